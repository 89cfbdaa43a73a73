//! Events the core reports while it works. The core never prints; the CLI hands it a
//! `Reporter` (progress bars on a terminal, plain lines otherwise, or JSON lines: those
//! print, so they live in the binary, `src/cli/report.rs`).

use crate::base::platform::Platform;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Plan,
    Probe,
    Emulation,
    Build,
    Export,
    Push,
    Publish,
    Verify,
    /// A platform's pushed image runs its `test:` (before any tag moves).
    Test,
    Done,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A unit of work (image × platform, or the image as a whole when `platform` is None)
    /// entered a phase.
    Phase {
        image: String,
        platform: Option<Platform>,
        phase: Phase,
        message: String,
    },
    /// A build step started (`step` of `total` when known).
    Step {
        image: String,
        platform: Platform,
        step: u32,
        total: Option<u32>,
        name: String,
    },
    /// A line of build output.
    Log {
        image: String,
        platform: Platform,
        line: String,
    },
    /// Bytes moved in the current phase (export or push).
    Bytes {
        image: String,
        platform: Option<Platform>,
        phase: Phase,
        done: u64,
        total: Option<u64>,
    },
    Warning {
        message: String,
    },
    Note {
        message: String,
    },
    /// The whole (bounded) build log of a platform whose build failed.
    FailedLog {
        image: String,
        platform: Platform,
        lines: Vec<String>,
    },
}

pub trait Reporter: Send + Sync {
    fn report(&self, event: Event);
}

/// Drops every event; for library users and tests that do not care.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _event: Event) {}
}

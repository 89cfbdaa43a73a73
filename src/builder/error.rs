//! What kind of failure a build was, so that callers decide by kind (retry elsewhere,
//! build again, stop) and never by the engine's message text.

use super::log::BuildLog;
use crate::builder::binfmt::EmulationError;
use crate::builder::build_inputs::InputsError;
use crate::builder::export::ImageExportError;
use crate::docker::buildkit::SolveError;
use crate::docker::endpoint::EndpointError;
use crate::docker::engine::ConnectError;
use crate::registry::credentials::CredentialsError;
use crate::registry::ClientError;
use std::path::PathBuf;

/// What the build area (the `Builder` seam, the builders of a run) fails with; each
/// variant reads as the crate-wide `Error` it becomes.
#[derive(Debug, thiserror::Error)]
pub enum BuilderError {
    /// A platform build failed; `source` says what kind of failure.
    #[error("build of {image} for {platform} failed: {source}")]
    Build {
        image: String,
        platform: String,
        #[source]
        source: BuildError,
    },
    /// A native builder from `builders:` cannot be reached.
    /// A platform's `test:` could not be run (no verdict on the image).
    #[error("test of {image} for {platform}: {source}")]
    Test {
        image: String,
        platform: String,
        #[source]
        source: super::platform_test::TestError,
    },
    #[error("docker engine: builder for {platform}: {source}")]
    Unreachable {
        platform: String,
        #[source]
        source: EndpointError,
    },
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Boxed, as every `Result` should stay small.
    #[error("{}: {}", .0.area(), .0)]
    Emulation(#[source] Box<EmulationError>),
    #[error(transparent)]
    Export(#[from] ImageExportError),
    #[error(transparent)]
    Registry(#[from] ClientError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error(transparent)]
    Inputs(#[from] InputsError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl BuilderError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BuilderError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<EmulationError> for BuilderError {
    fn from(error: EmulationError) -> Self {
        BuilderError::Emulation(Box::new(error))
    }
}

/// Why a platform build failed; its text is the message `Error::Build` shows.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builder went away or could not be reached (engine stopped, connection dropped):
    /// the build itself may be fine, so another builder may take it.
    #[error("{0}")]
    BuilderLost(String),
    /// The engine ran the build and a step failed: its message, step and last output.
    #[error("{0}")]
    StepFailed(String),
    /// The engine built for another platform than the one asked.
    #[error("{0}")]
    WrongPlatform(String),
    /// The engine lost the image record while writing it (a concurrent removal).
    #[error("{0}")]
    ImageLost(String),
    /// The build cannot run as asked (a feature the engine lacks, a bad ignore file, an
    /// SSH agent that is not there).
    #[error("{0}")]
    Request(String),
    /// The engine answered with something polyarch cannot use (no image ID, no manifest).
    #[error("{0}")]
    Answer(String),
}

/// How the engine ended a build that did not succeed, before it is classified.
pub(super) enum Stopped {
    /// The connection failed or was closed under the build.
    Lost(String),
    /// The engine ran the build and reports a failure.
    Failed(String),
}

impl Stopped {
    pub(super) fn message(&self) -> &str {
        match self {
            Stopped::Lost(message) | Stopped::Failed(message) => message,
        }
    }
}

impl From<SolveError> for Stopped {
    fn from(error: SolveError) -> Self {
        match error {
            SolveError::Connect { .. } | SolveError::Lost(_) => Stopped::Lost(error.to_string()),
            SolveError::Failed(_) | SolveError::Unauthorized { .. } => {
                Stopped::Failed(error.to_string())
            }
        }
    }
}

impl BuildLog<'_> {
    /// The one place the engine's failure message is read for its kind: a lost builder,
    /// or a lost image (BuildKit: "failed to get digest … no such file"). `None`: a
    /// failure of the build itself, to explain with its log ([`BuildLog::failure`]).
    pub(super) fn classify(&self, stopped: &Stopped) -> Option<BuildError> {
        match stopped {
            Stopped::Lost(message) => Some(BuildError::BuilderLost(self.summary(message))),
            Stopped::Failed(message) => {
                let with_tail = self.with_tail(message);
                (with_tail.contains("failed to get digest") && with_tail.contains("no such file"))
                    .then(|| BuildError::ImageLost(message.clone()))
            }
        }
    }
}

//! The project file, `polyarch.yaml` (version 1): parsing and validation into typed specs.
//! Every mistake becomes one `Error::Project` naming the file, the field path
//! (e.g. `images.hello.platforms[1]`) and the fix.

use crate::platform::Platform;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const SUPPORTED_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    Default,
    Host,
    None,
}

/// How to treat foreign platforms that need QEMU emulation (see `binfmt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BinfmtMode {
    #[default]
    Auto,
    Never,
    Require,
}

#[derive(Debug, Clone)]
pub struct Project {
    /// The project file as given (for messages).
    pub file: PathBuf,
    /// Images in the order the file declares them.
    pub images: Vec<ImageSpec>,
    pub binfmt: BinfmtMode,
    /// Installer image for binfmt registration.
    pub binfmt_image: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub name: String,
    /// `host[:port]/path`, without tag or digest.
    pub repository: String,
    pub tags: Vec<String>,
    /// Absolute build context directory.
    pub context: PathBuf,
    /// Dockerfile path relative to the context.
    pub dockerfile: PathBuf,
    pub platforms: Vec<Platform>,
    pub build_args: BTreeMap<String, String>,
    pub target: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub network: Network,
    /// Per-image override of the project's `binfmt`.
    pub binfmt: Option<BinfmtMode>,
}

impl Project {
    pub fn load(_path: &Path) -> crate::Result<Project> {
        todo!("project loading")
    }
}

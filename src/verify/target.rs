//! What verify is asked to check: the reference, its declared platforms and the checks
//! beyond them.

use crate::Platform;

/// What to check.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// The reference as the user wrote it (`repo:tag`, `repo@sha256:…`, `oci:DIR:TAG`).
    pub reference: String,
    pub tags: Vec<String>,
    pub declared: Vec<Platform>,
    /// Also check each platform's entrypoint binary (`--deep`).
    pub deep: bool,
    /// A platform entry without SLSA provenance attached is a gap.
    pub require_provenance: bool,
    /// A platform entry without an SBOM attached is a gap.
    pub require_sbom: bool,
}

/// What verify checks beyond the platforms: `--deep`, `--require-provenance`,
/// `--require-sbom`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checks {
    pub deep: bool,
    pub require_provenance: bool,
    pub require_sbom: bool,
}

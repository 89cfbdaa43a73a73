//! The coverage record (`polyarch/coverage/v1`): what was verified, as data.
//! Field names are a contract documented in the book (docs/src/reference/records.md) and
//! `schema/coverage.schema.json`.

use crate::base::attachment::Attached;
use crate::base::digest::Digest;
use crate::base::platform::Platform;
use crate::project::ValueSource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SCHEMA: &str = "polyarch/coverage/v1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoverageRecord {
    pub schema: String,
    pub tool: Tool,
    pub generated_at: String,
    pub covered: bool,
    pub images: Vec<ImageCoverage>,
    /// Project-file values that came from the job (environment or `--set`), not the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<ValueSource>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlatformStatus {
    Ok,
    Missing,
    ConfigMismatch,
    BinaryMismatch,
    /// `--require-provenance` (or `provenance: true`): no SLSA provenance is attached.
    ProvenanceMissing,
    /// `verify --sbom`: no SBOM is attached.
    SbomMissing,
    /// `--require-signature`: no signature by one of the keys given is attached.
    SignatureMissing,
    /// Its `test:` failed or timed out: the image was not published.
    TestFailed,
}

/// How a platform's `test:` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestStatus {
    Passed,
    Failed,
    TimedOut,
    /// `--no-test`.
    Skipped,
}

/// A platform's `test:` as it ran: the failing entry, else every entry (commands joined
/// by `; `, seconds summed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRecord {
    pub status: TestStatus,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The last 20 lines the command wrote (then BuildKit's failure or polyarch's
    /// cancellation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_tail: Vec<String>,
    /// Passed in an earlier run, on this image by digest with these tests: not run again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier_run: bool,
}

impl TestRecord {
    /// Failed or timed out: the platform is a gap and its image is not published.
    pub fn failed(&self) -> bool {
        matches!(self.status, TestStatus::Failed | TestStatus::TimedOut)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageCoverage {
    pub name: String,
    /// The first tag's reference (`repo:tag`), or the reference verified.
    pub reference: String,
    pub tags: Vec<String>,
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: Digest,
    /// `repo@sha256:…` to pin in deployments instead of a mutable tag.
    pub pinned: String,
    pub media_type: String,
    /// Size in bytes of the index (or single manifest) as the registry or layout holds it:
    /// with `digest` and `media_type`, its descriptor (`buildx build --metadata-file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The annotations of what the reference resolves to (the index).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub declared: Vec<Platform>,
    pub platforms: Vec<PlatformCoverage>,
    pub missing: Vec<Platform>,
    pub unexpected: Vec<Platform>,
    pub attestations: Vec<String>,
    /// Findings that are not gaps (unknown media types, duplicate entries, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub covered: bool,
    /// Why nothing was published for the image (a platform's test failed): `digest` is
    /// then the index that was not published, `pinned` empty, and no tag moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpublished: Option<String>,
    /// `--require-signature`: the index's (or single manifest's) signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<Signed>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlatformCoverage {
    pub platform: Platform,
    pub digest: Option<Digest>,
    pub config_platform: Option<Platform>,
    pub size: Option<u64>,
    pub status: PlatformStatus,
    /// The platform manifest's annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `--deep`: what the entrypoint resolved to and what machine it is built for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deep: Option<DeepCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildInfo>,
    /// What the registry lists as attached to the platform manifest (OCI referrers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached: Vec<Attached>,
    /// `build` with `test:`: how the platform's test ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<TestRecord>,
    /// `verify --sbom`: the attached SBOM's packages by purl type (`deb`, `apk`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sbom: Option<BTreeMap<String, usize>>,
    /// `--require-signature`: whether a signature by one of the keys given is attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<Signed>,
}

/// A manifest's signature as `--require-signature` found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// A Sigstore bundle attached checks out with one of the keys given.
    pub verified: bool,
    /// That key's fingerprint: base64 of the SHA-256 of its DER, the `hint` cosign writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Why none counts: no signature, another key's, one naming another digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeepCheck {
    pub executable: Option<String>,
    /// match, binary_mismatch, missing_entrypoint, no_entrypoint, interpreter_missing, not_elf, unreadable
    pub finding: String,
    pub detail: String,
}

impl From<&crate::verify::entrypoint::DeepReport> for DeepCheck {
    fn from(report: &crate::verify::entrypoint::DeepReport) -> Self {
        use crate::verify::entrypoint::Finding;
        let finding = match report.finding {
            Finding::Match => "match",
            Finding::BinaryMismatch { .. } => "binary_mismatch",
            Finding::MissingEntrypoint => "missing_entrypoint",
            Finding::NoEntrypoint => "no_entrypoint",
            Finding::InterpreterMissing { .. } => "interpreter_missing",
            Finding::NotElf => "not_elf",
            Finding::Unreadable => "unreadable",
        };
        DeepCheck {
            executable: report.executable.clone(),
            finding: finding.to_string(),
            detail: report.detail.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BuildInfo {
    pub emulated: bool,
    pub seconds: f64,
    /// The inputs matched an earlier run's build, whose pushed image was used unbuilt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builder: Option<String>,
    /// Why the platform was built on the default engine rather than its builder
    /// (`fallback: emulate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// When the build ran, for its provenance (not recorded: the record has `seconds`).
    #[serde(skip)]
    pub window: Option<BuildWindow>,
}

impl CoverageRecord {
    pub fn new(images: Vec<ImageCoverage>) -> Self {
        let covered = !images.is_empty() && images.iter().all(|i| i.covered);
        CoverageRecord {
            schema: SCHEMA.to_string(),
            tool: tool(),
            generated_at: now_rfc3339(),
            covered,
            images,
            values: Vec::new(),
        }
    }

    /// Adds where the project's values for the recorded images came from.
    pub fn with_values(mut self, project: &crate::project::Project) -> Self {
        let names: Vec<String> = self.images.iter().map(|i| i.name.clone()).collect();
        self.values = project.values_for(&names);
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("record serialises")
    }

    pub fn write(&self, path: &std::path::Path) -> Result<(), RecordError> {
        std::fs::write(path, self.to_json() + "\n").map_err(|source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

pub const PART_SCHEMA: &str = "polyarch/part/v1";

/// What one split runner pushed by digest (`build --push-by-digest`), for `assemble`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartRecord {
    pub schema: String,
    pub tool: Tool,
    pub generated_at: String,
    pub images: Vec<PartImage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartImage {
    pub name: String,
    pub repository: String,
    pub platforms: Vec<PartPlatform>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartPlatform {
    pub platform: Platform,
    /// The platform manifest, pushed by digest.
    pub digest: Digest,
    pub size: u64,
    pub build: BuildInfo,
    /// The platform's `test:` as this runner ran it; `assemble` refuses a failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<TestRecord>,
}

impl PartRecord {
    pub fn new(images: Vec<PartImage>) -> Self {
        PartRecord {
            schema: PART_SCHEMA.to_string(),
            tool: tool(),
            generated_at: now_rfc3339(),
            images,
        }
    }

    /// Reads a part file; anything else is a one-line error naming the file.
    pub fn load(path: &std::path::Path) -> Result<Self, RecordError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RecordError::Usage(crate::base::text::unreadable_argument(path, &e)))?;
        let part: PartRecord = serde_json::from_str(&text).map_err(|e| {
            RecordError::Usage(format!(
                "{}: not a polyarch part record ({e}); write it with `polyarch build --push-by-digest --record FILE`",
                path.display()
            ))
        })?;
        if part.schema != PART_SCHEMA {
            return Err(RecordError::Usage(format!(
                "{}: schema `{}` is not {PART_SCHEMA}",
                path.display(),
                part.schema
            )));
        }
        Ok(part)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("record serialises")
    }
}

fn tool() -> Tool {
    Tool {
        name: env!("CARGO_PKG_NAME").to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The record's JSON Schema, shipped as `schema/coverage.schema.json`.
pub const SCHEMA_JSON: &str = include_str!("../../schema/coverage.schema.json");

/// When one platform's build ran, for its provenance statement's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildWindow {
    pub started: time::OffsetDateTime,
    pub finished: time::OffsetDateTime,
}

impl BuildWindow {
    /// A build's window from its duration, taken when it has just finished.
    pub fn ending_now(seconds: f64) -> Self {
        let finished = time::OffsetDateTime::now_utc();
        let started = finished - time::Duration::seconds_f64(seconds.max(0.0));
        BuildWindow { started, finished }
    }
}

/// Reading a part file or writing a record. The crate-wide `Error` keeps the kind: `Usage`
/// exits 2, `Io` 3.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A part file named on the command line that cannot be read or is not a part record.
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_is_written_only_when_true() {
        let built = serde_json::to_string(&BuildInfo {
            seconds: 1.0,
            ..Default::default()
        })
        .unwrap();
        assert!(!built.contains("reused"), "absent unless true: {built}");
    }
}

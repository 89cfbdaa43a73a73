//! The coverage record (`polyarch/coverage/v1`): what was verified, as data.
//! Field names are a contract documented in the README and `schema/coverage.schema.json`.

use crate::platform::Platform;
use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "polyarch/coverage/v1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoverageRecord {
    pub schema: String,
    pub tool: Tool,
    pub generated_at: String,
    pub covered: bool,
    pub images: Vec<ImageCoverage>,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageCoverage {
    pub name: String,
    /// The first tag's reference (`repo:tag`), or the reference verified.
    pub reference: String,
    pub tags: Vec<String>,
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: String,
    /// `repo@sha256:…` to pin in deployments instead of a mutable tag.
    pub pinned: String,
    pub media_type: String,
    pub declared: Vec<Platform>,
    pub platforms: Vec<PlatformCoverage>,
    pub missing: Vec<Platform>,
    pub unexpected: Vec<Platform>,
    pub attestations: Vec<String>,
    /// Findings that are not gaps (unknown media types, duplicate entries, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub covered: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlatformCoverage {
    pub platform: Platform,
    pub digest: Option<String>,
    pub config_platform: Option<Platform>,
    pub size: Option<u64>,
    pub status: PlatformStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildInfo {
    pub emulated: bool,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builder: Option<String>,
}

impl CoverageRecord {
    pub fn new(images: Vec<ImageCoverage>) -> Self {
        let covered = !images.is_empty() && images.iter().all(|i| i.covered);
        CoverageRecord {
            schema: SCHEMA.to_string(),
            tool: Tool {
                name: env!("CARGO_PKG_NAME").to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            generated_at: now_rfc3339(),
            covered,
            images,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("record serialises")
    }

    pub fn write(&self, path: &std::path::Path) -> crate::Result<()> {
        std::fs::write(path, self.to_json() + "\n").map_err(|e| crate::Error::io(path, e))
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

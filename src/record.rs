//! The coverage record (`polyarch/coverage/v1`): what was verified, as data.
//! Field names are a contract documented in the README and `schema/coverage.schema.json`.

use crate::platform::Platform;
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

/// Where one project-file value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueSource {
    /// The field path, e.g. `images.api.tags[0]`.
    pub field: String,
    /// `env:NAME` (the variable's value), `default:NAME` (`${NAME:-…}`'s default, NAME being
    /// unset) or `set` (`--set`).
    pub source: String,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlatformCoverage {
    pub platform: Platform,
    pub digest: Option<String>,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeepCheck {
    pub executable: Option<String>,
    /// match, binary_mismatch, missing_entrypoint, no_entrypoint, interpreter_missing, not_elf, unreadable
    pub finding: String,
    pub detail: String,
}

impl From<&crate::deep::DeepReport> for DeepCheck {
    fn from(report: &crate::deep::DeepReport) -> Self {
        use crate::deep::Finding;
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

#[derive(Debug, Clone, Serialize, Deserialize)]
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

    pub fn write(&self, path: &std::path::Path) -> crate::Result<()> {
        std::fs::write(path, self.to_json() + "\n").map_err(|e| crate::Error::io(path, e))
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
    pub digest: String,
    pub size: u64,
    pub build: BuildInfo,
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
    pub fn load(path: &std::path::Path) -> crate::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| crate::Error::input(path, e))?;
        let part: PartRecord = serde_json::from_str(&text).map_err(|e| {
            crate::Error::Usage(format!(
                "{}: not a polyarch part record ({e}); write it with `polyarch build --push-by-digest --record FILE`",
                path.display()
            ))
        })?;
        if part.schema != PART_SCHEMA {
            return Err(crate::Error::Usage(format!(
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

fn human_size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1_000_000.0)
    } else {
        format!("{:.1} kB", bytes as f64 / 1_000.0)
    }
}

impl CoverageRecord {
    /// The human summary printed in text mode.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for image in &self.images {
            let verdict = if image.covered {
                "covered"
            } else {
                "NOT covered"
            };
            out += &format!(
                "{} {} -> {} ({})\n",
                image.name,
                image.reference,
                crate::oci::short_digest(&image.digest),
                verdict
            );
            for p in &image.platforms {
                let status = serde_json::to_value(&p.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let digest = p
                    .digest
                    .as_deref()
                    .map(crate::oci::short_digest)
                    .unwrap_or("-");
                let size = p.size.map(human_size).unwrap_or_else(|| "-".into());
                let build = p.build.as_ref().map_or(String::new(), |b| {
                    let fallback = if b.fallback.is_some() {
                        ", its builder unreachable (fallback: emulate)"
                    } else {
                        ""
                    };
                    if b.reused {
                        format!("  inputs unchanged, not rebuilt{fallback}")
                    } else {
                        let emulated = if b.emulated { " (emulated)" } else { "" };
                        format!("  built in {:.1}s{emulated}{fallback}", b.seconds)
                    }
                });
                out += &format!(
                    "  {:<16} {:<15} {:<12} {:>9}{build}\n",
                    p.platform.to_string(),
                    status,
                    digest,
                    size
                );
                if let Some(detail) = &p.detail {
                    out += &format!("    {detail}\n");
                }
            }
            for digest in &image.attestations {
                out += &format!(
                    "  attestation entry {digest}: older containerd fails on it with \"unknown media type\"; push without provenance/SBOM (buildx --provenance=false --sbom=false)\n"
                );
            }
            for warning in &image.warnings {
                out += &format!("  warning: {warning}\n");
            }
            let native = image
                .platforms
                .iter()
                .filter_map(|p| p.build.as_ref())
                .find(|b| !b.emulated && b.seconds > 0.0);
            for p in &image.platforms {
                if let (Some(build), Some(native)) = (&p.build, native) {
                    if build.emulated && !build.reused {
                        out += &format!(
                            "  {} built under QEMU emulation: {:.1}x the native build time\n",
                            p.platform,
                            build.seconds / native.seconds
                        );
                    }
                }
            }
            out += &format!("  pin: {}\n", image.pinned);
            if !image.tags.is_empty() {
                out += "  note: tags are mutable; nodes with imagePullPolicy: IfNotPresent keep a re-pushed tag's old image (possibly a stale architecture): deploy the pinned digest\n";
            }
        }
        out += if self.covered {
            "every declared platform is covered\n"
        } else {
            "coverage gap: see above\n"
        };
        out
    }
}

/// The record's JSON Schema, shipped as `schema/coverage.schema.json`.
pub const SCHEMA_JSON: &str = include_str!("../schema/coverage.schema.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_tells_reused_builds_from_emulated_ones() {
        let platform = |name: &str, build: BuildInfo| PlatformCoverage {
            platform: name.parse().unwrap(),
            digest: Some(format!("sha256:{}", "a".repeat(64))),
            config_platform: Some(name.parse().unwrap()),
            size: Some(900),
            status: PlatformStatus::Ok,
            annotations: BTreeMap::new(),
            detail: None,
            deep: None,
            build: Some(build),
        };
        let image = ImageCoverage {
            name: "x".into(),
            reference: "r.io/x:t".into(),
            tags: vec!["t".into()],
            digest: format!("sha256:{}", "b".repeat(64)),
            pinned: "r.io/x@sha256:…".into(),
            media_type: "application/vnd.oci.image.index.v1+json".into(),
            annotations: BTreeMap::new(),
            declared: vec![
                "linux/amd64".parse().unwrap(),
                "linux/arm64".parse().unwrap(),
            ],
            platforms: vec![
                platform(
                    "linux/amd64",
                    BuildInfo {
                        emulated: false,
                        seconds: 1.0,
                        reused: false,
                        builder: None,
                        fallback: None,
                    },
                ),
                platform(
                    "linux/arm64",
                    BuildInfo {
                        emulated: true,
                        seconds: 0.0,
                        reused: true,
                        builder: None,
                        fallback: None,
                    },
                ),
            ],
            missing: vec![],
            unexpected: vec![],
            attestations: vec![],
            warnings: vec![],
            covered: true,
        };
        let text = CoverageRecord::new(vec![image]).render_text();
        assert!(text.contains("built in 1.0s"), "{text}");
        assert!(text.contains("inputs unchanged, not rebuilt"), "{text}");
        // Nothing ran under QEMU in this run, so no emulation cost is claimed.
        assert!(!text.contains("QEMU"), "{text}");
        let built = serde_json::to_string(&BuildInfo {
            emulated: false,
            seconds: 1.0,
            reused: false,
            builder: None,
            fallback: None,
        })
        .unwrap();
        assert!(!built.contains("reused"), "absent unless true: {built}");
    }
}

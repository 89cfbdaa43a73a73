//! `polyarch gate`: where the pods of a set of Kubernetes manifests may land (the `k8s`
//! module) against what their images are, read the way `verify` reads them: every index
//! entry's config (with `--deep`, its entrypoint binary) checked against the platform the
//! entry claims, attestation entries set aside.
//!
//! Besides a reachable pool whose os/arch an image lacks, the gate finds:
//! - an entry that is not the platform it claims: a gap for the pools that would pull it;
//! - attestation entries (`unknown/unknown`): a warning naming the nodes' container
//!   runtimes, a refusal with `--strict`;
//! - a mutable tag pulled with `imagePullPolicy: IfNotPresent` (the re-tag trap): a warning;
//! - an image that cannot be read: recorded against each container using it while the rest
//!   is still judged; exit 3 at the end.
//!
//! `--pin DIR` writes the manifests back with every image it checked pinned to the digest
//! it checked (`repo:tag@sha256:…`), changing only those values in the text as written.

use crate::base::digest::Digest;
use crate::base::progress::Reporter;
use crate::flows::error::{exit, Error, Result};
use crate::k8s::{
    self, Container, GateRecord, ManifestFile, NodePool, ProvidedPlatforms, Workload,
};
use crate::registry::{self, Registry, RegistryOptions};
use crate::verify::coverage_record::{PlatformCoverage, PlatformStatus};
use crate::verify::{self, signed, Contents, ReadMemory, RegistrySource, Target};
use futures_util::StreamExt;
use oci_client::Reference;
use serde::{Deserialize, Serialize};
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

mod pin;

use pin::{check_pin_dir, pin};

/// The gate record's JSON Schema, shipped as `schema/gate.schema.json`.
pub const SCHEMA_JSON: &str = include_str!("../../../schema/gate.schema.json");

/// Images read from their registries at once.
const CONCURRENT_READS: usize = 4;

/// What `polyarch gate` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct GateOptions {
    /// Manifest files or directories.
    pub manifests: Vec<PathBuf>,
    /// `kubectl get nodes -o json` output or a pool file.
    pub nodes: PathBuf,
    /// Also check each entry's entrypoint binary, as `verify --deep` does.
    pub deep: bool,
    /// Refuse images with attestation entries instead of warning.
    pub strict: bool,
    /// Write the manifests, pinned, into this new or empty directory.
    pub pin: Option<PathBuf>,
    /// `--require-signature --key`: the index and each entry must be signed by one of these.
    pub keys: Vec<crate::sign::PublicKey>,
    /// `--require-sbom`: each entry must have an SBOM attached.
    pub require_sbom: bool,
}

/// The gate's record (`polyarch/gate/v1`): the scheduling verdict per container, what each
/// image holds, and every finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GateReport {
    #[serde(flatten)]
    pub record: GateRecord,
    /// Every image reference the workloads run, as read from its registry.
    pub images: Vec<ImageCheck>,
    pub findings: Vec<Finding>,
    /// `--pin DIR`: the files written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<PinnedFile>,
}

/// One image reference as its registry serves it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageCheck {
    pub image: String,
    /// Digest of the index (or single manifest) the reference resolved to; what `--pin` pins.
    pub digest: Option<Digest>,
    pub media_type: Option<String>,
    /// Every platform entry in index order, its config (and with `--deep` its binary)
    /// checked against the platform the entry claims.
    pub entries: Vec<PlatformCoverage>,
    /// Digests of attestation entries (`unknown/unknown`).
    pub attestations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Why the image could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--require-signature`: the index's signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<crate::verify::coverage_record::Signed>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// An entry whose config (or `--deep` binary) is another platform than the entry says.
    EntryMismatch,
    /// Attestation entries in the index.
    Attestation,
    /// A mutable tag pulled with `imagePullPolicy: IfNotPresent`.
    PullPolicy,
    /// The image could not be read.
    Unreadable,
    /// `--require-signature`: the index or an entry has no signature by one of the keys.
    Unsigned,
    /// `--require-sbom`: an entry has no SBOM attached.
    SbomMissing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Refuses the deploy (exit 1).
    Gap,
    /// Reported; does not refuse.
    Warning,
    /// Could not be checked (exit 3).
    Failure,
}

/// One finding about one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// `file#doc` of the workload.
    pub source: String,
    /// `Kind namespace/name`.
    pub workload: String,
    pub container: String,
    pub image: String,
    /// One line: what, where and the fix.
    pub message: String,
    /// entry_mismatch: the platform the entry claims, its digest and status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PlatformStatus>,
    /// entry_mismatch: the reachable pools that would pull the entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// attestation: the entries' digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<String>,
    /// attestation: container runtimes of the nodes the pods may land on, as the nodes
    /// report them (`containerd://1.7.13`); empty when the nodes file does not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtimes: Vec<String>,
    /// pull_policy: the policy in effect and whether it was written or Kubernetes' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy_source: Option<PolicySource>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    Written,
    Default,
}

/// One manifest file written by `--pin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedFile {
    /// The file read.
    pub source: String,
    /// Its pinned copy.
    pub path: String,
    /// Container image values pinned.
    pub pinned: usize,
    /// The values could not be replaced in the text as written, so the documents were
    /// written re-serialised (comments and formatting dropped).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserialised: bool,
}

impl GateReport {
    /// 3 when an image could not be read, else 1 for a gap, else 0.
    pub fn exit_code(&self) -> i32 {
        if self
            .findings
            .iter()
            .any(|f| f.severity == Severity::Failure)
        {
            exit::FAILURE
        } else if self.record.covered {
            exit::COVERED
        } else {
            exit::GAP
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("record serialises")
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json() + "\n").map_err(|e| Error::io(path, e))
    }
}

/// Runs the gate: reads manifests and nodes, reads every image (with what `memory` holds
/// of earlier reads, as `verify`), judges, and with `--pin` writes the pinned manifests.
/// Input mistakes fail before any registry is asked.
pub async fn run(
    options: &GateOptions,
    registry: &RegistryOptions,
    memory: &dyn ReadMemory,
    reporter: &dyn Reporter,
) -> Result<GateReport> {
    let files = k8s::load_manifests(&options.manifests)?;
    if let Some(dir) = &options.pin {
        check_pin_dir(dir, &files)?;
    }
    let pools = k8s::load_nodes(&options.nodes)?;
    let images = image_references(&files)?;
    let read = read_images(&images, registry, options, memory, reporter).await?;
    let mut report = judge(&files, &pools, &read, options);
    if let Some(dir) = &options.pin {
        report.pinned = pin(&files, &report.images, dir)?;
    }
    Ok(report)
}

/// Every distinct image reference, parsed; a malformed one is a usage error naming its field.
fn image_references(files: &[ManifestFile]) -> Result<Vec<(String, Reference)>> {
    let mut out = BTreeMap::new();
    for w in files.iter().flat_map(|f| &f.workloads) {
        for c in &w.containers {
            if out.contains_key(&c.image) {
                continue;
            }
            let parsed = registry::parse_reference(&c.image)
                .map_err(|e| Error::Usage(format!("{}: {}: {e}", w.source, image_field(w, c))))?;
            out.insert(c.image.clone(), parsed);
        }
    }
    Ok(out.into_iter().collect())
}

fn image_field(w: &Workload, c: &Container) -> String {
    let list = if c.init {
        "initContainers"
    } else {
        "containers"
    };
    format!("{}.{list}[{}].image", w.pod_spec_path, c.index)
}

/// Reads each image as `verify` does; an image's failure is its own result.
async fn read_images(
    images: &[(String, Reference)],
    registry_options: &RegistryOptions,
    options: &GateOptions,
    memory: &dyn ReadMemory,
    reporter: &dyn Reporter,
) -> Result<BTreeMap<String, Result<Contents>>> {
    if images.is_empty() {
        return Ok(BTreeMap::new());
    }
    let hosts: BTreeSet<String> = images
        .iter()
        .map(|(_, r)| r.registry().to_string())
        .collect();
    let registry = Registry::new(&hosts.into_iter().collect::<Vec<_>>(), registry_options)?;
    let (deep, keys, require_sbom) = (options.deep, options.keys.as_slice(), options.require_sbom);
    for (_, reference) in images {
        registry.declare(reference, false).await;
    }
    let registry = &registry;
    let reads = images.iter().map(|(text, reference)| async move {
        let target = Target {
            name: text.clone(),
            reference: text.clone(),
            tags: Vec::new(),
            declared: Vec::new(),
            deep,
            require_provenance: false,
            // Checked by the gate itself: a missing SBOM is its own finding, not an entry
            // that pools cannot run.
            require_sbom: false,
        };
        let source = RegistrySource {
            registry,
            reference: reference.clone(),
            memory,
            pushed: None,
        };
        let contents = async {
            let mut contents = verify::read_contents(&source, &target, reporter).await?;
            if require_sbom {
                contents.fill_attached(&target)?;
            }
            if !keys.is_empty() {
                check_signatures(&source, &mut contents, keys).await?;
            }
            Ok(contents)
        };
        (text.clone(), contents.await)
    });
    Ok(futures_util::stream::iter(reads)
        .buffer_unordered(CONCURRENT_READS)
        .collect()
        .await)
}

/// `--require-signature`: the signature of the index and of each entry, recorded on them.
async fn check_signatures(
    source: &RegistrySource<'_>,
    contents: &mut Contents,
    keys: &[crate::sign::PublicKey],
) -> Result<()> {
    let index = signed::signature(source, &contents.digest, keys).await?;
    contents.signed = Some(signed::signed(&index));
    for entry in &mut contents.entries {
        if let Some(digest) = &entry.digest {
            entry.signed = Some(signed::signed(
                &signed::signature(source, digest, keys).await?,
            ));
        }
    }
    Ok(())
}

/// A gap for the index and each entry of an image whose signature does not count.
fn unsigned(at: &Subject, contents: &Contents) -> Vec<Finding> {
    let index = (
        contents.signed.as_ref(),
        "index".to_string(),
        &contents.digest,
    );
    let entries = contents.entries.iter().filter_map(|e| {
        Some((
            e.signed.as_ref(),
            e.platform.to_string(),
            e.digest.as_ref()?,
        ))
    });
    std::iter::once(index)
        .chain(entries)
        .filter_map(|(signed, what, digest)| {
            let gap = signed?.gap.as_ref()?;
            let mut finding = at.finding(
                FindingKind::Unsigned,
                Severity::Gap,
                format!(
                    "image {}: {what} ({digest}) {gap}; deploy an image signed by one of the --key keys (polyarch build --sign-key, or cosign sign --key)",
                    at.c.image
                ),
            );
            finding.entry = Some(digest.clone());
            Some(finding)
        })
        .collect()
}

/// `--require-sbom`: a gap for each entry without an SBOM attached.
fn without_sbom(at: &Subject, contents: &Contents) -> Vec<Finding> {
    contents
        .entries
        .iter()
        .filter(|e| !e.attached.iter().any(|a| a.is_sbom()))
        .filter_map(|e| {
            let digest = e.digest.as_ref()?;
            let mut finding = at.finding(
                FindingKind::SbomMissing,
                Severity::Gap,
                format!(
                    "image {}: {} ({digest}) has no SBOM attached; deploy an image built with `sbom: true` in polyarch.yaml (or `polyarch build --sbom`)",
                    at.c.image, e.platform
                ),
            );
            finding.entry = Some(digest.clone());
            Some(finding)
        })
        .collect()
}

/// What pools can run from an image: its entries' platforms, except any os/arch one of whose
/// entries is another platform than it claims (a node of that arch may pull that entry).
fn usable(contents: &Contents) -> ProvidedPlatforms {
    let broken: BTreeSet<String> = contents
        .entries
        .iter()
        .filter(|e| e.status != PlatformStatus::Ok)
        .map(|e| e.platform.os_arch())
        .collect();
    ProvidedPlatforms {
        digest: Some(contents.digest.clone()),
        platforms: contents
            .entries
            .iter()
            .filter(|e| !broken.contains(&e.platform.os_arch()))
            .map(|e| e.platform.clone())
            .collect(),
    }
}

/// Why what an image provides is not known; the gate's record says it against each
/// container using the image.
#[derive(Debug, thiserror::Error)]
enum Unread<'r> {
    /// Reading the image failed.
    #[error(transparent)]
    Failed(&'r Error),
    /// The image was not among those read.
    #[error("{0} was not read")]
    NotRead(String),
}

/// Judges every container against the pools it may land on and what its image holds.
pub fn judge(
    files: &[ManifestFile],
    pools: &[NodePool],
    read: &BTreeMap<String, Result<Contents>>,
    options: &GateOptions,
) -> GateReport {
    let strict = options.strict;
    let workloads: Vec<Workload> = files
        .iter()
        .flat_map(|f| f.workloads.iter().cloned())
        .collect();
    let provided = |image: &str| match read.get(image) {
        Some(Ok(contents)) => Ok(usable(contents)),
        Some(Err(e)) => Err(Unread::Failed(e)),
        None => Err(Unread::NotRead(image.to_string())),
    };
    let mut record = k8s::evaluate(&workloads, pools, &provided);
    let mut findings = Vec::new();
    for (w, gate) in workloads.iter().zip(record.workloads.iter_mut()) {
        let reachable = k8s::schedulable_pools(w, pools);
        for (c, verdict) in w.containers.iter().zip(gate.containers.iter_mut()) {
            let at = Subject { w, c };
            match read.get(&c.image) {
                Some(Ok(contents)) => {
                    findings.extend(entry_mismatches(&at, contents, &reachable));
                    let unsigned = unsigned(&at, contents);
                    if !unsigned.is_empty() {
                        verdict.covered = false;
                        findings.extend(unsigned);
                    }
                    if options.require_sbom {
                        let without = without_sbom(&at, contents);
                        if !without.is_empty() {
                            verdict.covered = false;
                            findings.extend(without);
                        }
                    }
                    if !contents.attestations.is_empty() {
                        findings.push(attestation(&at, contents, &reachable, strict));
                        if strict {
                            verdict.covered = false;
                        }
                    }
                }
                _ => findings.push(at.finding(
                    FindingKind::Unreadable,
                    Severity::Failure,
                    format!(
                        "image {} could not be read: {}; the other images were still checked; \
                         check the reference and the registry's access (--username and \
                         --password-stdin, --ca-cert, --insecure-registry)",
                        c.image,
                        verdict.error.as_deref().unwrap_or("not read")
                    ),
                )),
            }
            let digest = match read.get(&c.image) {
                Some(Ok(contents)) => Some(contents.digest.as_str()),
                _ => None,
            };
            findings.extend(pull_policy_trap(&at, digest));
        }
    }
    record.covered = record
        .workloads
        .iter()
        .flat_map(|w| &w.containers)
        .all(|c| c.covered);
    GateReport {
        record,
        images: image_checks(read),
        findings,
        pinned: Vec::new(),
    }
}

/// What was read of each image, or why it could not be.
fn image_checks(read: &BTreeMap<String, Result<Contents>>) -> Vec<ImageCheck> {
    read.iter()
        .map(|(image, contents)| match contents {
            Ok(c) => ImageCheck {
                image: image.clone(),
                digest: Some(c.digest.clone()),
                media_type: Some(c.media_type.clone()),
                entries: c.entries.clone(),
                attestations: c.attestations.clone(),
                warnings: c.warnings.clone(),
                error: None,
                signed: c.signed.clone(),
            },
            Err(e) => ImageCheck {
                image: image.clone(),
                digest: None,
                media_type: None,
                entries: Vec::new(),
                attestations: Vec::new(),
                warnings: Vec::new(),
                error: Some(e.to_string()),
                signed: None,
            },
        })
        .collect()
}

/// The container a finding is about.
struct Subject<'a> {
    w: &'a Workload,
    c: &'a Container,
}

impl Subject<'_> {
    fn label(&self) -> String {
        let init = if self.c.init {
            "init container"
        } else {
            "container"
        };
        format!(
            "{} {} {init} `{}` ({})",
            self.w.kind,
            self.w.qualified_name(),
            self.c.name,
            self.w.source
        )
    }

    fn finding(&self, kind: FindingKind, severity: Severity, message: String) -> Finding {
        Finding {
            kind,
            severity,
            source: self.w.source.clone(),
            workload: format!("{} {}", self.w.kind, self.w.qualified_name()),
            container: self.c.name.clone(),
            image: self.c.image.clone(),
            message: format!("{}: {message}", self.label()),
            platform: None,
            entry: None,
            status: None,
            pools: Vec::new(),
            attestations: Vec::new(),
            runtimes: Vec::new(),
            pull_policy: None,
            pull_policy_source: None,
        }
    }
}

/// A gap per entry that is not the platform it claims and that a reachable pool would pull.
fn entry_mismatches(at: &Subject, contents: &Contents, reachable: &[&NodePool]) -> Vec<Finding> {
    let mut out = Vec::new();
    for entry in contents
        .entries
        .iter()
        .filter(|e| e.status != PlatformStatus::Ok)
    {
        let os_arch = entry.platform.os_arch();
        let pools: Vec<String> = reachable
            .iter()
            .filter(|p| p.platform.os_arch() == os_arch)
            .map(|p| p.name.clone())
            .collect();
        if pools.is_empty() {
            continue;
        }
        let digest = entry
            .digest
            .as_ref()
            .map(Digest::to_string)
            .unwrap_or_default();
        let detail = entry.detail.clone().unwrap_or_else(|| {
            format!(
                "entry {digest} says {} but is another platform",
                entry.platform
            )
        });
        let mut finding = at.finding(
            FindingKind::EntryMismatch,
            Severity::Gap,
            format!(
                "image {}: {detail}; pool(s) {} would pull that entry and fail (exec format \
                 error) or run it emulated; push the image again with each entry built for its \
                 own platform (polyarch build checks every entry before it tags)",
                at.c.image,
                pools.join(", ")
            ),
        );
        finding.platform = Some(entry.platform.to_string());
        finding.entry = entry.digest.clone();
        finding.status = Some(entry.status.clone());
        finding.pools = pools;
        out.push(finding);
    }
    out
}

/// Attestation entries: a warning naming the runtimes of the nodes the pods may land on; a
/// gap with `--strict`.
fn attestation(
    at: &Subject,
    contents: &Contents,
    reachable: &[&NodePool],
    strict: bool,
) -> Finding {
    let nodes: Vec<_> = reachable.iter().flat_map(|p| &p.nodes).collect();
    let runtimes: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.runtime.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let unknown = nodes.iter().any(|n| n.runtime.is_none());
    let on = match (runtimes.is_empty(), unknown) {
        (true, _) => "the nodes' container runtimes are not known (pass `kubectl get nodes -o \
                      json` output to --nodes to see them)"
            .to_string(),
        (false, false) => format!("the nodes it may land on run {}", runtimes.join(", ")),
        (false, true) => format!(
            "the nodes it may land on run {} (and pool-file pools, whose runtime is not known)",
            runtimes.join(", ")
        ),
    };
    let n = contents.attestations.len();
    let (severity, verdict) = if strict {
        (Severity::Gap, "refused (--strict)")
    } else {
        (Severity::Warning, "--strict refuses it")
    };
    let mut finding = at.finding(
        FindingKind::Attestation,
        severity,
        format!(
            "image {} has {n} attestation {} (unknown/unknown, as buildx adds for provenance \
             and SBOMs), which runtimes and tools that read every entry fail on with \"unknown \
             media type\"; {on}; push it without them (buildx --provenance=false --sbom=false; \
             polyarch build never adds them) or make sure those runtimes pull it; {verdict}",
            at.c.image,
            if n == 1 { "entry" } else { "entries" }
        ),
    );
    finding.attestations = contents.attestations.clone();
    finding.runtimes = runtimes;
    finding
}

/// The pull policy Kubernetes applies: as written, else `Always` for `:latest` or no tag
/// (without a digest), else `IfNotPresent`.
fn effective_pull_policy(image: &str, written: Option<&str>) -> (String, PolicySource) {
    if let Some(policy) = written {
        return (policy.to_string(), PolicySource::Written);
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.split_once(':').map(|(_, tag)| tag);
    let policy = match (tag, digest) {
        (Some("latest"), _) | (None, None) => "Always",
        _ => "IfNotPresent",
    };
    (policy.to_string(), PolicySource::Default)
}

/// The re-tag trap: a tag (not a digest) that nodes keep whatever they cached under.
fn pull_policy_trap(at: &Subject, digest: Option<&str>) -> Option<Finding> {
    let image = &at.c.image;
    let (policy, source) = effective_pull_policy(image, at.c.pull_policy.as_deref());
    if policy != "IfNotPresent" || image.contains('@') {
        return None;
    }
    let why = match source {
        PolicySource::Written => "as written",
        PolicySource::Default => "Kubernetes' default for a tag other than :latest",
    };
    let pinned = match digest {
        Some(d) => format!("{image}@{d}; "),
        None => String::new(),
    };
    let mut finding = at.finding(
        FindingKind::PullPolicy,
        Severity::Warning,
        format!(
            "image {image} is a mutable tag pulled with imagePullPolicy: IfNotPresent ({why}): a \
             node that cached an earlier push of the tag keeps running that, possibly built for \
             another architecture; pin it by digest ({pinned}`polyarch gate --pin DIR` writes \
             the manifests pinned) or set imagePullPolicy: Always"
        ),
    );
    finding.pull_policy = Some(policy);
    finding.pull_policy_source = Some(source);
    Some(finding)
}

#[cfg(test)]
mod tests;

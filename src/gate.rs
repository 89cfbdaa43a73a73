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

use crate::error::{exit, Error, Result};
use crate::k8s::{
    self, Container, GateRecord, ManifestFile, NodePool, ProvidedPlatforms, Workload,
};
use crate::progress::Reporter;
use crate::record::{PlatformCoverage, PlatformStatus};
use crate::registry::{self, Registry, RegistryOptions};
use crate::verify::{self, Contents, RegistrySource, Target};
use futures_util::StreamExt;
use oci_client::Reference;
use serde::{Deserialize, Serialize};
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The gate record's JSON Schema, shipped as `schema/gate.schema.json`.
pub const SCHEMA_JSON: &str = include_str!("../schema/gate.schema.json");

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
    pub digest: Option<String>,
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
    pub entry: Option<String>,
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

/// Runs the gate: reads manifests and nodes, reads every image, judges, and with `--pin`
/// writes the pinned manifests. Input mistakes fail before any registry is asked.
pub async fn run(
    options: &GateOptions,
    registry: &RegistryOptions,
    reporter: &dyn Reporter,
) -> Result<GateReport> {
    let files = k8s::load_manifests(&options.manifests)?;
    if let Some(dir) = &options.pin {
        check_pin_dir(dir, &files)?;
    }
    let pools = k8s::load_nodes(&options.nodes)?;
    let images = image_references(&files)?;
    let read = read_images(&images, registry, options.deep, reporter).await?;
    let mut report = judge(&files, &pools, &read, options.strict);
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
    options: &RegistryOptions,
    deep: bool,
    reporter: &dyn Reporter,
) -> Result<BTreeMap<String, Result<Contents>>> {
    if images.is_empty() {
        return Ok(BTreeMap::new());
    }
    let hosts: BTreeSet<String> = images
        .iter()
        .map(|(_, r)| r.registry().to_string())
        .collect();
    let registry = Registry::new(&hosts.into_iter().collect::<Vec<_>>(), options)?;
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
        };
        let source = RegistrySource {
            registry,
            reference: reference.clone(),
        };
        let contents = verify::read_contents(&source, &target, reporter).await;
        (text.clone(), contents)
    });
    Ok(futures_util::stream::iter(reads)
        .buffer_unordered(CONCURRENT_READS)
        .collect()
        .await)
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

/// Judges every container against the pools it may land on and what its image holds.
pub fn judge(
    files: &[ManifestFile],
    pools: &[NodePool],
    read: &BTreeMap<String, Result<Contents>>,
    strict: bool,
) -> GateReport {
    let workloads: Vec<Workload> = files
        .iter()
        .flat_map(|f| f.workloads.iter().cloned())
        .collect();
    let provided = |image: &str| match read.get(image) {
        Some(Ok(contents)) => Ok(usable(contents)),
        Some(Err(e)) => Err(e.to_string()),
        None => Err(format!("{image} was not read")),
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
    let images = read
        .iter()
        .map(|(image, contents)| match contents {
            Ok(c) => ImageCheck {
                image: image.clone(),
                digest: Some(c.digest.clone()),
                media_type: Some(c.media_type.clone()),
                entries: c.entries.clone(),
                attestations: c.attestations.clone(),
                warnings: c.warnings.clone(),
                error: None,
            },
            Err(e) => ImageCheck {
                image: image.clone(),
                digest: None,
                media_type: None,
                entries: Vec::new(),
                attestations: Vec::new(),
                warnings: Vec::new(),
                error: Some(e.to_string()),
            },
        })
        .collect();
    GateReport {
        record,
        images,
        findings,
        pinned: Vec::new(),
    }
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
        let digest = entry.digest.clone().unwrap_or_default();
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

// ---------------------------------------------------------------------------------------
// --pin

/// `--pin DIR` must be new or empty (`kubectl apply -f DIR` applies every file in it, stale
/// ones too) and no two manifest files may land on the same name in it.
fn check_pin_dir(dir: &Path, files: &[ManifestFile]) -> Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::Usage(format!(
                    "--pin {}: the directory is not empty; name a new or empty directory \
                     (`kubectl apply -f DIR` would apply stale files too)",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::Usage(format!(
                "--pin {}: {e}; name a new or empty directory",
                dir.display()
            )))
        }
    }
    let mut seen: BTreeMap<&Path, &Path> = BTreeMap::new();
    for f in files {
        if let Some(first) = seen.insert(&f.relative, &f.path) {
            return Err(Error::Usage(format!(
                "--pin {}: {} and {} would both be written as {}; gate them in separate runs \
                 or pass their common parent directory to --manifests",
                dir.display(),
                first.display(),
                f.path.display(),
                f.relative.display()
            )));
        }
    }
    Ok(())
}

/// `image@digest`, or the image as written when it already names a digest.
fn pinned_reference(image: &str, digest: &str) -> String {
    if image.contains('@') {
        image.to_string()
    } else {
        format!("{image}@{digest}")
    }
}

fn pin(files: &[ManifestFile], images: &[ImageCheck], dir: &Path) -> Result<Vec<PinnedFile>> {
    let digests: BTreeMap<&str, &str> = images
        .iter()
        .filter_map(|i| Some((i.image.as_str(), i.digest.as_deref()?)))
        .collect();
    let mut out = Vec::new();
    for file in files {
        let (text, pinned, reserialised) = pin_file(file, &digests)?;
        let path = dir.join(&file.relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        out.push(PinnedFile {
            source: file.path.display().to_string(),
            path: path.display().to_string(),
            pinned,
            reserialised,
        });
    }
    Ok(out)
}

/// A manifest file's text with every checked image pinned, and how many values were. The
/// values are replaced in the text as written (comments and layout kept) when that reads
/// back as exactly the expected documents; otherwise the documents are written re-serialised.
fn pin_file(file: &ManifestFile, digests: &BTreeMap<&str, &str>) -> Result<(String, usize, bool)> {
    let mut expected = k8s::documents(&file.path, &file.text)?;
    let mut pins: BTreeMap<&str, String> = BTreeMap::new();
    let mut pinned = 0;
    for w in &file.workloads {
        for c in &w.containers {
            let Some(digest) = digests.get(c.image.as_str()) else {
                continue;
            };
            let to = pinned_reference(&c.image, digest);
            if to == c.image {
                continue;
            }
            let doc = expected.iter_mut().find(|(i, _)| *i == w.document);
            if doc.and_then(|(_, v)| set_image(v, w, c, &to)).is_some() {
                pins.insert(&c.image, to);
                pinned += 1;
            }
        }
    }
    if pins.is_empty() {
        return Ok((file.text.clone(), 0, false));
    }
    let spans: Vec<Range<usize>> = if is_json(&file.path) {
        // JSON has no comments to keep and rarely more than one value: one span.
        std::iter::once(0..file.text.len()).collect()
    } else {
        let docs: BTreeSet<usize> = file.workloads.iter().map(|w| w.document).collect();
        yaml_document_spans(&file.text)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| docs.contains(&(i + 1)))
            .map(|(_, span)| span)
            .collect()
    };
    let text = replace_in_spans(&file.text, &spans, &pins);
    if k8s::documents(&file.path, &text).ok().as_ref() == Some(&expected) {
        return Ok((text, pinned, false));
    }
    Ok((serialise(&file.path, &expected)?, pinned, true))
}

fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

fn untag_mut(v: &mut Value) -> &mut Value {
    match v {
        Value::Tagged(t) => untag_mut(&mut t.value),
        other => other,
    }
}

/// Sets the container's `image` in its parsed document.
fn set_image(doc: &mut Value, w: &Workload, c: &Container, to: &str) -> Option<()> {
    let mut v = untag_mut(doc);
    if let Some(item) = w.item {
        v = untag_mut(v.get_mut("items")?.get_mut(item)?);
    }
    for key in w.pod_spec_path.split('.') {
        v = untag_mut(v.get_mut(key)?);
    }
    let list = if c.init {
        "initContainers"
    } else {
        "containers"
    };
    let container = untag_mut(untag_mut(v.get_mut(list)?).get_mut(c.index)?);
    *container.get_mut("image")? = Value::String(to.to_string());
    Some(())
}

fn serialise(file: &Path, docs: &[(usize, Value)]) -> Result<String> {
    let failed = |e: String| Error::io(file, std::io::Error::other(e));
    let mut out = String::new();
    for (_, doc) in docs {
        if is_json(file) {
            out += &serde_json::to_string_pretty(doc).map_err(|e| failed(e.to_string()))?;
            out.push('\n');
        } else {
            out += "---\n";
            out += &serde_norway::to_string(doc).map_err(|e| failed(e.to_string()))?;
        }
    }
    Ok(out)
}

/// Byte ranges of a YAML stream's documents, numbered as the parser numbers them (the
/// first is document 1): a `---` line starts one, and text before the first `---` is one
/// only when it holds more than comments and directives.
fn yaml_document_spans(text: &str) -> Vec<Range<usize>> {
    let mut starts = Vec::new();
    let mut preamble = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let marker =
            line.starts_with("---") && line[3..].chars().next().is_none_or(char::is_whitespace);
        if marker {
            starts.push(offset);
        } else if starts.is_empty() {
            let t = line.trim_start_matches('\u{feff}').trim();
            preamble |= !(t.is_empty() || t.starts_with('#') || t.starts_with('%'));
        }
        offset += line.len();
    }
    if preamble {
        starts.insert(0, 0);
    }
    starts
        .iter()
        .enumerate()
        .map(|(i, &start)| start..starts.get(i + 1).copied().unwrap_or(text.len()))
        .collect()
}

fn replace_in_spans(text: &str, spans: &[Range<usize>], pins: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len() + 80 * pins.len());
    let mut copied = 0;
    for span in spans {
        out.push_str(&text[copied..span.start]);
        out.push_str(&replace_image_values(&text[span.clone()], pins));
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Replaces the value of every `image` key whose value is one of `pins`' keys, keeping its
/// quoting and everything around it.
fn replace_image_values(text: &str, pins: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, _) in text.match_indices("image") {
        let Some(value) = image_value(text, at) else {
            continue;
        };
        let Some(to) = pins.get(&text[value.clone()]) else {
            continue;
        };
        out.push_str(&text[copied..value.start]);
        out.push_str(to);
        copied = value.end;
    }
    out.push_str(&text[copied..]);
    out
}

/// The byte range of the value of the `image` key whose name starts at `at`: `image: v`,
/// `- image: v`, `{…, image: v}`, `"image": "v"`, plain or quoted (quotes excluded). `None`
/// for anything else (`imagePullPolicy`, `baseimage`, a quoted value with escapes).
fn image_value(text: &str, at: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let (key_start, mut i) = match at.checked_sub(1).map(|b| bytes[b]) {
        Some(q @ (b'"' | b'\'')) if bytes.get(at + 5) == Some(&q) => (at - 1, at + 6),
        Some(b'"' | b'\'') => return None,
        _ => (at, at + 5),
    };
    let line_start = text[..key_start].rfind('\n').map_or(0, |n| n + 1);
    let lead = text[line_start..key_start].trim_end();
    let flow = lead.ends_with('{') || lead.ends_with(',');
    if !flow && !lead.chars().all(|c| c == '-' || c == ' ') {
        return None;
    }
    let blanks = |i: &mut usize| {
        while matches!(bytes.get(*i), Some(b' ' | b'\t')) {
            *i += 1;
        }
    };
    blanks(&mut i);
    if bytes.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    // A plain key needs a blank after its colon; a quoted one (JSON) need not.
    if key_start == at && !matches!(bytes.get(i), Some(b' ' | b'\t')) {
        return None;
    }
    blanks(&mut i);
    match *bytes.get(i)? {
        q @ (b'"' | b'\'') => {
            let start = i + 1;
            let end = start + text[start..].find(q as char)?;
            // Escapes (`\` in double quotes, `''` in single) would need unescaping: leave those.
            if text[start..end].contains('\\') || bytes.get(end + 1) == Some(&q) {
                return None;
            }
            Some(start..end)
        }
        _ => {
            let rest = &text[i..];
            let mut end = rest.find(['\n', '\r']).unwrap_or(rest.len());
            if let Some(comment) = rest[..end].find(" #") {
                end = comment;
            }
            if flow {
                if let Some(stop) = rest[..end].find([',', '}', ']']) {
                    end = stop;
                }
            }
            let value = rest[..end].trim_end();
            (!value.is_empty()).then_some(i..i + value.len())
        }
    }
}

// ---------------------------------------------------------------------------------------
// Text

/// The report for the terminal: each gap with why and its fixes, images that could not be
/// read, refusals, warnings, the pinned files, and a summary line.
pub fn render_text(report: &GateReport) -> String {
    let record = &report.record;
    let mut s = String::new();
    let (mut gaps, mut checked, mut unreadable) = (0, 0, 0);
    for w in &record.workloads {
        let name = match &w.namespace {
            Some(ns) => format!("{ns}/{}", w.name),
            None => w.name.clone(),
        };
        for c in &w.containers {
            checked += 1;
            if c.error.is_some() {
                unreadable += 1;
                continue;
            }
            if c.covered {
                continue;
            }
            gaps += 1;
            if c.missing.is_empty() {
                continue;
            }
            let init = if c.init {
                "init container"
            } else {
                "container"
            };
            let digest = c
                .digest
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            s.push_str(&format!(
                "GAP {} {name} {init} `{}` ({}): image {}{digest} lacks {}, needed by pool(s) {}\n",
                w.kind,
                c.container,
                w.source,
                c.image,
                c.missing.join(", "),
                c.missing_pools.join(", "),
            ));
            for f in report.findings.iter().filter(|f| {
                f.kind == FindingKind::EntryMismatch
                    && f.source == w.source
                    && f.container == c.container
            }) {
                let platform = f.platform.as_deref().unwrap_or_default();
                let detail = report
                    .images
                    .iter()
                    .filter(|i| i.image == c.image)
                    .flat_map(|i| &i.entries)
                    // Two entries may name one manifest (that is how an index lies).
                    .find(|e| e.digest == f.entry && e.platform.to_string() == platform)
                    .and_then(|e| e.detail.as_deref())
                    .unwrap_or("another platform");
                s.push_str(&format!(
                    "  its {platform} entry is not a {platform} image: {detail}\n"
                ));
            }
            if let Some(f) = &c.fixes {
                s.push_str(&format!(
                    "  fix: if polyarch builds this image, set in its polyarch.yaml entry: {}\n",
                    f.polyarch_platforms
                ));
                match &f.node_affinity {
                    Some(snippet) => {
                        s.push_str(&format!(
                            "  or keep the workload off those pools; under {}:\n",
                            f.node_affinity_path
                        ));
                        for line in snippet.lines() {
                            s.push_str("    ");
                            s.push_str(line);
                            s.push('\n');
                        }
                    }
                    None => s.push_str(
                        "  (no node affinity helps: no pool it can reach runs an arch all its images provide)\n",
                    ),
                }
            }
        }
    }
    // Refusals and failures first, then warnings: what stops the deploy stays on top.
    let (warnings, stops): (Vec<&Finding>, Vec<&Finding>) = report
        .findings
        .iter()
        .partition(|f| f.severity == Severity::Warning);
    for f in stops.into_iter().chain(warnings) {
        let prefix = match (f.severity, f.kind) {
            (Severity::Failure, _) => "UNREADABLE",
            (Severity::Gap, FindingKind::EntryMismatch) => continue,
            (Severity::Gap, _) => "REFUSED",
            (Severity::Warning, _) => "warning:",
        };
        s.push_str(&format!("{prefix} {}\n", f.message));
    }
    for image in &report.images {
        for w in &image.warnings {
            s.push_str(&format!("warning: image {}: {w}\n", image.image));
        }
    }
    for w in &record.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    for p in &report.pinned {
        let how = if p.reserialised {
            " (re-serialised: comments and formatting dropped)"
        } else {
            ""
        };
        s.push_str(&format!(
            "pinned: {} -> {}: {} image value(s){how}\n",
            p.source, p.path, p.pinned
        ));
    }
    let workloads = record.workloads.len();
    if record.covered {
        s.push_str(&format!(
            "covered: {checked} container(s) in {workloads} workload(s) have images for every pool they can be scheduled onto\n"
        ));
    } else {
        s.push_str(&format!(
            "not covered: {gaps} gap(s) in {checked} container(s) of {workloads} workload(s)"
        ));
        if unreadable > 0 {
            s.push_str(&format!(
                "; {unreadable} container(s) not checked: their image could not be read"
            ));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Platform;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn entry(claims: &str, config: &str, d: char) -> PlatformCoverage {
        let platform: Platform = claims.parse().unwrap();
        let config: Platform = config.parse().unwrap();
        let ok = platform == config;
        PlatformCoverage {
            detail: (!ok).then(|| {
                format!(
                    "entry {} says {platform} but its config says {config}",
                    digest(d)
                )
            }),
            platform,
            digest: Some(digest(d)),
            config_platform: Some(config),
            size: Some(500),
            annotations: Default::default(),
            status: if ok {
                PlatformStatus::Ok
            } else {
                PlatformStatus::ConfigMismatch
            },
            deep: None,
            build: None,
        }
    }

    fn contents(entries: Vec<PlatformCoverage>, attestations: &[char]) -> Result<Contents> {
        Ok(Contents {
            digest: digest('f'),
            media_type: "application/vnd.oci.image.index.v1+json".into(),
            annotations: Default::default(),
            entries,
            attestations: attestations.iter().map(|c| digest(*c)).collect(),
            warnings: Vec::new(),
        })
    }

    fn both() -> Result<Contents> {
        contents(
            vec![
                entry("linux/amd64", "linux/amd64", 'a'),
                entry("linux/arm64", "linux/arm64", 'b'),
            ],
            &[],
        )
    }

    fn file(name: &str, text: &str) -> ManifestFile {
        let path = PathBuf::from(name);
        ManifestFile {
            workloads: k8s::parse_workloads(&path, text).unwrap(),
            relative: path.clone(),
            path,
            text: text.to_string(),
        }
    }

    fn deployment(pod_spec: &str) -> ManifestFile {
        let indented: String = pod_spec.lines().map(|l| format!("      {l}\n")).collect();
        file(
            "deploy.yaml",
            &format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\n\
                 spec:\n  template:\n    spec:\n{indented}"
            ),
        )
    }

    /// Two kubectl nodes, one per arch, each reporting its runtime; the arm one is cordoned
    /// (and so tainted by the node controller).
    fn nodes() -> Vec<NodePool> {
        k8s::parse_nodes(
            Path::new("nodes.yaml"),
            "kind: List\nitems:\n\
             - metadata: {name: x1, labels: {kubernetes.io/arch: amd64, agentpool: general}}\n  \
               status: {nodeInfo: {containerRuntimeVersion: \"containerd://1.6.20\"}}\n\
             - metadata: {name: a1, labels: {kubernetes.io/arch: arm64, agentpool: graviton}}\n  \
               spec:\n    unschedulable: true\n    \
               taints: [{key: node.kubernetes.io/unschedulable, effect: NoSchedule}]\n  \
               status: {nodeInfo: {containerRuntimeVersion: \"containerd://1.4.13\"}}\n",
        )
        .unwrap()
    }

    fn read(images: Vec<(&str, Result<Contents>)>) -> BTreeMap<String, Result<Contents>> {
        images
            .into_iter()
            .map(|(i, c)| (i.to_string(), c))
            .collect()
    }

    const WEB: &str = "containers:\n- {name: web, image: r.io/web:v1}\n";

    #[test]
    fn an_entry_whose_config_is_another_platform_is_a_gap_for_the_pools_pulling_it() {
        // Both entries name the amd64 manifest, as a lying index does.
        let lying = contents(
            vec![
                entry("linux/amd64", "linux/amd64", 'a'),
                entry("linux/arm64", "linux/amd64", 'a'),
            ],
            &[],
        );
        let images = read(vec![("r.io/web:v1", lying)]);
        let report = judge(&[deployment(WEB)], &nodes(), &images, false);
        assert_eq!(report.exit_code(), exit::GAP);
        let c = &report.record.workloads[0].containers[0];
        // The cordoned arm64 node still counts: a cordon is lifted without a deploy.
        assert_eq!(c.pools, ["general", "graviton"]);
        assert_eq!(c.provided, ["linux/amd64"]);
        assert_eq!(c.missing_pools, ["graviton"]);
        let gaps: Vec<&Finding> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Gap)
            .collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].kind, FindingKind::EntryMismatch);
        assert_eq!(gaps[0].pools, ["graviton"]);
        assert_eq!(gaps[0].platform.as_deref(), Some("linux/arm64"));
        assert_eq!(gaps[0].entry.as_deref(), Some(digest('a').as_str()));
        assert_eq!(gaps[0].status, Some(PlatformStatus::ConfigMismatch));
        let text = render_text(&report);
        assert!(
            text.contains(
                "GAP Deployment shop/web container `web` (deploy.yaml#1): image r.io/web:v1"
            ) && text.contains("lacks linux/arm64, needed by pool(s) graviton"),
            "{text}"
        );
        assert!(
            text.contains("  its linux/arm64 entry is not a linux/arm64 image: entry sha256:aaaa")
                && text.contains("its config says linux/amd64"),
            "{text}"
        );
        // The fix offered keeps the pod on the arch that works.
        assert!(text.contains("values: [amd64]"), "{text}");
        assert!(
            text.contains("not covered: 1 gap(s) in 1 container(s)"),
            "{text}"
        );

        // A workload kept on amd64 never pulls the lying entry.
        let amd = deployment(&format!(
            "nodeSelector: {{kubernetes.io/arch: amd64}}\n{WEB}"
        ));
        let report = judge(&[amd], &nodes(), &images, false);
        assert_eq!(report.exit_code(), exit::COVERED);
        assert!(report
            .findings
            .iter()
            .all(|f| f.kind != FindingKind::EntryMismatch));
        // The record still shows the entry as it is.
        assert_eq!(
            report.images[0].entries[1].status,
            PlatformStatus::ConfigMismatch
        );
    }

    #[test]
    fn attestation_entries_warn_with_the_runtimes_and_strict_refuses() {
        let attested = || {
            contents(
                vec![
                    entry("linux/amd64", "linux/amd64", 'a'),
                    entry("linux/arm64", "linux/arm64", 'b'),
                ],
                &['c', 'd'],
            )
        };
        let images = read(vec![("r.io/web:v1", attested())]);
        let report = judge(&[deployment(WEB)], &nodes(), &images, false);
        assert_eq!(report.exit_code(), exit::COVERED);
        let warning = report
            .findings
            .iter()
            .find(|f| f.kind == FindingKind::Attestation)
            .unwrap();
        assert_eq!(warning.severity, Severity::Warning);
        assert_eq!(
            warning.runtimes,
            ["containerd://1.4.13", "containerd://1.6.20"]
        );
        assert_eq!(warning.attestations, [digest('c'), digest('d')]);
        assert!(
            warning.message.contains("unknown media type")
                && warning
                    .message
                    .contains("run containerd://1.4.13, containerd://1.6.20")
                && warning.message.contains("--provenance=false"),
            "{}",
            warning.message
        );
        let text = render_text(&report);
        assert!(
            text.contains("warning: Deployment shop/web container `web`"),
            "{text}"
        );
        assert!(
            text.starts_with("warning:") && text.contains("\ncovered:"),
            "{text}"
        );

        // Only the nodes the pod can reach are named.
        let amd = deployment(&format!(
            "nodeSelector: {{kubernetes.io/arch: amd64}}\n{WEB}"
        ));
        let report = judge(&[amd], &nodes(), &images, false);
        let warning = &report.findings[0];
        assert_eq!(warning.runtimes, ["containerd://1.6.20"]);

        let report = judge(&[deployment(WEB)], &nodes(), &images, true);
        assert_eq!(report.exit_code(), exit::GAP);
        assert!(!report.record.covered);
        let text = render_text(&report);
        assert!(
            text.contains("REFUSED Deployment shop/web container `web`")
                && text.contains("refused (--strict)"),
            "{text}"
        );
        assert!(text.contains("not covered: 1 gap(s)"), "{text}");

        // A pool file says nothing about runtimes.
        let pools = k8s::parse_nodes(
            Path::new("pools.yaml"),
            "pools:\n- {name: general, platform: linux/amd64}\n",
        )
        .unwrap();
        let report = judge(&[deployment(WEB)], &pools, &images, false);
        assert!(report.findings[0].runtimes.is_empty());
        assert!(report.findings[0]
            .message
            .contains("runtimes are not known"));
    }

    #[test]
    fn an_unreadable_image_is_reported_against_its_workload_and_the_rest_is_judged() {
        let two = file(
            "apps.yaml",
            "kind: Deployment\nmetadata: {name: a}\nspec: {template: {spec: {containers: [{name: a, image: r.io/gone:v1}]}}}\n\
             ---\n\
             kind: Deployment\nmetadata: {name: b}\nspec: {template: {spec: {containers: [{name: b, image: r.io/amd:v1}]}}}\n",
        );
        let images = read(vec![
            (
                "r.io/gone:v1",
                Err(Error::Registry {
                    registry: "r.io".into(),
                    message: "read manifest of r.io/gone:v1: manifest unknown".into(),
                }),
            ),
            (
                "r.io/amd:v1",
                contents(vec![entry("linux/amd64", "linux/amd64", 'a')], &[]),
            ),
        ]);
        let report = judge(&[two], &nodes(), &images, false);
        assert_eq!(report.exit_code(), exit::FAILURE);
        let unreadable: Vec<&Finding> = report
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Unreadable)
            .collect();
        assert_eq!(unreadable.len(), 1);
        assert_eq!(unreadable[0].source, "apps.yaml#1");
        assert_eq!(unreadable[0].workload, "Deployment a");
        assert!(unreadable[0].message.contains("manifest unknown"));
        let gone = report.images.iter().find(|i| i.image == "r.io/gone:v1");
        assert!(gone
            .unwrap()
            .error
            .as_deref()
            .unwrap()
            .contains("manifest unknown"));
        // The other workload was still judged: amd64 only, an arm64 pool reachable.
        let b = &report.record.workloads[1].containers[0];
        assert_eq!(b.missing_pools, ["graviton"]);
        let text = render_text(&report);
        assert!(
            text.contains("UNREADABLE Deployment a container `a` (apps.yaml#1): image r.io/gone:v1 could not be read"),
            "{text}"
        );
        assert!(
            text.contains("GAP Deployment b container `b` (apps.yaml#2)"),
            "{text}"
        );
        // What stops the deploy comes before the (re-tag) warnings.
        assert!(text.find("UNREADABLE") < text.find("warning:"), "{text}");
        assert!(
            text.contains("not covered: 1 gap(s) in 2 container(s) of 2 workload(s); 1 container(s) not checked"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["schema"], "polyarch/gate/v1");
        assert!(json["workloads"][0]["containers"][0]["error"].is_string());
    }

    #[test]
    fn pull_policy_defaults_follow_kubernetes() {
        use PolicySource::{Default, Written};
        for (image, written, want) in [
            ("nginx", None, ("Always", Default)),
            ("nginx:latest", None, ("Always", Default)),
            ("nginx:1.25", None, ("IfNotPresent", Default)),
            ("127.0.0.1:5000/x", None, ("Always", Default)),
            ("127.0.0.1:5000/x:v1", None, ("IfNotPresent", Default)),
            (
                "127.0.0.1:5000/x@sha256:abc",
                None,
                ("IfNotPresent", Default),
            ),
            ("r.io/x:latest@sha256:abc", None, ("Always", Default)),
            ("r.io/x:v1", Some("Always"), ("Always", Written)),
            (
                "r.io/x:latest",
                Some("IfNotPresent"),
                ("IfNotPresent", Written),
            ),
        ] {
            let (policy, source) = effective_pull_policy(image, written);
            assert_eq!((policy.as_str(), source), want, "{image} {written:?}");
        }
    }

    #[test]
    fn mutable_tags_pulled_if_not_present_warn_per_container() {
        let f = deployment(
            "containers:\n\
             - {name: default, image: r.io/web:v1}\n\
             - {name: written, image: r.io/web:latest, imagePullPolicy: IfNotPresent}\n\
             - {name: always, image: r.io/web:v1, imagePullPolicy: Always}\n\
             - {name: latest, image: r.io/web:latest}\n\
             - {name: pinned, image: \"r.io/web:v1@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\"}\n\
             initContainers:\n\
             - {name: init, image: r.io/web:v1}\n",
        );
        let images = read(vec![
            ("r.io/web:v1", both()),
            ("r.io/web:latest", both()),
            (
                "r.io/web:v1@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                both(),
            ),
        ]);
        let report = judge(&[f], &nodes(), &images, false);
        assert_eq!(report.exit_code(), exit::COVERED);
        let warned: Vec<(&str, Option<PolicySource>)> = report
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::PullPolicy)
            .map(|f| (f.container.as_str(), f.pull_policy_source))
            .collect();
        assert_eq!(
            warned,
            [
                ("default", Some(PolicySource::Default)),
                ("written", Some(PolicySource::Written)),
                ("init", Some(PolicySource::Default)),
            ]
        );
        let message = &report.findings[0].message;
        assert!(
            message.starts_with("Deployment shop/web container `default` (deploy.yaml#1): image r.io/web:v1 is a mutable tag")
                && message.contains(&format!("r.io/web:v1@{}", digest('f')))
                && message.contains("imagePullPolicy: Always"),
            "{message}"
        );
    }

    const PINNABLE: &str = "\
# Source: chart/templates/web.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # the storefront
spec:
  template:
    spec:
      initContainers:
        - name: migrate
          image: \"r.io/migrate:v1\"  # runs first
      containers:
        - image: r.io/web:v1 # pinned by the gate
          name: web
          imagePullPolicy: IfNotPresent
        - {name: side, image: 'r.io/web:v1', args: [--image, r.io/web:v1]}
---
# a config map that mentions the image: not a container, left alone
kind: ConfigMap
metadata: {name: c}
data:
  values.yaml: |
    image: r.io/web:v1
---
kind: List
items:
- kind: Pod
  metadata: {name: p}
  spec:
    containers:
    - name: p
      image: r.io/web:v1
";

    #[test]
    fn pin_replaces_only_container_image_values_and_keeps_the_text() {
        let f = file("deploy.yaml", PINNABLE);
        let (d1, d2) = (digest('1'), digest('2'));
        let digests = BTreeMap::from([
            ("r.io/web:v1", d1.as_str()),
            ("r.io/migrate:v1", d2.as_str()),
        ]);
        let (text, pinned, reserialised) = pin_file(&f, &digests).unwrap();
        assert_eq!((pinned, reserialised), (4, false));
        let web = format!("r.io/web:v1@{d1}");
        let want = PINNABLE
            .replace(
                "image: \"r.io/migrate:v1\"",
                &format!("image: \"r.io/migrate:v1@{d2}\""),
            )
            .replace("- image: r.io/web:v1 #", &format!("- image: {web} #"))
            .replace("image: 'r.io/web:v1',", &format!("image: '{web}',"))
            .replace(
                "      image: r.io/web:v1\n",
                &format!("      image: {web}\n"),
            );
        assert_eq!(text, want);
        // Comments, the args mentioning the image and the config map are as written.
        assert!(text.contains("# pinned by the gate") && text.contains("[--image, r.io/web:v1]"));
        assert!(text.contains("values.yaml: |\n    image: r.io/web:v1\n"));
        let back = k8s::parse_workloads(Path::new("deploy.yaml"), &text).unwrap();
        let images: Vec<&str> = back
            .iter()
            .flat_map(|w| &w.containers)
            .map(|c| c.image.as_str())
            .collect();
        let migrate = format!("r.io/migrate:v1@{d2}");
        assert_eq!(
            images,
            [web.as_str(), web.as_str(), migrate.as_str(), web.as_str()]
        );
    }

    #[test]
    fn pin_re_serialises_what_it_cannot_replace_in_place_and_handles_json() {
        // The value comes from an anchor elsewhere: no `image: r.io/x:v1` to replace.
        let aliased = file(
            "a.yaml",
            "x: &img r.io/x:v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: *img\n",
        );
        let d = digest('3');
        let digests = BTreeMap::from([("r.io/x:v1", d.as_str())]);
        let (text, pinned, reserialised) = pin_file(&aliased, &digests).unwrap();
        assert_eq!((pinned, reserialised), (1, true));
        let back = k8s::parse_workloads(Path::new("a.yaml"), &text).unwrap();
        assert_eq!(back[0].containers[0].image, format!("r.io/x:v1@{d}"));

        let json = file(
            "p.json",
            "{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"r.io/x:v1\"}]}}\n",
        );
        let (text, pinned, reserialised) = pin_file(&json, &digests).unwrap();
        assert_eq!((pinned, reserialised), (1, false));
        assert_eq!(
            text,
            json.text.replace("r.io/x:v1", &format!("r.io/x:v1@{d}"))
        );

        // Nothing readable to pin: the file as read.
        let (text, pinned, _) = pin_file(&json, &BTreeMap::new()).unwrap();
        assert_eq!((text.as_str(), pinned), (json.text.as_str(), 0));
    }

    #[test]
    fn image_values_are_found_in_every_spelling_and_nothing_else() {
        let pins = BTreeMap::from([("i:1", "i:1@d".to_string())]);
        for (text, want) in [
            ("image: i:1\n", "image: i:1@d\n"),
            ("  - image:   i:1   # c\n", "  - image:   i:1@d   # c\n"),
            ("- {name: c, image: i:1}\n", "- {name: c, image: i:1@d}\n"),
            ("{\"image\":\"i:1\"}", "{\"image\":\"i:1@d\"}"),
            ("'image': 'i:1'\r\n", "'image': 'i:1@d'\r\n"),
            ("imagePullPolicy: i:1\n", "imagePullPolicy: i:1\n"),
            ("baseimage: i:1\n", "baseimage: i:1\n"),
            ("image: i:10\n", "image: i:10\n"),
            ("image: \"i:1\\n\"\n", "image: \"i:1\\n\"\n"),
            ("env: [image: i:1]\n", "env: [image: i:1]\n"),
            ("image:i:1\n", "image:i:1\n"),
        ] {
            assert_eq!(replace_image_values(text, &pins), want, "{text:?}");
        }
    }

    #[test]
    fn document_spans_are_numbered_as_the_parser_numbers_documents() {
        let fixture = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/k8s/deploy.yaml"),
        )
        .unwrap();
        for text in [
            fixture.as_str(),
            "a: 1\n---\nb: 2\n",
            "# c\n---\na: 1\n---\n---\nc: 3\n",
            "%YAML 1.1\n---\na: 1\n",
            "a: 1\n--- \nb: 2\n---\n",
            "--- {a: 1}\n--- [b]\n",
        ] {
            let docs = k8s::documents(Path::new("t.yaml"), text).unwrap();
            let spans = yaml_document_spans(text);
            for (index, value) in docs {
                let span = &text[spans[index - 1].clone()];
                let alone = k8s::documents(Path::new("t.yaml"), span).unwrap();
                assert_eq!(alone, [(1, value)], "{text:?} #{index}");
            }
        }
    }

    #[test]
    fn pin_dir_must_be_new_or_empty_and_names_must_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            file("a/deploy.yaml", WEB_POD),
            file("a/other.yaml", WEB_POD),
        ];
        check_pin_dir(&dir.path().join("new"), &files).unwrap();
        check_pin_dir(dir.path(), &files).unwrap();
        std::fs::write(dir.path().join("stale.yaml"), "").unwrap();
        let err = check_pin_dir(dir.path(), &files).unwrap_err();
        assert!(matches!(err, Error::Usage(_)));
        assert!(err.to_string().contains("not empty"), "{err}");
        let mut twins = [
            file("a/deploy.yaml", WEB_POD),
            file("b/deploy.yaml", WEB_POD),
        ];
        for f in &mut twins {
            f.relative = PathBuf::from("deploy.yaml");
        }
        let err = check_pin_dir(&dir.path().join("new"), &twins).unwrap_err();
        assert!(
            err.to_string()
                .contains("a/deploy.yaml and b/deploy.yaml would both be written as deploy.yaml"),
            "{err}"
        );
    }

    const WEB_POD: &str =
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: r.io/web:v1}]}\n";

    #[test]
    fn a_malformed_image_reference_is_a_usage_error_naming_its_field() {
        let f = deployment("containers:\n- {name: a, image: r.io/ok:v1}\ninitContainers:\n- {name: b, image: \"R.io/Bad:v1\"}\n");
        let err = image_references(&[f]).unwrap_err();
        assert_eq!(err.exit_code(), exit::USAGE);
        let err = err.to_string();
        assert!(
            err.starts_with(
                "deploy.yaml#1: spec.template.spec.initContainers[0].image: `R.io/Bad:v1`"
            ),
            "{err}"
        );
    }
}

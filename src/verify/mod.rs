//! Reading a reference back (never from memory) and judging whether it covers the declared
//! platforms: one entry per platform, each entry's config agreeing with the entry, and no
//! attestation entries (older containerd fails on them with "unknown media type").

use crate::base::digest::Digest;
use crate::base::oci::{self, ConfigPlatform, Parsed};
use crate::base::progress::{Event, Phase, Reporter};
use crate::registry::{ClientError, Registry, RegistryError};
use crate::verify::coverage_record::{DeepCheck, ImageCoverage, PlatformCoverage, PlatformStatus};
use crate::verify::entrypoint::{DeepReport, Finding};
use crate::Platform;
use futures_util::future::Either;
use oci_client::Reference;
use oci_spec::image::ImageManifest;
use std::collections::BTreeMap;

mod attached;
pub mod coverage_record;
pub mod entrypoint;
mod error;
mod image;
mod remote_layers;

pub use error::VerifyError;
pub use image::verify_image;

/// Nested indexes deeper than this are reported rather than followed.
const MAX_INDEX_DEPTH: usize = 4;

/// Where manifests and configs are read from: a registry repository or an OCI layout.
pub trait ContentSource {
    /// The source's own failures; verify hands them up as [`VerifyError::Source`].
    type Error: std::error::Error + Send + Sync + 'static;
    /// Resolves the reference being verified: manifest bytes and their digest.
    fn resolve(&self) -> impl std::future::Future<Output = Result<(Vec<u8>, Digest), Self::Error>>;
    /// A manifest by digest, its content checked against the digest.
    fn manifest(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<u8>, Self::Error>>;
    /// A small JSON blob (a config) by digest, checked against the digest.
    fn json_blob(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<u8>, Self::Error>>;
    /// The descriptors listed as referrers of the manifest `digest` (empty: none).
    fn referrers(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<serde_json::Value>, Self::Error>>;
    /// [`ContentSource::referrers`] of each of `digests`, in order, asked at once.
    fn referrers_of(
        &self,
        digests: &[&Digest],
    ) -> impl std::future::Future<Output = Vec<Result<Vec<serde_json::Value>, Self::Error>>> {
        futures_util::future::join_all(digests.iter().map(|d| self.referrers(d)))
    }
    /// `repo` part for `repo@sha256:…` pins.
    fn repository(&self) -> String;
    /// The config an earlier run saw the manifest `digest` name: asked for beside the
    /// manifest rather than after it.
    fn known_config(&self, _manifest: &Digest) -> Option<Digest> {
        None
    }
    /// The config the manifest `digest` names, for [`ContentSource::known_config`].
    fn learned_config(&self, _manifest: &Digest, _config: &Digest) {}
    /// What the reference resolved to when last read (bytes and digest): its entries are
    /// read beside resolving it again, and count only if it still resolves there.
    fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
        None
    }
    /// What the reference resolves to now, for [`ContentSource::last_resolved`].
    fn resolved(&self, _bytes: &[u8], _digest: &Digest) {}
    /// `--deep`: streams the layers and checks the entrypoint's binary against `platform`.
    fn inspect(
        &self,
        config: &[u8],
        layers: &[(Digest, String)],
        platform: &Platform,
    ) -> impl std::future::Future<Output = Result<DeepReport, Self::Error>>;
}

pub struct RegistrySource<'a> {
    pub registry: &'a Registry,
    pub reference: Reference,
    pub memory: &'a dyn ReadMemory,
    /// The index this run just pushed under `reference`, known byte for byte: resolving
    /// takes it from here, and the caller reads the tag back beside the entries and checks
    /// that it names exactly this digest (see [`verify_image`]).
    pub pushed: Option<&'a oci::ManifestBlob>,
}

/// What earlier reads found, remembered across runs, so that `verify` asks for what it
/// will need in fewer waves; everything is still read and checked. A manifest's digest
/// fixes its config's, so a remembered config is never stale; a tag's index may be, so
/// it counts only when the tag, read beside it, still names its digest.
pub trait ReadMemory: Sync {
    /// The config the manifest `manifest` names.
    fn config_of(&self, manifest: &Digest) -> Option<Digest>;
    fn remember(&self, manifest: &Digest, config: &Digest);
    /// The manifest (bytes and digest) `reference` resolved to when last read.
    fn resolved_by(&self, reference: &str) -> Option<(Vec<u8>, Digest)>;
    fn remember_resolved(&self, reference: &str, bytes: &[u8], digest: &Digest);
}

/// Nothing remembered.
impl ReadMemory for () {
    fn config_of(&self, _: &Digest) -> Option<Digest> {
        None
    }
    fn remember(&self, _: &Digest, _: &Digest) {}
    fn resolved_by(&self, _: &str) -> Option<(Vec<u8>, Digest)> {
        None
    }
    fn remember_resolved(&self, _: &str, _: &[u8], _: &Digest) {}
}

impl ContentSource for RegistrySource<'_> {
    type Error = ClientError;

    async fn resolve(&self) -> Result<(Vec<u8>, Digest), ClientError> {
        match self.pushed {
            Some(index) => Ok((index.bytes.clone(), index.digest.clone())),
            None => self.registry.get_manifest(&self.reference).await,
        }
    }

    async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        let by_digest = self.reference.clone_with_digest(digest.to_string());
        let (bytes, _) = self.registry.get_manifest(&by_digest).await?;
        Ok(bytes)
    }

    async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        self.registry.get_json_blob(&self.reference, digest).await
    }

    async fn referrers(&self, digest: &Digest) -> Result<Vec<serde_json::Value>, ClientError> {
        self.registry.referrers(&self.reference, digest).await
    }

    async fn referrers_of(
        &self,
        digests: &[&Digest],
    ) -> Vec<Result<Vec<serde_json::Value>, ClientError>> {
        self.registry.referrers_of(&self.reference, digests).await
    }

    fn repository(&self) -> String {
        format!(
            "{}/{}",
            self.reference.registry(),
            self.reference.repository()
        )
    }

    fn known_config(&self, manifest: &Digest) -> Option<Digest> {
        self.memory.config_of(manifest)
    }

    fn learned_config(&self, manifest: &Digest, config: &Digest) {
        self.memory.remember(manifest, config)
    }

    fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
        match self.pushed {
            Some(_) => None,
            None => self.memory.resolved_by(&self.reference.whole()),
        }
    }

    fn resolved(&self, bytes: &[u8], digest: &Digest) {
        if self.pushed.is_none() {
            self.memory
                .remember_resolved(&self.reference.whole(), bytes, digest)
        }
    }

    async fn inspect(
        &self,
        config: &[u8],
        layers: &[(Digest, String)],
        platform: &Platform,
    ) -> Result<DeepReport, ClientError> {
        remote_layers::inspect_remote(self.registry, &self.reference, config, layers, platform)
            .await
    }
}

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
}

/// What verify checks beyond the platforms: `--deep`, `--require-provenance`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checks {
    pub deep: bool,
    pub require_provenance: bool,
}

/// A platform manifest found under the reference.
struct Entry {
    platform: Option<Platform>,
    digest: Digest,
    size: u64,
}

/// What an index and the indexes nested in it hold.
#[derive(Default)]
struct Collected {
    entries: Vec<Entry>,
    /// Attestation entries, skipped: their digests.
    attestations: Vec<String>,
    warnings: Vec<String>,
}

/// What a reference holds, entry by entry, before any platform is declared: the deploy gate
/// judges each entry against the nodes that would pull it.
pub struct Contents<E = ClientError> {
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: Digest,
    pub media_type: String,
    /// The index's annotations.
    pub annotations: BTreeMap<String, String>,
    /// Every platform entry in index order, its config (and with `deep` its binary) checked
    /// against the entry's platform.
    pub entries: Vec<PlatformCoverage>,
    /// Digests of attestation entries (`unknown/unknown`).
    pub attestations: Vec<String>,
    pub warnings: Vec<String>,
    /// What is attached to each entry, by the entry's digest.
    pub(crate) attached: BTreeMap<Digest, attached::Listing<E>>,
}

/// Reads the reference and checks every entry; `target.declared` is not looked at.
pub async fn read_contents<S: ContentSource>(
    source: &S,
    target: &Target,
    reporter: &dyn Reporter,
) -> Result<Contents<S::Error>, VerifyError<S::Error>> {
    reporter.report(Event::Phase {
        image: target.name.clone(),
        platform: None,
        phase: Phase::Verify,
        message: format!("reading {} back", target.reference),
    });
    // What the reference named last time is read beside resolving it again: if it still
    // names that digest, everything was read in the same wave as the reference itself.
    // A reference that moved has the reads for its old manifest dropped as soon as that is
    // known (with `--deep` they stream layers).
    let (bytes, digest) = match source.last_resolved() {
        Some((last, last_digest)) => {
            let guessed = std::pin::pin!(contents_of(source, target, last, last_digest.clone()));
            let now = std::pin::pin!(source.resolve());
            let (now, guessed) = match futures_util::future::select(now, guessed).await {
                Either::Left((now, guessed)) => (now, Either::Left(guessed)),
                Either::Right((contents, now)) => (now.await, Either::Right(contents)),
            };
            let now = now.map_err(VerifyError::Source)?;
            if now.1 == last_digest {
                return match guessed {
                    Either::Left(guessed) => guessed.await,
                    Either::Right(contents) => contents,
                };
            }
            now
        }
        None => source.resolve().await.map_err(VerifyError::Source)?,
    };
    source.resolved(&bytes, &digest);
    contents_of(source, target, bytes, digest).await
}

/// What the manifest `bytes` (of `digest`) the reference resolved to holds, entry by
/// entry, each checked.
async fn contents_of<S: ContentSource>(
    source: &S,
    target: &Target,
    bytes: Vec<u8>,
    digest: Digest,
) -> Result<Contents<S::Error>, VerifyError<S::Error>> {
    let mut warnings = Vec::new();
    let mut attestations = Vec::new();
    let mut entries = Vec::new();
    let mut annotations = BTreeMap::new();
    let media_type = match oci::parse_manifest(&bytes).map_err(|e| unreadable(target, e))? {
        Parsed::Unknown { media_type } => {
            warnings.push(format!(
                "{} has media type {media_type}, which is not an image index or manifest",
                target.reference
            ));
            media_type
        }
        Parsed::Image { media_type, .. } => {
            entries.push(Entry {
                platform: None,
                digest: digest.clone(),
                size: bytes.len() as u64,
            });
            media_type
        }
        Parsed::Index { media_type, index } => {
            annotations = index
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            let collected = collect_entries(source, target, index).await?;
            entries = collected.entries;
            attestations = collected.attestations;
            warnings.extend(collected.warnings);
            media_type
        }
    };

    let (found, attached) = check_entries(source, target, &entries, &mut warnings).await?;
    Ok(Contents {
        digest,
        media_type,
        annotations,
        entries: found,
        attestations,
        warnings,
        attached,
    })
}

/// Entries are independent: their manifests and configs are read, and what is attached
/// to them listed, all concurrently.
async fn check_entries<S: ContentSource>(
    source: &S,
    target: &Target,
    entries: &[Entry],
    warnings: &mut Vec<String>,
) -> Result<
    (
        Vec<PlatformCoverage>,
        BTreeMap<Digest, attached::Listing<S::Error>>,
    ),
    VerifyError<S::Error>,
> {
    let digests: Vec<&Digest> = entries.iter().map(|e| &e.digest).collect();
    let (checked, attached) = futures_util::future::join(
        futures_util::future::try_join_all(
            entries
                .iter()
                .map(|entry| check_entry(source, target, entry)),
        ),
        attached::list(source, &digests),
    )
    .await;
    let mut found = Vec::new();
    for (coverage, entry_warnings) in checked? {
        found.push(coverage);
        warnings.extend(entry_warnings);
    }
    Ok((found, attached))
}

pub async fn verify<S: ContentSource>(
    source: &S,
    target: &Target,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage, VerifyError<S::Error>> {
    let Contents {
        digest,
        media_type,
        annotations,
        entries: found,
        attestations,
        mut warnings,
        attached,
    } = read_contents(source, target, reporter).await?;

    let Matched {
        mut platforms,
        missing,
        duplicated,
    } = match_declared(target, &found, &mut warnings);
    let unexpected: Vec<Platform> = found
        .iter()
        .map(|p| p.platform.clone())
        .filter(|p| !target.declared.contains(p))
        .collect();
    for platform in &unexpected {
        warnings.push(format!(
            "{} also provides {platform}, which is not declared",
            target.reference
        ));
    }
    attached::apply(target, &mut platforms, attached, &mut warnings)?;
    let covered = missing.is_empty()
        && attestations.is_empty()
        && !duplicated
        && platforms.iter().all(|p| p.status == PlatformStatus::Ok);
    Ok(ImageCoverage {
        name: target.name.clone(),
        reference: target.reference.clone(),
        tags: target.tags.clone(),
        pinned: format!("{}@{}", source.repository(), digest),
        digest,
        media_type,
        annotations,
        declared: target.declared.clone(),
        platforms,
        missing,
        unexpected,
        attestations,
        warnings,
        covered,
    })
}

/// Each declared platform's entry (the first when the index lists it more than once, a
/// warning said), and the declared platforms the index lacks.
fn match_declared(
    target: &Target,
    found: &[PlatformCoverage],
    warnings: &mut Vec<String>,
) -> Matched {
    let mut platforms = Vec::new();
    let mut missing = Vec::new();
    let mut duplicated = false;
    for declared in &target.declared {
        let matching: Vec<&PlatformCoverage> =
            found.iter().filter(|p| &p.platform == declared).collect();
        match matching.as_slice() {
            [] => {
                missing.push(declared.clone());
                platforms.push(PlatformCoverage {
                    platform: declared.clone(),
                    digest: None,
                    config_platform: None,
                    size: None,
                    status: PlatformStatus::Missing,
                    annotations: Default::default(),
                    detail: Some(format!("{} has no entry for {declared}", target.reference)),
                    deep: None,
                    build: None,
                    attached: Vec::new(),
                });
            }
            [one] => platforms.push((*one).clone()),
            [first, ..] => {
                duplicated = true;
                warnings.push(format!(
                    "{} lists {declared} {} times; runtimes pick the first, so the others are dead weight",
                    target.reference,
                    matching.len()
                ));
                platforms.push((*first).clone());
            }
        }
    }
    Matched {
        platforms,
        missing,
        duplicated,
    }
}

/// The declared platforms as the index provides them.
struct Matched {
    /// One per declared platform, in declared order (a missing one with its status).
    platforms: Vec<PlatformCoverage>,
    missing: Vec<Platform>,
    /// Some declared platform is listed more than once.
    duplicated: bool,
}

fn unreadable<E>(target: &Target, source: oci::OciError) -> VerifyError<E> {
    let reference = target.reference.clone();
    target_error(target, RegistryError::Unreadable { reference, source })
}

/// A registry error about `target`, under its registry (an OCI layout: its reference).
fn target_error<E>(target: &Target, source: RegistryError) -> VerifyError<E> {
    let registry = match crate::registry::parse_reference(&target.reference) {
        Ok(r) if !target.reference.starts_with("oci:") => r.registry().to_string(),
        _ => target.reference.clone(),
    };
    VerifyError::Content(ClientError::registry(registry, source))
}

/// A digest a manifest names, as oci-spec read it (any algorithm) into ours.
fn parse_digest<E>(
    target: &Target,
    digest: &oci_spec::image::Digest,
) -> Result<Digest, VerifyError<E>> {
    digest.as_ref().parse().map_err(|source| {
        let value = digest.to_string();
        unreadable(target, oci::OciError::Digest { value, source })
    })
}

/// Flattens (possibly nested) indexes into platform entries, setting aside attestations.
async fn collect_entries<S: ContentSource>(
    source: &S,
    target: &Target,
    index: Box<oci_spec::image::ImageIndex>,
) -> Result<Collected, VerifyError<S::Error>> {
    let mut found = Collected::default();
    let mut pending = vec![(index, 0)];
    while let Some((index, depth)) = pending.pop() {
        for descriptor in index.manifests() {
            let media_type = descriptor.media_type().to_string();
            if oci::is_attestation(descriptor) {
                found.attestations.push(descriptor.digest().to_string());
                continue;
            }
            let digest = parse_digest(target, descriptor.digest())?;
            if oci::is_index_media_type(&media_type) {
                if depth + 1 >= MAX_INDEX_DEPTH {
                    found.warnings.push(format!(
                        "index {digest} is nested more than {MAX_INDEX_DEPTH} deep; not followed"
                    ));
                    continue;
                }
                let bytes = source
                    .manifest(&digest)
                    .await
                    .map_err(VerifyError::Source)?;
                match oci::parse_manifest(&bytes) {
                    Ok(Parsed::Index { index, .. }) => pending.push((index, depth + 1)),
                    Ok(_) => found
                        .warnings
                        .push(format!("{digest} claims to be an index but is not")),
                    Err(e) => found.warnings.push(format!("nested index {digest}: {e}")),
                }
            } else if oci::is_image_media_type(&media_type) {
                found.entries.push(Entry {
                    platform: oci::descriptor_platform(descriptor),
                    digest,
                    size: descriptor.size(),
                });
            } else {
                found.warnings.push(format!(
                    "entry {digest} has unknown media type {media_type}; ignored"
                ));
            }
        }
    }
    Ok(found)
}

/// Fetches an entry's manifest and config and compares the config's platform with the entry's.
/// An index entry's manifest, which must be an image manifest.
async fn entry_manifest<S: ContentSource>(
    source: &S,
    target: &Target,
    entry: &Entry,
) -> Result<Box<ImageManifest>, VerifyError<S::Error>> {
    let bytes = source
        .manifest(&entry.digest)
        .await
        .map_err(VerifyError::Source)?;
    match oci::parse_manifest(&bytes).map_err(|e| unreadable(target, e))? {
        Parsed::Image { manifest, .. } => Ok(manifest),
        _ => Err(target_error(
            target,
            RegistryError::EntryNotImage {
                reference: target.reference.clone(),
                digest: entry.digest.to_string(),
            },
        )),
    }
}

/// `--deep`: the entry's entrypoint binary, read from its layers.
async fn inspect_entry<S: ContentSource>(
    source: &S,
    target: &Target,
    manifest: &ImageManifest,
    config: &[u8],
    platform: &Platform,
) -> Result<DeepReport, VerifyError<S::Error>> {
    let layers = manifest
        .layers()
        .iter()
        .map(|l| {
            Ok((
                parse_digest(target, l.digest())?,
                l.media_type().to_string(),
            ))
        })
        .collect::<Result<Vec<_>, VerifyError<S::Error>>>()?;
    source
        .inspect(config, &layers, platform)
        .await
        .map_err(VerifyError::Source)
}

async fn check_entry<S: ContentSource>(
    source: &S,
    target: &Target,
    entry: &Entry,
) -> Result<(PlatformCoverage, Vec<String>), VerifyError<S::Error>> {
    let mut warnings = Vec::new();
    // The config a remembered manifest names is asked for at once, so an entry costs one
    // round trip, not two; it counts only if the manifest, read and checked, names it.
    let guess = source.known_config(&entry.digest);
    let early = async {
        match &guess {
            Some(config) => Some(source.json_blob(config).await),
            None => None,
        }
    };
    let (manifest, early) =
        futures_util::future::join(entry_manifest(source, target, entry), early).await;
    let manifest = manifest?;
    let config_digest = parse_digest(target, manifest.config().digest())?;
    let config = match early {
        Some(Ok(config)) if guess.as_ref() == Some(&config_digest) => config,
        _ => source
            .json_blob(&config_digest)
            .await
            .map_err(VerifyError::Source)?,
    };
    if guess.as_ref() != Some(&config_digest) {
        source.learned_config(&entry.digest, &config_digest);
    }
    let (config_platform, detail) = match ConfigPlatform::from_config(&config) {
        Ok(p) => (Some(p.normalized()), None),
        Err(e) => {
            warnings.push(format!("config {config_digest}: {e}"));
            (None, Some(format!("config {config_digest}: {e}")))
        }
    };
    // A single-platform manifest has no entry platform: its config says what it is.
    let platform = entry
        .platform
        .clone()
        .or_else(|| config_platform.clone())
        .unwrap_or_else(|| Platform::new("unknown", "unknown", None));
    let mut status = match &config_platform {
        Some(c) if c == &platform => PlatformStatus::Ok,
        _ => PlatformStatus::ConfigMismatch,
    };
    let deep = if target.deep {
        let report = inspect_entry(source, target, &manifest, &config, &platform).await?;
        match &report.finding {
            Finding::Match => {}
            Finding::BinaryMismatch { .. } => {
                if status == PlatformStatus::Ok {
                    status = PlatformStatus::BinaryMismatch;
                }
            }
            _ => warnings.push(format!("{platform}: {}", report.detail)),
        }
        Some(DeepCheck::from(&report))
    } else {
        None
    };
    let detail = detail.or_else(|| {
        mismatch_detail(
            &status,
            deep.as_ref(),
            entry,
            &platform,
            config_platform.as_ref(),
        )
    });
    Ok((
        PlatformCoverage {
            platform,
            digest: Some(entry.digest.clone()),
            config_platform,
            size: Some(entry.size),
            status,
            annotations: manifest
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            detail,
            deep,
            attached: Vec::new(),
            build: None,
        },
        warnings,
    ))
}

/// Why an entry is not what it claims: its binary's or its config's platform.
fn mismatch_detail(
    status: &PlatformStatus,
    deep: Option<&DeepCheck>,
    entry: &Entry,
    platform: &Platform,
    config_platform: Option<&Platform>,
) -> Option<String> {
    (*status == PlatformStatus::BinaryMismatch)
        .then(|| deep.map(|d| d.detail.clone()))
        .flatten()
        .or_else(|| {
            (*status == PlatformStatus::ConfigMismatch).then(|| {
                format!(
                    "entry {} says {platform} but its config says {}",
                    entry.digest,
                    config_platform.map_or("nothing".to_string(), |c| c.to_string())
                )
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::entrypoint::DeepReport;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A registry's content by digest; each read records whether any read had finished
    /// when it was asked (it had, if it waited for another).
    #[derive(Default)]
    struct Fake {
        index: Vec<u8>,
        blobs: BTreeMap<Digest, Vec<u8>>,
        known: BTreeMap<Digest, Digest>,
        /// What the reference resolved to last time; with it, resolving is a read too.
        last: Option<(Vec<u8>, Digest)>,
        finished: AtomicUsize,
        asked: Mutex<Vec<(String, usize)>>,
    }

    impl Fake {
        /// A 2-platform index; `remembered`: the configs its manifests name are known.
        fn two_platforms(remembered: bool) -> Fake {
            let mut fake = Fake::default();
            let mut entries = Vec::new();
            for arch in ["amd64", "arm64"] {
                let config = json!({"architecture": arch, "os": "linux"}).to_string();
                let config_digest = fake.put(config.into_bytes());
                let manifest = json!({"schemaVersion": 2, "mediaType": oci::OCI_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": config_digest.as_str(), "size": 1},
                    "layers": []});
                let digest = fake.put(manifest.to_string().into_bytes());
                if remembered {
                    fake.known.insert(digest.clone(), config_digest);
                }
                entries.push(
                    json!({"mediaType": oci::OCI_MANIFEST, "digest": digest.as_str(),
                    "size": 1, "platform": {"architecture": arch, "os": "linux"}}),
                );
            }
            fake.index = json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX,
                "manifests": entries})
            .to_string()
            .into_bytes();
            fake.put(fake.index.clone());
            fake
        }

        fn put(&mut self, bytes: Vec<u8>) -> Digest {
            let digest = Digest::of(&bytes);
            self.blobs.insert(digest.clone(), bytes);
            digest
        }

        async fn read(&self, what: &str, digest: &Digest) -> Result<Vec<u8>, ClientError> {
            let finished = self.finished.load(Ordering::SeqCst);
            let name = format!("{what} {}", digest.short());
            self.asked.lock().unwrap().push((name, finished));
            // Every read that is asked at once is asked before any of them finishes.
            tokio::task::yield_now().await;
            let Some(bytes) = self.blobs.get(digest) else {
                // Content the registry does not hold: a read that never ends.
                return std::future::pending().await;
            };
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(bytes.clone())
        }

        fn asked_late(&self) -> Vec<String> {
            let asked = self.asked.lock().unwrap();
            asked
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(name, _)| name.clone())
                .collect()
        }
    }

    impl ContentSource for Fake {
        type Error = ClientError;

        async fn resolve(&self) -> Result<(Vec<u8>, Digest), ClientError> {
            let digest = Digest::of(&self.index);
            if self.last.is_some() {
                self.read("index", &digest).await?;
            }
            Ok((self.index.clone(), digest))
        }
        async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
            self.read("manifest", digest).await
        }
        async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
            self.read("config", digest).await
        }
        async fn referrers(&self, digest: &Digest) -> Result<Vec<serde_json::Value>, ClientError> {
            self.read("referrers", digest).await.map(|_| Vec::new())
        }
        fn repository(&self) -> String {
            "fake".into()
        }
        fn known_config(&self, manifest: &Digest) -> Option<Digest> {
            self.known.get(manifest).cloned()
        }
        fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
            self.last.clone()
        }
        async fn inspect(
            &self,
            _: &[u8],
            _: &[(Digest, String)],
            _: &Platform,
        ) -> Result<DeepReport, ClientError> {
            unreachable!("no deep checks here")
        }
    }

    /// `r.io/app:v1` declaring linux/`archs`, in that order.
    fn target(archs: &[&str]) -> Target {
        Target {
            name: "app".into(),
            reference: "r.io/app:v1".into(),
            tags: vec!["v1".into()],
            declared: archs.iter().map(|a| Platform::linux(a, None)).collect(),
            deep: false,
            require_provenance: false,
        }
    }

    /// After the index, every entry's manifest, config and referrers are asked for in one
    /// wave when the configs are remembered; otherwise each config waits for its manifest.
    #[tokio::test]
    async fn remembered_configs_are_read_in_the_same_wave_as_their_manifests() {
        let fake = Fake::two_platforms(true);
        let coverage = verify(
            &fake,
            &target(&["amd64", "arm64"]),
            &crate::base::progress::Silent,
        )
        .await
        .unwrap();
        assert!(coverage.covered, "{:?}", coverage.warnings);
        assert_eq!(fake.asked.lock().unwrap().len(), 6);
        assert_eq!(fake.asked_late(), Vec::<String>::new());

        let cold = Fake::two_platforms(false);
        let coverage = verify(
            &cold,
            &target(&["amd64", "arm64"]),
            &crate::base::progress::Silent,
        )
        .await
        .unwrap();
        assert!(coverage.covered, "{:?}", coverage.warnings);
        let late = cold.asked_late();
        assert!(
            late.len() == 2 && late.iter().all(|r| r.starts_with("config")),
            "{late:?}"
        );
    }

    /// With what the reference named last time remembered, the reference and every entry's
    /// manifest, config and referrers are asked for in one wave.
    #[tokio::test]
    async fn a_remembered_index_is_read_in_the_same_wave_as_the_reference() {
        let mut fake = Fake::two_platforms(true);
        fake.last = Some((fake.index.clone(), Digest::of(&fake.index)));
        let silent = &crate::base::progress::Silent;
        let coverage = verify(&fake, &target(&["amd64", "arm64"]), silent)
            .await
            .unwrap();
        assert!(coverage.covered, "{:?}", coverage.warnings);
        assert_eq!(fake.asked.lock().unwrap().len(), 7);
        assert_eq!(fake.asked_late(), Vec::<String>::new());
    }

    /// A reference that moved since it was remembered: what it names now is judged, and the
    /// reads for what it named before are dropped unfinished.
    #[tokio::test]
    async fn a_remembered_index_the_reference_no_longer_names_is_not_trusted() {
        let mut fake = Fake::two_platforms(true);
        let gone = json!({"mediaType": oci::OCI_MANIFEST, "digest": Digest::of(b"gone").as_str(),
            "size": 1, "platform": {"architecture": "amd64", "os": "linux"}});
        let old = json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX, "manifests": [gone]});
        let old = old.to_string().into_bytes();
        fake.last = Some((old.clone(), Digest::of(&old)));
        let silent = &crate::base::progress::Silent;
        let both = target(&["amd64", "arm64"]);
        let verified = verify(&fake, &both, silent);
        let coverage = tokio::time::timeout(std::time::Duration::from_secs(30), verified)
            .await
            .expect("the old manifest's unending read was not dropped")
            .unwrap();
        assert!(coverage.covered, "{:?}", coverage.warnings);
        assert_eq!(coverage.digest, Digest::of(&fake.index));
        assert_eq!(coverage.platforms.len(), 2);
    }

    /// A remembered config the manifest does not name is not used: the named one is read.
    #[tokio::test]
    async fn a_wrongly_remembered_config_is_not_trusted() {
        let mut fake = Fake::two_platforms(true);
        let amd64 = fake.known.keys().next().unwrap().clone();
        let other = fake.known.values().nth(1).unwrap().clone();
        fake.known.insert(amd64, other);
        let coverage = verify(
            &fake,
            &target(&["amd64", "arm64"]),
            &crate::base::progress::Silent,
        )
        .await
        .unwrap();
        assert!(coverage.covered, "{:?}", coverage.platforms);
        assert_eq!(fake.asked_late().len(), 1, "{:?}", fake.asked_late());
    }

    fn found(arch: &str) -> PlatformCoverage {
        PlatformCoverage {
            platform: Platform::linux(arch, None),
            digest: None,
            config_platform: Some(Platform::linux(arch, None)),
            size: Some(400),
            status: PlatformStatus::Ok,
            annotations: BTreeMap::new(),
            detail: None,
            deep: None,
            build: None,
            attached: Vec::new(),
        }
    }

    /// A declared platform listed twice is kept once, warned about and marked, so the tag
    /// is not called covered; one the index lacks is missing in declared order.
    #[test]
    fn declared_platforms_are_matched_once_each() {
        let target = target(&["arm64", "amd64"]);
        let mut warnings = Vec::new();
        let once = match_declared(&target, &[found("amd64"), found("arm64")], &mut warnings);
        assert!(!once.duplicated && once.missing.is_empty() && warnings.is_empty());
        assert_eq!(once.platforms[0].platform, Platform::linux("arm64", None));

        let twice = match_declared(&target, &[found("amd64"), found("amd64")], &mut warnings);
        assert!(twice.duplicated);
        assert_eq!(twice.missing, vec![Platform::linux("arm64", None)]);
        assert_eq!(twice.platforms.len(), 2);
        assert_eq!(twice.platforms[0].status, PlatformStatus::Missing);
        assert_eq!(
            warnings,
            vec!["r.io/app:v1 lists linux/amd64 2 times; runtimes pick the first, so the others are dead weight"]
        );
    }
}

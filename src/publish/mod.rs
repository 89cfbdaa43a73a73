//! Publishing one image: with `provenance: true` each platform manifest gets its SLSA
//! provenance attached first, and with `sbom: true` its SBOM; then its index of exactly the
//! pushed platform manifests goes in by digest, then every tag moves, then the image is read
//! back through its tags. Tags move only after every platform (and its provenance and SBOM)
//! is in, and once the first moves the rest follow.

pub mod layout;
pub mod provenance;
pub mod store;

use crate::base::attachment::{Referrer, Referrers, SPDX_DOCUMENT};
use crate::base::oci::{self, IndexEntry};
use crate::base::progress::{Event, Phase, Reporter};
use crate::base::reference::ReferenceError;
use crate::project::ImageSpec;
use crate::registry::{ClientError, RegistryError};
use crate::sbom::spdx;
use crate::sign;
use crate::verify::coverage_record::{BuildInfo, ImageCoverage};
use crate::verify::ReadMemory;
use crate::Platform;
use futures_util::future::join_all;
use store::{Attachment, ImageStore, StoreError};

type Result<T, E = PublishError> = std::result::Result<T, E>;

/// Why an image was not published: its destination's failure (the index of its pushed
/// manifests that cannot be made is worded as a registry's), a tag that is no reference,
/// or an interrupt before the first tag moved.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("interrupted")]
    Interrupted,
    /// The signing key does not open (a wrong password), found at the first signature.
    #[error(transparent)]
    SigningKey(std::sync::Arc<sign::KeyError>),
}

impl From<ClientError> for PublishError {
    fn from(error: ClientError) -> Self {
        PublishError::Store(StoreError::Registry(error))
    }
}

/// One platform's pushed manifest plus how it was built.
pub struct Pushed {
    pub image: String,
    pub platform: Platform,
    pub entry: IndexEntry,
    pub build: BuildInfo,
}

/// The index of exactly the pushed platform manifests, in the project file's platform
/// order (`pushed` is sorted so), not build completion order: the same pushes always
/// make the same index.
pub fn index_of(
    image: &ImageSpec,
    pushed: &mut [&Pushed],
) -> Result<oci::ManifestBlob, ClientError> {
    pushed.sort_by_key(|p| image.platforms.iter().position(|d| d == &p.platform));
    let entries: Vec<IndexEntry> = pushed.iter().map(|p| p.entry.clone()).collect();
    oci::image_index(&entries, &image.annotations.index)
        .map_err(|e| ClientError::registry(image.repository.clone(), RegistryError::Content(e)))
}

/// Publishes one image: every tag that does not point at its index yet, then reads it back
/// (leaving in `memory` what a later `verify` or `gate` of its tags will read).
pub async fn publish(
    destination: &impl ImageStore,
    image: &ImageSpec,
    pushed: &[&Pushed],
    memory: &dyn ReadMemory,
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage> {
    let mut mine = pushed.to_vec();
    let index = index_of(image, &mut mine)?;
    attach_all(destination, image, &mine, &index, reporter).await?;
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: None,
        phase: Phase::Publish,
        message: format!("publishing {} as {}", index.digest, image.tags.join(", ")),
    });
    // Each tag is asked, and moved, independently of the others: all at once.
    let current = join_all(image.tags.iter().map(|tag| destination.current(image, tag))).await;
    let moved: Vec<&String> = image
        .tags
        .iter()
        .zip(current)
        .filter(|(_, at)| at.as_ref() != Some(&index.digest))
        .map(|(tag, _)| tag)
        .collect();
    if moved.is_empty() {
        reporter.report(Event::Note {
            message: format!(
                "{}: every tag already points at {}; nothing to publish",
                image.name, index.digest
            ),
        });
    } else {
        // Last point to stop: once the first tag moves, the others follow, so the tags
        // never point at different indexes.
        if interrupt.is_cancelled() {
            return Err(PublishError::Interrupted);
        }
        let tagged = join_all(moved.iter().map(|tag| destination.tag(image, tag, &index)));
        for tagged in tagged.await {
            tagged?;
        }
    }
    let mut checked = destination
        .read_back(image, &index, memory, reporter)
        .await?;
    for platform in &mut checked.platforms {
        platform.build = mine
            .iter()
            .find(|p| p.platform == platform.platform)
            .map(|p| p.build.clone());
    }
    Ok(checked)
}

/// Publishes every image of a run at once: each image's round trips (tags, read-back)
/// depend on no other image's, so ten images take about as long as one. Every publish that
/// began runs to its end (a tag that moved has its siblings follow); the first failure in
/// `images` order is the run's. The signatures made are written down once, after every
/// publish ended, whether or not they all succeeded.
pub async fn publish_all(
    destination: &impl ImageStore,
    images: &[(&ImageSpec, Vec<&Pushed>)],
    memory: &dyn ReadMemory,
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<Vec<ImageCoverage>> {
    let published =
        futures_util::future::join_all(images.iter().map(|(image, pushed)| {
            publish(destination, image, pushed, memory, interrupt, reporter)
        }))
        .await;
    // Images signed by one key share it; a second save of it writes nothing.
    for signer in images.iter().filter_map(|(image, _)| image.signer.as_ref()) {
        signer.save_made();
    }
    published.into_iter().collect()
}

/// Attaches what the image asks for (provenance, an SBOM, a signature) to every platform
/// manifest, and signs the index, all before any tag moves: a tag never points at an
/// index whose attachments are missing. The platforms and the index at once: the index's
/// signature names only its digest, so it need not wait for the platforms' SBOMs. Each
/// subject's referrers are listed once; what it needs is made against that listing, then
/// attached together, so its tag schema index (`sha256-<hex>`) is written once.
async fn attach_all(
    destination: &impl ImageStore,
    image: &ImageSpec,
    pushed: &[&Pushed],
    index: &oci::ManifestBlob,
    reporter: &dyn Reporter,
) -> Result<()> {
    if !(image.provenance || image.sbom || image.signer.is_some()) {
        return Ok(());
    }
    let invocation = uuid::Uuid::new_v4().to_string();
    let platforms = join_all(
        pushed
            .iter()
            .map(|p| attach_to_platform(destination, image, p, &invocation, reporter)),
    );
    let index_signed = async {
        let Some(key) = &image.signer else {
            return Ok(());
        };
        let subject = Subject::Index(index);
        let mut referrers = destination.referrers(image, &index.digest).await?;
        let signature = signature(image, key, &subject, &referrers, reporter).await;
        let signature = staged(destination, image, &referrers, signature).await?;
        attach_to(
            destination,
            image,
            &subject,
            &mut referrers,
            Vec::new(),
            signature,
            reporter,
        )
        .await
    };
    let (platforms, index_signed) = futures_util::future::join(platforms, index_signed).await;
    platforms.into_iter().collect::<Result<()>>()?;
    index_signed
}

/// A referrer made for a subject, and what to call it once attached.
struct Attaching {
    referrer: Referrer,
    what: String,
}

/// What the image asks for on one platform manifest: its provenance, its SBOM (its
/// layers read while the signing key finishes opening) and its signature, each staged
/// as soon as it is made (the provenance and the signature while the SBOM's layers are
/// still read), then attached together.
async fn attach_to_platform(
    destination: &impl ImageStore,
    image: &ImageSpec,
    p: &Pushed,
    invocation: &str,
    reporter: &dyn Reporter,
) -> Result<()> {
    let subject = Subject::Platform(p);
    let mut referrers = destination.referrers(image, subject.digest()).await?;
    let referrers_before = &referrers;
    let provenance = async {
        let made = image.provenance.then(|| {
            let statement = provenance::statement(image, p, invocation);
            Attaching {
                referrer: provenance::referrer(p, &statement),
                what: "SLSA provenance".into(),
            }
        });
        staged(destination, image, referrers_before, Ok(made)).await
    };
    let sbom = async {
        let made = match image.sbom {
            true => sbom(destination, image, p, referrers_before, reporter).await,
            false => Ok(None),
        };
        staged(destination, image, referrers_before, made).await
    };
    let signature = async {
        let made = match &image.signer {
            Some(key) => signature(image, key, &subject, referrers_before, reporter).await,
            None => Ok(None),
        };
        staged(destination, image, referrers_before, made).await
    };
    let (provenance, sbom, signature) =
        futures_util::future::join3(provenance, sbom, signature).await;
    let mut attaching: Vec<Attaching> = provenance?.into_iter().collect();
    attaching.extend(sbom?);
    let signature = signature?;
    attach_to(
        destination,
        image,
        &subject,
        &mut referrers,
        attaching,
        signature,
        reporter,
    )
    .await
}

/// Stages what was made for a subject (its blobs and manifest go in) unless its
/// referrers list it already, so its upload overlaps what the subject still waits for.
async fn staged(
    destination: &impl ImageStore,
    image: &ImageSpec,
    referrers: &Referrers,
    made: Result<Option<Attaching>>,
) -> Result<Option<Attaching>> {
    let made = made?;
    if let Some(attaching) = &made {
        if !attaching.referrer.already_in(referrers) {
            destination.stage(image, &attaching.referrer).await?;
        }
    }
    Ok(made)
}

/// Attaches what was made for `subject` (whose referrers are `referrers`) at once, says
/// how each came to be attached, and remembers the signature among them as the key's.
async fn attach_to(
    destination: &impl ImageStore,
    image: &ImageSpec,
    subject: &Subject<'_>,
    referrers: &mut Referrers,
    mut attaching: Vec<Attaching>,
    signature: Option<Attaching>,
    reporter: &dyn Reporter,
) -> Result<()> {
    let signed = signature
        .as_ref()
        .map(|s| s.referrer.manifest.digest.clone());
    attaching.extend(signature);
    if attaching.is_empty() {
        return Ok(());
    }
    let made: Vec<&Referrer> = attaching.iter().map(|a| &a.referrer).collect();
    let how = destination.attach(image, referrers, &made).await?;
    if let (Some(key), Some(signed)) = (&image.signer, signed) {
        key.remember_made(&image.repository, subject.digest(), &signed);
    }
    for (attached, how) in attaching.iter().zip(&how) {
        report_attached(
            image,
            subject.platform(),
            &attached.what,
            &attached.referrer,
            how,
            reporter,
        );
    }
    Ok(())
}

/// What a signature signs: a platform's manifest, or the index.
enum Subject<'a> {
    Platform(&'a Pushed),
    Index(&'a oci::ManifestBlob),
}

impl Subject<'_> {
    fn digest(&self) -> &crate::base::digest::Digest {
        match self {
            Subject::Platform(p) => &p.entry.digest,
            Subject::Index(index) => &index.digest,
        }
    }

    fn platform(&self) -> Option<&Pushed> {
        match self {
            Subject::Platform(p) => Some(p),
            Subject::Index(_) => None,
        }
    }

    fn descriptor(&self) -> serde_json::Value {
        match self {
            Subject::Platform(p) => serde_json::json!({
                "mediaType": oci::OCI_MANIFEST,
                "digest": p.entry.digest,
                "size": p.entry.size,
            }),
            Subject::Index(index) => serde_json::json!({
                "mediaType": index.media_type,
                "digest": index.digest,
                "size": index.bytes.len(),
            }),
        }
    }
}

/// Whether `referrers`, those of `subject`, list the signature this key attached to it
/// before (kept, and said so).
fn signed_already(
    image: &ImageSpec,
    key: &sign::OpeningKey,
    subject: &Subject<'_>,
    referrers: &Referrers,
    reporter: &dyn Reporter,
) -> bool {
    let digest = subject.digest();
    let Some(made) = key.made_before(&image.repository, digest) else {
        return false;
    };
    if !referrers.lists(&made) {
        return false;
    }
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: subject.platform().map(|p| p.platform.clone()),
        phase: Phase::Publish,
        message: format!("{digest} already has this key's signature {made} attached; kept"),
    });
    true
}

/// This key's signature of `subject`, unless `referrers` (its referrers) list the one it
/// made before. The key, opened beside the build, is waited for here.
async fn signature(
    image: &ImageSpec,
    key: &sign::OpeningKey,
    subject: &Subject<'_>,
    referrers: &Referrers,
    reporter: &dyn Reporter,
) -> Result<Option<Attaching>> {
    if signed_already(image, key, subject, referrers, reporter) {
        return Ok(None);
    }
    let opened = key.opened().await.map_err(PublishError::SigningKey)?;
    Ok(Some(Attaching {
        referrer: sign::sign(&opened, subject.descriptor()),
        what: format!("a signature by key {}", opened.fingerprint),
    }))
}

/// Says how a referrer came to be attached to a platform manifest (or, with no `p`, to
/// the index).
fn report_attached(
    image: &ImageSpec,
    p: Option<&Pushed>,
    what: &str,
    referrer: &Referrer,
    how: &Attachment,
    reporter: &dyn Reporter,
) {
    let subject = &referrer.subject;
    let message = match how {
        Attachment::Kept => format!("{subject} already has {what} attached; kept"),
        Attachment::Registry => format!(
            "attached {what} {} (listed by the registry's referrers API)",
            referrer.manifest.digest
        ),
        Attachment::TagSchema(tag) => format!(
            "attached {what} {} (listed in the referrers tag {tag})",
            referrer.manifest.digest
        ),
    };
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: p.map(|p| p.platform.clone()),
        phase: Phase::Publish,
        message,
    });
}

/// An SPDX SBOM of the platform manifest, made from its layers, unless `referrers` (its
/// referrers) list one: it is kept, and its layers are not read again.
async fn sbom(
    destination: &impl ImageStore,
    image: &ImageSpec,
    p: &Pushed,
    referrers: &Referrers,
    reporter: &dyn Reporter,
) -> Result<Option<Attaching>> {
    let subject = &p.entry.digest;
    if referrers.has_statement(SPDX_DOCUMENT) {
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: Some(p.platform.clone()),
            phase: Phase::Publish,
            message: format!("{subject} already has an SBOM attached; kept"),
        });
        return Ok(None);
    }
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: Some(p.platform.clone()),
        phase: Phase::Publish,
        message: format!("reading the layers of {subject} for its SBOM"),
    });
    let (catalog, created) = destination.catalog(image, subject).await?;
    for why in &catalog.warnings {
        reporter.report(Event::Warning {
            message: format!("{} {}: SBOM: {why}", image.name, p.platform),
        });
    }
    let about = spdx::Subject {
        repository: &image.repository,
        digest: subject,
        platform: &p.platform,
        created: created.as_deref(),
    };
    let statement = spdx::statement(&about, spdx::document(&about, &catalog));
    Ok(Some(Attaching {
        referrer: Referrer::in_toto(subject, p.entry.size, &statement, SPDX_DOCUMENT),
        what: format!("an SBOM of {} packages", catalog.packages.len()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::oci::ConfigPlatform;
    use crate::project::test_image as image;
    use store::fake::FakeStore;
    use tokio_util::sync::CancellationToken;

    fn with_provenance(tags: &str) -> ImageSpec {
        ImageSpec {
            provenance: true,
            require_provenance: true,
            ..image(tags)
        }
    }

    fn pushed(arch: &str, digest_char: char) -> Pushed {
        Pushed {
            image: "api".into(),
            platform: Platform::linux(arch, None),
            entry: IndexEntry {
                digest: format!("sha256:{}", digest_char.to_string().repeat(64))
                    .parse()
                    .unwrap(),
                size: 500,
                platform: ConfigPlatform {
                    os: "linux".into(),
                    architecture: arch.into(),
                    variant: None,
                },
            },
            build: BuildInfo {
                emulated: arch != "amd64",
                seconds: 1.0,
                ..Default::default()
            },
        }
    }

    async fn run(
        store: &FakeStore,
        image: &ImageSpec,
        units: &[Pushed],
        interrupt: &CancellationToken,
    ) -> Result<ImageCoverage> {
        let refs: Vec<&Pushed> = units.iter().collect();
        publish(
            store,
            image,
            &refs,
            &(),
            interrupt,
            &crate::base::progress::Silent,
        )
        .await
    }

    /// A store `units` were published to once, its calls forgotten.
    async fn published(image: &ImageSpec, units: &[Pushed]) -> FakeStore {
        let store = FakeStore::default();
        run(&store, image, units, &CancellationToken::new())
            .await
            .unwrap();
        store.calls.lock().unwrap().clear();
        store
    }

    #[tokio::test]
    async fn every_tag_moves_to_the_index_then_it_is_read_back() {
        let (store, image) = (FakeStore::default(), image("v1, latest"));
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let coverage = run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        // A push by tag stores the index too: no push by digest first.
        assert_eq!(store.calls(), ["tag v1", "tag latest", "read back"]);
        assert_eq!(store.tag_of("v1"), Some(coverage.digest.to_string()));
        assert_eq!(store.tag_of("latest"), Some(coverage.digest.to_string()));
    }

    #[tokio::test]
    async fn index_entries_follow_the_project_order_not_build_completion() {
        let (store, image) = (FakeStore::default(), image("v1"));
        // arm64 finished first.
        let units = [pushed("arm64", 'b'), pushed("amd64", 'a')];
        let coverage = run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        let order: Vec<String> = coverage
            .platforms
            .iter()
            .map(|p| p.platform.to_string())
            .collect();
        assert_eq!(order, ["linux/amd64", "linux/arm64"]);
        // The build facts travel with their platform.
        assert!(!coverage.platforms[0].build.as_ref().unwrap().emulated);
        assert!(coverage.platforms[1].build.as_ref().unwrap().emulated);
    }

    #[tokio::test]
    async fn tags_already_at_the_index_are_left_alone() {
        let image = image("v1, latest");
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let store = published(&image, &units).await;
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(store.calls(), ["read back"]);
    }

    #[tokio::test]
    async fn only_the_tags_elsewhere_move() {
        let image = image("v1, latest");
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let store = published(&image, &units).await;
        let old = format!("sha256:{}", "0".repeat(64));
        store.tags.lock().unwrap().insert("latest".into(), old);
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(store.calls(), ["tag latest", "read back"]);
    }

    #[tokio::test]
    async fn an_interrupt_before_publishing_moves_no_tag() {
        let old = format!("sha256:{}", "0".repeat(64));
        let (store, image) = (FakeStore::with_tags(&[("v1", &old)]), image("v1, latest"));
        let interrupt = CancellationToken::new();
        interrupt.cancel();
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let outcome = run(&store, &image, &units, &interrupt).await;
        assert!(
            matches!(outcome, Err(PublishError::Interrupted)),
            "{outcome:?}"
        );
        assert_eq!(store.tag_of("v1"), Some(old));
        assert_eq!(store.tag_of("latest"), None);
        assert!(store.calls().iter().all(|c| !c.starts_with("tag")));
    }

    #[tokio::test]
    async fn a_refused_tag_is_a_registry_error_and_nothing_is_read_back() {
        let store = FakeStore {
            refuse_tag: Some("latest".into()),
            ..FakeStore::default()
        };
        let image = image("v1, latest");
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let outcome = run(&store, &image, &units, &CancellationToken::new()).await;
        assert!(
            matches!(
                outcome,
                Err(PublishError::Store(StoreError::Registry(
                    ClientError::Registry { .. }
                )))
            ),
            "{outcome:?}"
        );
        assert!(!store.calls().contains(&"read back".to_string()));
    }

    #[tokio::test]
    async fn provenance_is_attached_to_every_platform_before_the_index_and_any_tag() {
        let (store, image) = (FakeStore::default(), with_provenance("v1, latest"));
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let coverage = run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        let calls = store.calls();
        assert_eq!(
            calls,
            [
                format!("attach {}", units[0].entry.digest),
                format!("attach {}", units[1].entry.digest),
                "tag v1".into(),
                "tag latest".into(),
                "read back".into(),
            ]
        );
        // The index still lists exactly the platform manifests.
        let index: serde_json::Value =
            serde_json::from_slice(&store.manifests.lock().unwrap()[coverage.digest.as_str()])
                .unwrap();
        let digests: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["digest"].as_str().unwrap())
            .collect();
        assert_eq!(
            digests,
            [
                units[0].entry.digest.as_str(),
                units[1].entry.digest.as_str()
            ]
        );
    }

    #[tokio::test]
    async fn a_refused_referrer_moves_no_tag_and_puts_no_index() {
        let old = format!("sha256:{}", "0".repeat(64));
        let store = FakeStore {
            refuse_attach: true,
            ..FakeStore::with_tags(&[("v1", &old)])
        };
        let image = with_provenance("v1");
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let outcome = run(&store, &image, &units, &CancellationToken::new()).await;
        assert!(
            matches!(
                outcome,
                Err(PublishError::Store(StoreError::Registry(
                    ClientError::Registry { .. }
                )))
            ),
            "{outcome:?}"
        );
        assert_eq!(store.tag_of("v1"), Some(old));
        assert!(store.calls().is_empty(), "{:?}", store.calls());
    }

    #[tokio::test]
    async fn an_sbom_is_made_and_attached_to_every_platform_before_any_tag_and_kept_on_a_rerun() {
        let image = ImageSpec {
            sbom: true,
            ..with_provenance("v1")
        };
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let store = FakeStore::default();
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        let calls = store.calls();
        let tagged = calls.iter().position(|c| c == "tag v1").unwrap();
        for unit in &units {
            let attached = store.attached.lock().unwrap().clone();
            assert!(attached.contains(&(unit.entry.digest.to_string(), SPDX_DOCUMENT.into())));
            let catalog = format!("catalog {}", unit.entry.digest);
            assert!(calls.iter().position(|c| *c == catalog).unwrap() < tagged);
        }
        assert_eq!(store.attached.lock().unwrap().len(), 4, "{calls:?}");
        // A rerun reads no layer and attaches nothing new.
        store.calls.lock().unwrap().clear();
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        assert!(
            store.calls().iter().all(|c| !c.starts_with("catalog")),
            "{:?}",
            store.calls()
        );
        assert_eq!(store.attached.lock().unwrap().len(), 4);
    }

    /// Provenance, an SBOM and a signature on every platform, and the index signed.
    fn with_everything(tags: &str) -> ImageSpec {
        let key = sign::OpeningKey::opened_for_tests(sign::SigningKey::random(), None);
        ImageSpec {
            sbom: true,
            signer: Some(std::sync::Arc::new(key)),
            ..with_provenance(tags)
        }
    }

    /// The provenance and the signatures are pushed while the SBOMs' layers are still
    /// read: only listing them waits for the SBOM.
    #[tokio::test]
    async fn provenance_and_signatures_go_in_while_the_layers_are_read() {
        let (store, image) = (FakeStore::default(), with_everything("v1"));
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        // 2 platforms x (provenance + signature), and the index's signature.
        let staged_by_catalog = store.staged_by_catalog.lock().unwrap().clone();
        assert!(
            staged_by_catalog.iter().all(|n| *n >= 5),
            "{staged_by_catalog:?}"
        );
        // Then each SBOM, and every referrer listed after it was staged.
        assert_eq!(store.staged.lock().unwrap().len(), 7);
        assert_eq!(store.attached.lock().unwrap().len(), 7);
    }

    /// How many times `counts` says each of `subjects` was counted.
    fn counted(
        counts: &std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
        subjects: &[&str],
    ) -> Vec<usize> {
        let counts = counts.lock().unwrap();
        subjects
            .iter()
            .map(|s| counts.get(*s).copied().unwrap_or(0))
            .collect()
    }

    /// A signed build asks the registry for each subject's referrers once, cold or warm:
    /// the SBOM's and the signature's checks and the attach share that listing. Cold, each
    /// subject's referrers tag schema index is written once, for all its attachments,
    /// keeping what it listed; warm, it is not written at all.
    #[tokio::test]
    async fn each_subject_is_listed_once_and_its_tag_schema_index_written_at_most_once() {
        let (store, image) = (FakeStore::default(), with_everything("v1"));
        let units = [pushed("amd64", 'a'), pushed("arm64", 'b')];
        let cosigned = serde_json::json!({
            "mediaType": oci::OCI_MANIFEST,
            "digest": format!("sha256:{}", "c".repeat(64)),
            "size": 300,
            "artifactType": crate::base::attachment::SIGSTORE_BUNDLE,
        });
        store
            .indexes
            .lock()
            .unwrap()
            .insert(units[0].entry.digest.to_string(), vec![cosigned.clone()]);
        let coverage = run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        let subjects = [
            units[0].entry.digest.as_str(),
            units[1].entry.digest.as_str(),
            coverage.digest.as_str(),
        ];
        assert_eq!(counted(&store.listings, &subjects), [1, 1, 1]);
        assert_eq!(counted(&store.index_puts, &subjects), [1, 1, 1]);
        assert_eq!(store.attached.lock().unwrap().len(), 7);
        let kept = store.indexes.lock().unwrap()[subjects[0]].clone();
        assert_eq!((kept.len(), &kept[0]), (4, &cosigned));
        // A rerun lists each once again, finds everything there, and writes nothing.
        store.listings.lock().unwrap().clear();
        store.index_puts.lock().unwrap().clear();
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(counted(&store.listings, &subjects), [1, 1, 1]);
        assert_eq!(counted(&store.index_puts, &subjects), [0, 0, 0]);
        assert_eq!(store.attached.lock().unwrap().len(), 7);
    }

    #[tokio::test]
    async fn without_provenance_nothing_is_attached() {
        let (store, image) = (FakeStore::default(), image("v1"));
        let units = [pushed("amd64", 'a')];
        run(&store, &image, &units, &CancellationToken::new())
            .await
            .unwrap();
        assert!(store.calls().iter().all(|c| !c.starts_with("attach")));
        assert!(store.listings.lock().unwrap().is_empty());
    }

    /// A store whose `current` answers only once `images` publishes ask at the same time.
    struct Together {
        store: FakeStore,
        all_asking: tokio::sync::Barrier,
    }

    impl ImageStore for Together {
        fn is_registry(&self) -> bool {
            true
        }
        async fn put_layer(
            &self,
            reference: &oci_client::Reference,
            layer: &crate::builder::export::ExportedLayer,
            progress: &crate::registry::BlobProgress<'_>,
        ) -> std::result::Result<(), StoreError> {
            self.store.put_layer(reference, layer, progress).await
        }
        fn knows_blob(
            &self,
            reference: &oci_client::Reference,
            digest: &crate::base::digest::Digest,
        ) -> bool {
            self.store.knows_blob(reference, digest)
        }
        async fn put_early_layer(
            &self,
            reference: &oci_client::Reference,
            layer: crate::builder::export::early::EarlyLayer,
        ) -> bool {
            self.store.put_early_layer(reference, layer).await
        }
        async fn put_config(
            &self,
            reference: &oci_client::Reference,
            image: &crate::builder::export::ExportedImage,
        ) -> std::result::Result<(), StoreError> {
            self.store.put_config(reference, image).await
        }
        async fn has_manifest(
            &self,
            image: &ImageSpec,
            digest: &crate::base::digest::Digest,
        ) -> bool {
            self.store.has_manifest(image, digest).await
        }
        async fn current(
            &self,
            image: &ImageSpec,
            tag: &str,
        ) -> Option<crate::base::digest::Digest> {
            self.all_asking.wait().await;
            self.store.current(image, tag).await
        }
        async fn put_manifest(
            &self,
            reference: &oci_client::Reference,
            manifest: &oci::ManifestBlob,
        ) -> std::result::Result<(), StoreError> {
            self.store.put_manifest(reference, manifest).await
        }
        async fn tag(
            &self,
            image: &ImageSpec,
            tag: &str,
            index: &oci::ManifestBlob,
        ) -> std::result::Result<(), StoreError> {
            self.store.tag(image, tag, index).await
        }
        async fn referrers(
            &self,
            image: &ImageSpec,
            subject: &crate::base::digest::Digest,
        ) -> std::result::Result<Referrers, StoreError> {
            self.store.referrers(image, subject).await
        }
        async fn stage(
            &self,
            image: &ImageSpec,
            referrer: &Referrer,
        ) -> std::result::Result<(), StoreError> {
            self.store.stage(image, referrer).await
        }
        async fn attach(
            &self,
            image: &ImageSpec,
            referrers: &mut Referrers,
            attaching: &[&Referrer],
        ) -> std::result::Result<Vec<Attachment>, StoreError> {
            self.store.attach(image, referrers, attaching).await
        }
        async fn catalog(
            &self,
            image: &ImageSpec,
            subject: &crate::base::digest::Digest,
        ) -> std::result::Result<(crate::sbom::Catalog, Option<String>), StoreError> {
            self.store.catalog(image, subject).await
        }
        async fn read_back(
            &self,
            image: &ImageSpec,
            pushed: &oci::ManifestBlob,
            memory: &dyn ReadMemory,
            reporter: &dyn Reporter,
        ) -> std::result::Result<ImageCoverage, StoreError> {
            self.store.read_back(image, pushed, memory, reporter).await
        }
    }

    /// Images `api` (tag v1) and `web` (tag v2), each with both platforms pushed.
    fn two_images() -> [(ImageSpec, [Pushed; 2]); 2] {
        let web = ImageSpec {
            name: "web".into(),
            ..image("v2")
        };
        let units = || [pushed("amd64", 'a'), pushed("arm64", 'b')];
        [(image("v1"), units()), (web, units())]
    }

    async fn publish_both(
        store: &impl ImageStore,
        images: &[(ImageSpec, [Pushed; 2]); 2],
    ) -> Result<Vec<ImageCoverage>> {
        let images: Vec<(&ImageSpec, Vec<&Pushed>)> = images
            .iter()
            .map(|(i, p)| (i, p.iter().collect()))
            .collect();
        let interrupt = CancellationToken::new();
        let silent = &crate::base::progress::Silent;
        publish_all(store, &images, &(), &interrupt, silent).await
    }

    #[tokio::test]
    async fn the_images_of_a_run_are_published_at_once() {
        let store = Together {
            store: FakeStore::default(),
            all_asking: tokio::sync::Barrier::new(2),
        };
        let images = two_images();
        // One after the other, the first publish would wait for the second forever.
        let published = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            publish_both(&store, &images),
        );
        let coverage = published
            .await
            .expect("both publishes ran at once")
            .unwrap();
        assert_eq!(coverage.len(), 2);
        assert_eq!(
            store.store.tag_of("v1"),
            Some(coverage[0].digest.to_string())
        );
        assert_eq!(
            store.store.tag_of("v2"),
            Some(coverage[1].digest.to_string())
        );
    }

    /// The signatures a run made are written down once its publishing ends, and those of
    /// an image that then failed too: a rerun finds them attached and signs nothing.
    #[tokio::test]
    async fn signatures_are_written_down_once_publishing_ends_even_when_an_image_failed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("signatures.json");
        let key = |made: &std::path::Path| {
            let key = sign::OpeningKey::opened_for_tests(
                sign::SigningKey::random(),
                Some(made.to_path_buf()),
            );
            Some(std::sync::Arc::new(key))
        };
        let signer = key(&file);
        let [(api, units), (web, web_units)] = two_images();
        let api = ImageSpec {
            signer: signer.clone(),
            ..api
        };
        let web = ImageSpec {
            repository: "127.0.0.1:5000/web".into(),
            signer,
            ..web
        };
        // One publish alone remembers, and writes nothing yet.
        run(
            &FakeStore::default(),
            &api,
            &units,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert!(!file.exists());
        let store = FakeStore {
            refuse_tag: Some("v1".into()),
            ..FakeStore::default()
        };
        let images = [(api, units), (web, web_units)];
        let outcome = publish_both(&store, &images).await;
        assert!(outcome.is_err(), "{outcome:?}");
        // Read back by another run (the same key file: the test key's memory).
        let reread = key(&file).unwrap();
        for (image, units) in &images {
            for unit in units {
                let made = reread.made_before(&image.repository, &unit.entry.digest);
                assert!(made.is_some(), "{} {}", image.name, unit.platform);
            }
        }
    }

    #[tokio::test]
    async fn one_image_refused_fails_the_run_and_the_other_is_still_published_whole() {
        let store = FakeStore {
            refuse_tag: Some("v1".into()),
            ..FakeStore::default()
        };
        let outcome = publish_both(&store, &two_images()).await;
        assert!(
            matches!(outcome, Err(PublishError::Store(StoreError::Registry(_)))),
            "{outcome:?}"
        );
        assert_eq!(store.tag_of("v1"), None);
        assert!(store.tag_of("v2").is_some());
        assert!(store.calls().contains(&"read back".to_string()));
    }
}

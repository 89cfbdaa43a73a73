//! One image × platform: reused when its inputs are unchanged and its manifest is still
//! pushed, else built, exported (or pushed by the engine) and pushed by digest.

use super::early::EarlySends;
use super::Run;
use crate::base::digest::Digest;
use crate::base::oci::{self, ConfigPlatform, IndexEntry};
use crate::base::progress::{Event, Phase, Reporter};
use crate::builder::build_inputs::{self, RememberedBuild};
use crate::builder::export::early::EarlyUploads;
use crate::builder::export::ExportedImage;
use crate::builder::{self, BuildError, Builder, BuiltImage, UnitBuild};
use crate::flows::cache::{CachedManifest, PushCache};
use crate::project::plan::Unit;
use crate::project::ImageSpec;
use crate::publish::store::ImageStore;
use crate::publish::Pushed;
use crate::registry::BlobProgress;
use crate::verify::coverage_record::BuildInfo;
use crate::verify::coverage_record::BuildWindow;
use crate::{Error, Result};

/// An engine that cannot build for a platform may quietly build for its own.
pub(super) fn check_platform(
    image: &ImageSpec,
    unit: &Unit<'_>,
    built: &ConfigPlatform,
) -> Result<()> {
    if built.normalized() == unit.platform {
        return Ok(());
    }
    Err(Error::Build {
        image: image.name.clone(),
        platform: unit.platform.to_string(),
        source: BuildError::WrongPlatform(format!(
            "the engine built an image for {} instead; it cannot build for {} (upgrade the engine or use a native builder)",
            built.normalized(),
            unit.platform
        )),
    })
}

/// What a pushed manifest is remembered under: the image's ID (or the manifest's digest
/// when the engine pushed it) and the annotations polyarch writes into the manifest, since
/// the same image with other annotations is another manifest.
pub(super) fn pushed_key(image: &ImageSpec, id: &str) -> String {
    if image.annotations.manifest.is_empty() {
        return id.to_string();
    }
    let annotations = serde_json::to_vec(&image.annotations.manifest).unwrap_or_default();
    format!("{id}+{}", Digest::of(&annotations).short())
}

/// A unit whose manifest an earlier run pushed.
fn pushed_before(unit: &Unit<'_>, cached: &CachedManifest, build: BuildInfo) -> Pushed {
    Pushed {
        image: unit.image.name.clone(),
        platform: unit.platform.clone(),
        entry: IndexEntry {
            digest: cached.digest.clone(),
            size: cached.size,
            platform: cached.config_platform(),
        },
        build,
    }
}

/// A manifest an earlier run pushed for this very image ID, when the store still has it.
async fn already_pushed(
    store: &impl ImageStore,
    cache: &PushCache,
    image: &ImageSpec,
    image_id: &str,
) -> Option<CachedManifest> {
    let cached = cache.get(&image.repository, &pushed_key(image, image_id))?;
    store
        .has_manifest(image, &cached.digest)
        .await
        .then_some(cached)
}

/// Whether a unit needs building: its earlier push when its inputs are unchanged, else
/// the key its build's inputs are remembered under.
pub(super) enum Reuse {
    Pushed(Box<Pushed>),
    Build { settings: Option<String> },
}

pub(super) async fn reuse(
    builder: &impl Builder,
    store: &impl ImageStore,
    unit: &Unit<'_>,
    emulated: bool,
    run: &Run<'_>,
) -> Result<Reuse> {
    let image = unit.image;
    let settings = builder
        .settings_key(image, &unit.platform, &run.bases)
        .await?;
    let remembered = settings
        .as_deref()
        .filter(|_| run.trust_inputs && !image.no_cache)
        .and_then(|key| run.builds.get(key));
    let reusable = match remembered {
        Some(build) if run.replays.unchanged(image, &build.reads).await => Some(build.image),
        _ => None,
    };
    if let Some(image_id) = reusable {
        if let Some(cached) = already_pushed(store, &run.cache, image, &image_id).await {
            report_phase(
                run,
                unit,
                Phase::Done,
                format!(
                    "inputs unchanged (context, Dockerfile, build args, base images): image {image_id} is already pushed as {}; no build, export or upload (--rebuild builds anyway)",
                    cached.digest
                ),
            );
            return Ok(Reuse::Pushed(Box::new(pushed_before(
                unit,
                &cached,
                BuildInfo {
                    emulated,
                    seconds: 0.0,
                    reused: true,
                    builder: Some(builder.endpoint().to_string()),
                    fallback: run.fallbacks.get(&unit.platform).cloned(),
                    window: None,
                },
            ))));
        }
    }
    Ok(Reuse::Build { settings })
}

/// Tells the reporter that `unit` reached `phase`.
pub(super) fn report_phase(run: &Run<'_>, unit: &Unit<'_>, phase: Phase, message: String) {
    run.reporter.report(Event::Phase {
        image: unit.image.name.clone(),
        platform: Some(unit.platform.clone()),
        phase,
        message,
    });
}

/// A platform's build starts: says so (and that it is emulated, where it is), and starts
/// opening the image's signing key, whose scrypt the build then hides.
pub(super) fn build_starts(run: &Run<'_>, unit: &Unit<'_>, emulated: bool, message: String) {
    warn_if_emulated(unit, emulated, run.reporter);
    if let Some(key) = &unit.image.signer {
        key.begin();
    }
    report_phase(run, unit, Phase::Build, message);
}

fn warn_if_emulated(unit: &Unit<'_>, emulated: bool, reporter: &dyn Reporter) {
    if emulated {
        reporter.report(Event::Warning {
            message: format!(
                "{} {} builds under QEMU emulation: RUN steps are typically 5-10x slower than native",
                unit.image.name, unit.platform
            ),
        });
    }
}

/// Remembers what a build read under its settings key, for the next run's reuse check.
pub(super) async fn remember_reads(
    run: &Run<'_>,
    image: &ImageSpec,
    key: &str,
    built: &str,
    transfers: &[crate::docker::buildkit::filesync::Transfer],
    sent_context: Option<&str>,
) {
    if let Some(reads) = reads(run, image, transfers, sent_context).await {
        remember(run, key, built, reads);
    }
}

/// What a build read (None when it cannot vouch for the image); hashes the context.
pub(super) async fn reads(
    run: &Run<'_>,
    image: &ImageSpec,
    transfers: &[crate::docker::buildkit::filesync::Transfer],
    sent_context: Option<&str>,
) -> Option<Vec<build_inputs::ContextRead>> {
    let (spec, transfers, hashes) = (image.clone(), transfers.to_vec(), run.replays.hashes());
    match sent_context {
        Some(sent) => Some(build_inputs::classic_reads(sent)),
        None => {
            tokio::task::spawn_blocking(move || build_inputs::reads_of(&spec, &transfers, &hashes))
                .await
                .ok()
                .flatten()
        }
    }
}

/// Remembers `reads` as what the build of `built` under the settings `key` read.
pub(super) fn remember(
    run: &Run<'_>,
    key: &str,
    built: &str,
    reads: Vec<build_inputs::ContextRead>,
) {
    let image = built.to_string();
    run.builds.remember(key, RememberedBuild { image, reads });
}

pub(super) async fn build_and_push(
    builder: &impl Builder,
    store: &impl ImageStore,
    unit: &Unit<'_>,
    emulated: bool,
    run: &Run<'_>,
) -> Result<Pushed> {
    match reuse(builder, store, unit, emulated, run).await? {
        Reuse::Pushed(pushed) => Ok(*pushed),
        Reuse::Build { settings } => {
            build_unit(builder, store, unit, emulated, settings, run).await
        }
    }
}

/// Builds `unit`, then pushes it unless the engine did or an earlier run pushed that
/// very image; `settings` is the key what the build read is remembered under.
pub(super) async fn build_unit(
    builder: &impl Builder,
    store: &impl ImageStore,
    unit: &Unit<'_>,
    emulated: bool,
    settings: Option<String>,
    run: &Run<'_>,
) -> Result<Pushed> {
    let image = unit.image;
    build_starts(
        run,
        unit,
        emulated,
        format!("building {}", building(builder)),
    );
    let output = build_output(builder, store, image, run);
    let hashes = run.replays.hashes();
    let unit_build = UnitBuild {
        spec: image,
        platform: &unit.platform,
        run_id: &run.id,
        output,
        reporter: run.reporter,
        hashes: &hashes,
    };
    let built = builder.build(unit_build, run.cleanup).await?;
    push_built(builder, store, unit, emulated, settings, built, run).await
}

/// Pushes what a build of `unit` wrote, unless the engine did or an earlier run pushed
/// that very image; `settings` is the key what the build read is remembered under.
pub(super) async fn push_built(
    builder: &impl Builder,
    store: &impl ImageStore,
    unit: &Unit<'_>,
    emulated: bool,
    settings: Option<String>,
    built: BuiltImage,
    run: &Run<'_>,
) -> Result<Pushed> {
    let image = unit.image;
    if let Some(key) = &settings {
        let sent = built.sent_context.as_deref();
        remember_reads(run, image, key, &built.id, &built.transfers, sent).await;
    }
    let build = build_info(builder, unit, emulated, built.seconds, run);
    if let Some(pushed) = built.pushed.clone() {
        return pushed_by_engine(unit, &built.id, pushed, build, pusher(builder), run);
    }
    if let Some(cached) = already_pushed(store, &run.cache, image, &built.id).await {
        builder.remove(run.cleanup, &built.tag).await;
        report_phase(
            run,
            unit,
            Phase::Done,
            format!(
                "unchanged (image {}): already pushed as {}, no export or upload",
                &built.id, cached.digest
            ),
        );
        return Ok(pushed_before(unit, &cached, build));
    }
    report_phase(run, unit, Phase::Export, format!("exporting {}", &built.id));
    let exported = export_built(builder, store, unit, &built, run).await;
    // The image is in the spool (or the export failed): the engine's copy is removed
    // while the layers upload, not before (a removal takes 0.1 s on Podman).
    let push = async { push_exported(store, unit, exported?, &run.early, run.reporter).await };
    let (entry, _) = tokio::join!(push, builder.remove(run.cleanup, &built.tag));
    let entry = entry?;
    remember_pushed(run, image, &built.id, &entry);
    report_phase(run, unit, Phase::Done, format!("pushed {}", entry.digest));
    Ok(Pushed {
        image: image.name.clone(),
        platform: unit.platform.clone(),
        entry,
        build,
    })
}

/// How progress names what builds: "with BuildKit", "on BuildKit daemon unix:///…".
pub(super) fn building(builder: &impl Builder) -> String {
    match (builder.standalone(), builder.buildkit()) {
        (true, _) => format!("on BuildKit daemon {}", builder.endpoint()),
        (false, true) => "with BuildKit".into(),
        (false, false) => "with the classic builder".into(),
    }
}

/// How progress names what pushed a platform manifest itself.
pub(super) fn pusher(builder: &impl Builder) -> &'static str {
    match builder.standalone() {
        true => "the BuildKit daemon",
        false => "the engine",
    }
}

/// Where a build's image goes: pushed by the engine itself when its BuildKit can push to
/// the registry polyarch pushes to (a standalone daemon always does), else into the
/// engine, to be exported.
fn build_output<'i>(
    builder: &impl Builder,
    store: &impl ImageStore,
    image: &'i ImageSpec,
    run: &Run<'_>,
) -> builder::Output<'i> {
    if store.is_registry()
        && builder.buildkit()
        && builder.containerd_store()
        && (builder.standalone() || run.engine_reaches(image, builder))
    {
        builder::Output::Registry(&image.repository)
    } else {
        builder::Output::Engine
    }
}

/// The record of a build on `builder` that took `seconds`, ending now.
pub(super) fn build_info(
    builder: &impl Builder,
    unit: &Unit<'_>,
    emulated: bool,
    seconds: f64,
    run: &Run<'_>,
) -> BuildInfo {
    BuildInfo {
        emulated,
        seconds: (seconds * 10.0).round() / 10.0,
        reused: false,
        builder: Some(builder.endpoint().to_string()),
        fallback: run.fallbacks.get(&unit.platform).cloned(),
        window: Some(BuildWindow::ending_now(seconds)),
    }
}

/// A unit whose manifest the engine pushed itself, once it is for the unit's platform.
fn pushed_by_engine(
    unit: &Unit<'_>,
    id: &str,
    pushed: builder::PushedManifest,
    build: BuildInfo,
    by: &str,
    run: &Run<'_>,
) -> Result<Pushed> {
    let image = unit.image;
    check_platform(image, unit, &pushed.platform)?;
    let entry = IndexEntry {
        digest: pushed.digest,
        size: pushed.size,
        platform: pushed.platform,
    };
    remember_pushed(run, image, id, &entry);
    report_phase(
        run,
        unit,
        Phase::Done,
        format!("pushed {} (by {by})", entry.digest),
    );
    Ok(Pushed {
        image: image.name.clone(),
        platform: unit.platform.clone(),
        entry,
        build,
    })
}

/// The pushed manifest, remembered under the image's ID for the next run's reuse.
pub(super) fn remember_pushed(run: &Run<'_>, image: &ImageSpec, id: &str, entry: &IndexEntry) {
    run.cache.put(
        &image.repository,
        &pushed_key(image, id),
        CachedManifest {
            digest: entry.digest.clone(),
            size: entry.size,
            os: entry.platform.os.clone(),
            architecture: entry.platform.architecture.clone(),
            variant: entry.platform.variant.clone(),
        },
    );
}

/// The built image out of the engine, with times clamped for `SOURCE_DATE_EPOCH`. Large
/// layers go to the registry while they are exported, unless their times are clamped
/// after the export.
async fn export_built(
    builder: &impl Builder,
    store: &impl ImageStore,
    unit: &Unit<'_>,
    built: &BuiltImage,
    run: &Run<'_>,
) -> Result<ExportedImage> {
    let image = unit.image;
    let early = match store.is_registry() && image.source_date_epoch.is_none() {
        true => Some(run.early.to(store, image.first_tag()?)),
        false => None,
    };
    let early = early.as_ref().map(|e| e as &dyn EarlyUploads);
    let exported = builder
        .export(built, image, &unit.platform, early, run.reporter)
        .await?;
    run.early.remember(&exported.layers);
    let Some(epoch) = image.source_date_epoch else {
        return Ok(exported);
    };
    // The engine wrote the image with the build's own times; they are clamped here.
    tokio::task::spawn_blocking(move || {
        crate::builder::export::reproducible::normalise(exported, epoch)
    })
    .await
    .map_err(|e| Error::Export {
        image: image.name.clone(),
        source: crate::builder::export::ExportError::RewriteStopped(e),
    })?
    .map_err(|e| Error::Export {
        image: image.name.clone(),
        source: crate::builder::export::ExportError::Reproducible(e),
    })
}

/// Pushes an exported image's layers, config and manifest (by digest: no per-platform
/// tags are left behind in the repository); the manifest's index entry.
async fn push_exported(
    store: &impl ImageStore,
    unit: &Unit<'_>,
    exported: ExportedImage,
    early: &EarlySends,
    reporter: &dyn Reporter,
) -> Result<IndexEntry> {
    let image = unit.image;
    let config_platform =
        ConfigPlatform::from_config(&exported.config).map_err(|e| Error::Export {
            image: image.name.clone(),
            source: crate::builder::export::ExportError::Content(e),
        })?;
    check_platform(image, unit, &config_platform)?;

    let total: u64 = exported.layers.iter().map(|l| l.size).sum();
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: Some(unit.platform.clone()),
        phase: Phase::Push,
        message: format!("pushing {} layers ({} bytes)", exported.layers.len(), total),
    });
    let progress = BlobProgress {
        image: &image.name,
        platform: Some(&unit.platform),
        total: Some(total),
        reporter,
        done: Default::default(),
    };
    let reference = image.first_tag()?;
    // Blobs go by digest, so they need no order: all at once, one connection each, rather
    // than a few round trips per blob one after another.
    let layers = futures_util::future::try_join_all(exported.layers.iter().map(|layer| async {
        early.settled(&layer.diff_id).await;
        store.put_layer(&reference, layer, &progress).await
    }));
    futures_util::future::try_join(layers, store.put_config(&reference, &exported)).await?;
    let manifest = oci::image_manifest(
        (&exported.config_digest, exported.config.len()),
        exported
            .layers
            .iter()
            .map(|layer| (&layer.digest, layer.size)),
        &image.annotations.manifest,
    )
    .map_err(|e| Error::Export {
        image: image.name.clone(),
        source: crate::builder::export::ExportError::Content(e),
    })?;
    store.put_manifest(&reference, &manifest).await?;
    Ok(IndexEntry {
        digest: manifest.digest.clone(),
        size: manifest.bytes.len() as u64,
        platform: config_platform,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::test_image as image;
    use crate::publish::store::fake::FakeStore;

    fn manifest(digest: &str) -> CachedManifest {
        CachedManifest {
            digest: digest.parse().unwrap(),
            size: 400,
            os: "linux".into(),
            architecture: "arm64".into(),
            variant: None,
        }
    }

    /// The warm path's second half: an image ID pushed by an earlier run is reused only
    /// while the registry still has that manifest, and only for the same annotations.
    #[tokio::test]
    async fn an_earlier_push_is_reused_only_while_the_registry_has_it() {
        let (store, cache, api) = (FakeStore::default(), PushCache::in_memory(), image("v1"));
        let digest = format!("sha256:{}", "a".repeat(64));
        cache.put(
            &api.repository,
            &pushed_key(&api, "sha256:id1"),
            manifest(&digest),
        );

        // Garbage-collected from the registry since: built again.
        assert!(already_pushed(&store, &cache, &api, "sha256:id1")
            .await
            .is_none());

        store
            .manifests
            .lock()
            .unwrap()
            .insert(digest.clone(), Vec::new());
        let reused = already_pushed(&store, &cache, &api, "sha256:id1").await;
        assert_eq!(reused.map(|m| m.digest.to_string()), Some(digest.clone()));

        // Another image, or the same image with other manifest annotations: not reused.
        assert!(already_pushed(&store, &cache, &api, "sha256:id2")
            .await
            .is_none());
        let mut annotated = api.clone();
        annotated
            .annotations
            .manifest
            .insert("org.opencontainers.image.version".into(), "1.2".into());
        assert!(already_pushed(&store, &cache, &annotated, "sha256:id1")
            .await
            .is_none());
    }
}

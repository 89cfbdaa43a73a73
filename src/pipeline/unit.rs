//! One image × platform: reused when its inputs are unchanged and its manifest is still
//! pushed, else built, exported (or pushed by the engine) and pushed by digest.

use super::Run;
use crate::build::{self, BuildError, BuiltImage};
use crate::cache::{CachedManifest, PushCache};
use crate::digest::Digest;
use crate::engine::Engine;
use crate::export;
use crate::inputs::{self, RememberedBuild};
use crate::oci::{self, ConfigPlatform, IndexEntry};
use crate::plan::Unit;
use crate::progress::{Event, Phase, Reporter};
use crate::project::ImageSpec;
use crate::provenance::BuildWindow;
use crate::publish::Pushed;
use crate::record::BuildInfo;
use crate::registry::BlobProgress;
use crate::store::{first_tag, Destination, ImageStore};
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
    engine: &Engine,
    destination: &Destination,
    unit: &Unit<'_>,
    emulated: bool,
    run: &Run<'_>,
) -> Result<Reuse> {
    let image = unit.image;
    let settings = inputs::settings_key(engine, image, &unit.platform, &run.bases).await?;
    let remembered = settings
        .as_deref()
        .filter(|_| run.trust_inputs && !image.no_cache)
        .and_then(|key| run.builds.get(key));
    let reusable = match remembered {
        Some(build) if run.replays.unchanged(image, &build.reads).await => Some(build.image),
        _ => None,
    };
    if let Some(image_id) = reusable {
        if let Some(cached) = already_pushed(destination, &run.cache, image, &image_id).await {
            run.reporter.report(Event::Phase {
                image: image.name.clone(),
                platform: Some(unit.platform.clone()),
                phase: Phase::Done,
                message: format!(
                    "inputs unchanged (context, Dockerfile, build args, base images): image {image_id} is already pushed as {}; no build, export or upload (--rebuild builds anyway)",
                    cached.digest
                ),
            });
            return Ok(Reuse::Pushed(Box::new(pushed_before(
                unit,
                &cached,
                BuildInfo {
                    emulated,
                    seconds: 0.0,
                    reused: true,
                    builder: Some(engine.endpoint.clone()),
                    fallback: run.fallbacks.get(&unit.platform).cloned(),
                    window: None,
                },
            ))));
        }
    }
    Ok(Reuse::Build { settings })
}

pub(super) fn warn_if_emulated(unit: &Unit<'_>, emulated: bool, reporter: &dyn Reporter) {
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
    transfers: &[crate::buildkit::filesync::Transfer],
) {
    let (spec, transfers) = (image.clone(), transfers.to_vec());
    let reads = tokio::task::spawn_blocking(move || inputs::reads_of(&spec, &transfers))
        .await
        .ok()
        .flatten();
    if let Some(reads) = reads {
        run.builds.remember(
            key,
            RememberedBuild {
                image: built.to_string(),
                reads,
            },
        );
    }
}

pub(super) async fn build_and_push(
    engine: &Engine,
    destination: &Destination,
    unit: &Unit<'_>,
    emulated: bool,
    run: &Run<'_>,
) -> Result<Pushed> {
    match reuse(engine, destination, unit, emulated, run).await? {
        Reuse::Pushed(pushed) => Ok(*pushed),
        Reuse::Build { settings } => {
            build_unit(engine, destination, unit, emulated, settings, run).await
        }
    }
}

pub(super) async fn build_unit(
    engine: &Engine,
    destination: &Destination,
    unit: &Unit<'_>,
    emulated: bool,
    settings: Option<String>,
    run: &Run<'_>,
) -> Result<Pushed> {
    let (run_id, cleanup, cache, reporter) =
        (run.id.as_str(), run.cleanup, &run.cache, run.reporter);
    let image = unit.image;
    let phase = |phase: Phase, message: String| {
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: Some(unit.platform.clone()),
            phase,
            message,
        })
    };
    warn_if_emulated(unit, emulated, reporter);
    phase(
        Phase::Build,
        format!(
            "building with {}",
            if engine.buildkit {
                "BuildKit"
            } else {
                "the classic builder"
            }
        ),
    );
    let output = match destination {
        Destination::Registry(_)
            if engine.buildkit && engine.containerd_store && run.engine_reaches(image, engine) =>
        {
            build::Output::Registry(&image.repository)
        }
        _ => build::Output::Engine,
    };
    let may_appear = match output {
        build::Output::Engine => cleanup.add(
            engine,
            &build::temporary_tag(&image.name, &unit.platform, run_id),
        ),
        // Nothing is written to the engine.
        build::Output::Registry(_) => Default::default(),
    };
    let built: BuiltImage = build::build(
        engine,
        image,
        &unit.platform,
        run_id,
        output,
        &may_appear,
        reporter,
    )
    .await?;
    if let Some(key) = &settings {
        remember_reads(run, image, key, &built.id, &built.transfers).await;
    }
    let build_info = BuildInfo {
        emulated,
        seconds: (built.seconds * 10.0).round() / 10.0,
        reused: false,
        builder: Some(engine.endpoint.clone()),
        fallback: run.fallbacks.get(&unit.platform).cloned(),
        window: Some(BuildWindow::ending_now(built.seconds)),
    };
    if let Some(pushed) = built.pushed.clone() {
        check_platform(image, unit, &pushed.platform)?;
        let entry = IndexEntry {
            digest: pushed.digest,
            size: pushed.size,
            platform: pushed.platform,
        };
        remember_pushed(run, image, &built.id, &entry);
        phase(
            Phase::Done,
            format!("pushed {} (by the engine)", entry.digest),
        );
        return Ok(Pushed {
            image: image.name.clone(),
            platform: unit.platform.clone(),
            entry,
            build: build_info,
        });
    }

    if let Some(cached) = already_pushed(destination, cache, image, &built.id).await {
        cleanup.remove(engine, &built.tag).await;
        phase(
            Phase::Done,
            format!(
                "unchanged (image {}): already pushed as {}, no export or upload",
                &built.id, cached.digest
            ),
        );
        return Ok(pushed_before(unit, &cached, build_info));
    }

    phase(Phase::Export, format!("exporting {}", &built.id));
    let exported = export_built(engine, unit, &built, run).await?;
    let entry = push_exported(destination, unit, exported, reporter).await?;
    remember_pushed(run, image, &built.id, &entry);
    phase(Phase::Done, format!("pushed {}", entry.digest));
    Ok(Pushed {
        image: image.name.clone(),
        platform: unit.platform.clone(),
        entry,
        build: build_info,
    })
}

/// The pushed manifest, remembered under the image's ID for the next run's reuse.
fn remember_pushed(run: &Run<'_>, image: &ImageSpec, id: &str, entry: &IndexEntry) {
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

/// The built image out of the engine (its temporary tag removed either way), with times
/// clamped for `SOURCE_DATE_EPOCH`.
async fn export_built(
    engine: &Engine,
    unit: &Unit<'_>,
    built: &BuiltImage,
    run: &Run<'_>,
) -> Result<export::ExportedImage> {
    let image = unit.image;
    let exported = export::export_image(
        &engine.docker,
        &built.id,
        &image.name,
        Some(&unit.platform),
        run.reporter,
    )
    .await;
    // The image is in the spool (or the export failed): the engine copy is not needed.
    let _ = run.cleanup.remove(engine, &built.tag).await;
    let exported = exported?;
    let Some(epoch) = image.source_date_epoch else {
        return Ok(exported);
    };
    // The engine wrote the image with the build's own times; they are clamped here.
    tokio::task::spawn_blocking(move || crate::reproducible::normalise(exported, epoch))
        .await
        .map_err(|e| Error::Export {
            image: image.name.clone(),
            message: e.to_string(),
        })?
        .map_err(|message| Error::Export {
            image: image.name.clone(),
            message,
        })
}

/// Pushes an exported image's layers, config and manifest (by digest: no per-platform
/// tags are left behind in the repository); the manifest's index entry.
async fn push_exported(
    destination: &Destination,
    unit: &Unit<'_>,
    exported: export::ExportedImage,
    reporter: &dyn Reporter,
) -> Result<IndexEntry> {
    let image = unit.image;
    let config_platform =
        ConfigPlatform::from_config(&exported.config).map_err(|m| Error::Export {
            image: image.name.clone(),
            message: m,
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
    let reference = first_tag(image)?;
    for layer in &exported.layers {
        destination.put_layer(&reference, layer, &progress).await?;
    }
    destination.put_config(&reference, &exported).await?;
    let manifest =
        oci::image_manifest(&exported, &image.annotations.manifest).map_err(|m| Error::Export {
            image: image.name.clone(),
            message: m,
        })?;
    destination.put_manifest(&reference, &manifest).await?;
    Ok(IndexEntry {
        digest: manifest.digest.clone(),
        size: manifest.bytes.len() as u64,
        platform: config_platform,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fake::{image, FakeStore};

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

//! One image × platform: reused when its inputs are unchanged and its manifest is still
//! pushed, else built, exported (or pushed by the engine) and pushed by digest.

use super::Run;
use crate::build::{self, BuildError, BuiltImage};
use crate::cache::{CachedManifest, PushCache};
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
    format!("{id}+{}", &oci::sha256_digest(&annotations)[7..19])
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
    let reference = first_tag(image)?;

    if let Some(pushed) = built.pushed {
        check_platform(image, unit, &pushed.platform)?;
        cache.put(
            &image.repository,
            &pushed_key(image, &built.id),
            CachedManifest {
                digest: pushed.digest.clone(),
                size: pushed.size,
                os: pushed.platform.os.clone(),
                architecture: pushed.platform.architecture.clone(),
                variant: pushed.platform.variant.clone(),
            },
        );
        phase(
            Phase::Done,
            format!("pushed {} (by the engine)", pushed.digest),
        );
        return Ok(Pushed {
            image: image.name.clone(),
            platform: unit.platform.clone(),
            entry: IndexEntry {
                digest: pushed.digest,
                size: pushed.size,
                platform: pushed.platform,
            },
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
    let exported = export::export_image(
        &engine.docker,
        &built.id,
        &image.name,
        Some(&unit.platform),
        reporter,
    )
    .await;
    // The image is in the spool (or the export failed): the engine copy is not needed.
    let _ = cleanup.remove(engine, &built.tag).await;
    let mut exported = exported?;
    if let Some(epoch) = image.source_date_epoch {
        // The engine wrote the image with the build's own times; they are clamped here.
        exported =
            tokio::task::spawn_blocking(move || crate::reproducible::normalise(exported, epoch))
                .await
                .map_err(|e| Error::Export {
                    image: image.name.clone(),
                    message: e.to_string(),
                })?
                .map_err(|message| Error::Export {
                    image: image.name.clone(),
                    message,
                })?;
    }

    let config_platform =
        ConfigPlatform::from_config(&exported.config).map_err(|m| Error::Export {
            image: image.name.clone(),
            message: m,
        })?;
    check_platform(image, unit, &config_platform)?;

    let total: u64 = exported.layers.iter().map(|l| l.size).sum();
    phase(
        Phase::Push,
        format!("pushing {} layers ({} bytes)", exported.layers.len(), total),
    );
    let progress = BlobProgress {
        image: &image.name,
        platform: Some(&unit.platform),
        total: Some(total),
        reporter,
        done: Default::default(),
    };
    for layer in &exported.layers {
        destination.put_layer(&reference, layer, &progress).await?;
    }
    destination.put_config(&reference, &exported).await?;
    let manifest =
        oci::image_manifest(&exported, &image.annotations.manifest).map_err(|m| Error::Export {
            image: image.name.clone(),
            message: m,
        })?;
    // By digest: no per-platform tags are left behind in the repository.
    destination.put_manifest(&reference, &manifest).await?;
    cache.put(
        &image.repository,
        &pushed_key(image, &built.id),
        CachedManifest {
            digest: manifest.digest.clone(),
            size: manifest.bytes.len() as u64,
            os: config_platform.os.clone(),
            architecture: config_platform.architecture.clone(),
            variant: config_platform.variant.clone(),
        },
    );
    phase(Phase::Done, format!("pushed {}", manifest.digest));
    Ok(Pushed {
        image: image.name.clone(),
        platform: unit.platform.clone(),
        entry: IndexEntry {
            digest: manifest.digest.clone(),
            size: manifest.bytes.len() as u64,
            platform: config_platform,
        },
        build: build_info,
    })
}

//! An image's platforms built in one solve on the containerd image store, the engine
//! pushing each platform manifest by digest itself.

use super::emulation::EmulationPlan;
use super::unit::{
    build_unit, check_platform, pushed_key, remember_reads, reuse, warn_if_emulated, Reuse,
};
use super::Run;
use crate::build;
use crate::cache::CachedManifest;
use crate::digest::Digest;
use crate::engine::{Builders, Engine};
use crate::oci::{self, ConfigPlatform, IndexEntry};
use crate::plan::Unit;
use crate::progress::{Event, Phase};
use crate::provenance::BuildWindow;
use crate::publish::Pushed;
use crate::record::BuildInfo;
use crate::registry::{self, Registry};
use crate::store::Destination;
use crate::{Error, Platform, Result};

/// The engine that builds all of an image's platforms in one solve pushing them by digest
/// itself, when one can: one builder for them all, on containerd's image store, reaching the
/// registry, and no per-platform registry cache (which needs a solve per platform).
pub(super) fn solved_together<'e>(
    units: &[&Unit<'_>],
    builders: &'e Builders,
    run: &Run<'_>,
) -> Option<&'e Engine> {
    let image = units.first()?.image;
    let engine = builders.for_unit(units[0]);
    let one_engine = units
        .iter()
        .all(|u| builders.for_unit(u).endpoint == engine.endpoint);
    (units.len() > 1
        && one_engine
        && engine.buildkit
        && engine.containerd_store
        && run.engine_reaches(image, engine)
        && image.cache_from.is_empty()
        && image.cache_to.is_none())
    .then_some(engine)
}

/// An image's platforms built in one solve (see [`solved_together`]): the ones whose
/// inputs are unchanged are reused, the rest built together, their manifests read from the
/// index the engine pushed by digest. The index itself is never tagged: polyarch
/// publishes its own of exactly the platform manifests.
pub(super) async fn build_and_push_image(
    engine: &Engine,
    destination: &Destination,
    registry: &Registry,
    units: &[&Unit<'_>],
    emulation: &EmulationPlan<'_>,
    jobs: &tokio::sync::Semaphore,
    run: &Run<'_>,
) -> Result<Vec<Pushed>> {
    let mut pushed = Vec::new();
    let mut to_build = Vec::new();
    let _job = jobs.acquire().await.map_err(|_| Error::Interrupted)?;
    for unit in units {
        let emulated = emulation.is_emulated(unit);
        match reuse(engine, destination, unit, emulated, run).await? {
            Reuse::Pushed(p) => pushed.push(*p),
            Reuse::Build { settings } => to_build.push((*unit, settings, emulated)),
        }
    }
    match to_build.len() {
        0 => {}
        1 => {
            let (unit, settings, emulated) = to_build.remove(0);
            pushed.push(build_unit(engine, destination, unit, emulated, settings, run).await?);
        }
        _ => match build_together(engine, registry, &to_build, run).await {
            Err(Error::Emulation(_))
                if to_build.iter().any(|(u, ..)| emulation.was_remembered(u)) =>
            {
                for (unit, _, emulated) in &mut to_build {
                    if emulation.was_remembered(unit) {
                        *emulated = emulation.recheck(engine, unit, run.reporter).await?;
                    }
                }
                pushed.extend(build_together(engine, registry, &to_build, run).await?);
            }
            outcome => pushed.extend(outcome?),
        },
    }
    Ok(pushed)
}

async fn build_together(
    engine: &Engine,
    registry: &Registry,
    units: &[(&Unit<'_>, Option<String>, bool)],
    run: &Run<'_>,
) -> Result<Vec<Pushed>> {
    let reporter = run.reporter;
    let image = units[0].0.image;
    let platforms: Vec<Platform> = units.iter().map(|(u, ..)| u.platform.clone()).collect();
    let names: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    for (unit, _, emulated) in units {
        warn_if_emulated(unit, *emulated, reporter);
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: Some(unit.platform.clone()),
            phase: Phase::Build,
            message: format!("building with BuildKit ({} in one solve)", names.join(", ")),
        });
    }
    let built =
        build::build_platforms(engine, image, &platforms, &image.repository, reporter).await?;
    let index_ref = registry::parse_reference(&format!("{}@{}", image.repository, built.digest))?;
    let (bytes, _) = registry.get_manifest(&index_ref).await?;
    let unreadable = |message: String| Error::Registry {
        registry: index_ref.registry().to_string(),
        message: format!("the index the engine pushed as {index_ref} {message}"),
    };
    let index = match oci::parse_manifest(&bytes).map_err(&unreadable)? {
        oci::Parsed::Index { index, .. } => index,
        _ => return Err(unreadable("is not an index".into())),
    };
    let mut pushed = Vec::new();
    for (unit, settings, emulated) in units {
        let entry = index
            .manifests()
            .iter()
            .filter(|d| !oci::is_attestation(d))
            .find(|d| oci::descriptor_platform(d).as_ref() == Some(&unit.platform))
            .ok_or_else(|| unreadable(format!("has no {} manifest", unit.platform)))?;
        let declared = entry.platform().as_ref().map(|p| ConfigPlatform {
            os: p.os().to_string(),
            architecture: p.architecture().to_string(),
            variant: p.variant().clone(),
        });
        let platform = declared.unwrap_or_default();
        check_platform(image, unit, &platform)?;
        let digest: Digest =
            entry.digest().as_ref().parse().map_err(|why| {
                unreadable(format!("lists digest `{}`, which {why}", entry.digest()))
            })?;
        if let Some(key) = settings {
            remember_reads(run, image, key, digest.as_str(), &built.transfers).await;
        }
        run.cache.put(
            &image.repository,
            &pushed_key(image, digest.as_str()),
            CachedManifest {
                digest: digest.clone(),
                size: entry.size(),
                os: platform.os.clone(),
                architecture: platform.architecture.clone(),
                variant: platform.variant.clone(),
            },
        );
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: Some(unit.platform.clone()),
            phase: Phase::Done,
            message: format!("pushed {digest} (by the engine)"),
        });
        pushed.push(Pushed {
            image: image.name.clone(),
            platform: unit.platform.clone(),
            entry: IndexEntry {
                digest,
                size: entry.size(),
                platform,
            },
            build: BuildInfo {
                emulated: *emulated,
                seconds: (built.seconds * 10.0).round() / 10.0,
                reused: false,
                builder: Some(engine.endpoint.clone()),
                fallback: run.fallbacks.get(&unit.platform).cloned(),
                window: Some(BuildWindow::ending_now(built.seconds)),
            },
        });
    }
    Ok(pushed)
}

//! An image's platforms built in one solve on the containerd image store, the engine
//! pushing each platform manifest by digest itself.

use super::retry::missing_emulation;
use super::unit::{
    build_info, build_starts, build_unit, building, check_platform, pusher, reads, remember,
    remember_pushed, report_phase, reuse, Reuse,
};
use super::{read_sbom_ahead, Run, Shared};
use crate::base::digest::Digest;
use crate::base::oci::{self, ConfigPlatform, IndexEntry};
use crate::base::progress::Phase;
use crate::builder;
use crate::builder::Builders;
use crate::docker::engine::Engine;
use crate::project::plan::Unit;
use crate::publish::Pushed;
use crate::registry::{self, Registry, RegistryError};
use crate::{Error, Platform, Result};
use oci_client::Reference;
use oci_spec::image::ImageIndex;

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
    registry: &Registry,
    units: &[&Unit<'_>],
    shared: &Shared<'_>,
) -> Result<Vec<Pushed>> {
    let (destination, emulation, run) = (shared.destination, shared.emulation, shared.run);
    let mut pushed = Vec::new();
    let mut to_build = Vec::new();
    let _job = shared
        .engine_jobs
        .acquire()
        .await
        .map_err(|_| Error::Interrupted)?;
    // Each platform's check (its settings key, replay and manifest look-up) at once: a
    // warm rerun's round trips overlap.
    let checks = units.iter().map(|unit| async move {
        let emulated = emulation.is_emulated(unit);
        let reuse = reuse(engine, destination, unit, emulated, run).await?;
        Ok::<_, Error>((*unit, emulated, reuse))
    });
    for (unit, emulated, reuse) in futures_util::future::try_join_all(checks).await? {
        match reuse {
            Reuse::Pushed(p) => pushed.push(*p),
            Reuse::Build { settings } => to_build.push((unit, settings, emulated)),
        }
    }
    match to_build.len() {
        0 => {}
        1 => {
            let (unit, settings, emulated) = to_build.remove(0);
            pushed.push(build_unit(engine, destination, unit, emulated, settings, run).await?);
        }
        _ => match build_together(engine, registry, &to_build, run).await {
            Err(error)
                if missing_emulation(&error)
                    && to_build.iter().any(|(u, ..)| emulation.was_remembered(u)) =>
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

/// An image's `units` built in one solve, each platform's manifest read from the index
/// the engine pushed.
async fn build_together(
    engine: &Engine,
    registry: &Registry,
    units: &[(&Unit<'_>, Option<String>, bool)],
    run: &Run<'_>,
) -> Result<Vec<Pushed>> {
    let image = units[0].0.image;
    let platforms: Vec<Platform> = units.iter().map(|(u, ..)| u.platform.clone()).collect();
    let names: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    for (unit, _, emulated) in units {
        let message = format!(
            "building {} ({} in one solve)",
            building(engine),
            names.join(", ")
        );
        build_starts(run, unit, *emulated, message);
    }
    let hashes = run.replays.hashes();
    let repository = &image.repository;
    // The layers of each platform are read for its SBOM as soon as the exporter has pushed
    // them, while the solve still finishes.
    let manifests_pushed = |manifests: &[Digest]| {
        for manifest in manifests {
            read_sbom_ahead(registry, image, manifest);
        }
    };
    let built = builder::build_platforms(
        engine,
        image,
        &platforms,
        repository,
        &hashes,
        &manifests_pushed,
        run.reporter,
    )
    .await?;
    let index_ref = registry::parse_reference(&format!("{}@{}", image.repository, built.digest))?;
    let index = pushed_index(registry, &index_ref).await?;
    let entries = units
        .iter()
        .map(|(unit, ..)| platform_entry(&index, &index_ref, unit))
        .collect::<Result<Vec<_>>>()?;
    // Started already when the solve's statuses named the pushed manifests; this starts it
    // for an engine whose statuses did not.
    for entry in &entries {
        read_sbom_ahead(registry, image, &entry.digest);
    }
    // One solve read the context for all its platforms: hashed once, remembered for each.
    let reads = match units.iter().any(|(_, settings, _)| settings.is_some()) {
        true => reads(run, image, &built.transfers, None).await,
        false => None,
    };
    let mut pushed = Vec::new();
    for ((unit, settings, emulated), entry) in units.iter().zip(entries) {
        if let (Some(key), Some(reads)) = (settings, &reads) {
            remember(run, key, entry.digest.as_str(), reads.clone());
        }
        remember_pushed(run, image, entry.digest.as_str(), &entry);
        let message = format!("pushed {} (by {})", entry.digest, pusher(engine));
        report_phase(run, unit, Phase::Done, message);
        pushed.push(Pushed {
            image: image.name.clone(),
            platform: unit.platform.clone(),
            entry,
            build: build_info(engine, unit, *emulated, built.seconds, run),
        });
    }
    Ok(pushed)
}

/// The index the engine pushed as `reference`, read back for its platform manifests.
async fn pushed_index(registry: &Registry, reference: &Reference) -> Result<ImageIndex> {
    let (bytes, _) = registry.get_manifest(reference).await?;
    let parsed = oci::parse_manifest(&bytes).map_err(|source| {
        let pushed = reference.to_string();
        let kind = RegistryError::PushedIndexMalformed {
            reference: pushed,
            source,
        };
        unreadable(reference, kind)
    })?;
    match parsed {
        oci::Parsed::Index { index, .. } => Ok(*index),
        _ => Err(unreadable(
            reference,
            RegistryError::PushedNotIndex {
                reference: reference.to_string(),
            },
        )),
    }
}

/// `unit`'s manifest in the index the engine pushed, once it is for the unit's platform.
fn platform_entry(
    index: &ImageIndex,
    reference: &Reference,
    unit: &Unit<'_>,
) -> Result<IndexEntry> {
    let entry = index
        .manifests()
        .iter()
        .filter(|d| !oci::is_attestation(d))
        .find(|d| oci::descriptor_platform(d).as_ref() == Some(&unit.platform))
        .ok_or_else(|| {
            let (pushed, platform) = (reference.to_string(), unit.platform.to_string());
            unreadable(
                reference,
                RegistryError::PushedWithout {
                    reference: pushed,
                    platform,
                },
            )
        })?;
    let declared = entry.platform().as_ref().map(|p| ConfigPlatform {
        os: p.os().to_string(),
        architecture: p.architecture().to_string(),
        variant: p.variant().clone(),
    });
    let platform = declared.unwrap_or_default();
    check_platform(unit.image, unit, &platform)?;
    let digest = entry.digest().as_ref().parse().map_err(|source| {
        let source = oci::OciError::Digest {
            value: entry.digest().to_string(),
            source,
        };
        unreadable(
            reference,
            RegistryError::PushedIndexMalformed {
                reference: reference.to_string(),
                source,
            },
        )
    })?;
    Ok(IndexEntry {
        digest,
        size: entry.size(),
        platform,
    })
}

/// The engine's index at `reference` is not what polyarch can read its manifests from.
fn unreadable(reference: &Reference, source: RegistryError) -> Error {
    Error::Registry {
        registry: reference.registry().to_string(),
        source: source.into(),
    }
}

//! An image's platforms built on Podman in one build through libpod's own API, then each
//! platform image exported from Podman and pushed by digest by polyarch, as the classic
//! builder's are.

use super::retry::missing_emulation;
use super::unit::{build_starts, push_built, reuse, Reuse};
use super::Shared;
use crate::builder::{self, Builders, LibpodBuild};
use crate::docker::engine::{Engine, Product};
use crate::project::plan::Unit;
use crate::publish::Pushed;
use crate::{Error, Platform, Result};

/// The Podman engine that builds all of an image's platforms in one libpod build: one
/// builder for them all, and Podman's API (not a BuildKit daemon or Docker).
pub(super) fn built_by_libpod<'e>(
    units: &[&Unit<'_>],
    builders: &'e Builders,
) -> Option<&'e Engine> {
    let engine = builders.for_unit(units.first()?);
    let one_engine = units
        .iter()
        .all(|u| builders.for_unit(u).endpoint == engine.endpoint);
    (one_engine && engine.product == Product::Podman && engine.daemon.is_none()).then_some(engine)
}

/// An image's platforms on Podman (see [`built_by_libpod`]): the ones whose inputs are
/// unchanged are reused, the rest built in one libpod build, then each exported and
/// pushed by digest (the index and tags stay polyarch's, as on every engine), or written
/// to the `--output oci:` layout.
pub(super) async fn build_and_push_image(
    engine: &Engine,
    units: &[&Unit<'_>],
    shared: &Shared<'_>,
) -> Result<Vec<Pushed>> {
    let (destination, emulation, run) = (shared.destination, shared.emulation, shared.run);
    let _job = shared
        .jobs
        .acquire()
        .await
        .map_err(|_| Error::Interrupted)?;
    let checks = units.iter().map(|unit| async move {
        let emulated = emulation.is_emulated(unit);
        let reuse = reuse(engine, destination, unit, emulated, run).await?;
        Ok::<_, Error>((*unit, emulated, reuse))
    });
    let mut pushed = Vec::new();
    let mut to_build = Vec::new();
    for (unit, emulated, reuse) in futures_util::future::try_join_all(checks).await? {
        match reuse {
            Reuse::Pushed(p) => pushed.push(*p),
            Reuse::Build { settings } => to_build.push((unit, settings, emulated)),
        }
    }
    if to_build.is_empty() {
        return Ok(pushed);
    }
    let image = to_build[0].0.image;
    let platforms: Vec<Platform> = to_build.iter().map(|(u, ..)| u.platform.clone()).collect();
    let names: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    for (unit, _, emulated) in &to_build {
        let message = format!(
            "building with Podman's libpod build ({} in one build)",
            names.join(", ")
        );
        build_starts(run, unit, *emulated, message);
    }
    let hashes = run.replays.hashes();
    let build = || LibpodBuild {
        spec: image,
        platforms: &platforms,
        run_id: &run.id,
        registry: &run.registry,
        reporter: run.reporter,
        hashes: &hashes,
    };
    // A remembered emulation verdict the build proves wrong is probed again (registering
    // QEMU, per the mode) and the build retried once, as on Docker.
    let built = match builder::build_with_libpod(engine, build(), run.cleanup)
        .await
        .map_err(Error::from)
    {
        Err(error)
            if missing_emulation(&error)
                && to_build.iter().any(|(u, ..)| emulation.was_remembered(u)) =>
        {
            for (unit, _, emulated) in &mut to_build {
                if emulation.was_remembered(unit) {
                    *emulated = emulation.recheck(engine, unit, run.reporter).await?;
                }
            }
            builder::build_with_libpod(engine, build(), run.cleanup).await?
        }
        outcome => outcome?,
    };
    // Each platform image is exported and pushed at once; its copy in Podman is removed
    // as its upload ends.
    let pushes =
        to_build
            .into_iter()
            .zip(built.images)
            .map(|((unit, settings, emulated), built)| {
                push_built(engine, destination, unit, emulated, settings, built, run)
            });
    pushed.extend(futures_util::future::try_join_all(pushes).await?);
    Ok(pushed)
}

//! The build command end to end: plan → build → export → push → publish → verify → record.
//! Tags move only after every platform manifest of an image is in the registry.

mod dependents;
mod early;
mod emulation_plan;
mod libpod;
pub(crate) mod platform_tests;
mod retry;
mod together;
mod unit;

use crate::base::digest::Digest;
use crate::base::join;
use crate::base::progress::Reporter;
use crate::builder::build_inputs;
use crate::builder::cleanup::Cleanup;
use crate::builder::file_hashes::FileHashes;
use crate::builder::platform_test::{self, TestOf};
use crate::builder::Builder;
use crate::builder::Builders;
use crate::docker::engine::Engine;
use crate::flows::cache::{
    BlobMemory, BuildMemory, LayerDigests, PushCache, TestMemory, VerifyMemory,
};
use crate::project::plan::{self, Unit};
use crate::project::{BinfmtMode, ImageSpec, Project};
use crate::publish::layout::OciLayout;
use crate::publish::store::{connect_registry, Destination};
use crate::publish::Pushed;
use crate::registry::{self, Registry, RegistryOptions};
use crate::verify::coverage_record::{CoverageRecord, PartImage, PartPlatform, PartRecord};
use crate::{Error, Platform, Result};
pub use emulation_plan::image_needs_emulation;
use emulation_plan::EmulationPlan;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use together::{build_and_push_image, solved_together};

#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Images to build (all when empty).
    pub images: Vec<String>,
    /// Restrict to these platforms.
    pub platforms: Vec<Platform>,
    pub registry: RegistryOptions,
    /// `--jobs`: solves running at once; None for the defaults of `job_limits`.
    pub jobs: Option<usize>,
    /// Write an OCI image layout directory instead of pushing (`--output oci:DIR`).
    pub layout: Option<std::path::PathBuf>,
    /// `--binfmt`: overrides the project's and every image's mode.
    pub binfmt: Option<BinfmtMode>,
    /// `--binfmt-image`: overrides the project's installer image.
    pub binfmt_image: Option<String>,
    /// `--rebuild`: ask the engine to build even when the inputs match an earlier run's.
    pub rebuild: bool,
    /// `--no-test`: the images' `test:` is not run; the record says skipped.
    pub skip_tests: bool,
    /// Cancelled on SIGINT: builds and uploads stop, but a publish that has begun completes,
    /// so tags never end up pointing at different indexes.
    pub interrupt: tokio_util::sync::CancellationToken,
}

/// What the builds of a run leave for publishing.
struct Built<'a> {
    plan: plan::Plan<'a>,
    destination: Destination,
    pushed: Vec<Pushed>,
    /// The dependents as built, from Dockerfiles naming what they build FROM by digest:
    /// what their provenance names.
    rebased: BTreeMap<String, ImageSpec>,
    /// The run's builders: a platform's tests run on the one that built it.
    builders: Builders,
    /// A test of a foreign platform runs under its build's QEMU, and re-checks a
    /// remembered verdict as a build does.
    emulation: EmulationPlan<'a>,
}

/// Builds and pushes every unit by digest; nothing is tagged yet. SIGINT stops it here,
/// before any tag moves.
async fn build_units<'a>(
    project: &'a Project,
    engine: impl Future<Output = Result<Engine>>,
    options: &'a BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<Built<'a>> {
    tokio::select! {
        built = build_and_push_all(project, engine, options, cleanup, reporter) => built,
        _ = options.interrupt.cancelled() => Err(Error::Interrupted),
    }
}

async fn build_and_push_all<'a>(
    project: &'a Project,
    engine: impl Future<Output = Result<Engine>>,
    options: &'a BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<Built<'a>> {
    let selection = plan::selection(project, &options.images, &options.platforms)?;
    // The engine and the registry are reached at once: neither needs the other.
    let reached = async {
        Ok(match &options.layout {
            Some(dir) => Reached::Layout(dir),
            None => Reached::Registry(
                connect_registry(&selection.images, &options.registry, true).await?,
            ),
        })
    };
    let (engine, reached) = join::primary_first(engine, reached).await?;
    let plan = selection.on(&engine.native);
    let builders = Builders::connect(engine.clone(), &project.builders, &plan, reporter).await?;
    if !options.skip_tests {
        platform_tests::check_testable(&plan, &builders, options.layout.is_some())?;
    }
    let destination = destination(&plan, reached)?;
    let blobs = Arc::new(BlobMemory::open());
    if let Destination::Registry(registry) = &destination {
        registry.remember_blob_places(blobs.clone());
    }
    let emulation =
        EmulationPlan::prepare(project, &plan, options, &builders, cleanup, reporter).await?;

    let run = Run::open(options, cleanup, &builders, reporter);
    let run = &run;
    dependents::check_named_contexts(&plan, &builders)?;
    dependents::check_reachable(&plan, &builders, run)?;
    // `--jobs` bounds the solves running at once: a platform's own, or one for several
    // platforms of an image.
    let (own, pushed_by_engine) = job_limits(options.jobs);
    let jobs = tokio::sync::Semaphore::new(own);
    let engine_jobs = tokio::sync::Semaphore::new(pushed_by_engine);
    let pins = dependents::Pins::new(&plan);
    let shared = Shared {
        destination: &destination,
        builders: &builders,
        emulation: &emulation,
        jobs: &jobs,
        engine_jobs: &engine_jobs,
        run,
    };
    let (shared, pins, graph) = (&shared, &pins, &plan.dependencies);
    let per_image = futures_util::future::try_join_all(
        units_by_image(&plan.units)
            .into_iter()
            .map(|units| build_when_ready(units, graph, pins, shared)),
    )
    .await;
    // What did get pushed is remembered even when another unit failed.
    run.save();
    blobs.save();
    let (pushed, rebased) = gather(per_image?);
    Ok(Built {
        plan,
        destination,
        pushed,
        rebased,
        builders,
        emulation,
    })
}

/// The plan's units grouped by image, in plan order.
fn units_by_image<'u>(units: &'u [Unit<'u>]) -> Vec<Vec<&'u Unit<'u>>> {
    let mut images: Vec<Vec<&Unit<'_>>> = Vec::new();
    for unit in units {
        match images
            .iter_mut()
            .find(|units| units[0].image.name == unit.image.name)
        {
            Some(units) => units.push(unit),
            None => images.push(vec![unit]),
        }
    }
    images
}

/// Every image's pushed platforms, and the dependents as rebuilt FROM digests by name.
fn gather(
    per_image: Vec<(Vec<Pushed>, Option<ImageSpec>)>,
) -> (Vec<Pushed>, BTreeMap<String, ImageSpec>) {
    let (mut pushed, mut rebased) = (Vec::new(), BTreeMap::new());
    for (image, spec) in per_image {
        pushed.extend(image);
        if let Some(spec) = spec {
            rebased.insert(spec.name.clone(), spec);
        }
    }
    (pushed, rebased)
}

/// The registry, reached beside the engine; or with `--output oci:DIR` the layout's
/// directory, made once the plan is checked against it.
enum Reached<'o> {
    Registry(Registry),
    Layout(&'o std::path::Path),
}

/// Where the images go: the registry, or with `--output oci:DIR` a layout of one image.
fn destination(plan: &plan::Plan<'_>, reached: Reached<'_>) -> Result<Destination> {
    Ok(match reached {
        Reached::Layout(dir) => {
            dependents::check_layout(plan, dir)?;
            if plan.images.len() != 1 {
                return Err(Error::Usage(format!(
                    "--output oci:{} holds one image's tags; name one image ({})",
                    dir.display(),
                    plan.images
                        .iter()
                        .map(|i| i.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            if let Some(image) = plan.images.iter().find(|i| i.provenance) {
                return Err(Error::Usage(format!(
                    "--output oci:{}: image {} asks for provenance, which polyarch attaches in a registry only; push to a registry, or drop provenance: true / --provenance",
                    dir.display(),
                    image.name
                )));
            }
            if let Some(image) = plan.images.iter().find(|i| i.sbom) {
                return Err(Error::Usage(format!(
                    "--output oci:{}: image {} asks for an SBOM, which polyarch attaches in a registry only; push to a registry, or drop sbom: true / --sbom",
                    dir.display(),
                    image.name
                )));
            }
            if let Some(image) = plan.images.iter().find(|i| i.signer.is_some()) {
                return Err(Error::Usage(format!(
                    "--output oci:{}: image {} asks to be signed, which polyarch attaches in a registry only; push to a registry, or drop sign: / --sign-key",
                    dir.display(),
                    image.name
                )));
            }
            Destination::Layout(OciLayout::create(dir)?)
        }
        Reached::Registry(registry) => Destination::Registry(registry),
    })
}

/// Solves at once by default that polyarch exports and pushes itself: its own CPU
/// (hashing, gzip) and uploads; also the platforms `verify --test` tests at once.
pub const DEFAULT_JOBS: usize = 2;
/// Solves at once by default that the engine pushes itself ([`solved_together`]): polyarch
/// only waits on them and BuildKit schedules their steps itself, so many at once let the
/// engine overlap one image's push round trips with another's steps, as `docker buildx
/// bake` does running every target at once. 10 images × 2 platforms on Docker 26.1: 4.8 s
/// two at a time, 3.8 s all at once (bench/analysis.md).
const ENGINE_PUSHED_JOBS: usize = 16;

/// How many solves run at once: (those polyarch exports and pushes, those the engine
/// pushes itself). `--jobs` bounds both.
fn job_limits(jobs: Option<usize>) -> (usize, usize) {
    match jobs {
        Some(n) => (n.max(1), n.max(1)),
        None => (DEFAULT_JOBS, ENGINE_PUSHED_JOBS),
    }
}

/// What every image's build of one run shares.
struct Shared<'r> {
    destination: &'r Destination,
    builders: &'r Builders,
    emulation: &'r EmulationPlan<'r>,
    jobs: &'r tokio::sync::Semaphore,
    /// Bounds the solves of [`solved_together`], which the engine pushes itself.
    engine_jobs: &'r tokio::sync::Semaphore,
    run: &'r Run<'r>,
}

/// One image's platforms once the images it builds `FROM` are pushed (from a Dockerfile
/// naming them by digest); then lets its own dependents start.
async fn build_when_ready(
    units: Vec<&Unit<'_>>,
    graph: &crate::project::dependencies::Graph,
    pins: &dependents::Pins,
    shared: &Shared<'_>,
) -> Result<(Vec<Pushed>, Option<ImageSpec>)> {
    let image = units[0].image;
    let rebased = dependents::rebased(image, graph, pins, shared.run).await?;
    let rebased_units: Vec<Unit<'_>> = units
        .iter()
        .map(|unit| Unit {
            image: rebased.as_ref().unwrap_or(image),
            ..(*unit).clone()
        })
        .collect();
    let units: Vec<&Unit<'_>> = rebased_units.iter().collect();
    let pushed = build_image(&units, shared).await?;
    pins.pushed(shared.destination, image, &pushed).await?;
    Ok((pushed, rebased))
}

/// One image's platforms: on Podman in one libpod build (see [`libpod::built_by_libpod`]),
/// in one solve where the engine can (see [`solved_together`]), else a solve per platform.
async fn build_image(units: &[&Unit<'_>], shared: &Shared<'_>) -> Result<Vec<Pushed>> {
    let (destination, builders, run) = (shared.destination, shared.builders, shared.run);
    if let Some(engine) = libpod::built_by_libpod(units, builders) {
        let pushed = libpod::build_and_push_image(engine, units, shared).await?;
        for p in &pushed {
            read_sbom_ahead_of(destination, units[0].image, p);
        }
        return Ok(pushed);
    }
    let together = match destination {
        Destination::Registry(registry) => {
            solved_together(units, builders, run).map(|engine| (engine, registry))
        }
        Destination::Layout(_) => None,
    };
    if let Some((engine, registry)) = together {
        return build_and_push_image(engine, registry, units, shared).await;
    }
    futures_util::future::try_join_all(units.iter().map(|unit| async move {
        let _job = shared
            .jobs
            .acquire()
            .await
            .map_err(|_| Error::Interrupted)?;
        let pushed = retry::build_on_builders(unit, shared).await?;
        read_sbom_ahead_of(destination, unit.image, &pushed);
        Ok(pushed)
    }))
    .await
}

/// Starts reading the layers of `pushed`, built this run, for its SBOM when its image
/// asks for one: while the other platforms build, and before its tests run.
fn read_sbom_ahead_of(destination: &Destination, image: &ImageSpec, pushed: &Pushed) {
    if let Destination::Registry(registry) = destination {
        if !pushed.build.reused {
            read_sbom_ahead(registry, image, &pushed.entry.digest);
        }
    }
}

/// Starts reading the layers of `platform`, a manifest of `image` pushed by digest, for
/// its SBOM when the image asks for one (see [`crate::sbom::remote::read_ahead`]).
pub(super) fn read_sbom_ahead(registry: &Registry, image: &ImageSpec, platform: &Digest) {
    if let (true, Ok(reference)) = (image.sbom, image.first_tag()) {
        crate::sbom::remote::read_ahead(registry, reference, platform.clone());
    }
}

/// `build`: builds, pushes, publishes every tag as one index per image, reads it back.
pub async fn build(
    project: &Project,
    engine: impl Future<Output = Result<Engine>>,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let built = build_units(project, engine, options, cleanup, reporter).await?;
    let images = pushed_by_image(&built);
    // Every platform is pushed by digest and nothing is tagged yet: the tests run now,
    // and an image with a failing test is not published.
    let results = test_pushed(&built, &images, options, cleanup, reporter).await?;
    // What the read-back finds is what a later `verify` or `gate` of the tags will read.
    let memory = VerifyMemory::open();
    let published = platform_tests::publish_tested(
        &built.destination,
        &images,
        &results,
        &memory,
        &options.interrupt,
        reporter,
    );
    let published = published.await;
    memory.save();
    Ok(CoverageRecord::new(published?))
}

/// Runs each pushed platform's tests on the builder that built it (`--no-test`: records
/// them skipped). Nothing is tagged while they run; Ctrl-C cancels them.
async fn test_pushed(
    built: &Built<'_>,
    images: &[(&ImageSpec, Vec<&Pushed>)],
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<platform_tests::TestResults> {
    if options.skip_tests {
        return Ok(platform_tests::skipped(images));
    }
    let test_memory = TestMemory::open();
    let tests = platform_tests::run_tests(
        images,
        job_limits(options.jobs).0,
        platform_tests::Earlier {
            memory: &test_memory,
            trusted: !options.rebuild,
        },
        reporter,
        async |image: &ImageSpec, pushed: &Pushed, test| {
            let engine = platform_tests::builder_of(&built.builders, pushed);
            let of = TestOf {
                spec: image,
                platform: &pushed.platform,
                digest: &pushed.entry.digest,
                test,
                registry: &options.registry,
                cleanup,
                reporter,
            };
            let outcome = platform_test::test_on_engine(engine, of).await?;
            // A remembered emulator may be gone (binfmt cleared since): probe again
            // and run the test once more, as a build would be.
            let unit = built
                .plan
                .units
                .iter()
                .find(|u| u.image.name == image.name && u.platform == pushed.platform);
            match unit {
                Some(unit)
                    if outcome.exec_format_error()
                        && built.emulation.was_remembered(unit)
                        && built.emulation.recheck(engine, unit, reporter).await? =>
                {
                    Ok(platform_test::test_on_engine(engine, of).await?)
                }
                _ => Ok(outcome),
            }
        },
    );
    let results = tokio::select! {
        results = tests => results,
        // Dropping the tests cancels their solves; no tag has moved.
        _ = options.interrupt.cancelled() => Err(Error::Interrupted),
    };
    // What passed is remembered even when another image's test could not run.
    test_memory.save();
    results
}

/// Each image of the plan with its pushed platforms (a dependent as rebuilt FROM digests).
fn pushed_by_image<'b>(built: &'b Built<'_>) -> Vec<(&'b ImageSpec, Vec<&'b Pushed>)> {
    built
        .plan
        .images
        .iter()
        .map(|image| {
            let mine = built
                .pushed
                .iter()
                .filter(|p| p.image == image.name)
                .collect();
            (built.rebased.get(&image.name).unwrap_or(image), mine)
        })
        .collect()
}

/// `build --push-by-digest`: pushes this runner's platforms by digest and records them
/// as a part for `assemble`; no tag moves.
pub async fn build_part(
    project: &Project,
    engine: impl Future<Output = Result<Engine>>,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<PartRecord> {
    if options.layout.is_some() {
        return Err(Error::Usage(
            "--push-by-digest pushes to the registry; drop --output".into(),
        ));
    }
    let built = build_units(project, engine, options, cleanup, reporter).await?;
    let images = pushed_by_image(&built);
    // The runner that built a platform tests it; `assemble` reads the verdict.
    let results = test_pushed(&built, &images, options, cleanup, reporter).await?;
    let images = images
        .iter()
        .map(|(image, pushed)| PartImage {
            name: image.name.clone(),
            repository: image.repository.clone(),
            platforms: pushed
                .iter()
                .map(|p| PartPlatform {
                    platform: p.platform.clone(),
                    digest: p.entry.digest.clone(),
                    size: p.entry.size,
                    build: p.build.clone(),
                    test: results
                        .get(&(image.name.clone(), p.platform.clone()))
                        .cloned(),
                })
                .collect(),
        })
        .collect();
    Ok(PartRecord::new(images))
}

/// What every unit of one run shares.
struct Run<'a> {
    id: String,
    cleanup: &'a Cleanup,
    cache: PushCache,
    builds: BuildMemory,
    /// False with `--rebuild`.
    trust_inputs: bool,
    registry: RegistryOptions,
    replays: build_inputs::Replays,
    bases: build_inputs::RemoteBases,
    reporter: &'a dyn Reporter,
    /// Platforms built on the default engine because their builders were unreachable.
    fallbacks: BTreeMap<Platform, String>,
    /// Layers sent while they are exported.
    early: early::EarlySends,
}

impl<'a> Run<'a> {
    /// A new run, with what earlier runs remembered.
    fn open(
        options: &BuildOptions,
        cleanup: &'a Cleanup,
        builders: &Builders,
        reporter: &'a dyn Reporter,
    ) -> Run<'a> {
        Run {
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            cleanup,
            cache: PushCache::open(),
            builds: BuildMemory::open(),
            trust_inputs: !options.rebuild,
            registry: options.registry.clone(),
            replays: build_inputs::Replays::new(FileHashes::open(
                crate::base::cache_dir().map(|d| d.join("file-hashes.json")),
            )),
            bases: build_inputs::RemoteBases::new(&options.registry),
            reporter,
            fallbacks: builders.fallbacks.clone(),
            early: early::EarlySends::new(LayerDigests::open()),
        }
    }

    /// Remembers what the run read and pushed, for the next run.
    fn save(&self) {
        self.cache.save();
        self.builds.save();
        self.replays.hashes().save();
        self.early.save();
    }

    /// Whether `engine`, which reaches registries with its own settings (loopback as
    /// insecure, /etc/docker/certs.d), can push `image` where polyarch would: a loopback
    /// registry when the engine runs on this machine; elsewhere only when no
    /// `--insecure-registry` or CA of polyarch's own is needed for it.
    fn engine_reaches(&self, image: &ImageSpec, engine: &impl Builder) -> bool {
        let Ok(reference) = registry::parse_reference(&image.repository) else {
            return false;
        };
        let host = reference.registry();
        if registry::is_loopback(host) {
            // A loopback registry is this machine's: an engine on another host has its own
            // loopback, so polyarch exports from it and pushes.
            return engine.is_local();
        }
        self.registry.ca_certs.is_empty() && !self.registry.insecure.iter().any(|h| h == host)
    }
}

#[cfg(test)]
mod tests;

//! The build command end to end: plan → build → export → push → publish → verify → record.
//! Tags move only after every platform manifest of an image is in the registry.

use crate::binfmt::{Emulation, EmulationStatus};
use crate::build::{self, BuiltImage};
use crate::cache::{BuildMemory, CachedManifest, EmulationMemory, PushCache};
use crate::dockerfile;
use crate::engine::{Builders, Engine};
use crate::export;
use crate::inputs::{self, RememberedBuild};
use crate::layout::{LayoutSource, OciLayout};
use crate::oci::{self, ConfigPlatform, IndexEntry, ManifestBlob};
use crate::plan::{self, Unit};
use crate::progress::{Event, Phase, Reporter};
use crate::project::{BinfmtMode, ImageSpec, Project};
use crate::record::{
    BuildInfo, CoverageRecord, ImageCoverage, PartImage, PartPlatform, PartRecord,
};
use crate::registry::{self, BlobProgress, Registry, RegistryOptions};
use crate::verify::{self, RegistrySource, Target};
use crate::{Error, Platform, Result};
use oci_client::Reference;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Images to build (all when empty).
    pub images: Vec<String>,
    /// Restrict to these platforms.
    pub platforms: Vec<Platform>,
    pub registry: RegistryOptions,
    /// Bounded concurrency for platform builds and blob uploads.
    pub jobs: usize,
    /// Write an OCI image layout directory instead of pushing (`--output oci:DIR`).
    pub layout: Option<std::path::PathBuf>,
    /// `--binfmt`: overrides the project's and every image's mode.
    pub binfmt: Option<BinfmtMode>,
    /// `--binfmt-image`: overrides the project's installer image.
    pub binfmt_image: Option<String>,
    /// `--rebuild`: ask the engine to build even when the inputs match an earlier run's.
    pub rebuild: bool,
    /// Cancelled on SIGINT: builds and uploads stop, but a publish that has begun completes,
    /// so tags never end up pointing at different indexes.
    pub interrupt: tokio_util::sync::CancellationToken,
}

/// Where built images go: a registry, or an OCI layout directory for air-gapped handoff.
enum Destination {
    Registry(Registry),
    Layout(OciLayout),
}

impl Destination {
    async fn put_layer(
        &self,
        reference: &Reference,
        layer: &export::ExportedLayer,
        progress: &BlobProgress<'_>,
    ) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_blob_file(reference, &layer.path, &layer.digest, layer.size, progress)
                    .await?;
            }
            Destination::Layout(l) => {
                l.put_blob_file(&layer.path, &layer.digest)?;
            }
        }
        Ok(())
    }

    async fn put_config(&self, reference: &Reference, image: &export::ExportedImage) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_blob_bytes(reference, &image.config, &image.config_digest)
                    .await?;
            }
            Destination::Layout(l) => {
                l.put_blob_bytes(&image.config, &image.config_digest)?;
            }
        }
        Ok(())
    }

    /// A manifest an earlier run pushed for this very image ID, when the registry still has it.
    async fn already_pushed(
        &self,
        cache: &PushCache,
        image: &ImageSpec,
        image_id: &str,
    ) -> Option<CachedManifest> {
        let Destination::Registry(r) = self else {
            return None;
        };
        let cached = cache.get(&image.repository, &pushed_key(image, image_id))?;
        let reference = first_tag(image)
            .ok()?
            .clone_with_digest(cached.digest.clone());
        r.get_manifest(&reference).await.ok().map(|_| cached)
    }

    /// What a tag resolves to now (None when it does not exist yet).
    async fn current(&self, image: &ImageSpec, tag: &str) -> Option<String> {
        match self {
            Destination::Registry(r) => {
                let reference = repository_reference(&image.repository, tag).ok()?;
                r.get_manifest(&reference)
                    .await
                    .ok()
                    .map(|(_, digest)| digest)
            }
            Destination::Layout(_) => None,
        }
    }

    /// Stores a manifest under its digest only (no tag moves).
    async fn put_manifest(&self, reference: &Reference, manifest: &ManifestBlob) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_manifest(
                    &reference.clone_with_digest(manifest.digest.clone()),
                    manifest,
                )
                .await
            }
            Destination::Layout(l) => l
                .put_blob_bytes(&manifest.bytes, &manifest.digest)
                .map(|_| ()),
        }
    }

    async fn tag(&self, image: &ImageSpec, tag: &str, index: &ManifestBlob) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_manifest(&repository_reference(&image.repository, tag)?, index)
                    .await
            }
            Destination::Layout(l) => l.tag(index, tag),
        }
    }

    async fn verify(
        &self,
        image: &ImageSpec,
        expected: &str,
        reporter: &dyn Reporter,
    ) -> Result<ImageCoverage> {
        match self {
            Destination::Registry(r) => {
                verify_image(r, image, Some(expected), false, reporter).await
            }
            Destination::Layout(l) => {
                let target = Target {
                    name: image.name.clone(),
                    reference: format!("oci:{}:{}", l.dir.display(), image.tags[0]),
                    tags: image.tags.clone(),
                    declared: image.platforms.clone(),
                    deep: false,
                };
                let mut coverage = Vec::new();
                for tag in &image.tags {
                    let source = LayoutSource {
                        layout: OciLayout { dir: l.dir.clone() },
                        tag: Some(tag.clone()),
                    };
                    coverage.push(verify::verify(&source, &target, reporter).await?);
                }
                let mut first = coverage.remove(0);
                for other in coverage.iter().chain(std::iter::once(&first.clone())) {
                    if other.digest != expected {
                        first.covered = false;
                        first.warnings.push(format!(
                            "a tag in {} resolves to {}, not {expected}",
                            l.dir.display(),
                            other.digest
                        ));
                    }
                }
                Ok(first)
            }
        }
    }
}

/// What a run created in the engines, so an interrupted or failed run can remove it.
#[derive(Default, Clone)]
pub struct Cleanup {
    images: Arc<Mutex<Vec<Temporary>>>,
}

/// A temporary image a build writes.
#[derive(Clone)]
struct Temporary {
    engine: Engine,
    tag: String,
    /// Whether the engine may still write the tag after its build was cut off: always for
    /// the classic builder, which runs on without its client; for BuildKit only once its
    /// exporter has started, since cutting the session cancels the solve before that.
    may_appear: Arc<AtomicBool>,
}

impl Cleanup {
    /// Records `tag`; the flag returned is [`Temporary::may_appear`], for the build to set.
    fn add(&self, engine: &Engine, tag: &str) -> Arc<AtomicBool> {
        let may_appear = Arc::new(AtomicBool::new(!engine.buildkit));
        self.images.lock().expect("cleanup lock").push(Temporary {
            engine: engine.clone(),
            tag: tag.to_string(),
            may_appear: may_appear.clone(),
        });
        may_appear
    }

    /// Removes `tag`; true once it is gone. A tag not there yet (a build cut off may still
    /// write it) or one the engine would not remove (still in use) stays recorded.
    async fn remove(&self, engine: &Engine, tag: &str) -> bool {
        let removed = engine
            .docker
            .remove_image(
                tag,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .is_ok();
        if removed {
            self.images
                .lock()
                .expect("cleanup lock")
                .retain(|t| !(t.tag == tag && t.engine.endpoint == engine.endpoint));
        }
        removed
    }

    /// Removes every temporary image still recorded; safe to call more than once.
    ///
    /// A build whose client went away (an interrupted run) can still finish in the engine
    /// and tag its image after the first attempt: what is left is retried every 100 ms
    /// for up to `grace`, which the reporter is told about.
    pub async fn run(&self, grace: std::time::Duration, reporter: &dyn Reporter) {
        let deadline = tokio::time::Instant::now() + grace;
        let mut images: Vec<Temporary> = self.images.lock().expect("cleanup lock").clone();
        let mut first = true;
        loop {
            let mut left = Vec::new();
            for image in images {
                if !self.remove(&image.engine, &image.tag).await
                    && image.may_appear.load(Ordering::SeqCst)
                {
                    left.push(image);
                }
            }
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                return;
            }
            if first {
                first = false;
                reporter.report(Event::Note {
                    message: format!(
                        "waiting up to {}s for {} cut-off build(s) to end in the engine, to remove their temporary images; interrupt again to exit now",
                        grace.as_secs(),
                        left.len()
                    ),
                });
            }
            images = left;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// One platform's pushed manifest plus how it was built.
struct Pushed {
    image: String,
    platform: Platform,
    entry: IndexEntry,
    build: BuildInfo,
}

/// Builds and pushes every unit by digest; nothing is tagged yet. SIGINT stops it here,
/// before any tag moves.
async fn build_units<'a>(
    project: &'a Project,
    engine: &Engine,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<(plan::Plan<'a>, Destination, Vec<Pushed>)> {
    tokio::select! {
        built = build_and_push_all(project, engine, options, cleanup, reporter) => built,
        _ = options.interrupt.cancelled() => Err(Error::Interrupted),
    }
}

async fn build_and_push_all<'a>(
    project: &'a Project,
    engine: &Engine,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<(plan::Plan<'a>, Destination, Vec<Pushed>)> {
    let plan = plan::plan(project, &options.images, &options.platforms, &engine.native)?;
    let destination = match &options.layout {
        Some(dir) => {
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
            Destination::Layout(OciLayout::create(dir)?)
        }
        None => {
            Destination::Registry(connect_registry(&plan.images, &options.registry, true).await?)
        }
    };
    let needed: Vec<Platform> = plan.units.iter().map(|u| u.platform.clone()).collect();
    let builders = Builders::connect(engine.clone(), &project.builders, &needed).await?;
    let emulation = EmulationPlan::prepare(project, &plan, options, &builders, reporter).await?;

    let run = Run {
        id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
        cleanup,
        cache: PushCache::open(),
        builds: BuildMemory::open(),
        trust_inputs: !options.rebuild,
        registry: options.registry.clone(),
        replays: Default::default(),
        bases: inputs::RemoteBases::new(&options.registry),
        reporter,
    };
    let run = &run;
    // `--jobs` bounds the solves running at once: a platform's own, or one for several
    // platforms of an image.
    let jobs = tokio::sync::Semaphore::new(options.jobs.max(1));
    let (jobs, destination_ref, emulation, builders) = (&jobs, &destination, &emulation, &builders);
    let mut images: Vec<Vec<&Unit<'_>>> = Vec::new();
    for unit in &plan.units {
        match images
            .iter_mut()
            .find(|units| units[0].image.name == unit.image.name)
        {
            Some(units) => units.push(unit),
            None => images.push(vec![unit]),
        }
    }
    let pushed: Result<Vec<Pushed>> =
        futures_util::future::try_join_all(images.into_iter().map(|units| async move {
            let together = match destination_ref {
                Destination::Registry(registry) => {
                    solved_together(&units, builders, run).map(|engine| (engine, registry))
                }
                Destination::Layout(_) => None,
            };
            if let Some((engine, registry)) = together {
                return build_and_push_image(
                    engine,
                    destination_ref,
                    registry,
                    &units,
                    emulation,
                    jobs,
                    run,
                )
                .await;
            }
            futures_util::future::try_join_all(units.iter().map(|unit| async move {
                let engine = builders.for_platform(&unit.platform);
                let _job = jobs.acquire().await.map_err(|_| Error::Interrupted)?;
                let emulated = emulation.is_emulated(unit);
                match build_and_push(engine, destination_ref, unit, emulated, run).await {
                    Err(Error::Emulation(_)) if emulation.was_remembered(unit) => {
                        let emulated = emulation.recheck(engine, unit, reporter).await?;
                        build_and_push(engine, destination_ref, unit, emulated, run).await
                    }
                    outcome => outcome,
                }
            }))
            .await
        }))
        .await
        .map(|per_image| per_image.into_iter().flatten().collect());
    // What did get pushed is remembered even when another unit failed.
    run.cache.save();
    run.builds.save();
    Ok((plan, destination, pushed?))
}

/// `build`: builds, pushes, publishes every tag as one index per image, reads it back.
pub async fn build(
    project: &Project,
    engine: &Engine,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let (plan, destination, pushed) =
        build_units(project, engine, options, cleanup, reporter).await?;
    let mut coverage = Vec::new();
    for image in &plan.images {
        let mine: Vec<&Pushed> = pushed.iter().filter(|p| p.image == image.name).collect();
        coverage.push(publish(&destination, image, &mine, &options.interrupt, reporter).await?);
    }
    Ok(CoverageRecord::new(coverage))
}

/// `build --push-by-digest`: pushes this runner's platforms by digest and records them
/// as a part for `assemble`; no tag moves.
pub async fn build_part(
    project: &Project,
    engine: &Engine,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<PartRecord> {
    if options.layout.is_some() {
        return Err(Error::Usage(
            "--push-by-digest pushes to the registry; drop --output".into(),
        ));
    }
    let (plan, _, pushed) = build_units(project, engine, options, cleanup, reporter).await?;
    let images = plan
        .images
        .iter()
        .map(|image| PartImage {
            name: image.name.clone(),
            repository: image.repository.clone(),
            platforms: pushed
                .iter()
                .filter(|p| p.image == image.name)
                .map(|p| PartPlatform {
                    platform: p.platform.clone(),
                    digest: p.entry.digest.clone(),
                    size: p.entry.size,
                    build: p.build.clone(),
                })
                .collect(),
        })
        .collect();
    Ok(PartRecord::new(images))
}

/// `assemble`: checks every part is in the registry and covers the declared platforms
/// exactly once, then publishes each image's index to its tags and reads it back.
/// Nothing is published when any part is missing, doubled or wrong.
pub async fn assemble(
    project: &Project,
    parts: &[(std::path::PathBuf, PartRecord)],
    selected: &[String],
    options: &RegistryOptions,
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let named: Vec<String> = if selected.is_empty() {
        project
            .images
            .iter()
            .filter(|i| {
                parts
                    .iter()
                    .any(|(_, p)| p.images.iter().any(|pi| pi.name == i.name))
            })
            .map(|i| i.name.clone())
            .collect()
    } else {
        selected.to_vec()
    };
    if named.is_empty() {
        return Err(Error::Usage(format!(
            "the part files name no image of {}",
            project.file.display()
        )));
    }
    let plan = plan::plan(project, &named, &[], &Platform::linux("amd64", None))?;
    let registry = connect_registry(&plan.images, options, true).await?;
    let part_names = |files: &[&std::path::PathBuf]| {
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut ready = Vec::new();
    for image in &plan.images {
        let mut found: Vec<(&std::path::PathBuf, &PartPlatform)> = Vec::new();
        for (file, part) in parts {
            for part_image in part.images.iter().filter(|pi| pi.name == image.name) {
                if part_image.repository != image.repository {
                    return Err(Error::Usage(format!(
                        "{}: image {} was pushed to {}, but {} declares {}; rebuild the part",
                        file.display(),
                        image.name,
                        part_image.repository,
                        project.file.display(),
                        image.repository
                    )));
                }
                found.extend(part_image.platforms.iter().map(|p| (file, p)));
            }
        }
        let all_files: Vec<&std::path::PathBuf> = parts.iter().map(|(f, _)| f).collect();
        for (file, platform) in &found {
            if !image.platforms.contains(&platform.platform) {
                return Err(Error::Usage(format!(
                    "{}: {} {} is not declared in {}; remove the part or declare the platform",
                    file.display(),
                    image.name,
                    platform.platform,
                    project.file.display()
                )));
            }
        }
        let mut pushed = Vec::new();
        for declared in &image.platforms {
            let holders: Vec<&(&std::path::PathBuf, &PartPlatform)> = found
                .iter()
                .filter(|(_, p)| &p.platform == declared)
                .collect();
            match holders.as_slice() {
                [] => {
                    return Err(Error::Usage(format!(
                        "{} {declared} has no part among {}; build it with `polyarch build --platform {declared} --push-by-digest --record FILE`",
                        image.name,
                        part_names(&all_files)
                    )))
                }
                [(_, part)] => pushed.push(check_part(&registry, image, part).await?),
                several => {
                    let files: Vec<&std::path::PathBuf> = several.iter().map(|(f, _)| *f).collect();
                    return Err(Error::Usage(format!(
                        "{} {declared} is in more than one part ({}); keep one",
                        image.name,
                        part_names(&files)
                    )));
                }
            }
        }
        ready.push((image, pushed));
    }
    let destination = Destination::Registry(registry);
    let mut coverage = Vec::new();
    for (image, pushed) in &ready {
        let refs: Vec<&Pushed> = pushed.iter().collect();
        coverage.push(publish(&destination, image, &refs, interrupt, reporter).await?);
    }
    Ok(CoverageRecord::new(coverage))
}

/// Reads a part's manifest and config back from the registry (digest-checked) and takes
/// the index entry's platform from the config, as a fresh build would.
async fn check_part(registry: &Registry, image: &ImageSpec, part: &PartPlatform) -> Result<Pushed> {
    let reference = first_tag(image)?.clone_with_digest(part.digest.clone());
    let (bytes, _) = registry.get_manifest(&reference).await?;
    let not_image = |message: String| Error::Registry {
        registry: reference.registry().to_string(),
        message,
    };
    let manifest = match oci::parse_manifest(&bytes).map_err(&not_image)? {
        oci::Parsed::Image { manifest, .. } => manifest,
        _ => {
            return Err(not_image(format!(
                "part {reference} is not an image manifest"
            )))
        }
    };
    let config = registry
        .get_json_blob(&reference, manifest.config().digest().as_ref())
        .await?;
    let config_platform = ConfigPlatform::from_config(&config).map_err(&not_image)?;
    if config_platform.normalized() != part.platform {
        return Err(not_image(format!(
            "part {reference} claims {} but its config says {}",
            part.platform,
            config_platform.normalized()
        )));
    }
    Ok(Pushed {
        image: image.name.clone(),
        platform: part.platform.clone(),
        entry: IndexEntry {
            digest: part.digest.clone(),
            size: bytes.len() as u64,
            platform: config_platform,
        },
        build: part.build.clone(),
    })
}

/// Publishes one image: the index by digest, then every tag, then reads it back.
async fn publish(
    destination: &Destination,
    image: &ImageSpec,
    pushed: &[&Pushed],
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage> {
    let mut mine = pushed.to_vec();
    // Index order follows the project file, not build completion order.
    mine.sort_by_key(|p| image.platforms.iter().position(|d| d == &p.platform));
    let entries: Vec<IndexEntry> = mine.iter().map(|p| p.entry.clone()).collect();
    let index =
        oci::image_index(&entries, &image.annotations.index).map_err(|m| Error::Registry {
            registry: image.repository.clone(),
            message: m,
        })?;
    reporter.report(Event::Phase {
        image: image.name.clone(),
        platform: None,
        phase: Phase::Publish,
        message: format!("publishing {} as {}", index.digest, image.tags.join(", ")),
    });
    let first = first_tag(image)?;
    let mut moved = Vec::new();
    for tag in &image.tags {
        if destination.current(image, tag).await.as_deref() != Some(index.digest.as_str()) {
            moved.push(tag);
        }
    }
    if moved.is_empty() {
        reporter.report(Event::Note {
            message: format!(
                "{}: every tag already points at {}; nothing to publish",
                image.name, index.digest
            ),
        });
    } else {
        destination.put_manifest(&first, &index).await?;
        // Last point to stop: once the first tag moves, the others follow, so the tags
        // never point at different indexes.
        if interrupt.is_cancelled() {
            return Err(Error::Interrupted);
        }
        for tag in moved {
            destination.tag(image, tag, &index).await?;
        }
    }
    let mut checked = destination.verify(image, &index.digest, reporter).await?;
    for platform in &mut checked.platforms {
        platform.build = mine
            .iter()
            .find(|p| p.platform == platform.platform)
            .map(|p| p.build.clone());
    }
    Ok(checked)
}

/// One client for the images' registries, probed first so bad credentials or an
/// unreachable registry fail before any build.
async fn connect_registry(
    images: &[&ImageSpec],
    options: &RegistryOptions,
    push: bool,
) -> Result<Registry> {
    let registry = Registry::new(&registry_hosts(images)?, options)?;
    for image in images {
        registry.declare(&first_tag(image)?, push).await;
    }
    for image in images {
        registry.probe(&first_tag(image)?, push).await?;
    }
    Ok(registry)
}

/// The binfmt mode in force for an image: CLI, then the image's own, then the project's.
fn binfmt_mode(project: &Project, image: &ImageSpec, options: &BuildOptions) -> BinfmtMode {
    options.binfmt.or(image.binfmt).unwrap_or(project.binfmt)
}

/// Whether an image's Dockerfile RUNs anything in stages built for the target platform.
pub fn image_needs_emulation(image: &ImageSpec) -> Result<bool> {
    let path = image.context.join(&image.dockerfile);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    Ok(dockerfile::needs_emulation(&text, image.target.as_deref()))
}

/// The run's emulation: which image × platform builds run under QEMU, and which of those
/// verdicts an earlier run found (they are trusted without a probe and checked again when
/// the build meets `exec format error`).
struct EmulationPlan<'a> {
    project: &'a Project,
    options: &'a BuildOptions,
    memory: EmulationMemory,
    emulated: HashSet<(String, Platform)>,
    remembered: HashSet<(String, Platform)>,
    /// Serialises re-checks, so two builds never register the same emulator at once.
    recheck: tokio::sync::Mutex<()>,
}

impl<'a> EmulationPlan<'a> {
    /// Before any build: makes every foreign platform whose build RUNs something runnable
    /// on its engine (or fails, per the binfmt mode).
    async fn prepare(
        project: &'a Project,
        plan: &plan::Plan<'_>,
        options: &'a BuildOptions,
        builders: &Builders,
        reporter: &dyn Reporter,
    ) -> Result<EmulationPlan<'a>> {
        let mut state = EmulationPlan {
            project,
            options,
            memory: EmulationMemory::open(),
            emulated: HashSet::new(),
            remembered: HashSet::new(),
            recheck: tokio::sync::Mutex::new(()),
        };
        // One per engine, so images sharing a platform share its probe.
        let mut emulations: HashMap<String, Emulation> = HashMap::new();
        let prepared = state
            .prepare_images(plan, builders, &mut emulations, reporter)
            .await;
        // Probe images are per run; registrations stay, as binfmt --install's do.
        for emulation in emulations.values() {
            let _ = emulation.cleanup().await;
        }
        state.memory.save();
        prepared.map(|()| state)
    }

    fn installer(&self) -> Option<&str> {
        self.options
            .binfmt_image
            .as_deref()
            .or(self.project.binfmt_image.as_deref())
    }

    async fn prepare_images(
        &mut self,
        plan: &plan::Plan<'_>,
        builders: &Builders,
        emulations: &mut HashMap<String, Emulation>,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        for image in &plan.images {
            let mut foreign: Vec<(&Engine, Platform)> = Vec::new();
            for unit in plan.units.iter().filter(|u| u.image.name == image.name) {
                let engine = builders.for_platform(&unit.platform);
                if unit.platform.os_arch() == engine.native.os_arch() {
                    continue;
                }
                if builders.by_platform.contains_key(&unit.platform) {
                    reporter.report(Event::Warning {
                        message: format!(
                            "builder {} for {} is a {} engine",
                            engine.endpoint, unit.platform, engine.native
                        ),
                    });
                }
                foreign.push((engine, unit.platform.clone()));
            }
            if foreign.is_empty() {
                continue;
            }
            if !image_needs_emulation(image)? {
                reporter.report(Event::Note {
                    message: format!(
                        "{}: no RUN step executes for the target platform, so {} builds need no emulation",
                        image.name,
                        foreign.iter().map(|(_, p)| p.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                });
                continue;
            }
            let mode = binfmt_mode(self.project, image, self.options);
            for (engine, platform) in foreign {
                // `never` decides from the platforms alone; the others may trust a verdict.
                let remembered = (mode != BinfmtMode::Never)
                    .then(|| self.memory.runs(&engine.identity, &platform))
                    .flatten();
                let status = match remembered {
                    Some(emulated) => {
                        self.remembered
                            .insert((image.name.clone(), platform.clone()));
                        if emulated {
                            EmulationStatus::Emulated {
                                registered_now: false,
                            }
                        } else {
                            EmulationStatus::Native
                        }
                    }
                    None => {
                        let emulation = emulations
                            .entry(engine.endpoint.clone())
                            .or_insert_with(|| Emulation::new(engine.clone()));
                        self.ensure(emulation, &platform, mode, reporter).await?
                    }
                };
                self.mark(&image.name, &platform, status);
            }
        }
        Ok(())
    }

    /// Probes (and, per `mode`, registers) one platform, and remembers what it found.
    async fn ensure(
        &self,
        emulation: &Emulation,
        platform: &Platform,
        mode: BinfmtMode,
        reporter: &dyn Reporter,
    ) -> Result<EmulationStatus> {
        let ensured = emulation
            .ensure(
                std::slice::from_ref(platform),
                mode,
                self.installer(),
                reporter,
            )
            .await?;
        let status = ensured
            .into_iter()
            .map(|(_, status)| status)
            .next()
            .unwrap_or(EmulationStatus::Native);
        self.memory.remember(
            &emulation.engine().identity,
            platform,
            matches!(status, EmulationStatus::Emulated { .. }),
        );
        Ok(status)
    }

    /// Keeps an emulated verdict; the slowness warning waits for a build that really runs
    /// (a reused one runs nothing).
    fn mark(&mut self, image: &str, platform: &Platform, status: EmulationStatus) {
        if matches!(status, EmulationStatus::Emulated { .. }) {
            self.emulated.insert((image.to_string(), platform.clone()));
        }
    }

    fn is_emulated(&self, unit: &Unit<'_>) -> bool {
        self.emulated
            .contains(&(unit.image.name.clone(), unit.platform.clone()))
    }

    fn was_remembered(&self, unit: &Unit<'_>) -> bool {
        self.remembered
            .contains(&(unit.image.name.clone(), unit.platform.clone()))
    }

    /// After a build trusted a remembered verdict and met `exec format error`: forgets it,
    /// probes (and registers, per the mode) again, and says whether the rebuild is emulated.
    async fn recheck(
        &self,
        engine: &Engine,
        unit: &Unit<'_>,
        reporter: &dyn Reporter,
    ) -> Result<bool> {
        let _serial = self.recheck.lock().await;
        reporter.report(Event::Note {
            message: format!(
                "{} {}: the emulator an earlier run found on {} is gone; probing again",
                unit.image.name, unit.platform, engine.endpoint
            ),
        });
        self.memory.forget(&engine.identity, &unit.platform);
        let emulation = Emulation::new(engine.clone());
        let mode = binfmt_mode(self.project, unit.image, self.options);
        let status = self
            .ensure(&emulation, &unit.platform, mode, reporter)
            .await;
        let _ = emulation.cleanup().await;
        self.memory.save();
        Ok(matches!(status?, EmulationStatus::Emulated { .. }))
    }
}

/// Reads an image's first tag back and checks it against the declared platforms; every
/// other tag must resolve to the same digest (and to `expected`, the index just pushed).
pub async fn verify_image(
    registry: &Registry,
    image: &ImageSpec,
    expected: Option<&str>,
    deep: bool,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage> {
    let first = first_tag(image)?;
    let target = Target {
        name: image.name.clone(),
        reference: format!("{}:{}", image.repository, image.tags[0]),
        tags: image.tags.clone(),
        declared: image.platforms.clone(),
        deep,
    };
    let source = RegistrySource {
        registry,
        reference: first,
    };
    let mut coverage = verify::verify(&source, &target, reporter).await?;
    let missing = missing_annotations(image, &coverage);
    coverage.warnings.extend(missing);
    let wanted = expected.unwrap_or(&coverage.digest).to_string();
    for (n, tag) in image.tags.iter().enumerate() {
        // The first tag is the one just read back.
        let digest = if n == 0 {
            coverage.digest.clone()
        } else {
            registry
                .get_manifest(&repository_reference(&image.repository, tag)?)
                .await?
                .1
        };
        if digest != wanted {
            coverage.covered = false;
            let why = if expected.is_some() {
                "not the index just pushed; another push raced this one"
            } else {
                "so the tags disagree; re-publish them together"
            };
            coverage.warnings.push(format!(
                "tag {tag} resolves to {digest}, {wanted} expected: {why}"
            ));
        }
    }
    Ok(coverage)
}

/// The annotations the project gives an image that its index or a platform manifest in
/// the registry does not carry (with the value it does carry, if another).
fn missing_annotations(image: &ImageSpec, coverage: &ImageCoverage) -> Vec<String> {
    let differs =
        |place: &str, wanted: &BTreeMap<String, String>, found: &BTreeMap<String, String>| {
            wanted
                .iter()
                .filter(|(key, value)| found.get(*key) != Some(value))
                .map(|(key, value)| match found.get(key) {
                    Some(other) => format!("{place} annotation {key} is `{other}`, not `{value}`"),
                    None => format!("{place} has no annotation {key} (`{value}` expected)"),
                })
                .collect::<Vec<_>>()
        };
    let mut out = differs("the index", &image.annotations.index, &coverage.annotations);
    for platform in coverage.platforms.iter().filter(|p| p.digest.is_some()) {
        out.extend(differs(
            &format!("the {} manifest", platform.platform),
            &image.annotations.manifest,
            &platform.annotations,
        ));
    }
    out
}

fn registry_hosts(images: &[&ImageSpec]) -> Result<Vec<String>> {
    images
        .iter()
        .map(|i| first_tag(i).map(|r| r.registry().to_string()))
        .collect()
}

/// The reference of an image's first tag, which polyarch reads back and pushes blobs under.
pub fn first_tag(image: &ImageSpec) -> Result<Reference> {
    repository_reference(&image.repository, &image.tags[0])
}

pub fn repository_reference(repository: &str, tag: &str) -> Result<Reference> {
    registry::parse_reference(&format!("{repository}:{tag}"))
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
    replays: inputs::Replays,
    bases: inputs::RemoteBases,
    reporter: &'a dyn Reporter,
}

impl Run<'_> {
    /// Whether the engine, which reaches registries with its own settings (loopback as
    /// insecure, /etc/docker/certs.d), can push `image` where polyarch would: always for a
    /// loopback registry; elsewhere only when no `--insecure-registry` or CA of polyarch's
    /// own is needed for it.
    fn engine_reaches(&self, image: &ImageSpec) -> bool {
        let Ok(reference) = registry::parse_reference(&image.repository) else {
            return false;
        };
        let host = reference.registry();
        registry::is_loopback(host)
            || (self.registry.ca_certs.is_empty()
                && !self.registry.insecure.iter().any(|h| h == host))
    }
}

/// An engine that cannot build for a platform may quietly build for its own.
fn check_platform(image: &ImageSpec, unit: &Unit<'_>, built: &ConfigPlatform) -> Result<()> {
    if built.normalized() == unit.platform {
        return Ok(());
    }
    Err(Error::Build {
        image: image.name.clone(),
        platform: unit.platform.to_string(),
        message: format!(
            "the engine built an image for {} instead; it cannot build for {} (upgrade the engine or use a native builder)",
            built.normalized(),
            unit.platform
        ),
    })
}

/// What a pushed manifest is remembered under: the image's ID (or the manifest's digest
/// when the engine pushed it) and the annotations polyarch writes into the manifest, since
/// the same image with other annotations is another manifest.
fn pushed_key(image: &ImageSpec, id: &str) -> String {
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

/// Whether a unit needs building: its earlier push when its inputs are unchanged, else
/// the key its build's inputs are remembered under.
enum Reuse {
    Pushed(Box<Pushed>),
    Build { settings: Option<String> },
}

async fn reuse(
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
        if let Some(cached) = destination
            .already_pushed(&run.cache, image, &image_id)
            .await
        {
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
                },
            ))));
        }
    }
    Ok(Reuse::Build { settings })
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
async fn remember_reads(
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

/// The engine that builds all of an image's platforms in one solve pushing them by digest
/// itself, when one can: one builder for them all, on containerd's image store, reaching the
/// registry, and no per-platform registry cache (which needs a solve per platform).
fn solved_together<'e>(
    units: &[&Unit<'_>],
    builders: &'e Builders,
    run: &Run<'_>,
) -> Option<&'e Engine> {
    let image = units.first()?.image;
    let engine = builders.for_platform(&units[0].platform);
    let one_engine = units
        .iter()
        .all(|u| builders.for_platform(&u.platform).endpoint == engine.endpoint);
    (units.len() > 1
        && one_engine
        && engine.buildkit
        && engine.containerd_store
        && run.engine_reaches(image)
        && image.cache_from.is_empty()
        && image.cache_to.is_none())
    .then_some(engine)
}

/// An image's platforms built in one solve (see [`solved_together`]): the ones whose
/// inputs are unchanged are reused, the rest built together, their manifests read from the
/// index the engine pushed by digest. The index itself is never tagged: polyarch
/// publishes its own of exactly the platform manifests.
async fn build_and_push_image(
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
        let digest = entry.digest().to_string();
        if let Some(key) = settings {
            remember_reads(run, image, key, &digest, &built.transfers).await;
        }
        run.cache.put(
            &image.repository,
            &pushed_key(image, &digest),
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
            },
        });
    }
    Ok(pushed)
}

async fn build_and_push(
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

async fn build_unit(
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
            if engine.buildkit && engine.containerd_store && run.engine_reaches(image) =>
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

    if let Some(cached) = destination.already_pushed(cache, image, &built.id).await {
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

/// `verify -f polyarch.yaml [IMAGE …]`: each selected image's tags against its platforms.
pub async fn verify_project(
    project: &Project,
    selected: &[String],
    options: &RegistryOptions,
    deep: bool,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    // The plan validates the image names; verification needs no engine.
    let plan = plan::plan(project, selected, &[], &Platform::linux("amd64", None))?;
    let registry = connect_registry(&plan.images, options, false).await?;
    let mut coverage = Vec::new();
    for image in &plan.images {
        coverage.push(verify_image(&registry, image, None, deep, reporter).await?);
    }
    Ok(CoverageRecord::new(coverage))
}

/// `verify REF --platform …`: a tag or digest someone else may have pushed.
pub async fn verify_reference(
    reference: &str,
    declared: &[Platform],
    options: &RegistryOptions,
    deep: bool,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    if let Some((dir, tag)) = crate::layout::parse_layout_reference(reference) {
        let target = Target {
            name: dir
                .file_name()
                .map_or("image".into(), |n| n.to_string_lossy().into_owned()),
            reference: reference.to_string(),
            tags: tag.iter().cloned().collect(),
            declared: declared.to_vec(),
            deep,
        };
        let source = LayoutSource {
            layout: OciLayout::open(&dir)?,
            tag,
        };
        return Ok(CoverageRecord::new(vec![
            verify::verify(&source, &target, reporter).await?,
        ]));
    }
    let parsed = registry::parse_reference(reference)?;
    let registry = Registry::new(&[parsed.registry().to_string()], options)?;
    let name = parsed
        .repository()
        .rsplit('/')
        .next()
        .unwrap_or(parsed.repository())
        .to_string();
    let target = Target {
        name,
        reference: reference.to_string(),
        tags: if parsed.digest().is_none() {
            parsed.tag().map(str::to_string).into_iter().collect()
        } else {
            Vec::new()
        },
        declared: declared.to_vec(),
        deep,
    };
    let source = RegistrySource {
        registry: &registry,
        reference: parsed,
    };
    Ok(CoverageRecord::new(vec![
        verify::verify(&source, &target, reporter).await?,
    ]))
}

//! The build command end to end: plan → build → export → push → publish → verify → record.
//! Tags move only after every platform manifest of an image is in the registry.

use crate::binfmt::{Emulation, EmulationStatus};
use crate::build::{self, BuiltImage};
use crate::dockerfile;
use crate::engine::Engine;
use crate::export;
use crate::layout::{LayoutSource, OciLayout};
use crate::oci::{self, ConfigPlatform, IndexEntry, ManifestBlob};
use crate::plan::{self, Unit};
use crate::progress::{Event, Phase, Reporter};
use crate::project::{BinfmtMode, ImageSpec, Project};
use crate::record::{BuildInfo, CoverageRecord, ImageCoverage};
use crate::registry::{self, BlobProgress, Registry, RegistryOptions};
use crate::verify::{self, RegistrySource, Target};
use crate::{Error, Platform, Result};
use futures_util::{StreamExt, TryStreamExt};
use oci_client::Reference;
use std::collections::HashSet;
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

/// What a run created in the engine, so an interrupted or failed run can remove it.
#[derive(Default, Clone)]
pub struct Cleanup {
    tags: Arc<Mutex<Vec<String>>>,
}

impl Cleanup {
    fn add(&self, tag: &str) {
        self.tags
            .lock()
            .expect("cleanup lock")
            .push(tag.to_string());
    }

    /// Removes `tag`; false when the engine had no such image.
    async fn remove(&self, engine: &Engine, tag: &str) -> bool {
        let removed = engine
            .docker
            .remove_image(
                tag,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
        self.tags.lock().expect("cleanup lock").retain(|t| t != tag);
        !matches!(
            removed,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        )
    }

    /// Removes every temporary image still recorded; safe to call more than once.
    ///
    /// A build whose client went away (an interrupted run) can still finish in the engine
    /// and tag its image after the first attempt: tags not found are retried every 100 ms
    /// for up to `grace`.
    pub async fn run(&self, engine: &Engine, grace: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        let mut tags: Vec<String> = self.tags.lock().expect("cleanup lock").clone();
        loop {
            let mut missing = Vec::new();
            for tag in tags {
                if !self.remove(engine, &tag).await {
                    missing.push(tag);
                }
            }
            if missing.is_empty() || tokio::time::Instant::now() >= deadline {
                return;
            }
            tags = missing;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// One platform's pushed manifest plus how it was built.
struct Pushed {
    platform: Platform,
    entry: IndexEntry,
    build: BuildInfo,
}

pub async fn build(
    project: &Project,
    engine: &Engine,
    options: &BuildOptions,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
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
            let registry = Registry::new(&registry_hosts(&plan.images)?, &options.registry)?;
            // Fail on credentials or reachability before spending minutes building.
            for image in &plan.images {
                registry
                    .probe(
                        &repository_reference(&image.repository, &image.tags[0])?,
                        true,
                    )
                    .await?;
            }
            Destination::Registry(registry)
        }
    };

    let emulation = Emulation::new(engine.clone());
    let emulated = prepare_emulation(project, &plan, options, &emulation, reporter).await;
    // Probe images are per run; the registrations themselves stay, as binfmt --install's do.
    let _ = emulation.cleanup().await;
    let emulated = emulated?;

    let run_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let jobs = options.jobs.max(1);
    let pushed: Vec<(String, Pushed)> = futures_util::stream::iter(plan.units.iter())
        .map(|unit| {
            let run_id = run_id.clone();
            let destination = &destination;
            let emulated = emulated.contains(&(unit.image.name.clone(), unit.platform.clone()));
            async move {
                let pushed = build_and_push(
                    engine,
                    destination,
                    unit,
                    emulated,
                    &run_id,
                    cleanup,
                    reporter,
                )
                .await?;
                Ok::<_, Error>((unit.image.name.clone(), pushed))
            }
        })
        .buffer_unordered(jobs)
        .try_collect()
        .await?;

    let mut coverage = Vec::new();
    for image in &plan.images {
        let mut mine: Vec<&Pushed> = pushed
            .iter()
            .filter(|(name, _)| name == &image.name)
            .map(|(_, p)| p)
            .collect();
        // Index order follows the project file, not build completion order.
        mine.sort_by_key(|p| image.platforms.iter().position(|d| d == &p.platform));
        let entries: Vec<IndexEntry> = mine.iter().map(|p| p.entry.clone()).collect();
        let index = oci::image_index(&entries).map_err(|m| Error::Registry {
            registry: image.repository.clone(),
            message: m,
        })?;
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: None,
            phase: Phase::Publish,
            message: format!("publishing {} as {}", index.digest, image.tags.join(", ")),
        });
        let first = repository_reference(&image.repository, &image.tags[0])?;
        destination.put_manifest(&first, &index).await?;
        for tag in &image.tags {
            destination.tag(image, tag, &index).await?;
        }

        let mut checked = destination.verify(image, &index.digest, reporter).await?;
        for platform in &mut checked.platforms {
            platform.build = mine
                .iter()
                .find(|p| p.platform == platform.platform)
                .map(|p| p.build.clone());
        }
        coverage.push(checked);
    }
    Ok(CoverageRecord::new(coverage))
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

/// Before any build: makes every foreign platform whose build RUNs something runnable on
/// the engine (or fails, per the binfmt mode). Returns the image × platform pairs that
/// will build under emulation.
async fn prepare_emulation(
    project: &Project,
    plan: &plan::Plan<'_>,
    options: &BuildOptions,
    emulation: &Emulation,
    reporter: &dyn Reporter,
) -> Result<HashSet<(String, Platform)>> {
    let mut emulated = HashSet::new();
    let installer = options
        .binfmt_image
        .as_deref()
        .or(project.binfmt_image.as_deref());
    for image in &plan.images {
        let foreign: Vec<Platform> = plan
            .units
            .iter()
            .filter(|u| u.image.name == image.name && u.foreign)
            .map(|u| u.platform.clone())
            .collect();
        if foreign.is_empty() {
            continue;
        }
        if !image_needs_emulation(image)? {
            reporter.report(Event::Note {
                message: format!(
                    "{}: no RUN step executes for the target platform, so {} builds need no emulation",
                    image.name,
                    foreign.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
                ),
            });
            continue;
        }
        let mode = binfmt_mode(project, image, options);
        for (platform, status) in emulation
            .ensure(&foreign, mode, installer, reporter)
            .await?
        {
            if let EmulationStatus::Emulated { registered_now } = status {
                reporter.report(Event::Warning {
                    message: format!(
                        "{} {platform} builds under QEMU emulation{}: RUN steps are typically 5-10x slower than native",
                        image.name,
                        if registered_now { " (emulator registered by this run)" } else { "" }
                    ),
                });
                emulated.insert((image.name.clone(), platform));
            }
        }
    }
    Ok(emulated)
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
    let first = repository_reference(&image.repository, &image.tags[0])?;
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
    let wanted = expected.unwrap_or(&coverage.digest).to_string();
    for tag in &image.tags {
        let (_, digest) = registry
            .get_manifest(&repository_reference(&image.repository, tag)?)
            .await?;
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

fn registry_hosts(images: &[&ImageSpec]) -> Result<Vec<String>> {
    images
        .iter()
        .map(|i| repository_reference(&i.repository, &i.tags[0]).map(|r| r.registry().to_string()))
        .collect()
}

pub fn repository_reference(repository: &str, tag: &str) -> Result<Reference> {
    registry::parse_reference(&format!("{repository}:{tag}"))
}

async fn build_and_push(
    engine: &Engine,
    destination: &Destination,
    unit: &Unit<'_>,
    emulated: bool,
    run_id: &str,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<Pushed> {
    let image = unit.image;
    let phase = |phase: Phase, message: String| {
        reporter.report(Event::Phase {
            image: image.name.clone(),
            platform: Some(unit.platform.clone()),
            phase,
            message,
        })
    };
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
    cleanup.add(&build::temporary_tag(&image.name, &unit.platform, run_id));
    let built: BuiltImage = build::build(engine, image, &unit.platform, run_id, reporter).await?;

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
    let exported = exported?;

    let config_platform =
        ConfigPlatform::from_config(&exported.config).map_err(|m| Error::Export {
            image: image.name.clone(),
            message: m,
        })?;
    if config_platform.normalized() != unit.platform {
        return Err(Error::Build {
            image: image.name.clone(),
            platform: unit.platform.to_string(),
            message: format!(
                "the engine built an image for {} instead; it cannot build for {} (upgrade the engine or use a native builder)",
                config_platform.normalized(),
                unit.platform
            ),
        });
    }

    let reference = repository_reference(&image.repository, &image.tags[0])?;
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
    let manifest = oci::image_manifest(&exported).map_err(|m| Error::Export {
        image: image.name.clone(),
        message: m,
    })?;
    // By digest: no per-platform tags are left behind in the repository.
    destination.put_manifest(&reference, &manifest).await?;
    phase(Phase::Done, format!("pushed {}", manifest.digest));
    Ok(Pushed {
        platform: unit.platform.clone(),
        entry: IndexEntry {
            digest: manifest.digest.clone(),
            size: manifest.bytes.len() as u64,
            platform: config_platform,
        },
        build: BuildInfo {
            emulated,
            seconds: (built.seconds * 10.0).round() / 10.0,
            builder: Some(engine.endpoint.clone()),
        },
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
    let registry = Registry::new(&registry_hosts(&plan.images)?, options)?;
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

/// What an image reference provides, for the deploy gate: every platform entry of its
/// index (attestations excluded) and the digest to pin.
pub async fn provided_platforms(
    references: &[String],
    options: &RegistryOptions,
    reporter: &dyn Reporter,
) -> Result<std::collections::BTreeMap<String, crate::k8s::ProvidedPlatforms>> {
    let parsed: Vec<Reference> = references
        .iter()
        .map(|r| registry::parse_reference(r))
        .collect::<Result<_>>()?;
    let hosts: Vec<String> = parsed.iter().map(|r| r.registry().to_string()).collect();
    let registry = Registry::new(&hosts, options)?;
    let mut out = std::collections::BTreeMap::new();
    for (text, reference) in references.iter().zip(parsed) {
        let target = Target {
            name: text.clone(),
            reference: text.clone(),
            tags: Vec::new(),
            declared: Vec::new(),
            deep: false,
        };
        let source = RegistrySource {
            registry: &registry,
            reference,
        };
        // With nothing declared, every platform found is listed as "unexpected".
        let coverage = verify::verify(&source, &target, reporter).await?;
        out.insert(
            text.clone(),
            crate::k8s::ProvidedPlatforms {
                digest: Some(coverage.digest),
                platforms: coverage.unexpected,
            },
        );
    }
    Ok(out)
}

//! The run's emulation: which image × platform builds run under QEMU, decided before any
//! build and checked again when a trusted verdict proves stale.

use super::BuildOptions;
use crate::base::dockerfile;
use crate::base::progress::{Event, Reporter};
use crate::builder::binfmt::{Emulation, EmulationStatus};
use crate::builder::cleanup::Cleanup;
use crate::builder::Builders;
use crate::docker::buildkit::daemon::DaemonError;
use crate::docker::engine::{Engine, Standalone};
use crate::flows::cache::EmulationMemory;
use crate::project::plan::{self, Unit};
use crate::project::{BinfmtMode, ImageSpec, Project};
use crate::{Error, Platform, Result};
use std::collections::{HashMap, HashSet};

/// The binfmt mode in force for an image: CLI, then the image's own, then the project's.
fn binfmt_mode(project: &Project, image: &ImageSpec, options: &BuildOptions) -> BinfmtMode {
    options.binfmt.or(image.binfmt).unwrap_or(project.binfmt)
}

/// The image's builds on a platform other than their builder's own, warning where the
/// builder was listed for that platform yet is native to another.
fn foreign_builds<'e>(
    image: &ImageSpec,
    plan: &plan::Plan<'_>,
    builders: &'e Builders,
    reporter: &dyn Reporter,
) -> Vec<(&'e Engine, Platform)> {
    let mut foreign = Vec::new();
    for unit in plan.units.iter().filter(|u| u.image.name == image.name) {
        let engine = builders.for_unit(unit);
        if unit.platform.os_arch() == engine.native.os_arch() {
            continue;
        }
        if builders.by_platform.contains_key(&unit.platform) {
            reporter.report(Event::Warning {
                message: format!(
                    "builder {} for {} is a {} {}",
                    engine.endpoint,
                    unit.platform,
                    engine.native,
                    match engine.daemon {
                        Some(_) => "BuildKit daemon",
                        None => "engine",
                    }
                ),
            });
        }
        foreign.push((engine, unit.platform.clone()));
    }
    foreign
}

/// A standalone daemon's verdict: polyarch registers nothing on a daemon's host, so its
/// workers say what runs.
fn daemon_runs(
    engine: &Engine,
    standalone: &Standalone,
    platform: Platform,
) -> Result<EmulationStatus> {
    if !standalone.platforms.contains(&platform) {
        return Err(DaemonError::Unrunnable {
            daemon: engine.endpoint.clone(),
            runs: standalone
                .platforms
                .iter()
                .map(Platform::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            arch: platform.architecture.clone(),
            platform,
        }
        .into());
    }
    Ok(EmulationStatus::Emulated {
        registered_now: false,
    })
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
pub(super) struct EmulationPlan<'a> {
    project: &'a Project,
    options: &'a BuildOptions,
    memory: EmulationMemory,
    emulated: HashSet<(String, Platform)>,
    remembered: HashSet<(String, Platform)>,
    /// Serialises re-checks, so two builds never register the same emulator at once.
    recheck: tokio::sync::Mutex<()>,
    /// The run's: what a probe cut off leaves is removed with the rest.
    cleanup: Cleanup,
}

impl<'a> EmulationPlan<'a> {
    /// Before any build: makes every foreign platform whose build RUNs something runnable
    /// on its engine (or fails, per the binfmt mode).
    pub(super) async fn prepare(
        project: &'a Project,
        plan: &plan::Plan<'_>,
        options: &'a BuildOptions,
        builders: &Builders,
        cleanup: &Cleanup,
        reporter: &dyn Reporter,
    ) -> Result<EmulationPlan<'a>> {
        let mut state = EmulationPlan {
            project,
            options,
            memory: EmulationMemory::open(),
            emulated: HashSet::new(),
            remembered: HashSet::new(),
            recheck: tokio::sync::Mutex::new(()),
            cleanup: cleanup.clone(),
        };
        // One per engine, so images sharing a platform share its probe.
        let mut emulations: HashMap<String, Emulation> = HashMap::new();
        let prepared = state
            .prepare_images(plan, builders, &mut emulations, reporter)
            .await;
        // Probe images are per run; registrations stay, as binfmt --install's do.
        for emulation in emulations.values() {
            emulation.remove_probe_images().await;
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
            let foreign = foreign_builds(image, plan, builders, reporter);
            if foreign.is_empty() {
                continue;
            }
            // A test of a foreign platform runs its image under the build's QEMU.
            let tested = !self.options.skip_tests
                && foreign
                    .iter()
                    .any(|(_, p)| image.tests.iter().any(|t| t.platforms.contains(p)));
            if !tested && !image_needs_emulation(image)? {
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
                let status = match &engine.daemon {
                    Some(standalone) => daemon_runs(engine, standalone, platform.clone())?,
                    None => {
                        self.engine_verdict(image, engine, &platform, mode, emulations, reporter)
                            .await?
                    }
                };
                self.mark(&image.name, &platform, status);
            }
        }
        Ok(())
    }

    /// A Docker engine's verdict on `platform`: remembered from an earlier run, or probed
    /// (and registered, per `mode`) through the engine's one `Emulation`.
    async fn engine_verdict(
        &mut self,
        image: &ImageSpec,
        engine: &Engine,
        platform: &Platform,
        mode: BinfmtMode,
        emulations: &mut HashMap<String, Emulation>,
        reporter: &dyn Reporter,
    ) -> Result<EmulationStatus> {
        // `never` decides from the platforms alone; the others may trust a verdict.
        let remembered = (mode != BinfmtMode::Never)
            .then(|| self.memory.runs(&engine.identity, platform))
            .flatten();
        match remembered {
            Some(emulated) => {
                self.remembered
                    .insert((image.name.clone(), platform.clone()));
                Ok(if emulated {
                    EmulationStatus::Emulated {
                        registered_now: false,
                    }
                } else {
                    EmulationStatus::Native
                })
            }
            None => {
                let emulation = emulations
                    .entry(engine.endpoint.clone())
                    .or_insert_with(|| Emulation::new(engine.clone(), &self.cleanup));
                self.ensure(emulation, platform, mode, reporter).await
            }
        }
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

    pub(super) fn is_emulated(&self, unit: &Unit<'_>) -> bool {
        self.emulated
            .contains(&(unit.image.name.clone(), unit.platform.clone()))
    }

    pub(super) fn was_remembered(&self, unit: &Unit<'_>) -> bool {
        self.remembered
            .contains(&(unit.image.name.clone(), unit.platform.clone()))
    }

    /// After a build trusted a remembered verdict and met `exec format error`: forgets it,
    /// probes (and registers, per the mode) again, and says whether the rebuild is emulated.
    pub(super) async fn recheck(
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
        let emulation = Emulation::new(engine.clone(), &self.cleanup);
        let mode = binfmt_mode(self.project, unit.image, self.options);
        let status = self
            .ensure(&emulation, &unit.platform, mode, reporter)
            .await;
        emulation.remove_probe_images().await;
        self.memory.save();
        Ok(matches!(status?, EmulationStatus::Emulated { .. }))
    }
}

//! `polyarch plan`: what a build would do on this engine, image × platform, without building
//! anything. `doctor` reads the same lines for its platform checks.

use crate::builder::binfmt::{Emulation, Runnable};
use crate::builder::cleanup::Cleanup;
use crate::builder::{sticky_key, sticky_slot};
use crate::docker::engine::Engine;
use crate::flows::pipeline::{image_needs_emulation, BuildOptions};
use crate::project::plan;
use crate::project::{BinfmtMode, Project};
use crate::{Platform, Result};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    Native,
    /// Foreign, but no RUN step executes for the target platform (COPY-only or cross-compiled).
    NoEmulationNeeded,
    EmulatedRegistered,
    EmulatedWillRegister,
    NotRunnable,
}

impl Execution {
    pub fn describe(self) -> &'static str {
        match self {
            Execution::Native => "native",
            Execution::NoEmulationNeeded => "foreign, no emulation needed (no RUN for the target)",
            Execution::EmulatedRegistered => "emulated (registered)",
            Execution::EmulatedWillRegister => "emulated (will register)",
            Execution::NotRunnable => "not runnable",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanLine {
    pub image: String,
    pub platform: Platform,
    pub execution: Execution,
    pub builder: String,
    pub binfmt: BinfmtMode,
    /// The images of the project this one builds `FROM`: it builds after them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Resolves each image × platform against the engine, probing (never registering).
pub async fn plan_report(
    project: &Project,
    engine: &Engine,
    options: &BuildOptions,
) -> Result<Vec<PlanLine>> {
    let plan = plan::plan(project, &options.images, &options.platforms, &engine.native)?;
    // Nothing cuts plan's probes off, so each removes its container itself: the probe
    // images are all there is to remove.
    let emulation = Emulation::new(engine.clone(), &Cleanup::default());
    let lines = plan_lines(project, &plan, engine, options, &emulation).await;
    emulation.remove_probe_images().await;
    lines
}

async fn plan_lines(
    project: &Project,
    plan: &plan::Plan<'_>,
    engine: &Engine,
    options: &BuildOptions,
    emulation: &Emulation,
) -> Result<Vec<PlanLine>> {
    let mut lines = Vec::new();
    for unit in &plan.units {
        let mode = options
            .binfmt
            .or(unit.image.binfmt)
            .unwrap_or(project.binfmt);
        let execution = execution(unit, mode, engine, emulation).await?;
        let warning = match execution {
            Execution::EmulatedRegistered | Execution::EmulatedWillRegister => Some(format!(
                "RUN steps for {} execute under QEMU: typically 5-10x slower than a native builder",
                unit.platform
            )),
            Execution::NotRunnable if engine.daemon.is_some() => Some(format!(
                "{} is not among the platforms {}'s workers run: register QEMU on its host and restart buildkitd, or add a native daemon under `builders:`",
                unit.platform,
                engine.described()
            )),
            Execution::NotRunnable => Some(format!(
                "{} cannot run on this engine and binfmt is `{}`: set `binfmt: auto` or give it a native builder under `builders:`",
                unit.platform,
                serde_json::to_value(mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
            )),
            _ => None,
        };
        lines.push(PlanLine {
            image: unit.image.name.clone(),
            platform: unit.platform.clone(),
            execution,
            builder: planned_builder(project, unit, engine),
            binfmt: mode,
            after: plan.dependencies.dependencies(&unit.image.name),
            warning,
        });
    }
    Ok(lines)
}

/// How `unit` will run on the default engine: a daemon's workers list what it runs
/// (polyarch probes and registers nothing there); an engine is probed.
async fn execution(
    unit: &plan::Unit<'_>,
    mode: BinfmtMode,
    engine: &Engine,
    emulation: &Emulation,
) -> Result<Execution> {
    if !unit.foreign {
        return Ok(Execution::Native);
    }
    if !image_needs_emulation(unit.image)? {
        return Ok(Execution::NoEmulationNeeded);
    }
    if let Some(standalone) = &engine.daemon {
        return Ok(match standalone.platforms.contains(&unit.platform) {
            true => Execution::EmulatedRegistered,
            false => Execution::NotRunnable,
        });
    }
    Ok(match emulation.probe(&unit.platform).await? {
        Runnable::Native => Execution::Native,
        Runnable::Emulated => Execution::EmulatedRegistered,
        Runnable::NotRunnable if mode == BinfmtMode::Auto => Execution::EmulatedWillRegister,
        Runnable::NotRunnable => Execution::NotRunnable,
    })
}

/// Which builder takes `unit`: of its platform's `builders:` list, the one it is sticky
/// to (the next one takes it while that one is down); else the default engine or daemon.
fn planned_builder(project: &Project, unit: &plan::Unit<'_>, engine: &Engine) -> String {
    match project.builders.get(&unit.platform) {
        Some(list) if list.len() > 1 => {
            let key = sticky_key(&unit.image.repository, &unit.image.name);
            let slot = sticky_slot(&key, list.len());
            format!(
                "{} (sticky: {} of {} in the list, the next one while it is down)",
                list[slot],
                slot + 1,
                list.len()
            )
        }
        Some(list) if !list.is_empty() => list[0].to_string(),
        _ => format!(
            "{} ({}, {})",
            engine.endpoint,
            engine.product_version(),
            engine.native
        ),
    }
}

//! Probing and registering emulators on the engine's kernel: small FROM-scratch images run
//! as containers, and the run's clean-up.

use super::*;
use crate::builder::cleanup::Cleanup;
use crate::docker::container::{ContainerRun, Ended};

pub(super) struct RunOutcome {
    pub(super) exit: Option<i64>,
    /// A create or start refusal.
    pub(super) refused: Option<String>,
    pub(super) logs: String,
}

/// Emulation detection and registration for one run on one engine: probe results and
/// probe images are cached; [`Emulation::remove_probe_images`] removes the images once
/// probing is done. The containers and probe images are recorded in the run's
/// [`Cleanup`] meanwhile, so a probe cut off leaves nothing once it runs.
pub struct Emulation {
    pub(super) engine: Engine,
    removal: Cleanup,
    run_id: String,
    cache: Mutex<HashMap<Platform, Runnable>>,
    details: Mutex<HashMap<Platform, String>>,
    /// Probe image tags built for this run.
    pub(super) images: tokio::sync::Mutex<HashMap<Platform, String>>,
    serial: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Emulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulation")
            .field("engine", &self.engine)
            .field("run_id", &self.run_id)
            .finish()
    }
}

fn slug(platform: &Platform) -> String {
    platform.to_string().replace('/', "-")
}

pub(super) fn tar_context(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .map_err(|source| EmulationError::Archive {
                path: path.to_string(),
                source,
            })?;
    }
    builder
        .into_inner()
        .map_err(|source| EmulationError::Archive {
            path: "build context".into(),
            source,
        })
}

impl Emulation {
    pub fn new(engine: Engine, cleanup: &Cleanup) -> Self {
        Emulation {
            engine,
            removal: cleanup.clone(),
            run_id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            cache: Mutex::new(HashMap::new()),
            details: Mutex::new(HashMap::new()),
            images: tokio::sync::Mutex::new(HashMap::new()),
            serial: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The id in this run's container and image names (`polyarch-probe:<run_id>-…`).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    fn container_name(&self, what: &str) -> String {
        let n = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("polyarch-{what}-{}-{n}", self.run_id)
    }

    /// Builds (once per run) the FROM-scratch probe image for `platform` and returns its tag.
    pub async fn probe_image(&self, platform: &Platform) -> Result<String> {
        let mut images = self.images.lock().await;
        if let Some(tag) = images.get(platform) {
            return Ok(tag.clone());
        }
        let elf = probe_elf(platform).ok_or_else(|| EmulationError::NoProbe {
            platform: platform.clone(),
        })?;
        let tag = format!("polyarch-probe:{}-{}", self.run_id, slug(platform));
        // Recorded first: a load cut off may still complete in the engine.
        self.removal.add_built(&self.engine, &tag);
        self.load_scratch_image(&tag, platform, &[("probe", &elf, 0o755)], "/probe")
            .await?;
        images.insert(platform.clone(), tag.clone());
        Ok(tag)
    }

    /// Loads a FROM-scratch image of one layer holding `files` (path, bytes, mode), as
    /// `docker load` does: no builder involved, a fraction of a classic build's time.
    pub(super) async fn load_scratch_image(
        &self,
        tag: &str,
        platform: &Platform,
        files: &[(&str, &[u8], u32)],
        entrypoint: &str,
    ) -> Result<()> {
        let layer = tar_context(files)?;
        let diff_id = hex::encode(sha2::Sha256::digest(&layer));
        let mut config = serde_json::json!({
            "architecture": platform.architecture,
            "os": platform.os,
            "config": {"Entrypoint": [entrypoint]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        });
        if let Some(variant) = &platform.variant {
            config["variant"] = variant.as_str().into();
        }
        let config = config.to_string().into_bytes();
        let config_name = format!("{}.json", hex::encode(sha2::Sha256::digest(&config)));
        let layer_name = format!("{diff_id}/layer.tar");
        let manifest = serde_json::json!([
            {"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}
        ])
        .to_string();
        let archive = tar_context(&[
            (&layer_name, &layer, 0o644),
            (&config_name, &config, 0o644),
            ("manifest.json", manifest.as_bytes(), 0o644),
        ])?;
        let mut stream = self.engine.docker.import_image(
            ImportImageOptionsBuilder::default().quiet(true).build(),
            bollard::body_full(bytes::Bytes::from(archive)),
            None,
        );
        while let Some(item) = stream.next().await {
            item.map_err(|source| {
                let tag = tag.to_string();
                EmulationError::Load { tag, source }
            })?;
        }
        Ok(())
    }

    /// Creates, starts and waits for a container, then removes it.
    pub(super) async fn run(
        &self,
        what: &str,
        image: &str,
        platform: Option<&Platform>,
        cmd: Option<Vec<String>>,
        host_config: HostConfig,
        timeout: Duration,
    ) -> Result<RunOutcome> {
        let name = self.container_name(what);
        let run = ContainerRun {
            name: &name,
            image,
            platform,
            entrypoint: None,
            cmd,
            env: Vec::new(),
            user: None,
            workdir: None,
            network: Some("none"),
            host_config,
        };
        let outcome = self
            .removal
            .run_container(&self.engine, run, timeout)
            .await?;
        let (exit, refused) = match outcome.ended {
            Ended::Exited(code) => (Some(code), None),
            Ended::NotCreated(refusal) | Ended::NotStarted(refusal) => (None, Some(refusal)),
            Ended::TimedOut => {
                return Err(EmulationError::Timeout {
                    container: name,
                    timeout,
                })
            }
        };
        Ok(RunOutcome {
            exit,
            refused,
            logs: outcome.logs,
        })
    }

    /// Whether the engine's kernel runs `platform` binaries: the engine's own platform
    /// is `Native` without a probe; every other one runs the probe image (cached per run).
    pub async fn probe(&self, platform: &Platform) -> Result<Runnable> {
        if *platform == self.engine.native {
            return Ok(Runnable::Native);
        }
        if let Some(r) = self.cache.lock().unwrap().get(platform) {
            return Ok(*r);
        }
        let detail = self.run_probe(platform).await?;
        let runs = detail.is_none();
        if let Some(d) = detail {
            self.details.lock().unwrap().insert(platform.clone(), d);
        }
        let result = match (runs, natively_compatible(&self.engine.native, platform)) {
            (false, _) => Runnable::NotRunnable,
            (true, true) => Runnable::Native,
            (true, false) => Runnable::Emulated,
        };
        self.cache.lock().unwrap().insert(platform.clone(), result);
        Ok(result)
    }

    /// Drops the cached probe result for `platform` (after registering an emulator).
    pub fn forget(&self, platform: &Platform) {
        self.cache.lock().unwrap().remove(platform);
    }

    /// Runs the probe: `None` when it exits with [`PROBE_EXIT`], else why it did not.
    async fn run_probe(&self, platform: &Platform) -> Result<Option<String>> {
        let image = self.probe_image(platform).await?;
        let outcome = self
            .run(
                "probe",
                &image,
                Some(platform),
                None,
                HostConfig::default(),
                Duration::from_secs(60),
            )
            .await?;
        let logs = tail(&outcome.logs)
            .map(|l| format!(": {l}"))
            .unwrap_or_default();
        match (outcome.exit, outcome.refused) {
            (Some(code), _) if code == PROBE_EXIT as i64 => Ok(None),
            (Some(code), _) => Ok(Some(format!("the probe exited with {code}{logs}"))),
            (None, Some(e)) if e.contains("exec format error") || e.contains("no such file") => {
                Ok(Some(format!("the probe did not start: {e}")))
            }
            (None, Some(refusal)) => Err(EmulationError::ProbeRefused {
                platform: platform.clone(),
                refusal,
            }),
            (None, None) => Ok(Some("the probe did not run".into())),
        }
    }

    /// Why the last probe of `platform` found it not runnable.
    pub fn probe_detail(&self, platform: &Platform) -> Option<String> {
        self.details.lock().unwrap().get(platform).cloned()
    }

    /// Makes sure every platform in `platforms` (those whose builds RUN something) can run
    /// on the engine, according to `mode`:
    /// * `Auto`: registers missing emulators, then probes again;
    /// * `Require`: errors when one is missing, never registers;
    /// * `Never`: errors for any platform that is not native, before touching the engine
    ///   for it.
    pub async fn ensure(
        &self,
        platforms: &[Platform],
        mode: BinfmtMode,
        installer_image: Option<&str>,
        reporter: &dyn Reporter,
    ) -> Result<Vec<(Platform, EmulationStatus)>> {
        let native = &self.engine.native;
        if mode == BinfmtMode::Never {
            // Before touching the engine: a foreign platform cannot be native.
            refuse_emulation(
                platforms.iter().filter(|p| !natively_compatible(native, p)),
                native,
            )?;
        }
        let mut statuses = self.probe_all(platforms).await?;
        if mode == BinfmtMode::Never {
            let emulated = statuses
                .iter()
                .filter(|(_, s)| !matches!(s, Some(EmulationStatus::Native)))
                .map(|(p, _)| p);
            refuse_emulation(emulated, native)?;
        }
        let missing: Vec<Platform> = statuses
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(p, _)| p.clone())
            .collect();
        if !missing.is_empty() {
            match mode {
                BinfmtMode::Never => unreachable!("handled above"),
                BinfmtMode::Require => {
                    return Err(EmulationError::Required {
                        installer_names: missing
                            .iter()
                            .filter_map(arch_info)
                            .map(|a| a.installer_name)
                            .collect(),
                        platforms: missing,
                        native: native.clone(),
                    })
                }
                BinfmtMode::Auto => {
                    self.register_missing(&mut statuses, &missing, installer_image, reporter)
                        .await?
                }
            }
        }
        Ok(statuses
            .into_iter()
            .map(|(p, s)| (p, s.expect("all resolved")))
            .collect())
    }

    /// Each platform's status as probed; `None` where it cannot run (yet).
    async fn probe_all(
        &self,
        platforms: &[Platform],
    ) -> Result<Vec<(Platform, Option<EmulationStatus>)>> {
        let mut statuses = vec![];
        for platform in platforms {
            let status = match self.probe(platform).await? {
                Runnable::Native => Some(EmulationStatus::Native),
                Runnable::Emulated => Some(EmulationStatus::Emulated {
                    registered_now: false,
                }),
                Runnable::NotRunnable => None,
            };
            statuses.push((platform.clone(), status));
        }
        Ok(statuses)
    }

    /// `binfmt: auto`: registers emulators for the `missing` platforms, probes them again
    /// and marks them registered now in `statuses`; an error for any still not runnable.
    async fn register_missing(
        &self,
        statuses: &mut [(Platform, Option<EmulationStatus>)],
        missing: &[Platform],
        installer_image: Option<&str>,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        let unknown: Vec<Platform> = missing
            .iter()
            .filter(|p| arch_info(p).is_none())
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(EmulationError::NoEmulator { platforms: unknown });
        }
        let registration = self.register(missing, installer_image, reporter).await?;
        for p in missing {
            self.forget(p);
        }
        let mut still = vec![];
        for (p, s) in statuses.iter_mut().filter(|(_, s)| s.is_none()) {
            match self.probe(p).await? {
                Runnable::NotRunnable => still.push(p.clone()),
                _ => {
                    *s = Some(EmulationStatus::Emulated {
                        registered_now: true,
                    })
                }
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        let why = still
            .iter()
            .filter_map(|p| self.probe_detail(p).map(|d| format!("{p}: {d}")))
            .collect::<Vec<_>>()
            .join("; ");
        Err(EmulationError::StillNotRunnable {
            platforms: still,
            registration,
            why,
        })
    }

    /// Registers QEMU emulators for `platforms` on the engine's kernel.
    /// Uses `installer_image` (default [`DEFAULT_INSTALLER`]) when the engine has it or can
    /// pull it, else an installer assembled from the client host's qemu-user-static files.
    /// Since Linux 6.7 binfmt_misc can be a per-namespace instance that lives only while
    /// mounted: on a sandboxed host, what the installer container registers into its own
    /// mount vanishes with the container. When the engine is local and the host has no
    /// binfmt_misc mounted, mount it here (as root) so the registrations persist.
    pub(super) fn keep_binfmt_instance_alive(&self, reporter: &dyn Reporter) {
        let local = self.engine.location.is_local();
        let mounted = std::path::Path::new(BINFMT_MISC).join("register").exists();
        if !local || mounted || !std::path::Path::new(BINFMT_MISC).is_dir() {
            return;
        }
        let status = std::process::Command::new("mount")
            .args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_MISC])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if status.is_ok_and(|s| s.success()) {
            reporter.report(Event::Note {
                message: format!(
                    "mounted binfmt_misc at {BINFMT_MISC} on this host so the emulators registered next outlive the installer container"
                ),
            });
        }
    }
}

impl Emulation {
    /// Removes the probe images built during this run; one the engine would not remove
    /// stays recorded for the run's [`Cleanup`].
    pub async fn remove_probe_images(&self) {
        let tags: Vec<String> = self.images.lock().await.drain().map(|(_, t)| t).collect();
        for tag in tags {
            self.removal.remove(&self.engine, &tag).await;
        }
    }
}

pub(super) fn tail(logs: &str) -> Option<String> {
    let lines: Vec<&str> = logs
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.chars().any(|c| c != '.'))
        .collect();
    (!lines.is_empty()).then(|| lines[lines.len().saturating_sub(3)..].join(" | "))
}

pub(super) fn join<P: std::borrow::Borrow<Platform>>(platforms: &[P]) -> String {
    platforms
        .iter()
        .map(|p| p.borrow().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `binfmt: never`: an error naming every platform in `emulated`, if there is one.
fn refuse_emulation<'a>(
    emulated: impl Iterator<Item = &'a Platform>,
    native: &Platform,
) -> Result<()> {
    let platforms: Vec<Platform> = emulated.cloned().collect();
    if platforms.is_empty() {
        return Ok(());
    }
    Err(EmulationError::Never {
        platforms,
        native: native.clone(),
    })
}

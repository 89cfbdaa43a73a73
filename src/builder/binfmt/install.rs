//! Registering emulators: the installer image when the engine has or can pull it, else one
//! assembled from the client host's `qemu-*-static` and a generated installer program.

use super::emulation::{join, tail, tar_context};
use super::programs::installer_exit_meaning;
use super::*;

impl Emulation {
    pub async fn register(
        &self,
        platforms: &[Platform],
        installer_image: Option<&str>,
        reporter: &dyn Reporter,
    ) -> Result<Registration> {
        let arches: Vec<ArchInfo> = {
            let mut v: Vec<ArchInfo> = vec![];
            for p in platforms {
                let a = arch_info(p).ok_or_else(|| EmulationError::UnknownArch {
                    platform: p.clone(),
                })?;
                if !v.contains(&a) {
                    v.push(a);
                }
            }
            v
        };
        let names = join(platforms);
        self.keep_binfmt_instance_alive(reporter);
        let image = installer_image.unwrap_or(DEFAULT_INSTALLER);
        let image_error = match self.have_or_pull(image, reporter).await {
            Ok(()) => {
                reporter.report(Event::Phase {
                    image: image.to_string(),
                    platform: None,
                    phase: Phase::Emulation,
                    message: format!("registering QEMU for {names} with {image}"),
                });
                let list = arches
                    .iter()
                    .map(|a| a.installer_name)
                    .collect::<Vec<_>>()
                    .join(",");
                let cmd = vec!["--install".to_string(), list];
                match self.run_installer(image, Some(cmd), false, reporter).await {
                    Ok(privileged) => {
                        return Ok(Registration::InstallerImage {
                            image: image.to_string(),
                            privileged,
                        })
                    }
                    Err(e) => InstallerError::Run(Box::new(e)),
                }
            }
            Err(e) => e,
        };
        reporter.report(Event::Note {
            message: format!(
                "installer image {image} is not usable ({image_error}); assembling one from \
                 this host's qemu-user-static"
            ),
        });
        let (image, privileged) =
            self.register_assembled(&arches, reporter)
                .await
                .map_err(|source| {
                    if source.is_engine() {
                        return source;
                    }
                    EmulationError::Register {
                        platforms: platforms.to_vec(),
                        installer: image.to_string(),
                        installer_error: Box::new(image_error),
                        source: Box::new(source),
                    }
                })?;
        Ok(Registration::Assembled { image, privileged })
    }

    async fn have_or_pull(
        &self,
        image: &str,
        reporter: &dyn Reporter,
    ) -> Result<(), InstallerError> {
        let docker = &self.engine.docker;
        if docker.inspect_image(image).await.is_ok() {
            return Ok(());
        }
        reporter.report(Event::Note {
            message: format!("pulling {image}"),
        });
        let (from, tag) = match image.rsplit_once(':') {
            Some((f, t)) if !t.contains('/') => (f, t),
            _ => (image, "latest"),
        };
        let options = CreateImageOptionsBuilder::default()
            .from_image(from)
            .tag(tag)
            .build();
        let pull = async {
            let mut stream = docker.create_image(Some(options), None, None);
            while let Some(item) = stream.next().await {
                item.map_err(InstallerError::Pull)?;
            }
            Ok::<(), InstallerError>(())
        };
        tokio::time::timeout(Duration::from_secs(60), pull)
            .await
            .map_err(|_| InstallerError::PullTimeout)??;
        docker
            .inspect_image(image)
            .await
            .map(|_| ())
            .map_err(InstallerError::NotFound)
    }

    /// Runs an installer container: privileged first, then CAP_SYS_ADMIN with unconfined
    /// AppArmor/seccomp when that is refused or fails. Returns whether privileged worked.
    async fn run_installer(
        &self,
        image: &str,
        cmd: Option<Vec<String>>,
        assembled: bool,
        reporter: &dyn Reporter,
    ) -> Result<bool> {
        let attempts = [
            (
                true,
                HostConfig {
                    privileged: Some(true),
                    ..Default::default()
                },
            ),
            (
                false,
                HostConfig {
                    cap_add: Some(vec!["SYS_ADMIN".into()]),
                    security_opt: Some(vec![
                        "apparmor=unconfined".into(),
                        "seccomp=unconfined".into(),
                    ]),
                    ..Default::default()
                },
            ),
        ];
        let mut failures = vec![];
        for (privileged, host_config) in attempts {
            let outcome = self
                .run(
                    "binfmt",
                    image,
                    Some(&self.engine.native),
                    cmd.clone(),
                    host_config,
                    Duration::from_secs(120),
                )
                .await?;
            let mode = if privileged {
                "privileged"
            } else {
                "with CAP_SYS_ADMIN"
            };
            match (outcome.exit, outcome.refused) {
                (Some(0), _) => return Ok(privileged),
                (Some(code), _) => {
                    let meaning = if assembled {
                        installer_exit_meaning(code)
                    } else {
                        format!("exit status {code}")
                    };
                    failures.push(format!(
                        "{mode}: {meaning}{}",
                        tail(&outcome.logs)
                            .map(|l| format!(" ({l})"))
                            .unwrap_or_default()
                    ));
                }
                (None, Some(e)) => failures.push(format!("{mode}: refused: {e}")),
                (None, None) => failures.push(format!("{mode}: did not run")),
            }
            if privileged {
                reporter.report(Event::Warning {
                    message: format!(
                        "binfmt installer {}; retrying with CAP_SYS_ADMIN",
                        failures.last().unwrap()
                    ),
                });
            }
        }
        Err(EmulationError::Installer {
            image: image.to_string(),
            failures,
        })
    }

    async fn register_assembled(
        &self,
        arches: &[ArchInfo],
        reporter: &dyn Reporter,
    ) -> Result<(String, bool)> {
        let native = &self.engine.native;
        let host = Platform::linux(std::env::consts::ARCH, None);
        if native.os != "linux" || native.architecture != "amd64" {
            return Err(EmulationError::AssembledNeedsAmd64 {
                native: native.clone(),
            });
        }
        if host.architecture != native.architecture {
            return Err(EmulationError::HostDiffers {
                host: Box::new(host),
                native: native.clone(),
            });
        }
        let mut files: Vec<(String, Vec<u8>)> = vec![];
        let mut lines = vec![];
        for a in arches {
            let path = PathBuf::from(a.interpreter());
            let data =
                std::fs::read(&path).map_err(|source| EmulationError::NoQemu { path, source })?;
            files.push((a.interpreter().trim_start_matches('/').to_string(), data));
            lines.push(a.register_line(&a.interpreter()));
        }
        let installer = installer_elf(&lines);
        let mut ctx: Vec<(&str, &[u8], u32)> = vec![("installer", &installer, 0o755)];
        for (p, d) in &files {
            ctx.push((p, d, 0o755));
        }
        let context = tar_context(&ctx)?;
        // Content-addressed and KEPT: with flag F the kernel re-opens the interpreter through
        // the path it pinned in the installer container, which stops working once the
        // image's layers are deleted. Removing this image disables the emulators it
        // registered (like removing tonistiigi/binfmt's image would).
        let digest = hex::encode(sha2::Sha256::digest(&context));
        let tag = format!("{INSTALLER_REPOSITORY}:{}", &digest[..16]);
        reporter.report(Event::Phase {
            image: tag.clone(),
            platform: None,
            phase: Phase::Emulation,
            message: format!(
                "registering {} with {tag} (from this host's /usr/bin/qemu-*-static)",
                arches
                    .iter()
                    .map(|a| a.entry_name())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        });
        if self.engine.docker.inspect_image(&tag).await.is_err() {
            self.load_scratch_image(&tag, native, &ctx, "/installer")
                .await?;
        }
        let privileged = self.run_installer(&tag, None, true, reporter).await?;
        Ok((tag, privileged))
    }
}

//! What kind of emulation failure happened, so that callers decide by kind (a build that
//! hit "exec format error" is probed again) and never by message text.

use super::emulation::join;
use super::{Registration, DEFAULT_INSTALLER};
use crate::base::platform::Platform;
use bollard::errors::Error as DockerError;
use std::path::PathBuf;
use std::time::Duration;

/// Why emulation is missing, cannot be registered, or could not be probed. Its text is
/// what [`crate::Error::Emulation`] shows after [`EmulationError::area`].
#[derive(Debug, thiserror::Error)]
pub enum EmulationError {
    /// A build's RUN step hit "exec format error" on a foreign platform: the emulator is
    /// not (or no longer) registered.
    #[error("emulation for {platform} is not registered on this engine, so its RUN steps cannot execute; run with `--binfmt auto` (or `binfmt: auto` in polyarch.yaml) to register QEMU, or build {platform} on a native builder")]
    ExecFormat { platform: Platform },
    #[error("polyarch has no probe executable for {platform}")]
    NoProbe { platform: Platform },
    #[error("{platform}: polyarch knows no QEMU emulator for it")]
    UnknownArch { platform: Platform },
    /// Platforms `auto` cannot register an emulator for.
    #[error(
        "{}: polyarch knows no QEMU emulator for it; add a native builder for it under `builders:`",
        join(platforms)
    )]
    NoEmulator { platforms: Vec<Platform> },
    /// `binfmt: never` and a platform needs emulation.
    #[error("{names}: the engine is {native}, so building {names} needs QEMU emulation, but binfmt is `never`; allow emulation with `binfmt: auto`, or add a native builder for {names} under `builders:`", names = join(platforms))]
    Never {
        platforms: Vec<Platform>,
        native: Platform,
    },
    /// `binfmt: require` and an emulator is missing.
    #[error("{names}: the engine ({native}) cannot run binaries for {names} and no QEMU emulator is registered for it; binfmt is `require`, so polyarch does not register one: register it yourself (e.g. `docker run --privileged --rm {DEFAULT_INSTALLER} --install {}`), set `binfmt: auto`, or add a native builder for it under `builders:`", installer_names.join(","), names = join(platforms))]
    Required {
        platforms: Vec<Platform>,
        native: Platform,
        installer_names: Vec<&'static str>,
    },
    /// Emulators were registered but the probe still does not run.
    #[error("{}: registered QEMU emulators ({registration:?}) but the probe still cannot run ({why}); an existing binfmt_misc entry without flag F may shadow them (check {binfmt_misc}/qemu-* on the engine host and remove stale ones with `echo -1 > {binfmt_misc}/<name>`), or add a native builder under `builders:`", join(platforms), binfmt_misc = super::BINFMT_MISC)]
    StillNotRunnable {
        platforms: Vec<Platform>,
        registration: Registration,
        why: String,
    },
    #[error("installer {image} failed: {}", failures.join("; "))]
    Installer {
        image: String,
        failures: Vec<String>,
    },
    #[error("the assembled installer only supports linux/amd64 engines (this one is {native}); make an installer image available to the engine (`binfmt_image:`)")]
    AssembledNeedsAmd64 { native: Platform },
    #[error("this host ({host}) differs from the engine ({native}), so its qemu-user-static binaries cannot run there; make an installer image available to the engine")]
    HostDiffers {
        // Boxed, as `installer_error`, so that every `Result` of the area stays small.
        host: Box<Platform>,
        native: Platform,
    },
    #[error("{}: {source}; install qemu-user-static (Debian/Ubuntu: `apt-get install qemu-user-static`)", path.display())]
    NoQemu {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Neither the installer image nor an assembled installer registered the emulators;
    /// `source` is why the assembled one failed.
    #[error(
        "{}: cannot register QEMU emulators: {installer}: {installer_error}; {source}",
        join(platforms)
    )]
    Register {
        platforms: Vec<Platform>,
        installer: String,
        installer_error: Box<InstallerError>,
        #[source]
        source: Box<EmulationError>,
    },
    /// The engine failed to load a probe or installer image.
    #[error("loading {tag} into the engine: {source}")]
    Load {
        tag: String,
        #[source]
        source: DockerError,
    },
    #[error("container {container} did not exit within {timeout:?}")]
    Timeout {
        container: String,
        timeout: Duration,
    },
    #[error(transparent)]
    Container(#[from] crate::docker::container::ContainerError),
    /// The engine refused to run the probe container (not an exec format error).
    #[error("running the {platform} probe container: {refusal}")]
    ProbeRefused { platform: Platform, refusal: String },
    /// Writing an in-memory image archive failed (out of memory, an entry too long).
    #[error("{path}: {source}")]
    Archive {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl EmulationError {
    /// Whether the engine failed (rather than emulation being missing): it decides the
    /// message's prefix, as the engine's other failures have theirs.
    pub fn is_engine(&self) -> bool {
        matches!(
            self,
            EmulationError::Load { .. }
                | EmulationError::Timeout { .. }
                | EmulationError::Container(_)
                | EmulationError::ProbeRefused { .. }
        )
    }

    pub fn area(&self) -> &'static str {
        if self.is_engine() {
            "docker engine"
        } else {
            "emulation"
        }
    }
}

/// Why the installer image did not register the emulators (then one is assembled).
#[derive(Debug, thiserror::Error)]
pub enum InstallerError {
    #[error("cannot pull it: {0}")]
    Pull(#[source] DockerError),
    #[error("pulling it timed out")]
    PullTimeout,
    #[error("pulled but not found: {0}")]
    NotFound(#[source] DockerError),
    /// It was there but running it failed.
    #[error("{}: {}", .0.area(), .0)]
    Run(#[source] Box<EmulationError>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn platform(text: &str) -> Platform {
        text.parse().unwrap()
    }

    /// What the user reads: the area, then the kind's own words.
    fn shown(error: &EmulationError) -> String {
        format!("{}: {error}", error.area())
    }

    #[test]
    fn each_kind_says_its_area_and_the_same_words_as_before() {
        let never = EmulationError::Never {
            platforms: vec![platform("linux/arm64"), platform("linux/s390x")],
            native: platform("linux/amd64"),
        };
        assert_eq!(
            shown(&never),
            "emulation: linux/arm64, linux/s390x: the engine is linux/amd64, so building linux/arm64, linux/s390x needs QEMU emulation, but binfmt is `never`; allow emulation with `binfmt: auto`, or add a native builder for linux/arm64, linux/s390x under `builders:`"
        );
        let required = EmulationError::Required {
            platforms: vec![platform("linux/arm64")],
            native: platform("linux/amd64"),
            installer_names: vec!["arm64"],
        };
        assert_eq!(
            shown(&required),
            "emulation: linux/arm64: the engine (linux/amd64) cannot run binaries for linux/arm64 and no QEMU emulator is registered for it; binfmt is `require`, so polyarch does not register one: register it yourself (e.g. `docker run --privileged --rm tonistiigi/binfmt --install arm64`), set `binfmt: auto`, or add a native builder for it under `builders:`"
        );
        let timeout = EmulationError::Timeout {
            container: "polyarch-probe-1".into(),
            timeout: Duration::from_secs(60),
        };
        assert_eq!(
            shown(&timeout),
            "docker engine: container polyarch-probe-1 did not exit within 60s"
        );
    }

    #[test]
    fn a_failed_registration_keeps_why_the_assembled_installer_failed() {
        let error = EmulationError::Register {
            platforms: vec![platform("linux/riscv64")],
            installer: DEFAULT_INSTALLER.into(),
            installer_error: Box::new(InstallerError::PullTimeout),
            source: Box::new(EmulationError::NoQemu {
                path: "/usr/bin/qemu-riscv64-static".into(),
                source: std::io::ErrorKind::NotFound.into(),
            }),
        };
        assert_eq!(
            shown(&error),
            "emulation: linux/riscv64: cannot register QEMU emulators: tonistiigi/binfmt: pulling it timed out; /usr/bin/qemu-riscv64-static: entity not found; install qemu-user-static (Debian/Ubuntu: `apt-get install qemu-user-static`)"
        );
        let assembled = error.source().unwrap();
        assert!(matches!(
            assembled
                .downcast_ref::<Box<EmulationError>>()
                .map(|e| &**e),
            Some(EmulationError::NoQemu { .. })
        ));
        let io = assembled.source().unwrap();
        assert_eq!(
            io.downcast_ref::<std::io::Error>().unwrap().kind(),
            std::io::ErrorKind::NotFound
        );
    }
}

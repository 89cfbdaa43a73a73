//! QEMU user-mode emulation through binfmt_misc, detected and registered on the
//! *engine's* kernel through the Docker API (never on the client host).
//!
//! * [`probe_elf`] generates a minimal static ELF per architecture that calls
//!   `exit(PROBE_EXIT)`; [`Emulation::probe`] runs it in a FROM-scratch image on the engine.
//! * [`Emulation::ensure`] applies a [`BinfmtMode`] to the platforms a build needs.
//! * Registration runs an installer container with CAP_SYS_ADMIN: the given installer
//!   image (`tonistiigi/binfmt --install <arch>`) when the engine has or can pull it,
//!   otherwise one assembled locally from the client host's `/usr/bin/qemu-*-static`
//!   and a generated static installer program (see [`installer_elf`]).

use crate::base::platform::Platform;
use crate::base::progress::{Event, Phase, Reporter};
use crate::docker::engine::Engine;
use crate::project::BinfmtMode;
use bollard::models::HostConfig;
use bollard::query_parameters::{CreateImageOptionsBuilder, ImportImageOptionsBuilder};
use futures_util::StreamExt;
use sha2::Digest;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

mod emulation;
mod error;
mod install;
mod programs;

pub use emulation::Emulation;
pub use error::{EmulationError, InstallerError};
pub use programs::{installer_elf, probe_elf};

type Result<T, E = EmulationError> = std::result::Result<T, E>;

/// The exit code every probe executable returns when it runs.
pub const PROBE_EXIT: u8 = 42;

/// The default installer image (`--install <arch>[,<arch>…]`).
pub const DEFAULT_INSTALLER: &str = "tonistiigi/binfmt";

/// Repository of the locally assembled installer images.
pub const INSTALLER_REPOSITORY: &str = "polyarch-binfmt-installer";

/// Where binfmt_misc lives, on the engine's kernel as seen from a container.
pub const BINFMT_MISC: &str = "/proc/sys/fs/binfmt_misc";

/// Flags polyarch registers with: P (keep `argv[0]`, needed by busybox-style multi-call
/// binaries), O/C (credentials from the binary), F (the kernel opens the interpreter at
/// registration, so it works inside containers that do not contain it).
pub const BINFMT_FLAGS: &str = "POCF";

// ---------------------------------------------------------------------------------------
// Architectures
// ---------------------------------------------------------------------------------------

/// What polyarch knows about one emulatable architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchInfo {
    /// QEMU's name (`qemu-<name>-static`, binfmt entry `qemu-<name>`).
    pub qemu: &'static str,
    /// tonistiigi/binfmt's `--install` name.
    pub installer_name: &'static str,
    /// binfmt_misc magic and mask, `\xNN`-escaped as in Debian's qemu-user-static
    /// `/usr/lib/binfmt.d/qemu-*.conf` (and QEMU's `qemu-binfmt-conf.sh`).
    pub magic: &'static str,
    pub mask: &'static str,
}

const MASK_LE: &str =
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff";

const X86_64: ArchInfo = ArchInfo {
    qemu: "x86_64",
    installer_name: "amd64",
    magic: r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00",
    mask: MASK_LE,
};
const I386: ArchInfo = ArchInfo {
    qemu: "i386",
    installer_name: "386",
    magic: r"\x7f\x45\x4c\x46\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x03\x00",
    mask: r"\xff\xff\xff\xff\xff\xfe\xfe\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
};
const AARCH64: ArchInfo = ArchInfo {
    qemu: "aarch64",
    installer_name: "arm64",
    magic: r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
    mask: MASK_LE,
};
const ARM: ArchInfo = ArchInfo {
    qemu: "arm",
    installer_name: "arm",
    magic: r"\x7f\x45\x4c\x46\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x28\x00",
    mask: MASK_LE,
};
const PPC64LE: ArchInfo = ArchInfo {
    qemu: "ppc64le",
    installer_name: "ppc64le",
    magic: r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x15\x00",
    mask: r"\xff\xff\xff\xff\xff\xff\xff\xfc\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\x00",
};
const S390X: ArchInfo = ArchInfo {
    qemu: "s390x",
    installer_name: "s390x",
    magic: r"\x7f\x45\x4c\x46\x02\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x16",
    mask: r"\xff\xff\xff\xff\xff\xff\xff\xfc\xff\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff",
};
const RISCV64: ArchInfo = ArchInfo {
    qemu: "riscv64",
    installer_name: "riscv64",
    magic: r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xf3\x00",
    mask: MASK_LE,
};

/// The emulator for a platform, if polyarch knows one (linux only).
pub fn arch_info(platform: &Platform) -> Option<ArchInfo> {
    if platform.os != "linux" {
        return None;
    }
    match (platform.architecture.as_str(), platform.variant.as_deref()) {
        ("amd64", _) => Some(X86_64),
        ("386", _) => Some(I386),
        ("arm64", _) => Some(AARCH64),
        ("arm", Some("v6" | "v7") | None) => Some(ARM),
        ("ppc64le", _) => Some(PPC64LE),
        ("s390x", _) => Some(S390X),
        ("riscv64", _) => Some(RISCV64),
        _ => None,
    }
}

impl ArchInfo {
    /// The binfmt_misc entry name (`qemu-aarch64`), the same as Debian's and
    /// tonistiigi/binfmt's so that nothing gets registered twice.
    pub fn entry_name(&self) -> String {
        format!("qemu-{}", self.qemu)
    }

    /// The interpreter path inside the assembled installer image.
    pub fn interpreter(&self) -> String {
        format!("/usr/bin/qemu-{}-static", self.qemu)
    }

    /// The line written to `/proc/sys/fs/binfmt_misc/register`.
    pub fn register_line(&self, interpreter: &str) -> String {
        format!(
            ":{}:M::{}:{}:{}:{}",
            self.entry_name(),
            self.magic,
            self.mask,
            interpreter,
            BINFMT_FLAGS
        )
    }
}

/// Whether `platform` can run natively on a kernel of `native` (when the CPU allows it:
/// amd64 kernels run 386 through IA32 emulation, arm64 kernels usually run arm/v7).
fn natively_compatible(native: &Platform, platform: &Platform) -> bool {
    if native == platform {
        return true;
    }
    if native.os != platform.os {
        return false;
    }
    matches!(
        (native.architecture.as_str(), platform.architecture.as_str()),
        ("amd64", "386") | ("arm64", "arm") | ("arm", "arm")
    )
}

/// Whether the engine's kernel can run binaries of a platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runnable {
    Native,
    /// Runs through a registered binfmt_misc emulator.
    Emulated,
    NotRunnable,
}

/// The outcome of [`Emulation::ensure`] for one platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmulationStatus {
    Native,
    Emulated { registered_now: bool },
}

/// How emulators were registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Through an installer image (`<image> --install <arches>`).
    InstallerImage { image: String, privileged: bool },
    /// Through an image assembled from the client host's qemu-user-static files, tagged
    /// `polyarch-binfmt-installer:<content digest>` and kept (the registered entries
    /// pin interpreters inside it).
    Assembled { image: String, privileged: bool },
}

#[cfg(test)]
mod tests;

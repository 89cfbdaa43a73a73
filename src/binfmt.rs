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

use crate::engine::Engine;
use crate::platform::Platform;
use crate::progress::{Event, Phase, Reporter};
use crate::project::BinfmtMode;
use crate::{Error, Result};
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The exit code every probe executable returns when it runs.
pub const PROBE_EXIT: u8 = 42;

/// The default installer image (`--install <arch>[,<arch>…]`).
pub const DEFAULT_INSTALLER: &str = "tonistiigi/binfmt";

/// Where binfmt_misc lives, on the engine's kernel as seen from a container.
pub const BINFMT_MISC: &str = "/proc/sys/fs/binfmt_misc";

/// Flags polyarch registers with: P (keep argv[0], needed by busybox-style multi-call
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

const MASK_LE: &str = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff";

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

// ---------------------------------------------------------------------------------------
// Probe ELFs
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct ElfTarget {
    class64: bool,
    big_endian: bool,
    machine: u16,
    flags: u32,
}

fn elf_target(platform: &Platform) -> Option<ElfTarget> {
    let t = |class64, big_endian, machine, flags| ElfTarget {
        class64,
        big_endian,
        machine,
        flags,
    };
    if platform.os != "linux" {
        return None;
    }
    Some(
        match (platform.architecture.as_str(), platform.variant.as_deref()) {
            ("amd64", _) => t(true, false, 62, 0),
            ("386", _) => t(false, false, 3, 0),
            ("arm64", _) => t(true, false, 183, 0),
            // EABI version 5.
            ("arm", Some("v6" | "v7") | None) => t(false, false, 40, 0x0500_0000),
            // ELFv2 ABI.
            ("ppc64le", _) => t(true, false, 21, 2),
            ("s390x", _) => t(true, true, 22, 0),
            ("riscv64", _) => t(true, false, 243, 0),
            _ => return None,
        },
    )
}

fn words_le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Machine code calling `exit(code)` for a platform.
fn exit_code_for(platform: &Platform, code: u8) -> Option<Vec<u8>> {
    let c = code as u32;
    Some(match platform.architecture.as_str() {
        // mov edi, code; mov eax, 60 (exit); syscall
        "amd64" => {
            let mut v = vec![0xbf];
            v.extend_from_slice(&c.to_le_bytes());
            v.extend_from_slice(&[0xb8, 60, 0, 0, 0, 0x0f, 0x05]);
            v
        }
        // mov ebx, code; mov eax, 1 (exit); int 0x80
        "386" => {
            let mut v = vec![0xbb];
            v.extend_from_slice(&c.to_le_bytes());
            v.extend_from_slice(&[0xb8, 1, 0, 0, 0, 0xcd, 0x80]);
            v
        }
        // movz x0, #code; movz x8, #93 (exit); svc #0
        "arm64" => words_le(&[0xd280_0000 | (c << 5), 0xd280_0000 | (93 << 5) | 8, 0xd400_0001]),
        // mov r0, #code; mov r7, #1 (exit); svc #0  (A32, valid on v6 and v7)
        "arm" => words_le(&[0xe3a0_0000 | c, 0xe3a0_7001, 0xef00_0000]),
        // li r0, 1 (exit); li r3, code; sc
        "ppc64le" => words_le(&[0x3800_0001, 0x3860_0000 | c, 0x4400_0002]),
        // lghi %r2, code; svc 1 (exit)   (big-endian)
        "s390x" => vec![0xa7, 0x29, 0x00, code, 0x0a, 0x01],
        // addi a0, zero, code; addi a7, zero, 93 (exit); ecall
        "riscv64" => words_le(&[(c << 20) | (10 << 7) | 0x13, (93 << 20) | (17 << 7) | 0x13, 0x73]),
        _ => return None,
    })
}

/// Wraps position-independent-enough machine code (it only uses absolute addresses it is
/// told about) in a one-segment static ELF executable. `code_at` gets the virtual address
/// the code is loaded at and returns the code.
fn elf_executable(target: ElfTarget, code_at: impl FnOnce(u64) -> Vec<u8>) -> Vec<u8> {
    let (ehsize, phsize): (usize, usize) = if target.class64 { (64, 56) } else { (52, 32) };
    let base: u64 = if target.class64 { 0x40_0000 } else { 0x1_0000 };
    let code_off = (ehsize + phsize) as u64;
    let entry = base + code_off;
    let code = code_at(entry);
    let filesz = code_off + code.len() as u64;

    let mut out = Vec::with_capacity(filesz as usize);
    let be = target.big_endian;
    let u16b = |v: u16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let u32b = |v: u32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let u64b = |v: u64| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let addr = |out: &mut Vec<u8>, v: u64| {
        if target.class64 {
            out.extend_from_slice(&u64b(v));
        } else {
            out.extend_from_slice(&u32b(v as u32));
        }
    };

    // e_ident
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F']);
    out.push(if target.class64 { 2 } else { 1 });
    out.push(if be { 2 } else { 1 });
    out.push(1); // EV_CURRENT
    out.push(0); // ELFOSABI_SYSV
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&u16b(2)); // ET_EXEC
    out.extend_from_slice(&u16b(target.machine));
    out.extend_from_slice(&u32b(1)); // e_version
    addr(&mut out, entry); // e_entry
    addr(&mut out, ehsize as u64); // e_phoff
    addr(&mut out, 0); // e_shoff
    out.extend_from_slice(&u32b(target.flags));
    out.extend_from_slice(&u16b(ehsize as u16));
    out.extend_from_slice(&u16b(phsize as u16));
    out.extend_from_slice(&u16b(1)); // e_phnum
    out.extend_from_slice(&u16b(if target.class64 { 64 } else { 40 })); // e_shentsize
    out.extend_from_slice(&u16b(0)); // e_shnum
    out.extend_from_slice(&u16b(0)); // e_shstrndx
    debug_assert_eq!(out.len(), ehsize);

    // PT_LOAD, R+X, the whole file.
    let (pt_load, flags_rx) = (1u32, 5u32);
    if target.class64 {
        out.extend_from_slice(&u32b(pt_load));
        out.extend_from_slice(&u32b(flags_rx));
        out.extend_from_slice(&u64b(0)); // p_offset
        out.extend_from_slice(&u64b(base)); // p_vaddr
        out.extend_from_slice(&u64b(base)); // p_paddr
        out.extend_from_slice(&u64b(filesz));
        out.extend_from_slice(&u64b(filesz));
        out.extend_from_slice(&u64b(0x1_0000)); // p_align (fits 4K and 64K pages)
    } else {
        out.extend_from_slice(&u32b(pt_load));
        out.extend_from_slice(&u32b(0)); // p_offset
        out.extend_from_slice(&u32b(base as u32));
        out.extend_from_slice(&u32b(base as u32));
        out.extend_from_slice(&u32b(filesz as u32));
        out.extend_from_slice(&u32b(filesz as u32));
        out.extend_from_slice(&u32b(flags_rx));
        out.extend_from_slice(&u32b(0x1_0000));
    }
    debug_assert_eq!(out.len() as u64, code_off);
    out.extend_from_slice(&code);
    out
}

/// A minimal static ELF executable for `platform` that calls `exit(PROBE_EXIT)`.
/// Known: linux amd64, 386, arm64, arm/v7, arm/v6, ppc64le, s390x, riscv64.
pub fn probe_elf(platform: &Platform) -> Option<Vec<u8>> {
    let target = elf_target(platform)?;
    let code = exit_code_for(platform, PROBE_EXIT)?;
    Some(elf_executable(target, |_| code))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Platform {
        s.parse().unwrap()
    }

    const ALL: &[&str] = &[
        "linux/amd64",
        "linux/arm64",
        "linux/arm/v7",
        "linux/arm/v6",
        "linux/386",
        "linux/ppc64le",
        "linux/s390x",
        "linux/riscv64",
    ];

    #[test]
    fn probe_headers() {
        for (plat, class, data, machine, flags) in [
            ("linux/amd64", 2u8, 1u8, 62u16, 0u32),
            ("linux/386", 1, 1, 3, 0),
            ("linux/arm64", 2, 1, 183, 0),
            ("linux/arm/v7", 1, 1, 40, 0x0500_0000),
            ("linux/arm/v6", 1, 1, 40, 0x0500_0000),
            ("linux/ppc64le", 2, 1, 21, 2),
            ("linux/s390x", 2, 2, 22, 0),
            ("linux/riscv64", 2, 1, 243, 0),
        ] {
            let elf = probe_elf(&p(plat)).unwrap();
            assert!(elf.len() < 512, "{plat}: {} bytes", elf.len());
            assert_eq!(&elf[..4], b"\x7fELF", "{plat}");
            assert_eq!(elf[4], class, "{plat} class");
            assert_eq!(elf[5], data, "{plat} endianness");
            let be = data == 2;
            let u16at = |o: usize| {
                let b = [elf[o], elf[o + 1]];
                if be { u16::from_be_bytes(b) } else { u16::from_le_bytes(b) }
            };
            let u32at = |o: usize| {
                let b = [elf[o], elf[o + 1], elf[o + 2], elf[o + 3]];
                if be { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }
            };
            assert_eq!(u16at(16), 2, "{plat} ET_EXEC");
            assert_eq!(u16at(18), machine, "{plat} e_machine");
            let flags_off = if class == 2 { 48 } else { 36 };
            assert_eq!(u32at(flags_off), flags, "{plat} e_flags");
            // Matches the binfmt_misc magic/mask it would be registered with.
            let info = arch_info(&p(plat)).unwrap();
            let magic = unescape(info.magic);
            let mask = unescape(info.mask);
            for i in 0..magic.len() {
                assert_eq!(elf[i] & mask[i], magic[i] & mask[i], "{plat} byte {i}");
            }
        }
        assert!(probe_elf(&p("linux/mips64le")).is_none());
        assert!(probe_elf(&p("windows/amd64")).is_none());
    }

    fn unescape(s: &str) -> Vec<u8> {
        s.split(r"\x")
            .filter(|h| !h.is_empty())
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect()
    }

    /// Runs each probe under the host's `qemu-*-static` directly: proves the machine code.
    #[test]
    fn probes_exit_42_under_qemu() {
        let dir = tempfile::tempdir().unwrap();
        for plat in ALL {
            let plat = p(plat);
            let info = arch_info(&plat).unwrap();
            let qemu = format!("/usr/bin/qemu-{}-static", info.qemu);
            if !Path::new(&qemu).exists() {
                eprintln!("skipping {plat}: no {qemu}");
                continue;
            }
            let file = dir.path().join(format!("probe-{}", info.qemu));
            std::fs::write(&file, probe_elf(&plat).unwrap()).unwrap();
            // qemu-user refuses files without execute permission.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
            let mut args = vec![];
            if plat.variant.as_deref() == Some("v6") {
                args = vec!["-cpu", "arm1176"];
            }
            let status = std::process::Command::new(&qemu)
                .args(&args)
                .arg(&file)
                .status()
                .unwrap();
            assert_eq!(status.code(), Some(PROBE_EXIT as i32), "{plat} under {qemu}");
        }
    }
}

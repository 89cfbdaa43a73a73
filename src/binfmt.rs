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
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ImportImageOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use futures_util::StreamExt;
use sha2::Digest;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The exit code every probe executable returns when it runs.
pub const PROBE_EXIT: u8 = 42;

/// The default installer image (`--install <arch>[,<arch>…]`).
pub const DEFAULT_INSTALLER: &str = "tonistiigi/binfmt";

/// Repository of the locally assembled installer images.
pub const INSTALLER_REPOSITORY: &str = "polyarch-binfmt-installer";

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
        "arm64" => words_le(&[
            0xd280_0000 | (c << 5),
            0xd280_0000 | (93 << 5) | 8,
            0xd400_0001,
        ]),
        // mov r0, #code; mov r7, #1 (exit); svc #0  (A32, valid on v6 and v7)
        "arm" => words_le(&[0xe3a0_0000 | c, 0xe3a0_7001, 0xef00_0000]),
        // li r0, 1 (exit); li r3, code; sc
        "ppc64le" => words_le(&[0x3800_0001, 0x3860_0000 | c, 0x4400_0002]),
        // lghi %r2, code; svc 1 (exit)   (big-endian)
        "s390x" => vec![0xa7, 0x29, 0x00, code, 0x0a, 0x01],
        // addi a0, zero, code; addi a7, zero, 93 (exit); ecall
        "riscv64" => words_le(&[
            (c << 20) | (10 << 7) | 0x13,
            (93 << 20) | (17 << 7) | 0x13,
            0x73,
        ]),
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

// ---------------------------------------------------------------------------------------
// The generated installer (x86_64)
// ---------------------------------------------------------------------------------------

/// A tiny x86_64 assembler: just what the installer needs.
struct Asm {
    code: Vec<u8>,
    fixups: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
enum Reg64 {
    Rdi = 0xbf,
    Rsi = 0xbe,
    Rdx = 0xba,
}

impl Asm {
    fn new() -> Self {
        Asm {
            code: vec![],
            fixups: vec![],
            labels: vec![],
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.code.extend_from_slice(b);
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn bind(&mut self, label: usize) {
        self.labels[label] = Some(self.code.len());
    }
    /// `jcc rel32` / `jmp rel32` to a label (`op` is the opcode bytes).
    fn jump(&mut self, op: &[u8], label: usize) {
        self.bytes(op);
        self.fixups.push((self.code.len(), label));
        self.bytes(&[0; 4]);
    }
    fn mov_imm64(&mut self, reg: Reg64, value: u64) {
        self.bytes(&[0x48, reg as u8]);
        self.bytes(&value.to_le_bytes());
    }
    /// `mov e?x, imm32` with a one-byte opcode (`b8`+reg).
    fn mov_imm32(&mut self, op: u8, value: u32) {
        self.bytes(&[op]);
        self.bytes(&value.to_le_bytes());
    }
    fn syscall(&mut self, nr: u32) {
        self.mov_imm32(0xb8, nr); // mov eax, nr
        self.bytes(&[0x0f, 0x05]);
    }
    fn finish(mut self) -> Vec<u8> {
        for (at, label) in std::mem::take(&mut self.fixups) {
            let target = self.labels[label].expect("unbound label") as i64;
            let rel = (target - (at as i64 + 4)) as i32;
            self.code[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        self.code
    }
}

fn installer_code(lines: &[String], data_base: u64) -> (Vec<u8>, Vec<u8>) {
    const SYS_WRITE: u32 = 1;
    const SYS_OPEN: u32 = 2;
    const SYS_CLOSE: u32 = 3;
    const SYS_EXIT: u32 = 60;
    const SYS_MOUNT: u32 = 165;
    const EEXIST: u8 = 17;

    let mut data = vec![];
    let mut put = |bytes: &[u8], nul: bool| {
        let at = data_base + data.len() as u64;
        data.extend_from_slice(bytes);
        if nul {
            data.push(0);
        }
        at
    };
    let fstype = put(b"binfmt_misc", true);
    let target = put(BINFMT_MISC.as_bytes(), true);
    let register = put(format!("{BINFMT_MISC}/register").as_bytes(), true);
    let dot = put(b".", false);
    let entries: Vec<(u64, u32)> = lines
        .iter()
        .map(|l| (put(l.as_bytes(), false), l.len() as u32))
        .collect();

    let mut a = Asm::new();
    let open_fail = a.label();
    let write_fail = a.label();
    // r12 = mount("binfmt_misc", BINFMT_MISC, "binfmt_misc", 0, NULL)
    a.mov_imm64(Reg64::Rdi, fstype);
    a.mov_imm64(Reg64::Rsi, target);
    a.mov_imm64(Reg64::Rdx, fstype);
    a.bytes(&[0x45, 0x31, 0xd2]); // xor r10d, r10d
    a.bytes(&[0x45, 0x31, 0xc0]); // xor r8d, r8d
    a.syscall(SYS_MOUNT);
    a.bytes(&[0x49, 0x89, 0xc4]); // mov r12, rax
    for (addr, len) in entries {
        let next = a.label();
        // r13 = open(register, O_WRONLY)
        a.mov_imm64(Reg64::Rdi, register);
        a.mov_imm32(0xbe, 1); // mov esi, O_WRONLY
        a.bytes(&[0x31, 0xd2]); // xor edx, edx
        a.syscall(SYS_OPEN);
        a.bytes(&[0x48, 0x85, 0xc0]); // test rax, rax
        a.jump(&[0x0f, 0x88], open_fail); // js
        a.bytes(&[0x49, 0x89, 0xc5]); // mov r13, rax
                                      // r14 = write(r13, line, len)
        a.bytes(&[0x4c, 0x89, 0xef]); // mov rdi, r13
        a.mov_imm64(Reg64::Rsi, addr);
        a.mov_imm32(0xba, len); // mov edx, len
        a.syscall(SYS_WRITE);
        a.bytes(&[0x49, 0x89, 0xc6]); // mov r14, rax
                                      // close(r13)
        a.bytes(&[0x4c, 0x89, 0xef]); // mov rdi, r13
        a.syscall(SYS_CLOSE);
        // -EEXIST: already registered, fine; other negative: exit(errno)
        a.bytes(&[0x49, 0x83, 0xfe, EEXIST.wrapping_neg()]); // cmp r14, -17
        a.jump(&[0x0f, 0x84], next); // je
        a.bytes(&[0x4d, 0x85, 0xf6]); // test r14, r14
        a.jump(&[0x0f, 0x88], write_fail); // js
        a.bind(next);
        // write(1, ".", 1): one dot per entry handled
        a.mov_imm32(0xbf, 1); // mov edi, 1
        a.mov_imm64(Reg64::Rsi, dot);
        a.mov_imm32(0xba, 1); // mov edx, 1
        a.syscall(SYS_WRITE);
    }
    a.bytes(&[0x31, 0xff]); // xor edi, edi
    a.syscall(SYS_EXIT);
    // write failed: exit(-r14)
    a.bind(write_fail);
    a.bytes(&[0x4c, 0x89, 0xf7]); // mov rdi, r14
    a.bytes(&[0x48, 0xf7, 0xdf]); // neg rdi
    a.syscall(SYS_EXIT);
    // open failed: exit(128 + mount errno) when mount failed, else exit(100)
    a.bind(open_fail);
    let do_exit = a.label();
    a.mov_imm32(0xbf, 100); // mov edi, 100
    a.bytes(&[0x4d, 0x85, 0xe4]); // test r12, r12
    a.jump(&[0x0f, 0x89], do_exit); // jns
    a.bytes(&[0x4c, 0x89, 0xe7]); // mov rdi, r12
    a.bytes(&[0x48, 0xf7, 0xdf]); // neg rdi
    a.bytes(&[0x48, 0x81, 0xc7, 0x80, 0, 0, 0]); // add rdi, 128
    a.bind(do_exit);
    a.syscall(SYS_EXIT);
    (a.finish(), data)
}

/// A static x86_64 executable that mounts binfmt_misc (ignoring failure, e.g. when it is
/// already mounted) and writes each line to `register`. Exit status: 0 on success (an
/// entry that already exists counts as success); the errno of the first failed
/// registration (EINVAL: bad line, ENOENT: interpreter missing); 128+errno of the mount
/// when `register` cannot be opened after a failed mount; 100 when it cannot be opened
/// although the mount worked. It prints one `.` per entry handled.
pub fn installer_elf(lines: &[String]) -> Vec<u8> {
    let target = ElfTarget {
        class64: true,
        big_endian: false,
        machine: 62,
        flags: 0,
    };
    elf_executable(target, |entry| {
        // Instruction sizes do not depend on addresses: measure, then place data after code.
        let (code, _) = installer_code(lines, 0);
        let (code, data) = installer_code(lines, entry + code.len() as u64);
        [code, data].concat()
    })
}

/// Explains an installer exit status.
fn installer_exit_meaning(code: i64) -> String {
    let errno = |e: i64| match e {
        1 => "EPERM (operation not permitted)".to_string(),
        2 => "ENOENT (interpreter not found)".to_string(),
        13 => "EACCES (permission denied)".to_string(),
        22 => "EINVAL (invalid entry)".to_string(),
        30 => "EROFS (read-only file system)".to_string(),
        e => format!("errno {e}"),
    };
    match code {
        0 => "success".into(),
        100 => format!("{BINFMT_MISC}/register could not be opened"),
        c if c > 128 => format!(
            "binfmt_misc could not be mounted ({}) and is not available",
            errno(c - 128)
        ),
        c => format!("registration failed: {}", errno(c)),
    }
}

// ---------------------------------------------------------------------------------------
// Detection and registration through the engine
// ---------------------------------------------------------------------------------------

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

struct RunOutcome {
    exit: Option<i64>,
    /// A create or start refusal.
    refused: Option<String>,
    logs: String,
}

/// Emulation detection and registration for one run on one engine: probe results and
/// probe images are cached; call [`Emulation::cleanup`] at the end of the run (dropping
/// it without does a best-effort cleanup in the background).
pub struct Emulation {
    engine: Engine,
    run_id: String,
    cache: Mutex<HashMap<Platform, Runnable>>,
    details: Mutex<HashMap<Platform, String>>,
    /// Probe image tags built for this run.
    images: tokio::sync::Mutex<HashMap<Platform, String>>,
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

fn tar_context(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .map_err(|e| Error::io(*path, e))?;
    }
    builder
        .into_inner()
        .map_err(|e| Error::io("build context", e))
}

impl Emulation {
    pub fn new(engine: Engine) -> Self {
        Emulation {
            engine,
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
        let elf = probe_elf(platform).ok_or_else(|| {
            Error::Emulation(format!("polyarch has no probe executable for {platform}"))
        })?;
        let tag = format!("polyarch-probe:{}-{}", self.run_id, slug(platform));
        self.load_scratch_image(&tag, platform, &[("probe", &elf, 0o755)], "/probe")
            .await?;
        images.insert(platform.clone(), tag.clone());
        Ok(tag)
    }

    /// Loads a FROM-scratch image of one layer holding `files` (path, bytes, mode), as
    /// `docker load` does: no builder involved, a fraction of a classic build's time.
    async fn load_scratch_image(
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
            item.map_err(|e| Error::Engine(format!("loading {tag} into the engine: {e}")))?;
        }
        Ok(())
    }

    /// Creates, starts and waits for a container, then removes it.
    async fn run(
        &self,
        what: &str,
        image: &str,
        platform: Option<&Platform>,
        cmd: Option<Vec<String>>,
        host_config: HostConfig,
        timeout: Duration,
    ) -> Result<RunOutcome> {
        let docker = &self.engine.docker;
        let name = self.container_name(what);
        let mut options = CreateContainerOptionsBuilder::default().name(&name);
        if let Some(p) = platform {
            options = options.platform(&p.to_string());
        }
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd,
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                ..host_config
            }),
            ..Default::default()
        };
        if let Err(e) = docker.create_container(Some(options.build()), body).await {
            return Ok(RunOutcome {
                exit: None,
                refused: Some(e.to_string()),
                logs: String::new(),
            });
        }
        let result = self.start_and_wait(&name, timeout).await;
        let logs = self.logs(&name).await;
        let _ = docker
            .remove_container(
                &name,
                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
            )
            .await;
        let (exit, refused) = result?;
        Ok(RunOutcome {
            exit,
            refused,
            logs,
        })
    }

    async fn start_and_wait(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Option<i64>, Option<String>)> {
        let docker = &self.engine.docker;
        if let Err(e) = docker.start_container(name, None).await {
            return Ok((None, Some(e.to_string())));
        }
        let mut wait = docker.wait_container(
            name,
            Some(
                WaitContainerOptionsBuilder::default()
                    .condition("not-running")
                    .build(),
            ),
        );
        let waited = tokio::time::timeout(timeout, wait.next())
            .await
            .map_err(|_| {
                Error::Engine(format!("container {name} did not exit within {timeout:?}"))
            })?;
        match waited {
            Some(Ok(r)) => Ok((Some(r.status_code), None)),
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok((Some(code), None)),
            Some(Err(e)) => Err(Error::Engine(format!("waiting for {name}: {e}"))),
            None => Err(Error::Engine(format!("waiting for {name}: no status"))),
        }
    }

    async fn logs(&self, name: &str) -> String {
        let mut out = String::new();
        let mut stream = self.engine.docker.logs(
            name,
            Some(
                LogsOptionsBuilder::default()
                    .stdout(true)
                    .stderr(true)
                    .build(),
            ),
        );
        while let Some(Ok(chunk)) = stream.next().await {
            out.push_str(&chunk.to_string());
        }
        out
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
            (None, Some(e)) => Err(Error::Engine(format!(
                "running the {platform} probe container: {e}"
            ))),
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
            let foreign: Vec<&Platform> = platforms
                .iter()
                .filter(|p| !natively_compatible(native, p))
                .collect();
            if !foreign.is_empty() {
                return Err(never_error(&foreign, native));
            }
        }
        let mut statuses: Vec<(Platform, Option<EmulationStatus>)> = vec![];
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
        let missing: Vec<Platform> = statuses
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(p, _)| p.clone())
            .collect();
        if mode == BinfmtMode::Never {
            let emulated: Vec<&Platform> = statuses
                .iter()
                .filter(|(_, s)| !matches!(s, Some(EmulationStatus::Native)))
                .map(|(p, _)| p)
                .collect();
            if !emulated.is_empty() {
                return Err(never_error(&emulated, native));
            }
        }
        if !missing.is_empty() {
            let names = join(&missing);
            match mode {
                BinfmtMode::Never => unreachable!("handled above"),
                BinfmtMode::Require => {
                    return Err(Error::Emulation(format!(
                        "{names}: the engine ({native}) cannot run binaries for {names} and \
                         no QEMU emulator is registered for it; binfmt is `require`, so \
                         polyarch does not register one: register it yourself (e.g. `docker \
                         run --privileged --rm {DEFAULT_INSTALLER} --install {}`), set \
                         `binfmt: auto`, or add a native builder for it under `builders:`",
                        missing
                            .iter()
                            .filter_map(arch_info)
                            .map(|a| a.installer_name)
                            .collect::<Vec<_>>()
                            .join(",")
                    )))
                }
                BinfmtMode::Auto => {
                    let unknown: Vec<&Platform> =
                        missing.iter().filter(|p| arch_info(p).is_none()).collect();
                    if !unknown.is_empty() {
                        return Err(Error::Emulation(format!(
                            "{}: polyarch knows no QEMU emulator for it; add a native builder \
                             for it under `builders:`",
                            join(&unknown)
                        )));
                    }
                    let how = self.register(&missing, installer_image, reporter).await?;
                    for p in &missing {
                        self.forget(p);
                    }
                    let mut still = vec![];
                    for (p, s) in statuses.iter_mut() {
                        if s.is_none() {
                            match self.probe(p).await? {
                                Runnable::NotRunnable => still.push(p.clone()),
                                _ => {
                                    *s = Some(EmulationStatus::Emulated {
                                        registered_now: true,
                                    })
                                }
                            }
                        }
                    }
                    if !still.is_empty() {
                        let why = still
                            .iter()
                            .filter_map(|p| self.probe_detail(p).map(|d| format!("{p}: {d}")))
                            .collect::<Vec<_>>()
                            .join("; ");
                        return Err(Error::Emulation(format!(
                            "{}: registered QEMU emulators ({how:?}) but the probe still cannot \
                             run ({why}); an existing binfmt_misc entry without flag F may shadow them \
                             (check {BINFMT_MISC}/qemu-* on the engine host and remove stale \
                             ones with `echo -1 > {BINFMT_MISC}/<name>`), or add a native \
                             builder under `builders:`",
                            join(&still)
                        )));
                    }
                }
            }
        }
        Ok(statuses
            .into_iter()
            .map(|(p, s)| (p, s.expect("all resolved")))
            .collect())
    }

    /// Registers QEMU emulators for `platforms` on the engine's kernel.
    /// Uses `installer_image` (default [`DEFAULT_INSTALLER`]) when the engine has it or can
    /// pull it, else an installer assembled from the client host's qemu-user-static files.
    /// Since Linux 6.7 binfmt_misc can be a per-namespace instance that lives only while
    /// mounted: on a sandboxed host, what the installer container registers into its own
    /// mount vanishes with the container. When the engine is local and the host has no
    /// binfmt_misc mounted, mount it here (as root) so the registrations persist.
    fn keep_binfmt_instance_alive(&self, reporter: &dyn Reporter) {
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

    pub async fn register(
        &self,
        platforms: &[Platform],
        installer_image: Option<&str>,
        reporter: &dyn Reporter,
    ) -> Result<Registration> {
        let arches: Vec<ArchInfo> = {
            let mut v: Vec<ArchInfo> = vec![];
            for p in platforms {
                let a = arch_info(p).ok_or_else(|| {
                    Error::Emulation(format!("{p}: polyarch knows no QEMU emulator for it"))
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
                    Err(e) => e.to_string(),
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
                .map_err(|e| match e {
                    Error::Emulation(m) => Error::Emulation(format!(
                        "{names}: cannot register QEMU emulators: {image}: {image_error}; {m}"
                    )),
                    other => other,
                })?;
        Ok(Registration::Assembled { image, privileged })
    }

    async fn have_or_pull(&self, image: &str, reporter: &dyn Reporter) -> Result<(), String> {
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
                item.map_err(|e| format!("cannot pull it: {e}"))?;
            }
            Ok::<(), String>(())
        };
        tokio::time::timeout(Duration::from_secs(60), pull)
            .await
            .map_err(|_| "pulling it timed out".to_string())??;
        docker
            .inspect_image(image)
            .await
            .map(|_| ())
            .map_err(|e| format!("pulled but not found: {e}"))
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
        Err(Error::Emulation(format!(
            "installer {image} failed: {}",
            failures.join("; ")
        )))
    }

    async fn register_assembled(
        &self,
        arches: &[ArchInfo],
        reporter: &dyn Reporter,
    ) -> Result<(String, bool)> {
        let native = &self.engine.native;
        let host = Platform::linux(std::env::consts::ARCH, None);
        if native.os != "linux" || native.architecture != "amd64" {
            return Err(Error::Emulation(format!(
                "the assembled installer only supports linux/amd64 engines (this one is \
                 {native}); make an installer image available to the engine (`binfmt_image:`)"
            )));
        }
        if host.architecture != native.architecture {
            return Err(Error::Emulation(format!(
                "this host ({host}) differs from the engine ({native}), so its qemu-user-static \
                 binaries cannot run there; make an installer image available to the engine"
            )));
        }
        let mut files: Vec<(String, Vec<u8>)> = vec![];
        let mut lines = vec![];
        for a in arches {
            let path = PathBuf::from(a.interpreter());
            let data = std::fs::read(&path).map_err(|e| {
                Error::Emulation(format!(
                    "{}: {e}; install qemu-user-static (Debian/Ubuntu: `apt-get install \
                     qemu-user-static`)",
                    path.display()
                ))
            })?;
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

    /// Removes the probe images built during this run.
    pub async fn cleanup(&self) -> Result<()> {
        let tags: Vec<String> = self.images.lock().await.drain().map(|(_, t)| t).collect();
        let mut errors = vec![];
        for tag in tags {
            if let Err(e) = self
                .engine
                .docker
                .remove_image(
                    &tag,
                    Some(RemoveImageOptionsBuilder::default().force(true).build()),
                    None,
                )
                .await
            {
                errors.push(format!("{tag}: {e}"));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Engine(format!(
                "removing probe images: {}",
                errors.join("; ")
            )))
        }
    }
}

impl Drop for Emulation {
    fn drop(&mut self) {
        let tags: Vec<String> = self.images.get_mut().drain().map(|(_, t)| t).collect();
        if tags.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let docker = self.engine.docker.clone();
            handle.spawn(async move {
                for tag in tags {
                    let _ = docker
                        .remove_image(
                            &tag,
                            Some(RemoveImageOptionsBuilder::default().force(true).build()),
                            None,
                        )
                        .await;
                }
            });
        }
    }
}

fn tail(logs: &str) -> Option<String> {
    let lines: Vec<&str> = logs
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.chars().any(|c| c != '.'))
        .collect();
    (!lines.is_empty()).then(|| lines[lines.len().saturating_sub(3)..].join(" | "))
}

fn join<P: std::borrow::Borrow<Platform>>(platforms: &[P]) -> String {
    platforms
        .iter()
        .map(|p| p.borrow().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn never_error(platforms: &[&Platform], native: &Platform) -> Error {
    let names = join(platforms);
    Error::Emulation(format!(
        "{names}: the engine is {native}, so building {names} needs QEMU emulation, but binfmt \
         is `never`; allow emulation with `binfmt: auto`, or add a native builder for {names} \
         under `builders:`"
    ))
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
    fn installer_is_an_x86_64_executable() {
        let line = AARCH64.register_line(&AARCH64.interpreter());
        assert_eq!(
            line,
            format!(
                ":qemu-aarch64:M::{}:{}:/usr/bin/qemu-aarch64-static:POCF",
                AARCH64.magic, AARCH64.mask
            )
        );
        let elf = installer_elf(&[line.clone(), ARM.register_line(&ARM.interpreter())]);
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 62);
        let text = String::from_utf8_lossy(&elf);
        assert!(text.contains(&line));
        assert!(text.contains("/proc/sys/fs/binfmt_misc/register"));
        assert!(installer_exit_meaning(129).contains("EPERM"));
    }

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
                if be {
                    u16::from_be_bytes(b)
                } else {
                    u16::from_le_bytes(b)
                }
            };
            let u32at = |o: usize| {
                let b = [elf[o], elf[o + 1], elf[o + 2], elf[o + 3]];
                if be {
                    u32::from_be_bytes(b)
                } else {
                    u32::from_le_bytes(b)
                }
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
            if !std::path::Path::new(&qemu).exists() {
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
            assert_eq!(
                status.code(),
                Some(PROBE_EXIT as i32),
                "{plat} under {qemu}"
            );
        }
    }
}

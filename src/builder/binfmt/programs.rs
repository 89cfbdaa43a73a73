//! Minimal static ELF programs generated per architecture: the probe that exits with
//! [`PROBE_EXIT`] and the binfmt_misc installer, with the few instructions they need.

use super::*;
use crate::base::elf::{self, ElfClass, Endian};

#[derive(Clone, Copy)]
struct ElfTarget {
    class64: bool,
    big_endian: bool,
    machine: u16,
    flags: u32,
}

/// What the generated program's ELF header says: the platform's machine, class and byte
/// order, plus the ABI flags the kernel checks.
fn elf_target(platform: &Platform) -> Option<ElfTarget> {
    let (machine, class, endian) = elf::expected_machine(platform)?;
    let flags = match (platform.architecture.as_str(), platform.variant.as_deref()) {
        // EABI version 5; the A32 code below needs v6 or later.
        ("arm", Some("v6" | "v7") | None) => 0x0500_0000,
        ("arm", _) => return None,
        // ELFv2 ABI.
        ("ppc64le", _) => 2,
        _ => 0,
    };
    Some(ElfTarget {
        class64: class == ElfClass::Elf64,
        big_endian: endian == Endian::Big,
        machine,
        flags,
    })
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
    let places = Places {
        register,
        dot,
        open_fail,
        write_fail,
    };
    for (addr, len) in entries {
        register_entry(&mut a, &places, addr, len);
    }
    exit_paths(&mut a, &places);
    (a.finish(), data)
}

/// Where the installer's code jumps to and the data it passes.
struct Places {
    register: u64,
    dot: u64,
    open_fail: usize,
    write_fail: usize,
}

const SYS_WRITE: u32 = 1;
const SYS_OPEN: u32 = 2;
const SYS_CLOSE: u32 = 3;
const SYS_EXIT: u32 = 60;
const SYS_MOUNT: u32 = 165;

/// Writes one registration line (`len` bytes at `addr`) to `register`; an entry that
/// already exists (-EEXIST) is fine, any other failure jumps to `write_fail`.
fn register_entry(a: &mut Asm, places: &Places, addr: u64, len: u32) {
    const EEXIST: u8 = 17;
    let Places {
        register,
        dot,
        open_fail,
        write_fail,
    } = *places;
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

/// Success, and the exits that carry what failed.
fn exit_paths(a: &mut Asm, places: &Places) {
    a.bytes(&[0x31, 0xff]); // xor edi, edi
    a.syscall(SYS_EXIT);
    // write failed: exit(-r14)
    a.bind(places.write_fail);
    a.bytes(&[0x4c, 0x89, 0xf7]); // mov rdi, r14
    a.bytes(&[0x48, 0xf7, 0xdf]); // neg rdi
    a.syscall(SYS_EXIT);
    // open failed: exit(128 + mount errno) when mount failed, else exit(100)
    a.bind(places.open_fail);
    let do_exit = a.label();
    a.mov_imm32(0xbf, 100); // mov edi, 100
    a.bytes(&[0x4d, 0x85, 0xe4]); // test r12, r12
    a.jump(&[0x0f, 0x89], do_exit); // jns
    a.bytes(&[0x4c, 0x89, 0xe7]); // mov rdi, r12
    a.bytes(&[0x48, 0xf7, 0xdf]); // neg rdi
    a.bytes(&[0x48, 0x81, 0xc7, 0x80, 0, 0, 0]); // add rdi, 128
    a.bind(do_exit);
    a.syscall(SYS_EXIT);
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
        machine: elf::EM_X86_64,
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
pub(super) fn installer_exit_meaning(code: i64) -> String {
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

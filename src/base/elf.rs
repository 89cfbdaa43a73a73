//! ELF identification: which machine, class and byte order a binary is for, whether it
//! needs a loader, and which of them a platform's binaries have.

use crate::base::platform::Platform;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfClass {
    Elf32,
    Elf64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linkage {
    /// No PT_INTERP: the kernel runs it directly (static or static-pie).
    Static,
    /// PT_INTERP present; the loader path when it lies within the bytes read.
    Dynamic { interpreter: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfIdent {
    pub class: ElfClass,
    pub endian: Endian,
    pub machine: u16,
    /// `e_type` (2 = EXEC, 3 = DYN).
    pub elf_type: u16,
    /// `None` when the program headers lie beyond the bytes read.
    pub linkage: Option<Linkage>,
}

pub const EM_386: u16 = 3;
pub const EM_MIPS: u16 = 8;
pub const EM_PPC: u16 = 20;
pub const EM_PPC64: u16 = 21;
pub const EM_S390: u16 = 22;
pub const EM_ARM: u16 = 40;
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;
pub const EM_RISCV: u16 = 243;
pub const EM_LOONGARCH: u16 = 258;

/// Human name and constant name of an ELF machine.
pub fn machine_name(machine: u16) -> (String, String) {
    let (human, constant) = match machine {
        EM_386 => ("x86", "EM_386"),
        EM_MIPS => ("MIPS", "EM_MIPS"),
        EM_PPC => ("PowerPC", "EM_PPC"),
        EM_PPC64 => ("PowerPC64", "EM_PPC64"),
        EM_S390 => ("IBM S/390", "EM_S390"),
        EM_ARM => ("ARM", "EM_ARM"),
        EM_X86_64 => ("x86-64", "EM_X86_64"),
        EM_AARCH64 => ("AArch64", "EM_AARCH64"),
        EM_RISCV => ("RISC-V", "EM_RISCV"),
        EM_LOONGARCH => ("LoongArch", "EM_LOONGARCH"),
        2 => ("SPARC", "EM_SPARC"),
        43 => ("SPARC V9", "EM_SPARCV9"),
        other => return (format!("machine {other}"), format!("e_machine={other}")),
    };
    (human.to_string(), constant.to_string())
}

fn bits(class: ElfClass) -> u8 {
    match class {
        ElfClass::Elf32 => 32,
        ElfClass::Elf64 => 64,
    }
}

fn order(endian: Endian) -> &'static str {
    match endian {
        Endian::Little => "LSB",
        Endian::Big => "MSB",
    }
}

/// `x86-64 (EM_X86_64, 64-bit LSB)`.
fn describe(machine: u16, class: ElfClass, endian: Endian) -> String {
    let (human, constant) = machine_name(machine);
    format!(
        "{human} ({constant}, {}-bit {})",
        bits(class),
        order(endian)
    )
}

impl ElfIdent {
    pub fn describe(&self) -> String {
        describe(self.machine, self.class, self.endian)
    }

    /// The machine alone where that is unambiguous (`x86-64`), else with class and byte order.
    pub fn short(&self) -> String {
        let (human, _) = machine_name(self.machine);
        let (e_human, e_class, e_endian) = (human, self.class, self.endian);
        // Name the class/byte order only where the machine name alone is ambiguous.
        match (self.machine, e_class, e_endian) {
            (EM_X86_64, ElfClass::Elf64, Endian::Little)
            | (EM_AARCH64, ElfClass::Elf64, Endian::Little)
            | (EM_386, ElfClass::Elf32, Endian::Little) => e_human,
            _ => format!("{e_human} {}-bit {}", bits(e_class), order(e_endian)),
        }
    }
}

/// The ELF machine, class and byte order binaries for `platform` have, where known.
pub fn expected_machine(platform: &Platform) -> Option<(u16, ElfClass, Endian)> {
    use ElfClass::*;
    use Endian::*;
    if platform.os != "linux" {
        return None;
    }
    Some(match platform.architecture.as_str() {
        "amd64" => (EM_X86_64, Elf64, Little),
        "386" => (EM_386, Elf32, Little),
        "arm64" => (EM_AARCH64, Elf64, Little),
        "arm" => (EM_ARM, Elf32, Little),
        "ppc64le" => (EM_PPC64, Elf64, Little),
        "ppc64" => (EM_PPC64, Elf64, Big),
        "s390x" => (EM_S390, Elf64, Big),
        "riscv64" => (EM_RISCV, Elf64, Little),
        "mips64le" => (EM_MIPS, Elf64, Little),
        "mips64" => (EM_MIPS, Elf64, Big),
        "mipsle" => (EM_MIPS, Elf32, Little),
        "mips" => (EM_MIPS, Elf32, Big),
        "loong64" => (EM_LOONGARCH, Elf64, Little),
        _ => return None,
    })
}

/// [`ElfIdent::short`] of the binaries `platform` runs.
pub fn expected_short(platform: &Platform) -> Option<String> {
    expected_machine(platform).map(|(machine, class, endian)| {
        ElfIdent {
            class,
            endian,
            machine,
            elf_type: 2,
            linkage: None,
        }
        .short()
    })
}

fn read_u16(b: &[u8], at: usize, endian: Endian) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(match endian {
        Endian::Little => u16::from_le_bytes(s),
        Endian::Big => u16::from_be_bytes(s),
    })
}

fn read_u32(b: &[u8], at: usize, endian: Endian) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(match endian {
        Endian::Little => u32::from_le_bytes(s),
        Endian::Big => u32::from_be_bytes(s),
    })
}

fn read_u64(b: &[u8], at: usize, endian: Endian) -> Option<u64> {
    let s: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(match endian {
        Endian::Little => u64::from_le_bytes(s),
        Endian::Big => u64::from_be_bytes(s),
    })
}

/// Parses the ELF identification and header from a file's first bytes. `None` unless the
/// bytes start with the ELF magic and carry a valid class, byte order and `e_machine`.
pub fn elf_machine(header: &[u8]) -> Option<ElfIdent> {
    if header.len() < 20 || !header.starts_with(b"\x7fELF") {
        return None;
    }
    let class = match header[4] {
        1 => ElfClass::Elf32,
        2 => ElfClass::Elf64,
        _ => return None,
    };
    let endian = match header[5] {
        1 => Endian::Little,
        2 => Endian::Big,
        _ => return None,
    };
    let elf_type = read_u16(header, 16, endian)?;
    let machine = read_u16(header, 18, endian)?;
    Some(ElfIdent {
        class,
        endian,
        machine,
        elf_type,
        linkage: linkage(header, class, endian),
    })
}

pub const PT_INTERP: u32 = 3;

fn linkage(b: &[u8], class: ElfClass, endian: Endian) -> Option<Linkage> {
    let (phoff, phentsize, phnum, min_entsize) = match class {
        ElfClass::Elf64 => (
            read_u64(b, 32, endian)?,
            read_u16(b, 54, endian)?,
            read_u16(b, 56, endian)?,
            56,
        ),
        ElfClass::Elf32 => (
            u64::from(read_u32(b, 28, endian)?),
            read_u16(b, 42, endian)?,
            read_u16(b, 44, endian)?,
            32,
        ),
    };
    // PN_XNUM: the real count is in section 0, which we do not have.
    if phnum == 0xffff || phentsize < min_entsize {
        return None;
    }
    let phoff = usize::try_from(phoff).ok()?;
    let entsize = usize::from(phentsize);
    let end = phoff.checked_add(entsize.checked_mul(usize::from(phnum))?)?;
    if end > b.len() {
        return None;
    }
    for i in 0..usize::from(phnum) {
        let at = phoff + i * entsize;
        if read_u32(b, at, endian)? != PT_INTERP {
            continue;
        }
        let (offset, filesz) = match class {
            ElfClass::Elf64 => (read_u64(b, at + 8, endian)?, read_u64(b, at + 32, endian)?),
            ElfClass::Elf32 => (
                u64::from(read_u32(b, at + 4, endian)?),
                u64::from(read_u32(b, at + 16, endian)?),
            ),
        };
        let interpreter = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(filesz).ok())
            .and_then(|(o, n)| b.get(o..o.checked_add(n)?))
            .map(|s| {
                let s = s.split(|&c| c == 0).next().unwrap_or_default();
                String::from_utf8_lossy(s).into_owned()
            })
            .filter(|s| !s.is_empty());
        return Some(Linkage::Dynamic { interpreter });
    }
    Some(Linkage::Static)
}

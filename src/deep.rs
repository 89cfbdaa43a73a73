//! `verify --deep`: does each platform's entrypoint binary match the platform?
//!
//! An `arm64` entry whose entrypoint is an x86-64 binary dies with `exec format error` on
//! arm64 nodes. [`inspect`] streams an image's layers once each, in order, building an
//! in-memory index of the merged filesystem (never extracting, never holding whole files),
//! resolves the command the way Docker/runc would, and reads the ELF header of the file
//! that would be executed (following `#!` interpreters and the ELF loader).
//!
//! Layers may be given decompressed or gzip-compressed: the gzip magic is detected.
//! zstd-compressed layers are reported as [`Finding::Unreadable`].

use crate::error::one_line;
use crate::platform::Platform;
use crate::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};

/// Bytes kept of each regular file with an exec bit: ELF header, program headers, PT_INTERP.
const EXEC_PREFIX: u64 = 4096;
/// Bytes kept of other regular files: enough for a `#!` line (Linux reads 256).
const OTHER_PREFIX: u64 = 256;
/// Overall cap on retained prefixes.
pub const MAX_RETAINED: usize = 64 * 1024 * 1024;
/// Symlinks followed while resolving one path, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// Nested `#!` interpreters followed, as Linux's binfmt recursion limit.
const MAX_SCRIPT_DEPTH: usize = 4;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepReport {
    /// The resolved path in the image of the file that would be executed (the script for
    /// `#!` scripts); when it cannot be resolved, argv0 as the config spells it.
    pub executable: Option<String>,
    pub finding: Finding,
    /// One line, for humans.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The executable (or its `#!` interpreter, and its ELF loader when present) is an ELF
    /// for the platform's machine, class and byte order.
    Match,
    /// The executable, its interpreter or its loader is an ELF for another machine.
    BinaryMismatch { found: String },
    /// argv0 (or a PATH lookup of it) does not resolve to a file in the image.
    MissingEntrypoint,
    /// The config has neither Entrypoint nor Cmd.
    NoEntrypoint,
    /// A `#!` interpreter, or a dynamic ELF's PT_INTERP loader, is missing from the image.
    InterpreterMissing { interpreter: String },
    /// The executable is neither an ELF nor a `#!` script.
    NotElf,
    /// Could not judge: malformed layers or config, truncated ELF, the retention cap, an
    /// unsupported compression or a platform without a known ELF machine.
    Unreadable,
}

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

    fn short(&self) -> String {
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

fn expected_short(platform: &Platform) -> Option<String> {
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

const PT_INTERP: u32 = 3;

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

// ---------------------------------------------------------------------------------------
// The merged filesystem index.

#[derive(Debug, Clone)]
enum Node {
    Dir,
    File {
        mode: u32,
        size: u64,
        /// `None` when the retention cap was reached before this file.
        head: Option<Vec<u8>>,
    },
    Symlink(String),
    Other(&'static str),
}

static IMPLICIT_DIR: Node = Node::Dir;

struct Fs {
    /// Cap on retained prefixes ([`MAX_RETAINED`] outside tests).
    cap: usize,
    /// Normalised paths (`usr/bin/env`, no leading `/`) to nodes; the root is implicit.
    nodes: BTreeMap<String, Node>,
    retained: usize,
}

/// `./usr//bin/` → `usr/bin`; `None` for entries with `..` components or for the root.
fn normalize(path: &str) -> Option<String> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[derive(Debug)]
enum ResolveError {
    NotFound(String),
    NotDir(String),
    Loop,
}

impl ResolveError {
    fn describe(&self, path: &str) -> String {
        match self {
            ResolveError::NotFound(at)
                if at.trim_start_matches('/') == path.trim_start_matches('/') =>
            {
                format!("{path} does not exist in the image")
            }
            ResolveError::NotFound(at) => {
                format!("{path} does not exist in the image (/{at} is missing)")
            }
            ResolveError::NotDir(at) => {
                format!("{path} does not exist in the image (/{at} is not a directory)")
            }
            ResolveError::Loop => {
                format!("{path}: too many levels of symbolic links (more than {MAX_SYMLINKS})")
            }
        }
    }
}

impl Fs {
    fn take_prefix(&mut self, limit: u64) -> bool {
        let limit = limit as usize;
        if self.retained.saturating_add(limit) > self.cap {
            return false;
        }
        self.retained += limit;
        true
    }

    fn has_children(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.nodes
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    fn remove_subtree(&mut self, path: &str, include_self: bool) {
        if include_self {
            self.nodes.remove(path);
        }
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{path}/")
        };
        let doomed: Vec<String> = self
            .nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for key in doomed {
            self.nodes.remove(&key);
        }
    }

    /// Reads one layer tar, then applies its whiteouts to the lower layers and merges it.
    fn apply_layer(&mut self, reader: impl Read) -> io::Result<()> {
        let mut archive = tar::Archive::new(reader);
        let mut upper: BTreeMap<String, Node> = BTreeMap::new();
        let mut whiteouts = Vec::new();
        let mut opaques = Vec::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let raw = entry.path_bytes();
            let Some(path) = normalize(&String::from_utf8_lossy(&raw)) else {
                continue;
            };
            let (dir, name) = split_parent(&path);
            if name == ".wh..wh..opq" {
                opaques.push(dir.to_string());
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                if !hidden.is_empty() {
                    whiteouts.push(join(dir, hidden));
                }
                continue;
            }
            use tar::EntryType as T;
            let kind = entry.header().entry_type();
            let node = match kind {
                T::Regular | T::Continuous | T::GNUSparse => {
                    let mode = entry.header().mode().unwrap_or(0);
                    let size = entry.size();
                    let limit = if mode & 0o111 != 0 {
                        EXEC_PREFIX
                    } else {
                        OTHER_PREFIX
                    }
                    .min(size);
                    let head = if self.take_prefix(limit) {
                        let mut head = Vec::with_capacity(limit as usize);
                        (&mut entry).take(limit).read_to_end(&mut head)?;
                        Some(head)
                    } else {
                        None
                    };
                    Node::File { mode, size, head }
                }
                T::Directory => Node::Dir,
                T::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    Node::Symlink(target)
                }
                T::Link => {
                    // A hard link shares the content its target had when it was linked.
                    let target = entry
                        .link_name_bytes()
                        .and_then(|t| normalize(&String::from_utf8_lossy(&t)));
                    match target
                        .as_ref()
                        .and_then(|t| upper.get(t).or_else(|| self.nodes.get(t)))
                    {
                        Some(node) => node.clone(),
                        None => continue,
                    }
                }
                T::Char => Node::Other("a character device"),
                T::Block => Node::Other("a block device"),
                T::Fifo => Node::Other("a FIFO"),
                _ => continue,
            };
            upper.insert(path, node);
        }
        for path in whiteouts {
            self.remove_subtree(&path, true);
        }
        for dir in opaques {
            self.remove_subtree(&dir, false);
        }
        for (path, node) in upper {
            if !matches!(node, Node::Dir) {
                // A non-directory in an upper layer hides a lower directory's contents.
                self.remove_subtree(&path, false);
            } else if matches!(self.nodes.get(&path), Some(Node::Dir)) {
                continue;
            }
            self.nodes.insert(path, node);
        }
        Ok(())
    }

    /// Resolves `path` (relative ones against `cwd`) inside the image root the way the
    /// kernel does after chroot: `..` and absolute symlink targets are clamped to the root.
    /// Returns the resolved absolute path and its node.
    fn resolve(&self, cwd: &str, path: &str) -> std::result::Result<(String, &Node), ResolveError> {
        let mut queue: VecDeque<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let mut stack: Vec<String> = if path.starts_with('/') {
            Vec::new()
        } else {
            cwd.split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .map(str::to_string)
                .collect()
        };
        let mut hops = 0;
        while let Some(part) = queue.pop_front() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            let candidate = join(&stack.join("/"), &part);
            let last = queue.is_empty();
            match self.nodes.get(&candidate) {
                Some(Node::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(ResolveError::Loop);
                    }
                    if target.is_empty() {
                        return Err(ResolveError::NotFound(candidate));
                    }
                    if target.starts_with('/') {
                        stack.clear();
                    }
                    for p in target.split('/').filter(|p| !p.is_empty()).rev() {
                        queue.push_front(p.to_string());
                    }
                }
                Some(Node::Dir) => stack.push(part),
                Some(_) if last => stack.push(part),
                Some(_) => return Err(ResolveError::NotDir(candidate)),
                None if !last && self.has_children(&candidate) => stack.push(part),
                None => return Err(ResolveError::NotFound(candidate)),
            }
        }
        let key = stack.join("/");
        let node = if key.is_empty() {
            &IMPLICIT_DIR
        } else {
            match self.nodes.get(&key) {
                Some(node) => node,
                None => &IMPLICIT_DIR,
            }
        };
        Ok((format!("/{key}"), node))
    }
}

// ---------------------------------------------------------------------------------------
// The command.

struct Command {
    argv: Vec<String>,
    path: String,
    cwd: String,
}

fn string_list(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        // Some old configs carry a string; Docker would run it through a shell.
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => {
            vec!["/bin/sh".into(), "-c".into(), s.clone()]
        }
        _ => Vec::new(),
    }
}

fn command(config: &[u8]) -> std::result::Result<Command, String> {
    let value: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| format!("image config is not JSON: {e}"))?;
    let c = value.get("config");
    let entrypoint = string_list(c.and_then(|c| c.get("Entrypoint")));
    let cmd = string_list(c.and_then(|c| c.get("Cmd")));
    let argv = if entrypoint.is_empty() {
        cmd
    } else {
        entrypoint.into_iter().chain(cmd).collect()
    };
    let env = string_list(c.and_then(|c| c.get("Env")));
    let path = env
        .iter()
        .rev()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH)
        .to_string();
    let cwd = c
        .and_then(|c| c.get("WorkingDir"))
        .and_then(|w| w.as_str())
        .filter(|w| !w.is_empty())
        .unwrap_or("/")
        .to_string();
    Ok(Command { argv, path, cwd })
}

fn report(executable: Option<String>, finding: Finding, detail: String) -> DeepReport {
    DeepReport {
        executable,
        finding,
        detail,
    }
}

fn unreadable(detail: String) -> DeepReport {
    report(None, Finding::Unreadable, detail)
}

/// Wraps a layer so that gzip-compressed layers are decompressed; zstd ones fail to read.
fn decompressing<'a>(reader: &'a mut (dyn Read + Send)) -> io::Result<Box<dyn Read + 'a>> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < magic.len() {
        match reader.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let chained: Box<dyn Read + Send> =
        Box::new(io::Cursor::new(magic[..n].to_vec()).chain(reader));
    if magic[..n].starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(chained)))
    } else if magic[..n] == [0x28, 0xb5, 0x2f, 0xfd] {
        Err(io::Error::other("zstd layers not supported"))
    } else {
        Ok(chained)
    }
}

/// Inspects an image: `config` is its config JSON, `layers` its layer tars (decompressed or
/// gzip) in rootfs order, each read once, sequentially.
pub fn inspect(
    config: &[u8],
    layers: Vec<Box<dyn Read + Send>>,
    platform: &Platform,
) -> Result<DeepReport> {
    inspect_capped(config, layers, platform, MAX_RETAINED)
}

fn inspect_capped(
    config: &[u8],
    layers: Vec<Box<dyn Read + Send>>,
    platform: &Platform,
    cap: usize,
) -> Result<DeepReport> {
    let command = match command(config) {
        Ok(c) => c,
        Err(e) => return Ok(unreadable(e)),
    };
    let Some(argv0) = command.argv.first().cloned() else {
        return Ok(report(
            None,
            Finding::NoEntrypoint,
            "the image config has neither Entrypoint nor Cmd".into(),
        ));
    };
    if argv0.is_empty() {
        return Ok(report(
            None,
            Finding::NoEntrypoint,
            "the image's command starts with an empty string".into(),
        ));
    }
    let mut fs = Fs {
        cap,
        nodes: BTreeMap::new(),
        retained: 0,
    };
    for (i, mut layer) in layers.into_iter().enumerate() {
        let applied = decompressing(&mut *layer).and_then(|l| fs.apply_layer(l));
        // tar stops at its end-of-archive marker: read the rest (record padding, the gzip
        // trailer) so a streaming source completes (and verifies its digest) before the
        // next layer is read.
        let applied = applied.and_then(|()| io::copy(&mut layer, &mut io::sink()).map(drop));
        if let Err(e) = applied {
            return Ok(unreadable(format!(
                "layer {} of the image cannot be read: {}",
                i + 1,
                one_line(&e.to_string())
            )));
        }
    }
    let inspector = Inspector {
        fs: &fs,
        platform,
        command: &command,
    };
    Ok(inspector.run(&argv0))
}

struct Inspector<'a> {
    fs: &'a Fs,
    platform: &'a Platform,
    command: &'a Command,
}

/// The outcome of examining one file.
struct Verdict {
    finding: Finding,
    detail: String,
}

impl Inspector<'_> {
    fn run(&self, argv0: &str) -> DeepReport {
        let located = if argv0.contains('/') {
            self.fs
                .resolve(&self.command.cwd, argv0)
                .map_err(|e| e.describe(argv0))
        } else {
            self.look_path(argv0)
        };
        let (resolved, node) = match located {
            Ok(found) => found,
            Err(detail) => {
                return report(
                    Some(argv0.to_string()),
                    Finding::MissingEntrypoint,
                    format!("entrypoint {detail}"),
                )
            }
        };
        let shown = if resolved == argv0 {
            resolved.clone()
        } else {
            format!("{argv0} -> {resolved}")
        };
        let verdict = self.examine(&shown, node, 0);
        report(Some(resolved), verdict.finding, verdict.detail)
    }

    /// `exec.LookPath` in the container: the first PATH entry holding an executable file.
    fn look_path(&self, name: &str) -> std::result::Result<(String, &Node), String> {
        let mut not_executable = None;
        for dir in self.command.path.split(':') {
            let dir = if dir.is_empty() { "." } else { dir };
            let candidate = format!("{}/{name}", dir.trim_end_matches('/'));
            if let Ok((resolved, node)) = self.fs.resolve(&self.command.cwd, &candidate) {
                match node {
                    Node::File { mode, .. } if mode & 0o111 != 0 => return Ok((resolved, node)),
                    Node::File { .. } => {
                        not_executable.get_or_insert(resolved);
                    }
                    _ => {}
                }
            }
        }
        Err(match not_executable {
            Some(p) => format!(
                "`{name}` is not on PATH={} ({p} exists but is not executable)",
                self.command.path
            ),
            None => format!("`{name}` is not on PATH={}", self.command.path),
        })
    }

    fn examine(&self, shown: &str, node: &Node, depth: usize) -> Verdict {
        let (mode, size, head) = match node {
            Node::Dir => {
                return Verdict {
                    finding: Finding::MissingEntrypoint,
                    detail: format!("entrypoint {shown} is a directory"),
                }
            }
            Node::Other(kind) => {
                return Verdict {
                    finding: Finding::NotElf,
                    detail: format!("entrypoint {shown} is {kind}"),
                }
            }
            Node::Symlink(_) => {
                return Verdict {
                    finding: Finding::Unreadable,
                    detail: format!("{shown} is an unresolved symlink"),
                }
            }
            Node::File { mode, size, head } => (*mode, *size, head),
        };
        let Some(head) = head else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!(
                    "{shown} was not retained: the image has more than {} of file headers (the --deep cap)",
                    if self.fs.cap.is_multiple_of(1 << 20) {
                        format!("{} MiB", self.fs.cap >> 20)
                    } else {
                        format!("{} bytes", self.fs.cap)
                    }
                ),
            };
        };
        let mut verdict = if head.starts_with(b"\x7fELF") {
            self.examine_elf(shown, head)
        } else if head.starts_with(b"#!") {
            self.examine_script(shown, head, depth)
        } else if size == 0 {
            Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} is an empty file"),
            }
        } else {
            Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} is neither an ELF binary nor a #! script"),
            }
        };
        if mode & 0o111 == 0 {
            verdict.detail += &format!("; note: it is not executable (mode {:04o})", mode & 0o7777);
        }
        verdict
    }

    fn examine_elf(&self, shown: &str, head: &[u8]) -> Verdict {
        let Some(ident) = elf_machine(head) else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!("{shown} has a truncated or malformed ELF header"),
            };
        };
        let Some((machine, class, endian)) = expected_machine(self.platform) else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!(
                    "{shown} is {}; no known ELF machine for {} to compare with",
                    ident.describe(),
                    self.platform
                ),
            };
        };
        if (ident.machine, ident.class, ident.endian) != (machine, class, endian) {
            return Verdict {
                finding: Finding::BinaryMismatch {
                    found: ident.describe(),
                },
                detail: format!(
                    "{shown} is {} but the entry is {} (expects {})",
                    ident.short(),
                    self.platform,
                    expected_short(self.platform).unwrap_or_default()
                ),
            };
        }
        let matched = |how: String| Verdict {
            finding: Finding::Match,
            detail: format!(
                "{shown} is {}, {how}; matches {}",
                ident.short(),
                self.platform
            ),
        };
        match &ident.linkage {
            None => matched("linkage unknown (program headers beyond the first 4 KiB)".into()),
            Some(Linkage::Static) => matched("static".into()),
            Some(Linkage::Dynamic { interpreter: None }) => {
                matched("dynamic (loader path beyond the first 4 KiB; not checked)".into())
            }
            Some(Linkage::Dynamic {
                interpreter: Some(loader),
            }) => match self.fs.resolve("/", loader) {
                Err(_) => Verdict {
                    finding: Finding::InterpreterMissing {
                        interpreter: loader.clone(),
                    },
                    detail: format!(
                        "{shown} is {}, dynamic, but its loader {loader} is missing from the image (exec fails with \"no such file or directory\")",
                        ident.short()
                    ),
                },
                Ok((resolved, Node::File { head: Some(h), .. })) => match elf_machine(h) {
                    Some(l) if (l.machine, l.class, l.endian) != (machine, class, endian) => Verdict {
                        finding: Finding::BinaryMismatch { found: l.describe() },
                        detail: format!(
                            "{shown} is {} but its loader {loader} ({resolved}) is {}; the entry is {}",
                            ident.short(),
                            l.short(),
                            self.platform
                        ),
                    },
                    Some(_) => matched(format!("dynamic (loader {loader} present)")),
                    None => matched(format!(
                        "dynamic (loader {loader} present but not an ELF I can read)"
                    )),
                },
                Ok(_) => matched(format!("dynamic (loader {loader} present, not checked)")),
            },
        }
    }

    fn examine_script(&self, shown: &str, head: &[u8], depth: usize) -> Verdict {
        if depth >= MAX_SCRIPT_DEPTH {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!("{shown}: more than {MAX_SCRIPT_DEPTH} nested #! interpreters"),
            };
        }
        let line = head[2..].split(|&c| c == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.split([' ', '\t', '\r']).filter(|w| !w.is_empty());
        let Some(interpreter) = words.next().map(str::to_string) else {
            return Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} has an empty #! line"),
            };
        };
        let argument = words.next().map(str::to_string);
        let (resolved, node) = match self.fs.resolve(&self.command.cwd, &interpreter) {
            Ok(found) => found,
            Err(e) => {
                return Verdict {
                    finding: Finding::InterpreterMissing {
                        interpreter: interpreter.clone(),
                    },
                    detail: format!(
                        "{shown} is a #!{interpreter} script but {}",
                        e.describe(&interpreter)
                    ),
                }
            }
        };
        let inner_shown = if resolved == interpreter {
            resolved.clone()
        } else {
            format!("{interpreter} -> {resolved}")
        };
        let inner = self.examine(&inner_shown, node, depth + 1);
        let mut verdict = Verdict {
            detail: format!("{shown} is a #!{interpreter} script: {}", inner.detail),
            finding: inner.finding,
        };
        // `#!/usr/bin/env prog`: env must find prog on PATH, and prog must run too.
        if verdict.finding == Finding::Match && interpreter.rsplit('/').next() == Some("env") {
            if let Some(program) = argument.filter(|a| !a.starts_with('-') && !a.contains('=')) {
                let located = if program.contains('/') {
                    self.fs
                        .resolve(&self.command.cwd, &program)
                        .map_err(|e| e.describe(&program))
                } else {
                    self.look_path(&program)
                };
                verdict = match located {
                    Err(e) => Verdict {
                        finding: Finding::InterpreterMissing {
                            interpreter: program.clone(),
                        },
                        detail: format!("{shown} runs `env {program}` but {e}"),
                    },
                    Ok((p, node)) => {
                        let inner = self.examine(&p, node, depth + 1);
                        Verdict {
                            detail: format!("{shown} runs `env {program}`: {}", inner.detail),
                            finding: inner.finding,
                        }
                    }
                };
            }
        }
        verdict
    }
}

// ---------------------------------------------------------------------------------------
// Remote glue.

use crate::export::ChannelReader;
use crate::oci::short_digest;

/// Streams an image's layers from the registry, one after another (bounded memory), and
/// runs [`inspect`] on them. gzip layers are decompressed (by media type or magic);
/// zstd layers give [`Finding::Unreadable`]; non-distributable (foreign) layers are skipped
/// with a note in `detail`. Registry failures are `Err`.
pub async fn inspect_remote(
    registry: &crate::registry::Registry,
    reference: &oci_client::Reference,
    config: &[u8],
    layer_digests: &[(String, String)],
    platform: &Platform,
) -> Result<DeepReport> {
    use futures_util::StreamExt;
    let mut skipped = Vec::new();
    let mut wanted = Vec::new();
    for (digest, media_type) in layer_digests {
        if media_type.contains("nondistributable") || media_type.contains("foreign") {
            skipped.push(short_digest(digest).to_string());
            continue;
        }
        if media_type.contains("zstd") {
            return Ok(unreadable(format!(
                "layer {} is zstd-compressed ({media_type}); zstd layers not supported",
                short_digest(digest)
            )));
        }
        wanted.push(digest.clone());
    }
    let mut senders = Vec::new();
    let mut readers: Vec<Box<dyn Read + Send>> = Vec::new();
    for _ in &wanted {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        senders.push(tx);
        readers.push(Box::new(ChannelReader::new(rx)));
    }
    let config_bytes = config.to_vec();
    let owned_platform = platform.clone();
    let inspector =
        tokio::task::spawn_blocking(move || inspect(&config_bytes, readers, &owned_platform));
    let pump = async move {
        for (digest, tx) in wanted.iter().zip(senders) {
            if tx.is_closed() {
                // The inspector has stopped reading (it reached a verdict or failed).
                return Ok(());
            }
            let stream = registry.blob_stream(reference, digest).await?;
            let mut stream = std::pin::pin!(stream);
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(bytes) => {
                        if tx.send(Ok(bytes)).await.is_err() {
                            return Ok(());
                        }
                    }
                    Err(e) => {
                        let message = format!(
                            "cannot read layer {digest} of {reference}: {}",
                            one_line(&e.to_string())
                        );
                        let _ = tx
                            .send(Err(io::Error::new(e.kind(), message.clone())))
                            .await;
                        return Err(Error::Registry {
                            registry: reference.registry().to_string(),
                            message,
                        });
                    }
                }
            }
        }
        Ok::<(), Error>(())
    };
    let (pumped, inspected) = tokio::join!(pump, inspector);
    pumped?;
    let mut report = inspected.map_err(|e| Error::Registry {
        registry: reference.registry().to_string(),
        message: format!("deep inspection of {reference} failed: {e}"),
    })??;
    if !skipped.is_empty() {
        report.detail += &format!(
            " (skipped non-distributable layer{} {})",
            if skipped.len() == 1 { "" } else { "s" },
            skipped.join(", ")
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn p(s: &str) -> Platform {
        s.parse().unwrap()
    }

    /// A 64-byte ELF64 header plus program headers (PT_LOAD, and PT_INTERP when given).
    fn elf64(machine: u16, little: bool, interp: Option<&str>) -> Vec<u8> {
        let u16b = |v: u16| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let u32b = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let u64b = |v: u64| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let phnum: u16 = if interp.is_some() { 2 } else { 1 };
        let mut b = vec![0x7f, b'E', b'L', b'F', 2, if little { 1 } else { 2 }, 1, 0];
        b.resize(16, 0);
        b.extend(u16b(2)); // e_type EXEC
        b.extend(u16b(machine));
        b.extend(u32b(1));
        b.extend(u64b(0x400000)); // e_entry
        b.extend(u64b(64)); // e_phoff
        b.extend(u64b(0)); // e_shoff
        b.extend(u32b(0)); // e_flags
        b.extend(u16b(64)); // e_ehsize
        b.extend(u16b(56)); // e_phentsize
        b.extend(u16b(phnum));
        b.extend(u16b(64));
        b.extend(u16b(0));
        b.extend(u16b(0));
        assert_eq!(b.len(), 64);
        let interp_off = 64 + 56 * u64::from(phnum);
        if let Some(i) = interp {
            b.extend(u32b(PT_INTERP));
            b.extend(u32b(4));
            b.extend(u64b(interp_off));
            b.extend(u64b(0));
            b.extend(u64b(0));
            b.extend(u64b(i.len() as u64 + 1));
            b.extend(u64b(i.len() as u64 + 1));
            b.extend(u64b(1));
        }
        b.extend(u32b(1)); // PT_LOAD
        b.extend(u32b(5));
        b.extend([0u8; 48]);
        if let Some(i) = interp {
            b.extend(i.as_bytes());
            b.push(0);
        }
        b.extend([0xcc; 32]);
        b
    }

    /// A 52-byte ELF32 header plus one PT_LOAD.
    fn elf32(machine: u16, little: bool) -> Vec<u8> {
        let u16b = |v: u16| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let u32b = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let mut b = vec![0x7f, b'E', b'L', b'F', 1, if little { 1 } else { 2 }, 1, 0];
        b.resize(16, 0);
        b.extend(u16b(2));
        b.extend(u16b(machine));
        b.extend(u32b(1));
        b.extend(u32b(0x8000)); // e_entry
        b.extend(u32b(52)); // e_phoff
        b.extend(u32b(0));
        b.extend(u32b(0));
        b.extend(u16b(52));
        b.extend(u16b(32));
        b.extend(u16b(1));
        b.extend(u16b(40));
        b.extend(u16b(0));
        b.extend(u16b(0));
        assert_eq!(b.len(), 52);
        b.extend(u32b(1));
        b.extend([0u8; 28]);
        b
    }

    enum E<'a> {
        File(&'a str, u32, &'a [u8]),
        Dir(&'a str),
        Sym(&'a str, &'a str),
        Hard(&'a str, &'a str),
    }

    /// Builds a tar with raw names (so `..` and leading `/` can be written).
    fn tar_bytes(entries: &[E]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            let (name, link, kind, mode, data): (&str, Option<&str>, tar::EntryType, u32, &[u8]) =
                match e {
                    E::File(n, m, d) => (n, None, tar::EntryType::Regular, *m, d),
                    E::Dir(n) => (n, None, tar::EntryType::Directory, 0o755, &[]),
                    E::Sym(n, t) => (n, Some(t), tar::EntryType::Symlink, 0o777, &[]),
                    E::Hard(n, t) => (n, Some(t), tar::EntryType::Link, 0o755, &[]),
                };
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_cksum();
            builder.append(&h, data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn layer(entries: &[E]) -> Box<dyn Read + Send> {
        Box::new(Cursor::new(tar_bytes(entries)))
    }

    fn config(entrypoint: &[&str], cmd: &[&str]) -> Vec<u8> {
        serde_json::json!({
            "architecture": "arm64", "os": "linux",
            "config": { "Entrypoint": entrypoint, "Cmd": cmd,
                         "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] }
        })
        .to_string()
        .into_bytes()
    }

    fn run(cfg: &[u8], layers: Vec<Box<dyn Read + Send>>, platform: &str) -> DeepReport {
        inspect(cfg, layers, &p(platform)).unwrap()
    }

    #[test]
    fn x86_binary_under_arm64_is_a_mismatch_naming_both() {
        let bin = elf64(EM_X86_64, true, None);
        let r = run(
            &config(&["/bin/busybox"], &[]),
            vec![layer(&[
                E::Dir("bin/"),
                E::File("bin/busybox", 0o755, &bin),
            ])],
            "linux/arm64",
        );
        assert_eq!(
            r.finding,
            Finding::BinaryMismatch {
                found: "x86-64 (EM_X86_64, 64-bit LSB)".into()
            }
        );
        assert_eq!(
            r.detail,
            "/bin/busybox is x86-64 but the entry is linux/arm64 (expects AArch64)"
        );
        assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
    }

    #[test]
    fn matching_arm64_static_binary() {
        let bin = elf64(EM_AARCH64, true, None);
        let r = run(
            &config(&["/app"], &["--serve"]),
            vec![layer(&[E::File("./app", 0o755, &bin)])],
            "linux/arm64/v8",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert!(r.detail.contains("static"), "{}", r.detail);
    }

    #[test]
    fn path_lookup_and_symlink_chains() {
        let bin = elf64(EM_AARCH64, true, None);
        let l = layer(&[
            E::Dir("bin/"),
            E::File("bin/busybox", 0o755, &bin),
            E::Sym("bin/sh", "busybox"),
            E::Dir("usr/"),
            E::Dir("usr/bin/"),
            E::Sym("usr/bin/sh", "/bin/sh"),
            E::Sym("usr/bin/ash", "../../../../bin/sh"),
        ]);
        // Cmd only, no slash: PATH is /usr/local/bin:/usr/bin:/bin, so /usr/bin/sh is found.
        let r = run(&config(&[], &["sh", "-c", "echo"]), vec![l], "linux/arm64");
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
        assert!(r.detail.starts_with("sh -> /bin/busybox"), "{}", r.detail);

        let l = layer(&[
            E::File("bin/busybox", 0o755, &bin),
            E::Sym("bin/sh", "busybox"),
            E::Sym("usr/bin/ash", "../../../../bin/sh"),
        ]);
        let r = run(&config(&["/usr/bin/ash"], &[]), vec![l], "linux/arm64");
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
    }

    #[test]
    fn default_path_and_working_dir() {
        let bin = elf64(EM_X86_64, true, None);
        let cfg =
            serde_json::json!({"config": {"Cmd": ["tool"], "WorkingDir": "/srv"}}).to_string();
        let r = run(
            cfg.as_bytes(),
            vec![layer(&[E::File("usr/sbin/tool", 0o755, &bin)])],
            "linux/amd64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        let cfg =
            serde_json::json!({"config": {"Cmd": ["./run"], "WorkingDir": "/srv"}}).to_string();
        let r = run(
            cfg.as_bytes(),
            vec![layer(&[E::File("srv/run", 0o755, &bin)])],
            "linux/amd64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert_eq!(r.executable.as_deref(), Some("/srv/run"));
    }

    #[test]
    fn whiteout_in_later_layer_removes_the_binary() {
        let bin = elf64(EM_AARCH64, true, None);
        let r = run(
            &config(&["/bin/app"], &[]),
            vec![
                layer(&[E::Dir("bin/"), E::File("bin/app", 0o755, &bin)]),
                layer(&[E::File("bin/.wh.app", 0o644, b"")]),
            ],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
        assert!(r.detail.contains("/bin/app"), "{}", r.detail);
    }

    #[test]
    fn opaque_dir_hides_lower_contents_but_not_its_own_layer() {
        let arm = elf64(EM_AARCH64, true, None);
        let x86 = elf64(EM_X86_64, true, None);
        let layers = || {
            vec![
                layer(&[
                    E::File("opt/app/old", 0o755, &arm),
                    E::File("opt/app/run", 0o755, &x86),
                ]),
                layer(&[
                    E::Dir("opt/app/"),
                    E::File("opt/app/.wh..wh..opq", 0o644, b""),
                    E::File("opt/app/run", 0o755, &arm),
                ]),
            ]
        };
        let r = run(&config(&["/opt/app/run"], &[]), layers(), "linux/arm64");
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        let r = run(&config(&["/opt/app/old"], &[]), layers(), "linux/arm64");
        assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
    }

    #[test]
    fn scripts_and_their_interpreters() {
        let bin = elf64(EM_AARCH64, true, None);
        let script: &[u8] = b"#!/bin/sh -e\necho hi\n";
        let r = run(
            &config(&["/entry.sh"], &[]),
            vec![layer(&[
                E::File("entry.sh", 0o755, script),
                E::File("bin/busybox", 0o755, &bin),
                E::Sym("bin/sh", "busybox"),
            ])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert_eq!(r.executable.as_deref(), Some("/entry.sh"));
        assert!(r.detail.contains("#!/bin/sh"), "{}", r.detail);

        let r = run(
            &config(&["/entry.sh"], &[]),
            vec![layer(&[E::File("entry.sh", 0o755, script)])],
            "linux/arm64",
        );
        assert_eq!(
            r.finding,
            Finding::InterpreterMissing {
                interpreter: "/bin/sh".into()
            }
        );

        // A script whose interpreter is for the wrong machine.
        let x86 = elf64(EM_X86_64, true, None);
        let r = run(
            &config(&["/entry.sh"], &[]),
            vec![layer(&[
                E::File("entry.sh", 0o755, script),
                E::File("bin/sh", 0o755, &x86),
            ])],
            "linux/arm64",
        );
        assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");

        // #!/usr/bin/env python3, python3 missing.
        let r = run(
            &config(&["/entry.py"], &[]),
            vec![layer(&[
                E::File("entry.py", 0o755, b"#!/usr/bin/env python3\n"),
                E::File("usr/bin/env", 0o755, &bin),
            ])],
            "linux/arm64",
        );
        assert_eq!(
            r.finding,
            Finding::InterpreterMissing {
                interpreter: "python3".into()
            },
            "{}",
            r.detail
        );
    }

    #[test]
    fn dotdot_entries_are_ignored() {
        let bin = elf64(EM_AARCH64, true, None);
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[
                E::File("../app", 0o755, &bin),
                E::File("x/../../app", 0o755, &bin),
                E::File("/../app", 0o755, &bin),
            ])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
        // A symlink pointing out of the root is clamped to the root.
        let r = run(
            &config(&["/bin/app"], &[]),
            vec![layer(&[
                E::File("/app", 0o755, &bin),
                E::Sym("bin/app", "../../../../app"),
            ])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert_eq!(r.executable.as_deref(), Some("/app"));
    }

    #[test]
    fn symlink_loop_is_a_clean_result() {
        let r = run(
            &config(&["/bin/a"], &[]),
            vec![layer(&[E::Sym("bin/a", "b"), E::Sym("bin/b", "/bin/a")])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::MissingEntrypoint);
        assert!(r.detail.contains("symbolic links"), "{}", r.detail);
        let r = run(
            &config(&[], &["a"]),
            vec![layer(&[E::Sym("bin/a", "a")])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::MissingEntrypoint);
    }

    #[test]
    fn hardlinks_share_content_even_after_the_target_is_deleted() {
        let bin = elf64(EM_X86_64, true, None);
        let r = run(
            &config(&["/usr/bin/app"], &[]),
            vec![
                layer(&[
                    E::File("bin/app", 0o755, &bin),
                    E::Hard("usr/bin/app", "bin/app"),
                ]),
                layer(&[E::File("bin/.wh.app", 0, b"")]),
            ],
            "linux/arm64",
        );
        assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
    }

    #[test]
    fn garbage_never_panics() {
        let inputs: Vec<Vec<u8>> = vec![
            vec![],
            vec![0xff; 10_000],
            b"not a tar at all".to_vec(),
            vec![0x1f, 0x8b, 0, 1, 2, 3],
            vec![0x28, 0xb5, 0x2f, 0xfd, 0],
            {
                let mut t = tar_bytes(&[E::File("bin/app", 0o755, &[1; 3000])]);
                t.truncate(1200);
                t
            },
        ];
        for input in inputs {
            let r = inspect(
                &config(&["/bin/app"], &[]),
                vec![Box::new(Cursor::new(input))],
                &p("linux/arm64"),
            )
            .unwrap();
            assert!(
                matches!(r.finding, Finding::Unreadable | Finding::MissingEntrypoint),
                "{r:?}"
            );
        }
        // Garbage config, and configs without a command.
        assert_eq!(
            run(b"{{{", vec![], "linux/arm64").finding,
            Finding::Unreadable
        );
        assert_eq!(
            run(b"{}", vec![], "linux/arm64").finding,
            Finding::NoEntrypoint
        );
        assert_eq!(
            run(
                br#"{"config":{"Entrypoint":null,"Cmd":[]}}"#,
                vec![],
                "linux/arm64"
            )
            .finding,
            Finding::NoEntrypoint
        );
        // Truncated and hostile ELF headers.
        let full = elf64(EM_AARCH64, true, Some("/lib/ld.so"));
        for n in 0..full.len() {
            let _ = elf_machine(&full[..n]);
        }
        let mut hostile = full.clone();
        hostile[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(elf_machine(&hostile).unwrap().linkage, None);
        let r = run(
            &config(&["/x"], &[]),
            vec![layer(&[E::File("x", 0o755, b"\x7fELF\x02")])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::Unreadable, "{}", r.detail);
    }

    #[test]
    fn gzip_layers_are_detected() {
        use std::io::Write;
        let bin = elf64(EM_AARCH64, true, None);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar_bytes(&[E::File("app", 0o755, &bin)]))
            .unwrap();
        let r = run(
            &config(&["/app"], &[]),
            vec![Box::new(Cursor::new(gz.finish().unwrap()))],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    }

    #[test]
    fn elf32_big_endian_s390_versus_s390x() {
        let id = elf_machine(&elf32(EM_S390, false)).unwrap();
        assert_eq!(
            (id.class, id.endian, id.machine),
            (ElfClass::Elf32, Endian::Big, EM_S390)
        );
        assert_eq!(id.linkage, Some(Linkage::Static));
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File("app", 0o755, &elf32(EM_S390, false))])],
            "linux/s390x",
        );
        assert_eq!(
            r.finding,
            Finding::BinaryMismatch {
                found: "IBM S/390 (EM_S390, 32-bit MSB)".into()
            }
        );
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File(
                "app",
                0o755,
                &elf64(EM_S390, false, None),
            )])],
            "linux/s390x",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        // ppc64le vs big-endian ppc64.
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File(
                "app",
                0o755,
                &elf64(EM_PPC64, false, None),
            )])],
            "linux/ppc64le",
        );
        assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
        // arm/v7 expects ELF32 EM_ARM.
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File("app", 0o755, &elf32(EM_ARM, true))])],
            "linux/arm/v7",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    }

    #[test]
    fn static_versus_dynamic() {
        let id = elf_machine(&elf64(EM_X86_64, true, Some("/lib64/ld-linux-x86-64.so.2"))).unwrap();
        assert_eq!(
            id.linkage,
            Some(Linkage::Dynamic {
                interpreter: Some("/lib64/ld-linux-x86-64.so.2".into())
            })
        );
        assert_eq!(
            elf_machine(&elf64(EM_X86_64, true, None)).unwrap().linkage,
            Some(Linkage::Static)
        );
        // Program headers beyond the prefix: linkage unknown.
        assert_eq!(
            elf_machine(&elf64(EM_X86_64, true, None)[..64])
                .unwrap()
                .linkage,
            None
        );

        let app = elf64(EM_AARCH64, true, Some("/lib/ld-linux-aarch64.so.1"));
        let loader = elf64(EM_AARCH64, true, None);
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[
                E::File("app", 0o755, &app),
                E::File("lib/ld-linux-aarch64.so.1", 0o755, &loader),
            ])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        assert!(r.detail.contains("dynamic"), "{}", r.detail);
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File("app", 0o755, &app)])],
            "linux/arm64",
        );
        assert_eq!(
            r.finding,
            Finding::InterpreterMissing {
                interpreter: "/lib/ld-linux-aarch64.so.1".into()
            }
        );
        assert!(r.detail.contains("missing from the image"), "{}", r.detail);
    }

    #[test]
    fn not_elf_and_unknown_platforms() {
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File("app", 0o755, b"MZ\x90\x00")])],
            "linux/arm64",
        );
        assert_eq!(r.finding, Finding::NotElf);
        let r = run(
            &config(&["/app"], &[]),
            vec![layer(&[E::File(
                "app",
                0o755,
                &elf64(EM_X86_64, true, None),
            )])],
            "windows/amd64",
        );
        assert_eq!(r.finding, Finding::Unreadable, "{}", r.detail);
        assert_eq!(
            expected_machine(&p("linux/riscv64")),
            Some((EM_RISCV, ElfClass::Elf64, Endian::Little))
        );
    }

    /// The remote path: small chunks through bounded channels, layers with trailing
    /// padding after the tar end marker (as real tars have), fed strictly in order.
    #[test]
    fn channel_streaming_does_not_deadlock_on_trailing_padding() {
        use std::io::Write;
        let x86 = elf64(EM_X86_64, true, None);
        let arm = elf64(EM_AARCH64, true, None);
        let mut first = tar_bytes(&[E::File("bin/app", 0o755, &x86)]);
        first.extend(vec![0u8; 20 * 1024]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut second = tar_bytes(&[E::File("bin/app", 0o755, &arm)]);
        second.extend(vec![0u8; 20 * 1024]);
        gz.write_all(&second).unwrap();
        let blobs = [first, gz.finish().unwrap()];
        let mut senders = Vec::new();
        let mut readers: Vec<Box<dyn Read + Send>> = Vec::new();
        for _ in &blobs {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            senders.push(tx);
            readers.push(Box::new(ChannelReader::new(rx)));
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = inspect(&config(&["/bin/app"], &[]), readers, &p("linux/arm64"));
            let _ = done_tx.send(r);
        });
        for (blob, tx) in blobs.iter().zip(senders) {
            for chunk in blob.chunks(512) {
                tx.blocking_send(Ok(bytes::Bytes::copy_from_slice(chunk)))
                    .expect("the inspector reads every layer to its end");
            }
        }
        let r = done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("no deadlock")
            .unwrap();
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    }

    #[allow(dead_code)]
    fn inspect_remote_is_send(
        registry: &crate::registry::Registry,
        reference: &oci_client::Reference,
    ) {
        fn is_send<T: Send>(_: T) {}
        is_send(inspect_remote(
            registry,
            reference,
            b"",
            &[],
            &p("linux/arm64"),
        ));
    }

    #[test]
    fn retention_cap_is_reported_only_when_it_matters() {
        let mut bin = elf64(EM_AARCH64, true, None);
        bin.resize(5000, 0);
        let layers = || {
            vec![layer(&[
                E::File("a", 0o755, &bin),
                E::File("b", 0o755, &bin),
            ])]
        };
        let cap = 4096 + 100;
        let r = inspect_capped(&config(&["/a"], &[]), layers(), &p("linux/arm64"), cap).unwrap();
        assert_eq!(r.finding, Finding::Match, "{}", r.detail);
        let r = inspect_capped(&config(&["/b"], &[]), layers(), &p("linux/arm64"), cap).unwrap();
        assert_eq!(r.finding, Finding::Unreadable);
        assert!(r.detail.contains("4196 bytes"), "{}", r.detail);
        assert!(format!("{} MiB", MAX_RETAINED >> 20) == "64 MiB");
    }

    #[test]
    fn real_busybox_fixtures_when_present() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/busybox");
        for (arch, machine) in [("amd64", EM_X86_64), ("arm64", EM_AARCH64)] {
            let path = dir.join(arch).join("busybox");
            let Ok(file) = std::fs::File::open(&path) else {
                eprintln!("skipping: {} is absent", path.display());
                continue;
            };
            let mut head = Vec::new();
            file.take(4096).read_to_end(&mut head).unwrap();
            let id = elf_machine(&head).unwrap();
            assert_eq!(id.machine, machine);
            assert_eq!(id.linkage, Some(Linkage::Static), "Debian's busybox-static");
            let data = std::fs::read(&path).unwrap();
            let other = if arch == "amd64" {
                "linux/arm64"
            } else {
                "linux/amd64"
            };
            let r = run(
                &config(&["/bin/busybox"], &[]),
                vec![layer(&[E::File("bin/busybox", 0o755, &data)])],
                other,
            );
            assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
        }
    }
}

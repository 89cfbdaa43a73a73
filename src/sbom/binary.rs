//! Packages compiled into an ELF binary: Go's build info (`.go.buildinfo`) and the
//! dependency list `cargo auditable` embeds (`.dep-v0`, zlib-compressed JSON). Section
//! headers sit at the end of an ELF file, so the layer reader spools a binary to a file
//! first; here its section headers are read by hand and only the two sections are loaded.

use super::{golang, Ecosystem, Package};
use std::io::{self, Read, Seek, SeekFrom};

/// Sections read at most: Go's build info and an auditable dependency list are a few KiB
/// to a few hundred; anything larger is not what it claims.
const MAX_SECTION: u64 = 4 << 20;
/// What a `.dep-v0` section may inflate to.
const MAX_DEP_JSON: u64 = 16 << 20;
/// Section headers read at most (64 bytes each).
const MAX_SECTIONS: u64 = 1 << 16;

/// Why a binary's embedded package list was not read (a note, not a failure).
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error("{0}")]
    Go(#[from] golang::GoInfoError),
    #[error("has a .dep-v0 section (cargo auditable) that is not zlib-compressed JSON: {0}")]
    Auditable(String),
    #[error("has a {name} section of {size} bytes, more than {MAX_SECTION} are read")]
    TooLarge { name: &'static str, size: u64 },
}

/// The packages embedded in the ELF file `file`: none for an ELF with neither section,
/// and for a file that is no well-formed ELF. I/O failures of the spool are `Err`.
pub(super) fn packages<F: Read + Seek>(
    file: &mut F,
    source: &str,
) -> io::Result<Result<Vec<Package>, BinaryError>> {
    let Some(sections) = sections(file)? else {
        return Ok(Ok(Vec::new()));
    };
    let mut found = Vec::new();
    for (name, offset, size) in sections {
        let name = match name.as_slice() {
            b".go.buildinfo" => ".go.buildinfo",
            b".dep-v0" => ".dep-v0",
            _ => continue,
        };
        if size > MAX_SECTION {
            return Ok(Err(BinaryError::TooLarge { name, size }));
        }
        let Some(bytes) = read_at(file, offset, size)? else {
            continue;
        };
        let read = if name == ".go.buildinfo" {
            golang::parse(&bytes, source).map_err(BinaryError::from)
        } else {
            auditable(&bytes, source)
        };
        match read {
            Ok(packages) => found.extend(packages),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(found))
}

/// A section's name, file offset and size.
type Section = (Vec<u8>, u64, u64);

/// Every section with contents; None for no well-formed ELF.
fn sections<F: Read + Seek>(file: &mut F) -> io::Result<Option<Vec<Section>>> {
    let Some(header) = read_at(file, 0, 64)? else {
        return Ok(None);
    };
    if !header.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let Some(elf) = Layout::new(&header) else {
        return Ok(None);
    };
    let shoff = elf.word(&header, if elf.wide { 0x28 } else { 0x20 });
    let (at, entsize) = if elf.wide { (0x3a, 64) } else { (0x2e, 40) };
    let shentsize = u64::from(elf.half(&header, at));
    let shnum = u64::from(elf.half(&header, at + 2));
    let shstrndx = u64::from(elf.half(&header, at + 4));
    if shentsize < entsize
        || shnum == 0
        || shnum > MAX_SECTIONS
        || shstrndx >= shnum
        || shnum * shentsize > MAX_SECTION
    {
        return Ok(None);
    }
    let Some(table) = read_at(file, shoff, shnum * shentsize)? else {
        return Ok(None);
    };
    let entry = |i: u64| -> (u32, u32, u64, u64) {
        let e = &table[(i * shentsize) as usize..];
        let name = elf.half32(e, 0);
        let kind = elf.half32(e, 4);
        if elf.wide {
            (name, kind, elf.word(e, 0x18), elf.word(e, 0x20))
        } else {
            (name, kind, elf.word(e, 0x10), elf.word(e, 0x14))
        }
    };
    let (_, _, names_at, names_size) = entry(shstrndx);
    if names_size > MAX_SECTION {
        return Ok(None);
    }
    let Some(names) = read_at(file, names_at, names_size)? else {
        return Ok(None);
    };
    const SHT_NOBITS: u32 = 8;
    let mut out = Vec::new();
    for i in 0..shnum {
        let (name, kind, offset, size) = entry(i);
        if kind == SHT_NOBITS || size == 0 {
            continue;
        }
        let Some(rest) = names.get(name as usize..) else {
            continue;
        };
        let name = rest.split(|b| *b == 0).next().unwrap_or_default();
        out.push((name.to_vec(), offset, size));
    }
    Ok(Some(out))
}

/// `size` bytes at `offset`; None when the file ends before them.
fn read_at<F: Read + Seek>(file: &mut F, offset: u64, size: u64) -> io::Result<Option<Vec<u8>>> {
    let end = file.seek(SeekFrom::End(0))?;
    if offset.checked_add(size).is_none_or(|stop| stop > end) {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = vec![0; size as usize];
    file.read_exact(&mut bytes)?;
    Ok(Some(bytes))
}

/// An ELF's class and byte order, for reading its header fields.
#[derive(Clone, Copy)]
struct Layout {
    wide: bool,
    big: bool,
}

impl Layout {
    fn new(header: &[u8]) -> Option<Layout> {
        let wide = match header[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let big = match header[5] {
            1 => false,
            2 => true,
            _ => return None,
        };
        Some(Layout { wide, big })
    }

    fn bytes<const N: usize>(&self, b: &[u8], at: usize) -> [u8; N] {
        let mut out = [0; N];
        out.copy_from_slice(&b[at..at + N]);
        if self.big {
            out.reverse();
        }
        out
    }

    fn half(&self, b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(self.bytes(b, at))
    }

    fn half32(&self, b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(self.bytes(b, at))
    }

    /// An address or offset: 8 bytes in ELF64, 4 in ELF32.
    fn word(&self, b: &[u8], at: usize) -> u64 {
        if self.wide {
            u64::from_le_bytes(self.bytes(b, at))
        } else {
            u64::from(self.half32(b, at))
        }
    }
}

/// The crates of a `.dep-v0` section: `{"packages": [{"name", "version", ...}]}`.
fn auditable(compressed: &[u8], source: &str) -> Result<Vec<Package>, BinaryError> {
    #[derive(serde::Deserialize)]
    struct Deps {
        packages: Vec<Crate>,
    }
    #[derive(serde::Deserialize)]
    struct Crate {
        name: String,
        version: String,
    }
    let mut json = Vec::new();
    flate2::read::ZlibDecoder::new(compressed)
        .take(MAX_DEP_JSON + 1)
        .read_to_end(&mut json)
        .map_err(|e| BinaryError::Auditable(e.to_string()))?;
    if json.len() as u64 > MAX_DEP_JSON {
        return Err(BinaryError::Auditable(format!(
            "it inflates past {MAX_DEP_JSON} bytes"
        )));
    }
    let deps: Deps =
        serde_json::from_slice(&json).map_err(|e| BinaryError::Auditable(e.to_string()))?;
    Ok(deps
        .packages
        .into_iter()
        .filter(|c| !c.name.is_empty() && !c.version.is_empty())
        .map(|c| Package {
            ecosystem: Ecosystem::Cargo,
            name: c.name,
            version: c.version,
            arch: None,
            license: None,
            source: source.to_string(),
        })
        .collect())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    /// A minimal little-endian ELF64 holding `sections` (name, contents), with its section
    /// header table at the end, as linkers write it.
    pub(in crate::sbom) fn elf(sections: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        let mut names = vec![0u8];
        let mut headers = vec![[0u8; 64]];
        let mut add = |name: &str, data: &[u8], out: &mut Vec<u8>| {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&(names.len() as u32).to_le_bytes());
            names.extend_from_slice(name.as_bytes());
            names.push(0);
            h[4..8].copy_from_slice(&1u32.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(out.len() as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(data.len() as u64).to_le_bytes());
            out.extend_from_slice(data);
            headers.push(h);
        };
        for (name, data) in sections {
            add(name, data, &mut out);
        }
        let names_at = out.len() as u64;
        let mut h = [0u8; 64];
        h[4..8].copy_from_slice(&3u32.to_le_bytes());
        h[0..4].copy_from_slice(&(names.len() as u32).to_le_bytes());
        names.extend_from_slice(b".shstrtab\0");
        out.extend_from_slice(&names);
        h[0x18..0x20].copy_from_slice(&names_at.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(names.len() as u64).to_le_bytes());
        headers.push(h);
        let shoff = out.len() as u64;
        for h in &headers {
            out.extend_from_slice(h);
        }
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&(headers.len() as u16).to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&((headers.len() - 1) as u16).to_le_bytes());
        out
    }

    pub(in crate::sbom) fn dep_v0(json: &str) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(json.as_bytes()).unwrap();
        z.finish().unwrap()
    }

    pub(in crate::sbom) const AUDITABLE: &str = r#"{"packages":[{"name":"ripgrep","version":"14.1.0","source":"crates.io","root":true,"dependencies":[1]},{"name":"regex","version":"1.10.4","source":"crates.io"}]}"#;

    fn read(bytes: Vec<u8>) -> Result<Vec<Package>, BinaryError> {
        packages(&mut Cursor::new(bytes), "/usr/bin/x").unwrap()
    }

    #[test]
    fn crates_of_a_cargo_auditable_binary() {
        let found = read(elf(&[
            (".text", vec![0x90; 100]),
            (".dep-v0", dep_v0(AUDITABLE)),
        ]));
        let got: Vec<_> = found
            .unwrap()
            .into_iter()
            .map(|p| (p.ecosystem, p.name, p.version))
            .collect();
        assert_eq!(
            got,
            [
                (Ecosystem::Cargo, "ripgrep".into(), "14.1.0".into()),
                (Ecosystem::Cargo, "regex".into(), "1.10.4".into()),
            ]
        );
    }

    #[test]
    fn modules_of_a_go_binary() {
        let info = golang::tests::section("go1.22.2", golang::tests::MODINFO);
        let found = read(elf(&[(".go.buildinfo", info)])).unwrap();
        assert_eq!(found.len(), 5);
        assert_eq!(found[1].name, "github.com/example/tool");
    }

    #[test]
    fn an_elf_without_either_section_or_no_elf_at_all_has_no_package() {
        assert!(read(elf(&[(".text", vec![1, 2, 3])])).unwrap().is_empty());
        assert!(read(b"#!/bin/sh\necho hi\n".to_vec()).unwrap().is_empty());
        assert!(read(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn a_bad_dep_section_is_told_and_hostile_headers_do_not_panic() {
        let outcome = read(elf(&[(".dep-v0", b"not zlib".to_vec())]));
        assert!(
            matches!(outcome, Err(BinaryError::Auditable(_))),
            "{outcome:?}"
        );
        let good = elf(&[(".dep-v0", dep_v0(AUDITABLE))]);
        let mut x: u32 = 5;
        for round in 0..2000 {
            let mut bytes = good.clone();
            for _ in 0..(1 + round % 8) {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let at = (x >> 8) as usize % bytes.len();
                bytes[at] = (x >> 16) as u8;
            }
            let _ = read(bytes.clone());
            bytes.truncate((x as usize) % bytes.len());
            let _ = read(bytes);
        }
    }
}

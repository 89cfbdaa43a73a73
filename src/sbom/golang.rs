//! The build info Go embeds in its binaries (the `.go.buildinfo` section): the Go
//! version, the main module and every dependency with its version, as `go version -m`
//! prints them. Only the inline-string format of Go 1.18 and later is read.

use super::{Ecosystem, Package};

pub(super) const MAGIC: &[u8] = b"\xff Go buildinf:";
/// The header before the inline strings: magic, pointer size, flags, padding.
const HEADER: usize = 32;
/// `flags` bit: the version and module strings follow the header inline.
const INLINE_STRINGS: u8 = 0x2;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoInfoError {
    #[error("has no Go build info header")]
    NoHeader,
    #[error("has Go build info from before Go 1.18 (pointer format), which is not read")]
    OldFormat,
    #[error("has Go build info cut short")]
    Truncated,
}

/// The packages of one binary's build info: the Go standard library (its version the
/// toolchain's), the main module, and the dependencies (a `=>` replacement stands for the
/// module it replaces; a directory replacement leaves the module's path, with the
/// directory's version, `(devel)`).
pub(super) fn parse(section: &[u8], source: &str) -> Result<Vec<Package>, GoInfoError> {
    let start = (0..section.len())
        .step_by(16)
        .find(|&at| section[at..].starts_with(MAGIC))
        .ok_or(GoInfoError::NoHeader)?;
    let info = &section[start..];
    if info.len() < HEADER {
        return Err(GoInfoError::Truncated);
    }
    if info[15] & INLINE_STRINGS == 0 {
        return Err(GoInfoError::OldFormat);
    }
    let (version, rest) = varint_string(&info[HEADER..])?;
    let (modinfo, _) = varint_string(rest)?;
    // The module text sits between two 16-byte sentinels, as debug/buildinfo strips them.
    let modinfo = if modinfo.len() >= 33 && modinfo[modinfo.len() - 17] == b'\n' {
        &modinfo[16..modinfo.len() - 16]
    } else {
        modinfo
    };
    let version = String::from_utf8_lossy(version).into_owned();
    let package = |name: &str, version: &str| Package {
        ecosystem: Ecosystem::Golang,
        name: name.to_string(),
        version: version.to_string(),
        arch: None,
        license: None,
        source: source.to_string(),
    };
    let mut packages = Vec::new();
    if !version.is_empty() {
        packages.push(package("stdlib", &version));
    }
    for line in String::from_utf8_lossy(modinfo).lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            ["mod" | "dep", path, version, ..] if !path.is_empty() => {
                packages.push(package(path, version));
            }
            ["=>", path, version, ..] if !path.is_empty() && packages.len() > 1 => {
                let last = packages.len() - 1;
                // A directory (`./x`, `../x`, `/x`) is no module: the module keeps its path,
                // built from that local source (`(devel)`).
                let name = if path.starts_with(['.', '/']) || path.contains('\\') {
                    packages[last].name.clone()
                } else {
                    path.to_string()
                };
                packages[last] = package(&name, version);
            }
            _ => {}
        }
    }
    Ok(packages)
}

/// A string written as its unsigned LEB128 length, then its bytes; and what follows it.
fn varint_string(bytes: &[u8]) -> Result<(&[u8], &[u8]), GoInfoError> {
    let mut len: u64 = 0;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        len |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let rest = &bytes[i + 1..];
            let len = usize::try_from(len).map_err(|_| GoInfoError::Truncated)?;
            if len > rest.len() {
                return Err(GoInfoError::Truncated);
            }
            return Ok(rest.split_at(len));
        }
    }
    Err(GoInfoError::Truncated)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn varint(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    /// A `.go.buildinfo` section as Go 1.18+ writes it.
    pub(in crate::sbom) fn section(version: &str, modinfo: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(8);
        out.push(INLINE_STRINGS);
        out.resize(HEADER, 0);
        varint(version.len(), &mut out);
        out.extend_from_slice(version.as_bytes());
        // The sentinels are 16 arbitrary bytes each side.
        let mut text = vec![0x30u8; 16];
        text.extend_from_slice(modinfo.as_bytes());
        text.push(b'\n');
        text.extend_from_slice(&[0xf9u8; 16]);
        varint(text.len(), &mut out);
        out.extend_from_slice(&text);
        out
    }

    pub(in crate::sbom) const MODINFO: &str = "path\tgithub.com/example/tool/cmd/tool\nmod\tgithub.com/example/tool\tv1.4.2\th1:abc=\ndep\tgolang.org/x/sys\tv0.19.0\th1:def=\ndep\tgithub.com/old/dep\tv1.0.0\n=>\tgithub.com/fork/dep\tv1.0.1\th1:ghi=\ndep\texample.com/local\tv1.2.3\n=>\t../local\t(devel)\t\nbuild\t-compiler=gc\nbuild\tGOARCH=arm64";

    #[test]
    fn go_version_main_module_and_dependencies_with_replacements() {
        let mut blob = vec![0u8; 48];
        blob.extend(section("go1.22.2", MODINFO));
        let found = parse(&blob, "/usr/bin/tool").unwrap();
        let got: Vec<(&str, &str)> = found
            .iter()
            .map(|p| (p.name.as_str(), p.version.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("stdlib", "go1.22.2"),
                ("github.com/example/tool", "v1.4.2"),
                ("golang.org/x/sys", "v0.19.0"),
                ("github.com/fork/dep", "v1.0.1"),
                ("example.com/local", "(devel)"),
            ]
        );
        assert!(found.iter().all(|p| p.source == "/usr/bin/tool"));
    }

    #[test]
    fn the_pointer_format_and_cut_short_info_are_told() {
        let mut old = section("go1.17", MODINFO);
        old[15] = 0;
        assert_eq!(parse(&old, "/x"), Err(GoInfoError::OldFormat));
        let whole = section("go1.22.2", MODINFO);
        for cut in [10, 31, 33, 40, whole.len() - 1] {
            let outcome = parse(&whole[..cut], "/x");
            assert!(outcome.is_err(), "{cut}: {outcome:?}");
        }
        assert_eq!(parse(b"no magic here", "/x"), Err(GoInfoError::NoHeader));
    }

    #[test]
    fn garbage_after_the_header_does_not_panic() {
        let mut x: u32 = 99;
        for round in 0..200 {
            let mut blob = MAGIC.to_vec();
            blob.extend([8, INLINE_STRINGS]);
            blob.resize(HEADER, 0);
            for _ in 0..round {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                blob.push((x >> 16) as u8);
            }
            let _ = parse(&blob, "/x");
        }
        // A length varint that never ends, or claims more than there is.
        let mut blob = MAGIC.to_vec();
        blob.extend([8, INLINE_STRINGS]);
        blob.resize(HEADER, 0);
        blob.extend([0xff; 12]);
        assert_eq!(parse(&blob, "/x"), Err(GoInfoError::Truncated));
    }
}

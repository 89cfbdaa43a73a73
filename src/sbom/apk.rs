//! Alpine packages: `/lib/apk/db/installed`, one paragraph of `K:value` lines per package
//! (`P` name, `V` version, `A` architecture, `L` licence).

use super::{Ecosystem, Package};

pub(super) fn parse(text: &[u8], source: &str) -> Vec<Package> {
    let text = String::from_utf8_lossy(text);
    let mut packages = Vec::new();
    let mut current = Fields::default();
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(package) = std::mem::take(&mut current).package(source) {
                packages.push(package);
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = Some(value.trim().to_string()).filter(|v| !v.is_empty());
        match key {
            "P" => current.name = value,
            "V" => current.version = value,
            "A" => current.arch = value,
            "L" => current.license = value,
            _ => {}
        }
    }
    packages
}

#[derive(Default)]
struct Fields {
    name: Option<String>,
    version: Option<String>,
    arch: Option<String>,
    license: Option<String>,
}

impl Fields {
    fn package(self, source: &str) -> Option<Package> {
        Some(Package {
            ecosystem: Ecosystem::Apk,
            name: self.name?,
            version: self.version?,
            arch: self.arch,
            license: self.license,
            source: source.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTALLED: &[u8] = b"C:Q1xyzzyB0rr6k3kEm9c4pN2v0WJ4w=\nP:musl\nV:1.2.4_git20230717-r4\nA:aarch64\nS:407278\nI:663552\nT:the musl c library (libc) implementation\nU:https://musl.libc.org/\nL:MIT\no:musl\nm:Timo Teras <timo.teras@iki.fi>\nt:1705419431\nc:7c0e7a9b0b7c\np:so:libc.musl-aarch64.so.1=1\nF:lib\nR:ld-musl-aarch64.so.1\na:0:0:755\nZ:Q1abc=\n\nC:Q1abc=\nP:busybox\nV:1.36.1-r15\nA:aarch64\nL:GPL-2.0-only\nF:bin\nR:busybox\n";

    #[test]
    fn name_version_architecture_and_licence() {
        let found = parse(INSTALLED, "/lib/apk/db/installed");
        let got: Vec<_> = found
            .iter()
            .map(|p| {
                (
                    &*p.name,
                    &*p.version,
                    p.arch.as_deref(),
                    p.license.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("musl", "1.2.4_git20230717-r4", Some("aarch64"), Some("MIT")),
                (
                    "busybox",
                    "1.36.1-r15",
                    Some("aarch64"),
                    Some("GPL-2.0-only")
                ),
            ]
        );
    }

    #[test]
    fn garbage_gives_no_package_and_no_panic() {
        for input in [&b""[..], b"\xff\xff", b"P:\nV:\n", b"V:1\n\nP:x\n", b"::::"] {
            assert!(parse(input, "/x").is_empty(), "{input:?}");
        }
    }
}

//! Debian and Ubuntu packages: `/var/lib/dpkg/status`, and distroless' one file per package
//! in `/var/lib/dpkg/status.d/`. The status file names no licence (that is in each
//! package's copyright file), so none is given.

use super::{Ecosystem, Package};

/// The installed packages of a dpkg status file (or a `status.d` entry, which has no
/// `Status` field). Paragraphs without a name or version, or not installed, are skipped.
pub(super) fn parse(text: &[u8], source: &str) -> Vec<Package> {
    let text = String::from_utf8_lossy(text);
    let mut packages = Vec::new();
    for paragraph in paragraphs(&text) {
        let field = |name: &str| {
            paragraph
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_string())
                .filter(|v| !v.is_empty())
        };
        // `deinstall ok config-files` and the like leave a paragraph behind.
        let installed = field("Status").is_none_or(|s| s.ends_with(" installed"));
        let (Some(name), Some(version)) = (field("Package"), field("Version")) else {
            continue;
        };
        if installed {
            packages.push(Package {
                ecosystem: Ecosystem::Deb,
                name,
                version,
                arch: field("Architecture"),
                license: None,
                source: source.to_string(),
            });
        }
    }
    packages
}

/// RFC 822-style paragraphs: `Key: value` lines, continuation lines (leading blank)
/// ignored, paragraphs separated by empty lines.
pub(super) fn paragraphs(text: &str) -> Vec<Vec<(&str, &str)>> {
    let mut out = vec![Vec::new()];
    for line in text.lines() {
        if line.trim().is_empty() {
            out.push(Vec::new());
        } else if line.starts_with([' ', '\t']) {
            continue;
        } else if let Some((key, value)) = line.split_once(':') {
            out.last_mut()
                .expect("one paragraph")
                .push((key.trim(), value.trim()));
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &[u8] = b"Package: base-files\nEssential: yes\nStatus: install ok installed\nPriority: required\nSection: admin\nInstalled-Size: 391\nMaintainer: Santiago Vila <sanvila@debian.org>\nArchitecture: arm64\nMultiArch: foreign\nVersion: 12.4+deb12u5\nReplaces: base, dpkg (<= 1.15.0), miscutils\nDescription: Debian base system miscellaneous files\n This package contains the basic filesystem hierarchy of a Debian system, and\n .\n Version: 99 (a continuation line, not a field)\nConffiles:\n /etc/debian_version 8a2b9d2a3b8b7b1a\n\nPackage: libc6\nStatus: install ok installed\nArchitecture: arm64\nSource: glibc\nVersion: 2.36-9+deb12u7\n\nPackage: old-tool\nStatus: deinstall ok config-files\nArchitecture: arm64\nVersion: 1.0-1\n";

    #[test]
    fn installed_packages_with_name_version_and_architecture() {
        let found = parse(STATUS, "/var/lib/dpkg/status");
        let got: Vec<(&str, &str, Option<&str>)> = found
            .iter()
            .map(|p| (p.name.as_str(), p.version.as_str(), p.arch.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("base-files", "12.4+deb12u5", Some("arm64")),
                ("libc6", "2.36-9+deb12u7", Some("arm64")),
            ]
        );
        assert!(found.iter().all(|p| p.license.is_none()));
        assert_eq!(found[0].source, "/var/lib/dpkg/status");
    }

    #[test]
    fn a_distroless_status_d_file_has_no_status_field() {
        let text = b"Package: tzdata\nVersion: 2024a-0+deb12u1\nArchitecture: all\nMaintainer: x\n";
        let found = parse(text, "/var/lib/dpkg/status.d/tzdata");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "tzdata");
    }

    #[test]
    fn garbage_gives_no_package_and_no_panic() {
        for input in [
            &b""[..],
            b"\xff\xfe\x00\x01",
            b"Package:\nVersion:\n",
            b":::\n\n\n: x\nPackage: only-a-name",
            b"\n\n\n",
        ] {
            assert!(parse(input, "/x").is_empty(), "{input:?}");
        }
        let mut noise = Vec::new();
        let mut x: u32 = 7;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            noise.push((x >> 16) as u8);
        }
        parse(&noise, "/x");
    }
}

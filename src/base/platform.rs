//! Platforms (`os/arch[/variant]`), normalised the way containerd does so that
//! `arm64` and `arm64/v8` compare equal while `arm/v7` and `arm/v6` do not.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    /// Only kept where it distinguishes binaries (`arm/v7`); `arm64/v8` is stored as `arm64`.
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a platform: {reason} (expected os/arch[/variant], e.g. linux/amd64, linux/arm64, linux/arm/v7)")]
pub struct PlatformParseError {
    pub input: String,
    pub reason: String,
}

impl Platform {
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Self {
        let (architecture, variant) = normalize_arch(
            &architecture.to_ascii_lowercase(),
            variant.map(|v| v.to_ascii_lowercase()).as_deref(),
        );
        Platform {
            os: os.to_ascii_lowercase(),
            architecture,
            variant,
        }
    }

    pub fn linux(architecture: &str, variant: Option<&str>) -> Self {
        Self::new("linux", architecture, variant)
    }

    /// The architecture as `TARGETARCH` and `GOARCH` spell it.
    pub fn arch(&self) -> &str {
        &self.architecture
    }

    /// `TARGETVARIANT` as buildx sets it: arm64 builds see `v8`.
    pub fn build_variant(&self) -> Option<&str> {
        match (self.architecture.as_str(), self.variant.as_deref()) {
            ("arm64", None) => Some("v8"),
            (_, v) => v,
        }
    }

    /// `os/arch` for compare-ignoring-variant uses (node pools only know os and arch).
    pub fn os_arch(&self) -> String {
        format!("{}/{}", self.os, self.architecture)
    }
}

/// containerd's `platforms.Normalize` for the architectures images are built for.
fn normalize_arch(arch: &str, variant: Option<&str>) -> (String, Option<String>) {
    let variant = variant.filter(|v| !v.is_empty());
    match (arch, variant) {
        ("i386" | "i486" | "i586" | "i686" | "x86", v) => ("386".into(), v.map(str::to_string)),
        ("x86_64" | "x86-64" | "amd64", Some("v1")) | ("x86_64" | "x86-64" | "amd64", None) => {
            ("amd64".into(), None)
        }
        ("x86_64" | "x86-64" | "amd64", Some(v)) => ("amd64".into(), Some(v.to_string())),
        ("aarch64" | "arm64", Some("v8") | Some("8")) | ("aarch64" | "arm64", None) => {
            ("arm64".into(), None)
        }
        ("aarch64" | "arm64", Some(v)) => ("arm64".into(), Some(v.to_string())),
        ("armhf", _) => ("arm".into(), Some("v7".into())),
        ("armel", _) => ("arm".into(), Some("v6".into())),
        ("arm", None | Some("7")) | ("arm", Some("v7")) => ("arm".into(), Some("v7".into())),
        ("arm", Some("5")) => ("arm".into(), Some("v5".into())),
        ("arm", Some("6")) => ("arm".into(), Some("v6".into())),
        ("arm", Some("8")) => ("arm".into(), Some("v8".into())),
        (a, v) => (a.to_string(), v.map(str::to_string)),
    }
}

impl FromStr for Platform {
    type Err = PlatformParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| PlatformParseError {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Err(err("it is empty"));
        }
        let parts: Vec<&str> = trimmed.split('/').collect();
        if parts.len() > 3 {
            return Err(err("it has more than three parts"));
        }
        if parts.iter().any(|p| p.is_empty()) {
            return Err(err("it has an empty part"));
        }
        if let Some(bad) = parts.iter().find(|p| {
            !p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        }) {
            return Err(err(&format!(
                "`{bad}` has characters other than letters, digits, ., _ and -"
            )));
        }
        let known_os = |os: &str| KNOWN_OS.contains(&os.to_ascii_lowercase().as_str());
        let platform = match parts.as_slice() {
            [os, arch] if known_os(os) => Platform::new(os, arch, None),
            [os, arch, variant] if known_os(os) => Platform::new(os, arch, Some(variant)),
            [os] if known_os(os) => {
                return Err(err(&format!(
                    "`{os}` names only the operating system; add the architecture, e.g. {}/amd64",
                    os.to_ascii_lowercase()
                )))
            }
            // containerd accepts a bare architecture and assumes linux.
            [arch] => Platform::new("linux", arch, None),
            [os, ..] => return Err(err(&format!("unknown operating system `{os}`"))),
            [] => return Err(err("it is malformed")),
        };
        if !KNOWN_ARCH.contains(&platform.architecture.as_str()) {
            return Err(err(&format!(
                "unknown architecture `{}` (known: {})",
                platform.architecture,
                KNOWN_ARCH.join(", ")
            )));
        }
        if let Some(variant) = &platform.variant {
            if !known_variant(&platform.architecture, variant) {
                return Err(err(&format!(
                    "`{}` has no variant `{variant}`{}",
                    platform.architecture,
                    match platform.architecture.as_str() {
                        "arm" => " (arm: v5, v6, v7, v8)",
                        "arm64" => " (arm64: v8, v8.N, v9, v9.N)",
                        "amd64" => " (amd64: v1, v2, v3, v4)",
                        _ => "",
                    }
                )));
            }
        }
        Ok(platform)
    }
}

/// GOARCH values, as image configs and buildx spell them (after normalisation).
const KNOWN_ARCH: &[&str] = &[
    "amd64", "arm64", "arm", "386", "ppc64le", "ppc64", "s390x", "riscv64", "mips", "mipsle",
    "mips64", "mips64le", "loong64", "wasm", "unknown",
];

/// Variants containerd knows, after normalisation (`arm64/v8` and `amd64/v1` are none).
fn known_variant(arch: &str, variant: &str) -> bool {
    let point_release = |major: &str| {
        variant == major
            || variant
                .strip_prefix(major)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|minor| !minor.is_empty() && minor.chars().all(|c| c.is_ascii_digit()))
    };
    match arch {
        "arm" => matches!(variant, "v5" | "v6" | "v7" | "v8"),
        "arm64" => point_release("v8") || point_release("v9"),
        "amd64" => matches!(variant, "v2" | "v3" | "v4"),
        _ => false,
    }
}

const KNOWN_OS: &[&str] = &[
    "linux",
    "windows",
    "darwin",
    "freebsd",
    "netbsd",
    "openbsd",
    "illumos",
    "solaris",
    "android",
    "ios",
    "aix",
    "plan9",
    "dragonfly",
    "wasip1",
    "js",
    "unknown",
];

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.variant {
            Some(v) => write!(f, "{}/{}/{}", self.os, self.architecture, v),
            None => write!(f, "{}/{}", self.os, self.architecture),
        }
    }
}

impl Serialize for Platform {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Platform {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Platform {
        s.parse().unwrap()
    }

    #[test]
    fn normalises_like_containerd() {
        assert_eq!(p("linux/arm64"), p("linux/arm64/v8"));
        assert_eq!(p("linux/aarch64"), p("linux/arm64"));
        assert_eq!(p("linux/x86_64"), p("linux/amd64"));
        assert_eq!(p("linux/arm"), p("linux/arm/v7"));
        assert_ne!(p("linux/arm/v7"), p("linux/arm/v6"));
        assert_eq!(p("arm64").to_string(), "linux/arm64");
        assert_eq!(p("Linux/AMD64").to_string(), "linux/amd64");
        assert_eq!(p("linux/arm/v7").to_string(), "linux/arm/v7");
        assert_eq!(p("linux/i386").to_string(), "linux/386");
    }

    #[test]
    fn only_real_architectures_and_variants_parse() {
        for bad in [
            "linux",
            "linux/foo",
            "linux/arm/v9",
            "linux/amd64/v7",
            "linux/386/v2",
        ] {
            assert!(bad.parse::<Platform>().is_err(), "{bad} parsed");
        }
        assert!("linux"
            .parse::<Platform>()
            .unwrap_err()
            .to_string()
            .contains("add the architecture"));
        for good in [
            "arm64",
            "linux/arm64/v8.2",
            "linux/arm64/v9",
            "linux/amd64/v3",
            "linux/arm/v6",
        ] {
            assert!(good.parse::<Platform>().is_ok(), "{good} refused");
        }
        assert_eq!(p("linux/arm64/v8"), p("arm64"));
    }

    #[test]
    fn build_variant_matches_buildx() {
        assert_eq!(p("linux/arm64").build_variant(), Some("v8"));
        assert_eq!(p("linux/amd64").build_variant(), None);
        assert_eq!(p("linux/arm/v6").build_variant(), Some("v6"));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "linux/",
            "/amd64",
            "linux/amd64/v8/x",
            "linux/am d64",
            "plan10/amd64",
        ] {
            assert!(bad.parse::<Platform>().is_err(), "{bad:?} parsed");
        }
    }
}

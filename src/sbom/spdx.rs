//! The SPDX 2.3 JSON document of one platform image's catalog, and the in-toto statement
//! that carries it. Deterministic: the same image always gives the same bytes (the
//! creation time is the image's own, from its config).

use super::{Catalog, Ecosystem, Package};
use crate::base::attachment::{SPDX_DOCUMENT, STATEMENT_TYPE};
use crate::base::digest::Digest;
use crate::base::platform::Platform;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use time::format_description::well_known::Rfc3339;

/// The platform image an SBOM describes.
pub struct Subject<'a> {
    /// The repository, e.g. `registry.example/team/api`.
    pub repository: &'a str,
    pub digest: &'a Digest,
    pub platform: &'a Platform,
    /// The image config's `created`, when it has one.
    pub created: Option<&'a str>,
}

const IMAGE_ID: &str = "SPDXRef-Image";
/// When the image gives no creation time: the epoch, so the document stays reproducible.
const NO_TIME: &str = "1970-01-01T00:00:00Z";

/// SPDX licence ids taken as written; any other licence text becomes a `LicenseRef-`.
const KNOWN_LICENSES: &[&str] = &[
    "0BSD",
    "AGPL-3.0-only",
    "AGPL-3.0-or-later",
    "Apache-2.0",
    "Artistic-2.0",
    "BSD-1-Clause",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "BSL-1.0",
    "CC0-1.0",
    "CC-BY-4.0",
    "EPL-2.0",
    "GPL-1.0-or-later",
    "GPL-2.0-only",
    "GPL-2.0-or-later",
    "GPL-3.0-only",
    "GPL-3.0-or-later",
    "ISC",
    "LGPL-2.0-only",
    "LGPL-2.0-or-later",
    "LGPL-2.1-only",
    "LGPL-2.1-or-later",
    "LGPL-3.0-only",
    "LGPL-3.0-or-later",
    "MIT",
    "MIT-0",
    "MPL-2.0",
    "OpenSSL",
    "PSF-2.0",
    "Python-2.0",
    "Unlicense",
    "Zlib",
    "curl",
    "bzip2-1.0.6",
];

/// The SPDX document: the image as the described package, containing every package found.
pub fn document(subject: &Subject<'_>, catalog: &Catalog) -> Value {
    let platform = subject.platform.to_string();
    let name = format!("{}@{} ({platform})", subject.repository, subject.digest);
    let namespace = format!(
        "https://polyarch.dev/spdx/{}/{}/{}",
        subject.repository,
        platform.replace('/', "-"),
        subject.digest.to_string().replace(':', "-")
    );
    let mut packages = vec![json!({
        "SPDXID": IMAGE_ID,
        "name": subject.repository,
        "versionInfo": subject.digest,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
        "externalRefs": [purl_ref(image_purl(subject))],
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": IMAGE_ID,
    })];
    let mut extracted = BTreeMap::new();
    let mut ids = std::collections::HashSet::new();
    for package in &catalog.packages {
        let purl = purl(package, catalog);
        let id = format!(
            "SPDXRef-Package-{}-{}-{}",
            package.ecosystem.purl_type(),
            id_safe(&package.name),
            &Digest::of(format!("{purl}\0{}", package.source).as_bytes()).hex()[..12]
        );
        // The same purl read twice from one file (a crate from two sources, a package
        // listed twice) is one package: SPDX ids must be unique.
        if !ids.insert(id.clone()) {
            continue;
        }
        let declared = match &package.license {
            Some(text) => license(text, &mut extracted),
            None => "NOASSERTION".into(),
        };
        packages.push(json!({
            "SPDXID": id,
            "name": package.name,
            "versionInfo": package.version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": declared,
            "copyrightText": "NOASSERTION",
            "sourceInfo": format!("acquired package info from {}", package.source),
            "externalRefs": [purl_ref(purl)],
        }));
        relationships.push(json!({
            "spdxElementId": IMAGE_ID,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
    }
    let mut document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": namespace,
        "creationInfo": {
            "created": created(subject.created),
            "creators": [format!("Tool: polyarch-{}", env!("CARGO_PKG_VERSION"))],
        },
        "packages": packages,
        "relationships": relationships,
    });
    if !extracted.is_empty() {
        document["hasExtractedLicensingInfos"] = extracted
            .into_iter()
            .map(|(id, text)| json!({ "licenseId": id, "extractedText": text, "name": text }))
            .collect();
    }
    if !catalog.warnings.is_empty() {
        document["comment"] = json!(format!("Not read: {}", catalog.warnings.join("; ")));
    }
    document
}

/// The in-toto statement v1 carrying `document`, as BuildKit's SBOM attestations are.
pub fn statement(subject: &Subject<'_>, document: Value) -> Value {
    json!({
        "_type": STATEMENT_TYPE,
        "subject": [{
            "name": image_purl(subject),
            "digest": { subject.digest.algorithm(): subject.digest.hex() },
        }],
        "predicateType": SPDX_DOCUMENT,
        "predicate": document,
    })
}

/// The packages of an SPDX document by purl type (`deb`, `apk`, …), the image itself not
/// counted.
pub fn counts(document: &Value) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for package in document["packages"].as_array().into_iter().flatten() {
        if package["SPDXID"] == IMAGE_ID {
            continue;
        }
        let kind = package["externalRefs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["referenceType"] == "purl")
            .find_map(|r| r["referenceLocator"].as_str())
            .and_then(|p| p.strip_prefix("pkg:"))
            .and_then(|p| p.split('/').next())
            .unwrap_or("other");
        *counts.entry(kind.to_string()).or_insert(0) += 1;
    }
    counts
}

fn purl_ref(locator: String) -> Value {
    json!({
        "referenceCategory": "PACKAGE-MANAGER",
        "referenceType": "purl",
        "referenceLocator": locator,
    })
}

fn image_purl(subject: &Subject<'_>) -> String {
    let (base, name) = subject
        .repository
        .rsplit_once('/')
        .unwrap_or(("", subject.repository));
    let mut purl = format!(
        "pkg:oci/{}@{}?arch={}",
        encode(name),
        encode(subject.digest.as_str()),
        encode(&subject.platform.architecture)
    );
    if !base.is_empty() {
        purl += &format!("&repository_url={}", encode(subject.repository));
    }
    purl
}

/// `pkg:deb/debian/NAME@VERSION?arch=arm64&distro=debian-12`, and the like for each kind
/// (qualifiers in the canonical, sorted order).
pub fn purl(package: &Package, catalog: &Catalog) -> String {
    let distro = &catalog.distro;
    let name = encode(&package.name);
    let version = encode(&package.version);
    let mut qualifiers = Vec::new();
    let namespace = match package.ecosystem {
        Ecosystem::Deb | Ecosystem::Apk | Ecosystem::Rpm => {
            if let Some(arch) = &package.arch {
                qualifiers.push(format!("arch={}", encode(arch)));
            }
            if let Some(q) = distro.qualifier() {
                qualifiers.push(format!("distro={}", encode(&q)));
            }
            if let Some((epoch, _)) = rpm_epoch(package) {
                qualifiers.push(format!("epoch={epoch}"));
            }
            // rpm has no default distribution to name.
            let fallback = match package.ecosystem {
                Ecosystem::Deb => Some("debian"),
                Ecosystem::Apk => Some("alpine"),
                _ => None,
            };
            distro
                .id
                .as_deref()
                .or(fallback)
                .map(|id| format!("{id}/"))
                .unwrap_or_default()
        }
        Ecosystem::Golang | Ecosystem::Cargo => String::new(),
    };
    let (name, version) = match package.ecosystem {
        // A module path's segments are the namespace and name.
        Ecosystem::Golang => (
            package
                .name
                .split('/')
                .map(encode)
                .collect::<Vec<_>>()
                .join("/"),
            encode(
                package
                    .version
                    .strip_prefix("go")
                    .filter(|_| package.name == "stdlib")
                    .unwrap_or(&package.version),
            ),
        ),
        Ecosystem::Rpm => match rpm_epoch(package) {
            Some((_, version)) => (name, encode(version)),
            None => (name, version),
        },
        _ => (name, version),
    };
    let mut purl = format!(
        "pkg:{}/{namespace}{name}@{version}",
        package.ecosystem.purl_type()
    );
    if !qualifiers.is_empty() {
        purl += &format!("?{}", qualifiers.join("&"));
    }
    purl
}

/// An rpm package's epoch and the rest of its EVR: `1:5.2.26-3.fc40` is
/// `("1", "5.2.26-3.fc40")`. The purl spec's rpm type makes the epoch a qualifier.
fn rpm_epoch(package: &Package) -> Option<(&str, &str)> {
    (package.ecosystem == Ecosystem::Rpm)
        .then(|| package.version.split_once(':'))
        .flatten()
        .filter(|(epoch, _)| !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit()))
}

/// Percent-encodes all but the characters purl leaves bare.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out += &format!("%{byte:02X}");
        }
    }
    out
}

/// A name as an SPDX id allows it: letters, digits, `.` and `-`.
fn id_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A licence as written when it is an expression of known ids joined by `AND`/`OR`, with
/// balanced parentheses; otherwise a `LicenseRef-` carrying the text, added to `extracted`.
fn license(text: &str, extracted: &mut BTreeMap<String, String>) -> String {
    let spaced = text.replace('(', " ( ").replace(')', " ) ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut at = 0;
    if expression(&tokens, &mut at) && at == tokens.len() {
        return tokens.join(" ").replace("( ", "(").replace(" )", ")");
    }
    if text.trim().is_empty() {
        return "NOASSERTION".into();
    }
    let id = format!("LicenseRef-{}", id_safe(text.trim()));
    extracted.insert(id.clone(), text.to_string());
    id
}

/// `term ((AND | OR) term)*` from `tokens[*at..]`, advancing `at` past it.
fn expression(tokens: &[&str], at: &mut usize) -> bool {
    if !term(tokens, at) {
        return false;
    }
    while matches!(tokens.get(*at), Some(&"AND" | &"OR")) {
        *at += 1;
        if !term(tokens, at) {
            return false;
        }
    }
    true
}

/// A known licence id, or a parenthesised expression.
fn term(tokens: &[&str], at: &mut usize) -> bool {
    match tokens.get(*at) {
        Some(&"(") => {
            *at += 1;
            let inner = expression(tokens, at) && tokens.get(*at) == Some(&")");
            *at += 1;
            inner
        }
        Some(id) if KNOWN_LICENSES.contains(id) => {
            *at += 1;
            true
        }
        _ => false,
    }
}

/// SPDX's `created`: UTC to the second, `YYYY-MM-DDThh:mm:ssZ`.
fn created(config_created: Option<&str>) -> String {
    config_created
        .and_then(|t| time::OffsetDateTime::parse(t, &Rfc3339).ok())
        .map(|t| {
            t.to_offset(time::UtcOffset::UTC)
                .replace_nanosecond(0)
                .unwrap_or(t)
        })
        .and_then(|t| {
            t.format(time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
            ))
            .ok()
        })
        .unwrap_or_else(|| NO_TIME.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sbom::Distro;

    fn package(ecosystem: Ecosystem, name: &str, version: &str, arch: Option<&str>) -> Package {
        Package {
            ecosystem,
            name: name.into(),
            version: version.into(),
            arch: arch.map(str::to_string),
            license: None,
            source: "/var/lib/dpkg/status".into(),
        }
    }

    fn catalog() -> Catalog {
        let mut apk = package(Ecosystem::Apk, "musl", "1.2.4-r2", Some("aarch64"));
        apk.license = Some("MIT AND (GPL-2.0-only OR BSD-2-Clause)".into());
        let mut odd = package(Ecosystem::Apk, "odd", "1", None);
        odd.license = Some("custom:weird licence".into());
        Catalog {
            packages: vec![
                package(Ecosystem::Deb, "libc6", "1:2.36-9+deb12u7", Some("arm64")),
                apk,
                odd,
                package(Ecosystem::Rpm, "bash", "1:5.2.26-3.fc40", Some("x86_64")),
                package(Ecosystem::Rpm, "gpg-pubkey", "a15b79cc-63d04c2c", None),
                package(Ecosystem::Golang, "github.com/a/b", "v1.2.3", None),
                package(Ecosystem::Golang, "stdlib", "go1.22.2", None),
                package(Ecosystem::Cargo, "regex", "1.10.4", None),
                Package {
                    license: Some("MIT".into()),
                    ..package(Ecosystem::Cargo, "regex", "1.10.4", None)
                },
            ],
            distro: Distro {
                id: Some("debian".into()),
                version_id: Some("12".into()),
            },
            warnings: vec![
                "/var/lib/rpm/Packages is an RPM Berkeley DB database, which is not read".into(),
            ],
        }
    }

    fn subject<'a>(digest: &'a Digest, platform: &'a Platform) -> Subject<'a> {
        Subject {
            repository: "registry.example:5000/team/api",
            digest,
            platform,
            created: Some("2024-05-01T10:20:30.123456789+02:00"),
        }
    }

    #[test]
    fn purls_for_each_kind() {
        let catalog = catalog();
        let purls: Vec<String> = catalog.packages.iter().map(|p| purl(p, &catalog)).collect();
        assert_eq!(
            purls,
            [
                "pkg:deb/debian/libc6@1%3A2.36-9%2Bdeb12u7?arch=arm64&distro=debian-12",
                "pkg:apk/debian/musl@1.2.4-r2?arch=aarch64&distro=debian-12",
                "pkg:apk/debian/odd@1?distro=debian-12",
                "pkg:rpm/debian/bash@5.2.26-3.fc40?arch=x86_64&distro=debian-12&epoch=1",
                "pkg:rpm/debian/gpg-pubkey@a15b79cc-63d04c2c?distro=debian-12",
                "pkg:golang/github.com/a/b@v1.2.3",
                "pkg:golang/stdlib@1.22.2",
                "pkg:cargo/regex@1.10.4",
                "pkg:cargo/regex@1.10.4",
            ]
        );
        // No os-release: an rpm purl names no namespace (rpm has no default distribution).
        let bare = Catalog {
            distro: Distro::default(),
            ..catalog
        };
        assert_eq!(
            purl(&bare.packages[3], &bare),
            "pkg:rpm/bash@5.2.26-3.fc40?arch=x86_64&epoch=1"
        );
    }

    #[test]
    fn the_document_describes_the_image_containing_each_package() {
        let digest = Digest::of(b"manifest");
        let platform: Platform = "linux/arm64".parse().unwrap();
        let doc = document(&subject(&digest, &platform), &catalog());
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["creationInfo"]["created"], "2024-05-01T08:20:30Z");
        assert!(doc["name"].as_str().unwrap().contains(digest.as_str()));
        assert!(doc["documentNamespace"]
            .as_str()
            .unwrap()
            .ends_with(&format!("linux-arm64/sha256-{}", digest.hex())));
        let packages = doc["packages"].as_array().unwrap();
        assert_eq!(packages.len(), 9);
        assert_eq!(doc["relationships"].as_array().unwrap().len(), 9);
        assert_eq!(
            packages[2]["licenseDeclared"],
            "MIT AND (GPL-2.0-only OR BSD-2-Clause)"
        );
        assert_eq!(
            packages[3]["licenseDeclared"],
            "LicenseRef-custom-weird-licence"
        );
        assert_eq!(
            doc["hasExtractedLicensingInfos"][0]["extractedText"],
            "custom:weird licence"
        );
        assert_eq!(
            packages[1]["sourceInfo"],
            "acquired package info from /var/lib/dpkg/status"
        );
        let ids: std::collections::HashSet<&str> = packages
            .iter()
            .map(|p| p["SPDXID"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 9);
        assert!(ids.iter().all(|id| id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')));
        assert_eq!(
            counts(&doc),
            BTreeMap::from([
                ("apk".to_string(), 2),
                ("cargo".to_string(), 1),
                ("deb".to_string(), 1),
                ("golang".to_string(), 2),
                ("rpm".to_string(), 2)
            ])
        );
        // The same image gives the same document.
        assert_eq!(doc, document(&subject(&digest, &platform), &catalog()));
    }

    #[test]
    fn only_well_formed_expressions_of_known_ids_are_kept_as_written() {
        let mut extracted = BTreeMap::new();
        for kept in ["MIT", "MIT AND (GPL-2.0-only OR BSD-2-Clause)", "((MIT))"] {
            assert_eq!(license(kept, &mut extracted), kept);
        }
        for other in [
            "(MIT",
            "MIT)",
            "MIT AND",
            "AND MIT",
            "MIT MIT",
            "()",
            "GPL-2.0 WITH x",
            "Public-Domain",
        ] {
            assert!(
                license(other, &mut extracted).starts_with("LicenseRef-"),
                "{other}"
            );
        }
        assert_eq!(license(" ", &mut extracted), "NOASSERTION");
    }

    #[test]
    fn the_statement_names_the_platform_manifest() {
        let digest = Digest::of(b"manifest");
        let platform: Platform = "linux/amd64".parse().unwrap();
        let s = subject(&digest, &platform);
        let statement = statement(&s, document(&s, &Catalog::default()));
        assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
        assert_eq!(statement["predicateType"], "https://spdx.dev/Document");
        assert_eq!(statement["subject"][0]["digest"]["sha256"], digest.hex());
        assert_eq!(created(None), NO_TIME);
        assert_eq!(created(Some("garbage")), NO_TIME);
    }
}

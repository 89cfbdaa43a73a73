//! What a user's supply-chain tools see of what polyarch attached: cosign 3.1.1 from
//! Debian sid (`scripts/cosign.sh`, fetched by `make test` first, so these checks never
//! skip) and the SPDX tools (`pyspdxtools`, from PyPI through `scripts/ensure-env.sh`).

use super::{polyarch, repo_root, run, skopeo_inspect_raw};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cosign key pair in fixtures/sign (made by `cosign generate-key-pair`) and its password.
pub const FIXTURE_PASSWORD: &str = "polyarch-fixture";

pub fn fixture_key() -> PathBuf {
    repo_root().join("fixtures/sign/cosign.key")
}

pub fn fixture_public_key() -> PathBuf {
    repo_root().join("fixtures/sign/cosign.pub")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn cosign() -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("scripts/cosign.sh")));
    assert!(out.status.success(), "no cosign: {}", stderr(&out));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn cosign_command(subcommand: &str) -> Command {
    let mut command = Command::new(cosign());
    command
        .args([subcommand, "--allow-http-registry"])
        // Offline: no TUF root to fetch for a keyed, log-less check.
        .env("TUF_ROOT", tempfile::tempdir().unwrap().path());
    command
}

/// `cosign verify --key PUBLIC --insecure-ignore-tlog=true REFERENCE`.
pub fn cosign_verify(public: &Path, reference: &str) -> Output {
    run(cosign_command("verify")
        .args(["--insecure-ignore-tlog=true", "--key"])
        .arg(public)
        .arg(reference))
}

/// `cosign tree REFERENCE`: what it lists as attached.
pub fn cosign_tree(reference: &str) -> String {
    let out = run(cosign_command("tree").arg(reference));
    assert!(
        out.status.success(),
        "cosign tree {reference}: {}",
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The index `reference` (`host/repo:tag` on a plain-HTTP registry) and each of its
/// platform manifests carry a signature by `public` that `cosign verify` accepts and
/// `cosign tree` lists; each platform has an SBOM that `cosign tree` lists and
/// `pyspdxtools` validates.
pub fn assert_signed_with_sboms(reference: &str, public: &Path) {
    let repository = reference.rsplit_once(':').unwrap().0;
    let index = skopeo_inspect_raw(reference);
    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let platform = &e["platform"];
            (
                format!(
                    "{}/{}",
                    platform["os"].as_str().unwrap(),
                    platform["architecture"].as_str().unwrap()
                ),
                e["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(!platforms.is_empty(), "{index}");
    let by_digest = platforms.iter().map(|(_, d)| format!("{repository}@{d}"));
    for target in std::iter::once(reference.to_string()).chain(by_digest) {
        let out = cosign_verify(public, &target);
        assert!(
            out.status.success(),
            "cosign verify {target}: {}",
            stderr(&out)
        );
        let tree = cosign_tree(&target);
        assert!(
            tree.contains("https://sigstore.dev/cosign/sign/v1"),
            "{target}: {tree}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    for (platform, digest) in &platforms {
        let tree = cosign_tree(&format!("{repository}@{digest}"));
        assert!(
            tree.contains("application/vnd.in-toto+json"),
            "{platform}: {tree}"
        );
        let out = run(polyarch().args(["sbom", reference, "--platform", platform]));
        assert!(
            out.status.success(),
            "polyarch sbom {platform}: {}",
            stderr(&out)
        );
        let document = dir
            .path()
            .join(format!("{}.spdx.json", platform.replace('/', "-")));
        assert_spdx_tools_accept(&document, &out.stdout);
    }
}

/// Writes an SBOM to `path` and asserts that `pyspdxtools -i` validates it.
pub fn assert_spdx_tools_accept(path: &Path, document: &[u8]) {
    std::fs::write(path, document).unwrap();
    let checked = run(Command::new("pyspdxtools").arg("-i").arg(path));
    assert!(
        checked.status.success(),
        "pyspdxtools refused {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&checked.stdout),
        stderr(&checked)
    );
}

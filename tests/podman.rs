//! Podman 4.3 as the engine, through its Docker-compatible API (`scripts/podman.sh`):
//! what a Podman user checks after `polyarch build`. The tests are named `podman_` so that
//! `make test` runs them once, in a pass of their own.

mod support;

use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use support::engines::{podman_cli, podman_host};
use support::{hello_context, polyarch, run, skopeo_inspect_raw, unique_name, Registry};

/// busybox per platform, a nonce so no other build made these layers, and a RUN step that
/// writes the architecture it ran on (QEMU for arm64 on this host).
const UNAME: &str = "FROM scratch
ARG TARGETARCH
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY nonce /nonce
RUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox uname -m > /arch\"]
ENTRYPOINT [\"/bin/busybox\", \"cat\", \"/arch\"]
";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A two-platform project in `dir` whose one image is named `name`.
fn project(dir: &Path, name: &str, repository: &str) -> std::path::PathBuf {
    hello_context(dir, UNAME);
    fs::write(dir.join("nonce"), unique_name("nonce")).unwrap();
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  {name}:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n"
        ),
    )
    .unwrap();
    file
}

/// polyarch aimed at Podman's service.
fn on_podman() -> Command {
    let mut cmd = polyarch();
    cmd.env("DOCKER_HOST", podman_host());
    cmd
}

/// `podman run --platform P REF` on the service's storage: what the image prints. Rootful
/// Podman's default open-files limit is refused on this kind of host, so ask for less.
fn podman_run(platform: &str, reference: &str) -> String {
    let out = run(podman_cli().args([
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--tls-verify=false",
        "--pull",
        "always",
        "--platform",
        platform,
        reference,
    ]));
    assert!(
        out.status.success(),
        "podman run {platform}: {}",
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn podman_two_platform_build_with_a_qemu_run_step_is_one_index_podman_runs() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("pmtwo");
    let repo = registry.repo(&unique_name("podman/two"));
    let file = project(dir.path(), &name, &repo);

    let out = run(on_podman()
        .args(["build", "--binfmt", "auto", "--output-format", "json", "-f"])
        .arg(&file)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");

    // skopeo reads back one index with exactly the two platforms.
    let index = skopeo_inspect_raw(&format!("{repo}:v1"));
    let mut platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("not an index: {index:#}"))
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index:#}");

    // Podman itself runs each platform's image; the RUN step ran on that architecture.
    assert_eq!(podman_run("linux/arm64", &format!("{repo}:v1")), "aarch64");
    assert_eq!(podman_run("linux/amd64", &format!("{repo}:v1")), "x86_64");
    let _ = run(podman_cli().args(["rmi", "-f", &format!("{repo}:v1")]));
}

#[test]
fn podman_doctor_names_podman_and_its_version() {
    let out = run(on_podman().args(["doctor", "--output-format", "json"]));
    let checks: Value = serde_json::from_slice(&out.stdout).expect("checks");
    let text = checks.to_string();
    assert!(text.contains("Podman 4."), "{checks:#}");
    assert!(text.contains("has no BuildKit"), "{checks:#}");
}

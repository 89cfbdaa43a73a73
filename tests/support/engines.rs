//! Docker Engine 26.1 beside the machine's engine, started by
//! `scripts/engine26.sh` (Debian trixie's docker.io unpacked under
//! /opt/polyarch/docker26; see the script's header).
//!
//! * [`docker26_host`]: `DOCKER_HOST` of the engine for a store
//!   (`"containerd"`: containerd image store, multi-platform images;
//!   `"classic"`: graph-driver store), started once per test process.
//! * [`docker26_cli`]: a `Command` for the 26.1 `docker` CLI (buildx 0.13.1
//!   plugin included) aimed at that engine.
//!
//! Neither skips: when the engine cannot be started the test panics with the
//! script's output. The script is idempotent and locks (flock), so test
//! binaries running at the same time may all call it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::repo_root;

/// The stores `scripts/engine26.sh` knows.
pub const DOCKER26_STORES: [&str; 2] = ["containerd", "classic"];

fn cell(store: &str) -> &'static OnceLock<String> {
    static CONTAINERD: OnceLock<String> = OnceLock::new();
    static CLASSIC: OnceLock<String> = OnceLock::new();
    match store {
        "containerd" => &CONTAINERD,
        "classic" => &CLASSIC,
        other => {
            panic!("unknown Docker 26.1 store {other:?} (expected one of {DOCKER26_STORES:?})")
        }
    }
}

/// Runs `bash scripts/engine26.sh ARGS…` and returns its stdout; panics with
/// its status, stdout and stderr when it fails.
fn engine26(args: &[&str]) -> String {
    let script = repo_root().join("scripts/engine26.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn bash {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bash scripts/engine26.sh {} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `DOCKER_HOST` (`unix:///run/polyarch/docker26-STORE.sock`) of Docker 26.1
/// with the given store, `"containerd"` or `"classic"`. The first call in a
/// process runs `scripts/engine26.sh start STORE` (installs and starts the
/// engine when needed, a quick check otherwise); later calls return the
/// cached value. Panics with the script's output when that fails.
pub fn docker26_host(store: &str) -> String {
    cell(store)
        .get_or_init(|| {
            let stdout = engine26(&["start", store]);
            let host = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty());
            match host {
                Some(h) if h.starts_with("unix://") => h.to_string(),
                _ => panic!(
                    "scripts/engine26.sh start {store}: no DOCKER_HOST in its output:\n{stdout}"
                ),
            }
        })
        .clone()
}

/// Directory of the 26.1 `docker` CLI (`scripts/engine26.sh bin`).
pub fn docker26_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| PathBuf::from(engine26(&["bin"]).trim()))
        .clone()
}

/// Private `DOCKER_CONFIG` with `cli-plugins/docker-buildx` (0.13.1)
/// (`scripts/engine26.sh docker-config`); `~/.docker` is never used.
pub fn docker26_config_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| PathBuf::from(engine26(&["docker-config"]).trim()))
        .clone()
}

/// `docker` 26.1 with `DOCKER_HOST` and `DOCKER_CONFIG` set for the engine of
/// `store` (started if needed), e.g. `docker26_cli("containerd").args(["buildx",
/// "build", "--platform", "linux/amd64,linux/arm64", …])`. That engine has its
/// own bridge without NAT: containers reach the host, nothing beyond.
pub fn docker26_cli(store: &str) -> Command {
    let host = docker26_host(store);
    let mut cmd = Command::new(docker26_bin_dir().join("docker"));
    cmd.env("DOCKER_HOST", host)
        .env("DOCKER_CONFIG", docker26_config_dir())
        .env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH");
    cmd
}

/// Whether the engine the tests build on (`DOCKER_HOST`, else the machine's) keeps
/// images in containerd's store, where polyarch lets BuildKit push platform images to a
/// loopback registry itself instead of exporting and uploading them.
pub fn engine_pushes_itself() -> bool {
    static STORE: OnceLock<bool> = OnceLock::new();
    *STORE.get_or_init(|| {
        let out = Command::new("docker")
            .args(["info", "--format", "{{json .DriverStatus}}"])
            .output()
            .expect("docker info");
        assert!(out.status.success(), "docker info: {out:?}");
        String::from_utf8_lossy(&out.stdout).contains("io.containerd.snapshotter.v1")
    })
}

/// `DOCKER_HOST` (`unix:///run/polyarch/podman.sock`) of Podman 4.3's Docker-compatible
/// service, started once per test process by `scripts/podman.sh start` (installs Podman
/// and starts the service when needed). Panics with the script's output when that fails.
pub fn podman_host() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let script = repo_root().join("scripts/podman.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("spawn bash {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "bash scripts/podman.sh start failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.trim().to_string()
    })
    .clone()
}

/// The `podman` CLI on the storage of the service [`podman_host`] starts
/// (`scripts/podman.sh podman ARGS…`).
pub fn podman_cli() -> Command {
    podman_host();
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("scripts/podman.sh")).arg("podman");
    cmd
}

/// The Docker 28.5 CLI with buildx 0.29.1 (`scripts/engine28.sh install`, once per test
/// process; no engine is started) and its private `DOCKER_CONFIG`, for what needs no
/// builder, e.g. `docker buildx bake --print`. Panics with the script's output when the
/// install fails: it never skips.
pub fn docker28_client() -> Command {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    let (bin, config) = DIRS.get_or_init(|| {
        let script = |args: &[&str]| {
            let out = Command::new("bash")
                .arg(repo_root().join("scripts/engine28.sh"))
                .args(args)
                .current_dir(repo_root())
                .stdin(Stdio::null())
                .output()
                .expect("spawn bash scripts/engine28.sh");
            assert!(
                out.status.success(),
                "bash scripts/engine28.sh {} failed ({}):\n{}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        };
        script(&["install"]);
        (script(&["bin"]), script(&["docker-config"]))
    });
    let mut cmd = Command::new(bin.join("docker"));
    cmd.env("DOCKER_CONFIG", config)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT");
    cmd
}

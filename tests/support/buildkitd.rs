//! The machine's standalone buildkitd (scripts/buildkitd.sh), started when it does not
//! answer: a unix socket, and TCP on 127.0.0.1 with mutual TLS.

use std::path::PathBuf;
use std::process::Command;

/// Where the script's daemon listens.
pub struct Buildkitd {
    /// `unix:///run/polyarch/buildkitd.sock`
    pub unix: String,
    /// `tcp://127.0.0.1:PORT` (mutual TLS)
    pub tcp: String,
    /// The client's `ca.pem`, `cert.pem`, `key.pem` (and the CA's `ca.key`).
    pub tls: PathBuf,
}

fn script(command: &str) -> String {
    let out = Command::new("bash")
        .arg(super::repo_root().join("scripts/buildkitd.sh"))
        .arg(command)
        .output()
        .expect("run scripts/buildkitd.sh");
    assert!(
        out.status.success(),
        "scripts/buildkitd.sh {command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Starts the daemon if it does not answer (idempotent; safe from parallel tests).
pub fn shared() -> Buildkitd {
    Buildkitd {
        unix: script("start"),
        tcp: script("tcp"),
        tls: PathBuf::from(script("tls")),
    }
}

/// A buildkitd of one test's own: its state, socket and TCP port (mutual TLS with the
/// machine daemon's certificates) are its alone, and it is killed on drop. BuildKit
/// reads which emulators the host has once, when it starts, so a test that needs
/// arm64 registers QEMU first (see `binfmt::register_qemu_aarch64`) and then starts one.
pub struct Private {
    pub unix: String,
    pub tcp: String,
    pub tls: PathBuf,
    child: std::process::Child,
    _state: tempfile::TempDir,
}

/// `BUILDKITD`/`BUILDCTL` when set, else what scripts/buildkit-debian.sh built (`shared`
/// starts the daemon, and so builds them, first).
fn binary(name: &str) -> PathBuf {
    let var = name.to_ascii_uppercase();
    std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let out = Command::new("bash")
                .arg(super::repo_root().join("scripts/buildkit-debian.sh"))
                .arg("dir")
                .output()
                .expect("run scripts/buildkit-debian.sh dir");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(name)
        })
}

/// The BuildKit version the daemon's binary reports (`buildkitd --version`: its third word).
pub fn binary_version() -> String {
    let out = Command::new(binary("buildkitd"))
        .arg("--version")
        .output()
        .expect("run buildkitd --version");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("buildkitd --version: {text}"))
        .to_string()
}

/// Whether the daemon at `address` answers `buildctl debug workers`.
pub fn answers(address: &str, tls: Option<&std::path::Path>) -> bool {
    let mut cmd = Command::new(binary("buildctl"));
    cmd.args(["--addr", address]);
    if let Some(dir) = tls {
        cmd.arg("--tlsdir").arg(dir);
    }
    cmd.args(["debug", "workers"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The repositories the image exporter of each build in the daemon's build history
/// pushed to (`buildctl debug histories`), one per recorded build.
pub fn recorded_repositories(address: &str) -> Vec<String> {
    let out = Command::new(binary("buildctl"))
        .args([
            "--addr",
            address,
            "debug",
            "histories",
            "--format",
            "{{json .}}",
        ])
        .output()
        .expect("run buildctl debug histories");
    assert!(
        out.status.success(),
        "buildctl debug histories: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .flat_map(|event| {
            let exporters = event["record"]["Exporters"].as_array().cloned();
            exporters.into_iter().flatten()
        })
        .filter_map(|exporter| exporter["Attrs"]["name"].as_str().map(str::to_string))
        .collect()
}

impl Private {
    pub fn start() -> Private {
        let tls = shared().tls;
        let state = tempfile::Builder::new()
            .prefix("polyarch-bkd-")
            .tempdir()
            .unwrap();
        let unix = format!("unix://{}", state.path().join("buildkitd.sock").display());
        let tcp = format!("tcp://127.0.0.1:{}", super::free_port());
        let log = std::fs::File::create(state.path().join("buildkitd.log")).unwrap();
        let mut child = Command::new(binary("buildkitd"))
            .arg("--root")
            .arg(state.path().join("root"))
            .args(["--addr", &unix, "--addr", &tcp])
            .arg("--tlscacert")
            .arg(tls.join("ca.pem"))
            .arg("--tlscert")
            .arg(tls.join("server.pem"))
            .arg("--tlskey")
            .arg(tls.join("server.key"))
            .args(["--oci-worker=true", "--containerd-worker=false"])
            // Its own trace socket: every buildkitd binds /run/buildkit/otel-grpc.sock by
            // default, and two tests' daemons starting at once collided on it.
            .arg("--otel-socket-path")
            .arg(state.path().join("otel-grpc.sock"))
            .env_remove("BUILDKIT_HOST")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start buildkitd");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !answers(&unix, None) {
            let log =
                std::fs::read_to_string(state.path().join("buildkitd.log")).unwrap_or_default();
            if let Some(status) = child.try_wait().unwrap() {
                panic!("buildkitd exited ({status}) before answering:\n{log}");
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("buildkitd did not answer within 60 s:\n{log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Private {
            unix,
            tcp,
            tls,
            child,
            _state: state,
        }
    }

    /// Stops the daemon now (a farm member going down mid-test).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Private {
    /// SIGTERM first so that the daemon unmounts its snapshots before its state goes.
    fn drop(&mut self) {
        // Already gone (`kill`): nothing to stop.
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.kill();
    }
}

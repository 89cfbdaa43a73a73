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

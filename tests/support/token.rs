//! A token-auth registry, as every public registry authenticates: [`TokenServer`] runs
//! `token-server.py` (RS256 JWTs, Python's `cryptography`) on a kernel-chosen port, and
//! [`Registry::start_token`] starts a distribution registry that trusts it. The server
//! logs every token request, so a test counts how many a run made.

use super::{run_ok, Registry, RegistryOptions};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use tempfile::TempDir;

pub const SERVICE: &str = "polyarch-test-registry";
pub const ISSUER: &str = "polyarch-test-issuer";

/// One token request as the server logged it.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    /// `GET` (Docker clients) or `POST` (OAuth form: BuildKit, containerd).
    pub method: String,
    /// Each `scope` asked for, e.g. `repository:a/b:pull,push`.
    pub scopes: Vec<String>,
    /// 200 granted, 401 refused.
    pub status: u16,
}

/// A running token server on 127.0.0.1. Killed on drop.
pub struct TokenServer {
    pub port: u16,
    /// Credentials it requires, when started with some.
    pub credentials: Option<(String, String)>,
    child: Child,
    dir: TempDir,
}

impl TokenServer {
    /// Grants every scope asked for; with `credentials`, only to requests that carry them.
    pub fn start(credentials: Option<(&str, &str)>) -> TokenServer {
        let dir = tempfile::Builder::new()
            .prefix("polyarch-token-")
            .tempdir()
            .expect("token server temp dir");
        let key = dir.path().join("signing.key");
        let cert = dir.path().join("signing.crt");
        run_ok(
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256"])
                .args(["-days", "2", "-subj", "/CN=polyarch test token signer"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        );
        let script = super::repo_root().join("tests/support/token-server.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .arg("--key")
            .arg(&key)
            .arg("--cert")
            .arg(&cert)
            .args(["--issuer", ISSUER, "--service", SERVICE])
            .arg("--log")
            .arg(dir.path().join("requests.jsonl"));
        if let Some((user, password)) = credentials {
            cmd.args(["--user", user, "--password", password]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3 token-server.py (python3-cryptography)");
        // The first line is the port, printed once the socket listens.
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line);
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("token-server.py did not start (printed {line:?})");
        };
        TokenServer {
            port,
            credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
            child,
            dir,
        }
    }

    pub fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    /// The certificate whose key signs the tokens (the registry's `rootcertbundle`).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("signing.crt")
    }

    /// Every token request so far, in order.
    pub fn requests(&self) -> Vec<TokenRequest> {
        let log =
            std::fs::read_to_string(self.dir.path().join("requests.jsonl")).unwrap_or_default();
        log.lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).expect("token log line");
                TokenRequest {
                    method: v["method"].as_str().unwrap_or_default().to_string(),
                    scopes: v["scopes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect(),
                    status: v["status"].as_u64().unwrap_or_default() as u16,
                }
            })
            .collect()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Plain HTTP with `auth: token`, trusting `server`'s tokens.
    pub fn start_token(server: &TokenServer) -> Registry {
        Self::start_token_at(server, &server.realm(), false)
    }

    /// `auth: token` trusting `server`'s tokens but sending clients to `realm`; `tls`: over
    /// HTTPS with a test CA, as [`Registry::start_tls`].
    pub fn start_token_at(server: &TokenServer, realm: &str, tls: bool) -> Registry {
        let section = format!(
            "auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            server.cert_path().display()
        );
        let options = RegistryOptions {
            tls,
            ..Default::default()
        };
        let mut registry = Self::start_auth(options, Some(section));
        registry.credentials = server.credentials.clone();
        registry
    }
}

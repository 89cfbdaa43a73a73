//! Registry credentials found the way the Docker CLI finds them.
//!
//! Order for one registry (the first that yields something wins):
//! 1. `--username` + `--password-stdin` (every registry of the run);
//! 2. `credHelpers[registry]` in the Docker config (`docker-credential-NAME get`);
//! 3. `credsStore` (same protocol), when it knows the registry;
//! 4. `auths[registry]`: `auth` (base64 `user:pass`), `username`/`password`, or
//!    `identitytoken`.
//!
//! The config is `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; a missing
//! file means anonymous access. Secrets never leave this module except inside the
//! returned [`Credential`], whose `Debug` is redacted.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

type Result<T, E = CredentialsError> = std::result::Result<T, E>;

/// Why the credentials for a registry cannot be found; the caller decides what it costs.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The Docker config exists but cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The Docker config is not JSON of the shape Docker writes: the user's to fix.
    #[error("{}: not a Docker config file ({source}); fix it or point DOCKER_CONFIG elsewhere", path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// An `auths` entry whose `auth` does not decode: the user's to fix.
    #[error("{}: auths.{registry}.auth is not base64 of user:password; run `docker login {registry}` again", path.display())]
    Auth { path: PathBuf, registry: String },
    /// A `docker-credential-*` helper the config names failed.
    #[error("registry {registry}: credential helper {program}: {source}")]
    Helper {
        registry: String,
        program: String,
        #[source]
        source: HelperError,
    },
}

/// How a `docker-credential-*` helper failed; never its output, which may hold secrets.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("cannot run it ({0}); install it on PATH or remove it from the Docker config")]
    Spawn(#[source] std::io::Error),
    #[error("did not finish ({0})")]
    Wait(#[source] std::io::Error),
    #[error("`get` failed ({0})")]
    Failed(std::process::ExitStatus),
    #[error("`get` did not answer {{\"Username\",\"Secret\"}} JSON")]
    Answer(#[source] serde_json::Error),
}

/// What a registry gets presented with.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    Basic {
        username: String,
        password: String,
    },
    /// An OAuth2 identity (refresh) token, `identitytoken` / helper user `<token>`.
    IdentityToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credential::IdentityToken(_) => write!(f, "IdentityToken(<redacted>)"),
        }
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

#[derive(serde::Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username")]
    username: String,
    #[serde(rename = "Secret")]
    secret: String,
}

/// The Docker config this process would read: `$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`.
pub fn config_path() -> Option<PathBuf> {
    config_dir().map(|dir| dir.join("config.json"))
}

/// The Docker CLI's configuration directory: `$DOCKER_CONFIG`, else `~/.docker`
/// (also where Docker contexts live).
pub fn config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker"))
}

/// Docker's names for Docker Hub.
fn is_docker_hub(host: &str) -> bool {
    matches!(
        host,
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    )
}

/// `https://host:port/v1/` → `host:port`; Docker Hub aliases → `docker.io`.
pub fn normalize_key(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = rest.split('/').next().unwrap_or(rest).to_ascii_lowercase();
    if is_docker_hub(&host) {
        "docker.io".into()
    } else {
        host
    }
}

/// The server URL a credential helper is asked about.
fn helper_server(registry: &str) -> String {
    if normalize_key(registry) == "docker.io" {
        "https://index.docker.io/v1/".into()
    } else {
        registry.to_string()
    }
}

/// Credentials for `registry` (`host[:port]` as in the image reference), or `None` for
/// anonymous access. `cli` is the `--username/--password-stdin` pair, which wins.
pub fn resolve(registry: &str, cli: Option<&(String, String)>) -> Result<Option<Credential>> {
    if let Some((username, password)) = cli {
        return Ok(Some(Credential::Basic {
            username: username.clone(),
            password: password.clone(),
        }));
    }
    let Some(path) = config_path() else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CredentialsError::Read { path, source }),
    };
    let config: ConfigFile = match serde_json::from_str(&text) {
        Ok(config) => config,
        Err(source) => return Err(CredentialsError::Config { path, source }),
    };
    lookup(&config, registry, &path)
}

fn lookup(
    config: &ConfigFile,
    registry: &str,
    path: &std::path::Path,
) -> Result<Option<Credential>> {
    let wanted = normalize_key(registry);
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| normalize_key(k) == wanted)
        .map(|(_, v)| v.as_str());
    if let Some(helper) = helper {
        return run_helper(helper, registry);
    }
    if let Some(store) = config.creds_store.as_deref().filter(|s| !s.is_empty()) {
        if let Some(found) = run_helper(store, registry)? {
            return Ok(Some(found));
        }
    }
    let Some(entry) = config
        .auths
        .iter()
        .find(|(k, _)| normalize_key(k) == wanted)
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    if let Some(token) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
        return Ok(Some(Credential::IdentityToken(token.to_string())));
    }
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64_decode(auth.trim())
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| {
                s.split_once(':')
                    .map(|(u, p)| (u.to_string(), p.to_string()))
            });
        return match decoded {
            Some((username, password)) => Ok(Some(Credential::Basic { username, password })),
            None => Err(CredentialsError::Auth {
                path: path.to_path_buf(),
                registry: registry.to_string(),
            }),
        };
    }
    match (&entry.username, &entry.password) {
        (Some(username), Some(password)) if !username.is_empty() => Ok(Some(Credential::Basic {
            username: username.clone(),
            password: password.clone(),
        })),
        _ => Ok(None),
    }
}

/// `docker-credential-NAME get` with the server URL on stdin. "Not found" answers mean
/// no credentials; anything else is an error naming the helper (never its output).
fn run_helper(name: &str, registry: &str) -> Result<Option<Credential>> {
    let program = format!("docker-credential-{name}");
    let fail = |source: HelperError| CredentialsError::Helper {
        registry: registry.to_string(),
        program: program.clone(),
        source,
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(HelperError::Spawn(e)))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(helper_server(registry).as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| fail(HelperError::Wait(e)))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
            + &String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
        if said.contains("not found") || said.contains("no credentials") {
            return Ok(None);
        }
        return Err(fail(HelperError::Failed(out.status)));
    }
    let answer: HelperAnswer =
        serde_json::from_slice(&out.stdout).map_err(|e| fail(HelperError::Answer(e)))?;
    if answer.secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(if answer.username == "<token>" {
        Credential::IdentityToken(answer.secret)
    } else {
        Credential::Basic {
            username: answer.username,
            password: answer.secret,
        }
    }))
}

/// Standard base64 (padding optional); `None` on any other byte.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> ConfigFile {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn keys_normalize_like_docker() {
        assert_eq!(normalize_key("https://127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(normalize_key("http://reg.example/v2/"), "reg.example");
        assert_eq!(normalize_key("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(normalize_key("Reg.Example:443"), "reg.example:443");
    }

    #[test]
    fn auths_entries_decode() {
        let c = config(
            r#"{"auths":{"https://a:1":{"auth":"dTpwOnc="},"b:2":{"username":"x","password":"y"},"c":{"identitytoken":"t"}}}"#,
        );
        let p = std::path::Path::new("config.json");
        assert_eq!(
            lookup(&c, "a:1", p).unwrap(),
            Some(Credential::Basic {
                username: "u".into(),
                password: "p:w".into()
            })
        );
        assert_eq!(
            lookup(&c, "b:2", p).unwrap(),
            Some(Credential::Basic {
                username: "x".into(),
                password: "y".into()
            })
        );
        assert_eq!(
            lookup(&c, "c", p).unwrap(),
            Some(Credential::IdentityToken("t".into()))
        );
        assert_eq!(lookup(&c, "d", p).unwrap(), None);
    }

    #[test]
    fn a_helper_that_cannot_run_is_a_helper_error_keeping_why() {
        use std::error::Error as _;
        let error = run_helper("polyarch-test-absent", "r.io").unwrap_err();
        assert!(
            error.to_string().starts_with(
                "registry r.io: credential helper docker-credential-polyarch-test-absent: cannot run it ("
            ),
            "{error}"
        );
        let CredentialsError::Helper { source, .. } = &error else {
            panic!("{error:?}");
        };
        assert!(matches!(source, HelperError::Spawn(_)));
        assert!(source.source().unwrap().is::<std::io::Error>());
    }

    #[test]
    fn a_helper_answer_that_is_not_json_says_so_never_what_it_said() {
        let error = CredentialsError::Helper {
            registry: "r.io".into(),
            program: "docker-credential-pass".into(),
            source: HelperError::Answer(serde_json::from_slice::<u8>(b"x").unwrap_err()),
        };
        assert_eq!(
            error.to_string(),
            r#"registry r.io: credential helper docker-credential-pass: `get` did not answer {"Username","Secret"} JSON"#
        );
    }

    #[test]
    fn a_config_that_is_not_json_or_an_auth_that_does_not_decode_names_the_file() {
        let error = CredentialsError::Config {
            path: "config.json".into(),
            source: serde_json::from_str::<ConfigFile>("{").unwrap_err(),
        };
        assert_eq!(
            error.to_string(),
            "config.json: not a Docker config file (EOF while parsing an object at line 1 column 1); fix it or point DOCKER_CONFIG elsewhere"
        );
        let c = config(r#"{"auths":{"a:1":{"auth":"***"}}}"#);
        let error = lookup(&c, "a:1", std::path::Path::new("config.json")).unwrap_err();
        assert!(matches!(error, CredentialsError::Auth { .. }));
        assert_eq!(
            error.to_string(),
            "config.json: auths.a:1.auth is not base64 of user:password; run `docker login a:1` again"
        );
    }

    #[test]
    fn debug_is_redacted() {
        let c = Credential::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn base64_matches_known_values() {
        assert_eq!(base64_decode("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("a*b").is_none());
    }
}

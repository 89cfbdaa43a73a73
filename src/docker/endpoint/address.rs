//! Engines as the Docker CLI names them: addresses (`unix://`, `tcp://`, `ssh://`) and
//! contexts in the Docker config directory.

use super::*;

/// A parsed address, before any file is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
    Ssh(SshTarget),
}

/// Whether `text` is written as an address (`scheme://…`) rather than a context name.
pub fn is_address(text: &str) -> bool {
    text.contains("://")
}

/// Parses `unix://`, `tcp://` (and `http://`, `https://` as bollard takes them) and
/// `ssh://` addresses.
pub fn parse_address(text: &str) -> Result<Address, EndpointError> {
    let bad = |reason: &str| EndpointError::Address {
        address: text.to_string(),
        reason: reason.to_string(),
    };
    let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
    match scheme {
        "unix" => {
            if rest.is_empty() || !rest.starts_with('/') {
                return Err(bad("a unix socket needs an absolute path"));
            }
            Ok(Address::Unix(PathBuf::from(rest)))
        }
        "tcp" | "http" | "https" => {
            let authority = rest.trim_end_matches('/');
            if authority.contains('/') {
                return Err(bad("a tcp address has no path"));
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("no host"))?;
            let port = match port {
                Some(p) => p
                    .parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
                // The Docker CLI's default for tcp://.
                None => 2375,
            };
            Ok(Address::Tcp { host, port })
        }
        "ssh" => {
            let authority = rest.trim_end_matches('/');
            if authority.contains('/') {
                return Err(bad(
                    "an ssh address has no path (the far side's `docker` finds its engine)",
                ));
            }
            let (user, hostport) = match authority.rsplit_once('@') {
                Some((user, hostport)) if !user.is_empty() => (Some(user.to_string()), hostport),
                Some(_) => return Err(bad("the user before @ is empty")),
                None => (None, authority),
            };
            let (host, port) = split_host_port(hostport).ok_or_else(|| bad("no host"))?;
            let port = port
                .map(|p| {
                    p.parse::<u16>()
                        .map_err(|_| bad("the port is not a number"))
                })
                .transpose()?;
            if host.starts_with('-') {
                return Err(bad("a host cannot start with `-`"));
            }
            Ok(Address::Ssh(SshTarget { user, host, port }))
        }
        other => Err(bad(&format!("unsupported scheme `{other}://`"))),
    }
}

/// `host[:port]`, `[v6]:port`.
fn split_host_port(authority: &str) -> Option<(String, Option<&str>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':');
        return (!host.is_empty()).then(|| (host.to_string(), port));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

pub(super) fn docker_config_dir() -> PathBuf {
    crate::registry::credentials::config_dir().unwrap_or_default()
}

pub(super) fn context_hash(name: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(name.as_bytes()))
}

/// The context `docker context use` selected (`DOCKER_CONTEXT`, else config.json's
/// `currentContext`), unless it is the built-in default.
pub(super) fn current_context() -> Option<String> {
    let name = std::env::var("DOCKER_CONTEXT").ok().or_else(|| {
        let text = std::fs::read_to_string(docker_config_dir().join("config.json")).ok()?;
        let config: serde_json::Value = serde_json::from_str(&text).ok()?;
        config["currentContext"].as_str().map(str::to_string)
    })?;
    (!name.is_empty() && name != "default").then_some(name)
}

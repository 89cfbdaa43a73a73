//! Which registries speak plain HTTP, what their `/v2/` answers, and where Docker keeps
//! their trust roots.

use super::challenge::{parse_challenge, Challenge};
use std::path::PathBuf;
use std::time::Duration;

/// `host:port` or `[v6]:port`.
pub(super) fn has_port(address: &str) -> bool {
    address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !port.contains(']') && port.parse::<u16>().is_ok()
    })
}

/// What a registry's `GET /v2/` over plain HTTP answered: the status and whether it set a
/// challenge (`WWW-Authenticate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PlainAnswer {
    status: u16,
    /// Its `WWW-Authenticate`, when it set one.
    challenge: Option<String>,
}

impl PlainAnswer {
    pub(super) fn new(status: u16, challenge: Option<String>) -> Self {
        PlainAnswer { status, challenge }
    }

    /// A registry's own answers (200 open, 401 challenged); a TLS server that gets a
    /// plain request answers 400, so anything else proves nothing.
    pub(super) fn is_registry(&self) -> bool {
        matches!(self.status, 200 | 401)
    }

    /// The Bearer challenge it set: the registry wants tokens from that realm.
    pub(super) fn bearer(&self) -> Option<Challenge> {
        self.challenge.as_deref().and_then(parse_challenge)
    }

    /// Serves anonymous requests without a token.
    pub(super) fn is_open(&self) -> bool {
        self.status == 200 && self.challenge.is_none()
    }
}

/// Asks `GET /v2/` of `address` (`host:port`) over plain HTTP, directly: no HTTP client
/// (building one loads the system's CA store), one request. None when nothing usable came
/// back within 5 s.
pub(super) async fn ask_plain_v2(address: &str) -> Option<PlainAnswer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request = format!("GET /v2/ HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        parse_plain_answer(&head)
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

/// The status and challenge of a complete HTTP/1.x response head.
pub(super) fn parse_plain_answer(head: &[u8]) -> Option<PlainAnswer> {
    let text = String::from_utf8_lossy(head);
    let (head, _) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    if !status_line.starts_with("HTTP/1.") {
        return None;
    }
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let challenge = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("www-authenticate")
            .then(|| value.trim().to_string())
    });
    Some(PlainAnswer { status, challenge })
}

/// Loopback registries speak plain HTTP, as Docker treats them.
pub fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Docker's per-registry trust directory root (`POLYARCH_CERTS_D` overrides it).
pub fn certs_d_root() -> PathBuf {
    std::env::var_os("POLYARCH_CERTS_D")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/docker/certs.d"))
}

pub(super) fn certs_d_files(registry: &str) -> Vec<PathBuf> {
    let dir = certs_d_root().join(registry);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "crt"))
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_answer_tells_a_registry_and_whether_it_wants_a_token() {
        let answer = |head: &[u8]| parse_plain_answer(head);
        let open = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert!(open.is_registry() && open.is_open());
        let basic =
            answer(b"HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Basic realm=\"r\"\r\n\r\n")
                .unwrap();
        assert!(basic.is_registry() && !basic.is_open());
        let challenged = answer(b"HTTP/1.1 200 OK\r\nWWW-Authenticate: Bearer x\r\n\r\n").unwrap();
        assert!(!challenged.is_open());
        // What Go's TLS server answers a plain request: not a registry's answer.
        let tls = answer(
            b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
        )
        .unwrap();
        assert!(!tls.is_registry());
        assert_eq!(answer(b"HTTP/1.1 200 OK\r\nContent-Le"), None);
        assert_eq!(answer(b"\x15\x03\x01\x00\x02\x02\x46"), None);
    }

    #[test]
    fn ports_are_told_apart_from_v6_addresses() {
        assert!(has_port("127.0.0.1:5000"));
        assert!(has_port("[::1]:5000"));
        assert!(!has_port("[::1]"));
        assert!(!has_port("localhost"));
        assert!(!has_port("registry.example"));
    }

    #[test]
    fn loopback_registries_are_plain_http() {
        for host in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "registry.example.org",
            "10.0.0.1:5000",
            "docker.io",
            "localhost.example:5000",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}

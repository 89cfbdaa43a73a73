//! Where an engine is, named as the Docker CLI names it: `unix://PATH`, `tcp://HOST:PORT`
//! (plain, or TLS with a CA and a client certificate), `ssh://[USER@]HOST[:PORT]` (the
//! system `ssh` running `docker system dial-stdio` on the far side), or a Docker context
//! name. Every connection to an engine, REST and BuildKit's `/grpc` and `/session`
//! upgrades alike, is opened here, so each form works for all of them.

mod address;
mod tls;
mod transport;

pub use address::{is_address, parse_address, Address};
pub use transport::{Io, Stream};

use address::{context_hash, current_context, docker_config_dir};
use transport::{Pooled, SshStream};

use bollard::Docker;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The Docker CLI's default engine.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";
/// How long `ssh` may take to reach the far side (the Docker CLI's value).
const SSH_CONNECT_TIMEOUT_SECS: u32 = 30;
/// How long a TCP connection may take before the engine counts as down.
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// bollard's per-request timeout (seconds), as for the local socket.
const REQUEST_TIMEOUT_SECS: u64 = 120;

/// Why an endpoint could not be resolved or reached. Each message names the endpoint and
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("`{address}` is not an engine address: {reason}; write unix:///path/docker.sock, tcp://host:port, ssh://[user@]host[:port] or a Docker context name")]
    Address { address: String, reason: String },
    #[error("`{name}` is neither an engine address nor a Docker context (no {}); create it with `docker context create {name} --docker host=…`", meta.display())]
    UnknownContext { name: String, meta: PathBuf },
    #[error("Docker context `{name}` ({}): {reason}; recreate it with `docker context create`", meta.display())]
    BadContext {
        name: String,
        meta: PathBuf,
        reason: String,
    },
    #[error("{}: cannot read it ({source}); give the engine's TLS files as PEM (ca, cert, key)", path.display())]
    TlsFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {reason}", path.display())]
    TlsMaterial { path: PathBuf, reason: String },
    #[error("{endpoint}: {reason}")]
    TlsSetup { endpoint: String, reason: String },
    #[error(
        "{endpoint} is down or unreachable ({source}); start dockerd there or correct the address"
    )]
    Down {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("{endpoint}: the engine's TLS certificate is not trusted ({source}); give the CA that signed it (tls: ca, or ca.pem in the context or DOCKER_CERT_PATH), and when the certificate names another host than the address, that name as tls: servername")]
    UntrustedServer {
        endpoint: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{endpoint}: the engine refused the client certificate ({source}); give a client certificate signed by the CA the engine's --tlscacert names (tls: cert, key)")]
    ClientCertRefused {
        endpoint: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{endpoint}: TLS failed ({source}); check that the engine listens with --tlsverify on that port and the tls files")]
    Tls {
        endpoint: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{endpoint}: {message}; check that `ssh {target} docker version` works from this machine (keys or agent, known host, `docker` on the remote PATH)")]
    Ssh {
        endpoint: String,
        target: String,
        message: String,
    },
    #[error(
        "{endpoint} answered /_ping but not the API ({source}); check that it is a Docker engine"
    )]
    Api {
        endpoint: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("{endpoint} did not answer as a Docker engine ({reason}); check the address and port")]
    NotAnEngine { endpoint: String, reason: String },
}

/// TLS material as files, as the Docker CLI reads it (`ca.pem`, `cert.pem`, `key.pem`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA the engine's certificate must chain to; without it, the system roots.
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// A Docker context's `SkipTLSVerify`: the engine's certificate is not checked.
    pub skip_verify: bool,
    /// The name the server's certificate must carry when it is not the address's host
    /// (buildctl's `--tlsservername`: a daemon reached through a load balancer or by IP).
    pub server_name: Option<String>,
}

/// An engine's location, resolved (contexts read, TLS files loaded) and ready to connect.
#[derive(Clone)]
pub struct Endpoint {
    /// As the user named it (an address, a context name, `DOCKER_HOST`), for messages.
    pub name: String,
    transport: Transport,
}

#[derive(Clone)]
enum Transport {
    Unix(PathBuf),
    Tcp {
        host: String,
        port: u16,
        tls: Option<Tls>,
    },
    Ssh(SshTarget),
}

#[derive(Clone)]
struct Tls {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

/// `ssh://[user@]host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("address", &self.address())
            .finish()
    }
}

impl Endpoint {
    /// The engine the Docker CLI talks to by default: `DOCKER_HOST` (with TLS when
    /// `DOCKER_TLS_VERIFY` is set, files from `DOCKER_CERT_PATH` or the Docker config
    /// directory), else `DOCKER_CONTEXT` or config.json's `currentContext`, else the
    /// local socket.
    pub fn default_engine() -> Result<Endpoint, EndpointError> {
        if let Some(host) = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()) {
            let tls = std::env::var("DOCKER_TLS_VERIFY")
                .is_ok_and(|v| !v.is_empty())
                .then(|| {
                    let dir = std::env::var_os("DOCKER_CERT_PATH")
                        .filter(|d| !d.is_empty())
                        .map(PathBuf::from)
                        .unwrap_or_else(docker_config_dir);
                    TlsFiles {
                        ca: Some(dir.join("ca.pem")),
                        cert: Some(dir.join("cert.pem")),
                        key: Some(dir.join("key.pem")),
                        skip_verify: false,
                        server_name: None,
                    }
                });
            return Endpoint::from_address(&host, &host, tls.as_ref());
        }
        if let Some(context) = current_context() {
            return Endpoint::from_context(&context);
        }
        Endpoint::from_address(DEFAULT_HOST, DEFAULT_HOST, None)
    }

    /// A `builders:` entry: an address (with TLS files when given) or a context name.
    pub fn resolve(spec: &str, tls: Option<&TlsFiles>) -> Result<Endpoint, EndpointError> {
        if is_address(spec) {
            Endpoint::from_address(spec, spec, tls)
        } else {
            Endpoint::from_context(spec)
        }
    }

    fn from_address(
        name: &str,
        address: &str,
        tls: Option<&TlsFiles>,
    ) -> Result<Endpoint, EndpointError> {
        let transport = match parse_address(address)? {
            Address::Unix(path) => Transport::Unix(path),
            Address::Ssh(target) => Transport::Ssh(target),
            Address::Tcp { host, port } => {
                let tls = match tls {
                    Some(files) => Some(Tls::load(name, &host, files)?),
                    None => None,
                };
                Transport::Tcp { host, port, tls }
            }
        };
        Ok(Endpoint {
            name: name.to_string(),
            transport,
        })
    }

    /// A Docker context as `docker context create` writes it: the address in
    /// `contexts/meta/<sha256>/meta.json`, TLS files in `contexts/tls/<sha256>/docker/`.
    pub fn from_context(name: &str) -> Result<Endpoint, EndpointError> {
        let hash = context_hash(name);
        let dir = docker_config_dir().join("contexts");
        let meta = dir.join("meta").join(&hash).join("meta.json");
        let text = std::fs::read_to_string(&meta).map_err(|_| EndpointError::UnknownContext {
            name: name.to_string(),
            meta: meta.clone(),
        })?;
        let bad = |reason: String| EndpointError::BadContext {
            name: name.to_string(),
            meta: meta.clone(),
            reason,
        };
        let parsed: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let docker = &parsed["Endpoints"]["docker"];
        let host = docker["Host"]
            .as_str()
            .ok_or_else(|| bad("no docker endpoint".into()))?;
        let tls_dir = dir.join("tls").join(&hash).join("docker");
        let present = |file: &str| {
            let path = tls_dir.join(file);
            path.is_file().then_some(path)
        };
        let files = TlsFiles {
            ca: present("ca.pem"),
            cert: present("cert.pem"),
            key: present("key.pem"),
            skip_verify: docker["SkipTLSVerify"].as_bool().unwrap_or(false),
            server_name: None,
        };
        // As the Docker CLI: TLS when the context has TLS material or skips verification.
        let tls = (files.ca.is_some()
            || files.cert.is_some()
            || files.key.is_some()
            || files.skip_verify)
            .then_some(&files);
        Endpoint::from_address(&format!("{name} ({host})"), host, tls)
    }

    /// Whether the engine runs on this machine, so it sees this machine's loopback
    /// addresses and file system: a unix socket, or TCP to a loopback address.
    pub fn is_local(&self) -> bool {
        match &self.transport {
            Transport::Unix(_) => true,
            Transport::Tcp { host, .. } => is_loopback_host(host),
            Transport::Ssh(_) => false,
        }
    }

    /// The socket's path when the engine is reached through a Unix socket.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        match &self.transport {
            Transport::Unix(path) => Some(path),
            Transport::Tcp { .. } | Transport::Ssh(_) => None,
        }
    }

    /// The address connected to, for messages (`tcp://…` with TLS marked).
    pub fn address(&self) -> String {
        match &self.transport {
            Transport::Unix(path) => format!("unix://{}", path.display()),
            Transport::Tcp { host, port, tls } => format!(
                "tcp://{}:{port}{}",
                if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                },
                if tls.is_some() { " (TLS)" } else { "" }
            ),
            Transport::Ssh(target) => format!(
                "ssh://{}{}{}",
                target
                    .user
                    .as_deref()
                    .map(|u| format!("{u}@"))
                    .unwrap_or_default(),
                target.host,
                target.port.map(|p| format!(":{p}")).unwrap_or_default()
            ),
        }
    }

    /// A new byte stream to the engine's API: TLS done, ssh's `dial-stdio` running.
    pub async fn connect(&self) -> Result<Stream, EndpointError> {
        let down = |source: io::Error| EndpointError::Down {
            endpoint: self.name.clone(),
            source,
        };
        match &self.transport {
            Transport::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await.map_err(down)?;
                Ok(Box::new(stream))
            }
            Transport::Tcp { host, port, tls } => {
                let stream = tokio::time::timeout(
                    TCP_CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| down(io::Error::from(io::ErrorKind::TimedOut)))?
                .map_err(down)?;
                stream.set_nodelay(true).map_err(down)?;
                let Some(tls) = tls else {
                    return Ok(Box::new(stream));
                };
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = connector
                    .connect(tls.server_name.clone(), stream)
                    .await
                    .map_err(|e| self.classify(e))?;
                Ok(Box::new(stream))
            }
            Transport::Ssh(target) => Ok(Box::new(
                SshStream::spawn(target).map_err(|e| self.ssh_error(target, e.to_string()))?,
            )),
        }
    }

    /// Opens a connection and asks `GET /_ping`, so a down engine, an untrusted or
    /// refused certificate and a failing ssh are told apart before anything else.
    pub async fn probe(&self) -> Result<(), EndpointError> {
        let mut stream = self.connect().await?;
        let ssh_stderr = stream.ssh_stderr();
        let request = b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n";
        let exchange = async {
            tokio::io::AsyncWriteExt::write_all(&mut stream, request).await?;
            let mut answer = vec![0u8; 512];
            let mut read = 0;
            // `Connection: close`: the engine ends the answer; its start is enough.
            while read < answer.len() {
                let n = stream.read(&mut answer[read..]).await?;
                if n == 0 {
                    break;
                }
                read += n;
            }
            answer.truncate(read);
            Ok::<_, io::Error>(answer)
        };
        let exchanged = tokio::time::timeout(
            Duration::from_secs(SSH_CONNECT_TIMEOUT_SECS as u64 + 5),
            exchange,
        )
        .await
        .map_err(|_| EndpointError::NotAnEngine {
            endpoint: self.name.clone(),
            reason: "no answer to GET /_ping".into(),
        })?;
        let answer = match exchanged {
            Ok(answer) => answer,
            // An ssh that ended at once (refused, unknown host, auth) breaks the pipe
            // before the request is written: its stderr, read below, says why.
            Err(_) if ssh_stderr.is_some() => Vec::new(),
            Err(e) => return Err(self.classify(e)),
        };
        let status = String::from_utf8_lossy(&answer);
        let status = status.lines().next().unwrap_or_default().trim().to_string();
        if status.starts_with("HTTP/1.") && status.contains(" 200") {
            return Ok(());
        }
        if let (Transport::Ssh(target), Some(stderr)) = (&self.transport, ssh_stderr) {
            // ssh wrote why it ended; give it a moment to finish writing.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let text = stderr.lock().map(|s| s.clone()).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty());
            return Err(self.ssh_error(
                target,
                last.map(|l| l.trim().to_string())
                    .unwrap_or_else(|| "ssh closed the connection without an answer".into()),
            ));
        }
        Err(EndpointError::NotAnEngine {
            endpoint: self.name.clone(),
            reason: if status.is_empty() {
                "the connection closed without an answer".into()
            } else if String::from_utf8_lossy(&answer).contains("HTTPS server") {
                // Go's TLS listener answering a plain request.
                "it speaks TLS: give the builder its tls files (ca, cert, key)".into()
            } else if status.starts_with("HTTP/1.") {
                format!("GET /_ping answered `{status}`")
            } else {
                "not HTTP".into()
            },
        })
    }

    /// The REST client for the engine: bollard's own for unix sockets and plain TCP,
    /// else hyper over [`Endpoint::connect`] (TLS, ssh), pooled so that ssh is not
    /// started again for every request.
    pub fn docker(&self) -> Result<Docker, bollard::errors::Error> {
        match &self.transport {
            Transport::Unix(path) => Docker::connect_with_socket(
                &format!("unix://{}", path.display()),
                REQUEST_TIMEOUT_SECS,
                bollard::API_DEFAULT_VERSION,
            ),
            Transport::Tcp {
                host,
                port,
                tls: None,
            } => Docker::connect_with_http(
                &format!("tcp://{host}:{port}"),
                REQUEST_TIMEOUT_SECS,
                bollard::API_DEFAULT_VERSION,
            ),
            _ => {
                let endpoint = self.clone();
                let connector = tower::service_fn(move |_: http::Uri| {
                    let endpoint = endpoint.clone();
                    Box::pin(async move {
                        endpoint
                            .connect()
                            .await
                            .map(|s| Pooled(hyper_util::rt::TokioIo::new(s)))
                    })
                });
                let client = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector);
                Docker::connect_with_custom_transport(
                    move |request: bollard::BollardRequest| {
                        let client = client.clone();
                        async move {
                            client
                                .request(request)
                                .await
                                .map_err(bollard::errors::Error::from)
                        }
                    },
                    Some("http://docker"),
                    REQUEST_TIMEOUT_SECS,
                    bollard::API_DEFAULT_VERSION,
                )
            }
        }
    }

    fn ssh_error(&self, target: &SshTarget, message: String) -> EndpointError {
        EndpointError::Ssh {
            endpoint: self.name.clone(),
            target: target.destination(),
            message,
        }
    }

    /// Tells a TLS failure (untrusted engine, refused client certificate) from a down engine.
    /// A TLS failure seen after the handshake (TLS 1.3 reports a refused client
    /// certificate at the first read), typed as one seen during it.
    pub(crate) fn classify_tls(&self, error: rustls::Error) -> EndpointError {
        self.classify(io::Error::new(io::ErrorKind::InvalidData, error))
    }

    fn classify(&self, error: io::Error) -> EndpointError {
        let endpoint = self.name.clone();
        let Some(tls) = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .cloned()
        else {
            return EndpointError::Down {
                endpoint,
                source: error,
            };
        };
        use rustls::AlertDescription as Alert;
        match &tls {
            rustls::Error::InvalidCertificate(_) => EndpointError::UntrustedServer {
                endpoint,
                source: tls,
            },
            rustls::Error::AlertReceived(
                Alert::BadCertificate
                | Alert::CertificateRequired
                | Alert::UnknownCA
                | Alert::CertificateUnknown
                | Alert::UnsupportedCertificate
                | Alert::CertificateExpired
                | Alert::CertificateRevoked
                | Alert::AccessDenied,
            ) => EndpointError::ClientCertRefused {
                endpoint,
                source: tls,
            },
            _ => EndpointError::Tls {
                endpoint,
                source: tls,
            },
        }
    }
}

fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_docker_cli_address_forms() {
        assert_eq!(
            parse_address("unix:///run/arm.sock").unwrap(),
            Address::Unix("/run/arm.sock".into())
        );
        assert_eq!(
            parse_address("tcp://10.0.0.2:2376").unwrap(),
            Address::Tcp {
                host: "10.0.0.2".into(),
                port: 2376
            }
        );
        assert_eq!(
            parse_address("tcp://[::1]:2376/").unwrap(),
            Address::Tcp {
                host: "::1".into(),
                port: 2376
            }
        );
        assert_eq!(
            parse_address("ssh://ci@arm-box:2222").unwrap(),
            Address::Ssh(SshTarget {
                user: Some("ci".into()),
                host: "arm-box".into(),
                port: Some(2222)
            })
        );
        assert_eq!(
            parse_address("ssh://arm-box").unwrap(),
            Address::Ssh(SshTarget {
                user: None,
                host: "arm-box".into(),
                port: None
            })
        );
        for bad in [
            "ftp://x",
            "tcp://",
            "tcp://h:port",
            "ssh://@h",
            "ssh://-oProxyCommand=x",
            "unix://relative",
        ] {
            assert!(
                matches!(parse_address(bad), Err(EndpointError::Address { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn ssh_is_run_as_the_docker_cli_runs_it() {
        let target = SshTarget {
            user: Some("ci".into()),
            host: "arm-box".into(),
            port: Some(2222),
        };
        let args = target.args().join(" ");
        assert!(
            args.ends_with("-l ci -p 2222 -- arm-box docker system dial-stdio"),
            "{args}"
        );
    }

    #[test]
    fn locality_follows_the_transport() {
        let local = |spec: &str| Endpoint::resolve(spec, None).unwrap().is_local();
        assert!(local("unix:///var/run/docker.sock"));
        assert!(local("tcp://127.0.0.1:2375"));
        assert!(local("tcp://localhost:2375"));
        assert!(!local("tcp://198.18.230.2:2375"));
        assert!(!local("ssh://arm-box"));
    }
}

//! Talking to an OCI distribution registry through oci-client: blobs by digest (HEAD
//! first), manifests by digest, the index to each tag, and verified reads back.

use crate::credentials::{self, Credential};
use crate::error::one_line;
use crate::oci::{self, ManifestBlob};
use crate::progress::{Event, Phase, Reporter};
use crate::{Error, Platform, Result};
use futures_util::TryStreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Largest manifest or config polyarch will read; real ones are a few KiB.
const MAX_JSON_BLOB: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Registries (host[:port]) to reach over plain HTTP besides loopback ones.
    pub insecure: Vec<String>,
    /// Basic credentials (user, password) for every registry, when given on the CLI.
    pub credentials: Option<(String, String)>,
    /// Extra CA certificates (PEM files) to trust.
    pub ca_certs: Vec<std::path::PathBuf>,
    /// Retry policy for transient failures; `None` uses [`RetryPolicy::from_env`].
    pub retry: Option<RetryPolicy>,
}

/// Bounded retries with exponential backoff and jitter for 5xx, 429 and transport errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// First backoff; doubles per attempt (±50 % jitter).
    pub base: Duration,
    /// Longest single backoff.
    pub max_delay: Duration,
    /// Upper bound of all backoffs of one call together.
    pub total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(500),
            max_delay: Duration::from_secs(4),
            total: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The default, with `POLYARCH_RETRY_ATTEMPTS` and `POLYARCH_RETRY_BASE_MS` overrides.
    pub fn from_env() -> Self {
        let mut policy = RetryPolicy::default();
        let number = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(n) = number("POLYARCH_RETRY_ATTEMPTS") {
            policy.attempts = n.clamp(1, 20) as u32;
        }
        if let Some(ms) = number("POLYARCH_RETRY_BASE_MS") {
            policy.base = Duration::from_millis(ms);
        }
        policy
    }

    /// Backoff before attempt `attempt + 1` (`attempt` counts from 1).
    fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(self.max_delay);
        // Jitter in [0.5, 1.5) of the exponential delay.
        let r = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
        exp.mul_f64(0.5 + r as f64 / 1000.0)
    }
}

/// How a failed call should be treated.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// Retry after at least this long (429 `Retry-After`, default 1 s).
    Transient(Duration),
    /// The certificate chain is not trusted: no retry, a TLS fix.
    Tls,
    Permanent,
}

/// `(registry, digest)`.
type BlobKey = (String, String);

/// A manifest's bytes and digest as a registry served them.
type ManifestRead = (Vec<u8>, String);

/// A registry client shared by a run (boxed: it is large and lives in enums).
pub struct Registry(Box<Inner>);

impl std::ops::Deref for Registry {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

#[doc(hidden)]
pub struct Inner {
    /// Each client is built on first use: building one loads the system's CA store.
    clients: Clients,
    /// Registries allowed to fall back to plain HTTP.
    plain_capable: HashSet<String>,
    /// `--insecure-registry` hosts: like Docker, TLS without verification, or plain HTTP.
    insecure: HashSet<String>,
    /// Per registry: whether it speaks plain HTTP, and then whether it wants no token
    /// (decided on first contact).
    schemes: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Scheme>>>>,
    /// Manifests read by digest in this run: content addressed, so never read twice.
    manifests: Mutex<HashMap<String, Arc<ManifestRead>>>,
    /// Per registry, resolved once (CLI, credential helpers, Docker config).
    auths: Mutex<HashMap<String, RegistryAuth>>,
    cli_credentials: Option<(String, String)>,
    retry: RetryPolicy,
    /// `registry digest` → repositories this run knows to hold the blob.
    known: Mutex<HashMap<BlobKey, HashSet<String>>>,
    /// One upload per `registry digest` at a time.
    uploads: Mutex<HashMap<BlobKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// How a loopback or insecure registry is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// Plain HTTP; `open`: it serves anonymous requests without a token.
    Plain {
        open: bool,
    },
    Tls,
}

/// `host:port` or `[v6]:port`.
fn has_port(address: &str) -> bool {
    address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !port.contains(']') && port.parse::<u16>().is_ok()
    })
}

/// What a registry's `GET /v2/` over plain HTTP answered: the status and whether it set a
/// challenge (`WWW-Authenticate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlainAnswer {
    status: u16,
    challenge: bool,
}

impl PlainAnswer {
    /// A registry's own answers (200 open, 401 challenged); a TLS server that gets a
    /// plain request answers 400, so anything else proves nothing.
    fn is_registry(self) -> bool {
        matches!(self.status, 200 | 401)
    }

    /// Serves anonymous requests without a token.
    fn is_open(self) -> bool {
        self.status == 200 && !self.challenge
    }
}

/// Asks `GET /v2/` of `address` (`host:port`) over plain HTTP, directly: no HTTP client
/// (building one loads the system's CA store), one request. None when nothing usable came
/// back within 5 s.
async fn ask_plain_v2(address: &str) -> Option<PlainAnswer> {
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
fn parse_plain_answer(head: &[u8]) -> Option<PlainAnswer> {
    let text = String::from_utf8_lossy(head);
    let (head, _) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    if !status_line.starts_with("HTTP/1.") {
        return None;
    }
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let challenge = lines.any(|line| {
        line.split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("www-authenticate"))
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

/// Parses `[host[:port]/]path[:tag][@digest]` with the grammar and Docker Hub
/// normalisation of distribution's `reference` package. Written out rather than taken
/// from oci-spec, whose regex (Unicode `\w` repeated 128 times) costs ~15 ms to compile in
/// every process; unlike it, bracketed IPv6 hosts are accepted.
pub fn parse_reference(reference: &str) -> Result<Reference> {
    let invalid = |why: String| {
        Error::Usage(format!(
            "`{reference}` is not an image reference ({why}); use host[:port]/path:tag or host[:port]/path@sha256:…"
        ))
    };
    if reference.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    let last_slash = rest.rfind('/');
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        _ => (rest, None),
    };
    let (registry, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
        {
            check_host(first).map_err(|why| invalid(format!("registry `{first}` {why}")))?;
            (first.to_string(), path.to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid(format!(
            "repository path `{path}` has uppercase letters; paths are lowercase"
        )));
    }
    if let Some(component) = path.split('/').find(|c| !is_path_component(c)) {
        return Err(invalid(format!(
            "path component `{component}` is not lowercase letters and digits joined by `.`, `_`, `__` or dashes"
        )));
    }
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if tag.len() > 128
            || !chars.next().is_some_and(word)
            || !chars.all(|c| word(c) || c == '.' || c == '-')
        {
            return Err(invalid(format!(
                "tag `{tag}` is not 1-128 letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)"
            )));
        }
    }
    if let Some(digest) = digest {
        check_digest(digest).map_err(|why| invalid(format!("digest `{digest}` {why}")))?;
    }
    let registry = if registry == "index.docker.io" {
        "docker.io".to_string()
    } else {
        registry
    };
    let path = if registry == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    // Checked as normalised, so what parses prints back as something that parses.
    if path.len() > 255 {
        return Err(invalid(
            "the repository path is longer than 255 characters".into(),
        ));
    }
    Ok(match (tag, digest) {
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, path, tag.into(), digest.into())
        }
        (Some(tag), None) => Reference::with_tag(registry, path, tag.into()),
        (None, Some(digest)) => Reference::with_digest(registry, path, digest.into()),
        (None, None) => Reference::with_tag(registry, path, "latest".into()),
    })
}

/// `host[:port]`: DNS labels, an IPv4 address or a bracketed IPv6 address.
fn check_host(host: &str) -> std::result::Result<(), &'static str> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (address, after) = rest.split_once(']').ok_or("has no closing `]`")?;
            address
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| "is not an IPv6 address in brackets")?;
            if after.is_empty() {
                return Ok(());
            }
            (
                None,
                Some(after.strip_prefix(':').ok_or("has text after `]`")?),
            )
        }
        None => match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        },
    };
    if port.is_some_and(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
        return Err("has a port that is not a number");
    }
    let label = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.is_some_and(|n| !n.split('.').all(label)) {
        return Err("is not a host name");
    }
    Ok(())
}

/// Lowercase letters and digits, joined by `.`, `_`, `__` or any number of dashes.
fn is_path_component(component: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !component.starts_with(alnum) || !component.ends_with(alnum) {
        return false;
    }
    component
        .split(alnum)
        .filter(|separator| !separator.is_empty())
        .all(|separator| {
            matches!(separator, "." | "_" | "__") || separator.chars().all(|c| c == '-')
        })
}

/// `algorithm:hex`, with the hex length the algorithm requires.
fn check_digest(digest: &str) -> std::result::Result<(), &'static str> {
    let (algorithm, hex) = digest.split_once(':').ok_or("has no `algorithm:`")?;
    if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("is not hexadecimal");
    }
    let length = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err("uses an unsupported algorithm (sha256, sha384 or sha512)"),
    };
    if hex.len() != length {
        return Err("has the wrong length for its algorithm");
    }
    Ok(())
}

/// Docker's per-registry trust directory root (`POLYARCH_CERTS_D` overrides it).
pub fn certs_d_root() -> PathBuf {
    std::env::var_os("POLYARCH_CERTS_D")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/docker/certs.d"))
}

fn certs_d_files(registry: &str) -> Vec<PathBuf> {
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

/// The registry clients, each built on first use.
struct Clients {
    extra_root_certificates: Vec<oci_client::client::Certificate>,
    /// HTTPS, verified against the system roots plus the extra CAs.
    https: OnceLock<Client>,
    /// HTTPS without certificate checks: telling TLS from plain HTTP, and
    /// `--insecure-registry` hosts that speak TLS.
    unverified: OnceLock<Client>,
    /// Plain HTTP for loopback and `--insecure-registry` registries.
    plain: OnceLock<Client>,
}

impl Clients {
    fn config(&self, protocol: ClientProtocol, verified: bool) -> ClientConfig {
        ClientConfig {
            protocol,
            // One streaming PUT per blob: the size is known from the spool file.
            use_monolithic_push: true,
            extra_root_certificates: if verified {
                self.extra_root_certificates.clone()
            } else {
                Vec::new()
            },
            accept_invalid_certificates: !verified,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        }
    }

    fn https(&self) -> &Client {
        self.https
            .get_or_init(|| Client::new(self.config(ClientProtocol::Https, true)))
    }

    fn unverified(&self) -> &Client {
        self.unverified
            .get_or_init(|| Client::new(self.config(ClientProtocol::Https, false)))
    }

    /// Verified still: a redirect may lead to an HTTPS host.
    fn plain(&self) -> &Client {
        self.plain
            .get_or_init(|| Client::new(self.config(ClientProtocol::Http, true)))
    }
}

/// What a blob upload sends: a spooled file (restartable) or bytes in memory.
enum Body<'a> {
    File { path: &'a Path, size: u64 },
    Bytes(&'a [u8]),
}

impl Registry {
    /// `registries` are the hosts this run talks to: their credentials are resolved now,
    /// loopback and `--insecure-registry` ones may fall back to plain HTTP.
    pub fn new(registries: &[String], options: &RegistryOptions) -> Result<Registry> {
        // reqwest takes the process-wide rustls provider; an earlier install is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain_capable: HashSet<String> = registries
            .iter()
            .filter(|r| is_loopback(r) || options.insecure.contains(r))
            .cloned()
            .collect();
        let insecure: HashSet<String> = options.insecure.iter().cloned().collect();
        let mut ca_files: Vec<PathBuf> = options.ca_certs.clone();
        for registry in registries {
            ca_files.extend(certs_d_files(registry));
        }
        let mut extra_root_certificates = Vec::new();
        for path in &ca_files {
            let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            extra_root_certificates.push(oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data,
            });
        }
        let registry = Registry(Box::new(Inner {
            clients: Clients {
                extra_root_certificates,
                https: OnceLock::new(),
                unverified: OnceLock::new(),
                plain: OnceLock::new(),
            },
            plain_capable,
            insecure,
            schemes: Mutex::default(),
            manifests: Mutex::default(),
            auths: Mutex::default(),
            cli_credentials: options.credentials.clone(),
            retry: options.retry.unwrap_or_else(RetryPolicy::from_env),
            known: Mutex::default(),
            uploads: Mutex::default(),
        }));
        for host in registries {
            registry.auth_for(host)?;
        }
        Ok(registry)
    }

    /// The auth for a registry, resolved on first use and then kept.
    fn auth_for(&self, registry: &str) -> Result<RegistryAuth> {
        if let Some(auth) = self.auths.lock().expect("auth lock").get(registry) {
            return Ok(auth.clone());
        }
        let auth = match credentials::resolve(registry, self.cli_credentials.as_ref())? {
            Some(Credential::Basic { username, password }) => {
                RegistryAuth::Basic(username, password)
            }
            // oci-client has no refresh-token grant: the token is presented as a bearer.
            Some(Credential::IdentityToken(token)) => RegistryAuth::Bearer(token),
            None => RegistryAuth::Anonymous,
        };
        self.auths
            .lock()
            .expect("auth lock")
            .insert(registry.to_string(), auth.clone());
        Ok(auth)
    }

    /// The client speaking the right scheme to the reference's registry. Like Docker,
    /// loopback and insecure registries are tried over HTTPS first and fall back to plain
    /// HTTP when the server does not speak TLS.
    async fn client_for<'a>(&'a self, reference: &Reference) -> Result<&'a Client> {
        let host = reference.registry().to_string();
        let resolved = reference.resolve_registry().to_string();
        let client = if !self.plain_capable.contains(&host) {
            self.clients.https()
        } else {
            match self.scheme(&host, reference).await {
                Scheme::Plain { open } => {
                    if open {
                        self.send_empty_bearer(&host)?;
                    }
                    self.clients.plain()
                }
                Scheme::Tls if self.insecure.contains(&host) => self.clients.unverified(),
                Scheme::Tls => self.clients.https(),
            }
        };
        client
            .store_auth_if_needed(&resolved, &self.auth_for(&host)?)
            .await;
        Ok(client)
    }

    /// oci-client asks a registry's `/v2/` before every request it sends anonymously until
    /// it gets a token, and a registry that wants none never gives one: each request would
    /// cost two round trips. Requests to such a registry carry an empty bearer instead,
    /// which oci-client sends without asking and the registry ignores.
    fn send_empty_bearer(&self, host: &str) -> Result<()> {
        if matches!(self.auth_for(host)?, RegistryAuth::Anonymous) {
            self.auths
                .lock()
                .expect("auth lock")
                .insert(host.to_string(), RegistryAuth::Bearer(String::new()));
        }
        Ok(())
    }

    /// Whether a loopback or insecure registry answers plain HTTP rather than TLS, asked
    /// once per registry with an anonymous request, so no credential meets a server whose
    /// certificate is not checked. With a port, one plain `GET /v2/` on it answers (a
    /// registry's 200 or 401 proves plain HTTP, and says whether it wants a token);
    /// otherwise, as Docker, HTTPS on 443 is tried and plain HTTP is the fallback.
    async fn scheme(&self, host: &str, reference: &Reference) -> Scheme {
        let cell = self
            .schemes
            .lock()
            .expect("scheme lock")
            .entry(host.to_string())
            .or_default()
            .clone();
        *cell
            .get_or_init(|| async {
                let resolved = reference.resolve_registry();
                if has_port(resolved) {
                    if let Some(answer) = ask_plain_v2(resolved).await.filter(|a| a.is_registry()) {
                        return Scheme::Plain {
                            open: answer.is_open(),
                        };
                    }
                }
                let absent = format!("sha256:{}", "0".repeat(64));
                let probe = self
                    .clients
                    .unverified()
                    .blob_exists(reference, &absent)
                    .await;
                match probe {
                    // No HTTP answer, and not for a certificate problem (which means the
                    // server does speak TLS).
                    Err(OciDistributionError::RequestError(e)) if e.status().is_none() => {
                        match classify(&OciDistributionError::RequestError(e)) {
                            Failure::Tls => Scheme::Tls,
                            _ => Scheme::Plain { open: false },
                        }
                    }
                    _ => Scheme::Tls,
                }
            })
            .await
    }

    /// Runs one registry call with bounded, jittered retries of transient failures.
    /// Every oci-client call goes through here.
    async fn call<'a, T, F, Fut>(
        &'a self,
        reference: &Reference,
        what: &str,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut(&'a Client, RegistryAuth) -> Fut,
        Fut: Future<Output = std::result::Result<T, OciDistributionError>>,
    {
        let client = self.client_for(reference).await?;
        let auth = self.auth_for(reference.registry())?;
        let mut waited = Duration::ZERO;
        let mut attempt = 1;
        loop {
            let error = match op(client, auth.clone()).await {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            let failure = classify(&error);
            let Failure::Transient(min) = failure else {
                return Err(registry_error(reference, what, error, failure, attempt));
            };
            let delay = self.retry.delay(attempt).max(min);
            if attempt >= self.retry.attempts || waited + delay > self.retry.total {
                return Err(registry_error(reference, what, error, failure, attempt));
            }
            tokio::time::sleep(delay).await;
            waited += delay;
            attempt += 1;
        }
    }

    async fn authenticate(
        &self,
        reference: &Reference,
        operation: RegistryOperation,
    ) -> Result<()> {
        self.call(reference, "authenticate", |c, auth| async move {
            c.auth(reference, &auth, operation).await.map(|_| ())
        })
        .await
    }

    /// Fails early (before any build) when the registry is unreachable or refuses us.
    pub async fn probe(&self, reference: &Reference, push: bool) -> Result<()> {
        let operation = if push {
            RegistryOperation::Push
        } else {
            RegistryOperation::Pull
        };
        self.authenticate(reference, operation).await?;
        let absent = format!("sha256:{}", "0".repeat(64));
        self.call(reference, "check access", |c, _| {
            let absent = absent.clone();
            async move { c.blob_exists(reference, &absent).await.map(|_| ()) }
        })
        .await
    }

    pub async fn blob_exists(&self, reference: &Reference, digest: &str) -> Result<bool> {
        self.call(reference, &format!("check blob {digest}"), |c, _| {
            c.blob_exists(reference, digest)
        })
        .await
    }

    /// Uploads a spooled blob unless the registry already has it; returns whether it uploaded.
    pub async fn push_blob_file(
        &self,
        reference: &Reference,
        path: &Path,
        digest: &str,
        size: u64,
        progress: &BlobProgress<'_>,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::File { path, size }, Some(progress))
            .await
    }

    pub async fn push_blob_bytes(
        &self,
        reference: &Reference,
        bytes: &[u8],
        digest: &str,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::Bytes(bytes), None)
            .await
    }

    /// HEAD, then a cross-repository mount when this run put the blob in another
    /// repository of the same registry, then an upload. Concurrent pushes of one digest
    /// to one registry wait for each other, so a shared layer is uploaded once.
    async fn push_blob(
        &self,
        reference: &Reference,
        digest: &str,
        body: Body<'_>,
        progress: Option<&BlobProgress<'_>>,
    ) -> Result<bool> {
        let key = (reference.registry().to_string(), digest.to_string());
        let repository = reference.repository().to_string();
        let size = match &body {
            Body::File { size, .. } => *size,
            Body::Bytes(b) => b.len() as u64,
        };
        let skipped = |progress: Option<&BlobProgress<'_>>| {
            if let Some(p) = progress {
                p.add(size);
            }
        };
        let lock = self
            .uploads
            .lock()
            .expect("upload lock")
            .entry(key.clone())
            .or_default()
            .clone();
        let _guard = lock.lock().await;
        let elsewhere: Vec<String> = {
            let known = self.known.lock().expect("known lock");
            match known.get(&key) {
                Some(repos) if repos.contains(&repository) => {
                    drop(known);
                    skipped(progress);
                    return Ok(false);
                }
                Some(repos) => repos.iter().cloned().collect(),
                None => Vec::new(),
            }
        };
        let remember = || {
            self.known
                .lock()
                .expect("known lock")
                .entry(key.clone())
                .or_default()
                .insert(repository.clone());
        };
        if self.blob_exists(reference, digest).await? {
            remember();
            skipped(progress);
            return Ok(false);
        }
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        for source_repo in elsewhere {
            let Ok(source) =
                parse_reference(&format!("{}/{source_repo}:latest", reference.registry()))
            else {
                continue;
            };
            let mounted = self
                .call(reference, &format!("mount blob {digest}"), |c, _| {
                    c.mount_blob(reference, &source, digest)
                })
                .await;
            // A registry that declines the mount answers 202 and we upload instead.
            if mounted.is_ok() && self.blob_exists(reference, digest).await? {
                remember();
                skipped(progress);
                return Ok(false);
            }
        }
        let what = format!("upload blob {digest}");
        match body {
            Body::File { path, size } => {
                let counter = progress.map(|p| p.counter());
                self.call(reference, &what, |c, _| {
                    let counter = counter.clone();
                    async move {
                        let file = tokio::fs::File::open(path).await?;
                        // Bytes sent by a failed attempt are taken back before the retry.
                        let sent = Arc::new(AtomicU64::new(0));
                        let sent_here = sent.clone();
                        let counted = counter.clone();
                        let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20)
                            .inspect_ok(move |chunk| {
                                sent_here.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                                if let Some(c) = &counted {
                                    c.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                                }
                            })
                            .map_err(OciDistributionError::IoError);
                        let result = c
                            .push_blob_stream(reference, stream, digest, Some(size))
                            .await;
                        if result.is_err() {
                            if let Some(c) = &counter {
                                c.fetch_sub(sent.load(Ordering::Relaxed), Ordering::Relaxed);
                            }
                        }
                        result
                    }
                })
                .await?;
                if let Some(p) = progress {
                    p.report();
                }
            }
            Body::Bytes(bytes) => {
                let bytes = bytes::Bytes::copy_from_slice(bytes);
                self.call(reference, &what, |c, _| {
                    let bytes = bytes.clone();
                    async move { c.push_blob(reference, bytes, digest).await }
                })
                .await?;
            }
        }
        remember();
        Ok(true)
    }

    /// Pushes a manifest under `reference` (a tag, or its own digest).
    pub async fn push_manifest(
        &self,
        reference: &Reference,
        manifest: &ManifestBlob,
    ) -> Result<()> {
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        self.call(reference, "push manifest", |c, _| async move {
            {
                let content_type = manifest
                    .media_type
                    .parse()
                    .expect("media types are valid header values");
                c.push_manifest_raw(reference, manifest.bytes.clone(), content_type)
                    .await
                    .map(|_| ())
            }
        })
        .await
    }

    /// Reads a manifest; oci-client checks the body against the requested digest or the
    /// registry's Docker-Content-Digest. Returns the bytes and their digest.
    /// The digest a tag resolves to now, by a HEAD request: no manifest is downloaded,
    /// which Docker Hub would count as a pull.
    pub async fn manifest_digest(&self, reference: &Reference) -> Result<String> {
        self.call(reference, "resolve manifest", |c, auth| async move {
            c.fetch_manifest_digest(reference, &auth).await
        })
        .await
    }

    pub async fn get_manifest(&self, reference: &Reference) -> Result<(Vec<u8>, String)> {
        let Some(by_digest) = reference.digest() else {
            return self.read_manifest(reference).await;
        };
        let key = format!(
            "{}/{}@{by_digest}",
            reference.registry(),
            reference.repository()
        );
        if let Some(read) = self.manifests.lock().expect("manifest lock").get(&key) {
            return Ok((read.0.clone(), read.1.clone()));
        }
        let read = self.read_manifest(reference).await?;
        self.manifests
            .lock()
            .expect("manifest lock")
            .insert(key, Arc::new(read.clone()));
        Ok(read)
    }

    async fn read_manifest(&self, reference: &Reference) -> Result<(Vec<u8>, String)> {
        let (bytes, digest) = self
            .call(reference, "read manifest", |c, auth| async move {
                c.pull_manifest_raw(reference, &auth, oci::ACCEPTED_MANIFESTS)
                    .await
            })
            .await?;
        if bytes.len() > MAX_JSON_BLOB {
            return Err(Error::Registry {
                registry: reference.registry().to_string(),
                message: format!("manifest of {reference} is {} bytes; refusing to read more than {MAX_JSON_BLOB}", bytes.len()),
            });
        }
        let computed = oci::sha256_digest(&bytes);
        if computed != digest {
            return Err(digest_mismatch(reference, &digest, &computed));
        }
        Ok((bytes.to_vec(), digest))
    }

    async fn open_blob(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> Result<oci_client::client::SizedStream> {
        let layer = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            ..Default::default()
        };
        self.call(reference, &format!("read blob {digest}"), |c, _| {
            c.pull_blob_stream(reference, &layer)
        })
        .await
    }

    /// Reads a small JSON blob (an image config) and checks its digest. The body is read
    /// inside the retried call, so an answer cut short is asked for again.
    pub async fn get_json_blob(&self, reference: &Reference, digest: &str) -> Result<Vec<u8>> {
        let layer = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            ..Default::default()
        };
        let layer = &layer;
        let out = self
            .call(
                reference,
                &format!("read blob {digest}"),
                |c, _| async move {
                    let mut stream = c.pull_blob_stream(reference, layer).await?;
                    let mut out = Vec::new();
                    while let Some(chunk) = stream
                        .try_next()
                        .await
                        .map_err(OciDistributionError::from)?
                    {
                        out.extend_from_slice(&chunk);
                        if out.len() > MAX_JSON_BLOB {
                            break;
                        }
                    }
                    Ok(out)
                },
            )
            .await?;
        if out.len() > MAX_JSON_BLOB {
            return Err(Error::Registry {
                registry: reference.registry().to_string(),
                message: format!(
                    "blob {digest} is larger than {MAX_JSON_BLOB} bytes; it is not an image config"
                ),
            });
        }
        let computed = oci::sha256_digest(&out);
        if computed != digest {
            return Err(digest_mismatch(reference, digest, &computed));
        }
        Ok(out)
    }

    /// Streams a blob (a layer) for deep checks; the digest is verified as it streams.
    pub async fn blob_stream(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> Result<impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>>> {
        Ok(self.open_blob(reference, digest).await?.stream)
    }
}

fn digest_mismatch(reference: &Reference, expected: &str, computed: &str) -> Error {
    Error::Registry {
        registry: reference.registry().to_string(),
        message: format!(
            "content of {reference} does not match its digest (expected {expected}, got {computed}); the registry or a proxy altered it"
        ),
    }
}

/// The error and its sources, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    strip_urls(&one_line(&text))
}

/// URLs in error text lose any `user:pass@` and query string (upload state, tokens).
fn strip_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | ',' | '"' | '\''))
            .unwrap_or(rest.len());
        let url = &rest[..end];
        let url = match url.find('/') {
            Some(slash) => match url[..slash].rfind('@') {
                Some(a) => &url[a + 1..],
                None => url,
            },
            None => url.rsplit('@').next().unwrap_or(url),
        };
        out.push_str(url.split('?').next().unwrap_or(url));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn status_of(error: &OciDistributionError) -> Option<u16> {
    match error {
        OciDistributionError::RequestError(e) => e.status().map(|s| s.as_u16()),
        OciDistributionError::ServerError { code, .. } => Some(*code),
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => Some(401),
        OciDistributionError::RegistryError { envelope, .. } => {
            let text = envelope.to_string().to_ascii_uppercase();
            if text.contains("TOOMANYREQUESTS") {
                Some(429)
            } else if text.contains("UNAUTHORIZED") {
                Some(401)
            } else if text.contains("DENIED") {
                Some(403)
            } else {
                Some(400)
            }
        }
        _ => None,
    }
}

/// 5xx, 429 and transport failures (resets, timeouts, refused connections) are
/// transient; 4xx answers, certificate problems and local errors are not.
fn classify(error: &OciDistributionError) -> Failure {
    if let Some(code) = status_of(error) {
        return match code {
            // oci-client does not expose response headers, so Retry-After cannot be read;
            // wait at least its common value.
            429 => Failure::Transient(Duration::from_secs(1)),
            500..=599 => Failure::Transient(Duration::ZERO),
            _ => Failure::Permanent,
        };
    }
    match error {
        OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => {
            let text = chain(error).to_ascii_lowercase();
            if text.contains("certificate") || text.contains("unknownissuer") {
                Failure::Tls
            } else {
                Failure::Transient(Duration::ZERO)
            }
        }
        _ => Failure::Permanent,
    }
}

fn registry_error(
    reference: &Reference,
    what: &str,
    error: OciDistributionError,
    failure: Failure,
    attempts: u32,
) -> Error {
    let registry = reference.registry().to_string();
    let detail = chain(&error);
    let status = status_of(&error);
    let message = if matches!(status, Some(401)) {
        format!(
            "401 unauthorized: cannot {what} for {reference} for {registry}: check credentials for this registry (--username/--password-stdin, docker login, or the Docker config's credHelpers)"
        )
    } else if matches!(status, Some(403)) {
        format!("403 denied: cannot {what} for {reference}: the credentials for {registry} lack permission for this repository")
    } else if failure == Failure::Tls {
        format!(
            "TLS: cannot {what} for {reference}: the certificate of {registry} is not trusted ({detail}); pass its CA with --ca-cert FILE (or SSL_CERT_FILE) or put it in {}",
            certs_d_root().join(&registry).join("ca.crt").display()
        )
    } else if matches!(failure, Failure::Transient(_)) {
        let tries = if attempts > 1 {
            format!(" after {attempts} attempts")
        } else {
            String::new()
        };
        let hint = if status.is_none() {
            "; is the registry running and reachable?"
        } else {
            "; the registry keeps failing, try again later"
        };
        format!("cannot {what} for {reference}{tries}: {detail}{hint}")
    } else {
        format!("cannot {what} for {reference}: {detail}")
    };
    Error::Registry { registry, message }
}

/// Counts pushed bytes for one image × platform and reports them.
pub struct BlobProgress<'a> {
    pub image: &'a str,
    pub platform: Option<&'a Platform>,
    pub total: Option<u64>,
    pub reporter: &'a dyn Reporter,
    pub done: Arc<AtomicU64>,
}

impl BlobProgress<'_> {
    fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
        self.report();
    }

    pub fn report(&self) {
        self.reporter.report(Event::Bytes {
            image: self.image.to_string(),
            platform: self.platform.cloned(),
            phase: Phase::Push,
            done: self.done.load(Ordering::Relaxed),
            total: self.total,
        });
    }
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
    fn error_urls_lose_credentials_and_queries() {
        assert_eq!(
            strip_urls("url (http://u:p@h:1/v2/x?_state=abc&digest=d), code: 500"),
            "url (http://h:1/v2/x), code: 500"
        );
    }

    #[test]
    fn retries_back_off_within_bounds() {
        let p = RetryPolicy::default();
        for attempt in 1..10 {
            let d = p.delay(attempt);
            assert!(d <= p.max_delay.mul_f64(1.5), "{attempt}: {d:?}");
        }
        assert!(p.delay(1) >= p.base / 2 && p.delay(1) < p.base * 3 / 2);
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "http://h/v2/".into(),
            message: String::new(),
        };
        assert_eq!(classify(&server(503)), Failure::Transient(Duration::ZERO));
        assert_eq!(
            classify(&server(429)),
            Failure::Transient(Duration::from_secs(1))
        );
        for code in [400, 401, 403, 404] {
            assert_eq!(classify(&server(code)), Failure::Permanent, "{code}");
        }
    }

    #[test]
    fn references_parse_as_distribution_and_oci_spec_parse_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let same = [
            "busybox".to_string(),
            "busybox:1.36".into(),
            "library/busybox".into(),
            "index.docker.io/x/y:z".into(),
            "ghcr.io/o/r/deep/path:v1.2.3-rc_1".into(),
            "127.0.0.1:5000/a/b".into(),
            "localhost/a".into(),
            "localhost:5000/a--b/c__d.e:t".into(),
            "test.com:tag".into(),
            format!("reg.example:443/a@{digest}"),
            format!("reg.example/a:t@{digest}"),
            format!("busybox@{digest}"),
        ];
        for text in &same {
            let ours = parse_reference(text).unwrap();
            let theirs: Reference = text.parse().unwrap();
            assert_eq!(ours.whole(), theirs.whole(), "{text}");
            assert_eq!(ours.registry(), theirs.registry(), "{text}");
            assert_eq!(ours.repository(), theirs.repository(), "{text}");
            assert_eq!(ours.tag(), theirs.tag(), "{text}");
            assert_eq!(ours.digest(), theirs.digest(), "{text}");
        }
        let rejected = [
            "".to_string(),
            "UPPER/x:y".into(),
            "r.io/Upper:y".into(),
            "r.io/a/:t".into(),
            "r.io/-a:t".into(),
            "r.io/a...b:t".into(),
            "r.io/a:.t".into(),
            format!("r.io/a:{}", "t".repeat(129)),
            "r.io/a@sha256:abc".into(),
            format!("r.io/a@md5:{}", "a".repeat(32)),
            "r.io:port/a:t".into(),
            "bad_host.io/a:t".into(),
            "[::1/a:t".into(),
        ];
        for text in &rejected {
            assert!(parse_reference(text).is_err(), "{text} accepted");
        }
        // Found by fuzzing: a 250-character Docker Hub name is 258 with `library/`.
        let long = "a".repeat(250);
        assert!(parse_reference(&long).is_err());
        assert!(parse_reference(&format!("r.io/{long}")).is_ok());
        let v6 = parse_reference("[::1]:5000/a/b:t").unwrap();
        assert_eq!((v6.registry(), v6.repository()), ("[::1]:5000", "a/b"));
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

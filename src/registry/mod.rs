//! Talking to an OCI distribution registry through oci-client: blobs by digest (HEAD
//! first), manifests by digest, the index to each tag, and verified reads back.

mod auth;
mod failure;
mod probe;
mod reference;

pub use probe::{certs_d_root, is_loopback};
pub use reference::parse_reference;

use crate::credentials::{self, Credential};
use crate::oci::{self, ManifestBlob};
use crate::progress::{Event, Phase, Reporter};
use crate::{Error, Platform, Result};
use auth::{Challenge, Scopes, TokenAnswer, Tokens};
use failure::{classify, digest_mismatch, registry_error, Attempt, Failure};
use futures_util::TryStreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use probe::{ask_plain_v2, certs_d_files, has_port};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    /// Per registry: the token realm it sends clients to, or None (basic auth or none).
    challenges: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Option<Challenge>>>>>,
    /// Per registry with a token realm: the run's one token and the scopes it wants.
    tokens: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Tokens>>>>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scheme {
    /// Plain HTTP; `open`: it serves anonymous requests without a token; `bearer`: the
    /// token realm its `/v2/` named, when it was asked on a known port.
    Plain {
        open: bool,
        bearer: Option<Challenge>,
    },
    Tls,
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
    /// reqwest itself, verified and not, for what oci-client cannot share: the `/v2/`
    /// challenge of a TLS registry and token fetches.
    http: OnceLock<reqwest::Client>,
    http_unverified: OnceLock<reqwest::Client>,
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

    fn http(&self, verified: bool) -> &reqwest::Client {
        let cell = if verified {
            &self.http
        } else {
            &self.http_unverified
        };
        cell.get_or_init(|| {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(60))
                .danger_accept_invalid_certs(!verified);
            if verified {
                // A file that is no PEM certificate fails oci-client's clients already.
                for pem in &self.extra_root_certificates {
                    if let Ok(certificate) = reqwest::Certificate::from_pem(&pem.data) {
                        builder = builder.add_root_certificate(certificate);
                    }
                }
            }
            // As oci-client's own clients: a builder that fails falls back to the default.
            builder.build().unwrap_or_else(|_| reqwest::Client::new())
        })
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
                http: OnceLock::new(),
                http_unverified: OnceLock::new(),
            },
            plain_capable,
            insecure,
            schemes: Mutex::default(),
            challenges: Mutex::default(),
            tokens: Mutex::default(),
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
                Scheme::Plain { open, .. } => {
                    if open {
                        self.send_empty_bearer(&host)?;
                    }
                    self.clients.plain()
                }
                Scheme::Tls if self.insecure.contains(&host) => self.clients.unverified(),
                Scheme::Tls => self.clients.https(),
            }
        };
        if self.challenge(reference).await.is_none() {
            client
                .store_auth_if_needed(&resolved, &self.auth_for(&host)?)
                .await;
        }
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
        cell.get_or_init(|| async {
            let resolved = reference.resolve_registry();
            if has_port(resolved) {
                if let Some(answer) = ask_plain_v2(resolved).await.filter(|a| a.is_registry()) {
                    return Scheme::Plain {
                        open: answer.is_open(),
                        bearer: answer.bearer(),
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
                        _ => Scheme::Plain {
                            open: false,
                            bearer: None,
                        },
                    }
                }
                _ => Scheme::Tls,
            }
        })
        .await
        .clone()
    }

    /// Runs one registry call with bounded, jittered retries of transient failures, with
    /// the run's token where the registry wants one (fetched again once when refused).
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
        let mut renewed = false;
        loop {
            let (auth, token) = match self.challenge(reference).await {
                Some(challenge) => {
                    let token = self.token(reference, &challenge, false).await?;
                    let auth = RegistryAuth::Bearer(token.clone());
                    // oci-client keeps a token per repository and operation and fetches its
                    // own on a miss; handed the run's token for both, it never does. With
                    // a bearer it only stores it: nothing can fail.
                    for operation in [RegistryOperation::Pull, RegistryOperation::Push] {
                        let _ = client.auth(reference, &auth, operation).await;
                    }
                    (auth, Some(token))
                }
                None => (self.auth_for(reference.registry())?, None),
            };
            let attempt = || {
                let call = op(client, auth.clone());
                async move { call.await.map_err(Attempt::from) }
            };
            match self.retrying(attempt).await {
                Ok(value) => return Ok(value),
                // A registry refuses a token that lapsed early or lacks a scope it now
                // wants: one new token, asked with every scope, then the call again.
                Err((failed, _)) if failed.status == Some(401) && !renewed && token.is_some() => {
                    renewed = true;
                    let state = self.token_state(reference.registry());
                    state
                        .lock()
                        .await
                        .reject(token.as_deref().unwrap_or_default());
                }
                Err((failed, attempts)) => {
                    return Err(registry_error(reference, what, failed, attempts))
                }
            }
        }
    }

    /// Bounded, jittered retries of transient failures; the last failure and the number
    /// of attempts when it gives up.
    async fn retrying<T, F, Fut>(&self, mut attempt: F) -> std::result::Result<T, (Attempt, u32)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, Attempt>>,
    {
        let mut waited = Duration::ZERO;
        let mut count = 1;
        loop {
            let failed = match attempt().await {
                Ok(value) => return Ok(value),
                Err(failed) => failed,
            };
            let Failure::Transient(min) = failed.failure else {
                return Err((failed, count));
            };
            let delay = self.retry.delay(count).max(min);
            if count >= self.retry.attempts || waited + delay > self.retry.total {
                return Err((failed, count));
            }
            tokio::time::sleep(delay).await;
            waited += delay;
            count += 1;
        }
    }

    /// The token realm of the reference's registry, asked once: from its plain `/v2/`
    /// answer when there was one, else by `GET /v2/`. None for registries without one, and
    /// for identity tokens (and the empty bearer), which are presented as they are.
    async fn challenge(&self, reference: &Reference) -> Option<Challenge> {
        let host = reference.registry();
        let cell = self
            .challenges
            .lock()
            .expect("challenge lock")
            .entry(host.to_string())
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            if !matches!(
                self.auth_for(host),
                Ok(RegistryAuth::Anonymous | RegistryAuth::Basic(..))
            ) {
                return None;
            }
            let resolved = reference.resolve_registry();
            let (scheme, verified) = if self.plain_capable.contains(host) {
                match self.scheme(host, reference).await {
                    Scheme::Plain { bearer, .. } if has_port(resolved) => return bearer,
                    Scheme::Plain { .. } => ("http", true),
                    Scheme::Tls => ("https", !self.insecure.contains(host)),
                }
            } else {
                ("https", true)
            };
            let url = format!("{scheme}://{resolved}/v2/");
            let answer = self.clients.http(verified).get(&url).send().await.ok()?;
            let header = answer.headers().get(reqwest::header::WWW_AUTHENTICATE)?;
            auth::parse_challenge(header.to_str().ok()?)
        })
        .await
        .clone()
    }

    fn token_state(&self, registry: &str) -> Arc<tokio::sync::Mutex<Tokens>> {
        self.tokens
            .lock()
            .expect("token lock")
            .entry(registry.to_string())
            .or_default()
            .clone()
    }

    /// Declares a repository the run will use (`push`: and push to), before any call, so
    /// the registry's one token is asked for all of them at once.
    pub async fn declare(&self, reference: &Reference, push: bool) {
        let state = self.token_state(reference.registry());
        state.lock().await.want(reference.repository(), push);
    }

    /// The run's token for the reference's registry, covering its repository (`push`: for
    /// pushing too): the one held, or one fetched for every scope the run wants. Calls
    /// wait for each other here, so concurrent ones share one fetch.
    async fn token(
        &self,
        reference: &Reference,
        challenge: &Challenge,
        push: bool,
    ) -> Result<String> {
        let state = self.token_state(reference.registry());
        let mut tokens = state.lock().await;
        if let Some(token) = tokens.current(reference.repository(), push, Instant::now()) {
            return Ok(token);
        }
        let asked = tokens.ask_with(reference.repository(), push);
        let credentials = match self.auth_for(reference.registry())? {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        };
        let fetched = self
            .retrying(|| self.fetch_token(challenge, &asked, credentials.as_ref()))
            .await;
        let (token, expires_in) =
            fetched.map_err(|(failed, n)| registry_error(reference, "authenticate", failed, n))?;
        tokens.store(token.clone(), asked, expires_in, Instant::now());
        Ok(token)
    }

    /// One `GET realm?service=…&scope=…&scope=…`, as Docker's token spec has it.
    async fn fetch_token(
        &self,
        challenge: &Challenge,
        scopes: &Scopes,
        credentials: Option<&(String, String)>,
    ) -> std::result::Result<(String, Option<u64>), Attempt> {
        let mut query: Vec<(&str, String)> = scopes
            .parameters()
            .into_iter()
            .map(|scope| ("scope", scope))
            .collect();
        if let Some(service) = &challenge.service {
            query.push(("service", service.clone()));
        }
        // A realm on an `--insecure-registry` host is trusted as that registry is.
        let verified = !self
            .insecure
            .iter()
            .any(|host| challenge.realm.contains(&format!("://{host}/")));
        let mut request = self
            .clients
            .http(verified)
            .get(&challenge.realm)
            .query(&query);
        if let Some((user, password)) = credentials {
            request = request.basic_auth(user, Some(password));
        }
        let answer = request.send().await?;
        let status = answer.status().as_u16();
        let body = answer.bytes().await?;
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(Attempt::answered(status, &challenge.realm, text));
        }
        serde_json::from_slice::<TokenAnswer>(&body)
            .ok()
            .and_then(TokenAnswer::token)
            .ok_or_else(|| Attempt {
                status: Some(status),
                failure: Failure::Permanent,
                detail: format!("the token server {} answered no token", challenge.realm),
            })
    }

    async fn authenticate(
        &self,
        reference: &Reference,
        operation: RegistryOperation,
    ) -> Result<()> {
        if let Some(challenge) = self.challenge(reference).await {
            let push = operation == RegistryOperation::Push;
            return self.token(reference, &challenge, push).await.map(drop);
        }
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
    fn retries_back_off_within_bounds() {
        let p = RetryPolicy::default();
        for attempt in 1..10 {
            let d = p.delay(attempt);
            assert!(d <= p.max_delay.mul_f64(1.5), "{attempt}: {d:?}");
        }
        assert!(p.delay(1) >= p.base / 2 && p.delay(1) < p.base * 3 / 2);
    }
}

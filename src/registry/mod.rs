//! Talking to an OCI distribution registry through oci-client: blobs by digest (HEAD
//! first), manifests by digest, the index to each tag, and verified reads back.

mod auth;
mod body;
mod challenge;
mod clients;
pub mod credentials;
mod error;
mod failure;
mod probe;
mod push;
mod read;
mod referrers;

pub use crate::base::reference::parse_reference;
pub use error::{ClientError, ListingError, RegistryError};
pub use probe::{certs_d_root, is_loopback};
pub use push::{BlobPlaces, BlobProgress};

use crate::base::digest::Digest;
use crate::base::oci;
use credentials::Credential;

type Result<T, E = ClientError> = std::result::Result<T, E>;
use auth::Tokens;
use body::read_json;
use challenge::Challenge;
use clients::Clients;
use failure::{classify, digest_mismatch, registry_error, Attempt, Failure};
use futures_util::TryStreamExt;
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use probe::{ask_plain_v2, certs_d_files, has_port};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long one registry request may take, from sending it to the end of its answer,
/// unless `RegistryOptions::deadline` says otherwise.
pub const DEFAULT_REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// The slowest transfer a blob upload or layer read is given time for beyond the deadline
/// (256 KiB/s, about 2 Mbit/s): a big layer is not cut off on a slow link, a stalled one is.
const MIN_TRANSFER_RATE: u64 = 256 * 1024;
/// Requests one registry has in flight at once, from every flow of a run: an index of
/// thousands of entries is read that many at a time, never all at once (which ran out of
/// file descriptors), and a registry is not flooded.
pub const MAX_IN_FLIGHT: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`) to reach over plain HTTP besides loopback ones.
    pub insecure: Vec<String>,
    /// Basic credentials (user, password) for every registry, when given on the CLI.
    pub credentials: Option<(String, String)>,
    /// Extra CA certificates (PEM files) to trust.
    pub ca_certs: Vec<std::path::PathBuf>,
    /// Retry policy for transient failures; `None` uses [`RetryPolicy::from_env`].
    pub retry: Option<RetryPolicy>,
    /// Longest one request may take; `None`: [`DEFAULT_REQUEST_DEADLINE`]. Blob transfers
    /// get more in proportion to their size.
    pub deadline: Option<Duration>,
}

impl RegistryOptions {
    /// Whether `registry` (`host[:port]`) may be reached over plain HTTP: loopback, or
    /// listed as insecure.
    pub fn allows_plain_http(&self, registry: &str) -> bool {
        is_loopback(registry) || self.insecure.iter().any(|r| r == registry)
    }
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

/// Where a manifest read is kept: `registry/repository@digest` or `registry/repository:tag`.
fn read_key(reference: &Reference) -> String {
    let (registry, repository) = (reference.registry(), reference.repository());
    match (reference.digest(), reference.tag()) {
        (Some(digest), _) => format!("{registry}/{repository}@{digest}"),
        (None, tag) => format!("{registry}/{repository}:{}", tag.unwrap_or("latest")),
    }
}

/// `(registry, digest)`.
type BlobKey = (String, String);

/// A manifest's bytes and digest as a registry served them.
type ManifestRead = (Vec<u8>, Digest);

/// A registry client shared by a run (behind an `Arc`: it is large and lives in enums,
/// and work begun in the background, as an SBOM read once a platform is pushed, holds
/// a clone of it).
#[derive(Clone)]
pub struct Registry(std::sync::Arc<Inner>);

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
    /// Manifests read in this run, so none is read twice: by digest (content addressed),
    /// and by tag until this run pushes to that tag (a warm rerun's read-back is then the
    /// answer the check before publishing got).
    manifests: Mutex<HashMap<String, Arc<ManifestRead>>>,
    /// Per registry, resolved once (CLI, credential helpers, Docker config).
    auths: Mutex<HashMap<String, RegistryAuth>>,
    cli_credentials: Option<(String, String)>,
    retry: RetryPolicy,
    /// Longest one request may take (see [`Registry::deadline_for`]).
    deadline: Duration,
    /// `registry digest` → repositories this run knows to hold the blob.
    known: Mutex<HashMap<BlobKey, HashSet<String>>>,
    /// One upload per `registry digest` at a time.
    uploads: Mutex<HashMap<BlobKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Per registry: the requests it may have in flight at once, from every flow of the
    /// run ([`MAX_IN_FLIGHT`]).
    in_flight: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Where earlier runs put each blob, when the caller keeps that between runs.
    places: OnceLock<Arc<dyn BlobPlaces>>,
    /// What this run derived from a blob's bytes, by kind and digest: each derived once,
    /// however many images and platforms hold the blob (see [`Registry::derived`]).
    derived: Mutex<HashMap<(std::any::TypeId, String), Arc<Derived>>>,
}

type Derived = tokio::sync::OnceCell<Arc<dyn std::any::Any + Send + Sync>>;

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

impl Registry {
    /// `registries` are the hosts this run talks to: their credentials are resolved now,
    /// loopback and `--insecure-registry` ones may fall back to plain HTTP.
    pub fn new(registries: &[String], options: &RegistryOptions) -> Result<Registry> {
        // reqwest takes the process-wide rustls provider; an earlier install is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain_capable: HashSet<String> = registries
            .iter()
            .filter(|r| options.allows_plain_http(r))
            .cloned()
            .collect();
        let insecure: HashSet<String> = options.insecure.iter().cloned().collect();
        let mut ca_files: Vec<PathBuf> = options.ca_certs.clone();
        for registry in registries {
            ca_files.extend(certs_d_files(registry));
        }
        // Checked now, so a wrong path is refused before any work; read when a verified
        // client is first built (see `Clients::ca_files`).
        for path in &ca_files {
            let file = std::fs::metadata(path).and_then(|m| match m.is_dir() {
                true => Err(std::io::ErrorKind::IsADirectory.into()),
                false => Ok(()),
            });
            file.map_err(|source| ClientError::CaFile {
                path: path.clone(),
                source,
            })?;
        }
        let registry = Registry(std::sync::Arc::new(Inner {
            clients: Clients {
                ca_files,
                extra_root_certificates: OnceLock::new(),
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
            derived: Mutex::default(),
            auths: Mutex::default(),
            cli_credentials: options.credentials.clone(),
            retry: options.retry.unwrap_or_else(RetryPolicy::from_env),
            deadline: options.deadline.unwrap_or(DEFAULT_REQUEST_DEADLINE),
            known: Mutex::default(),
            uploads: Mutex::default(),
            in_flight: Mutex::default(),
            places: OnceLock::new(),
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
    /// otherwise, as Docker, HTTPS on 443 is tried and plain HTTP is the fallback. A read
    /// whose own plain answer decided it (see `first_read`) spares the ping.
    async fn scheme(&self, host: &str, reference: &Reference) -> Scheme {
        self.decide_scheme(host, reference, true).await
    }

    /// [`Registry::scheme`]; without `ping` no plain `/v2/` is asked, as when a plain read
    /// of the same server got no answer at all.
    async fn decide_scheme(&self, host: &str, reference: &Reference, ping: bool) -> Scheme {
        self.scheme_cell(host)
            .get_or_init(|| async {
                let resolved = reference.resolve_registry();
                if has_port(resolved) && ping {
                    if let Some(answer) = ask_plain_v2(resolved).await.filter(|a| a.is_registry()) {
                        return Scheme::Plain {
                            open: answer.is_open(),
                            bearer: answer.bearer(),
                        };
                    }
                }
                let absent = format!("sha256:{}", "0".repeat(64));
                let probe = self.clients.unverified().blob_exists(reference, &absent);
                // A server silent to TLS too gets the answer of one that speaks no TLS; the
                // request that follows then fails by its own deadline.
                let Ok(probe) = tokio::time::timeout(self.deadline, probe).await else {
                    return Scheme::Plain {
                        open: false,
                        bearer: None,
                    };
                };
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

    /// Where the scheme of `host` is decided once per run.
    fn scheme_cell(&self, host: &str) -> Arc<tokio::sync::OnceCell<Scheme>> {
        self.schemes
            .lock()
            .expect("scheme lock")
            .entry(host.to_string())
            .or_default()
            .clone()
    }

    /// Runs one oci-client call with the run's auth, retried as [`Registry::authorized`]
    /// says, each attempt within the request deadline.
    async fn call<'a, T, F, Fut>(&'a self, reference: &'a Reference, what: &str, op: F) -> Result<T>
    where
        F: FnMut(&'a Client, RegistryAuth) -> Fut,
        Fut: Future<Output = std::result::Result<T, OciDistributionError>>,
    {
        self.call_within(reference, what, self.deadline, op).await
    }

    /// [`Registry::call`] with each attempt given `deadline`. Every oci-client call goes
    /// through here.
    async fn call_within<'a, T, F, Fut>(
        &'a self,
        reference: &'a Reference,
        what: &str,
        deadline: Duration,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut(&'a Client, RegistryAuth) -> Fut,
        Fut: Future<Output = std::result::Result<T, OciDistributionError>>,
    {
        let client = self.client_for(reference).await?;
        self.authorized(reference, what, deadline, |auth, token| {
            let call = op(client, auth.clone());
            async move {
                // oci-client keeps a token per repository and operation and fetches its
                // own on a miss; handed the run's token for both, it never does. With a
                // bearer it only stores it: nothing can fail.
                if token {
                    for operation in [RegistryOperation::Pull, RegistryOperation::Push] {
                        let _ = client.auth(reference, &auth, operation).await;
                    }
                }
                call.await.map_err(Attempt::from)
            }
        })
        .await
    }

    /// Runs one registry request with bounded, jittered retries of transient failures,
    /// with the run's token where the registry wants one (fetched again once when
    /// refused); `op` is told whether its auth is that token, and each attempt is given
    /// `deadline`.
    async fn authorized<T, F, Fut>(
        &self,
        reference: &Reference,
        what: &str,
        deadline: Duration,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut(RegistryAuth, bool) -> Fut,
        Fut: Future<Output = std::result::Result<T, Attempt>>,
    {
        let mut renewed = false;
        loop {
            let (auth, token) = match self.challenge(reference).await {
                Some(challenge) => {
                    let token = self.token(reference, &challenge, false).await?;
                    (RegistryAuth::Bearer(token.clone()), Some(token))
                }
                None => (self.auth_for(reference.registry())?, None),
            };
            let attempt = || op(auth.clone(), token.is_some());
            match self.retrying(reference.registry(), deadline, attempt).await {
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

    /// Bounded, jittered retries of transient failures, each attempt within `deadline`
    /// once one of `registry`'s places in flight is free; the last failure and the number
    /// of attempts when it gives up.
    async fn retrying<T, F, Fut>(
        &self,
        registry: &str,
        deadline: Duration,
        mut attempt: F,
    ) -> std::result::Result<T, (Attempt, u32)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, Attempt>>,
    {
        let places = self.places_in_flight(registry);
        let mut waited = Duration::ZERO;
        let mut count = 1;
        loop {
            let answered = {
                // Never closed, so the wait always ends with a place.
                let _place = places.acquire().await;
                within(deadline, attempt()).await
            };
            let failed = match answered {
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

    fn places_in_flight(&self, registry: &str) -> Arc<tokio::sync::Semaphore> {
        let mut all = self.in_flight.lock().expect("in-flight lock");
        let places = all.entry(registry.to_string());
        Arc::clone(places.or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT))))
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

    /// Fails early (before any build) when the registry is unreachable or refuses us: a
    /// token with the scope the run needs where the registry wants one, then a read of an
    /// absent blob with the run's auth (a 404 is the answer hoped for). Over reqwest, as
    /// reads are: building an oci-client client loads the system's CA store, which a run
    /// that pushes nothing (a warm rerun) never needs.
    pub async fn probe(&self, reference: &Reference, push: bool) -> Result<()> {
        if let Some(challenge) = self.challenge(reference).await {
            self.token(reference, &challenge, push).await?;
        }
        let absent = format!("blobs/sha256:{}", "0".repeat(64));
        let access = self.get_if_there(
            reference,
            "check access",
            &absent,
            "*/*",
            |_| async { Ok(()) },
            true,
        );
        access.await.map(drop)
    }

    pub async fn blob_exists(&self, reference: &Reference, digest: &Digest) -> Result<bool> {
        self.call(reference, &format!("check blob {digest}"), |c, _| {
            c.blob_exists(reference, digest.as_str())
        })
        .await
    }

    /// The digest a tag resolves to now, by a HEAD request: no manifest is downloaded,
    /// which Docker Hub would count as a pull.
    pub async fn manifest_digest(&self, reference: &Reference) -> Result<String> {
        self.call(reference, "resolve manifest", |c, auth| async move {
            c.fetch_manifest_digest(reference, &auth).await
        })
        .await
    }

    /// Reads a manifest, checked against the requested digest or the registry's
    /// Docker-Content-Digest. Returns the bytes and their digest.
    pub async fn get_manifest(&self, reference: &Reference) -> Result<ManifestRead> {
        let key = read_key(reference);
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

    /// Forgets what a tag was read as: this run is about to move it.
    fn forget_tag_read(&self, reference: &Reference) {
        if reference.digest().is_none() {
            self.manifests
                .lock()
                .expect("manifest lock")
                .remove(&read_key(reference));
        }
    }

    async fn read_manifest(&self, reference: &Reference) -> Result<ManifestRead> {
        let wanted = reference.digest().or(reference.tag()).unwrap_or("latest");
        let (bytes, announced) = self
            .get(
                reference,
                "read manifest",
                &format!("manifests/{wanted}"),
                &oci::ACCEPTED_MANIFESTS.join(", "),
                |response| async move {
                    let announced = response
                        .headers()
                        .get("Docker-Content-Digest")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    Ok((read_json(response).await?, announced))
                },
            )
            .await?;
        let computed = Digest::of(&bytes);
        // Checked against the digest asked for, else the one the registry announced.
        if let Some(expected) = reference.digest().map(str::to_string).or(announced) {
            if computed != expected.as_str() {
                return Err(digest_mismatch(reference, &expected, computed.as_str()));
            }
        }
        Ok((bytes, computed))
    }

    /// Reads a small JSON blob (an image config) and checks its digest. The body is read
    /// inside the retried request, so an answer cut short is asked for again.
    pub async fn get_json_blob(&self, reference: &Reference, digest: &Digest) -> Result<Vec<u8>> {
        let out = self
            .get(
                reference,
                &format!("read blob {digest}"),
                &format!("blobs/{digest}"),
                "*/*",
                read_json,
            )
            .await?;
        let computed = Digest::of(&out);
        if computed != *digest {
            return Err(digest_mismatch(
                reference,
                digest.as_str(),
                computed.as_str(),
            ));
        }
        Ok(out)
    }

    /// Streams a blob (a layer) for deep checks; the caller verifies the digest as it
    /// streams. The stream fails once the time its announced size is given has passed.
    pub async fn blob_stream(
        &self,
        reference: &Reference,
        digest: &Digest,
    ) -> Result<impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>>> {
        let response = self
            .get(
                reference,
                &format!("read blob {digest}"),
                &format!("blobs/{digest}"),
                "*/*",
                |response| async move { Ok(response) },
            )
            .await?;
        let size = response.content_length().unwrap_or(0);
        let until = tokio::time::Instant::now() + self.deadline_for(size);
        let chunks = response.bytes_stream().map_err(std::io::Error::other);
        Ok(futures_util::stream::unfold(
            Box::pin(chunks),
            move |mut chunks| async move {
                let next = tokio::time::timeout_at(until, chunks.try_next()).await;
                match next {
                    Ok(chunk) => chunk.transpose().map(|chunk| (chunk, chunks)),
                    Err(_) => {
                        let late = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the blob did not arrive within its deadline",
                        );
                        Some((Err(late), chunks))
                    }
                }
            },
        ))
    }

    /// How long a request moving `size` bytes may take: the deadline, and time for the
    /// bytes at [`MIN_TRANSFER_RATE`].
    fn deadline_for(&self, size: u64) -> Duration {
        self.deadline + Duration::from_secs(size / MIN_TRANSFER_RATE)
    }

    /// The `T` this run derived from the blob `digest`, derived now by `derive` if none
    /// was: a blob's digest names its bytes, so what was read from them once holds for
    /// every image that holds it. Callers that ask at once wait for one derivation; one
    /// that fails is tried again by the next caller.
    pub async fn derived<T, E, F>(
        &self,
        digest: &Digest,
        derive: impl FnOnce() -> F,
    ) -> std::result::Result<Arc<T>, E>
    where
        T: std::any::Any + Send + Sync,
        F: Future<Output = std::result::Result<T, E>>,
    {
        let key = (std::any::TypeId::of::<T>(), digest.to_string());
        let cell = self
            .derived
            .lock()
            .expect("derived lock")
            .entry(key)
            .or_default()
            .clone();
        let value = cell
            .get_or_try_init(|| async {
                let value: Arc<dyn std::any::Any + Send + Sync> = Arc::new(derive().await?);
                Ok(value)
            })
            .await?;
        // Keyed by its type: what is found is a `T`.
        Ok(Arc::clone(value)
            .downcast::<T>()
            .unwrap_or_else(|_| unreachable!("derived values are keyed by their type")))
    }
}

/// `work` within `deadline`; past it the attempt has timed out.
async fn within<T>(
    deadline: Duration,
    work: impl Future<Output = std::result::Result<T, Attempt>>,
) -> std::result::Result<T, Attempt> {
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| Err(Attempt::timed_out(deadline)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Platforms that share a layer ask for what it holds at once: it is derived once; a
    /// derivation that fails is not remembered, and the next caller derives it again.
    #[tokio::test]
    async fn what_a_blob_holds_is_derived_once_per_run_and_a_failure_is_tried_again() {
        let registry = Registry::new(&[], &RegistryOptions::default()).unwrap();
        let digest: Digest = format!("sha256:{}", "a".repeat(64)).parse().unwrap();
        let derivations = std::sync::atomic::AtomicUsize::new(0);
        let derive = || async {
            derivations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok::<_, String>(7u32)
        };
        let (a, b) = tokio::join!(
            registry.derived(&digest, derive),
            registry.derived(&digest, derive)
        );
        assert_eq!((*a.unwrap(), *b.unwrap()), (7, 7));
        assert_eq!(derivations.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Another kind of value of the same blob is its own.
        let other = registry.derived(&digest, || async { Ok::<_, String>("text") });
        assert_eq!(*other.await.unwrap(), "text");

        let failing: Digest = format!("sha256:{}", "b".repeat(64)).parse().unwrap();
        let failed = registry
            .derived(&failing, || async {
                Err::<u32, _>("the layer was cut short")
            })
            .await;
        assert_eq!(failed.unwrap_err(), "the layer was cut short");
        let again = registry.derived(&failing, || async { Ok::<u32, &str>(8) });
        assert_eq!(*again.await.unwrap(), 8);
    }

    /// `SSL_CERT_FILE` is often the whole system bundle: a run that only speaks plain HTTP
    /// (a loopback `verify`) must not read it; a path that is not there is refused up front.
    #[test]
    fn ca_files_are_read_by_the_first_verified_client_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("bundle.pem");
        std::fs::write(&ca, "not read yet").unwrap();
        let options = RegistryOptions {
            ca_certs: vec![ca.clone()],
            credentials: Some(("user".into(), "secret".into())),
            ..Default::default()
        };
        let registry = Registry::new(&["127.0.0.1:5000".into()], &options).unwrap();
        let _ = registry.clients.http(false);
        assert!(registry.clients.extra_root_certificates.get().is_none());
        let _ = registry.clients.http(true);
        assert_eq!(
            registry
                .clients
                .extra_root_certificates
                .get()
                .unwrap()
                .len(),
            1
        );

        let gone = RegistryOptions {
            ca_certs: vec![dir.path().join("missing.pem")],
            ..options
        };
        let refused = Registry::new(&["127.0.0.1:5000".into()], &gone);
        assert!(
            matches!(refused, Err(ClientError::CaFile { .. })),
            "{:?}",
            refused.err()
        );
    }

    /// A server too slow for the deadline is not asked again: each attempt would wait as
    /// long. A transient failure still is.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_past_its_deadline_fails_once_as_timed_out() {
        // A total no jittered backoff can reach: every attempt is made.
        let patient = RetryPolicy {
            total: Duration::from_secs(3600),
            ..RetryPolicy::default()
        };
        let options = RegistryOptions {
            retry: Some(patient),
            ..RegistryOptions::default()
        };
        let registry = Registry::new(&[], &options).unwrap();
        let deadline = Duration::from_secs(3);
        let tries = std::sync::atomic::AtomicU32::new(0);
        let hung = registry
            .retrying("r", deadline, || {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::future::pending::<std::result::Result<(), Attempt>>()
            })
            .await;
        let (failed, attempts) = hung.unwrap_err();
        assert_eq!((failed.failure, attempts), (Failure::TimedOut(deadline), 1));
        assert_eq!(tries.into_inner(), 1);
        let failing = registry
            .retrying("r", deadline, || async {
                Err::<(), _>(Attempt::answered(503, "http://r/v2/", String::new()))
            })
            .await;
        assert_eq!(failing.unwrap_err().1, registry.retry.attempts);
    }

    /// The backoffs of one call never add up past the policy's total, whatever the jitter
    /// draws; the first three always fit, so a failing registry is asked four or five times.
    #[tokio::test(start_paused = true)]
    async fn backoffs_stay_within_the_total() {
        let options = RegistryOptions {
            retry: Some(RetryPolicy::default()),
            ..RegistryOptions::default()
        };
        let registry = Registry::new(&[], &options).unwrap();
        for _ in 0..50 {
            let started = tokio::time::Instant::now();
            let failing = registry
                .retrying("r", Duration::from_secs(3), || async {
                    Err::<(), _>(Attempt::answered(503, "http://r/v2/", String::new()))
                })
                .await;
            assert!(started.elapsed() <= registry.retry.total);
            assert!((4..=5).contains(&failing.unwrap_err().1));
        }
    }

    /// However many flows ask at once, one registry has at most MAX_IN_FLIGHT requests
    /// in flight; another registry has places of its own.
    #[tokio::test(start_paused = true)]
    async fn requests_to_one_registry_wait_for_a_place_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let registry = Registry::new(&[], &RegistryOptions::default()).unwrap();
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let request = |host: &'static str| {
            registry.retrying(host, Duration::from_secs(3), || async {
                most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), Attempt>(())
            })
        };
        let all = (0..3 * MAX_IN_FLIGHT).map(|_| request("r"));
        for answered in futures_util::future::join_all(all).await {
            answered.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), MAX_IN_FLIGHT);
        most.store(0, Ordering::SeqCst);
        let mixed = (0..2 * MAX_IN_FLIGHT).map(|i| request(if i % 2 == 0 { "a" } else { "b" }));
        futures_util::future::join_all(mixed).await;
        assert_eq!(most.load(Ordering::SeqCst), 2 * MAX_IN_FLIGHT);
    }

    #[test]
    fn big_blobs_get_time_for_their_size() {
        let registry = Registry::new(&[], &RegistryOptions::default()).unwrap();
        assert_eq!(registry.deadline_for(0), DEFAULT_REQUEST_DEADLINE);
        let gib = registry.deadline_for(1 << 30);
        assert_eq!(gib, DEFAULT_REQUEST_DEADLINE + Duration::from_secs(4096));
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
}

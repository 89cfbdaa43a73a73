//! What kind of registry failure happened, so that callers decide by kind and never by
//! message text; each variant renders the message users have always seen.

use crate::base::oci::OciError;
use crate::registry::credentials::CredentialsError;
use oci_client::errors::OciDistributionError;
use std::path::PathBuf;
use std::time::Duration;

/// What a call of the registry client fails with: a registry's failure (which registry,
/// what kind), credentials that cannot be found, or a CA file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("registry {registry}: {source}")]
    Registry {
        registry: String,
        #[source]
        source: Box<RegistryError>,
    },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// A `--ca-cert` file (or one under certs.d) that cannot be read.
    #[error("{}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// A failure of `registry` of this kind.
    pub fn registry(registry: impl Into<String>, kind: RegistryError) -> Self {
        ClientError::Registry {
            registry: registry.into(),
            source: Box::new(kind),
        }
    }
}

/// Why a registry could not be used; its text follows `registry {registry}: ` in
/// [`ClientError::Registry`].
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// 401: no credentials, or wrong ones.
    #[error("401 unauthorized: cannot {what} for {reference} for {registry}: check credentials for this registry (--username/--password-stdin, docker login, or the Docker config's credHelpers)")]
    Unauthorized {
        what: String,
        reference: String,
        registry: String,
        #[source]
        source: Option<OciDistributionError>,
    },
    /// 403: the credentials work but lack permission.
    #[error("403 denied: cannot {what} for {reference}: the credentials for {registry} lack permission for this repository")]
    Denied {
        what: String,
        reference: String,
        registry: String,
        #[source]
        source: Option<OciDistributionError>,
    },
    /// The registry's certificate chain is not trusted: a CA to pass, not a retry.
    #[error("TLS: cannot {what} for {reference}: the certificate of {registry} is not trusted ({detail}); pass its CA with --ca-cert FILE (or SSL_CERT_FILE) or put it in {}", ca_path.display())]
    Untrusted {
        what: String,
        reference: String,
        registry: String,
        detail: String,
        ca_path: PathBuf,
        #[source]
        source: Option<OciDistributionError>,
    },
    /// Transient failures (5xx, 429, no answer) that outlasted the retries; `answered`:
    /// the registry answered at all (it is up but failing).
    #[error("cannot {what} for {reference}{}: {detail}{}", tries(*attempts), hint(*answered))]
    Unavailable {
        what: String,
        reference: String,
        attempts: u32,
        answered: bool,
        detail: String,
        #[source]
        source: Option<OciDistributionError>,
    },
    /// Any other permanent answer (a 4xx, a malformed reply).
    #[error("cannot {what} for {reference}: {detail}")]
    Refused {
        what: String,
        reference: String,
        detail: String,
        #[source]
        source: Option<OciDistributionError>,
    },
    #[error("cannot {what} for {reference}: not found")]
    NotFound { what: String, reference: String },
    /// Content whose hash is not the digest it was asked for or announced with.
    #[error("content of {reference} does not match its digest (expected {expected}, got {computed}); the registry or a proxy altered it")]
    DigestMismatch {
        reference: String,
        expected: String,
        computed: String,
    },
    /// An answer (manifest, config, listing, token, …) past its size limit; reading
    /// stopped there.
    #[error("cannot {what} for {reference}: the answer is larger than {}; refusing to read more", crate::base::text::size(*limit))]
    TooLarge {
        what: String,
        reference: String,
        limit: usize,
    },
    /// No complete answer within the request's deadline (a silent or trickling server).
    #[error("cannot {what} for {reference}: no complete answer within {}; the registry is not answering, or too slowly (POLYARCH_REGISTRY_TIMEOUT sets this deadline)", crate::base::duration::show(*deadline))]
    TimedOut {
        what: String,
        reference: String,
        deadline: Duration,
    },
    /// A registry reached over TLS that sends clients to a token realm on plain HTTP:
    /// credentials and tokens would cross the network in the clear.
    #[error("cannot authenticate for {reference}: the registry is reached over TLS but names the plain-HTTP token realm {realm}; refusing to send credentials there: configure the registry's token realm as https://, or pass --insecure-registry {host} if plain HTTP to that host is intended")]
    PlainRealm {
        reference: String,
        realm: String,
        host: String,
    },
    #[error("cannot {what} for {reference}: the referrers listing is not an OCI image index ({source}); check the registry's referrers API, or a proxy in front of it")]
    BadListing {
        what: String,
        reference: String,
        #[source]
        source: ListingError,
    },
    /// A manifest, config or index that is not valid OCI content.
    #[error("{0}")]
    Content(#[source] OciError),
    /// A verified target's manifest is not valid OCI content.
    #[error("cannot read {reference}: {source}")]
    Unreadable {
        reference: String,
        #[source]
        source: OciError,
    },
    #[error("cannot read {reference}: entry {digest} is not an image manifest")]
    EntryNotImage { reference: String, digest: String },
    /// An index (nested ones counted) listing more than verify reads.
    #[error("{reference} lists more than {limit} entries, those of its nested indexes counted; no image index needs that many, so it is refused unread")]
    TooManyEntries { reference: String, limit: usize },
    #[error("part {reference} is not an image manifest")]
    PartNotImage { reference: String },
    #[error("part {reference} claims {claimed} but its config says {found}")]
    PartPlatform {
        reference: String,
        claimed: String,
        found: String,
    },
    #[error("the index the engine pushed as {reference} {source}")]
    PushedIndexMalformed {
        reference: String,
        #[source]
        source: OciError,
    },
    #[error("the index the engine pushed as {reference} is not an index")]
    PushedNotIndex { reference: String },
    #[error("the index the engine pushed as {reference} has no {platform} manifest")]
    PushedWithout { reference: String, platform: String },
    /// BuildKit's own push failed (after its own retries).
    #[error("the engine could not push {image} {platform} to {repository}: {detail}; check that the engine reaches the registry (its insecure-registries and certs.d apply) and that the registry accepts uploads")]
    EnginePush {
        image: String,
        platform: String,
        repository: String,
        detail: String,
    },
    /// A layer stream that broke off during a deep inspection.
    #[error("cannot read layer {digest} of {reference}: {}", crate::base::text::one_line(&source.to_string()))]
    Layer {
        digest: String,
        reference: String,
        #[source]
        source: std::io::Error,
    },
    /// A referrers listing longer than verify reads (`verify::MAX_REFERRERS`).
    #[error("entry {subject} of {reference} lists {listed} referrers, more than the {limit} verify reads; a registry listing that many for one manifest is refused rather than read one by one")]
    TooManyReferrers {
        reference: String,
        subject: String,
        listed: usize,
        limit: usize,
    },
    /// `verify --deep` read a layer whose bytes are not the ones its manifest names: no
    /// verdict is drawn from them.
    #[error("layer {digest} of {reference} does not match its digest (its bytes hash to {computed}); the registry or a proxy altered it, so nothing is concluded about this image")]
    LayerDigest {
        digest: String,
        reference: String,
        computed: String,
    },
    /// `verify --deep` read a layer past one of its limits (names, headers, paths).
    #[error("--deep refused {reference}: {source}")]
    LayerRefused {
        reference: String,
        #[source]
        source: crate::base::layer_limits::LayerRefused,
    },
    #[error("deep inspection of {reference} failed: {source}")]
    Inspection {
        reference: String,
        #[source]
        source: tokio::task::JoinError,
    },
    /// A registry that refuses OCI 1.1 artifacts cannot hold provenance.
    #[error("{source}; the provenance of {subject} was not attached and no tag moved: the registry must accept OCI 1.1 artifact manifests (distribution 2.8+, or any registry with the referrers API); otherwise build without provenance")]
    NotAttached {
        subject: String,
        #[source]
        source: Box<RegistryError>,
    },
}

fn tries(attempts: u32) -> String {
    if attempts > 1 {
        format!(" after {attempts} attempts")
    } else {
        String::new()
    }
}

fn hint(answered: bool) -> &'static str {
    if answered {
        "; the registry keeps failing, try again later"
    } else {
        "; is the registry running and reachable?"
    }
}

/// Why a referrers listing is not an image index.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("`manifests` is not a list")]
    NotAList,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn kinds_say_what_the_formatted_messages_said() {
        let untrusted = RegistryError::Untrusted {
            what: "read manifest".into(),
            reference: "r.io/a:v1".into(),
            registry: "r.io".into(),
            detail: "invalid peer certificate: UnknownIssuer".into(),
            ca_path: "/etc/docker/certs.d/r.io/ca.crt".into(),
            source: None,
        };
        assert_eq!(
            untrusted.to_string(),
            "TLS: cannot read manifest for r.io/a:v1: the certificate of r.io is not trusted (invalid peer certificate: UnknownIssuer); pass its CA with --ca-cert FILE (or SSL_CERT_FILE) or put it in /etc/docker/certs.d/r.io/ca.crt"
        );
        let layer = RegistryError::Layer {
            digest: "sha256:ab".into(),
            reference: "r.io/a:v1".into(),
            source: std::io::Error::other("reset\nby peer"),
        };
        assert_eq!(
            layer.to_string(),
            "cannot read layer sha256:ab of r.io/a:v1: reset by peer"
        );
    }

    #[test]
    fn a_refused_referrer_keeps_the_registry_s_refusal_as_its_source() {
        let refusal = RegistryError::Refused {
            what: "push manifest".into(),
            reference: "r.io/a@sha256:ab".into(),
            detail: "400 manifest invalid".into(),
            source: None,
        };
        let error = RegistryError::NotAttached {
            subject: "sha256:ab".into(),
            source: Box::new(refusal),
        };
        assert!(error
            .to_string()
            .starts_with("cannot push manifest for r.io/a@sha256:ab: 400 manifest invalid; the provenance of sha256:ab was not attached and no tag moved: "));
        let cause = error.source().unwrap();
        assert!(matches!(
            cause.downcast_ref::<Box<RegistryError>>().map(|e| &**e),
            Some(RegistryError::Refused { .. })
        ));
    }
}

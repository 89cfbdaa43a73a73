//! Talking to an OCI distribution registry through oci-client: blobs by digest (HEAD
//! first), manifests by digest, the index to each tag, and verified reads back.

use crate::oci::{self, ManifestBlob};
use crate::progress::{Event, Phase, Reporter};
use crate::{Error, Platform, Result};
use futures_util::TryStreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
}

pub struct Registry {
    client: Client,
    auth: RegistryAuth,
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

pub fn parse_reference(reference: &str) -> Result<Reference> {
    reference.parse::<Reference>().map_err(|e| {
        Error::Usage(format!(
            "`{reference}` is not an image reference ({e}); use host[:port]/path:tag or host[:port]/path@sha256:…"
        ))
    })
}

impl Registry {
    /// `registries` are the hosts this run talks to, so loopback ones get plain HTTP.
    pub fn new(registries: &[String], options: &RegistryOptions) -> Result<Registry> {
        let plain: Vec<String> = registries
            .iter()
            .filter(|r| is_loopback(r) || options.insecure.contains(r))
            .cloned()
            .collect();
        let mut extra_root_certificates = Vec::new();
        for path in &options.ca_certs {
            let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            extra_root_certificates.push(oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(plain),
            // One streaming PUT per blob: the size is known from the spool file.
            use_monolithic_push: true,
            extra_root_certificates,
            ..Default::default()
        };
        let auth = match &options.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        };
        Ok(Registry {
            client: Client::new(config),
            auth,
        })
    }

    fn fail(&self, reference: &Reference, what: &str, error: OciDistributionError) -> Error {
        registry_error(reference, what, error)
    }

    async fn authenticate(
        &self,
        reference: &Reference,
        operation: RegistryOperation,
    ) -> Result<()> {
        self.client
            .auth(reference, &self.auth, operation)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(reference, "authenticate", e))
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
        self.client
            .blob_exists(reference, &absent)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(reference, "reach", e))
    }

    pub async fn blob_exists(&self, reference: &Reference, digest: &str) -> Result<bool> {
        self.client
            .blob_exists(reference, digest)
            .await
            .map_err(|e| self.fail(reference, &format!("check blob {digest}"), e))
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
        if self.blob_exists(reference, digest).await? {
            progress.add(size);
            return Ok(false);
        }
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::io(path, e))?;
        let counter = progress.counter();
        let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20)
            .inspect_ok(move |chunk| {
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            })
            .map_err(OciDistributionError::IoError);
        self.client
            .push_blob_stream(reference, stream, digest, Some(size))
            .await
            .map_err(|e| self.fail(reference, &format!("upload blob {digest}"), e))?;
        progress.report();
        Ok(true)
    }

    pub async fn push_blob_bytes(
        &self,
        reference: &Reference,
        bytes: &[u8],
        digest: &str,
    ) -> Result<bool> {
        if self.blob_exists(reference, digest).await? {
            return Ok(false);
        }
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        self.client
            .push_blob(reference, bytes.to_vec(), digest)
            .await
            .map_err(|e| self.fail(reference, &format!("upload blob {digest}"), e))?;
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
        let content_type = manifest
            .media_type
            .parse()
            .expect("media types are valid header values");
        self.client
            .push_manifest_raw(reference, manifest.bytes.clone(), content_type)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(reference, "push manifest", e))
    }

    /// Reads a manifest; oci-client checks the body against the requested digest or the
    /// registry's Docker-Content-Digest. Returns the bytes and their digest.
    pub async fn get_manifest(&self, reference: &Reference) -> Result<(Vec<u8>, String)> {
        let (bytes, digest) = self
            .client
            .pull_manifest_raw(reference, &self.auth, oci::ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| self.fail(reference, "read manifest", e))?;
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

    /// Reads a small JSON blob (an image config) and checks its digest.
    pub async fn get_json_blob(&self, reference: &Reference, digest: &str) -> Result<Vec<u8>> {
        let layer = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            ..Default::default()
        };
        let mut out = Vec::new();
        let mut stream = self
            .client
            .pull_blob_stream(reference, &layer)
            .await
            .map_err(|e| self.fail(reference, &format!("read blob {digest}"), e))?;
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| self.fail(reference, &format!("read blob {digest}"), e.into()))?
        {
            out.extend_from_slice(&chunk);
            if out.len() > MAX_JSON_BLOB {
                return Err(Error::Registry {
                    registry: reference.registry().to_string(),
                    message: format!("blob {digest} is larger than {MAX_JSON_BLOB} bytes; it is not an image config"),
                });
            }
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
        let layer = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            ..Default::default()
        };
        let stream = self
            .client
            .pull_blob_stream(reference, &layer)
            .await
            .map_err(|e| self.fail(reference, &format!("read blob {digest}"), e))?;
        Ok(stream.stream)
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

fn registry_error(reference: &Reference, what: &str, error: OciDistributionError) -> Error {
    let registry = reference.registry().to_string();
    let detail = error.to_string();
    let unauthorized = matches!(
        &error,
        OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. }
    ) || detail.contains("401")
        || detail.to_ascii_lowercase().contains("unauthorized");
    let message = if unauthorized {
        format!(
            "401 unauthorized: cannot {what} for {registry}: check credentials for this registry"
        )
    } else if matches!(&error, OciDistributionError::RequestError(_)) {
        format!(
            "cannot {what} of {reference}: {}; is the registry running and reachable?",
            one_line(&detail)
        )
    } else {
        format!("cannot {what} of {reference}: {}", one_line(&detail))
    };
    Error::Registry { registry, message }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
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

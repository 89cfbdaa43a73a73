//! Where verify reads manifests and configs from: the [`ContentSource`] seam, its registry
//! implementation, and what earlier reads are remembered across runs ([`ReadMemory`]).

use super::entrypoint::DeepReport;
use super::remote_layers;
use crate::base::digest::Digest;
use crate::base::oci;
use crate::registry::{ClientError, Registry};
use crate::Platform;
use oci_client::Reference;

/// Where manifests and configs are read from: a registry repository or an OCI layout.
pub trait ContentSource {
    /// The source's own failures; verify hands them up as [`super::VerifyError::Source`].
    type Error: std::error::Error + Send + Sync + 'static;
    /// Resolves the reference being verified: manifest bytes and their digest.
    fn resolve(&self) -> impl std::future::Future<Output = Result<(Vec<u8>, Digest), Self::Error>>;
    /// A manifest by digest, its content checked against the digest.
    fn manifest(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<u8>, Self::Error>>;
    /// A small JSON blob (a config) by digest, checked against the digest.
    fn json_blob(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<u8>, Self::Error>>;
    /// The descriptors listed as referrers of the manifest `digest` (empty: none).
    fn referrers(
        &self,
        digest: &Digest,
    ) -> impl std::future::Future<Output = Result<Vec<serde_json::Value>, Self::Error>>;
    /// [`ContentSource::referrers`] of each of `digests`, in order, asked at once.
    fn referrers_of(
        &self,
        digests: &[&Digest],
    ) -> impl std::future::Future<Output = Vec<Result<Vec<serde_json::Value>, Self::Error>>> {
        futures_util::future::join_all(digests.iter().map(|d| self.referrers(d)))
    }
    /// `repo` part for `repo@sha256:…` pins.
    fn repository(&self) -> String;
    /// The config an earlier run saw the manifest `digest` name: asked for beside the
    /// manifest rather than after it.
    fn known_config(&self, _manifest: &Digest) -> Option<Digest> {
        None
    }
    /// The config the manifest `digest` names, for [`ContentSource::known_config`].
    fn learned_config(&self, _manifest: &Digest, _config: &Digest) {}
    /// What the reference resolved to when last read (bytes and digest): its entries are
    /// read beside resolving it again, and count only if it still resolves there.
    fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
        None
    }
    /// What the reference resolves to now, for [`ContentSource::last_resolved`].
    fn resolved(&self, _bytes: &[u8], _digest: &Digest) {}
    /// `--deep`: streams the layers and checks the entrypoint's binary against `platform`.
    fn inspect(
        &self,
        config: &[u8],
        layers: &[(Digest, String)],
        platform: &Platform,
    ) -> impl std::future::Future<Output = Result<DeepReport, Self::Error>>;
}

pub struct RegistrySource<'a> {
    pub registry: &'a Registry,
    pub reference: Reference,
    pub memory: &'a dyn ReadMemory,
    /// The index this run just pushed under `reference`, known byte for byte: resolving
    /// takes it from here, and the caller reads the tag back beside the entries and checks
    /// that it names exactly this digest (see [`super::verify_image`]).
    pub pushed: Option<&'a oci::ManifestBlob>,
}

/// What earlier reads found, remembered across runs, so that `verify` asks for what it
/// will need in fewer waves; everything is still read and checked. A manifest's digest
/// fixes its config's, so a remembered config is never stale; a tag's index may be, so
/// it counts only when the tag, read beside it, still names its digest.
pub trait ReadMemory: Sync {
    /// The config the manifest `manifest` names.
    fn config_of(&self, manifest: &Digest) -> Option<Digest>;
    fn remember(&self, manifest: &Digest, config: &Digest);
    /// The manifest (bytes and digest) `reference` resolved to when last read.
    fn resolved_by(&self, reference: &str) -> Option<(Vec<u8>, Digest)>;
    fn remember_resolved(&self, reference: &str, bytes: &[u8], digest: &Digest);
}

/// Nothing remembered.
impl ReadMemory for () {
    fn config_of(&self, _: &Digest) -> Option<Digest> {
        None
    }
    fn remember(&self, _: &Digest, _: &Digest) {}
    fn resolved_by(&self, _: &str) -> Option<(Vec<u8>, Digest)> {
        None
    }
    fn remember_resolved(&self, _: &str, _: &[u8], _: &Digest) {}
}

impl ContentSource for RegistrySource<'_> {
    type Error = ClientError;

    async fn resolve(&self) -> Result<(Vec<u8>, Digest), ClientError> {
        match self.pushed {
            Some(index) => Ok((index.bytes.clone(), index.digest.clone())),
            None => self.registry.get_manifest(&self.reference).await,
        }
    }

    async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        let by_digest = self.reference.clone_with_digest(digest.to_string());
        let (bytes, _) = self.registry.get_manifest(&by_digest).await?;
        Ok(bytes)
    }

    async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        self.registry.get_json_blob(&self.reference, digest).await
    }

    async fn referrers(&self, digest: &Digest) -> Result<Vec<serde_json::Value>, ClientError> {
        self.registry
            .referrers(&self.reference, digest)
            .await
            .map(|r| r.listed)
    }

    async fn referrers_of(
        &self,
        digests: &[&Digest],
    ) -> Vec<Result<Vec<serde_json::Value>, ClientError>> {
        self.registry.referrers_of(&self.reference, digests).await
    }

    fn repository(&self) -> String {
        format!(
            "{}/{}",
            self.reference.registry(),
            self.reference.repository()
        )
    }

    fn known_config(&self, manifest: &Digest) -> Option<Digest> {
        self.memory.config_of(manifest)
    }

    fn learned_config(&self, manifest: &Digest, config: &Digest) {
        self.memory.remember(manifest, config)
    }

    fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
        match self.pushed {
            Some(_) => None,
            None => self.memory.resolved_by(&self.reference.whole()),
        }
    }

    fn resolved(&self, bytes: &[u8], digest: &Digest) {
        if self.pushed.is_none() {
            self.memory
                .remember_resolved(&self.reference.whole(), bytes, digest)
        }
    }

    async fn inspect(
        &self,
        config: &[u8],
        layers: &[(Digest, String)],
        platform: &Platform,
    ) -> Result<DeepReport, ClientError> {
        remote_layers::inspect_remote(self.registry, &self.reference, config, layers, platform)
            .await
    }
}

//! A scripted [`ContentSource`] for the unit tests of the reads: it records when each read
//! was asked, so tests can tell which reads went out in the same wave.

use super::coverage_record::{PlatformCoverage, PlatformStatus};
use super::entrypoint::DeepReport;
use super::source::ContentSource;
use super::target::Target;
use crate::base::digest::Digest;
use crate::base::oci;
use crate::registry::ClientError;
use crate::Platform;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A registry's content by digest; each read records whether any read had finished
/// when it was asked (it had, if it waited for another).
#[derive(Default)]
pub(super) struct Fake {
    pub(super) index: Vec<u8>,
    blobs: BTreeMap<Digest, Vec<u8>>,
    pub(super) known: BTreeMap<Digest, Digest>,
    /// What the reference resolved to last time; with it, resolving is a read too.
    pub(super) last: Option<(Vec<u8>, Digest)>,
    /// Referrer listings by subject; a subject not here has none.
    pub(super) listings: BTreeMap<Digest, Vec<serde_json::Value>>,
    finished: AtomicUsize,
    pub(super) asked: Mutex<Vec<(String, usize)>>,
}

impl Fake {
    /// A 2-platform index; `remembered`: the configs its manifests name are known.
    pub(super) fn two_platforms(remembered: bool) -> Fake {
        let mut fake = Fake::default();
        let mut entries = Vec::new();
        for arch in ["amd64", "arm64"] {
            let config = json!({"architecture": arch, "os": "linux"}).to_string();
            let config_digest = fake.put(config.into_bytes());
            let manifest = json!({"schemaVersion": 2, "mediaType": oci::OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": config_digest.as_str(), "size": 1},
                "layers": []});
            let digest = fake.put(manifest.to_string().into_bytes());
            if remembered {
                fake.known.insert(digest.clone(), config_digest);
            }
            entries.push(
                json!({"mediaType": oci::OCI_MANIFEST, "digest": digest.as_str(),
                "size": 1, "platform": {"architecture": arch, "os": "linux"}}),
            );
        }
        fake.index = json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX,
            "manifests": entries})
        .to_string()
        .into_bytes();
        fake.put(fake.index.clone());
        fake
    }

    pub(super) fn put(&mut self, bytes: Vec<u8>) -> Digest {
        let digest = Digest::of(&bytes);
        self.blobs.insert(digest.clone(), bytes);
        digest
    }

    async fn read(&self, what: &str, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        let finished = self.finished.load(Ordering::SeqCst);
        let name = format!("{what} {}", digest.short());
        self.asked.lock().unwrap().push((name, finished));
        // Every read that is asked at once is asked before any of them finishes.
        tokio::task::yield_now().await;
        let Some(bytes) = self.blobs.get(digest) else {
            // Content the registry does not hold: a read that never ends.
            return std::future::pending().await;
        };
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(bytes.clone())
    }

    pub(super) fn asked_late(&self) -> Vec<String> {
        let asked = self.asked.lock().unwrap();
        asked
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

impl ContentSource for Fake {
    type Error = ClientError;

    async fn resolve(&self) -> Result<(Vec<u8>, Digest), ClientError> {
        let digest = Digest::of(&self.index);
        if self.last.is_some() {
            self.read("index", &digest).await?;
        }
        Ok((self.index.clone(), digest))
    }
    async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        self.read("manifest", digest).await
    }
    async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
        self.read("config", digest).await
    }
    async fn referrers(&self, digest: &Digest) -> Result<Vec<serde_json::Value>, ClientError> {
        self.read("referrers", digest)
            .await
            .map(|_| self.listings.get(digest).cloned().unwrap_or_default())
    }
    fn repository(&self) -> String {
        "fake".into()
    }
    fn known_config(&self, manifest: &Digest) -> Option<Digest> {
        self.known.get(manifest).cloned()
    }
    fn last_resolved(&self) -> Option<(Vec<u8>, Digest)> {
        self.last.clone()
    }
    async fn inspect(
        &self,
        _: &[u8],
        _: &[(Digest, String)],
        _: &Platform,
    ) -> Result<DeepReport, ClientError> {
        unreachable!("no deep checks here")
    }
}

/// An entry for linux/`arch` whose config agrees, as the checks leave a good one.
pub(super) fn agreeing_entry(arch: &str, digest: Option<Digest>) -> PlatformCoverage {
    PlatformCoverage {
        platform: Platform::linux(arch, None),
        digest,
        config_platform: Some(Platform::linux(arch, None)),
        size: Some(400),
        status: PlatformStatus::Ok,
        annotations: BTreeMap::new(),
        detail: None,
        deep: None,
        build: None,
        attached: Vec::new(),
        test: None,
        sbom: None,
        signed: None,
    }
}

/// `r.io/app:v1` declaring linux/`archs`, in that order.
pub(super) fn target(archs: &[&str]) -> Target {
    Target {
        name: "app".into(),
        reference: "r.io/app:v1".into(),
        tags: vec!["v1".into()],
        declared: archs.iter().map(|a| Platform::linux(a, None)).collect(),
        deep: false,
        require_provenance: false,
        require_sbom: false,
    }
}

/// What a covered `target(&["amd64", "arm64"])` holds: both entries, in index order, each
/// agreeing with its config.
pub(super) fn assert_both_platforms_ok(found: &[PlatformCoverage]) {
    let platforms: Vec<&Platform> = found.iter().map(|p| &p.platform).collect();
    assert_eq!(
        platforms,
        [
            &Platform::linux("amd64", None),
            &Platform::linux("arm64", None)
        ]
    );
    assert!(
        found.iter().all(|p| p.status == PlatformStatus::Ok),
        "{found:?}"
    );
}

//! An image store in memory for unit tests of the flows that write through the seam.

use super::{Attachment, ImageStore};
use super::{Result, StoreError};
use crate::base::attachment::{self, ListedBy, Referrer, Referrers};
use crate::base::digest::Digest;
use crate::base::oci::ManifestBlob;
use crate::base::progress::Reporter;
use crate::builder::export::early::EarlyLayer;
use crate::builder::export::{ExportedImage, ExportedLayer};
use crate::project::ImageSpec;
use crate::registry::{BlobProgress, ClientError, RegistryError};
use crate::verify::coverage_record::{ImageCoverage, PlatformCoverage, PlatformStatus};
use crate::Platform;
use oci_client::Reference;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// An image store in memory: tags, manifests by digest, and every call in order.
#[derive(Default)]
pub(crate) struct FakeStore {
    pub(crate) tags: Mutex<BTreeMap<String, String>>,
    pub(crate) manifests: Mutex<BTreeMap<String, Vec<u8>>>,
    pub(crate) calls: Mutex<Vec<String>>,
    /// `tag` fails for this tag.
    pub(crate) refuse_tag: Option<String>,
    /// `stage` and `attach` fail.
    pub(crate) refuse_attach: bool,
    /// The manifest digest of every referrer staged.
    pub(crate) staged: Mutex<Vec<String>>,
    /// How many referrers were staged when each catalog's layers were read.
    pub(crate) staged_by_catalog: Mutex<Vec<usize>>,
    /// `(subject, predicate type)` of every referrer attached.
    pub(crate) attached: Mutex<Vec<(String, String)>>,
    /// Each subject's referrers tag schema index: the descriptors it lists.
    pub(crate) indexes: Mutex<BTreeMap<String, Vec<serde_json::Value>>>,
    /// How many times each subject's referrers were listed.
    pub(crate) listings: Mutex<BTreeMap<String, usize>>,
    /// How many times each subject's referrers tag schema index was written.
    pub(crate) index_puts: Mutex<BTreeMap<String, usize>>,
}

impl FakeStore {
    pub(crate) fn with_tags(tags: &[(&str, &str)]) -> Self {
        let store = FakeStore::default();
        for (tag, digest) in tags {
            store
                .tags
                .lock()
                .unwrap()
                .insert(tag.to_string(), digest.to_string());
        }
        store
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub(crate) fn tag_of(&self, tag: &str) -> Option<String> {
        self.tags.lock().unwrap().get(tag).cloned()
    }
}

impl ImageStore for FakeStore {
    /// An in-memory registry: builders may push to it themselves.
    fn is_registry(&self) -> bool {
        true
    }

    async fn put_layer(
        &self,
        _: &Reference,
        layer: &ExportedLayer,
        _: &BlobProgress<'_>,
    ) -> Result<()> {
        let mut calls = self.calls.lock().unwrap();
        // Sent while it was exported: there already, as a registry would find.
        if !calls.contains(&format!("early layer {}", layer.digest)) {
            calls.push(format!("layer {}", layer.digest));
        }
        Ok(())
    }

    fn knows_blob(&self, _: &Reference, digest: &Digest) -> bool {
        self.calls().iter().any(|call| {
            call.strip_prefix("early layer ")
                .or_else(|| call.strip_prefix("layer "))
                == Some(digest.as_str())
        })
    }

    /// Takes the bytes and the digest; the bytes must have that digest.
    async fn put_early_layer(&self, _: &Reference, mut layer: EarlyLayer) -> bool {
        let mut bytes = Vec::new();
        while let Some(chunk) = layer.chunks.recv().await {
            bytes.extend_from_slice(&chunk);
        }
        let Ok(digest) = layer.digest.await else {
            return false;
        };
        assert_eq!(
            Digest::of(&bytes),
            digest,
            "an early layer's bytes and digest"
        );
        self.calls
            .lock()
            .unwrap()
            .push(format!("early layer {digest}"));
        true
    }

    async fn put_config(&self, _: &Reference, image: &ExportedImage) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("config {}", image.config_digest));
        Ok(())
    }

    async fn has_manifest(&self, _: &ImageSpec, digest: &Digest) -> bool {
        self.manifests.lock().unwrap().contains_key(digest.as_str())
    }

    async fn current(&self, _: &ImageSpec, tag: &str) -> Option<Digest> {
        self.tag_of(tag).map(|digest| digest.parse().unwrap())
    }

    async fn put_manifest(&self, _: &Reference, manifest: &ManifestBlob) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("manifest {}", manifest.digest));
        self.manifests
            .lock()
            .unwrap()
            .insert(manifest.digest.to_string(), manifest.bytes.clone());
        Ok(())
    }

    async fn tag(&self, image: &ImageSpec, tag: &str, index: &ManifestBlob) -> Result<()> {
        if self.refuse_tag.as_deref() == Some(tag) {
            return Err(refused(image, &format!("tag {tag}")));
        }
        self.calls.lock().unwrap().push(format!("tag {tag}"));
        self.manifests
            .lock()
            .unwrap()
            .insert(index.digest.to_string(), index.bytes.clone());
        self.tags
            .lock()
            .unwrap()
            .insert(tag.to_string(), index.digest.to_string());
        Ok(())
    }

    /// As a registry without the referrers API: the tag schema's index lists them.
    async fn referrers(&self, _: &ImageSpec, subject: &Digest) -> Result<Referrers> {
        *self
            .listings
            .lock()
            .unwrap()
            .entry(subject.to_string())
            .or_default() += 1;
        let listed = self.indexes.lock().unwrap().get(subject.as_str()).cloned();
        Ok(Referrers {
            subject: subject.clone(),
            listed: listed.unwrap_or_default(),
            by: ListedBy::TagSchema,
        })
    }

    async fn stage(&self, image: &ImageSpec, referrer: &Referrer) -> Result<()> {
        if self.refuse_attach {
            return Err(refused(image, "push a referrer"));
        }
        let digest = referrer.manifest.digest.to_string();
        self.staged.lock().unwrap().push(digest);
        Ok(())
    }

    /// As a registry: an index of referrers lists only manifests it holds.
    async fn attach(
        &self,
        image: &ImageSpec,
        referrers: &mut Referrers,
        attaching: &[&Referrer],
    ) -> Result<Vec<Attachment>> {
        if self.refuse_attach {
            return Err(refused(image, "attach a referrer"));
        }
        let staged = self.staged.lock().unwrap().clone();
        if let Some(missing) = (attaching.iter())
            .find(|r| !r.already_in(referrers) && !staged.contains(&r.manifest.digest.to_string()))
        {
            return Err(refused(
                image,
                &format!("list {} unstaged", missing.manifest.digest),
            ));
        }
        let subject = referrers.subject.to_string();
        let mut how = Vec::new();
        for referrer in attaching {
            // As a registry: a subject keeps the statement of a predicate type it has.
            if referrer.already_in(referrers) {
                how.push(Attachment::Kept);
                continue;
            }
            self.attached
                .lock()
                .unwrap()
                .push((subject.clone(), referrer.predicate_type.clone()));
            referrers.add(referrer.descriptor());
            how.push(Attachment::TagSchema(attachment::referrers_tag(
                &referrers.subject,
            )));
        }
        if how.iter().all(|h| *h == Attachment::Kept) {
            return Ok(how);
        }
        self.calls.lock().unwrap().push(format!("attach {subject}"));
        self.indexes
            .lock()
            .unwrap()
            .insert(subject.clone(), referrers.listed.clone());
        *self.index_puts.lock().unwrap().entry(subject).or_default() += 1;
        Ok(how)
    }

    /// Every platform image holds one Debian package.
    async fn catalog(
        &self,
        _: &ImageSpec,
        subject: &Digest,
    ) -> Result<(crate::sbom::Catalog, Option<String>)> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("catalog {subject}"));
        // Reading layers takes a while: whatever else is ready goes on meanwhile.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let staged = self.staged.lock().unwrap().len();
        self.staged_by_catalog.lock().unwrap().push(staged);
        let package = crate::sbom::Package {
            ecosystem: crate::sbom::Ecosystem::Deb,
            name: "libc6".into(),
            version: "2.36-9".into(),
            arch: None,
            license: None,
            source: "/var/lib/dpkg/status".into(),
        };
        let catalog = crate::sbom::Catalog {
            packages: vec![package],
            ..Default::default()
        };
        Ok((catalog, None))
    }

    async fn read_back(
        &self,
        image: &ImageSpec,
        pushed: &ManifestBlob,
        _: &dyn crate::verify::ReadMemory,
        _: &dyn Reporter,
    ) -> Result<ImageCoverage> {
        self.calls.lock().unwrap().push("read back".into());
        let index: serde_json::Value =
            serde_json::from_slice(&self.manifests.lock().unwrap()[pushed.digest.as_str()])
                .unwrap();
        let platforms = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let p = &m["platform"];
                let platform = Platform::linux(p["architecture"].as_str().unwrap(), None);
                PlatformCoverage {
                    platform,
                    digest: m["digest"].as_str().map(|d| d.parse().unwrap()),
                    config_platform: None,
                    size: m["size"].as_u64(),
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
            })
            .collect();
        Ok(ImageCoverage {
            name: image.name.clone(),
            reference: format!("{}:{}", image.repository, image.tags[0]),
            tags: image.tags.clone(),
            digest: pushed.digest.clone(),
            pinned: format!("{}@{}", image.repository, pushed.digest),
            media_type: oci_spec::image::MediaType::ImageIndex.to_string(),
            size: None,
            annotations: BTreeMap::new(),
            declared: image.platforms.clone(),
            platforms,
            missing: vec![],
            unexpected: vec![],
            attestations: vec![],
            warnings: vec![],
            covered: true,
            unpublished: None,
            signed: None,
        })
    }
}

/// What a registry answers when it refuses `what` for `image` (a 400, say).
fn refused(image: &ImageSpec, what: &str) -> StoreError {
    StoreError::Registry(ClientError::registry(
        image.repository.clone(),
        RegistryError::Refused {
            what: what.to_string(),
            reference: image.repository.clone(),
            detail: "refused".into(),
            source: None,
        },
    ))
}

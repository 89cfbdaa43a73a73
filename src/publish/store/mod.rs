//! Where built images go: the image store seam (blobs, manifests by digest, tags, reading
//! back) with its two implementations, a registry and an OCI layout directory.

mod error;
#[cfg(test)]
pub(crate) mod fake;

pub use error::StoreError;

use crate::base::attachment::{self, ListedBy, Referrer, Referrers};
use crate::base::digest::Digest;
use crate::base::oci::ManifestBlob;
use crate::base::progress::Reporter;
use crate::builder::export::early::EarlyLayer;
use crate::builder::export::{ExportedImage, ExportedLayer};
use crate::project::ImageSpec;
use crate::publish::layout::{LayoutSource, OciLayout};
use crate::registry::{BlobProgress, ClientError, Registry, RegistryError, RegistryOptions};
use crate::sbom::{self, Catalog};
use crate::verify::coverage_record::ImageCoverage;
use crate::verify::{self, ReadMemory, Target};
use oci_client::Reference;
use std::future::Future;

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What publishing needs of a destination. Blobs and manifests go in by digest; only
/// [`ImageStore::tag`] moves a tag, so a flow decides when tags move.
pub trait ImageStore {
    /// Whether it is a registry, which an engine's BuildKit can push to itself.
    fn is_registry(&self) -> bool;
    /// Uploads a layer file, streamed from disk.
    fn put_layer(
        &self,
        reference: &Reference,
        layer: &ExportedLayer,
        progress: &BlobProgress<'_>,
    ) -> impl Future<Output = Result<()>>;
    /// Whether the store is known (from this run or an earlier one) to hold the blob
    /// `digest`, in the image's repository or one it can be mounted from.
    fn knows_blob(&self, reference: &Reference, digest: &Digest) -> bool;
    /// Uploads a layer while it is exported, in one attempt (its bytes go by once);
    /// false when it did not land, and the layer is pushed from the spool as usual.
    fn put_early_layer(
        &self,
        reference: &Reference,
        layer: EarlyLayer,
    ) -> impl Future<Output = bool>;
    /// Uploads an image's config.
    fn put_config(
        &self,
        reference: &Reference,
        image: &ExportedImage,
    ) -> impl Future<Output = Result<()>>;
    /// Whether a manifest is there under `digest` in the image's repository.
    fn has_manifest(&self, image: &ImageSpec, digest: &Digest) -> impl Future<Output = bool>;
    /// What a tag resolves to now (None when it does not exist yet).
    fn current(&self, image: &ImageSpec, tag: &str) -> impl Future<Output = Option<Digest>>;
    /// Stores a manifest under its digest only (no tag moves).
    fn put_manifest(
        &self,
        reference: &Reference,
        manifest: &ManifestBlob,
    ) -> impl Future<Output = Result<()>>;
    /// Stores `index` and points `tag` at it: a registry keeps a manifest pushed by tag
    /// under its digest too, so publishing needs no push by digest first.
    fn tag(
        &self,
        image: &ImageSpec,
        tag: &str,
        index: &ManifestBlob,
    ) -> impl Future<Output = Result<()>>;
    /// What is attached to the manifest `subject` of `image`, listed once: the attaches
    /// that follow read and extend it instead of listing again.
    fn referrers(
        &self,
        image: &ImageSpec,
        subject: &Digest,
    ) -> impl Future<Output = Result<Referrers>>;
    /// Pushes a referrer of a manifest of `image`: its blobs, then its manifest by digest.
    /// Nothing lists it yet (a registry with the referrers API does); [`ImageStore::attach`]
    /// does, once every referrer of the subject is staged. No tag of the image moves.
    fn stage(&self, image: &ImageSpec, referrer: &Referrer) -> impl Future<Output = Result<()>>;
    /// Attaches `attaching`, referrers of one manifest of `image` whose referrers are
    /// `referrers` (which then list them too): each one not listed already, staged
    /// before, is listed among the subject's referrers, in one write of its tag schema
    /// index where that lists them. How each came to be attached, in order. No tag of
    /// the image moves.
    fn attach(
        &self,
        image: &ImageSpec,
        referrers: &mut Referrers,
        attaching: &[&Referrer],
    ) -> impl Future<Output = Result<Vec<Attachment>>>;
    /// What the platform manifest `subject` installs, read from its layers as the store
    /// holds them (whichever engine pushed them), and its config's creation time.
    fn catalog(
        &self,
        image: &ImageSpec,
        subject: &Digest,
    ) -> impl Future<Output = Result<(Catalog, Option<String>)>>;
    /// Reads the image back through its tags and checks it against its declared platforms
    /// and `pushed`, the index just published.
    fn read_back(
        &self,
        image: &ImageSpec,
        pushed: &ManifestBlob,
        memory: &dyn ReadMemory,
        reporter: &dyn Reporter,
    ) -> impl Future<Output = Result<ImageCoverage>>;
}

/// How a referrer came to be listed for its subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    /// The subject already had a statement of that predicate type; nothing was pushed.
    Kept,
    /// The registry lists it by itself (it has the referrers API).
    Registry,
    /// Added to the referrers tag schema's index under this tag.
    TagSchema(String),
}

/// The destination of one run: a registry, or an OCI layout directory for air-gapped
/// handoff (`--output oci:DIR`).
pub enum Destination {
    Registry(Registry),
    Layout(OciLayout),
}

impl ImageStore for Destination {
    fn is_registry(&self) -> bool {
        matches!(self, Destination::Registry(_))
    }

    async fn put_layer(
        &self,
        reference: &Reference,
        layer: &ExportedLayer,
        progress: &BlobProgress<'_>,
    ) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_blob_file(reference, &layer.path, &layer.digest, layer.size, progress)
                    .await?;
            }
            Destination::Layout(l) => {
                l.put_blob_file(&layer.path, &layer.digest)?;
            }
        }
        Ok(())
    }

    fn knows_blob(&self, reference: &Reference, digest: &Digest) -> bool {
        match self {
            Destination::Registry(r) => r.knows_blob(reference, digest),
            Destination::Layout(_) => false,
        }
    }

    async fn put_early_layer(&self, reference: &Reference, layer: EarlyLayer) -> bool {
        match self {
            Destination::Registry(r) => {
                r.push_blob_streamed(reference, layer.chunks, layer.digest)
                    .await
            }
            // A directory on this machine is written from the spool at once.
            Destination::Layout(_) => false,
        }
    }

    async fn put_config(&self, reference: &Reference, image: &ExportedImage) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_blob_bytes(reference, &image.config, &image.config_digest)
                    .await?;
            }
            Destination::Layout(l) => {
                l.put_blob_bytes(&image.config, &image.config_digest)?;
            }
        }
        Ok(())
    }

    async fn has_manifest(&self, image: &ImageSpec, digest: &Digest) -> bool {
        let Destination::Registry(r) = self else {
            return false;
        };
        let Ok(reference) = image.first_tag() else {
            return false;
        };
        r.get_manifest(&reference.clone_with_digest(digest.to_string()))
            .await
            .is_ok()
    }

    async fn current(&self, image: &ImageSpec, tag: &str) -> Option<Digest> {
        match self {
            Destination::Registry(r) => {
                let reference = image.tagged(tag).ok()?;
                r.get_manifest(&reference)
                    .await
                    .ok()
                    .map(|(_, digest)| digest)
            }
            Destination::Layout(_) => None,
        }
    }

    async fn put_manifest(&self, reference: &Reference, manifest: &ManifestBlob) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_manifest(
                    &reference.clone_with_digest(manifest.digest.to_string()),
                    manifest,
                )
                .await?;
                Ok(())
            }
            Destination::Layout(l) => {
                l.put_blob_bytes(&manifest.bytes, &manifest.digest)?;
                Ok(())
            }
        }
    }

    async fn tag(&self, image: &ImageSpec, tag: &str, index: &ManifestBlob) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_manifest(&image.tagged(tag)?, index).await?;
                Ok(())
            }
            Destination::Layout(l) => {
                l.put_blob_bytes(&index.bytes, &index.digest)?;
                Ok(l.tag(index, tag)?)
            }
        }
    }

    async fn referrers(&self, image: &ImageSpec, subject: &Digest) -> Result<Referrers> {
        match self {
            Destination::Registry(r) => Ok(r.referrers(&image.first_tag()?, subject).await?),
            Destination::Layout(l) => Err(StoreError::AttachInLayout {
                dir: l.dir.clone(),
                image: image.name.clone(),
            }),
        }
    }

    async fn stage(&self, image: &ImageSpec, referrer: &Referrer) -> Result<()> {
        match self {
            Destination::Registry(r) => stage_in_registry(r, image, referrer).await,
            Destination::Layout(l) => Err(StoreError::AttachInLayout {
                dir: l.dir.clone(),
                image: image.name.clone(),
            }),
        }
    }

    async fn attach(
        &self,
        image: &ImageSpec,
        referrers: &mut Referrers,
        attaching: &[&Referrer],
    ) -> Result<Vec<Attachment>> {
        match self {
            Destination::Registry(r) => attach_in_registry(r, image, referrers, attaching).await,
            // Layout readers (skopeo, containerd) have no referrers convention to follow.
            Destination::Layout(l) => Err(StoreError::AttachInLayout {
                dir: l.dir.clone(),
                image: image.name.clone(),
            }),
        }
    }

    async fn catalog(
        &self,
        image: &ImageSpec,
        subject: &Digest,
    ) -> Result<(Catalog, Option<String>)> {
        match self {
            Destination::Registry(r) => {
                Ok(sbom::remote::catalog_of(r, &image.first_tag()?, subject).await?)
            }
            Destination::Layout(l) => Err(StoreError::AttachInLayout {
                dir: l.dir.clone(),
                image: image.name.clone(),
            }),
        }
    }

    async fn read_back(
        &self,
        image: &ImageSpec,
        pushed: &ManifestBlob,
        memory: &dyn ReadMemory,
        reporter: &dyn Reporter,
    ) -> Result<ImageCoverage> {
        match self {
            Destination::Registry(r) => Ok(verify::verify_image(
                r,
                image,
                Some(pushed),
                verify::Checks::default(),
                memory,
                reporter,
            )
            .await?),
            Destination::Layout(l) => read_back_layout(l, image, &pushed.digest, reporter).await,
        }
    }
}

/// Pushes one referrer: its config (asked for first: every artifact shares the empty
/// one) and its layer (made by this run, so uploaded without asking) at once, then its
/// manifest by digest.
async fn stage_in_registry(
    registry: &Registry,
    image: &ImageSpec,
    referrer: &Referrer,
) -> Result<()> {
    let reference = image.first_tag()?;
    let (layer, layer_digest) = &referrer.layer;
    let (config, config_digest) = Referrer::config();
    futures_util::future::try_join(
        registry.push_blob_bytes(&reference, config, &config_digest),
        registry.push_new_blob_bytes(&reference, layer, layer_digest),
    )
    .await?;
    let by_digest = reference.clone_with_digest(referrer.manifest.digest.to_string());
    registry
        .push_manifest(&by_digest, &referrer.manifest)
        .await
        .map_err(|e| refused(e, referrer))?;
    Ok(())
}

/// Lists the referrers of one subject that `referrers` (listed before) do not hold, each
/// staged already: a registry with the referrers API lists them by itself; otherwise the
/// tag schema's index (`sha256-<hex>`) is written once for all of them, keeping what it
/// held.
async fn attach_in_registry(
    registry: &Registry,
    image: &ImageSpec,
    referrers: &mut Referrers,
    attaching: &[&Referrer],
) -> Result<Vec<Attachment>> {
    let kept: Vec<bool> = attaching.iter().map(|r| r.already_in(referrers)).collect();
    let new: Vec<&Referrer> = attaching
        .iter()
        .zip(&kept)
        .filter(|(_, kept)| !**kept)
        .map(|(r, _)| *r)
        .collect();
    let Some(first) = new.first() else {
        return Ok(vec![Attachment::Kept; attaching.len()]);
    };
    for referrer in &new {
        referrers.add(referrer.descriptor());
    }
    let how = match referrers.by {
        ListedBy::Api => Attachment::Registry,
        ListedBy::TagSchema => {
            let tag = attachment::referrers_tag(&referrers.subject);
            registry
                .push_manifest(&image.tagged(&tag)?, &referrers.tag_schema_index())
                .await
                .map_err(|e| refused(e, first))?;
            Attachment::TagSchema(tag)
        }
    };
    Ok(kept
        .into_iter()
        .map(|kept| match kept {
            true => Attachment::Kept,
            false => how.clone(),
        })
        .collect())
}

/// A registry that refuses OCI 1.1 artifacts (`artifactType`, `subject`, the empty config)
/// cannot hold provenance: say so, and what to do.
fn refused(error: ClientError, referrer: &Referrer) -> ClientError {
    match error {
        ClientError::Registry { registry, source } => ClientError::registry(
            registry,
            RegistryError::NotAttached {
                subject: referrer.subject.to_string(),
                source,
            },
        ),
        other => other,
    }
}

/// Every tag of `image` in the layout, checked; all must resolve to `expected`.
async fn read_back_layout(
    layout: &OciLayout,
    image: &ImageSpec,
    expected: &Digest,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage> {
    let target = Target {
        name: image.name.clone(),
        reference: format!("oci:{}:{}", layout.dir.display(), image.tags[0]),
        tags: image.tags.clone(),
        declared: image.platforms.clone(),
        deep: false,
        require_provenance: image.require_provenance,
        require_sbom: image.require_sbom,
    };
    let mut coverage = Vec::new();
    for tag in &image.tags {
        let source = LayoutSource {
            layout: OciLayout {
                dir: layout.dir.clone(),
            },
            tag: Some(tag.clone()),
        };
        coverage.push(verify::verify(&source, &target, reporter).await?);
    }
    let mut first = coverage.remove(0);
    for other in coverage.iter().chain(std::iter::once(&first.clone())) {
        if other.digest != *expected {
            first.covered = false;
            first.warnings.push(format!(
                "a tag in {} resolves to {}, not {expected}",
                layout.dir.display(),
                other.digest
            ));
        }
    }
    Ok(first)
}

/// One client for the images' registries, probed first so bad credentials or an
/// unreachable registry fail before any build.
pub async fn connect_registry(
    images: &[&ImageSpec],
    options: &RegistryOptions,
    push: bool,
) -> Result<Registry> {
    let registry = Registry::new(&registry_hosts(images)?, options)?;
    for image in images {
        registry.declare(&image.first_tag()?, push).await;
    }
    let tags = images
        .iter()
        .map(|image| image.first_tag())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // At once: a run of many images would otherwise wait one round trip per image.
    futures_util::future::try_join_all(tags.iter().map(|tag| registry.probe(tag, push))).await?;
    Ok(registry)
}

fn registry_hosts(images: &[&ImageSpec]) -> Result<Vec<String>> {
    images
        .iter()
        .map(|i| Ok(i.first_tag()?.registry().to_string()))
        .collect()
}

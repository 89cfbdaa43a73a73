//! Where built images go: the image store seam (blobs, manifests by digest, tags, reading
//! back) with its two implementations, a registry and an OCI layout directory.

use crate::export::{ExportedImage, ExportedLayer};
use crate::layout::{LayoutSource, OciLayout};
use crate::oci::ManifestBlob;
use crate::progress::Reporter;
use crate::project::ImageSpec;
use crate::record::ImageCoverage;
use crate::registry::{self, BlobProgress, Registry, RegistryOptions};
use crate::verify::{self, Target};
use crate::Result;
use oci_client::Reference;
use std::future::Future;

/// What publishing needs of a destination. Blobs and manifests go in by digest; only
/// [`ImageStore::tag`] moves a tag, so a flow decides when tags move.
pub trait ImageStore {
    /// Uploads a layer file, streamed from disk.
    fn put_layer(
        &self,
        reference: &Reference,
        layer: &ExportedLayer,
        progress: &BlobProgress<'_>,
    ) -> impl Future<Output = Result<()>>;
    /// Uploads an image's config.
    fn put_config(
        &self,
        reference: &Reference,
        image: &ExportedImage,
    ) -> impl Future<Output = Result<()>>;
    /// Whether a manifest is there under `digest` in the image's repository.
    fn has_manifest(&self, image: &ImageSpec, digest: &str) -> impl Future<Output = bool>;
    /// What a tag resolves to now (None when it does not exist yet).
    fn current(&self, image: &ImageSpec, tag: &str) -> impl Future<Output = Option<String>>;
    /// Stores a manifest under its digest only (no tag moves).
    fn put_manifest(
        &self,
        reference: &Reference,
        manifest: &ManifestBlob,
    ) -> impl Future<Output = Result<()>>;
    /// Points `tag` at `index`.
    fn tag(
        &self,
        image: &ImageSpec,
        tag: &str,
        index: &ManifestBlob,
    ) -> impl Future<Output = Result<()>>;
    /// Reads the image back through its tags and checks it against its declared platforms
    /// and `expected`, the index just published.
    fn read_back(
        &self,
        image: &ImageSpec,
        expected: &str,
        reporter: &dyn Reporter,
    ) -> impl Future<Output = Result<ImageCoverage>>;
}

/// The destination of one run: a registry, or an OCI layout directory for air-gapped
/// handoff (`--output oci:DIR`).
pub enum Destination {
    Registry(Registry),
    Layout(OciLayout),
}

impl ImageStore for Destination {
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

    async fn has_manifest(&self, image: &ImageSpec, digest: &str) -> bool {
        let Destination::Registry(r) = self else {
            return false;
        };
        let Ok(reference) = first_tag(image) else {
            return false;
        };
        r.get_manifest(&reference.clone_with_digest(digest.to_string()))
            .await
            .is_ok()
    }

    async fn current(&self, image: &ImageSpec, tag: &str) -> Option<String> {
        match self {
            Destination::Registry(r) => {
                let reference = repository_reference(&image.repository, tag).ok()?;
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
                    &reference.clone_with_digest(manifest.digest.clone()),
                    manifest,
                )
                .await
            }
            Destination::Layout(l) => l
                .put_blob_bytes(&manifest.bytes, &manifest.digest)
                .map(|_| ()),
        }
    }

    async fn tag(&self, image: &ImageSpec, tag: &str, index: &ManifestBlob) -> Result<()> {
        match self {
            Destination::Registry(r) => {
                r.push_manifest(&repository_reference(&image.repository, tag)?, index)
                    .await
            }
            Destination::Layout(l) => l.tag(index, tag),
        }
    }

    async fn read_back(
        &self,
        image: &ImageSpec,
        expected: &str,
        reporter: &dyn Reporter,
    ) -> Result<ImageCoverage> {
        match self {
            Destination::Registry(r) => {
                verify::verify_image(r, image, Some(expected), false, reporter).await
            }
            Destination::Layout(l) => read_back_layout(l, image, expected, reporter).await,
        }
    }
}

/// Every tag of `image` in the layout, checked; all must resolve to `expected`.
async fn read_back_layout(
    layout: &OciLayout,
    image: &ImageSpec,
    expected: &str,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage> {
    let target = Target {
        name: image.name.clone(),
        reference: format!("oci:{}:{}", layout.dir.display(), image.tags[0]),
        tags: image.tags.clone(),
        declared: image.platforms.clone(),
        deep: false,
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
        if other.digest != expected {
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
        registry.declare(&first_tag(image)?, push).await;
    }
    for image in images {
        registry.probe(&first_tag(image)?, push).await?;
    }
    Ok(registry)
}

fn registry_hosts(images: &[&ImageSpec]) -> Result<Vec<String>> {
    images
        .iter()
        .map(|i| first_tag(i).map(|r| r.registry().to_string()))
        .collect()
}

/// The reference of an image's first tag, which polyarch reads back and pushes blobs under.
pub fn first_tag(image: &ImageSpec) -> Result<Reference> {
    repository_reference(&image.repository, &image.tags[0])
}

pub fn repository_reference(repository: &str, tag: &str) -> Result<Reference> {
    registry::parse_reference(&format!("{repository}:{tag}"))
}

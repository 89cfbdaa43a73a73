//! Verifying a project's image through its tags.

use super::error::VerifyError;
use super::source::{ReadMemory, RegistrySource};
use super::target::{Checks, Target};
use super::verdict::verify;
use crate::base::oci::ManifestBlob;
use crate::base::progress::Reporter;
use crate::project::ImageSpec;
use crate::registry::{ClientError, Registry};
use crate::verify::coverage_record::ImageCoverage;
use std::collections::BTreeMap;

/// Reads an image's first tag back and checks it against the declared platforms; every
/// other tag must resolve to the same digest (and to `pushed`, the index just pushed).
///
/// With `pushed`, whose bytes are known, the entries are read beside the tags rather than
/// after the first of them: a tag naming that digest holds exactly those bytes. A first
/// tag holding another index (a push racing this one) has that index read and judged.
pub async fn verify_image(
    registry: &Registry,
    image: &ImageSpec,
    pushed: Option<&ManifestBlob>,
    checks: Checks,
    memory: &dyn ReadMemory,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage, VerifyError<ClientError>> {
    let first = image.first_tag()?;
    let target = Target {
        name: image.name.clone(),
        reference: format!("{}:{}", image.repository, image.tags[0]),
        tags: image.tags.clone(),
        declared: image.platforms.clone(),
        deep: checks.deep,
        require_provenance: checks.require_provenance || image.require_provenance,
        require_sbom: checks.require_sbom || image.require_sbom,
    };
    let source = |pushed| RegistrySource {
        registry,
        reference: first.clone(),
        memory,
        pushed,
    };
    // Without `pushed` the first tag is read by the verify itself.
    let skipped = usize::from(pushed.is_none());
    let tags =
        futures_util::future::try_join_all(image.tags.iter().skip(skipped).map(|tag| async move {
            let reference = image.tagged(tag)?;
            let (_, digest) = registry
                .get_manifest(&reference)
                .await
                .map_err(VerifyError::Source)?;
            Ok::<_, VerifyError<ClientError>>(digest)
        }));
    let (coverage, digests) =
        futures_util::future::join(verify(&source(pushed), &target, reporter), tags).await;
    let (mut coverage, mut digests) = (coverage?, digests?);
    match pushed {
        Some(index) if digests[0] != index.digest => {
            // The tag read back above is what the registry serves now; that is judged.
            coverage = verify(&source(None), &target, reporter).await?;
        }
        Some(index) => memory.remember_resolved(&first.whole(), &index.bytes, &index.digest),
        None => digests.insert(0, coverage.digest.clone()),
    }
    let missing = missing_annotations(image, &coverage);
    coverage.warnings.extend(missing);
    let wanted = pushed
        .map_or(&coverage.digest, |index| &index.digest)
        .clone();
    for (tag, digest) in image.tags.iter().zip(digests) {
        if digest != wanted {
            coverage.covered = false;
            let why = if pushed.is_some() {
                "not the index just pushed; another push raced this one"
            } else {
                "so the tags disagree; re-publish them together"
            };
            coverage.warnings.push(format!(
                "tag {tag} resolves to {digest}, {wanted} expected: {why}"
            ));
        }
    }
    Ok(coverage)
}

/// The annotations the project gives an image that its index or a platform manifest in
/// the registry does not carry (with the value it does carry, if another).
fn missing_annotations(image: &ImageSpec, coverage: &ImageCoverage) -> Vec<String> {
    let differs =
        |place: &str, wanted: &BTreeMap<String, String>, found: &BTreeMap<String, String>| {
            wanted
                .iter()
                .filter(|(key, value)| found.get(*key) != Some(value))
                .map(|(key, value)| match found.get(key) {
                    Some(other) => format!("{place} annotation {key} is `{other}`, not `{value}`"),
                    None => format!("{place} has no annotation {key} (`{value}` expected)"),
                })
                .collect::<Vec<_>>()
        };
    let mut out = differs("the index", &image.annotations.index, &coverage.annotations);
    for platform in coverage.platforms.iter().filter(|p| p.digest.is_some()) {
        out.extend(differs(
            &format!("the {} manifest", platform.platform),
            &image.annotations.manifest,
            &platform.annotations,
        ));
    }
    out
}

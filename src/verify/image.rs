//! Verifying a project's image through its tags.

use super::{verify, Checks, KnownConfigs, RegistrySource, Target, VerifyError};
use crate::base::digest::Digest;
use crate::base::progress::Reporter;
use crate::project::ImageSpec;
use crate::registry::{ClientError, Registry};
use crate::verify::coverage_record::ImageCoverage;
use std::collections::BTreeMap;

/// Reads an image's first tag back and checks it against the declared platforms; every
/// other tag must resolve to the same digest (and to `expected`, the index just pushed).
pub async fn verify_image(
    registry: &Registry,
    image: &ImageSpec,
    expected: Option<&Digest>,
    checks: Checks,
    configs: &dyn KnownConfigs,
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
    };
    let source = RegistrySource {
        registry,
        reference: first,
        configs,
    };
    let mut coverage = verify(&source, &target, reporter).await?;
    let missing = missing_annotations(image, &coverage);
    coverage.warnings.extend(missing);
    let wanted = expected.unwrap_or(&coverage.digest).clone();
    for (n, tag) in image.tags.iter().enumerate() {
        // The first tag is the one just read back.
        let digest = if n == 0 {
            coverage.digest.clone()
        } else {
            registry
                .get_manifest(&image.tagged(tag)?)
                .await
                .map_err(VerifyError::Source)?
                .1
        };
        if digest != wanted {
            coverage.covered = false;
            let why = if expected.is_some() {
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

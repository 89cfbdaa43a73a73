//! Verifying images by name: a project's images through their tags, or any reference.

use super::{verify, Checks, KnownConfigs, RegistrySource, Target};
use crate::digest::Digest;
use crate::layout::{LayoutSource, OciLayout};
use crate::plan;
use crate::progress::Reporter;
use crate::project::{ImageSpec, Project};
use crate::record::{CoverageRecord, ImageCoverage};
use crate::registry::{self, Registry, RegistryOptions};
use crate::store::{connect_registry, first_tag, repository_reference};
use crate::{Platform, Result};
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
) -> Result<ImageCoverage> {
    let first = first_tag(image)?;
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
                .get_manifest(&repository_reference(&image.repository, tag)?)
                .await?
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

/// `verify -f polyarch.yaml [IMAGE …]`: each selected image's tags against its platforms.
pub async fn verify_project(
    project: &Project,
    selected: &[String],
    options: &RegistryOptions,
    checks: Checks,
    configs: &dyn KnownConfigs,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let images = plan::select(project, selected)?;
    let registry = connect_registry(&images, options, false).await?;
    let mut coverage = Vec::new();
    for image in &images {
        coverage.push(verify_image(&registry, image, None, checks, configs, reporter).await?);
    }
    Ok(CoverageRecord::new(coverage))
}

/// `verify REF --platform …`: a tag or digest someone else may have pushed.
pub async fn verify_reference(
    reference: &str,
    declared: &[Platform],
    options: &RegistryOptions,
    checks: Checks,
    configs: &dyn KnownConfigs,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let Checks {
        deep,
        require_provenance,
    } = checks;
    if let Some((dir, tag)) = crate::layout::parse_layout_reference(reference) {
        let target = Target {
            name: dir
                .file_name()
                .map_or("image".into(), |n| n.to_string_lossy().into_owned()),
            reference: reference.to_string(),
            tags: tag.iter().cloned().collect(),
            declared: declared.to_vec(),
            deep,
            require_provenance,
        };
        let source = LayoutSource {
            layout: OciLayout::open(&dir)?,
            tag,
        };
        return Ok(CoverageRecord::new(vec![
            verify(&source, &target, reporter).await?,
        ]));
    }
    let parsed = registry::parse_reference(reference)?;
    let registry = Registry::new(&[parsed.registry().to_string()], options)?;
    let name = parsed
        .repository()
        .rsplit('/')
        .next()
        .unwrap_or(parsed.repository())
        .to_string();
    let target = Target {
        name,
        reference: reference.to_string(),
        tags: if parsed.digest().is_none() {
            parsed.tag().map(str::to_string).into_iter().collect()
        } else {
            Vec::new()
        },
        declared: declared.to_vec(),
        deep,
        require_provenance,
    };
    let source = RegistrySource {
        registry: &registry,
        reference: parsed,
        configs,
    };
    Ok(CoverageRecord::new(vec![
        verify(&source, &target, reporter).await?,
    ]))
}

//! The `verify` command's entry points: a project's images through their tags, or any
//! reference (a registry's, or an OCI layout's `oci:DIR[:TAG]`). They sit above verify,
//! which checks what a source holds, because they pick the source and connect to it.

use crate::base::progress::Reporter;
use crate::project::plan;
use crate::project::Project;
use crate::publish::layout::{parse_layout_reference, LayoutSource, OciLayout};
use crate::publish::store::connect_registry;
use crate::registry::{self, Registry, RegistryOptions};
use crate::verify::coverage_record::CoverageRecord;
use crate::verify::{verify, verify_image, Checks, ReadMemory, RegistrySource, Target};
use crate::{Platform, Result};

/// `verify -f polyarch.yaml [IMAGE …]`: each selected image's tags against its platforms.
pub async fn verify_project(
    project: &Project,
    selected: &[String],
    options: &RegistryOptions,
    checks: Checks,
    memory: &dyn ReadMemory,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let images = plan::select(project, selected)?;
    let registry = connect_registry(&images, options, false).await?;
    // Images are independent: all read at once.
    let coverage = futures_util::future::try_join_all(
        images
            .iter()
            .map(|image| verify_image(&registry, image, None, checks, memory, reporter)),
    );
    Ok(CoverageRecord::new(coverage.await?))
}

/// `verify REF --platform …`: a tag or digest someone else may have pushed.
pub async fn verify_reference(
    reference: &str,
    declared: &[Platform],
    options: &RegistryOptions,
    checks: Checks,
    memory: &dyn ReadMemory,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let Checks {
        deep,
        require_provenance,
        require_sbom,
    } = checks;
    if let Some((dir, tag)) = parse_layout_reference(reference) {
        let target = Target {
            name: dir
                .file_name()
                .map_or("image".into(), |n| n.to_string_lossy().into_owned()),
            reference: reference.to_string(),
            tags: tag.iter().cloned().collect(),
            declared: declared.to_vec(),
            deep,
            require_provenance,
            require_sbom,
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
        require_sbom,
    };
    let source = RegistrySource {
        registry: &registry,
        reference: parsed,
        memory,
        pushed: None,
    };
    Ok(CoverageRecord::new(vec![
        verify(&source, &target, reporter).await?,
    ]))
}

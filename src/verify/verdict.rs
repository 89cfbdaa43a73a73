//! The verdict: the entries a reference holds matched against the declared platforms,
//! what is attached to each applied, and whether the reference covers them.

use super::attached;
use super::contents::{read_contents, Contents};
use super::coverage_record::{ImageCoverage, PlatformCoverage, PlatformStatus};
use super::error::VerifyError;
use super::source::ContentSource;
use super::target::Target;
use crate::base::progress::Reporter;
use crate::Platform;

/// Reads the reference back and judges it against `target`'s declared platforms.
pub async fn verify<S: ContentSource>(
    source: &S,
    target: &Target,
    reporter: &dyn Reporter,
) -> Result<ImageCoverage, VerifyError<S::Error>> {
    let Contents {
        digest,
        media_type,
        size,
        annotations,
        entries: found,
        attestations,
        mut warnings,
        attached,
        ..
    } = read_contents(source, target, reporter).await?;

    let Matched {
        mut platforms,
        missing,
        duplicated,
    } = match_declared(target, &found, &mut warnings);
    let unexpected: Vec<Platform> = found
        .iter()
        .map(|p| p.platform.clone())
        .filter(|p| !target.declared.contains(p))
        .collect();
    for platform in &unexpected {
        warnings.push(format!(
            "{} also provides {platform}, which is not declared",
            target.reference
        ));
    }
    attached::apply(target, &mut platforms, attached, &mut warnings)?;
    let covered = missing.is_empty()
        && attestations.is_empty()
        && !duplicated
        && platforms.iter().all(|p| p.status == PlatformStatus::Ok);
    Ok(ImageCoverage {
        name: target.name.clone(),
        reference: target.reference.clone(),
        tags: target.tags.clone(),
        pinned: format!("{}@{}", source.repository(), digest),
        digest,
        media_type,
        size: Some(size),
        annotations,
        declared: target.declared.clone(),
        platforms,
        missing,
        unexpected,
        attestations,
        warnings,
        covered,
        unpublished: None,
        signed: None,
    })
}

/// Each declared platform's entry (the first when the index lists it more than once, a
/// warning said), and the declared platforms the index lacks.
fn match_declared(
    target: &Target,
    found: &[PlatformCoverage],
    warnings: &mut Vec<String>,
) -> Matched {
    let mut platforms = Vec::new();
    let mut missing = Vec::new();
    let mut duplicated = false;
    for declared in &target.declared {
        let matching: Vec<&PlatformCoverage> =
            found.iter().filter(|p| &p.platform == declared).collect();
        match matching.as_slice() {
            [] => {
                missing.push(declared.clone());
                platforms.push(PlatformCoverage {
                    platform: declared.clone(),
                    digest: None,
                    config_platform: None,
                    size: None,
                    status: PlatformStatus::Missing,
                    annotations: Default::default(),
                    detail: Some(format!("{} has no entry for {declared}", target.reference)),
                    deep: None,
                    build: None,
                    attached: Vec::new(),
                    test: None,
                    sbom: None,
                    signed: None,
                });
            }
            [one] => platforms.push((*one).clone()),
            [first, ..] => {
                duplicated = true;
                warnings.push(format!(
                    "{} lists {declared} {} times; runtimes pick the first, so the others are dead weight",
                    target.reference,
                    matching.len()
                ));
                platforms.push((*first).clone());
            }
        }
    }
    Matched {
        platforms,
        missing,
        duplicated,
    }
}

/// The declared platforms as the index provides them.
struct Matched {
    /// One per declared platform, in declared order (a missing one with its status).
    platforms: Vec<PlatformCoverage>,
    missing: Vec<Platform>,
    /// Some declared platform is listed more than once.
    duplicated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::fake::target;

    fn found(arch: &str) -> PlatformCoverage {
        crate::verify::fake::agreeing_entry(arch, None)
    }

    /// A declared platform listed twice is kept once, warned about and marked, so the tag
    /// is not called covered; one the index lacks is missing in declared order.
    #[test]
    fn declared_platforms_are_matched_once_each() {
        let target = target(&["arm64", "amd64"]);
        let mut warnings = Vec::new();
        let once = match_declared(&target, &[found("amd64"), found("arm64")], &mut warnings);
        assert!(!once.duplicated && once.missing.is_empty() && warnings.is_empty());
        assert_eq!(once.platforms[0].platform, Platform::linux("arm64", None));

        let twice = match_declared(&target, &[found("amd64"), found("amd64")], &mut warnings);
        assert!(twice.duplicated);
        assert_eq!(twice.missing, vec![Platform::linux("arm64", None)]);
        assert_eq!(twice.platforms.len(), 2);
        assert_eq!(twice.platforms[0].status, PlatformStatus::Missing);
        assert_eq!(
            warnings,
            vec!["r.io/app:v1 lists linux/amd64 2 times; runtimes pick the first, so the others are dead weight"]
        );
    }
}

//! What is attached to each platform entry (OCI referrers: provenance, signatures, SBOMs),
//! each referrer read and checked to name the entry as its subject, and whether provenance
//! the target requires is there.

use super::{ContentSource, Target};
use crate::provenance;
use crate::record::{Attached, PlatformCoverage, PlatformStatus};
use crate::Result;

/// Fills each entry's `attached`. When provenance is required, an entry without it
/// becomes a gap and a listing that cannot be read is an error; otherwise that is a warning.
pub(super) async fn read_attached<S: ContentSource>(
    source: &S,
    target: &Target,
    platforms: &mut [PlatformCoverage],
    warnings: &mut Vec<String>,
) -> Result<()> {
    for platform in platforms.iter_mut() {
        let Some(digest) = platform.digest.clone() else {
            continue;
        };
        let listed = match source.referrers(&digest).await {
            Ok(listed) => listed,
            Err(e) if !target.require_provenance => {
                warnings.push(format!(
                    "cannot list what is attached to {} ({digest}): {e}",
                    platform.platform
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        for found in provenance::attached(&listed) {
            match checked(source, &found, &digest).await {
                Ok(attached) => platform.attached.push(attached),
                Err(why) => warnings.push(format!(
                    "{} ({digest}) lists referrer {} which {why}; ignored",
                    platform.platform, found.digest
                )),
            }
        }
        let has_provenance = platform.attached.iter().any(Attached::is_provenance);
        if target.require_provenance && !has_provenance && platform.status == PlatformStatus::Ok {
            platform.status = PlatformStatus::ProvenanceMissing;
            platform.detail = Some(format!(
                "{} {} ({digest}) has no SLSA provenance attached; build image {} with `provenance: true` in polyarch.yaml (or `polyarch build --provenance`)",
                target.reference, platform.platform, target.name
            ));
        }
    }
    Ok(())
}

/// A listed referrer as its manifest says: it must name `subject`; its predicate type
/// is its in-toto layer's.
async fn checked<S: ContentSource>(
    source: &S,
    found: &Attached,
    subject: &str,
) -> std::result::Result<Attached, String> {
    let bytes = source
        .manifest(&found.digest)
        .await
        .map_err(|e| format!("cannot be read ({e})"))?;
    let predicate_type = provenance::check_referrer(&bytes, subject)?;
    Ok(Attached {
        predicate_type: predicate_type.or_else(|| found.predicate_type.clone()),
        ..found.clone()
    })
}

//! SBOMs read back from a registry: `polyarch sbom REF --platform P` (one platform's
//! attached SPDX document) and `verify --sbom` (each verified platform's package counts;
//! a platform without an SBOM is a gap).

use crate::base::digest::Digest;
use crate::base::oci::{self, Parsed};
use crate::registry::{self, ClientError, Registry, RegistryError, RegistryOptions};
use crate::sbom::{remote, spdx};
use crate::verify::coverage_record::CoverageRecord;
use crate::{Error, Platform, Result};
use serde_json::Value;

/// What `polyarch sbom` found for one platform of a reference.
#[derive(Debug)]
pub enum Found {
    /// The SPDX document attached to the platform manifest.
    Document(Value),
    /// The platform manifest (its digest) has no SBOM attached.
    NoSbom(Digest),
    /// The reference has no manifest for the platform; what it has.
    NoPlatform(Vec<Platform>),
}

/// `polyarch sbom REF --platform P`: the SBOM attached to the platform manifest of `P`
/// that `reference` (an index, or one image manifest) holds.
pub async fn attached(
    reference: &str,
    platform: &Platform,
    options: &RegistryOptions,
) -> Result<Found> {
    if reference.starts_with("oci:") {
        return Err(Error::Usage(format!(
            "{reference}: SBOMs are attached in a registry only; name a registry reference"
        )));
    }
    let parsed = registry::parse_reference(reference)?;
    let registry = Registry::new(&[parsed.registry().to_string()], options)?;
    let (bytes, digest) = registry.get_manifest(&parsed).await?;
    let content = |e: oci::OciError| {
        Error::from(ClientError::registry(
            parsed.registry(),
            RegistryError::Content(e),
        ))
    };
    let subject = match oci::parse_manifest(&bytes).map_err(content)? {
        Parsed::Index { index, .. } => {
            let entries: Vec<(Platform, Digest)> = index
                .manifests()
                .iter()
                .filter(|d| !oci::is_attestation(d))
                .filter_map(|d| {
                    let digest = d.digest().to_string().parse().ok()?;
                    Some((oci::descriptor_platform(d)?, digest))
                })
                .collect();
            match entries.iter().find(|(p, _)| p == platform) {
                Some((_, digest)) => digest.clone(),
                None => {
                    return Ok(Found::NoPlatform(
                        entries.into_iter().map(|e| e.0).collect(),
                    ))
                }
            }
        }
        // One platform's image: it is the subject, whichever platform was asked.
        _ => digest,
    };
    Ok(
        match remote::attached_document(&registry, &parsed, &subject).await? {
            Some(document) => Found::Document(document),
            None => Found::NoSbom(subject),
        },
    )
}

/// `verify --sbom`: reads the SBOM attached to each platform of `record` for its package
/// counts (a platform without one is already a gap, as `--sbom` requires SBOMs).
pub async fn count_packages(record: &mut CoverageRecord, options: &RegistryOptions) -> Result<()> {
    for image in &mut record.images {
        if image.reference.starts_with("oci:") {
            return Err(Error::Usage(format!(
                "verify --sbom: {}: SBOMs are attached in a registry only; verify a registry reference",
                image.reference
            )));
        }
        let reference = registry::parse_reference(&image.reference)?;
        let registry = Registry::new(&[reference.registry().to_string()], options)?;
        let subjects: Vec<Option<Digest>> = image
            .platforms
            .iter()
            .map(|p| {
                p.digest
                    .clone()
                    .filter(|_| p.attached.iter().any(|a| a.is_sbom()))
            })
            .collect();
        let documents = futures_util::future::try_join_all(subjects.iter().map(|s| async {
            match s {
                Some(subject) => remote::attached_document(&registry, &reference, subject).await,
                None => Ok(None),
            }
        }))
        .await?;
        for (platform, document) in image.platforms.iter_mut().zip(documents) {
            platform.sbom = document.as_ref().map(spdx::counts);
        }
    }
    Ok(())
}

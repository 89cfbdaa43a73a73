//! `verify --require-signature`: each verified image's index and platform manifests read
//! back for a signature by one of its keys (see [`crate::verify::signed`]).

use crate::registry::{self, Registry, RegistryOptions};
use crate::sign::PublicKey;
use crate::verify::coverage_record::CoverageRecord;
use crate::verify::{signed, RegistrySource};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// Checks the signatures of every image of `record` that `keys` (by image name) names;
/// an image without keys is not checked.
pub async fn require(
    record: &mut CoverageRecord,
    keys: &BTreeMap<String, Vec<PublicKey>>,
    options: &RegistryOptions,
) -> Result<()> {
    for image in &mut record.images {
        let Some(keys) = keys.get(&image.name) else {
            continue;
        };
        // A failed test published nothing: there is nothing signed to read.
        if image.unpublished.is_some() {
            continue;
        }
        if image.reference.starts_with("oci:") {
            return Err(Error::Usage(format!(
                "--require-signature: {}: signatures are attached in a registry only; verify a registry reference",
                image.reference
            )));
        }
        let reference = registry::parse_reference(&image.reference)?;
        let registry = Registry::new(&[reference.registry().to_string()], options)?;
        let source = RegistrySource {
            registry: &registry,
            reference,
            memory: &(),
            pushed: None,
        };
        signed::check_image(&source, image, keys).await?;
    }
    record.covered = !record.images.is_empty() && record.images.iter().all(|i| i.covered);
    Ok(())
}

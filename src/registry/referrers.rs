//! Listing what is attached to a manifest: the registry's OCI referrers API, or, where it
//! has none (a 404, as the distribution registry 2.8 answers), the referrers tag schema
//! (`sha256-<hex>`), as the OCI distribution spec v1.1 has clients do.

use super::Registry;
use crate::Result;
use oci_client::errors::OciDistributionError;
use oci_client::Reference;
use serde_json::Value;

impl Registry {
    /// The descriptors listed as referrers of `subject` in the reference's repository; an
    /// empty list when nothing is attached.
    pub async fn referrers(&self, reference: &Reference, subject: &str) -> Result<Vec<Value>> {
        let by_digest = reference.clone_with_digest(subject.to_string());
        let by_digest = &by_digest;
        let index = self
            .call(
                reference,
                &format!("list referrers of {subject}"),
                |c, _| async move {
                    c.pull_referrers(by_digest, None).await.map_err(|e| match e {
                        OciDistributionError::ManifestParsingError(why) => {
                            OciDistributionError::SpecViolationError(format!(
                                "the referrers listing is not an OCI image index ({why}); check the registry's referrers API, or a proxy in front of it"
                            ))
                        }
                        other => other,
                    })
                },
            )
            .await?;
        Ok(index
            .manifests
            .iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect())
    }
}

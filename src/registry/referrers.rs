//! Listing what is attached to a manifest: the registry's OCI referrers API, or, where it
//! has none (a 404, as the distribution registry 2.8 answers), the referrers tag schema
//! (`sha256-<hex>`), as the OCI distribution spec v1.1 has clients do.

use super::read::read_limited;
use super::Registry;
use crate::digest::Digest;
use crate::{oci, provenance, Error, Result};
use oci_client::Reference;
use serde_json::Value;

impl Registry {
    /// The descriptors listed as referrers of `subject` in the reference's repository; an
    /// empty list when nothing is attached.
    pub async fn referrers(&self, reference: &Reference, subject: &Digest) -> Result<Vec<Value>> {
        let what = format!("list referrers of {subject}");
        let path = format!("referrers/{subject}");
        let api = self.get_if_there(reference, &what, &path, oci::OCI_INDEX, read_limited, true);
        // Both asked at once: a registry without the API costs no extra round trip.
        let (api, by_tag) =
            futures_util::future::join(api, self.referrers_by_tag(reference, subject)).await;
        let Some(listing) = api? else {
            return by_tag;
        };
        listed(&listing).map_err(|why| Error::Registry {
            registry: reference.registry().to_string(),
            message: format!(
                "cannot {what} for {reference}: the referrers listing is not an OCI image index ({why}); check the registry's referrers API, or a proxy in front of it"
            ),
        })
    }

    /// The referrers tag schema's index; none, or not an index, lists nothing.
    async fn referrers_by_tag(
        &self,
        reference: &Reference,
        subject: &Digest,
    ) -> Result<Vec<Value>> {
        let tag = provenance::referrers_tag(subject);
        let (what, path) = (
            format!("read the referrers tag {tag}"),
            format!("manifests/{tag}"),
        );
        let index = self.get_if_there(reference, &what, &path, oci::OCI_INDEX, read_limited, true);
        Ok(index
            .await?
            .and_then(|bytes| listed(&bytes).ok())
            .unwrap_or_default())
    }
}

/// The descriptors an image index lists.
fn listed(bytes: &[u8]) -> std::result::Result<Vec<Value>, String> {
    let index: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    match index.get("manifests") {
        Some(Value::Array(manifests)) => Ok(manifests.clone()),
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(_) => Err("`manifests` is not a list".into()),
    }
}

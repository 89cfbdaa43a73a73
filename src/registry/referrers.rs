//! Listing what is attached to a manifest: the registry's OCI referrers API, or, where it
//! has none (a 404, as the distribution registry 2.8 answers), the referrers tag schema
//! (`sha256-<hex>`), as the OCI distribution spec v1.1 has clients do.

use super::read::read_limited;
use super::{ListingError, Registry, RegistryError};
use crate::digest::Digest;
use crate::{attachment, oci, Error, Result};
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
        listed(&listing).map_err(|source| Error::Registry {
            registry: reference.registry().to_string(),
            source: RegistryError::BadListing {
                what,
                reference: reference.to_string(),
                source,
            }
            .into(),
        })
    }

    /// The referrers tag schema's index; none, or not an index, lists nothing.
    async fn referrers_by_tag(
        &self,
        reference: &Reference,
        subject: &Digest,
    ) -> Result<Vec<Value>> {
        let tag = attachment::referrers_tag(subject);
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
fn listed(bytes: &[u8]) -> std::result::Result<Vec<Value>, ListingError> {
    let index: Value = serde_json::from_slice(bytes)?;
    match index.get("manifests") {
        Some(Value::Array(manifests)) => Ok(manifests.clone()),
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(_) => Err(ListingError::NotAList),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_listing_that_is_not_an_index_says_why_and_keeps_the_json_error() {
        assert!(listed(br#"{"manifests": null}"#).unwrap().is_empty());
        assert!(matches!(
            listed(br#"{"manifests": {}}"#),
            Err(ListingError::NotAList)
        ));
        let Err(error) = listed(b"<html>") else {
            panic!("HTML read as a listing");
        };
        assert!(error.source().unwrap().is::<serde_json::Error>());
    }
}

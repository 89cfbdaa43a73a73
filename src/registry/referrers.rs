//! Listing what is attached to a manifest: the registry's OCI referrers API, or, where it
//! has none (a 404, as the distribution registry 2.8 answers), the referrers tag schema
//! (`sha256-<hex>`), as the OCI distribution spec v1.1 has clients do.

use super::body::read_json;
use super::{ClientError, ListingError, Registry, RegistryError, Result};
use crate::base::attachment::{self, ListedBy, Referrers};
use crate::base::digest::Digest;
use crate::base::oci;
use futures_util::future::{join, join_all};
use oci_client::Reference;
use serde_json::Value;
use std::collections::HashSet;

impl Registry {
    /// The referrers of `subject` in the reference's repository (none listed when nothing
    /// is attached), and whether the API or the tag schema lists them.
    pub async fn referrers(&self, reference: &Reference, subject: &Digest) -> Result<Referrers> {
        // Both asked at once: a registry without the API costs no extra round trip.
        let (api, by_tag) = join(
            self.referrers_api(reference, subject),
            self.referrers_by_tag(reference, subject),
        )
        .await;
        let (listed, by) = match api? {
            Some(listed) => (listed, ListedBy::Api),
            None => (by_tag?, ListedBy::TagSchema),
        };
        Ok(Referrers {
            subject: subject.clone(),
            listed,
            by,
        })
    }

    /// [`Registry::referrers`] of each of `subjects`, in order. Beside the referrers API
    /// the repository's tags are listed once: a subject whose referrers tag is not among
    /// them has nothing attached by the tag schema, so only the tags that exist are read.
    /// Without that listing a registry lacking the API answers each subject's tag with a
    /// 404, which the distribution registry logs as an error before it answers.
    pub async fn referrers_of(
        &self,
        reference: &Reference,
        subjects: &[&Digest],
    ) -> Vec<Result<Vec<Value>>> {
        let apis = join_all(subjects.iter().map(|s| self.referrers_api(reference, s)));
        let (apis, tags) = join(apis, self.tags(reference)).await;
        let tags = &tags;
        join_all(subjects.iter().zip(apis).map(|(subject, api)| async move {
            match api? {
                Some(listed) => Ok(listed),
                None => match tags {
                    Some(tags) if !tags.contains(&attachment::referrers_tag(subject)) => {
                        Ok(Vec::new())
                    }
                    _ => self.referrers_by_tag(reference, subject).await,
                },
            }
        }))
        .await
    }

    /// The referrers API's listing; None when the registry has no such API (a 404).
    async fn referrers_api(
        &self,
        reference: &Reference,
        subject: &Digest,
    ) -> Result<Option<Vec<Value>>> {
        let what = format!("list referrers of {subject}");
        let path = format!("referrers/{subject}");
        let api = self.get_if_there(reference, &what, &path, oci::OCI_INDEX, read_json, true);
        let Some(listing) = api.await? else {
            return Ok(None);
        };
        listed(&listing).map(Some).map_err(|source| {
            ClientError::registry(
                reference.registry(),
                RegistryError::BadListing {
                    what,
                    reference: reference.to_string(),
                    source,
                },
            )
        })
    }

    /// Every tag of the reference's repository, when one answer of at most 1000 lists them
    /// all (none that points to a next page, as a registry paginating a long list does);
    /// else None, and nothing is concluded from it.
    async fn tags(&self, reference: &Reference) -> Option<HashSet<String>> {
        #[derive(serde::Deserialize)]
        struct TagList {
            tags: Option<Vec<String>>,
        }
        let read = |response: reqwest::Response| async move {
            let paged = response.headers().contains_key(reqwest::header::LINK);
            Ok((paged, read_json(response).await?))
        };
        let what = "list tags";
        let answer = self.get_if_there(
            reference,
            what,
            "tags/list?n=1000",
            "application/json",
            read,
            true,
        );
        match answer.await {
            Ok(Some((false, body))) => {
                let list: TagList = serde_json::from_slice(&body).ok()?;
                Some(list.tags.unwrap_or_default().into_iter().collect())
            }
            _ => None,
        }
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
        let index = self.get_if_there(reference, &what, &path, oci::OCI_INDEX, read_json, true);
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
    use serde_json::json;
    use std::error::Error as _;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A registry without the referrers API on a loopback port, holding the referrers tag of
    /// `attached` only; `paged`: its tag list says more pages follow. Records each path.
    async fn registry_without_the_api(
        attached: &Digest,
        paged: bool,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let paths = Arc::new(Mutex::new(Vec::new()));
        let tag = attachment::referrers_tag(attached);
        let seen = paths.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let (seen, tag) = (seen.clone(), tag.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut head = Vec::new();
                    loop {
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let request = String::from_utf8_lossy(&head[..end]).to_string();
                        head.drain(..end + 4);
                        let path = request.split(' ').nth(1).unwrap_or("").to_string();
                        seen.lock().unwrap().push(path.clone());
                        let (status, extra, body) = if path.starts_with("/v2/r/tags/list") {
                            let link = if paged {
                                "Link: </v2/r/tags/list?last=t>; rel=\"next\"\r\n"
                            } else {
                                ""
                            };
                            (
                                "200 OK",
                                link,
                                format!(r#"{{"name":"r","tags":["t","{tag}"]}}"#),
                            )
                        } else if path == format!("/v2/r/manifests/{tag}") {
                            let index =
                                json!({"schemaVersion": 2, "manifests": [{"digest": "sha256:1"}]});
                            ("200 OK", "", index.to_string())
                        } else {
                            ("404 Not Found", "", String::new())
                        };
                        let answer = format!("HTTP/1.1 {status}\r\nDocker-Distribution-Api-Version: registry/2.0\r\n{extra}Content-Length: {}\r\n\r\n{body}", body.len());
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, paths)
    }

    /// One tag listing answers for every subject: only a referrers tag that exists is read;
    /// a listing that pages is not trusted, and each subject's tag is asked for.
    #[tokio::test]
    async fn only_referrers_tags_the_repository_lists_are_read() {
        let (bare, attached) = (Digest::of(b"bare"), Digest::of(b"attached"));
        for paged in [false, true] {
            let (address, paths) = registry_without_the_api(&attached, paged).await;
            let options = super::super::RegistryOptions {
                credentials: Some(("user".into(), "secret".into())),
                ..Default::default()
            };
            let registry = Registry::new(std::slice::from_ref(&address), &options).unwrap();
            let reference: Reference = format!("{address}/r:t").parse().unwrap();
            let listed = registry.referrers_of(&reference, &[&bare, &attached]).await;
            let listed: Vec<usize> = listed.into_iter().map(|l| l.unwrap().len()).collect();
            assert_eq!(listed, vec![0, 1]);
            let asked_bare_tag = paths.lock().unwrap().contains(&format!(
                "/v2/r/manifests/{}",
                attachment::referrers_tag(&bare)
            ));
            assert_eq!(asked_bare_tag, paged, "{:?}", paths.lock().unwrap());
        }
    }

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

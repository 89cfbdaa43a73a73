//! Pushing: blobs (HEAD first, a cross-repository mount when this run or an earlier one
//! put the blob in another repository, then a streamed upload) and manifests, with progress.

use super::body::error_text;
use super::failure::Attempt;
use super::read::{refusal, with_auth};
use super::Result;
use super::{parse_reference, Registry};
use crate::base::digest::Digest;
use crate::base::oci::ManifestBlob;
use crate::base::progress::{Event, Phase, Reporter};
use crate::Platform;
use futures_util::{StreamExt, TryStreamExt};
use oci_client::errors::OciDistributionError;
use oci_client::{Reference, RegistryOperation};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where earlier runs put each blob (the caller keeps it between runs, e.g. in the cache
/// directory): a layer another project already pushed to the same registry is mounted
/// from there instead of uploaded again.
pub trait BlobPlaces: Send + Sync {
    /// Repositories of `registry` an earlier run put `digest` in, most recent first.
    fn places(&self, registry: &str, digest: &Digest) -> Vec<String>;
    fn remember(&self, registry: &str, digest: &Digest, repository: &str);
    /// The blob is no longer there (deleted, or the mount was refused).
    fn forget(&self, registry: &str, digest: &Digest, repository: &str);
}

/// Whether a push asks the registry for the blob (HEAD) before uploading it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    First,
    Not,
}

/// What a blob upload sends: a spooled file (restartable) or bytes in memory.
enum Body<'a> {
    File { path: &'a Path, size: u64 },
    Bytes(&'a [u8]),
}

impl Registry {
    /// Remember where blobs go, and mount from where earlier runs put them. Set once, before
    /// any push; a second call is ignored.
    pub fn remember_blob_places(&self, places: Arc<dyn BlobPlaces>) {
        let _ = self.places.set(places);
    }

    /// Uploads a spooled blob unless the registry already has it; returns whether it uploaded.
    pub async fn push_blob_file(
        &self,
        reference: &Reference,
        path: &Path,
        digest: &Digest,
        size: u64,
        progress: &BlobProgress<'_>,
    ) -> Result<bool> {
        self.push_blob(
            reference,
            digest,
            Body::File { path, size },
            Some(progress),
            Ask::First,
        )
        .await
    }

    pub async fn push_blob_bytes(
        &self,
        reference: &Reference,
        bytes: &[u8],
        digest: &Digest,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::Bytes(bytes), None, Ask::First)
            .await
    }

    /// Uploads a small blob this run has just made (a statement, a signature), with no
    /// HEAD first: the registry is all but sure not to hold it, so asking would only put
    /// one more round trip before the upload. Uploading a blob the registry holds already
    /// is harmless (the same bytes under the same digest).
    pub async fn push_new_blob_bytes(
        &self,
        reference: &Reference,
        bytes: &[u8],
        digest: &Digest,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::Bytes(bytes), None, Ask::Not)
            .await
    }

    /// HEAD (unless `ask` says not to), then a cross-repository mount when this run put
    /// the blob in another repository of the same registry, then an upload. Concurrent
    /// pushes of one digest to one registry wait for each other, so a shared layer is
    /// uploaded once.
    async fn push_blob(
        &self,
        reference: &Reference,
        digest: &Digest,
        body: Body<'_>,
        progress: Option<&BlobProgress<'_>>,
        ask: Ask,
    ) -> Result<bool> {
        let key = (reference.registry().to_string(), digest.to_string());
        let repository = reference.repository().to_string();
        let size = match &body {
            Body::File { size, .. } => *size,
            Body::Bytes(b) => b.len() as u64,
        };
        let skipped = |progress: Option<&BlobProgress<'_>>| {
            if let Some(p) = progress {
                p.add(size);
            }
        };
        let lock = self
            .uploads
            .lock()
            .expect("upload lock")
            .entry(key.clone())
            .or_default()
            .clone();
        let _guard = lock.lock().await;
        let mut elsewhere: Vec<String> = {
            let known = self.known.lock().expect("known lock");
            match known.get(&key) {
                Some(repos) if repos.contains(&repository) => {
                    drop(known);
                    skipped(progress);
                    return Ok(false);
                }
                Some(repos) => repos.iter().cloned().collect(),
                None => Vec::new(),
            }
        };
        if let Some(places) = self.places.get() {
            for place in places.places(&key.0, digest) {
                if place != repository && !elsewhere.contains(&place) {
                    elsewhere.push(place);
                }
            }
        }
        let remember = || self.remember_blob(reference, digest);
        if ask == Ask::First && self.blob_exists(reference, digest).await? {
            remember();
            skipped(progress);
            return Ok(false);
        }
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        if self.mounted(reference, digest, elsewhere).await? {
            remember();
            skipped(progress);
            return Ok(false);
        }
        self.upload(reference, digest, body, progress).await?;
        remember();
        Ok(true)
    }

    /// This run put (or found) `digest` in `reference`'s repository.
    fn remember_blob(&self, reference: &Reference, digest: &Digest) {
        let key = (reference.registry().to_string(), digest.to_string());
        let repository = reference.repository().to_string();
        if let Some(places) = self.places.get() {
            places.remember(&key.0, digest, &repository);
        }
        self.known
            .lock()
            .expect("known lock")
            .entry(key)
            .or_default()
            .insert(repository);
    }

    /// Whether this run or an earlier one put `digest` in this registry: in `reference`'s
    /// repository, or in one it can be mounted from.
    pub fn knows_blob(&self, reference: &Reference, digest: &Digest) -> bool {
        let key = (reference.registry().to_string(), digest.to_string());
        if self.known.lock().expect("known lock").contains_key(&key) {
            return true;
        }
        self.places
            .get()
            .is_some_and(|places| !places.places(&key.0, digest).is_empty())
    }

    /// Uploads a blob while it is being made: its bytes arrive on `chunks` and go out as
    /// one streamed `PATCH`, and its digest arrives on `digest` once they all did, for the
    /// closing `PUT`. One attempt: the bytes went by once. False when it did not land
    /// (the caller still has the blob, and pushes it the usual way).
    pub async fn push_blob_streamed(
        &self,
        reference: &Reference,
        chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
        digest: tokio::sync::oneshot::Receiver<Digest>,
    ) -> bool {
        // A token that may push, as the upload's requests below use the one this fetches.
        if let Some(challenge) = self.challenge(reference).await {
            if self.token(reference, &challenge, true).await.is_err() {
                return false;
            }
        }
        let (base, client) = self.base(reference).await;
        let start = format!("{base}/v2/{}/blobs/uploads/", reference.repository());
        let (start, base) = (&start, &base);
        let begun = self
            .authorized(
                reference,
                "start an upload",
                self.deadline,
                |auth, _| async move {
                    let response = with_auth(client.post(start), &auth).send().await?;
                    let location = upload_location(&response, base).ok_or_else(|| {
                        Attempt::answered(response.status().as_u16(), start, String::new())
                    })?;
                    Ok((location, auth))
                },
            )
            .await;
        let Ok((location, auth)) = begun else {
            return false;
        };
        let body = reqwest::Body::wrap_stream(
            tokio_stream::wrappers::ReceiverStream::new(chunks).map(Ok::<_, std::io::Error>),
        );
        let sent = with_auth(client.patch(&location), &auth)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body)
            .send()
            .await;
        let location = match sent {
            Ok(response) if response.status().is_success() => {
                upload_location(&response, base).unwrap_or(location)
            }
            _ => return false,
        };
        let Ok(digest) = digest.await else {
            // The export failed: the registry drops the upload after its timeout anyway.
            let dropped = with_auth(client.delete(&location), &auth).send();
            let _ = tokio::time::timeout(self.deadline, dropped).await;
            return false;
        };
        let closed = with_auth(client.put(&location), &auth)
            .query(&[("digest", digest.as_str())])
            .header(reqwest::header::CONTENT_LENGTH, 0)
            .send();
        let closed = tokio::time::timeout(self.deadline, closed).await;
        if !closed.is_ok_and(|r| r.is_ok_and(|r| r.status().is_success())) {
            return false;
        }
        self.remember_blob(reference, &digest);
        true
    }

    /// Mounts the blob from one of the repositories this run or an earlier one put it in;
    /// false when none could (a registry that declines answers 202 and the blob is
    /// uploaded instead). Only a mount the registry then shows the blob for counts.
    async fn mounted(
        &self,
        reference: &Reference,
        digest: &Digest,
        elsewhere: Vec<String>,
    ) -> Result<bool> {
        for source_repo in elsewhere {
            let Ok(source) =
                parse_reference(&format!("{}/{source_repo}:latest", reference.registry()))
            else {
                continue;
            };
            // With tokens, the run's token must let us pull the source, or the registry
            // quietly starts an upload instead of the mount.
            let readable = match self.challenge(&source).await {
                Some(challenge) => self.token(&source, &challenge, false).await.is_ok(),
                None => true,
            };
            let mounted = readable
                && self
                    .call(reference, &format!("mount blob {digest}"), |c, _| {
                        c.mount_blob(reference, &source, digest.as_str())
                    })
                    .await
                    .is_ok();
            if mounted && self.blob_exists(reference, digest).await? {
                return Ok(true);
            }
            if let Some(places) = self.places.get() {
                places.forget(reference.registry(), digest, &source_repo);
            }
        }
        Ok(false)
    }

    /// Uploads the blob, streamed from its spool file or from memory.
    async fn upload(
        &self,
        reference: &Reference,
        digest: &Digest,
        body: Body<'_>,
        progress: Option<&BlobProgress<'_>>,
    ) -> Result<()> {
        let what = format!("upload blob {digest}");
        match body {
            Body::File { path, size } => {
                let counter = progress.map(|p| p.counter());
                let deadline = self.deadline_for(size);
                self.call_within(reference, &what, deadline, |c, _| {
                    let counter = counter.clone();
                    async move {
                        let file = tokio::fs::File::open(path).await?;
                        // Bytes sent by a failed attempt are taken back before the retry.
                        let sent = Arc::new(AtomicU64::new(0));
                        let sent_here = sent.clone();
                        let counted = counter.clone();
                        let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20)
                            .inspect_ok(move |chunk| {
                                sent_here.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                                if let Some(c) = &counted {
                                    c.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                                }
                            })
                            .map_err(OciDistributionError::IoError);
                        let result = c
                            .push_blob_stream(reference, stream, digest.as_str(), Some(size))
                            .await;
                        if result.is_err() {
                            if let Some(c) = &counter {
                                c.fetch_sub(sent.load(Ordering::Relaxed), Ordering::Relaxed);
                            }
                        }
                        result
                    }
                })
                .await?;
                if let Some(p) = progress {
                    p.report();
                }
            }
            Body::Bytes(bytes) => {
                let deadline = self.deadline_for(bytes.len() as u64);
                let bytes = bytes::Bytes::copy_from_slice(bytes);
                self.call_within(reference, &what, deadline, |c, _| {
                    let bytes = bytes.clone();
                    async move { c.push_blob(reference, bytes, digest.as_str()).await }
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Pushes a manifest under `reference` (a tag, or its own digest), over reqwest as reads
    /// are: a run whose layers the engine pushed builds no oci-client client (and loads no
    /// CA store for a plain-HTTP registry) to push its index.
    pub async fn push_manifest(
        &self,
        reference: &Reference,
        manifest: &ManifestBlob,
    ) -> Result<()> {
        if let Some(challenge) = self.challenge(reference).await {
            self.token(reference, &challenge, true).await?;
        }
        self.forget_tag_read(reference);
        let wanted = reference.digest().or(reference.tag()).unwrap_or("latest");
        let (base, client) = self.base(reference).await;
        let url = format!("{base}/v2/{}/manifests/{wanted}", reference.repository());
        let url = &url;
        let deadline = self.deadline;
        self.authorized(reference, "push manifest", deadline, |auth, _| async move {
            let request = client
                .put(url)
                .header(reqwest::header::CONTENT_TYPE, manifest.media_type)
                .body(manifest.bytes.clone());
            let response = with_auth(request, &auth).send().await?;
            let status = response.status();
            if !status.is_success() {
                let body = error_text(response).await;
                return Err(Attempt::answered(status.as_u16(), url, refusal(&body)));
            }
            Ok(())
        })
        .await
    }
}

/// Where an upload goes on: the answer's `Location`, made absolute against `base`.
fn upload_location(response: &reqwest::Response, base: &str) -> Option<String> {
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    Some(match location.starts_with('/') {
        true => format!("{base}{location}"),
        false => location.to_string(),
    })
}

/// Counts pushed bytes for one image × platform and reports them.
pub struct BlobProgress<'a> {
    pub image: &'a str,
    pub platform: Option<&'a Platform>,
    pub total: Option<u64>,
    pub reporter: &'a dyn Reporter,
    pub done: Arc<AtomicU64>,
}

impl BlobProgress<'_> {
    fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
        self.report();
    }

    pub fn report(&self) {
        self.reporter.report(Event::Bytes {
            image: self.image.to_string(),
            platform: self.platform.cloned(),
            phase: Phase::Push,
            done: self.done.load(Ordering::Relaxed),
            total: self.total,
        });
    }
}

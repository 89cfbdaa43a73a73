//! Pushing: blobs (HEAD first, a cross-repository mount when this run or an earlier one
//! put the blob in another repository, then a streamed upload) and manifests, with
//! progress.

use super::failure::{Attempt, Failure};
use super::mount::Mount;
use super::Registry;
use crate::digest::Digest;
use crate::oci::ManifestBlob;
use crate::progress::{Event, Phase, Reporter};
use crate::text::one_line;
use crate::{Platform, Result};
use futures_util::TryStreamExt;
use oci_client::errors::OciDistributionError;
use oci_client::{Reference, RegistryOperation};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a blob upload sends: a spooled file (restartable) or bytes in memory.
enum Body<'a> {
    File { path: &'a Path, size: u64 },
    Bytes(&'a [u8]),
}

impl Registry {
    /// Uploads a spooled blob unless the registry already has it; returns whether it uploaded.
    pub async fn push_blob_file(
        &self,
        reference: &Reference,
        path: &Path,
        digest: &Digest,
        size: u64,
        progress: &BlobProgress<'_>,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::File { path, size }, Some(progress))
            .await
    }

    pub async fn push_blob_bytes(
        &self,
        reference: &Reference,
        bytes: &[u8],
        digest: &Digest,
    ) -> Result<bool> {
        self.push_blob(reference, digest, Body::Bytes(bytes), None)
            .await
    }

    /// HEAD, then a cross-repository mount from a repository of the same registry that
    /// this run or (with a [`BlobMemory`]) an earlier one put the blob in, then an upload.
    /// Concurrent pushes of one digest to one registry wait for each other, so a shared
    /// layer is uploaded once.
    async fn push_blob(
        &self,
        reference: &Reference,
        digest: &Digest,
        body: Body<'_>,
        progress: Option<&BlobProgress<'_>>,
    ) -> Result<bool> {
        let registry = reference.registry();
        let key = (registry.to_string(), digest.to_string());
        let repository = reference.repository();
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
        let in_run: Option<String> = {
            let known = self.known.lock().expect("known lock");
            match known.get(&key) {
                Some(repos) if repos.contains(repository) => {
                    drop(known);
                    skipped(progress);
                    return Ok(false);
                }
                Some(repos) => repos.iter().next().cloned(),
                None => None,
            }
        };
        let memory = self.memory.get();
        let remember = || {
            self.known
                .lock()
                .expect("known lock")
                .entry(key.clone())
                .or_default()
                .insert(repository.to_string());
            if let Some(memory) = memory {
                memory.remember(registry, digest, repository);
            }
        };
        if self.blob_exists(reference, digest).await? {
            remember();
            skipped(progress);
            return Ok(false);
        }
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        // One mount request: from where this run put the blob (certain), else from where
        // an earlier run last did.
        let remembered = || {
            memory?
                .repositories(registry, digest)
                .into_iter()
                .find(|r| r != repository)
        };
        let source = in_run.clone().or_else(remembered);
        let mut session = None;
        if let Some(source) = &source {
            match self.mount(reference, digest, source).await {
                Mount::Mounted => {
                    remember();
                    skipped(progress);
                    return Ok(false);
                }
                Mount::Declined(url) => session = Some(url),
                Mount::Failed => {}
            }
            if in_run.is_none() {
                if let Some(memory) = memory {
                    memory.forget(registry, digest, source);
                }
            }
        }
        // The session a declined mount opened saves a request; should it fail, a new one.
        let on_session = match &session {
            Some(url) => self
                .upload_to(reference, url, digest, &body, progress)
                .await
                .is_ok(),
            None => false,
        };
        if !on_session {
            self.upload(reference, digest, &body, progress).await?;
        }
        if let Some(p) = progress {
            p.report();
        }
        remember();
        Ok(true)
    }

    /// Uploads the blob with one PUT on an upload session the registry opened (`session`,
    /// a declined mount's), streamed from its spool file or from memory.
    async fn upload_to(
        &self,
        reference: &Reference,
        session: &reqwest::Url,
        digest: &Digest,
        body: &Body<'_>,
        progress: Option<&BlobProgress<'_>>,
    ) -> Result<()> {
        let (base, client) = self.base(reference).await;
        // Credentials go to the registry only, not to a storage host it redirects to.
        let same_origin = reqwest::Url::parse(&base).is_ok_and(|b| b.origin() == session.origin());
        let mut url = session.clone();
        url.query_pairs_mut().append_pair("digest", digest.as_str());
        let (url, counter) = (&url, progress.map(|p| p.counter()));
        self.authorized(reference, &format!("upload blob {digest}"), |auth, _| {
            let counter = counter.clone();
            async move {
                let sent = Arc::new(AtomicU64::new(0));
                let (length, payload) = match body {
                    Body::File { path, size } => {
                        let stream = counted(path, &sent, counter.as_ref())
                            .await
                            .map_err(|e| Attempt::from(OciDistributionError::IoError(e)))?;
                        (*size, reqwest::Body::wrap_stream(stream))
                    }
                    Body::Bytes(bytes) => (bytes.len() as u64, bytes.to_vec().into()),
                };
                let mut request = client
                    .put(url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .header(reqwest::header::CONTENT_LENGTH, length)
                    .body(payload);
                if same_origin {
                    request = super::mount::authorize(request, &auth);
                }
                let answer = async {
                    let response = request.send().await?;
                    let status = response.status().as_u16();
                    let announced = response
                        .headers()
                        .get("Docker-Content-Digest")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    match (status, announced) {
                        (200 | 201 | 204, Some(d)) if d != digest.as_str() => Err(
                            Attempt::answered(status, url.as_str(), format!("stored as {d}")),
                        ),
                        (200 | 201 | 204, _) => Ok(()),
                        _ => {
                            let text = response.text().await.unwrap_or_default();
                            Err(Attempt::answered(status, url.as_str(), one_line(&text)))
                        }
                    }
                }
                .await;
                answer.map_err(|mut failed| {
                    if let Some(c) = &counter {
                        c.fetch_sub(sent.load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                    // Not retried here: a session a failed PUT reached may be gone, and
                    // the caller's fallback uploads on a new one, with retries.
                    failed.failure = Failure::Permanent;
                    failed
                })
            }
        })
        .await
    }

    /// Uploads the blob on a new session, streamed from its spool file or from memory.
    async fn upload(
        &self,
        reference: &Reference,
        digest: &Digest,
        body: &Body<'_>,
        progress: Option<&BlobProgress<'_>>,
    ) -> Result<()> {
        let what = format!("upload blob {digest}");
        match *body {
            Body::File { path, size } => {
                let counter = progress.map(|p| p.counter());
                self.call(reference, &what, |c, _| {
                    let counter = counter.clone();
                    async move {
                        // Bytes sent by a failed attempt are taken back before the retry.
                        let sent = Arc::new(AtomicU64::new(0));
                        let stream = counted(path, &sent, counter.as_ref())
                            .await?
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
            }
            Body::Bytes(bytes) => {
                let bytes = bytes::Bytes::copy_from_slice(bytes);
                self.call(reference, &what, |c, _| {
                    let bytes = bytes.clone();
                    async move { c.push_blob(reference, bytes, digest.as_str()).await }
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Pushes a manifest under `reference` (a tag, or its own digest).
    pub async fn push_manifest(
        &self,
        reference: &Reference,
        manifest: &ManifestBlob,
    ) -> Result<()> {
        self.authenticate(reference, RegistryOperation::Push)
            .await?;
        self.call(reference, "push manifest", |c, _| async move {
            {
                let content_type = manifest
                    .media_type
                    .parse()
                    .expect("media types are valid header values");
                c.push_manifest_raw(reference, manifest.bytes.clone(), content_type)
                    .await
                    .map(|_| ())
            }
        })
        .await
    }
}

/// A spool file's bytes as they are read, counted into `sent` (this attempt's) and the
/// progress `counter`.
async fn counted(
    path: &Path,
    sent: &Arc<AtomicU64>,
    counter: Option<&Arc<AtomicU64>>,
) -> std::io::Result<impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static>
{
    let file = tokio::fs::File::open(path).await?;
    let (sent, counter) = (sent.clone(), counter.cloned());
    Ok(
        tokio_util::io::ReaderStream::with_capacity(file, 1 << 20).inspect_ok(move |chunk| {
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if let Some(c) = &counter {
                c.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }),
    )
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

//! Cross-repository mounts (`POST /v2/<name>/blobs/uploads/?mount=<digest>&from=<other>`):
//! a blob already in another repository of the registry is linked into the target with
//! one request instead of being uploaded again. The sources are the repositories this run
//! put the blob in, and those a [`BlobMemory`] remembers from earlier runs.

use super::failure::Attempt;
use super::{parse_reference, Registry};
use crate::digest::Digest;
use crate::text::one_line;
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use std::time::Instant;

/// Where blobs went in earlier runs, per registry (the flows keep it in the cache
/// directory). Only a hint: the registry decides whether a mount takes effect.
pub trait BlobMemory: Send + Sync {
    /// Repositories of `registry` that held `digest`, newest first.
    fn repositories(&self, registry: &str, digest: &Digest) -> Vec<String>;
    /// `repository` of `registry` holds `digest` now.
    fn remember(&self, registry: &str, digest: &Digest, repository: &str);
    /// `repository` did not give `digest` to a mount: it is not asked again.
    fn forget(&self, registry: &str, digest: &Digest, repository: &str);
}

/// What a mount request came to.
pub(super) enum Mount {
    /// The registry answered 201 for this very digest: the blob is in the target now.
    Mounted,
    /// It answered 202: no mount (the source lacks the blob, or the registry does not
    /// mount), and an upload session opened at this URL instead.
    Declined(reqwest::Url),
    /// Refused or failed (e.g. no pull access to the source): upload as without a mount.
    Failed,
}

/// How the registry answered a mount request.
enum Answer {
    /// 201, with the digest it announced.
    Created(Option<String>),
    /// 202, with the upload session's URL.
    Accepted(Option<reqwest::Url>),
}

/// `request` with the run's auth for the registry (the empty bearer sends none).
pub(super) fn authorize(
    request: reqwest::RequestBuilder,
    auth: &RegistryAuth,
) -> reqwest::RequestBuilder {
    match auth {
        RegistryAuth::Basic(user, password) => request.basic_auth(user, Some(password)),
        RegistryAuth::Bearer(token) if !token.is_empty() => request.bearer_auth(token),
        _ => request,
    }
}

impl Registry {
    /// Asks the registry to mount `digest` into the reference's repository from the
    /// repository `source`, and checks that it took effect.
    pub(super) async fn mount(
        &self,
        reference: &Reference,
        digest: &Digest,
        source: &str,
    ) -> Mount {
        if !self.may_read(reference, source).await {
            return Mount::Failed;
        }
        let (base, client) = self.base(reference).await;
        let url = format!(
            "{base}/v2/{}/blobs/uploads/?mount={digest}&from={source}",
            reference.repository()
        );
        let url = &url;
        let answer = self
            .authorized(
                reference,
                &format!("mount blob {digest}"),
                |auth, _| async move {
                    let response = authorize(client.post(url), &auth).send().await?;
                    let header = |name| {
                        response
                            .headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string)
                    };
                    match response.status().as_u16() {
                        201 => Ok(Answer::Created(header("Docker-Content-Digest"))),
                        202 => {
                            let session = header("Location")
                                .and_then(|l| reqwest::Url::parse(url).ok()?.join(&l).ok());
                            Ok(Answer::Accepted(session))
                        }
                        status => {
                            let body = response.text().await.unwrap_or_default();
                            let detail = one_line(&body.chars().take(200).collect::<String>());
                            Err(Attempt::answered(status, url, detail))
                        }
                    }
                },
            )
            .await;
        match answer {
            Ok(Answer::Created(Some(announced))) if announced == digest.as_str() => Mount::Mounted,
            // A registry that announces no digest is asked whether the blob is there.
            Ok(Answer::Created(None)) => match self.blob_exists(reference, digest).await {
                Ok(true) => Mount::Mounted,
                _ => Mount::Failed,
            },
            Ok(Answer::Accepted(Some(session))) => Mount::Declined(session),
            Ok(Answer::Created(Some(_)) | Answer::Accepted(None)) | Err(_) => Mount::Failed,
        }
    }

    /// Whether the run's token (where the registry wants one) may read `source`, as a
    /// mount requires: when it may not yet, one is asked for with every other scope of the
    /// run. A token server that refuses is not asked for `source` again, so later tokens
    /// for the run's own repositories are not refused with it.
    async fn may_read(&self, reference: &Reference, source: &str) -> bool {
        let Some(challenge) = self.challenge(reference).await else {
            return true;
        };
        let state = self.token_state(reference.registry());
        if state
            .lock()
            .await
            .current(source, false, Instant::now())
            .is_some()
        {
            return true;
        }
        let Ok(source_reference) = parse_reference(&format!("{}/{source}", reference.registry()))
        else {
            return false;
        };
        if self
            .token(&source_reference, &challenge, false)
            .await
            .is_ok()
        {
            return true;
        }
        state.lock().await.unwant(source);
        false
    }
}

//! Reads over the registry's HTTP API with reqwest itself: manifests, blobs and referrer
//! listings. Each oci-client client also builds a throw-away HTTP client, and with it a
//! certificate verifier that reads the system's CA store: most of a `polyarch verify`'s
//! start-up, for reads that need none of oci-client's state.

use super::body::error_text;
use super::failure::{registry_error, Attempt, Failure};
use super::probe::{has_port, PlainAnswer};
use super::Result;
use super::{Registry, Scheme};
use crate::base::text::one_line;
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use std::future::Future;

impl Registry {
    /// The scheme and host to reach the reference's registry at, and the client for it.
    pub(super) async fn base(&self, reference: &Reference) -> (String, &reqwest::Client) {
        let host = reference.registry().to_string();
        let resolved = reference.resolve_registry();
        if !self.plain_capable.contains(&host) {
            return (format!("https://{resolved}"), self.clients.http(true));
        }
        match self.scheme(&host, reference).await {
            // Unverified as Docker's insecure registries: see `Clients::plain`.
            Scheme::Plain { .. } => (format!("http://{resolved}"), self.clients.http(false)),
            Scheme::Tls if self.insecure.contains(&host) => {
                (format!("https://{resolved}"), self.clients.http(false))
            }
            Scheme::Tls => (format!("https://{resolved}"), self.clients.http(true)),
        }
    }

    /// The answer to this very request when it was sent before the scheme of a loopback
    /// or insecure registry with a port was known: every read asked before then is its own
    /// plain probe, so reads asked at once (`verify`'s one wave) do not queue behind the
    /// first of them. The first answer proving plain HTTP decides the scheme (as the `/v2/`
    /// ping's would, a round trip sooner); a read proving nothing waits for the scheme. A
    /// server that takes the connection and says nothing within the deadline fails the
    /// read: asked over TLS or again, it would keep the run waiting as long.
    async fn first_read(
        &self,
        reference: &Reference,
        path: &str,
        accept: &str,
    ) -> std::result::Result<Option<reqwest::Response>, Attempt> {
        let host = reference.registry();
        if !self.plain_capable.contains(host) || !has_port(reference.resolve_registry()) {
            return Ok(None);
        }
        let cell = self.scheme_cell(host);
        if cell.initialized() {
            return Ok(None);
        }
        match self.read_plain(reference, path, accept).await {
            Ok((scheme, response)) => {
                // Another read may have decided meanwhile, from an answer of the same server.
                let _ = cell.set(scheme);
                Ok(Some(response))
            }
            Err(PlainMiss::Silent) => Err(Attempt::timed_out(self.deadline)),
            Err(miss) => {
                let answered = miss == PlainMiss::NotARegistry;
                self.decide_scheme(host, reference, answered).await;
                Ok(None)
            }
        }
    }

    /// An anonymous plain-HTTP GET of `path` under the reference's repository, and the
    /// scheme its answer proves: a registry's 200 or 401 (or its 404, which carries the
    /// registry's API version header) means plain HTTP, as the `/v2/` ping's would.
    pub(super) async fn read_plain(
        &self,
        reference: &Reference,
        path: &str,
        accept: &str,
    ) -> Result<(Scheme, reqwest::Response), PlainMiss> {
        let url = format!(
            "http://{}/v2/{}/{path}",
            reference.resolve_registry(),
            reference.repository()
        );
        let request = self
            .clients
            .http(false)
            .get(&url)
            .header(reqwest::header::ACCEPT, accept);
        let response = tokio::time::timeout(self.deadline, request.send())
            .await
            .map_err(|_| PlainMiss::Silent)?
            .map_err(|_| PlainMiss::Unanswered)?;
        let status = response.status().as_u16();
        let headers = response.headers();
        let challenge = headers
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let registry_404 = status == 404 && headers.contains_key("docker-distribution-api-version");
        let answer = PlainAnswer::new(if registry_404 { 200 } else { status }, challenge);
        if !answer.is_registry() {
            return Err(PlainMiss::NotARegistry);
        }
        let scheme = Scheme::Plain {
            open: answer.is_open(),
            bearer: answer.bearer(),
        };
        Ok((scheme, response))
    }

    /// GET `path` under the reference's repository (`/v2/<name>/<path>`) with the run's
    /// auth, retried as every call; `read` takes a successful answer inside the retry, so
    /// a body cut short is asked for again.
    pub(super) async fn get<T, F, Fut>(
        &self,
        reference: &Reference,
        what: &str,
        path: &str,
        accept: &str,
        read: F,
    ) -> Result<T>
    where
        F: Fn(reqwest::Response) -> Fut,
        Fut: Future<Output = std::result::Result<T, Attempt>>,
    {
        let found = self.get_if_there(reference, what, path, accept, read, false);
        // Without `absent_ok` a 404 is an error already; None cannot come back.
        found.await?.ok_or_else(|| {
            super::ClientError::registry(
                reference.registry(),
                super::RegistryError::NotFound {
                    what: what.to_string(),
                    reference: reference.to_string(),
                },
            )
        })
    }

    /// As [`Registry::get`], with `absent_ok` a 404 answer is `None`.
    pub(super) async fn get_if_there<T, F, Fut>(
        &self,
        reference: &Reference,
        what: &str,
        path: &str,
        accept: &str,
        read: F,
        absent_ok: bool,
    ) -> Result<Option<T>>
    where
        F: Fn(reqwest::Response) -> Fut,
        Fut: Future<Output = std::result::Result<T, Attempt>>,
    {
        let started = tokio::time::Instant::now();
        let failed = |attempt| registry_error(reference, what, attempt, 1);
        if let Some(first) = self
            .first_read(reference, path, accept)
            .await
            .map_err(failed)?
        {
            let status = first.status();
            if status.is_success() {
                let left = self.deadline.saturating_sub(started.elapsed());
                let read = tokio::time::timeout(left, read(first)).await;
                match read.unwrap_or_else(|_| Err(Attempt::timed_out(self.deadline))) {
                    Ok(value) => return Ok(Some(value)),
                    // A body cut short is asked for again below, as any failed read.
                    Err(attempt) if matches!(attempt.failure, Failure::Transient(_)) => {}
                    Err(attempt) => return Err(failed(attempt)),
                }
            } else if absent_ok && status == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
        }
        let (base, client) = self.base(reference).await;
        let url = format!("{base}/v2/{}/{path}", reference.repository());
        let (url, read) = (&url, &read);
        self.authorized(reference, what, self.deadline, |auth, _| async move {
            let request = client.get(url).header(reqwest::header::ACCEPT, accept);
            let response = with_auth(request, &auth).send().await?;
            let status = response.status();
            if absent_ok && status == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !status.is_success() {
                let body = error_text(response).await;
                return Err(Attempt::answered(status.as_u16(), url, refusal(&body)));
            }
            read(response).await.map(Some)
        })
        .await
    }
}

/// Why a plain read proved nothing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PlainMiss {
    /// Nothing came back at all (refused, reset): no `/v2/` ping can do better.
    Unanswered,
    /// Another answer: a TLS server answers a plain request with 400.
    NotARegistry,
    /// The connection was taken, and no answer came within the deadline.
    Silent,
}

/// `request` with the run's credentials or token; an empty bearer (see
/// [`Registry::send_empty_bearer`]) sends none.
pub(super) fn with_auth(
    request: reqwest::RequestBuilder,
    auth: &RegistryAuth,
) -> reqwest::RequestBuilder {
    match auth {
        RegistryAuth::Basic(user, password) => request.basic_auth(user, Some(password)),
        RegistryAuth::Bearer(token) if !token.is_empty() => request.bearer_auth(token),
        _ => request,
    }
}

/// What a registry said when it refused: the OCI error envelope's codes and messages
/// (`MANIFEST_UNKNOWN: manifest unknown`), else the start of its body.
pub(super) fn refusal(body: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<OciError>,
    }
    #[derive(serde::Deserialize)]
    struct OciError {
        code: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<Envelope>(body) {
        Ok(envelope) if !envelope.errors.is_empty() => envelope
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; "),
        _ => one_line(&body.chars().take(200).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_worded_from_the_error_envelope() {
        let body = r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"v9"}}]}"#;
        assert_eq!(refusal(body), "MANIFEST_UNKNOWN: manifest unknown");
        assert_eq!(refusal("404 page not found\n"), "404 page not found");
    }
}

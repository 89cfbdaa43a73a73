//! Podman's own API beside its Docker-compatible one, for what the compatible one cannot
//! say: a pull from a registry reached over plain HTTP (`tlsVerify=false`), which
//! Podman's `/images/create` tries over HTTPS and fails.

use crate::base::platform::Platform;
use crate::docker::endpoint::Endpoint;
use crate::registry::credentials::Credential;
use base64::Engine as _;
use http_body_util::BodyExt;

/// libpod's routes carry a version (Podman 4.3 answers 404 without one); 4.0.0 is the
/// oldest every Podman 4 and 5 serves.
const LIBPOD_API: &str = "/v4.0.0/libpod";

/// Longest answer a pull may stream back (progress lines, then the image ID or an error).
const PULL_ANSWER_LIMIT: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LibpodError {
    #[error("Podman at {endpoint}: {message}")]
    Transport { endpoint: String, message: String },
    #[error("Podman at {endpoint} could not pull {reference}: {message}")]
    Pull {
        endpoint: String,
        reference: String,
        message: String,
    },
}

/// How a pull reaches the registry.
pub struct PullAccess {
    /// False for a registry polyarch reaches over plain HTTP (loopback, or configured so).
    pub tls_verify: bool,
    pub credential: Option<Credential>,
}

/// Pulls `reference` (by digest) for `platform` into Podman's storage.
pub async fn pull(
    endpoint: &Endpoint,
    reference: &str,
    platform: &Platform,
    access: &PullAccess,
) -> Result<(), LibpodError> {
    let transport = |message: String| LibpodError::Transport {
        endpoint: endpoint.name.clone(),
        message,
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("reference", reference)
        .append_pair("os", &platform.os)
        .append_pair("arch", &platform.architecture)
        .append_pair(
            "tlsVerify",
            if access.tls_verify { "true" } else { "false" },
        )
        .append_pair("quiet", "true");
    if let Some(variant) = &platform.variant {
        query.append_pair("variant", variant);
    }
    let mut request = http::Request::post(format!("{LIBPOD_API}/images/pull?{}", query.finish()))
        .header(http::header::HOST, "d");
    if let Some(credential) = &access.credential {
        request = request.header("X-Registry-Auth", registry_auth(credential));
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| transport(e.to_string()))?;
    let stream = endpoint
        .connect()
        .await
        .map_err(|e| transport(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| transport(e.to_string()))?;
    let connection = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), PULL_ANSWER_LIMIT)
        .collect()
        .await
        .map_err(|e| transport(format!("reading the pull's answer: {e}")))?
        .to_bytes();
    connection.abort();
    let refused = |message: String| LibpodError::Pull {
        endpoint: endpoint.name.clone(),
        reference: reference.to_string(),
        message: crate::base::text::printable(&message).into_owned(),
    };
    match pull_error(status, &body) {
        Some(message) => Err(refused(message)),
        None => Ok(()),
    }
}

/// Podman answers a pull with JSON lines; one with `error` (or a non-2xx status whose body
/// says `message`) is the failure.
fn pull_error(status: http::StatusCode, body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let said = |key: &str| {
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|value| value.get(key)?.as_str().map(str::to_string))
            .filter(|message| !message.is_empty())
    };
    match status.is_success() {
        true => said("error"),
        false => Some(
            said("message")
                .or_else(|| said("cause"))
                .unwrap_or_else(|| format!("HTTP {status}")),
        ),
    }
}

/// The `X-Registry-Auth` header value the Docker API (and Podman's) takes: base64url of a
/// JSON auth config.
fn registry_auth(credential: &Credential) -> String {
    let json = match credential {
        Credential::Basic { username, password } => {
            serde_json::json!({"username": username, "password": password})
        }
        Credential::IdentityToken(token) => serde_json::json!({"identitytoken": token}),
    };
    base64::engine::general_purpose::URL_SAFE.encode(json.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_fails_on_an_error_line_or_a_refusing_status() {
        let ok = b"{\"stream\":\"Trying to pull\"}\n{\"images\":[\"abc\"],\"id\":\"abc\"}\n";
        assert_eq!(pull_error(http::StatusCode::OK, ok), None);
        let failed = b"{\"stream\":\"Trying\"}\n{\"error\":\"http: server gave HTTP response to HTTPS client\"}\n";
        assert_eq!(
            pull_error(http::StatusCode::OK, failed).as_deref(),
            Some("http: server gave HTTP response to HTTPS client")
        );
        let refused = b"{\"cause\":\"manifest unknown\",\"message\":\"pulling x: manifest unknown\",\"response\":500}";
        assert_eq!(
            pull_error(http::StatusCode::INTERNAL_SERVER_ERROR, refused).as_deref(),
            Some("pulling x: manifest unknown")
        );
        assert_eq!(
            pull_error(http::StatusCode::NOT_FOUND, b"\xff garbage").as_deref(),
            Some("HTTP 404 Not Found")
        );
    }

    #[test]
    fn credentials_go_as_the_docker_apis_auth_header() {
        let header = registry_auth(&Credential::Basic {
            username: "u".into(),
            password: "p/+".into(),
        });
        let json = base64::engine::general_purpose::URL_SAFE
            .decode(header)
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["username"], "u");
        assert_eq!(value["password"], "p/+");
    }
}

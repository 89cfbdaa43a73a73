//! Podman's own API beside its Docker-compatible one, for what the compatible one cannot
//! say: a pull from a registry reached over plain HTTP (`tlsVerify=false`), which
//! Podman's `/images/create` tries over HTTPS and fails; one build for all of an image's
//! platforms (`/libpod/build` with `platform=` per platform); Buildah's build
//! containers, which the compatible API does not list.

use crate::base::platform::Platform;
use crate::docker::endpoint::Endpoint;
use crate::registry::credentials::Credential;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;

/// libpod's routes carry a version (Podman 4.3 answers 404 without one); 4.0.0 is the
/// oldest every Podman 4 and 5 serves.
const LIBPOD_API: &str = "/v4.0.0/libpod";

/// Longest answer a pull may stream back (progress lines, then the image ID or an error).
const PULL_ANSWER_LIMIT: usize = 1 << 20;

/// Longest answer of the small JSON calls (container lists, removals).
const SMALL_ANSWER_LIMIT: usize = 8 << 20;

/// Longest line of a build's answer: Buildah writes a RUN step's output line by line.
const BUILD_LINE_LIMIT: usize = 1 << 20;

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
    #[error("Podman at {endpoint} refused {what}: {message}")]
    Refused {
        endpoint: String,
        what: String,
        message: String,
    },
}

/// The connection a request went over; dropping it closes the connection, which is how
/// libpod is told its client went away (a build then stops after its current step).
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// libpod's answer: its status and its body, read while the connection stays open.
struct Answer {
    status: http::StatusCode,
    body: hyper::body::Incoming,
    _connection: Connection,
}

fn transport(endpoint: &Endpoint) -> impl Fn(String) -> LibpodError + '_ {
    move |message| LibpodError::Transport {
        endpoint: endpoint.name.clone(),
        message,
    }
}

/// Sends `request` over a connection of its own.
async fn send<B>(endpoint: &Endpoint, request: http::Request<B>) -> Result<Answer, LibpodError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let transport = transport(endpoint);
    let stream = endpoint
        .connect()
        .await
        .map_err(|e| transport(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| transport(e.to_string()))?;
    let connection = Connection(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let status = response.status();
    Ok(Answer {
        status,
        body: response.into_body(),
        _connection: connection,
    })
}

/// A bodiless request to libpod's `path` (query included).
fn bare(method: http::Method, path: &str) -> http::Request<http_body_util::Empty<Bytes>> {
    http::Request::builder()
        .method(method)
        .uri(format!("{LIBPOD_API}{path}"))
        .header(http::header::HOST, "d")
        .body(http_body_util::Empty::new())
        .expect("a valid libpod request")
}

/// The whole body of `answer`, up to `limit` bytes.
async fn read_all(
    endpoint: &Endpoint,
    answer: Answer,
    limit: usize,
) -> Result<(http::StatusCode, Bytes), LibpodError> {
    let status = answer.status;
    let body = http_body_util::Limited::new(answer.body, limit)
        .collect()
        .await
        .map_err(|e| transport(endpoint)(format!("reading the answer: {e}")))?
        .to_bytes();
    Ok((status, body))
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
    let transport = transport(endpoint);
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
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| transport(e.to_string()))?;
    let answer = send(endpoint, request).await?;
    let (status, body) = read_all(endpoint, answer, PULL_ANSWER_LIMIT).await?;
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

/// One line of a build's answer: output, or the build's failure.
#[derive(Debug, Default, serde::Deserialize)]
pub struct BuildLine {
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A build under way: its answer, line by line. Dropping it closes the connection.
pub struct Build {
    endpoint: Endpoint,
    answer: Answer,
    pending: Vec<u8>,
    ended: bool,
}

impl Build {
    /// The next line of the answer; None at its end.
    pub async fn next_line(&mut self) -> Option<Result<BuildLine, LibpodError>> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                match parse_build_line(&line) {
                    Some(parsed) => return Some(Ok(parsed)),
                    None => continue,
                }
            }
            if self.ended {
                let rest = std::mem::take(&mut self.pending);
                return parse_build_line(&rest).map(Ok);
            }
            if self.pending.len() > BUILD_LINE_LIMIT {
                self.ended = true;
                return Some(Err(transport(&self.endpoint)(format!(
                    "a line of the build's answer is longer than {BUILD_LINE_LIMIT} bytes"
                ))));
            }
            match self.answer.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(transport(&self.endpoint)(format!(
                        "reading the build's answer: {e}"
                    ))));
                }
                None => self.ended = true,
            }
        }
    }
}

/// A JSON line of a build's answer; None for a blank one. A line that is not JSON is
/// output as it is.
fn parse_build_line(line: &[u8]) -> Option<BuildLine> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    Some(serde_json::from_str(text).unwrap_or_else(|_| BuildLine {
        stream: Some(text.to_string()),
        error: None,
    }))
}

/// Starts `POST /libpod/build?{query}` with `context` (a tar) as its body and, when given,
/// `registry_config` as `X-Registry-Config` (what its base images are pulled with).
pub async fn build(
    endpoint: &Endpoint,
    query: &str,
    registry_config: Option<String>,
    context: impl futures_util::Stream<Item = Bytes> + Send + 'static,
) -> Result<Build, LibpodError> {
    use futures_util::StreamExt;
    let body = http_body_util::StreamBody::new(
        context.map(|chunk| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk))),
    );
    let mut request = http::Request::post(format!("{LIBPOD_API}/build?{query}"))
        .header(http::header::HOST, "d")
        .header(http::header::CONTENT_TYPE, "application/x-tar");
    if let Some(config) = registry_config {
        request = request.header("X-Registry-Config", config);
    }
    let request = request
        .body(body)
        .map_err(|e| transport(endpoint)(e.to_string()))?;
    let answer = send(endpoint, request).await?;
    if !answer.status.is_success() {
        let (status, body) = read_all(endpoint, answer, SMALL_ANSWER_LIMIT).await?;
        return Err(LibpodError::Refused {
            endpoint: endpoint.name.clone(),
            what: "the build".into(),
            message: answer_message(status, &body),
        });
    }
    Ok(Build {
        endpoint: endpoint.clone(),
        answer,
        pending: Vec::new(),
        ended: false,
    })
}

/// The `X-Registry-Config` value: base64url of the JSON map of registry to credentials,
/// as the Docker API's build takes it and libpod's reads it.
pub fn registry_config<T: serde::Serialize>(config: &T) -> String {
    let json = serde_json::to_vec(config).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE.encode(json)
}

/// A container Buildah made for a build (`podman ps --external`): not Podman's own, so
/// the compatible API does not list it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct BuildContainer {
    #[serde(rename = "Id")]
    pub id: String,
    /// The image its stage is FROM, as the Dockerfile names it (`scratch` for none).
    #[serde(rename = "Image", default)]
    pub image: String,
}

/// Buildah's build containers on the engine now.
pub async fn build_containers(endpoint: &Endpoint) -> Result<Vec<BuildContainer>, LibpodError> {
    #[derive(serde::Deserialize)]
    struct Listed {
        #[serde(flatten)]
        container: BuildContainer,
        #[serde(rename = "State", default)]
        state: String,
        #[serde(rename = "Command", default)]
        command: Option<Vec<String>>,
    }
    let answer = send(
        endpoint,
        bare(http::Method::GET, "/containers/json?all=true&external=true"),
    )
    .await?;
    let (status, body) = read_all(endpoint, answer, SMALL_ANSWER_LIMIT).await?;
    if !status.is_success() {
        return Err(LibpodError::Refused {
            endpoint: endpoint.name.clone(),
            what: "listing containers".into(),
            message: answer_message(status, &body),
        });
    }
    let listed: Vec<Listed> = serde_json::from_slice(&body)
        .map_err(|e| transport(endpoint)(format!("listing containers: {e}")))?;
    Ok(listed
        .into_iter()
        // Buildah's containers live in storage only and run the command `buildah`.
        .filter(|c| {
            c.state == "storage" || c.command.as_deref() == Some(&["buildah".to_string()][..])
        })
        .map(|c| c.container)
        .collect())
}

/// Removes a build container from storage; true once it is gone. Its step's process, if
/// one runs, runs on to its end (Podman 4.3 cannot stop it), but the build can no longer
/// commit from it.
pub async fn remove_container(endpoint: &Endpoint, id: &str) -> bool {
    let path = format!("/containers/{id}?force=true");
    match send(endpoint, bare(http::Method::DELETE, &path)).await {
        Ok(answer) => answer.status.is_success() || answer.status == http::StatusCode::NOT_FOUND,
        Err(_) => false,
    }
}

/// libpod's words for a refusal: its JSON `message` (or `cause`), else the status.
fn answer_message(status: http::StatusCode, body: &[u8]) -> String {
    let said = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            ["message", "cause"]
                .iter()
                .find_map(|k| v.get(*k)?.as_str().map(str::to_string))
        });
    crate::base::text::printable(&said.unwrap_or_else(|| format!("HTTP {status}"))).into_owned()
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

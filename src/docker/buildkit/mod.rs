//! Builds through BuildKit's own protocol on the engine, as buildx's `docker` driver does:
//! the control API over `POST /grpc` and a session over `POST /session`, both upgraded to
//! h2c, in which polyarch serves the context by file sync, registry credentials, secrets
//! and SSH agents.

mod connection;
pub mod daemon;
pub mod filesync;
pub mod secrets;
pub mod session;
mod session_stream;
pub mod ssh;

use crate::docker::endpoint::Endpoint;
use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::buildkit::v1::{
    CacheOptions, CacheOptionsEntry, SolveRequest, SolveResponse, StatusRequest, StatusResponse,
};
use filesync::{SyncedDirs, Transfer};
use secrets::SecretStore;
pub use session::SessionAuth;
use session::{Services, Session};
use ssh::SshAgents;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;

/// Why a solve did not produce an image.
#[derive(Debug, thiserror::Error)]
pub enum SolveError {
    /// The engine could not be reached, or refused the session or control connection.
    #[error("cannot open a BuildKit session on {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    /// The connection to the engine failed or closed under the build (the engine was
    /// stopped, the network dropped): gRPC `Unavailable` or `Cancelled`, or a transport
    /// error from the client's side.
    #[error("{0}")]
    Lost(String),
    /// BuildKit ran the build and it failed (its message, e.g. a RUN step's exit code).
    #[error("{0}")]
    Failed(String),
    /// A registry refused the engine for want of credentials: a base image's pull, or a
    /// cache's import or export.
    #[error("{message}; {registry} wants credentials the engine was not given: log in with `docker login {registry}` (polyarch passes on what the Docker config and its credential helpers hold), or pass --username/--password-stdin when it is the registry the image is pushed to")]
    Unauthorized { message: String, registry: String },
}

impl SolveError {
    /// A failed solve: the engine's own answer carries no source, while a connection that
    /// broke does (hyper, h2 or I/O), and a dead engine ends streams `Unavailable` or
    /// `Cancelled`.
    fn from_status(status: tonic::Status) -> SolveError {
        use std::error::Error as _;
        let message = status.message().to_string();
        // The transport's causes, each once: tonic's "transport error" wraps hyper's.
        let lost = |message: String| {
            let mut said = vec![message];
            let mut cause = status.source();
            while let Some(error) = cause {
                let text = error.to_string();
                if !said.contains(&text) {
                    said.push(text);
                }
                cause = error.source();
            }
            SolveError::Lost(said.join(": "))
        };
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled => lost(message),
            _ if status.source().is_some() => lost(message),
            _ => SolveError::failed(message),
        }
    }

    /// BuildKit's failure, with the fix when a registry refused it credentials. BuildKit
    /// 0.8 says "pulling from host HOST failed … 401 Unauthorized", 0.13 "… request to
    /// http://HOST/v2/…: 401 Unauthorized".
    fn failed(message: String) -> SolveError {
        if !message.contains("401 Unauthorized") {
            return SolveError::Failed(message);
        }
        let host = |after: &str| {
            message.split_once(after).and_then(|(_, rest)| {
                rest.split(['/', ' '])
                    .next()
                    .filter(|h| !h.is_empty())
                    .map(str::to_string)
            })
        };
        match host("from host ").or_else(|| host("://")) {
            Some(registry) => SolveError::Unauthorized { message, registry },
            None => SolveError::Failed(message),
        }
    }
}

/// One exporter of the solve: BuildKit's type name and its attributes.
pub struct Exporter {
    pub kind: String,
    pub attrs: HashMap<String, String>,
    /// Where the session writes the file the exporter sends back (the `oci` exporter's
    /// layout tar); None for exporters that keep or push the image themselves.
    pub file: Option<std::path::PathBuf>,
}

/// A Dockerfile build for BuildKit's `dockerfile.v0` frontend.
pub struct DockerfileBuild<'a> {
    pub context: &'a Path,
    /// Relative to `context`.
    pub dockerfile: &'a Path,
    /// Named contexts' directories, served by these names (`context:NAME=local:NAME`).
    pub named_dirs: Vec<(String, &'a Path)>,
    /// Frontend attributes besides `filename` (platform, target, `build-arg:*`, …).
    pub frontend_attrs: HashMap<String, String>,
    pub entitlements: Vec<String>,
    pub exporter: Exporter,
    /// Secrets the build may mount, served through the session.
    pub secrets: SecretStore,
    /// SSH agents the build may use, served through the session.
    pub ssh: SshAgents,
    /// Registry cache references to import (`--cache-from`).
    pub cache_from: Vec<String>,
    /// A registry cache reference to export to (`--cache-to`), with every intermediate
    /// layer (`mode=max`).
    pub cache_to: Option<String>,
    /// Recorded in BuildKit's build history; otherwise the solve is marked internal, as
    /// buildx marks its own helper solves, and BuildKit writes no record.
    pub history: bool,
    /// Told the hash of each context file sent, for the replay after the build.
    pub hashes: Option<filesync::SharedHashes>,
}

/// A finished solve.
pub struct Solved {
    /// The exporter's answer: image digests and names.
    pub exporter_response: HashMap<String, String>,
    /// What BuildKit read through the session's file sync.
    pub transfers: Vec<Transfer>,
}

/// Runs `build` on the engine at `endpoint`. Status updates go to `on_status` as they
/// come. Dropping the returned future cancels the build in the engine.
pub async fn solve(
    endpoint: &Endpoint,
    build: DockerfileBuild<'_>,
    auth: SessionAuth,
    on_status: impl FnMut(StatusResponse) + Send,
) -> Result<Solved, SolveError> {
    solve_on(Target::Engine(endpoint), build, auth, on_status).await
}

/// Where a solve runs: an engine's BuildKit (`/grpc` and `/session` upgrades) or a
/// standalone daemon (plain gRPC, the session through `Control/Session`).
#[derive(Clone, Copy)]
pub enum Target<'a> {
    Engine(&'a Endpoint),
    Daemon(&'a daemon::Daemon),
}

/// Runs `build` on `target`, as [`solve`] does on an engine.
pub async fn solve_on(
    target: Target<'_>,
    build: DockerfileBuild<'_>,
    auth: SessionAuth,
    on_status: impl FnMut(StatusResponse) + Send,
) -> Result<Solved, SolveError> {
    let endpoint = match target {
        Target::Engine(endpoint) => endpoint,
        Target::Daemon(daemon) => &daemon.endpoint,
    };
    let connect = |source: std::io::Error| SolveError::Connect {
        endpoint: endpoint.name.clone(),
        source,
    };
    let (dirs, filename) = synced_dirs(build.context, build.dockerfile, &build.named_dirs);
    let dirs = dirs.with_hashes(build.hashes);
    let services = Services {
        dirs: dirs.clone(),
        auth,
        secrets: build.secrets,
        ssh: build.ssh,
        file_to: build.exporter.file,
    };
    let key = shared_key(build.context);
    let (session, control) = match target {
        Target::Engine(endpoint) => {
            let session = Session::start(endpoint, &key, services)
                .await
                .map_err(connect)?;
            (session, control_client(endpoint).await.map_err(connect)?)
        }
        Target::Daemon(daemon) => {
            let session = Session::attach(daemon.control(), &key, services)
                .await
                .map_err(connect)?;
            (session, daemon.control())
        }
    };

    let build_ref = uuid::Uuid::new_v4().simple().to_string();
    let mut frontend_attrs = build.frontend_attrs;
    frontend_attrs.insert("filename".into(), filename);
    let cache = registry_cache(build.cache_from, build.cache_to);
    if !cache.imports.is_empty() {
        // The Dockerfile frontend solves with the imports it is given in this attribute,
        // as BuildKit's client sends them; the request's own list serves the final solve.
        frontend_attrs.insert("cache-imports".into(), cache_imports_attr(&cache.imports));
    }
    let request = SolveRequest {
        r#ref: build_ref,
        session: session.id.clone(),
        frontend: "dockerfile.v0".into(),
        frontend_attrs,
        entitlements: build.entitlements,
        // The single-exporter fields: the only ones Docker 20.10's BuildKit reads, and
        // still honoured by current ones.
        exporter_deprecated: build.exporter.kind,
        exporter_attrs_deprecated: build.exporter.attrs,
        // Exports and Imports: read since BuildKit 0.4, so by Docker 20.10's 0.8 too.
        cache: Some(cache),
        // Unknown to BuildKit before 0.11 (Docker 20.10's 0.8), which records nothing.
        internal: !build.history,
        ..Default::default()
    };

    let solved = solve_with_status(control, request, on_status).await;
    drop(session);
    match solved {
        Ok(response) => Ok(Solved {
            exporter_response: response.into_inner().exporter_response,
            transfers: dirs.transfers(),
        }),
        Err(status) => Err(SolveError::from_status(status)),
    }
}

/// The directories the session serves: the context, the Dockerfile's own as
/// `dockerfile`, and the named contexts' by their names; the Dockerfile's name in the
/// second. BuildKit's frontend reads each named directory's own `.dockerignore` through
/// the session and sends its patterns with the transfer, as for the context.
fn synced_dirs(
    context: &Path,
    dockerfile: &Path,
    named: &[(String, &Path)],
) -> (SyncedDirs, String) {
    let full = context.join(dockerfile);
    let dockerfile_dir = full.parent().unwrap_or(context).to_path_buf();
    let filename = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "Dockerfile".into());
    let dirs = named.iter().fold(
        SyncedDirs::new()
            .with_dir("context", context)
            .with_dir("dockerfile", dockerfile_dir),
        |dirs, (name, dir)| dirs.with_dir(name, dir),
    );
    (dirs, filename)
}

/// Runs the solve `request` on `control`, its status updates going to `on_status`;
/// BuildKit's answer.
async fn solve_with_status(
    control: ControlClient<Channel>,
    request: SolveRequest,
    mut on_status: impl FnMut(StatusResponse) + Send,
) -> Result<tonic::Response<SolveResponse>, tonic::Status> {
    let mut status_client = control.clone();
    let build_ref = request.r#ref.clone();
    let status = async move {
        let mut stream = status_client
            .status(StatusRequest { r#ref: build_ref })
            .await?
            .into_inner();
        while let Some(update) = stream.message().await? {
            on_status(update);
        }
        Ok::<_, tonic::Status>(())
    };
    let mut solve_client = control;
    let solve = solve_client.solve(request);
    tokio::pin!(status, solve);
    tokio::select! {
        solved = &mut solve => {
            // The last status updates (the failing step's log) follow the solve's answer
            // closely; a build that failed before it began has a status stream that never ends.
            let _ = tokio::time::timeout(Duration::from_secs(2), status).await;
            solved
        }
        // The status stream ending early is no failure; the solve decides.
        _ = &mut status => solve.await,
    }
}

/// Registry cache imports and export, as `--cache-from`/`--cache-to type=registry` give them.
fn registry_cache(from: Vec<String>, to: Option<String>) -> CacheOptions {
    let entry = |attrs: HashMap<String, String>| CacheOptionsEntry {
        r#type: "registry".into(),
        attrs,
    };
    CacheOptions {
        imports: from
            .into_iter()
            .map(|reference| entry(HashMap::from([("ref".to_string(), reference)])))
            .collect(),
        exports: to
            .into_iter()
            .map(|reference| {
                entry(HashMap::from([
                    ("ref".to_string(), reference),
                    ("mode".to_string(), "max".to_string()),
                ]))
            })
            .collect(),
        ..Default::default()
    }
}

/// The `cache-imports` frontend attribute: the entries as JSON, with the field names
/// BuildKit's Go structs marshal (`Type`, `Attrs`).
fn cache_imports_attr(imports: &[CacheOptionsEntry]) -> String {
    let entries: Vec<serde_json::Value> = imports
        .iter()
        .map(|e| serde_json::json!({"Type": e.r#type, "Attrs": e.attrs}))
        .collect();
    serde_json::Value::Array(entries).to_string()
}

/// BuildKit's control API on a connection of its own.
async fn control_client(endpoint: &Endpoint) -> std::io::Result<ControlClient<Channel>> {
    let endpoint_owned = endpoint.clone();
    let connector = tower::service_fn(move |_: http::Uri| {
        let endpoint = endpoint_owned.clone();
        async move { connection::upgrade(&endpoint, "/grpc", &[]).await }
    });
    let channel = tonic::transport::Endpoint::from_static("http://docker.buildkit")
        .connect_with_connector(connector)
        .await
        .map_err(std::io::Error::other)?;
    // Status updates of a big build can exceed tonic's 4 MiB default.
    Ok(ControlClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
}

/// Whether BuildKit answers on the engine: its control API's `/grpc` upgrade is accepted
/// (over the same transport a build uses).
pub async fn reachable(endpoint: &Endpoint) -> std::io::Result<()> {
    connection::upgrade(endpoint, "/grpc", &[]).await.map(drop)
}

/// The same context directory gets the same key, so the engine's copy of what it was
/// sent last time is reused and only changes travel.
fn shared_key(context: &Path) -> String {
    use sha2::Digest;
    let canonical = context
        .canonicalize()
        .unwrap_or_else(|_| context.to_path_buf());
    hex::encode(sha2::Sha256::digest(canonical.to_string_lossy().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unauthorized_registry_is_named_with_the_fix() {
        let old = "failed to solve with frontend dockerfile.v0: failed to create LLB definition: pulling from host 127.0.0.1:42013 failed with status code [manifests v1]: 401 Unauthorized";
        let new = "127.0.0.1:36047/base:v1: failed to resolve source metadata for 127.0.0.1:36047/base:v1: unexpected status from HEAD request to http://127.0.0.1:36047/v2/base/manifests/v1: 401 Unauthorized";
        for (message, host) in [(old, "127.0.0.1:42013"), (new, "127.0.0.1:36047")] {
            let shown = SolveError::failed(message.into()).to_string();
            assert!(shown.starts_with(message), "{shown}");
            assert!(shown.contains(&format!("docker login {host}`")), "{shown}");
        }
        let other = SolveError::failed("process exited with 1".into()).to_string();
        assert_eq!(other, "process exited with 1");
    }

    #[test]
    fn a_broken_connection_is_lost_and_buildkits_own_answer_a_failure() {
        let lost =
            |status: tonic::Status| matches!(SolveError::from_status(status), SolveError::Lost(_));
        assert!(lost(tonic::Status::unavailable("connection refused")));
        assert!(lost(tonic::Status::cancelled("context canceled")));
        // A client-side transport error keeps its cause, said once.
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed connection",
        )));
        match SolveError::from_status(broken) {
            SolveError::Lost(message) => {
                assert_eq!(
                    message.matches("peer closed connection").count(),
                    1,
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A failing step, as BuildKit answers it: no transport cause.
        let step = tonic::Status::unknown(
            "process \"/bin/sh -c false\" did not complete successfully: exit code: 1",
        );
        assert!(matches!(
            SolveError::from_status(step),
            SolveError::Failed(_)
        ));
    }
}

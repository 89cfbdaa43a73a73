//! Builds through BuildKit's own protocol on the engine, as buildx's `docker` driver does:
//! the control API over `POST /grpc` and a session over `POST /session`, both upgraded to
//! h2c, in which polyarch serves the context by file sync.

mod connection;
pub mod filesync;
mod session;

use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::buildkit::v1::{SolveRequest, StatusRequest, StatusResponse};
use filesync::{SyncedDirs, Transfer};
use session::Session;
pub use session::SessionAuth;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

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
    /// BuildKit ran the build and it failed (its message, e.g. a RUN step's exit code).
    #[error("{0}")]
    Failed(String),
}

/// One exporter of the solve: BuildKit's type name and its attributes.
pub struct Exporter {
    pub kind: String,
    pub attrs: HashMap<String, String>,
}

/// A Dockerfile build for BuildKit's `dockerfile.v0` frontend.
pub struct DockerfileBuild<'a> {
    pub context: &'a Path,
    /// Relative to `context`.
    pub dockerfile: &'a Path,
    /// Frontend attributes besides `filename` (platform, target, `build-arg:*`, …).
    pub frontend_attrs: HashMap<String, String>,
    pub entitlements: Vec<String>,
    pub exporter: Exporter,
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
    endpoint: &str,
    build: DockerfileBuild<'_>,
    auth: SessionAuth,
    mut on_status: impl FnMut(StatusResponse) + Send,
) -> Result<Solved, SolveError> {
    let connect = |source: std::io::Error| SolveError::Connect {
        endpoint: endpoint.to_string(),
        source,
    };
    let full = build.context.join(build.dockerfile);
    let dockerfile_dir = full.parent().unwrap_or(build.context).to_path_buf();
    let filename = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "Dockerfile".into());
    let dirs = SyncedDirs::new()
        .with_dir("context", build.context)
        .with_dir("dockerfile", dockerfile_dir);
    let session = Session::start(endpoint, &shared_key(build.context), dirs.clone(), auth)
        .await
        .map_err(connect)?;
    let control = control_client(endpoint).await.map_err(connect)?;

    let build_ref = uuid::Uuid::new_v4().simple().to_string();
    let mut frontend_attrs = build.frontend_attrs;
    frontend_attrs.insert("filename".into(), filename);
    let request = SolveRequest {
        r#ref: build_ref.clone(),
        session: session.id.clone(),
        frontend: "dockerfile.v0".into(),
        frontend_attrs,
        entitlements: build.entitlements,
        // The single-exporter fields: the only ones Docker 20.10's BuildKit reads, and
        // still honoured by current ones.
        exporter_deprecated: build.exporter.kind,
        exporter_attrs_deprecated: build.exporter.attrs,
        ..Default::default()
    };

    let mut status_client = control.clone();
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
    let solved = tokio::select! {
        solved = &mut solve => {
            // The last status updates (the failing step's log) follow the solve's answer
            // closely; a build that failed before it began has a status stream that never ends.
            let _ = tokio::time::timeout(Duration::from_secs(2), status).await;
            solved
        }
        // The status stream ending early is no failure; the solve decides.
        _ = &mut status => solve.await,
    };
    drop(session);
    match solved {
        Ok(response) => Ok(Solved {
            exporter_response: response.into_inner().exporter_response,
            transfers: dirs.transfers(),
        }),
        Err(status) => Err(SolveError::Failed(status.message().to_string())),
    }
}

/// BuildKit's control API on a connection of its own.
async fn control_client(endpoint: &str) -> std::io::Result<ControlClient<Channel>> {
    let endpoint_owned = endpoint.to_string();
    let connector = tower::service_fn(move |_: http::Uri| {
        let endpoint = endpoint_owned.clone();
        async move { connection::upgrade(&endpoint, "/grpc", &[]).await }
    });
    let channel = Endpoint::from_static("http://docker.buildkit")
        .connect_with_connector(connector)
        .await
        .map_err(std::io::Error::other)?;
    // Status updates of a big build can exceed tonic's 4 MiB default.
    Ok(ControlClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
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

//! A BuildKit session: the engine dials back into services polyarch serves over the
//! hijacked `/session` connection (file sync for the context, registry credentials,
//! secrets, SSH agents, health), and receives what an exporter sends back (FileSend).

use super::connection;
use super::filesync::SyncedDirs;
use super::secrets::SecretStore;
use super::ssh::SshAgents;
use crate::registry::credentials::{self, Credential};
use bollard_buildkit_proto::health::health_server::{Health, HealthServer};
use bollard_buildkit_proto::health::{
    health_check_response::ServingStatus, HealthCheckRequest, HealthCheckResponse,
    HealthListRequest, HealthListResponse,
};
use bollard_buildkit_proto::moby::buildkit::secrets::v1::secrets_server::SecretsServer;
use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::filesync::v1::auth_server::{Auth, AuthServer};
use bollard_buildkit_proto::moby::filesync::v1::file_send_server::{FileSend, FileSendServer};
use bollard_buildkit_proto::moby::filesync::v1::file_sync_server::FileSyncServer;
use bollard_buildkit_proto::moby::filesync::v1::{
    BytesMessage, CredentialsRequest, CredentialsResponse, FetchTokenRequest, FetchTokenResponse,
    GetTokenAuthorityRequest, GetTokenAuthorityResponse, VerifyTokenAuthorityRequest,
    VerifyTokenAuthorityResponse,
};
use bollard_buildkit_proto::moby::sshforward::v1::ssh_server::SshServer;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The gRPC methods the session serves; the engine calls only what is announced.
/// Secrets and SSH are always announced, so a build asking for an id it was not given
/// gets NotFound naming it (as with buildx) rather than "not implemented".
const METHODS: &[&str] = &[
    "/grpc.health.v1.Health/Check",
    "/moby.filesync.v1.FileSync/DiffCopy",
    "/moby.filesync.v1.Auth/Credentials",
    "/moby.filesync.v1.Auth/FetchToken",
    "/moby.filesync.v1.Auth/GetTokenAuthority",
    "/moby.filesync.v1.Auth/VerifyTokenAuthority",
    "/moby.buildkit.secrets.v1.Secrets/GetSecret",
    "/moby.sshforward.v1.SSH/CheckAgent",
    "/moby.sshforward.v1.SSH/ForwardAgent",
];

/// Announced only when the session takes an exporter's file: the exporter fails up front
/// ("not supported by the client") rather than sending into nothing.
const FILE_SEND: &str = "/moby.filesync.v1.FileSend/DiffCopy";

/// What a session serves besides its health.
pub struct Services {
    /// The context and Dockerfile directories.
    pub dirs: SyncedDirs,
    pub auth: SessionAuth,
    pub secrets: SecretStore,
    pub ssh: SshAgents,
    /// Where an exporter's file (the `oci` exporter's layout tar) is written.
    pub file_to: Option<PathBuf>,
}

/// A running session; dropping it ends it.
pub struct Session {
    pub id: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Session {
    /// Opens a session on the engine at `endpoint` serving `services`. `shared_key` lets
    /// the engine keep the files it was sent for the next session with the same key, so a
    /// rerun transfers only what changed.
    pub async fn start(
        endpoint: &crate::docker::endpoint::Endpoint,
        shared_key: &str,
        services: Services,
    ) -> std::io::Result<Session> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let headers = headers(&id, shared_key, services.file_to.is_some());
        let upgraded = connection::upgrade(endpoint, "/session", &headers).await?;
        Ok(Session::serve(id, TokioIo::new(upgraded), services))
    }

    /// Opens a session on a standalone daemon through its `Control/Session`.
    pub async fn attach(
        control: ControlClient<Channel>,
        shared_key: &str,
        services: Services,
    ) -> std::io::Result<Session> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let headers = headers(&id, shared_key, services.file_to.is_some());
        let stream = super::session_stream::open(control, &headers).await?;
        Ok(Session::serve(id, stream, services))
    }

    /// Serves `services` on the session's one connection `io`.
    fn serve<S>(id: String, io: S, services: Services) -> Session
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let router = tonic::transport::Server::builder()
            .add_service(HealthServer::new(Healthy))
            .add_service(FileSyncServer::new(services.dirs))
            .add_service(AuthServer::new(services.auth))
            .add_service(SecretsServer::new(services.secrets))
            .add_service(SshServer::new(services.ssh))
            .add_optional_service(
                services
                    .file_to
                    .map(|path| FileSendServer::new(FileSink(path))),
            );
        // One connection, then nothing more: the server lives as long as the session.
        let incoming = futures_util::StreamExt::chain(
            futures_util::stream::iter([Ok::<_, std::io::Error>(SessionStream(io))]),
            futures_util::stream::pending(),
        );
        let server = tokio::spawn(async move {
            // A failed session shows as the build's own error ("no active session").
            let _ = router.serve_with_incoming(incoming).await;
        });
        Session { id, server }
    }
}

/// The session's name for the daemon: headers of `/session`, metadata of
/// `Control/Session`.
fn headers(id: &str, shared_key: &str, file_send: bool) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("X-Docker-Expose-Session-Uuid", id.to_string()),
        ("X-Docker-Expose-Session-Name", "polyarch".to_string()),
        ("X-Docker-Expose-Session-Sharedkey", shared_key.to_string()),
    ];
    headers.extend(
        METHODS
            .iter()
            .chain(file_send.then_some(&FILE_SEND))
            .map(|m| ("X-Docker-Expose-Session-Grpc-Method", m.to_string())),
    );
    headers
}

/// Writes the file an exporter sends (BuildKit's `CopyFileWriter`: the bytes as
/// `BytesMessage` chunks, then the end of the stream) to its path as it comes, so memory
/// stays bounded whatever the image's size.
struct FileSink(PathBuf);

#[tonic::async_trait]
impl FileSend for FileSink {
    type DiffCopyStream = futures_util::stream::Empty<Result<BytesMessage, Status>>;

    async fn diff_copy(
        &self,
        request: Request<tonic::Streaming<BytesMessage>>,
    ) -> Result<Response<Self::DiffCopyStream>, Status> {
        let failed = |e: std::io::Error| {
            Status::internal(format!("writing {} failed: {e}", self.0.display()))
        };
        let mut chunks = request.into_inner();
        let file = tokio::fs::File::create(&self.0).await.map_err(failed)?;
        let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
        while let Some(chunk) = chunks.message().await? {
            file.write_all(&chunk.data).await.map_err(failed)?;
        }
        file.flush().await.map_err(failed)?;
        Ok(Response::new(futures_util::stream::empty()))
    }
}

/// The engine's side of the session's connection, as tonic's server wants a stream.
struct SessionStream<S>(S);

impl<S> tonic::transport::server::Connected for SessionStream<S> {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl<S: AsyncRead + Unpin> AsyncRead for SessionStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SessionStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// BuildKit checks the session's health and drops it when unanswered.
struct Healthy;

#[tonic::async_trait]
impl Health for Healthy {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    async fn list(
        &self,
        _: Request<HealthListRequest>,
    ) -> Result<Response<HealthListResponse>, Status> {
        Err(Status::unimplemented("list"))
    }

    type WatchStream = futures_util::stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

/// Registry credentials for the engine's pulls (base images, cache imports) and pushes
/// (cache exports), as the Docker CLI gives them: the command line's credentials for the
/// registry polyarch pushes the image to, else the Docker config and its helpers.
#[derive(Default)]
pub struct SessionAuth {
    /// The push registry's host and the `--username/--password-stdin` credentials.
    pub push: Option<(String, Credential)>,
}

#[tonic::async_trait]
impl Auth for SessionAuth {
    async fn credentials(
        &self,
        request: Request<CredentialsRequest>,
    ) -> Result<Response<CredentialsResponse>, Status> {
        let host = request.into_inner().host;
        // BuildKit names Docker Hub by its API host; normalize_key maps it to docker.io.
        let registry = credentials::normalize_key(&host);
        let given = self
            .push
            .as_ref()
            .filter(|(push_host, _)| credentials::normalize_key(push_host) == registry)
            .map(|(_, credential)| Ok(Some(credential.clone())));
        let found = given.unwrap_or_else(|| credentials::resolve(&registry, None));
        let answer = match found {
            Ok(Some(Credential::Basic { username, password })) => CredentialsResponse {
                username,
                secret: password,
            },
            Ok(Some(Credential::IdentityToken(token))) => CredentialsResponse {
                username: String::new(),
                secret: token,
            },
            // Anonymous: an unreadable config shows as the registry's own refusal.
            Ok(None) | Err(_) => CredentialsResponse::default(),
        };
        Ok(Response::new(answer))
    }

    async fn fetch_token(
        &self,
        _: Request<FetchTokenRequest>,
    ) -> Result<Response<FetchTokenResponse>, Status> {
        // BuildKit then fetches tokens itself with the credentials above.
        Err(Status::unimplemented("fetch_token"))
    }

    async fn get_token_authority(
        &self,
        _: Request<GetTokenAuthorityRequest>,
    ) -> Result<Response<GetTokenAuthorityResponse>, Status> {
        Err(Status::unimplemented("get_token_authority"))
    }

    async fn verify_token_authority(
        &self,
        _: Request<VerifyTokenAuthorityRequest>,
    ) -> Result<Response<VerifyTokenAuthorityResponse>, Status> {
        Err(Status::unimplemented("verify_token_authority"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announced(file_send: bool) -> bool {
        headers("id", "key", file_send)
            .iter()
            .any(|(name, value)| name.ends_with("Grpc-Method") && value == FILE_SEND)
    }

    #[test]
    fn file_send_is_announced_only_when_the_session_takes_a_file() {
        assert!(announced(true));
        assert!(!announced(false));
    }
}

//! Raw connections to the engine, upgraded to h2c the way the Docker CLI hijacks
//! `/grpc` and `/session`: BuildKit's protocol then runs over the upgraded stream.

use crate::docker::endpoint::Endpoint;
use hyper::upgrade::Upgraded;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite};

/// An HTTP/1.1 `POST path` with `Upgrade: h2c` (plus `headers`) on a new connection to
/// the engine at `endpoint` (whatever carries it: unix socket, TCP, TLS, ssh), answered
/// with `101`.
pub async fn upgrade(
    endpoint: &Endpoint,
    path: &str,
    headers: &[(&str, String)],
) -> io::Result<Upgraded> {
    let stream = endpoint.connect().await.map_err(io::Error::other)?;
    upgrade_over(stream, path, headers).await
}

async fn upgrade_over<S>(stream: S, path: &str, headers: &[(&str, String)]) -> io::Result<Upgraded>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
    // The connection task ends when the upgrade takes the stream over.
    tokio::spawn(connection.with_upgrades());
    let mut request = http::Request::post(path)
        .header(http::header::HOST, "docker")
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "h2c");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(io::Error::other(format!(
            "the engine answered {} to POST {path} (expected 101 Switching Protocols)",
            response.status()
        )));
    }
    hyper::upgrade::on(response).await.map_err(io::Error::other)
}

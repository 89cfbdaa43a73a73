//! A session attached the way BuildKit's own client attaches one to a standalone daemon
//! (moby/buildkit `session/grpchijack/dial.go`): `Control/Session`, a bidirectional
//! stream of `BytesMessage` carrying the session's HTTP/2 byte for byte, named by the
//! `X-Docker-Expose-Session-*` metadata that the engine's `/session` takes as headers.

use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::buildkit::v1::BytesMessage;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// How many bytes of the session may wait in either direction.
const BUFFER: usize = 256 * 1024;

/// Opens `Control/Session` with `headers` as metadata; the session's byte stream, whose
/// pumps end with it.
pub async fn open(
    mut control: ControlClient<Channel>,
    headers: &[(&str, String)],
) -> std::io::Result<DuplexStream> {
    let (to_daemon, outgoing) = tokio::sync::mpsc::channel::<BytesMessage>(16);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
    for (name, value) in headers {
        let value = MetadataValue::try_from(value.as_str()).map_err(std::io::Error::other)?;
        let name = tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(std::io::Error::other)?;
        request.metadata_mut().append(name, value);
    }
    let mut incoming = control
        .session(request)
        .await
        .map_err(std::io::Error::other)?
        .into_inner();
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    let (mut read_half, mut write_half) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = read_half.read(&mut buf).await {
            let message = BytesMessage {
                data: buf[..n].to_vec(),
            };
            if n == 0 || to_daemon.send(message).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok(Some(message)) = incoming.message().await {
            if write_half.write_all(&message.data).await.is_err() {
                break;
            }
        }
        let _ = write_half.shutdown().await;
    });
    Ok(ours)
}

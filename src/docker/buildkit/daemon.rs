//! A standalone BuildKit daemon (`buildkitd`), as buildctl and buildx's `remote` driver
//! reach one: plain gRPC on its socket (unix, or TCP with mutual TLS), no engine API and
//! no `/grpc` upgrade. The address and TLS files are an [`Endpoint`]'s, so unix, TCP,
//! TLS and ssh transports are the engines' own.

use crate::base::platform::Platform;
use crate::docker::endpoint::{Endpoint, EndpointError};
use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::buildkit::v1::{InfoRequest, ListWorkersRequest};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::Channel;

/// Why a BuildKit daemon could not be used. Each message names the daemon and the fix.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Down, unreachable, or its TLS refused (untrusted certificate, client certificate
    /// refused), as for an engine.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Nothing answers at the address.
    #[error("BuildKit daemon {daemon} is down or unreachable ({source}); start buildkitd there or correct the address (BUILDKIT_HOST, or `buildkit:` under `builders:`)")]
    Down {
        daemon: String,
        #[source]
        source: std::io::Error,
    },
    /// The daemon's workers cannot run a platform whose build RUNs something.
    #[error("BuildKit daemon {daemon} cannot run {platform} (its workers run {runs}); register QEMU for it on that host (docker run --privileged tonistiigi/binfmt --install {arch}, then restart buildkitd) or add a native daemon for {platform}")]
    Unrunnable {
        daemon: String,
        platform: Platform,
        runs: String,
        arch: String,
    },
    /// The daemon closed the connection without speaking gRPC: a plain-text client on a
    /// TLS listener, or not a BuildKit daemon at all.
    #[error("BuildKit daemon {daemon} closed the connection without answering gRPC ({reason}); if buildkitd listens there with --tlscacert, give tls: ca, cert, key (BUILDKIT_TLS_DIR, as buildctl --tlsdir); check the address")]
    NotGrpc { daemon: String, reason: String },
    /// The daemon answered, with an error.
    #[error("{daemon} refused {call}: {source}")]
    Call {
        daemon: String,
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
}

/// A connected daemon: its control API.
#[derive(Clone)]
pub struct Daemon {
    pub endpoint: Endpoint,
    control: ControlClient<Channel>,
    /// A TLS failure after the handshake, kept typed (h2 keeps only its text).
    tls_failure: TlsFailure,
}

type TlsFailure = Arc<Mutex<Option<rustls::Error>>>;

impl Daemon {
    /// Connects to the daemon at `endpoint`; connection and TLS failures come back typed
    /// (the first call tells a refused client certificate, which TLS 1.3 reports only
    /// after the handshake).
    pub async fn connect(endpoint: &Endpoint) -> Result<Daemon, DaemonError> {
        // The connector's own error, kept typed: tonic hands back only its boxed form.
        let failed: Arc<Mutex<Option<EndpointError>>> = Arc::default();
        let tls_failure = TlsFailure::default();
        let connector = {
            let endpoint = endpoint.clone();
            let failed = failed.clone();
            let tls_failure = tls_failure.clone();
            tower::service_fn(move |_: http::Uri| {
                let endpoint = endpoint.clone();
                let failed = failed.clone();
                let tls_failure = tls_failure.clone();
                async move {
                    match endpoint.connect().await {
                        Ok(inner) => Ok(hyper_util::rt::TokioIo::new(Watched {
                            inner,
                            tls_failure,
                            closed_write: None,
                        })),
                        Err(error) => {
                            let message = error.to_string();
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
                            Err(std::io::Error::other(message))
                        }
                    }
                }
            })
        };
        let channel = tonic::transport::Endpoint::from_static("http://buildkitd")
            .connect_with_connector(connector)
            .await;
        let channel = match channel {
            Ok(channel) => channel,
            Err(error) => {
                let kept = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(match kept {
                    Some(EndpointError::Down { endpoint, source }) => DaemonError::Down {
                        daemon: endpoint,
                        source,
                    },
                    Some(error) => error.into(),
                    None => DaemonError::NotGrpc {
                        daemon: endpoint.name.clone(),
                        reason: causes(&error),
                    },
                });
            }
        };
        // Status updates of a big build can exceed tonic's 4 MiB default.
        let control = ControlClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
        Ok(Daemon {
            endpoint: endpoint.clone(),
            control,
            tls_failure,
        })
    }

    /// The control API, for solves and the session.
    pub fn control(&self) -> ControlClient<Channel> {
        self.control.clone()
    }

    /// The platforms the daemon's workers can build, each once, in the daemon's order
    /// (the first worker's first platform is its native one).
    pub async fn platforms(&self) -> Result<Vec<Platform>, DaemonError> {
        let workers = self
            .control
            .clone()
            .list_workers(ListWorkersRequest::default())
            .await
            .map_err(|status| self.status_error("ListWorkers", status))?
            .into_inner()
            .record;
        let mut platforms: Vec<Platform> = Vec::new();
        for p in workers.iter().flat_map(|w| &w.platforms) {
            let variant = Some(p.variant.as_str()).filter(|v| !v.is_empty());
            let platform = Platform::new(&p.os, &p.architecture, variant);
            if !platforms.contains(&platform) {
                platforms.push(platform);
            }
        }
        Ok(platforms)
    }

    /// The daemon's BuildKit version (`v0.25.2`).
    pub async fn version(&self) -> Result<String, DaemonError> {
        let info = self
            .control
            .clone()
            .info(InfoRequest {})
            .await
            .map_err(|status| self.status_error("Info", status))?
            .into_inner();
        Ok(info.buildkit_version.map(|v| v.version).unwrap_or_default())
    }

    /// A failed call, typed by its transport cause: TLS alerts as the endpoint's TLS
    /// errors, a connection closed before any answer as not gRPC.
    pub fn status_error(&self, call: &'static str, status: tonic::Status) -> DaemonError {
        let daemon = self.endpoint.name.clone();
        let seen = self
            .tls_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tls) = seen.or_else(|| find_cause::<rustls::Error>(&status).cloned()) {
            return self.endpoint.classify_tls(tls).into();
        }
        let transport = status.code() == tonic::Code::Unavailable
            || std::error::Error::source(&status).is_some();
        if transport {
            return DaemonError::NotGrpc {
                daemon,
                reason: causes(&status),
            };
        }
        DaemonError::Call {
            daemon,
            call,
            source: status,
        }
    }
}

/// The connection to the daemon, keeping the first TLS error its reads and writes meet.
struct Watched {
    inner: crate::docker::endpoint::Stream,
    tls_failure: TlsFailure,
    /// A write that failed because the daemon closed: held back until the daemon's
    /// last words (a TLS alert) are read.
    closed_write: Option<std::io::Error>,
}

impl Watched {
    fn watch<T>(&self, result: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(error)) = &result {
            if let Some(tls) = error
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>())
            {
                let mut slot = self.tls_failure.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert_with(|| tls.clone());
            }
        }
        result
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.watch(result)
    }
}

impl Watched {
    /// A daemon refusing the client certificate sends a TLS alert and closes; a write
    /// racing the alert fails with a broken pipe before anyone reads it. Hold such a
    /// failure back until the alert (or the end) has been read, so the refusal is told
    /// by kind rather than as a bare broken pipe.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match result {
            Poll::Ready(Err(error))
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                self.closed_write = Some(error);
                self.read_last_words(cx)
            }
            other => self.watch(other),
        }
    }

    fn read_last_words<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let mut scratch = [0u8; 512];
        let mut unread = ReadBuf::new(&mut scratch);
        let read = Pin::new(&mut self.inner).poll_read(cx, &mut unread);
        match self.watch(read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Err(self
                .closed_write
                .take()
                .unwrap_or_else(|| std::io::ErrorKind::BrokenPipe.into()))),
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.closed_write.is_some() {
            return self.read_last_words(cx);
        }
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, result)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.closed_write.is_some() {
            return self.read_last_words(cx);
        }
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.after_write(cx, result)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(result)
    }
}

/// The first error of type `T` in `error`'s chain (itself included).
fn find_cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if let Some(found) = io.get_ref().and_then(|inner| inner.downcast_ref::<T>()) {
                return Some(found);
            }
        }
        cause = error.source();
    }
    None
}

/// The error and its causes, each once (tonic's "transport error" wraps hyper's).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut cause = Some(error);
    while let Some(error) = cause {
        let text = error.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        cause = error.source();
    }
    said.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_alert_is_found_inside_an_io_error_and_causes_are_said_once() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let io = std::io::Error::other(alert.clone());
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(find_cause::<rustls::Error>(&status), Some(&alert));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let status = tonic::Status::from_error(Box::new(reset));
        assert!(find_cause::<rustls::Error>(&status).is_none());
        let shown = causes(&status);
        assert_eq!(shown.matches("connection reset").count(), 1, "{shown}");
    }
}

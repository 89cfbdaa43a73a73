//! What carries a connection to an engine: a socket, TLS over TCP, or the system `ssh`
//! running `docker system dial-stdio`, each as one stream type hyper and tonic can use.

use super::*;

impl SshTarget {
    /// `[-p PORT] [user@]host` as `ssh` is given it, for messages.
    pub(super) fn destination(&self) -> String {
        let port = self.port.map(|p| format!("-p {p} ")).unwrap_or_default();
        match &self.user {
            Some(user) => format!("{port}{user}@{}", self.host),
            None => format!("{port}{}", self.host),
        }
    }

    /// The Docker CLI's command line (cli/connhelper/ssh): `-l`, `-p`, `--`, then
    /// `docker system dial-stdio` on the far side; `BatchMode` so that a missing key fails
    /// instead of waiting at a password prompt no one sees.
    pub(super) fn args(&self) -> Vec<String> {
        let mut args = vec![
            "-o".to_string(),
            format!("ConnectTimeout={SSH_CONNECT_TIMEOUT_SECS}"),
            "-o".to_string(),
            "BatchMode=yes".to_string(),
            "-T".to_string(),
        ];
        if let Some(user) = &self.user {
            args.extend(["-l".to_string(), user.clone()]);
        }
        if let Some(port) = self.port {
            args.extend(["-p".to_string(), port.to_string()]);
        }
        args.extend(
            ["--", &self.host, "docker", "system", "dial-stdio"]
                .iter()
                .map(|s| s.to_string()),
        );
        args
    }
}

/// A connection to an engine, whatever carries it.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {
    /// What `ssh` wrote to stderr so far, for a connection it carries.
    fn ssh_stderr(&self) -> Option<Arc<Mutex<String>>> {
        None
    }
}

pub type Stream = Box<dyn Io>;

impl Io for tokio::net::UnixStream {}
impl Io for tokio::net::TcpStream {}
impl Io for tokio_rustls::client::TlsStream<tokio::net::TcpStream> {}

/// `ssh … docker system dial-stdio`: its stdout is what the engine says, its stdin what
/// it is told. The process ends with the stream.
pub(super) struct SshStream {
    // Held so that dropping the stream kills ssh (kill_on_drop).
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    stderr: Arc<Mutex<String>>,
}

impl SshStream {
    pub(super) fn spawn(target: &SshTarget) -> io::Result<SshStream> {
        let mut child = tokio::process::Command::new("ssh")
            .args(target.args())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run `ssh`: {e}")))?;
        let (Some(stdin), Some(stdout), Some(mut err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(io::Error::other("ssh's pipes are missing"));
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = stderr.clone();
        // ssh's own messages (auth failures, the far side's `docker` errors), kept for
        // the error that names why the connection ended; bounded.
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut text) = collected.lock() {
                    if text.len() < 16 * 1024 {
                        text.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            }
        });
        Ok(SshStream {
            _child: child,
            stdin,
            stdout,
            stderr,
        })
    }
}

impl Io for SshStream {
    fn ssh_stderr(&self) -> Option<Arc<Mutex<String>>> {
        Some(self.stderr.clone())
    }
}

impl AsyncRead for SshStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

impl AsyncWrite for SshStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stdin).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdin).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdin).poll_shutdown(cx)
    }
}

/// A pooled REST connection, as hyper's client wants one.
pub(super) struct Pooled(pub(super) hyper_util::rt::TokioIo<Stream>);

impl hyper_util::client::legacy::connect::Connection for Pooled {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl hyper::rt::Read for Pooled {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Pooled {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

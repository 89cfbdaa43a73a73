//! What a BuildKit daemon sends over `Control/Session`: `polyarch::docker::buildkit::session::
//! Session::attach` is given a `ControlClient` whose channel (in memory) reaches a fake
//! `Control` server; its `Session` call hands the session's byte stream to a scripted
//! "daemon", which frames its own HTTP/2 into `BytesMessage`s split where the input says
//! (now and then an empty one) and calls what the session serves, as BuildKit would:
//!
//! - `Health/Check` (and `List`, unimplemented), `Auth/Credentials` for a few hosts,
//!   `Secrets/GetSecret`, `SSH/CheckAgent`, `SSH/ForwardAgent` (to a fake agent), the
//!   exporter's `FileSend/DiffCopy`, unknown methods;
//! - `FileSync/DiffCopy` with `dir-name`, include / exclude patterns and follow paths from
//!   lists aimed at leaving the root (`..`, absolute paths, links out, escaped `-encoded`
//!   values, raw bytes), then, once the STATs are in, a script of fsutil `Packet`s: REQ with
//!   a listed id, a directory's, a repeated or a raw one, FIN, ERR, DATA, STAT, unknown
//!   types, gRPC messages that are not a `Packet`, compressed or with a huge declared length;
//! - a gRPC call with a raw body on any path, and raw bytes in the middle of the HTTP/2
//!   stream (the connection is then only expected to end);
//! - or (mode 7) the input after its first bytes as the whole HTTP/2 stream.
//!
//! Asserted: no panic anywhere (libFuzzer aborts on one in any task); every call ends within
//! 10 s; valid calls get their documented answers (SERVING, the push registry's credentials
//! or none, the secret or NotFound, the agent or NotFound, UNIMPLEMENTED for unknown
//! methods, the exported file byte for byte); every STAT path is relative, clean and
//! lstat-able under the context root without passing a symlink; DATA comes only for ids
//! asked for, and its bytes are the file's under the root (or empty, when withheld) and
//! never a file outside the root; a DiffCopy script of valid REQs then FIN ends OK with FIN,
//! one with a bad REQ, an ERR or no FIN ends with a non-OK status; the fake agent only ever
//! sees requests of the kinds polyarch forwards; when the daemon ends `Control/Session`,
//! polyarch's side of it ends too (within 10 s). Memory: libFuzzer's `-rss_limit_mb` and
//! `-malloc_limit_mb` (a declared 4 GiB gRPC message must not be allocated).
//!
//! `SESSION_DEBUG=1` prints the actions and their outcomes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use polyarch::docker::buildkit::filesync::SyncedDirs;
use polyarch::docker::buildkit::secrets::{SecretSource, SecretStore};
use polyarch::docker::buildkit::session::{Services, Session};
use polyarch::docker::buildkit::ssh::SshAgents;
use polyarch::docker::buildkit::SessionAuth;
use polyarch::registry::credentials::Credential;

use bollard_buildkit_proto::fsutil::types::{packet::PacketType, Packet, Stat};
use bollard_buildkit_proto::health::{HealthCheckRequest, HealthCheckResponse};
use bollard_buildkit_proto::moby::buildkit::secrets::v1::{GetSecretRequest, GetSecretResponse};
use bollard_buildkit_proto::moby::buildkit::v1 as control;
use bollard_buildkit_proto::moby::buildkit::v1::control_client::ControlClient;
use bollard_buildkit_proto::moby::buildkit::v1::control_server::{Control, ControlServer};
use bollard_buildkit_proto::moby::filesync::v1::{
    BytesMessage as FileBytes, CredentialsRequest, CredentialsResponse,
};
use bollard_buildkit_proto::moby::sshforward::v1::{BytesMessage as SshBytes, CheckAgentRequest};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const WAIT: Duration = Duration::from_secs(10);
const MAX_ACTIONS: usize = 8;
const MAX_PACKETS: usize = 16;
/// In the file outside the context root: never in a DATA packet.
const MARKER: &[u8] = b"polyarch-fuzz: outside the context root";
const TOKEN: &[u8] = b"polyarch-fuzz-secret-token";
const SSH_FAILURE: [u8; 5] = [0, 0, 0, 1, 5];
const SSH_NO_IDENTITIES: [u8; 9] = [0, 0, 0, 5, 12, 0, 0, 0, 0];
const PUSH_HOST: &str = "registry.example:5000";
const MODE_TYPE: u32 =
    (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19);

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.byte()).collect()
    }
    fn pick<'s>(&mut self, list: &[&'s str]) -> &'s str {
        list[self.below(list.len())]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
}

/// The context tree, a file outside it, a secret and an empty Docker config; built once.
struct Fixture {
    root: PathBuf,
    secret: PathBuf,
    spool: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let spool: PathBuf = std::env::var_os("FUZZ_SPOOL")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let base = tempfile::Builder::new()
            .prefix("polyarch-fuzz-session-")
            .tempdir_in(&spool)
            .expect("temp dir")
            .keep();
        let root = base.join("root");
        let outside = base.join("outside");
        fs::create_dir_all(root.join("dir/sub")).unwrap();
        fs::create_dir_all(outside.join("dir")).unwrap();
        fs::write(outside.join("secret"), MARKER).unwrap();
        fs::write(outside.join("dir/secret"), MARKER).unwrap();
        fs::write(root.join("Dockerfile"), b"FROM scratch\nCOPY . /\n").unwrap();
        fs::write(root.join("a.txt"), b"a").unwrap();
        fs::write(root.join("empty"), b"").unwrap();
        // Three DATA packets.
        let big: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(root.join("dir/big.bin"), big).unwrap();
        fs::write(root.join("dir/sub/c"), b"c").unwrap();
        fs::hard_link(root.join("a.txt"), root.join("dir/hard")).unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap()
        };
        link(Path::new("../outside/secret"), "link-out");
        link(&outside.join("secret"), "abs-out");
        link(Path::new("../outside"), "dirlink");
        link(Path::new("/"), "slash");
        link(Path::new("a.txt"), "link-in");
        link(Path::new("loop"), "loop");
        link(Path::new("../../outside/dir"), "dir/up");
        let secret = base.join("token");
        fs::write(&secret, TOKEN).unwrap();
        let docker_config = base.join("docker-config");
        fs::create_dir(&docker_config).unwrap();
        // Credentials come from the push registry or nowhere: no helper is ever run.
        std::env::set_var("DOCKER_CONFIG", &docker_config);
        Fixture {
            root,
            secret,
            spool,
        }
    })
}

/// lstat of a root-relative path, refusing to pass through anything but a real directory.
fn lstat_inside(root: &Path, rel: &str) -> Option<fs::Metadata> {
    let mut path = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        path.push(part);
        let meta = fs::symlink_metadata(&path).ok()?;
        if i + 1 == parts.len() {
            return Some(meta);
        }
        if !meta.is_dir() {
            return None;
        }
    }
    None
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---- the fake daemon's Control server ------------------------------------------------

/// The session call as the daemon receives it: its metadata, polyarch's bytes, and where
/// the daemon's own go.
struct Attached {
    metadata: tonic::metadata::MetadataMap,
    from_polyarch: Streaming<control::BytesMessage>,
    to_polyarch: mpsc::Sender<Result<control::BytesMessage, Status>>,
}

struct FakeControl {
    attached: Mutex<Option<oneshot::Sender<Attached>>>,
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("fake daemon"))
}

type Never<T> = futures_util::stream::Pending<Result<T, Status>>;

#[tonic::async_trait]
impl Control for FakeControl {
    async fn disk_usage(
        &self,
        _: Request<control::DiskUsageRequest>,
    ) -> Result<Response<control::DiskUsageResponse>, Status> {
        unimplemented()
    }
    type PruneStream = Never<control::UsageRecord>;
    async fn prune(
        &self,
        _: Request<control::PruneRequest>,
    ) -> Result<Response<Self::PruneStream>, Status> {
        unimplemented()
    }
    async fn solve(
        &self,
        _: Request<control::SolveRequest>,
    ) -> Result<Response<control::SolveResponse>, Status> {
        unimplemented()
    }
    type StatusStream = Never<control::StatusResponse>;
    async fn status(
        &self,
        _: Request<control::StatusRequest>,
    ) -> Result<Response<Self::StatusStream>, Status> {
        unimplemented()
    }
    type SessionStream = ReceiverStream<Result<control::BytesMessage, Status>>;
    async fn session(
        &self,
        request: Request<Streaming<control::BytesMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (to_polyarch, stream) = mpsc::channel(16);
        let metadata = request.metadata().clone();
        let attached = Attached {
            metadata,
            from_polyarch: request.into_inner(),
            to_polyarch,
        };
        let waiting = self.attached.lock().unwrap().take();
        match waiting {
            Some(tx) => {
                let _ = tx.send(attached);
                Ok(Response::new(ReceiverStream::new(stream)))
            }
            None => Err(Status::already_exists("one session per daemon")),
        }
    }
    async fn list_workers(
        &self,
        _: Request<control::ListWorkersRequest>,
    ) -> Result<Response<control::ListWorkersResponse>, Status> {
        unimplemented()
    }
    async fn info(
        &self,
        _: Request<control::InfoRequest>,
    ) -> Result<Response<control::InfoResponse>, Status> {
        unimplemented()
    }
    type ListenBuildHistoryStream = Never<control::BuildHistoryEvent>;
    async fn listen_build_history(
        &self,
        _: Request<control::BuildHistoryRequest>,
    ) -> Result<Response<Self::ListenBuildHistoryStream>, Status> {
        unimplemented()
    }
    async fn update_build_history(
        &self,
        _: Request<control::UpdateBuildHistoryRequest>,
    ) -> Result<Response<control::UpdateBuildHistoryResponse>, Status> {
        unimplemented()
    }
}

/// A `ControlClient` whose one connection reaches `server` in memory.
async fn control_client(server: FakeControl) -> ControlClient<tonic::transport::Channel> {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let incoming = futures_util::StreamExt::chain(
            futures_util::stream::iter([Ok::<_, std::io::Error>(server_io)]),
            futures_util::stream::pending(),
        );
        let _ = tonic::transport::Server::builder()
            .add_service(ControlServer::new(server))
            .serve_with_incoming(incoming)
            .await;
    });
    let mut client_io = Some(client_io);
    let channel = tonic::transport::Endpoint::from_static("http://buildkitd.fuzz")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let io = client_io.take();
            async move {
                io.map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("connected twice"))
            }
        }))
        .await
        .expect("in-memory channel");
    ControlClient::new(channel)
}

// ---- framing the daemon's HTTP/2 into BytesMessages ----------------------------------

/// Where the daemon's byte stream is cut into `BytesMessage`s (0: an empty message).
fn splits(input: &mut Input) -> Vec<usize> {
    (0..input.below(4) + 1)
        .map(|_| {
            let b = input.byte() as usize;
            match b % 4 {
                0 => b / 4 % 9,
                1 => 1 + b / 4 * 16,
                2 => 16_384 + b,
                _ => 64 * 1024,
            }
        })
        .collect()
}

/// Copies polyarch's session bytes to the daemon's HTTP/2 and back, the latter cut at
/// `splits`; raw bytes sent to `inject` go between frames as they are. Ends when
/// polyarch's side does (returns) or the daemon closes.
fn pump(
    attached: Attached,
    daemon_side: DuplexStream,
    splits: Vec<usize>,
    mut inject: mpsc::Receiver<Vec<u8>>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
    mpsc::Sender<Result<control::BytesMessage, Status>>,
) {
    let (mut read_half, mut write_half) = tokio::io::split(daemon_side);
    let mut from_polyarch = attached.from_polyarch;
    let ended = tokio::spawn(async move {
        loop {
            match from_polyarch.message().await {
                Ok(Some(message)) => {
                    // The daemon's HTTP/2 may be gone after an injection: keep draining.
                    let _ = write_half.write_all(&message.data).await;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let _ = write_half.shutdown().await;
    });
    let to_polyarch = attached.to_polyarch.clone();
    let out = attached.to_polyarch;
    let sending = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut injecting = true;
        let mut i = 0;
        loop {
            let mut size = splits[i % splits.len()];
            i += 1;
            // 0: an empty message before the next byte.
            if size == 0 {
                let empty = control::BytesMessage { data: Vec::new() };
                if out.send(Ok(empty)).await.is_err() {
                    break;
                }
                size = 1;
            }
            let data = tokio::select! {
                biased;
                raw = inject.recv(), if injecting => {
                    injecting = raw.is_some();
                    raw
                }
                n = read_half.read(&mut buf[..size]) => match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => Some(buf[..n].to_vec()),
                },
            };
            let Some(data) = data else { continue };
            if out.send(Ok(control::BytesMessage { data })).await.is_err() {
                break;
            }
        }
    });
    (ended, sending, to_polyarch)
}

// ---- gRPC over the daemon's own HTTP/2 ------------------------------------------------

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;
type Sender = hyper::client::conn::http2::SendRequest<Body>;

fn frame(message: &[u8]) -> Bytes {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed.into()
}

/// A call's answer: the gRPC messages received, its status, or that the stream broke.
#[derive(Debug, Default)]
struct Answer {
    messages: Vec<Vec<u8>>,
    status: Option<i32>,
    broken: Option<String>,
}

/// Reads gRPC messages from a response as they come.
struct Reader {
    body: Option<Incoming>,
    buf: Vec<u8>,
    answer: Answer,
}

impl Reader {
    fn new(response: Result<http::Response<Incoming>, hyper::Error>) -> Reader {
        let mut reader = Reader {
            body: None,
            buf: Vec::new(),
            answer: Answer::default(),
        };
        match response {
            Ok(response) => {
                reader.answer.status = grpc_status(response.headers());
                if response.status() != http::StatusCode::OK {
                    reader.answer.broken = Some(format!("HTTP {}", response.status()));
                }
                reader.body = Some(response.into_body());
            }
            Err(e) => reader.answer.broken = Some(e.to_string()),
        }
        reader
    }

    /// The next message, None at the end of the response.
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                assert_eq!(self.buf[0], 0, "polyarch compressed a message unasked");
                if self.buf.len() >= 5 + len {
                    let message = self.buf[5..5 + len].to_vec();
                    self.buf.drain(..5 + len);
                    self.answer.messages.push(message.clone());
                    return Some(message);
                }
            }
            let body = self.body.as_mut()?;
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        if let Some(trailers) = frame.trailers_ref() {
                            self.answer.status = grpc_status(trailers);
                        }
                    }
                },
                Some(Err(e)) => {
                    self.answer.broken = Some(e.to_string());
                    self.body = None;
                }
                None => {
                    assert!(self.buf.is_empty(), "a response ended inside a message");
                    self.body = None;
                }
            }
        }
    }

    async fn finish(mut self) -> Answer {
        while self.next().await.is_some() {}
        self.answer
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Starts a call: its body's sender (dropping it ends the request) and its reader.
async fn start(
    send: &mut Sender,
    path: &str,
    metadata: &[(String, Vec<u8>)],
) -> Option<(mpsc::Sender<Bytes>, Reader)> {
    let (body_tx, body_rx) = mpsc::channel::<Bytes>(64);
    let body = StreamBody::new(futures_util::StreamExt::map(
        ReceiverStream::new(body_rx),
        |b| Ok::<_, Infallible>(Frame::data(b)),
    ));
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://session.fuzz{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            request = request.header(name, value);
        }
    }
    let request = request.body(BodyExt::boxed(body)).ok()?;
    send.ready().await.ok()?;
    let response = send.send_request(request);
    Some((body_tx, Reader::new(response.await)))
}

/// A call with whole gRPC messages (or raw bytes) as its body.
async fn call(
    send: &mut Sender,
    path: &str,
    metadata: &[(String, Vec<u8>)],
    body: Vec<Bytes>,
) -> Option<Answer> {
    let (body_tx, body_rx) = mpsc::channel::<Bytes>(body.len().max(1));
    for b in body {
        body_tx.try_send(b).unwrap();
    }
    drop(body_tx);
    let stream = StreamBody::new(futures_util::StreamExt::map(
        ReceiverStream::new(body_rx),
        |b| Ok::<_, Infallible>(Frame::data(b)),
    ));
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://session.fuzz{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            request = request.header(name, value);
        }
    }
    let request = request.body(BodyExt::boxed(stream)).ok()?;
    send.ready().await.ok()?;
    let response = send.send_request(request).await;
    Some(Reader::new(response).finish().await)
}

/// A unary call that must be answered: its one message and status.
async fn unary(send: &mut Sender, path: &str, message: &impl Message) -> Answer {
    let answer = call(send, path, &[], vec![frame(&message.encode_to_vec())])
        .await
        .unwrap_or_else(|| panic!("{path}: the connection is gone"));
    assert!(answer.broken.is_none(), "{path}: {answer:?}");
    assert!(
        answer.status.is_some(),
        "{path}: no grpc-status: {answer:?}"
    );
    answer
}

// ---- the daemon's actions -------------------------------------------------------------

const DIR_NAMES: &[&str] = &[
    "context",
    "dockerfile",
    "",
    "nope",
    "../context",
    "context/..",
    "/",
    "CONTEXT",
];
const PATTERNS: &[&str] = &[
    "*",
    "a.txt",
    "dir",
    "dir/**",
    "**",
    "../outside",
    "..",
    "/",
    "/..",
    "link-out",
    "dirlink",
    "dirlink/*",
    "dirlink/secret",
    "**/secret",
    "!a.txt",
    "!dir/big.bin",
    "[",
    "\\",
    "",
    ".",
    "dir/up/secret",
    "slash/etc",
    "abs-out",
    "loop",
    "*/..",
    "dir/../..",
    "%2e%2e",
    "a+b",
];
const FOLLOW: &[&str] = &[
    "link-out",
    "abs-out",
    "dirlink",
    "dirlink/secret",
    "dirlink/dir",
    "dir/up",
    "dir/up/secret",
    "../outside/secret",
    "/abs-out",
    "Dockerfile",
    "*",
    "loop",
    "slash",
    "slash/etc/passwd",
    "link-in",
    "/..",
    "%2e%2e/outside",
    "%ZZ",
    ".",
];

/// DiffCopy's metadata: dir-name and the three pattern lists, now and then query-escaped
/// with `-encoded`, now and then a raw value.
fn diff_copy_metadata(input: &mut Input) -> Vec<(String, Vec<u8>)> {
    let mut md = Vec::new();
    if input.below(8) != 0 {
        md.push(("dir-name".to_string(), input.pick(DIR_NAMES).into()));
    }
    for (key, list) in [
        ("include-patterns", PATTERNS),
        ("exclude-patterns", PATTERNS),
        ("followpaths", FOLLOW),
    ] {
        for _ in 0..input.below(4) {
            let value = match input.below(8) {
                0 => input.bytes(12),
                _ => input.pick(list).as_bytes().to_vec(),
            };
            md.push((key.to_string(), value));
        }
        if input.below(6) == 0 {
            md.push((
                format!("{key}-encoded"),
                input.pick(&["1", "true", "0", "x"]).into(),
            ));
        }
    }
    md
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Fin,
    Failure,
    Unknown,
}

/// One DiffCopy: the STATs, then a packet script, then the end of the request.
async fn diff_copy(send: &mut Sender, input: &mut Input<'_>, debug: bool) -> bool {
    let root = &fixture().root;
    let metadata = diff_copy_metadata(input);
    let Some((body, mut reader)) =
        start(send, "/moby.filesync.v1.FileSync/DiffCopy", &metadata).await
    else {
        return false;
    };
    let decode = |m: &[u8]| Packet::decode(m).expect("polyarch sent a Packet that does not decode");

    // The STATs, up to the empty one.
    let mut stats: Vec<Stat> = Vec::new();
    let mut walk_failed = false;
    let mut stats_done = false;
    while let Some(m) = reader.next().await {
        let p = decode(&m);
        match (PacketType::try_from(p.r#type), p.stat) {
            (Ok(PacketType::PacketStat), Some(stat)) => stats.push(stat),
            (Ok(PacketType::PacketStat), None) => {
                stats_done = true;
                break;
            }
            (Ok(PacketType::PacketErr), _) => {
                walk_failed = true;
                break;
            }
            (other, _) => panic!("{other:?} among the STATs"),
        }
    }
    for stat in &stats {
        let p = &stat.path;
        assert!(
            !p.is_empty()
                && !p.starts_with('/')
                && p.split('/').all(|c| !c.is_empty() && c != "." && c != ".."),
            "STAT path {p:?} is not clean and relative"
        );
        assert!(
            lstat_inside(root, p).is_some() || lstat_inside(&root.join("dir"), p).is_some(),
            "STAT {p:?} is not under the root"
        );
    }

    // The script.
    let mut requested: HashSet<u32> = HashSet::new();
    // Valid REQs before the packet that decides the outcome: what FIN waits for.
    let mut served: HashSet<u32> = HashSet::new();
    let mut expect = if stats_done && !walk_failed {
        None
    } else {
        Some(Expect::Failure)
    };
    let requestable = |id: u32| {
        stats
            .get(id as usize)
            .is_some_and(|s| s.mode & MODE_TYPE == 0)
    };
    let packet = |kind: i32| Packet {
        r#type: kind,
        ..Default::default()
    };
    let count = input.below(MAX_PACKETS + 1);
    for _ in 0..count {
        let mut req = None;
        let (bytes, outcome) = match input.below(12) {
            0..=3 => {
                let id = if stats.is_empty() {
                    0
                } else {
                    input.below(stats.len()) as u32
                };
                let valid = requestable(id) && !requested.contains(&id);
                requested.insert(id);
                req = Some(id);
                let p = Packet {
                    id,
                    ..packet(PacketType::PacketReq as i32)
                };
                (
                    frame(&p.encode_to_vec()),
                    (!valid).then_some(Expect::Failure),
                )
            }
            4 => {
                let id = input.u32();
                let valid = requestable(id) && !requested.contains(&id);
                requested.insert(id);
                req = Some(id);
                let p = Packet {
                    id,
                    ..packet(PacketType::PacketReq as i32)
                };
                (
                    frame(&p.encode_to_vec()),
                    (!valid).then_some(Expect::Failure),
                )
            }
            5 => (
                frame(&packet(PacketType::PacketFin as i32).encode_to_vec()),
                Some(Expect::Fin),
            ),
            6 => {
                let p = Packet {
                    data: input.bytes(8),
                    ..packet(PacketType::PacketErr as i32)
                };
                (frame(&p.encode_to_vec()), Some(Expect::Failure))
            }
            7 => {
                // Not REQ, FIN or ERR: ignored, as by fsutil.
                let kind = match input.below(4) {
                    0 => PacketType::PacketStat as i32,
                    1 => PacketType::PacketData as i32,
                    2 => 99,
                    _ => -1,
                };
                let p = Packet {
                    r#type: kind,
                    id: input.u32(),
                    data: input.bytes(8),
                    stat: (input.below(2) == 0).then(|| Stat {
                        path: "../outside/secret".into(),
                        ..Default::default()
                    }),
                };
                (frame(&p.encode_to_vec()), None)
            }
            8 => {
                // Whatever the bytes decode to (or not).
                (frame(&input.bytes(12)), Some(Expect::Unknown))
            }
            9 => {
                // A compressed message, though no encoding was negotiated.
                let mut f = frame(&packet(PacketType::PacketFin as i32).encode_to_vec()).to_vec();
                f[0] = 1;
                (f.into(), Some(Expect::Failure))
            }
            10 => {
                // A declared length far past the limit, then nothing.
                let mut f = vec![0u8];
                f.extend_from_slice(&(u32::MAX - input.byte() as u32).to_be_bytes());
                f.extend_from_slice(&input.bytes(8));
                (f.into(), Some(Expect::Failure))
            }
            _ => {
                // A message cut across HTTP/2 DATA frames.
                let p = Packet {
                    id: input.byte() as u32,
                    ..packet(PacketType::PacketReq as i32)
                };
                let f = frame(&p.encode_to_vec());
                let cut = input.below(f.len());
                let _ = body.send(f.slice(..cut)).await;
                let id = p.id;
                let valid = requestable(id) && !requested.contains(&id);
                requested.insert(id);
                req = Some(id);
                (f.slice(cut..), (!valid).then_some(Expect::Failure))
            }
        };
        if expect.is_none() {
            if let (Some(id), None) = (req, outcome) {
                served.insert(id);
            }
            expect = outcome;
        }
        if body.send(bytes).await.is_err() {
            break;
        }
    }
    drop(body);
    let expect = expect.unwrap_or(Expect::Failure);

    // Everything else it sends: DATA for what was asked, FIN or an error.
    let mut data: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut ended: HashSet<u32> = HashSet::new();
    let mut fin = false;
    while let Some(m) = reader.next().await {
        let p = decode(&m);
        match PacketType::try_from(p.r#type) {
            Ok(PacketType::PacketData) => {
                // Bytes that decode as anything may be a REQ too.
                assert!(
                    expect == Expect::Unknown || served.contains(&p.id),
                    "DATA for {} not requested",
                    p.id
                );
                assert!(requestable(p.id), "DATA for {}, not a file", p.id);
                assert!(!ended.contains(&p.id), "DATA for {} after its end", p.id);
                assert!(!fin, "DATA after FIN");
                if p.data.is_empty() {
                    ended.insert(p.id);
                } else {
                    data.entry(p.id).or_default().extend_from_slice(&p.data);
                }
            }
            Ok(PacketType::PacketFin) => fin = true,
            Ok(PacketType::PacketErr) => {}
            other => panic!("{other:?} after the STATs"),
        }
    }
    let answer = reader.answer;
    for (id, bytes) in &data {
        assert!(!contains(bytes, MARKER), "a file outside the root was sent");
        let path = &stats[*id as usize].path;
        let meta = lstat_inside(root, path).or_else(|| lstat_inside(&root.join("dir"), path));
        assert!(
            meta.is_some_and(|m| m.is_file()),
            "{path:?} sent but not a file under the root"
        );
    }
    for id in &ended {
        let path = &stats[*id as usize].path;
        let got = data.remove(id).unwrap_or_default();
        // The context's or the dockerfile dir's file.
        let want = [root.join(path), root.join("dir").join(path)]
            .iter()
            .filter_map(|p| fs::read(p).ok())
            .collect::<Vec<_>>();
        assert!(
            got.is_empty() || want.contains(&got),
            "{path:?}: the bytes sent are not the file's"
        );
    }
    if debug {
        eprintln!(
            "diff_copy {metadata:?}: {} stats, expect {expect:?}, fin {fin}, status {:?}, broken {:?}",
            stats.len(),
            answer.status,
            answer.broken
        );
    }
    if answer.broken.is_none() {
        match expect {
            Expect::Fin => {
                assert!(fin, "FIN was not answered: {answer:?}");
                assert!(ended == served, "requested {served:?}, ended {ended:?}");
                assert_eq!(answer.status, Some(0), "FIN but {answer:?}");
            }
            Expect::Failure => {
                assert!(!fin, "FIN after a failure");
                assert!(
                    matches!(answer.status, Some(s) if s != 0),
                    "a failed transfer ended {answer:?}"
                );
            }
            Expect::Unknown => {}
        }
    }
    true
}

/// A fake SSH agent on `socket`: it answers request-identities with none and anything else
/// with failure, and asserts it only ever sees what polyarch forwards.
fn serve_agent(socket: &Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(socket).expect("agent socket");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if conn.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let len = u32::from_be_bytes(len) as usize;
                    assert!(
                        (1..=256 * 1024).contains(&len),
                        "agent got a {len}-byte message"
                    );
                    let mut message = vec![0u8; len];
                    if conn.read_exact(&mut message).await.is_err() {
                        return;
                    }
                    assert!(
                        [11, 13].contains(&message[0]),
                        "the agent was sent request kind {}",
                        message[0]
                    );
                    let answer: &[u8] = if message[0] == 11 {
                        &SSH_NO_IDENTITIES
                    } else {
                        &SSH_FAILURE
                    };
                    if conn.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// The actions; false once the connection is no longer usable.
async fn act(
    send: &mut Sender,
    input: &mut Input<'_>,
    inject: &mpsc::Sender<Vec<u8>>,
    export: &Path,
    debug: bool,
) -> bool {
    let action = input.below(11);
    if debug {
        eprintln!("action {action}");
    }
    match action {
        0 => {
            let answer = unary(
                send,
                "/grpc.health.v1.Health/Check",
                &HealthCheckRequest {
                    service: String::new(),
                },
            )
            .await;
            assert_eq!(answer.status, Some(0), "{answer:?}");
            let health = HealthCheckResponse::decode(&answer.messages[0][..]).unwrap();
            assert_eq!(health.status, 1, "not SERVING");
        }
        1 => return diff_copy(send, input, debug).await,
        2 => {
            let host = input.pick(&[
                PUSH_HOST,
                "ghcr.io",
                "",
                "https://registry.example:5000",
                "registry-1.docker.io",
            ]);
            let answer = unary(
                send,
                "/moby.filesync.v1.Auth/Credentials",
                &CredentialsRequest { host: host.into() },
            )
            .await;
            assert_eq!(answer.status, Some(0), "{answer:?}");
            let creds = CredentialsResponse::decode(&answer.messages[0][..]).unwrap();
            match host {
                PUSH_HOST => {
                    assert_eq!((creds.username.as_str(), creds.secret.as_str()), ("u", "p"))
                }
                "ghcr.io" | "" | "registry-1.docker.io" => {
                    assert!(
                        creds.username.is_empty() && creds.secret.is_empty(),
                        "{host}: credentials from nowhere"
                    )
                }
                _ => {}
            }
        }
        3 => {
            let id = input.pick(&["tok", "missing", "", "../token", "TOK"]);
            let answer = unary(
                send,
                "/moby.buildkit.secrets.v1.Secrets/GetSecret",
                &GetSecretRequest {
                    id: id.into(),
                    annotations: Default::default(),
                },
            )
            .await;
            if id == "tok" {
                assert_eq!(answer.status, Some(0), "{answer:?}");
                assert_eq!(
                    GetSecretResponse::decode(&answer.messages[0][..])
                        .unwrap()
                        .data,
                    TOKEN
                );
            } else {
                assert_eq!(answer.status, Some(5), "secret {id:?}: {answer:?}");
            }
        }
        4 => {
            let id = input.pick(&["default", "github", "", "nope"]);
            let answer = unary(
                send,
                "/moby.sshforward.v1.SSH/CheckAgent",
                &CheckAgentRequest { id: id.into() },
            )
            .await;
            let want = if id == "nope" { 5 } else { 0 };
            assert_eq!(answer.status, Some(want), "agent {id:?}: {answer:?}");
        }
        5 => {
            let id = input.pick(&["default", "github", "nope"]);
            let mut chunks = Vec::new();
            for _ in 0..input.below(4) + 1 {
                let data = match input.below(4) {
                    0 => {
                        let kind = input.byte();
                        let mut m = vec![0, 0, 0, 1, kind];
                        if input.below(2) == 0 {
                            m = vec![0, 0, 0, 5, 13, 0, 0, 0, 0];
                        }
                        m
                    }
                    1 => vec![0, 0, 0, 1, 11],
                    2 => (u32::MAX - input.byte() as u32).to_be_bytes().to_vec(),
                    _ => input.bytes(12),
                };
                chunks.push(frame(&SshBytes { data }.encode_to_vec()));
            }
            let md = [("buildkit.ssh.id".to_string(), id.as_bytes().to_vec())];
            if let Some(answer) =
                call(send, "/moby.sshforward.v1.SSH/ForwardAgent", &md, chunks).await
            {
                if id == "nope" {
                    assert_eq!(answer.status, Some(5), "{answer:?}");
                }
                for m in &answer.messages {
                    let data = SshBytes::decode(&m[..]).unwrap().data;
                    assert!(
                        data == SSH_FAILURE || data == SSH_NO_IDENTITIES,
                        "agent answer {data:?}"
                    );
                }
            }
        }
        6 => {
            let chunks: Vec<Vec<u8>> = (0..input.below(4)).map(|_| input.bytes(40)).collect();
            let framed = chunks
                .iter()
                .map(|c| frame(&FileBytes { data: c.clone() }.encode_to_vec()))
                .collect();
            let answer = call(send, "/moby.filesync.v1.FileSend/DiffCopy", &[], framed)
                .await
                .expect("connection");
            assert_eq!(answer.status, Some(0), "{answer:?}");
            assert_eq!(
                fs::read(export).unwrap(),
                chunks.concat(),
                "the exported file"
            );
        }
        7 => {
            let path = input.pick(&[
                "/grpc.health.v1.Health/List",
                "/grpc.health.v1.Health/Watch",
                "/moby.filesync.v1.FileSync/TarStream",
                "/moby.filesync.v1.Auth/FetchToken",
                "/moby.filesync.v1.Auth/GetTokenAuthority",
                "/moby.filesync.v1.Auth/VerifyTokenAuthority",
                "/moby.buildkit.v1.Control/Solve",
                "/moby.filesync.v1.FileSync/Nope",
            ]);
            let answer = unary(
                send,
                path,
                &HealthCheckRequest {
                    service: String::new(),
                },
            )
            .await;
            assert_eq!(answer.status, Some(12), "{path}: {answer:?}");
        }
        8 => {
            // A raw body on any path.
            let path = input.pick(&[
                "/grpc.health.v1.Health/Check",
                "/moby.filesync.v1.FileSync/DiffCopy",
                "/moby.filesync.v1.Auth/Credentials",
                "/moby.buildkit.secrets.v1.Secrets/GetSecret",
                "/moby.sshforward.v1.SSH/CheckAgent",
                "/moby.sshforward.v1.SSH/ForwardAgent",
                "/moby.filesync.v1.FileSend/DiffCopy",
                "/",
            ]);
            let md = diff_copy_metadata(input);
            let body: Vec<Bytes> = (0..input.below(3) + 1)
                .map(|_| input.bytes(24).into())
                .collect();
            if call(send, path, &md, body).await.is_none() {
                return false;
            }
        }
        9 => {
            // Raw bytes amid the HTTP/2 frames: the connection need not survive.
            let _ = inject.send(input.bytes(32)).await;
            return false;
        }
        _ => {
            // Two calls at once on the connection.
            let mut other = send.clone();
            let health = HealthCheckRequest {
                service: String::new(),
            };
            let agent = CheckAgentRequest { id: String::new() };
            let (a, b) = tokio::join!(
                unary(send, "/grpc.health.v1.Health/Check", &health),
                unary(&mut other, "/moby.sshforward.v1.SSH/CheckAgent", &agent),
            );
            assert_eq!((a.status, b.status), (Some(0), Some(0)));
        }
    }
    true
}

async fn run(data: &[u8], scratch: &Path) {
    let debug = std::env::var_os("SESSION_DEBUG").is_some();
    let fixture = fixture();
    let mut input = Input { data, pos: 0 };
    let mode = input.below(8);
    let socket = scratch.join("agent.sock");
    let _agent = serve_agent(&socket);
    let export = scratch.join("export.tar");

    let (attached_tx, attached_rx) = oneshot::channel();
    let control = control_client(FakeControl {
        attached: Mutex::new(Some(attached_tx)),
    })
    .await;
    let services = Services {
        dirs: SyncedDirs::new()
            .with_dir("context", &fixture.root)
            .with_dir("dockerfile", fixture.root.join("dir")),
        auth: SessionAuth {
            push: Some((
                PUSH_HOST.to_string(),
                Credential::Basic {
                    username: "u".into(),
                    password: "p".into(),
                },
            )),
        },
        secrets: SecretStore::new(BTreeMap::from([(
            "tok".to_string(),
            SecretSource::File(fixture.secret.clone()),
        )])),
        ssh: SshAgents::new(BTreeMap::from([
            ("default".to_string(), socket.clone()),
            ("github".to_string(), socket.clone()),
        ])),
        file_to: Some(export.clone()),
    };
    let session = Session::attach(control, "fuzz-key", services)
        .await
        .expect("attach");
    let attached = tokio::time::timeout(WAIT, attached_rx)
        .await
        .expect("no Control/Session call")
        .expect("attached");

    // The session's name, as BuildKit's session manager reads it.
    let header = |name: &str| -> Vec<String> {
        attached
            .metadata
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(header("x-docker-expose-session-uuid"), [session.id.clone()]);
    assert_eq!(header("x-docker-expose-session-sharedkey"), ["fuzz-key"]);
    let methods = header("x-docker-expose-session-grpc-method");
    assert!(methods
        .iter()
        .any(|m| m == "/moby.filesync.v1.FileSync/DiffCopy"));
    assert!(methods
        .iter()
        .any(|m| m == "/moby.filesync.v1.FileSend/DiffCopy"));

    let (daemon_io, daemon_side) = tokio::io::duplex(64 * 1024);
    let splits = splits(&mut input);
    let (inject_tx, inject_rx) = mpsc::channel(4);
    let (polyarch_ended, sending, to_polyarch) = pump(attached, daemon_side, splits, inject_rx);

    if mode == 7 {
        // The input as the daemon's whole HTTP/2 stream, after the preface or not.
        let mut raw = Vec::new();
        if input.below(2) == 0 {
            raw.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        }
        raw.extend_from_slice(&data[input.pos.min(data.len())..]);
        let (mut r, mut w) = tokio::io::split(daemon_io);
        let _ = w.write_all(&raw).await;
        // Whatever polyarch answers, read and dropped.
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(w);
        sending.abort();
        drop(to_polyarch);
        tokio::time::timeout(WAIT, polyarch_ended)
            .await
            .expect("polyarch's side of the session did not end")
            .unwrap();
        drain.abort();
        drop(session);
        return;
    }

    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(daemon_io),
    )
    .await
    .expect("HTTP/2 handshake");
    let connection = tokio::spawn(connection);

    for _ in 0..MAX_ACTIONS {
        if input.done() {
            break;
        }
        let step =
            tokio::time::timeout(WAIT, act(&mut send, &mut input, &inject_tx, &export, debug))
                .await
                .expect("a call did not end");
        if !step {
            break;
        }
    }

    // BuildKit ends the session: polyarch's side must end as well.
    drop(send);
    connection.abort();
    sending.abort();
    drop(to_polyarch);
    drop(inject_tx);
    tokio::time::timeout(WAIT, polyarch_ended)
        .await
        .expect("polyarch's side of the session did not end")
        .unwrap();
    drop(session);
}

fuzz_target!(|data: &[u8]| {
    let scratch = tempfile::Builder::new()
        .prefix("polyarch-fuzz-session-")
        .tempdir_in(&fixture().spool)
        .expect("temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(data, scratch.path()));
    runtime.shutdown_timeout(WAIT);
});

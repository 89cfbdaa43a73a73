//! fsutil's file sync sender: serves a directory to BuildKit over the session.
//!
//! BuildKit (the receiver) opens `FileSync/DiffCopy` naming a directory and its filters in
//! the gRPC metadata. The sender walks the directory and sends one STAT packet per entry
//! then an empty STAT; the receiver diffs that list against its own copy and sends REQ
//! packets (an index into the STAT sequence) for the files it lacks, answered with DATA
//! packets and an empty DATA; the receiver's FIN is answered with FIN. This follows
//! tonistiigi/fsutil (send.go, filter.go, followlinks.go, stat.go) and moby/patternmatcher
//! so BuildKit sees the same entries, modes and order as from the Docker CLI or buildx.
//!
//! Not sent, unlike fsutil: extended attributes (reading them needs `libc`), and names that
//! are not UTF-8 (protobuf strings must be; such an entry fails the transfer unless excluded).
//! The `override-excludes` key is ignored: BuildKit dropped it in 2023, and it only mattered
//! for excludes held by the client, which `SyncedDirs` has none of.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bollard_buildkit_proto::fsutil::types::{packet::PacketType, Packet, Stat};
use bollard_buildkit_proto::moby::filesync::v1::file_sync_server::FileSync;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

mod follow;
mod patterns;
mod send;
mod walk;

use follow::*;
use patterns::*;
pub use send::{replay, send};
pub use walk::Filter;
use walk::*;

/// fsutil copies file contents through a 32 KiB buffer, so no DATA packet is larger.
pub const CHUNK_SIZE: usize = 32 * 1024;
/// fsutil serves requested files with four workers.
const FILE_WORKERS: usize = 4;
/// Packets queued towards the receiver: memory stays at a few chunks per transfer.
const OUTGOING_QUEUE: usize = 16;
/// Stats the walker may run ahead of the network.
const STAT_QUEUE: usize = 128;

// Go's os.FileMode type bits: fsutil sends `uint32(fi.Mode())`, not the Unix st_mode.
const MODE_DIR: u32 = 1 << 31;
const MODE_SYMLINK: u32 = 1 << 27;
const MODE_DEVICE: u32 = 1 << 26;
const MODE_NAMED_PIPE: u32 = 1 << 25;
const MODE_SOCKET: u32 = 1 << 24;
const MODE_SETUID: u32 = 1 << 23;
const MODE_SETGID: u32 = 1 << 22;
const MODE_CHAR_DEVICE: u32 = 1 << 21;
const MODE_STICKY: u32 = 1 << 20;
const MODE_IRREGULAR: u32 = 1 << 19;
/// Go's os.ModeType; an entry without these bits is one the receiver may request.
const MODE_TYPE: u32 = MODE_DIR
    | MODE_SYMLINK
    | MODE_NAMED_PIPE
    | MODE_SOCKET
    | MODE_DEVICE
    | MODE_CHAR_DEVICE
    | MODE_IRREGULAR;

/// Metadata keys of BuildKit's session/filesync.
const KEY_DIR_NAME: &str = "dir-name";
const KEY_INCLUDE_PATTERNS: &str = "include-patterns";
const KEY_EXCLUDE_PATTERNS: &str = "exclude-patterns";
const KEY_FOLLOW_PATHS: &str = "followpaths";

/// Why a transfer could not be served or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("no access allowed to dir {0:?}")]
    UnknownDir(String),
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("invalid {kind} pattern {pattern:?}: {reason}")]
    BadPattern {
        kind: &'static str,
        pattern: String,
        reason: &'static str,
    },
    #[error("invalid metadata {key}: {reason}")]
    BadMetadata { key: String, reason: &'static str },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0:?} is not valid UTF-8, so it cannot be sent; exclude it")]
    NotUtf8(PathBuf),
    #[error("more entries than fsutil's 32-bit file ids can address")]
    TooManyEntries,
    #[error("invalid file id {0}")]
    InvalidId(u32),
    #[error("error from receiver: {0}")]
    Receiver(String),
    #[error("receiver closed the stream before FIN")]
    Closed,
    #[error("receiver stream failed: {0}")]
    Transport(String),
    #[error("file transfer worker failed: {0}")]
    Worker(String),
    #[error("transfer cancelled")]
    Cancelled,
}

impl SyncError {
    fn io(path: &Path, source: io::Error) -> Self {
        SyncError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<&SyncError> for Status {
    fn from(error: &SyncError) -> Status {
        let message = error.to_string();
        match error {
            SyncError::UnknownDir(_) => Status::not_found(message),
            SyncError::NotADirectory(_) => Status::failed_precondition(message),
            SyncError::BadPattern { .. }
            | SyncError::BadMetadata { .. }
            | SyncError::InvalidId(_) => Status::invalid_argument(message),
            SyncError::Receiver(_) => Status::aborted(message),
            SyncError::Closed | SyncError::Transport(_) | SyncError::Cancelled => {
                Status::cancelled(message)
            }
            SyncError::Io { .. }
            | SyncError::NotUtf8(_)
            | SyncError::TooManyEntries
            | SyncError::Worker(_) => Status::internal(message),
        }
    }
}

/// One diff_copy call as BuildKit made it and as it was answered: enough to key a cache on
/// exactly what BuildKit read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    pub dir_name: String,
    pub include_patterns: Vec<String>,
    pub exclude_patterns: Vec<String>,
    pub follow_paths: Vec<String>,
    /// Every stat sent, in order; an entry's index is its fsutil file id.
    pub entries: Vec<SentEntry>,
    /// Why the transfer failed; `None` when the receiver ended it with FIN.
    pub error: Option<String>,
}

/// One STAT packet sent, and the digest of the bytes sent if the receiver asked for them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SentEntry {
    pub path: String,
    /// Go's os.FileMode bits, as on the wire.
    pub mode: u32,
    pub size: i64,
    pub linkname: String,
    /// Hex sha256 of the DATA sent; `None` when the receiver did not request the file.
    pub sha256: Option<String>,
}

impl SentEntry {
    fn new(stat: &Stat) -> Self {
        SentEntry {
            path: stat.path.clone(),
            mode: stat.mode,
            size: stat.size,
            linkname: stat.linkname.clone(),
            sha256: None,
        }
    }
}

/// How a replay learns the sha256 of a regular file: a cache may answer from the walk's
/// own stat, so an unchanged file is not even opened, or from the opened file's; the file
/// sync tells it the hash of each file it sent.
pub trait HashFile {
    /// The hash known for `path` while its stat is `walked` (the walk's lstat).
    fn remembered(&self, path: &Path, walked: &fs::Metadata) -> Option<String>;
    fn sha256(&self, path: &Path, file: &mut fs::File) -> io::Result<String>;
    /// Reads `file`, open at `path`, in full with `read`, which answers the sha256 of the
    /// bytes it read (while sending them, say); a cache keeps that hash as one of its own
    /// reads, for a replay to find.
    fn sha256_while(
        &self,
        path: &Path,
        file: &mut fs::File,
        read: &mut dyn FnMut(&mut fs::File) -> io::Result<String>,
    ) -> io::Result<String>;
}

/// The run's [`HashFile`], shared by the session's file sync and the replays.
pub type SharedHashes = Arc<dyn HashFile + Send + Sync>;

/// The directories a session serves, by the names BuildKit asks for (`context`,
/// `dockerfile`), and the record of what it was sent. Clones share the record, so keep one
/// to read [`SyncedDirs::transfers`] after handing the other to `FileSyncServer::new`.
#[derive(Clone, Default)]
pub struct SyncedDirs {
    dirs: HashMap<String, PathBuf>,
    transfers: Arc<Mutex<Vec<Transfer>>>,
    /// Told the hash of every file sent.
    hashes: Option<SharedHashes>,
}

impl SyncedDirs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `dir` under `name`.
    pub fn with_dir(mut self, name: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.dirs.insert(name.into(), dir.into());
        self
    }

    /// Tells `hashes` the sha256 of each file it sends.
    pub fn with_hashes(mut self, hashes: Option<SharedHashes>) -> Self {
        self.hashes = hashes;
        self
    }

    /// Every diff_copy served so far, in the order they finished.
    pub fn transfers(&self) -> Vec<Transfer> {
        lock(&self.transfers).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the record down with it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[tonic::async_trait]
impl FileSync for SyncedDirs {
    type DiffCopyStream = ReceiverStream<Result<Packet, Status>>;
    type TarStreamStream = ReceiverStream<Result<Packet, Status>>;

    async fn diff_copy(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<Self::DiffCopyStream>, Status> {
        let options = SyncOptions::from_metadata(request.metadata())?;
        let root = self
            .dirs
            .get(&options.dir_name)
            .cloned()
            .ok_or_else(|| Status::from(&SyncError::UnknownDir(options.dir_name.clone())))?;
        let filter = {
            let (root, options) = (root.clone(), options.clone());
            tokio::task::spawn_blocking(move || prepare(&root, &options))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::from(&e))?
        };
        let (outgoing, response) = mpsc::channel(OUTGOING_QUEUE);
        let (transfers, hashes) = (Arc::clone(&self.transfers), self.hashes.clone());
        let incoming = request.into_inner();
        tokio::spawn(async move {
            let mut entries = Vec::new();
            let result = send(
                &root,
                &filter,
                hashes,
                incoming,
                outgoing.clone(),
                &mut entries,
            )
            .await;
            if let Err(error) = &result {
                let _ = outgoing.send(Err(Status::from(error))).await;
            }
            lock(&transfers).push(Transfer {
                dir_name: options.dir_name,
                include_patterns: options.include_patterns,
                exclude_patterns: options.exclude_patterns,
                follow_paths: options.follow_paths,
                entries,
                error: result.err().map(|e| e.to_string()),
            });
        });
        Ok(Response::new(ReceiverStream::new(response)))
    }

    async fn tar_stream(
        &self,
        _request: Request<Streaming<Packet>>,
    ) -> Result<Response<Self::TarStreamStream>, Status> {
        Err(Status::unimplemented(
            "tarstream is not served; BuildKit negotiates diffcopy",
        ))
    }
}

/// Checks the root as fsutil's NewFS does, then builds the filter (which may read links).
fn prepare(root: &Path, options: &SyncOptions) -> Result<Filter, SyncError> {
    let meta = fs::metadata(root).map_err(|e| SyncError::io(root, e))?;
    if !meta.is_dir() {
        return Err(SyncError::NotADirectory(root.to_path_buf()));
    }
    Filter::new(
        root,
        &options.include_patterns,
        &options.exclude_patterns,
        &options.follow_paths,
    )
}

/// What BuildKit asked for in the request metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SyncOptions {
    dir_name: String,
    include_patterns: Vec<String>,
    exclude_patterns: Vec<String>,
    follow_paths: Vec<String>,
}

impl SyncOptions {
    fn from_metadata(metadata: &MetadataMap) -> Result<Self, Status> {
        let values = |key: &str| decoded_values(metadata, key).map_err(|e| Status::from(&e));
        Ok(SyncOptions {
            dir_name: values(KEY_DIR_NAME)?.into_iter().next().unwrap_or_default(),
            include_patterns: values(KEY_INCLUDE_PATTERNS)?,
            exclude_patterns: values(KEY_EXCLUDE_PATTERNS)?,
            follow_paths: values(KEY_FOLLOW_PATHS)?,
        })
    }
}

/// All values of `key`. BuildKit query-escapes every value of a key holding non-ASCII text
/// and flags it with `<key>-encoded: 1`, since gRPC headers are ASCII.
fn decoded_values(metadata: &MetadataMap, key: &str) -> Result<Vec<String>, SyncError> {
    let bad = |reason| SyncError::BadMetadata {
        key: key.to_string(),
        reason,
    };
    let encoded = metadata
        .get(format!("{key}-encoded"))
        .and_then(|v| v.to_str().ok())
        .is_some_and(go_parse_bool);
    metadata
        .get_all(key)
        .iter()
        .map(|value| {
            // Older BuildKit (Docker 20.10's) sends non-ASCII paths as raw UTF-8 bytes
            // instead of escaping them.
            let text =
                std::str::from_utf8(value.as_encoded_bytes()).map_err(|_| bad("not UTF-8"))?;
            if encoded {
                query_unescape(text).ok_or_else(|| bad("bad query escaping"))
            } else {
                Ok(text.to_string())
            }
        })
        .collect()
}

/// Go's strconv.ParseBool, true side; anything else (errors included) is false.
fn go_parse_bool(text: &str) -> bool {
    matches!(text, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Go's url.QueryUnescape: `+` is a space, `%XX` a byte; the result must be UTF-8 here.
fn query_unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;

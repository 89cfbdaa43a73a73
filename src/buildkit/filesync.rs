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

/// The directories a session serves, by the names BuildKit asks for (`context`,
/// `dockerfile`), and the record of what it was sent. Clones share the record, so keep one
/// to read [`SyncedDirs::transfers`] after handing the other to `FileSyncServer::new`.
#[derive(Clone, Debug, Default)]
pub struct SyncedDirs {
    dirs: HashMap<String, PathBuf>,
    transfers: Arc<Mutex<Vec<Transfer>>>,
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
        let transfers = Arc::clone(&self.transfers);
        let incoming = request.into_inner();
        tokio::spawn(async move {
            let mut entries = Vec::new();
            let result = send(&root, &filter, incoming, outgoing.clone(), &mut entries).await;
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

// ---------------------------------------------------------------------------------------
// The sender.

/// Serves `root` to one receiver, as fsutil's `Send`: every STAT, an empty STAT, DATA for
/// each REQ, FIN for FIN. `entries` receives every stat sent (its index is the file id) and
/// the sha256 of each file sent, even when the transfer fails part way. A walk error or a
/// bad REQ is sent to the receiver as an ERR packet before the error is returned.
pub async fn send<S>(
    root: &Path,
    filter: &Filter,
    incoming: S,
    outgoing: mpsc::Sender<Result<Packet, Status>>,
    entries: &mut Vec<SentEntry>,
) -> Result<(), SyncError>
where
    S: Stream<Item = Result<Packet, Status>>,
{
    let stop = Arc::new(AtomicBool::new(false));
    // File workers outlive this function in spawn_blocking; they check this between chunks.
    let _stop_on_return = StopOnDrop(Arc::clone(&stop));

    let (stat_tx, mut stats) = mpsc::channel(STAT_QUEUE);
    {
        let (root, filter) = (root.to_path_buf(), filter.clone());
        tokio::task::spawn_blocking(move || {
            let result = walk_tree(&root, &filter, &mut |stat| {
                stat_tx
                    .blocking_send(Ok(stat))
                    .map_err(|_| SyncError::Cancelled)
            });
            if let Err(error) = result {
                let _ = stat_tx.blocking_send(Err(error));
            }
        });
    }

    let mut incoming = std::pin::pin!(incoming);
    // Files the receiver may still request, by id; fsutil serves each id once.
    let mut requestable: HashMap<u32, String> = HashMap::new();
    let mut walking = true;
    let workers = Arc::new(Semaphore::new(FILE_WORKERS));
    let mut jobs: JoinSet<FileSent> = JoinSet::new();

    loop {
        tokio::select! {
            stat = stats.recv(), if walking => match stat {
                Some(Ok(stat)) => {
                    let Ok(id) = u32::try_from(entries.len()) else {
                        return Err(fail(&outgoing, SyncError::TooManyEntries).await);
                    };
                    // fsutil numbers every stat, directories included, but only entries
                    // without type bits can be requested.
                    if stat.mode & MODE_TYPE == 0 {
                        requestable.insert(id, stat.path.clone());
                    }
                    entries.push(SentEntry::new(&stat));
                    let stat = Packet { stat: Some(stat), ..packet(PacketType::PacketStat) };
                    emit(&outgoing, stat).await?;
                }
                Some(Err(error)) => return Err(fail(&outgoing, error).await),
                None => {
                    walking = false;
                    emit(&outgoing, packet(PacketType::PacketStat)).await?;
                }
            },
            received = incoming.next() => {
                let received = match received {
                    None => return Err(SyncError::Closed),
                    Some(Err(status)) => {
                        return Err(SyncError::Transport(status.message().to_string()))
                    }
                    Some(Ok(received)) => received,
                };
                match PacketType::try_from(received.r#type) {
                    Ok(PacketType::PacketReq) => {
                        let id = received.id;
                        let Some(path) = requestable.remove(&id) else {
                            return Err(fail(&outgoing, SyncError::InvalidId(id)).await);
                        };
                        let job = FileJob {
                            withheld: !filter.opens(&path),
                            path: root.join(path),
                            id,
                            out: outgoing.clone(),
                            stop: Arc::clone(&stop),
                        };
                        jobs.spawn(job.run(Arc::clone(&workers)));
                    }
                    Ok(PacketType::PacketFin) => {
                        while let Some(done) = jobs.join_next().await {
                            finish_job(entries, done, &outgoing).await?;
                        }
                        return emit(&outgoing, packet(PacketType::PacketFin)).await;
                    }
                    Ok(PacketType::PacketErr) => {
                        let message = String::from_utf8_lossy(&received.data).into_owned();
                        return Err(SyncError::Receiver(message));
                    }
                    // fsutil's sender ignores anything else the receiver sends.
                    _ => {}
                }
            },
            Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                finish_job(entries, done, &outgoing).await?;
            }
        }
    }
}

/// A requested file's id and the hex sha256 of the bytes sent for it.
type FileSent = Result<(u32, String), SyncError>;

/// One REQ to answer.
struct FileJob {
    path: PathBuf,
    /// Listed by the walk but refused by the filter's open check: sent empty.
    withheld: bool,
    id: u32,
    out: mpsc::Sender<Result<Packet, Status>>,
    stop: Arc<AtomicBool>,
}

impl FileJob {
    /// Waits for one of the workers, then streams the file from a blocking thread.
    async fn run(self, workers: Arc<Semaphore>) -> FileSent {
        let _permit = workers
            .acquire_owned()
            .await
            .map_err(|_| SyncError::Cancelled)?;
        tokio::task::spawn_blocking(move || self.send())
            .await
            .map_err(|e| SyncError::Worker(e.to_string()))?
    }

    /// Streams the file as DATA packets of at most [`CHUNK_SIZE`], then the empty DATA that
    /// ends it. Like fsutil, a file that can no longer be opened, or that the filter refuses
    /// to open, is sent empty.
    fn send(self) -> FileSent {
        let data = |data: Vec<u8>| {
            Ok(Packet {
                id: self.id,
                data,
                ..packet(PacketType::PacketData)
            })
        };
        let mut hasher = Sha256::new();
        let file = (!self.withheld).then(|| open_regular(&self.path)).flatten();
        if let Some(mut file) = file {
            let mut buf = vec![0; CHUNK_SIZE];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(SyncError::io(&self.path, e)),
                };
                if self.stop.load(Ordering::Relaxed) {
                    return Err(SyncError::Cancelled);
                }
                hasher.update(&buf[..n]);
                self.out
                    .blocking_send(data(buf[..n].to_vec()))
                    .map_err(|_| SyncError::Closed)?;
            }
        }
        self.out
            .blocking_send(data(Vec::new()))
            .map_err(|_| SyncError::Closed)?;
        Ok((self.id, hex::encode(hasher.finalize())))
    }
}

/// What a transfer with `filter` would send from `root` now: every entry as
/// [`SentEntry`], with the sha256 of each regular file's content (not only the requested
/// ones), so a later replay can tell whether BuildKit would read the same thing.
/// Blocking.
pub fn replay(root: &Path, filter: &Filter) -> Result<Vec<SentEntry>, SyncError> {
    let mut entries = Vec::new();
    walk_tree(root, filter, &mut |stat| {
        let mut entry = SentEntry::new(&stat);
        if stat.mode & MODE_TYPE == 0 && stat.linkname.is_empty() {
            let path = root.join(&stat.path);
            let mut hasher = Sha256::new();
            let file = filter
                .opens(&stat.path)
                .then(|| open_regular(&path))
                .flatten();
            if let Some(mut file) = file {
                io::copy(&mut file, &mut hasher).map_err(|e| SyncError::io(&path, e))?;
            }
            entry.sha256 = Some(hex::encode(hasher.finalize()));
        }
        entries.push(entry);
        Ok(())
    })?;
    Ok(entries)
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn packet(kind: PacketType) -> Packet {
    Packet {
        r#type: kind as i32,
        ..Default::default()
    }
}

async fn emit(
    outgoing: &mpsc::Sender<Result<Packet, Status>>,
    packet: Packet,
) -> Result<(), SyncError> {
    outgoing
        .send(Ok(packet))
        .await
        .map_err(|_| SyncError::Closed)
}

/// Tells the receiver why the transfer stops, then hands the error back.
async fn fail(outgoing: &mpsc::Sender<Result<Packet, Status>>, error: SyncError) -> SyncError {
    let message = Packet {
        data: error.to_string().into_bytes(),
        ..packet(PacketType::PacketErr)
    };
    let _ = outgoing.send(Ok(message)).await;
    error
}

async fn finish_job(
    entries: &mut [SentEntry],
    done: Result<FileSent, tokio::task::JoinError>,
    outgoing: &mpsc::Sender<Result<Packet, Status>>,
) -> Result<(), SyncError> {
    match done {
        Ok(Ok((id, sha256))) => {
            if let Some(entry) = entries.get_mut(id as usize) {
                entry.sha256 = Some(sha256);
            }
            Ok(())
        }
        Ok(Err(error)) => Err(fail(outgoing, error).await),
        Err(join) => Err(fail(outgoing, SyncError::Worker(join.to_string())).await),
    }
}

/// Opens `path` only while it is a regular file, so a socket (which fsutil sends with a
/// plain-file mode) or a file swapped for a FIFO or a link since the walk is never read.
fn open_regular(path: &Path) -> Option<fs::File> {
    let before = fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_file())?;
    let file = fs::File::open(path).ok()?;
    let after = file.metadata().ok()?;
    (after.dev() == before.dev() && after.ino() == before.ino()).then_some(file)
}

// ---------------------------------------------------------------------------------------
// The walk.

/// Include and exclude patterns, as fsutil's FilterOpt with BuildKit's metadata applied;
/// the default lets everything through.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    include: Option<Matcher>,
    exclude: Option<Matcher>,
    /// No include pattern has wildcards before a trailing `/**` or `/*`, so an unmatched
    /// directory that no pattern names a prefix of can be skipped whole.
    only_prefix_includes: bool,
    /// The same for the `!` exceptions among the exclude patterns.
    only_prefix_exclude_exceptions: bool,
}

impl Filter {
    /// Compiles the patterns (patternmatcher syntax: `*`, `?`, `[...]`, `**`, `!` for an
    /// exception) and resolves `follow_paths` against `root`: each path, and every symlink
    /// along it, becomes an include pattern; links resolve inside `root` as if it were `/`.
    /// Reads links under `root`, so call it off the async runtime.
    pub fn new(
        root: &Path,
        include_patterns: &[String],
        exclude_patterns: &[String],
        follow_paths: &[String],
    ) -> Result<Self, SyncError> {
        let mut includes = include_patterns.to_vec();
        if !follow_paths.is_empty() {
            // `None` means a followpath resolved to the root: it adds nothing.
            if let Some(targets) = follow_links(root, follow_paths)? {
                includes.extend(targets);
                includes = dedupe_paths(&includes).unwrap_or_default();
            }
        }
        let include = (!includes.is_empty())
            .then(|| Matcher::new(&includes, "include"))
            .transpose()?;
        let exclude = (!exclude_patterns.is_empty())
            .then(|| Matcher::new(exclude_patterns, "exclude"))
            .transpose()?;
        let prefix_only = |matcher: &Option<Matcher>, exclusions: bool| {
            matcher.as_ref().is_none_or(|m| {
                m.patterns
                    .iter()
                    .filter(|p| p.exclusion == exclusions)
                    .all(|p| !without_trailing_glob(&p.text).contains(PATTERN_CHARS))
            })
        };
        Ok(Filter {
            only_prefix_includes: prefix_only(&include, false),
            only_prefix_exclude_exceptions: prefix_only(&exclude, true),
            include,
            exclude,
        })
    }
}

impl Filter {
    /// Whether fsutil's filtered file system opens `path` for its content. It decides with
    /// patternmatcher's MatchesOrParentMatches, which re-checks every pattern against every
    /// parent, where the walk reuses parents' results and skips patterns that cannot change
    /// the outcome so far; the two disagree (`src`, `!src/src`, `src` lists
    /// `src/src/keep.txt` but refuses to open it), and the Docker CLI then sends the file
    /// empty. polyarch sends what the Docker CLI sends, so an ignored file's content never
    /// leaves the machine.
    pub fn opens(&self, path: &str) -> bool {
        self.include
            .as_ref()
            .is_none_or(|m| m.matches_or_parent_matches(path))
            && self
                .exclude
                .as_ref()
                .is_none_or(|m| !m.matches_or_parent_matches(path))
    }
}

/// Characters that make fsutil treat a pattern as more than a path prefix.
const PATTERN_CHARS: &[char] = &['*', '[', ']', '?', '^', '\\'];

fn without_trailing_glob(pattern: &str) -> &str {
    let pattern = pattern.strip_suffix("/**").unwrap_or(pattern);
    pattern.strip_suffix("/*").unwrap_or(pattern)
}

/// fsutil's dedupePaths: drops paths under the previous kept one; `None` if the root (`.`)
/// is among them, which means no filtering at all.
fn dedupe_paths(paths: &[String]) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    let mut last = String::new();
    for path in paths {
        if path == "." {
            return None;
        }
        if path.starts_with(&format!("{last}/")) {
            continue;
        }
        out.push(path.clone());
        last = path.clone();
    }
    Some(out)
}

/// Walks `root` in fsutil's order and hands each entry's stat to `emit`: entries of a
/// directory sorted by name bytes, each directory before its children (what the receiver's
/// order check and its own walk expect). Symlinks are never followed.
fn walk_tree(
    root: &Path,
    filter: &Filter,
    emit: &mut dyn FnMut(Stat) -> Result<(), SyncError>,
) -> Result<(), SyncError> {
    Walker {
        root,
        filter,
        emit,
        hardlinks: HashMap::new(),
        pending: Vec::new(),
    }
    .walk_dir(&[], None, None, false)
}

struct Walker<'a> {
    root: &'a Path,
    filter: &'a Filter,
    emit: &'a mut dyn FnMut(Stat) -> Result<(), SyncError>,
    /// First path sent for each multiply-linked inode; later links name it as linkname.
    hardlinks: HashMap<(u64, u64), String>,
    /// The directories above the current entry; filtered-out ones are sent just before
    /// their first sent descendant, so the receiver always sees parents first.
    pending: Vec<PendingDir>,
}

struct PendingDir {
    rel: Vec<u8>,
    meta: Metadata,
    sent: bool,
}

impl Walker<'_> {
    fn abs(&self, rel: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(rel))
    }

    fn walk_dir(
        &mut self,
        dir: &[u8],
        include_parent: Option<&[bool]>,
        exclude_parent: Option<&[bool]>,
        filtered_out: bool,
    ) -> Result<(), SyncError> {
        let abs = self.abs(dir);
        let names = match read_sorted(&abs) {
            Ok(names) => names,
            // Gone since it was listed: fsutil skips it.
            Err(e) if is_not_exist(&e) => return Ok(()),
            // fsutil tolerates unreadable directories only when they are filtered out.
            Err(e) if filtered_out && e.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
            Err(e) => return Err(SyncError::io(&abs, e)),
        };
        for (name, file_type) in names {
            let mut rel = dir.to_vec();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
            let text = String::from_utf8_lossy(&rel);
            let is_dir = file_type.is_dir();

            let mut skip = false;
            let mut include_info = Vec::new();
            if let Some(matcher) = &self.filter.include {
                let (matched, info) = matcher.matches(&text, include_parent);
                if !matched {
                    if is_dir
                        && self.filter.only_prefix_includes
                        && !matcher.may_match_inside(&text, false)
                    {
                        continue;
                    }
                    skip = true;
                }
                include_info = info;
            }
            let mut exclude_info = Vec::new();
            if let Some(matcher) = &self.filter.exclude {
                let (matched, info) = matcher.matches(&text, exclude_parent);
                if matched {
                    if is_dir
                        && self.filter.only_prefix_exclude_exceptions
                        && !matcher.may_match_inside(&text, true)
                    {
                        continue;
                    }
                    skip = true;
                }
                exclude_info = info;
            }
            if skip && !is_dir {
                continue;
            }

            let abs = self.abs(&rel);
            let meta = match fs::symlink_metadata(&abs) {
                Ok(meta) => meta,
                Err(e) if is_not_exist(&e) => continue,
                Err(e) => return Err(SyncError::io(&abs, e)),
            };
            if !skip {
                self.send_pending()?;
                let stat = make_stat(self.root, &rel, &meta, &mut self.hardlinks)?;
                (self.emit)(stat)?;
            }
            // lstat, not the listing, decides: a directory swapped for a link is not entered.
            if is_dir && meta.is_dir() {
                self.pending.push(PendingDir {
                    rel: rel.clone(),
                    meta,
                    sent: !skip,
                });
                let result = self.walk_dir(&rel, Some(&include_info), Some(&exclude_info), skip);
                self.pending.pop();
                result?;
            }
        }
        Ok(())
    }

    fn send_pending(&mut self) -> Result<(), SyncError> {
        for dir in self.pending.iter_mut().filter(|d| !d.sent) {
            let stat = make_stat(self.root, &dir.rel, &dir.meta, &mut self.hardlinks)?;
            (self.emit)(stat)?;
            dir.sent = true;
        }
        Ok(())
    }
}

fn is_not_exist(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// A directory's entries sorted by name bytes, as Go's os.ReadDir returns them.
fn read_sorted(dir: &Path) -> io::Result<Vec<(Vec<u8>, fs::FileType)>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        match entry.file_type() {
            Ok(file_type) => entries.push((entry.file_name().as_bytes().to_vec(), file_type)),
            Err(e) if is_not_exist(&e) => {}
            Err(e) => return Err(e),
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

fn utf8(bytes: &[u8]) -> Result<String, SyncError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|e| SyncError::NotUtf8(PathBuf::from(OsStr::from_bytes(e.as_bytes()))))
}

/// The stat fsutil's mkstat makes from an lstat.
fn make_stat(
    root: &Path,
    rel: &[u8],
    meta: &Metadata,
    hardlinks: &mut HashMap<(u64, u64), String>,
) -> Result<Stat, SyncError> {
    let path = utf8(rel)?;
    let file_type = meta.file_type();
    let mut stat = Stat {
        path,
        mode: go_mode(meta),
        uid: meta.uid(),
        gid: meta.gid(),
        mod_time: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        ..Default::default()
    };
    if !file_type.is_dir() {
        stat.size = i64::try_from(meta.len()).unwrap_or(i64::MAX);
        if file_type.is_block_device() || file_type.is_char_device() {
            let (major, minor) = dev_major_minor(meta.rdev());
            stat.devmajor = major;
            stat.devminor = minor;
        }
        // A second name for an inode already sent goes as a hard link to the first.
        if meta.nlink() > 1 {
            match hardlinks.entry((meta.dev(), meta.ino())) {
                Entry::Occupied(first) => stat.linkname = first.get().clone(),
                Entry::Vacant(slot) => {
                    slot.insert(stat.path.clone());
                }
            }
        }
        if file_type.is_symlink() {
            let abs = root.join(OsStr::from_bytes(rel));
            let target = fs::read_link(&abs).map_err(|e| SyncError::io(&abs, e))?;
            stat.linkname = utf8(target.as_os_str().as_bytes())?;
        }
    }
    Ok(stat)
}

/// Go's os.FileMode for an lstat: permission bits plus Go's own type and special bits.
fn go_mode(meta: &Metadata) -> u32 {
    let unix = meta.mode();
    let file_type = meta.file_type();
    let mut mode = unix & 0o777;
    if file_type.is_dir() {
        mode |= MODE_DIR;
    } else if file_type.is_symlink() {
        mode |= MODE_SYMLINK;
    } else if file_type.is_fifo() {
        mode |= MODE_NAMED_PIPE;
    } else if file_type.is_block_device() {
        mode |= MODE_DEVICE;
    } else if file_type.is_char_device() {
        mode |= MODE_DEVICE | MODE_CHAR_DEVICE;
    }
    // Sockets get no type bit: fsutil clears ModeSocket since archive/tar cannot store it.
    if unix & 0o4000 != 0 {
        mode |= MODE_SETUID;
    }
    if unix & 0o2000 != 0 {
        mode |= MODE_SETGID;
    }
    if unix & 0o1000 != 0 {
        mode |= MODE_STICKY;
    }
    mode
}

/// fsutil's major/minor split of st_rdev (Linux's traditional encoding).
fn dev_major_minor(rdev: u64) -> (i64, i64) {
    let major = (rdev >> 8) & 0xfff;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    (major as i64, minor as i64)
}

// ---------------------------------------------------------------------------------------
// Patterns, with moby/patternmatcher's semantics.

#[derive(Clone, Debug)]
struct Matcher {
    patterns: Vec<Pattern>,
}

#[derive(Clone, Debug)]
struct Pattern {
    /// The cleaned pattern without its `!`.
    text: String,
    exclusion: bool,
    kind: Kind,
}

/// patternmatcher's fast paths, and the general case it hands to a regexp.
#[derive(Clone, Debug)]
enum Kind {
    Exact,
    /// Ends in `**` with no other wildcard: a plain string prefix.
    Prefix,
    /// Starts with `**` with no other wildcard: a plain string suffix.
    Suffix,
    Tokens(Vec<Token>),
}

#[derive(Clone, Debug)]
enum Token {
    Char(char),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `?`: one character other than `/`.
    AnyOne,
    /// `*`: any run of characters other than `/`.
    AnyRun,
    /// `**/` inside a pattern: nothing, or anything ending in `/`.
    DirPrefix,
    /// `**` ending a pattern that has other wildcards: anything.
    Rest,
}

impl Matcher {
    fn new(patterns: &[String], kind: &'static str) -> Result<Self, SyncError> {
        let mut compiled = Vec::new();
        for raw in patterns {
            let bad = |reason| SyncError::BadPattern {
                kind,
                pattern: raw.clone(),
                reason,
            };
            let trimmed = raw.trim();
            if trimmed.is_empty() {
                continue;
            }
            let cleaned = go_clean(trimmed);
            let (exclusion, text) = match cleaned.strip_prefix('!') {
                Some("") => return Err(bad("\"!\" alone excludes nothing")),
                Some(rest) => (true, rest.to_string()),
                None => (false, cleaned.clone()),
            };
            let kind = compile(&text).map_err(bad)?;
            compiled.push(Pattern {
                text,
                exclusion,
                kind,
            });
        }
        Ok(Matcher { patterns: compiled })
    }

    /// patternmatcher's MatchesUsingParentResults: whether `path` matches, and per pattern
    /// whether it or a parent matched, for the children's call. The walk always passes the
    /// parent's results below the top level, where paths have no parent to check.
    fn matches(&self, path: &str, parent: Option<&[bool]>) -> (bool, Vec<bool>) {
        let mut matched = false;
        let mut info = vec![false; self.patterns.len()];
        for (i, pattern) in self.patterns.iter().enumerate() {
            let mut hit = parent.and_then(|p| p.get(i).copied()).unwrap_or(false);
            if !hit {
                // Only a pattern that can change the outcome is evaluated.
                if pattern.exclusion != matched {
                    continue;
                }
                hit = pattern.matches(path);
            }
            info[i] = hit;
            if hit {
                matched = !pattern.exclusion;
            }
        }
        (matched, info)
    }

    /// patternmatcher's MatchesOrParentMatches: each pattern that can change the outcome is
    /// checked against `path` and, failing that, against each of its parents.
    fn matches_or_parent_matches(&self, path: &str) -> bool {
        let parents: Vec<&str> = path
            .match_indices('/')
            .map(|(end, _)| &path[..end])
            .collect();
        let mut matched = false;
        for pattern in &self.patterns {
            if pattern.exclusion != matched {
                continue;
            }
            if pattern.matches(path) || parents.iter().any(|p| pattern.matches(p)) {
                matched = !pattern.exclusion;
            }
        }
        matched
    }

    /// Whether a pattern of this polarity names something below `dir`, so the directory
    /// must be walked even though it does not pass the filter itself.
    fn may_match_inside(&self, dir: &str, exclusions: bool) -> bool {
        let dir = format!("{dir}/");
        self.patterns
            .iter()
            .filter(|p| p.exclusion == exclusions)
            .any(|p| format!("{}/", without_trailing_glob(&p.text)).starts_with(&dir))
    }
}

impl Pattern {
    fn matches(&self, path: &str) -> bool {
        match &self.kind {
            Kind::Exact => path == self.text,
            Kind::Prefix => path.starts_with(&self.text[..self.text.len() - 2]),
            Kind::Suffix => {
                let suffix = &self.text[2..];
                // `**/foo` also matches `foo` itself.
                path.ends_with(suffix) || suffix.strip_prefix('/') == Some(path)
            }
            Kind::Tokens(tokens) => match_tokens(tokens, path),
        }
    }
}

/// Translates a cleaned pattern as patternmatcher's compile does, including which fast
/// path it takes. Syntax errors are those Go's filepath.Match reports.
fn compile(pattern: &str) -> Result<Kind, &'static str> {
    #[derive(PartialEq)]
    enum Detected {
        Exact,
        Prefix,
        Suffix,
        Tokens,
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut detected = Detected::Exact;
    let mut pos = 0;
    let mut first = true;
    while pos < chars.len() {
        let ch = chars[pos];
        pos += 1;
        match ch {
            '*' if chars.get(pos) == Some(&'*') => {
                pos += 1;
                if chars.get(pos) == Some(&'/') {
                    pos += 1;
                }
                if pos == chars.len() {
                    if detected == Detected::Exact {
                        detected = Detected::Prefix;
                    } else {
                        tokens.push(Token::Rest);
                        detected = Detected::Tokens;
                    }
                } else {
                    tokens.push(Token::DirPrefix);
                    detected = Detected::Tokens;
                }
                if first {
                    detected = Detected::Suffix;
                }
            }
            '*' => {
                tokens.push(Token::AnyRun);
                detected = Detected::Tokens;
            }
            '?' => {
                tokens.push(Token::AnyOne);
                detected = Detected::Tokens;
            }
            '\\' => {
                let escaped = chars.get(pos).ok_or("trailing backslash")?;
                pos += 1;
                tokens.push(Token::Char(*escaped));
                detected = Detected::Tokens;
            }
            '[' => {
                let (class, next) = parse_class(&chars, pos)?;
                pos = next;
                tokens.push(class);
                detected = Detected::Tokens;
            }
            ']' => {
                tokens.push(Token::Char(']'));
                detected = Detected::Tokens;
            }
            other => tokens.push(Token::Char(other)),
        }
        first = false;
    }
    Ok(match detected {
        Detected::Exact => Kind::Exact,
        Detected::Prefix => Kind::Prefix,
        Detected::Suffix => Kind::Suffix,
        Detected::Tokens => Kind::Tokens(tokens),
    })
}

/// A `[...]` class after its `[`, with filepath.Match's grammar: `^` negates, `a-z` ranges,
/// `\` escapes, and an unescaped `-` or `]` where a character belongs is an error.
fn parse_class(chars: &[char], mut pos: usize) -> Result<(Token, usize), &'static str> {
    let class_char = |pos: usize| -> Result<(char, usize), &'static str> {
        match chars.get(pos) {
            None => Err("unterminated character class"),
            Some('-' | ']') => Err("bad character class"),
            Some('\\') => chars
                .get(pos + 1)
                .map(|c| (*c, pos + 2))
                .ok_or("unterminated character class"),
            Some(c) => Ok((*c, pos + 1)),
        }
    };
    let negated = chars.get(pos) == Some(&'^');
    if negated {
        pos += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if chars.get(pos) == Some(&']') && !ranges.is_empty() {
            return Ok((Token::Class { negated, ranges }, pos + 1));
        }
        let (lo, next) = class_char(pos)?;
        pos = next;
        let mut hi = lo;
        if chars.get(pos) == Some(&'-') {
            (hi, pos) = class_char(pos + 1)?;
            if hi < lo {
                return Err("bad range in character class");
            }
        }
        ranges.push((lo, hi));
    }
}

/// Whether `tokens` match all of `text`, by tracking every position reachable so far.
fn match_tokens(tokens: &[Token], text: &str) -> bool {
    let text: Vec<char> = text.chars().collect();
    let n = text.len();
    let mut states = vec![false; n + 1];
    states[0] = true;
    for token in tokens {
        let mut next = vec![false; n + 1];
        for start in (0..=n).filter(|&j| states[j]) {
            let current = text.get(start).copied();
            match token {
                Token::Char(c) => {
                    if current == Some(*c) {
                        next[start + 1] = true;
                    }
                }
                Token::Class { negated, ranges } => {
                    if let Some(c) = current {
                        let inside = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                        if inside != *negated {
                            next[start + 1] = true;
                        }
                    }
                }
                Token::AnyOne => {
                    if current.is_some_and(|c| c != '/') {
                        next[start + 1] = true;
                    }
                }
                Token::AnyRun => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '/' {
                            break;
                        }
                        next[end + 1] = true;
                    }
                }
                // Go's regexp `.` does not match a newline.
                Token::DirPrefix => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '\n' {
                            break;
                        }
                        if c == '/' {
                            next[end + 1] = true;
                        }
                    }
                }
                Token::Rest => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '\n' {
                            break;
                        }
                        next[end + 1] = true;
                    }
                }
            }
        }
        states = next;
    }
    states[n]
}

/// Go's filepath.Clean for `/`-separated paths.
fn go_clean(path: &str) -> String {
    if path.is_empty() {
        return ".".to_string();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            name => parts.push(name),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".to_string(),
        (false, false) => body,
    }
}

/// Go's filepath.Join of two elements.
fn go_join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => String::new(),
        (true, false) => go_clean(b),
        (false, true) => go_clean(a),
        (false, false) => go_clean(&format!("{a}/{b}")),
    }
}

/// Go's filepath.Dir and Base of a cleaned relative path.
fn split_dir_base(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or((".", path))
}

// ---------------------------------------------------------------------------------------
// followpaths, with fsutil's FollowLinks semantics.

/// Every followpath and every symlink met along it, resolved inside `root`, sorted and
/// deduplicated; `None` when one resolves to the root itself.
fn follow_links(root: &Path, paths: &[String]) -> Result<Option<Vec<String>>, SyncError> {
    let mut resolver = LinkResolver {
        root,
        resolved: BTreeSet::new(),
    };
    for path in paths {
        resolver.resolve(path)?;
    }
    let resolved: Vec<String> = resolver.resolved.into_iter().collect();
    Ok(dedupe_paths(&resolved))
}

struct LinkResolver<'a> {
    root: &'a Path,
    resolved: BTreeSet<String>,
}

impl LinkResolver<'_> {
    /// Walks `path` a component at a time; at a symlink, records it and continues from its
    /// target. Each symlink is followed once, which ends loops.
    fn resolve(&mut self, path: &str) -> Result<(), SyncError> {
        let mut rest = go_join(".", path);
        let mut current = ".".to_string();
        loop {
            let (first, tail) = rest.split_once('/').unwrap_or((&rest, ""));
            current = go_join(&current, first);
            let tail = tail.to_string();
            let targets = self.read_symlink(&current, true)?;
            rest = tail;
            if (rest.is_empty() || !targets.is_empty()) && self.resolved.contains(&current) {
                return Ok(());
            }
            if !targets.is_empty() {
                self.resolved.insert(current);
                for target in targets {
                    // Targets are rooted at `/`; joining with "." makes them root-relative.
                    self.resolve(&go_join(&target, &rest))?;
                }
                return Ok(());
            }
            if rest.is_empty() {
                self.resolved.insert(current);
                return Ok(());
            }
        }
    }

    /// The targets of the symlink at `path` (several when its last component is a
    /// wildcard), each as an absolute path within the root; empty if it is not a symlink.
    fn read_symlink(&self, path: &str, wildcards: bool) -> Result<Vec<String>, SyncError> {
        let (dir, base) = split_dir_base(path);
        if wildcards && contains_wildcards(base) {
            let mut targets = Vec::new();
            if let Some(glob) = glob_tokens(base) {
                for name in self.list_dir(dir)? {
                    if match_tokens(&glob, &name) {
                        targets.extend(self.read_symlink(&go_join(dir, &name), false)?);
                    }
                }
            }
            return Ok(targets);
        }
        let Some(meta) = self.lstat(path)? else {
            return Ok(Vec::new());
        };
        if !meta.file_type().is_symlink() {
            return Ok(Vec::new());
        }
        let abs = self.root.join(path);
        let link = fs::read_link(&abs).map_err(|e| SyncError::io(&abs, e))?;
        let link = go_clean(&link.to_string_lossy());
        Ok(vec![if link.starts_with('/') {
            link
        } else {
            go_join("/", &go_join(dir, &link))
        }])
    }

    /// lstat of a root-relative path, refusing to pass through a symlink or out of the
    /// root on the way; `None` when there is nothing there.
    fn lstat(&self, path: &str) -> Result<Option<Metadata>, SyncError> {
        if path == "." || path == ".." || path.starts_with("../") {
            return Ok(None);
        }
        let mut abs = self.root.to_path_buf();
        let components: Vec<&str> = path.split('/').collect();
        for (i, component) in components.iter().enumerate() {
            abs.push(component);
            let meta = match fs::symlink_metadata(&abs) {
                Ok(meta) => meta,
                Err(e) if is_not_exist(&e) => return Ok(None),
                Err(e) => return Err(SyncError::io(&abs, e)),
            };
            if i + 1 == components.len() {
                return Ok(Some(meta));
            }
            if !meta.is_dir() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Names in a root-relative directory, sorted; empty if it is not a directory.
    fn list_dir(&self, dir: &str) -> Result<Vec<String>, SyncError> {
        let abs = if dir == "." {
            self.root.to_path_buf()
        } else {
            match self.lstat(dir)? {
                Some(meta) if meta.is_dir() => self.root.join(dir),
                _ => return Ok(Vec::new()),
            }
        };
        match read_sorted(&abs) {
            Ok(entries) => Ok(entries
                .into_iter()
                .map(|(name, _)| String::from_utf8_lossy(&name).into_owned())
                .collect()),
            Err(e) if is_not_exist(&e) => Ok(Vec::new()),
            Err(e) => Err(SyncError::io(&abs, e)),
        }
    }
}

/// fsutil's containsWildcards: `*`, `?` or `[` not escaped by a backslash.
fn contains_wildcards(name: &str) -> bool {
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

/// A single path component's glob as Go's filepath.Match reads it; `None` when malformed,
/// which filepath.Match reports as no match.
fn glob_tokens(pattern: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut pos = 0;
    while pos < chars.len() {
        let ch = chars[pos];
        pos += 1;
        match ch {
            '*' => tokens.push(Token::AnyRun),
            '?' => tokens.push(Token::AnyOne),
            '\\' => {
                tokens.push(Token::Char(*chars.get(pos)?));
                pos += 1;
            }
            '[' => {
                let (class, next) = parse_class(&chars, pos).ok()?;
                tokens.push(class);
                pos = next;
            }
            other => tokens.push(Token::Char(other)),
        }
    }
    Some(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::time::Duration;

    use bollard_buildkit_proto::moby::filesync::v1::file_sync_client::FileSyncClient;
    use bollard_buildkit_proto::moby::filesync::v1::file_sync_server::FileSyncServer;
    use tempfile::TempDir;

    const WAIT: Duration = Duration::from_secs(20);

    fn write(root: &Path, rel: &str, data: &[u8]) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }

    fn chmod(root: &Path, rel: &str, mode: u32) {
        fs::set_permissions(root.join(rel), fs::Permissions::from_mode(mode)).unwrap();
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn filter(root: &Path, include: &[&str], exclude: &[&str], follow: &[&str]) -> Filter {
        Filter::new(root, &strings(include), &strings(exclude), &strings(follow)).unwrap()
    }

    fn stats(root: &Path, filter: &Filter) -> Vec<Stat> {
        let mut out = Vec::new();
        walk_tree(root, filter, &mut |stat| {
            out.push(stat);
            Ok(())
        })
        .unwrap();
        out
    }

    fn paths(root: &Path, filter: &Filter) -> Vec<String> {
        stats(root, filter).into_iter().map(|s| s.path).collect()
    }

    fn find<'a>(stats: &'a [Stat], path: &str) -> &'a Stat {
        stats.iter().find(|s| s.path == path).unwrap()
    }

    #[test]
    fn stats_come_per_directory_in_byte_order_parents_first() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        for rel in [
            ".hidden",
            "B",
            "a/b/c.txt",
            "a/z",
            "a-c",
            "a.d",
            "with space",
            "ünï",
            "zz/.x",
        ] {
            write(root, rel, b"x");
        }
        // Not a full-path sort: `a-c` and `a.d` sort before `a/b` as strings, but fsutil
        // finishes `a` first, and the receiver's order check requires exactly that.
        assert_eq!(
            paths(root, &Filter::default()),
            [
                ".hidden",
                "B",
                "a",
                "a/b",
                "a/b/c.txt",
                "a/z",
                "a-c",
                "a.d",
                "with space",
                "zz",
                "zz/.x",
                "ünï",
            ]
        );
    }

    #[test]
    fn modes_are_go_file_modes() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "file", b"hello");
        chmod(root, "file", 0o644);
        write(root, "tool", b"#!/bin/sh\n");
        chmod(root, "tool", 0o755);
        write(root, "suid", b"");
        chmod(root, "suid", 0o4755);
        fs::create_dir(root.join("dir")).unwrap();
        chmod(root, "dir", 0o755);
        fs::create_dir(root.join("tmp")).unwrap();
        chmod(root, "tmp", 0o1777);
        symlink("file", root.join("link")).unwrap();

        let all = stats(root, &Filter::default());
        let file = find(&all, "file");
        assert_eq!(file.mode, 0o644);
        assert_eq!(file.size, 5);
        assert!(file.linkname.is_empty());
        let meta = fs::symlink_metadata(root.join("file")).unwrap();
        assert_eq!(file.uid, meta.uid());
        assert_eq!(file.gid, meta.gid());
        assert_eq!(
            file.mod_time,
            meta.mtime() * 1_000_000_000 + meta.mtime_nsec()
        );
        assert_eq!(find(&all, "tool").mode, 0o755);
        assert_eq!(find(&all, "suid").mode, MODE_SETUID | 0o755);
        assert_eq!(find(&all, "dir").mode, MODE_DIR | 0o755);
        assert_eq!(find(&all, "dir").size, 0);
        assert_eq!(find(&all, "tmp").mode, MODE_DIR | MODE_STICKY | 0o777);
        let link = find(&all, "link");
        assert_eq!(link.mode, MODE_SYMLINK | 0o777);
        assert_eq!(link.linkname, "file");
        assert_eq!(link.size, 4);
    }

    #[test]
    fn devices_carry_go_device_bits_and_numbers() {
        let meta = fs::symlink_metadata("/dev/null").unwrap();
        let stat = make_stat(Path::new("/dev"), b"null", &meta, &mut HashMap::new()).unwrap();
        assert_eq!(stat.mode & !0o777, MODE_DEVICE | MODE_CHAR_DEVICE);
        assert_eq!((stat.devmajor, stat.devminor), (1, 3));
    }

    #[test]
    fn hard_links_name_the_first_path_sent() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "a", b"shared");
        fs::hard_link(root.join("a"), root.join("b")).unwrap();
        let all = stats(root, &Filter::default());
        assert_eq!(find(&all, "a").linkname, "");
        assert_eq!(find(&all, "b").linkname, "a");
        assert_eq!(find(&all, "b").size, 6);
    }

    #[test]
    fn excludes_follow_dockerignore_semantics() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        for rel in [
            "README.md",
            "app.log",
            "src/main.rs",
            "src/debug.log",
            "build/out.bin",
            "build/keep.txt",
            "tmp/junk",
            "x/tmp/junk",
            "docs/index.md",
            "docs/guide/img.png",
            "docs/guide/deep/page.md",
        ] {
            write(root, rel, b"x");
        }
        let filter = filter(
            root,
            &[],
            &[
                "*.log",
                "build/",
                "!build/keep.txt",
                "**/tmp",
                "docs/**/*.md",
            ],
            &[],
        );
        assert_eq!(
            paths(root, &filter),
            [
                "README.md",
                // Excluded, but sent ahead of the exception inside it.
                "build",
                "build/keep.txt",
                "docs",
                "docs/guide",
                "docs/guide/deep",
                "docs/guide/img.png",
                "src",
                // `*` does not cross `/`: only a top-level `*.log` is excluded.
                "src/debug.log",
                "src/main.rs",
                "x",
            ]
        );
    }

    #[test]
    fn includes_keep_only_what_they_name() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        for rel in [
            "Cargo.toml",
            "srcfoo",
            "src/lib.rs",
            "src/nested/x.rs",
            "src/nested/notes.txt",
            "target/debug/bin",
        ] {
            write(root, rel, b"x");
        }
        assert_eq!(
            paths(root, &filter(root, &["src", "Cargo.toml"], &[], &[])),
            [
                "Cargo.toml",
                "src",
                "src/lib.rs",
                "src/nested",
                "src/nested/notes.txt",
                "src/nested/x.rs"
            ]
        );
        assert_eq!(
            paths(root, &filter(root, &["src/**/*.rs"], &[], &[])),
            ["src", "src/lib.rs", "src/nested", "src/nested/x.rs"]
        );
        assert_eq!(
            paths(root, &filter(root, &["src", "!src/nested"], &[], &[])),
            ["src", "src/lib.rs"]
        );
        assert_eq!(
            paths(root, &filter(root, &["src"], &["**/*.txt"], &[])),
            ["src", "src/lib.rs", "src/nested", "src/nested/x.rs"]
        );
    }

    #[test]
    fn followpaths_resolve_symlinks_inside_the_root() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "real/dir/f", b"f");
        write(root, "real/other", b"o");
        write(root, "unrelated.txt", b"u");
        symlink("real/dir", root.join("link")).unwrap();
        symlink("/real/dir/f", root.join("abs")).unwrap();
        symlink("../../../etc", root.join("up")).unwrap();

        assert_eq!(
            paths(root, &filter(root, &[], &[], &["link/f"])),
            ["link", "real", "real/dir", "real/dir/f"]
        );
        // An absolute target is taken relative to the root, as if the root were `/`.
        assert_eq!(
            paths(root, &filter(root, &[], &[], &["abs"])),
            ["abs", "real", "real/dir", "real/dir/f"]
        );
        // A target climbing out of the root stops at the root: nothing outside is read.
        let escaped = stats(root, &filter(root, &[], &[], &["up/passwd"]));
        assert_eq!(escaped.len(), 1);
        assert_eq!(escaped[0].path, "up");
        assert_eq!(escaped[0].linkname, "../../../etc");
        // The root itself means everything.
        assert_eq!(paths(root, &filter(root, &[], &[], &["."])).len(), 8);
    }

    #[test]
    fn symlinks_out_of_the_root_and_loops_are_sent_as_links() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "dir/file", b"x");
        symlink("/etc", root.join("out")).unwrap();
        symlink("..", root.join("parent")).unwrap();
        symlink("loop2", root.join("loop1")).unwrap();
        symlink("loop1", root.join("loop2")).unwrap();
        symlink(".", root.join("self")).unwrap();
        symlink("..", root.join("dir/back")).unwrap();

        let all = stats(root, &Filter::default());
        let listed: Vec<&str> = all.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            listed,
            ["dir", "dir/back", "dir/file", "loop1", "loop2", "out", "parent", "self"]
        );
        for (path, target) in [
            ("out", "/etc"),
            ("parent", ".."),
            ("loop1", "loop2"),
            ("loop2", "loop1"),
            ("self", "."),
            ("dir/back", ".."),
        ] {
            let stat = find(&all, path);
            assert_eq!(stat.mode & MODE_TYPE, MODE_SYMLINK, "{path}");
            assert_eq!(stat.linkname, target, "{path}");
        }
        // followpaths through a loop terminate too.
        assert_eq!(
            paths(root, &filter(root, &[], &[], &["loop1/x"])),
            ["loop1", "loop2"]
        );
    }

    #[test]
    fn patterns_match_as_patternmatcher_does() {
        let matches = |pattern: &str, path: &str| {
            let matcher = Matcher::new(&strings(&[pattern]), "test").unwrap();
            matcher.patterns[0].matches(path)
        };
        assert!(matches("foo", "foo"));
        assert!(!matches("foo", "foo/bar"));
        assert!(matches("foo/", "foo"));
        assert!(matches("./foo", "foo"));
        assert!(matches("a/**", "a/b/c"));
        assert!(matches("**/foo", "foo"));
        assert!(matches("**/foo", "x/y/foo"));
        assert!(matches("**", "anything/at/all"));
        assert!(matches("a/**/b", "a/b"));
        assert!(matches("a/**/b", "a/x/y/b"));
        assert!(!matches("a/**/b", "a/xb"));
        assert!(matches("*.go", "main.go"));
        assert!(!matches("*.go", "cmd/main.go"));
        assert!(matches("?.txt", "a.txt"));
        assert!(!matches("?.txt", "ab.txt"));
        assert!(matches("[a-c]x", "bx"));
        assert!(!matches("[a-c]x", "dx"));
        assert!(matches("[^a-c]x", "dx"));
        assert!(matches("\\*", "*"));
        assert!(!matches("\\*", "a"));
        assert!(matches("a.b", "a.b"));
        assert!(!matches("a.b", "axb"));
        for bad in ["[", "[]", "a\\", "[a-]", "!"] {
            assert!(
                Matcher::new(&strings(&[bad]), "test").is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn metadata_is_decoded_as_buildkit_encodes_it() {
        let mut md = MetadataMap::new();
        md.insert("dir-name", "context".parse().unwrap());
        md.append("exclude-patterns", "%C3%BCn%C3%AF".parse().unwrap());
        md.append("exclude-patterns", "with+space".parse().unwrap());
        md.insert("exclude-patterns-encoded", "1".parse().unwrap());
        md.append("include-patterns", "a+b".parse().unwrap());
        md.append("followpaths", "Dockerfile".parse().unwrap());
        md.append("followpaths", "Dockerfile.dockerignore".parse().unwrap());
        let options = SyncOptions::from_metadata(&md).unwrap();
        assert_eq!(options.dir_name, "context");
        assert_eq!(options.exclude_patterns, ["ünï", "with space"]);
        assert_eq!(options.include_patterns, ["a+b"]);
        assert_eq!(
            options.follow_paths,
            ["Dockerfile", "Dockerfile.dockerignore"]
        );

        let mut broken = MetadataMap::new();
        broken.insert("dir-name", "%zz".parse().unwrap());
        broken.insert("dir-name-encoded", "true".parse().unwrap());
        let status = SyncOptions::from_metadata(&broken).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    // ---- the protocol, over channels -------------------------------------------------

    struct Receiver {
        to_sender: mpsc::Sender<Result<Packet, Status>>,
        from_sender: mpsc::Receiver<Result<Packet, Status>>,
        task: tokio::task::JoinHandle<(Result<(), SyncError>, Vec<SentEntry>)>,
    }

    impl Receiver {
        fn start(root: &Path, filter: Filter, queue: usize) -> Receiver {
            let (to_sender, incoming) = mpsc::channel(16);
            let (outgoing, from_sender) = mpsc::channel(queue);
            let root = root.to_path_buf();
            let task = tokio::spawn(async move {
                let mut entries = Vec::new();
                let result = send(
                    &root,
                    &filter,
                    ReceiverStream::new(incoming),
                    outgoing,
                    &mut entries,
                )
                .await;
                (result, entries)
            });
            Receiver {
                to_sender,
                from_sender,
                task,
            }
        }

        async fn next(&mut self) -> Packet {
            tokio::time::timeout(WAIT, self.from_sender.recv())
                .await
                .expect("sender stalled")
                .expect("sender ended")
                .expect("sender sent a status")
        }

        async fn put(&self, kind: PacketType, id: u32) {
            self.to_sender
                .send(Ok(Packet { id, ..packet(kind) }))
                .await
                .unwrap();
        }

        /// Stats up to the empty one.
        async fn stats(&mut self) -> Vec<Stat> {
            let mut out = Vec::new();
            loop {
                let p = self.next().await;
                assert_eq!(p.r#type, PacketType::PacketStat as i32);
                match p.stat {
                    Some(stat) => out.push(stat),
                    None => return out,
                }
            }
        }

        /// DATA for `ids` until each has its empty terminator.
        async fn data(&mut self, ids: &[u32]) -> HashMap<u32, Vec<u8>> {
            let mut open: BTreeSet<u32> = ids.iter().copied().collect();
            let mut out: HashMap<u32, Vec<u8>> = HashMap::new();
            while !open.is_empty() {
                let p = self.next().await;
                assert_eq!(p.r#type, PacketType::PacketData as i32, "{p:?}");
                assert!(open.contains(&p.id), "data for {}", p.id);
                assert!(p.data.len() <= CHUNK_SIZE);
                out.entry(p.id).or_default().extend_from_slice(&p.data);
                if p.data.is_empty() {
                    open.remove(&p.id);
                }
            }
            out
        }

        async fn finish(self) -> (Result<(), SyncError>, Vec<SentEntry>) {
            tokio::time::timeout(WAIT, self.task)
                .await
                .expect("send did not return")
                .unwrap()
        }
    }

    fn id_of(stats: &[Stat], path: &str) -> u32 {
        stats.iter().position(|s| s.path == path).unwrap() as u32
    }

    fn sha256_hex(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    #[tokio::test]
    async fn full_exchange_sends_requested_files_and_answers_fin() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        let small = b"small file\n".to_vec();
        let big: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        write(root, "a.txt", &small);
        write(root, "dir/b.bin", &big);
        write(root, "dir/c.txt", b"not requested");

        let mut rx = Receiver::start(root, Filter::default(), 4);
        let stats = rx.stats().await;
        let listed: Vec<&str> = stats.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(listed, ["a.txt", "dir", "dir/b.bin", "dir/c.txt"]);
        // Ids count every stat, the directory included.
        let (a, b) = (id_of(&stats, "a.txt"), id_of(&stats, "dir/b.bin"));
        assert_eq!((a, b), (0, 2));

        rx.put(PacketType::PacketReq, a).await;
        rx.put(PacketType::PacketReq, b).await;
        let data = rx.data(&[a, b]).await;
        assert_eq!(data[&a], small);
        assert_eq!(data[&b], big);

        rx.put(PacketType::PacketFin, 0).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketFin as i32);
        let (result, entries) = rx.finish().await;
        result.unwrap();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].sha256.as_deref(), Some(&*sha256_hex(&small)));
        assert_eq!(entries[2].sha256.as_deref(), Some(&*sha256_hex(&big)));
        assert_eq!(entries[1].sha256, None);
        assert_eq!(entries[3].sha256, None);
        assert_eq!(entries[1].mode & MODE_DIR, MODE_DIR);
        assert_eq!(entries[2].size, big.len() as i64);
    }

    #[tokio::test]
    async fn a_file_the_walk_lists_but_the_filter_refuses_to_open_is_sent_empty() {
        // Found by the differential test against docker buildx: the last `src` excludes
        // src/src/keep.txt for the open check but not for the walk.
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "src/src/keep.txt", b"secret\n");
        write(root, "other.txt", b"kept\n");
        let filter = filter(root, &[], &["src", "!src/src", "src"], &[]);
        assert!(!filter.opens("src/src/keep.txt"));
        assert!(filter.opens("other.txt"));

        let mut rx = Receiver::start(root, filter.clone(), 4);
        let stats = rx.stats().await;
        let listed: Vec<&str> = stats.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(listed, ["other.txt", "src", "src/src", "src/src/keep.txt"]);
        let (kept, refused) = (
            id_of(&stats, "other.txt"),
            id_of(&stats, "src/src/keep.txt"),
        );
        rx.put(PacketType::PacketReq, kept).await;
        rx.put(PacketType::PacketReq, refused).await;
        let data = rx.data(&[kept, refused]).await;
        assert_eq!(data[&kept], b"kept\n");
        assert_eq!(data[&refused], b"");
        rx.put(PacketType::PacketFin, 0).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketFin as i32);
        let (result, entries) = rx.finish().await;
        result.unwrap();
        // The record and a replay agree on what was sent: nothing of the refused file.
        let replayed = replay(root, &filter).unwrap();
        assert_eq!(
            entries[refused as usize].sha256.as_deref(),
            Some(&*sha256_hex(b""))
        );
        assert_eq!(
            replayed[refused as usize].sha256,
            entries[refused as usize].sha256
        );
    }

    #[tokio::test]
    async fn requests_may_come_while_stats_are_still_being_sent() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        for i in 0..300 {
            write(root, &format!("f{i:03}"), format!("file {i}").as_bytes());
        }
        let mut rx = Receiver::start(root, Filter::default(), 1);
        let first = rx.next().await;
        assert_eq!(first.stat.unwrap().path, "f000");
        rx.put(PacketType::PacketReq, 0).await;
        // Stats and DATA for 0 interleave until both are complete.
        let mut stats = 1;
        let mut data = Vec::new();
        let (mut stats_done, mut data_done) = (false, false);
        while !(stats_done && data_done) {
            let p = rx.next().await;
            match PacketType::try_from(p.r#type).unwrap() {
                PacketType::PacketStat if p.stat.is_none() => stats_done = true,
                PacketType::PacketStat => stats += 1,
                PacketType::PacketData if p.data.is_empty() => data_done = true,
                PacketType::PacketData => data.extend_from_slice(&p.data),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(stats, 300);
        assert_eq!(data, b"file 0");
        rx.put(PacketType::PacketFin, 0).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketFin as i32);
        rx.finish().await.0.unwrap();
    }

    #[tokio::test]
    async fn large_files_stream_in_bounded_chunks() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        let big: Vec<u8> = (0..5 * 1024 * 1024u32)
            .map(|i| (i.wrapping_mul(31) >> 3) as u8)
            .collect();
        write(root, "big", &big);
        // A two-packet queue: the file can only get through chunk by chunk.
        let mut rx = Receiver::start(root, Filter::default(), 2);
        rx.stats().await;
        rx.put(PacketType::PacketReq, 0).await;
        let mut received = Vec::new();
        let mut chunks = 0;
        loop {
            let p = rx.next().await;
            assert_eq!(p.r#type, PacketType::PacketData as i32);
            assert!(p.data.len() <= CHUNK_SIZE);
            if p.data.is_empty() {
                break;
            }
            chunks += 1;
            received.extend_from_slice(&p.data);
        }
        assert!(chunks >= big.len() / CHUNK_SIZE);
        assert!(received == big);
        rx.put(PacketType::PacketFin, 0).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketFin as i32);
        let (result, entries) = rx.finish().await;
        result.unwrap();
        assert_eq!(entries[0].sha256.as_deref(), Some(&*sha256_hex(&big)));
    }

    #[tokio::test]
    async fn fifos_and_sockets_are_stat_only_and_never_hang() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        let made = std::process::Command::new("mkfifo")
            .arg(root.join("pipe"))
            .status()
            .unwrap();
        assert!(made.success());
        chmod(root, "pipe", 0o644);
        let _listener = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();

        let mut rx = Receiver::start(root, Filter::default(), 4);
        let stats = rx.stats().await;
        let pipe = find(&stats, "pipe");
        assert_eq!(pipe.mode, MODE_NAMED_PIPE | 0o644);
        // fsutil clears the socket bit, so a socket looks requestable; it is sent empty.
        let sock = id_of(&stats, "sock");
        assert_eq!(stats[sock as usize].mode & MODE_TYPE, 0);
        rx.put(PacketType::PacketReq, sock).await;
        assert!(rx.data(&[sock]).await[&sock].is_empty());
        // A FIFO is never requestable.
        rx.put(PacketType::PacketReq, id_of(&stats, "pipe")).await;
        let err = rx.next().await;
        assert_eq!(err.r#type, PacketType::PacketErr as i32);
        let (result, _) = rx.finish().await;
        assert!(matches!(result, Err(SyncError::InvalidId(0))));
    }

    #[tokio::test]
    async fn bad_requests_end_with_an_error_not_a_panic() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "dir/file", b"x");

        // A directory's id.
        let mut rx = Receiver::start(root, Filter::default(), 4);
        rx.stats().await;
        rx.put(PacketType::PacketReq, 0).await;
        let err = rx.next().await;
        assert_eq!(err.r#type, PacketType::PacketErr as i32);
        assert_eq!(String::from_utf8_lossy(&err.data), "invalid file id 0");
        assert!(matches!(rx.finish().await.0, Err(SyncError::InvalidId(0))));

        // An id past the end, after an unknown packet type that is ignored.
        let mut rx = Receiver::start(root, Filter::default(), 4);
        rx.stats().await;
        rx.to_sender
            .send(Ok(Packet {
                r#type: 42,
                ..Default::default()
            }))
            .await
            .unwrap();
        rx.put(PacketType::PacketReq, 99).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketErr as i32);
        assert!(matches!(rx.finish().await.0, Err(SyncError::InvalidId(99))));

        // The same file twice: fsutil serves each id once.
        let mut rx = Receiver::start(root, Filter::default(), 4);
        rx.stats().await;
        rx.put(PacketType::PacketReq, 1).await;
        rx.data(&[1]).await;
        rx.put(PacketType::PacketReq, 1).await;
        assert_eq!(rx.next().await.r#type, PacketType::PacketErr as i32);
        assert!(matches!(rx.finish().await.0, Err(SyncError::InvalidId(1))));

        // The receiver's own error.
        let mut rx = Receiver::start(root, Filter::default(), 4);
        rx.stats().await;
        rx.to_sender
            .send(Ok(Packet {
                data: b"disk full".to_vec(),
                ..packet(PacketType::PacketErr)
            }))
            .await
            .unwrap();
        match rx.finish().await.0 {
            Err(SyncError::Receiver(message)) => assert_eq!(message, "disk full"),
            other => panic!("{other:?}"),
        }

        // The receiver going away without FIN.
        let mut rx = Receiver::start(root, Filter::default(), 4);
        rx.stats().await;
        rx.to_sender = mpsc::channel(1).0;
        assert!(matches!(rx.finish().await.0, Err(SyncError::Closed)));
    }

    #[tokio::test]
    async fn walk_errors_reach_the_receiver_as_err() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "ok", b"x");
        let bad = OsStr::from_bytes(b"bad\xff");
        fs::write(root.join(bad), b"x").unwrap();
        let mut rx = Receiver::start(root, Filter::default(), 4);
        let p = rx.next().await;
        assert_eq!(p.r#type, PacketType::PacketErr as i32);
        assert!(String::from_utf8_lossy(&p.data).contains("not valid UTF-8"));
        assert!(matches!(rx.finish().await.0, Err(SyncError::NotUtf8(_))));
        // Excluded, it is no obstacle.
        assert_eq!(paths(root, &filter(root, &[], &["bad*"], &[])), ["ok"]);
    }

    // ---- the gRPC service ------------------------------------------------------------

    async fn connect(dirs: SyncedDirs) -> FileSyncClient<tonic::transport::Channel> {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let incoming = futures_util::stream::iter([Ok::<_, io::Error>(server_io)])
                .chain(futures_util::stream::pending());
            let _ = tonic::transport::Server::builder()
                .add_service(FileSyncServer::new(dirs))
                .serve_with_incoming(incoming)
                .await;
        });
        let mut client_io = Some(client_io);
        let channel = tonic::transport::Endpoint::from_static("http://filesync.test")
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let io = client_io.take();
                async move {
                    io.map(hyper_util::rt::TokioIo::new)
                        .ok_or_else(|| io::Error::other("connected twice"))
                }
            }))
            .await
            .unwrap();
        FileSyncClient::new(channel)
    }

    #[tokio::test]
    async fn diff_copy_serves_named_dirs_and_records_the_transfer() {
        let dir = TempDir::new().unwrap();
        let root = dir.path();
        write(root, "Dockerfile", b"FROM scratch\n");
        write(root, "app.log", b"noise");
        let dirs = SyncedDirs::new().with_dir("context", root);
        let mut client = connect(dirs.clone()).await;

        let (to_sender, incoming) = mpsc::channel::<Packet>(4);
        let mut request = Request::new(ReceiverStream::new(incoming));
        request
            .metadata_mut()
            .insert("dir-name", "context".parse().unwrap());
        request
            .metadata_mut()
            .append("exclude-patterns", "*.log".parse().unwrap());
        let mut response = tokio::time::timeout(WAIT, client.diff_copy(request))
            .await
            .unwrap()
            .unwrap()
            .into_inner();

        let mut stats = Vec::new();
        loop {
            let p = response.message().await.unwrap().unwrap();
            match p.stat {
                Some(stat) => stats.push(stat.path),
                None => break,
            }
        }
        assert_eq!(stats, ["Dockerfile"]);
        to_sender
            .send(Packet {
                id: 0,
                ..packet(PacketType::PacketReq)
            })
            .await
            .unwrap();
        let mut data = Vec::new();
        loop {
            let p = response.message().await.unwrap().unwrap();
            assert_eq!(p.r#type, PacketType::PacketData as i32);
            if p.data.is_empty() {
                break;
            }
            data.extend_from_slice(&p.data);
        }
        assert_eq!(data, b"FROM scratch\n");
        to_sender.send(packet(PacketType::PacketFin)).await.unwrap();
        let fin = response.message().await.unwrap().unwrap();
        assert_eq!(fin.r#type, PacketType::PacketFin as i32);
        assert!(response.message().await.unwrap().is_none());

        let transfers = dirs.transfers();
        assert_eq!(transfers.len(), 1);
        let transfer = &transfers[0];
        assert_eq!(transfer.dir_name, "context");
        assert_eq!(transfer.exclude_patterns, ["*.log"]);
        assert_eq!(transfer.error, None);
        assert_eq!(transfer.entries.len(), 1);
        assert_eq!(
            transfer.entries[0].sha256.as_deref(),
            Some(&*sha256_hex(b"FROM scratch\n"))
        );
        assert!(serde_json::to_string(transfer)
            .unwrap()
            .contains("Dockerfile"));
    }

    #[tokio::test]
    async fn diff_copy_refuses_unknown_dir_names() {
        let dir = TempDir::new().unwrap();
        let mut client = connect(SyncedDirs::new().with_dir("context", dir.path())).await;
        let mut request = Request::new(futures_util::stream::pending::<Packet>());
        request
            .metadata_mut()
            .insert("dir-name", "secrets".parse().unwrap());
        let status = tokio::time::timeout(WAIT, client.diff_copy(request))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(status.message().contains("secrets"));
    }
}

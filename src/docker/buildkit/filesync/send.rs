//! The sender, as fsutil's `Send`: every STAT, an empty STAT, DATA for each REQ (four
//! workers reading from disk in 32 KiB packets), FIN for FIN; and the replay of a transfer
//! on the tree as it is now.

use super::*;

/// Serves `root` to one receiver, as fsutil's `Send`: every STAT, an empty STAT, DATA for
/// each REQ, FIN for FIN. `entries` receives every stat sent (its index is the file id) and
/// the sha256 of each file sent, even when the transfer fails part way; `hashes` is told
/// each file's too. A walk error or a bad REQ is sent to the receiver as an ERR packet
/// before the error is returned.
pub async fn send<S>(
    root: &Path,
    filter: &Filter,
    hashes: Option<SharedHashes>,
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

    let mut stats = start_walk(root, filter);
    let mut incoming = std::pin::pin!(incoming);
    // Files the receiver may still request, by id; fsutil serves each id once.
    let mut requestable: HashMap<u32, String> = HashMap::new();
    let mut walking = true;
    let workers = Arc::new(Semaphore::new(FILE_WORKERS));
    let mut jobs: JoinSet<FileSent> = JoinSet::new();

    loop {
        tokio::select! {
            stat = stats.recv(), if walking => match stat {
                Some(Ok(stat)) => offer(stat, entries, &mut requestable, &outgoing).await?,
                Some(Err(error)) => return Err(fail(&outgoing, error).await),
                None => {
                    walking = false;
                    emit(&outgoing, packet(PacketType::PacketStat)).await?;
                }
            },
            received = incoming.next() => {
                let received = received_packet(received)?;
                match PacketType::try_from(received.r#type) {
                    Ok(PacketType::PacketReq) => {
                        let id = received.id;
                        let Some(path) = requestable.remove(&id) else {
                            return Err(fail(&outgoing, SyncError::InvalidId(id)).await);
                        };
                        let job = FileJob {
                            withheld: !filter.opens(&path),
                            path: root.join(path),
                            hashes: hashes.clone(),
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

/// Walks `root` on a blocking thread, handing each stat (or the walk's error) over.
fn start_walk(root: &Path, filter: &Filter) -> mpsc::Receiver<Result<Stat, SyncError>> {
    let (stat_tx, stats) = mpsc::channel(STAT_QUEUE);
    let (root, filter) = (root.to_path_buf(), filter.clone());
    tokio::task::spawn_blocking(move || {
        let result = walk_tree(&root, &filter, &mut |stat, _| {
            stat_tx
                .blocking_send(Ok(stat))
                .map_err(|_| SyncError::Cancelled)
        });
        if let Err(error) = result {
            let _ = stat_tx.blocking_send(Err(error));
        }
    });
    stats
}

/// Sends one stat under the next file id, remembering the ids the receiver may request.
async fn offer(
    stat: Stat,
    entries: &mut Vec<SentEntry>,
    requestable: &mut HashMap<u32, String>,
    outgoing: &mpsc::Sender<Result<Packet, Status>>,
) -> Result<(), SyncError> {
    let Ok(id) = u32::try_from(entries.len()) else {
        return Err(fail(outgoing, SyncError::TooManyEntries).await);
    };
    // fsutil numbers every stat, directories included, but only entries without type bits
    // can be requested.
    if stat.mode & MODE_TYPE == 0 {
        requestable.insert(id, stat.path.clone());
    }
    entries.push(SentEntry::new(&stat));
    let stat = Packet {
        stat: Some(stat),
        ..packet(PacketType::PacketStat)
    };
    emit(outgoing, stat).await
}

/// The receiver's next packet; its end or a transport error ends the transfer.
fn received_packet(received: Option<Result<Packet, Status>>) -> Result<Packet, SyncError> {
    match received {
        None => Err(SyncError::Closed),
        Some(Err(status)) => Err(SyncError::Transport(status.message().to_string())),
        Some(Ok(received)) => Ok(received),
    }
}

/// A requested file's id and the hex sha256 of the bytes sent for it.
type FileSent = Result<(u32, String), SyncError>;

/// One REQ to answer.
struct FileJob {
    pub(super) path: PathBuf,
    /// Listed by the walk but refused by the filter's open check: sent empty.
    withheld: bool,
    hashes: Option<SharedHashes>,
    pub(super) id: u32,
    pub(super) out: mpsc::Sender<Result<Packet, Status>>,
    stop: Arc<AtomicBool>,
}

impl FileJob {
    /// Waits for one of the workers, then streams the file from a blocking thread.
    pub(super) async fn run(self, workers: Arc<Semaphore>) -> FileSent {
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
    pub(super) fn send(self) -> FileSent {
        let data = |data: Vec<u8>| {
            Ok(Packet {
                id: self.id,
                data,
                ..packet(PacketType::PacketData)
            })
        };
        let file = (!self.withheld).then(|| open_regular(&self.path)).flatten();
        let sha256 = match file {
            Some(mut file) => {
                // What stopped the read, kept whole: `read` answers io errors only.
                let mut stopped = None;
                let mut read = |file: &mut fs::File| {
                    self.send_content(file, &data)
                        .map_err(|e| io::Error::other(stopped.insert(e).to_string()))
                };
                let sent = match &self.hashes {
                    Some(hashes) => hashes.sha256_while(&self.path, &mut file, &mut read),
                    None => read(&mut file),
                };
                match (sent, stopped) {
                    (Ok(sha256), _) => sha256,
                    (Err(_), Some(error)) => return Err(error),
                    (Err(e), None) => return Err(SyncError::io(&self.path, e)),
                }
            }
            None => hex::encode(Sha256::digest([])),
        };
        self.out
            .blocking_send(data(Vec::new()))
            .map_err(|_| SyncError::Closed)?;
        Ok((self.id, sha256))
    }

    /// Sends `file`'s content as DATA packets; the hex sha256 of what was sent.
    fn send_content(
        &self,
        file: &mut fs::File,
        data: &dyn Fn(Vec<u8>) -> Result<Packet, Status>,
    ) -> Result<String, SyncError> {
        let mut hasher = Sha256::new();
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
        Ok(hex::encode(hasher.finalize()))
    }
}

/// What a transfer with `filter` would send from `root` now: every entry as
/// [`SentEntry`], with the sha256 of each regular file's content (not only the requested
/// ones), so a later replay can tell whether BuildKit would read the same thing.
/// Blocking.
pub fn replay(
    root: &Path,
    filter: &Filter,
    hashes: &dyn HashFile,
) -> Result<Vec<SentEntry>, SyncError> {
    let mut entries = Vec::new();
    walk_tree(root, filter, &mut |stat, walked| {
        let mut entry = SentEntry::new(&stat);
        if stat.mode & MODE_TYPE == 0 && stat.linkname.is_empty() {
            let path = root.join(&stat.path);
            let opens = filter.opens(&stat.path);
            let sha256 = match opens.then(|| hashes.remembered(&path, walked)).flatten() {
                Some(known) => known,
                None => match opens.then(|| open_regular(&path)).flatten() {
                    Some(mut file) => hashes
                        .sha256(&path, &mut file)
                        .map_err(|e| SyncError::io(&path, e))?,
                    None => hex::encode(Sha256::digest([])),
                },
            };
            entry.sha256 = Some(sha256);
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

pub(super) fn packet(kind: PacketType) -> Packet {
    Packet {
        r#type: kind as i32,
        ..Default::default()
    }
}

pub(super) async fn emit(
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

//! The sha256 of context files by path and stat, across runs, as git's index keeps them:
//! a warm rerun's replay (see [`crate::builder::build_inputs`]) reads no file whose stat
//! is unchanged, and a run reads each file at most once however many platforms and
//! images replay it. Whole trees likewise: a digest of a tree's content (the classic
//! builder's context tar) is kept under the stat of all its entries ([`TreeStat`]).

use crate::base::files;
use crate::docker::buildkit::filesync::HashFile;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Entries kept in `file-hashes.json`: enough for a few big contexts; past it, the files
/// the last run did not look at go first.
const MAX_FILE_HASHES: usize = 200_000;
/// How long after a file's last change its hash may be remembered: a second change within
/// the same timestamp tick as the first could leave the stat as it was, so such a "racy"
/// file (git's word) is hashed again on every run until it has settled. This margin holds
/// for any file system: 1-second timestamps, FAT's 2 seconds, a file server's own clock.
const RACY_NANOS: i64 = 2_000_000_000;
/// The margin on a local file system with fine timestamps: the kernel stamps a change from
/// its coarse clock, which lags the clock read here by at most a tick (1–10 ms), so a file
/// last changed this long before the read began cannot change again within its tick.
const LOCAL_RACY_NANOS: i64 = 100_000_000;

/// File systems whose timestamps come from this kernel's clock at nanosecond precision;
/// any other (NFS, SMB, FUSE, FAT, ...) may stamp from another clock or coarser.
const LOCAL_FINE_TIMESTAMPS: [u64; 8] = [
    0xEF53,      // ext2/3/4 (ext3 and small inodes keep whole seconds: see `racy_nanos`)
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs
    0xF2F5_2010, // f2fs
    0x2FC1_2FC1, // zfs
    0x858_458F6, // ramfs
];

/// What `stat` says of a file: any write, truncation or replacement changes one of these
/// (the ctime moves on every change and, unlike the mtime, cannot be set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        }
    }
}

/// What a remembered hash holds while it is as it was: one file's stamp, or a tree's
/// ([`TreeStat`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Stamp {
    File(FileStamp),
    Tree(String),
}

/// A remembered hash: the stamp when it was read, and the sha256 of the content.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KnownHash(Stamp, String);

/// The stat of every entry of a tree, in walk order, as one digest, under the key a
/// digest of that tree is remembered by: any entry added, removed, renamed or replaced,
/// any write, and any change of type, mode, owner or link target changes it. Only made
/// when no entry is racy, so an unchanged `TreeStat` vouches for unchanged content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeStat {
    key: String,
    stat: String,
}

/// The remembered hashes (`file-hashes.json` in the cache directory), loaded on first use.
pub struct FileHashes {
    path: Option<PathBuf>,
    /// By absolute path: the remembered hash, and whether this run used it.
    known: OnceLock<Mutex<HashMap<String, (KnownHash, bool)>>>,
    /// A lock per path being hashed: platforms replaying at once wait for one read.
    reading: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The racy margin of each device seen (see [`FileHashes::racy_nanos`]).
    devices: Mutex<HashMap<u64, i64>>,
    changed: AtomicBool,
}

impl FileHashes {
    /// Kept in `path` (the cache directory's `file-hashes.json`); None keeps them for this
    /// run only.
    pub fn open(path: Option<PathBuf>) -> FileHashes {
        FileHashes {
            path,
            known: Default::default(),
            reading: Default::default(),
            devices: Default::default(),
            changed: AtomicBool::new(false),
        }
    }

    fn known(&self) -> &Mutex<HashMap<String, (KnownHash, bool)>> {
        self.known.get_or_init(|| {
            let read: HashMap<String, KnownHash> = self
                .path
                .as_ref()
                .and_then(|p| std::fs::read(p).ok())
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default();
            Mutex::new(read.into_iter().map(|(k, v)| (k, (v, false))).collect())
        })
    }

    /// [`HashFile::sha256`] at `started` (Unix nanoseconds) before the file's stat.
    fn sha256_at(
        &self,
        path: &Path,
        file: &mut std::fs::File,
        started: i64,
    ) -> std::io::Result<String> {
        let stamp = FileStamp::of(&file.metadata()?);
        let Some(key) = path.to_str() else {
            return read_all(file);
        };
        let file_stamp = stamp;
        let stamp = Stamp::File(stamp);
        if let Some(known) = self.known_hash(key, &stamp) {
            return Ok(known);
        }
        let lock = self
            .reading
            .lock()
            .expect("file hashes lock")
            .entry(key.to_string())
            .or_default()
            .clone();
        let _reading = lock.lock().expect("file hashes lock");
        // Another platform's replay may have read it meanwhile.
        if let Some(known) = self.known_hash(key, &stamp) {
            return Ok(known);
        }
        let sha256 = read_all(file)?;
        self.keep(key, file, file_stamp, started, &sha256)?;
        Ok(sha256)
    }

    /// Remembers `sha256`, the hash of `file` (at `key`) read in full from `before`, its
    /// stat taken at `started`: only when the file had settled by then and its stat still
    /// holds, so no change during or right before the read can hide behind it.
    fn keep(
        &self,
        key: &str,
        file: &std::fs::File,
        before: FileStamp,
        started: i64,
        sha256: &str,
    ) -> std::io::Result<()> {
        let settled = self.settled(&before, started, || rustix::fs::fstatfs(file));
        if settled && FileStamp::of(&file.metadata()?) == before {
            self.remember(key.to_string(), Stamp::File(before), sha256.to_string());
        }
        Ok(())
    }

    /// Whether the last change `stamp` shows was long enough before `started` that any
    /// later change shows in the stat (else the entry is "racy", git's word); `statfs`
    /// says which file system the entry is on.
    fn settled(
        &self,
        stamp: &FileStamp,
        started: i64,
        statfs: impl FnOnce() -> rustix::io::Result<rustix::fs::StatFs>,
    ) -> bool {
        let margin = self.racy_nanos(stamp, statfs);
        stamp.ctime_ns.saturating_add(margin) < started
    }

    /// How long after its last change a file is racy: [`LOCAL_RACY_NANOS`] on a local file
    /// system whose stamps carry sub-second parts, else [`RACY_NANOS`]. A ctime on a whole
    /// second is taken as a coarse file system's (one in a billion fine ones looks so too,
    /// and only waits longer). The file system's type is asked once per device.
    fn racy_nanos(
        &self,
        stamp: &FileStamp,
        statfs: impl FnOnce() -> rustix::io::Result<rustix::fs::StatFs>,
    ) -> i64 {
        if stamp.ctime_ns % 1_000_000_000 == 0 {
            return RACY_NANOS;
        }
        let mut devices = self.devices.lock().expect("file hashes lock");
        *devices.entry(stamp.dev).or_insert_with(|| match statfs() {
            Ok(fs) if LOCAL_FINE_TIMESTAMPS.contains(&(fs.f_type as u64)) => LOCAL_RACY_NANOS,
            _ => RACY_NANOS,
        })
    }

    fn remember(&self, key: String, stamp: Stamp, sha256: String) {
        let entry = (KnownHash(stamp, sha256), true);
        let mut known = self.known().lock().expect("file hashes lock");
        known.insert(key, entry);
        self.changed.store(true, Ordering::Relaxed);
    }

    /// The stat of `entries` (paths relative to `root`, symlinks not followed) as
    /// [`unix_nanos`] said `started` before the first was looked at, for the digest of
    /// the tree kept under `name`; None when an entry is racy or cannot be looked at.
    pub fn tree_stat(
        &self,
        root: &Path,
        name: &str,
        entries: &[PathBuf],
        started: i64,
    ) -> Option<TreeStat> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let mut hasher = Sha256::new();
        for relative in entries {
            let path = root.join(relative);
            let meta = std::fs::symlink_metadata(&path).ok()?;
            let stamp = FileStamp::of(&meta);
            let link = meta.file_type().is_symlink();
            // A link's own file system is its directory's (statfs follows links).
            let on = match link {
                true => path.parent().unwrap_or(root),
                false => &path,
            };
            if !self.settled(&stamp, started, || rustix::fs::statfs(on)) {
                return None;
            }
            let link = match link {
                true => std::fs::read_link(&path).ok()?.into_os_string(),
                false => Default::default(),
            };
            // No path holds a NUL; the numbers have fixed widths; the link is counted.
            hasher.update(relative.as_os_str().as_bytes());
            hasher.update([0]);
            for n in [stamp.dev, stamp.ino, stamp.size, meta.rdev()] {
                hasher.update(n.to_le_bytes());
            }
            for n in [stamp.mtime_ns, stamp.ctime_ns] {
                hasher.update(n.to_le_bytes());
            }
            for n in [meta.mode(), meta.uid(), meta.gid()] {
                hasher.update(n.to_le_bytes());
            }
            hasher.update((link.len() as u64).to_le_bytes());
            hasher.update(link.as_bytes());
        }
        Some(TreeStat {
            key: format!("{}\0{name}", root.to_str()?),
            stat: hex::encode(hasher.finalize()),
        })
    }

    /// The digest remembered for the tree while its stat is `stat`.
    pub fn tree_digest(&self, stat: &TreeStat) -> Option<String> {
        self.known_hash(&stat.key, &Stamp::Tree(stat.stat.clone()))
    }

    /// Remembers `digest` for the tree while its stat is `stat`.
    pub fn remember_tree(&self, stat: TreeStat, digest: String) {
        self.remember(stat.key, Stamp::Tree(stat.stat), digest);
    }

    /// The hash remembered for `key` while its stat is `stamp`.
    fn known_hash(&self, key: &str, stamp: &Stamp) -> Option<String> {
        let mut known = self.known().lock().expect("file hashes lock");
        let (KnownHash(was, sha256), used) = known.get_mut(key)?;
        (was == stamp).then(|| {
            *used = true;
            sha256.clone()
        })
    }

    /// Writes what changed; past `MAX_FILE_HASHES` entries, those this run did not use go.
    pub fn save(&self) {
        if !self.changed.swap(false, Ordering::Relaxed) {
            return;
        }
        let (Some(path), Some(known)) = (&self.path, self.known.get()) else {
            return;
        };
        let bytes = {
            let known = known.lock().expect("file hashes lock");
            // Past the cap, only what this run used is kept.
            let over = known.len() > MAX_FILE_HASHES;
            let kept: HashMap<&str, &KnownHash> = known
                .iter()
                .filter(|(_, (_, used))| *used || !over)
                .map(|(k, (v, _))| (k.as_str(), v))
                .collect();
            match serde_json::to_vec(&kept) {
                Ok(bytes) => bytes,
                Err(_) => return,
            }
        };
        // Unsaved hashes only cost the next run a read.
        let _ = files::replace(path, &bytes);
    }
}

/// Now, in nanoseconds since the Unix epoch: the `started` of [`FileHashes::tree_stat`].
pub fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn read_all(file: &mut std::fs::File) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

impl HashFile for FileHashes {
    /// The remembered hash while the walk's stat of the file is the one it was read with:
    /// for a regular file, the same stat the opened file would give.
    fn remembered(&self, path: &Path, walked: &std::fs::Metadata) -> Option<String> {
        let key = path.to_str()?;
        self.known_hash(key, &Stamp::File(FileStamp::of(walked)))
    }

    /// The sha256 of the regular file `file`, open at `path`: the remembered one while its
    /// stat is exactly as when it was read, else read now. A file whose stat moved while
    /// it was read, or whose last change is too recent to be told apart from a later one
    /// by its stat, is not remembered.
    fn sha256(&self, path: &Path, file: &mut std::fs::File) -> std::io::Result<String> {
        self.sha256_at(path, file, unix_nanos())
    }

    /// The file sync's read of a file it sends: the hash of those bytes is kept as one
    /// read here would be, so the replay after the build does not read the file again.
    fn sha256_while(
        &self,
        path: &Path,
        file: &mut std::fs::File,
        read: &mut dyn FnMut(&mut std::fs::File) -> std::io::Result<String>,
    ) -> std::io::Result<String> {
        self.sha256_while_at(path, file, unix_nanos(), read)
    }
}

impl FileHashes {
    /// [`HashFile::sha256_while`] at `started` (Unix nanoseconds) before the file's stat.
    fn sha256_while_at(
        &self,
        path: &Path,
        file: &mut std::fs::File,
        started: i64,
        read: &mut dyn FnMut(&mut std::fs::File) -> std::io::Result<String>,
    ) -> std::io::Result<String> {
        let before = FileStamp::of(&file.metadata()?);
        let sha256 = read(file)?;
        if let Some(key) = path.to_str() {
            self.keep(key, file, before, started, &sha256)?;
        }
        Ok(sha256)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// Hashes `path` as a replay does, as if at `started`.
    fn hash(hashes: &FileHashes, path: &Path, started: i64) -> String {
        let mut file = std::fs::File::open(path).unwrap();
        hashes.sha256_at(path, &mut file, started).unwrap()
    }

    fn remembered(hashes: &FileHashes, path: &Path) -> bool {
        let known = hashes.known().lock().unwrap();
        known.contains_key(path.to_str().unwrap())
    }

    #[test]
    fn a_settled_file_is_read_once_and_its_hash_kept_while_its_stat_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let hashes = FileHashes::open(None);
        let later = unix_nanos() + 10 * RACY_NANOS;
        assert_eq!(hash(&hashes, &path, later), sha256_hex(b"aaaa"));
        assert!(remembered(&hashes, &path));
        // The remembered hash answers without a read: plant another to see it served.
        let stamp = Stamp::File(FileStamp::of(&std::fs::metadata(&path).unwrap()));
        let planted = (KnownHash(stamp, "planted".into()), false);
        let key = path.to_str().unwrap().to_string();
        hashes.known().lock().unwrap().insert(key, planted);
        assert_eq!(hash(&hashes, &path, later), "planted");
    }

    #[test]
    fn a_file_changed_since_its_hash_is_read_again_even_at_the_same_size_and_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let hashes = FileHashes::open(None);
        let later = unix_nanos() + 10 * RACY_NANOS;
        assert_eq!(hash(&hashes, &path, later), sha256_hex(b"aaaa"));
        // Same size, and the mtime set back as `touch -d` or an archive extractor would:
        // the ctime still moves.
        std::fs::write(&path, b"bbbb").unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(mtime).unwrap();
        drop(file);
        let later = unix_nanos() + 10 * RACY_NANOS;
        assert_eq!(hash(&hashes, &path, later), sha256_hex(b"bbbb"));
        // Replaced by another file under the same name: another inode.
        let other = dir.path().join("g");
        std::fs::write(&other, b"cccc").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(hash(&hashes, &path, later), sha256_hex(b"cccc"));
    }

    /// Sends `path` as the file sync does, as if at `started`, running `meanwhile` after
    /// the read; the hash of the bytes sent.
    fn send(hashes: &FileHashes, path: &Path, started: i64, meanwhile: impl Fn()) -> String {
        let mut file = std::fs::File::open(path).unwrap();
        let mut read = |file: &mut std::fs::File| {
            let sent = read_all(file);
            meanwhile();
            sent
        };
        hashes
            .sha256_while_at(path, &mut file, started, &mut read)
            .unwrap()
    }

    #[test]
    fn a_settled_file_sent_is_known_to_the_replay_without_another_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let hashes = FileHashes::open(None);
        let later = unix_nanos() + 10 * RACY_NANOS;
        assert_eq!(send(&hashes, &path, later, || {}), sha256_hex(b"aaaa"));
        let walked = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            HashFile::remembered(&hashes, &path, &walked),
            Some(sha256_hex(b"aaaa"))
        );
    }

    #[test]
    fn a_file_changed_while_it_was_sent_or_racy_is_not_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let hashes = FileHashes::open(None);
        let later = unix_nanos() + 10 * RACY_NANOS;
        // A change within the same timestamp tick shows in the size alone: the stamps
        // may not move, and `later` stands in for a file that had settled.
        let change = || std::fs::write(&path, b"bbbbb").unwrap();
        assert_eq!(send(&hashes, &path, later, change), sha256_hex(b"aaaa"));
        assert!(!remembered(&hashes, &path));
        assert_eq!(
            send(&hashes, &path, unix_nanos(), || {}),
            sha256_hex(b"bbbbb")
        );
        assert!(!remembered(&hashes, &path));
    }

    #[test]
    fn a_racy_file_is_not_remembered_so_a_change_within_the_same_tick_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let hashes = FileHashes::open(None);
        // Hashed right after its change: a same-size change within the file system's
        // timestamp granularity could leave the stat exactly as it was.
        assert_eq!(hash(&hashes, &path, unix_nanos()), sha256_hex(b"aaaa"));
        assert!(!remembered(&hashes, &path));
        std::fs::write(&path, b"bbbb").unwrap();
        assert_eq!(hash(&hashes, &path, unix_nanos()), sha256_hex(b"bbbb"));
    }

    /// A rerun right after a build (the ctime a second old) reads no file again where the
    /// file system's stamps come from this kernel's clock; elsewhere it waits for the margin
    /// any file system allows.
    #[test]
    fn a_file_changed_a_moment_before_its_read_is_remembered_on_a_local_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let hashes = FileHashes::open(None);
        let stamp = FileStamp::of(&meta);
        let a_moment_later = stamp.ctime_ns + 4 * LOCAL_RACY_NANOS;
        assert_eq!(hash(&hashes, &path, a_moment_later), sha256_hex(b"aaaa"));
        let fs_type = rustix::fs::statfs(dir.path()).unwrap().f_type as u64;
        let local_fine =
            LOCAL_FINE_TIMESTAMPS.contains(&fs_type) && stamp.ctime_ns % 1_000_000_000 != 0;
        assert_eq!(
            remembered(&hashes, &path),
            local_fine,
            "file system type {fs_type:#x}"
        );
    }

    #[test]
    fn file_hashes_are_kept_across_runs_and_an_unchanged_run_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"aaaa").unwrap();
        let store = dir.path().join("cache/file-hashes.json");
        let open = || FileHashes::open(Some(store.clone()));
        let later = unix_nanos() + 10 * RACY_NANOS;
        let first = open();
        hash(&first, &path, later);
        first.save();
        let written = std::fs::metadata(&store).unwrap().modified().unwrap();
        let second = open();
        assert!(remembered(&second, &path));
        assert_eq!(hash(&second, &path, later), sha256_hex(b"aaaa"));
        second.save();
        let unchanged = std::fs::metadata(&store).unwrap().modified().unwrap();
        assert_eq!(
            unchanged, written,
            "a run that learned nothing rewrote the file"
        );
    }
}

//! The build-context sender: `buildkit::filesync::Filter::new` and `replay` (and `send`,
//! driven over channels) on a small tree built from the input in a fresh temp dir: files
//! with small contents and any mode, directories, empty directories, hidden / spaced /
//! unicode / glob-character names (and now and then raw bytes), hard links, a socket, a
//! FIFO (at most one, via `mkfifo`), and symlinks to entries inside (relative, rooted at the
//! context, by real absolute path), to `..`-climbing paths out of the root, to absolute
//! paths outside, to themselves and to each other; then up to 8 include patterns, 8 exclude
//! patterns (`!`, `**`, trailing `/`, classes, escapes) and 8 follow paths from the input.
//!
//! Asserted: every path sent is relative, `/`-separated, without empty, `.` or `..`
//! components, and names an entry that exists under the root looked up without following a
//! symlink in any component (so neither patterns nor follow paths lead the walk out of the
//! root); each directory comes before its children and siblings in byte order; modes, sizes
//! and link targets are those of the lstat; no entry whose lstat is a symlink (nor a
//! directory or FIFO) has a sha256, and each sha256 is that of the file's bytes (of no
//! bytes when `Filter::opens` refuses a listed file, which is then sent empty); hard links
//! name an earlier path of the same inode; `replay` is deterministic; with no patterns it
//! lists exactly what an independent walk finds; a filtered walk is a subsequence of the
//! unfiltered one; literal patterns (no wildcards, no `!`) keep / drop what dockerignore
//! says; `send`, asked for every requestable file then FIN, sends the same stats as
//! `replay`, the files' bytes, and the same digests, within 20 s.
//!
//! The input is read as: entry count, then per entry a kind, a parent directory, a name and
//! kind-specific bytes; then include, exclude and follow-path counts and their token lists.
//! An exhausted input reads as zeros.
#![no_main]
use libfuzzer_sys::fuzz_target;
use polyarch::docker::buildkit::filesync::{replay, send, Filter, HashFile, SentEntry};

use bollard_buildkit_proto::fsutil::types::{packet::PacketType, Packet};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const MAX_ENTRIES: usize = 64;
const MAX_PATTERNS: usize = 8;

// Go's os.FileMode type bits, as fsutil sends them.
const MODE_DIR: u32 = 1 << 31;
const MODE_SYMLINK: u32 = 1 << 27;
const MODE_DEVICE: u32 = 1 << 26;
const MODE_NAMED_PIPE: u32 = 1 << 25;
const MODE_SOCKET: u32 = 1 << 24;
const MODE_CHAR_DEVICE: u32 = 1 << 21;
const MODE_IRREGULAR: u32 = 1 << 19;
const MODE_TYPE: u32 = MODE_DIR
    | MODE_SYMLINK
    | MODE_NAMED_PIPE
    | MODE_SOCKET
    | MODE_DEVICE
    | MODE_CHAR_DEVICE
    | MODE_IRREGULAR;

const NAMES: &[&str] = &[
    "a",
    "b",
    "A",
    "B",
    "a.txt",
    "b.log",
    "x.rs",
    "Dockerfile",
    ".dockerignore",
    ".hidden",
    ".git",
    "node_modules",
    "src",
    "build",
    "tmp",
    "with space",
    " lead",
    "trail ",
    "ünï",
    "日本",
    "é",
    "a*",
    "*",
    "?",
    "[a]",
    "[",
    "]",
    "a\\b",
    "!bang",
    "#c",
    "-",
    "a-c",
    "a.d",
    "a b.c",
    "new\nline",
    "~",
    "ab",
    "ba",
    "aa",
    "a.b",
    "...",
    "**",
    "root",
    "outside",
];

const DIR_MODES: &[u32] = &[0o755, 0o700, 0o555, 0o1777, 0o2755, 0o000, 0o311, 0o644];

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
    fn name(&mut self) -> Vec<u8> {
        let b = self.byte();
        if b < 0xe0 {
            return NAMES[b as usize % NAMES.len()].as_bytes().to_vec();
        }
        let len = self.below(8) + 1;
        let mut name: Vec<u8> = (0..len)
            .map(|_| match self.byte() {
                0 | b'/' => b'_',
                b => b,
            })
            .collect();
        if name == b"." || name == b".." {
            name.push(b'_');
        }
        name
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    File,
    Dir,
    Link,
    Other,
}

struct Tree {
    root: PathBuf,
    outside: PathBuf,
    /// Directories that may get children, root-relative ("" is the root).
    dirs: Vec<Vec<u8>>,
    entries: Vec<(Vec<u8>, Kind)>,
    fifo_made: bool,
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut rel = parent.to_vec();
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name);
    rel
}

fn abs(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

impl Tree {
    fn pick_entry(&self, input: &mut Input) -> Option<Vec<u8>> {
        if self.entries.is_empty() {
            return None;
        }
        Some(self.entries[input.below(self.entries.len())].0.clone())
    }

    fn link_target(&self, input: &mut Input, parent: &[u8], own: &[u8]) -> Vec<u8> {
        let depth = if parent.is_empty() {
            0
        } else {
            parent.iter().filter(|&&b| b == b'/').count() + 1
        };
        let entry = self.pick_entry(input).unwrap_or_else(|| b"a".to_vec());
        match input.below(10) {
            // Relative, to an entry inside.
            0 => {
                let mut t = b"../".repeat(depth);
                t.extend_from_slice(&entry);
                t
            }
            // Rooted at the context, as followpaths read it.
            1 => join(b"", &[b"/".as_slice(), &entry].concat()),
            // The real absolute path of an entry inside.
            2 => abs(&self.root, &entry).as_os_str().as_bytes().to_vec(),
            // Climbing out of the root.
            3 => {
                let mut t = b"../".repeat(depth + 1 + input.below(3));
                t.extend_from_slice(
                    [
                        "outside",
                        "outside/secret",
                        "outside/dir",
                        "",
                        "root-sibling/f",
                        "root/a",
                    ][input.below(6)]
                    .as_bytes(),
                );
                t
            }
            // Itself, or a loop through a name that may become a link.
            4 => match input.below(3) {
                0 => own.rsplit(|&b| b == b'/').next().unwrap().to_vec(),
                1 => [b"./".as_slice(), own.rsplit(|&b| b == b'/').next().unwrap()].concat(),
                _ => [b"/".as_slice(), &entry].concat(),
            },
            5 => [".", "..", "./", "../..", "/", "//", "./."][input.below(7)]
                .as_bytes()
                .to_vec(),
            6 => b"nope/x".to_vec(),
            7 => match input.below(3) {
                0 => self.outside.as_os_str().as_bytes().to_vec(),
                1 => b"/etc".to_vec(),
                _ => b"/".to_vec(),
            },
            8 => ["*", "a*", "[ab]", "*/..", "?"][input.below(5)]
                .as_bytes()
                .to_vec(),
            _ => {
                let mut t = Vec::new();
                for i in 0..input.below(3) + 1 {
                    if i > 0 {
                        t.push(b'/');
                    }
                    match input.below(4) {
                        0 => t.extend_from_slice(b".."),
                        1 => t.extend_from_slice(&entry),
                        _ => t.extend_from_slice(&input.name()),
                    }
                }
                t
            }
        }
    }

    fn build(&mut self, input: &mut Input) {
        let count = input.below(MAX_ENTRIES + 1);
        for _ in 0..count {
            let kind = input.byte();
            let parent = self.dirs[input.below(self.dirs.len())].clone();
            let name = input.name();
            let rel = join(&parent, &name);
            let path = abs(&self.root, &rel);
            let made = match kind % 8 {
                0 | 1 => {
                    let len = input.below(17);
                    let content: Vec<u8> = (0..len).map(|_| input.byte()).collect();
                    let mode = ((input.byte() as u32) << 4 | input.byte() as u32) & 0o7777;
                    // create_new: never open what is there (a FIFO would block, a link
                    // would be written through).
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .and_then(|mut f| f.write_all(&content))
                        .and_then(|_| fs::set_permissions(&path, fs::Permissions::from_mode(mode)))
                        .ok()
                        .map(|_| Kind::File)
                }
                2 => {
                    let mode = DIR_MODES[input.below(DIR_MODES.len())];
                    fs::create_dir(&path).ok().map(|_| {
                        // Root ignores the bits; anyone else gets dirs they can still walk.
                        let _ = fs::set_permissions(&path, fs::Permissions::from_mode(mode));
                        self.dirs.push(rel.clone());
                        Kind::Dir
                    })
                }
                3..=5 => {
                    let target = self.link_target(input, &parent, &rel);
                    symlink(OsStr::from_bytes(&target), &path)
                        .ok()
                        .map(|_| Kind::Link)
                }
                6 => {
                    let files: Vec<&Vec<u8>> = self
                        .entries
                        .iter()
                        .filter(|(_, k)| *k == Kind::File)
                        .map(|(r, _)| r)
                        .collect();
                    if files.is_empty() {
                        None
                    } else {
                        let first = files[input.below(files.len())];
                        fs::hard_link(abs(&self.root, first), &path)
                            .ok()
                            .map(|_| Kind::File)
                    }
                }
                _ => match input.below(4) {
                    0 => std::os::unix::net::UnixListener::bind(&path)
                        .ok()
                        .map(|_| Kind::Other),
                    1 if !self.fifo_made => {
                        self.fifo_made = true;
                        std::process::Command::new("mkfifo")
                            .arg(&path)
                            .stderr(std::process::Stdio::null())
                            .status()
                            .ok()
                            .filter(|s| s.success())
                            .map(|_| Kind::Other)
                    }
                    // An empty directory: never given children.
                    _ => fs::create_dir(&path).ok().map(|_| Kind::Dir),
                },
            };
            if let Some(kind) = made {
                self.entries.push((rel, kind));
            }
        }
    }

    fn pattern(&self, input: &mut Input, negatable: bool) -> String {
        let mut p = String::new();
        if negatable && input.below(3) == 0 {
            p.push('!');
        }
        for _ in 0..input.below(6) + 1 {
            match input.below(18) {
                0 => p.push('*'),
                1 => p.push_str("**"),
                2 => p.push('?'),
                3 => p.push_str("[a-z]"),
                4 => p.push('/'),
                5 => p.push('.'),
                6 => p.push_str(".."),
                7 => p.push_str("\\*"),
                8 => p.push_str("[^.]"),
                9..=12 => {
                    if let Some(e) = self.pick_entry(input) {
                        p.push_str(&String::from_utf8_lossy(&e));
                    }
                }
                13 => p.push_str(&String::from_utf8_lossy(&input.name())),
                14 => p.push_str("**/"),
                15 => p.push(' '),
                16 => p.push('['),
                _ => p.push('\\'),
            }
        }
        p
    }

    fn follow_path(&self, input: &mut Input) -> String {
        let mut p = String::new();
        match input.below(4) {
            0 => p.push('/'),
            1 => p.push_str("./"),
            _ => {}
        }
        for i in 0..input.below(4) + 1 {
            if i > 0 {
                p.push('/');
            }
            match input.below(8) {
                0 => p.push_str(".."),
                1 => p.push('.'),
                2 => p.push('*'),
                3 => p.push_str("a?"),
                4 => p.push_str(&String::from_utf8_lossy(&input.name())),
                _ => {
                    if let Some(e) = self.pick_entry(input) {
                        p.push_str(&String::from_utf8_lossy(&e));
                    }
                }
            }
        }
        p
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    })
}

/// Reads every file: a replay with no remembered hashes.
struct ReadEach;

impl HashFile for ReadEach {
    fn remembered(&self, _: &Path, _: &fs::Metadata) -> Option<String> {
        None
    }

    fn sha256(&self, _: &Path, file: &mut fs::File) -> std::io::Result<String> {
        let mut hasher = Sha256::new();
        std::io::copy(file, &mut hasher)?;
        Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    }

    fn sha256_while(
        &self,
        _: &Path,
        file: &mut fs::File,
        read: &mut dyn FnMut(&mut fs::File) -> std::io::Result<String>,
    ) -> std::io::Result<String> {
        read(file)
    }
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every entry under `root` in fsutil's order, found without the code under test.
fn reference_walk(root: &Path, dir: &[u8], out: &mut Vec<Vec<u8>>) {
    let mut names: Vec<Vec<u8>> = fs::read_dir(abs(root, dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    names.sort();
    for name in names {
        let rel = join(dir, &name);
        out.push(rel.clone());
        if fs::symlink_metadata(abs(root, &rel)).unwrap().is_dir() {
            reference_walk(root, &rel, out);
        }
    }
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

/// Go's filepath.Clean for `/`-separated paths.
fn go_clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            ".." if rooted => {}
            name => parts.push(name),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".into(),
        (false, false) => body,
    }
}

/// The patterns as patternmatcher keeps them, if none is an exception or has a wildcard.
fn literal_patterns(patterns: &[String]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for p in patterns {
        let t = p.trim();
        if t.is_empty() {
            continue;
        }
        let c = go_clean(t);
        if c.starts_with('!') || c.contains(['*', '?', '[', '\\']) {
            return None;
        }
        out.push(c);
    }
    Some(out)
}

fn at_or_under(path: &str, pattern: &str) -> bool {
    path == pattern
        || path
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `filter` refusing to open a listed file (patternmatcher's parent re-check disagreeing
/// with the walk) means it is sent, and hashed, empty, as by the Docker CLI.
fn check_entries(root: &Path, entries: &[SentEntry], what: &str, filter: &Filter) {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut inodes: HashMap<(u64, u64), &str> = HashMap::new();
    let mut previous: Option<Vec<&[u8]>> = None;
    for e in entries {
        let p = e.path.as_str();
        let parts: Vec<&[u8]> = p.split('/').map(str::as_bytes).collect();
        assert!(
            !p.is_empty() && !p.starts_with('/'),
            "{what}: path {p:?} is not relative"
        );
        for part in &parts {
            assert!(
                !part.is_empty() && *part != b"." && *part != b"..",
                "{what}: path {p:?} has an empty, . or .. component"
            );
        }
        // fsutil's order: parents first, siblings by bytes (a component-wise comparison).
        if let Some(prev) = &previous {
            assert!(
                prev < &parts,
                "{what}: {p:?} is out of order after {:?}",
                prev.join(&b'/')
                    .iter()
                    .map(|&b| b as char)
                    .collect::<String>()
            );
        }
        if let Some((parent, _)) = p.rsplit_once('/') {
            assert!(
                seen.contains(parent),
                "{what}: {p:?} sent before its parent"
            );
        }
        let meta = lstat_inside(root, p)
            .unwrap_or_else(|| panic!("{what}: {p:?} does not exist under the root"));
        let ft = meta.file_type();
        let type_bits = e.mode & MODE_TYPE;
        let expected_type = if ft.is_dir() {
            MODE_DIR
        } else if ft.is_symlink() {
            MODE_SYMLINK
        } else if ft.is_fifo() {
            MODE_NAMED_PIPE
        } else {
            0
        };
        assert_eq!(type_bits, expected_type, "{what}: {p:?} mode {:o}", e.mode);
        assert_eq!(
            e.mode & 0o777,
            meta.mode() & 0o777,
            "{what}: {p:?} permissions"
        );
        if ft.is_dir() {
            assert_eq!(e.size, 0, "{what}: {p:?} dir size");
            assert!(e.linkname.is_empty(), "{what}: {p:?} dir linkname");
        } else {
            assert_eq!(e.size, meta.len() as i64, "{what}: {p:?} size");
        }
        if ft.is_symlink() {
            let target = fs::read_link(root.join(p)).unwrap();
            assert_eq!(
                e.linkname.as_bytes(),
                target.as_os_str().as_bytes(),
                "{what}: {p:?} link target"
            );
            assert!(
                e.sha256.is_none(),
                "{what}: {p:?} is a symlink but was hashed (read through the link)"
            );
        }
        if ft.is_dir() || ft.is_fifo() {
            assert!(e.sha256.is_none(), "{what}: {p:?} hashed but not a file");
        }
        if ft.is_file() || ft.is_socket() {
            let key = (meta.dev(), meta.ino());
            match inodes.get(&key) {
                Some(first) if ft.is_file() => {
                    assert_eq!(&e.linkname, first, "{what}: {p:?} hard link target");
                }
                _ => {
                    assert!(
                        e.linkname.is_empty(),
                        "{what}: {p:?} names {:?} as its first link, not sent before",
                        e.linkname
                    );
                    inodes.insert(key, p);
                }
            }
        }
        // replay hashes every regular file (and socket) that is not a second hard link.
        if (ft.is_file() || ft.is_socket()) && e.linkname.is_empty() {
            assert!(e.sha256.is_some(), "{what}: {p:?} was not hashed");
        }
        if let Some(sha) = &e.sha256 {
            let expected = if ft.is_file() && filter.opens(p) {
                sha256_hex(&fs::read(root.join(p)).unwrap_or_default())
            } else {
                sha256_hex(b"")
            };
            assert_eq!(sha, &expected, "{what}: {p:?} digest");
        }
        seen.insert(p);
        previous = Some(parts);
    }
}

/// Serves `root` as a receiver asking for every requestable file would: the stats (or the
/// walk's error), and per requested id the bytes received; `send`'s own result and record.
struct Sent {
    stats_error: Option<String>,
    result: Result<(), String>,
    entries: Vec<SentEntry>,
    data: HashMap<u32, Vec<u8>>,
}

async fn next<E: std::fmt::Debug>(
    from_sender: &mut tokio::sync::mpsc::Receiver<Result<Packet, E>>,
) -> Packet {
    match from_sender.recv().await {
        Some(Ok(p)) => p,
        Some(Err(status)) => panic!("sender sent a status {status:?}"),
        None => panic!("sender closed the stream early"),
    }
}

async fn drive(root: PathBuf, filter: Filter) -> Sent {
    let (to_sender, incoming) = tokio::sync::mpsc::channel(4 * MAX_ENTRIES);
    let (outgoing, mut from_sender) = tokio::sync::mpsc::channel(8);
    let task = tokio::spawn(async move {
        let mut entries = Vec::new();
        let result = send(
            &root,
            &filter,
            None,
            tokio_stream::wrappers::ReceiverStream::new(incoming),
            outgoing,
            &mut entries,
        )
        .await;
        (result, entries)
    });
    let mut stats = Vec::new();
    let mut stats_error = None;
    loop {
        let p = next(&mut from_sender).await;
        match PacketType::try_from(p.r#type) {
            Ok(PacketType::PacketStat) => match p.stat {
                Some(stat) => stats.push(stat),
                None => break,
            },
            Ok(PacketType::PacketErr) => {
                stats_error = Some(String::from_utf8_lossy(&p.data).into_owned());
                break;
            }
            other => panic!("unexpected packet {other:?} among the stats"),
        }
    }
    let mut data: HashMap<u32, Vec<u8>> = HashMap::new();
    if stats_error.is_none() {
        let mut open = HashSet::new();
        for (id, stat) in stats.iter().enumerate() {
            if stat.mode & MODE_TYPE == 0 {
                let id = id as u32;
                to_sender
                    .send(Ok(Packet {
                        r#type: PacketType::PacketReq as i32,
                        id,
                        ..Default::default()
                    }))
                    .await
                    .unwrap();
                open.insert(id);
                data.insert(id, Vec::new());
            }
        }
        while !open.is_empty() {
            let p = next(&mut from_sender).await;
            assert_eq!(p.r#type, PacketType::PacketData as i32, "{p:?}");
            assert!(open.contains(&p.id), "DATA for {} not open", p.id);
            if p.data.is_empty() {
                open.remove(&p.id);
            } else {
                data.get_mut(&p.id).unwrap().extend_from_slice(&p.data);
            }
        }
        to_sender
            .send(Ok(Packet {
                r#type: PacketType::PacketFin as i32,
                ..Default::default()
            }))
            .await
            .unwrap();
        let fin = next(&mut from_sender).await;
        assert_eq!(fin.r#type, PacketType::PacketFin as i32, "{fin:?}");
    }
    let (result, entries) = task.await.expect("send panicked");
    Sent {
        stats_error,
        result: result.map_err(|e| e.to_string()),
        entries,
        data,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data, pos: 0 };
    let base = tempfile::Builder::new()
        .prefix("polyarch-fuzz-filesync-")
        .tempdir_in(std::env::var_os("FUZZ_SPOOL").unwrap_or_else(|| std::env::temp_dir().into()))
        .expect("temp dir");
    let root = base.path().join("root");
    let outside = base.path().join("outside");
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("secret"), b"outside").unwrap();
    fs::write(outside.join("dir/secret2"), b"outside").unwrap();
    fs::create_dir_all(base.path().join("root-sibling")).unwrap();
    fs::write(base.path().join("root-sibling/f"), b"sibling").unwrap();
    fs::create_dir(&root).unwrap();

    let mut tree = Tree {
        root: root.clone(),
        outside,
        dirs: vec![Vec::new()],
        entries: Vec::new(),
        fifo_made: false,
    };
    tree.build(&mut input);
    let include: Vec<String> = (0..input.below(MAX_PATTERNS + 1))
        .map(|_| tree.pattern(&mut input, true))
        .collect();
    let exclude: Vec<String> = (0..input.below(MAX_PATTERNS + 1))
        .map(|_| tree.pattern(&mut input, true))
        .collect();
    let follow: Vec<String> = (0..input.below(MAX_PATTERNS + 1))
        .map(|_| tree.follow_path(&mut input))
        .collect();

    let debug = std::env::var_os("FILESYNC_DEBUG").is_some();
    if debug {
        for (rel, _) in &tree.entries {
            let path = abs(&root, rel);
            let meta = fs::symlink_metadata(&path).unwrap();
            let link = fs::read_link(&path).ok();
            eprintln!(
                "entry {:?} mode {:o} -> {link:?}",
                OsStr::from_bytes(rel),
                meta.mode()
            );
        }
        eprintln!("include {include:?}\nexclude {exclude:?}\nfollow {follow:?}");
    }

    // No patterns: exactly the tree, in fsutil's order, or the non-UTF-8 name's error.
    let mut all = Vec::new();
    reference_walk(&root, b"", &mut all);
    let unfiltered = replay(&root, &Filter::default(), &ReadEach);
    // Names and link targets go in protobuf strings: one that is not UTF-8 fails the walk.
    let utf8 = all.iter().all(|p| {
        std::str::from_utf8(p).is_ok()
            && fs::read_link(abs(&root, p)).map_or(true, |t| {
                std::str::from_utf8(t.as_os_str().as_bytes()).is_ok()
            })
    });
    if utf8 {
        let unfiltered = unfiltered.as_ref().expect("replay of a UTF-8 tree failed");
        let listed: Vec<&[u8]> = unfiltered.iter().map(|e| e.path.as_bytes()).collect();
        let expected: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        assert_eq!(listed, expected, "unfiltered replay is not the whole tree");
        check_entries(&root, unfiltered, "unfiltered", &Filter::default());
    } else {
        assert!(
            unfiltered.is_err(),
            "a non-UTF-8 name or link target was sent"
        );
    }

    let Ok(filter) = Filter::new(&root, &include, &exclude, &follow) else {
        return;
    };
    let first = replay(&root, &filter, &ReadEach);
    if debug {
        match &first {
            Ok(entries) => entries.iter().for_each(|e| eprintln!("sent {e:?}")),
            Err(e) => eprintln!("replay error {e}"),
        }
    }
    let second = replay(&root, &filter, &ReadEach);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert!(a == b, "replay is not deterministic"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "replay errors differ"),
        _ => panic!("replay is not deterministic: {first:?} then {second:?}"),
    }

    if let Ok(entries) = &first {
        check_entries(&root, entries, "filtered", &filter);
        // Filtering only removes: the same entries, in the same order.
        if let Ok(unfiltered) = &unfiltered {
            let mut rest = unfiltered.iter();
            for e in entries {
                let u = rest
                    .find(|u| u.path == e.path)
                    .unwrap_or_else(|| panic!("{:?} sent filtered but not unfiltered", e.path));
                assert_eq!((u.mode, u.size), (e.mode, e.size), "{:?}", e.path);
            }
        }
        // Literal excludes (no exceptions): nothing at or under them but directories.
        if let Some(literal) = literal_patterns(&exclude) {
            for e in entries.iter().filter(|e| e.mode & MODE_DIR == 0) {
                for l in &literal {
                    assert!(
                        !at_or_under(&e.path, l),
                        "{:?} sent despite exclude {l:?}",
                        e.path
                    );
                }
            }
        }
        // Literal includes, no follow paths: every non-directory at or under one of them.
        if follow.is_empty() {
            if let Some(literal) = literal_patterns(&include) {
                if !literal.is_empty() && !literal.iter().any(|l| l == ".") {
                    for e in entries.iter().filter(|e| e.mode & MODE_DIR == 0) {
                        assert!(
                            literal.iter().any(|l| at_or_under(&e.path, l)),
                            "{:?} sent but not included by {literal:?}",
                            e.path
                        );
                    }
                }
            }
        }
    }

    // The protocol: every requestable file asked for, then FIN.
    let sent = runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(20), drive(root.clone(), filter.clone()))
            .await
            .expect("send hung")
    });
    match &first {
        Ok(entries) => {
            assert!(
                sent.stats_error.is_none(),
                "send failed: {:?}",
                sent.stats_error
            );
            sent.result.as_ref().expect("send failed after FIN");
            assert_eq!(
                sent.entries.len(),
                entries.len(),
                "send and replay differ in count"
            );
            for (id, (s, r)) in sent.entries.iter().zip(entries).enumerate() {
                assert_eq!(
                    (&s.path, s.mode, s.size, &s.linkname),
                    (&r.path, r.mode, r.size, &r.linkname),
                    "send and replay differ"
                );
                if let Some(bytes) = sent.data.get(&(id as u32)) {
                    let meta = fs::symlink_metadata(root.join(&s.path)).unwrap();
                    let expected = if meta.is_file() && filter.opens(&s.path) {
                        fs::read(root.join(&s.path)).unwrap()
                    } else {
                        Vec::new()
                    };
                    assert!(bytes == &expected, "{:?}: wrong bytes sent", s.path);
                    assert_eq!(
                        s.sha256.as_deref(),
                        Some(&*sha256_hex(bytes)),
                        "{:?}",
                        s.path
                    );
                    if r.sha256.is_some() {
                        assert_eq!(s.sha256, r.sha256, "{:?}: send and replay digests", s.path);
                    }
                } else {
                    assert!(s.sha256.is_none(), "{:?} hashed but not requested", s.path);
                }
            }
        }
        Err(error) => {
            assert_eq!(
                sent.stats_error.as_deref(),
                Some(&*error.to_string()),
                "send's ERR is not replay's error"
            );
            assert_eq!(sent.result.as_ref().err(), Some(&error.to_string()));
        }
    }
});

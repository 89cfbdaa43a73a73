use super::send::*;
use super::walk::*;
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

/// A directory holding each of `files` (parents created), each with the bytes `x`.
fn tree(files: &[&str]) -> TempDir {
    let dir = TempDir::new().unwrap();
    for rel in files {
        write(dir.path(), rel, b"x");
    }
    dir
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
    walk_tree(root, filter, &mut |stat, _| {
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
    let dir = tree(&[
        ".hidden",
        "B",
        "a/b/c.txt",
        "a/z",
        "a-c",
        "a.d",
        "with space",
        "ünï",
        "zz/.x",
    ]);
    let root = dir.path();
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
    let dir = tree(&[
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
    ]);
    let root = dir.path();
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
    let dir = tree(&[
        "Cargo.toml",
        "srcfoo",
        "src/lib.rs",
        "src/nested/x.rs",
        "src/nested/notes.txt",
        "target/debug/bin",
    ]);
    let root = dir.path();
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
        Self::telling(root, filter, queue, None)
    }

    /// A receiver whose sender tells `hashes` what it sends.
    fn telling(
        root: &Path,
        filter: Filter,
        queue: usize,
        hashes: Option<SharedHashes>,
    ) -> Receiver {
        let (to_sender, incoming) = mpsc::channel(16);
        let (outgoing, from_sender) = mpsc::channel(queue);
        let root = root.to_path_buf();
        let task = tokio::spawn(async move {
            let mut entries = Vec::new();
            let result = send(
                &root,
                &filter,
                hashes,
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
    let replayed = replay(root, &filter, &ReadEach).unwrap();
    assert_eq!(
        entries[refused as usize].sha256.as_deref(),
        Some(&*sha256_hex(b""))
    );
    assert_eq!(
        replayed[refused as usize].sha256,
        entries[refused as usize].sha256
    );
}

/// Knows every file by the walk's stat, as remembered hashes of an unchanged tree do.
struct KnowsAll(std::sync::atomic::AtomicUsize);

impl HashFile for KnowsAll {
    fn remembered(&self, _: &Path, walked: &fs::Metadata) -> Option<String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(format!("known at size {}", walked.len()))
    }

    fn sha256(&self, path: &Path, _: &mut fs::File) -> io::Result<String> {
        panic!("{} was opened although its hash was known", path.display())
    }

    fn sha256_while(
        &self,
        path: &Path,
        _: &mut fs::File,
        _: &mut dyn FnMut(&mut fs::File) -> io::Result<String>,
    ) -> io::Result<String> {
        panic!("{} was sent by a replay", path.display())
    }
}

#[test]
fn a_replay_opens_no_file_whose_hash_the_walks_stat_answers() {
    let dir = tree(&["a.txt", "src/b.txt"]);
    let root = dir.path();
    let hashes = KnowsAll(Default::default());
    let replayed = replay(root, &Filter::default(), &hashes).unwrap();
    let files: Vec<_> = replayed.iter().filter(|e| e.sha256.is_some()).collect();
    assert_eq!(files.len(), 2);
    for file in files {
        let size = fs::metadata(root.join(&file.path)).unwrap().len();
        assert_eq!(file.sha256, Some(format!("known at size {size}")));
    }
    assert_eq!(hashes.0.into_inner(), 2);
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

/// Reads every file, as a replay without remembered hashes does.
struct ReadEach;

impl HashFile for ReadEach {
    fn remembered(&self, _: &Path, _: &fs::Metadata) -> Option<String> {
        None
    }

    fn sha256(&self, _: &Path, file: &mut fs::File) -> io::Result<String> {
        let mut hasher = Sha256::new();
        io::copy(file, &mut hasher)?;
        Ok(hex::encode(hasher.finalize()))
    }

    fn sha256_while(
        &self,
        _: &Path,
        file: &mut fs::File,
        read: &mut dyn FnMut(&mut fs::File) -> io::Result<String>,
    ) -> io::Result<String> {
        read(file)
    }
}

/// Keeps what the sender tells it of each file it sent.
#[derive(Default)]
struct ToldSent(Mutex<Vec<(PathBuf, String)>>);

impl HashFile for ToldSent {
    fn remembered(&self, _: &Path, _: &fs::Metadata) -> Option<String> {
        None
    }

    fn sha256(&self, path: &Path, _: &mut fs::File) -> io::Result<String> {
        panic!("the sender hashed {} apart from sending it", path.display())
    }

    fn sha256_while(
        &self,
        path: &Path,
        file: &mut fs::File,
        read: &mut dyn FnMut(&mut fs::File) -> io::Result<String>,
    ) -> io::Result<String> {
        let sha256 = read(file)?;
        lock(&self.0).push((path.to_path_buf(), sha256.clone()));
        Ok(sha256)
    }
}

/// The replay after a build finds each file sent already hashed: the sender tells the
/// run's hashes the sha256 of the very bytes it sent, and nothing of a withheld file.
#[tokio::test]
async fn the_sender_tells_the_hashes_what_it_sent() {
    let dir = tree(&["a.txt", "dir/b.bin", "dir/c.txt"]);
    let root = dir.path();
    let big: Vec<u8> = (0..(3 * CHUNK_SIZE + 7)).map(|i| (i % 251) as u8).collect();
    fs::write(root.join("dir/b.bin"), &big).unwrap();
    let told = Arc::new(ToldSent::default());
    let hashes: SharedHashes = told.clone();
    let filter = Filter::new(root, &[], &["dir/c.txt".into()], &[]).unwrap();
    let mut rx = Receiver::telling(root, filter, 4, Some(hashes));
    let stats = rx.stats().await;
    let (a, b) = (id_of(&stats, "a.txt"), id_of(&stats, "dir/b.bin"));
    rx.put(PacketType::PacketReq, a).await;
    rx.put(PacketType::PacketReq, b).await;
    let data = rx.data(&[a, b]).await;
    rx.put(PacketType::PacketFin, 0).await;
    assert_eq!(rx.next().await.r#type, PacketType::PacketFin as i32);
    let (result, entries) = rx.finish().await;
    result.unwrap();
    let mut told = lock(&told.0).clone();
    told.sort();
    let expected = [(a, "a.txt"), (b, "dir/b.bin")].map(|(id, path)| {
        assert_eq!(entries[id as usize].sha256, Some(sha256_hex(&data[&id])));
        (root.join(path), sha256_hex(&data[&id]))
    });
    assert_eq!(told, expected);
}

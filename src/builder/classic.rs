//! The classic builder (engines without BuildKit): the context as a tar through the
//! REST `/build`, `.dockerignore` applied here.

use super::*;
use crate::builder::file_hashes::{self, FileHashes, TreeStat};
use crate::docker::engine::Product;
use crate::registry::credentials::Credential;
use bollard::auth::DockerCredentials;
use std::sync::Arc;

/// How a classic build ended: the error message when it failed, and the sha256 of the
/// context tar the engine was sent in full (what the warm path compares next time).
pub(super) struct ClassicOutcome {
    pub(super) failed: Option<String>,
    pub(super) sent_context: Option<String>,
}

/// The build through the classic builder (`POST /build`, the context uploaded as a tar),
/// for engines without BuildKit (old Docker, Podman).
pub(super) async fn build_classic(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    tag: &str,
    hashes: &Arc<FileHashes>,
    log: &mut BuildLog<'_>,
) -> Result<ClassicOutcome> {
    refuse_buildkit_only_settings(engine, spec, platform, false)?;
    let options = classic_options(engine, spec, platform, tag);
    let credentials = registry_config(spec, options.buildargs.as_ref())?;
    let (context, sent) = stream_context(spec, hashes.clone(), Vec::new())?;
    let mut stream =
        engine
            .docker
            .build_image(options, credentials, Some(bollard::body_stream(context)));
    while let Some(item) = stream.next().await {
        if let Err(e) = item.map(|info| log.consume(info)) {
            return Ok(ClassicOutcome {
                failed: Some(e.to_string()),
                sent_context: None,
            });
        }
    }
    Ok(ClassicOutcome {
        failed: None,
        sent_context: sent.await.ok(),
    })
}

/// Settings only BuildKit builds are refused up front, with the way to get BuildKit.
/// `secrets` is what libpod's build takes besides (secrets, not SSH agents or caches).
pub(super) fn refuse_buildkit_only_settings(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    secrets: bool,
) -> Result<()> {
    let needs_buildkit = [
        (!secrets && !spec.secrets.is_empty(), "secrets"),
        (!spec.ssh.is_empty(), "ssh"),
        (
            !spec.cache_from.is_empty() || spec.cache_to.is_some(),
            "cache",
        ),
        (!spec.contexts.is_empty(), "contexts"),
        // The classic builder reads the Dockerfile from the context tar only.
        (
            !spec
                .context
                .join(&spec.dockerfile)
                .starts_with(&spec.context),
            "a Dockerfile outside the context",
        ),
    ];
    if let Some((_, what)) = needs_buildkit.iter().find(|(used, _)| *used) {
        let fix = match engine.product {
            Product::Podman => {
                "build this image on a Docker engine (DOCKER_HOST, or a builder under `builders:`)"
            }
            // A daemon always builds with BuildKit.
            Product::Docker | Product::BuildKit => {
                "upgrade it to Docker 18.09+ or build on another engine"
            }
        };
        let has = match (engine.product, secrets) {
            (Product::Podman, true) => "its libpod build takes secrets only".to_string(),
            _ => "has none".to_string(),
        };
        Err(BuilderError::Build {
            image: spec.name.clone(),
            platform: platform.to_string(),
            source: BuildError::Request(format!(
                "`{what}` needs BuildKit, and the engine at {} ({}, API {}) {has}; {fix}",
                engine.endpoint,
                engine.product_version(),
                engine.api_version
            )),
        })
    } else {
        Ok(())
    }
}

/// The classic builder's `/build` query for one platform of `spec`, tagged `tag`.
fn classic_options(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    tag: &str,
) -> BuildImageOptions {
    let mut buildargs: HashMap<String, String> = spec.build_args.clone().into_iter().collect();
    // The classic builder defines none of the platform args BuildKit does.
    for (key, value) in platform_build_args(platform, &engine.native) {
        buildargs.entry(key).or_insert(value);
    }
    BuildImageOptions {
        dockerfile: spec.dockerfile.to_string_lossy().replace('\\', "/"),
        t: Some(tag.to_string()),
        platform: platform.to_string(),
        target: spec.target.clone().unwrap_or_default(),
        buildargs: Some(buildargs),
        labels: Some(spec.labels.clone().into_iter().collect()),
        networkmode: Some(
            match spec.network {
                Network::Default => "default",
                Network::Host => "host",
                Network::None => "none",
            }
            .to_string(),
        ),
        rm: true,
        forcerm: true,
        // The classic builder's cache ignores the platform: a layer cached for amd64 would
        // be reused for arm64.
        nocache: true,
        version: BuilderVersion::BuilderV1,
        ..Default::default()
    }
}

/// The credentials the classic builder pulls the Dockerfile's base images with (sent as
/// `X-Registry-Config`, as the Docker CLI does): the command line's for the image's own
/// registry, else what the Docker config holds for each base's registry. None when no
/// base needs any.
pub(super) fn registry_config(
    spec: &ImageSpec,
    args: Option<&HashMap<String, String>>,
) -> Result<Option<HashMap<String, DockerCredentials>>> {
    let path = spec.context.join(&spec.dockerfile);
    let text = std::fs::read_to_string(&path).map_err(|e| BuilderError::io(&path, e))?;
    let images = crate::base::dockerfile::external_images(&text, args.unwrap_or(&HashMap::new()))
        .unwrap_or_default();
    let push = crate::registry::parse_reference(&spec.repository)
        .ok()
        .map(|r| crate::registry::credentials::normalize_key(r.registry()));
    let mut config = HashMap::new();
    for (image, _) in images {
        let Ok(reference) = crate::registry::parse_reference(&image) else {
            continue;
        };
        let registry = reference.registry().to_string();
        let key = crate::registry::credentials::normalize_key(&registry);
        let given = spec.login.clone().filter(|_| push.as_ref() == Some(&key));
        let found = match given {
            Some(login) => Some(login),
            None => crate::registry::credentials::resolve(&registry, None)?,
        };
        let Some(credential) = found else { continue };
        // The engine looks Docker Hub up under its index URL, others under host[:port].
        let server = match key.as_str() {
            "docker.io" => "https://index.docker.io/v1/".to_string(),
            _ => registry,
        };
        let (username, password, identitytoken) = match credential {
            Credential::Basic { username, password } => (Some(username), Some(password), None),
            Credential::IdentityToken(token) => (None, None, Some(token)),
        };
        config.insert(
            server.clone(),
            DockerCredentials {
                username,
                password,
                identitytoken,
                serveraddress: Some(server),
                ..Default::default()
            },
        );
    }
    Ok((!config.is_empty()).then_some(config))
}

/// A file sent after the context: its name at the tar's root and its content.
pub(super) type ExtraFile = (String, Vec<u8>);

/// Streams the build context as a tar from a blocking thread, so a large context is
/// never held in memory; the receiver gets the tar's sha256 once all of it was sent
/// (remembered in `hashes` by the tree's stat, for the next run's warm check). `extra`
/// files (name at the tar's root, content: libpod's build secrets) follow the context's
/// and are not part of that sha256, which stays the one of the context's tar alone.
pub(super) fn stream_context(
    spec: &ImageSpec,
    hashes: Arc<FileHashes>,
    extra: Vec<ExtraFile>,
) -> Result<(
    impl futures_util::Stream<Item = Bytes> + Send + 'static,
    tokio::sync::oneshot::Receiver<String>,
)> {
    let started = file_hashes::unix_nanos();
    let context = ContextTree::walk(spec, &hashes, started)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let (digest_tx, digest_rx) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx,
            buf: Vec::new(),
        };
        // An error means the engine hung up; the build stream reports why.
        if let Ok(digest) = context.write(&hashes, started, writer, &extra) {
            let _ = digest_tx.send(digest);
        }
    });
    Ok((tokio_stream_from(rx), digest_rx))
}

/// What of a context the engine is sent, and the stat of it all when none of it is racy.
struct ContextTree {
    root: PathBuf,
    name: String,
    files: Vec<PathBuf>,
    stat: Option<TreeStat>,
}

impl ContextTree {
    /// The context's files and their stat, `started` being [`file_hashes::unix_nanos`]
    /// before the walk.
    fn walk(spec: &ImageSpec, hashes: &FileHashes, started: i64) -> Result<ContextTree> {
        let root = spec.context.clone();
        let files = ContextFilter::load(&root, &spec.dockerfile)?.files(&root)?;
        // The Dockerfile decides which ignore file counts: a tree per Dockerfile.
        let name = format!("classic-context-tar {}", spec.dockerfile.display());
        let stat = hashes.tree_stat(&root, &name, &files, started);
        Ok(ContextTree {
            root,
            name,
            files,
            stat,
        })
    }

    /// Writes the tar to `out`; its sha256, remembered by the tree's stat when that did
    /// not move while it was written.
    fn write(
        self,
        hashes: &FileHashes,
        started: i64,
        out: impl Write,
        extra: &[ExtraFile],
    ) -> std::io::Result<String> {
        let digest = write_context(&self.root, &self.files, out, extra)?;
        if let Some(before) = self.stat {
            let after = hashes.tree_stat(&self.root, &self.name, &self.files, started);
            if after.as_ref() == Some(&before) {
                hashes.remember_tree(before, digest.clone());
            }
        }
        Ok(digest)
    }
}

/// Writes the context tar of `files` to `out`, then the `extra` files; the sha256 of the
/// tar of `files` alone (its entries and the end-of-archive blocks).
fn write_context(
    context: &Path,
    files: &[PathBuf],
    out: impl Write,
    extra: &[ExtraFile],
) -> std::io::Result<String> {
    let mut tar = tar::Builder::new(HashingWriter {
        inner: out,
        hash: sha2::Sha256::default(),
        hashing: true,
    });
    tar.follow_symlinks(false);
    for relative in files {
        tar.append_path_with_name(context.join(relative), relative)?;
    }
    if !extra.is_empty() {
        let writer = tar.get_mut();
        // The digest is of the context's tar as it would end here.
        sha2::Digest::update(&mut writer.hash, [0u8; 1024]);
        writer.hashing = false;
        for (name, data) in extra {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o600);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, name, data.as_slice())?;
        }
    }
    let mut hashing = tar.into_inner()?;
    hashing.flush()?;
    use sha2::Digest as _;
    Ok(hex::encode(hashing.hash.finalize()))
}

/// The sha256 of the context tar a classic build of `spec` would be sent now, without
/// sending it: equal to an earlier build's `ClassicOutcome::sent_context` when nothing the
/// engine was sent has changed (file list, contents, modes, times). Read only when the
/// tree's stat is not the one `hashes` remember a digest for. Blocking.
pub fn classic_context_digest(spec: &ImageSpec, hashes: &FileHashes) -> Result<String> {
    context_digest_at(spec, hashes, file_hashes::unix_nanos())
}

/// [`classic_context_digest`] at `started` ([`file_hashes::unix_nanos`]) before the walk.
fn context_digest_at(spec: &ImageSpec, hashes: &FileHashes, started: i64) -> Result<String> {
    let context = ContextTree::walk(spec, hashes, started)?;
    if let Some(known) = context.stat.as_ref().and_then(|s| hashes.tree_digest(s)) {
        return Ok(known);
    }
    context
        .write(hashes, started, std::io::sink(), &[])
        .map_err(|e| BuilderError::io(&spec.context, e))
}

struct HashingWriter<W> {
    inner: W,
    hash: sha2::Sha256,
    /// Off for what follows the context (secrets).
    hashing: bool,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        if self.hashing {
            sha2::Digest::update(&mut self.hash, &data[..n]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 * 1024 {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.blocking_send(chunk).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "engine closed the build")
        })
    }
}

/// What of a context the engine is sent, as BuildKit decides it: the ignore file's
/// patterns, and the files that are always sent (the Dockerfile and that ignore file).
pub(super) struct ContextFilter {
    pub(super) ignore: Gitignore,
    /// Relative to the context: `<Dockerfile>.dockerignore` beside the Dockerfile when it
    /// exists (BuildKit then reads it instead of the context's), else `.dockerignore`.
    ignore_file: PathBuf,
    pub(super) dockerfile: PathBuf,
}

impl ContextFilter {
    /// `.dockerignore` patterns are relative to the context root, so each is anchored;
    /// gitignore matching then gives Docker's semantics (`*` within a segment, `**`, `!`).
    pub(super) fn load(context: &Path, dockerfile: &Path) -> Result<ContextFilter> {
        let mut specific = dockerfile.as_os_str().to_owned();
        specific.push(".dockerignore");
        let specific = PathBuf::from(specific);
        let ignore_file = if context.join(&specific).is_file() {
            specific
        } else {
            PathBuf::from(".dockerignore")
        };
        let path = context.join(&ignore_file);
        let bad = |message: String| BuilderError::Build {
            image: context.display().to_string(),
            platform: "any".into(),
            source: BuildError::Request(message),
        };
        let mut builder = GitignoreBuilder::new(context);
        if let Ok(text) = std::fs::read_to_string(&path) {
            for raw in text.lines() {
                let line = raw.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (negated, pattern) = match line.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, line),
                };
                let pattern = pattern.trim_start_matches("./").trim_start_matches('/');
                let anchored = format!("{}/{}", if negated { "!" } else { "" }, pattern);
                builder
                    .add_line(None, &anchored)
                    .map_err(|e| bad(format!("{}: bad pattern `{line}`: {e}", path.display())))?;
            }
        }
        let ignore = builder
            .build()
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Ok(ContextFilter {
            ignore,
            ignore_file,
            dockerfile: dockerfile.to_path_buf(),
        })
    }

    /// The Dockerfile and the ignore file are always sent, as the Docker CLI does.
    fn always_sent(&self, relative: &Path) -> bool {
        relative == self.dockerfile || relative == self.ignore_file
    }

    /// Files of the context in a stable order.
    pub(super) fn files(&self, context: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(dir) = stack.pop() {
            let full = context.join(&dir);
            let mut entries: Vec<_> = std::fs::read_dir(&full)
                .map_err(|e| BuilderError::io(&full, e))?
                .filter_map(|e| e.ok())
                .collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let relative = dir.join(entry.file_name());
                let file_type = entry
                    .file_type()
                    .map_err(|e| BuilderError::io(entry.path(), e))?;
                let is_dir = file_type.is_dir();
                let ignored = self
                    .ignore
                    .matched_path_or_any_parents(&relative, is_dir)
                    .is_ignore();
                if is_dir {
                    // Walk ignored directories too: an exception (`!dir/keep`) may re-include a child.
                    if !ignored {
                        out.push(relative.clone());
                    }
                    stack.push(relative);
                } else if !ignored || self.always_sent(&relative) {
                    out.push(relative);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A context of a Dockerfile, a file in a directory and a symlink, and an image of it.
    fn context() -> (tempfile::TempDir, ImageSpec) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("Dockerfile"), "FROM scratch\nCOPY . /\n").unwrap();
        fs::create_dir(dir.path().join("src")).unwrap();
        fs::write(dir.path().join("src/a"), "aaaa").unwrap();
        std::os::unix::fs::symlink("src/a", dir.path().join("link")).unwrap();
        let spec = ImageSpec {
            context: dir.path().to_path_buf(),
            ..crate::project::test_image("v1")
        };
        (dir, spec)
    }

    /// As if every change so far were long past (no entry racy).
    fn later() -> i64 {
        file_hashes::unix_nanos() + 3_600_000_000_000
    }

    /// The digest of the tar as sent now, read in full.
    fn read_in_full(spec: &ImageSpec) -> String {
        let files = ContextFilter::load(&spec.context, &spec.dockerfile)
            .unwrap()
            .files(&spec.context)
            .unwrap();
        write_context(&spec.context, &files, std::io::sink(), &[]).unwrap()
    }

    /// Plants a digest no read would give for the tree as it is now: served only when
    /// the tree is not read again.
    fn plant(spec: &ImageSpec, hashes: &FileHashes, at: i64) {
        let tree = ContextTree::walk(spec, hashes, at).unwrap();
        hashes.remember_tree(tree.stat.unwrap(), "planted".into());
    }

    #[test]
    fn the_context_a_build_sent_is_remembered_and_not_read_again_while_its_stat_holds() {
        let (_dir, spec) = context();
        let hashes = FileHashes::open(None);
        let at = later();
        // As the build streams it to the engine.
        let mut sent = Vec::new();
        let tree = ContextTree::walk(&spec, &hashes, at).unwrap();
        let digest = tree.write(&hashes, at, &mut sent, &[]).unwrap();
        assert_eq!(digest, read_in_full(&spec));
        assert_eq!(context_digest_at(&spec, &hashes, at).unwrap(), digest);
        plant(&spec, &hashes, at);
        assert_eq!(context_digest_at(&spec, &hashes, at).unwrap(), "planted");
    }

    /// Waits until a file written now gets a later ctime than any entry under `root`.
    fn past_the_newest_change(root: &Path, probes: &Path) {
        use std::os::unix::fs::MetadataExt;
        let ctime = |m: fs::Metadata| (m.ctime(), m.ctime_nsec());
        let newest = fs::read_dir(root)
            .unwrap()
            .chain(fs::read_dir(root.join("src")).unwrap())
            .map(|e| ctime(fs::symlink_metadata(e.unwrap().path()).unwrap()))
            .max()
            .unwrap();
        let probe = probes.join("probe");
        while {
            fs::write(&probe, "").unwrap();
            ctime(fs::metadata(&probe).unwrap()) <= newest
        } {}
    }

    #[test]
    fn any_change_to_a_classic_context_is_noticed_on_a_warm_rerun() {
        let (dir, spec) = context();
        let root = dir.path();
        let hashes = FileHashes::open(None);
        let a = root.join("src/a");
        let old_mtime = fs::metadata(&a).unwrap().modified().unwrap();
        type Change<'a> = (&'a str, Box<dyn Fn() + 'a>);
        let changes: Vec<Change> = vec![
            (
                "content, same size, old mtime put back",
                Box::new(|| {
                    fs::write(&a, "bbbb").unwrap();
                    let file = fs::File::options().write(true).open(&a).unwrap();
                    file.set_modified(old_mtime).unwrap();
                }),
            ),
            (
                "replaced by another file",
                Box::new(|| {
                    fs::write(root.join("new"), "cccc").unwrap();
                    fs::rename(root.join("new"), &a).unwrap();
                }),
            ),
            (
                "mode",
                Box::new(|| {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(&a, fs::Permissions::from_mode(0o600)).unwrap();
                }),
            ),
            (
                "a file added",
                Box::new(|| fs::write(root.join("src/b"), "b").unwrap()),
            ),
            (
                "a file renamed",
                Box::new(|| fs::rename(root.join("src/b"), root.join("src/c")).unwrap()),
            ),
            (
                "a file removed",
                Box::new(|| fs::remove_file(root.join("src/c")).unwrap()),
            ),
            (
                "link target",
                Box::new(|| {
                    fs::remove_file(root.join("link")).unwrap();
                    std::os::unix::fs::symlink("src/other", root.join("link")).unwrap();
                }),
            ),
            (
                "ignore file",
                Box::new(|| fs::write(root.join(".dockerignore"), "src/a\n").unwrap()),
            ),
            (
                "ignore file's patterns",
                Box::new(|| fs::write(root.join(".dockerignore"), "link\n").unwrap()),
            ),
        ];
        let probes = tempfile::tempdir().unwrap();
        for (what, change) in changes {
            let at = later();
            plant(&spec, &hashes, at);
            // What the racy rule leaves to the clock: a change in a later timestamp tick.
            past_the_newest_change(root, probes.path());
            change();
            let now = context_digest_at(&spec, &hashes, later()).unwrap();
            // Read again (not the planted digest), and as a full read gives it.
            assert_eq!(now, read_in_full(&spec), "{what}");
        }
    }

    #[test]
    fn files_sent_after_the_context_are_in_the_tar_but_not_in_its_digest() {
        let (_dir, spec) = context();
        let files = ContextFilter::load(&spec.context, &spec.dockerfile)
            .unwrap()
            .files(&spec.context)
            .unwrap();
        let mut sent = Vec::new();
        let extra = [(".polyarch-secret-1".to_string(), b"s3cret".to_vec())];
        let digest = write_context(&spec.context, &files, &mut sent, &extra).unwrap();
        assert_eq!(digest, read_in_full(&spec));
        let mut archive = tar::Archive::new(sent.as_slice());
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            if name == ".polyarch-secret-1" {
                let mut value = String::new();
                std::io::Read::read_to_string(&mut entry, &mut value).unwrap();
                assert_eq!(value, "s3cret");
            }
            names.push(name);
        }
        assert_eq!(names.last().map(String::as_str), Some(".polyarch-secret-1"));
        assert!(names.contains(&"src/a".to_string()), "{names:?}");
    }

    #[test]
    fn a_context_changed_too_recently_is_read_on_every_run() {
        let (_dir, spec) = context();
        let hashes = FileHashes::open(None);
        // Read right after its last change: a same-size change within the timestamp
        // granularity could leave every stat as it is, so nothing is remembered.
        let changed = fs::symlink_metadata(spec.context.join("link")).unwrap();
        let now = {
            use std::os::unix::fs::MetadataExt;
            changed.ctime() * 1_000_000_000 + changed.ctime_nsec() + 1
        };
        let tree = ContextTree::walk(&spec, &hashes, now).unwrap();
        assert!(tree.stat.is_none());
        tree.write(&hashes, now, std::io::sink(), &[]).unwrap();
        let settled = ContextTree::walk(&spec, &hashes, later()).unwrap();
        assert_eq!(hashes.tree_digest(&settled.stat.unwrap()), None);
    }
}

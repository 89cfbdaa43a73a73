//! Getting a built image out of the engine as a stream (`docker save`), in either layout
//! the engine writes: Engine ≤ 24's `<id>/layer.tar` + `manifest.json` (last), or the
//! OCI image layout of Engine 25+. Each layer is hashed (diff_id) and gzipped with its
//! sha256 computed on the fly, spooled to a temporary file so that memory stays bounded
//! and an upload can be restarted without exporting again.
//!
//! The async [`export_image`] only pumps the engine's byte stream into a bounded channel;
//! the parsing core, [`read_save_stream`], is synchronous and works on any `Read`, so it
//! is tested without an engine.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use bytes::{Buf, Bytes};
use flate2::write::GzEncoder;
use flate2::Compression;
use futures_util::StreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::image_path;
use crate::oci;
use crate::platform::Platform;
use crate::progress::{Event, Phase, Reporter};
use crate::{Error, Result};

/// Media type of every layer polyarch pushes.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// gzip level used when compressing uncompressed layers. Level 1 is the fastest and,
/// on typical layers, only a few percent larger than the default level 6.
const GZIP_LEVEL: u32 = 1;
/// JSON files (configs, manifests, indexes) up to this size are kept in memory; larger
/// blobs are spooled to disk.
const SMALL_BLOB: u64 = 1024 * 1024;
/// Buffer used when copying entry data.
const COPY_BUF: usize = 256 * 1024;
/// Chunks in flight between the engine stream and the parser.
const CHANNEL_DEPTH: usize = 16;
/// Progress is reported at most this often (in bytes received).
const PROGRESS_EVERY: u64 = 8 * 1024 * 1024;
/// Symlink/hardlink hops followed before giving up.
const MAX_LINK_HOPS: usize = 16;
/// A tar block.
const BLOCK: usize = 512;

#[derive(Debug, Clone)]
pub struct ExportedLayer {
    /// sha256 of the uncompressed tar, as in the config's `rootfs.diff_ids`.
    pub diff_id: String,
    /// sha256 of the compressed blob as pushed.
    pub digest: String,
    /// Size of the compressed blob.
    pub size: u64,
    /// `application/vnd.oci.image.layer.v1.tar+gzip`.
    pub media_type: String,
    /// The compressed blob on disk, inside the export's spool directory.
    pub path: PathBuf,
}

#[derive(Debug)]
pub struct ExportedImage {
    /// The image config JSON exactly as the engine stored it (its sha256 is the image ID).
    pub config: Vec<u8>,
    pub config_digest: String,
    /// Layers in rootfs order.
    pub layers: Vec<ExportedLayer>,
    /// Keeps the spooled layers alive; deleted on drop.
    pub spool: tempfile::TempDir,
}

/// What [`read_save_stream`] found: everything of an [`ExportedImage`] but the spool
/// directory, which the caller owns.
#[derive(Debug)]
pub struct SaveContents {
    pub config: Vec<u8>,
    pub config_digest: String,
    pub layers: Vec<ExportedLayer>,
    /// Bytes of the save stream consumed.
    pub stream_bytes: u64,
}

/// Exports `image_id` from the engine (`GET /images/{id}/get`) and turns it into
/// gzip-compressed, digested layers spooled in a fresh temporary directory.
///
/// `image_name` and `platform` are used for messages and progress only, except that
/// `platform` picks the manifest when an OCI-layout stream holds an index of several.
pub async fn export_image(
    docker: &bollard::Docker,
    image_id: &str,
    image_name: &str,
    platform: Option<&Platform>,
    reporter: &dyn Reporter,
) -> Result<ExportedImage> {
    let export_err = |message: String| Error::Export {
        image: image_name.to_string(),
        message,
    };
    let spool = tempfile::Builder::new()
        .prefix("polyarch-export-")
        .tempdir()
        .map_err(|e| export_err(format!("cannot create a spool directory: {e}")))?;

    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    let name = image_name.to_string();
    let wanted = platform.cloned();
    // The spool moves into the worker so that, if this future is dropped, the worker
    // (which then sees a truncated stream) removes it once it stops.
    let worker = tokio::task::spawn_blocking(move || {
        let contents =
            read_save_stream(ChannelReader::new(rx), spool.path(), &name, wanted.as_ref());
        (contents, spool)
    });

    let report = |done: u64| {
        reporter.report(Event::Bytes {
            image: image_name.to_string(),
            platform: platform.cloned(),
            phase: Phase::Export,
            done,
            total: None,
        })
    };
    let mut stream = Box::pin(docker.export_image(image_id));
    let mut done = 0u64;
    let mut reported = 0u64;
    let mut stream_error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(chunk) => {
                done += chunk.len() as u64;
                if tx.send(Ok(chunk)).await.is_err() {
                    // The parser stopped (finished or failed); its result says which.
                    break;
                }
                if done - reported >= PROGRESS_EVERY {
                    reported = done;
                    report(done);
                }
            }
            Err(e) => {
                let message = engine_error_message(&e, image_id);
                let _ = tx.send(Err(io::Error::other(message.clone()))).await;
                stream_error = Some(message);
                break;
            }
        }
    }
    drop(tx);
    drop(stream);

    let (contents, spool) = worker
        .await
        .map_err(|e| export_err(format!("the export worker failed: {e}")))?;
    if let Some(message) = stream_error {
        return Err(export_err(message));
    }
    let contents = contents?;
    report(done.max(contents.stream_bytes));
    Ok(ExportedImage {
        config: contents.config,
        config_digest: contents.config_digest,
        layers: contents.layers,
        spool,
    })
}

fn engine_error_message(e: &bollard::errors::Error, image_id: &str) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } if message.contains("empty export") => format!(
            "the engine cannot export {image_id}, an image without layers (a FROM scratch stage that only sets metadata): Docker's classic image store does not save such images ({status_code}: {message}); add a file to it (COPY/ADD), or build on an engine with the containerd image store"
        ),
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => format!("the engine refused to export {image_id} ({status_code}): {message}"),
        other => format!("reading the engine's export stream of {image_id} failed: {other}"),
    }
}

/// A blocking `Read` over the chunks the async side sends; EOF when the sender is dropped.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        ChannelReader {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// Counts bytes and remembers whether the underlying reader reached its end.
struct Tracked<R> {
    inner: R,
    pos: u64,
    eof: bool,
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.eof = true;
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Writes through to `inner` while hashing and counting.
struct HashWriter<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Flushes the spooled blob and describes it: `diff` hashed the uncompressed tar.
    fn finish_layer(
        mut self,
        diff: Sha256,
        file: &Path,
    ) -> std::result::Result<ExportedLayer, SpoolError> {
        self.flush().map_err(SpoolError::Write)?;
        Ok(ExportedLayer {
            diff_id: oci::sha256_finish(diff),
            digest: oci::sha256_finish(self.hasher),
            size: self.len,
            media_type: LAYER_MEDIA_TYPE.to_string(),
            path: file.to_path_buf(),
        })
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Copies everything it reads into a hashing file writer.
struct TeeReader<'a, R> {
    inner: R,
    out: &'a mut HashWriter<BufWriter<File>>,
}

impl<R: Read> Read for TeeReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// One entry of the save stream that may matter once the manifest is known.
#[derive(Debug)]
enum Item {
    /// A small JSON-looking file, kept in memory.
    Small(Vec<u8>),
    /// A large blob that did not look like a layer, spooled as is.
    Raw(PathBuf),
    /// A layer, already compressed and digested.
    Layer(ExportedLayer),
    /// A blob in a compression polyarch cannot re-export.
    Unsupported(&'static str),
    /// A symlink or hardlink to another entry (archive-root-relative path).
    Link(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Gzip,
    Zstd,
    Json,
    Tar,
}

fn sniff(head: &[u8]) -> Kind {
    if head.starts_with(&[0x1f, 0x8b]) {
        Kind::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Kind::Zstd
    } else if head
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{' || *b == b'[')
    {
        Kind::Json
    } else {
        Kind::Tar
    }
}

/// Parses a `docker save` stream (either layout) from `reader`, spooling compressed
/// layers into `spool`. `image` is used in error messages; `platform` picks the
/// manifest when an OCI index lists several.
///
/// Memory stays bounded: layer data only passes through fixed-size buffers.
pub fn read_save_stream(
    reader: impl Read,
    spool: &Path,
    image: &str,
    platform: Option<&Platform>,
) -> Result<SaveContents> {
    let err = |message: String| Error::Export {
        image: image.to_string(),
        message,
    };
    let mut archive = tar::Archive::new(Tracked {
        inner: reader,
        pos: 0,
        eof: false,
    });
    let mut items: HashMap<String, Item> = HashMap::new();
    let mut spooled = 0usize;
    let mut buf = vec![0u8; COPY_BUF];
    {
        let entries = archive
            .entries()
            .map_err(|e| err(format!("the save stream is not a tar archive: {e}")))?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| err(format!("the save stream is not a readable tar: {e}")))?;
            let raw_path = entry
                .path()
                .map_err(|e| err(format!("a tar entry has an unreadable path: {e}")))?
                .to_string_lossy()
                .into_owned();
            let Some(path) = image_path::normalize(&raw_path) else {
                return Err(err(format!(
                    "tar entry `{raw_path}` points outside the archive"
                )));
            };
            let entry_type = entry.header().entry_type();
            if entry_type.is_symlink() || entry_type.is_hard_link() {
                let target = entry
                    .link_name()
                    .map_err(|e| err(format!("link `{path}` has an unreadable target: {e}")))?
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let resolved = if entry_type.is_symlink() {
                    image_path::link_target(&path, &target)
                } else {
                    image_path::normalize(&target)
                };
                let Some(resolved) = resolved else {
                    return Err(err(format!(
                        "link `{path}` -> `{target}` points outside the archive"
                    )));
                };
                items.insert(path, Item::Link(resolved));
                continue;
            }
            if !entry_type.is_file() {
                continue;
            }
            let size = entry.size();
            let is_layer_tar = path.ends_with("/layer.tar");
            let is_blob = path.starts_with("blobs/");
            let is_top_json = !path.contains('/') && path.ends_with(".json");
            if !(is_layer_tar || is_blob || is_top_json) {
                // VERSION, <id>/json, repositories, oci-layout: not needed.
                continue;
            }
            let mut counted = CountingReader {
                inner: &mut entry,
                n: 0,
            };
            let truncated = |got: u64| {
                err(format!(
                    "the save stream ends inside `{path}` ({got} of {size} bytes): truncated export"
                ))
            };
            let io_err = |e: io::Error| err(format!("reading `{path}` from the save stream: {e}"));

            // Peek at the first bytes to tell layers from metadata.
            let mut head = Vec::with_capacity(512);
            (&mut counted)
                .take(512)
                .read_to_end(&mut head)
                .map_err(io_err)?;
            let kind = if is_layer_tar {
                Kind::Tar
            } else {
                sniff(&head)
            };

            let item: Result<Item> = (|| {
                Ok(match kind {
                    Kind::Json if size < SMALL_BLOB => {
                        let mut data = head;
                        counted.read_to_end(&mut data).map_err(io_err)?;
                        Item::Small(data)
                    }
                    Kind::Zstd => {
                        io::copy(&mut counted, &mut io::sink()).map_err(io_err)?;
                        Item::Unsupported("zstd")
                    }
                    Kind::Json => {
                        spooled += 1;
                        let file = spool.join(format!("raw-{spooled}"));
                        let mut out = File::create(&file).map_err(|e| {
                            err(format!("cannot write the spool {}: {e}", file.display()))
                        })?;
                        out.write_all(&head).map_err(io_err)?;
                        io::copy(&mut counted, &mut out).map_err(io_err)?;
                        Item::Raw(file)
                    }
                    Kind::Gzip | Kind::Tar => {
                        spooled += 1;
                        let file = spool.join(format!("layer-{spooled}.tar.gz"));
                        let src = Read::chain(io::Cursor::new(head), &mut counted);
                        let layer = if kind == Kind::Gzip {
                            spool_gzip_layer(src, &file, &mut buf)
                        } else {
                            spool_tar_layer(src, &file, &mut buf)
                        }
                        .map_err(|e| match e {
                            SpoolError::Read(e) => io_err(e),
                            SpoolError::Write(e) => {
                                err(format!("cannot write the spool {}: {e}", file.display()))
                            }
                            SpoolError::Gzip(e) => {
                                err(format!("`{path}` is not a valid gzip stream: {e}"))
                            }
                        })?;
                        Item::Layer(layer)
                    }
                })
            })();
            // A short entry explains any error it caused (e.g. a cut gzip stream).
            let got = counted.n;
            if got != size {
                return Err(truncated(got));
            }
            let item = item?;
            items.insert(path, item);
        }
    }
    let mut tracked = archive.into_inner();
    // tar stops at the first zero block of the end-of-archive marker; the second must
    // follow (the engine writes both), then nothing but padding. Drain it so that a
    // stream cut right after the first block is caught too.
    let mut trailer = [0u8; BLOCK];
    let mut filled = 0;
    while filled < BLOCK && !tracked.eof {
        filled += tracked
            .read(&mut trailer[filled..])
            .map_err(|e| err(format!("reading the end of the save stream: {e}")))?;
    }
    if filled == BLOCK {
        io::copy(&mut tracked, &mut io::sink())
            .map_err(|e| err(format!("reading the end of the save stream: {e}")))?;
    }
    if filled < BLOCK {
        return Err(err(format!(
            "the save stream ends after {} bytes without the tar end-of-archive marker: truncated export",
            tracked.pos
        )));
    }
    let stream_bytes = tracked.pos;

    let mut resolver = Resolver {
        items,
        spool,
        image,
        spooled,
        buf,
    };
    let (config_path, layer_paths) = resolver.find_manifest(platform)?;
    let config = resolver.json(&config_path, "config")?;
    let config_digest = oci::sha256_digest(&config);
    if let Some(expected) = name_digest(&config_path) {
        if expected != config_digest {
            return Err(err(format!(
                "config `{config_path}` has sha256 {config_digest}, not the digest its name says"
            )));
        }
    }
    let mut layers = Vec::with_capacity(layer_paths.len());
    for path in &layer_paths {
        layers.push(resolver.layer(path)?);
    }

    let parsed: ConfigJson = serde_json::from_slice(&config).map_err(|e| {
        err(format!(
            "config `{config_path}` is not valid image config JSON: {e}"
        ))
    })?;
    let diff_ids = parsed.rootfs.diff_ids;
    if diff_ids.len() != layers.len() {
        return Err(err(format!(
            "config rootfs.diff_ids lists {} layers but the manifest lists {}",
            diff_ids.len(),
            layers.len()
        )));
    }
    for (i, (want, layer)) in diff_ids.iter().zip(&layers).enumerate() {
        if *want != layer.diff_id {
            return Err(err(format!(
                "layer {} (`{}`) has diff_id {} but config rootfs.diff_ids[{i}] is {want}",
                i + 1,
                layer_paths[i],
                layer.diff_id
            )));
        }
    }
    Ok(SaveContents {
        config,
        config_digest,
        layers,
        stream_bytes,
    })
}

struct CountingReader<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

enum SpoolError {
    Read(io::Error),
    Write(io::Error),
    Gzip(io::Error),
}

/// Hashes an uncompressed layer tar (diff_id) while gzipping it into `file` and hashing
/// the compressed output (digest).
fn spool_tar_layer(
    mut src: impl Read,
    file: &Path,
    buf: &mut [u8],
) -> std::result::Result<ExportedLayer, SpoolError> {
    let out = File::create(file).map_err(SpoolError::Write)?;
    let mut gz = GzEncoder::new(
        HashWriter::new(BufWriter::with_capacity(COPY_BUF, out)),
        Compression::new(GZIP_LEVEL),
    );
    let mut diff = Sha256::new();
    loop {
        let n = match src.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SpoolError::Read(e)),
        };
        diff.update(&buf[..n]);
        gz.write_all(&buf[..n]).map_err(SpoolError::Write)?;
    }
    let hashed = gz.finish().map_err(SpoolError::Write)?;
    hashed.finish_layer(diff, file)
}

/// Spools the uncompressed layer tar that `fill` writes: hashed (diff_id), gzipped into
/// `file` and hashed again (digest), as [`spool_tar_layer`] does with a reader.
pub(crate) fn spool_written_layer(
    file: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<ExportedLayer> {
    struct DiffHasher<W> {
        inner: W,
        diff: Sha256,
    }
    impl<W: Write> Write for DiffHasher<W> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = self.inner.write(buf)?;
            self.diff.update(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.inner.flush()
        }
    }
    let out = File::create(file)?;
    let mut writer = DiffHasher {
        inner: GzEncoder::new(
            HashWriter::new(BufWriter::with_capacity(COPY_BUF, out)),
            Compression::new(GZIP_LEVEL),
        ),
        diff: Sha256::new(),
    };
    fill(&mut writer)?;
    let hashed = writer.inner.finish()?;
    hashed.finish_layer(writer.diff, file).map_err(|e| match e {
        SpoolError::Read(e) | SpoolError::Write(e) | SpoolError::Gzip(e) => e,
    })
}

/// Copies an already-gzipped layer into `file` as is (digest = sha256 of those bytes)
/// while decompressing it to compute the diff_id.
fn spool_gzip_layer(
    src: impl Read,
    file: &Path,
    buf: &mut [u8],
) -> std::result::Result<ExportedLayer, SpoolError> {
    let out = File::create(file).map_err(SpoolError::Write)?;
    let mut hashed = HashWriter::new(BufWriter::with_capacity(COPY_BUF, out));
    let mut diff = Sha256::new();
    // Read errors from the tar stream and write errors to the spool both surface
    // through the decoder as io errors; tag them so they are told apart.
    let mut src = ErrTag { inner: src };
    {
        let tee = TeeReader {
            inner: &mut src,
            out: &mut hashed,
        };
        let mut decoder = flate2::read::MultiGzDecoder::new(tee);
        loop {
            let n = match decoder.read(buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(classify(e)),
            };
            diff.update(&buf[..n]);
        }
    }
    // Whatever follows the gzip members is still part of the blob.
    io::copy(&mut src, &mut hashed).map_err(classify)?;
    hashed.finish_layer(diff, file)
}

#[derive(Debug)]
struct SourceError(io::Error);

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SourceError {}

struct ErrTag<R> {
    inner: R,
}

impl<R: Read> Read for ErrTag<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), SourceError(e)))
    }
}

fn classify(e: io::Error) -> SpoolError {
    if e.get_ref().is_some_and(|inner| inner.is::<SourceError>()) {
        let kind = e.kind();
        let inner = e
            .into_inner()
            .and_then(|b| b.downcast::<SourceError>().ok())
            .map(|s| s.0)
            .unwrap_or_else(|| io::Error::from(kind));
        return SpoolError::Read(inner);
    }
    match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof => {
            SpoolError::Gzip(e)
        }
        _ => SpoolError::Write(e),
    }
}

/// `sha256:<hex>` from `<hex>.json` or `blobs/sha256/<hex>`.
fn name_digest(path: &str) -> Option<String> {
    let hex = path
        .strip_prefix("blobs/sha256/")
        .or_else(|| path.strip_suffix(".json"))?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

#[derive(Deserialize)]
struct ConfigJson {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LegacyManifest {
    config: String,
    #[serde(default)]
    layers: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciDescriptor {
    #[serde(default)]
    media_type: Option<String>,
    digest: String,
    #[serde(default)]
    platform: Option<OciPlatform>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Deserialize)]
struct OciPlatform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

/// An OCI image index or image manifest (told apart by which fields are present).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciDocument {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<OciDescriptor>>,
    #[serde(default)]
    config: Option<OciDescriptor>,
    #[serde(default)]
    layers: Option<Vec<OciDescriptor>>,
}

struct Resolver<'a> {
    items: HashMap<String, Item>,
    spool: &'a Path,
    image: &'a str,
    spooled: usize,
    buf: Vec<u8>,
}

impl Resolver<'_> {
    fn err(&self, message: String) -> Error {
        Error::Export {
            image: self.image.to_string(),
            message,
        }
    }

    /// Follows links from `path` to the entry that holds data.
    fn resolve(&self, path: &str, what: &str) -> Result<String> {
        let mut current = image_path::normalize(path)
            .ok_or_else(|| self.err(format!("{what} `{path}` points outside the archive")))?;
        for _ in 0..MAX_LINK_HOPS {
            match self.items.get(&current) {
                Some(Item::Link(target)) => current = target.clone(),
                Some(_) => return Ok(current),
                None if current == path => {
                    return Err(self.err(format!(
                    "{what} `{path}` is referenced by the manifest but absent from the save stream"
                )))
                }
                None => {
                    return Err(self.err(format!(
                        "{what} `{path}` links to `{current}`, which is absent from the save stream"
                    )))
                }
            }
        }
        Err(self.err(format!("{what} `{path}`: too many links (a link loop?)")))
    }

    fn json(&self, path: &str, what: &str) -> Result<Vec<u8>> {
        let key = self.resolve(path, what)?;
        match &self.items[&key] {
            Item::Small(data) => Ok(data.clone()),
            Item::Raw(file) => std::fs::read(file)
                .map_err(|e| self.err(format!("cannot read back spooled {what} `{path}`: {e}"))),
            Item::Layer(_) | Item::Unsupported(_) => Err(self.err(format!(
                "{what} `{path}` is not JSON (it looks like layer data)"
            ))),
            Item::Link(_) => Err(self.err(format!("{what} `{path}`: unresolved link"))),
        }
    }

    fn layer(&mut self, path: &str) -> Result<ExportedLayer> {
        let key = self.resolve(path, "layer")?;
        let data = match self.items.get(&key) {
            Some(Item::Layer(layer)) => return Ok(layer.clone()),
            Some(Item::Unsupported(kind)) => {
                return Err(self.err(format!(
                    "layer `{path}` is {kind}-compressed, which polyarch cannot re-export as gzip"
                )))
            }
            Some(Item::Small(data)) => Source::Memory(data.clone()),
            Some(Item::Raw(file)) => Source::File(file.clone()),
            _ => return Err(self.err(format!("layer `{path}`: unresolved link"))),
        };
        // A small layer that looked like JSON was kept in memory: process it now.
        self.spooled += 1;
        let file = self.spool.join(format!("layer-{}.tar.gz", self.spooled));
        let src: Box<dyn Read> = match data {
            Source::Memory(bytes) => Box::new(io::Cursor::new(bytes)),
            Source::File(raw) => Box::new(
                File::open(&raw)
                    .map_err(|e| self.err(format!("cannot read back spooled `{path}`: {e}")))?,
            ),
        };
        let mut buf = std::mem::take(&mut self.buf);
        let result = spool_tar_layer(src, &file, &mut buf);
        self.buf = buf;
        let layer = result.map_err(|e| match e {
            SpoolError::Read(e) | SpoolError::Write(e) | SpoolError::Gzip(e) => {
                self.err(format!("cannot spool layer `{path}`: {e}"))
            }
        })?;
        self.items.insert(key, Item::Layer(layer.clone()));
        Ok(layer)
    }

    /// The config path and layer paths, from `manifest.json` or else `index.json`.
    fn find_manifest(&self, platform: Option<&Platform>) -> Result<(String, Vec<String>)> {
        if self.items.contains_key("manifest.json") {
            let data = self.json("manifest.json", "manifest")?;
            let manifests: Vec<LegacyManifest> = serde_json::from_slice(&data)
                .map_err(|e| self.err(format!("manifest.json is not a save manifest: {e}")))?;
            let mut manifests = manifests.into_iter();
            return match (manifests.next(), manifests.next()) {
                (Some(m), None) => Ok((m.config, m.layers)),
                (None, _) => Err(self.err("manifest.json lists no image".into())),
                (Some(_), Some(_)) => Err(self
                    .err("manifest.json lists several images; export one image at a time".into())),
            };
        }
        if !self.items.contains_key("index.json") {
            return Err(self.err(
                "the save stream has no manifest.json (nor an OCI index.json): not a docker save archive, or truncated"
                    .into(),
            ));
        }
        let mut path = "index.json".to_string();
        for _ in 0..4 {
            let data = self.json(&path, "manifest")?;
            let doc: OciDocument = serde_json::from_slice(&data)
                .map_err(|e| self.err(format!("`{path}` is not an OCI index or manifest: {e}")))?;
            if let Some(manifests) = doc.manifests {
                let chosen = choose_manifest(&manifests, platform)
                    .ok_or_else(|| self.err(format!("`{path}` lists no usable image manifest")))?;
                path = blob_path(&chosen.digest)
                    .ok_or_else(|| self.err(format!("`{path}`: bad digest `{}`", chosen.digest)))?;
                continue;
            }
            let (Some(config), Some(layers)) = (doc.config, doc.layers) else {
                return Err(self.err(format!(
                    "`{path}` ({}) is neither an image index nor an image manifest",
                    doc.media_type.as_deref().unwrap_or("no mediaType")
                )));
            };
            let bad = |d: &str| self.err(format!("`{path}`: bad digest `{d}`"));
            let config_path = blob_path(&config.digest).ok_or_else(|| bad(&config.digest))?;
            let mut layer_paths = Vec::with_capacity(layers.len());
            for layer in &layers {
                layer_paths.push(blob_path(&layer.digest).ok_or_else(|| bad(&layer.digest))?);
            }
            return Ok((config_path, layer_paths));
        }
        Err(self.err("index.json nests indexes too deeply".into()))
    }
}

enum Source {
    Memory(Vec<u8>),
    File(PathBuf),
}

fn blob_path(digest: &str) -> Option<String> {
    let (algorithm, hex) = digest.split_once(':')?;
    (!algorithm.is_empty()
        && !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_alphanumeric())
        && algorithm.bytes().all(|b| b.is_ascii_alphanumeric()))
    .then(|| format!("blobs/{algorithm}/{hex}"))
}

fn choose_manifest<'a>(
    manifests: &'a [OciDescriptor],
    platform: Option<&Platform>,
) -> Option<&'a OciDescriptor> {
    let usable: Vec<&OciDescriptor> = manifests
        .iter()
        .filter(|m| {
            m.annotations
                .get("vnd.docker.reference.type")
                .is_none_or(|t| t != "attestation-manifest")
                && m.platform
                    .as_ref()
                    .is_none_or(|p| p.os != "unknown" && p.architecture != "unknown")
                && m.media_type
                    .as_deref()
                    .is_none_or(|t| t.contains("manifest") || t.contains("index"))
        })
        .collect();
    if let Some(wanted) = platform {
        let matching = usable.iter().find(|m| {
            m.platform.as_ref().is_some_and(|p| {
                Platform::new(&p.os, &p.architecture, p.variant.as_deref()) == *wanted
            })
        });
        if let Some(m) = matching {
            return Some(m);
        }
    }
    usable.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;

    fn layer_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn hex_of(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    fn config_json(diff_ids: &[String]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap()
    }

    enum E<'a> {
        File(&'a str, Vec<u8>),
        Dir(&'a str),
        Symlink(&'a str, &'a str),
        Hardlink(&'a str, &'a str),
    }

    fn archive(entries: Vec<E>) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_mtime(1_700_000_000);
            match e {
                E::File(name, data) => {
                    h.set_size(data.len() as u64);
                    h.set_cksum();
                    b.append_data(&mut h, name, data.as_slice()).unwrap();
                }
                E::Dir(name) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    h.set_cksum();
                    b.append_data(&mut h, name, io::empty()).unwrap();
                }
                E::Symlink(name, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, name, target).unwrap();
                }
                E::Hardlink(name, target) => {
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    b.append_link(&mut h, name, target).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn sha_file(path: &Path) -> (String, u64) {
        let data = std::fs::read(path).unwrap();
        (format!("sha256:{}", hex_of(&data)), data.len() as u64)
    }

    fn gunzip_file(path: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        GzDecoder::new(File::open(path).unwrap())
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// A legacy (Engine ≤ 24) save stream: three layers, the third reusing the first
    /// through a symlink that comes before its target (the engine sorts entries by name).
    fn legacy_stream(config_diff_ids: Option<Vec<String>>) -> (Vec<u8>, String) {
        let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
        let l2 = layer_tar(&[("b.txt", b"hello b\n")]);
        let ids = [
            format!("sha256:{}", hex_of(&l1)),
            format!("sha256:{}", hex_of(&l2)),
            format!("sha256:{}", hex_of(&l1)),
        ];
        let config = config_json(&config_diff_ids.unwrap_or_else(|| ids.to_vec()));
        let cfg_hex = hex_of(&config);
        let (d1, d2, d3) = ("c".repeat(64), "d".repeat(64), "a".repeat(64));
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{cfg_hex}.json"),
            "RepoTags": null,
            "Layers": [format!("{d1}/layer.tar"), format!("{d2}/layer.tar"), format!("{d3}/layer.tar")],
        }]))
        .unwrap();
        let stream = archive(
            [
                E::File(&format!("{cfg_hex}.json"), config.clone()).owned(),
                E::Dir(&format!("{d3}/")).owned(),
                E::File(&format!("{d3}/VERSION"), b"1.0".to_vec()).owned(),
                E::File(&format!("{d3}/json"), b"{}".to_vec()).owned(),
                E::Symlink(&format!("{d3}/layer.tar"), &format!("../{d1}/layer.tar")).owned(),
                E::Dir(&format!("{d1}/")).owned(),
                E::File(&format!("{d1}/VERSION"), b"1.0".to_vec()).owned(),
                E::File(&format!("{d1}/json"), b"{}".to_vec()).owned(),
                E::File(&format!("{d1}/layer.tar"), l1.clone()).owned(),
                E::Dir(&format!("{d2}/")).owned(),
                E::File(&format!("{d2}/layer.tar"), l2.clone()).owned(),
                E::File("manifest.json", manifest).owned(),
            ]
            .iter()
            .map(Owned::as_e)
            .collect(),
        );
        (stream, format!("sha256:{cfg_hex}"))
    }

    /// Owned form of `E`, so entries can be built from `format!` temporaries.
    enum Owned {
        File(String, Vec<u8>),
        Dir(String),
        Symlink(String, String),
        Hardlink(String, String),
    }

    impl Owned {
        fn as_e(&self) -> E<'_> {
            match self {
                Owned::File(n, d) => E::File(n, d.clone()),
                Owned::Dir(n) => E::Dir(n),
                Owned::Symlink(n, t) => E::Symlink(n, t),
                Owned::Hardlink(n, t) => E::Hardlink(n, t),
            }
        }
    }

    impl E<'_> {
        fn owned(self) -> Owned {
            match self {
                E::File(n, d) => Owned::File(n.into(), d),
                E::Dir(n) => Owned::Dir(n.into()),
                E::Symlink(n, t) => Owned::Symlink(n.into(), t.into()),
                E::Hardlink(n, t) => Owned::Hardlink(n.into(), t.into()),
            }
        }
    }

    fn parse(stream: &[u8]) -> (Result<SaveContents>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let r = read_save_stream(stream, dir.path(), "test/image", None);
        (r, dir)
    }

    fn message(r: Result<SaveContents>) -> String {
        match r {
            Err(Error::Export { image, message }) => {
                assert_eq!(image, "test/image");
                assert!(!message.contains('\n'), "one line: {message}");
                message
            }
            Err(other) => panic!("expected an export error, got {other}"),
            Ok(c) => panic!("expected an error, got {c:?}"),
        }
    }

    #[test]
    fn legacy_layout_with_manifest_last_and_symlinked_layer() {
        let (stream, config_digest) = legacy_stream(None);
        let (r, _dir) = parse(&stream);
        let c = r.unwrap();
        assert_eq!(c.config_digest, config_digest);
        assert_eq!(c.stream_bytes, stream.len() as u64);
        assert_eq!(c.layers.len(), 3);
        let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
        let l2 = layer_tar(&[("b.txt", b"hello b\n")]);
        for (layer, tar) in c.layers.iter().zip([&l1, &l2, &l1]) {
            assert_eq!(layer.diff_id, format!("sha256:{}", hex_of(tar)));
            assert_eq!(layer.media_type, LAYER_MEDIA_TYPE);
            let (digest, size) = sha_file(&layer.path);
            assert_eq!(layer.digest, digest);
            assert_eq!(layer.size, size);
            assert_eq!(&gunzip_file(&layer.path), tar);
        }
        // The reused layer is spooled once.
        assert_eq!(c.layers[0].path, c.layers[2].path);
    }

    #[test]
    fn legacy_layout_with_hardlinked_layer() {
        let l1 = layer_tar(&[("a.txt", b"x")]);
        let id = format!("sha256:{}", hex_of(&l1));
        let config = config_json(&[id.clone(), id]);
        let cfg_hex = hex_of(&config);
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{cfg_hex}.json"),
            "Layers": ["one/layer.tar", "two/layer.tar"],
        }]))
        .unwrap();
        let stream = archive(vec![
            E::File("one/layer.tar", l1),
            E::Hardlink("two/layer.tar", "one/layer.tar"),
            E::File(&format!("{cfg_hex}.json"), config),
            E::File("manifest.json", manifest),
        ]);
        let (r, _dir) = parse(&stream);
        let c = r.unwrap();
        assert_eq!(c.layers.len(), 2);
        assert_eq!(c.layers[0].digest, c.layers[1].digest);
    }

    /// An OCI-layout (Engine 25+) stream: one uncompressed and one gzipped layer, blobs
    /// in an arbitrary order, with or without the legacy manifest.json.
    fn oci_stream(with_legacy_manifest: bool) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
        let l1 = layer_tar(&[("etc/one", b"one\n")]);
        let l2_tar = layer_tar(&[("etc/two", &[7u8; 5000])]);
        let l2 = gzip(&l2_tar);
        let config = config_json(&[
            format!("sha256:{}", hex_of(&l1)),
            format!("sha256:{}", hex_of(&l2_tar)),
        ]);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": format!("sha256:{}", hex_of(&config)), "size": config.len()},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar",
                 "digest": format!("sha256:{}", hex_of(&l1)), "size": l1.len()},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                 "digest": format!("sha256:{}", hex_of(&l2)), "size": l2.len()},
            ],
        }))
        .unwrap();
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": format!("sha256:{}", hex_of(&manifest)), "size": manifest.len()}],
        }))
        .unwrap();
        let blob = |d: &[u8]| format!("blobs/sha256/{}", hex_of(d));
        let mut entries = vec![
            Owned::Dir("blobs/".into()),
            Owned::Dir("blobs/sha256/".into()),
            Owned::File(blob(&l2), l2.clone()),
            Owned::File(blob(&manifest), manifest.clone()),
            Owned::File(blob(&config), config.clone()),
            Owned::File(blob(&l1), l1.clone()),
            Owned::File("index.json".into(), index),
            Owned::File(
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
        ];
        if with_legacy_manifest {
            entries.push(Owned::File(
                "manifest.json".into(),
                serde_json::to_vec(&serde_json::json!([{
                    "Config": blob(&config),
                    "RepoTags": ["x:latest"],
                    "Layers": [blob(&l1), blob(&l2)],
                }]))
                .unwrap(),
            ));
        }
        let stream = archive(entries.iter().map(Owned::as_e).collect());
        (stream, l1, l2, config)
    }

    #[test]
    fn oci_layout_with_uncompressed_and_gzipped_layers() {
        for legacy_manifest in [true, false] {
            let (stream, l1, l2, config) = oci_stream(legacy_manifest);
            let (r, _dir) = parse(&stream);
            let c = r.unwrap();
            assert_eq!(c.config, config);
            assert_eq!(c.config_digest, format!("sha256:{}", hex_of(&config)));
            assert_eq!(c.layers.len(), 2);
            // Uncompressed: gzipped by us.
            assert_eq!(c.layers[0].diff_id, format!("sha256:{}", hex_of(&l1)));
            assert_eq!(gunzip_file(&c.layers[0].path), l1);
            // Already gzipped: kept byte for byte.
            assert_eq!(c.layers[1].digest, format!("sha256:{}", hex_of(&l2)));
            assert_eq!(std::fs::read(&c.layers[1].path).unwrap(), l2);
            for layer in &c.layers {
                assert_eq!((layer.digest.clone(), layer.size), sha_file(&layer.path));
            }
        }
    }

    #[test]
    fn small_layer_that_looks_like_json_is_still_a_layer() {
        let l1 = layer_tar(&[("{weird}", b"x")]);
        let config = config_json(&[format!("sha256:{}", hex_of(&l1))]);
        let blob = |d: &[u8]| format!("blobs/sha256/{}", hex_of(d));
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": blob(&config), "Layers": [blob(&l1)],
        }]))
        .unwrap();
        let stream = archive(vec![
            E::File(&blob(&l1), l1.clone()),
            E::File(&blob(&config), config),
            E::File("manifest.json", manifest),
        ]);
        let (r, _dir) = parse(&stream);
        let c = r.unwrap();
        assert_eq!(gunzip_file(&c.layers[0].path), l1);
    }

    #[test]
    fn diff_id_mismatch_is_an_error() {
        let wrong = format!("sha256:{}", "0".repeat(64));
        let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
        let ids = vec![
            format!("sha256:{}", hex_of(&l1)),
            wrong.clone(),
            format!("sha256:{}", hex_of(&l1)),
        ];
        let (stream, _) = legacy_stream(Some(ids));
        let m = message(parse(&stream).0);
        assert!(m.contains("diff_id") && m.contains(&wrong), "{m}");

        let (stream, _) = legacy_stream(Some(vec![format!("sha256:{}", hex_of(&l1))]));
        let m = message(parse(&stream).0);
        assert!(m.contains("rootfs.diff_ids lists 1 layers"), "{m}");
    }

    #[test]
    fn truncated_streams_are_errors() {
        for stream in [
            legacy_stream(None).0,
            oci_stream(true).0,
            oci_stream(false).0,
        ] {
            // Every cut point but the very end (the tar's trailing zero blocks are
            // part of what proves the stream is complete).
            for cut in (0..stream.len() - 1).step_by(37) {
                let m = message(parse(&stream[..cut]).0);
                assert!(!m.is_empty());
            }
            for missing in [1024, 512, 1] {
                let m = message(parse(&stream[..stream.len() - missing]).0);
                assert!(m.contains("end-of-archive"), "{missing}: {m}");
            }
        }
    }

    #[test]
    fn garbage_is_an_error() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let garbage: Vec<u8> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for input in [&garbage[..], &garbage[..100], b"", &[0u8; 4096][..]] {
            message(parse(input).0);
        }
    }

    #[test]
    fn missing_manifest_and_missing_layer_are_errors() {
        let l1 = layer_tar(&[("a.txt", b"x")]);
        let stream = archive(vec![E::File("abc/layer.tar", l1.clone())]);
        let m = message(parse(&stream).0);
        assert!(m.contains("no manifest.json"), "{m}");

        let config = config_json(&[format!("sha256:{}", hex_of(&l1))]);
        let cfg_hex = hex_of(&config);
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{cfg_hex}.json"), "Layers": ["gone/layer.tar"],
        }]))
        .unwrap();
        let stream = archive(vec![
            E::File("abc/layer.tar", l1),
            E::File(&format!("{cfg_hex}.json"), config),
            E::File("manifest.json", manifest),
        ]);
        let m = message(parse(&stream).0);
        assert!(m.contains("gone/layer.tar") && m.contains("absent"), "{m}");
    }

    #[test]
    fn corrupt_gzip_blob_is_an_error() {
        let (stream, _, l2, _) = oci_stream(true);
        let mut stream = stream;
        // Flip a byte in the middle of the gzipped blob's data.
        let pos = stream
            .windows(l2.len())
            .position(|w| w == l2.as_slice())
            .unwrap();
        stream[pos + l2.len() / 2] ^= 0xff;
        message(parse(&stream).0);
    }

    #[test]
    fn save_stream_names_give_digests() {
        assert_eq!(
            name_digest(&format!("{}.json", "ab".repeat(32))),
            Some(format!("sha256:{}", "ab".repeat(32)))
        );
    }
}

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
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use crate::base::digest::Digest;
use crate::base::image_path;
use crate::base::oci::ConfigPlatform;
use crate::base::platform::Platform;
use crate::base::progress::{Event, Phase, Reporter};

mod blocks;
pub mod early;
mod error;
pub mod reproducible;
mod resolve;
mod save;
mod spool;
mod streams;

pub use error::{ExportError, ImageExportError};

type Result<T, E = ImageExportError> = std::result::Result<T, E>;
use blocks::*;
use early::*;
use resolve::*;
pub use save::read_save_stream;
use save::*;
pub(crate) use spool::spool_written_layer;
use spool::*;
pub(crate) use streams::ChannelReader;
use streams::*;

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
    pub digest: Digest,
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
    pub config_digest: Digest,
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
    pub config_digest: Digest,
    pub layers: Vec<ExportedLayer>,
    /// Bytes of the save stream consumed.
    pub stream_bytes: u64,
}

/// Exports `image_id` from the engine (`GET /images/{id}/get`) and turns it into
/// gzip-compressed, digested layers spooled in a fresh temporary directory. Large layers
/// are offered to `early` as their export begins ([`early`]); the export returns once
/// their uploads ended.
///
/// `image_name` and `platform` are used for messages and progress only, except that
/// `platform` picks the manifest when an OCI-layout stream holds an index of several.
pub async fn export_image(
    docker: &bollard::Docker,
    image_id: &str,
    image_name: &str,
    platform: Option<&Platform>,
    early: Option<&dyn EarlyUploads>,
    reporter: &dyn Reporter,
) -> Result<ExportedImage> {
    let export_err = |source: ExportError| ImageExportError {
        image: image_name.to_string(),
        source,
    };
    let spool = spool_dir().map_err(export_err)?;

    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    let (offers, mut offered) = mpsc::channel::<EarlyLayer>(1);
    let (diff_ids_to, diff_ids) = tokio::sync::oneshot::channel();
    let offering = early.is_some().then(|| EarlyOffers {
        offers,
        diff_ids: DiffIds::coming(diff_ids),
        legacy_json: None,
    });
    let worker = spawn_save_reader(rx, spool, image_name, platform, offering);

    let report = |done: u64| {
        reporter.report(Event::Bytes {
            image: image_name.to_string(),
            platform: platform.cloned(),
            phase: Phase::Export,
            done,
            total: None,
        })
    };
    let pump = pump_save_stream(docker, image_id, tx, report);
    let uploads = async {
        let Some(early) = early else { return };
        let (diff_ids, send) = inspect_before_export(docker, image_id, platform).await;
        let _ = diff_ids_to.send(diff_ids);
        upload_offered_layers(early, &mut offered, send).await;
    };
    let ((done, stream_error), ()) = tokio::join!(pump, uploads);

    let (contents, spool) = worker
        .await
        .map_err(|e| export_err(ExportError::Worker(e)))?;
    if let Some(source) = stream_error {
        let image_id = image_id.to_string();
        return Err(export_err(ExportError::Engine { image_id, source }));
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

/// Parses the save stream arriving on `rx` on a blocking thread, spooling its layers into
/// `spool`. The spool moves into the worker so that, if the export is dropped, the worker
/// (which then sees a truncated stream) removes it once it stops.
fn spawn_save_reader(
    rx: mpsc::Receiver<io::Result<Bytes>>,
    spool: tempfile::TempDir,
    image_name: &str,
    platform: Option<&Platform>,
    offering: Option<EarlyOffers>,
) -> tokio::task::JoinHandle<(Result<SaveContents>, tempfile::TempDir)> {
    let name = image_name.to_string();
    let wanted = platform.cloned();
    tokio::task::spawn_blocking(move || {
        let reader = ChannelReader::new(rx);
        let contents =
            read_save_stream_offering(reader, spool.path(), &name, wanted.as_ref(), offering);
        (contents, spool)
    })
}

/// Pumps the engine's `docker save` stream into the parser's channel, reporting progress:
/// the bytes received, and the engine's error if the stream broke. `tx` is owned so that
/// the parser sees the end of the stream as soon as the pump ends.
async fn pump_save_stream(
    docker: &bollard::Docker,
    image_id: &str,
    tx: mpsc::Sender<io::Result<Bytes>>,
    report: impl Fn(u64),
) -> (u64, Option<bollard::errors::Error>) {
    let mut stream = Box::pin(docker.export_image(image_id));
    let mut done = 0u64;
    let mut reported = 0u64;
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
                let _ = tx.send(Err(io::Error::other(message))).await;
                return (done, Some(e));
            }
        }
    }
    (done, None)
}

/// Asked while the engine prepares the stream: the image's diff IDs (Docker ≤ 24 names a
/// layer's directory by an ID derived from them), and whether its layers may be sent
/// early (an image of another platform than asked for is refused after the export, so
/// nothing of it is sent before).
async fn inspect_before_export(
    docker: &bollard::Docker,
    image_id: &str,
    platform: Option<&Platform>,
) -> (Vec<String>, bool) {
    match docker.inspect_image(image_id).await.ok() {
        Some(image) => {
            let built = ConfigPlatform {
                os: image.os.unwrap_or_default(),
                architecture: image.architecture.unwrap_or_default(),
                variant: image.variant,
            };
            let diff_ids = image.root_fs.and_then(|r| r.layers).unwrap_or_default();
            let send = platform.is_none_or(|p| built.normalized() == *p);
            (diff_ids, send)
        }
        None => (Vec::new(), false),
    }
}

/// Uploads the layers the worker offers that `early` claims (none unless `send`), until
/// the worker stops offering and every upload has ended.
async fn upload_offered_layers(
    early: &dyn EarlyUploads,
    offered: &mut mpsc::Receiver<EarlyLayer>,
    send: bool,
) {
    let mut running = futures_util::stream::FuturesUnordered::new();
    loop {
        tokio::select! {
            layer = offered.recv() => match layer {
                Some(layer) if send && early.claim(&layer.diff_id) => {
                    running.push(early.upload(layer))
                }
                // Not taken: dropping it tells the worker to spool only.
                Some(_) => {}
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    while running.next().await.is_some() {}
}

/// A fresh temporary directory for one image's spooled layers.
fn spool_dir() -> Result<tempfile::TempDir, ExportError> {
    tempfile::Builder::new()
        .prefix("polyarch-export-")
        .tempdir()
        .map_err(ExportError::SpoolDir)
}

/// Reads the OCI layout tar a standalone BuildKit daemon's `oci` exporter sent back
/// (written to `path`), as [`export_image`] reads an engine's: its layers, already
/// gzipped, are spooled with their digests in a fresh temporary directory.
pub async fn read_layout_file(
    path: &Path,
    image_name: &str,
    platform: &Platform,
    reporter: &dyn Reporter,
) -> Result<ExportedImage> {
    let export_err = |source: ExportError| ImageExportError {
        image: image_name.to_string(),
        source,
    };
    let spool = spool_dir().map_err(export_err)?;
    let file = File::open(path).map_err(|source| {
        export_err(ExportError::LayoutFile {
            file: path.to_path_buf(),
            source,
        })
    })?;
    let name = image_name.to_string();
    let wanted = platform.clone();
    let worker = tokio::task::spawn_blocking(move || {
        let reader = io::BufReader::with_capacity(COPY_BUF, file);
        let contents = read_save_stream(reader, spool.path(), &name, Some(&wanted));
        (contents, spool)
    });
    let (contents, spool) = worker
        .await
        .map_err(|e| export_err(ExportError::Worker(e)))?;
    let contents = contents?;
    reporter.report(Event::Bytes {
        image: image_name.to_string(),
        platform: Some(platform.clone()),
        phase: Phase::Export,
        done: contents.stream_bytes,
        total: None,
    });
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

#[cfg(test)]
mod tests;

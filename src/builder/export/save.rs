//! Reading a `docker save` stream (the classic `manifest.json` layout, as Docker or
//! Podman writes it, or an OCI layout),
//! spooling its layers as it goes.

use super::*;

/// One entry of the save stream that may matter once the manifest is known.
#[derive(Debug)]
pub(super) enum Item {
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
pub(super) enum Kind {
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
    read_save_stream_offering(reader, spool, image, platform, None)
}

/// [`read_save_stream`], offering each large uncompressed layer to `early` as its export
/// begins.
pub(super) fn read_save_stream_offering(
    reader: impl Read,
    spool: &Path,
    image: &str,
    platform: Option<&Platform>,
    early: Option<EarlyOffers>,
) -> Result<SaveContents> {
    let mut archive = tar::Archive::new(Tracked {
        inner: reader,
        pos: 0,
        eof: false,
    });
    let mut spooler = Spooler {
        spool,
        image,
        spooled: 0,
        buf: vec![0u8; COPY_BUF],
        early,
    };
    let mut items: HashMap<String, Item> = HashMap::new();
    {
        let entries = archive
            .entries()
            .map_err(|e| stream(image, "the save stream is not a tar archive".into(), e))?;
        for entry in entries {
            let mut entry = entry
                .map_err(|e| stream(image, "the save stream is not a readable tar".into(), e))?;
            if let Some((path, item)) = spooler.entry(&mut entry)? {
                items.insert(path, item);
            }
        }
    }
    let stream_bytes = read_end(archive.into_inner(), image)?;
    let resolver = Resolver {
        items,
        spool,
        image,
        spooled: spooler.spooled,
        buf: spooler.buf,
    };
    contents(resolver, platform, stream_bytes)
}

fn failed(image: &str, message: String) -> ImageExportError {
    export_error(image, ExportError::Malformed(message))
}

fn export_error(image: &str, source: ExportError) -> ImageExportError {
    ImageExportError {
        image: image.to_string(),
        source,
    }
}

/// Reading the save stream failed at `what`.
fn stream(image: &str, what: String, source: io::Error) -> ImageExportError {
    export_error(image, ExportError::Stream { what, source })
}

/// Reads the save stream's entries, spooling layers and large blobs as they pass.
struct Spooler<'a> {
    spool: &'a Path,
    image: &'a str,
    spooled: usize,
    buf: Vec<u8>,
    early: Option<EarlyOffers>,
}

impl Spooler<'_> {
    /// One entry as an item under its archive path, or None for what is never needed.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<Option<(String, Item)>> {
        let err = |message: String| failed(self.image, message);
        let raw_path = entry
            .path()
            .map_err(|e| stream(self.image, "a tar entry has an unreadable path".into(), e))?
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
                .map_err(|e| {
                    stream(
                        self.image,
                        format!("link `{path}` has an unreadable target"),
                        e,
                    )
                })?
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
            return Ok(Some((path, Item::Link(resolved))));
        }
        if !entry_type.is_file() {
            return Ok(None);
        }
        // Docker writes `<id>/layer.tar`; Podman writes its layers as top-level `<hex>.tar`.
        let is_layer_tar =
            path.ends_with("/layer.tar") || (!path.contains('/') && path.ends_with(".tar"));
        let is_blob = path.starts_with("blobs/");
        let is_top_json = !path.contains('/') && path.ends_with(".json");
        if let (Some(early), Some(dir)) = (&mut self.early, legacy_json_dir(&path)) {
            if entry.size() < SMALL_BLOB {
                let mut json = Vec::new();
                entry.read_to_end(&mut json).map_err(|e| {
                    stream(
                        self.image,
                        format!("reading `{path}` from the save stream"),
                        e,
                    )
                })?;
                early.legacy_json = Some((dir.to_string(), json));
            }
            return Ok(None);
        }
        if !(is_layer_tar || is_blob || is_top_json) {
            // VERSION, <id>/json, repositories, oci-layout: not needed.
            return Ok(None);
        }
        let size = entry.size();
        let item = self.file(entry, &path, size, is_layer_tar)?;
        Ok(Some((path, item)))
    }

    /// A file entry: kept in memory when small JSON, else spooled (layers compressed and
    /// digested on the way).
    fn file(
        &mut self,
        entry: &mut impl Read,
        path: &str,
        size: u64,
        is_layer_tar: bool,
    ) -> Result<Item> {
        let image = self.image;
        let err = |message: String| failed(image, message);
        let mut counted = CountingReader { inner: entry, n: 0 };
        let io_err = |e| stream(image, format!("reading `{path}` from the save stream"), e);

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
        let item = self.spooled_item(kind, head, &mut counted, size, path);
        // A short entry explains any error it caused (e.g. a cut gzip stream).
        let got = counted.n;
        if got != size {
            return Err(err(format!(
                "the save stream ends inside `{path}` ({got} of {size} bytes): truncated export"
            )));
        }
        item
    }

    /// The item a file entry becomes, by what its first bytes say it is.
    fn spooled_item(
        &mut self,
        kind: Kind,
        head: Vec<u8>,
        counted: &mut impl Read,
        size: u64,
        path: &str,
    ) -> Result<Item> {
        let image = self.image;
        let io_err = |e| stream(image, format!("reading `{path}` from the save stream"), e);
        let spool_write = |file: &Path, source| {
            let file = file.to_path_buf();
            export_error(image, ExportError::SpoolWrite { file, source })
        };
        Ok(match kind {
            Kind::Json if size < SMALL_BLOB => {
                let mut data = head;
                counted.read_to_end(&mut data).map_err(io_err)?;
                Item::Small(data)
            }
            Kind::Zstd => {
                io::copy(counted, &mut io::sink()).map_err(io_err)?;
                Item::Unsupported("zstd")
            }
            Kind::Json => {
                self.spooled += 1;
                let file = self.spool.join(format!("raw-{}", self.spooled));
                let mut out = File::create(&file).map_err(|e| spool_write(&file, e))?;
                out.write_all(&head).map_err(io_err)?;
                io::copy(counted, &mut out).map_err(io_err)?;
                Item::Raw(file)
            }
            Kind::Gzip | Kind::Tar => {
                self.spooled += 1;
                let file = self.spool.join(format!("layer-{}.tar.gz", self.spooled));
                let src = Read::chain(io::Cursor::new(head), counted);
                let layer = if kind == Kind::Gzip {
                    spool_gzip_layer(src, &file, &mut self.buf)
                } else {
                    let sending = self.early.as_mut().and_then(|e| e.offer(path, size));
                    spool_tar_layer(src, &file, &mut self.buf, sending)
                }
                .map_err(|e| match e {
                    SpoolError::Read(e) => io_err(e),
                    SpoolError::Write(e) => spool_write(&file, e),
                    SpoolError::Gzip(source) => {
                        let path = path.to_string();
                        export_error(image, ExportError::Gzip { path, source })
                    }
                })?;
                Item::Layer(layer)
            }
        })
    }
}

/// tar stops at the first zero block of the end-of-archive marker; the second must
/// follow (the engine writes both), then nothing but padding. Draining it catches a stream
/// cut right after the first block too. Returns the bytes the stream held.
fn read_end(mut tracked: Tracked<impl Read>, image: &str) -> Result<u64> {
    let err = |message: String| failed(image, message);
    let mut trailer = [0u8; BLOCK];
    let mut filled = 0;
    while filled < BLOCK && !tracked.eof {
        filled += tracked
            .read(&mut trailer[filled..])
            .map_err(|e| stream(image, "reading the end of the save stream".into(), e))?;
    }
    if filled == BLOCK {
        io::copy(&mut tracked, &mut io::sink())
            .map_err(|e| stream(image, "reading the end of the save stream".into(), e))?;
    }
    if filled < BLOCK {
        return Err(err(format!(
            "the save stream ends after {} bytes without the tar end-of-archive marker: truncated export",
            tracked.pos
        )));
    }
    Ok(tracked.pos)
}

/// The image the stream's manifest names: its config, checked against its name, and its
/// layers, checked against the config's diff IDs.
fn contents(
    mut resolver: Resolver<'_>,
    platform: Option<&Platform>,
    stream_bytes: u64,
) -> Result<SaveContents> {
    let err = |message: String| failed(resolver.image, message);
    let (config_path, layer_paths) = resolver.find_manifest(platform)?;
    let config = resolver.json(&config_path, "config")?;
    let config_digest = Digest::of(&config);
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

    let parsed: ConfigJson = serde_json::from_slice(&config).map_err(|source| {
        let what = format!("config `{config_path}` is not valid image config JSON");
        export_error(resolver.image, ExportError::Json { what, source })
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

/// `<dir>` of a Docker ≤ 24 save directory's `<dir>/json`.
fn legacy_json_dir(path: &str) -> Option<&str> {
    path.strip_suffix("/json").filter(|dir| !dir.contains('/'))
}

/// `sha256:<hex>` from `<hex>.json` or `blobs/sha256/<hex>`.
pub(super) fn name_digest(path: &str) -> Option<Digest> {
    let hex = path
        .strip_prefix("blobs/sha256/")
        .or_else(|| path.strip_suffix(".json"))?;
    format!("sha256:{}", hex.to_ascii_lowercase()).parse().ok()
}

//! Spooling a layer to disk: gzip-compressed (by blocks, on several cores), digested and
//! diff-id'd in one pass.

use super::*;

pub(super) enum SpoolError {
    Read(io::Error),
    Write(io::Error),
    Gzip(io::Error),
}

/// Hashes an uncompressed layer tar (diff_id) while gzipping it into `file` and hashing
/// the compressed output (digest); the compressed bytes also go to `sending`'s upload,
/// then its digest.
pub(super) fn spool_tar_layer(
    mut src: impl Read,
    file: &Path,
    buf: &mut [u8],
    sending: Option<Sending>,
) -> std::result::Result<ExportedLayer, SpoolError> {
    let (to, digest_to) = match sending {
        Some(s) => (Some(s.chunks), Some(s.digest)),
        None => (None, None),
    };
    let out = File::create(file).map_err(SpoolError::Write)?;
    let out = Tee {
        inner: BufWriter::with_capacity(COPY_BUF, out),
        to,
    };
    let mut gz = BlockGz::new(HashWriter::new(out), GZIP_LEVEL);
    loop {
        let n = match src.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SpoolError::Read(e)),
        };
        gz.write_all(&buf[..n]).map_err(SpoolError::Write)?;
    }
    let (mut hashed, diff) = gz.finish().map_err(SpoolError::Write)?;
    // The upload's body ends with the layer; its digest follows.
    hashed.inner.to = None;
    let layer = hashed.finish_layer(diff, file)?;
    if let Some(digest_to) = digest_to {
        let _ = digest_to.send(layer.digest.clone());
    }
    Ok(layer)
}

/// Spools the uncompressed layer tar that `fill` writes: hashed (diff_id), gzipped into
/// `file` and hashed again (digest), as [`spool_tar_layer`] does with a reader.
pub(crate) fn spool_written_layer(
    file: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<ExportedLayer> {
    let out = File::create(file)?;
    let mut gz = BlockGz::new(
        HashWriter::new(BufWriter::with_capacity(COPY_BUF, out)),
        GZIP_LEVEL,
    );
    fill(&mut gz)?;
    let (hashed, diff) = gz.finish()?;
    hashed.finish_layer(diff, file).map_err(|e| match e {
        SpoolError::Read(e) | SpoolError::Write(e) | SpoolError::Gzip(e) => e,
    })
}

/// Copies an already-gzipped layer into `file` as is (digest = sha256 of those bytes)
/// while decompressing it to compute the diff_id.
pub(super) fn spool_gzip_layer(
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

//! Blocking readers and writers between the engine's export stream and the spool:
//! channels, byte counting, hashing while writing, error tagging.

use super::*;

/// A blocking `Read` over the chunks the async side sends; EOF when the sender is dropped.
pub(crate) struct ChannelReader {
    pub(super) rx: mpsc::Receiver<io::Result<Bytes>>,
    pub(super) current: Bytes,
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
pub(super) struct Tracked<R> {
    pub(super) inner: R,
    pub(super) pos: u64,
    pub(super) eof: bool,
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
pub(super) struct HashWriter<W> {
    pub(super) inner: W,
    hasher: Sha256,
    pub(super) len: u64,
}

impl<W: Write> HashWriter<W> {
    pub(super) fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Flushes the spooled blob and describes it: `diff` hashed the uncompressed tar.
    pub(super) fn finish_layer(
        mut self,
        diff: Sha256,
        file: &Path,
    ) -> std::result::Result<ExportedLayer, SpoolError> {
        self.flush().map_err(SpoolError::Write)?;
        Ok(ExportedLayer {
            diff_id: Digest::finish(diff).to_string(),
            digest: Digest::finish(self.hasher),
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
pub(super) struct TeeReader<'a, R> {
    pub(super) inner: R,
    pub(super) out: &'a mut HashWriter<BufWriter<File>>,
}

impl<R: Read> Read for TeeReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out.write_all(&buf[..n])?;
        Ok(n)
    }
}

pub(super) struct CountingReader<R> {
    pub(super) inner: R,
    pub(super) n: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
pub(super) struct SourceError(pub(super) io::Error);

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SourceError {}

pub(super) struct ErrTag<R> {
    pub(super) inner: R,
}

impl<R: Read> Read for ErrTag<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), SourceError(e)))
    }
}

//! Reading a layer as a stream, within [`LayerLimit`]s: gzip detected by its magic and
//! decompressed on the fly, tar headers metered.
//!
//! The tar crate reads an entry's GNU long name (`L`), long link (`K`) and PAX header (`x`)
//! whole into memory, and a GNU sparse map block by block, before it hands the entry over;
//! it skips entry data it is not asked for by seeking. So what it *reads* (rather than
//! seeks past) while finding the next entry is headers, and [`Metered`] caps that.

use crate::base::layer_limits::LayerLimit;
use std::cell::Cell;
use std::io::{self, Read, Seek, SeekFrom};
use std::rc::Rc;

/// A layer's tar stream whose skips are reads thrown away, and whose reads since the last
/// [`Metered::counter`] reset are capped at `limit` bytes.
pub struct Metered<R> {
    inner: R,
    pos: u64,
    read: Rc<Cell<usize>>,
    limit: usize,
}

impl<R: Read> Metered<R> {
    pub fn new(inner: R, limit: usize) -> Metered<R> {
        Metered {
            inner,
            pos: 0,
            read: Rc::new(Cell::new(0)),
            limit,
        }
    }

    /// The count of bytes read; the reader of the archive sets it to 0 before each entry.
    pub fn counter(&self) -> Rc<Cell<usize>> {
        Rc::clone(&self.read)
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        let read = self.read.get().saturating_add(n);
        self.read.set(read);
        if read > self.limit {
            return Err(io::Error::other(LayerLimit::EntryHeaders {
                limit: self.limit,
            }));
        }
        Ok(n)
    }
}

/// Only forward skips, which is all the tar crate asks for.
impl<R: Read> Seek for Metered<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let SeekFrom::Current(delta @ 0..) = pos else {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        };
        let skipped = io::copy(&mut (&mut self.inner).take(delta as u64), &mut io::sink())?;
        self.pos += skipped;
        if skipped < delta as u64 {
            // The tar crate's own skip fails the same way; silence would end the archive.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "unexpected EOF during skip",
            ));
        }
        Ok(self.pos)
    }
}

/// Wraps a layer so that gzip-compressed layers are decompressed; zstd ones fail to read.
pub fn decompressing<'a>(reader: &'a mut (dyn Read + Send)) -> io::Result<Box<dyn Read + 'a>> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < magic.len() {
        match reader.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let chained: Box<dyn Read + Send> =
        Box::new(io::Cursor::new(magic[..n].to_vec()).chain(reader));
    if magic[..n].starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(chained)))
    } else if magic[..n] == [0x28, 0xb5, 0x2f, 0xfd] {
        Err(io::Error::other("zstd layers not supported"))
    } else {
        Ok(chained)
    }
}

/// Why reading a layer stopped.
#[derive(Debug)]
pub enum Stop {
    /// A malformed, truncated or unsupported layer, or a spool failing.
    Unreadable(io::Error),
    /// The layer went past a limit.
    Refused(LayerLimit),
}

impl From<io::Error> for Stop {
    /// The limit [`Metered`] stopped the tar crate's reading at comes back inside its error.
    fn from(error: io::Error) -> Stop {
        match error.get_ref().and_then(|e| e.downcast_ref::<LayerLimit>()) {
            Some(limit) => Stop::Refused(*limit),
            None => Stop::Unreadable(error),
        }
    }
}

/// Applies each layer (a tar, gzip or not) in rootfs order with `apply`, each read to its
/// end; the first that stops is returned with its 1-based number.
pub fn apply_layers(
    layers: Vec<Box<dyn Read + Send>>,
    mut apply: impl FnMut(Box<dyn Read + '_>) -> Result<(), Stop>,
) -> Result<(), (usize, Stop)> {
    for (i, mut layer) in layers.into_iter().enumerate() {
        let applied = decompressing(&mut *layer)
            .map_err(Stop::from)
            .and_then(&mut apply);
        // tar stops at its end-of-archive marker: read the rest (record padding, the gzip
        // trailer) so a streaming source completes (and verifies its digest) before the
        // next layer is read.
        let applied = applied.and_then(|()| {
            io::copy(&mut layer, &mut io::sink())
                .map(drop)
                .map_err(Stop::from)
        });
        applied.map_err(|stop| (i + 1, stop))?;
    }
    Ok(())
}

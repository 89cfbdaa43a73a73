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
pub(super) struct Metered<R> {
    inner: R,
    pos: u64,
    read: Rc<Cell<usize>>,
    limit: usize,
}

impl<R: Read> Metered<R> {
    pub(super) fn new(inner: R, limit: usize) -> Metered<R> {
        Metered {
            inner,
            pos: 0,
            read: Rc::new(Cell::new(0)),
            limit,
        }
    }

    /// The count of bytes read; the reader of the archive sets it to 0 before each entry.
    pub(super) fn counter(&self) -> Rc<Cell<usize>> {
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

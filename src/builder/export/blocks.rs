//! gzip as a series of members, one per block of the input, compressed on several cores at
//! once. A gzip file may hold several members (RFC 1952 §2.2); every reader of image layers
//! (Go's `compress/gzip`, pigz, containerd, skopeo, eStargz's own layers) reads them as
//! one stream. A block whose samples do not compress (random or already compressed data)
//! is stored rather than deflated: deflating it costs the most CPU of any input and saves
//! nothing. On Docker 20.10 this compression was the longest step polyarch itself took.

use super::*;

/// Input per member: large enough that restarting the 32 KiB window costs well under 0.1%
/// of the size, small enough that a few blocks in flight keep memory low.
const GZ_BLOCK: usize = 1 << 20;
/// Threads compressing at once, at most.
const MAX_WORKERS: usize = 4;
/// Bytes taken at each of a block's sample points to tell whether it compresses.
const SAMPLE: usize = 16 * 1024;
/// Sample points spread over a block.
const SAMPLES: usize = 4;
/// A block is stored when its samples deflate to at least this share (per mille) of
/// their size.
const STORE_AT_PERMILLE: usize = 980;

/// A `Write` that gzips what it is given into `inner`, block by block (see the module),
/// and hashes it uncompressed (a layer's diff ID) while the workers compress each batch.
pub(crate) struct BlockGz<W: Write> {
    inner: W,
    level: u32,
    workers: usize,
    /// Blocks waiting for the next batch, the last one still filling.
    blocks: Vec<Vec<u8>>,
    /// The uncompressed input hashed so far.
    diff: Sha256,
    /// Whether any member was written yet (an empty input still gets one, empty, member).
    wrote: bool,
}

impl<W: Write> BlockGz<W> {
    pub(crate) fn new(inner: W, level: u32) -> Self {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_WORKERS);
        Self::with_workers(inner, level, workers)
    }

    fn with_workers(inner: W, level: u32, workers: usize) -> Self {
        BlockGz {
            inner,
            level,
            workers,
            blocks: Vec::new(),
            diff: Sha256::new(),
            wrote: false,
        }
    }

    /// Compresses what is left; hands back the inner writer and the hash of the
    /// uncompressed input.
    pub(crate) fn finish(mut self) -> io::Result<(W, Sha256)> {
        if !self.wrote && self.blocks.is_empty() {
            self.blocks.push(Vec::new());
        }
        self.compress_batch()?;
        Ok((self.inner, self.diff))
    }

    /// Compresses the waiting blocks, one thread each, while this thread hashes them;
    /// then writes their members in order.
    fn compress_batch(&mut self) -> io::Result<()> {
        let blocks = std::mem::take(&mut self.blocks);
        let level = self.level;
        let diff = &mut self.diff;
        let members: Vec<io::Result<Vec<u8>>> = std::thread::scope(|scope| {
            let compressors: Vec<_> = blocks
                .iter()
                .map(|block| scope.spawn(move || member(block, level)))
                .collect();
            for block in &blocks {
                diff.update(block);
            }
            compressors
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("a gzip worker panicked")))
                })
                .collect()
        });
        for member in members {
            self.inner.write_all(&member?)?;
            self.wrote = true;
        }
        Ok(())
    }
}

impl<W: Write> Write for BlockGz<W> {
    fn write(&mut self, mut data: &[u8]) -> io::Result<usize> {
        let given = data.len();
        while !data.is_empty() {
            if self.blocks.last().is_none_or(|b| b.len() >= GZ_BLOCK) {
                if self.blocks.len() == self.workers {
                    self.compress_batch()?;
                }
                self.blocks.push(Vec::with_capacity(GZ_BLOCK));
            }
            let block = self.blocks.last_mut().expect("a block is filling");
            let n = (GZ_BLOCK - block.len()).min(data.len());
            block.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        Ok(given)
    }

    /// Members are only written whole, by batches and at the finish.
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// One gzip member of `block`: deflated at `level`, or stored when it does not compress.
fn member(block: &[u8], level: u32) -> io::Result<Vec<u8>> {
    if !compresses(block) {
        return Ok(stored_member(block));
    }
    let mut gz = GzEncoder::new(
        Vec::with_capacity(block.len() + block.len() / 64 + 64),
        Compression::new(level),
    );
    gz.write_all(block)?;
    gz.finish()
}

/// Largest stored deflate block (its length is a 16-bit field).
const STORED_MAX: usize = u16::MAX as usize;

/// A gzip member of `block` in stored deflate blocks (RFC 1951 §3.2.4), written here: a
/// copy and a CRC. miniz_oxide's level 0 still runs its match finder over the input,
/// which made it most of an export's CPU on random data.
fn stored_member(block: &[u8]) -> Vec<u8> {
    let blocks = block.len().div_ceil(STORED_MAX).max(1);
    let mut out = Vec::with_capacity(block.len() + 5 * blocks + 18);
    // ID1 ID2, CM deflate, no flags, no mtime, no extra flags, OS unknown: as flate2's.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    let mut chunks = block.chunks(STORED_MAX).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = chunk.len() as u16;
        out.push(u8::from(last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    let mut crc = flate2::Crc::new();
    crc.update(block);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(block.len() as u32).to_le_bytes());
    out
}

/// Whether deflating samples spread over `block` saves more than a few percent.
fn compresses(block: &[u8]) -> bool {
    let step = block.len() / SAMPLES;
    let samples: Vec<&[u8]> = if step < SAMPLE {
        vec![block]
    } else {
        (0..SAMPLES)
            .map(|i| &block[i * step..i * step + SAMPLE])
            .collect()
    };
    let taken: usize = samples.iter().map(|s| s.len()).sum();
    if taken == 0 {
        return true;
    }
    let mut deflate = flate2::Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(taken + taken / 16 + 64);
    for (i, sample) in samples.iter().enumerate() {
        let flush = match i + 1 == samples.len() {
            true => flate2::FlushCompress::Finish,
            false => flate2::FlushCompress::None,
        };
        // `out` has room for all of it: one call consumes the whole sample.
        if deflate.compress_vec(sample, &mut out, flush).is_err() {
            return true;
        }
    }
    out.len() * 1000 < taken * STORE_AT_PERMILLE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn gz(data: &[u8], workers: usize) -> Vec<u8> {
        let mut writer = BlockGz::with_workers(Vec::new(), GZIP_LEVEL, workers);
        // Odd-sized writes cross block boundaries.
        for chunk in data.chunks(100_003) {
            writer.write_all(chunk).unwrap();
        }
        let (out, diff) = writer.finish().unwrap();
        assert_eq!(
            Digest::finish(diff),
            Digest::of(data),
            "the diff hash is the input's sha256"
        );
        out
    }

    /// Pseudo-random bytes (xorshift): incompressible, reproducible.
    fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    fn text(len: usize) -> Vec<u8> {
        (0..)
            .map(|i: u64| format!("line {i}: the quick brown fox\n"))
            .flat_map(String::into_bytes)
            .take(len)
            .collect()
    }

    #[test]
    fn members_read_back_as_the_input_whatever_the_workers() {
        let mut input = text(2 * GZ_BLOCK + 12_345);
        input.extend(noise(GZ_BLOCK + 7, 1));
        input.extend(text(5000));
        let one = gz(&input, 1);
        assert_eq!(gunzip(&one), input);
        // Members depend on the blocks only: the same bytes from any number of threads.
        assert_eq!(gz(&input, 3), one);
        assert_eq!(gz(&input, 4), one);
    }

    /// Written by hand, a stored member reads back through flate2 and through gzip(1)
    /// whatever its size: empty, one byte, exactly one stored block, and several.
    #[test]
    fn stored_members_read_back_at_any_size() {
        for len in [0, 1, STORED_MAX, STORED_MAX + 1, 3 * STORED_MAX + 17] {
            let input = noise(len, len as u64 + 1);
            let member = stored_member(&input);
            assert_eq!(gunzip(&member), input, "{len} bytes");
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), &member).unwrap();
            let out = std::process::Command::new("gzip")
                .args(["-d", "-c"])
                .arg(file.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "gzip -d refused {len} bytes");
            assert_eq!(out.stdout, input, "gzip -d of {len} bytes");
        }
    }

    #[test]
    fn empty_input_is_one_empty_member() {
        let out = gz(&[], 2);
        assert!(out.starts_with(&[0x1f, 0x8b]));
        assert!(gunzip(&out).is_empty());
    }

    /// Text still compresses as level 1 does; noise is stored, a few bytes over its size.
    #[test]
    fn text_is_deflated_and_noise_is_stored() {
        let input = text(3 * GZ_BLOCK);
        let out = gz(&input, 2);
        assert!(
            out.len() < input.len() / 4,
            "{} of {}",
            out.len(),
            input.len()
        );

        let input = noise(3 * GZ_BLOCK + 1, 7);
        let out = gz(&input, 2);
        assert_eq!(gunzip(&out), input);
        // Stored: a few bytes per stored block and 18 per member, under 0.1% in all.
        assert!(
            out.len() < input.len() + input.len() / 1000,
            "{} of {}",
            out.len(),
            input.len()
        );
        assert!(!compresses(&input[..GZ_BLOCK]));
        assert!(compresses(&text(GZ_BLOCK)));
    }
}

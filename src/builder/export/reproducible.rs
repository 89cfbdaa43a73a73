//! Reproducible images where the engine cannot make them: with `SOURCE_DATE_EPOCH`, an
//! image exported from an engine's own store (whose BuildKit neither clamps file times in
//! layers nor, before 0.11, sets the config's times) is rewritten before it is pushed:
//! every time stamp in the layer tars at most the epoch, the config's and history's
//! `created` at the epoch, the config's `diff_ids` those of the rewritten layers. Layers
//! stream from the spool through the rewrite into a new spool file; nothing is held whole.
//!
//! The tar rewrite works on 512-byte blocks, so every header field but the times stays as
//! the engine wrote it (names, modes, owners, link targets, extended attributes).

use crate::builder::export::{spool_written_layer, ExportedImage};
use std::io::{self, Read, Write};
use std::path::PathBuf;

const BLOCK: usize = 512;
/// A PAX extended header larger than this is refused rather than held in memory.
const MAX_PAX: u64 = 1024 * 1024;

/// Copies the tar archive `src` to `dst` with every modification time later than `epoch`
/// set to `epoch`, and the access and change times of PAX headers dropped (Docker's own
/// layers carry none). Everything after the end-of-archive blocks is copied as is.
pub fn clamp_tar_times(mut src: impl Read, mut dst: impl Write, epoch: u64) -> io::Result<()> {
    let mut header = [0u8; BLOCK];
    loop {
        if !read_block(&mut src, &mut header)? {
            return Ok(());
        }
        if header.iter().all(|b| *b == 0) {
            // End of archive: the rest (the second zero block, padding) is copied as is.
            dst.write_all(&header)?;
            io::copy(&mut src, &mut dst)?;
            return Ok(());
        }
        let size = field_number(&header[124..136])
            .ok_or_else(|| invalid("a tar header has no readable size"))?;
        let kind = header[156];
        match kind {
            // PAX extended headers (per entry, and global): their records may carry times.
            b'x' | b'g' => {
                if size > MAX_PAX {
                    return Err(invalid("a PAX header is larger than 1 MiB"));
                }
                let mut data = vec![0u8; padded(size) as usize];
                src.read_exact(&mut data)?;
                data.truncate(size as usize);
                let records = clamp_pax_records(&data, epoch)?;
                set_octal(&mut header[124..136], records.len() as u64);
                clamp_mtime(&mut header, epoch);
                seal(&mut header);
                dst.write_all(&header)?;
                dst.write_all(&records)?;
                dst.write_all(&vec![
                    0u8;
                    (padded(records.len() as u64) - records.len() as u64)
                        as usize
                ])?;
            }
            _ => {
                clamp_mtime(&mut header, epoch);
                seal(&mut header);
                dst.write_all(&header)?;
                let mut data = (&mut src).take(padded(size));
                let copied = io::copy(&mut data, &mut dst)?;
                if copied != padded(size) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "a tar entry is cut short",
                    ));
                }
            }
        }
    }
}

/// Reads one block; false at a clean end of input.
fn read_block(src: &mut impl Read, block: &mut [u8; BLOCK]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < BLOCK {
        match src.read(&mut block[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a tar block is cut short",
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// A numeric header field: octal text, or GNU's base-256 when the high bit is set.
fn field_number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(*b))?;
        }
        return Some(value);
    }
    let text = std::str::from_utf8(field).ok()?;
    let digits = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// Writes `value` as zero-padded octal ending in NUL, as tar writers do.
fn set_octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    let text = format!("{value:0width$o}");
    field[..width].copy_from_slice(&text.as_bytes()[text.len() - width..]);
    field[width] = 0;
}

fn clamp_mtime(header: &mut [u8; BLOCK], epoch: u64) {
    if field_number(&header[136..148]).is_some_and(|mtime| mtime > epoch) {
        set_octal(&mut header[136..148], epoch);
    }
}

/// Recomputes the header checksum (the sum of its bytes, the checksum field as spaces).
fn seal(header: &mut [u8; BLOCK]) {
    header[148..156].fill(b' ');
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(text.as_bytes());
}

/// PAX records (`LEN KEY=VALUE\n`) with `mtime` clamped and `atime`/`ctime` dropped.
fn clamp_pax_records(data: &[u8], epoch: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len());
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|b| *b == b' ')
            .ok_or_else(|| invalid("a PAX record has no length"))?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|t| t.parse().ok())
            .filter(|len| *len > space && *len <= rest.len())
            .ok_or_else(|| invalid("a PAX record has a bad length"))?;
        let whole = &rest[..len];
        let record = &rest[space + 1..len];
        rest = &rest[len..];
        let (key, value) = match record.iter().position(|b| *b == b'=') {
            Some(eq) => (&record[..eq], &record[eq + 1..]),
            None => return Err(invalid("a PAX record has no `=`")),
        };
        match key {
            b"atime" | b"ctime" => {}
            b"mtime" => {
                let value = std::str::from_utf8(value)
                    .unwrap_or("")
                    .trim_end_matches('\n');
                let seconds = value.split('.').next().and_then(|s| s.parse::<i64>().ok());
                let clamped = match seconds {
                    Some(s) if s >= 0 && s as u64 >= epoch => epoch.to_string(),
                    _ => value.to_string(),
                };
                out.extend_from_slice(&pax_record("mtime", clamped.as_bytes()));
            }
            _ => out.extend_from_slice(whole),
        }
    }
    Ok(out)
}

/// One PAX record, its length prefix counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len.to_string().len() + body != len {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// Why an image cannot be rewritten for `SOURCE_DATE_EPOCH`.
#[derive(Debug, thiserror::Error)]
pub enum ReproducibleError {
    #[error("cannot read the spooled layer {}: {source}", path.display())]
    ReadLayer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot rewrite layer {digest} for SOURCE_DATE_EPOCH: {source}")]
    RewriteLayer {
        digest: String,
        #[source]
        source: io::Error,
    },
    #[error("image config is not JSON: {0}")]
    ConfigJson(#[source] serde_json::Error),
    #[error("image config is not a JSON object")]
    NotAnObject,
    #[error("image config has no rootfs")]
    NoRootfs,
    #[error("SOURCE_DATE_EPOCH {epoch} is not a time: {source}")]
    Epoch {
        epoch: u64,
        #[source]
        source: time::error::ComponentRange,
    },
    #[error("{0}")]
    Format(#[source] time::error::Format),
    #[error("{0}")]
    Serialize(#[source] serde_json::Error),
}

/// The image config with `created` and every history entry's `created` at the epoch, and
/// `rootfs.diff_ids` replaced; its bytes (keys sorted, compact) are deterministic. A
/// history comment naming a base by image ID is dropped: Buildah writes `FROM <short ID>`
/// for a stage built FROM an earlier one, whose image holds that stage's build times, so
/// two builds of one tree would differ in it (seen on Podman 4.3).
pub fn normalise_config(
    config: &[u8],
    epoch: u64,
    diff_ids: &[String],
) -> Result<Vec<u8>, ReproducibleError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(config).map_err(ReproducibleError::ConfigJson)?;
    let created = time::OffsetDateTime::from_unix_timestamp(epoch as i64)
        .map_err(|source| ReproducibleError::Epoch { epoch, source })?
        .format(&time::format_description::well_known::Rfc3339)
        .map_err(ReproducibleError::Format)?;
    let object = value
        .as_object_mut()
        .ok_or(ReproducibleError::NotAnObject)?;
    object.insert("created".into(), created.clone().into());
    if let Some(history) = object.get_mut("history").and_then(|h| h.as_array_mut()) {
        for entry in history.iter_mut().filter_map(|e| e.as_object_mut()) {
            entry.insert("created".into(), created.clone().into());
            let names_an_id = entry
                .get("comment")
                .and_then(|c| c.as_str()?.strip_prefix("FROM "))
                .is_some_and(crate::builder::is_short_id);
            if names_an_id {
                entry.remove("comment");
            }
        }
    }
    let rootfs = object
        .get_mut("rootfs")
        .and_then(|r| r.as_object_mut())
        .ok_or(ReproducibleError::NoRootfs)?;
    rootfs.insert("diff_ids".into(), diff_ids.to_vec().into());
    serde_json::to_vec(&value).map_err(ReproducibleError::Serialize)
}

/// `image` with its layers and config rewritten for `epoch` (see the module's text); the
/// new layers are spooled beside the old ones, which are removed as each is done.
pub fn normalise(image: ExportedImage, epoch: u64) -> Result<ExportedImage, ReproducibleError> {
    let mut layers = Vec::with_capacity(image.layers.len());
    for (n, layer) in image.layers.iter().enumerate() {
        let path = image.spool.path().join(format!("reproducible-{n}.tar.gz"));
        let source =
            std::fs::File::open(&layer.path).map_err(|source| ReproducibleError::ReadLayer {
                path: layer.path.clone(),
                source,
            })?;
        let rewritten = spool_written_layer(&path, |out| {
            clamp_tar_times(
                flate2::read::MultiGzDecoder::new(io::BufReader::new(source)),
                out,
                epoch,
            )
        })
        .map_err(|source| ReproducibleError::RewriteLayer {
            digest: layer.digest.to_string(),
            source,
        })?;
        let _ = std::fs::remove_file(&layer.path);
        layers.push(rewritten);
    }
    let diff_ids: Vec<String> = layers.iter().map(|l| l.diff_id.clone()).collect();
    let config = normalise_config(&image.config, epoch, &diff_ids)?;
    Ok(ExportedImage {
        config_digest: crate::base::digest::Digest::of(&config),
        config,
        layers,
        spool: image.spool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(mtime: u64, long_name: bool, pax: bool) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_uid(1000);
        header.set_size(5);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        let name = if long_name {
            format!("dir/{}", "n".repeat(150))
        } else {
            "dir/file".to_string()
        };
        if pax {
            // What Go's archive/tar writes for an extended attribute.
            let records = [
                pax_record("mtime", format!("{mtime}.5").as_bytes()),
                pax_record("atime", b"1"),
                pax_record("SCHILY.xattr.user.k", b"v"),
            ]
            .concat();
            let mut x = tar::Header::new_ustar();
            x.set_entry_type(tar::EntryType::XHeader);
            x.set_size(records.len() as u64);
            x.set_mtime(mtime);
            x.set_path("PaxHeaders/file").unwrap();
            x.set_cksum();
            builder.append(&x, records.as_slice()).unwrap();
        }
        builder
            .append_data(&mut header, name, &b"hello"[..])
            .unwrap();
        builder.into_inner().unwrap()
    }

    fn clamp(input: &[u8], epoch: u64) -> Vec<u8> {
        let mut out = Vec::new();
        clamp_tar_times(input, &mut out, epoch).unwrap();
        out
    }

    #[test]
    fn times_after_the_epoch_are_clamped_and_the_rest_kept() {
        for (long_name, pax) in [(false, false), (true, false), (false, true), (true, true)] {
            let later = clamp(&archive(1_900_000_000, long_name, pax), 1_700_000_000);
            let other = clamp(&archive(1_800_000_000, long_name, pax), 1_700_000_000);
            assert_eq!(later, other, "long name {long_name}, pax {pax}");
            let mut read = tar::Archive::new(later.as_slice());
            let mut entries = read.entries().unwrap();
            let mut entry = entries.next().unwrap().unwrap();
            assert_eq!(entry.header().mtime().unwrap(), 1_700_000_000);
            assert_eq!(entry.header().mode().unwrap(), 0o755);
            assert_eq!(entry.header().uid().unwrap(), 1000);
            assert!(entry.path().unwrap().to_string_lossy().starts_with("dir/"));
            if pax {
                let keys: Vec<String> = entry
                    .pax_extensions()
                    .unwrap()
                    .unwrap()
                    .map(|e| e.unwrap().key().unwrap().to_string())
                    .collect();
                assert_eq!(keys, ["mtime", "SCHILY.xattr.user.k"]);
            }
            let mut body = String::new();
            entry.read_to_string(&mut body).unwrap();
            assert_eq!(body, "hello");
        }
        // Older times are kept.
        let old = archive(1_600_000_000, false, true);
        let kept = clamp(&old, 1_700_000_000);
        let mut read = tar::Archive::new(kept.as_slice());
        let entry = read.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(entry.header().mtime().unwrap(), 1_600_000_000);
    }

    #[test]
    fn broken_archives_are_errors_not_panics() {
        let good = archive(1_900_000_000, true, true);
        for cut in [1, 511, 512, 700, 1024, good.len() - 1024] {
            let _ = clamp_tar_times(&good[..cut], io::sink(), 1);
        }
        let mut bad_size = good.clone();
        bad_size[124..136].copy_from_slice(b"zzzzzzzzzzz\0");
        assert!(clamp_tar_times(bad_size.as_slice(), io::sink(), 1).is_err());
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for value in ["", "1", "123456789", &"x".repeat(95)] {
            let record = pax_record("mtime", value.as_bytes());
            let text = String::from_utf8(record.clone()).unwrap();
            let len: usize = text.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(len, record.len(), "{text:?}");
        }
    }

    #[test]
    fn the_config_gets_the_epoch_and_the_new_diff_ids() {
        let config = br#"{"architecture":"amd64","os":"linux","created":"2026-12-03T10:00:00.123Z","history":[{"created":"2026-12-03T10:00:00Z","created_by":"COPY","comment":"FROM docker.io/library/base"},{"created":"2026-12-03T10:00:01Z","created_by":"COPY","comment":"FROM 6198bc72cb3b"}],"rootfs":{"type":"layers","diff_ids":["sha256:old"]}}"#;
        let out = normalise_config(config, 1_700_000_000, &["sha256:new".into()]).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["created"], "2023-11-14T22:13:20Z");
        assert_eq!(value["history"][0]["created"], "2023-11-14T22:13:20Z");
        assert_eq!(value["history"][0]["created_by"], "COPY");
        // A base named by reference stays; one named by an ID of this build's is dropped.
        assert_eq!(
            value["history"][0]["comment"],
            "FROM docker.io/library/base"
        );
        assert_eq!(value["history"][1]["created"], "2023-11-14T22:13:20Z");
        assert!(value["history"][1].get("comment").is_none(), "{value}");
        assert_eq!(value["rootfs"]["diff_ids"][0], "sha256:new");
        assert!(normalise_config(b"[]", 1, &[]).is_err());
    }
}

//! RPM packages: the sqlite database rpm 4.16 and later keeps (`/var/lib/rpm/rpmdb.sqlite`,
//! or `/usr/lib/sysimage/rpm/rpmdb.sqlite`), one header blob per package in its `Packages`
//! table. SQLite (bundled, through rusqlite) reads the file, which the layer reader has
//! spooled to a temporary file; the headers are parsed here. The file is untrusted: it is
//! opened read-only and immutable, with SQLite's own defences for hostile databases
//! (defensive mode, untrusted schema, cell size checks), a small page cache, a cap on any
//! one value's size and a cap on the work a query may do. A header that is not what it
//! claims is skipped and named in a warning; nothing in a blob can panic or make this
//! allocate more than the blob.

use super::{Ecosystem, Package};
use rusqlite::{
    config::DbConfig, limits::Limit, types::ValueRef, Connection, OpenFlags, OptionalExtension,
};
use std::path::Path;

/// The largest header blob read: rpm's own headers are a few KiB to a few MiB (a package
/// with tens of thousands of files); SQLite refuses to load any larger value.
const MAX_HEADER: i32 = 16 << 20;
/// SQLite's page cache, in KiB (its default is 2000).
const CACHE_KIB: i64 = 2048;
/// Headers read at most: a distribution's whole archive is some 70,000 packages, an image
/// holds hundreds. Tiny hostile headers cannot make the catalog grow past this.
const MAX_HEADERS: usize = 100_000;
/// Skipped headers named in the warning; the rest are counted.
const TOLD: usize = 3;
/// The query's work at most, in SQLite virtual machine steps (a few dozen a row): whatever
/// the file holds, reading it ends.
const MAX_STEPS: u64 = 1 << 28;
/// How often the step counter is called back.
const STEPS_PER_CHECK: u64 = 1 << 16;

/// The tags read (rpmtag.h).
const NAME: u32 = 1000;
const VERSION: u32 = 1001;
const RELEASE: u32 = 1002;
const EPOCH: u32 = 1003;
const LICENSE: u32 = 1014;
const ARCH: u32 = 1022;

/// The tag types read (rpmtag.h's `rpmTagType`).
const INT32: u32 = 4;
const STRING: u32 = 6;
const STRING_ARRAY: u32 = 8;
const I18NSTRING: u32 = 9;

/// rpm's own limits on a header (header_internal.h): index entries and data bytes.
const MAX_ENTRIES: u32 = 0xffff;
const MAX_DATA: u32 = 256 << 20;

/// Why one header blob was not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("is {0} bytes, shorter than a header's 8-byte preamble")]
    Short(usize),
    #[error("claims {entries} index entries and {data} data bytes, which is not its {len} bytes")]
    Size { entries: u32, data: u32, len: usize },
    #[error("has tag {tag} of type {kind} where {wanted} was expected")]
    Type {
        tag: u32,
        kind: u32,
        wanted: &'static str,
    },
    #[error("has tag {0} pointing outside its data")]
    Bounds(u32),
    #[error("has no {0}")]
    Missing(&'static str),
}

/// The packages of the rpm sqlite database at `db`, and a warning naming the headers that
/// were skipped, if any; Err (a warning) when it cannot be read as such a database.
pub(super) fn read(db: &Path, source: &str) -> Result<(Vec<Package>, Option<String>), String> {
    let sqlite = |e: rusqlite::Error| format!("cannot be read as an RPM sqlite database ({e})");
    let connection = open(db).map_err(sqlite)?;
    // A view or virtual table named Packages could compute anything: only a table is read.
    let kind: Option<String> = connection
        .query_row(
            "SELECT type FROM sqlite_master WHERE name = 'Packages'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(sqlite)?
        .flatten();
    if kind.as_deref() != Some("table") {
        return Err("has no Packages table; not an RPM sqlite database".into());
    }
    // A blob's length() is read from its record header, without loading it: a header
    // past the cap is skipped, not the whole database refused (SQLITE_TOOBIG).
    let mut statement = connection
        .prepare(
            "SELECT hnum, length(blob), CASE WHEN length(blob) <= ?1 THEN blob END FROM Packages",
        )
        .map_err(sqlite)?;
    let mut rows = statement.query([MAX_HEADER]).map_err(sqlite)?;
    let mut packages = Vec::new();
    // How many headers were skipped, the first few of them told.
    let (mut skipped, mut told) = (0usize, Vec::new());
    let mut cut = false;
    while let Some(row) = rows.next().map_err(sqlite)? {
        if packages.len() + skipped == MAX_HEADERS {
            cut = true;
            break;
        }
        let hnum = row.get_ref(0).ok().and_then(|v| v.as_i64().ok());
        let header = match (row.get_ref(1), row.get_ref(2).map(|v| v.as_blob())) {
            (_, Ok(Ok(blob))) => package(blob, source).map_err(|e| e.to_string()),
            (Ok(ValueRef::Integer(len)), _) if len > MAX_HEADER.into() => Err(format!(
                "is {len} bytes, more than the {} MiB read",
                MAX_HEADER >> 20
            )),
            _ => Err("is no blob".to_string()),
        };
        match header {
            Ok(package) => packages.push(package),
            Err(why) => {
                skipped += 1;
                if told.len() < TOLD {
                    told.push(match hnum {
                        Some(n) => format!("header {n} {why}"),
                        None => format!("a header {why}"),
                    });
                }
            }
        }
    }
    let mut notes = Vec::new();
    if skipped > 0 {
        let mut text = format!("{skipped} header(s) not read: {}", told.join(", "));
        if skipped > told.len() {
            text += &format!(" and {} more", skipped - told.len());
        }
        notes.push(text);
    }
    if cut {
        notes.push(format!("only its first {MAX_HEADERS} headers read"));
    }
    let warning = (!notes.is_empty()).then(|| format!("{source}: {}", notes.join("; ")));
    Ok((packages, warning))
}

/// The database, read-only, immutable (no lock, no journal or WAL file looked for or
/// made), with the limits above.
fn open(db: &Path) -> rusqlite::Result<Connection> {
    let mut uri = String::from("file:");
    for byte in db.as_os_str().as_encoded_bytes() {
        match byte {
            b'/' | b'.' | b'-' | b'_' | b'~' => uri.push(*byte as char),
            b if b.is_ascii_alphanumeric() => uri.push(*b as char),
            b => uri += &format!("%{b:02X}"),
        }
    }
    uri += "?immutable=1";
    let mut connection = Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    connection.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_HEADER)?;
    connection.pragma_update(None, "cell_size_check", true)?;
    connection.pragma_update(None, "cache_size", -CACHE_KIB)?;
    let mut steps = 0u64;
    connection.progress_handler(
        STEPS_PER_CHECK as i32,
        Some(move || {
            steps += STEPS_PER_CHECK;
            steps > MAX_STEPS
        }),
    )?;
    Ok(connection)
}

/// One installed package from its header blob: rpm's header without the 8-byte magic, as
/// rpmdb stores it: the index entry count and data length (big-endian `u32`s), that many
/// 16-byte entries (tag, type, offset into the data, count), then the data.
pub(super) fn package(blob: &[u8], source: &str) -> Result<Package, HeaderError> {
    let header = Header::new(blob)?;
    let required = |tag, what| header.string(tag)?.ok_or(HeaderError::Missing(what));
    let name = required(NAME, "NAME")?;
    let version = required(VERSION, "VERSION")?;
    let release = required(RELEASE, "RELEASE")?;
    // rpm's EVR, as `rpm -q --qf '%{EPOCHNUM}:%{VERSION}-%{RELEASE}'` and dnf write it; the
    // purl carries the epoch as a qualifier.
    let version = match header.int32(EPOCH)? {
        Some(epoch) => format!("{epoch}:{version}-{release}"),
        None => format!("{version}-{release}"),
    };
    Ok(Package {
        ecosystem: Ecosystem::Rpm,
        name,
        version,
        arch: header.string(ARCH)?,
        license: header.string(LICENSE)?,
        source: source.to_string(),
    })
}

struct Header<'a> {
    index: &'a [u8],
    data: &'a [u8],
}

impl<'a> Header<'a> {
    fn new(blob: &'a [u8]) -> Result<Self, HeaderError> {
        let (Some(entries), Some(data)) = (be32(blob, 0), be32(blob, 4)) else {
            return Err(HeaderError::Short(blob.len()));
        };
        let size = HeaderError::Size {
            entries,
            data,
            len: blob.len(),
        };
        if entries > MAX_ENTRIES || data > MAX_DATA {
            return Err(size);
        }
        // At most 8 + 16 * 0xffff + 256 MiB: no overflow in usize.
        let index_end = 8 + 16 * entries as usize;
        if index_end + data as usize != blob.len() {
            return Err(size);
        }
        Ok(Header {
            index: &blob[8..index_end],
            data: &blob[index_end..],
        })
    }

    /// The first entry of `tag`: its type, offset and count.
    fn entry(&self, tag: u32) -> Option<(u32, usize, u32)> {
        self.index.chunks_exact(16).find_map(|e| {
            (be32(e, 0)? == tag).then_some(())?;
            Some((be32(e, 4)?, be32(e, 8)? as usize, be32(e, 12)?))
        })
    }

    /// A string tag's value (the first of an array or of the translations).
    fn string(&self, tag: u32) -> Result<Option<String>, HeaderError> {
        let Some((kind, offset, count)) = self.entry(tag) else {
            return Ok(None);
        };
        if !matches!(kind, STRING | STRING_ARRAY | I18NSTRING) {
            return Err(HeaderError::Type {
                tag,
                kind,
                wanted: "a string",
            });
        }
        if count == 0 || (kind == STRING && count != 1) {
            return Err(HeaderError::Bounds(tag));
        }
        let text = self.data.get(offset..).ok_or(HeaderError::Bounds(tag))?;
        let end = text
            .iter()
            .position(|b| *b == 0)
            .ok_or(HeaderError::Bounds(tag))?;
        Ok(Some(String::from_utf8_lossy(&text[..end]).into_owned()))
    }

    /// An INT32 tag's first value.
    fn int32(&self, tag: u32) -> Result<Option<u32>, HeaderError> {
        let Some((kind, offset, count)) = self.entry(tag) else {
            return Ok(None);
        };
        if kind != INT32 {
            return Err(HeaderError::Type {
                tag,
                kind,
                wanted: "INT32",
            });
        }
        if count == 0 || offset % 4 != 0 {
            return Err(HeaderError::Bounds(tag));
        }
        be32(self.data, offset)
            .map(Some)
            .ok_or(HeaderError::Bounds(tag))
    }
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A header blob as rpmdb stores it, of `(tag, type, count, data)` entries, each
    /// entry's data aligned as rpm aligns it (INT32 to 4).
    pub(in crate::sbom) fn blob(entries: &[(u32, u32, u32, Vec<u8>)]) -> Vec<u8> {
        let (mut index, mut data) = (Vec::new(), Vec::new());
        for (tag, kind, count, bytes) in entries {
            if *kind == INT32 {
                data.resize(data.len().next_multiple_of(4), 0);
            }
            for field in [*tag, *kind, data.len() as u32, *count] {
                index.extend(field.to_be_bytes());
            }
            data.extend(bytes);
        }
        let mut out = (entries.len() as u32).to_be_bytes().to_vec();
        out.extend((data.len() as u32).to_be_bytes());
        out.extend(index);
        out.extend(data);
        out
    }

    fn string(tag: u32, text: &str) -> (u32, u32, u32, Vec<u8>) {
        (tag, STRING, 1, format!("{text}\0").into_bytes())
    }

    /// The header of an installed package: an immutable region entry first, as rpm writes.
    pub(in crate::sbom) fn header(
        name: &str,
        version: &str,
        release: &str,
        epoch: Option<u32>,
        arch: &str,
        license: &str,
    ) -> Vec<u8> {
        let mut entries = vec![
            (63, 7, 16, vec![0; 16]),
            string(NAME, name),
            string(VERSION, version),
            string(RELEASE, release),
            (1004, I18NSTRING, 1, b"a summary\0".to_vec()),
            string(LICENSE, license),
            string(ARCH, arch),
        ];
        if let Some(epoch) = epoch {
            entries.push((EPOCH, INT32, 1, epoch.to_be_bytes().to_vec()));
        }
        blob(&entries)
    }

    #[test]
    fn name_evr_arch_and_licence_of_a_header() {
        let found = package(
            &header(
                "bash",
                "5.2.26",
                "3.fc40",
                Some(1),
                "x86_64",
                "GPL-3.0-or-later",
            ),
            "/var/lib/rpm/rpmdb.sqlite",
        )
        .unwrap();
        assert_eq!(
            found,
            Package {
                ecosystem: Ecosystem::Rpm,
                name: "bash".into(),
                version: "1:5.2.26-3.fc40".into(),
                arch: Some("x86_64".into()),
                license: Some("GPL-3.0-or-later".into()),
                source: "/var/lib/rpm/rpmdb.sqlite".into(),
            }
        );
        let no_epoch = package(
            &header("tzdata", "2024a", "5.fc40", None, "noarch", "x"),
            "/x",
        );
        assert_eq!(no_epoch.unwrap().version, "2024a-5.fc40");
        // gpg-pubkey entries carry no ARCH (rpm prints `(none)`).
        let key = blob(&[
            string(NAME, "gpg-pubkey"),
            string(VERSION, "a15b79cc"),
            string(RELEASE, "63d04c2c"),
        ]);
        let key = package(&key, "/x").unwrap();
        assert_eq!((key.arch, key.license), (None, None));
    }

    #[test]
    fn a_header_that_lies_is_an_error() {
        let good = header("bash", "5.2", "1", Some(2), "x86_64", "MIT");
        let cut = &good[..good.len() - 1];
        assert!(matches!(package(cut, "/x"), Err(HeaderError::Size { .. })));
        assert_eq!(package(&good[..5], "/x"), Err(HeaderError::Short(5)));
        let huge = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert!(matches!(
            package(&huge, "/x"),
            Err(HeaderError::Size { .. })
        ));
        let no_release = blob(&[string(NAME, "a"), string(VERSION, "1")]);
        assert_eq!(
            package(&no_release, "/x"),
            Err(HeaderError::Missing("RELEASE"))
        );
        // A string with no terminating NUL, an offset past the data, a number as a name,
        // a misaligned INT32.
        let unterminated = blob(&[
            string(VERSION, "1"),
            string(RELEASE, "1"),
            (NAME, STRING, 1, b"abc".to_vec()),
        ]);
        assert_eq!(package(&unterminated, "/x"), Err(HeaderError::Bounds(NAME)));
        let mut past = header("a", "1", "1", None, "x", "y");
        let name_offset = 8 + 16 + 8;
        past[name_offset..name_offset + 4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
        assert_eq!(package(&past, "/x"), Err(HeaderError::Bounds(NAME)));
        let number = blob(&[(NAME, INT32, 1, vec![0, 0, 0, 1])]);
        assert!(matches!(
            package(&number, "/x"),
            Err(HeaderError::Type { tag: NAME, .. })
        ));
        let mut misaligned = header("a", "1", "1", Some(1), "x", "y");
        let epoch_offset = 8 + 16 * 7 + 8;
        let at = u32::from_be_bytes(
            misaligned[epoch_offset..epoch_offset + 4]
                .try_into()
                .unwrap(),
        );
        misaligned[epoch_offset..epoch_offset + 4].copy_from_slice(&(at + 1).to_be_bytes());
        assert_eq!(package(&misaligned, "/x"), Err(HeaderError::Bounds(EPOCH)));
    }

    #[test]
    fn a_database_of_countless_headers_is_cut_and_its_bad_ones_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rpmdb.sqlite");
        let mut db = Connection::open(&path).unwrap();
        db.execute_batch("CREATE TABLE Packages (hnum INTEGER PRIMARY KEY, blob BLOB NOT NULL)")
            .unwrap();
        let good = header("a", "1", "1", None, "noarch", "MIT");
        let batch = db.transaction().unwrap();
        for n in 0..MAX_HEADERS + 10 {
            let blob = if n % 2 == 0 { &good[..] } else { b"bad" };
            batch
                .execute("INSERT INTO Packages (blob) VALUES (?1)", [blob])
                .unwrap();
        }
        batch.commit().unwrap();
        drop(db);
        let (packages, warning) = read(&path, "/var/lib/rpm/rpmdb.sqlite").unwrap();
        assert_eq!(packages.len(), MAX_HEADERS / 2);
        assert_eq!(
            warning.unwrap(),
            format!(
                "/var/lib/rpm/rpmdb.sqlite: {} header(s) not read: header 2 is 3 bytes, \
                 shorter than a header's 8-byte preamble, header 4 is 3 bytes, shorter than a \
                 header's 8-byte preamble, header 6 is 3 bytes, shorter than a header's 8-byte \
                 preamble and {} more; only its first {MAX_HEADERS} headers read",
                MAX_HEADERS / 2,
                MAX_HEADERS / 2 - TOLD
            )
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let good = header("bash", "5.2", "1", Some(2), "x86_64", "MIT");
        let mut x: u32 = 17;
        let mut next = || {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            x >> 8
        };
        for round in 0..20_000 {
            let mut bytes = good.clone();
            for _ in 0..(1 + round % 6) {
                let at = next() as usize % bytes.len();
                bytes[at] = next() as u8;
            }
            let _ = package(&bytes, "/x");
            bytes.truncate(next() as usize % (bytes.len() + 1));
            let _ = package(&bytes, "/x");
            // Pure noise, of a length its preamble may or may not match.
            let noise: Vec<u8> = (0..(next() % 300)).map(|_| next() as u8).collect();
            let _ = package(&noise, "/x");
        }
    }
}

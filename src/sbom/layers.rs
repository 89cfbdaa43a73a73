//! An image's layers read once each, in order, as streams: whiteouts (`.wh.NAME`) and
//! opaque directories (`.wh..wh..opq`) hide what lower layers held, and only what the
//! catalogers want is kept, parsed as soon as it is read: package databases (capped),
//! os-release, RPM sqlite databases and the packages embedded in ELF binaries (each
//! spooled to a temporary file: SQLite reads a file, and ELF section headers come last).
//! No layer is ever held in memory.

use super::{apk, binary, dpkg, os_release, rpm, Distro, Package};
use crate::base::image_path::{below, join, normalize, split_parent};
use crate::base::layer_limits::LayerLimit;
use crate::base::layer_stream::{Metered, Stop};
use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// Longest entry name and link target: Linux's PATH_MAX.
const MAX_NAME: usize = 4096;
/// Tar headers read for one entry (GNU long names, PAX headers), as `--deep` allows.
const MAX_ENTRY_HEADERS: usize = 1 << 20;
/// A package database read at most; Debian's status with thousands of packages is a few MiB.
const MAX_DATABASE: u64 = 32 << 20;
/// A binary spooled at most to look for embedded packages.
const MAX_BINARY: u64 = 1 << 30;
/// An RPM sqlite database spooled at most (to disk; SQLite reads it a page at a time).
const MAX_RPMDB: u64 = 256 << 20;

/// What a kept path holds, once read.
#[derive(Debug, Clone)]
pub(super) enum Found {
    /// The packages read, and what in the file was not (a warning).
    Packages(Vec<Package>, Option<String>),
    OsRelease(Distro),
    /// A database or binary that was not read, and why (a warning in the catalog).
    NotRead(String),
}

/// An entry's contents as the catalogers read them: not tar headers, so not counted
/// against the headers' limit (each read small enough that the meter never trips on one).
struct Data<'a, R> {
    entry: R,
    headers: &'a std::cell::Cell<usize>,
}

impl<R: Read> Read for Data<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.headers.set(0);
        let n = buf.len().min(64 << 10);
        self.entry.read(&mut buf[..n])
    }
}

/// The merged view of the layers read so far, for the paths the catalogers keep.
#[derive(Default)]
pub(super) struct Tree {
    pub(super) found: BTreeMap<String, Found>,
    spool: Option<std::fs::File>,
}

/// What the catalogers read at a path.
#[derive(Clone, Copy)]
enum Wanted {
    Dpkg,
    Apk,
    OsRelease,
    Rpm,
    /// A database that is not read, and what it is.
    Unread(&'static str),
    Binary,
}

fn wanted(path: &str, mode: u32) -> Option<Wanted> {
    let (dir, name) = split_parent(path);
    Some(match path {
        "var/lib/dpkg/status" => Wanted::Dpkg,
        _ if dir == "var/lib/dpkg/status.d" && !name.ends_with(".md5sums") => Wanted::Dpkg,
        "lib/apk/db/installed" | "usr/lib/apk/db/installed" => Wanted::Apk,
        "etc/os-release" | "usr/lib/os-release" => Wanted::OsRelease,
        "var/lib/rpm/rpmdb.sqlite" | "usr/lib/sysimage/rpm/rpmdb.sqlite" => Wanted::Rpm,
        "var/lib/rpm/Packages" | "usr/lib/sysimage/rpm/Packages" => {
            Wanted::Unread("an RPM Berkeley DB database")
        }
        "var/lib/rpm/Packages.db" | "usr/lib/sysimage/rpm/Packages.db" => {
            Wanted::Unread("an RPM ndb database (SUSE's)")
        }
        _ if mode & 0o111 != 0 => Wanted::Binary,
        _ => return None,
    })
}

impl Tree {
    /// Reads one (decompressed) layer tar, then lays it over the layers below.
    pub(super) fn apply_layer(&mut self, reader: impl Read) -> Result<(), Stop> {
        let reader = Metered::new(reader, MAX_ENTRY_HEADERS);
        let headers = reader.counter();
        let mut archive = tar::Archive::new(reader);
        // A path this layer puts something at: what it holds for the catalogers, if anything.
        let mut upper: BTreeMap<String, Option<Found>> = BTreeMap::new();
        let (mut whiteouts, mut opaques) = (Vec::new(), Vec::new());
        let mut entries = archive.entries_with_seek()?;
        loop {
            // Only what the tar crate reads to find the next entry counts as headers.
            headers.set(0);
            let Some(entry) = entries.next() else { break };
            headers.set(0);
            let mut entry = entry?;
            let raw = entry.path_bytes();
            if raw.len() > MAX_NAME {
                return Err(Stop::Refused(LayerLimit::Name { limit: MAX_NAME }));
            }
            let Some(path) = normalize(&String::from_utf8_lossy(&raw)).filter(|p| !p.is_empty())
            else {
                continue;
            };
            let (dir, name) = split_parent(&path);
            if name == ".wh..wh..opq" {
                opaques.push(dir.to_string());
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                if !hidden.is_empty() {
                    whiteouts.push(join(dir, hidden));
                }
                continue;
            }
            use tar::EntryType as T;
            let found = match entry.header().entry_type() {
                T::Directory => continue,
                T::Regular | T::Continuous => {
                    let mode = entry.header().mode().unwrap_or(0);
                    match wanted(&path, mode) {
                        Some(what) => {
                            let mut data = Data {
                                entry: &mut entry,
                                headers: &headers,
                            };
                            self.read(what, &path, &mut data)?
                        }
                        None => None,
                    }
                }
                T::Link => {
                    // A hard link holds what its target held when it was linked.
                    let target = entry.link_name_bytes().and_then(|t| {
                        (t.len() <= MAX_NAME)
                            .then(|| normalize(&String::from_utf8_lossy(&t)))
                            .flatten()
                    });
                    target.and_then(|t| match upper.get(&t) {
                        Some(found) => found.clone(),
                        None => self.found.get(&t).cloned(),
                    })
                }
                _ => None,
            };
            // Something the catalogers skip matters only where it hides what they kept.
            if found.is_some() || self.holds(&path) || upper.contains_key(&path) {
                upper.insert(path, found);
            }
        }
        for path in whiteouts {
            self.remove_subtree(&path, true);
        }
        for dir in opaques {
            self.remove_subtree(&dir, false);
        }
        for (path, found) in upper {
            self.remove_subtree(&path, true);
            if let Some(found) = found {
                self.found.insert(path, found);
            }
        }
        Ok(())
    }

    /// Whether a kept path is `path` or below it.
    fn holds(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.found.contains_key(path)
            || self
                .found
                .range(prefix.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    fn remove_subtree(&mut self, path: &str, include_self: bool) {
        if include_self {
            self.found.remove(path);
        }
        for key in below(&self.found, path) {
            self.found.remove(&key);
        }
    }

    /// Reads a wanted file's contents (the entry's data, streamed).
    fn read(
        &mut self,
        what: Wanted,
        path: &str,
        entry: &mut impl Read,
    ) -> Result<Option<Found>, Stop> {
        let source = format!("/{path}");
        let small = |entry: &mut dyn Read| -> io::Result<Option<Vec<u8>>> {
            let mut bytes = Vec::new();
            entry.take(MAX_DATABASE + 1).read_to_end(&mut bytes)?;
            Ok((bytes.len() as u64 <= MAX_DATABASE).then_some(bytes))
        };
        let too_large = || {
            Found::NotRead(format!(
                "{source} is larger than {} MiB; not read",
                MAX_DATABASE >> 20
            ))
        };
        Ok(Some(match what {
            Wanted::Dpkg => match small(entry)? {
                Some(bytes) => Found::Packages(dpkg::parse(&bytes, &source), None),
                None => too_large(),
            },
            Wanted::Apk => match small(entry)? {
                Some(bytes) => Found::Packages(apk::parse(&bytes, &source), None),
                None => too_large(),
            },
            Wanted::OsRelease => match small(entry)? {
                Some(bytes) => Found::OsRelease(os_release::parse(&bytes)),
                None => too_large(),
            },
            Wanted::Rpm => return rpm_sqlite(&source, entry),
            Wanted::Unread(what) => {
                Found::NotRead(format!("{source} is {what}, which is not read"))
            }
            Wanted::Binary => return self.binary(&source, entry),
        }))
    }

    /// An executable file: if it is an ELF, spooled to the temporary file and read for
    /// embedded packages.
    fn binary(&mut self, source: &str, entry: &mut impl Read) -> Result<Option<Found>, Stop> {
        let mut magic = [0u8; 4];
        let mut n = 0;
        while n < magic.len() {
            match entry.read(&mut magic[n..])? {
                0 => return Ok(None),
                k => n += k,
            }
        }
        if &magic != b"\x7fELF" {
            return Ok(None);
        }
        let spool = match &mut self.spool {
            Some(file) => file,
            empty => empty.insert(tempfile::tempfile()?),
        };
        spool.set_len(0)?;
        spool.seek(SeekFrom::Start(0))?;
        spool.write_all(&magic)?;
        let copied = io::copy(&mut entry.take(MAX_BINARY), spool)?;
        if copied == MAX_BINARY {
            return Ok(Some(Found::NotRead(format!(
                "{source} is larger than {} GiB; not read for embedded packages",
                MAX_BINARY >> 30
            ))));
        }
        Ok(match binary::packages(spool, source)? {
            Ok(packages) if packages.is_empty() => None,
            Ok(packages) => Some(Found::Packages(packages, None)),
            Err(why) => Some(Found::NotRead(format!("{source} {why}"))),
        })
    }
}

/// An RPM sqlite database: spooled to a temporary file of its own (SQLite opens a path),
/// which is gone when this returns.
fn rpm_sqlite(source: &str, entry: &mut impl Read) -> Result<Option<Found>, Stop> {
    let mut spool = tempfile::NamedTempFile::new()?;
    let copied = io::copy(&mut entry.take(MAX_RPMDB + 1), spool.as_file_mut())?;
    if copied > MAX_RPMDB {
        return Ok(Some(Found::NotRead(format!(
            "{source} is larger than {} MiB; not read",
            MAX_RPMDB >> 20
        ))));
    }
    Ok(Some(match rpm::read(spool.path(), source) {
        Ok((packages, not_read)) => Found::Packages(packages, not_read),
        Err(why) => Found::NotRead(format!("{source} {why}")),
    }))
}

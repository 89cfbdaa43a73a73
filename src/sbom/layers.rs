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
use std::collections::{BTreeMap, HashSet};
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

/// What one layer holds for the catalogers, read on its own: what it puts at the paths
/// they keep, and what it hides of the layers below. Its digest names it, so a layer that
/// several images (or platforms) share is read once and laid over each one's lower layers.
#[derive(Debug, Default)]
pub struct LayerFacts {
    /// The kept paths this layer puts something at.
    kept: BTreeMap<String, Held>,
    /// The other non-directory paths it puts something at, hashed: each hides what lower
    /// layers kept at it and below it. Hashes, not names, so a layer of a million files
    /// costs 8 MiB, not its listing (a collision, at 64 bits, is not a practical risk).
    hides: HashSet<u64>,
    whiteouts: Vec<String>,
    opaques: Vec<String>,
}

/// What a layer puts at a kept path.
#[derive(Debug, Clone)]
enum Held {
    Found(Found),
    /// A hard link to a path the layer itself does not hold: it holds what the layers
    /// below hold there.
    LinkBelow(String),
}

fn path_hash(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same path hashes alike in every layer.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut hasher);
    hasher.finish()
}

/// `path` and every directory above it.
fn self_and_parents(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| match p.rfind('/') {
        Some(i) => Some(&p[..i]),
        None => None,
    })
}

/// The merged view of the layers laid so far, for the paths the catalogers keep.
#[derive(Default)]
pub(super) struct Tree {
    pub(super) found: BTreeMap<String, Found>,
}

impl Tree {
    /// Lays one layer over the layers below.
    pub(super) fn lay(&mut self, layer: &LayerFacts) {
        // A hard link holds what its target held when it was linked: below this layer.
        let linked: Vec<(&String, Option<Found>)> = layer
            .kept
            .iter()
            .map(|(path, held)| match held {
                Held::Found(found) => (path, Some(found.clone())),
                Held::LinkBelow(target) => (path, self.found.get(target).cloned()),
            })
            .collect();
        for path in &layer.whiteouts {
            self.remove_subtree(path, true);
        }
        for dir in &layer.opaques {
            self.remove_subtree(dir, false);
        }
        if !layer.hides.is_empty() {
            self.found.retain(|kept, _| {
                !self_and_parents(kept).any(|p| layer.hides.contains(&path_hash(p)))
            });
        }
        for (path, found) in linked {
            self.remove_subtree(path, true);
            if let Some(found) = found {
                self.found.insert(path.clone(), found);
            }
        }
    }

    fn remove_subtree(&mut self, path: &str, include_self: bool) {
        if include_self {
            self.found.remove(path);
        }
        for key in below(&self.found, path) {
            self.found.remove(&key);
        }
    }
}

impl LayerFacts {
    /// Reads one (decompressed) layer tar.
    pub(super) fn read(reader: impl Read) -> Result<LayerFacts, Stop> {
        let reader = Metered::new(reader, MAX_ENTRY_HEADERS);
        let headers = reader.counter();
        let mut archive = tar::Archive::new(reader);
        let mut facts = LayerFacts::default();
        // Where binaries are spooled, made at the first one.
        let mut spool = None;
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
                facts.opaques.push(dir.to_string());
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                if !hidden.is_empty() {
                    facts.whiteouts.push(join(dir, hidden));
                }
                continue;
            }
            use tar::EntryType as T;
            let held = match entry.header().entry_type() {
                T::Directory => continue,
                T::Regular | T::Continuous => {
                    let mode = entry.header().mode().unwrap_or(0);
                    match wanted(&path, mode) {
                        Some(what) => {
                            let mut data = Data {
                                entry: &mut entry,
                                headers: &headers,
                            };
                            read_file(what, &path, &mut data, &mut spool)?.map(Held::Found)
                        }
                        None => None,
                    }
                }
                T::Link => {
                    let target = entry.link_name_bytes().and_then(|t| {
                        (t.len() <= MAX_NAME)
                            .then(|| normalize(&String::from_utf8_lossy(&t)))
                            .flatten()
                    });
                    target.and_then(|t| match facts.kept.get(&t) {
                        Some(held) => Some(held.clone()),
                        None if facts.hides.contains(&path_hash(&t)) => None,
                        None => Some(Held::LinkBelow(t)),
                    })
                }
                _ => None,
            };
            match held {
                Some(held) => {
                    facts.kept.insert(path, held);
                }
                None => {
                    facts.kept.remove(&path);
                    facts.hides.insert(path_hash(&path));
                }
            }
        }
        Ok(facts)
    }
}

/// Reads a wanted file's contents (the entry's data, streamed).
fn read_file(
    what: Wanted,
    path: &str,
    entry: &mut impl Read,
    spool: &mut Option<std::fs::File>,
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
        Wanted::Unread(what) => Found::NotRead(format!("{source} is {what}, which is not read")),
        Wanted::Binary => return binary(&source, entry, spool),
    }))
}

/// An executable file: if it is an ELF, spooled to the temporary file and read for
/// embedded packages.
fn binary(
    source: &str,
    entry: &mut impl Read,
    spool: &mut Option<std::fs::File>,
) -> Result<Option<Found>, Stop> {
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
    let spool = match spool {
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

//! The walk, as fsutil's: include/exclude filters, lexical order, Go's FileMode bits.

use super::*;

/// Include and exclude patterns, as fsutil's FilterOpt with BuildKit's metadata applied;
/// the default lets everything through.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub(super) include: Option<Matcher>,
    pub(super) exclude: Option<Matcher>,
    /// No include pattern has wildcards before a trailing `/**` or `/*`, so an unmatched
    /// directory that no pattern names a prefix of can be skipped whole.
    only_prefix_includes: bool,
    /// The same for the `!` exceptions among the exclude patterns.
    only_prefix_exclude_exceptions: bool,
}

impl Filter {
    /// Compiles the patterns (patternmatcher syntax: `*`, `?`, `[...]`, `**`, `!` for an
    /// exception) and resolves `follow_paths` against `root`: each path, and every symlink
    /// along it, becomes an include pattern; links resolve inside `root` as if it were `/`.
    /// Reads links under `root`, so call it off the async runtime.
    pub fn new(
        root: &Path,
        include_patterns: &[String],
        exclude_patterns: &[String],
        follow_paths: &[String],
    ) -> Result<Self, SyncError> {
        let mut includes = include_patterns.to_vec();
        if !follow_paths.is_empty() {
            // `None` means a followpath resolved to the root: it adds nothing.
            if let Some(targets) = follow_links(root, follow_paths)? {
                includes.extend(targets);
                includes = dedupe_paths(&includes).unwrap_or_default();
            }
        }
        let include = (!includes.is_empty())
            .then(|| Matcher::new(&includes, "include"))
            .transpose()?;
        let exclude = (!exclude_patterns.is_empty())
            .then(|| Matcher::new(exclude_patterns, "exclude"))
            .transpose()?;
        let prefix_only = |matcher: &Option<Matcher>, exclusions: bool| {
            matcher.as_ref().is_none_or(|m| {
                m.patterns
                    .iter()
                    .filter(|p| p.exclusion == exclusions)
                    .all(|p| !without_trailing_glob(&p.text).contains(PATTERN_CHARS))
            })
        };
        Ok(Filter {
            only_prefix_includes: prefix_only(&include, false),
            only_prefix_exclude_exceptions: prefix_only(&exclude, true),
            include,
            exclude,
        })
    }
}

impl Filter {
    /// Whether fsutil's filtered file system opens `path` for its content. It decides with
    /// patternmatcher's MatchesOrParentMatches, which re-checks every pattern against every
    /// parent, where the walk reuses parents' results and skips patterns that cannot change
    /// the outcome so far; the two disagree (`src`, `!src/src`, `src` lists
    /// `src/src/keep.txt` but refuses to open it), and the Docker CLI then sends the file
    /// empty. polyarch sends what the Docker CLI sends, so an ignored file's content never
    /// leaves the machine.
    pub fn opens(&self, path: &str) -> bool {
        self.include
            .as_ref()
            .is_none_or(|m| m.matches_or_parent_matches(path))
            && self
                .exclude
                .as_ref()
                .is_none_or(|m| !m.matches_or_parent_matches(path))
    }
}

/// Characters that make fsutil treat a pattern as more than a path prefix.
const PATTERN_CHARS: &[char] = &['*', '[', ']', '?', '^', '\\'];

pub(super) fn without_trailing_glob(pattern: &str) -> &str {
    let pattern = pattern.strip_suffix("/**").unwrap_or(pattern);
    pattern.strip_suffix("/*").unwrap_or(pattern)
}

/// fsutil's dedupePaths: drops paths under the previous kept one; `None` if the root (`.`)
/// is among them, which means no filtering at all.
pub(super) fn dedupe_paths(paths: &[String]) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    let mut last = String::new();
    for path in paths {
        if path == "." {
            return None;
        }
        if path.starts_with(&format!("{last}/")) {
            continue;
        }
        out.push(path.clone());
        last = path.clone();
    }
    Some(out)
}

/// Walks `root` in fsutil's order and hands each entry's stat to `emit`: entries of a
/// directory sorted by name bytes, each directory before its children (what the receiver's
/// order check and its own walk expect). Symlinks are never followed.
pub(super) fn walk_tree(
    root: &Path,
    filter: &Filter,
    emit: &mut dyn FnMut(Stat, &Metadata) -> Result<(), SyncError>,
) -> Result<(), SyncError> {
    Walker {
        root,
        filter,
        emit,
        hardlinks: HashMap::new(),
        pending: Vec::new(),
    }
    .walk_dir(&[], None, None, false)
}

struct Walker<'a> {
    pub(super) root: &'a Path,
    pub(super) filter: &'a Filter,
    pub(super) emit: &'a mut dyn FnMut(Stat, &Metadata) -> Result<(), SyncError>,
    /// First path sent for each multiply-linked inode; later links name it as linkname.
    hardlinks: HashMap<(u64, u64), String>,
    /// The directories above the current entry; filtered-out ones are sent just before
    /// their first sent descendant, so the receiver always sees parents first.
    pub(super) pending: Vec<PendingDir>,
}

struct PendingDir {
    pub(super) rel: Vec<u8>,
    pub(super) meta: Metadata,
    pub(super) sent: bool,
}

impl Walker<'_> {
    pub(super) fn abs(&self, rel: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(rel))
    }

    fn walk_dir(
        &mut self,
        dir: &[u8],
        include_parent: Option<&[bool]>,
        exclude_parent: Option<&[bool]>,
        filtered_out: bool,
    ) -> Result<(), SyncError> {
        let abs = self.abs(dir);
        let names = match read_sorted(&abs) {
            Ok(names) => names,
            // Gone since it was listed: fsutil skips it.
            Err(e) if is_not_exist(&e) => return Ok(()),
            // fsutil tolerates unreadable directories only when they are filtered out.
            Err(e) if filtered_out && e.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
            Err(e) => return Err(SyncError::io(&abs, e)),
        };
        for (name, file_type) in names {
            let mut rel = dir.to_vec();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
            let is_dir = file_type.is_dir();
            let text = String::from_utf8_lossy(&rel);
            let Some(Verdict {
                skip,
                include_info,
                exclude_info,
            }) = self.judge(&text, is_dir, include_parent, exclude_parent)
            else {
                continue;
            };
            if skip && !is_dir {
                continue;
            }

            let abs = self.abs(&rel);
            let meta = match fs::symlink_metadata(&abs) {
                Ok(meta) => meta,
                Err(e) if is_not_exist(&e) => continue,
                Err(e) => return Err(SyncError::io(&abs, e)),
            };
            if !skip {
                self.send_pending()?;
                let stat = make_stat(self.root, &rel, &meta, &mut self.hardlinks)?;
                (self.emit)(stat, &meta)?;
            }
            // lstat, not the listing, decides: a directory swapped for a link is not entered.
            if is_dir && meta.is_dir() {
                self.pending.push(PendingDir {
                    rel: rel.clone(),
                    meta,
                    sent: !skip,
                });
                let result = self.walk_dir(&rel, Some(&include_info), Some(&exclude_info), skip);
                self.pending.pop();
                result?;
            }
        }
        Ok(())
    }

    /// What the filter makes of one entry; `None` when nothing below a directory can
    /// match, so it is not even entered.
    fn judge(
        &self,
        text: &str,
        is_dir: bool,
        include_parent: Option<&[bool]>,
        exclude_parent: Option<&[bool]>,
    ) -> Option<Verdict> {
        let mut verdict = Verdict::default();
        if let Some(matcher) = &self.filter.include {
            let (matched, info) = matcher.matches(text, include_parent);
            if !matched {
                if is_dir
                    && self.filter.only_prefix_includes
                    && !matcher.may_match_inside(text, false)
                {
                    return None;
                }
                verdict.skip = true;
            }
            verdict.include_info = info;
        }
        if let Some(matcher) = &self.filter.exclude {
            let (matched, info) = matcher.matches(text, exclude_parent);
            if matched {
                if is_dir
                    && self.filter.only_prefix_exclude_exceptions
                    && !matcher.may_match_inside(text, true)
                {
                    return None;
                }
                verdict.skip = true;
            }
            verdict.exclude_info = info;
        }
        Some(verdict)
    }

    fn send_pending(&mut self) -> Result<(), SyncError> {
        for dir in self.pending.iter_mut().filter(|d| !d.sent) {
            let stat = make_stat(self.root, &dir.rel, &dir.meta, &mut self.hardlinks)?;
            (self.emit)(stat, &dir.meta)?;
            dir.sent = true;
        }
        Ok(())
    }
}

/// An entry the walk enters: whether it is itself left out (`skip`: not sent, though a
/// directory is still entered for the exceptions below it) and the pattern state its
/// children are matched against.
#[derive(Default)]
struct Verdict {
    skip: bool,
    include_info: Vec<bool>,
    exclude_info: Vec<bool>,
}

pub(super) fn is_not_exist(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// A directory's entries sorted by name bytes, as Go's os.ReadDir returns them.
pub(super) fn read_sorted(dir: &Path) -> io::Result<Vec<(Vec<u8>, fs::FileType)>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        match entry.file_type() {
            Ok(file_type) => entries.push((entry.file_name().as_bytes().to_vec(), file_type)),
            Err(e) if is_not_exist(&e) => {}
            Err(e) => return Err(e),
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

fn utf8(bytes: &[u8]) -> Result<String, SyncError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|e| SyncError::NotUtf8(PathBuf::from(OsStr::from_bytes(e.as_bytes()))))
}

/// The stat fsutil's mkstat makes from an lstat.
pub(super) fn make_stat(
    root: &Path,
    rel: &[u8],
    meta: &Metadata,
    hardlinks: &mut HashMap<(u64, u64), String>,
) -> Result<Stat, SyncError> {
    let path = utf8(rel)?;
    let file_type = meta.file_type();
    let mut stat = Stat {
        path,
        mode: go_mode(meta),
        uid: meta.uid(),
        gid: meta.gid(),
        mod_time: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        ..Default::default()
    };
    if !file_type.is_dir() {
        stat.size = i64::try_from(meta.len()).unwrap_or(i64::MAX);
        if file_type.is_block_device() || file_type.is_char_device() {
            let (major, minor) = dev_major_minor(meta.rdev());
            stat.devmajor = major;
            stat.devminor = minor;
        }
        // A second name for an inode already sent goes as a hard link to the first.
        if meta.nlink() > 1 {
            match hardlinks.entry((meta.dev(), meta.ino())) {
                Entry::Occupied(first) => stat.linkname = first.get().clone(),
                Entry::Vacant(slot) => {
                    slot.insert(stat.path.clone());
                }
            }
        }
        if file_type.is_symlink() {
            let abs = root.join(OsStr::from_bytes(rel));
            let target = fs::read_link(&abs).map_err(|e| SyncError::io(&abs, e))?;
            stat.linkname = utf8(target.as_os_str().as_bytes())?;
        }
    }
    Ok(stat)
}

/// Go's os.FileMode for an lstat: permission bits plus Go's own type and special bits.
fn go_mode(meta: &Metadata) -> u32 {
    let unix = meta.mode();
    let file_type = meta.file_type();
    let mut mode = unix & 0o777;
    if file_type.is_dir() {
        mode |= MODE_DIR;
    } else if file_type.is_symlink() {
        mode |= MODE_SYMLINK;
    } else if file_type.is_fifo() {
        mode |= MODE_NAMED_PIPE;
    } else if file_type.is_block_device() {
        mode |= MODE_DEVICE;
    } else if file_type.is_char_device() {
        mode |= MODE_DEVICE | MODE_CHAR_DEVICE;
    }
    // Sockets get no type bit: fsutil clears ModeSocket since archive/tar cannot store it.
    if unix & 0o4000 != 0 {
        mode |= MODE_SETUID;
    }
    if unix & 0o2000 != 0 {
        mode |= MODE_SETGID;
    }
    if unix & 0o1000 != 0 {
        mode |= MODE_STICKY;
    }
    mode
}

/// fsutil's major/minor split of st_rdev (Linux's traditional encoding).
fn dev_major_minor(rdev: u64) -> (i64, i64) {
    let major = (rdev >> 8) & 0xfff;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    (major as i64, minor as i64)
}

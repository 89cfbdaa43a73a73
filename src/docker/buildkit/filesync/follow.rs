//! followpaths, with fsutil's FollowLinks semantics.

use super::*;

/// Every followpath and every symlink met along it, resolved inside `root`, sorted and
/// deduplicated; `None` when one resolves to the root itself.
pub(super) fn follow_links(
    root: &Path,
    paths: &[String],
) -> Result<Option<Vec<String>>, SyncError> {
    let mut resolver = LinkResolver {
        root,
        resolved: BTreeSet::new(),
    };
    for path in paths {
        resolver.resolve(path)?;
    }
    let resolved: Vec<String> = resolver.resolved.into_iter().collect();
    Ok(dedupe_paths(&resolved))
}

struct LinkResolver<'a> {
    pub(super) root: &'a Path,
    pub(super) resolved: BTreeSet<String>,
}

impl LinkResolver<'_> {
    /// Walks `path` a component at a time; at a symlink, records it and continues from its
    /// target. Each symlink is followed once, which ends loops.
    pub(super) fn resolve(&mut self, path: &str) -> Result<(), SyncError> {
        let mut rest = go_join(".", path);
        let mut current = ".".to_string();
        loop {
            let (first, tail) = rest.split_once('/').unwrap_or((&rest, ""));
            current = go_join(&current, first);
            let tail = tail.to_string();
            let targets = self.read_symlink(&current, true)?;
            rest = tail;
            if (rest.is_empty() || !targets.is_empty()) && self.resolved.contains(&current) {
                return Ok(());
            }
            if !targets.is_empty() {
                self.resolved.insert(current);
                for target in targets {
                    // Targets are rooted at `/`; joining with "." makes them root-relative.
                    self.resolve(&go_join(&target, &rest))?;
                }
                return Ok(());
            }
            if rest.is_empty() {
                self.resolved.insert(current);
                return Ok(());
            }
        }
    }

    /// The targets of the symlink at `path` (several when its last component is a
    /// wildcard), each as an absolute path within the root; empty if it is not a symlink.
    fn read_symlink(&self, path: &str, wildcards: bool) -> Result<Vec<String>, SyncError> {
        let (dir, base) = split_dir_base(path);
        if wildcards && contains_wildcards(base) {
            let mut targets = Vec::new();
            if let Some(glob) = glob_tokens(base) {
                for name in self.list_dir(dir)? {
                    if match_tokens(&glob, &name) {
                        targets.extend(self.read_symlink(&go_join(dir, &name), false)?);
                    }
                }
            }
            return Ok(targets);
        }
        let Some(meta) = self.lstat(path)? else {
            return Ok(Vec::new());
        };
        if !meta.file_type().is_symlink() {
            return Ok(Vec::new());
        }
        let abs = self.root.join(path);
        let link = fs::read_link(&abs).map_err(|e| SyncError::io(&abs, e))?;
        let link = go_clean(&link.to_string_lossy());
        Ok(vec![if link.starts_with('/') {
            link
        } else {
            go_join("/", &go_join(dir, &link))
        }])
    }

    /// lstat of a root-relative path, refusing to pass through a symlink or out of the
    /// root on the way; `None` when there is nothing there.
    pub(super) fn lstat(&self, path: &str) -> Result<Option<Metadata>, SyncError> {
        if path == "." || path == ".." || path.starts_with("../") {
            return Ok(None);
        }
        let mut abs = self.root.to_path_buf();
        let components: Vec<&str> = path.split('/').collect();
        for (i, component) in components.iter().enumerate() {
            abs.push(component);
            let meta = match fs::symlink_metadata(&abs) {
                Ok(meta) => meta,
                Err(e) if is_not_exist(&e) => return Ok(None),
                Err(e) => return Err(SyncError::io(&abs, e)),
            };
            if i + 1 == components.len() {
                return Ok(Some(meta));
            }
            if !meta.is_dir() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Names in a root-relative directory, sorted; empty if it is not a directory.
    fn list_dir(&self, dir: &str) -> Result<Vec<String>, SyncError> {
        let abs = if dir == "." {
            self.root.to_path_buf()
        } else {
            match self.lstat(dir)? {
                Some(meta) if meta.is_dir() => self.root.join(dir),
                _ => return Ok(Vec::new()),
            }
        };
        match read_sorted(&abs) {
            Ok(entries) => Ok(entries
                .into_iter()
                .map(|(name, _)| String::from_utf8_lossy(&name).into_owned())
                .collect()),
            Err(e) if is_not_exist(&e) => Ok(Vec::new()),
            Err(e) => Err(SyncError::io(&abs, e)),
        }
    }
}

/// fsutil's containsWildcards: `*`, `?` or `[` not escaped by a backslash.
fn contains_wildcards(name: &str) -> bool {
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

/// A single path component's glob as Go's filepath.Match reads it; `None` when malformed,
/// which filepath.Match reports as no match.
fn glob_tokens(pattern: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut pos = 0;
    while pos < chars.len() {
        let ch = chars[pos];
        pos += 1;
        match ch {
            '*' => tokens.push(Token::AnyRun),
            '?' => tokens.push(Token::AnyOne),
            '\\' => {
                tokens.push(Token::Char(*chars.get(pos)?));
                pos += 1;
            }
            '[' => {
                let (class, next) = parse_class(&chars, pos).ok()?;
                tokens.push(class);
                pos = next;
            }
            other => tokens.push(Token::Char(other)),
        }
    }
    Some(tokens)
}

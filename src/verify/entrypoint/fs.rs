//! The merged filesystem of an image's layers, as an in-memory index of paths (never
//! extracted), and path resolution the way the kernel does it.

use super::*;
use crate::base::image_path::{self, join, split_parent};
use crate::base::layer_stream::{Metered, Stop};
use std::borrow::Cow;

#[derive(Debug, Clone)]
pub(super) enum Node {
    Dir,
    File {
        mode: u32,
        size: u64,
        /// `None` when the retention cap was reached before this file.
        head: Option<Vec<u8>>,
    },
    Symlink(String),
    Other(&'static str),
}

static IMPLICIT_DIR: Node = Node::Dir;

pub(super) struct Fs {
    /// What the index may hold ([`LIMITS`] outside tests).
    pub(super) limits: Limits,
    /// Normalised paths (`usr/bin/env`, no leading `/`) to nodes; the root is implicit.
    nodes: BTreeMap<String, Node>,
    /// Bytes of file heads kept.
    retained: usize,
    /// Bytes of the paths and symlink targets in `nodes`.
    name_bytes: usize,
}

/// The paths (and their bytes) the layer being read adds to the index.
#[derive(Default)]
struct Pending {
    paths: usize,
    bytes: usize,
}

/// What a node adds to its path's bytes in the index's name budget: a symlink's target.
fn target_bytes(node: &Node) -> usize {
    match node {
        Node::Symlink(target) => target.len(),
        _ => 0,
    }
}

/// A name or link target read from a layer, refused past PATH_MAX.
fn capped<'a>(bytes: Cow<'a, [u8]>, limit: LayerLimit) -> Result<Cow<'a, [u8]>, Stop> {
    if bytes.len() > MAX_NAME {
        return Err(Stop::Refused(limit));
    }
    Ok(bytes)
}

/// An entry name in a layer, cleaned; `None` for the root itself or a name climbing out.
fn normalize(path: &str) -> Option<String> {
    image_path::normalize(path).filter(|p| !p.is_empty())
}

#[derive(Debug)]
pub(super) enum ResolveError {
    NotFound(String),
    NotDir(String),
    Loop,
}

impl ResolveError {
    pub(super) fn describe(&self, path: &str) -> String {
        match self {
            ResolveError::NotFound(at)
                if at.trim_start_matches('/') == path.trim_start_matches('/') =>
            {
                format!("{path} does not exist in the image")
            }
            ResolveError::NotFound(at) => {
                format!("{path} does not exist in the image (/{at} is missing)")
            }
            ResolveError::NotDir(at) => {
                format!("{path} does not exist in the image (/{at} is not a directory)")
            }
            ResolveError::Loop => {
                format!("{path}: too many levels of symbolic links (more than {MAX_SYMLINKS})")
            }
        }
    }
}

impl Fs {
    pub(super) fn new(limits: Limits) -> Fs {
        Fs {
            limits,
            nodes: BTreeMap::new(),
            retained: 0,
            name_bytes: 0,
        }
    }

    fn take_prefix(&mut self, limit: u64) -> bool {
        let limit = limit as usize;
        if self.retained.saturating_add(limit) > self.limits.retained {
            return false;
        }
        self.retained += limit;
        true
    }

    fn has_children(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.nodes
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    /// Counts what the layer being read adds to the index against its budgets.
    fn admit(&self, pending: &mut Pending, paths: usize, bytes: usize) -> Result<(), Stop> {
        pending.paths += paths;
        pending.bytes += bytes;
        if self.nodes.len() + pending.paths > self.limits.paths {
            return Err(Stop::Refused(LayerLimit::Paths {
                limit: self.limits.paths,
            }));
        }
        if self.name_bytes + pending.bytes > self.limits.name_bytes {
            return Err(Stop::Refused(LayerLimit::NameBytes {
                limit: self.limits.name_bytes,
            }));
        }
        Ok(())
    }

    fn insert(&mut self, path: String, node: Node) {
        let len = path.len();
        self.name_bytes += len + target_bytes(&node);
        if let Some(old) = self.nodes.insert(path, node) {
            self.name_bytes -= len + target_bytes(&old);
        }
    }

    fn remove(&mut self, path: &str) {
        if let Some(old) = self.nodes.remove(path) {
            self.name_bytes -= path.len() + target_bytes(&old);
        }
    }

    fn remove_subtree(&mut self, path: &str, include_self: bool) {
        if include_self {
            self.remove(path);
        }
        for key in image_path::below(&self.nodes, path) {
            self.remove(&key);
        }
    }

    /// Reads one layer tar, then applies its whiteouts to the lower layers and merges it.
    pub(super) fn apply_layer(&mut self, reader: impl Read) -> Result<(), Stop> {
        let reader = Metered::new(reader, self.limits.entry_headers);
        let headers = reader.counter();
        let mut archive = tar::Archive::new(reader);
        let mut upper: BTreeMap<String, Node> = BTreeMap::new();
        let mut whiteouts = Vec::new();
        let mut opaques = Vec::new();
        let mut pending = Pending::default();
        let mut entries = archive.entries_with_seek()?;
        loop {
            // Only what the tar crate reads to find the next entry counts.
            headers.set(0);
            let Some(entry) = entries.next() else { break };
            headers.set(0);
            let mut entry = entry?;
            let raw = capped(entry.path_bytes(), LayerLimit::Name { limit: MAX_NAME })?;
            let Some(path) = normalize(&String::from_utf8_lossy(&raw)) else {
                continue;
            };
            let (dir, name) = split_parent(&path);
            if name == ".wh..wh..opq" {
                self.admit(&mut pending, 1, dir.len())?;
                opaques.push(dir.to_string());
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                if !hidden.is_empty() {
                    self.admit(&mut pending, 1, path.len())?;
                    whiteouts.push(join(dir, hidden));
                }
                continue;
            }
            use tar::EntryType as T;
            let kind = entry.header().entry_type();
            let link = LayerLimit::LinkTarget { limit: MAX_NAME };
            let node = match kind {
                T::Regular | T::Continuous | T::GNUSparse => self.file_node(&mut entry)?,
                T::Directory => Node::Dir,
                T::Symlink => {
                    let target = match entry.link_name_bytes() {
                        Some(t) => String::from_utf8_lossy(&capped(t, link)?).into_owned(),
                        None => String::new(),
                    };
                    Node::Symlink(target)
                }
                T::Link => {
                    // A hard link shares the content its target had when it was linked.
                    let target = match entry.link_name_bytes() {
                        Some(t) => normalize(&String::from_utf8_lossy(&capped(t, link)?)),
                        None => None,
                    };
                    let found = target
                        .as_ref()
                        .and_then(|t| upper.get(t).or_else(|| self.nodes.get(t)))
                        .cloned();
                    match found {
                        Some(node) => self.linked(node),
                        None => continue,
                    }
                }
                T::Char => Node::Other("a character device"),
                T::Block => Node::Other("a block device"),
                T::Fifo => Node::Other("a FIFO"),
                _ => continue,
            };
            // A path the index holds already costs no new path (nor its name) when laid over.
            let fresh = usize::from(!self.nodes.contains_key(&path));
            let len = fresh * path.len();
            self.admit(&mut pending, fresh, len + target_bytes(&node))?;
            if let Some(old) = upper.insert(path, node) {
                // A path given twice in one layer is kept once.
                pending.paths -= fresh;
                pending.bytes -= len + target_bytes(&old);
            }
        }
        self.lay_over(upper, whiteouts, opaques);
        Ok(())
    }

    /// A hard link's node: a file's head is kept once more, so it counts once more.
    fn linked(&mut self, node: Node) -> Node {
        match node {
            Node::File {
                mode,
                size,
                head: Some(head),
            } if !self.take_prefix(head.len() as u64) => Node::File {
                mode,
                size,
                head: None,
            },
            node => node,
        }
    }

    /// A regular file, with as much of its head as the inspection may still keep.
    fn file_node<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> io::Result<Node> {
        let mode = entry.header().mode().unwrap_or(0);
        let size = entry.size();
        let limit = if mode & 0o111 != 0 {
            EXEC_PREFIX
        } else {
            OTHER_PREFIX
        }
        .min(size);
        let head = if self.take_prefix(limit) {
            let mut head = Vec::with_capacity(limit as usize);
            entry.take(limit).read_to_end(&mut head)?;
            Some(head)
        } else {
            None
        };
        Ok(Node::File { mode, size, head })
    }

    /// One layer's entries over the layers below: whiteouts and opaque directories first
    /// remove what they hide, then the layer's own entries are laid over.
    fn lay_over(
        &mut self,
        upper: BTreeMap<String, Node>,
        whiteouts: Vec<String>,
        opaques: Vec<String>,
    ) {
        for path in whiteouts {
            self.remove_subtree(&path, true);
        }
        for dir in opaques {
            self.remove_subtree(&dir, false);
        }
        for (path, node) in upper {
            if !matches!(node, Node::Dir) {
                // A non-directory in an upper layer hides a lower directory's contents.
                self.remove_subtree(&path, false);
            } else if matches!(self.nodes.get(&path), Some(Node::Dir)) {
                continue;
            }
            self.insert(path, node);
        }
    }

    /// Resolves `path` (relative ones against `cwd`) inside the image root the way the
    /// kernel does after chroot: `..` and absolute symlink targets are clamped to the root.
    /// Returns the resolved absolute path and its node.
    pub(super) fn resolve(
        &self,
        cwd: &str,
        path: &str,
    ) -> std::result::Result<(String, &Node), ResolveError> {
        let mut queue: VecDeque<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let mut stack: Vec<String> = if path.starts_with('/') {
            Vec::new()
        } else {
            cwd.split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .map(str::to_string)
                .collect()
        };
        let mut hops = 0;
        while let Some(part) = queue.pop_front() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            let candidate = join(&stack.join("/"), &part);
            let last = queue.is_empty();
            match self.nodes.get(&candidate) {
                Some(Node::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(ResolveError::Loop);
                    }
                    if target.is_empty() {
                        return Err(ResolveError::NotFound(candidate));
                    }
                    if target.starts_with('/') {
                        stack.clear();
                    }
                    for p in target.split('/').filter(|p| !p.is_empty()).rev() {
                        queue.push_front(p.to_string());
                    }
                }
                Some(Node::Dir) => stack.push(part),
                Some(_) if last => stack.push(part),
                Some(_) => return Err(ResolveError::NotDir(candidate)),
                None if !last && self.has_children(&candidate) => stack.push(part),
                None => return Err(ResolveError::NotFound(candidate)),
            }
        }
        let key = stack.join("/");
        let node = if key.is_empty() {
            &IMPLICIT_DIR
        } else {
            match self.nodes.get(&key) {
                Some(node) => node,
                None => &IMPLICIT_DIR,
            }
        };
        Ok((format!("/{key}"), node))
    }
}

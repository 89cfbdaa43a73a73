//! What a case is: a build context (with a few files outside it), a Dockerfile, its
//! ignore files, project options and the mutations applied between the first build
//! and the reruns. Plain data (serde), so a shrunk case is saved as JSON under
//! tests/regressions/ and replayed as it is, whatever the generator becomes.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Placeholder in symlink targets for the absolute path of the context directory.
pub const CTX: &str = "@CTX@";
/// Placeholder in symlink targets for the absolute path of the directory beside it.
pub const OUT: &str = "@OUT@";

/// A file's content, kept small in JSON: large files are generated from a seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Content {
    Text(String),
    /// `len` pseudo-random bytes from splitmix64(`seed`).
    Random {
        len: u64,
        seed: u64,
    },
    /// Debian's static busybox for amd64 (`support::busybox("amd64")`).
    Busybox,
    /// A tar archive (gzip-compressed or not) of small text files, byte-for-byte
    /// reproducible (fixed times and owners).
    Tar {
        gzip: bool,
        members: Vec<TarMember>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TarMember {
    pub path: String,
    pub text: String,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Node {
    File {
        content: Content,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    /// A symlink; `@CTX@` and `@OUT@` in the target are replaced by absolute paths.
    Link {
        target: String,
    },
}

/// One entry. `path` is relative to the context; `../outside/…` is beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub node: Node,
}

/// A change to the tree between the first build and the reruns. A mutation whose path
/// no longer fits (e.g. shrinking removed the file) does nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mutation {
    /// New content for a regular file; `keep_mtime` puts the old modification time back.
    Write {
        path: String,
        content: Content,
        keep_mtime: bool,
    },
    /// Same size, one byte changed (at `at` modulo the length); `keep_mtime` as above.
    FlipByte {
        path: String,
        at: u64,
        keep_mtime: bool,
    },
    /// chmod of a regular file or directory (never through a symlink).
    Chmod { path: String, mode: u32 },
    /// The symlink now points elsewhere.
    Retarget { path: String, target: String },
    /// A new entry (its parents are created 0755).
    Add { entry: Entry },
    /// Removal of a file, symlink or whole directory.
    Remove { path: String },
    /// `.dockerignore` (or, `specific`, `<Dockerfile>.dockerignore`) gets this text, or
    /// is deleted (None).
    SetIgnore {
        specific: bool,
        text: Option<String>,
    },
    /// A new modification time, same content.
    Touch { path: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    pub entries: Vec<Entry>,
    /// Relative to the context.
    pub dockerfile_path: String,
    pub dockerfile: String,
    /// `.dockerignore`
    pub ignore: Option<String>,
    /// `<dockerfile_path>.dockerignore` (BuildKit reads it instead of `.dockerignore`).
    pub specific_ignore: Option<String>,
    pub target: Option<String>,
    pub build_args: BTreeMap<String, String>,
    pub mutations: Vec<Mutation>,
}

impl Case {
    /// Uses features Docker 20.10's built-in Dockerfile frontend lacks (`COPY --link`,
    /// heredocs): such cases need Engine 23+.
    pub fn needs_modern_frontend(&self) -> bool {
        self.dockerfile.contains("--link") || self.dockerfile.contains("<<")
    }

    /// Whether the Dockerfile has a FROM instruction. Docker 20.10's BuildKit panics on a
    /// Dockerfile without one (dockerfile2llb's lastTarget indexes an empty list) and the
    /// whole engine goes down, so such a file is never sent (the shrinker would make it).
    pub fn has_stage(&self) -> bool {
        self.dockerfile.lines().any(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case("FROM"))
        })
    }

    pub fn specific_ignore_path(&self) -> String {
        format!("{}.dockerignore", self.dockerfile_path)
    }

    pub fn ignore_path(&self, specific: bool) -> String {
        if specific {
            self.specific_ignore_path()
        } else {
            ".dockerignore".to_string()
        }
    }
}

/// Where a case is materialised: `root/ctx-NAME` (the context), `root/outside` (beside
/// it). The context's name is that of `root` (unique per case): BuildKit keeps the files
/// it was sent under a key made from the context directory's name (buildx 0.13 on
/// Docker 20.10: a second `ctx` elsewhere is sent as a difference from the first), so a
/// shared name would let one case's transfer leak into another's.
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: PathBuf) -> Layout {
        Layout { root }
    }
    /// The context directory's name.
    pub fn ctx_name(&self) -> String {
        format!(
            "ctx-{}",
            self.root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        )
    }
    pub fn ctx(&self) -> PathBuf {
        self.root.join(self.ctx_name())
    }
    pub fn outside(&self) -> PathBuf {
        self.root.join("outside")
    }
    fn resolve_target(&self, target: &str) -> String {
        target
            .replace(CTX, &self.ctx().to_string_lossy())
            .replace(OUT, &self.outside().to_string_lossy())
    }
    /// A path of the model (relative to the context, may start with `../outside`).
    fn path(&self, relative: &str) -> PathBuf {
        self.ctx().join(relative)
    }
}

pub fn content_bytes(content: &Content) -> Vec<u8> {
    match content {
        Content::Text(t) => t.as_bytes().to_vec(),
        Content::Random { len, seed } => Rng::new(*seed).bytes(*len as usize),
        Content::Busybox => {
            fs::read(crate::support::busybox("amd64")).expect("read busybox fixture")
        }
        Content::Tar { gzip, members } => {
            let mut builder = tar::Builder::new(Vec::new());
            for m in members {
                let mut header = tar::Header::new_gnu();
                header.set_size(m.text.len() as u64);
                header.set_mode(m.mode);
                header.set_mtime(1_600_000_000);
                header.set_uid(0);
                header.set_gid(0);
                header.set_entry_type(tar::EntryType::Regular);
                builder
                    .append_data(&mut header, &m.path, m.text.as_bytes())
                    .expect("tar member");
            }
            let data = builder.into_inner().expect("tar");
            if *gzip {
                let mut enc = flate2::GzBuilder::new()
                    .mtime(0)
                    .write(Vec::new(), flate2::Compression::fast());
                enc.write_all(&data).unwrap();
                enc.finish().unwrap()
            } else {
                data
            }
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Creates the missing parents of `path` with mode 0755 (whatever the umask).
fn make_parents(path: &Path) -> std::io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    if fs::symlink_metadata(parent).is_ok() {
        return Ok(());
    }
    make_parents(parent)?;
    fs::create_dir(parent)?;
    set_mode(parent, 0o755)
}

fn write_entry(layout: &Layout, entry: &Entry) -> std::io::Result<()> {
    let path = layout.path(&entry.path);
    make_parents(&path)?;
    match &entry.node {
        Node::Dir { mode } => {
            if fs::symlink_metadata(&path).is_err() {
                fs::create_dir(&path)?;
            }
            set_mode(&path, *mode)
        }
        Node::File { content, mode } => {
            fs::write(&path, content_bytes(content))?;
            set_mode(&path, *mode)
        }
        Node::Link { target } => std::os::unix::fs::symlink(layout.resolve_target(target), &path),
    }
}

/// Writes the case's tree (before mutations) under `layout.root`.
pub fn materialize(case: &Case, layout: &Layout) {
    fs::create_dir_all(layout.ctx()).unwrap();
    fs::create_dir_all(layout.outside()).unwrap();
    set_mode(&layout.ctx(), 0o755).unwrap();
    set_mode(&layout.outside(), 0o755).unwrap();
    // Directories first (explicit modes are set last, so a 0500 one still gets children).
    let mut entries: Vec<&Entry> = case.entries.iter().collect();
    entries.sort_by_key(|e| match e.node {
        Node::Dir { .. } => 0,
        Node::File { .. } => 1,
        Node::Link { .. } => 2,
    });
    for entry in &entries {
        if let Node::Dir { .. } = entry.node {
            let path = layout.path(&entry.path);
            make_parents(&path).unwrap();
            if fs::symlink_metadata(&path).is_err() {
                fs::create_dir(&path).unwrap();
                set_mode(&path, 0o755).unwrap();
            }
        } else if let Err(e) = write_entry(layout, entry) {
            panic!("materialize {}: {e}", entry.path);
        }
    }
    let df = layout.path(&case.dockerfile_path);
    make_parents(&df).unwrap();
    fs::write(&df, &case.dockerfile).unwrap();
    set_mode(&df, 0o644).unwrap();
    for (specific, text) in [(false, &case.ignore), (true, &case.specific_ignore)] {
        if let Some(text) = text {
            let p = layout.path(&case.ignore_path(specific));
            make_parents(&p).unwrap();
            fs::write(&p, text).unwrap();
            set_mode(&p, 0o644).unwrap();
        }
    }
    for entry in entries.iter().rev() {
        if let Node::Dir { mode } = entry.node {
            set_mode(&layout.path(&entry.path), mode).unwrap();
        }
    }
}

fn is_regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

fn mtime(path: &Path) -> Option<SystemTime> {
    fs::symlink_metadata(path).ok()?.modified().ok()
}

fn restore_mtime(path: &Path, when: Option<SystemTime>) {
    if let (Some(t), Ok(f)) = (when, fs::OpenOptions::new().write(true).open(path)) {
        let _ = f.set_modified(t);
    }
}

/// Applies one mutation to the materialised tree. Returns false when it did not apply
/// (its path is gone or of another kind): a no-op, never an error.
pub fn apply(case: &Case, layout: &Layout, mutation: &Mutation) -> bool {
    let res: std::io::Result<bool> = (|| match mutation {
        Mutation::Write {
            path,
            content,
            keep_mtime,
        } => {
            let p = layout.path(path);
            if !is_regular(&p) {
                return Ok(false);
            }
            let old = mtime(&p);
            fs::write(&p, content_bytes(content))?;
            if *keep_mtime {
                restore_mtime(&p, old);
            }
            Ok(true)
        }
        Mutation::FlipByte {
            path,
            at,
            keep_mtime,
        } => {
            let p = layout.path(path);
            if !is_regular(&p) {
                return Ok(false);
            }
            let old = mtime(&p);
            let mut bytes = fs::read(&p)?;
            if bytes.is_empty() {
                return Ok(false);
            }
            let i = (*at % bytes.len() as u64) as usize;
            // Printable stays printable: flip a low bit.
            bytes[i] ^= 1;
            fs::write(&p, &bytes)?;
            if *keep_mtime {
                restore_mtime(&p, old);
            }
            Ok(true)
        }
        Mutation::Chmod { path, mode } => {
            let p = layout.path(path);
            match fs::symlink_metadata(&p) {
                Ok(m) if !m.file_type().is_symlink() => {
                    set_mode(&p, *mode)?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
        Mutation::Retarget { path, target } => {
            let p = layout.path(path);
            if !fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Ok(false);
            }
            fs::remove_file(&p)?;
            std::os::unix::fs::symlink(layout.resolve_target(target), &p)?;
            Ok(true)
        }
        Mutation::Add { entry } => {
            let p = layout.path(&entry.path);
            if fs::symlink_metadata(&p).is_ok() {
                return Ok(false);
            }
            // A parent that is a file or a link: not applicable.
            let mut ancestor = p.parent();
            while let Some(a) = ancestor {
                if let Ok(m) = fs::symlink_metadata(a) {
                    if !m.is_dir() {
                        return Ok(false);
                    }
                    break;
                }
                ancestor = a.parent();
            }
            write_entry(layout, entry)?;
            Ok(true)
        }
        Mutation::Remove { path } => {
            let p = layout.path(path);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(&p)?,
                Ok(_) => fs::remove_file(&p)?,
                Err(_) => return Ok(false),
            }
            Ok(true)
        }
        Mutation::SetIgnore { specific, text } => {
            let p = layout.path(&case.ignore_path(*specific));
            match text {
                Some(t) => {
                    make_parents(&p)?;
                    fs::write(&p, t)?;
                }
                None => {
                    if fs::symlink_metadata(&p).is_err() {
                        return Ok(false);
                    }
                    fs::remove_file(&p)?;
                }
            }
            Ok(true)
        }
        Mutation::Touch { path } => {
            let p = layout.path(path);
            let Ok(m) = fs::symlink_metadata(&p) else {
                return Ok(false);
            };
            if m.file_type().is_symlink() {
                return Ok(false);
            }
            let when = m.modified()? + Duration::from_secs(3600);
            let f = if m.is_dir() {
                fs::File::open(&p)?
            } else {
                fs::OpenOptions::new().write(true).open(&p)?
            };
            f.set_modified(when)?;
            Ok(true)
        }
    })();
    res.unwrap_or(false)
}

// ------------------------------------------------------------------ describing

fn mode_str(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

fn short_content(content: &Content) -> String {
    match content {
        Content::Text(t) if t.is_empty() => "empty".into(),
        Content::Text(t) if t.len() <= 40 => format!("{t:?}"),
        Content::Text(t) => format!("{} bytes of text {:?}…", t.len(), prefix(t, 30)),
        Content::Random { len, seed } => format!("{len} random bytes (seed {seed:#x})"),
        Content::Busybox => "static busybox (amd64)".into(),
        Content::Tar { gzip, members } => format!(
            "{}tar of [{}]",
            if *gzip { "gzipped " } else { "" },
            members
                .iter()
                .map(|m| format!("{} {} {:?}", m.path, mode_str(m.mode), m.text))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn describe_entry(entry: &Entry) -> String {
    match &entry.node {
        Node::File { content, mode } => {
            format!(
                "{}  file {}  {}",
                entry.path,
                mode_str(*mode),
                short_content(content)
            )
        }
        Node::Dir { mode } => format!("{}/  dir {}", entry.path, mode_str(*mode)),
        Node::Link { target } => format!("{}  -> {}", entry.path, target),
    }
}

pub fn describe_mutation(m: &Mutation) -> String {
    match m {
        Mutation::Write {
            path,
            content,
            keep_mtime,
        } => format!(
            "write {path}: {}{}",
            short_content(content),
            if *keep_mtime { " (mtime kept)" } else { "" }
        ),
        Mutation::FlipByte {
            path,
            at,
            keep_mtime,
        } => format!(
            "flip one bit of {path} at byte {at} mod size (same size){}",
            if *keep_mtime { ", mtime kept" } else { "" }
        ),
        Mutation::Chmod { path, mode } => format!("chmod {} {path}", mode_str(*mode)),
        Mutation::Retarget { path, target } => format!("retarget {path} -> {target}"),
        Mutation::Add { entry } => format!("add {}", describe_entry(entry)),
        Mutation::Remove { path } => format!("remove {path}"),
        Mutation::SetIgnore { specific, text } => {
            format!(
                "{} {}",
                match text {
                    Some(_) => "set",
                    None => "delete",
                },
                if *specific {
                    "<Dockerfile>.dockerignore"
                } else {
                    ".dockerignore"
                },
            ) + &match text {
                Some(t) => format!(" to:\n{}", indent(t, "      | ")),
                None => String::new(),
            }
        }
        Mutation::Touch { path } => format!("touch {path} (mtime +1h, same content)"),
    }
}

fn prefix(t: &str, n: usize) -> &str {
    let mut end = n.min(t.len());
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    &t[..end]
}

pub fn indent(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(prefix);
        out.push_str(line);
        out.push('\n');
    }
    if text.is_empty() {
        out.push_str(prefix);
        out.push_str("(empty)\n");
    }
    out
}

/// The reproduction a human reads: listing, Dockerfile, ignore files, options, mutations.
pub fn describe(case: &Case) -> String {
    let mut out = String::new();
    out.push_str(
        "  context (paths relative to it; ../outside/ is beside it; @CTX@/@OUT@ = their absolute paths):\n",
    );
    let mut entries: Vec<&Entry> = case.entries.iter().collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    for e in entries {
        out.push_str(&format!("    {}\n", describe_entry(e)));
    }
    out.push_str(&format!("  {} (0644):\n", case.dockerfile_path));
    out.push_str(&indent(&case.dockerfile, "    | "));
    for (specific, text) in [(false, &case.ignore), (true, &case.specific_ignore)] {
        if let Some(t) = text {
            out.push_str(&format!("  {}:\n", case.ignore_path(specific)));
            out.push_str(&indent(t, "    | "));
        }
    }
    if let Some(t) = &case.target {
        out.push_str(&format!("  target: {t}\n"));
    }
    if !case.build_args.is_empty() {
        out.push_str(&format!("  build_args: {:?}\n", case.build_args));
    }
    out.push_str("  mutations (after the first build):\n");
    for m in &case.mutations {
        out.push_str(&format!(
            "    - {}\n",
            indent(&describe_mutation(m), "").trim_end()
        ));
    }
    if case.mutations.is_empty() {
        out.push_str("    (none)\n");
    }
    out
}

//! The files of an image in an OCI image layout (a directory, or a tar of one as
//! `docker buildx build --output type=oci` writes: its layers applied in order,
//! whiteouts honoured) or in a root file system tar (`--output type=tar`): each
//! path's type, permission bits, owner, size, link target and content digest. Timestamps, user/group names and extended attributes are not read:
//! those are what the comparison normalises away.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// f file, d directory, l symlink, h hard link, c/b/p devices and fifos
    pub kind: char,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// Regular files only (0 otherwise).
    pub size: u64,
    /// Symlink or hard-link target.
    pub link: String,
    /// sha256 of a regular file's content.
    pub sha: String,
}

impl std::fmt::Display for FileInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:04o} {}:{}",
            self.kind, self.mode, self.uid, self.gid
        )?;
        if self.kind == 'f' {
            write!(f, " {} bytes", self.size)?;
            if !self.sha.is_empty() {
                write!(f, " sha256:{}", &self.sha[..12])?;
            }
        }
        if !self.link.is_empty() {
            write!(f, " -> {}", self.link)?;
        }
        Ok(())
    }
}

pub type Files = BTreeMap<String, FileInfo>;

/// Extracts a tar (an OCI layout as buildx writes it) into `dest`.
pub fn untar(tar_path: &Path, dest: &Path) -> Result<(), String> {
    let f = fs::File::open(tar_path).map_err(|e| format!("{}: {e}", tar_path.display()))?;
    tar::Archive::new(f)
        .unpack(dest)
        .map_err(|e| format!("unpack {}: {e}", tar_path.display()))
}

fn blob(layout: &Path, digest: &str) -> Result<Vec<u8>, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("unsupported digest {digest}"))?;
    let p = layout.join("blobs/sha256").join(hex);
    fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
}

fn json(bytes: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))
}

/// The image manifest for linux/amd64 under an index (skipping attestations).
fn manifest(layout: &Path, index: &Value) -> Result<Value, String> {
    let entries = index["manifests"]
        .as_array()
        .ok_or("index without manifests")?;
    for e in entries {
        if e["annotations"]["vnd.docker.reference.type"].is_string() {
            continue;
        }
        let p = &e["platform"];
        if p.is_object() && (p["architecture"] != "amd64" || p["os"] != "linux") {
            continue;
        }
        let digest = e["digest"].as_str().ok_or("entry without digest")?;
        let body = json(&blob(layout, digest)?)?;
        let media = body["mediaType"]
            .as_str()
            .or(e["mediaType"].as_str())
            .unwrap_or_default();
        if media.contains("index")
            || media.contains("manifest.list")
            || body["manifests"].is_array()
        {
            return manifest(layout, &body);
        }
        return Ok(body);
    }
    Err(format!("no linux/amd64 manifest in {index}"))
}

fn clean(path: &str) -> String {
    let p = path.trim_start_matches("./").trim_start_matches('/');
    p.trim_end_matches('/').to_string()
}

fn remove_under(files: &mut Files, dir: &str, including: bool) {
    let prefix = format!("{dir}/");
    files.retain(|k, _| !(k.starts_with(&prefix) || (including && k == dir)));
}

/// The files of the linux/amd64 image of the OCI layout in `layout`.
pub fn image_files(layout: &Path) -> Result<Files, String> {
    let index =
        json(&fs::read(layout.join("index.json")).map_err(|e| format!("index.json: {e}"))?)?;
    let manifest = manifest(layout, &index)?;
    let mut files = Files::new();
    // BuildKit writes `"layers": null` for an image without layers.
    let layers = match &manifest["layers"] {
        serde_json::Value::Null => Vec::new(),
        layers => layers.as_array().ok_or("manifest without layers")?.clone(),
    };
    for layer in &layers {
        let digest = layer["digest"].as_str().ok_or("layer without digest")?;
        let data = blob(layout, digest)?;
        let reader: Box<dyn Read> = if data.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::MultiGzDecoder::new(&data[..]))
        } else if data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            return Err(format!("layer {digest} is zstd-compressed"));
        } else {
            Box::new(&data[..])
        };
        apply_tar(reader, &mut files).map_err(|e| format!("layer {digest}: {e}"))?;
    }
    resolve_hard_links(&mut files);
    Ok(files)
}

/// The files of a root file system tar (`docker buildx build --output type=tar`).
pub fn rootfs_files(tar_path: &Path) -> Result<Files, String> {
    let f = fs::File::open(tar_path).map_err(|e| format!("{}: {e}", tar_path.display()))?;
    let mut files = Files::new();
    apply_tar(f, &mut files).map_err(|e| format!("{}: {e}", tar_path.display()))?;
    resolve_hard_links(&mut files);
    Ok(files)
}

/// Applies one layer (or a whole file system) tar onto `files`.
fn apply_tar(reader: impl Read, files: &mut Files) -> Result<(), String> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = clean(&entry.path().map_err(|e| e.to_string())?.to_string_lossy());
        if path.is_empty() || path == "." {
            continue;
        }
        let (dir, base) = match path.rfind('/') {
            Some(i) => (path[..i].to_string(), path[i + 1..].to_string()),
            None => (String::new(), path.clone()),
        };
        if base == ".wh..wh..opq" {
            remove_under(files, &dir, false);
            continue;
        }
        if let Some(name) = base.strip_prefix(".wh.") {
            let victim = if dir.is_empty() {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            };
            remove_under(files, &victim, true);
            continue;
        }
        let header = entry.header();
        let kind = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => 'f',
            tar::EntryType::Directory => 'd',
            tar::EntryType::Symlink => 'l',
            tar::EntryType::Link => 'h',
            tar::EntryType::Char => 'c',
            tar::EntryType::Block => 'b',
            tar::EntryType::Fifo => 'p',
            other => return Err(format!("{path}: tar entry type {other:?}")),
        };
        let mode = header.mode().map_err(|e| e.to_string())? & 0o7777;
        let uid = header.uid().map_err(|e| e.to_string())?;
        let gid = header.gid().map_err(|e| e.to_string())?;
        let link_name = entry
            .link_name()
            .map_err(|e| e.to_string())?
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let link = match kind {
            'l' => link_name,
            'h' => clean(&link_name),
            _ => String::new(),
        };
        let (size, sha) = if kind == 'f' {
            let mut h = Sha256::new();
            let n = std::io::copy(&mut entry, &mut h).map_err(|e| e.to_string())?;
            (n, hex::encode(h.finalize()))
        } else {
            (0, String::new())
        };
        // A new entry replaces what was there (a directory keeps its children).
        if kind != 'd' {
            remove_under(files, &path, false);
        }
        files.insert(
            path,
            FileInfo {
                kind,
                mode,
                uid,
                gid,
                size,
                link,
                sha,
            },
        );
    }
    Ok(())
}

/// A hard link is the file it names (exporters differ in which copy is the link).
fn resolve_hard_links(files: &mut Files) {
    let snapshot = files.clone();
    for info in files.values_mut() {
        if info.kind == 'h' {
            if let Some(t) = snapshot.get(&info.link) {
                *info = FileInfo {
                    mode: info.mode,
                    uid: info.uid,
                    gid: info.gid,
                    ..t.clone()
                };
            }
        }
    }
}

/// Differences between two file lists, one line per path.
pub fn diff(a_name: &str, a: &Files, b_name: &str, b: &Files) -> Vec<String> {
    let mut out = vec![];
    for (path, ia) in a {
        match b.get(path) {
            None => out.push(format!("/{path}: only in {a_name}: {ia}")),
            Some(ib) if ia != ib => out.push(format!("/{path}: {a_name} {ia}, {b_name} {ib}")),
            _ => {}
        }
    }
    for (path, ib) in b {
        if !a.contains_key(path) {
            out.push(format!("/{path}: only in {b_name}: {ib}"));
        }
    }
    out
}

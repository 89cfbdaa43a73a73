//! An OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/…`) as a
//! destination for `build --output oci:DIR` and a source for `verify oci:DIR[:TAG]`.
//! Tags are `org.opencontainers.image.ref.name` annotations, as skopeo and containerd read them.

use crate::base::digest::{first_mismatch, Digest, HashingReader};
use crate::base::files;
use crate::base::oci::{self, ManifestBlob};
use crate::verify::ContentSource;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

type Result<T, E = LayoutError> = std::result::Result<T, E>;

/// Why a layout cannot be written or read. A layout that is not what was asked for (not a
/// layout, no such tag, a damaged index) is the user's to fix; I/O and a blob whose
/// content is not its digest are failures.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Only sha256 blobs are stored here.
    #[error("`{digest}` is not a sha256 digest")]
    NotSha256 { digest: String },
    #[error("{} is not an OCI image layout (no oci-layout/index.json); build into it with --output oci:{}", dir.display(), dir.display())]
    NotALayout { dir: PathBuf },
    #[error("{}: not valid JSON ({source}); remove the directory and build again", path.display())]
    IndexJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: has no manifests list", path.display())]
    NoManifestsList { path: PathBuf },
    #[error("{}: blob {digest} is missing from the layout ({source})", dir.display())]
    MissingBlob {
        dir: PathBuf,
        digest: Digest,
        #[source]
        source: std::io::Error,
    },
    /// Read as a registry's content is: the message names the layout as its registry.
    #[error("registry {}: blob {digest} is corrupt (its content hashes to {computed})", dir.display())]
    CorruptBlob {
        dir: PathBuf,
        digest: Digest,
        computed: Digest,
    },
    /// `tag`: the one asked for; none: the layout holds no manifest at all.
    #[error("{}: no manifest {}", dir.display(), tag.as_ref().map_or("at all".into(), |t| format!("tagged `{t}`")))]
    NoManifest { dir: PathBuf, tag: Option<String> },
    #[error("{}: several manifests; name one as oci:{}:TAG", dir.display(), dir.display())]
    SeveralManifests { dir: PathBuf },
    #[error("deep inspection stopped: {0}")]
    Inspection(#[source] tokio::task::JoinError),
    /// `verify --deep` read a layer past one of its limits (names, headers, paths).
    #[error("--deep refused {reference}: {source}")]
    LayerRefused {
        reference: String,
        #[source]
        source: crate::base::layer_limits::LayerRefused,
    },
}

/// `oci:DIR[:TAG]` split into its parts; None when the reference is not a layout.
pub fn parse_layout_reference(reference: &str) -> Option<(PathBuf, Option<String>)> {
    let rest = reference.strip_prefix("oci:")?;
    // The tag follows the last colon, unless that colon is part of the path.
    match rest.rsplit_once(':') {
        Some((dir, tag)) if !tag.is_empty() && !tag.contains('/') => {
            Some((PathBuf::from(dir), Some(tag.to_string())))
        }
        _ => Some((PathBuf::from(rest), None)),
    }
}

pub struct OciLayout {
    pub dir: PathBuf,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn not_sha256(digest: &str) -> LayoutError {
    LayoutError::NotSha256 {
        digest: digest.to_string(),
    }
}

fn blob_path(dir: &Path, digest: &Digest) -> Result<PathBuf> {
    if digest.algorithm() != "sha256" {
        return Err(not_sha256(digest.as_str()));
    }
    Ok(dir.join("blobs/sha256").join(digest.hex()))
}

impl OciLayout {
    /// Creates the layout (or opens an existing one to add to).
    pub fn create(dir: &Path) -> Result<OciLayout> {
        std::fs::create_dir_all(dir.join("blobs/sha256")).map_err(io(dir))?;
        let marker = dir.join("oci-layout");
        if !marker.exists() {
            std::fs::write(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io(&marker))?;
        }
        let index = dir.join("index.json");
        if !index.exists() {
            let empty = json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX, "manifests": []});
            std::fs::write(&index, empty.to_string()).map_err(io(&index))?;
        }
        Ok(OciLayout {
            dir: dir.to_path_buf(),
        })
    }

    pub fn open(dir: &Path) -> Result<OciLayout> {
        if !dir.join("oci-layout").is_file() || !dir.join("index.json").is_file() {
            return Err(LayoutError::NotALayout {
                dir: dir.to_path_buf(),
            });
        }
        Ok(OciLayout {
            dir: dir.to_path_buf(),
        })
    }

    pub fn has_blob(&self, digest: &Digest) -> Result<bool> {
        Ok(blob_path(&self.dir, digest)?.is_file())
    }

    /// Copies a spooled blob in; written under a temporary name first so a crash never
    /// leaves a truncated blob under its digest.
    pub fn put_blob_file(&self, source: &Path, digest: &Digest) -> Result<bool> {
        let target = blob_path(&self.dir, digest)?;
        if target.is_file() {
            return Ok(false);
        }
        let partial = target.with_extension("partial");
        std::fs::copy(source, &partial).map_err(io(&partial))?;
        std::fs::rename(&partial, &target).map_err(io(&target))?;
        Ok(true)
    }

    pub fn put_blob_bytes(&self, bytes: &[u8], digest: &Digest) -> Result<bool> {
        let target = blob_path(&self.dir, digest)?;
        if target.is_file() {
            return Ok(false);
        }
        let partial = target.with_extension("partial");
        std::fs::write(&partial, bytes).map_err(io(&partial))?;
        std::fs::rename(&partial, &target).map_err(io(&target))?;
        Ok(true)
    }

    fn read_index(&self) -> Result<Value> {
        let path = self.dir.join("index.json");
        let text = std::fs::read(&path).map_err(io(&path))?;
        let index: Value = match serde_json::from_slice(&text) {
            Ok(index) => index,
            Err(source) => return Err(LayoutError::IndexJson { path, source }),
        };
        if !index["manifests"].is_array() {
            return Err(LayoutError::NoManifestsList { path });
        }
        Ok(index)
    }

    /// Points `tag` at `manifest` (replacing what the tag pointed at), atomically.
    pub fn tag(&self, manifest: &ManifestBlob, tag: &str) -> Result<()> {
        let mut index = self.read_index()?;
        let manifests = index["manifests"].as_array_mut().expect("checked above");
        manifests.retain(|m| m["annotations"][REF_NAME].as_str() != Some(tag));
        manifests.push(json!({
            "mediaType": manifest.media_type,
            "digest": manifest.digest,
            "size": manifest.bytes.len(),
            "annotations": {REF_NAME: tag},
        }));
        let path = self.dir.join("index.json");
        files::replace(&path, &serde_json::to_vec(&index).expect("serialises")).map_err(io(&path))
    }

    fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let path = blob_path(&self.dir, digest)?;
        let bytes = std::fs::read(&path).map_err(|source| LayoutError::MissingBlob {
            dir: self.dir.clone(),
            digest: digest.clone(),
            source,
        })?;
        let computed = Digest::of(&bytes);
        if computed != *digest {
            return Err(LayoutError::CorruptBlob {
                dir: self.dir.clone(),
                digest: digest.clone(),
                computed,
            });
        }
        Ok(bytes)
    }
}

/// Reads a tag (or the only manifest) of a layout for verification.
pub struct LayoutSource {
    pub layout: OciLayout,
    pub tag: Option<String>,
}

impl ContentSource for LayoutSource {
    type Error = LayoutError;

    async fn resolve(&self) -> Result<(Vec<u8>, Digest)> {
        let index = self.layout.read_index()?;
        let manifests = index["manifests"].as_array().expect("checked on read");
        let chosen: Vec<&Value> = match &self.tag {
            Some(tag) => manifests
                .iter()
                .filter(|m| m["annotations"][REF_NAME].as_str() == Some(tag))
                .collect(),
            None => manifests.iter().collect(),
        };
        let descriptor = match chosen.as_slice() {
            [one] => *one,
            [] => {
                return Err(LayoutError::NoManifest {
                    dir: self.layout.dir.clone(),
                    tag: self.tag.clone(),
                })
            }
            _ => {
                return Err(LayoutError::SeveralManifests {
                    dir: self.layout.dir.clone(),
                })
            }
        };
        let digest = descriptor["digest"].as_str().unwrap_or_default();
        let digest: Digest = digest.parse().map_err(|_| not_sha256(digest))?;
        Ok((self.layout.read_blob(&digest)?, digest))
    }

    async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>> {
        self.layout.read_blob(digest)
    }

    async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        self.layout.read_blob(digest)
    }

    /// polyarch attaches nothing in a layout (see `Destination::attach`).
    async fn referrers(&self, _digest: &Digest) -> Result<Vec<Value>> {
        Ok(Vec::new())
    }

    fn repository(&self) -> String {
        format!("oci:{}", self.layout.dir.display())
    }

    async fn inspect(
        &self,
        config: &[u8],
        layers: &[(Digest, String)],
        platform: &crate::Platform,
    ) -> Result<crate::verify::entrypoint::DeepReport> {
        // Each layer is hashed as the inspector reads it: a layout is as untrusted as a
        // registry, and no verdict is drawn from bytes its manifest does not name.
        let mut readers: Vec<Box<dyn std::io::Read + Send>> = Vec::new();
        let mut hashed = Vec::new();
        for (digest, _) in layers {
            let path = blob_path(&self.layout.dir, digest)?;
            let file = std::fs::File::open(&path).map_err(io(&path))?;
            let (reader, seen) = HashingReader::new(std::io::BufReader::new(file), digest);
            readers.push(Box::new(reader));
            hashed.push(seen);
        }
        let (config, platform) = (config.to_vec(), platform.clone());
        let report = tokio::task::spawn_blocking(move || {
            crate::verify::entrypoint::inspect(&config, readers, &platform)
        })
        .await
        .map_err(LayoutError::Inspection)?;
        let named = layers.iter().map(|(digest, _)| digest);
        match first_mismatch(named.zip(hashed.iter().map(|s| &**s))) {
            Some((digest, computed)) => Err(LayoutError::CorruptBlob {
                dir: self.layout.dir.clone(),
                digest,
                computed,
            }),
            None => report.map_err(|source| LayoutError::LayerRefused {
                reference: match &self.tag {
                    Some(tag) => format!("{}:{tag}", self.repository()),
                    None => self.repository(),
                },
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_layout_references() {
        assert_eq!(
            parse_layout_reference("oci:/tmp/out:v1"),
            Some((PathBuf::from("/tmp/out"), Some("v1".into())))
        );
        assert_eq!(
            parse_layout_reference("oci:out"),
            Some((PathBuf::from("out"), None))
        );
        assert_eq!(parse_layout_reference("127.0.0.1:5000/x:v1"), None);
    }

    #[test]
    fn tags_replace_and_blobs_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let layout = OciLayout::create(dir.path()).unwrap();
        let blob = |b: &[u8]| ManifestBlob {
            bytes: b.to_vec(),
            digest: Digest::of(b),
            media_type: oci::OCI_INDEX,
        };
        let (a, b) = (blob(b"{\"a\":1}"), blob(b"{\"b\":2}"));
        for m in [&a, &b] {
            layout.put_blob_bytes(&m.bytes, &m.digest).unwrap();
        }
        layout.tag(&a, "v1").unwrap();
        layout.tag(&b, "v1").unwrap();
        let index = layout.read_index().unwrap();
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
        assert_eq!(index["manifests"][0]["digest"], b.digest.as_str());
        std::fs::write(blob_path(dir.path(), &a.digest).unwrap(), b"tampered").unwrap();
        assert!(matches!(
            layout.read_blob(&a.digest),
            Err(LayoutError::CorruptBlob { .. })
        ));
        assert!(matches!(
            OciLayout::open(&dir.path().join("nope")),
            Err(LayoutError::NotALayout { .. })
        ));
    }
}

//! What earlier runs pushed, keyed by registry repository and engine image ID, so a warm
//! rerun whose builds produced the same images skips export and upload entirely.
//! It is only a hint: an entry is used after the registry confirms the manifest exists.

use crate::oci::ConfigPlatform;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedManifest {
    pub digest: String,
    pub size: u64,
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl CachedManifest {
    pub fn config_platform(&self) -> ConfigPlatform {
        ConfigPlatform {
            os: self.os.clone(),
            architecture: self.architecture.clone(),
            variant: self.variant.clone(),
        }
    }
}

pub struct PushCache {
    path: Option<PathBuf>,
    entries: Mutex<BTreeMap<String, CachedManifest>>,
}

fn key(repository: &str, image_id: &str) -> String {
    format!("{repository}|{image_id}")
}

impl PushCache {
    /// `$POLYARCH_CACHE_DIR`, `$XDG_CACHE_HOME/polyarch` or `~/.cache/polyarch`; an
    /// unreadable or corrupt cache is treated as empty.
    pub fn open() -> PushCache {
        let dir = std::env::var_os("POLYARCH_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("polyarch"))
            })
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/polyarch")));
        let path = dir.map(|d| d.join("pushed.json"));
        let entries = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        PushCache {
            path,
            entries: Mutex::new(entries),
        }
    }

    pub fn get(&self, repository: &str, image_id: &str) -> Option<CachedManifest> {
        self.entries
            .lock()
            .expect("cache lock")
            .get(&key(repository, image_id))
            .cloned()
    }

    pub fn put(&self, repository: &str, image_id: &str, manifest: CachedManifest) {
        self.entries
            .lock()
            .expect("cache lock")
            .insert(key(repository, image_id), manifest);
    }

    /// Best effort: a cache that cannot be written only costs the next run an upload.
    pub fn save(&self) {
        let Some(path) = &self.path else { return };
        let Some(dir) = path.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let entries = self.entries.lock().expect("cache lock");
        let partial = path.with_extension("json.partial");
        if let Ok(bytes) = serde_json::to_vec_pretty(&*entries) {
            if std::fs::write(&partial, bytes).is_ok() {
                let _ = std::fs::rename(&partial, path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_round_trip_and_ignores_corruption() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("POLYARCH_CACHE_DIR", dir.path());
        let cache = PushCache::open();
        let entry = CachedManifest {
            digest: format!("sha256:{}", "a".repeat(64)),
            size: 10,
            os: "linux".into(),
            architecture: "arm64".into(),
            variant: None,
        };
        cache.put("r/x", "sha256:1", entry.clone());
        cache.save();
        assert_eq!(PushCache::open().get("r/x", "sha256:1"), Some(entry));
        std::fs::write(dir.path().join("pushed.json"), b"{not json").unwrap();
        assert_eq!(PushCache::open().get("r/x", "sha256:1"), None);
    }
}

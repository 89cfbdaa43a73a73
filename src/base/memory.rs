//! What polyarch remembers across runs: small JSON maps in the cache directory, each
//! keeping its most recently used entries.

use super::cache_dir;
use super::files;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Entries kept per cache file: the least recently used go first, so a long-lived CI
/// runner's files stay small enough to read in a few milliseconds.
const MAX_ENTRIES: usize = 2048;
/// How stale an entry's last-use stamp may get before a read refreshes it (a refresh
/// rewrites the file, which a warm run should not do every time).
const USE_STAMP_SECONDS: u64 = 24 * 60 * 60;

#[derive(Clone, Serialize, Deserialize)]
struct Stamped<V> {
    value: V,
    /// Unix seconds of the last write or (coarsely) read.
    used: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A small JSON map in the cache directory; unreadable or corrupt files read as empty,
/// and a file that cannot be written only costs the next run the work it would have saved.
pub(crate) struct Store<V> {
    path: Option<PathBuf>,
    entries: Mutex<BTreeMap<String, Stamped<V>>>,
    /// Whether `entries` changed since they were read: an unchanged file is not rewritten.
    changed: AtomicBool,
}

impl<V: Serialize + DeserializeOwned + Clone> Store<V> {
    /// `file` in the cache directory ([`cache_dir`]).
    pub(crate) fn open(file: &str) -> Store<V> {
        Self::at(cache_dir().map(|d| d.join(file)))
    }

    /// At `path`; None keeps it in memory only.
    pub(crate) fn at(path: Option<PathBuf>) -> Store<V> {
        let entries = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Store {
            path,
            entries: Mutex::new(entries),
            changed: AtomicBool::new(false),
        }
    }

    #[cfg(test)]
    pub(crate) fn in_memory() -> Store<V> {
        Self::at(None)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
    }

    pub(crate) fn get(&self, key: &str) -> Option<V> {
        let mut entries = self.entries.lock().expect("cache lock");
        let entry = entries.get_mut(key)?;
        let now = unix_now();
        if now.saturating_sub(entry.used) > USE_STAMP_SECONDS {
            entry.used = now;
            self.changed.store(true, Ordering::Relaxed);
        }
        Some(entry.value.clone())
    }

    pub(crate) fn put(&self, key: String, value: V) {
        let mut entries = self.entries.lock().expect("cache lock");
        entries.insert(
            key,
            Stamped {
                value,
                used: unix_now(),
            },
        );
        if entries.len() > MAX_ENTRIES {
            let mut by_use: Vec<(u64, String)> =
                entries.iter().map(|(k, e)| (e.used, k.clone())).collect();
            by_use.sort();
            for (_, oldest) in by_use.into_iter().take(entries.len() - MAX_ENTRIES) {
                entries.remove(&oldest);
            }
        }
        self.changed.store(true, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, key: &str) {
        if self
            .entries
            .lock()
            .expect("cache lock")
            .remove(key)
            .is_some()
        {
            self.changed.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn save(&self) {
        if !self.changed.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(path) = &self.path else { return };
        let Ok(bytes) = serde_json::to_vec_pretty(&*self.entries.lock().expect("cache lock"))
        else {
            return;
        };
        // A cache that cannot be written is only a slower next run.
        let _ = files::replace(path, &bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_the_least_recently_used_entries_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("builds.json");
        let open = || Store::<String>::at(Some(path.clone()));
        let store = open();
        store.put("inputs".into(), "sha256:2".into());
        store.save();
        let store = open();
        store
            .entries
            .lock()
            .unwrap()
            .get_mut("inputs")
            .unwrap()
            .used = 1;
        for n in 0..MAX_ENTRIES {
            store.put(format!("new-{n}"), "sha256:3".into());
        }
        store.save();
        let reopened = open();
        assert_eq!(reopened.entries.lock().unwrap().len(), MAX_ENTRIES);
        assert!(reopened.get("inputs").is_none());
        assert!(reopened.get("new-0").is_some());
    }
}

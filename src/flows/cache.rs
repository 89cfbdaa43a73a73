//! What earlier runs learned, so a warm rerun skips work: what they pushed, keyed by
//! registry repository and engine image ID (export and upload are skipped; an entry is
//! used after the registry confirms the manifest exists), which image each set of build
//! inputs produced (the build is skipped), which platforms each engine ran (the
//! emulation probe is skipped), where each blob was pushed (it is mounted, not
//! uploaded, to another repository of that registry), and which platform images passed
//! which tests (they are not run again).

use crate::base::digest::Digest;
use crate::base::memory::Store;
use crate::base::oci::ConfigPlatform;
use crate::builder::build_inputs::RememberedBuild;
use crate::verify::coverage_record::TestRecord;
use crate::Platform;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedManifest {
    pub digest: Digest,
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

pub struct PushCache(Store<CachedManifest>);

fn key(repository: &str, image_id: &str) -> String {
    format!("{repository}|{image_id}")
}

impl PushCache {
    pub fn open() -> PushCache {
        PushCache(Store::open("pushed.json"))
    }

    /// Kept in memory only: unit tests never read the user's cache.
    #[cfg(test)]
    pub(crate) fn in_memory() -> PushCache {
        PushCache(Store::in_memory())
    }

    pub fn get(&self, repository: &str, image_id: &str) -> Option<CachedManifest> {
        self.0.get(&key(repository, image_id))
    }

    pub fn put(&self, repository: &str, image_id: &str, manifest: CachedManifest) {
        self.0.put(key(repository, image_id), manifest);
    }

    pub fn save(&self) {
        self.0.save()
    }
}

/// The builds earlier runs made, by their settings ([`crate::builder::build_inputs::settings_key`]):
/// the image and what the build read of its context.
pub struct BuildMemory(Store<RememberedBuild>);

impl BuildMemory {
    pub fn open() -> BuildMemory {
        BuildMemory(Store::open("builds.json"))
    }

    /// Kept in memory only: unit tests never read the user's cache.
    #[cfg(test)]
    pub(crate) fn in_memory() -> BuildMemory {
        BuildMemory(Store::in_memory())
    }

    pub fn get(&self, settings: &str) -> Option<RememberedBuild> {
        self.0.get(settings)
    }

    pub fn remember(&self, settings: &str, build: RememberedBuild) {
        self.0.put(settings.to_string(), build);
    }

    pub fn save(&self) {
        self.0.save()
    }
}

/// Platforms an engine's kernel ran in an earlier run (`true`: under QEMU), so a rerun
/// builds without probing again. Only a hint: registrations vanish with a reboot, so a
/// build that then meets `exec format error` makes the caller forget it and probe.
pub struct EmulationMemory(Store<bool>);

impl EmulationMemory {
    pub fn open() -> EmulationMemory {
        EmulationMemory(Store::open("emulation.json"))
    }

    /// `Some(emulated)` when `engine` (an engine identity) ran `platform` before.
    pub fn runs(&self, engine: &str, platform: &Platform) -> Option<bool> {
        self.0.get(&key(engine, &platform.to_string()))
    }

    pub fn remember(&self, engine: &str, platform: &Platform, emulated: bool) {
        self.0.put(key(engine, &platform.to_string()), emulated);
    }

    pub fn forget(&self, engine: &str, platform: &Platform) {
        self.0.remove(&key(engine, &platform.to_string()));
    }

    pub fn save(&self) {
        self.0.save()
    }
}

/// Platform images whose `test:` passed in an earlier run, by a key naming the image's
/// digest and the tests (`tests.json`): an unchanged image with unchanged tests is not
/// tested again.
pub struct TestMemory(Store<TestRecord>);

impl TestMemory {
    pub fn open() -> TestMemory {
        TestMemory(Store::open("tests.json"))
    }

    /// Kept in memory only: unit tests never read the user's cache.
    #[cfg(test)]
    pub(crate) fn in_memory() -> TestMemory {
        TestMemory(Store::in_memory())
    }

    pub fn passed(&self, key: &str) -> Option<TestRecord> {
        self.0.get(key)
    }

    pub fn remember(&self, key: &str, record: TestRecord) {
        self.0.put(key.to_string(), record);
    }

    pub fn save(&self) {
        self.0.save()
    }
}

/// What `verify` read (see [`crate::verify::ReadMemory`]): which config each image
/// manifest names, by the manifest's digest (`configs.json`), so an entry's config is
/// asked for beside its manifest; and the manifest each reference resolved to
/// (`references.json`), so its entries are asked for beside the reference itself.
pub struct VerifyMemory {
    configs: Store<Digest>,
    references: Store<ResolvedManifest>,
}

/// A manifest as a reference resolved to it: a registry's manifests are JSON, kept as text.
#[derive(Clone, Serialize, Deserialize)]
struct ResolvedManifest {
    digest: Digest,
    manifest: String,
}

impl VerifyMemory {
    pub fn open() -> VerifyMemory {
        VerifyMemory {
            configs: Store::open("configs.json"),
            references: Store::open("references.json"),
        }
    }

    pub fn save(&self) {
        self.configs.save();
        self.references.save();
    }
}

impl crate::verify::ReadMemory for VerifyMemory {
    fn config_of(&self, manifest: &Digest) -> Option<Digest> {
        self.configs.get(manifest.as_str())
    }

    fn remember(&self, manifest: &Digest, config: &Digest) {
        self.configs.put(manifest.to_string(), config.clone());
    }

    fn resolved_by(&self, reference: &str) -> Option<(Vec<u8>, Digest)> {
        let resolved = self.references.get(reference)?;
        // A file edited by hand is no guess at all.
        (Digest::of(resolved.manifest.as_bytes()) == resolved.digest)
            .then(|| (resolved.manifest.into_bytes(), resolved.digest))
    }

    fn remember_resolved(&self, reference: &str, bytes: &[u8], digest: &Digest) {
        let Ok(manifest) = std::str::from_utf8(bytes) else {
            return;
        };
        if bytes.len() > MAX_REMEMBERED_MANIFEST {
            return;
        }
        self.references.put(
            reference.to_string(),
            ResolvedManifest {
                digest: digest.clone(),
                manifest: manifest.to_string(),
            },
        );
    }
}

/// Larger manifests (an index of more than ~40 entries) are read again rather than kept:
/// every `verify` loads the whole file, up to 2048 of them.
const MAX_REMEMBERED_MANIFEST: usize = 16 * 1024;

/// Repositories kept per blob: enough to find a live source after a few deletions,
/// few enough that a failed mount costs little.
const PLACES_PER_BLOB: usize = 4;

/// Which repositories of each registry earlier runs put each blob in (`blobs.json`), so a
/// later run mounts a shared layer instead of uploading it (see
/// [`crate::registry::BlobPlaces`]).
pub struct BlobMemory(Store<Vec<String>>);

impl BlobMemory {
    pub fn open() -> BlobMemory {
        BlobMemory(Store::open("blobs.json"))
    }

    pub fn save(&self) {
        self.0.save()
    }
}

impl crate::registry::BlobPlaces for BlobMemory {
    fn places(&self, registry: &str, digest: &Digest) -> Vec<String> {
        self.0
            .get(&key(registry, digest.as_str()))
            .unwrap_or_default()
    }

    fn remember(&self, registry: &str, digest: &Digest, repository: &str) {
        let key = key(registry, digest.as_str());
        let mut places = self.0.get(&key).unwrap_or_default();
        if places.first().map(String::as_str) == Some(repository) {
            return;
        }
        places.retain(|p| p != repository);
        places.insert(0, repository.to_string());
        places.truncate(PLACES_PER_BLOB);
        self.0.put(key, places);
    }

    fn forget(&self, registry: &str, digest: &Digest, repository: &str) {
        let key = key(registry, digest.as_str());
        let mut places = self.0.get(&key).unwrap_or_default();
        places.retain(|p| p != repository);
        match places.is_empty() {
            true => self.0.remove(&key),
            false => self.0.put(key, places),
        }
    }
}

/// What each layer (by diff ID) compressed to when polyarch last exported it
/// (`layer-digests.json`): with [`BlobMemory`], whether a registry already holds a layer
/// before it is exported again.
pub struct LayerDigests(Store<Digest>);

impl LayerDigests {
    pub fn open() -> LayerDigests {
        LayerDigests(Store::open("layer-digests.json"))
    }

    #[cfg(test)]
    pub fn in_memory() -> LayerDigests {
        LayerDigests(Store::in_memory())
    }

    pub fn get(&self, diff_id: &str) -> Option<Digest> {
        self.0.get(diff_id)
    }

    pub fn remember(&self, diff_id: &str, digest: &Digest) {
        if self.0.get(diff_id).as_ref() != Some(digest) {
            self.0.put(diff_id.to_string(), digest.clone());
        }
    }

    pub fn save(&self) {
        self.0.save()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_config_is_found_by_its_manifest_digest() {
        use crate::verify::ReadMemory;
        let memory = VerifyMemory {
            configs: Store::in_memory(),
            references: Store::in_memory(),
        };
        let (manifest, config) = (Digest::of(b"manifest"), Digest::of(b"config"));
        assert_eq!(memory.config_of(&manifest), None);
        memory.remember(&manifest, &config);
        assert_eq!(memory.config_of(&manifest), Some(config));
    }

    #[test]
    fn what_a_reference_resolved_to_is_kept_whole_and_only_if_its_digest_holds() {
        use crate::verify::ReadMemory;
        let memory = VerifyMemory {
            configs: Store::in_memory(),
            references: Store::in_memory(),
        };
        let index = br#"{"schemaVersion":2,"manifests":[]}"#;
        let reference = "r.io/app:v1";
        memory.remember_resolved(reference, index, &Digest::of(index));
        assert_eq!(
            memory.resolved_by(reference),
            Some((index.to_vec(), Digest::of(index)))
        );
        assert_eq!(memory.resolved_by("r.io/app:v2"), None);
        // An entry whose text no longer has its digest (edited by hand) is no guess.
        memory.remember_resolved(reference, index, &Digest::of(b"other"));
        assert_eq!(memory.resolved_by(reference), None);
        // Neither text that is not UTF-8 nor a very large manifest is kept.
        memory.remember_resolved("r.io/app:bin", &[0xff, 0xfe], &Digest::of(&[0xff, 0xfe]));
        assert_eq!(memory.resolved_by("r.io/app:bin"), None);
        let large = format!(
            "{{\"padding\":\"{}\"}}",
            "x".repeat(MAX_REMEMBERED_MANIFEST)
        );
        let large = large.as_bytes();
        memory.remember_resolved("r.io/app:large", large, &Digest::of(large));
        assert_eq!(memory.resolved_by("r.io/app:large"), None);
    }

    #[test]
    fn blob_places_keep_the_latest_few_per_registry_and_forget_refused_ones() {
        use crate::registry::BlobPlaces;
        let memory = BlobMemory(Store::in_memory());
        let layer = Digest::of(b"layer");
        for repo in ["a", "b", "c", "d", "e", "c"] {
            memory.remember("r:5000", &layer, repo);
        }
        assert_eq!(memory.places("r:5000", &layer), ["c", "e", "d", "b"]);
        assert!(memory.places("other:5000", &layer).is_empty());
        memory.forget("r:5000", &layer, "e");
        assert_eq!(memory.places("r:5000", &layer), ["c", "d", "b"]);
        for repo in ["c", "d", "b"] {
            memory.forget("r:5000", &layer, repo);
        }
        assert_eq!(memory.0.len(), 0);
    }

    #[test]
    fn survives_a_round_trip_and_ignores_corruption() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("POLYARCH_CACHE_DIR", dir.path());
        let cache = PushCache::open();
        let entry = CachedManifest {
            digest: format!("sha256:{}", "a".repeat(64)).parse().unwrap(),
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

        let arm64: Platform = "linux/arm64".parse().unwrap();
        let memory = EmulationMemory::open();
        memory.remember("engine-a", &arm64, true);
        memory.save();
        assert_eq!(EmulationMemory::open().runs("engine-a", &arm64), Some(true));
        assert_eq!(EmulationMemory::open().runs("engine-b", &arm64), None);
        memory.forget("engine-a", &arm64);
        memory.save();
        assert_eq!(EmulationMemory::open().runs("engine-a", &arm64), None);

        let built = |image: &str| RememberedBuild {
            image: image.to_string(),
            reads: Vec::new(),
        };
        let builds = BuildMemory::open();
        builds.remember("inputs", built("sha256:2"));
        builds.save();
        assert_eq!(
            BuildMemory::open()
                .get("inputs")
                .map(|b| b.image)
                .as_deref(),
            Some("sha256:2")
        );
    }
}

//! What a build depended on, so that a rerun can tell without building whether the engine
//! would produce the same image (the warm path).
//!
//! Two parts: the build's settings and the images its Dockerfile names ([`settings_key`],
//! computed before the build), and the context files BuildKit actually read in the build,
//! as the session's file sync served them ([`ContextRead`]). A rerun replays each read,
//! with BuildKit's own patterns, on the tree as it is now: no second reading of the
//! Dockerfile decides which files count, so a symlinked source, an ignore file or an
//! `ONBUILD` trigger of a base counts exactly as far as BuildKit let it.

use crate::base::dockerfile;
use crate::builder::file_hashes::FileHashes;
use crate::docker::buildkit::filesync::{self, Filter, SentEntry, Transfer};
use crate::docker::engine::Engine;
use crate::project::contexts::{self, NamedContext};
use crate::project::ImageSpec;
use crate::registry::{self, Registry, RegistryOptions, RetryPolicy};
use crate::{builder, Platform};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Why a build's settings key cannot be computed: a failure, not a reason to rebuild (a
/// Dockerfile that cannot be read would fail the build too).
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    #[error("{}: {source}", path.display())]
    Dockerfile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One file-sync transfer of a build: the session directory BuildKit asked for, its
/// patterns, and a digest of every entry sent (path, mode, size, link target, content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextRead {
    pub dir: String,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub follow: Vec<String>,
    pub digest: String,
}

/// A build an earlier run made: its image and what it read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RememberedBuild {
    pub image: String,
    pub reads: Vec<ContextRead>,
}

/// The one read of a classic build (no BuildKit: old Docker, Podman): the whole context
/// tar it was sent, by its sha256 ([`builder::classic_context_digest`]).
const CLASSIC_CONTEXT: &str = "classic-context-tar";

/// What a classic build read: the context tar whose sha256 is `sent`.
pub fn classic_reads(sent: &str) -> Vec<ContextRead> {
    vec![ContextRead {
        dir: CLASSIC_CONTEXT.into(),
        include: Vec::new(),
        exclude: Vec::new(),
        follow: Vec::new(),
        digest: sent.to_string(),
    }]
}

/// The digest of the build's settings and of the images its Dockerfile names (the
/// engine's image ID, or the registry's digest for one the engine does not hold). None
/// when no key can be trusted: a Dockerfile reading something no key can pin (see
/// [`dockerfile::external_images`]), or an image that cannot be resolved.
pub async fn settings_key(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    remote: &RemoteBases,
) -> Result<Option<String>, InputsError> {
    let path = spec.context.join(&spec.dockerfile);
    let text = std::fs::read_to_string(&path)
        .map_err(|source| InputsError::Dockerfile { path, source })?;
    let mut args: HashMap<String, String> = builder::platform_build_args(platform, &engine.native)
        .into_iter()
        .collect();
    args.extend(spec.build_args.clone());
    let Some(mut images) = dockerfile::external_images(&text, &args) else {
        return Ok(None);
    };
    // A name the build reads as a named context is that context, not an image; an
    // image context is resolved as a base is (a `target:` one is a digest by now).
    images.retain(|(image, _)| {
        let name = image.strip_suffix(":latest").unwrap_or(image);
        !spec.contexts.contains_key(name)
    });
    let target = platform.to_string();
    for context in spec.contexts.values() {
        if let NamedContext::Image(reference) = context {
            images.push((reference.clone(), target.clone()));
        }
    }
    let mut bases = Vec::new();
    for (image, wanted) in images {
        // BuildKit uses the engine's copy when it is for the wanted platform, unless told
        // to pull.
        let held = match spec.pull {
            true => None,
            false => engine.docker.inspect_image(&image).await.ok(),
        };
        let local = held.filter(|i| {
            let held = format!(
                "{}/{}",
                i.os.as_deref().unwrap_or_default(),
                i.architecture.as_deref().unwrap_or_default()
            );
            wanted
                .parse::<Platform>()
                .is_ok_and(|w| w.os_arch() == held)
        });
        let id = match local {
            Some(inspected) => inspected.id.unwrap_or_default(),
            None => match remote.digest(&image).await {
                Some(digest) => digest,
                None => return Ok(None),
            },
        };
        bases.push((image, id));
    }
    let engine = [engine.identity.as_str(), engine.server_version.as_str()];
    Ok(Some(settings_digest(engine, spec, platform, &bases)))
}

/// The settings key of `spec` for `platform` on `engine` (identity, version) with its
/// `bases` resolved (image, ID or digest).
fn settings_digest(
    engine: [&str; 2],
    spec: &ImageSpec,
    platform: &Platform,
    bases: &[(String, String)],
) -> String {
    let key = serde_json::json!({
        "polyarch": env!("CARGO_PKG_VERSION"),
        "engine": engine,
        "platform": platform.to_string(),
        // What was read is remembered per context: another context built with the same
        // settings (a second checkout, a service sharing the Dockerfile) would otherwise
        // take this one's place, and its next rerun would build again.
        "context": spec.context,
        "dockerfile": spec.dockerfile,
        "target": spec.target,
        "build_args": spec.build_args,
        "labels": spec.labels,
        // The engine writes them into the manifests it pushes itself.
        "manifest_annotations": spec.annotations.manifest,
        "source_date_epoch": spec.source_date_epoch,
        "network": format!("{:?}", spec.network),
        "bases": bases,
        // Which secrets and agents a build may use, never what they hold: BuildKit's own
        // cache does not key on secret values either.
        "secrets": spec.secrets.keys().collect::<Vec<_>>(),
        "ssh": spec.ssh.keys().collect::<Vec<_>>(),
        "cache_from": spec.cache_from.iter().map(|c| c.for_platform(platform)).collect::<Vec<_>>(),
        "cache_to": spec.cache_to.as_ref().map(|c| c.for_platform(platform)),
        "pull": spec.pull,
        // Directories by path (their files are in what the build read), images by
        // reference (their digests are in `bases`).
        "contexts": spec.contexts.iter().map(|(name, c)| (name, c.written())).collect::<Vec<_>>(),
    });
    hex::encode(Sha256::digest(key.to_string()))
}

/// The session directory BuildKit names `dir`, as [`crate::builder`] serves it.
fn session_dir(spec: &ImageSpec, dir: &str) -> Option<PathBuf> {
    match dir {
        "context" => Some(spec.context.clone()),
        "dockerfile" => spec
            .context
            .join(&spec.dockerfile)
            .parent()
            .map(|p| p.to_path_buf()),
        named => contexts::session_dirs(&spec.contexts)
            .into_iter()
            .find(|(served, _)| served == named)
            .map(|(_, dir)| dir.to_path_buf()),
    }
}

/// What `read`'s patterns select under `spec`'s directories now, as a digest; None when
/// it cannot be told (an unknown directory, a pattern or file that cannot be read).
fn replay(
    spec: &ImageSpec,
    read: &ContextRead,
    hashes: &FileHashes,
) -> Option<(Vec<SentEntry>, String)> {
    let root = session_dir(spec, &read.dir)?;
    let filter = Filter::new(&root, &read.include, &read.exclude, &read.follow).ok()?;
    let entries = filesync::replay(&root, &filter, hashes).ok()?;
    let digest = hex::encode(Sha256::digest(serde_json::to_vec(&entries).ok()?));
    Some((entries, digest))
}

/// The reads of a finished build, from its transfers; None when they cannot vouch for
/// the image: a transfer failed, or the tree no longer shows what was sent (a file
/// changed while BuildKit read it: the next run must build). Blocking.
pub fn reads_of(
    spec: &ImageSpec,
    transfers: &[Transfer],
    hashes: &FileHashes,
) -> Option<Vec<ContextRead>> {
    if transfers.is_empty() {
        return None;
    }
    let mut reads: Vec<ContextRead> = Vec::new();
    // A solve for several platforms reads the context once per platform with the same
    // patterns: the tree is replayed (every file hashed) once for them all.
    let mut replays: Vec<(usize, Vec<SentEntry>)> = Vec::new();
    for transfer in transfers {
        if transfer.error.is_some() {
            return None;
        }
        let mut read = ContextRead {
            dir: transfer.dir_name.clone(),
            include: transfer.include_patterns.clone(),
            exclude: transfer.exclude_patterns.clone(),
            follow: transfer.follow_paths.clone(),
            digest: String::new(),
        };
        let earlier = replays.iter().position(|(index, _)| {
            let r = &reads[*index];
            (&r.dir, &r.include, &r.exclude, &r.follow)
                == (&read.dir, &read.include, &read.exclude, &read.follow)
        });
        let now = match earlier {
            Some(replay) => {
                read.digest = reads[replays[replay].0].digest.clone();
                &replays[replay].1
            }
            None => {
                let (now, digest) = replay(spec, &read, hashes)?;
                read.digest = digest;
                replays.push((reads.len(), now));
                &replays[replays.len() - 1].1
            }
        };
        let same = now.len() == transfer.entries.len()
            && now.iter().zip(&transfer.entries).all(|(now, sent)| {
                now.path == sent.path
                    && now.mode == sent.mode
                    && now.size == sent.size
                    && now.linkname == sent.linkname
                    && sent
                        .sha256
                        .as_ref()
                        .is_none_or(|s| Some(s) == now.sha256.as_ref())
            });
        if !same {
            return None;
        }
        reads.push(read);
    }
    Some(reads)
}

/// Replays of one run, each made once however many platforms share it, and the file
/// hashes they and the run's builds share (kept across runs in the cache directory).
pub struct Replays {
    digests: std::sync::Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Option<String>>>>>,
    hashes: Arc<FileHashes>,
}

impl Replays {
    pub fn new(hashes: FileHashes) -> Replays {
        Replays {
            digests: Default::default(),
            hashes: Arc::new(hashes),
        }
    }

    /// The hashes a finished build's [`reads_of`] uses.
    pub fn hashes(&self) -> Arc<FileHashes> {
        self.hashes.clone()
    }

    /// Whether every read would see exactly what it saw before.
    pub async fn unchanged(&self, spec: &ImageSpec, reads: &[ContextRead]) -> bool {
        for read in reads {
            let key = serde_json::json!([
                &spec.name,
                read.dir,
                read.include,
                read.exclude,
                read.follow
            ])
            .to_string();
            let cell = self
                .digests
                .lock()
                .expect("replays lock")
                .entry(key)
                .or_default()
                .clone();
            let (spec, replayed, hashes) = (spec.clone(), read.clone(), self.hashes.clone());
            let now = cell
                .get_or_init(|| async move {
                    tokio::task::spawn_blocking(move || match replayed.dir.as_str() {
                        CLASSIC_CONTEXT => builder::classic_context_digest(&spec, &hashes).ok(),
                        _ => replay(&spec, &replayed, &hashes).map(|(_, d)| d),
                    })
                    .await
                    .ok()
                    .flatten()
                })
                .await;
            if now.as_deref() != Some(read.digest.as_str()) {
                return false;
            }
        }
        !reads.is_empty()
    }
}

/// Base images the engine does not hold, resolved the way BuildKit resolves them before
/// pulling: to the digest their registry serves now; once per image per run.
pub struct RemoteBases {
    options: RegistryOptions,
    digests: tokio::sync::Mutex<HashMap<String, Option<String>>>,
}

impl RemoteBases {
    pub fn new(options: &RegistryOptions) -> RemoteBases {
        RemoteBases {
            options: RegistryOptions {
                // Credentials given for the push registry are not for a base's registry.
                credentials: None,
                // A base that cannot be resolved at once only costs a build.
                retry: Some(RetryPolicy {
                    attempts: 1,
                    ..RetryPolicy::default()
                }),
                ..options.clone()
            },
            digests: Default::default(),
        }
    }

    async fn digest(&self, image: &str) -> Option<String> {
        let mut digests = self.digests.lock().await;
        if let Some(known) = digests.get(image) {
            return known.clone();
        }
        let resolved = async {
            let reference = registry::parse_reference(image).ok()?;
            if let Some(pinned) = reference.digest() {
                return Some(pinned.to_string());
            }
            let host = reference.registry().to_string();
            let registry = Registry::new(&[host], &self.options).ok()?;
            registry.manifest_digest(&reference).await.ok()
        }
        .await;
        digests.insert(image.to_string(), resolved.clone());
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::test_image as image;

    /// A context of one file, an image building from it, and the transfer BuildKit made
    /// of it for one platform (every file sent).
    fn sent_context() -> (tempfile::TempDir, ImageSpec, Transfer) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("blob"), b"some bytes").unwrap();
        let spec = ImageSpec {
            context: dir.path().to_path_buf(),
            ..image("v1")
        };
        let everything = Filter::new(dir.path(), &[], &[], &[]).unwrap();
        let transfer = Transfer {
            dir_name: "context".into(),
            include_patterns: vec![],
            exclude_patterns: vec![],
            follow_paths: vec![],
            entries: filesync::replay(dir.path(), &everything, &FileHashes::open(None)).unwrap(),
            error: None,
        };
        (dir, spec, transfer)
    }

    #[test]
    fn builds_of_two_contexts_under_the_same_settings_are_remembered_apart() {
        let (one, two) = (image("v1"), image("v1"));
        let two = ImageSpec {
            context: two.context.join("elsewhere"),
            ..two
        };
        let platform: Platform = "linux/amd64".parse().unwrap();
        let key = |spec: &ImageSpec| settings_digest(["engine", "20.10"], spec, &platform, &[]);
        assert_eq!(key(&one), key(&image("v1")));
        assert_ne!(key(&one), key(&two));
    }

    #[test]
    fn a_context_read_once_per_platform_is_remembered_for_each() {
        let (_dir, spec, transfer) = sent_context();
        let hashes = FileHashes::open(None);
        let one = reads_of(&spec, std::slice::from_ref(&transfer), &hashes).unwrap();
        let both = reads_of(&spec, &[transfer.clone(), transfer], &hashes).unwrap();
        assert_eq!(both, [one[0].clone(), one[0].clone()]);
    }

    #[test]
    fn each_platforms_transfer_is_checked_against_the_tree_even_when_replayed_once() {
        let (_dir, spec, transfer) = sent_context();
        let hashes = FileHashes::open(None);
        // The second platform's transfer saw another size: the file changed while read.
        let mut changed = transfer.clone();
        changed.entries.last_mut().unwrap().size += 1;
        assert_eq!(reads_of(&spec, &[transfer, changed], &hashes), None);
    }

    #[tokio::test]
    async fn a_change_in_a_named_context_directory_is_a_change_of_what_the_build_read() {
        use crate::project::contexts::NamedContext;
        let (_dir, spec, transfer) = sent_context();
        let assets = tempfile::tempdir().unwrap();
        std::fs::write(assets.path().join("x"), b"one").unwrap();
        let spec = ImageSpec {
            contexts: [(
                "assets".to_string(),
                NamedContext::Dir(assets.path().to_path_buf()),
            )]
            .into(),
            ..spec
        };
        let everything = Filter::new(assets.path(), &[], &[], &[]).unwrap();
        let named = Transfer {
            dir_name: "assets".into(),
            entries: filesync::replay(assets.path(), &everything, &FileHashes::open(None)).unwrap(),
            ..transfer.clone()
        };
        let hashes = FileHashes::open(None);
        let reads = reads_of(&spec, &[transfer, named], &hashes).unwrap();
        assert_eq!(reads[1].dir, "assets");
        assert!(
            Replays::new(FileHashes::open(None))
                .unchanged(&spec, &reads)
                .await
        );
        std::fs::write(assets.path().join("x"), b"two").unwrap();
        assert!(
            !Replays::new(FileHashes::open(None))
                .unchanged(&spec, &reads)
                .await
        );

        // Which contexts, and what they name, are settings.
        let platform: Platform = "linux/amd64".parse().unwrap();
        let key = |spec: &ImageSpec| settings_digest(["engine", "28.5"], spec, &platform, &[]);
        let mut other = spec.clone();
        other.contexts.insert(
            "base".into(),
            NamedContext::Image("r.example/base:v1".into()),
        );
        assert_ne!(key(&spec), key(&other));
    }
}

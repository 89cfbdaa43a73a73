//! One platform entry's checks: its manifest and config read (concurrently with every
//! other entry's), the config's platform against the entry's, and with `--deep` the
//! entrypoint binary's.

use super::attached;
use super::coverage_record::{DeepCheck, PlatformCoverage, PlatformStatus};
use super::entrypoint::{DeepReport, Finding};
use super::error::{parse_digest, target_error, unreadable, VerifyError};
use super::source::ContentSource;
use super::target::Target;
use crate::base::digest::Digest;
use crate::base::oci::{self, ConfigPlatform, Parsed};
use crate::registry::RegistryError;
use crate::Platform;
use futures_util::{StreamExt, TryStreamExt};
use oci_spec::image::ImageManifest;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A platform manifest found under the reference.
pub(super) struct Entry {
    pub(super) platform: Option<Platform>,
    pub(super) digest: Digest,
    pub(super) size: u64,
}

/// Entries checked at once; the registry bounds its requests in flight too, this bounds
/// the work held in memory.
const ENTRIES_IN_FLIGHT: usize = 16;

/// Entries are independent: their manifests and configs are read, and what is attached
/// to them listed, concurrently. An entry listed again (the same digest for the same
/// platform) is checked once.
pub(super) async fn check_entries<S: ContentSource>(
    source: &S,
    target: &Target,
    entries: &[Entry],
    warnings: &mut Vec<String>,
) -> Result<
    (
        Vec<PlatformCoverage>,
        BTreeMap<Digest, attached::Listing<S::Error>>,
    ),
    VerifyError<S::Error>,
> {
    let mut distinct: Vec<&Entry> = Vec::new();
    let mut first_of = HashMap::new();
    let slots: Vec<usize> = entries
        .iter()
        .map(|entry| {
            *first_of
                .entry((&entry.digest, &entry.platform))
                .or_insert_with(|| {
                    distinct.push(entry);
                    distinct.len() - 1
                })
        })
        .collect();
    let digests: Vec<&Digest> = distinct
        .iter()
        .map(|e| &e.digest)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let checks = futures_util::stream::iter(
        distinct
            .iter()
            .map(|entry| check_entry(source, target, entry)),
    )
    .buffered(ENTRIES_IN_FLIGHT)
    .try_collect::<Vec<_>>();
    let (checked, attached) =
        futures_util::future::join(checks, attached::list(source, target, &digests)).await;
    let mut checked = checked?;
    for (_, entry_warnings) in &mut checked {
        warnings.append(entry_warnings);
    }
    let found = slots.iter().map(|&i| checked[i].0.clone()).collect();
    Ok((found, attached))
}

/// Fetches an entry's manifest and config and compares the config's platform with the entry's.
async fn check_entry<S: ContentSource>(
    source: &S,
    target: &Target,
    entry: &Entry,
) -> Result<(PlatformCoverage, Vec<String>), VerifyError<S::Error>> {
    let mut warnings = Vec::new();
    let (manifest, config_digest, config) = manifest_and_config(source, target, entry).await?;
    let (config_platform, detail) = match ConfigPlatform::from_config(&config) {
        Ok(p) => (Some(p.normalized()), None),
        Err(e) => {
            warnings.push(format!("config {config_digest}: {e}"));
            (None, Some(format!("config {config_digest}: {e}")))
        }
    };
    // A single-platform manifest has no entry platform: its config says what it is.
    let platform = entry
        .platform
        .clone()
        .or_else(|| config_platform.clone())
        .unwrap_or_else(|| Platform::new("unknown", "unknown", None));
    let mut status = match &config_platform {
        Some(c) if c == &platform => PlatformStatus::Ok,
        _ => PlatformStatus::ConfigMismatch,
    };
    let deep = if target.deep {
        let report = inspect_entry(source, target, &manifest, &config, &platform).await?;
        Some(judge_binary(&report, &platform, &mut status, &mut warnings))
    } else {
        None
    };
    let detail = detail.or_else(|| {
        mismatch_detail(
            &status,
            deep.as_ref(),
            entry,
            &platform,
            config_platform.as_ref(),
        )
    });
    Ok((
        PlatformCoverage {
            platform,
            digest: Some(entry.digest.clone()),
            config_platform,
            size: Some(entry.size),
            status,
            annotations: manifest
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            detail,
            deep,
            attached: Vec::new(),
            sbom: None,
            signed: None,
            build: None,
            test: None,
        },
        warnings,
    ))
}

/// The entry's manifest and its config (digest and bytes). The config a remembered
/// manifest names is asked for at once, so an entry costs one round trip, not two; it
/// counts only if the manifest, read and checked, names it.
async fn manifest_and_config<S: ContentSource>(
    source: &S,
    target: &Target,
    entry: &Entry,
) -> Result<(Box<ImageManifest>, Digest, Vec<u8>), VerifyError<S::Error>> {
    let guess = source.known_config(&entry.digest);
    let early = async {
        match &guess {
            Some(config) => Some(source.json_blob(config).await),
            None => None,
        }
    };
    let (manifest, early) =
        futures_util::future::join(entry_manifest(source, target, entry), early).await;
    let manifest = manifest?;
    let config_digest = parse_digest(target, manifest.config().digest())?;
    let config = match early {
        Some(Ok(config)) if guess.as_ref() == Some(&config_digest) => config,
        _ => source
            .json_blob(&config_digest)
            .await
            .map_err(VerifyError::Source)?,
    };
    if guess.as_ref() != Some(&config_digest) {
        source.learned_config(&entry.digest, &config_digest);
    }
    Ok((manifest, config_digest, config))
}

/// `--deep`: a binary of another platform makes an entry whose config agreed a binary
/// mismatch; one that could not be judged is a warning.
fn judge_binary(
    report: &DeepReport,
    platform: &Platform,
    status: &mut PlatformStatus,
    warnings: &mut Vec<String>,
) -> DeepCheck {
    match &report.finding {
        Finding::Match => {}
        Finding::BinaryMismatch { .. } => {
            if *status == PlatformStatus::Ok {
                *status = PlatformStatus::BinaryMismatch;
            }
        }
        _ => warnings.push(format!("{platform}: {}", report.detail)),
    }
    DeepCheck::from(report)
}

/// An index entry's manifest, which must be an image manifest.
async fn entry_manifest<S: ContentSource>(
    source: &S,
    target: &Target,
    entry: &Entry,
) -> Result<Box<ImageManifest>, VerifyError<S::Error>> {
    let bytes = source
        .manifest(&entry.digest)
        .await
        .map_err(VerifyError::Source)?;
    match oci::parse_manifest(&bytes).map_err(|e| unreadable(target, e))? {
        Parsed::Image { manifest, .. } => Ok(manifest),
        _ => Err(target_error(
            target,
            RegistryError::EntryNotImage {
                reference: target.reference.clone(),
                digest: entry.digest.to_string(),
            },
        )),
    }
}

/// `--deep`: the entry's entrypoint binary, read from its layers.
async fn inspect_entry<S: ContentSource>(
    source: &S,
    target: &Target,
    manifest: &ImageManifest,
    config: &[u8],
    platform: &Platform,
) -> Result<DeepReport, VerifyError<S::Error>> {
    let layers = manifest
        .layers()
        .iter()
        .map(|l| {
            Ok((
                parse_digest(target, l.digest())?,
                l.media_type().to_string(),
            ))
        })
        .collect::<Result<Vec<_>, VerifyError<S::Error>>>()?;
    source
        .inspect(config, &layers, platform)
        .await
        .map_err(VerifyError::Source)
}

/// Why an entry is not what it claims: its binary's or its config's platform.
fn mismatch_detail(
    status: &PlatformStatus,
    deep: Option<&DeepCheck>,
    entry: &Entry,
    platform: &Platform,
    config_platform: Option<&Platform>,
) -> Option<String> {
    (*status == PlatformStatus::BinaryMismatch)
        .then(|| deep.map(|d| d.detail.clone()))
        .flatten()
        .or_else(|| {
            (*status == PlatformStatus::ConfigMismatch).then(|| {
                format!(
                    "entry {} says {platform} but its config says {}",
                    entry.digest,
                    config_platform.map_or("nothing".to_string(), |c| c.to_string())
                )
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::fake::{assert_both_platforms_ok, target, Fake};

    /// The fake's index entries, as the index walk finds them.
    fn entries_of(fake: &Fake) -> Vec<Entry> {
        let index: serde_json::Value = serde_json::from_slice(&fake.index).unwrap();
        let manifests = index["manifests"].as_array().unwrap();
        manifests
            .iter()
            .map(|m| Entry {
                platform: oci::descriptor_platform(&serde_json::from_value(m.clone()).unwrap()),
                digest: m["digest"].as_str().unwrap().parse().unwrap(),
                size: 1,
            })
            .collect()
    }

    /// Checks every entry of `fake`'s index against linux/amd64 and linux/arm64.
    async fn checked(fake: &Fake) -> Vec<PlatformCoverage> {
        let mut warnings = Vec::new();
        let both = target(&["amd64", "arm64"]);
        let (found, _) = check_entries(fake, &both, &entries_of(fake), &mut warnings)
            .await
            .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        found
    }

    /// Every entry's manifest, config and referrers are asked for in one wave when the
    /// configs are remembered; otherwise each config waits for its manifest.
    #[tokio::test]
    async fn remembered_configs_are_read_in_the_same_wave_as_their_manifests() {
        let fake = Fake::two_platforms(true);
        assert_both_platforms_ok(&checked(&fake).await);
        assert_eq!(fake.asked.lock().unwrap().len(), 6);
        assert_eq!(fake.asked_late(), Vec::<String>::new());

        let cold = Fake::two_platforms(false);
        assert_both_platforms_ok(&checked(&cold).await);
        let late = cold.asked_late();
        assert!(
            late.len() == 2 && late.iter().all(|r| r.starts_with("config")),
            "{late:?}"
        );
    }

    /// A remembered config the manifest does not name is not used: the named one is read.
    #[tokio::test]
    async fn a_wrongly_remembered_config_is_not_trusted() {
        let mut fake = Fake::two_platforms(true);
        let amd64 = fake.known.keys().next().unwrap().clone();
        let other = fake.known.values().nth(1).unwrap().clone();
        fake.known.insert(amd64, other);
        assert_both_platforms_ok(&checked(&fake).await);
        assert_eq!(fake.asked_late().len(), 1, "{:?}", fake.asked_late());
    }
}

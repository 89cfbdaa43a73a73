//! Reading a reference back into what it holds: the manifest it resolves to, the platform
//! entries of its (possibly nested) indexes with attestations set aside, each entry
//! checked.

use super::attached;
use super::coverage_record::PlatformCoverage;
use super::entry::{check_entries, Entry};
use super::error::{parse_digest, target_error, unreadable, VerifyError};
use super::source::ContentSource;
use super::target::Target;
use crate::base::digest::Digest;
use crate::base::oci::{self, Parsed};
use crate::base::progress::{Event, Phase, Reporter};
use crate::registry::{ClientError, RegistryError};
use futures_util::future::Either;
use std::collections::{BTreeMap, HashSet};

/// Nested indexes deeper than this are reported rather than followed.
const MAX_INDEX_DEPTH: usize = 4;

/// Descriptors read over an index and the indexes nested in it. Real indexes list a few
/// platforms and their attestations; a hostile one fanning out 64 wide and 4 deep asked
/// for 3 GB before this cap, and 20,000 entries for 43,000 requests.
pub const MAX_ENTRIES: usize = 1024;

/// What a reference holds, entry by entry, before any platform is declared: the deploy gate
/// judges each entry against the nodes that would pull it.
pub struct Contents<E = ClientError> {
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: Digest,
    pub media_type: String,
    /// Size in bytes of what the reference resolves to, as read back.
    pub size: u64,
    /// The index's annotations.
    pub annotations: BTreeMap<String, String>,
    /// Every platform entry in index order, its config (and with `deep` its binary) checked
    /// against the entry's platform.
    pub entries: Vec<PlatformCoverage>,
    /// Digests of attestation entries (`unknown/unknown`).
    pub attestations: Vec<String>,
    pub warnings: Vec<String>,
    /// `gate --require-signature`: the index's signature (each entry's is its `signed`).
    pub signed: Option<crate::verify::coverage_record::Signed>,
    /// What is attached to each entry, by the entry's digest.
    pub(crate) attached: BTreeMap<Digest, attached::Listing<E>>,
}

impl<E: std::fmt::Display> Contents<E> {
    /// Fills each entry's `attached` from what was listed for it (the gate's
    /// `--require-sbom`); a listing that cannot be read is a warning, as for `verify`.
    pub fn fill_attached(&mut self, target: &Target) -> Result<(), VerifyError<E>> {
        let listings = std::mem::take(&mut self.attached);
        attached::apply(target, &mut self.entries, listings, &mut self.warnings)
    }
}

/// What an index and the indexes nested in it hold.
#[derive(Default)]
struct Collected {
    entries: Vec<Entry>,
    /// Attestation entries, skipped: their digests.
    attestations: Vec<String>,
    warnings: Vec<String>,
}

/// Reads the reference and checks every entry; `target.declared` is not looked at.
pub async fn read_contents<S: ContentSource>(
    source: &S,
    target: &Target,
    reporter: &dyn Reporter,
) -> Result<Contents<S::Error>, VerifyError<S::Error>> {
    reporter.report(Event::Phase {
        image: target.name.clone(),
        platform: None,
        phase: Phase::Verify,
        message: format!("reading {} back", target.reference),
    });
    // What the reference named last time is read beside resolving it again: if it still
    // names that digest, everything was read in the same wave as the reference itself.
    // A reference that moved has the reads for its old manifest dropped as soon as that is
    // known (with `--deep` they stream layers).
    let (bytes, digest) = match source.last_resolved() {
        Some((last, last_digest)) => {
            let guessed = std::pin::pin!(contents_of(source, target, last, last_digest.clone()));
            let now = std::pin::pin!(source.resolve());
            let (now, guessed) = match futures_util::future::select(now, guessed).await {
                Either::Left((now, guessed)) => (now, Either::Left(guessed)),
                Either::Right((contents, now)) => (now.await, Either::Right(contents)),
            };
            let now = now.map_err(VerifyError::Source)?;
            if now.1 == last_digest {
                return match guessed {
                    Either::Left(guessed) => guessed.await,
                    Either::Right(contents) => contents,
                };
            }
            now
        }
        None => source.resolve().await.map_err(VerifyError::Source)?,
    };
    source.resolved(&bytes, &digest);
    contents_of(source, target, bytes, digest).await
}

/// What the manifest `bytes` (of `digest`) the reference resolved to holds, entry by
/// entry, each checked.
async fn contents_of<S: ContentSource>(
    source: &S,
    target: &Target,
    bytes: Vec<u8>,
    digest: Digest,
) -> Result<Contents<S::Error>, VerifyError<S::Error>> {
    let size = bytes.len() as u64;
    let mut warnings = Vec::new();
    let mut attestations = Vec::new();
    let mut entries = Vec::new();
    let mut annotations = BTreeMap::new();
    let media_type = match oci::parse_manifest(&bytes).map_err(|e| unreadable(target, e))? {
        Parsed::Unknown { media_type } => {
            warnings.push(format!(
                "{} has media type {media_type}, which is not an image index or manifest",
                target.reference
            ));
            media_type
        }
        Parsed::Image { media_type, .. } => {
            entries.push(Entry {
                platform: None,
                digest: digest.clone(),
                size: bytes.len() as u64,
            });
            media_type
        }
        Parsed::Index { media_type, index } => {
            annotations = index
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            let collected = collect_entries(source, target, index).await?;
            entries = collected.entries;
            attestations = collected.attestations;
            warnings.extend(collected.warnings);
            media_type
        }
    };

    let (found, attached) = check_entries(source, target, &entries, &mut warnings).await?;
    Ok(Contents {
        digest,
        media_type,
        size,
        annotations,
        entries: found,
        attestations,
        warnings,
        signed: None,
        attached,
    })
}

/// Flattens (possibly nested) indexes into platform entries, setting aside attestations.
async fn collect_entries<S: ContentSource>(
    source: &S,
    target: &Target,
    index: Box<oci_spec::image::ImageIndex>,
) -> Result<Collected, VerifyError<S::Error>> {
    // Counted as each index is read, so a wide one stops the walk before its nested
    // indexes are asked for.
    let mut walked = 0;
    let mut within_budget = |index: &oci_spec::image::ImageIndex| {
        walked += index.manifests().len();
        if walked <= MAX_ENTRIES {
            return Ok(());
        }
        Err(target_error(
            target,
            RegistryError::TooManyEntries {
                reference: target.reference.clone(),
                limit: MAX_ENTRIES,
            },
        ))
    };
    within_budget(&index)?;
    let mut found = Collected::default();
    let mut pending = vec![(index, 0)];
    let mut nested_read = HashSet::new();
    while let Some((index, depth)) = pending.pop() {
        for descriptor in index.manifests() {
            let media_type = descriptor.media_type().to_string();
            if oci::is_attestation(descriptor) {
                found.attestations.push(descriptor.digest().to_string());
                continue;
            }
            let digest = parse_digest(target, descriptor.digest())?;
            if oci::is_index_media_type(&media_type) {
                if depth + 1 >= MAX_INDEX_DEPTH {
                    found.warnings.push(format!(
                        "index {digest} is nested more than {MAX_INDEX_DEPTH} deep; not followed"
                    ));
                    continue;
                }
                // Listed again (here or in another nested index): its entries are in.
                if !nested_read.insert(digest.clone()) {
                    continue;
                }
                let bytes = source
                    .manifest(&digest)
                    .await
                    .map_err(VerifyError::Source)?;
                match oci::parse_manifest(&bytes) {
                    Ok(Parsed::Index { index, .. }) => {
                        within_budget(&index)?;
                        pending.push((index, depth + 1));
                    }
                    Ok(_) => found
                        .warnings
                        .push(format!("{digest} claims to be an index but is not")),
                    Err(e) => found.warnings.push(format!("nested index {digest}: {e}")),
                }
            } else if oci::is_image_media_type(&media_type) {
                found.entries.push(Entry {
                    platform: oci::descriptor_platform(descriptor),
                    digest,
                    size: descriptor.size(),
                });
            } else {
                found.warnings.push(format!(
                    "entry {digest} has unknown media type {media_type}; ignored"
                ));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::progress::Silent;
    use crate::verify::fake::{assert_both_platforms_ok, target, Fake};
    use serde_json::json;

    /// With what the reference named last time remembered, the reference and every entry's
    /// manifest, config and referrers are asked for in one wave.
    #[tokio::test]
    async fn a_remembered_index_is_read_in_the_same_wave_as_the_reference() {
        let mut fake = Fake::two_platforms(true);
        fake.last = Some((fake.index.clone(), Digest::of(&fake.index)));
        let contents = read_contents(&fake, &target(&["amd64", "arm64"]), &Silent)
            .await
            .unwrap();
        assert_both_platforms_ok(&contents.entries);
        assert!(contents.attestations.is_empty());
        assert_eq!(fake.asked.lock().unwrap().len(), 7);
        assert_eq!(fake.asked_late(), Vec::<String>::new());
    }

    /// A reference that moved since it was remembered: what it names now is read, and the
    /// reads for what it named before are dropped unfinished.
    #[tokio::test]
    async fn a_remembered_index_the_reference_no_longer_names_is_not_trusted() {
        let mut fake = Fake::two_platforms(true);
        let gone = json!({"mediaType": oci::OCI_MANIFEST, "digest": Digest::of(b"gone").as_str(),
            "size": 1, "platform": {"architecture": "amd64", "os": "linux"}});
        let old = json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX, "manifests": [gone]});
        let old = old.to_string().into_bytes();
        fake.last = Some((old.clone(), Digest::of(&old)));
        let both = target(&["amd64", "arm64"]);
        let read = read_contents(&fake, &both, &Silent);
        let contents = tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("the old manifest's unending read was not dropped")
            .unwrap();
        assert_eq!(contents.digest, Digest::of(&fake.index));
        assert_both_platforms_ok(&contents.entries);
        assert!(contents.attestations.is_empty());
    }

    /// The two platform entries of `Fake::two_platforms`'s index.
    fn platform_entries(fake: &Fake) -> Vec<serde_json::Value> {
        let index: serde_json::Value = serde_json::from_slice(&fake.index).unwrap();
        index["manifests"].as_array().unwrap().clone()
    }

    fn index_of(entries: Vec<serde_json::Value>, marker: usize) -> Vec<u8> {
        json!({"schemaVersion": 2, "mediaType": oci::OCI_INDEX, "manifests": entries,
               "annotations": {"marker": marker.to_string()}})
        .to_string()
        .into_bytes()
    }

    fn nested(digest: &Digest) -> serde_json::Value {
        json!({"mediaType": oci::OCI_INDEX, "digest": digest.as_str(), "size": 1})
    }

    fn reads(fake: &Fake, what: &str, digest: &Digest) -> usize {
        let name = format!("{what} {}", digest.short());
        let asked = fake.asked.lock().unwrap();
        asked.iter().filter(|(n, _)| *n == name).count()
    }

    /// Nested indexes fanning out, each listing 64 others: the walk stops at the entry
    /// budget, having read no more nested indexes than fit in it.
    #[tokio::test]
    async fn an_index_fanning_out_past_the_entry_budget_is_refused() {
        let mut fake = Fake::two_platforms(false);
        let entry = platform_entries(&fake)[0].clone();
        let leaves: Vec<Digest> = (0..64)
            .map(|i| fake.put(index_of(vec![entry.clone(); 64], i)))
            .collect();
        fake.index = index_of(leaves.iter().map(nested).collect(), 64);
        let refused = read_contents(&fake, &target(&["amd64"]), &Silent).await;
        let Err(VerifyError::Content(ClientError::Registry { source, .. })) = refused else {
            panic!("not refused");
        };
        assert!(
            matches!(*source, RegistryError::TooManyEntries { limit, .. } if limit == MAX_ENTRIES),
            "{source:?}"
        );
        let read = fake.asked.lock().unwrap().len();
        assert!(read <= MAX_ENTRIES / 64, "{read} reads");
    }

    /// An index that lists one nested index twice, and one platform manifest three times:
    /// each is read once, and every listing still counts as an entry.
    #[tokio::test]
    async fn what_an_index_lists_again_is_read_once() {
        let mut fake = Fake::two_platforms(false);
        let entries = platform_entries(&fake);
        let amd64: Digest = entries[0]["digest"].as_str().unwrap().parse().unwrap();
        let inner = fake.put(index_of(entries.clone(), 0));
        fake.index = index_of(
            vec![
                nested(&inner),
                nested(&inner),
                entries[0].clone(),
                entries[0].clone(),
            ],
            1,
        );
        let contents = read_contents(&fake, &target(&["amd64", "arm64"]), &Silent)
            .await
            .unwrap();
        assert_eq!(contents.entries.len(), 4);
        assert_eq!(reads(&fake, "manifest", &inner), 1);
        assert_eq!(reads(&fake, "manifest", &amd64), 1);
        assert_eq!(reads(&fake, "referrers", &amd64), 1);
    }
}

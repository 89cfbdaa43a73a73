//! What is attached to each platform entry (OCI referrers: provenance, signatures, SBOMs),
//! each referrer read and checked to name the entry as its subject, and whether provenance
//! the target requires is there.

use super::error::{target_error, VerifyError};
use super::source::ContentSource;
use super::target::Target;
use crate::base::attachment::{self, Attached, ReferrerError};
use crate::base::digest::{Digest, DigestError};
use crate::registry::RegistryError;
use crate::verify::coverage_record::{PlatformCoverage, PlatformStatus};
use futures_util::StreamExt;
use std::collections::{BTreeMap, HashSet};

/// What is attached to one entry, or the failure to list it: the source's, or a listing
/// past [`MAX_REFERRERS`].
pub(crate) type Listing<E> = Result<(Vec<Attached>, Vec<String>), VerifyError<E>>;

/// The referrers read for one entry. Signatures, SBOMs, provenance and VEX documents of a
/// few builds and signers stay far below it; a longer listing would cost a request each
/// (a hostile registry's 20,000 took 13,500 requests over 300 s), so it is refused.
pub(super) const MAX_REFERRERS: usize = 256;

/// Referrer manifests read at once for one entry.
const READS_IN_FLIGHT: usize = 8;

/// Lists what is attached to each of `digests`, concurrently.
pub(super) async fn list<S: ContentSource>(
    source: &S,
    target: &Target,
    digests: &[&Digest],
) -> BTreeMap<Digest, Listing<S::Error>> {
    let listed = source.referrers_of(digests).await;
    let checks = digests
        .iter()
        .zip(listed)
        .map(|(d, l)| attached_to(source, target, d, l));
    let listings = futures_util::future::join_all(checks).await;
    digests.iter().map(|d| (*d).clone()).zip(listings).collect()
}

/// Fills each entry's `attached` from its listing. When provenance or an SBOM is
/// required, an entry without it becomes a gap and a listing that cannot be read is an
/// error; otherwise that is a warning.
pub(super) fn apply<E>(
    target: &Target,
    platforms: &mut [PlatformCoverage],
    mut listings: BTreeMap<Digest, Listing<E>>,
    warnings: &mut Vec<String>,
) -> Result<(), VerifyError<E>>
where
    E: std::fmt::Display,
{
    for platform in platforms.iter_mut() {
        let Some(digest) = platform.digest.clone() else {
            continue;
        };
        match listings
            .remove(&digest)
            .unwrap_or_else(|| Ok(Default::default()))
        {
            Ok((attached, ignored)) => {
                platform.attached = attached;
                warnings.extend(ignored.into_iter().map(|why| {
                    format!(
                        "{} ({digest}) lists referrer {why}; ignored",
                        platform.platform
                    )
                }));
            }
            Err(VerifyError::Source(e)) if !target.require_provenance && !target.require_sbom => {
                warnings.push(format!(
                    "cannot list what is attached to {} ({digest}): {e}",
                    platform.platform
                ));
            }
            Err(e) => return Err(e),
        }
        let required = [
            (
                target.require_provenance,
                Attached::is_provenance as fn(&Attached) -> bool,
                PlatformStatus::ProvenanceMissing,
                ("SLSA provenance", "provenance"),
            ),
            (
                target.require_sbom,
                Attached::is_sbom,
                PlatformStatus::SbomMissing,
                ("SBOM", "sbom"),
            ),
        ];
        for (wanted, is_it, gap, (what, field)) in required {
            if !wanted
                || platform.status != PlatformStatus::Ok
                || platform.attached.iter().any(is_it)
            {
                continue;
            }
            platform.status = gap;
            platform.detail = Some(format!(
                "{} {} ({digest}) has no {what} attached; build image {} with `{field}: true` in polyarch.yaml (or `polyarch build --{field}`)",
                target.reference, platform.platform, target.name
            ));
        }
    }
    Ok(())
}

/// The referrers of one entry that check out, and why each other one listed does not.
/// A referrer listed twice is read once.
async fn attached_to<S: ContentSource>(
    source: &S,
    target: &Target,
    digest: &Digest,
    listed: Result<Vec<serde_json::Value>, S::Error>,
) -> Listing<S::Error> {
    let listed = listed.map_err(VerifyError::Source)?;
    if listed.len() > MAX_REFERRERS {
        return Err(target_error(
            target,
            RegistryError::TooManyReferrers {
                reference: target.reference.clone(),
                subject: digest.to_string(),
                listed: listed.len(),
                limit: MAX_REFERRERS,
            },
        ));
    }
    let mut seen = HashSet::new();
    let distinct = attachment::attached(&listed)
        .into_iter()
        .filter(|found| seen.insert(found.digest.clone()));
    let checks = futures_util::stream::iter(distinct.map(|found| async move {
        let outcome = checked(source, &found, digest).await;
        (found, outcome)
    }))
    .buffered(READS_IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    let (mut attached, mut ignored) = (Vec::new(), Vec::new());
    for (found, outcome) in checks {
        match outcome {
            Ok(one) => attached.push(one),
            Err(why) => ignored.push(format!("{} which {why}", found.digest)),
        }
    }
    Ok((attached, ignored))
}

/// Why a listed referrer is ignored, said after its digest.
#[derive(Debug, thiserror::Error)]
enum Ignored<E> {
    #[error("{0}")]
    Digest(#[source] DigestError),
    #[error("cannot be read ({0})")]
    Unreadable(#[source] E),
    #[error(transparent)]
    Referrer(#[from] ReferrerError),
}

/// A listed referrer as its manifest says: it must name `subject`; its predicate type
/// is its in-toto layer's.
async fn checked<S: ContentSource>(
    source: &S,
    found: &Attached,
    subject: &Digest,
) -> std::result::Result<Attached, Ignored<S::Error>> {
    let digest: Digest = found.digest.parse().map_err(Ignored::Digest)?;
    let bytes = source
        .manifest(&digest)
        .await
        .map_err(Ignored::Unreadable)?;
    let predicate_type = attachment::check_referrer(&bytes, subject)?;
    Ok(Attached {
        predicate_type: predicate_type.or_else(|| found.predicate_type.clone()),
        ..found.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{ClientError, RegistryError};
    use crate::verify::entrypoint::DeepReport;
    use crate::Platform;
    use serde_json::{json, Value};

    async fn read_attached(
        source: &Fake,
        target: &Target,
        platforms: &mut [PlatformCoverage],
        warnings: &mut Vec<String>,
    ) -> Result<(), VerifyError<ClientError>> {
        let digests: Vec<&Digest> = platforms.iter().filter_map(|p| p.digest.as_ref()).collect();
        let listings = list(source, target, &digests).await;
        apply(target, platforms, listings, warnings)
    }

    /// Manifests by digest and referrer listings by subject; counts the manifests read.
    struct Fake {
        manifests: BTreeMap<String, Vec<u8>>,
        listings: BTreeMap<String, Vec<Value>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl ContentSource for Fake {
        type Error = ClientError;

        async fn resolve(&self) -> Result<(Vec<u8>, Digest), ClientError> {
            unreachable!("not resolved here")
        }
        async fn manifest(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.manifests.get(digest.as_str()).cloned().ok_or_else(|| {
                ClientError::registry(
                    "fake",
                    RegistryError::NotFound {
                        what: "read manifest".into(),
                        reference: digest.to_string(),
                    },
                )
            })
        }
        async fn json_blob(&self, digest: &Digest) -> Result<Vec<u8>, ClientError> {
            self.manifest(digest).await
        }
        async fn referrers(&self, digest: &Digest) -> Result<Vec<Value>, ClientError> {
            self.listings.get(digest.as_str()).cloned().ok_or_else(|| {
                ClientError::registry(
                    "fake",
                    RegistryError::Refused {
                        what: format!("list referrers of {digest}"),
                        reference: "fake".into(),
                        detail: "listing refused".into(),
                        source: None,
                    },
                )
            })
        }
        fn repository(&self) -> String {
            "fake".into()
        }
        async fn inspect(
            &self,
            _: &[u8],
            _: &[(Digest, String)],
            _: &Platform,
        ) -> Result<DeepReport, ClientError> {
            unreachable!("no deep checks here")
        }
    }

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn entry(arch: &str, c: char) -> PlatformCoverage {
        crate::verify::fake::agreeing_entry(arch, Some(digest(c).parse().unwrap()))
    }

    /// A referrer manifest naming `subject`, with an in-toto SLSA layer.
    fn statement_manifest(subject: &str) -> Vec<u8> {
        json!({
            "schemaVersion": 2,
            "artifactType": attachment::IN_TOTO,
            "layers": [{"mediaType": attachment::IN_TOTO, "digest": digest('9'), "size": 1,
                        "annotations": {attachment::PREDICATE_TYPE: attachment::SLSA_PROVENANCE}}],
            "subject": {"digest": subject, "size": 400},
        })
        .to_string()
        .into_bytes()
    }

    fn listed(c: char) -> Value {
        json!({"mediaType": crate::base::oci::OCI_MANIFEST, "digest": digest(c), "size": 1,
               "artifactType": attachment::IN_TOTO})
    }

    fn target(require_provenance: bool) -> Target {
        Target {
            name: "api".into(),
            reference: "r.io/api:v1".into(),
            tags: vec!["v1".into()],
            declared: vec![],
            deep: false,
            require_provenance,
            require_sbom: false,
        }
    }

    fn fake() -> Fake {
        // amd64 (a): a good statement (1), one naming another subject (2), one missing (3).
        // arm64 (b): nothing attached.
        Fake {
            manifests: BTreeMap::from([
                (digest('1'), statement_manifest(&digest('a'))),
                (digest('2'), statement_manifest(&digest('b'))),
            ]),
            listings: BTreeMap::from([
                (digest('a'), vec![listed('1'), listed('2'), listed('3')]),
                (digest('b'), vec![]),
            ]),
            reads: Default::default(),
        }
    }

    #[tokio::test]
    async fn only_referrers_naming_the_entry_count_and_missing_provenance_is_a_gap() {
        let mut platforms = [entry("amd64", 'a'), entry("arm64", 'b')];
        let mut warnings = Vec::new();
        read_attached(&fake(), &target(true), &mut platforms, &mut warnings)
            .await
            .unwrap();
        assert_eq!(platforms[0].attached.len(), 1, "{warnings:?}");
        assert!(platforms[0].attached[0].is_provenance());
        assert_eq!(platforms[0].status, PlatformStatus::Ok);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("names subject"), "{warnings:?}");
        assert!(warnings[1].contains("cannot be read"), "{warnings:?}");
        assert_eq!(platforms[1].status, PlatformStatus::ProvenanceMissing);
        let detail = platforms[1].detail.as_deref().unwrap();
        assert!(
            detail.contains("r.io/api:v1 linux/arm64") && detail.contains("provenance: true"),
            "{detail}"
        );
    }

    #[tokio::test]
    async fn provenance_is_not_an_sbom_and_a_required_sbom_is_named_with_its_field() {
        let required = Target {
            require_sbom: true,
            ..target(false)
        };
        let mut platforms = [entry("amd64", 'a'), entry("arm64", 'b')];
        read_attached(&fake(), &required, &mut platforms, &mut Vec::new())
            .await
            .unwrap();
        for platform in &platforms {
            assert_eq!(platform.status, PlatformStatus::SbomMissing);
            let detail = platform.detail.as_deref().unwrap();
            assert!(
                detail.contains("has no SBOM attached") && detail.contains("`sbom: true`"),
                "{detail}"
            );
        }
        let unlisted = Fake {
            listings: BTreeMap::new(),
            ..fake()
        };
        let mut platforms = [entry("amd64", 'a')];
        let outcome = read_attached(&unlisted, &required, &mut platforms, &mut Vec::new()).await;
        assert!(
            matches!(outcome, Err(VerifyError::Source(_))),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn an_unreadable_listing_is_an_error_only_where_provenance_is_required() {
        let source = Fake {
            listings: BTreeMap::new(),
            ..fake()
        };
        let mut platforms = [entry("amd64", 'a')];
        let mut warnings = Vec::new();
        read_attached(&source, &target(false), &mut platforms, &mut warnings)
            .await
            .unwrap();
        assert_eq!(platforms[0].status, PlatformStatus::Ok);
        assert!(warnings[0].contains("listing refused"), "{warnings:?}");
        let outcome = read_attached(&source, &target(true), &mut platforms, &mut warnings).await;
        assert!(
            matches!(
                outcome,
                Err(VerifyError::Source(ClientError::Registry { .. }))
            ),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn a_referrer_listed_twice_is_read_once() {
        let source = Fake {
            listings: BTreeMap::from([(digest('a'), vec![listed('1'); MAX_REFERRERS])]),
            ..fake()
        };
        let mut platforms = [entry("amd64", 'a')];
        let mut warnings = Vec::new();
        read_attached(&source, &target(true), &mut platforms, &mut warnings)
            .await
            .unwrap();
        assert_eq!(platforms[0].attached.len(), 1, "{warnings:?}");
        assert_eq!(source.reads.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_listing_past_the_limit_is_refused_unread_whatever_is_required() {
        let many: Vec<Value> = (0..=MAX_REFERRERS)
            .map(|i| {
                json!({"mediaType": crate::base::oci::OCI_MANIFEST, "size": 1,
                       "digest": format!("sha256:{i:064x}")})
            })
            .collect();
        let source = Fake {
            listings: BTreeMap::from([(digest('a'), many)]),
            ..fake()
        };
        for required in [false, true] {
            let mut platforms = [entry("amd64", 'a')];
            let mut warnings = Vec::new();
            let outcome =
                read_attached(&source, &target(required), &mut platforms, &mut warnings).await;
            let Err(VerifyError::Content(ClientError::Registry { source: why, .. })) = outcome
            else {
                panic!("{outcome:?}");
            };
            assert!(
                matches!(*why, RegistryError::TooManyReferrers { listed, limit, .. }
                    if listed == MAX_REFERRERS + 1 && limit == MAX_REFERRERS),
                "{why:?}"
            );
        }
        assert_eq!(source.reads.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}

//! `--require-signature`: the index and each platform manifest must carry a Sigstore
//! bundle (an OCI referrer, as polyarch and `cosign sign --key` attach it) that one of the
//! keys given signed over a statement naming that manifest's digest.

use super::attached::MAX_REFERRERS;
use super::coverage_record::{ImageCoverage, PlatformStatus, Signed};
use super::source::ContentSource;
use crate::base::attachment::{self, SIGSTORE_BUNDLE};
use crate::base::digest::Digest;
use crate::sign::{self, PublicKey, SignatureGap};
use std::collections::HashSet;

/// Why a manifest has no signature that counts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsigned {
    #[error("has no signature attached")]
    Missing,
    /// The first bundle attached that did not check out, and why.
    #[error("has a signature ({bundle}) that {gap}")]
    Bad { bundle: Digest, gap: SignatureGap },
}

/// The fingerprint of a key among `keys` that signed `subject`, or why none did. A
/// referrer whose manifest names another subject is not counted at all: the listing,
/// not the signer, is wrong. The source's failures are handed up (exit 3).
pub async fn signature<S: ContentSource>(
    source: &S,
    subject: &Digest,
    keys: &[PublicKey],
) -> Result<Result<String, Unsigned>, S::Error> {
    let listed = source.referrers(subject).await?;
    let mut seen = HashSet::new();
    let bundles = attachment::attached(&listed)
        .into_iter()
        .filter(|a| is_bundle_or_unnamed(a) && seen.insert(a.digest.clone()))
        .filter_map(|a| Some((a.digest.parse::<Digest>().ok()?, a.is_signature())))
        // Each costs two reads; a listing longer than verify reads at all is cut.
        .take(MAX_REFERRERS);
    let mut first_gap = None;
    for (bundle, listed_as_bundle) in bundles {
        let bytes = source.manifest(&bundle).await?;
        if attachment::check_referrer(&bytes, subject).is_err() {
            continue;
        }
        let manifest: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let layer = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["mediaType"] == SIGSTORE_BUNDLE)
            .and_then(|l| l["digest"].as_str()?.parse::<Digest>().ok());
        let checked = match layer {
            Some(layer) => sign::check(&source.json_blob(&layer).await?, subject, keys),
            None if listed_as_bundle => Err(SignatureGap::NotABundle("no bundle layer".into())),
            // Another kind of artifact, listed without saying so.
            None => continue,
        };
        match checked {
            Ok(key) => return Ok(Ok(key.fingerprint.clone())),
            Err(gap) => {
                first_gap.get_or_insert(Unsigned::Bad { bundle, gap });
            }
        }
    }
    Ok(Err(first_gap.unwrap_or(Unsigned::Missing)))
}

/// Whether a listed referrer may be a signature: listed as a bundle, or listed with no
/// artifact type of its own. cosign 3 on a registry without the referrers API lists its
/// bundle under the empty config's media type, so the manifest says what it is.
fn is_bundle_or_unnamed(listed: &attachment::Attached) -> bool {
    match listed.artifact_type.as_deref() {
        None | Some(attachment::EMPTY_MEDIA_TYPE) => true,
        Some(_) => listed.is_signature(),
    }
}

/// Checks the signatures of `image`'s index and platform manifests, read at once: each
/// gets `signed`; a platform without a good one becomes `signature_missing`, an index
/// without one leaves the image not covered.
pub async fn check_image<S: ContentSource>(
    source: &S,
    image: &mut ImageCoverage,
    keys: &[PublicKey],
) -> Result<(), S::Error> {
    let subjects: Vec<Digest> = std::iter::once(image.digest.clone())
        .chain(image.platforms.iter().filter_map(|p| p.digest.clone()))
        .collect();
    let found =
        futures_util::future::try_join_all(subjects.iter().map(|s| signature(source, s, keys)))
            .await?;
    let mut found = found.into_iter();
    let outcome = found.next().expect("the index is checked first");
    let mut index = signed(&outcome);
    if let Err(why) = outcome {
        index.gap = Some(format!(
            "{} index ({}) {why}",
            image.reference, image.digest
        ));
        image.covered = false;
    }
    image.signed = Some(index);
    for (platform, outcome) in image
        .platforms
        .iter_mut()
        .filter(|p| p.digest.is_some())
        .zip(found)
    {
        platform.signed = Some(signed(&outcome));
        let (Err(why), Some(digest)) = (outcome, &platform.digest) else {
            continue;
        };
        if platform.status == PlatformStatus::Ok {
            platform.status = PlatformStatus::SignatureMissing;
            platform.detail = Some(format!(
                "{} {} ({digest}) {why}; sign image {} with `sign: {{key: …}}` in polyarch.yaml (or `polyarch build --sign-key`), or `cosign sign --key`, using the private key of a --key given",
                image.reference, platform.platform, image.name
            ));
        }
        image.covered = false;
    }
    Ok(())
}

/// What the record says of a manifest's signature.
pub fn signed(outcome: &Result<String, Unsigned>) -> Signed {
    match outcome {
        Ok(key) => Signed {
            verified: true,
            key: Some(key.clone()),
            gap: None,
        },
        Err(why) => Signed {
            verified: false,
            key: None,
            gap: Some(why.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::oci;
    use crate::sign::SigningKey;
    use crate::verify::fake::{agreeing_entry, Fake};
    use serde_json::json;

    /// Attaches `key`'s signature over `signed` to `subject`, as a registry lists it.
    fn attach(fake: &mut Fake, key: &SigningKey, subject: &Digest, signed: &Digest) {
        let descriptor = json!({"mediaType": oci::OCI_MANIFEST, "digest": signed, "size": 1});
        let mut referrer = sign::sign(key, descriptor);
        if subject != signed {
            // A bundle copied onto another manifest: its referrer manifest names that one.
            let mut manifest: serde_json::Value =
                serde_json::from_slice(&referrer.manifest.bytes).unwrap();
            manifest["subject"]["digest"] = json!(subject);
            referrer.manifest.bytes = serde_json::to_vec(&manifest).unwrap();
            referrer.manifest.digest = Digest::of(&referrer.manifest.bytes);
        }
        fake.put(attachment::Referrer::config().0.to_vec());
        fake.put(referrer.layer.0.clone());
        fake.put(referrer.manifest.bytes.clone());
        fake.listings
            .entry(subject.clone())
            .or_default()
            .push(referrer.descriptor());
    }

    /// A 2-platform index, its digest and its platform manifests' digests.
    fn image() -> (Fake, ImageCoverage) {
        let fake = Fake::two_platforms(false);
        let index: serde_json::Value = serde_json::from_slice(&fake.index).unwrap();
        let platforms = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .zip(["amd64", "arm64"])
            .map(|(e, arch)| agreeing_entry(arch, e["digest"].as_str().unwrap().parse().ok()))
            .collect();
        let image = ImageCoverage {
            name: "app".into(),
            reference: "r.io/app:v1".into(),
            tags: vec!["v1".into()],
            digest: Digest::of(&fake.index),
            pinned: String::new(),
            media_type: oci::OCI_INDEX.into(),
            size: None,
            annotations: Default::default(),
            declared: Vec::new(),
            platforms,
            missing: Vec::new(),
            unexpected: Vec::new(),
            attestations: Vec::new(),
            warnings: Vec::new(),
            covered: true,
            unpublished: None,
            signed: None,
        };
        (fake, image)
    }

    fn digests(image: &ImageCoverage) -> Vec<Digest> {
        std::iter::once(image.digest.clone())
            .chain(image.platforms.iter().filter_map(|p| p.digest.clone()))
            .collect()
    }

    #[tokio::test]
    async fn a_signature_by_any_key_given_counts_for_its_own_digest_only() {
        let (signer, other) = (SigningKey::random(), SigningKey::random());
        let keys = [
            other.public("other.pub".as_ref()),
            signer.public("signer.pub".as_ref()),
        ];
        let (mut fake, _) = image();
        // The fake serves a subject's referrers only if it holds the subject.
        let [a, b, c] = [b"a", b"b", b"c"].map(|m| fake.put(m.to_vec()));
        attach(&mut fake, &signer, &a, &a);
        attach(&mut fake, &signer, &b, &c);
        assert_eq!(
            signature(&fake, &a, &keys).await.unwrap(),
            Ok(signer.fingerprint.clone())
        );
        assert_eq!(
            signature(&fake, &a, &keys[..1]).await.unwrap(),
            Err(Unsigned::Bad {
                bundle: fake.listings[&a][0]["digest"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
                gap: SignatureGap::OtherKey
            })
        );
        let copied = signature(&fake, &b, &keys).await.unwrap().unwrap_err();
        assert!(
            matches!(&copied, Unsigned::Bad { gap: SignatureGap::OtherDigest { named, .. }, .. }
                if *named == c.as_str()),
            "{copied:?}"
        );
        assert_eq!(
            signature(&fake, &c, &keys).await.unwrap(),
            Err(Unsigned::Missing)
        );
    }

    #[tokio::test]
    async fn every_manifest_signed_is_covered_and_each_one_unsigned_is_a_gap() {
        let signer = SigningKey::random();
        let keys = [signer.public("signer.pub".as_ref())];
        let (mut fake, mut image) = image();
        for digest in digests(&image) {
            attach(&mut fake, &signer, &digest, &digest);
        }
        check_image(&fake, &mut image, &keys).await.unwrap();
        assert!(image.covered);
        let signed = Signed {
            verified: true,
            key: Some(signer.fingerprint.clone()),
            gap: None,
        };
        assert_eq!(image.signed.as_ref(), Some(&signed));
        for p in &image.platforms {
            assert_eq!(
                (&p.status, p.signed.as_ref()),
                (&PlatformStatus::Ok, Some(&signed))
            );
        }

        // Signed by another key: every manifest is a gap, each named.
        let (_, mut image) = self::image();
        let other = [SigningKey::random().public("other.pub".as_ref())];
        check_image(&fake, &mut image, &other).await.unwrap();
        assert!(!image.covered);
        let index_gap = image.signed.as_ref().unwrap().gap.as_deref().unwrap();
        assert!(
            index_gap.contains(&format!("r.io/app:v1 index ({})", image.digest))
                && index_gap.contains("signed by none of the keys given"),
            "{index_gap}"
        );
        for p in &image.platforms {
            assert_eq!(p.status, PlatformStatus::SignatureMissing);
            let detail = p.detail.as_deref().unwrap();
            assert!(
                detail.contains(&format!("r.io/app:v1 {}", p.platform))
                    && detail.contains(p.digest.as_ref().unwrap().as_str())
                    && detail.contains("signed by none of the keys given"),
                "{detail}"
            );
        }
    }

    #[tokio::test]
    async fn an_unsigned_platform_is_a_gap_beside_a_signed_index() {
        let signer = SigningKey::random();
        let keys = [signer.public("signer.pub".as_ref())];
        let (mut fake, mut image) = image();
        let all = digests(&image);
        attach(&mut fake, &signer, &all[0], &all[0]);
        attach(&mut fake, &signer, &all[1], &all[1]);
        check_image(&fake, &mut image, &keys).await.unwrap();
        assert!(!image.covered);
        assert!(image.signed.as_ref().unwrap().verified);
        assert_eq!(image.platforms[0].status, PlatformStatus::Ok);
        assert_eq!(image.platforms[1].status, PlatformStatus::SignatureMissing);
        let detail = image.platforms[1].detail.as_deref().unwrap();
        assert!(
            detail.contains("linux/arm64") && detail.contains("has no signature attached"),
            "{detail}"
        );
    }

    #[tokio::test]
    async fn a_bundle_listed_under_the_empty_config_type_is_read_as_cosign_lists_it() {
        let signer = SigningKey::random();
        let keys = [signer.public("signer.pub".as_ref())];
        let (mut fake, _) = image();
        let a = fake.put(b"a".to_vec());
        attach(&mut fake, &signer, &a, &a);
        let listed = fake.listings.get_mut(&a).unwrap();
        listed[0]["artifactType"] = json!(attachment::EMPTY_MEDIA_TYPE);
        assert_eq!(
            signature(&fake, &a, &keys).await.unwrap(),
            Ok(signer.fingerprint.clone())
        );
    }
}

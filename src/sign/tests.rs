use super::*;
use crate::base::oci;

fn new_key() -> (SigningKey, PublicKey) {
    let key = SigningKey::random();
    let public = key.public("pub.pem".as_ref());
    (key, public)
}

fn subject(c: char) -> (Digest, Value) {
    let digest: Digest = format!("sha256:{}", c.to_string().repeat(64))
        .parse()
        .unwrap();
    let descriptor = json!({ "mediaType": oci::OCI_INDEX, "digest": digest, "size": 300 });
    (digest, descriptor)
}

/// The bundle layer of a signature referrer.
fn bundle_of(referrer: &Referrer) -> Vec<u8> {
    referrer.layer.0.clone()
}

#[test]
fn a_signature_verifies_with_its_key_and_names_its_subject() {
    let (key, public) = new_key();
    let (digest, descriptor) = subject('a');
    let referrer = sign(&key, descriptor.clone());
    assert_eq!(referrer.subject, digest);
    assert_eq!(referrer.artifact_type, SIGSTORE_BUNDLE);
    let manifest: Value = serde_json::from_slice(&referrer.manifest.bytes).unwrap();
    assert_eq!(manifest["subject"], descriptor);
    assert_eq!(manifest["layers"][0]["mediaType"], SIGSTORE_BUNDLE);
    let keys = [public];
    let by = check(&bundle_of(&referrer), &digest, &keys).unwrap();
    assert_eq!(by.fingerprint, key.fingerprint);
    // Deterministic (RFC 6979): a rerun lists no second signature by the same key.
    assert_eq!(
        sign(&key, descriptor).manifest.digest,
        referrer.manifest.digest
    );
}

#[test]
fn any_one_of_several_keys_suffices() {
    let (key, public) = new_key();
    let (_, other) = new_key();
    let (digest, descriptor) = subject('a');
    let keys = [other, public];
    let by = check(&bundle_of(&sign(&key, descriptor)), &digest, &keys).unwrap();
    assert_eq!(by.fingerprint, key.fingerprint);
}

#[test]
fn another_key_a_tampered_payload_or_another_digest_never_passes() {
    let (key, _) = new_key();
    let (_, other) = new_key();
    let (digest, descriptor) = subject('a');
    let bundle = bundle_of(&sign(&key, descriptor));
    let public = PublicKey {
        key: key.public_key(),
        path: "pub.pem".into(),
        fingerprint: key.fingerprint.clone(),
    };
    assert_eq!(
        check(&bundle, &digest, std::slice::from_ref(&other)).unwrap_err(),
        SignatureGap::OtherKey
    );
    // The payload rewritten to name another digest: the signature no longer covers it.
    let mut tampered: Value = serde_json::from_slice(&bundle).unwrap();
    let payload = String::from_utf8(
        BASE64
            .decode(tampered["dsseEnvelope"]["payload"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let (elsewhere, _) = subject('b');
    let forged = payload.replace(digest.hex(), elsewhere.hex());
    tampered["dsseEnvelope"]["payload"] = json!(BASE64.encode(forged));
    let tampered = serde_json::to_vec(&tampered).unwrap();
    assert_eq!(
        check(&tampered, &elsewhere, std::slice::from_ref(&public)).unwrap_err(),
        SignatureGap::OtherKey
    );
    // A valid signature copied beside another manifest names the digest it was made for.
    assert!(matches!(
        check(&bundle, &elsewhere, std::slice::from_ref(&public)),
        Err(SignatureGap::OtherDigest { .. })
    ));
    assert!(matches!(
        check(b"{}", &digest, std::slice::from_ref(&public)),
        Err(SignatureGap::NotABundle(_))
    ));
}

#[test]
fn signs_with_a_key_cosign_made() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/sign");
    let key = SigningKey::load(&dir.join("cosign.key"), Some("polyarch-fixture")).unwrap();
    let public = PublicKey::load(&dir.join("cosign.pub")).unwrap();
    let (digest, descriptor) = subject('c');
    let bundle = bundle_of(&sign(&key, descriptor));
    check(&bundle, &digest, &[public]).unwrap();
}

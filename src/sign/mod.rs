//! Signatures of manifests in the form cosign 3 writes by default: a Sigstore bundle v0.3
//! whose DSSE envelope signs an in-toto statement naming the manifest's digest, attached
//! as an OCI referrer of that manifest. Keyed (ECDSA P-256), with no transparency log:
//! a keyless signer (Fulcio, Rekor) would fill the same bundle's verification material.

pub mod keys;

pub use keys::{KeyError, OpeningKey, PublicKey, SigningKey};

use crate::base::attachment::{Referrer, COSIGN_SIGN, IN_TOTO, SIGSTORE_BUNDLE, STATEMENT_TYPE};
use crate::base::digest::Digest;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature};
use serde_json::{json, Value};

/// The referrer that signs the manifest `subject` (a descriptor: media type, digest, size).
pub fn sign(key: &SigningKey, subject: Value) -> Referrer {
    let digest: Digest = subject["digest"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .expect("a subject descriptor names a digest");
    let statement = json!({
        "_type": STATEMENT_TYPE,
        "subject": [{ "digest": { "sha256": digest.hex() } }],
        "predicateType": COSIGN_SIGN,
        "predicate": {},
    });
    let payload = serde_json::to_vec(&statement).expect("a statement serialises");
    let signature: DerSignature = key.key.sign(&pae(IN_TOTO, &payload));
    let bundle = json!({
        "mediaType": SIGSTORE_BUNDLE,
        "verificationMaterial": { "publicKey": { "hint": key.fingerprint } },
        "dsseEnvelope": {
            "payload": BASE64.encode(&payload),
            "payloadType": IN_TOTO,
            "signatures": [{ "sig": BASE64.encode(signature.as_bytes()) }],
        },
    });
    Referrer::sigstore_bundle(
        subject,
        serde_json::to_vec(&bundle).expect("a bundle serialises"),
    )
}

/// DSSE's pre-authentication encoding: what the signature covers, type and payload both.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Why a bundle does not count as a signature of the manifest it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureGap {
    #[error("is not a Sigstore bundle with a DSSE envelope ({0})")]
    NotABundle(String),
    #[error("is signed by none of the keys given")]
    OtherKey,
    #[error("signs {named}, not {subject}")]
    OtherDigest { named: String, subject: Digest },
}

/// Checks the bundle `bytes` attached to `subject`: a DSSE envelope signed by one of
/// `keys` over an in-toto statement that names `subject`. The key that signed it.
pub fn check<'k>(
    bytes: &[u8],
    subject: &Digest,
    keys: &'k [PublicKey],
) -> Result<&'k PublicKey, SignatureGap> {
    let not = |why: &str| SignatureGap::NotABundle(why.to_string());
    let bundle: Value = serde_json::from_slice(bytes).map_err(|e| not(&e.to_string()))?;
    let envelope = &bundle["dsseEnvelope"];
    let payload_type = envelope["payloadType"]
        .as_str()
        .ok_or_else(|| not("no payloadType"))?;
    let payload = envelope["payload"]
        .as_str()
        .and_then(|p| BASE64.decode(p).ok())
        .ok_or_else(|| not("no payload"))?;
    let signed = pae(payload_type, &payload);
    let signatures = envelope["signatures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Only a signature that verifies makes its payload worth reading.
    let key = signatures
        .iter()
        .filter_map(|s| BASE64.decode(s["sig"].as_str()?).ok())
        .filter_map(|sig| {
            Signature::from_der(&sig)
                .or_else(|_| Signature::from_slice(&sig))
                .ok()
        })
        .find_map(|sig| keys.iter().find(|k| k.key.verify(&signed, &sig).is_ok()))
        .ok_or(SignatureGap::OtherKey)?;
    let statement: Value = serde_json::from_slice(&payload).map_err(|e| not(&e.to_string()))?;
    let names_subject = statement["subject"].as_array().is_some_and(|subjects| {
        subjects
            .iter()
            .any(|s| s["digest"]["sha256"].as_str() == Some(subject.hex()))
    });
    if payload_type != IN_TOTO || !names_subject {
        let named = statement["subject"][0]["digest"]["sha256"]
            .as_str()
            .map_or_else(|| "no digest".to_string(), |hex| format!("sha256:{hex}"));
        return Err(SignatureGap::OtherDigest {
            named,
            subject: subject.clone(),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests;

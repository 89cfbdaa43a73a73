//! The OCI referrers vocabulary: what is attached to a platform manifest (a provenance
//! statement, a signature, an SBOM), how a referrer is listed for its subject, and the
//! referrers tag schema for registries without the referrers API. Shared by the registry,
//! the image stores, verify and the record, so it sits below all of them.

use crate::base::digest::Digest;
use crate::base::oci::{self, ManifestBlob};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The artifact type (and layer media type) of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";
pub const SLSA_PROVENANCE: &str = "https://slsa.dev/provenance/v1";
/// The predicate type of an SPDX document, as BuildKit's SBOM attestations name it.
pub const SPDX_DOCUMENT: &str = "https://spdx.dev/Document";
/// The in-toto statement format polyarch writes.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The empty config's media type, which artifacts without a config of their own name.
pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_JSON: &[u8] = b"{}";
/// The annotation naming a statement's predicate type, as BuildKit and cosign write it.
pub const PREDICATE_TYPE: &str = "in-toto.io/predicate-type";
/// The artifact type (and layer media type) of a Sigstore bundle: a signature as cosign 3
/// writes it by default.
pub const SIGSTORE_BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The predicate type of the statement cosign signs for an image.
pub const COSIGN_SIGN: &str = "https://sigstore.dev/cosign/sign/v1";
/// A referrer ready to push: its blobs, then its manifest by digest, then listed for its
/// subject.
#[derive(Debug, Clone)]
pub struct Referrer {
    /// The platform manifest it is attached to.
    pub subject: Digest,
    pub manifest: ManifestBlob,
    /// `(bytes, digest)` of its layer (the statement, the bundle), made by this run. Its
    /// config is the empty one every artifact shares ([`Referrer::config`]).
    pub layer: (Vec<u8>, Digest),
    pub predicate_type: String,
    pub artifact_type: &'static str,
    /// The manifest's annotations, which a referrers listing repeats.
    annotations: Value,
}

/// One referrer of a platform manifest: a provenance statement, a signature, an SBOM, …
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    pub artifact_type: Option<String>,
    pub digest: String,
    /// The in-toto predicate type, for statements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate_type: Option<String>,
}

impl Attached {
    pub fn is_provenance(&self) -> bool {
        self.predicate_type.as_deref() == Some(SLSA_PROVENANCE)
    }

    pub fn is_sbom(&self) -> bool {
        self.predicate_type.as_deref() == Some(SPDX_DOCUMENT)
    }

    pub fn is_signature(&self) -> bool {
        self.artifact_type.as_deref() == Some(SIGSTORE_BUNDLE)
    }
}

impl Referrer {
    /// The referrer manifest carrying an in-toto `statement` of `predicate_type` for the
    /// platform manifest `subject` (`subject_size` bytes): an OCI image manifest with
    /// artifact type in-toto, the empty config, the statement as its one layer, and
    /// `subject` set.
    pub fn in_toto(
        subject: &Digest,
        subject_size: u64,
        statement: &Value,
        predicate_type: &str,
    ) -> Referrer {
        let layer = serde_json::to_vec(statement).expect("a statement serialises");
        let subject =
            json!({ "mediaType": oci::OCI_MANIFEST, "digest": subject, "size": subject_size });
        let mut referrer = Referrer::artifact(
            subject,
            IN_TOTO,
            layer,
            json!({ PREDICATE_TYPE: predicate_type }),
        );
        referrer.predicate_type = predicate_type.to_string();
        referrer
    }

    /// The referrer manifest carrying a Sigstore bundle that signs `subject` (a descriptor:
    /// a platform manifest or the index), shaped as `cosign sign` writes it, so cosign,
    /// policy-controller and Kyverno find it.
    pub fn sigstore_bundle(subject: Value, bundle: Vec<u8>) -> Referrer {
        let annotations = json!({
            "dev.sigstore.bundle.content": "dsse-envelope",
            "dev.sigstore.bundle.predicateType": COSIGN_SIGN,
        });
        Referrer::artifact(subject, SIGSTORE_BUNDLE, bundle, annotations)
    }

    /// An OCI image manifest of `artifact_type` with the empty config, `layer` as its one
    /// layer (of media type `artifact_type`) and `subject` (a descriptor) set.
    fn artifact(
        subject: Value,
        artifact_type: &'static str,
        layer: Vec<u8>,
        annotations: Value,
    ) -> Referrer {
        let layer_digest = Digest::of(&layer);
        let (_, empty_digest) = Referrer::config();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": oci::OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {
                "mediaType": EMPTY_MEDIA_TYPE,
                "digest": empty_digest,
                "size": EMPTY_JSON.len(),
                "data": base64::engine::general_purpose::STANDARD.encode(EMPTY_JSON),
            },
            "layers": [{
                "mediaType": artifact_type,
                "digest": layer_digest,
                "size": layer.len(),
                "annotations": annotations,
            }],
            "subject": subject,
            // Registries copy the manifest's annotations into referrer listings, so a reader
            // learns what it is without fetching the layer.
            "annotations": annotations,
        });
        let bytes = serde_json::to_vec(&manifest).expect("a manifest serialises");
        let subject = subject["digest"]
            .as_str()
            .and_then(|d| d.parse().ok())
            .expect("a subject descriptor names a digest");
        Referrer {
            subject,
            manifest: ManifestBlob {
                digest: Digest::of(&bytes),
                bytes,
                media_type: oci::OCI_MANIFEST,
            },
            layer: (layer, layer_digest),
            predicate_type: String::new(),
            artifact_type,
            annotations,
        }
    }

    /// `(bytes, digest)` of the config of every referrer: the empty JSON object.
    pub fn config() -> (&'static [u8], Digest) {
        (EMPTY_JSON, Digest::of(EMPTY_JSON))
    }

    /// The descriptor a referrers listing holds for it.
    pub fn descriptor(&self) -> Value {
        json!({
            "mediaType": self.manifest.media_type,
            "digest": self.manifest.digest,
            "size": self.manifest.bytes.len(),
            "artifactType": self.artifact_type,
            "annotations": self.annotations,
        })
    }

    /// Whether `referrers` (those of its subject) already hold it: a statement
    /// of this predicate type (a platform image keeps the provenance it has, so a rebuild
    /// to the same digest or a rerun adds no second one), or this very signature (ECDSA
    /// signing is deterministic here, so the same key signs a digest alike every time,
    /// while another key's signature is added beside it).
    pub fn already_in(&self, referrers: &Referrers) -> bool {
        match self.artifact_type {
            IN_TOTO => referrers.has_statement(&self.predicate_type),
            _ => referrers.lists(&self.manifest.digest),
        }
    }
}

/// The referrers tag schema's tag for a subject: `sha256-<hex>`.
pub fn referrers_tag(subject: &Digest) -> String {
    format!("{}-{}", subject.algorithm(), subject.hex())
}

/// Where a subject's referrers are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedBy {
    /// The registry's referrers API, which lists a manifest pushed with a subject by itself.
    Api,
    /// The referrers tag schema's index (`sha256-<hex>`), which whoever attaches rewrites.
    TagSchema,
}

/// What is attached to one subject, listed once: whatever attaches to it next reads and
/// extends this, rather than asking the registry again.
#[derive(Debug, Clone)]
pub struct Referrers {
    pub subject: Digest,
    /// The descriptors listed.
    pub listed: Vec<Value>,
    pub by: ListedBy,
}

impl Referrers {
    /// Whether a statement of `predicate_type` is listed.
    pub fn has_statement(&self, predicate_type: &str) -> bool {
        attached(&self.listed)
            .iter()
            .any(|a| a.predicate_type.as_deref() == Some(predicate_type))
    }

    /// Whether the referrer manifest `digest` is listed.
    pub fn lists(&self, digest: &Digest) -> bool {
        self.listed.iter().any(|d| d["digest"] == digest.as_str())
    }

    /// Lists `descriptor` too: every entry is kept, one with the same digest replaced.
    pub fn add(&mut self, descriptor: Value) {
        self.listed.retain(|d| d["digest"] != descriptor["digest"]);
        self.listed.push(descriptor);
    }

    /// The tag schema's index of what is listed.
    pub fn tag_schema_index(&self) -> ManifestBlob {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": oci::OCI_INDEX,
            "manifests": self.listed,
        });
        let bytes = serde_json::to_vec(&index).expect("an index serialises");
        ManifestBlob {
            digest: Digest::of(&bytes),
            bytes,
            media_type: oci::OCI_INDEX,
        }
    }
}

/// What a referrers listing says is attached, read from its descriptors.
pub fn attached(listed: &[Value]) -> Vec<Attached> {
    listed
        .iter()
        .filter_map(|d| {
            let text = |v: &Value| v.as_str().map(str::to_string);
            Some(Attached {
                digest: text(&d["digest"])?,
                artifact_type: text(&d["artifactType"]),
                predicate_type: text(&d["annotations"][PREDICATE_TYPE]),
            })
        })
        .collect()
}

/// Why a listed referrer does not count as attached to the entry.
#[derive(Debug, thiserror::Error)]
pub enum ReferrerError {
    #[error("is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("names subject {named}, not {subject}")]
    OtherSubject { named: String, subject: Digest },
}

/// Reads a referrer manifest as verify checks it: it must name `subject`. The predicate
/// type of its in-toto layer, when it has one.
pub fn check_referrer(bytes: &[u8], subject: &Digest) -> Result<Option<String>, ReferrerError> {
    let manifest: Value = serde_json::from_slice(bytes).map_err(ReferrerError::NotJson)?;
    let named = manifest["subject"]["digest"].as_str().unwrap_or("none");
    if *subject != named {
        return Err(ReferrerError::OtherSubject {
            named: named.to_string(),
            subject: subject.clone(),
        });
    }
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    Ok(layers
        .iter()
        .find(|l| l["mediaType"] == IN_TOTO)
        .and_then(|l| l["annotations"][PREDICATE_TYPE].as_str())
        .map(str::to_string))
}

//! SLSA provenance for each platform image (`provenance: true`), written by polyarch itself
//! so it is the same on every engine (Docker 20.10's BuildKit 0.8 has no attestations), and
//! attached as an OCI referrer of the platform manifest (`subject` set) rather than as an
//! index entry: the index keeps exactly the platform manifests, which every runtime reads.

use crate::digest::Digest;
use crate::oci::{self, ManifestBlob};
use crate::platform::Platform;
use crate::project::ImageSpec;
use crate::publish::Pushed;
use crate::record::Attached;
use crate::{build, dockerfile};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use time::format_description::well_known::Rfc3339;

/// The artifact type (and layer media type) of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const SLSA_PROVENANCE: &str = "https://slsa.dev/provenance/v1";
/// The annotation naming a statement's predicate type, as BuildKit and cosign write it.
pub const PREDICATE_TYPE: &str = "in-toto.io/predicate-type";
/// What `externalParameters` mean: documented in the README's "Provenance" section.
pub const BUILD_TYPE: &str = "urn:polyarch:build:dockerfile:v1";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_JSON: &[u8] = b"{}";

/// A referrer ready to push: its blobs, then its manifest by digest, then listed for its
/// subject.
#[derive(Debug, Clone)]
pub struct Referrer {
    /// The platform manifest it is attached to.
    pub subject: Digest,
    pub manifest: ManifestBlob,
    /// `(bytes, digest)` of the config and layer.
    pub blobs: Vec<(Vec<u8>, Digest)>,
    pub predicate_type: String,
}

/// When one platform's build ran, for the statement's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildWindow {
    pub started: time::OffsetDateTime,
    pub finished: time::OffsetDateTime,
}

/// The in-toto statement (SLSA provenance v1) for one pushed platform image. It names
/// build-arg and secret ids, never their values.
pub fn statement(image: &ImageSpec, pushed: &Pushed, invocation_id: &str) -> Value {
    let platform = pushed.platform.to_string();
    let hex = pushed.entry.digest.hex();
    let subject_name = format!(
        "pkg:docker/{}@{}?platform={}",
        image.repository,
        image.tags[0],
        platform.replace('/', "%2F")
    );
    let mut external = json!({
        "context": image.context.display().to_string(),
        "dockerfile": image.dockerfile.display().to_string(),
        "platform": platform,
        "build_args": image.build_args.keys().collect::<Vec<_>>(),
    });
    if let Some(target) = &image.target {
        external["target"] = json!(target);
    }
    if !image.secrets.is_empty() {
        external["secrets"] = json!(image.secrets.keys().collect::<Vec<_>>());
    }
    if let Some(epoch) = image.source_date_epoch {
        external["source_date_epoch"] = json!(epoch);
    }
    let build = &pushed.build;
    let mut metadata = json!({ "invocationId": invocation_id });
    if let Some(window) = &build.window {
        metadata["startedOn"] = json!(rfc3339(window.started));
        metadata["finishedOn"] = json!(rfc3339(window.finished));
    }
    json!({
        "_type": STATEMENT_TYPE,
        "subject": [{ "name": subject_name, "digest": { "sha256": hex } }],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": { "emulated": build.emulated, "reused": build.reused },
                "resolvedDependencies": dependencies(image, &pushed.platform),
            },
            "runDetails": {
                "builder": {
                    "id": build.builder.clone().unwrap_or_else(|| "polyarch".into()),
                    "version": { "polyarch": env!("CARGO_PKG_VERSION") },
                },
                "metadata": metadata,
            },
        },
    })
}

/// The base images the Dockerfile names for `platform`, as SLSA resource descriptors
/// (`pkg:docker/REGISTRY/REPOSITORY@TAG?platform=…`, with the digest where the
/// Dockerfile pins one). Empty when the Dockerfile is not here (assemble in a deploy
/// checkout) or names an image only the engine could resolve (`$BUILDPLATFORM`).
fn dependencies(image: &ImageSpec, platform: &Platform) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(image.context.join(&image.dockerfile)) else {
        return Vec::new();
    };
    let mut args: HashMap<String, String> = build::platform_build_args(platform, platform)
        .into_iter()
        .filter(|(name, _)| name.starts_with("TARGET"))
        .collect();
    args.extend(image.build_args.clone());
    let images = dockerfile::external_images(&text, &args).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for (name, wanted) in images {
        let platform = wanted
            .parse::<Platform>()
            .map_or(wanted, |p| p.to_string())
            .replace('/', "%2F");
        let (uri, digest) = match crate::registry::parse_reference(&name) {
            Ok(r) => {
                let tag = r.tag().map(|t| format!("@{t}")).unwrap_or_default();
                let name = format!("{}/{}{tag}", r.registry(), r.repository());
                (
                    name,
                    r.digest()
                        .and_then(|d| d.parse::<Digest>().ok())
                        .map(|d| d.hex().to_string()),
                )
            }
            Err(_) => (name, None),
        };
        seen.entry(format!("pkg:docker/{uri}?platform={platform}"))
            .or_insert(digest);
    }
    seen.into_iter()
        .map(|(uri, digest)| match digest {
            Some(d) => json!({ "uri": uri, "digest": { "sha256": d } }),
            None => json!({ "uri": uri }),
        })
        .collect()
}

impl BuildWindow {
    /// A build's window from its duration, taken when it has just finished.
    pub fn ending_now(seconds: f64) -> Self {
        let finished = time::OffsetDateTime::now_utc();
        let started = finished - time::Duration::seconds_f64(seconds.max(0.0));
        BuildWindow { started, finished }
    }
}

fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// The referrer manifest carrying `statement` for the platform manifest `pushed`: an OCI
/// image manifest with artifact type in-toto, the empty config, the statement as its one
/// layer, and `subject` set.
pub fn referrer(pushed: &Pushed, statement: &Value) -> Referrer {
    let layer = serde_json::to_vec(statement).expect("a statement serialises");
    let layer_digest = Digest::of(&layer);
    let empty_digest = Digest::of(EMPTY_JSON);
    let annotations = json!({ PREDICATE_TYPE: SLSA_PROVENANCE });
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": oci::OCI_MANIFEST,
        "artifactType": IN_TOTO,
        "config": {
            "mediaType": EMPTY_MEDIA_TYPE,
            "digest": empty_digest,
            "size": EMPTY_JSON.len(),
            "data": base64::engine::general_purpose::STANDARD.encode(EMPTY_JSON),
        },
        "layers": [{
            "mediaType": IN_TOTO,
            "digest": layer_digest,
            "size": layer.len(),
            "annotations": annotations,
        }],
        "subject": {
            "mediaType": oci::OCI_MANIFEST,
            "digest": pushed.entry.digest,
            "size": pushed.entry.size,
        },
        // Registries copy the manifest's annotations into referrer listings, so a reader
        // learns the predicate type without fetching the statement.
        "annotations": annotations,
    });
    let bytes = serde_json::to_vec(&manifest).expect("a manifest serialises");
    Referrer {
        subject: pushed.entry.digest.clone(),
        manifest: ManifestBlob {
            digest: Digest::of(&bytes),
            bytes,
            media_type: oci::OCI_MANIFEST,
        },
        blobs: vec![(EMPTY_JSON.to_vec(), empty_digest), (layer, layer_digest)],
        predicate_type: SLSA_PROVENANCE.to_string(),
    }
}

impl Referrer {
    /// The descriptor a referrers listing holds for it.
    pub fn descriptor(&self) -> Value {
        json!({
            "mediaType": self.manifest.media_type,
            "digest": self.manifest.digest,
            "size": self.manifest.bytes.len(),
            "artifactType": IN_TOTO,
            "annotations": { PREDICATE_TYPE: self.predicate_type },
        })
    }

    /// Whether `listed` (a referrers listing of the subject) already holds a statement of
    /// this predicate type: a platform image keeps the provenance it has, so a rebuild to
    /// the same digest or a rerun adds no second one.
    pub fn already_in(&self, listed: &[Value]) -> bool {
        attached(listed)
            .iter()
            .any(|a| a.predicate_type.as_deref() == Some(self.predicate_type.as_str()))
    }
}

/// The referrers tag schema's tag for a subject: `sha256-<hex>`.
pub fn referrers_tag(subject: &Digest) -> String {
    format!("{}-{}", subject.algorithm(), subject.hex())
}

/// The tag schema's index after adding `descriptor`: every entry it had is kept, one with
/// the same digest replaced.
pub fn tag_schema_index(listed: Vec<Value>, descriptor: Value) -> ManifestBlob {
    let mut manifests: Vec<Value> = listed
        .into_iter()
        .filter(|d| d["digest"] != descriptor["digest"])
        .collect();
    manifests.push(descriptor);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": oci::OCI_INDEX,
        "manifests": manifests,
    });
    let bytes = serde_json::to_vec(&index).expect("an index serialises");
    ManifestBlob {
        digest: Digest::of(&bytes),
        bytes,
        media_type: oci::OCI_INDEX,
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

/// Reads a referrer manifest as verify checks it: it must name `subject`. The predicate
/// type of its in-toto layer, when it has one.
pub fn check_referrer(bytes: &[u8], subject: &Digest) -> Result<Option<String>, String> {
    let manifest: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is not valid JSON: {e}"))?;
    let named = manifest["subject"]["digest"].as_str().unwrap_or("none");
    if *subject != named {
        return Err(format!("names subject {named}, not {subject}"));
    }
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    Ok(layers
        .iter()
        .find(|l| l["mediaType"] == IN_TOTO)
        .and_then(|l| l["annotations"][PREDICATE_TYPE].as_str())
        .map(str::to_string))
}

#[cfg(test)]
mod tests;

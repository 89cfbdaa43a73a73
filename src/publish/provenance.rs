//! SLSA provenance for each platform image (`provenance: true`), written by polyarch itself
//! so it is the same on every engine (Docker 20.10's BuildKit 0.8 has no attestations), and
//! attached as an OCI referrer of the platform manifest (`subject` set) rather than as an
//! index entry: the index keeps exactly the platform manifests, which every runtime reads.

use crate::base::attachment::{Referrer, SLSA_PROVENANCE, STATEMENT_TYPE};
use crate::base::digest::Digest;
use crate::base::dockerfile;
use crate::base::platform::Platform;
use crate::builder;
use crate::project::ImageSpec;
use crate::publish::Pushed;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use time::format_description::well_known::Rfc3339;

/// What `externalParameters` mean: documented in the book's Provenance page
/// (docs/src/guide/provenance.md).
pub const BUILD_TYPE: &str = "urn:polyarch:build:dockerfile:v1";

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
    let mut args: HashMap<String, String> = builder::platform_build_args(platform, platform)
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

fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// The referrer manifest carrying `statement` for the platform manifest `pushed`.
pub fn referrer(pushed: &Pushed, statement: &Value) -> Referrer {
    Referrer::in_toto(
        &pushed.entry.digest,
        pushed.entry.size,
        statement,
        SLSA_PROVENANCE,
    )
}

#[cfg(test)]
mod tests;

//! An image's SBOM against a registry: made from its layers, streamed from the registry by
//! digest (whichever engine built it), or read back from what is attached to it.

use super::{lay_layers, read_layer, Catalog, LayerFacts, LayersError, SbomError};
use crate::base::attachment::{self, IN_TOTO, SPDX_DOCUMENT};
use crate::base::digest::Digest;
use crate::base::text::one_line;
use crate::registry::Registry;
use crate::verify::remote_layers::read_layers;
use futures_util::{StreamExt, TryStreamExt};
use oci_client::Reference;
use serde_json::Value;
use std::sync::Arc;

type Result<T, E = SbomError> = std::result::Result<T, E>;

/// The catalog of the platform manifest `subject` in `reference`'s repository, and its
/// config's `created`: read once per run, whoever asks first (see [`read_ahead`]).
pub async fn catalog_of(
    registry: &Registry,
    reference: &Reference,
    subject: &Digest,
) -> Result<(Catalog, Option<String>)> {
    let made = registry
        .derived(subject, || read_catalog(registry, reference, subject))
        .await?;
    Ok(made.as_ref().clone())
}

/// Starts reading the catalog of `subject`, a platform manifest just pushed, in the
/// background, unless an SBOM is attached to it already: its layers are read while the
/// run's other platforms build and push, and the SBOM that needs it later finds it read
/// (or waits for the read under way). Once per subject: a solve says what it pushed
/// before it returns, and again after. A failure here is forgotten: the SBOM's own read
/// tries again and reports it.
pub fn read_ahead(registry: &Registry, reference: Reference, subject: Digest) {
    let registry = registry.clone();
    tokio::spawn(async move {
        let once = registry.derived(&subject, || async {
            read_unless_attached(&registry, &reference, &subject).await;
            Ok::<_, std::convert::Infallible>(ReadAhead)
        });
        let _ = once.await;
    });
}

/// A subject whose layers were read ahead (or found to need no SBOM).
struct ReadAhead;

/// [`catalog_of`] `subject` unless its referrers list an SBOM. Both are asked at once:
/// the read is dropped, a few milliseconds in, if an SBOM is attached, or if the listing
/// fails.
async fn read_unless_attached(registry: &Registry, reference: &Reference, subject: &Digest) {
    let read = catalog_of(registry, reference, subject);
    let listed = registry.referrers(reference, subject);
    tokio::pin!(read);
    tokio::select! {
        listed = listed => {
            if listed.is_ok_and(|r| !r.has_statement(SPDX_DOCUMENT)) {
                let _ = read.await;
            }
        }
        _ = &mut read => {}
    }
}

/// [`catalog_of`], read from the registry.
async fn read_catalog(
    registry: &Registry,
    reference: &Reference,
    subject: &Digest,
) -> Result<(Catalog, Option<String>)> {
    let at = reference.clone_with_digest(subject.to_string());
    let content = |what: &str, reason: String| SbomError::Content {
        reference: at.to_string(),
        what: what.to_string(),
        reason,
    };
    let (bytes, _) = registry.get_manifest(&at).await?;
    let manifest: Value =
        serde_json::from_slice(&bytes).map_err(|e| content("its manifest", e.to_string()))?;
    let digest_of =
        |v: &Value| -> Result<Digest> {
            v["digest"].as_str().unwrap_or_default().parse().map_err(
                |e: crate::base::digest::DigestError| content("its manifest", e.to_string()),
            )
        };
    let mut layers = Vec::new();
    let mut skipped = Vec::new();
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let digest = digest_of(layer)?;
        let media_type = layer["mediaType"].as_str().unwrap_or_default();
        // Foreign layers live elsewhere and are not pushed; they are named, not read.
        if media_type.contains("nondistributable") || media_type.contains("foreign") {
            skipped.push(format!("non-distributable layer {digest} was not read"));
            continue;
        }
        layers.push(digest);
    }
    let config = digest_of(&manifest["config"])?;
    let config = registry.get_json_blob(&at, &config);
    // The layers at once (a few at a time), each read on its own: one that another
    // platform or image of the run holds too is read once.
    // (The futures made first: a closure mapping the stream is not `Send` for every
    // lifetime, as a spawned read ahead needs.)
    let reads: Vec<_> = (layers.iter().enumerate())
        .map(|(i, digest)| layer_facts(registry, &at, i + 1, digest))
        .collect();
    let read = futures_util::stream::iter(reads)
        .buffered(LAYERS_AT_ONCE)
        .try_collect::<Vec<_>>();
    let (config, read) = futures_util::future::join(config, read).await;
    let created = serde_json::from_slice::<Value>(&config?)
        .ok()
        .and_then(|c| c["created"].as_str().map(str::to_string));
    let mut catalog = lay_layers(&read?);
    catalog.warnings.extend(skipped);
    Ok((catalog, created))
}

/// Layers read at once for one image: reading is CPU work (hashing, gunzip), and each
/// stream holds its buffers.
const LAYERS_AT_ONCE: usize = 4;

/// What the `n`th layer of the image at `at` holds, read from the registry (and hashed)
/// unless this run read that layer already.
async fn layer_facts(
    registry: &Registry,
    at: &Reference,
    n: usize,
    digest: &Digest,
) -> Result<Arc<LayerFacts>> {
    registry
        .derived(digest, || async {
            let read = read_layers(
                registry,
                at,
                std::slice::from_ref(digest),
                move |mut one| read_layer(n, one.remove(0)),
            )
            .await?;
            match read {
                Ok(Ok(facts)) => Ok(facts),
                Ok(Err(LayersError::Unreadable { layer, error })) => Err(SbomError::Layer {
                    reference: at.to_string(),
                    layer,
                    reason: one_line(&error.to_string()),
                }),
                Ok(Err(LayersError::Refused { layer, limit })) => Err(SbomError::Refused {
                    reference: at.to_string(),
                    layer,
                    limit,
                }),
                Err(source) => Err(SbomError::Reader {
                    reference: at.to_string(),
                    source,
                }),
            }
        })
        .await
}

/// The SPDX document attached to the platform manifest `subject`; None when none is.
/// A referrer naming another subject, or a statement about another digest, is not it.
pub async fn attached_document(
    registry: &Registry,
    reference: &Reference,
    subject: &Digest,
) -> Result<Option<Value>> {
    let referrers = registry.referrers(reference, subject).await?;
    for found in attachment::attached(&referrers.listed)
        .into_iter()
        .filter(|a| a.is_sbom())
    {
        let Ok(digest) = found.digest.parse::<Digest>() else {
            continue;
        };
        let (bytes, _) = registry
            .get_manifest(&reference.clone_with_digest(digest.to_string()))
            .await?;
        if attachment::check_referrer(&bytes, subject)
            .ok()
            .flatten()
            .as_deref()
            != Some(SPDX_DOCUMENT)
        {
            continue;
        }
        let manifest: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let Some(layer) = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["mediaType"] == IN_TOTO)
            .and_then(|l| l["digest"].as_str()?.parse::<Digest>().ok())
        else {
            continue;
        };
        let statement: Value =
            match serde_json::from_slice(&registry.get_json_blob(reference, &layer).await?) {
                Ok(statement) => statement,
                Err(_) => continue,
            };
        let names_subject = statement["subject"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["digest"][subject.algorithm()] == subject.hex());
        if statement["predicateType"] == SPDX_DOCUMENT && names_subject {
            return Ok(Some(statement["predicate"].clone()));
        }
    }
    Ok(None)
}

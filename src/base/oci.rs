//! OCI content: building the per-platform image manifest and the index polyarch pushes,
//! and reading what registries hold (OCI index/manifest, Docker manifest list/v2 schema 2).

use crate::base::digest::{Digest, DigestError};
use crate::base::platform::Platform;
use oci_spec::image::{
    Arch, Descriptor, DescriptorBuilder, ImageIndex, ImageIndexBuilder, ImageManifest,
    ImageManifestBuilder, MediaType, Os, PlatformBuilder,
};
use oci_spec::OciSpecError;
use serde::Deserialize;
use std::collections::BTreeMap;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// What polyarch asks registries for when reading a reference.
pub const ACCEPTED_MANIFESTS: &[&str] = &[OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST];

/// Why OCI content cannot be written or read: its text names what is malformed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("image config is not valid JSON: {0}")]
    ConfigJson(#[source] serde_json::Error),
    #[error("image config has no os/architecture")]
    NoPlatform,
    /// A digest the content names that is not one.
    #[error("digest `{value}` {source}")]
    Digest {
        value: String,
        #[source]
        source: DigestError,
    },
    /// oci-spec refuses to build a descriptor, manifest or index from the given parts.
    #[error("{0}")]
    Build(#[source] OciSpecError),
    #[error("{0}")]
    Serialize(#[source] serde_json::Error),
    #[error("manifest is not valid JSON: {0}")]
    ManifestJson(#[source] serde_json::Error),
    #[error("manifest has no mediaType, manifests or config")]
    NoMediaType,
    #[error("index ({media_type}) is malformed: {source}")]
    MalformedIndex {
        media_type: String,
        #[source]
        source: OciSpecError,
    },
    #[error("image manifest ({media_type}) is malformed: {source}")]
    MalformedManifest {
        media_type: String,
        #[source]
        source: serde_json::Error,
    },
}

/// buildx marks its provenance/SBOM manifests with this annotation.
const REFERENCE_TYPE: &str = "vnd.docker.reference.type";

/// The sha256 digest of `bytes` as text, for callers outside the crate (the integration
/// tests).
pub fn sha256_digest(bytes: &[u8]) -> String {
    Digest::of(bytes).to_string()
}

/// The first 12 hex digits of a digest read as text, as `docker images` shows them.
pub fn short_digest(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

/// A serialized manifest ready to push by digest.
#[derive(Debug, Clone)]
pub struct ManifestBlob {
    pub bytes: Vec<u8>,
    pub digest: Digest,
    pub media_type: &'static str,
}

impl ManifestBlob {
    fn new(bytes: Vec<u8>, media_type: &'static str) -> Self {
        ManifestBlob {
            digest: Digest::of(&bytes),
            bytes,
            media_type,
        }
    }
}

/// One platform's pushed manifest, as the index lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub digest: Digest,
    pub size: u64,
    /// The platform exactly as the image config states it.
    pub platform: ConfigPlatform,
}

/// `os`/`architecture`/`variant` as written in an image config (not normalised).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct ConfigPlatform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl ConfigPlatform {
    pub fn normalized(&self) -> Platform {
        Platform::new(&self.os, &self.architecture, self.variant.as_deref())
    }

    /// Reads the platform from an image config blob.
    pub fn from_config(config: &[u8]) -> Result<Self, OciError> {
        let parsed: ConfigPlatform =
            serde_json::from_slice(config).map_err(OciError::ConfigJson)?;
        if parsed.os.is_empty() || parsed.architecture.is_empty() {
            return Err(OciError::NoPlatform);
        }
        Ok(parsed)
    }
}

/// The image manifest for one exported platform image: its config as exported (the
/// engine's own bytes, unless rewritten for SOURCE_DATE_EPOCH) and its layers in rootfs
/// order, each as (digest, size), with `annotations` when there are any.
pub fn image_manifest<'a>(
    config: (&Digest, usize),
    layers: impl IntoIterator<Item = (&'a Digest, u64)>,
    annotations: &BTreeMap<String, String>,
) -> Result<ManifestBlob, OciError> {
    let (config_digest, config_size) = config;
    let config = DescriptorBuilder::default()
        .media_type(MediaType::ImageConfig)
        .digest(config_digest.to_oci())
        .size(config_size as u64)
        .build()
        .map_err(OciError::Build)?;
    let layers = layers
        .into_iter()
        .map(|(digest, size)| {
            DescriptorBuilder::default()
                .media_type(MediaType::ImageLayerGzip)
                .digest(digest.to_oci())
                .size(size)
                .build()
                .map_err(OciError::Build)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(layers)
        .build()
        .map_err(OciError::Build)?;
    if !annotations.is_empty() {
        manifest.set_annotations(Some(annotations.clone().into_iter().collect()));
    }
    let bytes = serde_json::to_vec(&manifest).map_err(OciError::Serialize)?;
    Ok(ManifestBlob::new(bytes, OCI_MANIFEST))
}

/// The index for a tag: exactly the given platform manifests, nothing else
/// (no attestation or provenance entries, which older containerd cannot read), with
/// `annotations` when there are any.
pub fn image_index(
    entries: &[IndexEntry],
    annotations: &BTreeMap<String, String>,
) -> Result<ManifestBlob, OciError> {
    let manifests = entries
        .iter()
        .map(|entry| {
            let mut platform = PlatformBuilder::default()
                .architecture(Arch::from(entry.platform.architecture.as_str()))
                .os(Os::from(entry.platform.os.as_str()));
            if let Some(variant) = &entry.platform.variant {
                platform = platform.variant(variant.clone());
            }
            DescriptorBuilder::default()
                .media_type(MediaType::ImageManifest)
                .digest(entry.digest.to_oci())
                .size(entry.size)
                .platform(platform.build().map_err(OciError::Build)?)
                .build()
                .map_err(OciError::Build)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests)
        .build()
        .map_err(OciError::Build)?;
    if !annotations.is_empty() {
        index.set_annotations(Some(annotations.clone().into_iter().collect()));
    }
    let bytes = serde_json::to_vec(&index).map_err(OciError::Serialize)?;
    Ok(ManifestBlob::new(bytes, OCI_INDEX))
}

/// A manifest as a registry returned it, classified by its media type.
#[derive(Debug)]
pub enum Parsed {
    Index {
        media_type: String,
        index: Box<ImageIndex>,
    },
    Image {
        media_type: String,
        manifest: Box<ImageManifest>,
    },
    /// A media type polyarch does not know (reported, not fatal).
    Unknown { media_type: String },
}

#[derive(Deserialize)]
struct MediaTypeProbe {
    #[serde(rename = "mediaType")]
    media_type: Option<String>,
    manifests: Option<serde_json::Value>,
    config: Option<serde_json::Value>,
}

/// Classifies and parses manifest bytes; errors name what is malformed.
pub fn parse_manifest(bytes: &[u8]) -> Result<Parsed, OciError> {
    let probe: MediaTypeProbe = serde_json::from_slice(bytes).map_err(OciError::ManifestJson)?;
    // Some writers omit mediaType in OCI content; infer from the shape as the spec allows.
    let media_type = match (probe.media_type, &probe.manifests, &probe.config) {
        (Some(m), _, _) => m,
        (None, Some(_), _) => OCI_INDEX.to_string(),
        (None, None, Some(_)) => OCI_MANIFEST.to_string(),
        (None, None, None) => return Err(OciError::NoMediaType),
    };
    match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => {
            let index =
                ImageIndex::from_reader(bytes).map_err(|source| OciError::MalformedIndex {
                    media_type: media_type.clone(),
                    source,
                })?;
            Ok(Parsed::Index {
                media_type,
                index: Box::new(index),
            })
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let manifest =
                parse_image_manifest(bytes).map_err(|source| OciError::MalformedManifest {
                    media_type: media_type.clone(),
                    source,
                })?;
            Ok(Parsed::Image {
                media_type,
                manifest: Box::new(manifest),
            })
        }
        _ => Ok(Parsed::Unknown { media_type }),
    }
}

/// An image manifest; `"layers": null`, which BuildKit writes for an image without layers
/// (a `FROM scratch` stage that only sets metadata), reads as no layers, as containerd
/// reads it.
fn parse_image_manifest(bytes: &[u8]) -> Result<ImageManifest, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes)?;
    if let Some(layers) = value.get_mut("layers").filter(|l| l.is_null()) {
        *layers = serde_json::Value::Array(Vec::new());
    }
    serde_json::from_value(value)
}

/// buildx attestation manifests (`unknown/unknown`, or annotated as attestation).
pub fn is_attestation(descriptor: &Descriptor) -> bool {
    let annotated = descriptor
        .annotations()
        .as_ref()
        .and_then(|a| a.get(REFERENCE_TYPE))
        .is_some_and(|t| t == "attestation-manifest");
    let unknown_platform = descriptor.platform().as_ref().is_some_and(|p| {
        p.os().to_string() == "unknown" || p.architecture().to_string() == "unknown"
    });
    annotated || unknown_platform
}

/// An index entry's declared platform, normalised.
pub fn descriptor_platform(descriptor: &Descriptor) -> Option<Platform> {
    descriptor.platform().as_ref().map(|p| {
        Platform::new(
            &p.os().to_string(),
            &p.architecture().to_string(),
            p.variant().as_deref(),
        )
    })
}

pub fn is_index_media_type(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_LIST
}

pub fn is_image_media_type(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(arch: &str, variant: Option<&str>, n: u8) -> IndexEntry {
        IndexEntry {
            digest: format!("sha256:{}", hex::encode([n; 32])).parse().unwrap(),
            size: 500 + n as u64,
            platform: ConfigPlatform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: variant.map(str::to_string),
            },
        }
    }

    #[test]
    fn index_lists_exactly_the_platform_manifests() {
        let blob = image_index(
            &[entry("amd64", None, 1), entry("arm64", Some("v8"), 2)],
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(blob.digest, Digest::of(&blob.bytes));
        let json: serde_json::Value = serde_json::from_slice(&blob.bytes).unwrap();
        assert_eq!(json["mediaType"], OCI_INDEX);
        assert_eq!(json["schemaVersion"], 2);
        let manifests = json["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(manifests[0]["platform"]["architecture"], "amd64");
        assert!(manifests[0]["platform"].get("variant").is_none());
        assert_eq!(manifests[1]["platform"]["variant"], "v8");
        assert_eq!(manifests[1]["mediaType"], OCI_MANIFEST);
        assert!(manifests.iter().all(|m| m.get("annotations").is_none()));
        match parse_manifest(&blob.bytes).unwrap() {
            Parsed::Index { index, .. } => {
                assert!(index.manifests().iter().all(|d| !is_attestation(d)));
                assert_eq!(
                    descriptor_platform(&index.manifests()[1]).unwrap(),
                    "linux/arm64".parse().unwrap()
                );
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn recognises_buildx_attestations() {
        let raw = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
          {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1,"platform":{"architecture":"amd64","os":"linux"}},
          {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2222222222222222222222222222222222222222222222222222222222222222","size":1,
           "annotations":{"vnd.docker.reference.digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","vnd.docker.reference.type":"attestation-manifest"},
           "platform":{"architecture":"unknown","os":"unknown"}}]}"#;
        let Parsed::Index { index, .. } = parse_manifest(raw).unwrap() else {
            panic!("not an index")
        };
        let flags: Vec<bool> = index.manifests().iter().map(is_attestation).collect();
        assert_eq!(flags, [false, true]);
    }

    #[test]
    fn an_image_without_layers_as_buildkit_writes_it_parses() {
        let raw = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:6353f0e23e4dd13661569cbc868e7f84fcb468f032c5251e9d0927f1dc519d23","size":363},"layers":null}"#;
        match parse_manifest(raw) {
            Ok(Parsed::Image { manifest, .. }) => assert!(manifest.layers().is_empty()),
            Ok(_) => panic!("not read as an image manifest"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn malformed_and_unknown_manifests_never_panic() {
        for raw in [
            &b""[..],
            b"{",
            b"[]",
            b"{}",
            b"null",
            b"{\"mediaType\":5}",
            b"{\"manifests\":3}",
        ] {
            assert!(
                parse_manifest(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        assert!(matches!(
            parse_manifest(br#"{"mediaType":"application/x-weird"}"#),
            Ok(Parsed::Unknown { .. })
        ));
    }

    #[test]
    fn reads_platform_from_config() {
        let cfg = br#"{"architecture":"arm64","variant":"v8","os":"linux","rootfs":{}}"#;
        let p = ConfigPlatform::from_config(cfg).unwrap();
        assert_eq!(p.normalized(), "linux/arm64".parse().unwrap());
        assert!(ConfigPlatform::from_config(b"{}").is_err());
        assert!(ConfigPlatform::from_config(b"nope").is_err());
    }
}

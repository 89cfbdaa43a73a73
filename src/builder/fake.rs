//! A builder in memory for unit tests of the build flows: scripted builds, exports of a
//! small spooled layer, and every call in order.

use super::{temporary_tag, BuildError, Builder, BuiltImage, Output, PushedManifest, UnitBuild};
use super::{BuilderError, Result};
use crate::base::digest::Digest;
use crate::base::oci::ConfigPlatform;
use crate::base::progress::Reporter;
use crate::builder::build_inputs::RemoteBases;
use crate::builder::cleanup::Cleanup;
use crate::builder::export::early::{EarlyLayer, EarlyUploads};
use crate::builder::export::{ExportedImage, ExportedLayer};
use crate::project::ImageSpec;
use crate::Platform;
use std::sync::Mutex;

/// How every build on a [`FakeBuilder`] ends.
#[derive(Clone)]
pub(crate) enum Script {
    /// An image whose config says this platform (not necessarily the one asked for).
    Builds(Platform),
    /// The connection to the builder broke mid-build.
    Lost,
    /// A Dockerfile step failed.
    StepFails,
}

pub(crate) struct FakeBuilder {
    pub(crate) endpoint: String,
    pub(crate) buildkit: bool,
    /// With a registry output, the builder pushes the image itself, as containerd's image
    /// store lets BuildKit do.
    pub(crate) containerd_store: bool,
    pub(crate) answers: bool,
    pub(crate) script: Script,
    pub(crate) calls: Mutex<Vec<String>>,
}

impl FakeBuilder {
    /// A local BuildKit builder on the classic image store that answers.
    pub(crate) fn new(endpoint: &str, script: Script) -> FakeBuilder {
        FakeBuilder {
            endpoint: endpoint.to_string(),
            buildkit: true,
            containerd_store: false,
            answers: true,
            script,
            calls: Mutex::default(),
        }
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn call(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    /// The config of the image the script builds, whose digest is the image ID.
    fn config(&self, spec: &ImageSpec) -> Vec<u8> {
        let Script::Builds(platform) = &self.script else {
            return Vec::new();
        };
        serde_json::json!({
            "os": platform.os,
            "architecture": platform.architecture,
            "config": { "Labels": { "image": spec.name } },
            "rootfs": { "type": "layers", "diff_ids": [Digest::of(LAYER)] },
        })
        .to_string()
        .into_bytes()
    }
}

/// The content of the one layer every image built here has.
const LAYER: &[u8] = b"a layer";

impl Builder for FakeBuilder {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn buildkit(&self) -> bool {
        self.buildkit
    }

    fn containerd_store(&self) -> bool {
        self.containerd_store
    }

    fn standalone(&self) -> bool {
        false
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn answers(&self) -> bool {
        self.answers
    }

    async fn settings_key(
        &self,
        _: &ImageSpec,
        _: &Platform,
        _: &RemoteBases,
    ) -> Result<Option<String>> {
        Ok(None)
    }

    async fn build(&self, unit: UnitBuild<'_>, _: &Cleanup) -> Result<BuiltImage> {
        let UnitBuild {
            spec,
            platform,
            run_id,
            output,
            ..
        } = unit;
        self.call(format!("build {platform}"));
        let failed = |source| BuilderError::Build {
            image: spec.name.clone(),
            platform: platform.to_string(),
            source,
        };
        let built = match &self.script {
            Script::Builds(built) => built,
            Script::Lost => {
                return Err(failed(BuildError::BuilderLost(
                    "connection reset by peer".into(),
                )))
            }
            Script::StepFails => {
                return Err(failed(BuildError::StepFailed(
                    "exit code: 1 at step `RUN false`".into(),
                )))
            }
        };
        let id = Digest::of(&self.config(spec));
        let pushed = match output {
            Output::Registry(_) => Some(PushedManifest {
                digest: Digest::of(format!("manifest of {id}").as_bytes()),
                size: 500,
                platform: ConfigPlatform {
                    os: built.os.clone(),
                    architecture: built.architecture.clone(),
                    variant: built.variant.clone(),
                },
            }),
            Output::Engine => None,
        };
        Ok(BuiltImage {
            id: pushed.as_ref().map_or(id, |p| p.digest.clone()).to_string(),
            tag: temporary_tag(&spec.name, platform, run_id),
            seconds: 1.0,
            transfers: Vec::new(),
            sent_context: None,
            pushed,
            layout: None,
        })
    }

    async fn export(
        &self,
        built: &BuiltImage,
        spec: &ImageSpec,
        platform: &Platform,
        early: Option<&dyn EarlyUploads>,
        _: &dyn Reporter,
    ) -> Result<ExportedImage> {
        self.call(format!("export {}", built.id));
        // Its one layer is offered as an engine's large layers are: when the image is of
        // the platform asked for.
        let diff_id = Digest::of(LAYER).to_string();
        let asked = matches!(&self.script, Script::Builds(built) if built == platform);
        if let Some(early) = early.filter(|e| asked && e.claim(&diff_id)) {
            let (chunks, chunks_rx) = tokio::sync::mpsc::channel(1);
            let (digest, digest_rx) = tokio::sync::oneshot::channel();
            chunks.send(bytes::Bytes::from_static(LAYER)).await.unwrap();
            drop(chunks);
            digest.send(Digest::of(LAYER)).unwrap();
            early
                .upload(EarlyLayer {
                    diff_id,
                    chunks: chunks_rx,
                    digest: digest_rx,
                })
                .await;
        }
        let spool = tempfile::tempdir().unwrap();
        let path = spool.path().join("layer");
        std::fs::write(&path, LAYER).unwrap();
        let config = self.config(spec);
        Ok(ExportedImage {
            config_digest: Digest::of(&config),
            config,
            layers: vec![ExportedLayer {
                diff_id: Digest::of(LAYER).to_string(),
                digest: Digest::of(LAYER),
                size: LAYER.len() as u64,
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                path,
            }],
            spool,
        })
    }

    async fn remove(&self, _: &Cleanup, tag: &str) -> bool {
        self.call(format!("remove {tag}"));
        true
    }
}

//! The builder seam: what the build flows (`src/pipeline/`) need of an engine, so that
//! their order and decisions are unit-tested against the in-memory builder of
//! `fake.rs`, while [`Engine`] does the real work through Docker.

use super::Result;
use super::{build_on_engine, temporary_tag, BuiltImage, Output, UnitBuild};
use crate::base::progress::Reporter;
use crate::builder::build_inputs::{self, RemoteBases};
use crate::builder::cleanup::Cleanup;
use crate::builder::export::early::EarlyUploads;
use crate::builder::export::{self, ExportedImage};
use crate::docker::buildkit::daemon::Daemon;
use crate::docker::engine::Engine;
use crate::project::ImageSpec;
use crate::Platform;
use std::future::Future;

/// An engine that builds one image × platform at a time.
pub trait Builder {
    /// Where the builder was reached, as the user named it: for messages and records.
    fn endpoint(&self) -> &str;
    /// Whether it builds with BuildKit (else with the classic builder).
    fn buildkit(&self) -> bool;
    /// Whether it keeps images in containerd's image store, whose BuildKit can push an
    /// image to a registry itself.
    fn containerd_store(&self) -> bool;
    /// Whether it is a standalone BuildKit daemon, which has no image store to export
    /// from: it pushes to the registry itself, or sends the image back as an OCI layout.
    fn standalone(&self) -> bool;
    /// Whether it runs on this machine, and so reaches this machine's loopback registries.
    fn is_local(&self) -> bool;
    /// Whether it answers now: a builder lost mid-run is only retried on one that does.
    fn answers(&self) -> impl Future<Output = bool>;
    /// The key the inputs of `spec`'s build on this builder are remembered under
    /// ([`build_inputs::settings_key`]); None when they cannot be trusted.
    fn settings_key(
        &self,
        spec: &ImageSpec,
        platform: &Platform,
        bases: &RemoteBases,
    ) -> impl Future<Output = Result<Option<String>>>;
    /// Builds `unit`; what the build writes to the engine is recorded in `cleanup` first,
    /// so an interrupted run removes it.
    fn build(
        &self,
        unit: UnitBuild<'_>,
        cleanup: &Cleanup,
    ) -> impl Future<Output = Result<BuiltImage>>;
    /// The built image out of the builder, as layers, config and manifest to push; large
    /// layers are offered to `early` as they are exported.
    fn export(
        &self,
        built: &BuiltImage,
        spec: &ImageSpec,
        platform: &Platform,
        early: Option<&dyn EarlyUploads>,
        reporter: &dyn Reporter,
    ) -> impl Future<Output = Result<ExportedImage>>;
    /// Removes a temporary image the build wrote; true once it is gone.
    fn remove(&self, cleanup: &Cleanup, tag: &str) -> impl Future<Output = bool>;
}

impl Builder for Engine {
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
        self.daemon.is_some()
    }

    fn is_local(&self) -> bool {
        self.location.is_local()
    }

    async fn answers(&self) -> bool {
        let Some(standalone) = &self.daemon else {
            return self.location.probe().await.is_ok();
        };
        // A daemon speaks only gRPC (no `/_ping`): asked its version on a new connection,
        // bounded as the probe is, for a host that went away silently.
        let asked = async {
            let daemon = Daemon::connect(&standalone.daemon.endpoint).await?;
            daemon.version().await
        };
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(10), asked).await,
            Ok(Ok(_))
        )
    }

    async fn settings_key(
        &self,
        spec: &ImageSpec,
        platform: &Platform,
        bases: &RemoteBases,
    ) -> Result<Option<String>> {
        Ok(build_inputs::settings_key(self, spec, platform, bases).await?)
    }

    async fn build(&self, unit: UnitBuild<'_>, cleanup: &Cleanup) -> Result<BuiltImage> {
        let stage = match unit.output {
            Output::Engine if !self.standalone() => cleanup.add(
                self,
                &temporary_tag(&unit.spec.name, unit.platform, unit.run_id),
            ),
            // Nothing is written to the engine: a daemon sends the image back.
            Output::Engine | Output::Registry(_) => Default::default(),
        };
        build_on_engine(self, unit, &stage).await
    }

    async fn export(
        &self,
        built: &BuiltImage,
        spec: &ImageSpec,
        platform: &Platform,
        early: Option<&dyn EarlyUploads>,
        reporter: &dyn Reporter,
    ) -> Result<ExportedImage> {
        if let Some(layout) = &built.layout {
            let exported =
                export::read_layout_file(layout.path(), &spec.name, platform, reporter).await?;
            return Ok(exported);
        }
        let exported = export::export_image(
            &self.docker,
            &built.id,
            &spec.name,
            Some(platform),
            early,
            reporter,
        )
        .await?;
        Ok(exported)
    }

    async fn remove(&self, cleanup: &Cleanup, tag: &str) -> bool {
        // A daemon stored nothing under the tag (its layout file goes with the build).
        if self.standalone() {
            return true;
        }
        cleanup.remove(self, tag).await
    }
}

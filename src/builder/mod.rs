//! One build per image × platform on the Docker Engine: through BuildKit's own protocol
//! (see [`crate::docker::buildkit`]: BuildKit reads the context by file sync and applies the
//! ignore files itself), or the classic builder where the engine has no BuildKit (the
//! context streamed as a tar honouring the ignore file).

use crate::base::digest::Digest;
use crate::base::oci::ConfigPlatform;
use crate::base::progress::{Event, Reporter};
use crate::base::text::one_line;
use crate::docker::buildkit::{self, filesync::Transfer};
use crate::docker::engine::Engine;
use crate::project::{ImageSpec, Network};
use crate::Platform;
use bollard::models::{BuildInfo, BuildInfoAux};
use bollard::query_parameters::{BuildImageOptions, BuilderVersion};
use bollard_buildkit_proto::moby::buildkit::v1::StatusResponse;
use bytes::Bytes;
use cleanup::BuildStage;
use futures_util::StreamExt;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub mod binfmt;
pub mod build_inputs;
mod builders;
mod classic;
pub mod cleanup;
mod default_engine;
mod error;
pub mod export;
#[cfg(test)]
pub(crate) mod fake;
pub mod file_hashes;
mod libpod_build;
mod log;
pub mod platform_test;
mod platforms;
mod seam;

pub use builders::{connect_spec, sticky_key, sticky_slot, Builders};
pub use classic::classic_context_digest;
use classic::*;
pub use default_engine::default_engine;
pub use error::{BuildError, BuilderError};
pub(crate) use libpod_build::is_short_id;
pub use libpod_build::{build_with_libpod, LibpodBuild, LibpodBuilt};
pub use seam::Builder;

type Result<T, E = BuilderError> = std::result::Result<T, E>;
use error::Stopped;
use log::*;
pub use platforms::{build_platforms, BuiltIndex};

/// Log lines kept per build: a failing platform's log is shown in full up to this many
/// lines (the others stay in their reporter's last lines).
const LOG_TAIL: usize = 2000;

#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The engine's image ID (`sha256:…`), the digest of its config.
    pub id: String,
    /// The temporary local tag the build wrote; removed by the caller after export.
    pub tag: String,
    pub seconds: f64,
    /// What BuildKit read of the context (empty for the classic builder).
    pub transfers: Vec<Transfer>,
    /// The sha256 of the context tar the classic builder was sent in full (None for
    /// BuildKit, which reads what it needs through `transfers`).
    pub sent_context: Option<String>,
    /// The manifest the engine pushed itself ([`Output::Registry`]); `id` is its digest
    /// then, and nothing was written to the engine.
    pub pushed: Option<PushedManifest>,
    /// The OCI layout tar a standalone daemon's `oci` exporter sent back (it has no image
    /// store to export from); `id` is its config's digest then. Deleted on drop.
    pub layout: Option<std::sync::Arc<tempfile::NamedTempFile>>,
}

/// Where a build's image goes.
#[derive(Debug, Clone, Copy)]
pub enum Output<'a> {
    /// Into the engine under a temporary tag, to be exported from there; from a
    /// standalone daemon, sent back through the session as an OCI layout tar.
    Engine,
    /// Pushed by digest to this repository by the engine's BuildKit, compressed once and
    /// never stored in the engine: what containerd's image store can do.
    Registry(&'a str),
}

/// A platform manifest the engine pushed.
#[derive(Debug, Clone)]
pub struct PushedManifest {
    pub digest: Digest,
    pub size: u64,
    pub platform: ConfigPlatform,
}

/// The build args buildx defines for every build; injected for the classic builder,
/// which knows none of them.
pub fn platform_build_args(target: &Platform, build: &Platform) -> Vec<(String, String)> {
    let mut args = Vec::new();
    for (prefix, platform) in [("TARGET", target), ("BUILD", build)] {
        let variant = platform.build_variant().unwrap_or("");
        let full = match platform.build_variant() {
            Some(v) => format!("{}/{}/{}", platform.os, platform.architecture, v),
            None => platform.to_string(),
        };
        args.push((format!("{prefix}PLATFORM"), full));
        args.push((format!("{prefix}OS"), platform.os.clone()));
        args.push((format!("{prefix}ARCH"), platform.architecture.clone()));
        args.push((format!("{prefix}VARIANT"), variant.to_string()));
    }
    args
}

/// A local tag unique to this run, so parallel runs never collide.
pub fn temporary_tag(image: &str, platform: &Platform, run_id: &str) -> String {
    let slug = platform.to_string().replace('/', "-");
    format!("polyarch-build/{image}:{slug}-{run_id}")
}

/// Attempts per build when the engine loses an image another client deleted mid-build.
const BUILD_ATTEMPTS: usize = 3;

/// How one build attempt ended when it did not fail outright.
enum Attempt {
    Built(BuiltImage),
    /// Identical content gives identical image IDs: when a concurrent run removes its copy
    /// while the engine is exporting or tagging ours, the engine loses the image record
    /// (BuildKit: "failed to get digest … no such file"; or the tag is simply absent after
    /// a successful build). Building again recreates it.
    Lost(String),
}

/// One image × platform to build, and who hears about it.
#[derive(Clone, Copy)]
pub struct UnitBuild<'a> {
    pub spec: &'a ImageSpec,
    pub platform: &'a Platform,
    /// Makes the temporary tag unique to this run.
    pub run_id: &'a str,
    pub output: Output<'a>,
    pub reporter: &'a dyn Reporter,
    /// The run's remembered context hashes: the classic builder keeps the digest of the
    /// context it sent there.
    pub hashes: &'a std::sync::Arc<file_hashes::FileHashes>,
}

/// Builds `unit` into the temporary tag, marking on `stage` how far the engine got (once
/// it writes the image, the image may appear even if the build is cut off).
pub async fn build_on_engine(
    engine: &Engine,
    unit: UnitBuild<'_>,
    stage: &BuildStage,
) -> Result<BuiltImage> {
    let UnitBuild {
        spec,
        platform,
        reporter,
        ..
    } = unit;
    let mut attempt = 1;
    loop {
        match build_once(engine, unit, stage).await? {
            Attempt::Built(image) => return Ok(image),
            Attempt::Lost(message) if attempt >= BUILD_ATTEMPTS => {
                return Err(BuilderError::Build {
                    image: spec.name.clone(),
                    platform: platform.to_string(),
                    source: BuildError::ImageLost(message),
                })
            }
            Attempt::Lost(_) => {
                attempt += 1;
                reporter.report(Event::Warning {
                    message: format!(
                        "{} {platform}: the engine lost the image while exporting it (a concurrent removal); building again",
                        spec.name
                    ),
                });
            }
        }
    }
}

async fn build_once(engine: &Engine, unit: UnitBuild<'_>, stage: &BuildStage) -> Result<Attempt> {
    let UnitBuild {
        spec,
        platform,
        run_id,
        output,
        reporter,
        ..
    } = unit;
    let started = Instant::now();
    let tag = temporary_tag(&spec.name, platform, run_id);
    let failed = |source: BuildError| BuilderError::Build {
        image: spec.name.clone(),
        platform: platform.to_string(),
        source,
    };

    let foreign = platform.os_arch() != engine.native.os_arch();
    let mut log = BuildLog::new(&spec.name, platform, foreign, stage, reporter);
    let layout = match (output, &engine.daemon) {
        (Output::Engine, Some(_)) => Some(layout_spool().map_err(|e| {
            failed(BuildError::Answer(format!(
                "creating a temporary file for the daemon's OCI layout failed: {e}"
            )))
        })?),
        _ => None,
    };
    let into = layout.as_ref().map(|file| file.path());
    let (error, solved, sent_context) = run_build(engine, unit, &tag, into, &mut log).await?;
    // A solve BuildKit answered with success succeeded, whatever its steps said: a step
    // shared by two requests reports "context canceled" for the one whose wait was cut
    // short, and buildx builds on too.
    if let Some(stopped) = error {
        return stopped_build(&mut log, &stopped, spec, platform, output);
    }
    let (transfers, exporter_response) = solved
        .map(|s| (s.transfers, s.exporter_response))
        .unwrap_or_default();
    if let Output::Registry(repository) = output {
        let pushed = pushed_manifest(&exporter_response).ok_or_else(|| {
            failed(BuildError::Answer(format!(
                "the engine pushed to {repository} but did not say which manifest ({exporter_response:?})"
            )))
        })?;
        return Ok(Attempt::Built(BuiltImage {
            id: pushed.digest.to_string(),
            tag,
            seconds: started.elapsed().as_secs_f64(),
            transfers,
            sent_context,
            pushed: Some(pushed),
            layout: None,
        }));
    }
    if let Some(layout) = layout {
        let id = exporter_response
            .get("containerimage.config.digest")
            .ok_or_else(|| {
                failed(BuildError::Answer(format!(
                    "the daemon exported an OCI layout but did not say which config ({exporter_response:?})"
                )))
            })?;
        return Ok(Attempt::Built(BuiltImage {
            id: id.clone(),
            tag,
            seconds: started.elapsed().as_secs_f64(),
            transfers,
            sent_context,
            pushed: None,
            layout: Some(std::sync::Arc::new(layout)),
        }));
    }
    let read = (transfers, sent_context);
    built_in_engine(engine, spec, platform, tag, started, read).await
}

/// How a build stopped when it did not succeed, what BuildKit answered, and the digest of
/// the context the classic builder was sent.
type Ran = (Option<Stopped>, Option<buildkit::Solved>, Option<String>);

/// Runs the build through BuildKit, or the classic builder where the engine has no
/// BuildKit.
async fn run_build(
    engine: &Engine,
    unit: UnitBuild<'_>,
    tag: &str,
    layout: Option<&Path>,
    log: &mut BuildLog<'_>,
) -> Result<Ran> {
    let UnitBuild {
        spec,
        platform,
        output,
        hashes,
        ..
    } = unit;
    if !engine.buildkit {
        let outcome = build_classic(engine, spec, platform, tag, hashes, log).await?;
        return Ok((
            outcome.failed.map(Stopped::Failed),
            None,
            outcome.sent_context,
        ));
    }
    let exporter = match (output, layout) {
        (Output::Engine, Some(file)) => layout_exporter(file, spec),
        (Output::Engine, None) => buildkit::Exporter {
            kind: "moby".into(),
            attrs: HashMap::from([("name".to_string(), tag.to_string())]),
            file: None,
        },
        (Output::Registry(repository), _) => registry_exporter(engine, repository, spec),
    };
    let reporter = log.reporter;
    let mut on_status = |status| {
        log.consume(BuildInfo {
            aux: Some(BuildInfoAux::BuildKit(status)),
            ..Default::default()
        })
    };
    let platforms = std::slice::from_ref(platform);
    Ok(
        match solve_in_session(
            engine,
            spec,
            platforms,
            exporter,
            hashes,
            reporter,
            &mut on_status,
        )
        .await
        {
            Ok(solved) => (None, Some(solved), None),
            Err(error) => (Some(Stopped::from(error)), None, None),
        },
    )
}

/// The image the build wrote under `tag`; lost (to be built again) when the engine does
/// not have it after all.
async fn built_in_engine(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    tag: String,
    started: Instant,
    (transfers, sent_context): (Vec<Transfer>, Option<String>),
) -> Result<Attempt> {
    let inspected = match engine.docker.inspect_image(&tag).await {
        Ok(inspected) => inspected,
        Err(e) => {
            return Ok(Attempt::Lost(format!(
                "the engine reported success but the image {tag} is missing: {e}"
            )))
        }
    };
    let id = inspected.id.ok_or_else(|| BuilderError::Build {
        image: spec.name.clone(),
        platform: platform.to_string(),
        source: BuildError::Answer(format!("the engine returned no ID for {tag}")),
    })?;
    Ok(Attempt::Built(BuiltImage {
        id,
        tag,
        seconds: started.elapsed().as_secs_f64(),
        transfers,
        sent_context,
        pushed: None,
        layout: None,
    }))
}

/// A build the engine ended without an image: built again when the engine lost the image,
/// else the failure of its kind (a push the engine made, a lost builder, a failing step).
fn stopped_build(
    log: &mut BuildLog<'_>,
    stopped: &Stopped,
    spec: &ImageSpec,
    platform: &Platform,
    output: Output<'_>,
) -> Result<Attempt> {
    let failed = |source: BuildError| BuilderError::Build {
        image: spec.name.clone(),
        platform: platform.to_string(),
        source,
    };
    match log.classify(stopped) {
        Some(BuildError::ImageLost(message)) => return Ok(Attempt::Lost(message)),
        Some(kind) => return Err(failed(kind)),
        None => {}
    }
    let message = stopped.message();
    let exporting = log
        .current_step
        .as_deref()
        .is_some_and(|step| step.starts_with("exporting to"));
    if let (Output::Registry(repository), true) = (output, exporting) {
        return Err(push_failure(
            spec,
            &platform.to_string(),
            repository,
            message,
        ));
    }
    Err(log.failure(message, |m| failed(BuildError::StepFailed(m))))
}

/// How BuildKit's exporters (an engine's or a daemon's) write every layer: gzip level 1, as polyarch's own
/// export (BuildKit's default level 6 took a fifth of a cold build's wall time on
/// incompressible layers), OCI media types, and with `SOURCE_DATE_EPOCH` the layers' file
/// times clamped to it.
fn layer_attrs(spec: &ImageSpec) -> HashMap<String, String> {
    let mut attrs: HashMap<String, String> = [
        ("oci-mediatypes", "true"),
        ("compression", "gzip"),
        ("compression-level", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if spec.source_date_epoch.is_some() {
        attrs.insert("rewrite-timestamp".into(), "true".into());
    }
    attrs
}

/// BuildKit's image exporter pushing by digest to `repository`, layers as
/// [`layer_attrs`] has them, never stored in the engine; each platform manifest gets the
/// image's annotations.
fn registry_exporter(engine: &Engine, repository: &str, spec: &ImageSpec) -> buildkit::Exporter {
    let mut attrs = layer_attrs(spec);
    for (key, value) in [
        ("name", repository),
        ("push", "true"),
        ("push-by-digest", "true"),
        ("store", "false"),
        ("unpack", "false"),
    ] {
        attrs.insert(key.to_string(), value.to_string());
    }
    for (key, value) in &spec.annotations.manifest {
        attrs.insert(format!("annotation-manifest.{key}"), value.clone());
    }
    // An engine's BuildKit talks plain HTTP to loopback registries by itself (the
    // engine's own insecure list); a daemon's needs telling.
    let loopback = crate::registry::parse_reference(repository)
        .is_ok_and(|r| crate::registry::is_loopback(r.registry()));
    if engine.daemon.is_some() && loopback {
        attrs.insert("registry.insecure".into(), "true".into());
    }
    buildkit::Exporter {
        kind: "image".into(),
        attrs,
        file: None,
    }
}

/// A temporary file for a daemon's OCI layout tar, beside polyarch's export spools.
fn layout_spool() -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix("polyarch-layout-")
        .suffix(".tar")
        .tempfile()
}

/// BuildKit's `oci` exporter sending the image back as an OCI layout tar into `file`,
/// layers as [`layer_attrs`] has them, for polyarch to write the
/// `--output oci:` layout from as it does from an engine's export.
fn layout_exporter(file: &Path, spec: &ImageSpec) -> buildkit::Exporter {
    let attrs = layer_attrs(spec);
    buildkit::Exporter {
        kind: "oci".into(),
        attrs,
        file: Some(file.to_path_buf()),
    }
}

/// BuildKit's own push failed (after its own retries): a registry failure, named by the
/// registry as polyarch's uploads are, without the upload URLs' long session queries.
fn push_failure(spec: &ImageSpec, platform: &str, repository: &str, message: &str) -> BuilderError {
    let registry = crate::registry::parse_reference(repository)
        .map(|r| r.registry().to_string())
        .unwrap_or_else(|_| repository.to_string());
    let words: Vec<&str> = message
        .split_whitespace()
        .map(|word| match word.split_once('?') {
            Some((url, _)) if word.contains("://") => url,
            _ => word,
        })
        .collect();
    BuilderError::Registry(crate::registry::ClientError::registry(
        registry,
        crate::registry::RegistryError::EnginePush {
            image: spec.name.clone(),
            platform: platform.to_string(),
            repository: repository.to_string(),
            detail: words.join(" "),
        },
    ))
}

/// The digest of what BuildKit's image exporter pushed (a multi-platform solve's index).
fn pushed_manifest_digest(exporter_response: &HashMap<String, String>) -> Option<Digest> {
    exporter_response.get("containerimage.digest")?.parse().ok()
}

/// The manifest BuildKit's image exporter pushed: its descriptor, base64 JSON.
fn pushed_manifest(exporter_response: &HashMap<String, String>) -> Option<PushedManifest> {
    #[derive(serde::Deserialize)]
    struct Descriptor {
        digest: Digest,
        size: u64,
        platform: ConfigPlatform,
    }
    use base64::Engine as _;
    let encoded = exporter_response.get("containerimage.descriptor")?;
    let json = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let descriptor: Descriptor = serde_json::from_slice(&json).ok()?;
    Some(PushedManifest {
        digest: descriptor.digest,
        size: descriptor.size,
        platform: descriptor.platform,
    })
}

/// The build through BuildKit's session protocol, the image going where `exporter` says.
async fn solve_in_session(
    engine: &Engine,
    spec: &ImageSpec,
    platforms: &[Platform],
    exporter: buildkit::Exporter,
    hashes: &std::sync::Arc<file_hashes::FileHashes>,
    reporter: &dyn Reporter,
    on_status: &mut (dyn FnMut(StatusResponse) + Send),
) -> std::result::Result<buildkit::Solved, buildkit::SolveError> {
    let list: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    let platform_names = list.join(",");
    let (attrs, entitlements) = frontend_attrs(spec, &platform_names);
    let secrets = spec
        .secrets
        .iter()
        .map(|(id, secret)| (id.clone(), secret.source.clone()))
        .collect();
    let cache_to = registry_cache_to(engine, spec, platforms, reporter);
    let build = buildkit::DockerfileBuild {
        context: &spec.context,
        dockerfile: &spec.dockerfile,
        named_dirs: crate::project::contexts::session_dirs(&spec.contexts),
        frontend_attrs: attrs,
        entitlements,
        exporter,
        secrets: buildkit::secrets::SecretStore::new(secrets),
        ssh: buildkit::ssh::SshAgents::new(ssh_sockets(spec)?),
        cache_from: spec
            .cache_from
            .iter()
            .flat_map(|from| {
                platforms
                    .first()
                    .map(|platform| from.for_platform(platform))
            })
            .collect(),
        cache_to,
        history: spec.build_history,
        hashes: Some(hashes.clone()),
    };
    // A cache BuildKit cannot import (on a first run it is not pushed yet) only costs the
    // build its cached steps: BuildKit goes on without it, and so does polyarch, saying so
    // once, instead of taking the import's failed step for the build's failure.
    const IMPORTING: &str = "importing cache manifest from ";
    let mut not_imported = std::collections::BTreeSet::new();
    buildkit::solve_on(solve_target(engine), build, session_auth(spec), |mut status| {
        for vertex in &mut status.vertexes {
            if let Some(reference) = vertex.name.strip_prefix(IMPORTING) {
                let error = std::mem::take(&mut vertex.error);
                if !error.is_empty() && not_imported.insert(reference.to_string()) {
                    reporter.report(Event::Warning {
                        message: format!(
                            "{} {platform_names}: the cache {reference} could not be imported ({}); building without it",
                            spec.name,
                            crate::base::text::one_line(&error)
                        ),
                    });
                }
            }
        }
        on_status(status)
    })
    .await
}

/// Where a solve on `engine` runs: its own BuildKit, or the standalone daemon it is.
fn solve_target(engine: &Engine) -> buildkit::Target<'_> {
    match &engine.daemon {
        Some(standalone) => buildkit::Target::Daemon(&standalone.daemon),
        None => buildkit::Target::Engine(&engine.location),
    }
}

/// The socket of each SSH agent the build forwards, by its id.
fn ssh_sockets(
    spec: &ImageSpec,
) -> std::result::Result<BTreeMap<String, PathBuf>, buildkit::SolveError> {
    spec.ssh
        .iter()
        .map(|(id, agent)| {
            let socket = agent
                .socket
                .resolve()
                .map_err(|e| buildkit::SolveError::Failed(format!("SSH agent `{id}`: {e}")))?;
            Ok((id.clone(), socket))
        })
        .collect()
}

/// The command line's credentials go to the image's own registry only, as the push does
/// with them.
fn session_auth(spec: &ImageSpec) -> buildkit::SessionAuth {
    buildkit::SessionAuth {
        push: spec.login.clone().and_then(|login| {
            let repository = crate::registry::parse_reference(&spec.repository).ok()?;
            Some((repository.registry().to_string(), login))
        }),
    }
}

/// The frontend attribute for a RUN step's `network`, and the entitlements it needs.
fn network_attrs(network: Network, attrs: &mut HashMap<String, String>) -> Vec<String> {
    match network {
        Network::Default => Vec::new(),
        Network::Host => {
            attrs.insert("force-network-mode".into(), "host".into());
            vec!["network.host".to_string()]
        }
        Network::None => {
            attrs.insert("force-network-mode".into(), "none".into());
            Vec::new()
        }
    }
}

/// The Dockerfile frontend's attributes for `spec` and the entitlements they need.
fn frontend_attrs(
    spec: &ImageSpec,
    platform_names: &str,
) -> (HashMap<String, String>, Vec<String>) {
    let mut attrs: HashMap<String, String> =
        HashMap::from([("platform".into(), platform_names.to_string())]);
    if let Some(target) = &spec.target {
        attrs.insert("target".into(), target.clone());
    }
    if let Some(epoch) = spec.source_date_epoch {
        // BuildKit 0.11+ sets the config's and history's times from it.
        attrs.insert("build-arg:SOURCE_DATE_EPOCH".into(), epoch.to_string());
    }
    for (key, value) in &spec.build_args {
        attrs.insert(format!("build-arg:{key}"), value.clone());
    }
    for (key, value) in &spec.labels {
        attrs.insert(format!("label:{key}"), value.clone());
    }
    let entitlements = network_attrs(spec.network, &mut attrs);
    if spec.pull {
        attrs.insert("image-resolve-mode".into(), "pull".into());
    }
    if spec.no_cache {
        // Empty: no step may come from the cache (a list would name stages).
        attrs.insert("no-cache".into(), String::new());
    }
    for (name, context) in &spec.contexts {
        attrs.insert(format!("context:{name}"), context.frontend_value(name));
    }
    if !spec.contexts.is_empty() {
        // What buildx declares with them: a `# syntax=` frontend gets them forwarded.
        attrs.insert(
            "frontend.caps".into(),
            "moby.buildkit.frontend.contexts+forward".into(),
        );
    }
    (attrs, entitlements)
}

/// Where the registry cache goes, if the engine can export one. Only BuildKit on
/// containerd's image store has the registry cache exporter (Docker's classic store offers
/// `inline` alone, and refuses the solve for any other): said once per engine and run, not
/// per platform.
fn registry_cache_to(
    engine: &Engine,
    spec: &ImageSpec,
    platforms: &[Platform],
    reporter: &dyn Reporter,
) -> Option<String> {
    static TOLD: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    match &spec.cache_to {
        Some(to) if !engine.containerd_store => {
            let first = TOLD
                .lock()
                .map(|mut told| told.insert(engine.endpoint.clone()))
                .unwrap_or(false);
            if first {
                reporter.report(Event::Warning {
                    message: format!(
                        "the engine at {} (Docker {}) keeps images in the classic store, whose BuildKit cannot export a registry cache: building without exporting to {to}; use an engine with the containerd image store to export",
                        engine.endpoint, engine.server_version
                    ),
                });
            }
            None
        }
        // Per-platform caches need one solve per platform: the caller solves several
        // platforms together only for images without registry cache.
        Some(to) => platforms.first().map(|platform| to.for_platform(platform)),
        None => None,
    }
}

#[cfg(test)]
mod tests;

//! One build per image × platform on the Docker Engine: through BuildKit's own protocol
//! (see [`crate::buildkit`]: BuildKit reads the context by file sync and applies the
//! ignore files itself), or the classic builder where the engine has no BuildKit (the
//! context streamed as a tar honouring the ignore file).

use crate::buildkit::{self, filesync::Transfer};
use crate::engine::Engine;
use crate::error::one_line;
use crate::oci::ConfigPlatform;
use crate::progress::{Event, Reporter};
use crate::project::{ImageSpec, Network};
use crate::{Error, Platform, Result};
use bollard::models::{BuildInfo, BuildInfoAux};
use bollard::query_parameters::{BuildImageOptions, BuilderVersion};
use bollard_buildkit_proto::moby::buildkit::v1::StatusResponse;
use bytes::Bytes;
use futures_util::StreamExt;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

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
    /// The manifest the engine pushed itself ([`Output::Registry`]); `id` is its digest
    /// then, and nothing was written to the engine.
    pub pushed: Option<PushedManifest>,
}

/// Where a build's image goes.
#[derive(Debug, Clone, Copy)]
pub enum Output<'a> {
    /// Into the engine under a temporary tag, to be exported from there.
    Engine,
    /// Pushed by digest to this repository by the engine's BuildKit, compressed once and
    /// never stored in the engine: what containerd's image store can do.
    Registry(&'a str),
}

/// A platform manifest the engine pushed.
#[derive(Debug, Clone)]
pub struct PushedManifest {
    pub digest: String,
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

/// Builds `spec` for `platform` into the temporary tag; `export_started` is set once the
/// engine begins writing the image (from then on it may appear even if the build is cut off).
pub async fn build(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    run_id: &str,
    output: Output<'_>,
    export_started: &AtomicBool,
    reporter: &dyn Reporter,
) -> Result<BuiltImage> {
    let mut attempt = 1;
    loop {
        match build_once(
            engine,
            spec,
            platform,
            run_id,
            output,
            export_started,
            reporter,
        )
        .await?
        {
            Attempt::Built(image) => return Ok(image),
            Attempt::Lost(message) if attempt >= BUILD_ATTEMPTS => {
                return Err(Error::Build {
                    image: spec.name.clone(),
                    platform: platform.to_string(),
                    message,
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

async fn build_once(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    run_id: &str,
    output: Output<'_>,
    export_started: &AtomicBool,
    reporter: &dyn Reporter,
) -> Result<Attempt> {
    let started = Instant::now();
    let tag = temporary_tag(&spec.name, platform, run_id);
    let failed = |message: String| Error::Build {
        image: spec.name.clone(),
        platform: platform.to_string(),
        message,
    };

    let foreign = platform.os_arch() != engine.native.os_arch();
    let mut log = BuildLog::new(&spec.name, platform, foreign, export_started, reporter);
    let exporter = match output {
        Output::Engine => buildkit::Exporter {
            kind: "moby".into(),
            attrs: HashMap::from([("name".to_string(), tag.clone())]),
        },
        Output::Registry(repository) => registry_exporter(repository, spec),
    };
    let (error, solved) = if engine.buildkit {
        let mut on_status = |status| {
            log.consume(BuildInfo {
                aux: Some(BuildInfoAux::BuildKit(status)),
                ..Default::default()
            })
        };
        let platforms = std::slice::from_ref(platform);
        match solve_in_session(engine, spec, platforms, exporter, reporter, &mut on_status).await {
            Ok(solved) => (None, Some(solved)),
            Err(message) => (Some(message), None),
        }
    } else {
        (
            build_classic(engine, spec, platform, &tag, &mut log).await?,
            None,
        )
    };
    if let Some(message) = error.or_else(|| log.vertex_error.take()) {
        let with_tail = log.with_tail(&message);
        if with_tail.contains("failed to get digest") && with_tail.contains("no such file") {
            return Ok(Attempt::Lost(message));
        }
        let exporting = log
            .current_step
            .as_deref()
            .is_some_and(|step| step.starts_with("exporting to"));
        if let (Output::Registry(repository), true) = (output, exporting) {
            return Err(push_failure(
                spec,
                &platform.to_string(),
                repository,
                &message,
            ));
        }
        return Err(log.failure(&message, failed));
    }
    let (transfers, exporter_response) = solved
        .map(|s| (s.transfers, s.exporter_response))
        .unwrap_or_default();
    if let Output::Registry(repository) = output {
        let pushed = pushed_manifest(&exporter_response).ok_or_else(|| {
            failed(format!(
                "the engine pushed to {repository} but did not say which manifest ({exporter_response:?})"
            ))
        })?;
        return Ok(Attempt::Built(BuiltImage {
            id: pushed.digest.clone(),
            tag,
            seconds: started.elapsed().as_secs_f64(),
            transfers,
            pushed: Some(pushed),
        }));
    }

    let inspected = match engine.docker.inspect_image(&tag).await {
        Ok(inspected) => inspected,
        Err(e) => {
            return Ok(Attempt::Lost(format!(
                "the engine reported success but the image {tag} is missing: {e}"
            )))
        }
    };
    let id = inspected
        .id
        .ok_or_else(|| failed(format!("the engine returned no ID for {tag}")))?;
    Ok(Attempt::Built(BuiltImage {
        id,
        tag,
        seconds: started.elapsed().as_secs_f64(),
        transfers,
        pushed: None,
    }))
}

/// BuildKit's image exporter pushing by digest to `repository`: compressed once, never
/// stored in the engine; each platform manifest gets the image's annotations, and with
/// `SOURCE_DATE_EPOCH` the exporter clamps the layers' file times to it.
fn registry_exporter(repository: &str, spec: &ImageSpec) -> buildkit::Exporter {
    let mut attrs: HashMap<String, String> = [
        ("name", repository),
        ("push", "true"),
        ("push-by-digest", "true"),
        ("store", "false"),
        ("unpack", "false"),
        ("oci-mediatypes", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (key, value) in &spec.annotations.manifest {
        attrs.insert(format!("annotation-manifest.{key}"), value.clone());
    }
    if spec.source_date_epoch.is_some() {
        attrs.insert("rewrite-timestamp".into(), "true".into());
    }
    buildkit::Exporter {
        kind: "image".into(),
        attrs,
    }
}

/// What one solve for several platforms pushed: an index of their manifests, by digest.
#[derive(Debug, Clone)]
pub struct BuiltIndex {
    /// The index BuildKit pushed; polyarch reads its platform manifests and publishes its
    /// own index of them.
    pub digest: String,
    pub seconds: f64,
    /// What BuildKit read of the context, for all the platforms.
    pub transfers: Vec<Transfer>,
}

/// Builds `spec` for every one of `platforms` in one solve whose image exporter pushes
/// them by digest to `repository` (an engine on containerd's image store): one session,
/// one context transfer and one exporter run for the image instead of one per platform.
/// Each platform's steps and logs are reported as its own build's would be.
pub async fn build_platforms(
    engine: &Engine,
    spec: &ImageSpec,
    platforms: &[Platform],
    repository: &str,
    reporter: &dyn Reporter,
) -> Result<BuiltIndex> {
    let started = Instant::now();
    // Nothing is written to the engine, so nothing waits on the exporter having started.
    let export_started = AtomicBool::new(false);
    let mut logs = PlatformLogs::new(
        &spec.name,
        platforms,
        &engine.native,
        &export_started,
        reporter,
    );
    let solved = {
        let mut on_status = |status| logs.route(status);
        let exporter = registry_exporter(repository, spec);
        solve_in_session(engine, spec, platforms, exporter, reporter, &mut on_status).await
    };
    let (message, failed) = match solved {
        Ok(solved) => match logs.failed() {
            None => {
                let digest =
                    pushed_manifest_digest(&solved.exporter_response).ok_or_else(|| {
                        Error::Build {
                            image: spec.name.clone(),
                            platform: platform_list(platforms),
                            message: format!(
                            "the engine pushed to {repository} but did not say which index ({:?})",
                            solved.exporter_response
                        ),
                        }
                    })?;
                return Ok(BuiltIndex {
                    digest,
                    seconds: started.elapsed().as_secs_f64(),
                    transfers: solved.transfers,
                });
            }
            Some(index) => (
                logs.logs[index].vertex_error.clone().unwrap_or_default(),
                index,
            ),
        },
        Err(message) => (message, logs.failed().unwrap_or(0)),
    };
    let log = &mut logs.logs[failed];
    let platform = log.platform;
    let shared = log.shared_failure;
    let names = if shared {
        platform_list(platforms)
    } else {
        platform.to_string()
    };
    let exporting = log
        .current_step
        .as_deref()
        .is_some_and(|step| step.starts_with("exporting to"));
    if exporting {
        return Err(push_failure(spec, &names, repository, &message));
    }
    Err(log.failure(&message, |message| Error::Build {
        image: spec.name.clone(),
        platform: names.clone(),
        message,
    }))
}

fn platform_list(platforms: &[Platform]) -> String {
    platforms
        .iter()
        .map(Platform::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// One [`BuildLog`] per platform of a multi-platform solve. BuildKit names a platform's
/// vertices `[linux/arm64 2/4] RUN …`: each goes to its platform's log without the
/// platform (as a single-platform build names it), a vertex of no platform (the context
/// transfer, the exporter) to every log.
struct PlatformLogs<'a> {
    logs: Vec<BuildLog<'a>>,
    /// Which log each vertex went to (`None`: all), for the logs that name it.
    vertices: HashMap<String, Option<usize>>,
}

impl<'a> PlatformLogs<'a> {
    fn new(
        image: &'a str,
        platforms: &'a [Platform],
        native: &Platform,
        export_started: &'a AtomicBool,
        reporter: &'a dyn Reporter,
    ) -> Self {
        let logs = platforms
            .iter()
            .map(|platform| {
                let foreign = platform.os_arch() != native.os_arch();
                BuildLog::new(image, platform, foreign, export_started, reporter)
            })
            .collect();
        PlatformLogs {
            logs,
            vertices: HashMap::new(),
        }
    }

    fn route(&mut self, status: StatusResponse) {
        let mut parts: Vec<StatusResponse> = vec![StatusResponse::default(); self.logs.len()];
        let mut vertexes = status.vertexes;
        for vertex in &mut vertexes {
            if let Some((index, name)) = self.split_platform(&vertex.name) {
                vertex.name = name;
                self.vertices.insert(vertex.digest.clone(), Some(index));
            }
        }
        // Some steps carry no platform in their name (an exec-form RUN is `[2/2] RUN [...]`
        // for every platform): such a step belongs to the platform of the steps it builds
        // on, which a status lists in no particular order.
        loop {
            let mut found = false;
            for vertex in &vertexes {
                if self
                    .vertices
                    .get(&vertex.digest)
                    .copied()
                    .flatten()
                    .is_none()
                {
                    if let Some(index) = self.platform_of_inputs(&vertex.inputs) {
                        self.vertices.insert(vertex.digest.clone(), Some(index));
                        found = true;
                    }
                }
            }
            if !found {
                break;
            }
        }
        for vertex in vertexes {
            let target = self.vertices.get(&vertex.digest).copied().flatten();
            self.vertices.insert(vertex.digest.clone(), target);
            match target {
                Some(index) => parts[index].vertexes.push(vertex),
                None => {
                    for part in &mut parts {
                        part.vertexes.push(vertex.clone());
                    }
                }
            }
        }
        for log in status.logs {
            match self.vertices.get(&log.vertex).copied().flatten() {
                Some(index) => parts[index].logs.push(log),
                None => {
                    for part in &mut parts {
                        part.logs.push(log.clone());
                    }
                }
            }
        }
        for (log, part) in self.logs.iter_mut().zip(parts) {
            if part.vertexes.is_empty() && part.logs.is_empty() {
                continue;
            }
            let shared_error = part
                .vertexes
                .iter()
                .any(|v| !v.error.is_empty() && self.vertices[&v.digest].is_none());
            if shared_error && log.vertex_error.is_none() {
                log.shared_failure = true;
            }
            log.consume(BuildInfo {
                aux: Some(BuildInfoAux::BuildKit(part)),
                ..Default::default()
            });
        }
    }

    /// The one platform the `inputs` vertices were routed to, if they agree on one.
    fn platform_of_inputs(&self, inputs: &[String]) -> Option<usize> {
        let mut routed = inputs
            .iter()
            .filter_map(|input| self.vertices.get(input).copied().flatten());
        let first = routed.next()?;
        routed.all(|index| index == first).then_some(first)
    }

    /// The log of the platform whose vertex named in `[PLATFORM …]` is one of ours, and the
    /// name without it.
    fn split_platform(&self, name: &str) -> Option<(usize, String)> {
        let inner = name.strip_prefix('[')?;
        let end = inner.find([' ', ']'])?;
        let platform: Platform = inner[..end].parse().ok()?;
        let index = self.logs.iter().position(|log| *log.platform == platform)?;
        let rest = &inner[end..];
        let name = match rest.strip_prefix(' ') {
            Some(rest) => format!("[{rest}"),
            None => rest.trim_start_matches(']').trim_start().to_string(),
        };
        Some((index, name))
    }

    /// The log that explains the failure: a platform whose own step failed first, rather
    /// than one cancelled because another failed.
    fn failed(&self) -> Option<usize> {
        let cancelled = |log: &BuildLog<'_>| {
            log.vertex_error
                .as_deref()
                .is_some_and(|e| e.contains("context canceled"))
        };
        self.logs
            .iter()
            .position(|log| log.vertex_error.is_some() && !cancelled(log))
            .or_else(|| self.logs.iter().position(|log| log.vertex_error.is_some()))
    }
}

/// BuildKit's own push failed (after its own retries): a registry failure, named by the
/// registry as polyarch's uploads are, without the upload URLs' long session queries.
fn push_failure(spec: &ImageSpec, platform: &str, repository: &str, message: &str) -> Error {
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
    Error::Registry {
        registry,
        message: format!(
            "the engine could not push {} {platform} to {repository}: {}; check that the engine reaches the registry (its insecure-registries and certs.d apply) and that the registry accepts uploads",
            spec.name,
            words.join(" ")
        ),
    }
}

/// The digest of what BuildKit's image exporter pushed (a multi-platform solve's index).
fn pushed_manifest_digest(exporter_response: &HashMap<String, String>) -> Option<String> {
    exporter_response
        .get("containerimage.digest")
        .filter(|digest| digest.starts_with("sha256:"))
        .cloned()
}

/// The manifest BuildKit's image exporter pushed: its descriptor, base64 JSON.
fn pushed_manifest(exporter_response: &HashMap<String, String>) -> Option<PushedManifest> {
    #[derive(serde::Deserialize)]
    struct Descriptor {
        digest: String,
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

/// The build through the classic builder (`POST /build`, the context uploaded as a tar),
/// for engines without BuildKit; the error message when it failed.
async fn build_classic(
    engine: &Engine,
    spec: &ImageSpec,
    platform: &Platform,
    tag: &str,
    log: &mut BuildLog<'_>,
) -> Result<Option<String>> {
    let needs_buildkit = [
        (!spec.secrets.is_empty(), "secrets"),
        (!spec.ssh.is_empty(), "ssh"),
        (
            !spec.cache_from.is_empty() || spec.cache_to.is_some(),
            "cache",
        ),
    ];
    if let Some((_, what)) = needs_buildkit.iter().find(|(used, _)| *used) {
        return Err(Error::Build {
            image: spec.name.clone(),
            platform: platform.to_string(),
            message: format!(
                "`{what}` needs BuildKit, and the engine at {} (API {}) has none; upgrade it to Docker 18.09+ or build on another engine",
                engine.endpoint, engine.api_version
            ),
        });
    }
    let mut buildargs: HashMap<String, String> = spec.build_args.clone().into_iter().collect();
    // The classic builder defines none of the platform args BuildKit does.
    for (key, value) in platform_build_args(platform, &engine.native) {
        buildargs.entry(key).or_insert(value);
    }
    let options = BuildImageOptions {
        dockerfile: spec.dockerfile.to_string_lossy().replace('\\', "/"),
        t: Some(tag.to_string()),
        platform: platform.to_string(),
        target: spec.target.clone().unwrap_or_default(),
        buildargs: Some(buildargs),
        labels: Some(spec.labels.clone().into_iter().collect()),
        networkmode: Some(
            match spec.network {
                Network::Default => "default",
                Network::Host => "host",
                Network::None => "none",
            }
            .to_string(),
        ),
        rm: true,
        forcerm: true,
        // The classic builder's cache ignores the platform: a layer cached for amd64 would
        // be reused for arm64.
        nocache: true,
        version: BuilderVersion::BuilderV1,
        ..Default::default()
    };
    let context = stream_context(spec.context.clone(), spec.dockerfile.clone())?;
    let mut stream = engine
        .docker
        .build_image(options, None, Some(bollard::body_stream(context)));
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => log.consume(info),
            Err(e) => return Ok(Some(e.to_string())),
        }
    }
    Ok(None)
}

/// The build through BuildKit's session protocol, the image going where `exporter` says;
/// the error message when it failed.
async fn solve_in_session(
    engine: &Engine,
    spec: &ImageSpec,
    platforms: &[Platform],
    exporter: buildkit::Exporter,
    reporter: &dyn Reporter,
    on_status: &mut (dyn FnMut(StatusResponse) + Send),
) -> std::result::Result<buildkit::Solved, String> {
    let list: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    let platform_names = list.join(",");
    let mut attrs: HashMap<String, String> =
        HashMap::from([("platform".into(), platform_names.clone())]);
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
    let mut entitlements = Vec::new();
    match spec.network {
        Network::Default => {}
        Network::Host => {
            attrs.insert("force-network-mode".into(), "host".into());
            entitlements.push("network.host".to_string());
        }
        Network::None => {
            attrs.insert("force-network-mode".into(), "none".into());
        }
    }
    if spec.pull {
        attrs.insert("image-resolve-mode".into(), "pull".into());
    }
    if spec.no_cache {
        // Empty: no step may come from the cache (a list would name stages).
        attrs.insert("no-cache".into(), String::new());
    }
    let secrets = spec
        .secrets
        .iter()
        .map(|(id, secret)| (id.clone(), secret.source.clone()))
        .collect();
    let mut sockets = std::collections::BTreeMap::new();
    for (id, agent) in &spec.ssh {
        let socket = agent
            .socket
            .resolve()
            .map_err(|e| format!("SSH agent `{id}`: {e}"))?;
        sockets.insert(id.clone(), socket);
    }
    // Only BuildKit on containerd's image store has the registry cache exporter (Docker's
    // classic store offers `inline` alone, and refuses the solve for any other). Said
    // once per engine and run, not per platform.
    static TOLD: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let cache_to = match &spec.cache_to {
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
    };
    let build = buildkit::DockerfileBuild {
        context: &spec.context,
        dockerfile: &spec.dockerfile,
        frontend_attrs: attrs,
        entitlements,
        exporter,
        secrets: buildkit::secrets::SecretStore::new(secrets),
        ssh: buildkit::ssh::SshAgents::new(sockets),
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
    };
    // The command line's credentials go to the image's own registry only, as the push
    // does with them.
    let auth = buildkit::SessionAuth {
        push: spec.login.clone().and_then(|login| {
            let repository = crate::registry::parse_reference(&spec.repository).ok()?;
            Some((repository.registry().to_string(), login))
        }),
    };
    // A cache BuildKit cannot import (on a first run it is not pushed yet) only costs the
    // build its cached steps: BuildKit goes on without it, and so does polyarch, saying so
    // once, instead of taking the import's failed step for the build's failure.
    const IMPORTING: &str = "importing cache manifest from ";
    let mut not_imported = std::collections::BTreeSet::new();
    let solved = buildkit::solve(&engine.location, build, auth, |mut status| {
        for vertex in &mut status.vertexes {
            if let Some(reference) = vertex.name.strip_prefix(IMPORTING) {
                let error = std::mem::take(&mut vertex.error);
                if !error.is_empty() && not_imported.insert(reference.to_string()) {
                    reporter.report(Event::Warning {
                        message: format!(
                            "{} {platform_names}: the cache {reference} could not be imported ({}); building without it",
                            spec.name,
                            crate::error::one_line(&error)
                        ),
                    });
                }
            }
        }
        on_status(status)
    })
    .await;
    solved.map_err(|e| e.to_string())
}

/// Turns the engine's build stream (BuildKit status or classic lines) into events and
/// keeps what is needed to explain a failure.
struct BuildLog<'a> {
    image: &'a str,
    platform: &'a Platform,
    /// The engine runs this platform's programs only under emulation.
    foreign: bool,
    /// In a multi-platform solve, the first error came from a step of no one platform.
    shared_failure: bool,
    reporter: &'a dyn Reporter,
    export_started: &'a AtomicBool,
    tail: VecDeque<String>,
    vertex_names: HashMap<String, String>,
    started: Vec<String>,
    current_step: Option<String>,
    vertex_error: Option<String>,
}

impl<'a> BuildLog<'a> {
    fn new(
        image: &'a str,
        platform: &'a Platform,
        foreign: bool,
        export_started: &'a AtomicBool,
        reporter: &'a dyn Reporter,
    ) -> Self {
        BuildLog {
            image,
            platform,
            foreign,
            shared_failure: false,
            reporter,
            export_started,
            tail: VecDeque::new(),
            vertex_names: HashMap::new(),
            started: Vec::new(),
            current_step: None,
            vertex_error: None,
        }
    }

    fn line(&mut self, line: &str) {
        let line = line.trim_end();
        if line.is_empty() {
            return;
        }
        if self.tail.len() == LOG_TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
        self.reporter.report(Event::Log {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            line: line.to_string(),
        });
    }

    fn step(&mut self, name: &str, step: u32, total: Option<u32>) {
        self.current_step = Some(name.to_string());
        self.reporter.report(Event::Step {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            step,
            total,
            name: name.to_string(),
        });
    }

    fn consume(&mut self, info: BuildInfo) {
        if let Some(text) = &info.stream {
            for line in text.lines() {
                // Classic builder: "Step 2/5 : COPY . /src"
                if let Some((n, m)) = classic_step(line) {
                    let name = line.split_once(" : ").map_or(line, |(_, s)| s).to_string();
                    self.step(&name, n, Some(m));
                }
                self.line(line);
            }
        }
        if let Some(BuildInfoAux::BuildKit(status)) = info.aux {
            for vertex in status.vertexes {
                self.vertex_names
                    .insert(vertex.digest.clone(), vertex.name.clone());
                if vertex.started.is_some() && !self.started.contains(&vertex.digest) {
                    self.started.push(vertex.digest.clone());
                    // BuildKit's exporters name their vertex "exporting to image" (or to
                    // another destination).
                    if vertex.name.starts_with("exporting to") {
                        self.export_started.store(true, Ordering::SeqCst);
                    }
                    let (n, m) = buildkit_step(&vertex.name).unzip();
                    self.step(&vertex.name, n.unwrap_or(0), m);
                }
                if !vertex.error.is_empty() && self.vertex_error.is_none() {
                    self.current_step = Some(vertex.name.clone());
                    self.vertex_error = Some(vertex.error.clone());
                }
            }
            for log in status.logs {
                let text = String::from_utf8_lossy(&log.msg).to_string();
                for line in text.lines() {
                    self.line(line);
                }
            }
        }
    }

    /// The engine's error message followed by the build's last log lines.
    fn with_tail(&self, message: &str) -> String {
        let mut text = message.to_string();
        for line in &self.tail {
            text.push('\n');
            text.push_str(line);
        }
        text
    }

    fn failure(&mut self, message: &str, failed: impl Fn(String) -> Error) -> Error {
        // Missing emulation is said in one line; the log adds nothing to it. On the engine's
        // own platform the same error means a program built for another one: the build's
        // own failure, with its log.
        if self.foreign && self.with_tail(message).contains("exec format error") {
            return Error::Emulation(format!(
                "emulation for {} is not registered on this engine, so its RUN steps cannot execute; run with `--binfmt auto` (or `binfmt: auto` in polyarch.yaml) to register QEMU, or build {} on a native builder",
                self.platform, self.platform
            ));
        }
        self.reporter.report(Event::FailedLog {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            lines: self.tail.iter().cloned().collect(),
        });
        let step = self
            .current_step
            .as_deref()
            .map(|s| format!(" at step `{s}`"))
            .unwrap_or_default();
        let tail: Vec<String> = self.tail.iter().rev().take(5).rev().cloned().collect();
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!("; last output: {}", tail.join(" | "))
        };
        failed(format!("{}{step}{tail}", one_line(message)))
    }
}

fn classic_step(line: &str) -> Option<(u32, u32)> {
    let rest = line.strip_prefix("Step ")?;
    let (frac, _) = rest.split_once(' ')?;
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// BuildKit names Dockerfile steps "[stage 2/5] RUN …" or "[2/5] COPY …".
fn buildkit_step(name: &str) -> Option<(u32, u32)> {
    let inner = name.strip_prefix('[')?.split_once(']')?.0;
    let frac = inner.rsplit(' ').next()?;
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// Streams the build context as a tar from a blocking thread, so a large context is
/// never held in memory.
fn stream_context(
    context: PathBuf,
    dockerfile: PathBuf,
) -> Result<impl futures_util::Stream<Item = Bytes> + Send + 'static> {
    let files = ContextFilter::load(&context, &dockerfile)?.files(&context)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::task::spawn_blocking(move || {
        let mut tar = tar::Builder::new(ChannelWriter {
            tx,
            buf: Vec::new(),
        });
        tar.follow_symlinks(false);
        for relative in files {
            // A send error means the engine hung up; the build stream reports why.
            if tar
                .append_path_with_name(context.join(&relative), &relative)
                .is_err()
            {
                return;
            }
        }
        if let Ok(mut writer) = tar.into_inner() {
            let _ = writer.flush();
        }
    });
    Ok(tokio_stream_from(rx))
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 * 1024 {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.blocking_send(chunk).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "engine closed the build")
        })
    }
}

/// What of a context the engine is sent, as BuildKit decides it: the ignore file's
/// patterns, and the files that are always sent (the Dockerfile and that ignore file).
struct ContextFilter {
    ignore: Gitignore,
    /// Relative to the context: `<Dockerfile>.dockerignore` beside the Dockerfile when it
    /// exists (BuildKit then reads it instead of the context's), else `.dockerignore`.
    ignore_file: PathBuf,
    dockerfile: PathBuf,
}

impl ContextFilter {
    /// `.dockerignore` patterns are relative to the context root, so each is anchored;
    /// gitignore matching then gives Docker's semantics (`*` within a segment, `**`, `!`).
    fn load(context: &Path, dockerfile: &Path) -> Result<ContextFilter> {
        let mut specific = dockerfile.as_os_str().to_owned();
        specific.push(".dockerignore");
        let specific = PathBuf::from(specific);
        let ignore_file = if context.join(&specific).is_file() {
            specific
        } else {
            PathBuf::from(".dockerignore")
        };
        let path = context.join(&ignore_file);
        let bad = |message: String| Error::Build {
            image: context.display().to_string(),
            platform: "any".into(),
            message,
        };
        let mut builder = GitignoreBuilder::new(context);
        if let Ok(text) = std::fs::read_to_string(&path) {
            for raw in text.lines() {
                let line = raw.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (negated, pattern) = match line.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, line),
                };
                let pattern = pattern.trim_start_matches("./").trim_start_matches('/');
                let anchored = format!("{}/{}", if negated { "!" } else { "" }, pattern);
                builder
                    .add_line(None, &anchored)
                    .map_err(|e| bad(format!("{}: bad pattern `{line}`: {e}", path.display())))?;
            }
        }
        let ignore = builder
            .build()
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Ok(ContextFilter {
            ignore,
            ignore_file,
            dockerfile: dockerfile.to_path_buf(),
        })
    }

    /// The Dockerfile and the ignore file are always sent, as the Docker CLI does.
    fn always_sent(&self, relative: &Path) -> bool {
        relative == self.dockerfile || relative == self.ignore_file
    }

    /// Files of the context in a stable order.
    fn files(&self, context: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(dir) = stack.pop() {
            let full = context.join(&dir);
            let mut entries: Vec<_> = std::fs::read_dir(&full)
                .map_err(|e| Error::io(&full, e))?
                .filter_map(|e| e.ok())
                .collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let relative = dir.join(entry.file_name());
                let file_type = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
                let is_dir = file_type.is_dir();
                let ignored = self
                    .ignore
                    .matched_path_or_any_parents(&relative, is_dir)
                    .is_ignore();
                if is_dir {
                    // Walk ignored directories too: an exception (`!dir/keep`) may re-include a child.
                    if !ignored {
                        out.push(relative.clone());
                    }
                    stack.push(relative);
                } else if !ignored || self.always_sent(&relative) {
                    out.push(relative);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard_buildkit_proto::moby::buildkit::v1::{Vertex, VertexLog};

    struct Recorded(std::sync::Mutex<Vec<Event>>);

    impl Reporter for Recorded {
        fn report(&self, event: Event) {
            self.0.lock().unwrap().push(event);
        }
    }

    fn vertex(digest: &str, name: &str, inputs: &[&str], error: &str) -> Vertex {
        Vertex {
            digest: digest.into(),
            name: name.into(),
            inputs: inputs.iter().map(|i| i.to_string()).collect(),
            error: error.into(),
            started: Some(Default::default()),
            ..Default::default()
        }
    }

    #[test]
    fn a_multi_platform_solve_reports_each_step_against_its_platform() {
        let platforms: Vec<Platform> = vec![
            "linux/amd64".parse().unwrap(),
            "linux/arm64".parse().unwrap(),
        ];
        let native: Platform = "linux/amd64".parse().unwrap();
        let recorded = Recorded(Default::default());
        let started = AtomicBool::new(false);
        let mut logs = PlatformLogs::new("api", &platforms, &native, &started, &recorded);
        // As BuildKit lists them: an exec-form RUN has no platform in its name, and may
        // come before the step it builds on.
        logs.route(StatusResponse {
            vertexes: vec![
                vertex("run-arm", "[2/2] RUN [\"/app\"]", &["copy-arm"], ""),
                vertex("ctx", "[internal] load build context", &[], ""),
                vertex("copy-arm", "[linux/arm64 1/2] COPY app /app", &["ctx"], ""),
                vertex("copy-amd", "[linux/amd64 1/2] COPY app /app", &["ctx"], ""),
                vertex("run-amd", "[2/2] RUN [\"/app\"]", &["copy-amd"], ""),
            ],
            ..Default::default()
        });
        logs.route(StatusResponse {
            vertexes: vec![
                vertex(
                    "run-arm",
                    "[2/2] RUN [\"/app\"]",
                    &["copy-arm"],
                    "exit code: 255",
                ),
                vertex(
                    "run-amd",
                    "[2/2] RUN [\"/app\"]",
                    &["copy-amd"],
                    "context canceled",
                ),
            ],
            logs: vec![VertexLog {
                vertex: "run-arm".into(),
                msg: b"exec /app: exec format error\n".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let steps: Vec<(String, String)> = recorded
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|event| match event {
                Event::Step { platform, name, .. } => Some((platform.to_string(), name.clone())),
                _ => None,
            })
            .collect();
        for platform in ["linux/amd64", "linux/arm64"] {
            let mut mine: Vec<&str> = steps
                .iter()
                .filter(|(p, _)| p == platform)
                .map(|(_, name)| name.as_str())
                .collect();
            mine.sort();
            assert_eq!(
                mine,
                [
                    "[1/2] COPY app /app",
                    "[2/2] RUN [\"/app\"]",
                    "[internal] load build context"
                ],
                "{platform}"
            );
        }
        // The platform whose own step failed explains the failure, not the one cancelled.
        let failed = logs.failed().unwrap();
        assert_eq!(logs.logs[failed].platform.to_string(), "linux/arm64");
        assert!(!logs.logs[failed].shared_failure);
        assert!(matches!(
            logs.logs[failed].failure("exit code: 255", |m| Error::Build {
                image: "api".into(),
                platform: "linux/arm64".into(),
                message: m,
            }),
            Error::Emulation(_)
        ));
    }

    #[test]
    fn exec_format_error_means_missing_emulation_only_on_a_foreign_platform() {
        let platform: Platform = "linux/arm64".parse().unwrap();
        let started = AtomicBool::new(false);
        let failure = |foreign: bool| {
            let mut log = BuildLog {
                image: "api",
                platform: &platform,
                foreign,
                shared_failure: false,
                reporter: &crate::progress::Silent,
                export_started: &started,
                tail: VecDeque::from(["exec /app: exec format error".to_string()]),
                vertex_names: HashMap::new(),
                started: Vec::new(),
                current_step: Some("RUN /app".into()),
                vertex_error: None,
            };
            log.failure("process did not complete successfully", |message| {
                Error::Build {
                    image: "api".into(),
                    platform: platform.to_string(),
                    message,
                }
            })
        };
        assert!(matches!(failure(true), Error::Emulation(_)));
        // A program of another architecture copied into the image, run on the engine's own
        // platform: the build's failure, with the step and the log line that says why.
        match failure(false) {
            Error::Build { message, .. } => {
                assert!(message.contains("at step `RUN /app`"), "{message}");
                assert!(message.contains("exec format error"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn build_args_match_buildx() {
        let args: HashMap<_, _> = platform_build_args(
            &"linux/arm64".parse().unwrap(),
            &"linux/amd64".parse().unwrap(),
        )
        .into_iter()
        .collect();
        assert_eq!(args["TARGETPLATFORM"], "linux/arm64/v8");
        assert_eq!(args["TARGETARCH"], "arm64");
        assert_eq!(args["TARGETVARIANT"], "v8");
        assert_eq!(args["BUILDPLATFORM"], "linux/amd64");
        assert_eq!(args["BUILDVARIANT"], "");
    }

    #[test]
    fn a_dockerfile_specific_ignore_file_replaces_the_contexts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("build")).unwrap();
        for f in [
            "build/app.Dockerfile",
            "secret.txt",
            "other.txt",
            "Dockerfile",
        ] {
            std::fs::write(root.join(f), f).unwrap();
        }
        std::fs::write(root.join(".dockerignore"), "other.txt\n").unwrap();
        std::fs::write(
            root.join("build/app.Dockerfile.dockerignore"),
            "secret.txt\n",
        )
        .unwrap();
        let sent = |dockerfile: &str| -> Vec<String> {
            ContextFilter::load(root, Path::new(dockerfile))
                .unwrap()
                .files(root)
                .unwrap()
                .into_iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        };
        let specific = sent("build/app.Dockerfile");
        assert!(
            !specific.contains(&"secret.txt".to_string()),
            "{specific:?}"
        );
        assert!(specific.contains(&"other.txt".to_string()), "{specific:?}");
        assert!(specific.contains(&"build/app.Dockerfile.dockerignore".to_string()));
        // Another Dockerfile of the same context still reads the context's file.
        let plain = sent("Dockerfile");
        assert!(plain.contains(&"secret.txt".to_string()), "{plain:?}");
        assert!(!plain.contains(&"other.txt".to_string()), "{plain:?}");
    }

    #[test]
    fn parses_step_counters() {
        assert_eq!(classic_step("Step 2/5 : COPY . /"), Some((2, 5)));
        assert_eq!(buildkit_step("[stage-1 3/4] RUN make"), Some((3, 4)));
        assert_eq!(buildkit_step("[2/3] COPY a b"), Some((2, 3)));
        assert_eq!(buildkit_step("[internal] load metadata"), None);
    }

    #[test]
    fn dockerignore_is_anchored_with_exceptions() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("logs")).unwrap();
        std::fs::create_dir_all(root.join("src/logs")).unwrap();
        for f in [
            "Dockerfile",
            "a.txt",
            "b.md",
            "logs/x",
            "logs/keep",
            "src/logs/y",
            "secret.key",
        ] {
            std::fs::write(root.join(f), f).unwrap();
        }
        std::fs::write(
            root.join(".dockerignore"),
            "# c\nlogs\n!logs/keep\n*.md\n/secret.key\nDockerfile\n",
        )
        .unwrap();
        let files: Vec<String> = ContextFilter::load(root, Path::new("Dockerfile"))
            .unwrap()
            .files(root)
            .unwrap()
            .into_iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        for expected in [
            "Dockerfile",
            ".dockerignore",
            "a.txt",
            "logs/keep",
            "src/logs/y",
        ] {
            assert!(
                files.contains(&expected.to_string()),
                "{expected} missing from {files:?}"
            );
        }
        for excluded in ["b.md", "logs/x", "secret.key"] {
            assert!(
                !files.contains(&excluded.to_string()),
                "{excluded} sent: {files:?}"
            );
        }
    }
}

//! All of an image's platforms in one build through Podman's own API (`/libpod/build`
//! with a `platform` per platform): the context tar is uploaded once, and Buildah builds
//! the platforms side by side. The platform images stay in Podman's storage for polyarch
//! to export and push by digest, as the classic builder's do.
//!
//! No manifest list is made (`manifest=`): polyarch reads each platform image's ID from
//! the build's answer and publishes its own index, and a list left behind whose image is
//! removed makes Podman 4.3's `podman images` fail for everyone ("reading manifest for
//! image instance … file does not exist", seen here).

use super::*;
use crate::builder::cleanup::Cleanup;
use crate::builder::file_hashes::FileHashes;
use crate::docker::libpod;
use crate::registry::RegistryOptions;
use std::sync::Arc;

/// What one libpod build wrote: each platform's image, in the order asked.
pub struct LibpodBuilt {
    pub images: Vec<BuiltImage>,
}

/// One libpod build of `spec` for `platforms`.
pub struct LibpodBuild<'a> {
    pub spec: &'a ImageSpec,
    pub platforms: &'a [Platform],
    /// Makes the names of secrets sent with the context unique to this run.
    pub run_id: &'a str,
    /// How polyarch reaches registries: a base on a registry it reaches over plain HTTP
    /// is pulled so by Podman too.
    pub registry: &'a RegistryOptions,
    pub reporter: &'a dyn Reporter,
    pub hashes: &'a Arc<FileHashes>,
}

/// Builds `build.spec` for all of `build.platforms` in one libpod build. What the build
/// may leave in Podman (Buildah's build containers, the images) is recorded in `cleanup`
/// first, so an interrupted run removes it.
pub async fn build_with_libpod(
    engine: &Engine,
    build: LibpodBuild<'_>,
    cleanup: &Cleanup,
) -> Result<LibpodBuilt> {
    let LibpodBuild {
        spec,
        platforms,
        run_id,
        reporter,
        ..
    } = build;
    let names = platforms
        .iter()
        .map(Platform::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let failed = |source: BuildError| BuilderError::Build {
        image: spec.name.clone(),
        platform: names.clone(),
        source,
    };
    let first = platforms
        .first()
        .ok_or_else(|| failed(BuildError::Request("no platform to build".into())))?;
    refuse_buildkit_only_settings(engine, spec, first, true)?;
    let started = Instant::now();
    let args = libpod_build_args(spec, &engine.native);
    let bases = stage_bases(spec, platforms, &engine.native)?;
    let tls_verify = !all_over_plain_http(&bases, build.registry);
    let (secrets, secret_files) = secrets_sent(spec, run_id).map_err(failed)?;
    let mut query = libpod_query(spec, platforms, &args, tls_verify);
    if !secrets.is_empty() {
        query.push_str("&secrets=");
        query.extend(form_urlencoded::byte_serialize(json(&secrets).as_bytes()));
    }
    let mut credentials = HashMap::new();
    for platform in platforms {
        let args = platform_args(spec, platform, &engine.native);
        credentials.extend(registry_config(spec, Some(&args))?.unwrap_or_default());
    }
    let credentials = (!credentials.is_empty()).then(|| libpod::registry_config(&credentials));
    let libpod_error = |e: libpod::LibpodError| failed(BuildError::Request(e.to_string()));
    // Buildah's containers of this build are the ones that were not there before it.
    let before = libpod::build_containers(&engine.location)
        .await
        .map_err(libpod_error)?;
    let record = cleanup.add_libpod_build(engine, before, bases);
    let (context, sent) = stream_context(spec, build.hashes.clone(), secret_files)?;
    let stage = BuildStage::default();
    let mut logs = PlatformLines::new(&spec.name, platforms, &engine.native, &stage, reporter);
    let outcome = async {
        let mut answer = libpod::build(&engine.location, &query, credentials, context)
            .await
            .map_err(|e| e.to_string())?;
        while let Some(line) = answer.next_line().await {
            let line = line.map_err(|e| e.to_string())?;
            if let Some(error) = line.error {
                return Err(error);
            }
            if let Some(text) = line.stream {
                for id in logs.consume(&text) {
                    record.image_seen(&id);
                }
            }
        }
        Ok(())
    }
    .await;
    // The build ended (or failed): its containers are Buildah's to remove.
    record.ended();
    if let Err(message) = outcome {
        let log = logs.failed_log();
        return Err(log.failure(&message, |m| failed(BuildError::StepFailed(m))));
    }
    let seconds = started.elapsed().as_secs_f64();
    let sent_context = sent.await.ok();
    let mut images: Vec<Option<BuiltImage>> = vec![None; platforms.len()];
    for id in &logs.ids {
        let inspected = engine
            .docker
            .inspect_image(id)
            .await
            .map_err(|e| failed(BuildError::Answer(format!("inspecting image {id}: {e}"))))?;
        let built = Platform::new(
            inspected.os.as_deref().unwrap_or_default(),
            inspected.architecture.as_deref().unwrap_or_default(),
            inspected.variant.as_deref(),
        );
        let full = inspected.id.unwrap_or_else(|| id.clone());
        cleanup.add_built(engine, &full);
        record.forget_seen(&full);
        if let Some(index) = platforms.iter().position(|p| *p == built) {
            images[index] = Some(BuiltImage {
                id: full.clone(),
                tag: full,
                seconds,
                transfers: Vec::new(),
                sent_context: sent_context.clone(),
                pushed: None,
                layout: None,
            });
        }
    }
    let images = images
        .into_iter()
        .zip(platforms)
        .map(|(image, platform)| {
            image.ok_or_else(|| BuilderError::Build {
                image: spec.name.clone(),
                platform: platform.to_string(),
                source: BuildError::WrongPlatform(format!(
                    "Podman's build wrote no image for {platform} (images {:?}); it cannot build for it (upgrade the engine or use a native builder)",
                    logs.ids
                )),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(LibpodBuilt { images })
}

/// The image's secrets as libpod's build takes them from a remote client: each a file at
/// the context tar's root (after the context, never part of its digest), which Podman
/// moves out of the context before the build and deletes after it; and the `secrets`
/// entries naming them.
fn secrets_sent(
    spec: &ImageSpec,
    run_id: &str,
) -> std::result::Result<(Vec<String>, Vec<ExtraFile>), BuildError> {
    let mut entries = Vec::new();
    let mut files = Vec::new();
    for (n, (id, secret)) in spec.secrets.iter().enumerate() {
        let value = secret
            .source
            .read()
            .map_err(|e| BuildError::Request(format!("secret `{id}`: {e}")))?;
        let name = format!(".polyarch-secret-{run_id}-{n}");
        entries.push(format!("id={id},src={name}"));
        files.push((name, value));
    }
    Ok((entries, files))
}

/// The build args: the image's, and the `BUILD*` ones buildx defines (Buildah defines the
/// `TARGET*` ones itself, per platform).
fn libpod_build_args(spec: &ImageSpec, native: &Platform) -> HashMap<String, String> {
    let mut args: HashMap<String, String> = spec.build_args.clone().into_iter().collect();
    for (key, value) in platform_build_args(native, native) {
        if key.starts_with("BUILD") {
            args.entry(key).or_insert(value);
        }
    }
    args
}

/// The build args of `spec` with those buildx defines for `platform`: what the
/// Dockerfile's `FROM` lines are read with.
fn platform_args(
    spec: &ImageSpec,
    platform: &Platform,
    native: &Platform,
) -> HashMap<String, String> {
    let mut args: HashMap<String, String> =
        platform_build_args(platform, native).into_iter().collect();
    args.extend(spec.build_args.clone());
    args
}

/// The images the Dockerfile's stages are FROM for any of `platforms` (`scratch` among
/// them), as Buildah names them on its build containers.
fn stage_bases(spec: &ImageSpec, platforms: &[Platform], native: &Platform) -> Result<Vec<String>> {
    let path = spec.context.join(&spec.dockerfile);
    let text = std::fs::read_to_string(&path).map_err(|e| BuilderError::io(&path, e))?;
    let mut bases = vec!["scratch".to_string()];
    for platform in platforms {
        let args = platform_args(spec, platform, native);
        for (image, _) in crate::base::dockerfile::external_images(&text, &args).unwrap_or_default()
        {
            if !bases.contains(&image) {
                bases.push(image);
            }
        }
    }
    Ok(bases)
}

/// Whether every registry `bases` are pulled from is one polyarch reaches over plain
/// HTTP (loopback, or `--insecure-registry`): libpod's build then pulls without TLS. It is
/// one setting for the whole build, so never while another base needs TLS.
fn all_over_plain_http(bases: &[String], registry: &RegistryOptions) -> bool {
    let pulled: Vec<&String> = bases.iter().filter(|b| *b != "scratch").collect();
    !pulled.is_empty()
        && pulled.iter().all(|base| {
            crate::registry::parse_reference(base)
                .is_ok_and(|r| registry.allows_plain_http(r.registry()))
        })
}

/// `/libpod/build`'s query, in libpod's parameter names.
fn libpod_query(
    spec: &ImageSpec,
    platforms: &[Platform],
    args: &HashMap<String, String>,
    tls_verify: bool,
) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for platform in platforms {
        query.append_pair("platform", &platform.to_string());
    }
    query
        .append_pair(
            "dockerfile",
            &spec.dockerfile.to_string_lossy().replace('\\', "/"),
        )
        .append_pair("buildargs", &json(args))
        .append_pair("labels", &json(&spec.labels))
        // Every platform at once (libpod's default is one step at a time).
        .append_pair("jobs", &platforms.len().max(1).to_string())
        // No layer cache: each build is whole, as the classic path's `nocache`.
        .append_pair("layers", "false")
        .append_pair("rm", "true")
        .append_pair("forcerm", "true")
        .append_pair("outputformat", "application/vnd.oci.image.manifest.v1+json")
        .append_pair("pullpolicy", if spec.pull { "always" } else { "missing" });
    if let Some(target) = &spec.target {
        query.append_pair("target", target);
    }
    if !tls_verify {
        query.append_pair("tlsVerify", "false");
    }
    // libpod runs RUN steps in the host's network unless told otherwise.
    let network = match spec.network {
        Network::Default => None,
        Network::Host => Some((true, "NetworkEnabled")),
        Network::None => Some((false, "NetworkDisabled")),
    };
    if let Some((host, policy)) = network {
        let options = serde_json::json!([{"Name": "network", "Host": host, "Path": ""}]);
        query
            .append_pair("nsoptions", &options.to_string())
            .append_pair("networkmode", policy);
    }
    query.finish()
}

/// A value as the JSON text libpod takes it in a query.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Buildah's output, told apart per platform: with several, each line of a platform's
/// steps starts with `[os/arch] `; the rest (its commit's progress, image IDs) goes to the
/// platform that spoke last.
struct PlatformLines<'a> {
    logs: Vec<BuildLog<'a>>,
    last: usize,
    /// The emulated platform that spoke last, and whether a RUN step of the build met
    /// `exec format error` (Buildah says so unprefixed: the emulated platform's, whose
    /// emulator is missing, not the one that spoke last).
    last_foreign: Option<usize>,
    exec_format_error: bool,
    /// The full IDs of the images written, in the order they were told.
    ids: Vec<String>,
}

impl<'a> PlatformLines<'a> {
    fn new(
        image: &'a str,
        platforms: &'a [Platform],
        native: &Platform,
        stage: &'a BuildStage,
        reporter: &'a dyn Reporter,
    ) -> Self {
        let logs = BuildLog::per_platform(image, platforms, native, stage, reporter);
        PlatformLines {
            logs,
            last: 0,
            last_foreign: None,
            exec_format_error: false,
            ids: Vec::new(),
        }
    }

    /// Takes a piece of output; the IDs of images it says were written (short, after
    /// `--> `, as each commit ends; full at the build's end).
    fn consume(&mut self, text: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for line in text.lines() {
            let line = line.trim_end();
            let (index, rest) = self.split_platform(line);
            if let Some(index) = index {
                self.last = index;
                if self.logs[index].foreign {
                    self.last_foreign = Some(index);
                }
            }
            let mut speaker = self.last;
            if index.is_none() && rest.contains("exec format error") {
                self.exec_format_error = true;
                speaker = self.last_foreign.unwrap_or(speaker);
            }
            let log = &mut self.logs[speaker];
            if let Some((n, m, name)) = buildah_step(rest) {
                log.step(name, n, Some(m));
            }
            if is_full_id(rest) {
                self.ids.push(rest.to_string());
                seen.push(rest.to_string());
            } else if let Some(short) = rest.strip_prefix("--> ").filter(|s| is_short_id(s)) {
                seen.push(short.to_string());
            }
            log.line(rest);
        }
        seen
    }

    /// The platform a `[os/arch] ` prefix names, and the line without it.
    fn split_platform<'l>(&self, line: &'l str) -> (Option<usize>, &'l str) {
        let Some((prefix, rest)) = line
            .strip_prefix('[')
            .and_then(|inner| inner.split_once("] "))
        else {
            return (None, line);
        };
        let Ok(platform) = prefix.parse::<Platform>() else {
            return (None, line);
        };
        match self.logs.iter().position(|log| *log.platform == platform) {
            Some(index) => (Some(index), rest),
            None => (None, line),
        }
    }

    /// The log that explains a failure: the emulated platform's after `exec format error`,
    /// else the platform that spoke last.
    fn failed_log(&mut self) -> &mut BuildLog<'a> {
        let index = match (self.exec_format_error, self.last_foreign) {
            (true, Some(foreign)) => foreign,
            _ => self.last,
        };
        &mut self.logs[index]
    }
}

/// Buildah names its steps `STEP 2/5: COPY . /src`.
fn buildah_step(line: &str) -> Option<(u32, u32, &str)> {
    let rest = line.strip_prefix("STEP ")?;
    let (frac, name) = rest.split_once(": ")?;
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?, name))
}

fn is_full_id(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// An image ID as Buildah shortens it in its output and history comments.
pub(crate) fn is_short_id(text: &str) -> bool {
    (11..=12).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::progress::Event;

    fn amd64_and_arm64() -> Vec<Platform> {
        ["linux/amd64", "linux/arm64"]
            .map(|p| p.parse().unwrap())
            .to_vec()
    }

    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<Event>>);

    impl Reporter for Heard {
        fn report(&self, event: Event) {
            self.0.lock().unwrap().push(event);
        }
    }

    #[test]
    fn buildahs_lines_go_to_their_platform_and_name_the_images_written() {
        let platforms = amd64_and_arm64();
        let (heard, stage) = (Heard::default(), BuildStage::default());
        // amd64 is the machine's own platform; arm64 is emulated.
        let mut lines = PlatformLines::new("app", &platforms, &platforms[0], &stage, &heard);
        let amd = "a".repeat(64);
        let arm = "b".repeat(64);
        let mut seen = Vec::new();
        for text in [
            "[linux/amd64] STEP 1/2: FROM scratch\n",
            "[linux/arm64] STEP 2/2: RUN [\"/bin/busybox\", \"true\"]\n",
            "Copying config sha256:0123\n",
            "--> aaaaaaaaaaa\n",
            &format!("{amd}\n{arm}\n"),
        ] {
            seen.extend(lines.consume(text));
        }
        assert_eq!(seen, ["aaaaaaaaaaa".to_string(), amd.clone(), arm.clone()]);
        assert_eq!(lines.ids, [amd, arm]);
        let events = heard.0.lock().unwrap();
        let steps: Vec<(String, String)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Step { platform, name, .. } => Some((platform.to_string(), name.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            steps,
            [
                ("linux/amd64".to_string(), "FROM scratch".to_string()),
                (
                    "linux/arm64".to_string(),
                    "RUN [\"/bin/busybox\", \"true\"]".to_string()
                ),
            ]
        );
        // Unprefixed output goes to the platform that spoke last.
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::Log { platform, line, .. }
            if platform.to_string() == "linux/arm64" && line.starts_with("Copying config"))));
    }

    #[test]
    fn an_unprefixed_exec_format_error_is_the_emulated_platforms_missing_emulator() {
        let platforms = amd64_and_arm64();
        let (heard, stage) = (Heard::default(), BuildStage::default());
        // amd64 is the machine's own platform; arm64 is emulated.
        let mut lines = PlatformLines::new("app", &platforms, &platforms[0], &stage, &heard);
        for text in [
            "[linux/arm64] STEP 2/3: RUN [\"/bin/busybox\", \"true\"]\n",
            "[linux/amd64] STEP 2/3: RUN [\"/bin/busybox\", \"true\"]\n",
            "exec /bin/busybox: exec format error\n",
            "[linux/amd64] STEP 3/3: CMD [\"true\"]\n",
        ] {
            lines.consume(text);
        }
        let failed = lines
            .failed_log()
            .failure("while running runtime: exit status 1", |m| {
                BuilderError::Build {
                    image: "app".into(),
                    platform: "linux/amd64,linux/arm64".into(),
                    source: BuildError::StepFailed(m),
                }
            });
        assert!(
            matches!(&failed, BuilderError::Emulation(e)
                if matches!(**e, crate::builder::binfmt::EmulationError::ExecFormat { ref platform } if platform.to_string() == "linux/arm64")),
            "{failed:?}"
        );
    }

    #[test]
    fn the_query_names_every_platform_and_the_network() {
        let spec = ImageSpec {
            network: Network::None,
            target: Some("app".into()),
            ..crate::project::test_image("v1")
        };
        let platforms = amd64_and_arm64();
        let args = HashMap::from([("A".to_string(), "1".to_string())]);
        let query = libpod_query(&spec, &platforms, &args, false);
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let values = |key: &str| -> Vec<&str> {
            pairs
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(values("platform"), ["linux/amd64", "linux/arm64"]);
        assert!(values("manifest").is_empty());
        assert_eq!(values("buildargs"), ["{\"A\":\"1\"}"]);
        assert_eq!(values("target"), ["app"]);
        assert_eq!(values("tlsVerify"), ["false"]);
        assert_eq!(values("networkmode"), ["NetworkDisabled"]);
        assert_eq!(values("layers"), ["false"]);
        assert_eq!(values("jobs"), ["2"]);
    }
}

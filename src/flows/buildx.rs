//! `polyarch buildx build …`: buildx's command line, unchanged, read into a project of one
//! image and the flags `polyarch build` would take, so the same pipeline builds, pushes
//! and verifies it. A buildx flag polyarch has no equivalent for is refused by name with
//! what to use instead: a line that builds here means what it says.
//!
//! Also what buildx writes after a build from the record: `--metadata-file`'s keys and
//! `--iidfile`.

use crate::base::annotations::AnnotationFlag;
use crate::base::platform::Platform;
use crate::project::source_date_epoch::EpochSource;
use crate::project::{BuildFlags, CacheRef, ImageSpec, Network, Project};
use crate::verify::coverage_record::ImageCoverage;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

/// `--progress`, as buildx spells it (also read from `BUILDKIT_PROGRESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Progress {
    /// Bars on a terminal, plain lines elsewhere (and in CI).
    #[default]
    Auto,
    /// Plain lines, with every platform's build output.
    Plain,
    /// Progress bars.
    Tty,
    /// polyarch's JSON-lines events on stderr (not BuildKit's raw solve status).
    Rawjson,
    /// Nothing but errors.
    Quiet,
}

/// `docker buildx build`'s flags. Those polyarch cannot honour are read too, so that
/// refusing them names the flag and what to use instead.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BuildxBuildArgs {
    /// The build context: a directory, or `-` for a Dockerfile on standard input (an
    /// empty context).
    #[arg(value_name = "PATH|-")]
    pub context: String,
    /// Name and tag, `REGISTRY/REPOSITORY[:TAG]` (no tag: latest). Repeatable; every tag
    /// names one repository.
    #[arg(short = 't', long = "tag", value_name = "NAME[:TAG]")]
    pub tags: Vec<String>,
    /// Platforms to build (comma-separated, repeatable) [default: the engine's own].
    #[arg(long = "platform", value_name = "PLATFORMS")]
    pub platforms: Vec<String>,
    /// The Dockerfile, inside the context [default: PATH/Dockerfile].
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// A build argument, `KEY=VALUE`, or `KEY` for the environment's value. Repeatable.
    #[arg(long = "build-arg", value_name = "KEY[=VALUE]")]
    pub build_args: Vec<String>,
    /// The stage to build.
    #[arg(long, value_name = "STAGE")]
    pub target: Option<String>,
    /// An image label, `KEY=VALUE`. Repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// An OCI annotation, `[index:|manifest:|index,manifest:]KEY=VALUE`. Repeatable.
    #[arg(long = "annotation", value_name = "[TYPES:]KEY=VALUE")]
    pub annotations: Vec<String>,
    /// A build secret, `id=ID[,src=PATH|,env=NAME]`. Repeatable.
    #[arg(long = "secret", value_name = "id=ID,src=PATH|env=NAME")]
    pub secrets: Vec<String>,
    /// An SSH agent, `default|ID[=SOCKET]`. Repeatable.
    #[arg(long, value_name = "default|ID[=SOCKET]")]
    pub ssh: Vec<String>,
    /// A registry cache to import: `type=registry,ref=REF` or `REF`. Repeatable.
    #[arg(long = "cache-from", value_name = "type=registry,ref=REF|REF")]
    pub cache_from: Vec<String>,
    /// The registry cache to export to: `type=registry,ref=REF[,mode=max]` or `REF`.
    #[arg(long = "cache-to", value_name = "type=registry,ref=REF|REF")]
    pub cache_to: Vec<String>,
    /// Push the index to the tags' registry (`--output type=registry`).
    #[arg(long)]
    pub push: bool,
    /// Pull every base image, even one the engine holds.
    #[arg(long)]
    pub pull: bool,
    /// Run every step, using no cached result.
    #[arg(long)]
    pub no_cache: bool,
    /// The network of RUN steps: default, host or none.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// Attach SLSA provenance: `true`, `false`, `mode=min|max`.
    #[arg(long, value_name = "VALUE", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub provenance: Option<String>,
    /// An attestation: `type=provenance[,mode=min|max][,disabled=true]`. Repeatable.
    #[arg(long, value_name = "type=provenance,…")]
    pub attest: Vec<String>,
    /// Write buildx's build metadata (JSON) to this file.
    #[arg(long, value_name = "FILE")]
    pub metadata_file: Option<PathBuf>,
    /// Write the index digest to this file.
    #[arg(long, value_name = "FILE")]
    pub iidfile: Option<PathBuf>,
    /// Where the image goes: `type=registry`, `type=image,push=true`,
    /// `type=oci,dest=PATH[,tar=false]`.
    #[arg(short = 'o', long, value_name = "type=…")]
    pub output: Vec<String>,
    /// Print only the index digest.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// How progress is shown.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        env = "BUILDKIT_PROGRESS",
        default_value = "auto"
    )]
    pub progress: Progress,
    /// Refused: polyarch pushes (or writes an OCI layout).
    #[arg(long)]
    pub load: bool,
    /// Refused: polyarch builds on the engine the Docker CLI selects.
    #[arg(long, value_name = "NAME")]
    pub builder: Option<String>,
    /// Refused unless `build`: polyarch builds.
    #[arg(long, value_name = "METHOD", num_args = 0..=1, require_equals = true, default_missing_value = "build")]
    pub call: Option<String>,
    /// Refused: polyarch builds (`--call=check`).
    #[arg(long)]
    pub check: bool,
    /// Attach an SPDX SBOM per platform, made by polyarch from the image's layers.
    #[arg(long, value_name = "VALUE", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub sbom: Option<String>,
    /// A named context for `FROM NAME` / `COPY --from=NAME`: a directory or
    /// docker-image://REF (repeatable).
    #[arg(long = "build-context", value_name = "NAME=VALUE")]
    pub build_contexts: Vec<String>,
    /// Refused: a project file cannot say it either.
    #[arg(long = "add-host", value_name = "HOST:IP")]
    pub add_hosts: Vec<String>,
    /// Refused: the only entitlement polyarch grants is `--network host`'s.
    #[arg(long, value_name = "ENTITLEMENT")]
    pub allow: Vec<String>,
    /// Refused: polyarch's cache switch is all or nothing (`--no-cache`).
    #[arg(long = "no-cache-filter", value_name = "STAGE")]
    pub no_cache_filter: Vec<String>,
    /// Refused: RUN steps get BuildKit's default /dev/shm.
    #[arg(long = "shm-size", value_name = "BYTES")]
    pub shm_size: Option<String>,
    /// Refused: RUN steps get BuildKit's default limits.
    #[arg(long, value_name = "ULIMIT")]
    pub ulimit: Vec<String>,
    /// Refused: RUN steps get BuildKit's default cgroup.
    #[arg(long = "cgroup-parent", value_name = "CGROUP")]
    pub cgroup_parent: Option<String>,
    /// polyarch's own: write the coverage record (JSON) to this file.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

/// A buildx line polyarch will not run, naming the flag and what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum BuildxError {
    /// A flag (or a value of one) polyarch has no equivalent for.
    #[error("{flag}: {fix}")]
    Refused { flag: String, fix: String },
    /// A value that is not what the flag takes.
    #[error("{flag} {value}: {problem}")]
    Invalid {
        flag: String,
        value: String,
        problem: String,
    },
    /// The Dockerfile on standard input (`-`) could not be read or kept.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

type Result<T, E = BuildxError> = std::result::Result<T, E>;

fn refused(flag: impl Into<String>, fix: impl Into<String>) -> BuildxError {
    BuildxError::Refused {
        flag: flag.into(),
        fix: fix.into(),
    }
}

fn invalid(flag: &str, value: &str, problem: impl Into<String>) -> BuildxError {
    BuildxError::Invalid {
        flag: flag.into(),
        value: value.into(),
        problem: problem.into(),
    }
}

/// Where the built index goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `--push`, `--output type=registry`: the tags' registry.
    Registry,
    /// `--output type=oci,dest=PATH`: an OCI layout, a directory with `tar=false`, else
    /// packed into the tar file `PATH` as buildx writes it.
    Layout { dest: PathBuf, tar: bool },
    /// No `--push` or `--output`: built and verified, nothing shipped.
    Nowhere,
}

/// What a buildx line asks for, in polyarch's terms.
#[derive(Debug)]
pub struct BuildxJob {
    /// One image, named after its repository's last component.
    pub project: Project,
    /// The flags `polyarch build` would take for the rest.
    pub flags: BuildFlags,
    pub destination: Destination,
    pub metadata_file: Option<PathBuf>,
    pub iidfile: Option<PathBuf>,
    /// `-q`: only the digest on stdout.
    pub quiet: bool,
    pub progress: Progress,
    /// polyarch's `--record`.
    pub record: Option<PathBuf>,
    /// The names `-t` gave, normalised as BuildKit writes them (`app` →
    /// `docker.io/library/app:latest`): `image.name` of the metadata file.
    pub image_names: Vec<String>,
    /// No `--platform`: the engine's own platform is to be built, as buildx does; the
    /// caller sets it on the image once it knows the engine.
    pub platform_from_engine: bool,
    /// The directory of a Dockerfile read from stdin (the context `-`, or `-f -`); removed
    /// when the job is dropped.
    pub stdin_context: Option<tempfile::TempDir>,
}

/// Where the translation reads what is not on the line.
pub struct Surroundings<'a> {
    /// Relative paths (context, `-f`, secrets, sockets, dest) start here.
    pub cwd: &'a Path,
    /// `--build-arg KEY`'s value and `SOURCE_DATE_EPOCH`.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The Dockerfile of the context `-`.
    pub stdin: &'a mut dyn Read,
}

/// Where a one-image project's settings came from, for messages that name "the file".
const ORIGIN: &str = "buildx build";

/// Reads a buildx line into a job; every flag either maps or is refused.
pub fn translate(args: BuildxBuildArgs, around: Surroundings<'_>) -> Result<BuildxJob> {
    refuse_unsupported(&args)?;
    let destination = destination(&args, around.cwd)?;
    let (repository, tags) = tags(&args, &destination, around.cwd)?;
    let (context, dockerfile, stdin_context) = context_and_dockerfile(
        &args.context,
        args.file.as_deref(),
        around.cwd,
        around.stdin,
    )?;
    let platforms = platforms(&args.platforms)?;
    let target = match args.target.as_deref() {
        Some(t) if t.trim().is_empty() || t.contains(char::is_whitespace) => {
            return Err(invalid(
                "--target",
                t,
                "is not a stage name; name one stage of the Dockerfile (`FROM … AS NAME`)",
            ))
        }
        other => other.map(str::to_string),
    };
    let network = match args.network.as_deref() {
        None | Some("default") => Network::Default,
        Some("host") => Network::Host,
        Some("none") => Network::None,
        Some(other) => {
            return Err(refused(
                format!("--network {other}"),
                "polyarch's RUN steps use the default network, host or none; use one of those",
            ))
        }
    };
    let name = image_name(&repository);
    let image = ImageSpec {
        name,
        repository,
        tags,
        context,
        dockerfile,
        platforms,
        build_args: build_args(&args.build_args, around.env)?,
        target,
        labels: labels(&args.labels)?,
        annotations: Default::default(),
        source_date_epoch: None,
        reproducible: false,
        network,
        binfmt: None,
        secrets: BTreeMap::new(),
        ssh: BTreeMap::new(),
        cache_from: Vec::new(),
        cache_to: None,
        pull: false,
        no_cache: false,
        provenance: false,
        require_provenance: false,
        require_sbom: false,
        login: None,
        build_history: false,
        tests: Vec::new(),
        sbom: false,
        sign_key: None,
        signer: None,
        contexts: BTreeMap::new(),
    };
    let flags = BuildFlags {
        secrets: parsed("--secret", &args.secrets)?,
        ssh: parsed("--ssh", &args.ssh)?,
        cache_from: cache_from(&args.cache_from)?,
        cache_to: cache_to(&args.cache_to)?,
        pull: args.pull,
        no_cache: args.no_cache,
        annotations: parsed::<AnnotationFlag>("--annotation", &args.annotations)?,
        contexts: parsed("--build-context", &args.build_contexts)?,
        // buildx hands SOURCE_DATE_EPOCH to BuildKit, which clamps the image's times.
        source_date_epoch: source_date_epoch(around.env)?,
        provenance: provenance(&args)?,
        require_provenance: false,
        require_sbom: false,
        build_history: false,
        sbom: sbom(&args)?,
        sign_key: None,
        sign_password: None,
    };
    let platform_from_engine = image.platforms.is_empty();
    let image_names = match args.tags.is_empty() && !args.output.iter().any(|o| o.contains("name="))
    {
        true => Vec::new(),
        false => image
            .tags
            .iter()
            .map(|t| format!("{}:{t}", image.repository))
            .collect(),
    };
    Ok(BuildxJob {
        project: Project::single(PathBuf::from(ORIGIN), image),
        flags,
        destination,
        metadata_file: args.metadata_file,
        iidfile: args.iidfile,
        quiet: args.quiet,
        progress: match args.quiet {
            true => Progress::Quiet,
            false => args.progress,
        },
        record: args.record,
        image_names,
        platform_from_engine,
        stdin_context,
    })
}

/// The flags polyarch has no equivalent for, each with what to use instead.
fn refuse_unsupported(args: &BuildxBuildArgs) -> Result<()> {
    if args.load {
        return Err(refused(
            "--load",
            "polyarch pushes the index, it does not load images into the engine; use --push, or --output type=oci,dest=PATH",
        ));
    }
    if let Some(builder) = &args.builder {
        return Err(refused(
            format!("--builder {builder}"),
            "polyarch builds on the engine the Docker CLI selects (docker --context, DOCKER_CONTEXT, DOCKER_HOST, or BUILDKIT_HOST for a BuildKit daemon), or on a project file's `builders:`; drop --builder and select the engine so",
        ));
    }
    match args.call.as_deref() {
        None | Some("build") => {}
        Some(method) => {
            return Err(refused(
                format!("--call={method}"),
                "polyarch builds and runs no frontend methods; run `docker buildx build --call` for those",
            ))
        }
    }
    if args.check {
        return Err(refused(
            "--check",
            "polyarch builds and runs no Dockerfile checks; run `docker buildx build --check` for those",
        ));
    }
    let not_yet = [
        (
            "--add-host",
            args.add_hosts.first(),
            "polyarch's RUN steps resolve names through the network they use; put the host in the image's /etc/hosts at run time instead",
        ),
        (
            "--allow",
            args.allow.first(),
            "polyarch grants only `--network host`'s entitlement; drop --allow",
        ),
        (
            "--no-cache-filter",
            args.no_cache_filter.first(),
            "polyarch's cache is all or nothing; use --no-cache",
        ),
        (
            "--shm-size",
            args.shm_size.as_ref(),
            "RUN steps get BuildKit's default /dev/shm; drop --shm-size",
        ),
        (
            "--ulimit",
            args.ulimit.first(),
            "RUN steps get BuildKit's default limits; drop --ulimit",
        ),
        (
            "--cgroup-parent",
            args.cgroup_parent.as_ref(),
            "RUN steps get BuildKit's default cgroup; drop --cgroup-parent",
        ),
    ];
    match not_yet.into_iter().find(|(_, value, _)| value.is_some()) {
        Some((flag, Some(value), fix)) => Err(refused(format!("{flag} {value}"), fix)),
        _ => Ok(()),
    }
}

/// buildx's `key=value,…` form (`--output`, `--cache-from`, `--attest`); a pair without
/// `=` is refused naming `flag`.
fn pairs<'a>(flag: &str, value: &'a str) -> Result<Vec<(&'a str, &'a str)>> {
    value
        .split(',')
        .map(|pair| {
            pair.split_once('=')
                .ok_or_else(|| invalid(flag, value, format!("`{pair}` is not key=value")))
        })
        .collect()
}

/// `--push` and `--output`: one destination.
fn destination(args: &BuildxBuildArgs, cwd: &Path) -> Result<Destination> {
    let mut chosen: Vec<(String, Destination)> = Vec::new();
    if args.push {
        chosen.push(("--push".into(), Destination::Registry));
    }
    for value in &args.output {
        let flag = format!("--output {value}");
        chosen.push((flag.clone(), output(&flag, value, cwd)?));
    }
    let Some((first, destination)) = chosen.first().cloned() else {
        return Ok(Destination::Nowhere);
    };
    match chosen.iter().find(|(_, d)| *d != destination) {
        Some((other, _)) => Err(refused(
            format!("{first} with {other}"),
            "polyarch ships an index to one destination, a registry or an OCI layout; keep one, and `polyarch verify` or skopeo copy it to the other",
        )),
        None => Ok(destination),
    }
}

/// One `--output` value.
fn output(flag: &str, value: &str, cwd: &Path) -> Result<Destination> {
    if !value.contains('=') {
        return Err(refused(
            flag,
            "a bare path (or `-`) exports the files (type=local or tar), which polyarch does not; use --push, or --output type=oci,dest=PATH",
        ));
    }
    let pairs = pairs("--output", value)?;
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let kind = get("type").unwrap_or("local");
    let allowed: &[&str] = match kind {
        "registry" => &["type", "name", "push"],
        "image" => &["type", "name", "push"],
        "oci" => &["type", "name", "dest", "tar"],
        "docker" => {
            return Err(refused(
                flag,
                "polyarch pushes the index, it does not load a Docker image; use --push, or --output type=oci,dest=PATH",
            ))
        }
        other => {
            return Err(refused(
                flag,
                format!("polyarch ships an index to a registry or an OCI layout, not type={other}; use --push, or --output type=oci,dest=PATH"),
            ))
        }
    };
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !allowed.contains(k)) {
        return Err(refused(
            flag,
            format!("polyarch has no `{key}` for type={kind} (it pushes OCI media types, gzip layers); drop {key}="),
        ));
    }
    let yes = |key: &str| -> Result<Option<bool>> {
        match get(key) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(invalid(
                "--output",
                value,
                format!("{key}={other} is not true or false"),
            )),
        }
    };
    match kind {
        "oci" => {
            let dest = get("dest").filter(|d| !d.is_empty() && *d != "-").ok_or_else(|| {
                refused(flag, "polyarch writes the layout to a path; add dest=PATH")
            })?;
            Ok(Destination::Layout {
                dest: cwd.join(dest),
                tar: yes("tar")?.unwrap_or(true),
            })
        }
        "image" if yes("push")? != Some(true) => Err(refused(
            flag,
            "type=image without push=true loads the engine's store, which polyarch does not; add push=true, or use --push",
        )),
        _ if yes("push")? == Some(false) => Err(refused(
            flag,
            "push=false keeps the image in the builder, which polyarch does not; drop push=false, or use --output type=oci,dest=PATH",
        )),
        _ => Ok(Destination::Registry),
    }
}

/// `-t` and `--output name=`: one repository and its tags, in order, without repeats.
fn tags(
    args: &BuildxBuildArgs,
    destination: &Destination,
    cwd: &Path,
) -> Result<(String, Vec<String>)> {
    let from_outputs = args.output.iter().flat_map(|value| {
        value
            .split(',')
            .filter_map(|pair| pair.strip_prefix("name="))
            .map(|name| ("--output name=", name))
    });
    let given: Vec<(&str, &str)> = args
        .tags
        .iter()
        .map(|t| ("-t", t.as_str()))
        .chain(from_outputs)
        .collect();
    let mut repository: Option<(String, &str)> = None;
    let mut tags: Vec<String> = Vec::new();
    for (flag, text) in given {
        let reference = crate::base::reference::parse_reference(text)
            .map_err(|e| invalid(flag, text, e.to_string()))?;
        if reference.digest().is_some() {
            return Err(invalid(flag, text, "names a digest; a tag is NAME[:TAG]"));
        }
        let name = format!("{}/{}", reference.registry(), reference.repository());
        match &repository {
            Some((first, first_text)) if *first != name => {
                return Err(refused(
                    format!("{flag} {text}"),
                    format!("polyarch pushes one index to one repository, and -t {first_text} names {first}; tag {name} in another run, or copy the index there"),
                ))
            }
            Some(_) => {}
            None => repository = Some((name, text)),
        }
        let tag = reference.tag().unwrap_or("latest").to_string();
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    match repository {
        Some((name, _)) => Ok((name, tags)),
        None if *destination == Destination::Registry => Err(refused(
            "--push",
            "a push needs a name; add -t REGISTRY/REPOSITORY:TAG",
        )),
        // A layout names its image by tag only: the repository is a placeholder named
        // after the context, never pushed to.
        None => {
            let dir = cwd.join(&args.context);
            let base = dir
                .canonicalize()
                .ok()
                .and_then(|d| {
                    d.file_name()
                        .map(|n| n.to_string_lossy().to_ascii_lowercase())
                })
                .unwrap_or_default();
            Ok((
                format!("localhost/{}", image_name(&base)),
                vec!["latest".into()],
            ))
        }
    }
}

/// The image's name in the record: the repository's last component, which the
/// reference grammar already keeps to what image names allow.
fn image_name(repository: &str) -> String {
    let last = repository.rsplit('/').next().unwrap_or_default();
    let valid = last.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && last
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    match valid {
        true => last.to_string(),
        false => "image".to_string(),
    }
}

/// The context directory (absolute) and the Dockerfile in it; for `-`, a temporary
/// context holding only the Dockerfile read from stdin. With `-f -` and a context
/// directory, the Dockerfile read from stdin is kept in a temporary directory of its own
/// (BuildKit reads the Dockerfile from a directory apart from the context).
fn context_and_dockerfile(
    context: &str,
    file: Option<&Path>,
    cwd: &Path,
    stdin: &mut dyn Read,
) -> Result<(PathBuf, PathBuf, Option<tempfile::TempDir>)> {
    if context == "-" {
        if let Some(file) = file {
            return Err(refused(
                format!("-f {} with the context -", file.display()),
                "the Dockerfile on standard input is the whole build; drop -f, or pass a context directory",
            ));
        }
        let dir = dockerfile_from_stdin(stdin, "context -")?;
        let context = dir.path().to_path_buf();
        return Ok((context, PathBuf::from("Dockerfile"), Some(dir)));
    }
    if context.contains("://") || context.starts_with("git@") {
        return Err(refused(
            format!("context {context}"),
            "polyarch builds a local directory; clone or download it and pass the directory",
        ));
    }
    let looked = cwd.join(context);
    let context_dir = match std::fs::metadata(&looked) {
        Ok(m) if m.is_dir() => looked
            .canonicalize()
            .map_err(|e| invalid("context", context, format!("cannot be resolved ({e})")))?,
        Ok(_) => {
            return Err(invalid(
                "context",
                context,
                "is not a directory; pass the directory holding the build files",
            ))
        }
        Err(e) => {
            return Err(invalid(
                "context",
                context,
                format!("cannot be read ({e}); pass the directory holding the build files"),
            ))
        }
    };
    let dockerfile = match file {
        Some(path) if path == Path::new("-") => {
            let dir = dockerfile_from_stdin(stdin, "-f -")?;
            return Ok((context_dir, dir.path().join("Dockerfile"), Some(dir)));
        }
        Some(path) => cwd.join(path),
        None => context_dir.join("Dockerfile"),
    };
    let shown = dockerfile.display().to_string();
    let flag = match file {
        Some(_) => "-f",
        None => "context",
    };
    let found = dockerfile
        .canonicalize()
        .ok()
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            invalid(
                flag,
                &shown,
                "no such Dockerfile; create it or pass -f PATH",
            )
        })?;
    // Outside the context, BuildKit still reads it (from a directory of its own).
    let dockerfile = match found.strip_prefix(&context_dir) {
        Ok(inside) => inside.to_path_buf(),
        Err(_) => found.clone(),
    };
    Ok((context_dir, dockerfile, None))
}

/// `--platform`: comma lists, repeatable, Linux only, each once.
fn platforms(values: &[String]) -> Result<Vec<Platform>> {
    let mut out: Vec<Platform> = Vec::new();
    for text in values.iter().flat_map(|v| v.split(',')).map(str::trim) {
        let platform: Platform = text
            .parse()
            .map_err(|e| invalid("--platform", text, format!("{e}")))?;
        if platform.os != "linux" {
            return Err(refused(
                format!("--platform {text}"),
                format!(
                    "polyarch builds Linux images; use linux/{}",
                    platform.architecture
                ),
            ));
        }
        if !out.contains(&platform) {
            out.push(platform);
        }
    }
    Ok(out)
}

/// `--build-arg KEY=VALUE`, or `KEY` for the environment's value (left out when unset,
/// as buildx does); a later one wins.
fn build_args(
    values: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for text in values {
        let (key, value) = match text.split_once('=') {
            Some((key, value)) => (key, Some(value.to_string())),
            None => (text.as_str(), env(text)),
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(invalid(
                "--build-arg",
                text,
                "is not KEY=VALUE; name the argument, e.g. --build-arg VERSION=1.2",
            ));
        }
        if let Some(value) = value {
            out.insert(key.to_string(), value);
        }
    }
    Ok(out)
}

/// `--label KEY=VALUE` (`KEY` alone: an empty value, as buildx sets); a later one wins.
fn labels(values: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for text in values {
        let (key, value) = text.split_once('=').unwrap_or((text, ""));
        if key.trim().is_empty() {
            return Err(invalid(
                "--label",
                text,
                "has no key; write KEY=VALUE, e.g. org.opencontainers.image.source=URL",
            ));
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

/// Values whose grammar polyarch's own flags already read (`--secret`, `--ssh`,
/// `--annotation`).
fn parsed<T: std::str::FromStr<Err = String>>(flag: &str, values: &[String]) -> Result<Vec<T>> {
    values
        .iter()
        .map(|text| text.parse().map_err(|e: String| invalid(flag, text, e)))
        .collect()
}

/// A cache: `REF`, or `type=registry,ref=REF` with `mode=max` (what polyarch exports
/// anyway) allowed for `--cache-to`.
fn cache(flag: &str, text: &str) -> Result<CacheRef> {
    let reference = match text.contains('=') {
        false => text,
        true => {
            let pairs = pairs(flag, text)?;
            let kind = pairs.iter().find(|(k, _)| *k == "type").map(|(_, v)| *v);
            if kind.is_some_and(|k| k != "registry") {
                return Err(refused(
                    format!("{flag} {text}"),
                    "polyarch reads and writes registry caches only; use type=registry,ref=REF",
                ));
            }
            for (key, value) in &pairs {
                match (*key, *value) {
                    ("type" | "ref", _) => {}
                    ("mode", "max") if flag == "--cache-to" => {}
                    ("mode", other) if flag == "--cache-to" => {
                        return Err(refused(
                            format!("{flag} {text}"),
                            format!(
                            "polyarch exports every step (mode=max), not mode={other}; drop mode="
                        ),
                        ))
                    }
                    (key, _) => {
                        return Err(refused(
                            format!("{flag} {text}"),
                            format!("polyarch's registry cache has no `{key}`; drop {key}="),
                        ))
                    }
                }
            }
            pairs
                .iter()
                .find(|(k, _)| *k == "ref")
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    invalid(
                        flag,
                        text,
                        "names no cache; add ref=REGISTRY/REPOSITORY:TAG",
                    )
                })?
        }
    };
    CacheRef::parse(reference).map_err(|e| invalid(flag, text, e))
}

/// `--cache-from`, each once.
fn cache_from(values: &[String]) -> Result<Vec<CacheRef>> {
    let mut out: Vec<CacheRef> = Vec::new();
    for value in values {
        let reference = cache("--cache-from", value)?;
        if !out.contains(&reference) {
            out.push(reference);
        }
    }
    Ok(out)
}

/// `--cache-to`: polyarch exports one cache per image.
fn cache_to(values: &[String]) -> Result<Option<CacheRef>> {
    match values {
        [] => Ok(None),
        [one] => cache("--cache-to", one).map(Some),
        [_, second, ..] => Err(refused(
            format!("--cache-to {second}"),
            "polyarch exports one cache per image; keep one --cache-to",
        )),
    }
}

/// `--provenance` and `--attest type=provenance` (SBOMs are [`sbom`]'s). A later value
/// wins, as in buildx.
fn provenance(args: &BuildxBuildArgs) -> Result<bool> {
    let mut on = false;
    if let Some(value) = &args.provenance {
        on = provenance_value("--provenance", value, &value.split(',').collect::<Vec<_>>())?;
    }
    for text in &args.attest {
        let pairs = pairs("--attest", text)?;
        match pairs.iter().find(|(k, _)| *k == "type").map(|(_, v)| *v) {
            Some("provenance") => {}
            Some("sbom") => continue,
            _ => {
                return Err(invalid(
                    "--attest",
                    text,
                    "polyarch attaches type=provenance and type=sbom only",
                ))
            }
        }
        let rest: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| *k != "type")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        on = provenance_value("--attest", text, &rest)?;
    }
    Ok(on)
}

/// One provenance request: `true`/`false`, or `mode=min|max` and `disabled=BOOL` pairs.
/// polyarch writes one statement shape whatever the mode.
/// `--sbom` and `--attest type=sbom`: polyarch's own SPDX document per platform, read from
/// the image's layers; there is no scanner image to pick. A later value wins.
fn sbom(args: &BuildxBuildArgs) -> Result<bool> {
    let mut on = false;
    let mut settings: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(value) = &args.sbom {
        settings.push((
            format!("--sbom={value}"),
            value.split(',').map(str::to_string).collect(),
        ));
    }
    for text in &args.attest {
        let pairs = pairs("--attest", text)?;
        if pairs.iter().any(|(k, v)| *k == "type" && *v == "sbom") {
            let rest = pairs
                .iter()
                .filter(|(k, _)| *k != "type")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            settings.push((format!("--attest {text}"), rest));
        }
    }
    for (flag, parts) in settings {
        on = true;
        for part in &parts {
            match part.as_str() {
                "" | "true" | "1" | "disabled=false" => {}
                "false" | "0" | "disabled=true" => on = false,
                other => {
                    return Err(refused(
                        flag,
                        format!("polyarch makes each platform's SPDX SBOM from its layers itself and has no `{other}` (no scanner image); use true or false"),
                    ))
                }
            }
        }
    }
    Ok(on)
}

fn provenance_value(flag: &str, text: &str, parts: &[&str]) -> Result<bool> {
    let mut on = true;
    for part in parts {
        match *part {
            "" | "true" | "1" | "mode=min" | "mode=max" | "disabled=false" => {}
            "false" | "0" | "disabled=true" => on = false,
            other => {
                return Err(refused(
                    format!("{flag} {text}"),
                    format!("polyarch attaches one SLSA provenance statement per platform and has no `{other}`; use true, false or mode=max"),
                ))
            }
        }
    }
    Ok(on)
}

/// `SOURCE_DATE_EPOCH` from the environment, as buildx passes it on.
fn source_date_epoch(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<(u64, EpochSource)>> {
    match env("SOURCE_DATE_EPOCH").filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(text) => text
            .trim()
            .parse()
            .map(|seconds| Some((seconds, EpochSource::Env)))
            .map_err(|_| {
                invalid(
                    "SOURCE_DATE_EPOCH",
                    &text,
                    "is not a number of seconds since 1970; set it to e.g. $(git log -1 --format=%ct)",
                )
            }),
    }
}

/// A temporary directory holding, as `Dockerfile`, the Dockerfile read from `stdin` (what
/// `flag` names); removed when dropped.
fn dockerfile_from_stdin(stdin: &mut dyn Read, flag: &str) -> Result<tempfile::TempDir> {
    let io = |what: String| move |source| BuildxError::Io { what, source };
    let mut text = Vec::new();
    stdin.read_to_end(&mut text).map_err(io(format!(
        "reading the Dockerfile from standard input ({flag})"
    )))?;
    // buildx also takes a tar context on stdin; its `ustar` magic sits at 257.
    if text.get(257..262) == Some(b"ustar") {
        return Err(refused(
            "- (a tar archive on standard input)",
            "polyarch takes a Dockerfile on standard input, not a context archive; unpack it and pass the directory",
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix("polyarch-stdin-")
        .tempdir()
        .map_err(io(
            "creating a directory for the Dockerfile on standard input".into(),
        ))?;
    std::fs::write(dir.path().join("Dockerfile"), &text)
        .map_err(io("writing the Dockerfile from standard input".into()))?;
    Ok(dir)
}

/// buildx's `--metadata-file` keys for the index read back: its digest, the tags pushed
/// (comma-joined) and its descriptor.
pub fn metadata(image: &ImageCoverage, names: &[String]) -> serde_json::Value {
    let mut descriptor = serde_json::json!({
        "mediaType": image.media_type,
        "digest": image.digest.as_str(),
    });
    if let Some(size) = image.size {
        descriptor["size"] = size.into();
    }
    let mut metadata = serde_json::json!({
        "containerimage.digest": image.digest.as_str(),
        "containerimage.descriptor": descriptor,
    });
    // As BuildKit's exporter: no name, no key.
    if !names.is_empty() {
        metadata["image.name"] = names.join(",").into();
    }
    metadata
}

/// `--output type=oci,dest=PATH` without `tar=false`: the layout `dir` packed into the
/// tar file `dest`, as buildx writes it.
pub fn pack_layout(dir: &Path, dest: &Path) -> std::io::Result<()> {
    let partial = dest.with_extension("polyarch-partial");
    let file = std::fs::File::create(&partial)?;
    let mut archive = tar::Builder::new(file);
    archive.follow_symlinks(false);
    archive.append_dir_all(".", dir)?;
    archive.into_inner()?.sync_all()?;
    std::fs::rename(&partial, dest)
}

//! The project file, `polyarch.yaml` (version 1): parsing and validation into typed specs.
//! Every mistake becomes one `ProjectError::File` naming the file, the field path
//! (e.g. `images.hello.platforms[1]`) and the fix.
//!
//! Parsing runs in two passes over the text: first into a generic YAML value (so syntax
//! errors and the `version` check come before anything version-specific), then into
//! loosely typed `Raw*` structs (every field optional, every scalar a string) so that the
//! validation below, not serde, decides what is missing or wrong and how to say so.
//! Between the two, the job's values (`${VAR}`, `--set`; see `values`) are written into
//! the raw strings, so validation judges and names them like any other.

use crate::base::annotations::{AnnotationFlag, Annotations};
use crate::base::platform::Platform;
use crate::base::reference::{parse_reference, ReferenceError};
use crate::base::text::one_line;
use crate::docker::buildkit::secrets::{self, SecretSource};
use crate::docker::buildkit::ssh::{self, AgentSocket};
use crate::docker::endpoint::{Endpoint, EndpointError, TlsFiles};
use crate::registry::credentials::Credential;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

mod bake;
mod checks;
pub mod contexts;
pub mod dependencies;
mod diagnostics;
mod error;
mod images;
mod names;
pub mod plan;
pub mod platform_test;
mod raw;
pub mod source_date_epoch;
mod values;

pub use bake::{Converted, DEFAULT_FILES};
use checks::Cx;
use diagnostics::q;
pub use error::ProjectError;

type Result<T, E = ProjectError> = std::result::Result<T, E>;
use raw::RawProject;
pub use values::{Override, ValueSource};

pub const SUPPORTED_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    Default,
    Host,
    None,
}

/// How to treat foreign platforms that need QEMU emulation (see `binfmt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BinfmtMode {
    #[default]
    Auto,
    Never,
    Require,
}

#[derive(Debug, Clone)]
pub struct Project {
    /// The project file as given (for messages).
    pub file: PathBuf,
    /// Images in the order the file declares them.
    pub images: Vec<ImageSpec>,
    pub binfmt: BinfmtMode,
    /// Installer image for binfmt registration.
    pub binfmt_image: Option<String>,
    /// Engine per (normalised) platform, so foreign platforms can build natively on
    /// another machine instead of under emulation.
    /// One or more per platform: a list spreads that platform's builds over its builders.
    pub builders: BTreeMap<Platform, Vec<BuilderSpec>>,
    /// Where values that did not come from the file itself came from.
    values: Vec<values::Provenance>,
    /// A bake file's groups: name → its targets (nested groups expanded).
    groups: BTreeMap<String, Vec<String>>,
}

/// A `builders:` entry: where the engine is, as written, and its TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuilderSpec {
    /// `unix://…`, `tcp://…`, `ssh://…` or a Docker context name.
    pub host: String,
    /// For a `tcp://` host: the CA, client certificate and key, as absolute paths.
    pub tls: Option<TlsFiles>,
    /// What to do when the builder cannot be reached.
    pub fallback: Fallback,
    /// A standalone BuildKit daemon (`buildkit:`) rather than a Docker engine (`host:`).
    pub buildkit: bool,
}

/// What a build does when a platform's builder cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Stop before anything is built.
    #[default]
    None,
    /// Build that platform on the default engine, under QEMU when it needs it.
    Emulate,
}

const FALLBACKS: &[(&str, Fallback)] = &[("none", Fallback::None), ("emulate", Fallback::Emulate)];

impl BuilderSpec {
    /// The engine's location, reading the context or TLS files it names.
    pub fn endpoint(&self) -> std::result::Result<Endpoint, EndpointError> {
        Endpoint::resolve(&self.host, self.tls.as_ref())
    }
}

impl fmt::Display for BuilderSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.buildkit {
            f.write_str("BuildKit daemon ")?;
        }
        f.write_str(&self.host)?;
        if self.tls.is_some() {
            f.write_str(" (TLS)")?;
        }
        Ok(())
    }
}

/// What the command reading the project file will do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// build, plan, doctor: each context and Dockerfile must exist.
    Build,
    /// verify, assemble: only repositories, tags and platforms are read, so a deploy job's
    /// checkout without the build inputs works.
    Verify,
}

/// How to read the project file.
pub struct LoadOptions<'a> {
    pub purpose: Purpose,
    /// `--set IMAGE.FIELD=VALUE`, in command-line order (a later one wins).
    pub overrides: &'a [Override],
    /// Where `${VAR}` is looked up: the process environment, or a test's own.
    pub env: values::Lookup<'a>,
    /// The images the command line names: a bake file reads only these targets (groups
    /// expanded), or its `default` group when none are named.
    pub targets: &'a [String],
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            purpose: Purpose::Build,
            overrides: &[],
            env: &values::process_env,
            targets: &[],
        }
    }
}

#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub name: String,
    /// `host[:port]/path`, without tag or digest.
    pub repository: String,
    pub tags: Vec<String>,
    /// Absolute build context directory.
    pub context: PathBuf,
    /// Dockerfile path relative to the context.
    pub dockerfile: PathBuf,
    pub platforms: Vec<Platform>,
    pub build_args: BTreeMap<String, String>,
    pub target: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// OCI annotations for the index and the platform manifests.
    pub annotations: Annotations,
    /// `SOURCE_DATE_EPOCH`: build reproducibly, with every time stamp at most this (seconds
    /// since 1970).
    pub source_date_epoch: Option<u64>,
    /// `reproducible: true`: without an explicit epoch, the context's last commit time.
    pub reproducible: bool,
    pub network: Network,
    /// Per-image override of the project's `binfmt`.
    pub binfmt: Option<BinfmtMode>,
    /// Secrets the build may mount (`RUN --mount=type=secret,id=ID`), by id.
    pub secrets: BTreeMap<String, Secret>,
    /// SSH agents the build may use (`RUN --mount=type=ssh[,id=ID]`), by id.
    pub ssh: BTreeMap<String, SshAgent>,
    /// Registry caches to import, each read per platform.
    pub cache_from: Vec<CacheRef>,
    /// The registry cache to export to, written per platform.
    pub cache_to: Option<CacheRef>,
    /// Pull every base image even when the engine holds it.
    pub pull: bool,
    /// Run every step, using no cached result.
    pub no_cache: bool,
    /// Attach SLSA provenance to each platform image (an OCI referrer, not an index entry).
    pub provenance: bool,
    /// A platform image without SLSA provenance attached is a coverage gap
    /// (`--require-provenance`; `provenance: true` implies it for the read-back).
    pub require_provenance: bool,
    /// Attach an SPDX SBOM, made from the image's layers, to each platform image (an OCI
    /// referrer beside provenance).
    pub sbom: bool,
    /// A platform image without an SBOM attached is a coverage gap (`--require-sbom`;
    /// `sbom: true` implies it for the read-back).
    pub require_sbom: bool,
    /// `sign: {key: PATH}` (or `--sign-key`): the key's file, relative paths resolved
    /// against the project file's directory.
    pub sign_key: Option<PathBuf>,
    /// That key, opened when the image is readied for a build: the index and every
    /// platform manifest are signed with it before any tag moves.
    pub signer: Option<std::sync::Arc<crate::sign::OpeningKey>>,
    /// `--username/--password-stdin`: offered to BuildKit for the image's own registry
    /// (its pulls from and cache exports to that registry).
    pub login: Option<Credential>,
    /// `--build-history`: the build is recorded in BuildKit's build history.
    pub build_history: bool,
    /// `test:`: run in each platform's pushed image before any tag moves.
    pub tests: Vec<platform_test::PlatformTest>,
    /// Named build contexts by name (`contexts:`, `--build-context`): what `FROM NAME`,
    /// `COPY --from=NAME` and `RUN --mount=from=NAME` read instead of an image so named.
    /// A `target:` entry becomes the pushed digest before the image is built.
    pub contexts: BTreeMap<String, contexts::NamedContext>,
}

/// Where a setting came from, so a problem found when building (a secret that cannot be
/// read) names the project file's field or the flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A field of the project file, e.g. `images.hello.secrets.token.env`.
    Field(String),
    /// A command-line flag as given, e.g. `--secret id=token,env=API_TOKEN`.
    Flag(String),
}

/// A build secret: where its value is read from (never the value itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    pub source: SecretSource,
    pub origin: Origin,
}

/// An SSH agent forwarded to the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshAgent {
    pub socket: AgentSocket,
    pub origin: Origin,
}

/// A registry cache reference (`host/path:tag`). Each platform reads and writes its own
/// tag, the platform appended (`:cache` → `:cache-linux-arm64`), so the platforms of one
/// image never overwrite each other's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRef {
    /// `host/path`, normalised as Docker does (`app` → `docker.io/library/app`).
    name: String,
    tag: String,
}

impl CacheRef {
    /// A tag reference (no digest: the platform is appended to the tag); without a tag,
    /// `latest`, as Docker reads it. The error is the problem and the fix.
    pub fn parse(text: &str) -> std::result::Result<CacheRef, String> {
        let reference = crate::registry::parse_reference(text).map_err(|e| e.to_string())?;
        if reference.digest().is_some() {
            return Err(format!(
                "{} names a digest; a cache is a tag (polyarch appends the platform to it), e.g. registry.example.com/app:buildcache",
                q(text)
            ));
        }
        Ok(CacheRef {
            name: format!("{}/{}", reference.registry(), reference.repository()),
            tag: reference.tag().unwrap_or("latest").to_string(),
        })
    }

    /// The reference one platform's build reads and writes: `host/path:tag-os-arch[-variant]`.
    pub fn for_platform(&self, platform: &Platform) -> String {
        format!("{}:{}", self.name, self.platform_tag(platform))
    }

    fn platform_tag(&self, platform: &Platform) -> String {
        format!("{}-{}", self.tag, platform.to_string().replace('/', "-"))
    }

    /// The longest tag a platform gives, when it exceeds the 128 characters a tag may have.
    fn too_long<'a>(&self, platforms: impl IntoIterator<Item = &'a Platform>) -> Option<String> {
        platforms
            .into_iter()
            .map(|p| self.platform_tag(p))
            .find(|tag| tag.len() > 128)
    }
}

impl std::str::FromStr for CacheRef {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        CacheRef::parse(text)
    }
}

impl fmt::Display for CacheRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// `polyarch build`'s flags that change how images build, applied to every image built.
#[derive(Debug, Clone, Default)]
pub struct BuildFlags {
    /// `--secret`: adds to, or replaces by id, each image's secrets.
    pub secrets: Vec<SecretFlag>,
    /// `--ssh`: adds to, or replaces by id, each image's SSH agents.
    pub ssh: Vec<SshFlag>,
    /// `--cache-from`: added to each image's imports.
    pub cache_from: Vec<CacheRef>,
    /// `--cache-to`: replaces the image's export.
    pub cache_to: Option<CacheRef>,
    pub pull: bool,
    pub no_cache: bool,
    /// `--provenance`: every image built attaches SLSA provenance.
    pub provenance: bool,
    /// `--require-provenance`: an image without provenance is a gap.
    pub require_provenance: bool,
    /// `--sbom`: every image built attaches an SBOM.
    pub sbom: bool,
    /// `--require-sbom`: an image without an SBOM is a gap.
    pub require_sbom: bool,
    /// `--sign-key`: every image built is signed with this key (it wins over `sign:`).
    pub sign_key: Option<PathBuf>,
    /// The password of a cosign key (`COSIGN_PASSWORD` or `--sign-password-stdin`).
    pub sign_password: Option<String>,
    /// `--build-history`: every build is recorded in BuildKit's build history.
    pub build_history: bool,
    /// `--annotation`: added to each image's annotations (a flag's value wins).
    pub annotations: Vec<AnnotationFlag>,
    /// `--build-context`: adds to, or replaces by name, each image's named contexts.
    pub contexts: Vec<contexts::ContextFlag>,
    /// `--source-date-epoch` / `SOURCE_DATE_EPOCH`: for every image, winning over
    /// `reproducible: true`.
    pub source_date_epoch: Option<(u64, crate::project::source_date_epoch::EpochSource)>,
}

/// One `--secret` value, parsed (relative paths against the working directory).
#[derive(Debug, Clone)]
pub struct SecretFlag {
    pub id: String,
    pub source: SecretSource,
    /// As given, for messages.
    pub text: String,
}

impl std::str::FromStr for SecretFlag {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
        let (id, source) = secrets::parse_flag(text, &cwd)?;
        Ok(SecretFlag {
            id,
            source,
            text: text.to_string(),
        })
    }
}

/// One `--ssh` value, parsed (relative paths against the working directory).
#[derive(Debug, Clone)]
pub struct SshFlag {
    pub id: String,
    pub socket: AgentSocket,
    /// As given, for messages.
    pub text: String,
}

impl std::str::FromStr for SshFlag {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
        let (id, socket) = ssh::parse_spec(text, &cwd)?;
        Ok(SshFlag {
            id,
            socket,
            text: text.to_string(),
        })
    }
}

impl ImageSpec {
    /// The reference of the image's first tag, which polyarch reads back and pushes blobs
    /// under.
    pub fn first_tag(&self) -> Result<oci_client::Reference, ReferenceError> {
        self.tagged(&self.tags[0])
    }

    /// The image's repository with `tag`.
    pub fn tagged(&self, tag: &str) -> Result<oci_client::Reference, ReferenceError> {
        parse_reference(&format!("{}:{tag}", self.repository))
    }

    /// The binfmt mode that applies to this image, so callers need not repeat the fallback.
    pub fn binfmt_mode(&self, project_default: BinfmtMode) -> BinfmtMode {
        self.binfmt.unwrap_or(project_default)
    }
}

/// Top-level keys the parser accepts (kept in sync with the schema by a test).
pub const PROJECT_FIELDS: &[&str] = &[
    "version",
    "binfmt",
    "binfmt_image",
    "reproducible",
    "builders",
    "images",
];

/// Per-image keys the parser accepts (kept in sync with serde and the schema by tests).
pub const IMAGE_FIELDS: &[&str] = &[
    "repository",
    "tags",
    "context",
    "dockerfile",
    "platforms",
    "build_args",
    "target",
    "labels",
    "annotations",
    "network",
    "binfmt",
    "secrets",
    "ssh",
    "cache",
    "pull",
    "no_cache",
    "reproducible",
    "provenance",
    "test",
    "sbom",
    "sign",
    "contexts",
];

/// The JSON Schema for editors, shipped in the binary so `polyarch` can print or install it.
pub const SCHEMA_JSON: &str = include_str!("../../schema/polyarch.schema.json");

const NETWORKS: &[(&str, Network)] = &[
    ("default", Network::Default),
    ("host", Network::Host),
    ("none", Network::None),
];

const BOOLEANS: &[(&str, bool)] = &[("true", true), ("false", false)];

const BINFMT_MODES: &[(&str, BinfmtMode)] = &[
    ("auto", BinfmtMode::Auto),
    ("never", BinfmtMode::Never),
    ("require", BinfmtMode::Require),
];

impl Project {
    /// Reads and validates a project file; every failure is an `ProjectError::File` naming
    /// `path`, or an `ProjectError::Usage` naming a bad `--set`.
    /// A project file's text, or what keeps it from being read.
    fn read_text(path: &Path) -> Result<String> {
        let whole = |message: String| ProjectError::File {
            file: path.to_path_buf(),
            field: String::new(),
            message: one_line(&message),
        };
        if path.is_dir() {
            return Err(whole(format!(
                "is a directory; pass the project file itself, e.g. -f {}",
                path.join("polyarch.yaml").display()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| {
            whole(match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "no such file; create it or pass -f FILE".to_string()
                }
                _ => format!("cannot read it ({e}); fix its permissions or pass -f FILE"),
            })
        })?;
        String::from_utf8(bytes).map_err(|e| {
            whole(format!(
                "is not UTF-8 text (invalid byte at offset {}); save it as UTF-8",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    pub fn load(path: &Path, options: &LoadOptions) -> Result<Project> {
        let text = Project::read_text(path)?;
        Project::parse(path, &text, options)
    }

    /// Reads one project file, or several bake and compose files merged in bake's order
    /// (`-f` repeated, or bake's default files found together).
    pub fn load_files(paths: &[PathBuf], options: &LoadOptions) -> Result<Project> {
        match paths {
            [one] => Project::load(one, options),
            _ => {
                let (mut cx, files) = Project::bake_files(paths, options)?;
                bake::load_many(&mut cx, &files, options)
            }
        }
    }

    /// `polyarch plan --print`: bake or compose files resolved and printed in the JSON
    /// shape of `docker buildx bake --print`, with the refusals of [`Project::load`].
    pub fn print_bake(paths: &[PathBuf], options: &LoadOptions) -> Result<String> {
        let (mut cx, files) = Project::bake_files(paths, options)?;
        bake::print(&mut cx, &files, options)
    }

    /// `polyarch init --from`: bake or compose files written as the `polyarch.yaml` that
    /// plans as they do (the targets `options.targets` names, or bake's `default` group),
    /// its relative paths holding from `dest`, the directory it is to be written in.
    pub fn convert_bake(
        paths: &[PathBuf],
        options: &LoadOptions,
        dest: &Path,
    ) -> Result<Converted> {
        let (mut cx, files) = Project::bake_files(paths, options)?;
        bake::convert(&mut cx, paths, &files, options, dest)
    }

    fn bake_files(
        paths: &[PathBuf],
        options: &LoadOptions,
    ) -> Result<(Cx, Vec<(bake::Kind, String)>)> {
        let mut files = Vec::new();
        for path in paths {
            let Some(kind) = bake::Kind::of(path) else {
                return Err(ProjectError::Usage(format!(
                    "{} is polyarch's own format, which is read alone: several -f, plan --print and init --from take bake and compose files",
                    path.display()
                )));
            };
            let text = Project::read_text(path)?;
            files.push((
                kind,
                text.strip_prefix('\u{feff}').unwrap_or(&text).to_string(),
            ));
        }
        Ok((Cx::for_file(&paths[0], options.purpose), files))
    }

    /// Validates project text as if it were read from `file`; relative paths in it
    /// (contexts) resolve against `file`'s directory, which must therefore be real.
    pub fn parse(file: &Path, text: &str, options: &LoadOptions) -> Result<Project> {
        // Editors on Windows may start UTF-8 files with a byte order mark.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut cx = Cx::for_file(file, options.purpose);
        if let Some(kind) = bake::Kind::of(file) {
            return bake::load(&mut cx, kind, text, options);
        }
        cx.precheck(text)?;
        // The typed pass reads the text itself, not a YAML value, so its errors keep their
        // line and column and scalars stay as written (`1.10`, not 1.1).
        let mut raw: RawProject =
            serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text))
                .map_err(|e| cx.serde_error(e))?;
        cx.values =
            values::resolve(&mut raw, file, options.overrides, options.env).map_err(|problem| {
                match problem {
                    values::Problem::Set(message) => ProjectError::Usage(one_line(&message)),
                    values::Problem::Variable(field, why) => cx.err(field, why.to_string()),
                }
            })?;
        cx.project(raw)
    }

    /// A project of one image that no file declares (`buildx build`'s command line):
    /// `file` names where its settings came from in messages.
    pub fn single(file: PathBuf, image: ImageSpec) -> Project {
        Project {
            file,
            images: vec![image],
            binfmt: BinfmtMode::default(),
            binfmt_image: None,
            builders: BTreeMap::new(),
            values: Vec::new(),
            groups: BTreeMap::new(),
        }
    }

    /// The image names a command line gives, a bake group's name replaced by its targets.
    pub fn expand(&self, names: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for name in names {
            for one in self.groups.get(name).unwrap_or(&vec![name.clone()]) {
                if !out.contains(one) {
                    out.push(one.clone());
                }
            }
        }
        out
    }

    /// Where the values of these images (all when none are named), and the file's
    /// top-level ones, came from when not from the file.
    pub fn values_for(&self, names: &[String]) -> Vec<ValueSource> {
        let chosen = |field: &str| match field.strip_prefix("images.") {
            None => true,
            Some(rest) => {
                names.is_empty()
                    || names.iter().any(|n| {
                        rest.strip_prefix(n.as_str())
                            .is_some_and(|r| r.starts_with('.'))
                    })
            }
        };
        self.values
            .iter()
            .filter(|p| chosen(&p.field))
            .map(values::Provenance::record)
            .collect()
    }

    /// Looks an image up by the name used on the command line.
    pub fn image(&self, name: &str) -> Option<&ImageSpec> {
        self.images.iter().find(|i| i.name == name)
    }

    /// The images a command line names (all when it names none); unknown names are left
    /// for the command to refuse.
    pub fn selected<'a>(&'a self, names: &'a [String]) -> impl Iterator<Item = &'a ImageSpec> {
        self.images
            .iter()
            .filter(move |i| names.is_empty() || names.contains(&i.name))
    }

    /// Readies the images `names` selects for `polyarch build`: applies the command
    /// line's `flags` and `login`, then checks that every secret and SSH agent those
    /// builds take from this machine is there now, so nothing is built when one is not.
    /// Problems are usage errors naming the project file's field or the flag.
    pub fn prepare_build(
        &mut self,
        names: &[String],
        flags: &BuildFlags,
        login: Option<Credential>,
    ) -> Result<()> {
        let count = self.selected(names).count();
        if let (Some(to), true) = (&flags.cache_to, count > 1) {
            return Err(ProjectError::Usage(format!(
                "--cache-to {to}: the {count} images built would overwrite each other's cache; name one image on the command line, or give each image its own `cache: {{to: …}}` in {}",
                self.file.display()
            )));
        }
        let file = self.file.clone();
        // One key is opened once (cosign's scrypt costs 32 MiB and a fifth of a second),
        // however many images it signs.
        let mut keys: BTreeMap<PathBuf, std::sync::Arc<crate::sign::OpeningKey>> = BTreeMap::new();
        for image in &mut self.images {
            if !(names.is_empty() || names.contains(&image.name)) {
                continue;
            }
            flags.apply_to(image, login.clone())?;
            if let Some(path) = &image.sign_key {
                let key = match keys.get(path) {
                    Some(key) => key.clone(),
                    None => {
                        let key =
                            crate::sign::OpeningKey::start(path, flags.sign_password.as_deref())
                                .map_err(|e| ProjectError::Usage(one_line(&e.to_string())))?;
                        let key = std::sync::Arc::new(key);
                        keys.insert(path.clone(), key.clone());
                        key
                    }
                };
                image.signer = Some(key);
            }
            self.values
                .extend(epoch_for(image, flags).map_err(|m| ProjectError::File {
                    file: file.clone(),
                    field: format!("images.{}.reproducible", image.name),
                    message: one_line(&m.to_string()),
                })?);
            check_sources(image, &file)?;
        }
        Ok(())
    }
}

impl BuildFlags {
    /// The flags laid over one image's settings: secrets and agents by id, annotations,
    /// caches, and the switches that only add (`--pull`, `--no-cache`, `--provenance`,
    /// `--sbom`).
    fn apply_to(&self, image: &mut ImageSpec, login: Option<Credential>) -> Result<()> {
        for flag in &self.contexts {
            image
                .contexts
                .insert(flag.name.clone(), flag.context.clone());
        }
        for flag in &self.secrets {
            image.secrets.insert(
                flag.id.clone(),
                Secret {
                    source: flag.source.clone(),
                    origin: Origin::Flag(format!("--secret {}", flag.text)),
                },
            );
        }
        for flag in &self.ssh {
            image.ssh.insert(
                flag.id.clone(),
                SshAgent {
                    socket: flag.socket.clone(),
                    origin: Origin::Flag(format!("--ssh {}", flag.text)),
                },
            );
        }
        for flag in &self.annotations {
            image.annotations.insert(flag);
        }
        for reference in &self.cache_from {
            if !image.cache_from.contains(reference) {
                image.cache_from.push(reference.clone());
            }
        }
        if let Some(to) = &self.cache_to {
            image.cache_to = Some(to.clone());
        }
        for reference in self.cache_from.iter().chain(&self.cache_to) {
            if let Some(tag) = reference.too_long(&image.platforms) {
                return Err(ProjectError::Usage(format!(
                    "--cache-from/--cache-to {reference}: the tag of image {} would be {tag}, longer than 128 characters; shorten the tag",
                    image.name
                )));
            }
        }
        image.pull |= self.pull;
        image.no_cache |= self.no_cache;
        image.provenance |= self.provenance;
        image.require_provenance |= self.require_provenance || image.provenance;
        image.sbom |= self.sbom;
        image.require_sbom |= self.require_sbom || image.sbom;
        if let Some(key) = &self.sign_key {
            image.sign_key = Some(key.clone());
        }
        image.build_history |= self.build_history;
        image.login = login;
        Ok(())
    }
}

/// Every secret and SSH agent the image's build may use can be read now, so a missing one
/// is named (by its field or flag) before anything builds.
fn check_sources(image: &ImageSpec, file: &Path) -> Result<()> {
    let at = |origin: &Origin, message: String| match origin {
        Origin::Field(field) => ProjectError::File {
            file: file.to_path_buf(),
            field: field.clone(),
            message: one_line(&message),
        },
        Origin::Flag(flag) => ProjectError::Usage(one_line(&format!("{flag}: {message}"))),
    };
    for secret in image.secrets.values() {
        secret
            .source
            .check()
            .map_err(|e| at(&secret.origin, e.to_string()))?;
    }
    for agent in image.ssh.values() {
        agent
            .socket
            .resolve()
            .map_err(|e| at(&agent.origin, e.to_string()))?;
    }
    Ok(())
}

/// Sets the image's epoch (see [`crate::project::source_date_epoch::choose`]); where a `reproducible: true`
/// image's epoch came from, for the record.
fn epoch_for(
    image: &mut ImageSpec,
    flags: &BuildFlags,
) -> std::result::Result<Option<values::Provenance>, source_date_epoch::EpochError> {
    let chosen = crate::project::source_date_epoch::choose(
        flags.source_date_epoch.clone(),
        image.reproducible,
        &image.context,
    )?;
    image.source_date_epoch = chosen.as_ref().map(|(seconds, _)| *seconds);
    Ok(chosen
        .filter(|_| image.reproducible)
        .map(|(_, source)| values::Provenance {
            field: format!("images.{}.source_date_epoch", image.name),
            source: values::Source::Epoch(source.record()),
        }))
}

/// The image `api` of a small project, tagged `tags` (`v1, latest`), for the unit tests
/// of every area above this one.
#[cfg(test)]
pub(crate) fn test_image(tags: &str) -> ImageSpec {
    let text = format!(
        "version: 1\nimages:\n  api:\n    context: .\n    repository: 127.0.0.1:5000/api\n    tags: [{tags}]\n    platforms: [linux/amd64, linux/arm64]\n"
    );
    let options = LoadOptions {
        purpose: Purpose::Verify,
        ..LoadOptions::default()
    };
    let project = Project::parse(std::path::Path::new("polyarch.yaml"), &text, &options)
        .expect("test project parses");
    project.images[0].clone()
}

#[cfg(test)]
mod tests;

//! The project file, `polyarch.yaml` (version 1): parsing and validation into typed specs.
//! Every mistake becomes one `Error::Project` naming the file, the field path
//! (e.g. `images.hello.platforms[1]`) and the fix.
//!
//! Parsing runs in two passes over the text: first into a generic YAML value (so syntax
//! errors and the `version` check come before anything version-specific), then into
//! loosely typed `Raw*` structs (every field optional, every scalar a string) so that the
//! validation below, not serde, decides what is missing or wrong and how to say so.
//! Between the two, the job's values (`${VAR}`, `--set`; see `values`) are written into
//! the raw strings, so validation judges and names them like any other.

use crate::annotations::{AnnotationFlag, Annotations};
use crate::buildkit::secrets::{self, SecretSource};
use crate::buildkit::ssh::{self, AgentSocket};
use crate::credentials::Credential;
use crate::endpoint::{self, Endpoint, EndpointError, TlsFiles};
use crate::error::{one_line, Error, Result};
use crate::platform::Platform;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

mod values;
pub use values::Override;

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
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            purpose: Purpose::Build,
            overrides: &[],
            env: &values::process_env,
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
    /// `--username/--password-stdin`: offered to BuildKit for the image's own registry
    /// (its pulls from and cache exports to that registry).
    pub login: Option<Credential>,
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
        let reference = crate::registry::parse_reference(text).map_err(|e| match e {
            Error::Usage(message) => message,
            other => other.to_string(),
        })?;
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
    /// `--annotation`: added to each image's annotations (a flag's value wins).
    pub annotations: Vec<AnnotationFlag>,
    /// `--source-date-epoch` / `SOURCE_DATE_EPOCH`: for every image, winning over
    /// `reproducible: true`.
    pub source_date_epoch: Option<(u64, crate::epoch::EpochSource)>,
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
];

/// The JSON Schema for editors, shipped in the binary so `polyarch` can print or install it.
pub const SCHEMA_JSON: &str = include_str!("../schema/polyarch.schema.json");

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
    /// Reads and validates a project file; every failure is an `Error::Project` naming
    /// `path`, or an `Error::Usage` naming a bad `--set`.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Project> {
        let whole = |message: String| Error::Project {
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
        let text = String::from_utf8(bytes).map_err(|e| {
            whole(format!(
                "is not UTF-8 text (invalid byte at offset {}); save it as UTF-8",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Project::parse(path, &text, options)
    }

    /// Validates project text as if it were read from `file`; relative paths in it
    /// (contexts) resolve against `file`'s directory, which must therefore be real.
    pub fn parse(file: &Path, text: &str, options: &LoadOptions) -> Result<Project> {
        // Editors on Windows may start UTF-8 files with a byte order mark.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut cx = Cx {
            file: file.to_path_buf(),
            base: match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
            purpose: options.purpose,
            values: Vec::new(),
        };
        cx.precheck(text)?;
        // The typed pass reads the text itself, not a YAML value, so its errors keep their
        // line and column and scalars stay as written (`1.10`, not 1.1).
        let mut raw: RawProject =
            serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text))
                .map_err(|e| cx.serde_error(e))?;
        cx.values =
            values::resolve(&mut raw, file, options.overrides, options.env).map_err(|problem| {
                match problem {
                    values::Problem::Set(message) => Error::Usage(one_line(&message)),
                    values::Problem::Variable(field, message) => cx.err(field, message),
                }
            })?;
        cx.project(raw)
    }

    /// Where the values of these images (all when none are named), and the file's
    /// top-level ones, came from when not from the file.
    pub fn values_for(&self, names: &[String]) -> Vec<crate::record::ValueSource> {
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
            return Err(Error::Usage(format!(
                "--cache-to {to}: the {count} images built would overwrite each other's cache; name one image on the command line, or give each image its own `cache: {{to: …}}` in {}",
                self.file.display()
            )));
        }
        let file = self.file.clone();
        for image in &mut self.images {
            if !(names.is_empty() || names.contains(&image.name)) {
                continue;
            }
            for flag in &flags.secrets {
                image.secrets.insert(
                    flag.id.clone(),
                    Secret {
                        source: flag.source.clone(),
                        origin: Origin::Flag(format!("--secret {}", flag.text)),
                    },
                );
            }
            for flag in &flags.ssh {
                image.ssh.insert(
                    flag.id.clone(),
                    SshAgent {
                        socket: flag.socket.clone(),
                        origin: Origin::Flag(format!("--ssh {}", flag.text)),
                    },
                );
            }
            for flag in &flags.annotations {
                image.annotations.insert(flag);
            }
            self.values
                .extend(epoch_for(image, flags).map_err(|m| Error::Project {
                    file: file.clone(),
                    field: format!("images.{}.reproducible", image.name),
                    message: one_line(&m),
                })?);
            for reference in &flags.cache_from {
                if !image.cache_from.contains(reference) {
                    image.cache_from.push(reference.clone());
                }
            }
            if let Some(to) = &flags.cache_to {
                image.cache_to = Some(to.clone());
            }
            let flagged = flags.cache_from.iter().chain(&flags.cache_to);
            for reference in flagged {
                if let Some(tag) = reference.too_long(&image.platforms) {
                    return Err(Error::Usage(format!(
                        "--cache-from/--cache-to {reference}: the tag of image {} would be {tag}, longer than 128 characters; shorten the tag",
                        image.name
                    )));
                }
            }
            image.pull |= flags.pull;
            image.no_cache |= flags.no_cache;
            image.provenance |= flags.provenance;
            image.require_provenance |= flags.require_provenance || image.provenance;
            image.login = login.clone();
            let at = |origin: &Origin, message: String| match origin {
                Origin::Field(field) => Error::Project {
                    file: file.clone(),
                    field: field.clone(),
                    message: one_line(&message),
                },
                Origin::Flag(flag) => Error::Usage(one_line(&format!("{flag}: {message}"))),
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
        }
        Ok(())
    }
}

/// Sets the image's epoch (see [`crate::epoch::choose`]); where a `reproducible: true`
/// image's epoch came from, for the record.
fn epoch_for(
    image: &mut ImageSpec,
    flags: &BuildFlags,
) -> std::result::Result<Option<values::Provenance>, String> {
    let chosen = crate::epoch::choose(
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

// ---------------------------------------------------------------------------------------
// Raw, loosely typed shape of the file.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    // Checked in the first pass; kept here so `deny_unknown_fields` accepts it.
    #[allow(dead_code)]
    version: Option<serde_norway::Value>,
    binfmt: Option<String>,
    binfmt_image: Option<String>,
    reproducible: Option<String>,
    builders: Option<Entries<RawBuilder>>,
    images: Option<Entries<RawImage>>,
}

/// A builder: an address or context name, or `{host, tls, fallback}`; or a list of them.
enum RawBuilder {
    Address(String),
    Map(RawBuilderMap),
    List(Vec<RawBuilder>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuilderMap {
    host: Option<String>,
    tls: Option<RawTls>,
    fallback: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl<'de> Deserialize<'de> for RawBuilder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawBuilder;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "an engine address, a context name, a mapping with host and tls, or a list of them",
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<RawBuilder, A::Error> {
                let mut list = Vec::new();
                while let Some(one) = seq.next_element::<RawBuilder>()? {
                    list.push(one);
                }
                Ok(RawBuilder::List(list))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawBuilder, E> {
                Ok(RawBuilder::Address(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<RawBuilder, A::Error> {
                RawBuilderMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawBuilder::Map)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImage {
    repository: Option<String>,
    tags: Option<Vec<String>>,
    context: Option<String>,
    dockerfile: Option<String>,
    platforms: Option<Vec<String>>,
    build_args: Option<Entries<String>>,
    target: Option<String>,
    labels: Option<Entries<String>>,
    network: Option<String>,
    binfmt: Option<String>,
    secrets: Option<Entries<RawSecret>>,
    ssh: Option<Vec<String>>,
    cache: Option<RawCache>,
    pull: Option<String>,
    no_cache: Option<String>,
    reproducible: Option<String>,
    provenance: Option<String>,
    annotations: Option<Entries<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    file: Option<String>,
    env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    from: Option<Vec<String>>,
    to: Option<String>,
}

/// A mapping kept in file order (images are built and reported in declaration order).
/// Scalars deserialize as written, so `GREETING: 1.10` stays `"1.10"`.
struct Entries<T>(Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<T>()?;
                    out.push((key, value));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

// ---------------------------------------------------------------------------------------
// Validation.

/// Where messages point and where relative paths start.
struct Cx {
    file: PathBuf,
    base: PathBuf,
    purpose: Purpose,
    /// The job's values, so a bad one is traced to the variable or `--set` it came from.
    values: Vec<values::Provenance>,
}

impl Cx {
    fn err(&self, field: impl AsRef<str>, message: impl AsRef<str>) -> Error {
        let field = field.as_ref();
        let note = values::note(self.values.iter().filter(|p| p.covers(field)));
        Error::Project {
            file: self.file.clone(),
            field: one_line(field),
            message: one_line(&format!("{}{note}", message.as_ref())),
        }
    }

    /// Syntax, top-level shape and version, before any version-specific typing.
    fn precheck(&self, text: &str) -> Result<()> {
        let top = match Shallow::deserialize_top(serde_norway::Deserializer::from_str(text)) {
            Ok(v) => v,
            Err(e) => {
                let msg = strip_marks(&e.to_string());
                if msg.starts_with("EOF while parsing") {
                    return Err(self.err("", EMPTY_FILE));
                }
                // Non-syntax failures carry serde_norway's path prefix (`a.b: invalid type…`).
                let has_path = msg.split_once(": ").is_some_and(|(pre, _)| {
                    !pre.is_empty() && !pre.contains(char::is_whitespace) && !pre.contains('`')
                });
                let kind = if has_path || msg.starts_with("invalid ") {
                    "YAML error"
                } else {
                    "YAML syntax error"
                };
                let msg = clip_long(&msg, 200);
                return Err(self.err(
                    "",
                    match e.location() {
                        // `[${VERSION}]` is the likely mistake once files hold variables:
                        // inside brackets YAML reads `{` and `}` as a mapping.
                        Some(l) if text.lines().nth(l.line().saturating_sub(1)).is_some_and(|t| t.contains("${")) => format!(
                            "{kind} at line {}, column {}: {msg}; quote values holding `${{…}}` inside […] or {{…}}, e.g. `tags: [\"${{VERSION}}\", latest]`",
                            l.line(),
                            l.column()
                        ),
                        Some(l) => format!(
                            "{kind} at line {}, column {}: {msg}; fix the indentation, quoting or brackets there",
                            l.line(),
                            l.column()
                        ),
                        None => format!(
                            "{kind}: {msg}; fix the file so it is a single YAML document"
                        ),
                    },
                ));
            }
        };
        let version = match top {
            Shallow::Map(version) => version,
            Shallow::Null => return Err(self.err("", EMPTY_FILE)),
            other => {
                return Err(self.err(
                    "",
                    format!(
                        "the top level is {}, not a mapping; write `key: value` lines starting with `version: {SUPPORTED_VERSION}` and `images:`",
                        other.describe()
                    ),
                ))
            }
        };
        match version.as_deref() {
            None | Some(Shallow::Null) => Err(self.err(
                "version",
                format!("missing; add `version: {SUPPORTED_VERSION}` at the top of the file"),
            )),
            Some(Shallow::Int(n)) if *n == SUPPORTED_VERSION.to_string() => Ok(()),
            Some(Shallow::Float(f)) if *f == f64::from(SUPPORTED_VERSION) => Ok(()),
            Some(Shallow::Int(n)) => Err(self.unsupported(n)),
            Some(Shallow::Float(f)) => Err(self.unsupported(&f.to_string())),
            Some(other) => {
                let quoted =
                    matches!(other, Shallow::Str(s) if s.trim() == SUPPORTED_VERSION.to_string());
                Err(self.err(
                    "version",
                    format!(
                        "must be the number {SUPPORTED_VERSION}, found {}; write `version: {SUPPORTED_VERSION}`{}",
                        other.describe(),
                        if quoted { " without quotes" } else { "" }
                    ),
                ))
            }
        }
    }

    fn unsupported(&self, version: &str) -> Error {
        self.err(
            "version",
            format!(
                "unsupported version {}; this polyarch reads version {SUPPORTED_VERSION}, write `version: {SUPPORTED_VERSION}` or use a newer polyarch",
                clip(version)
            ),
        )
    }

    fn serde_error(&self, e: serde_path_to_error::Error<serde_norway::Error>) -> Error {
        let segs: Vec<Seg> = e
            .path()
            .iter()
            .map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Seg::Key(key.clone()),
                serde_path_to_error::Segment::Seq { index } => Seg::Index(*index),
                serde_path_to_error::Segment::Enum { variant } => Seg::Key(variant.clone()),
                serde_path_to_error::Segment::Unknown => Seg::Key("?".into()),
            })
            .collect();
        let field = seg_path(&segs);
        let inner = e.into_inner();
        let location = inner.location();
        let mut raw = strip_marks(&inner.to_string());
        // serde_norway prefixes its own copy of the path (`images.hello: invalid type…`).
        if let Some((pre, rest)) = raw.split_once(": ") {
            if !pre.is_empty() && !pre.contains(char::is_whitespace) && !pre.contains('`') {
                raw = rest.to_string();
            }
        }
        let at = location
            .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
            .unwrap_or_default();
        // serde reports a repeated key at the enclosing mapping; point at the key itself.
        if let Some(rest) = raw.strip_prefix("duplicate field `") {
            let key = rest.split('`').next().unwrap_or_default();
            let field = if field.is_empty() {
                key.to_string()
            } else {
                format!("{field}.{key}")
            };
            return self.err(field, format!("is given twice{at}; keep one"));
        }
        let message = humanize(&raw, &segs, &at);
        self.err(field, message)
    }

    /// A `builders:` entry, checked as far as the file can say: the address's form, and
    /// TLS files only for `tcp://` hosts, in pairs, present when building.
    fn builder(&self, field: &str, raw: RawBuilder) -> Result<BuilderSpec> {
        let (host, raw_tls, host_field, fallback) = match raw {
            RawBuilder::List(_) => {
                return Err(self.err(
                    field,
                    "is a list inside a list; write the platform's builders as one list",
                ))
            }
            RawBuilder::Address(host) => (host, None, field.to_string(), Fallback::None),
            RawBuilder::Map(map) => {
                let host = map.host.ok_or_else(|| {
                    self.err(
                        format!("{field}.host"),
                        "is missing; give the engine's address, e.g. `host: tcp://arm-box:2376`",
                    )
                })?;
                let fallback = match map.fallback {
                    Some(s) => pick(&s, FALLBACKS, "fallback")
                        .map_err(|m| self.err(format!("{field}.fallback"), m))?,
                    None => Fallback::None,
                };
                (host, map.tls, format!("{field}.host"), fallback)
            }
        };
        if host.trim().is_empty() {
            return Err(self.err(
                &host_field,
                "is empty; give an engine endpoint (unix:///path/docker.sock, tcp://host:port, ssh://user@host) or a docker context name",
            ));
        }
        let address = if endpoint::is_address(&host) {
            Some(endpoint::parse_address(&host).map_err(|e| self.err(&host_field, e.to_string()))?)
        } else if host.contains(char::is_whitespace) {
            return Err(self.err(
                &host_field,
                format!("{} is not a Docker context name (it has whitespace); write an address or the name `docker context ls` shows", q(&host)),
            ));
        } else {
            None
        };
        let Some(raw_tls) = raw_tls else {
            return Ok(BuilderSpec {
                host,
                tls: None,
                fallback,
            });
        };
        let tls_field = format!("{field}.tls");
        if !matches!(address, Some(endpoint::Address::Tcp { .. })) {
            return Err(self.err(
                &tls_field,
                "applies to tcp:// hosts only (a Docker context brings its own TLS files, ssh:// needs none); remove it or write host: tcp://HOST:2376",
            ));
        }
        let path = |name: &str, value: Option<String>| -> Result<Option<PathBuf>> {
            let Some(value) = value else { return Ok(None) };
            let at = format!("{tls_field}.{name}");
            if value.trim().is_empty() {
                return Err(self.err(
                    &at,
                    "is empty; give a PEM file, relative to the project file",
                ));
            }
            let resolved = self.base.join(&value);
            if self.purpose == Purpose::Build && !resolved.is_file() {
                return Err(self.err(
                    &at,
                    format!("{} does not exist (looked for {}); give the PEM file, relative to the project file", q(&value), resolved.display()),
                ));
            }
            Ok(Some(resolved))
        };
        let files = TlsFiles {
            ca: path("ca", raw_tls.ca)?,
            cert: path("cert", raw_tls.cert)?,
            key: path("key", raw_tls.key)?,
            skip_verify: false,
        };
        match (&files.cert, &files.key) {
            (Some(_), None) => Err(self.err(&tls_field, "has cert but no key; give both, or neither to connect without a client certificate")),
            (None, Some(_)) => Err(self.err(&tls_field, "has key but no cert; give both, or neither to connect without a client certificate")),
            (None, None) if files.ca.is_none() => Err(self.err(&tls_field, "is empty; give ca (the engine's CA) and cert and key (the client's), e.g. tls: {ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}")),
            _ => Ok(BuilderSpec {
                host,
                tls: Some(files),
                fallback,
            }),
        }
    }

    fn project(&self, raw: RawProject) -> Result<Project> {
        let binfmt = match raw.binfmt {
            Some(s) => pick(&s, BINFMT_MODES, "binfmt mode").map_err(|m| self.err("binfmt", m))?,
            None => BinfmtMode::default(),
        };
        let binfmt_image = match raw.binfmt_image {
            Some(s) if s.trim().is_empty() => {
                return Err(self.err(
                    "binfmt_image",
                    "is empty; name an installer image (e.g. tonistiigi/binfmt) or remove the key",
                ))
            }
            Some(s) if s.contains(char::is_whitespace) => {
                return Err(self.err(
                    "binfmt_image",
                    format!("{} contains whitespace; write a single image reference such as tonistiigi/binfmt", q(&s)),
                ))
            }
            other => other,
        };
        let mut builders = BTreeMap::new();
        let mut builder_keys: BTreeMap<Platform, String> = BTreeMap::new();
        for (key, builder) in raw.builders.map(|b| b.0).unwrap_or_default() {
            let field = format!("builders.{key}");
            let platform: Platform = key.parse().map_err(|e| self.err(&field, format!("{e}")))?;
            if let Some(earlier) = builder_keys.get(&platform) {
                return Err(self.err(
                    &field,
                    format!(
                        "is the same platform as builders.{earlier} (both are {platform}); keep one entry"
                    ),
                ));
            }
            let specs = match builder {
                RawBuilder::List(list) if list.is_empty() => {
                    return Err(self.err(
                        &field,
                        "is an empty list; name at least one builder, or remove the entry to build on the default engine",
                    ))
                }
                RawBuilder::List(list) => list
                    .into_iter()
                    .enumerate()
                    .map(|(i, one)| self.builder(&format!("{field}[{i}]"), one))
                    .collect::<Result<Vec<_>>>()?,
                one => vec![self.builder(&field, one)?],
            };
            builder_keys.insert(platform.clone(), key);
            builders.insert(platform, specs);
        }
        let entries = raw.images.map(|i| i.0).unwrap_or_default();
        if entries.is_empty() {
            return Err(self.err(
                "images",
                "no images declared; add at least one, e.g. `images: {hello: {repository: registry.example.com/hello, tags: [v1], context: ., platforms: [linux/amd64]}}`",
            ));
        }
        // The default of every image's own `reproducible:`.
        let reproducible = match raw.reproducible {
            Some(s) => pick(&s, BOOLEANS, "boolean").map_err(|_| {
                self.err(
                    "reproducible",
                    format!(
                        "{} is not a boolean; write `reproducible: true` or `reproducible: false`",
                        q(&s)
                    ),
                )
            })?,
            None => false,
        };
        let mut images: Vec<ImageSpec> = Vec::with_capacity(entries.len());
        for (name, img) in entries {
            let inherits = img.reproducible.is_none();
            if images.iter().any(|i| i.name == name) {
                return Err(self.err(
                    format!("images.{name}"),
                    "is declared twice; image names must be unique, rename or merge one",
                ));
            }
            let mut image = self.image(name, img)?;
            image.reproducible |= inherits && reproducible;
            images.push(image);
        }
        Ok(Project {
            file: self.file.clone(),
            images,
            binfmt,
            binfmt_image,
            builders,
            values: self.values.clone(),
        })
    }

    fn image(&self, name: String, raw: RawImage) -> Result<ImageSpec> {
        let at = |f: &str| format!("images.{name}.{f}");
        if !valid_image_name(&name) {
            let lower = name.to_ascii_lowercase();
            let hint = if valid_image_name(&lower) {
                format!(" (e.g. `{lower}`)")
            } else {
                String::new()
            };
            return Err(self.err(
                format!("images.{name}"),
                format!(
                    "{} is not a valid image name; use lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit{hint}",
                    q(&name)
                ),
            ));
        }
        let missing =
            |f: &str, example: &str| self.err(at(f), format!("missing; add it, e.g. `{example}`"));

        // repository
        let repository = raw
            .repository
            .ok_or_else(|| missing("repository", "repository: registry.example.com/team/app"))?;
        check_repository(&repository).map_err(|m| self.err(at("repository"), m))?;

        // tags
        let tags = raw
            .tags
            .ok_or_else(|| missing("tags", "tags: [v1, latest]"))?;
        if tags.is_empty() {
            return Err(self.err(
                at("tags"),
                "is empty; list at least one tag, e.g. `tags: [v1, latest]`",
            ));
        }
        for (i, tag) in tags.iter().enumerate() {
            let field = format!("images.{name}.tags[{i}]");
            if !valid_tag(tag) {
                return Err(self.err(
                    field,
                    format!(
                        "{} is not a valid tag; use 1 to 128 letters, digits, `_`, `.` or `-`, not starting with `.` or `-`",
                        q(tag)
                    ),
                ));
            }
            if let Some(j) = tags[..i].iter().position(|t| t == tag) {
                return Err(self.err(
                    field,
                    format!("{} repeats tags[{j}]; remove the duplicate", q(tag)),
                ));
            }
        }

        // context
        let context_raw = raw
            .context
            .ok_or_else(|| missing("context", "context: ."))?;
        if context_raw.trim().is_empty() {
            return Err(self.err(
                at("context"),
                "is empty; give the build directory relative to the project file, e.g. `context: .`",
            ));
        }
        let looked = self.base.join(&context_raw);
        // Commands that build nothing never open the context or Dockerfile.
        let dockerfile_raw = raw.dockerfile.unwrap_or_else(|| "Dockerfile".to_string());
        let (context, dockerfile) = if self.purpose == Purpose::Build {
            let context = self.context(&at("context"), &looked)?;
            let dockerfile = self.dockerfile(&at("dockerfile"), &context, &dockerfile_raw)?;
            (context, dockerfile)
        } else {
            self.dockerfile_written(&at("dockerfile"), &looked, &dockerfile_raw)?;
            (looked, PathBuf::from(dockerfile_raw))
        };

        // platforms
        // platforms
        let platform_strs = raw
            .platforms
            .ok_or_else(|| missing("platforms", "platforms: [linux/amd64, linux/arm64]"))?;
        if platform_strs.is_empty() {
            return Err(self.err(
                at("platforms"),
                "is empty; list at least one platform, e.g. `platforms: [linux/amd64, linux/arm64]`",
            ));
        }
        let mut platforms: Vec<Platform> = Vec::with_capacity(platform_strs.len());
        for (i, s) in platform_strs.iter().enumerate() {
            let field = format!("images.{name}.platforms[{i}]");
            let p: Platform = s.parse().map_err(|e| self.err(&field, format!("{e}")))?;
            if p.os != "linux" {
                return Err(self.err(
                    field,
                    format!(
                        "{}: polyarch builds Linux images (its builders are Linux Docker engines); use linux/{}",
                        q(s),
                        p.architecture
                    ),
                ));
            }
            if let Some(j) = platforms.iter().position(|x| *x == p) {
                return Err(self.err(
                    field,
                    format!(
                        "{} is the same platform as platforms[{j}] ({}) once normalised to {p}; remove one",
                        q(s),
                        q(&platform_strs[j])
                    ),
                ));
            }
            platforms.push(p);
        }

        // build args, labels
        let mut build_args = BTreeMap::new();
        for (k, v) in raw.build_args.map(|e| e.0).unwrap_or_default() {
            let field = format!("images.{name}.build_args.{k}");
            if k.is_empty() || k.contains('=') || k.contains(char::is_whitespace) {
                return Err(self.err(
                    field,
                    format!("{} is not a build argument name; use a name without `=` or spaces, e.g. GREETING", q(&k)),
                ));
            }
            if build_args.insert(k, v).is_some() {
                return Err(self.err(field, "is given twice; keep one"));
            }
        }
        let mut labels = BTreeMap::new();
        for (k, v) in raw.labels.map(|e| e.0).unwrap_or_default() {
            let field = format!("images.{name}.labels.{k}");
            if k.trim().is_empty() {
                return Err(self.err(
                    field,
                    "has an empty label key; use a key such as org.opencontainers.image.source",
                ));
            }
            if labels.insert(k, v).is_some() {
                return Err(self.err(field, "is given twice; keep one"));
            }
        }

        let mut annotations = Annotations::default();
        for (k, v) in raw.annotations.map(|e| e.0).unwrap_or_default() {
            annotations
                .add(&k, &v)
                .map_err(|e| self.err(format!("images.{name}.annotations.{k}"), e.to_string()))?;
        }

        // target
        let target = match raw.target {
            Some(t) if t.trim().is_empty() => return Err(self.err(
                at("target"),
                "is empty; name a stage of the Dockerfile (`FROM … AS NAME`) or remove `target:`",
            )),
            Some(t) if t.contains(char::is_whitespace) => {
                return Err(self.err(
                    at("target"),
                    format!(
                        "{} contains whitespace; name a single stage of the Dockerfile",
                        q(&t)
                    ),
                ))
            }
            other => other,
        };

        let network = match raw.network {
            Some(s) => {
                pick(&s, NETWORKS, "network mode").map_err(|m| self.err(at("network"), m))?
            }
            None => Network::default(),
        };
        let binfmt = match raw.binfmt {
            Some(s) => {
                Some(pick(&s, BINFMT_MODES, "binfmt mode").map_err(|m| self.err(at("binfmt"), m))?)
            }
            None => None,
        };

        let flag = |value: Option<String>, field: &str| match value {
            Some(s) => pick(&s, BOOLEANS, "boolean").map_err(|_| {
                self.err(
                    at(field),
                    format!(
                        "{} is not a boolean; write `{field}: true` or `{field}: false`",
                        q(&s)
                    ),
                )
            }),
            None => Ok(false),
        };
        let pull = flag(raw.pull, "pull")?;
        let no_cache = flag(raw.no_cache, "no_cache")?;
        let reproducible = flag(raw.reproducible, "reproducible")?;
        let provenance = flag(raw.provenance, "provenance")?;
        let secrets = self.secrets(&name, raw.secrets)?;
        let ssh = self.ssh(&name, raw.ssh)?;
        let (cache_from, cache_to) = self.cache(&name, raw.cache, &platforms)?;

        Ok(ImageSpec {
            name,
            repository,
            tags,
            context,
            dockerfile,
            platforms,
            build_args,
            target,
            labels,
            annotations,
            source_date_epoch: None,
            reproducible,
            network,
            binfmt,
            secrets,
            ssh,
            cache_from,
            cache_to,
            pull,
            no_cache,
            provenance,
            require_provenance: provenance,
            login: None,
        })
    }

    /// `secrets: {ID: {file: PATH} | {env: NAME}}`; files relative to the project file.
    /// Whether they can be read is checked when building (see [`Project::prepare_build`]).
    fn secrets(
        &self,
        image: &str,
        raw: Option<Entries<RawSecret>>,
    ) -> Result<BTreeMap<String, Secret>> {
        let mut out = BTreeMap::new();
        for (id, entry) in raw.map(|e| e.0).unwrap_or_default() {
            let field = format!("images.{image}.secrets.{id}");
            if !secrets::valid_id(&id) {
                return Err(self.err(
                    &field,
                    format!("{} is not a secret id; use a name without `,`, `=` or spaces, as in `RUN --mount=type=secret,id=token`", q(&id)),
                ));
            }
            if out.contains_key(&id) {
                return Err(self.err(&field, "is given twice; keep one"));
            }
            let (source, origin) = match (entry.file, entry.env) {
                (Some(_), Some(_)) => {
                    return Err(self.err(
                        &field,
                        "gives both file and env; a secret comes from one of them, remove the other",
                    ))
                }
                (None, None) => {
                    return Err(self.err(
                        &field,
                        format!("gives neither file nor env; write `{id}: {{file: ./path}}` or `{id}: {{env: VARIABLE}}`"),
                    ))
                }
                (Some(file), None) => {
                    if file.trim().is_empty() {
                        return Err(self.err(
                            format!("{field}.file"),
                            "is empty; give the path of the file holding the secret, relative to the project file",
                        ));
                    }
                    (
                        SecretSource::File(self.base.join(&file)),
                        format!("{field}.file"),
                    )
                }
                (None, Some(env)) => {
                    if env.is_empty() || env.contains(['=', '\0']) || env.contains(char::is_whitespace) {
                        return Err(self.err(
                            format!("{field}.env"),
                            format!("{} is not an environment variable name; write e.g. `env: API_TOKEN`", q(&env)),
                        ));
                    }
                    (SecretSource::Env(env), format!("{field}.env"))
                }
            };
            out.insert(
                id,
                Secret {
                    source,
                    origin: Origin::Field(origin),
                },
            );
        }
        Ok(out)
    }

    /// `ssh: [default | ID | ID=SOCKET]`; sockets relative to the project file.
    fn ssh(&self, image: &str, raw: Option<Vec<String>>) -> Result<BTreeMap<String, SshAgent>> {
        let mut out: BTreeMap<String, SshAgent> = BTreeMap::new();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (i, text) in raw.unwrap_or_default().iter().enumerate() {
            let field = format!("images.{image}.ssh[{i}]");
            let (id, socket) =
                ssh::parse_spec(text, &self.base).map_err(|m| self.err(&field, m))?;
            if let Some(j) = seen.insert(id.clone(), i) {
                return Err(self.err(
                    &field,
                    format!("forwards id `{id}` again (see ssh[{j}]); keep one entry per id"),
                ));
            }
            out.insert(
                id,
                SshAgent {
                    socket,
                    origin: Origin::Field(field),
                },
            );
        }
        Ok(out)
    }

    /// `cache: {from: [REF…], to: REF}`.
    fn cache(
        &self,
        image: &str,
        raw: Option<RawCache>,
        platforms: &[Platform],
    ) -> Result<(Vec<CacheRef>, Option<CacheRef>)> {
        let Some(raw) = raw else {
            return Ok((Vec::new(), None));
        };
        let parse = |field: String, text: &str| {
            let reference = CacheRef::parse(text).map_err(|m| self.err(&field, m))?;
            match reference.too_long(platforms) {
                Some(tag) => Err(self.err(
                    &field,
                    format!("the tag with the platform appended, {}, is longer than 128 characters; shorten the tag", q(&tag)),
                )),
                None => Ok(reference),
            }
        };
        let mut from = Vec::new();
        for (i, text) in raw.from.unwrap_or_default().iter().enumerate() {
            from.push(parse(format!("images.{image}.cache.from[{i}]"), text)?);
        }
        let to = match raw.to {
            Some(text) => Some(parse(format!("images.{image}.cache.to"), &text)?),
            None => None,
        };
        Ok((from, to))
    }

    /// The context directory, which must exist: absolute and canonical.
    fn context(&self, field: &str, looked: &Path) -> Result<PathBuf> {
        match std::fs::metadata(looked) {
            Ok(m) if m.is_dir() => looked.canonicalize().map_err(|e| {
                self.err(field, format!("cannot resolve {} ({e}); fix the path", looked.display()))
            }),
            Ok(_) => {
                Err(self.err(
                    field,
                    format!(
                        "{} is not a directory; point `context:` at the directory holding the build files",
                        looked.display()
                    ),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(self.err(
                    field,
                    format!(
                        "{} does not exist; create it or fix the path (it is relative to the project file's directory {})",
                        looked.display(),
                        self.base.display()
                    ),
                ))
            }
            Err(e) => {
                Err(self.err(
                    field,
                    format!("cannot read {} ({e}); fix the path or its permissions", looked.display()),
                ))
            }
        }
    }

    /// What can be checked of `dockerfile:` without reading the disk.
    fn dockerfile_written(&self, field: &str, context: &Path, written: &str) -> Result<()> {
        if written.trim().is_empty() {
            return Err(self.err(
                field,
                "is empty; give the Dockerfile path relative to the context, or remove the key to use Dockerfile",
            ));
        }
        if Path::new(written).is_absolute() {
            return Err(self.err(
                field,
                format!(
                    "{written} is absolute; write it relative to the context {}",
                    context.display()
                ),
            ));
        }
        Ok(())
    }

    /// The Dockerfile must be inside the context: the engine only receives the context.
    fn dockerfile(&self, field: &str, context: &Path, written: &str) -> Result<PathBuf> {
        self.dockerfile_written(field, context, written)?;
        let looked = context.join(written);
        match std::fs::metadata(&looked) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(self.err(
                    field,
                    format!("{} is not a file; point `dockerfile:` at the Dockerfile itself", looked.display()),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.err(
                    field,
                    format!(
                        "{} does not exist; create it or set `dockerfile:` to its path relative to the context {}",
                        looked.display(),
                        context.display()
                    ),
                ))
            }
            Err(e) => {
                return Err(self.err(
                    field,
                    format!("cannot read {} ({e}); fix the path or its permissions", looked.display()),
                ))
            }
        }
        let canonical = looked.canonicalize().map_err(|e| {
            self.err(
                field,
                format!("cannot resolve {} ({e}); fix the path", looked.display()),
            )
        })?;
        match canonical.strip_prefix(context) {
            Ok(inside) => Ok(inside.to_path_buf()),
            Err(_) => Err(self.err(
                field,
                format!(
                    "{} is outside the context {}; the engine only sees files inside the context, so move the Dockerfile in or widen `context:`",
                    looked.display(),
                    context.display()
                ),
            )),
        }
    }
}

const EMPTY_FILE: &str =
    "the file is empty; start it with `version: 1` and an `images:` mapping (see schema/polyarch.schema.json)";

/// Matches one of the allowed spellings exactly; the message lists them all.
fn pick<T: Copy>(s: &str, allowed: &[(&str, T)], what: &str) -> std::result::Result<T, String> {
    allowed
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            format!("{} is not a {what}; use one of {}", q(s), names.join(", "))
        })
}

// ---------------------------------------------------------------------------------------
// Grammar checks (distribution/reference, hand-written: no regex dependency).

/// `[a-z0-9][a-z0-9._-]*`: names are typed on the command line and used in file names.
fn valid_image_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

/// Distribution's tag grammar `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn valid_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// A distribution reference *name* (no tag, no digest); `Err` is the one-line message.
fn check_repository(repo: &str) -> std::result::Result<(), String> {
    const EXAMPLE: &str = "e.g. `registry.example.com/team/app` or `127.0.0.1:5000/demo/hello`";
    if repo.trim().is_empty() {
        return Err(format!(
            "is empty; set it to where the image is pushed, {EXAMPLE}"
        ));
    }
    if repo.contains(char::is_whitespace) {
        return Err(format!(
            "{} contains whitespace; remove it, {EXAMPLE}",
            q(repo)
        ));
    }
    if let Some((scheme, rest)) = repo.split_once("://") {
        return Err(format!(
            "{} starts with a URL scheme (`{scheme}://`); write `repository: {}` (TLS or plain HTTP is worked out per registry)",
            q(repo),
            clip(rest)
        ));
    }
    if let Some((name, digest)) = repo.split_once('@') {
        return Err(format!(
            "{} includes a digest (`@{}`); remove it and write `repository: {}` (polyarch pushes by tag, put tags under `tags:`)",
            q(repo),
            clip(digest),
            clip(name)
        ));
    }
    if repo.len() > 255 {
        return Err(format!(
            "is {} characters long; repository names are at most 255, shorten it",
            repo.len()
        ));
    }
    let comps: Vec<&str> = repo.split('/').collect();
    let first_is_domain = |c: &str| c.contains('.') || c.contains(':') || c == "localhost";
    if comps.len() == 1 && repo.contains(':') && check_domain(repo).is_ok() {
        return Err(format!(
            "{} is only a registry host; add the repository path, e.g. `{}/team/app`",
            q(repo),
            clip(repo)
        ));
    }
    let last = comps[comps.len() - 1];
    if let Some((_, tag)) = last.rsplit_once(':') {
        let without = &repo[..repo.len() - tag.len() - 1];
        return Err(format!(
            "{} includes a tag (`:{}`); write `repository: {}` and put the tag under `tags:`",
            q(repo),
            clip(tag),
            clip(without)
        ));
    }
    let path: &[&str] = if comps.len() > 1 && first_is_domain(comps[0]) {
        check_domain(comps[0]).map_err(|m| format!("registry host {} {m}", q(comps[0])))?;
        &comps[1..]
    } else {
        &comps[..]
    };
    if path
        .iter()
        .any(|c| c.chars().any(|ch| ch.is_ascii_uppercase()))
    {
        let lowered: Vec<String> = path.iter().map(|c| c.to_ascii_lowercase()).collect();
        let fixed = if path.len() < comps.len() {
            format!("{}/{}", comps[0], lowered.join("/"))
        } else {
            lowered.join("/")
        };
        return Err(format!(
            "{} has uppercase letters in its path; repository paths are lowercase, write `{}`",
            q(repo),
            clip(&fixed)
        ));
    }
    for c in path {
        check_path_component(c).map_err(|m| format!("{}: {m}", q(repo)))?;
    }
    Ok(())
}

/// `host[:port]`: a DNS name, IPv4 or `[IPv6]`.
fn check_domain(d: &str) -> std::result::Result<(), String> {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("has `[` without `]`; write IPv6 hosts as `[::1]:5000`".into());
        };
        let ip = &rest[..end];
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "has {} which is not an IPv6 address; fix it, e.g. `[::1]:5000`",
                q(ip)
            ));
        }
        let after = &rest[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (None, Some(p)),
            None if after.is_empty() => (None, None),
            None => return Err("has text after `]`; write `[ADDRESS]:PORT`".into()),
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(host) = host {
        let ok_label = |l: &str| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !host.split('.').all(ok_label) {
            return Err(
                "is not a valid host name; use letters, digits, `-` and `.` (e.g. registry.example.com:5000)"
                    .into(),
            );
        }
    }
    if let Some(port) = port {
        if port.is_empty()
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port.parse::<u16>().is_err()
        {
            return Err(format!(
                "has port {} which is not a number from 0 to 65535; fix it, e.g. `localhost:5000`",
                q(port)
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn check_path_component(c: &str) -> std::result::Result<(), String> {
    if c.is_empty() {
        return Err("has an empty path component (`//`, or a leading or trailing `/`); remove the extra `/`".into());
    }
    if let Some(bad) = c.chars().find(|ch| {
        !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-'))
    }) {
        return Err(format!(
            "{} contains {}; repository paths use lowercase letters, digits and the separators `.`, `_`, `__`, `-`",
            q(c),
            q(&bad.to_string())
        ));
    }
    let alnum = |ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit();
    let bad_sep = || {
        format!(
            "{} has a misplaced separator; components start and end with a letter or digit and separate words with one `.`, one `_`, `__`, or dashes",
            q(c)
        )
    };
    let mut sep = String::new();
    let mut seen_alnum = false;
    for ch in c.chars() {
        if alnum(ch) {
            if !sep.is_empty() {
                let ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|s| s == '-');
                if !ok || !seen_alnum {
                    return Err(bad_sep());
                }
                sep.clear();
            }
            seen_alnum = true;
        } else {
            sep.push(ch);
        }
    }
    if !sep.is_empty() || !seen_alnum {
        return Err(bad_sep());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Message shaping.

enum Seg {
    Key(String),
    Index(usize),
}

fn seg_path(segs: &[Seg]) -> String {
    let mut out = String::new();
    for s in segs {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Turns serde's wording into `problem; fix` for a person editing YAML.
fn humanize(raw: &str, segs: &[Seg], at: &str) -> String {
    if let Some(rest) = raw.strip_prefix("unknown field `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        if expected.is_empty() {
            return format!("unknown field{at}; remove it");
        }
        let suggestion = closest(name, &expected)
            .map(|s| format!(" did you mean {s}?"))
            .unwrap_or_default();
        return format!(
            "unknown field{at};{suggestion} expected one of {}",
            expected.join(", ")
        );
    }
    if let Some(rest) = raw.strip_prefix("invalid type: ") {
        let (found, expected) = rest
            .rsplit_once(", expected ")
            .unwrap_or((rest, "something else"));
        return format!(
            "expected {}, found {}{at}; {}",
            describe_expected(expected),
            describe_found(found),
            hint(segs)
        );
    }
    if raw.starts_with("recursion limit exceeded") {
        return format!(
            "the document is nested too deeply{at}; flatten it to the documented layout"
        );
    }
    if raw.starts_with("repetition limit exceeded") {
        return format!("too many alias expansions{at}; remove the repeated `*alias` references");
    }
    format!("{}{at}; {}", clip_long(raw, 200), hint(segs))
}

fn describe_expected(e: &str) -> String {
    match e {
        "a sequence" => "a list".into(),
        "a map" | "a mapping" => "a mapping".into(),
        "struct RawProject" => "a mapping".into(),
        "struct RawImage" => "a mapping of image settings".into(),
        "struct RawSecret" => "a mapping with file or env".into(),
        "struct RawCache" => "a mapping with from and to".into(),
        "struct RawBuilderMap" => "a mapping with host, tls and fallback".into(),
        "struct RawTls" => "a mapping with ca, cert and key".into(),
        "a string" | "a borrowed string" => "a single value".into(),
        other => other.to_string(),
    }
}

fn describe_found(f: &str) -> String {
    match f {
        "map" => "a mapping".into(),
        "sequence" => "a list".into(),
        "unit value" => "nothing".into(),
        other => clip_long(other, 60),
    }
}

/// What the field should look like, by its position in the document.
fn hint(segs: &[Seg]) -> String {
    let keys: Vec<&str> = segs
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect();
    let field = match keys.as_slice() {
        [] => {
            return format!("write `key: value` lines starting with `version: {SUPPORTED_VERSION}`")
        }
        ["images"] => {
            return "write each image as `NAME:` followed by its indented settings".into()
        }
        ["images", _] => {
            return "give the image its settings as a mapping: repository, tags, context, platforms"
                .into()
        }
        ["images", _, f, ..] => *f,
        [f, ..] => *f,
    };
    let example = match field {
        "repository" => "repository: registry.example.com/team/app",
        "tags" => "tags: [v1, latest]",
        "context" => "context: .",
        "dockerfile" => "dockerfile: Dockerfile",
        "platforms" => "platforms: [linux/amd64, linux/arm64]",
        "build_args" => "build_args: {GREETING: hello}",
        "labels" => "labels: {org.opencontainers.image.source: https://example.org/x}",
        "target" => "target: release",
        "network" => "network: default",
        "binfmt" => "binfmt: auto",
        "secrets" => "secrets: {token: {env: API_TOKEN}, npmrc: {file: ./npmrc}}",
        "ssh" => "ssh: [default]",
        "cache" => "cache: {from: [registry.example.com/app:buildcache], to: registry.example.com/app:buildcache}",
        "pull" => "pull: true",
        "no_cache" => "no_cache: true",
        "reproducible" => "reproducible: true",
        "provenance" => "provenance: true",
        "binfmt_image" => "binfmt_image: tonistiigi/binfmt",
        "builders" => "builders: {linux/arm64: unix:///run/arm-docker.sock}",
        "version" => "version: 1",
        _ => return "see schema/polyarch.schema.json for the expected layout".into(),
    };
    format!("write it like `{example}`")
}

/// A near-miss spelling (edit distance ≤ 2, or ≤ a third of the word).
fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .iter()
        .map(|c| (levenshtein(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(64).collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A shallow look at a YAML value: enough to check `version` before anything else, and
/// accepting every well-formed document (unlike `Value`, which rejects huge integers).
enum Shallow {
    Null,
    Bool(bool),
    /// Integer as decimal text, so any width compares exactly.
    Int(String),
    Float(f64),
    Str(String),
    List,
    /// A mapping, with its `version` entry when looked at the top level.
    Map(Option<Box<Shallow>>),
    Tagged,
}

impl Shallow {
    fn deserialize_top<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Shallow, D::Error> {
        serde::de::DeserializeSeed::deserialize(ShallowSeed { top: true }, d)
    }

    fn describe(&self) -> String {
        match self {
            Shallow::Null => "nothing".into(),
            Shallow::Bool(b) => format!("the boolean {b}"),
            Shallow::Int(n) => format!("the number {}", clip(n)),
            Shallow::Float(f) => format!("the number {f}"),
            Shallow::Str(s) => format!("the string {}", q(s)),
            Shallow::List => "a list".into(),
            Shallow::Map(_) => "a mapping".into(),
            Shallow::Tagged => "a tagged value".into(),
        }
    }
}

#[derive(Clone, Copy)]
struct ShallowSeed {
    top: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for ShallowSeed {
    type Value = Shallow;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Shallow, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ShallowSeed {
    type Value = Shallow;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_i128<E>(self, v: i128) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_u128<E>(self, v: u128) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Str(v.to_string()))
    }
    fn visit_unit<E>(self) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Shallow, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Shallow, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Shallow::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Shallow, A::Error> {
        let mut version = None;
        while let Some(key) = map.next_key_seed(ShallowSeed { top: false })? {
            match key {
                Shallow::Str(k) if self.top && k == "version" => {
                    version = Some(Box::new(map.next_value_seed(ShallowSeed { top: false })?));
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Shallow::Map(version))
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(
        self,
        data: A,
    ) -> std::result::Result<Shallow, A::Error> {
        use serde::de::VariantAccess;
        let (_, variant) = data.variant::<serde::de::IgnoredAny>()?;
        variant.newtype_variant::<serde::de::IgnoredAny>()?;
        Ok(Shallow::Tagged)
    }
}

/// Drops serde_norway's ` at line N column M` / ` at position N` (we report them our way).
fn strip_marks(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(" at ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 4..];
        let skip = mark_len(after);
        if skip == 0 {
            out.push_str(" at ");
            rest = after;
        } else {
            rest = &after[skip..];
        }
    }
    out.push_str(rest);
    out
}

/// Length of a leading `line N column M` or `position N`, else 0.
fn mark_len(s: &str) -> usize {
    fn digits(s: &str) -> usize {
        s.bytes().take_while(u8::is_ascii_digit).count()
    }
    if let Some(r) = s.strip_prefix("line ") {
        let n = digits(r);
        if n > 0 {
            if let Some(r2) = r[n..].strip_prefix(" column ") {
                let m = digits(r2);
                if m > 0 {
                    return 5 + n + 8 + m;
                }
            }
        }
    } else if let Some(r) = s.strip_prefix("position ") {
        let n = digits(r);
        if n > 0 {
            return 9 + n;
        }
    }
    0
}

/// Quotes user text for a message: escaped so it stays on one line, and clipped.
fn q(s: &str) -> String {
    format!("`{}`", clip(s))
}

fn clip(s: &str) -> String {
    clip_long(s, 80)
}

fn clip_long(s: &str, max: usize) -> String {
    let escaped: String = s
        .chars()
        .flat_map(|c| {
            let e: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            e
        })
        .collect();
    if escaped.chars().count() > max {
        let head: String = escaped.chars().take(max).collect();
        format!("{head}…")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use tempfile::TempDir;

    /// A project directory with a Dockerfile, a sub-context and a plain file.
    fn fixture() -> TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        fs::create_dir(dir.path().join("app")).unwrap();
        fs::write(
            dir.path().join("app/Dockerfile.release"),
            "FROM scratch AS release\n",
        )
        .unwrap();
        fs::create_dir(dir.path().join("app/Dockerfile.d")).unwrap();
        fs::write(dir.path().join("notadir"), "x").unwrap();
        dir
    }

    fn parse_in(dir: &TempDir, text: &str) -> Result<Project> {
        Project::parse(
            &dir.path().join("polyarch.yaml"),
            text,
            &LoadOptions::default(),
        )
    }

    /// A minimal valid image with `extra` lines appended to its settings.
    fn with_image(extra: &str) -> String {
        format!(
            "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:5000/demo/hello\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n{extra}"
        )
    }

    /// Replaces one line (`key: ...`) of the minimal image.
    fn replacing(key: &str, line: &str) -> String {
        with_image("")
            .lines()
            .map(|l| {
                if l.trim_start().starts_with(&format!("{key}:")) {
                    line.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }

    fn project_err(r: Result<Project>) -> (String, String, String) {
        match r {
            Err(e @ Error::Project { .. }) => {
                let shown = e.to_string();
                let Error::Project { field, message, .. } = e else {
                    unreachable!()
                };
                assert!(
                    !shown.contains('\n') && !shown.contains('\r'),
                    "multi-line: {shown:?}"
                );
                (field, message, shown)
            }
            Err(other) => panic!("not a project error: {other}"),
            Ok(_) => panic!("parsed"),
        }
    }

    /// Asserts the failure is at `field` and the message mentions `needle` (the fix).
    fn expect(dir: &TempDir, text: &str, field: &str, needle: &str) -> String {
        let (f, m, shown) = project_err(parse_in(dir, text));
        assert_eq!(f, field, "wrong field for {text:?}: {shown}");
        assert!(m.contains(needle), "message lacks {needle:?}: {shown}");
        assert!(
            m.contains(';') || m.contains("e.g.") || m.contains("use "),
            "no fix: {shown}"
        );
        shown
    }

    const FULL: &str = r#"
version: 1
binfmt: require
binfmt_image: tonistiigi/binfmt:qemu-v8
builders:
  linux/arm64/v8: unix:///run/arm-docker.sock
  linux/arm/v7: tcp://pi.local:2375
images:
  zeta:
    repository: 127.0.0.1:5000/demo/hello
    tags: [v1, latest, "1.10"]
    context: app
    dockerfile: Dockerfile.release
    platforms: [linux/amd64, linux/aarch64, linux/arm/v7]
    build_args: {GREETING: hello, COUNT: 3, DEBUG: true, VERSION: 1.10}
    target: release
    labels: {org.opencontainers.image.source: https://example.org/x}
    network: host
    binfmt: never
  alpha:
    repository: docker.io/library/alpha
    tags: [edge]
    context: .
    platforms: [linux/amd64]
"#;

    #[test]
    fn full_valid_file() {
        let dir = fixture();
        let p = parse_in(&dir, FULL).unwrap();
        assert_eq!(p.binfmt, BinfmtMode::Require);
        assert_eq!(p.binfmt_image.as_deref(), Some("tonistiigi/binfmt:qemu-v8"));
        assert_eq!(p.builders.len(), 2);
        assert_eq!(
            p.builders
                .get(&"linux/arm64".parse().unwrap())
                .map(|b| b[0].host.as_str()),
            Some("unix:///run/arm-docker.sock")
        );
        let names: Vec<&str> = p.images.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["zeta", "alpha"], "declaration order kept");
        let z = p.image("zeta").unwrap();
        assert_eq!(z.repository, "127.0.0.1:5000/demo/hello");
        assert_eq!(z.tags, ["v1", "latest", "1.10"]);
        assert_eq!(z.context, dir.path().join("app").canonicalize().unwrap());
        assert!(z.context.is_absolute());
        assert_eq!(z.dockerfile, PathBuf::from("Dockerfile.release"));
        let plats: Vec<String> = z.platforms.iter().map(ToString::to_string).collect();
        assert_eq!(plats, ["linux/amd64", "linux/arm64", "linux/arm/v7"]);
        assert_eq!(z.build_args["GREETING"], "hello");
        assert_eq!(z.build_args["COUNT"], "3");
        assert_eq!(z.build_args["DEBUG"], "true");
        assert_eq!(z.build_args["VERSION"], "1.10", "scalars kept as written");
        assert_eq!(z.target.as_deref(), Some("release"));
        assert_eq!(
            z.labels["org.opencontainers.image.source"],
            "https://example.org/x"
        );
        assert_eq!(z.network, Network::Host);
        assert_eq!(z.binfmt, Some(BinfmtMode::Never));
        assert_eq!(z.binfmt_mode(p.binfmt), BinfmtMode::Never);
        let a = p.image("alpha").unwrap();
        assert_eq!(a.binfmt_mode(p.binfmt), BinfmtMode::Require);
    }

    #[test]
    fn defaults() {
        let dir = fixture();
        let p = parse_in(&dir, &with_image("")).unwrap();
        assert_eq!(p.binfmt, BinfmtMode::Auto);
        assert!(p.binfmt_image.is_none());
        assert!(p.builders.is_empty());
        let i = &p.images[0];
        assert_eq!(i.dockerfile, PathBuf::from("Dockerfile"));
        assert_eq!(i.network, Network::Default);
        assert_eq!(i.binfmt, None);
        assert!(i.target.is_none() && i.build_args.is_empty() && i.labels.is_empty());
        assert_eq!(i.context, dir.path().canonicalize().unwrap());
    }

    #[test]
    fn load_reads_file_and_reports_missing() {
        let dir = fixture();
        let file = dir.path().join("polyarch.yaml");
        fs::write(&file, with_image("")).unwrap();
        assert_eq!(
            Project::load(&file, &LoadOptions::default())
                .unwrap()
                .images
                .len(),
            1
        );

        let missing = dir.path().join("nope.yaml");
        let (f, m, shown) = project_err(Project::load(&missing, &LoadOptions::default()));
        assert_eq!(f, "");
        assert!(m.contains("-f FILE"), "{shown}");
        assert!(shown.contains("nope.yaml"), "{shown}");

        let (_, m, _) = project_err(Project::load(dir.path(), &LoadOptions::default()));
        assert!(m.contains("is a directory"), "{m}");

        let bin = dir.path().join("bin.yaml");
        fs::write(&bin, [0xff, 0xfe, 0x00, b'a']).unwrap();
        let (_, m, _) = project_err(Project::load(&bin, &LoadOptions::default()));
        assert!(m.contains("UTF-8"), "{m}");
    }

    #[test]
    fn relative_project_file_uses_current_directory() {
        // No parent directory: contexts resolve against `.`; a missing one names it.
        let (f, m, _) = project_err(Project::parse(
            Path::new("polyarch.yaml"),
            &replacing("context", "    context: definitely-not-here-xyz"),
            &LoadOptions::default(),
        ));
        assert_eq!(f, "images.hello.context");
        assert!(
            m.contains("definitely-not-here-xyz") && m.contains("create it"),
            "{m}"
        );
    }

    #[test]
    fn version_errors() {
        let d = fixture();
        let body = "images:\n  hello:\n    repository: x/y\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n";
        expect(&d, body, "version", "add `version: 1`");
        let s = expect(
            &d,
            &format!("version: 2\n{body}"),
            "version",
            "reads version 1",
        );
        assert!(s.contains("unsupported version 2"), "{s}");
        expect(
            &d,
            &format!("version: \"1\"\n{body}"),
            "version",
            "without quotes",
        );
        expect(
            &d,
            &format!("version: 1e999\n{body}"),
            "version",
            "write `version: 1`",
        );
        expect(
            &d,
            &format!("version: 99999999999999999999999999999999\n{body}"),
            "version",
            "reads version 1",
        );
        expect(
            &d,
            &format!("version: -1\n{body}"),
            "version",
            "reads version 1",
        );
        expect(
            &d,
            &format!("version: [1]\n{body}"),
            "version",
            "write `version: 1`",
        );
        // An unsupported version wins over version-1 field errors.
        expect(
            &d,
            "version: 2\nfuture_key: 1\n",
            "version",
            "newer polyarch",
        );
        // 1.0 is the number one.
        assert!(parse_in(&d, &with_image("").replace("version: 1", "version: 1.0")).is_ok());
    }

    #[test]
    fn images_errors() {
        let d = fixture();
        expect(&d, "version: 1\n", "images", "add at least one");
        expect(&d, "version: 1\nimages: {}\n", "images", "add at least one");
        expect(&d, "version: 1\nimages:\n", "images", "add at least one");
        expect(&d, "version: 1\nimages: [a, b]\n", "images", "NAME:");
        let s = expect(
            &d,
            &with_image("").replace("hello:", "Hello:"),
            "images.Hello",
            "e.g. `hello`",
        );
        assert!(s.contains("not a valid image name"), "{s}");
        expect(
            &d,
            &with_image("").replace("hello:", "-x:"),
            "images.-x",
            "lowercase letters",
        );
        expect(
            &d,
            "version: 1\nimages:\n  hello: 5\n",
            "images.hello",
            "repository, tags",
        );
        expect(
            &d,
            "version: 1\nimages:\n  hello:\n",
            "images.hello.repository",
            "missing; add it",
        );
        expect(
            &d,
            &format!("{}  hello:\n    tags: [v2]\n", with_image("")),
            "images.hello",
            "names must be unique",
        );
        // A key repeated inside an image is serde's duplicate-field error, at that key.
        let (f, m, _) = project_err(parse_in(&d, &with_image("    tags: [v2]\n")));
        assert_eq!(f, "images.hello.tags");
        assert!(m.contains("given twice") && m.contains("keep one"), "{m}");
    }

    #[test]
    fn platform_errors() {
        let d = fixture();
        let s = expect(
            &d,
            &replacing("platforms", "    platforms: [linux/amd64, plan10/amd64]"),
            "images.hello.platforms[1]",
            "e.g. linux/amd64",
        );
        assert!(s.contains("plan10"), "{s}");
        let s = expect(
            &d,
            &replacing(
                "platforms",
                "    platforms: [linux/arm64, linux/amd64, linux/arm64/v8]",
            ),
            "images.hello.platforms[2]",
            "remove one",
        );
        assert!(
            s.contains("platforms[0]") && s.contains("`linux/arm64`"),
            "{s}"
        );
        expect(
            &d,
            &replacing("platforms", "    platforms: []"),
            "images.hello.platforms",
            "at least one",
        );
        expect(
            &d,
            &replacing("platforms", ""),
            "images.hello.platforms",
            "platforms: [linux/amd64",
        );
        expect(
            &d,
            &replacing("platforms", "    platforms: linux/amd64"),
            "images.hello.platforms",
            "platforms: [linux/amd64",
        );
        expect(
            &d,
            &replacing("platforms", "    platforms: [[linux/amd64]]"),
            "images.hello.platforms[0]",
            "expected a single value",
        );
    }

    #[test]
    fn tag_errors() {
        let d = fixture();
        expect(
            &d,
            &replacing("tags", "    tags: [v1, \"v 2\"]"),
            "images.hello.tags[1]",
            "not a valid tag",
        );
        expect(
            &d,
            &replacing("tags", "    tags: [.hidden]"),
            "images.hello.tags[0]",
            "not starting with",
        );
        expect(
            &d,
            &replacing("tags", "    tags: [-x]"),
            "images.hello.tags[0]",
            "not starting with",
        );
        let long = "a".repeat(129);
        expect(
            &d,
            &replacing("tags", &format!("    tags: [{long}]")),
            "images.hello.tags[0]",
            "1 to 128",
        );
        assert!(parse_in(
            &d,
            &replacing("tags", &format!("    tags: [{}]", "a".repeat(128)))
        )
        .is_ok());
        let s = expect(
            &d,
            &replacing("tags", "    tags: [v1, latest, v1]"),
            "images.hello.tags[2]",
            "remove the duplicate",
        );
        assert!(s.contains("tags[0]"), "{s}");
        expect(
            &d,
            &replacing("tags", "    tags: []"),
            "images.hello.tags",
            "at least one tag",
        );
        expect(
            &d,
            &replacing("tags", ""),
            "images.hello.tags",
            "tags: [v1, latest]",
        );
        expect(
            &d,
            &replacing("tags", "    tags: v1"),
            "images.hello.tags",
            "tags: [v1, latest]",
        );
        assert!(parse_in(&d, &replacing("tags", "    tags: [_x, V1.2-rc_3, 2]")).is_ok());
    }

    #[test]
    fn repository_errors() {
        let d = fixture();
        let f = "images.hello.repository";
        let repo = |r: &str| replacing("repository", &format!("    repository: {r}"));
        expect(
            &d,
            &repo("127.0.0.1:5000/Demo/hello"),
            f,
            "write `127.0.0.1:5000/demo/hello`",
        );
        let s = expect(
            &d,
            &repo("127.0.0.1:5000/demo/hello:v1"),
            f,
            "put the tag under `tags:`",
        );
        assert!(s.contains("`repository: 127.0.0.1:5000/demo/hello`"), "{s}");
        expect(&d, &repo("hello:v1"), f, "under `tags:`");
        expect(
            &d,
            &repo("demo/hello@sha256:0123abcd"),
            f,
            "put tags under `tags:`",
        );
        expect(&d, &repo("\"\""), f, "set it to where the image is pushed");
        expect(&d, &replacing("repository", ""), f, "missing; add it");
        expect(&d, &repo("127.0.0.1:5000"), f, "only a registry host");
        expect(&d, &repo("\"[::1]:5000\""), f, "only a registry host");
        expect(&d, &repo("localhost:99999/x"), f, "0 to 65535");
        expect(&d, &repo("localhost:5000//x"), f, "empty path component");
        expect(&d, &repo("demo/"), f, "empty path component");
        expect(&d, &repo("demo/he!lo"), f, "contains `!`");
        expect(&d, &repo("demo/-hello"), f, "misplaced separator");
        expect(&d, &repo("demo/hel..lo"), f, "misplaced separator");
        expect(&d, &repo("demo/hel___lo"), f, "misplaced separator");
        expect(
            &d,
            &repo("bad_host.example.com/x"),
            f,
            "not a valid host name",
        );
        expect(&d, &repo("\"[zz::1]:5000/x\""), f, "not an IPv6 address");
        expect(
            &d,
            &repo(&format!("x/{}", "a".repeat(260))),
            f,
            "at most 255",
        );
        expect(&d, &repo("[a, b]"), f, "repository: registry.example.com");
    }

    #[test]
    fn repository_grammar() {
        for ok in [
            "hello",
            "library/hello",
            "demo/hello",
            "localhost/x",
            "localhost:5000/x",
            "127.0.0.1:5000/demo/hello",
            "[::1]:5000/demo/hello",
            "[::1]/x",
            "registry.example.com/team/app",
            "ghcr.io/a_b/c__d/e---f/g.h",
            "example.com",
            "Registry.Example.com:443/app",
        ] {
            assert_eq!(check_repository(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "a//b",
            "/a",
            "a/",
            "A/b",
            "a/b:c",
            "a@sha256:00",
            "a/_b",
            "a/b_",
            "a/b-",
            "a/b.-c",
            "host:/x",
            "[::1/x",
            "[::1]x/y",
            "ex ample/x",
            "é/x",
        ] {
            assert!(check_repository(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn context_and_dockerfile_errors() {
        let d = fixture();
        let ctx = |c: &str| replacing("context", &format!("    context: {c}"));
        let s = expect(
            &d,
            &ctx("missing-dir"),
            "images.hello.context",
            "create it or fix the path",
        );
        assert!(s.contains("missing-dir"), "{s}");
        expect(
            &d,
            &ctx("notadir"),
            "images.hello.context",
            "not a directory",
        );
        expect(&d, &ctx("\"\""), "images.hello.context", "context: .");
        expect(
            &d,
            &replacing("context", ""),
            "images.hello.context",
            "missing; add it",
        );

        let s = expect(
            &d,
            &with_image("    dockerfile: Nope.Dockerfile\n"),
            "images.hello.dockerfile",
            "create it or set `dockerfile:`",
        );
        assert!(
            s.contains("Nope.Dockerfile")
                && s.contains(&d.path().canonicalize().unwrap().display().to_string()),
            "{s}"
        );
        // Default Dockerfile missing in the context: still names the field and path.
        let s = expect(&d, &ctx("app"), "images.hello.dockerfile", "does not exist");
        assert!(s.contains("app/Dockerfile"), "{s}");
        expect(
            &d,
            &with_image("    dockerfile: app/Dockerfile.d\n"),
            "images.hello.dockerfile",
            "not a file",
        );
        expect(
            &d,
            &with_image("    dockerfile: /etc/hostname\n"),
            "images.hello.dockerfile",
            "relative to the context",
        );
        let outside = replacing("context", "    context: app") + "    dockerfile: ../Dockerfile\n";
        expect(
            &d,
            &outside,
            "images.hello.dockerfile",
            "outside the context",
        );
        expect(
            &d,
            &with_image("    dockerfile: \"\"\n"),
            "images.hello.dockerfile",
            "remove the key",
        );
        let ok = parse_in(
            &d,
            &with_image("    dockerfile: ./app/Dockerfile.release\n"),
        )
        .unwrap();
        assert_eq!(
            ok.images[0].dockerfile,
            PathBuf::from("app/Dockerfile.release")
        );
    }

    #[test]
    fn enum_errors() {
        let d = fixture();
        let s = expect(
            &d,
            &with_image("    network: bridge\n"),
            "images.hello.network",
            "default, host, none",
        );
        assert!(s.contains("`bridge`"), "{s}");
        expect(
            &d,
            &with_image("    binfmt: sometimes\n"),
            "images.hello.binfmt",
            "auto, never, require",
        );
        expect(
            &d,
            &format!("binfmt: Auto\n{}", with_image("")),
            "binfmt",
            "auto, never, require",
        );
        expect(
            &d,
            &with_image("    network: {a: b}\n"),
            "images.hello.network",
            "network: default",
        );
        expect(
            &d,
            &format!("binfmt_image: \"\"\n{}", with_image("")),
            "binfmt_image",
            "tonistiigi/binfmt",
        );
        expect(
            &d,
            &with_image("    target: \"\"\n"),
            "images.hello.target",
            "remove `target:`",
        );
        expect(
            &d,
            &with_image("    build_args: {\"A=B\": x}\n"),
            "images.hello.build_args.A=B",
            "without `=`",
        );
        expect(
            &d,
            &with_image("    build_args: [A]\n"),
            "images.hello.build_args",
            "GREETING: hello",
        );
        expect(
            &d,
            &with_image("    labels: {\"\": x}\n"),
            "images.hello.labels.",
            "org.opencontainers",
        );
    }

    #[test]
    fn builder_errors() {
        let d = fixture();
        let b = |lines: &str| format!("builders:\n{lines}{}", with_image(""));
        let s = expect(
            &d,
            &b("  plan10/arm64: unix:///x\n"),
            "builders.plan10/arm64",
            "e.g. linux/amd64",
        );
        assert!(s.contains("unknown operating system"), "{s}");
        let s = expect(
            &d,
            &b("  linux/arm64: unix:///a\n  linux/arm64/v8: unix:///b\n"),
            "builders.linux/arm64/v8",
            "keep one",
        );
        assert!(s.contains("builders.linux/arm64 "), "{s}");
        expect(
            &d,
            &b("  linux/arm64: \"\"\n"),
            "builders.linux/arm64",
            "docker context name",
        );
        expect(
            &d,
            &b("  linux/arm64: 5\n"),
            "builders.linux/arm64",
            "builders: {linux/arm64",
        );
        expect(
            &d,
            "version: 1\nbuilders: x\n",
            "builders",
            "builders: {linux/arm64",
        );
    }

    #[test]
    fn builders_take_every_endpoint_form() {
        let d = fixture();
        fs::create_dir(d.path().join("certs")).unwrap();
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            fs::write(d.path().join("certs").join(f), "").unwrap();
        }
        let text = format!(
            "builders:\n  linux/arm64: ssh://ci@arm-box:2222\n  linux/arm/v7: {{host: tcp://10.0.0.7:2376, tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}\n  linux/riscv64: riscv-ctx\n{}",
            with_image("")
        );
        let p = parse_in(&d, &text).unwrap();
        let get = |platform: &str| p.builders[&platform.parse::<Platform>().unwrap()][0].clone();
        assert_eq!(get("linux/arm64").host, "ssh://ci@arm-box:2222");
        assert!(get("linux/arm64").tls.is_none());
        let tls = get("linux/arm/v7").tls.unwrap();
        assert_eq!(
            tls.ca,
            Some(d.path().join("certs/ca.pem")),
            "relative to the file"
        );
        assert_eq!(tls.key, Some(d.path().join("certs/key.pem")));
        assert_eq!(get("linux/riscv64").to_string(), "riscv-ctx");
        assert_eq!(get("linux/arm64").fallback, Fallback::None);
        let text = format!(
            "builders:\n  linux/arm64: {{host: ssh://arm-box, fallback: emulate}}\n{}",
            with_image("")
        );
        let p = parse_in(&d, &text).unwrap();
        assert_eq!(
            p.builders[&"linux/arm64".parse::<Platform>().unwrap()][0].fallback,
            Fallback::Emulate
        );
        let text = format!(
            "builders:\n  linux/arm64: [ssh://a, {{host: ssh://b, fallback: emulate}}]\n{}",
            with_image("")
        );
        let p = parse_in(&d, &text).unwrap();
        let list = &p.builders[&"linux/arm64".parse::<Platform>().unwrap()];
        let hosts: Vec<&str> = list.iter().map(|b| b.host.as_str()).collect();
        assert_eq!(hosts, ["ssh://a", "ssh://b"]);
    }

    #[test]
    fn builder_map_errors() {
        let d = fixture();
        let b = |line: &str| format!("builders:\n  linux/arm64: {line}\n{}", with_image(""));
        expect(
            &d,
            &b("{tls: {ca: ca.pem}}"),
            "builders.linux/arm64.host",
            "host: tcp://",
        );
        expect(
            &d,
            &b("ftp://arm-box"),
            "builders.linux/arm64",
            "unsupported scheme",
        );
        expect(
            &d,
            &b("{host: \"tcp://h:port\"}"),
            "builders.linux/arm64.host",
            "port is not a number",
        );
        expect(
            &d,
            &b("{host: \"ssh://arm-box\", tls: {ca: ca.pem}}"),
            "builders.linux/arm64.tls",
            "tcp:// hosts only",
        );
        expect(
            &d,
            &b("{host: \"tcp://h:2376\", tls: {ca: missing.pem}}"),
            "builders.linux/arm64.tls.ca",
            "does not exist",
        );
        fs::write(d.path().join("cert.pem"), "").unwrap();
        expect(
            &d,
            &b("{host: \"tcp://h:2376\", tls: {cert: cert.pem}}"),
            "builders.linux/arm64.tls",
            "no key",
        );
        expect(
            &d,
            &b("{host: \"tcp://h:2376\", tls: {}}"),
            "builders.linux/arm64.tls",
            "give ca",
        );
        expect(&d, &b("[]"), "builders.linux/arm64", "empty list");
        expect(
            &d,
            &b("[ssh://a, {host: \"ftp://b\"}]"),
            "builders.linux/arm64[1].host",
            "unsupported scheme",
        );
        expect(&d, &b("[[ssh://a]]"), "builders.linux/arm64[0]", "one list");
        expect(
            &d,
            &b("{host: \"tcp://h:2376\", fallback: qemu}"),
            "builders.linux/arm64.fallback",
            "use one of none, emulate",
        );
        let s = expect(
            &d,
            &b("{host: \"tcp://h:2376\", tsl: {}}"),
            "builders.linux/arm64.tsl",
            "did you mean tls?",
        );
        assert!(s.contains("host, tls"), "{s}");
    }

    #[test]
    fn unknown_fields() {
        let d = fixture();
        let s = expect(
            &d,
            &with_image("    platfroms: [linux/arm64]\n"),
            "images.hello.platfroms",
            "did you mean platforms?",
        );
        assert!(
            s.contains("unknown field") && s.contains("expected one of repository, tags, context"),
            "{s}"
        );
        assert!(!s.contains('`') || s.contains("did you mean"), "{s}");
        let s = expect(
            &d,
            &format!("imagez: {{}}\n{}", with_image("")),
            "imagez",
            "did you mean images?",
        );
        assert!(s.contains("expected one of version, binfmt"), "{s}");
        expect(
            &d,
            &with_image("    zzzzzz: 1\n"),
            "images.hello.zzzzzz",
            "expected one of",
        );
    }

    #[test]
    fn yaml_syntax_error_names_line_and_column() {
        let d = fixture();
        let text = "version: 1\nimages:\n  hello:\n    tags: [v1\n    context: .\n";
        let (f, m, shown) = project_err(parse_in(&d, text));
        assert_eq!(f, "");
        assert!(m.starts_with("YAML syntax error at line "), "{shown}");
        assert!(m.contains(", column "), "{shown}");
        assert!(m.contains("fix the"), "{shown}");
        let (_, m, _) = project_err(parse_in(&d, "version: 1\n images: x\n  - y\n"));
        assert!(m.contains("line 2") || m.contains("line 3"), "{m}");
    }

    #[test]
    fn type_error_reports_location() {
        let d = fixture();
        let (f, m, _) = project_err(parse_in(&d, &replacing("tags", "    tags: {a: b}")));
        assert_eq!(f, "images.hello.tags");
        assert!(
            m.starts_with("expected a list, found a mapping (line 5, column"),
            "{m}"
        );
    }

    #[test]
    fn garbage_never_panics() {
        let d = fixture();
        let deep_seq = "[".repeat(5000);
        let deep_map = "a: {".repeat(2000);
        let bomb = "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nversion: 1\n";
        let mut inputs: Vec<String> = [
            "",
            " ",
            "\n\n",
            "# only a comment\n",
            "---",
            "---\n...\n",
            "~",
            "null",
            "[1, 2]",
            "just a string",
            "42",
            "{",
            "}",
            "[",
            "\"",
            "'",
            ":",
            "- - -",
            "? [a]\n: b\n",
            "\0\u{1}\u{7f}",
            "\u{feff}version: 1",
            "version: 1\n---\nversion: 1\n",
            "version: 1\nimages: !!binary aGVsbG8=\n",
            "version: !!str 1\n",
            "version: 1\nimages: *nope\n",
            "version: 1\n<<: {images: {}}\n",
            "version: 1\nimages:\n  ? [a, b]\n  : {}\n",
            "version: 1\nimages:\n  hello: {tags: 99999999999999999999999999999999999}\n",
            "version: 1\nimages:\n  hello: {platforms: [1e999, -0, .nan]}\n",
            "version: 0x1\n",
            "version: .inf\n",
            "version: 18446744073709551617\n",
            "version: -9223372036854775809\n",
            "version: 1\nimages: {a: {b: {c: {d: e}}}}\n",
            "\tversion: 1",
            "version: 1\nimages:\n\thello: {}\n",
            "!!map {version: 1}",
            "%YAML 1.2\n---\nversion: 1\n",
            "%TAG ! tag:x,2000:\n--- !foo\nversion: 1\n",
            "version: 1\nimages: {\"\\n\": {}}\n",
            "version: 1\nimages: {\"a\\nb\": {repository: \"x\\ny\"}}\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        inputs.push(deep_seq);
        inputs.push(deep_map);
        inputs.push(bomb.to_string());
        inputs.push(format!(
            "version: 1\nimages:\n  hello:\n    tags: [{}]\n",
            "9".repeat(100_000)
        ));
        // Every truncation of a valid document.
        let full = FULL.to_string();
        let mut cut: Vec<String> = full
            .char_indices()
            .map(|(i, _)| full[..i].to_string())
            .collect();
        inputs.append(&mut cut);
        for input in inputs {
            match parse_in(&d, &input) {
                Ok(_) => {}
                Err(e) => {
                    let s = e.to_string();
                    assert!(
                        !s.contains('\n') && !s.contains('\r'),
                        "multi-line for {input:?}: {s:?}"
                    );
                    assert!(matches!(e, Error::Project { .. }), "{s}");
                }
            }
        }
    }

    #[test]
    fn empty_and_non_mapping_documents() {
        let d = fixture();
        for empty in ["", "  \n", "# c\n", "---\n", "~\n"] {
            let (f, m, _) = project_err(parse_in(&d, empty));
            assert_eq!(f, "");
            assert!(
                m.contains("the file is empty") && m.contains("version: 1"),
                "{empty:?}: {m}"
            );
        }
        for (doc, what) in [
            ("[1, 2]", "a list"),
            ("hello", "the string `hello`"),
            ("7", "the number 7"),
        ] {
            let (f, m, _) = project_err(parse_in(&d, doc));
            assert_eq!(f, "");
            assert!(
                m.contains(what) && m.contains("not a mapping") && m.contains("version: 1"),
                "{m}"
            );
        }
    }

    #[test]
    fn messages_stay_on_one_line_with_hostile_values() {
        let d = fixture();
        let (_, m, _) = project_err(parse_in(&d, &replacing("tags", "    tags: [\"a\\nb\"]")));
        assert!(m.contains("a\\nb"), "{m}");
        let (f, _, _) = project_err(parse_in(&d, "version: 1\nimages: {\"a\\nb\": {}}\n"));
        assert!(!f.contains('\n'));
    }

    fn schema() -> serde_json::Value {
        serde_json::from_str(SCHEMA_JSON).expect("schema/polyarch.schema.json is JSON")
    }

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    fn sorted(fields: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn schema_matches_parser() {
        let s = schema();
        assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
        assert_eq!(keys(&s["properties"]), sorted(PROJECT_FIELDS));
        assert_eq!(
            keys(&s["$defs"]["image"]["properties"]),
            sorted(IMAGE_FIELDS)
        );
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["$defs"]["image"]["additionalProperties"], false);
        assert_eq!(s["properties"]["version"]["const"], SUPPORTED_VERSION);
        let enum_of = |v: &serde_json::Value| -> Vec<String> {
            v["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(enum_of(&s["$defs"]["binfmt"]), ["auto", "never", "require"]);
        assert_eq!(enum_of(&s["$defs"]["network"]), ["default", "host", "none"]);
        let mut req: Vec<&str> = s["$defs"]["image"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        req.sort();
        assert_eq!(req, ["context", "platforms", "repository", "tags"]);
    }

    /// The lists the parser's serde derive actually accepts, read back from its own
    /// unknown-field message, equal the published constants (and so the schema).
    #[test]
    fn field_lists_match_serde() {
        let d = fixture();
        let listed = |text: &str| -> Vec<String> {
            let (_, m, _) = project_err(parse_in(&d, text));
            let list = m.split("expected one of ").nth(1).unwrap();
            let mut v: Vec<String> = list.split(", ").map(str::to_string).collect();
            v.sort();
            v
        };
        assert_eq!(
            listed(&with_image("    qqqqqqqq: 1\n")),
            sorted(IMAGE_FIELDS)
        );
        assert_eq!(
            listed(&format!("qqqqqqqq: 1\n{}", with_image(""))),
            sorted(PROJECT_FIELDS)
        );
    }

    #[test]
    fn secrets_ssh_cache_pull_and_no_cache_are_read() {
        let d = fixture();
        let project = parse_in(
            &d,
            &with_image(
                "    secrets: {npmrc: {file: conf/npmrc}, token: {env: API_TOKEN}}\n    ssh: [default, work=run/agent.sock]\n    cache: {from: [127.0.0.1:5000/demo/hello:cache, other], to: 127.0.0.1:5000/demo/hello:cache}\n    pull: true\n    no_cache: false\n",
            ),
        )
        .unwrap();
        let image = &project.images[0];
        assert_eq!(
            image.secrets["npmrc"].source,
            SecretSource::File(d.path().join("conf/npmrc"))
        );
        assert_eq!(
            image.secrets["npmrc"].origin,
            Origin::Field("images.hello.secrets.npmrc.file".into())
        );
        assert_eq!(
            image.secrets["token"].source,
            SecretSource::Env("API_TOKEN".into())
        );
        assert_eq!(image.ssh["default"].socket, AgentSocket::FromEnv);
        assert_eq!(
            image.ssh["work"].socket,
            AgentSocket::Path(d.path().join("run/agent.sock"))
        );
        let arm64: Platform = "linux/arm64".parse().unwrap();
        let armv7: Platform = "linux/arm/v7".parse().unwrap();
        assert_eq!(
            image.cache_to.as_ref().unwrap().for_platform(&arm64),
            "127.0.0.1:5000/demo/hello:cache-linux-arm64"
        );
        assert_eq!(
            image.cache_from[1].for_platform(&armv7),
            "docker.io/library/other:latest-linux-arm-v7"
        );
        assert!(image.pull);
        assert!(!image.no_cache);
        let plain = parse_in(&d, &with_image("")).unwrap();
        assert!(plain.images[0].secrets.is_empty() && plain.images[0].cache_to.is_none());
    }

    #[test]
    fn secrets_ssh_cache_mistakes_name_the_field() {
        let d = fixture();
        let cases: &[(&str, &str, &str)] = &[
            ("    secrets: {a: {file: x, env: Y}}\n", "images.hello.secrets.a", "both file and env"),
            ("    secrets: {a: {}}\n", "images.hello.secrets.a", "neither file nor env"),
            ("    secrets: {a: {fil: x}}\n", "images.hello.secrets.a.fil", "did you mean file?"),
            ("    secrets: {a: {env: \"A B\"}}\n", "images.hello.secrets.a.env", "not an environment variable name"),
            ("    secrets: {a: {file: \"\"}}\n", "images.hello.secrets.a.file", "is empty"),
            ("    secrets: {\"a,b\": {env: X}}\n", "images.hello.secrets.a,b", "not a secret id"),
            ("    secrets: [a]\n", "images.hello.secrets", "expected a mapping"),
            ("    ssh: default\n", "images.hello.ssh", "expected a list"),
            ("    ssh: [default, default]\n", "images.hello.ssh[1]", "again"),
            ("    ssh: [\"x=\"]\n", "images.hello.ssh[0]", "no socket path"),
            ("    ssh: [\"x=a,b\"]\n", "images.hello.ssh[0]", "one agent socket"),
            ("    cache: {from: x:cache}\n", "images.hello.cache.from", "expected a list"),
            ("    cache: {to: [x]}\n", "images.hello.cache.to", "expected a single value"),
            ("    cache: {to: \"Reg/X:y\"}\n", "images.hello.cache.to", "not an image reference"),
            ("    cache: {to: \"x@sha256:0000000000000000000000000000000000000000000000000000000000000000\"}\n", "images.hello.cache.to", "names a digest"),
            ("    cache: {from: [a], too: b}\n", "images.hello.cache.too", "did you mean to?"),
            ("    pull: yes\n", "images.hello.pull", "write `pull: true`"),
            ("    no_cache: 1\n", "images.hello.no_cache", "not a boolean"),
        ];
        for (extra, field, needle) in cases {
            let (f, m, shown) = project_err(parse_in(&d, &with_image(extra)));
            assert_eq!(&f, field, "{extra}: {shown}");
            assert!(m.contains(needle), "{extra}: {shown}");
        }
        let long = format!("    cache: {{to: \"x:{}\"}}\n", "a".repeat(120));
        let (f, m, _) = project_err(parse_in(&d, &with_image(&long)));
        assert_eq!(f, "images.hello.cache.to");
        assert!(m.contains("longer than 128"), "{m}");
    }

    #[test]
    fn build_flags_add_to_and_override_the_file() {
        let d = fixture();
        fs::write(d.path().join("npmrc"), "registry=x").unwrap();
        let text = format!(
            "{}  other:\n    repository: 127.0.0.1:5000/demo/other\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n",
            with_image("    secrets: {npmrc: {file: npmrc}, token: {env: POLYARCH_TEST_UNSET_VARIABLE}}\n    cache: {from: [127.0.0.1:5000/demo/hello:cache]}\n")
        );
        let mut project = parse_in(&d, &text).unwrap();
        // The file's token comes from an unset variable: refused, naming the field.
        let error = project
            .clone()
            .prepare_build(&["hello".into()], &BuildFlags::default(), None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("images.hello.secrets.token.env: environment variable POLYARCH_TEST_UNSET_VARIABLE is not set"),
            "{error}"
        );
        let token: SecretFlag = "id=token,env=PATH".parse().unwrap();
        let cache: CacheRef = "127.0.0.1:5000/demo/cache:x".parse().unwrap();
        let flags = BuildFlags {
            secrets: vec![token],
            cache_from: vec![cache.clone()],
            cache_to: Some(cache.clone()),
            no_cache: true,
            ..Default::default()
        };
        // --cache-to for two images would mix their caches.
        let error = project
            .clone()
            .prepare_build(&[], &flags, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--cache-to") && error.contains("2 images"),
            "{error}"
        );
        let login = Credential::Basic {
            username: "u".into(),
            password: "p".into(),
        };
        project
            .prepare_build(&["hello".into()], &flags, Some(login.clone()))
            .unwrap();
        let hello = project.image("hello").unwrap();
        assert_eq!(
            hello.secrets["token"].source,
            SecretSource::Env("PATH".into())
        );
        assert!(matches!(hello.secrets["token"].origin, Origin::Flag(_)));
        assert_eq!(hello.cache_from.len(), 2);
        assert_eq!(hello.cache_to.as_ref(), Some(&cache));
        assert!(hello.no_cache && !hello.pull);
        assert_eq!(hello.login, Some(login));
        // An image not built is left alone.
        let other = project.image("other").unwrap();
        assert!(other.secrets.is_empty() && !other.no_cache && other.login.is_none());

        let missing: SecretFlag = "id=x,src=/nonexistent/polyarch-secret".parse().unwrap();
        let error = parse_in(&d, &text)
            .unwrap()
            .prepare_build(
                &["other".into()],
                &BuildFlags {
                    secrets: vec![missing],
                    ..Default::default()
                },
                None,
            )
            .unwrap_err();
        assert_eq!(error.exit_code(), 2);
        assert!(
            error
                .to_string()
                .starts_with("--secret id=x,src=/nonexistent/polyarch-secret: /nonexistent/polyarch-secret does not exist"),
            "{error}"
        );
    }

    fn job_env(name: &str) -> Option<String> {
        match name {
            "VERSION" => Some("v1.4.3".into()),
            "REGISTRY" => Some("127.0.0.1:5000/demo".into()),
            "BAD_TAG" => Some("not a tag".into()),
            _ => None,
        }
    }

    fn parse_job(dir: &TempDir, text: &str, sets: &[&str], purpose: Purpose) -> Result<Project> {
        let overrides: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
        let options = LoadOptions {
            purpose,
            overrides: &overrides,
            env: &job_env,
        };
        Project::parse(&dir.path().join("polyarch.yaml"), text, &options)
    }

    const JOB: &str = "version: 1\nimages:\n  api:\n    repository: ${REGISTRY}/api\n    tags: [\"${VERSION}\", latest]\n    context: .\n    platforms: [linux/amd64]\n    build_args: {VERSION: \"${VERSION:-dev}\", COMMIT: \"${COMMIT:-unknown}\"}\n    labels: {org.opencontainers.image.version: $VERSION}\n  web:\n    repository: 127.0.0.1:5000/demo/web\n    tags: [\"${WEB_TAG:-edge}\"]\n    context: .\n    platforms: [linux/amd64]\n";

    #[test]
    fn variables_fill_values_and_are_recorded() {
        let d = fixture();
        let p = parse_job(&d, JOB, &[], Purpose::Build).unwrap();
        let api = p.image("api").unwrap();
        assert_eq!(api.repository, "127.0.0.1:5000/demo/api");
        assert_eq!(api.tags, ["v1.4.3", "latest"]);
        assert_eq!(api.build_args["VERSION"], "v1.4.3");
        assert_eq!(api.build_args["COMMIT"], "unknown");
        assert_eq!(api.labels["org.opencontainers.image.version"], "v1.4.3");
        assert_eq!(p.image("web").unwrap().tags, ["edge"]);
        let sources: Vec<(String, String)> = p
            .values_for(&["api".into()])
            .into_iter()
            .map(|v| (v.field, v.source))
            .collect();
        let pair = |f: &str, s: &str| (f.to_string(), s.to_string());
        assert_eq!(
            sources,
            vec![
                pair("images.api.repository", "env:REGISTRY"),
                pair("images.api.tags[0]", "env:VERSION"),
                pair("images.api.build_args.VERSION", "env:VERSION"),
                pair("images.api.build_args.COMMIT", "default:COMMIT"),
                pair(
                    "images.api.labels.org.opencontainers.image.version",
                    "env:VERSION"
                ),
            ]
        );
        assert_eq!(p.values_for(&[]).len(), 6, "all images");
        // A file without variables has nothing to record.
        assert!(parse_in(&d, FULL).unwrap().values_for(&[]).is_empty());
    }

    #[test]
    fn an_unset_variable_names_the_field_and_variable() {
        let d = fixture();
        let text = JOB.replace("${VERSION}\", latest", "${RELEASE}\", latest");
        let (f, m, shown) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, "images.api.tags[0]");
        assert!(
            m.contains("variable RELEASE is not set") && m.contains("${RELEASE:-default}"),
            "{shown}"
        );
        assert!(
            shown.starts_with(&format!(
                "{}: images.api.tags[0]: ",
                d.path().join("polyarch.yaml").display()
            )),
            "{shown}"
        );
        let text = JOB.replace(
            "${REGISTRY}/api",
            "\"${REGISTRY_HOST:?the registry to push to}/api\"",
        );
        let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, "images.api.repository");
        assert!(
            m.contains("REGISTRY_HOST is not set: the registry to push to;"),
            "{m}"
        );
        // Keys are names, not values: left alone.
        let text = with_image("    build_args: {$NOT_A_VARIABLE: x}\n");
        assert!(parse_in(&d, &text)
            .unwrap()
            .image("hello")
            .unwrap()
            .build_args
            .contains_key("$NOT_A_VARIABLE"));
        // A value from the job is validated like any other, and traced to its variable.
        let text = JOB.replace("${VERSION}\", latest", "${BAD_TAG}\", latest");
        let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, "images.api.tags[0]");
        assert!(
            m.contains("is not a valid tag") && m.ends_with("(the value came from $BAD_TAG)"),
            "{m}"
        );
        // Every variable of a bad value is named.
        let text = JOB.replace("${REGISTRY}/api", "${REGISTRY}/${BAD_TAG}");
        let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, "images.api.repository");
        assert!(
            m.ends_with("(the value came from $REGISTRY, $BAD_TAG)"),
            "{m}"
        );
        // `[${VERSION}]` is YAML's mapping inside a list: the fix is to quote it.
        let text = JOB.replace("[\"${VERSION}\", latest]", "[${VERSION}, latest]");
        let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, "");
        assert!(
            m.contains("line 5") && m.contains("quote values holding `${…}`"),
            "{m}"
        );
        let (_, m, _) = project_err(parse_in(&d, "version: 1\nimages: [\n"));
        assert!(m.contains("fix the indentation"), "{m}");
    }

    #[test]
    fn set_overrides_the_file() {
        let d = fixture();
        let p = parse_job(
            &d,
            JOB,
            &[
                "api.tags=v2.0.0, latest",
                "*.platforms=linux/arm64,linux/amd64",
                "api.args.VERSION=1.2",
                "api.labels.org.example.team=core",
                "web.target=release",
                "web.dockerfile=app/Dockerfile.release",
            ],
            Purpose::Build,
        )
        .unwrap();
        let api = p.image("api").unwrap();
        assert_eq!(api.tags, ["v2.0.0", "latest"]);
        assert_eq!(api.platforms.len(), 2);
        assert_eq!(api.build_args["VERSION"], "1.2");
        assert_eq!(api.labels["org.example.team"], "core");
        let web = p.image("web").unwrap();
        assert_eq!(web.platforms, api.platforms);
        assert_eq!(web.target.as_deref(), Some("release"));
        assert_eq!(web.dockerfile, Path::new("app/Dockerfile.release"));
        let sources = p.values_for(&["api".into()]);
        let of = |field: &str| {
            sources
                .iter()
                .filter(|v| v.field == field)
                .map(|v| v.source.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(of("images.api.tags"), ["set"]);
        assert!(
            of("images.api.tags[0]").is_empty(),
            "the file's ${{VERSION}} was replaced"
        );
        assert_eq!(of("images.api.build_args.VERSION"), ["set"]);
        assert_eq!(of("images.api.build_args.COMMIT"), ["default:COMMIT"]);
        // A --set value is taken literally, and spares the field it replaces from the
        // file's unset variable.
        let text = JOB.replace("${VERSION}\", latest", "${RELEASE}\", latest");
        let p = parse_job(
            &d,
            &text,
            &["api.tags=v1", "api.args.X=$HOME"],
            Purpose::Build,
        )
        .unwrap();
        assert_eq!(p.image("api").unwrap().build_args["X"], "$HOME");
        // The later of two wins.
        let p = parse_job(&d, JOB, &["api.tags=a", "api.tags=b"], Purpose::Build).unwrap();
        assert_eq!(p.image("api").unwrap().tags, ["b"]);
    }

    #[test]
    fn a_bad_set_is_a_usage_error_naming_it() {
        let d = fixture();
        let usage = |sets: &[&str]| match parse_job(&d, JOB, sets, Purpose::Build) {
            Err(Error::Usage(m)) => m,
            other => panic!("not a usage error: {other:?}"),
        };
        let m = usage(&["apx.tags=v1"]);
        assert!(
            m.starts_with("--set apx.tags=v1: no image of ")
                && m.ends_with("is named `apx`; its images are api, web"),
            "{m}"
        );
        let m = usage(&["api.platfroms=linux/arm64"]);
        assert!(
            m.starts_with("--set api.platfroms=linux/arm64: `platfroms` is not a field")
                && m.contains("did you mean platforms?"),
            "{m}"
        );
        // A value --set gives is validated at its field, naming the flag.
        let (f, m, _) = project_err(parse_job(
            &d,
            JOB,
            &["api.platforms=linux/foo"],
            Purpose::Build,
        ));
        assert_eq!(f, "images.api.platforms[0]");
        assert!(
            m.ends_with("(the value came from --set api.platforms=linux/foo)"),
            "{m}"
        );
        let (f, m, _) = project_err(parse_job(&d, JOB, &["api.tags="], Purpose::Build));
        assert_eq!(f, "images.api.tags");
        assert!(
            m.contains("is empty") && m.contains("--set api.tags="),
            "{m}"
        );
    }

    #[test]
    fn verify_reads_no_build_inputs() {
        let d = tempfile::tempdir().unwrap();
        let text = "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:5000/demo/hello\n    tags: [v1]\n    context: app\n    dockerfile: build/Dockerfile\n    platforms: [linux/amd64]\n";
        let (f, _, _) = project_err(parse_job(&d, text, &[], Purpose::Build));
        assert_eq!(f, "images.hello.context");
        let p = parse_job(&d, text, &[], Purpose::Verify).unwrap();
        assert_eq!(p.images[0].tags, ["v1"]);
        // What can be told without the disk is still checked.
        let absolute = text.replace("build/Dockerfile", "/abs/Dockerfile");
        let (f, m, _) = project_err(parse_job(&d, &absolute, &[], Purpose::Verify));
        assert_eq!(f, "images.hello.dockerfile");
        assert!(m.contains("is absolute"), "{m}");
        let empty = text.replace("context: app", "context: \"\"");
        let (f, _, _) = project_err(parse_job(&d, &empty, &[], Purpose::Verify));
        assert_eq!(f, "images.hello.context");
    }

    /// The CI example's project file takes its registry and version from the job.
    #[test]
    fn the_ci_example_reads_its_release_from_the_environment() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ci/polyarch.yaml");
        let env = |name: &str| match name {
            "REGISTRY" => Some("ghcr.io".to_string()),
            "VERSION" => Some("v1.4.3".to_string()),
            _ => None,
        };
        let options = LoadOptions {
            purpose: Purpose::Verify,
            overrides: &[],
            env: &env,
        };
        let p = Project::load(&file, &options).unwrap();
        let api = p.image("api").unwrap();
        assert_eq!(api.repository, "ghcr.io/acme/api");
        assert_eq!(api.tags, ["v1.4.3", "latest"]);
        assert_eq!(api.labels["org.opencontainers.image.revision"], "unknown");
        let without = LoadOptions {
            env: &|name: &str| env(name).filter(|_| name != "VERSION"),
            ..options
        };
        let (f, m, _) = project_err(Project::load(&file, &without));
        assert_eq!(f, "images.api.tags[0]");
        assert!(m.contains("VERSION is not set: the release version"), "{m}");
    }

    /// The ssh builder example names its builder from the job too.
    #[test]
    fn the_ssh_builder_example_takes_its_builder_from_the_environment() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ci/polyarch-ssh.yaml");
        let env = |name: &str| match name {
            "REGISTRY" => Some("ghcr.io".to_string()),
            "VERSION" => Some("v1.4.3".to_string()),
            "ARM_BUILDER" => Some("ssh://ci@arm-box.example.com".to_string()),
            _ => None,
        };
        let options = LoadOptions {
            purpose: Purpose::Verify,
            overrides: &[],
            env: &env,
        };
        let p = Project::load(&file, &options).unwrap();
        let arm = &p.builders[&"linux/arm64".parse::<Platform>().unwrap()][0];
        assert_eq!(arm.host, "ssh://ci@arm-box.example.com");
        assert!(!arm.endpoint().unwrap().is_local());
    }
}

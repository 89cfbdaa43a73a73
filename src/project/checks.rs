//! Validation of the file as a whole: syntax, version, top-level fields, builders.

use super::diagnostics::{clip, clip_long, humanize, q, seg_path, strip_marks, Seg, Shallow};
use super::raw::{Entries, RawBuilder, RawProject, RawTls};
use super::{
    values, BinfmtMode, BuilderSpec, Fallback, ImageSpec, Project, Purpose, BINFMT_MODES, BOOLEANS,
    FALLBACKS, SUPPORTED_VERSION,
};
use super::{ProjectError, Result};
use crate::base::platform::Platform;
use crate::base::text::one_line;
use crate::base::yaml_depth::{check_depth, MAX_YAML_DEPTH};
use crate::docker::endpoint::{self, TlsFiles};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where messages point and where relative paths start.
pub(super) struct Cx {
    pub(super) file: PathBuf,
    pub(super) base: PathBuf,
    pub(super) purpose: Purpose,
    /// The job's values, so a bad one is traced to the variable or `--set` it came from.
    pub(super) values: Vec<values::Provenance>,
}

impl Cx {
    /// Checks for `file`, whose relative paths resolve against its directory.
    pub(super) fn for_file(file: &Path, purpose: Purpose) -> Cx {
        Cx {
            file: file.to_path_buf(),
            base: match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
            purpose,
            values: Vec::new(),
        }
    }

    pub(super) fn err(&self, field: impl AsRef<str>, message: impl AsRef<str>) -> ProjectError {
        let field = field.as_ref();
        let note = values::note(self.values.iter().filter(|p| p.covers(field)));
        ProjectError::File {
            file: self.file.clone(),
            field: one_line(field),
            message: one_line(&format!("{}{note}", message.as_ref())),
        }
    }

    /// `true` or `false`, absent being false; `key` is the field as written in the file.
    pub(super) fn flag(&self, field: &str, key: &str, value: Option<String>) -> Result<bool> {
        match value {
            Some(s) => pick(&s, BOOLEANS, "boolean").map_err(|_| {
                self.err(
                    field,
                    format!(
                        "{} is not a boolean; write `{key}: true` or `{key}: false`",
                        q(&s)
                    ),
                )
            }),
            None => Ok(false),
        }
    }

    /// Syntax, top-level shape and version, before any version-specific typing.
    pub(super) fn precheck(&self, text: &str) -> Result<()> {
        // Before the parser, whose time grows with the depth at every token.
        check_depth(text, MAX_YAML_DEPTH).map_err(|e| self.err("", e.to_string()))?;
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

    pub(super) fn unsupported(&self, version: &str) -> ProjectError {
        self.err(
            "version",
            format!(
                "unsupported version {}; this polyarch reads version {SUPPORTED_VERSION}, write `version: {SUPPORTED_VERSION}` or use a newer polyarch",
                clip(version)
            ),
        )
    }

    pub(super) fn serde_error(
        &self,
        e: serde_path_to_error::Error<serde_norway::Error>,
    ) -> ProjectError {
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
    pub(super) fn builder(&self, field: &str, raw: RawBuilder) -> Result<BuilderSpec> {
        let (host, raw_tls, host_field, fallback, buildkit) = match raw {
            RawBuilder::List(_) => {
                return Err(self.err(
                    field,
                    "is a list inside a list; write the platform's builders as one list",
                ))
            }
            RawBuilder::Address(host) => (host, None, field.to_string(), Fallback::None, false),
            RawBuilder::Map(map) => {
                let (host, buildkit, key) = match (map.host, map.buildkit) {
                    (Some(host), None) => (host, false, "host"),
                    (None, Some(daemon)) => (daemon, true, "buildkit"),
                    (Some(_), Some(_)) => return Err(self.err(
                        field,
                        "has both host and buildkit; give host for a Docker engine or buildkit for a BuildKit daemon",
                    )),
                    (None, None) => return Err(self.err(
                        format!("{field}.host"),
                        "is missing; give the engine's address, e.g. `host: tcp://arm-box:2376`, or a BuildKit daemon's, e.g. `buildkit: tcp://arm-bk:1234`",
                    )),
                };
                if buildkit && !endpoint::is_address(&host) {
                    return Err(self.err(
                        format!("{field}.buildkit"),
                        format!("{} is not an address; write unix:///path/buildkitd.sock, tcp://host:port or ssh://user@host", q(&host)),
                    ));
                }
                let fallback = match map.fallback {
                    Some(s) => pick(&s, FALLBACKS, "fallback")
                        .map_err(|m| self.err(format!("{field}.fallback"), m))?,
                    None => Fallback::None,
                };
                (host, map.tls, format!("{field}.{key}"), fallback, buildkit)
            }
        };
        if host.trim().is_empty() {
            return Err(self.err(
                &host_field,
                "is empty; give an engine endpoint (unix:///path/docker.sock, tcp://host:port, ssh://user@host) or a docker context name",
            ));
        }
        let address = self.builder_address(&host_field, &host)?;
        let Some(raw_tls) = raw_tls else {
            return Ok(BuilderSpec {
                host,
                tls: None,
                fallback,
                buildkit,
            });
        };
        let tls_field = format!("{field}.tls");
        if !matches!(address, Some(endpoint::Address::Tcp { .. })) {
            return Err(self.err(
                &tls_field,
                "applies to tcp:// hosts only (a Docker context brings its own TLS files, ssh:// needs none); remove it or write host: tcp://HOST:2376",
            ));
        }
        Ok(BuilderSpec {
            host,
            tls: Some(self.builder_tls(&tls_field, raw_tls)?),
            fallback,
            buildkit,
        })
    }

    /// A builder's address when it is one; else a Docker context's name, read when the
    /// build connects.
    fn builder_address(&self, host_field: &str, host: &str) -> Result<Option<endpoint::Address>> {
        if endpoint::is_address(host) {
            Ok(Some(
                endpoint::parse_address(host).map_err(|e| self.err(host_field, e.to_string()))?,
            ))
        } else if host.contains(char::is_whitespace) {
            Err(self.err(
                host_field,
                format!("{} is not a Docker context name (it has whitespace); write an address or the name `docker context ls` shows", q(host)),
            ))
        } else {
            Ok(None)
        }
    }

    /// A tcp:// builder's `tls:` files, relative to the project file, present when building.
    fn builder_tls(&self, tls_field: &str, raw_tls: RawTls) -> Result<TlsFiles> {
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
            server_name: match raw_tls.servername {
                Some(name) if name.trim().is_empty() => {
                    return Err(self.err(
                        format!("{tls_field}.servername"),
                        "is empty; give the host name the daemon's certificate carries, or leave it out to check the address's",
                    ))
                }
                name => name,
            },
        };
        match (&files.cert, &files.key) {
            (Some(_), None) => Err(self.err(tls_field, "has cert but no key; give both, or neither to connect without a client certificate")),
            (None, Some(_)) => Err(self.err(tls_field, "has key but no cert; give both, or neither to connect without a client certificate")),
            (None, None) if files.ca.is_none() => Err(self.err(tls_field, "is empty; give ca (the engine's CA) and cert and key (the client's), e.g. tls: {ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}")),
            _ => Ok(files),
        }
    }

    pub(super) fn project(&self, raw: RawProject) -> Result<Project> {
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
        let builders = self.builders(raw.builders)?;
        let entries = raw.images.map(|i| i.0).unwrap_or_default();
        if entries.is_empty() {
            return Err(self.err(
                "images",
                "no images declared; add at least one, e.g. `images: {hello: {repository: registry.example.com/hello, tags: [v1], context: ., platforms: [linux/amd64]}}`",
            ));
        }
        // The default of every image's own `reproducible:`.
        let reproducible = self.flag("reproducible", "reproducible", raw.reproducible)?;
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
            groups: BTreeMap::new(),
        })
    }

    /// `builders:` by platform, each a list of engines tried in order.
    fn builders(
        &self,
        raw: Option<Entries<RawBuilder>>,
    ) -> Result<BTreeMap<Platform, Vec<BuilderSpec>>> {
        let mut builders = BTreeMap::new();
        let mut builder_keys: BTreeMap<Platform, String> = BTreeMap::new();
        for (key, builder) in raw.map(|b| b.0).unwrap_or_default() {
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
        Ok(builders)
    }
}

const EMPTY_FILE: &str =
    "the file is empty; start it with `version: 1` and an `images:` mapping (see schema/polyarch.schema.json)";

/// Matches one of the allowed spellings exactly; the message lists them all.
pub(super) fn pick<T: Copy>(
    s: &str,
    allowed: &[(&str, T)],
    what: &str,
) -> std::result::Result<T, String> {
    allowed
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            format!("{} is not a {what}; use one of {}", q(s), names.join(", "))
        })
}

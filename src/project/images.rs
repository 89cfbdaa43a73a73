//! Validation of one entry under `images:`.

use super::checks::{pick, Cx};
use super::contexts::{check_name, NamedContext};
use super::diagnostics::q;
use super::names::{check_repository, valid_image_name};
use super::raw::{Entries, RawCache, RawImage, RawSecret};
use super::{
    CacheRef, ImageSpec, Network, Origin, Purpose, Secret, SshAgent, BINFMT_MODES, NETWORKS,
};
use super::{ProjectError, Result};
use crate::base::annotations::Annotations;
use crate::base::platform::Platform;
use crate::base::reference::is_tag;
use crate::docker::buildkit::secrets::{self, SecretSource};
use crate::docker::buildkit::ssh;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

impl Cx {
    pub(super) fn image(&self, name: String, raw: RawImage) -> Result<ImageSpec> {
        let at = |f: &str| format!("images.{name}.{f}");
        self.image_name(&name)?;

        // repository
        let repository = raw.repository.ok_or_else(|| {
            self.missing(
                &name,
                "repository",
                "repository: registry.example.com/team/app",
            )
        })?;
        check_repository(&repository).map_err(|m| self.err(at("repository"), m))?;

        let tags = self.tags(&name, raw.tags)?;

        let (context, dockerfile) =
            self.context_and_dockerfile(&name, raw.context, raw.dockerfile)?;
        let platforms = self.platforms(&name, raw.platforms)?;

        // build args, labels
        let build_args = self.build_args(&name, raw.build_args)?;
        let labels = self.labels(&name, raw.labels)?;

        let annotations = self.annotations(&name, raw.annotations)?;

        let target = self.target(&name, raw.target)?;

        let network = match raw.network {
            Some(s) => {
                pick(&s, NETWORKS, "network mode").map_err(|m| self.err(at("network"), m))?
            }
            None => Network::default(),
        };
        let binfmt = raw
            .binfmt
            .map(|s| pick(&s, BINFMT_MODES, "binfmt mode").map_err(|m| self.err(at("binfmt"), m)))
            .transpose()?;

        let flag = |value: Option<String>, field: &str| self.flag(&at(field), field, value);
        let pull = flag(raw.pull, "pull")?;
        let no_cache = flag(raw.no_cache, "no_cache")?;
        let reproducible = flag(raw.reproducible, "reproducible")?;
        let provenance = flag(raw.provenance, "provenance")?;
        let sbom = flag(raw.sbom, "sbom")?;
        let sign_key = match raw.sign {
            Some(sign) if sign.key.trim().is_empty() => {
                return Err(self.err(
                    at("sign.key"),
                    "is empty; give the private key's file, e.g. `sign: {key: cosign.key}`",
                ))
            }
            Some(sign) => Some(self.base.join(sign.key)),
            None => None,
        };
        let secrets = self.secrets(&name, raw.secrets)?;
        let ssh = self.ssh(&name, raw.ssh)?;
        let (cache_from, cache_to) = self.cache(&name, raw.cache, &platforms)?;
        let tests = self.platform_tests(&name, raw.test, &platforms)?;
        let contexts = self.named_contexts(&name, raw.contexts)?;

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
            require_sbom: sbom,
            sbom,
            sign_key,
            signer: None,
            login: None,
            build_history: false,
            tests,
            contexts,
        })
    }

    /// `contexts: {NAME: DIR | docker-image://REF | target:IMAGE}`; directories relative to
    /// the project file, and only a build requires them to exist. Whether a `target:`
    /// names an image of the project is checked with the other images (see
    /// [`super::dependencies`]).
    fn named_contexts(
        &self,
        name: &str,
        raw: Option<Entries<String>>,
    ) -> Result<BTreeMap<String, NamedContext>> {
        let mut out = BTreeMap::new();
        for (key, value) in raw.map(|e| e.0).unwrap_or_default() {
            let field = format!("images.{name}.contexts.{key}");
            check_name(&key).map_err(|m| self.err(&field, m))?;
            if out.contains_key(&key) {
                return Err(self.err(&field, "is given twice; keep one"));
            }
            let context = match NamedContext::parse(&value, &self.base) {
                Ok(NamedContext::Dir(dir)) if self.purpose == Purpose::Build => {
                    NamedContext::Dir(self.context(&field, &dir)?)
                }
                Ok(NamedContext::Target(target)) if target == name => {
                    return Err(self.err(
                        &field,
                        format!(
                        "`target:{target}` is this image itself; name another image of the project"
                    ),
                    ))
                }
                Ok(context) => context,
                Err(m) => return Err(self.err(&field, m)),
            };
            out.insert(key, context);
        }
        Ok(out)
    }

    fn annotations(&self, name: &str, raw: Option<Entries<String>>) -> Result<Annotations> {
        let mut annotations = Annotations::default();
        for (k, v) in raw.map(|e| e.0).unwrap_or_default() {
            annotations
                .add(&k, &v)
                .map_err(|e| self.err(format!("images.{name}.annotations.{k}"), e.to_string()))?;
        }
        Ok(annotations)
    }

    /// The build directory and the Dockerfile in it; only a build opens them.
    fn context_and_dockerfile(
        &self,
        name: &str,
        context: Option<String>,
        dockerfile: Option<String>,
    ) -> Result<(PathBuf, PathBuf)> {
        let at = |f: &str| format!("images.{name}.{f}");
        let context_raw = context.ok_or_else(|| self.missing(name, "context", "context: ."))?;
        if context_raw.trim().is_empty() {
            return Err(self.err(
                at("context"),
                "is empty; give the build directory relative to the project file, e.g. `context: .`",
            ));
        }
        let looked = self.base.join(&context_raw);
        // Commands that build nothing never open the context or Dockerfile.
        let dockerfile_raw = dockerfile.unwrap_or_else(|| "Dockerfile".to_string());
        Ok(if self.purpose == Purpose::Build {
            let context = self.context(&at("context"), &looked)?;
            let dockerfile = self.dockerfile(&at("dockerfile"), &context, &dockerfile_raw)?;
            (context, dockerfile)
        } else {
            self.dockerfile_written(&at("dockerfile"), &looked, &dockerfile_raw)?;
            (looked, PathBuf::from(dockerfile_raw))
        })
    }

    /// A single stage name, if any.
    fn target(&self, name: &str, target: Option<String>) -> Result<Option<String>> {
        let at = |f: &str| format!("images.{name}.{f}");
        match target {
            Some(t) if t.trim().is_empty() => Err(self.err(
                at("target"),
                "is empty; name a stage of the Dockerfile (`FROM … AS NAME`) or remove `target:`",
            )),
            Some(t) if t.contains(char::is_whitespace) => Err(self.err(
                at("target"),
                format!(
                    "{} contains whitespace; name a single stage of the Dockerfile",
                    q(&t)
                ),
            )),
            other => Ok(other),
        }
    }

    /// `[a-z0-9][a-z0-9._-]*`, with the lowercase spelling offered when it would do.
    fn image_name(&self, name: &str) -> Result<()> {
        if !valid_image_name(name) {
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
                    q(name)
                ),
            ));
        }
        Ok(())
    }

    /// A required field that is absent, with an example to copy.
    fn missing(&self, name: &str, field: &str, example: &str) -> ProjectError {
        self.err(
            format!("images.{name}.{field}"),
            format!("missing; add it, e.g. `{example}`"),
        )
    }

    /// A list that must be there and hold something: `tags:`, `platforms:`.
    fn required_list(
        &self,
        name: &str,
        field: &str,
        list: Option<Vec<String>>,
        what: &str,
        example: &str,
    ) -> Result<Vec<String>> {
        let at = format!("images.{name}.{field}");
        let list = list.ok_or_else(|| self.missing(name, field, &format!("{field}: {example}")))?;
        if list.is_empty() {
            return Err(self.err(
                at,
                format!("is empty; list at least one {what}, e.g. `{field}: {example}`"),
            ));
        }
        Ok(list)
    }

    fn tags(&self, name: &str, tags: Option<Vec<String>>) -> Result<Vec<String>> {
        let tags = self.required_list(name, "tags", tags, "tag", "[v1, latest]")?;
        for (i, tag) in tags.iter().enumerate() {
            let field = format!("images.{name}.tags[{i}]");
            if !is_tag(tag) {
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

        Ok(tags)
    }

    fn platforms(&self, name: &str, platforms: Option<Vec<String>>) -> Result<Vec<Platform>> {
        let platform_strs = self.required_list(
            name,
            "platforms",
            platforms,
            "platform",
            "[linux/amd64, linux/arm64]",
        )?;
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

        Ok(platforms)
    }

    fn build_args(
        &self,
        name: &str,
        raw: Option<Entries<String>>,
    ) -> Result<BTreeMap<String, String>> {
        let mut build_args = BTreeMap::new();
        for (k, v) in raw.map(|e| e.0).unwrap_or_default() {
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
        Ok(build_args)
    }

    fn labels(&self, name: &str, raw: Option<Entries<String>>) -> Result<BTreeMap<String, String>> {
        let mut labels = BTreeMap::new();
        for (k, v) in raw.map(|e| e.0).unwrap_or_default() {
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

        Ok(labels)
    }

    /// `secrets: {ID: {file: PATH} | {env: NAME}}`; files relative to the project file.
    /// Whether they can be read is checked when building (see [`Project::prepare_build`]).
    pub(super) fn secrets(
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
    pub(super) fn ssh(
        &self,
        image: &str,
        raw: Option<Vec<String>>,
    ) -> Result<BTreeMap<String, SshAgent>> {
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
    pub(super) fn cache(
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
    pub(super) fn context(&self, field: &str, looked: &Path) -> Result<PathBuf> {
        match std::fs::metadata(looked) {
            Ok(m) if m.is_dir() => looked.canonicalize().map_err(|e| {
                self.err(field, format!("cannot resolve {} ({e}); fix the path", looked.display()))
            }),
            Ok(_) => {
                Err(self.err(
                    field,
                    format!(
                        "{} is not a directory; point it at the directory holding the build files",
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
    pub(super) fn dockerfile_written(
        &self,
        field: &str,
        context: &Path,
        written: &str,
    ) -> Result<()> {
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
    pub(super) fn dockerfile(&self, field: &str, context: &Path, written: &str) -> Result<PathBuf> {
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

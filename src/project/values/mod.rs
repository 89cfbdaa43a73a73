//! Values from the job: `${VAR}` in the project file's strings, read from the environment
//! as `docker compose` reads them, and `--set IMAGE.FIELD=VALUE` from the command line.
//! Both change the raw file before validation, so a bad value is reported at its field
//! like any other, and both leave a [`Provenance`] so the record can say where a value
//! came from.

use super::diagnostics::{closest, q};
use super::raw::{
    Entries, RawBuilder, RawBuilderMap, RawCache, RawImage, RawProject, RawSecret, RawSign,
    RawTest, RawTests, RawTls,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Where one project-file value came from, as the coverage record lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueSource {
    /// The field path, e.g. `images.api.tags[0]`.
    pub field: String,
    /// `env:NAME` (the variable's value), `default:NAME` (`${NAME:-…}`'s default, NAME being
    /// unset) or `set` (`--set`); for a `reproducible: true` image's epoch also
    /// `flag:--source-date-epoch` or `git:COMMIT`.
    pub source: String,
}

/// Where a field's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// `${NAME}` (or a form with a default) read the variable.
    Env(String),
    /// `${NAME:-default}` or `${NAME-default}` fell back to its default.
    Default(String),
    /// `--set`, as given.
    Set(String),
    /// A build's `SOURCE_DATE_EPOCH`, as [`crate::project::source_date_epoch::EpochSource::record`] names it.
    Epoch(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Provenance {
    /// The field path, e.g. `images.api.tags[0]`, or `images.api.tags` for a whole list set.
    pub field: String,
    pub source: Source,
}

impl Provenance {
    /// Whether `field` (as validation names it) holds this value or part of it.
    pub fn covers(&self, field: &str) -> bool {
        within(&self.field, field)
    }

    pub fn record(&self) -> ValueSource {
        ValueSource {
            field: self.field.clone(),
            source: match &self.source {
                Source::Env(name) => format!("env:{name}"),
                Source::Default(name) => format!("default:{name}"),
                Source::Set(_) => "set".to_string(),
                Source::Epoch(source) => source.clone(),
            },
        }
    }
}

/// Appended to a validation message, so a bad value from the job is traced to where it
/// came from; empty for a value written in the file.
pub(super) fn note<'a>(sources: impl Iterator<Item = &'a Provenance>) -> String {
    let from: Vec<String> = sources
        .map(|p| match &p.source {
            Source::Env(name) => format!("${name}"),
            Source::Default(name) => format!("the default of ${{{name}}} (unset)"),
            Source::Set(text) => format!("--set {text}"),
            Source::Epoch(source) => source.clone(),
        })
        .collect();
    match from.as_slice() {
        [] => String::new(),
        _ => format!(" (the value came from {})", from.join(", ")),
    }
}

/// Whether `field` is `outer` or inside it (`images.a.tags` holds `images.a.tags[1]`).
fn within(outer: &str, field: &str) -> bool {
    field == outer
        || field
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
}

/// Looks an environment variable up; tests pass their own.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment; a value that is not Unicode counts as unset.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

// ---------------------------------------------------------------------------------------
// Interpolation.

/// How deep `${…}` may nest in a default or message: far beyond any real file, and each
/// level is a stack frame and a scan of the rest of the value.
pub const MAX_INTERPOLATION_DEPTH: usize = 32;

/// Why a value could not be expanded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Unexpanded {
    /// A reference polyarch cannot read, or a variable that must be set: the problem and
    /// the fix.
    #[error("{0}")]
    Invalid(String),
    /// Defaults holding references nest deeper than [`MAX_INTERPOLATION_DEPTH`].
    #[error("`${{…}}` references nest more than {MAX_INTERPOLATION_DEPTH} deep in defaults or messages; flatten them")]
    TooDeep,
}

type Expanded = std::result::Result<String, Unexpanded>;

/// Expands `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?message}`,
/// `${NAME?message}`, `$NAME` and `$$` (a literal `$`) as compose does; defaults may hold
/// references themselves, up to [`MAX_INTERPOLATION_DEPTH`] deep. A variable used without
/// a default must be set (compose would warn and use an empty string; a release built with
/// an empty tag is worse than none). Each variable read is added to `used`.
pub(super) fn interpolate(text: &str, env: Lookup, used: &mut Vec<Source>) -> Expanded {
    nested(text, env, used, 0)
}

/// [`interpolate`] inside `depth` enclosing `${…}`.
fn nested(text: &str, env: Lookup, used: &mut Vec<Source>, depth: usize) -> Expanded {
    if depth > MAX_INTERPOLATION_DEPTH {
        return Err(Unexpanded::TooDeep);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let end = closing_brace(inner).ok_or_else(|| {
                Unexpanded::Invalid(format!(
                    "{} opens `${{` without a closing `}}`; close it, or write `$$` for a literal `$`",
                    q(text)
                ))
            })?;
            out.push_str(&braced(&inner[..end], env, used, depth)?);
            rest = &inner[end + 1..];
        } else {
            let len = name_len(after);
            if len == 0 {
                return Err(Unexpanded::Invalid(format!(
                    "{} has a `$` that starts no variable; write `${{NAME}}` for a variable or `$$` for a literal `$`",
                    q(text)
                )));
            }
            let name = &after[..len];
            out.push_str(&required(name, env, used)?);
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The index of the `}` closing a `${`, skipping nested `${…}` and `$$`.
fn closing_brace(inner: &str) -> Option<usize> {
    let bytes = inner.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'$') => i += 1,
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 1;
            }
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// `[A-Za-z_][A-Za-z0-9_]*` at the start of `s`: its length in bytes.
fn name_len(s: &str) -> usize {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(b) if b.is_ascii_alphabetic() || *b == b'_' => bytes
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count(),
        _ => 0,
    }
}

/// The inside of `${…}`, itself inside `depth` enclosing ones.
fn braced(inner: &str, env: Lookup, used: &mut Vec<Source>, depth: usize) -> Expanded {
    let len = name_len(inner);
    let (name, op) = inner.split_at(len);
    let unsupported = || {
        Unexpanded::Invalid(format!(
            "`${{{inner}}}` is not a variable reference polyarch reads; write `${{NAME}}`, `${{NAME:-default}}` or `${{NAME:?message}}`"
        ))
    };
    if name.is_empty() {
        return Err(unsupported());
    }
    // `:` makes an empty value count as unset, as in the shell.
    let (empty_is_unset, op) = match op.strip_prefix(':') {
        Some(op) => (true, op),
        None => (false, op),
    };
    let value = env(name).filter(|v| !(empty_is_unset && v.is_empty()));
    match op.chars().next() {
        None if !empty_is_unset => required(name, env, used),
        Some('-') => match value {
            Some(value) => {
                used.push(Source::Env(name.to_string()));
                Ok(value)
            }
            None => {
                used.push(Source::Default(name.to_string()));
                nested(&op[1..], env, used, depth + 1)
            }
        },
        Some('?') => match value {
            Some(value) => {
                used.push(Source::Env(name.to_string()));
                Ok(value)
            }
            None => {
                let message = nested(&op[1..], env, used, depth + 1)?;
                let state = if env(name).is_some() {
                    "is empty"
                } else {
                    "is not set"
                };
                Err(Unexpanded::Invalid(format!(
                    "variable {name} {state}{}; set it in the job's environment",
                    match message.trim() {
                        "" => String::new(),
                        m => format!(": {m}"),
                    }
                )))
            }
        },
        _ => Err(unsupported()),
    }
}

/// A variable used without a default: it must be set.
fn required(name: &str, env: Lookup, used: &mut Vec<Source>) -> Expanded {
    let value = env(name).ok_or_else(|| {
        Unexpanded::Invalid(format!(
            "variable {name} is not set; set it in the job's environment, or give a default: `${{{name}:-default}}`"
        ))
    })?;
    used.push(Source::Env(name.to_string()));
    Ok(value)
}

/// Calls `f` with every string value of the file and its field path (keys are left as
/// written). Destructures exhaustively, so a new field cannot be forgotten here.
pub(super) fn each_string<E>(
    raw: &mut RawProject,
    f: &mut dyn FnMut(&str, &mut String) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let RawProject {
        version: _,
        binfmt,
        binfmt_image,
        reproducible,
        builders,
        images,
    } = raw;
    one(f, "binfmt", binfmt)?;
    one(f, "binfmt_image", binfmt_image)?;
    one(f, "reproducible", reproducible)?;
    for (key, builder) in builders.iter_mut().flat_map(|e| e.0.iter_mut()) {
        builder_strings(f, &format!("builders.{key}"), builder)?;
    }
    for (name, image) in images.iter_mut().flat_map(|e| e.0.iter_mut()) {
        let at = |field: &str| format!("images.{name}.{field}");
        let RawImage {
            repository,
            tags,
            context,
            dockerfile,
            platforms,
            build_args,
            target,
            labels,
            network,
            binfmt,
            secrets,
            ssh,
            cache,
            pull,
            no_cache,
            reproducible,
            provenance,
            sbom,
            sign,
            annotations,
            test,
            contexts,
        } = image;
        one(f, &at("repository"), repository)?;
        list(f, &at("tags"), tags)?;
        one(f, &at("context"), context)?;
        one(f, &at("dockerfile"), dockerfile)?;
        list(f, &at("platforms"), platforms)?;
        entries(f, &at("build_args"), build_args)?;
        one(f, &at("target"), target)?;
        entries(f, &at("labels"), labels)?;
        entries(f, &at("annotations"), annotations)?;
        entries(f, &at("contexts"), contexts)?;
        one(f, &at("network"), network)?;
        one(f, &at("binfmt"), binfmt)?;
        for (id, secret) in secrets.iter_mut().flat_map(|e| e.0.iter_mut()) {
            let RawSecret { file, env } = secret;
            one(f, &at(&format!("secrets.{id}.file")), file)?;
            one(f, &at(&format!("secrets.{id}.env")), env)?;
        }
        list(f, &at("ssh"), ssh)?;
        if let Some(RawCache { from, to }) = cache {
            list(f, &at("cache.from"), from)?;
            one(f, &at("cache.to"), to)?;
        }
        one(f, &at("pull"), pull)?;
        one(f, &at("no_cache"), no_cache)?;
        one(f, &at("reproducible"), reproducible)?;
        one(f, &at("provenance"), provenance)?;
        one(f, &at("sbom"), sbom)?;
        if let Some(RawSign { key }) = sign {
            f(&at("sign.key"), key)?;
        }
        test_strings(f, &at("test"), test)?;
    }
    Ok(())
}

/// A `test:`'s values; `run` is kept as written: it is the test's own shell text (`$` is
/// the shell's there), and values reach it through `env`.
fn test_strings<E>(
    f: Visit<E>,
    at: &str,
    test: &mut Option<RawTests>,
) -> std::result::Result<(), E> {
    let (tests, listed): (Vec<&mut RawTest>, bool) = match test {
        None => return Ok(()),
        Some(RawTests::One(one)) => (vec![one], false),
        Some(RawTests::List(list)) => (list.iter_mut().collect(), true),
    };
    for (i, entry) in tests.into_iter().enumerate() {
        let at = match listed {
            true => format!("{at}[{i}]"),
            false => at.to_string(),
        };
        let RawTest {
            run: _,
            timeout,
            env,
            network,
            user,
            workdir,
            platforms,
        } = entry;
        one(f, &format!("{at}.timeout"), timeout)?;
        entries(f, &format!("{at}.env"), env)?;
        one(f, &format!("{at}.network"), network)?;
        one(f, &format!("{at}.user"), user)?;
        one(f, &format!("{at}.workdir"), workdir)?;
        list(f, &format!("{at}.platforms"), platforms)?;
    }
    Ok(())
}

fn builder_strings<E>(
    f: Visit<E>,
    at: &str,
    builder: &mut RawBuilder,
) -> std::result::Result<(), E> {
    match builder {
        RawBuilder::Address(host) => f(at, host),
        RawBuilder::Map(RawBuilderMap {
            host,
            buildkit,
            tls,
            fallback,
        }) => {
            one(f, &format!("{at}.host"), host)?;
            one(f, &format!("{at}.buildkit"), buildkit)?;
            one(f, &format!("{at}.fallback"), fallback)?;
            if let Some(RawTls {
                ca,
                cert,
                key,
                servername,
            }) = tls
            {
                one(f, &format!("{at}.tls.ca"), ca)?;
                one(f, &format!("{at}.tls.cert"), cert)?;
                one(f, &format!("{at}.tls.key"), key)?;
                one(f, &format!("{at}.tls.servername"), servername)?;
            }
            Ok(())
        }
        RawBuilder::List(list) => list
            .iter_mut()
            .enumerate()
            .try_for_each(|(i, one)| builder_strings(f, &format!("{at}[{i}]"), one)),
    }
}

type Visit<'a, E> = &'a mut dyn FnMut(&str, &mut String) -> std::result::Result<(), E>;

fn one<E>(f: Visit<E>, field: &str, value: &mut Option<String>) -> std::result::Result<(), E> {
    value.as_mut().map_or(Ok(()), |v| f(field, v))
}

fn list<E>(
    f: Visit<E>,
    field: &str,
    values: &mut Option<Vec<String>>,
) -> std::result::Result<(), E> {
    for (i, v) in values.iter_mut().flatten().enumerate() {
        f(&format!("{field}[{i}]"), v)?;
    }
    Ok(())
}

fn entries<E>(
    f: Visit<E>,
    field: &str,
    values: &mut Option<Entries<String>>,
) -> std::result::Result<(), E> {
    for (key, v) in values.iter_mut().flat_map(|e| e.0.iter_mut()) {
        f(&format!("{field}.{key}"), v)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// --set.

/// One `--set IMAGE.FIELD=VALUE` (or `IMAGE.FIELD.KEY=VALUE` for build args and labels),
/// checked against the project file when it is loaded. IMAGE may hold `*` wildcards.
#[derive(Debug, Clone)]
pub struct Override {
    /// As given, for messages.
    text: String,
    /// Left of the first `=`.
    target: String,
    value: String,
}

impl std::fmt::Display for Override {
    /// As given on the command line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Override {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text.split_once('=') {
            Some((target, value)) if target.contains('.') => Ok(Override {
                text: text.to_string(),
                target: target.to_string(),
                value: value.to_string(),
            }),
            _ => Err(format!(
                "`{text}` is not IMAGE.FIELD=VALUE; write e.g. --set api.tags=v1.4.3,latest or --set 'api.build_args.VERSION=1.2'"
            )),
        }
    }
}

/// What `--set` may change: the scalar and list fields a job overrides, and one key of
/// the build args or labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Repository,
    Tags,
    Context,
    Dockerfile,
    Platforms,
    Target,
    BuildArgs,
    Labels,
}

const SET_FIELDS: &[(&str, Field)] = &[
    ("repository", Field::Repository),
    ("tags", Field::Tags),
    ("context", Field::Context),
    ("dockerfile", Field::Dockerfile),
    ("platforms", Field::Platforms),
    ("target", Field::Target),
    ("build_args", Field::BuildArgs),
    ("labels", Field::Labels),
];

/// buildx bake's spellings, accepted so a bake user's `--set` works unchanged.
const ALIASES: &[(&str, &str)] = &[("args", "build_args"), ("platform", "platforms")];

impl Field {
    /// Maps take one key per `--set`.
    fn keyed(self) -> bool {
        matches!(self, Field::BuildArgs | Field::Labels)
    }
}

/// Where one `--set` lands: images (by pattern), a field, and a key for maps.
struct Resolved<'a> {
    pattern: &'a str,
    name: &'static str,
    field: Field,
    key: Option<&'a str>,
}

impl Override {
    /// Splits the target at the first `.` followed by a field `--set` knows, so image names
    /// with dots (`web.v2.tags`) and label keys with dots (`api.labels.org.example.x`) work.
    fn resolve(&self) -> std::result::Result<Resolved<'_>, String> {
        let field_names: Vec<&str> = SET_FIELDS
            .iter()
            .map(|(n, _)| *n)
            .chain(ALIASES.iter().map(|(a, _)| *a))
            .collect();
        let splits = self.target.match_indices('.').map(|(i, _)| i);
        for at in splits {
            let (pattern, rest) = (&self.target[..at], &self.target[at + 1..]);
            let (word, key) = match rest.split_once('.') {
                Some((word, key)) => (word, Some(key)),
                None => (rest, None),
            };
            let word = ALIASES
                .iter()
                .find(|(alias, _)| *alias == word)
                .map_or(word, |(_, field)| *field);
            let Some(&(name, field)) = SET_FIELDS.iter().find(|(n, _)| *n == word) else {
                continue;
            };
            return match (field.keyed(), key) {
                (true, Some(key)) if !key.is_empty() => Ok(Resolved {
                    pattern,
                    name,
                    field,
                    key: Some(key),
                }),
                (true, _) => Err(format!(
                    "{name} takes one key per --set; write --set {pattern}.{name}.NAME=VALUE"
                )),
                (false, Some(_)) => Err(format!(
                    "{name} has no keys; write --set {pattern}.{name}=VALUE"
                )),
                (false, None) => Ok(Resolved {
                    pattern,
                    name,
                    field,
                    key: None,
                }),
            };
        }
        let (pattern, rest) = self.target.split_once('.').unwrap_or((&self.target, ""));
        let word = rest.split('.').next().unwrap_or_default();
        let suggestion = closest(word, &field_names)
            .map(|s| format!("did you mean {s}? "))
            .unwrap_or_default();
        Err(format!(
            "{} is not a field --set can change for {pattern}; {suggestion}use one of {}",
            q(word),
            SET_FIELDS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Writes the value into every image the pattern matches; returns the field paths set.
    /// `Err` is the one-line usage message.
    pub(super) fn apply(
        &self,
        raw: &mut RawProject,
        file: &std::path::Path,
    ) -> std::result::Result<Vec<String>, String> {
        let problem = |m: String| format!("--set {}: {m}", self.text);
        let resolved = self.resolve().map_err(problem)?;
        let images = raw.images.as_mut().map(|e| &mut e.0);
        let mut set = Vec::new();
        let mut names = Vec::new();
        for (name, image) in images.into_iter().flatten() {
            names.push(name.clone());
            if !glob(resolved.pattern, name) {
                continue;
            }
            let list = || {
                self.value
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
            };
            let scalar = Some(self.value.clone());
            let map = match resolved.field {
                Field::Repository => {
                    image.repository = scalar;
                    None
                }
                Field::Context => {
                    image.context = scalar;
                    None
                }
                Field::Dockerfile => {
                    image.dockerfile = scalar;
                    None
                }
                Field::Target => {
                    image.target = scalar;
                    None
                }
                Field::Tags => {
                    image.tags = Some(list());
                    None
                }
                Field::Platforms => {
                    image.platforms = Some(list());
                    None
                }
                Field::BuildArgs => Some(&mut image.build_args),
                Field::Labels => Some(&mut image.labels),
            };
            if let (Some(map), Some(key)) = (map, resolved.key) {
                let map = &mut map.get_or_insert_with(|| Entries(Vec::new())).0;
                match map.iter_mut().find(|(k, _)| k == key) {
                    Some((_, v)) => v.clone_from(&self.value),
                    None => map.push((key.to_string(), self.value.clone())),
                }
            }
            set.push(match resolved.key {
                Some(key) => format!("images.{name}.{}.{key}", resolved.name),
                None => format!("images.{name}.{}", resolved.name),
            });
        }
        if set.is_empty() {
            return Err(problem(format!(
                "no image of {} is named {}; its images are {}",
                file.display(),
                q(resolved.pattern),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
        Ok(set)
    }

    pub(super) fn text(&self) -> &str {
        &self.text
    }
}

/// `*` matches any run of characters (bake's target patterns); everything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|i| rest.is_char_boundary(*i))
                .any(|i| glob(tail, &rest[i..]))
        }
    }
}

/// Applies the overrides, then interpolates every string they did not set.
/// Errors: (field, message) for a variable, or the usage message for a bad `--set`.
pub(super) fn resolve(
    raw: &mut RawProject,
    file: &std::path::Path,
    overrides: &[Override],
    env: Lookup,
) -> std::result::Result<Vec<Provenance>, Problem> {
    let mut found = apply_overrides(raw, file, overrides)?;
    let set_fields: BTreeSet<String> = found.iter().map(|p| p.field.clone()).collect();
    each_string(raw, &mut |field, value| {
        // A value given with --set is taken as it is: the shell has already expanded it.
        if set_fields.iter().any(|outer| within(outer, field)) || !value.contains('$') {
            return Ok(());
        }
        let mut used = Vec::new();
        *value = interpolate(value, env, &mut used)
            .map_err(|message| Problem::Variable(field.to_string(), message))?;
        for source in used {
            let p = Provenance {
                field: field.to_string(),
                source,
            };
            if !found.contains(&p) {
                found.push(p);
            }
        }
        Ok(())
    })?;
    Ok(found)
}

/// Applies the overrides alone, for a file whose own language has already interpolated
/// its strings (a bake file's HCL), where a `$` left over is meant literally.
pub(super) fn apply_overrides(
    raw: &mut RawProject,
    file: &std::path::Path,
    overrides: &[Override],
) -> std::result::Result<Vec<Provenance>, Problem> {
    let mut found = Vec::new();
    for o in overrides {
        for field in o.apply(raw, file).map_err(Problem::Set)? {
            found.retain(|p: &Provenance| p.field != field);
            found.push(Provenance {
                field,
                source: Source::Set(o.text().to_string()),
            });
        }
    }
    Ok(found)
}

/// Why the job's values could not be applied.
#[derive(Debug)]
pub(super) enum Problem {
    /// A bad `--set`: the whole one-line message.
    Set(String),
    /// A value that cannot be expanded: the field path and why.
    Variable(String, Unexpanded),
}

#[cfg(test)]
mod tests;

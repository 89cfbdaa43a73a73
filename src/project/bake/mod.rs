//! bake and compose files as project files: `docker-bake.hcl`, `docker-bake.json`,
//! `compose.yaml` and `docker-compose.yml` read into the same raw shape as `polyarch.yaml`,
//! so one validation judges them and names their fields in their own words.
//!
//! Each reader resolves its file into a [`Definition`]: groups, and targets whose fields
//! carry bake's names and values (inheritance applied). [`image`] then maps one target's
//! fields onto polyarch's, and refuses by name any field polyarch cannot honour: a file
//! that builds here means what it says.

use super::checks::Cx;
use super::raw::{Entries, RawCache, RawImage, RawProject, RawSecret};
use super::{values, LoadOptions, Project, ProjectError, Result};
use crate::base::text::one_line;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

pub(super) use convert::convert;
pub use convert::Converted;

mod compose;
mod convert;
mod eval;
mod functions;
mod hcl;
mod print;
#[cfg(test)]
mod tests;

/// The files searched when no `-f` is given: polyarch's own, else every one of bake's
/// that exists, read together in bake's order.
pub const DEFAULT_FILES: &[&str] = &[
    "polyarch.yaml",
    "compose.yaml",
    "compose.yml",
    "docker-compose.yml",
    "docker-compose.yaml",
    "docker-bake.json",
    "docker-bake.hcl",
    "docker-bake.override.json",
    "docker-bake.override.hcl",
];

/// Which language a project file is in, by its name as bake decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Hcl,
    Json,
    Compose,
}

impl Kind {
    /// `None` for polyarch's own YAML (any other name).
    pub(super) fn of(file: &Path) -> Option<Kind> {
        let name = file.file_name()?.to_str()?;
        if name.contains("compose") && (name.ends_with(".yml") || name.ends_with(".yaml")) {
            Some(Kind::Compose)
        } else if name.ends_with(".hcl") {
            Some(Kind::Hcl)
        } else if name.ends_with(".json") {
            Some(Kind::Json)
        } else {
            None
        }
    }

    /// How the file names a target's field, for messages: `target.app.args`.
    fn field(self, target: &str, field: &str) -> String {
        match self {
            Kind::Compose => format!("services.{target}.build.{}", compose::key_of(field)),
            Kind::Hcl | Kind::Json => format!("target.{target}.{field}"),
        }
    }
}

/// A target's fields, by bake's names, as bake resolved them.
pub(super) type Fields = Map<String, Value>;

/// A bake file resolved: groups (name → members, which may be groups) and targets, in
/// file order.
#[derive(Debug, Default)]
pub(super) struct Definition {
    pub(super) groups: Vec<(String, Vec<String>)>,
    pub(super) targets: Vec<(String, Fields)>,
    /// Groups' descriptions, for `plan --print`.
    pub(super) descriptions: Vec<(String, String)>,
    /// The variables the files read, for `init`'s comments: whether the environment set
    /// each, and an HCL variable's value (compose's `${…}` may give a name several).
    pub(super) variables: Vec<(values::Source, Option<Value>)>,
    /// How a target came to be, for `init`'s comments: its matrix, its `inherits`.
    pub(super) origins: Vec<(String, String)>,
}

impl Definition {
    /// A target's fields by its name.
    pub(super) fn target(&self, name: &str) -> Option<&Fields> {
        self.targets.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }
}

/// What is wrong, at which field of the file (empty: the file as a whole).
#[derive(Debug)]
pub(super) struct Problem {
    pub(super) field: String,
    pub(super) message: String,
}

impl Problem {
    pub(super) fn at(field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Reads a bake or compose file into a project of the targets `options.targets` names
/// (groups expanded), or of bake's `default` group when it names none.
pub(super) fn load(cx: &mut Cx, kind: Kind, text: &str, options: &LoadOptions) -> Result<Project> {
    load_many(cx, &[(kind, text.to_string())], options)
}

/// Several bake and compose files (`-f` repeated, or bake's default files) read as one,
/// merged in bake's order: the compose files first, then the HCL and JSON files as one
/// body, a later file's fields winning.
pub(super) fn load_many(
    cx: &mut Cx,
    files: &[(Kind, String)],
    options: &LoadOptions,
) -> Result<Project> {
    let definition = read(cx, files, options)?;
    project(cx, files[0].0, &definition, options)
}

/// `polyarch plan --print`: the files resolved, in `docker buildx bake --print`'s JSON
/// shape. Each target printed is first read as `load` reads it, so a field polyarch
/// refuses is refused here too.
pub(super) fn print(
    cx: &mut Cx,
    files: &[(Kind, String)],
    options: &LoadOptions,
) -> Result<String> {
    let definition = read(cx, files, options)?;
    let kind = files[0].0;
    let value = print::print(&definition, options.targets).map_err(|p| problem(cx, p))?;
    for name in value["target"]
        .as_object()
        .into_iter()
        .flat_map(|t| t.keys())
    {
        let fields = definition.target(name).expect("printed targets exist");
        image(kind, name, fields).map_err(|p| problem(cx, p))?;
    }
    Ok(serde_json::to_string_pretty(&value).expect("JSON values serialise"))
}

fn problem(cx: &Cx, p: Problem) -> ProjectError {
    ProjectError::File {
        file: cx.file.clone(),
        field: p.field,
        message: one_line(&p.message),
    }
}

/// The files resolved into one definition.
fn read(cx: &Cx, files: &[(Kind, String)], options: &LoadOptions) -> Result<Definition> {
    let mut definition = Definition::default();
    for (_, text) in files.iter().filter(|(k, _)| *k == Kind::Compose) {
        merge_definition(
            &mut definition,
            compose::read(text, options.env).map_err(|p| problem(cx, p))?,
        );
    }
    let bake: Vec<(bool, &str)> = files
        .iter()
        .filter(|(k, _)| *k != Kind::Compose)
        .map(|(k, t)| (*k == Kind::Json, t.as_str()))
        .collect();
    if !bake.is_empty() {
        merge_definition(
            &mut definition,
            hcl::read_many(&bake, options.env).map_err(|p| problem(cx, p))?,
        );
    }
    Ok(definition)
}

/// A later file's groups and targets over the earlier ones', field by field.
fn merge_definition(into: &mut Definition, from: Definition) {
    for (name, members) in from.groups {
        match into.groups.iter_mut().find(|(g, _)| *g == name) {
            Some((_, old)) => *old = members,
            None => into.groups.push((name, members)),
        }
    }
    for (name, fields) in from.targets {
        match into.targets.iter_mut().find(|(t, _)| *t == name) {
            Some((_, old)) => old.extend(fields),
            None => into.targets.push((name, fields)),
        }
    }
    into.descriptions.extend(from.descriptions);
    into.variables.extend(from.variables);
    into.origins.extend(from.origins);
}

/// The chosen targets as a project's images.
fn project(
    cx: &mut Cx,
    kind: Kind,
    definition: &Definition,
    options: &LoadOptions,
) -> Result<Project> {
    let file = cx.file.clone();
    let problem = |p: Problem| ProjectError::File {
        file: file.clone(),
        field: p.field,
        message: one_line(&p.message),
    };
    let groups = flatten_groups(definition).map_err(problem)?;
    let chosen = chosen(kind, definition, &groups, options.targets).map_err(problem)?;
    let mut raw = raw_project(kind, definition, &chosen).map_err(problem)?;
    // Each reader has interpolated its strings: a `$` left over is meant literally.
    cx.values =
        values::apply_overrides(&mut raw, &file, options.overrides).map_err(
            |problem| match problem {
                values::Problem::Set(message) => ProjectError::Usage(one_line(&message)),
                values::Problem::Variable(field, why) => {
                    cx.err(own_field(kind, &field), why.to_string())
                }
            },
        )?;
    // bake builds a target without platforms for the machine it runs on; polyarch builds
    // only the platforms it is told, so it asks for them in the file's own terms.
    let unplatformed = raw
        .images
        .iter()
        .flat_map(|i| &i.0)
        .find(|(_, i)| i.platforms.is_none());
    if let Some((name, _)) = unplatformed {
        let example = match kind {
            Kind::Compose => "platforms: [linux/amd64, linux/arm64]",
            Kind::Hcl | Kind::Json => "platforms = [\"linux/amd64\", \"linux/arm64\"]",
        };
        return Err(cx.err(
            kind.field(name, "platforms"),
            format!("missing: polyarch builds the platforms it is told, not the machine's own as bake does; add `{example}`, or pass --set '{name}.platforms=linux/amd64,linux/arm64'"),
        ));
    }
    let mut project = cx.project(raw).map_err(|e| match e {
        ProjectError::File {
            file,
            field,
            message,
        } => ProjectError::File {
            field: own_field(kind, &field),
            file,
            message,
        },
        other => other,
    })?;
    project.groups = groups;
    Ok(project)
}

/// Every group with its targets, nested groups expanded, without repeats.
fn flatten_groups(
    definition: &Definition,
) -> std::result::Result<BTreeMap<String, Vec<String>>, Problem> {
    fn expand(
        definition: &Definition,
        name: &str,
        trail: &mut Vec<String>,
        out: &mut Vec<String>,
    ) -> std::result::Result<(), Problem> {
        let Some((_, members)) = definition.groups.iter().find(|(g, _)| g == name) else {
            if definition.targets.iter().any(|(t, _)| t == name) {
                if !out.iter().any(|o| o == name) {
                    out.push(name.to_string());
                }
                return Ok(());
            }
            return Err(Problem::at(
                format!("group.{}", trail.last().map_or(name, String::as_str)),
                format!("names `{name}`, which is no target or group of the file; define it or remove it"),
            ));
        };
        if trail.iter().any(|t| t == name) {
            return Err(Problem::at(
                format!("group.{name}"),
                format!(
                    "contains itself ({} → {name}); remove one of them",
                    trail.join(" → ")
                ),
            ));
        }
        trail.push(name.to_string());
        for member in members {
            expand(definition, member, trail, out)?;
        }
        trail.pop();
        Ok(())
    }
    let mut groups = BTreeMap::new();
    for (name, _) in &definition.groups {
        let mut out = Vec::new();
        expand(definition, name, &mut Vec::new(), &mut out)?;
        groups.insert(name.clone(), out);
    }
    Ok(groups)
}

/// The targets a command line names (groups expanded), or bake's `default` group; a
/// compose file's default is every service that builds.
fn chosen(
    kind: Kind,
    definition: &Definition,
    groups: &BTreeMap<String, Vec<String>>,
    names: &[String],
) -> std::result::Result<Vec<String>, Problem> {
    let known = || {
        let mut all: Vec<&str> = groups.keys().map(String::as_str).collect();
        all.extend(definition.targets.iter().map(|(t, _)| t.as_str()));
        all.join(", ")
    };
    let mut out: Vec<String> = Vec::new();
    let mut add = |name: &String| {
        if !out.contains(name) {
            out.push(name.clone());
        }
    };
    if names.is_empty() {
        match groups.get("default") {
            Some(members) => members.iter().for_each(&mut add),
            // bake reads `default` as a target's name when no group has it.
            None if definition.targets.iter().any(|(t, _)| t == "default") => {
                add(&"default".to_string())
            }
            None if kind == Kind::Compose => definition.targets.iter().for_each(|(t, _)| add(t)),
            None => {
                return Err(Problem::at(
                    "",
                    format!(
                        "has no `default` group; name the targets to build (it declares: {}), or add group \"default\" {{ targets = [...] }}",
                        known()
                    ),
                ))
            }
        }
    }
    for name in names {
        match groups.get(name) {
            Some(members) => members.iter().for_each(&mut add),
            None if definition.targets.iter().any(|(t, _)| t == name) => add(name),
            None => {
                return Err(Problem::at(
                    "",
                    format!(
                        "has no target or group named `{name}`; name one of: {}",
                        known()
                    ),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(Problem::at(
            "",
            format!(
                "selects no target to build; name one of: {}",
                match known() {
                    k if k.is_empty() => "(none: add a target, or a service with build:)".into(),
                    k => k,
                }
            ),
        ));
    }
    Ok(out)
}

/// A validation field of polyarch's (`images.app.build_args.X`) in the file's own terms
/// (`target.app.args.X`).
fn own_field(kind: Kind, field: &str) -> String {
    let Some(rest) = field.strip_prefix("images.") else {
        return field.to_string();
    };
    let (name, rest) = rest.split_once('.').unwrap_or((rest, ""));
    let (key, tail) = match rest.find(['.', '[']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let own = match key {
        "" => return kind.field(name, "").trim_end_matches('.').to_string(),
        "repository" => ("tags", ""),
        "build_args" => ("args", tail),
        "no_cache" => ("no-cache", tail),
        "secrets" => ("secret", ""),
        "provenance" | "sbom" => ("attest", ""),
        "cache" if tail.starts_with(".from") => ("cache-from", &tail[".from".len()..]),
        "cache" => ("cache-to", ""),
        other => (other, tail),
    };
    format!("{}{}", kind.field(name, own.0), own.1)
}

/// Fields polyarch cannot honour, with what to do instead.
const REFUSED: &[(&str, &str)] = &[
    ("dockerfile-inline", "polyarch builds a Dockerfile file; write it to a file in the context and name it in dockerfile"),
    ("call", "polyarch builds and runs no frontend methods; remove call, or run `docker buildx bake --call` for those"),
    ("entitlements", "polyarch grants only network = \"host\"'s entitlement; remove entitlements"),
    ("no-cache-filter", "polyarch's cache is all or nothing; use no-cache = true"),
    ("shm-size", "RUN steps get BuildKit's default /dev/shm; remove shm-size"),
    ("ulimits", "RUN steps get BuildKit's default limits; remove ulimits"),
    ("extra-hosts", "polyarch's RUN steps resolve names through the network they use; remove extra-hosts"),
];

/// Fields polyarch reads (besides `inherits`, already applied, and `description`).
const FIELDS: &[&str] = &[
    "context",
    "contexts",
    "dockerfile",
    "args",
    "labels",
    "annotations",
    "tags",
    "platforms",
    "target",
    "cache-from",
    "cache-to",
    "secret",
    "ssh",
    "network",
    "no-cache",
    "pull",
    "output",
    "attest",
    "description",
    "inherits",
];

/// The named targets as a `polyarch.yaml` of only images: bake has no project-wide fields.
fn raw_project(
    kind: Kind,
    definition: &Definition,
    names: &[String],
) -> std::result::Result<RawProject, Problem> {
    let mut images = Vec::new();
    for name in names {
        let fields = definition.target(name).expect("chosen names exist");
        images.push((name.clone(), image(kind, name, fields)?));
    }
    Ok(RawProject {
        version: None,
        binfmt: None,
        binfmt_image: None,
        reproducible: None,
        builders: None,
        images: Some(Entries(images)),
    })
}

/// One target's fields as a `polyarch.yaml` image, or the field refused and why.
fn image(kind: Kind, name: &str, fields: &Fields) -> std::result::Result<RawImage, Problem> {
    let at = |field: &str| kind.field(name, field);
    for (key, _) in fields
        .iter()
        .filter(|(k, v)| !v.is_null() && *k != hcl::GRANTED)
    {
        if let Some((_, fix)) = REFUSED.iter().find(|(k, _)| k == key) {
            return Err(Problem::at(
                at(key),
                format!("polyarch cannot honour it: {fix}"),
            ));
        }
        if !FIELDS.contains(&key.as_str()) {
            return Err(Problem::at(
                at(key),
                format!(
                    "is not a field polyarch reads; remove it (it reads {})",
                    FIELDS[..FIELDS.len() - 2].join(", ")
                ),
            ));
        }
    }
    let text = |key: &str| -> std::result::Result<Option<String>, Problem> {
        fields
            .get(key)
            .filter(|v| !v.is_null())
            .map(|v| scalar(v).ok_or_else(|| Problem::at(at(key), "is not a string; write one")))
            .transpose()
    };
    let list = |key: &str| -> std::result::Result<Vec<String>, Problem> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    scalar(v).ok_or_else(|| {
                        Problem::at(format!("{}[{i}]", at(key)), "is not a string; write one")
                    })
                })
                .collect(),
            Some(_) => Err(Problem::at(at(key), "is not a list; write [\"…\"]")),
        }
    };
    let map = |key: &str| -> std::result::Result<Option<Entries<String>>, Problem> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(entries)) => Ok(Some(Entries(
                entries
                    .iter()
                    // bake leaves out an arg whose value is null.
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        scalar(v).map(|s| (k.clone(), s)).ok_or_else(|| {
                            Problem::at(format!("{}.{k}", at(key)), "is not a string; write one")
                        })
                    })
                    .collect::<std::result::Result<_, _>>()?,
            ))),
            Some(_) => Err(Problem::at(
                at(key),
                "is not a map; write { KEY = \"value\" }",
            )),
        }
    };

    let (repository, tags) =
        repository_and_tags(&list("tags")?).map_err(|m| Problem::at(at("tags"), m))?;
    let annotations = list("annotations")?
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    Problem::at(
                        format!("{}[{i}]", at("annotations")),
                        format!(
                            "`{a}` has no `=`; write [index:|manifest:|index,manifest:]KEY=VALUE"
                        ),
                    )
                })
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let cache_from = list("cache-from")?
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cache_ref(c).map_err(|m| Problem::at(format!("{}[{i}]", at("cache-from")), m))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let cache_to = match list("cache-to")?.as_slice() {
        [] => None,
        [one] => Some(cache_ref(one).map_err(|m| Problem::at(at("cache-to"), m))?),
        _ => {
            return Err(Problem::at(
                at("cache-to"),
                "names more than one cache; polyarch exports to one registry cache, keep one",
            ))
        }
    };
    for (i, output) in list("output")?.iter().enumerate() {
        check_output(output).map_err(|m| Problem::at(format!("{}[{i}]", at("output")), m))?;
    }
    let (mut provenance, mut sbom) = (None, None);
    for (i, attest) in list("attest")?.iter().enumerate() {
        let (kind, on) =
            attestation(attest).map_err(|m| Problem::at(format!("{}[{i}]", at("attest")), m))?;
        *match kind {
            Attest::Provenance => &mut provenance,
            Attest::Sbom => &mut sbom,
        } = Some(on.to_string());
    }
    let mut secrets: Vec<(String, RawSecret)> = Vec::new();
    for (i, s) in list("secret")?.iter().enumerate() {
        let (id, raw) = secret(s).map_err(|m| Problem::at(format!("{}[{i}]", at("secret")), m))?;
        // bake keeps one secret per id, a later one in the earlier one's place.
        match secrets.iter_mut().find(|(known, _)| *known == id) {
            Some(slot) => slot.1 = raw,
            None => secrets.push((id, raw)),
        }
    }
    let ssh = list("ssh")?;
    let boolean = |key: &str| -> std::result::Result<Option<String>, Problem> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b.to_string())),
            Some(v) => Ok(scalar(v)),
        }
    };
    Ok(RawImage {
        repository: Some(repository),
        tags: Some(tags),
        context: Some(text("context")?.unwrap_or_else(|| ".".into())),
        dockerfile: text("dockerfile")?,
        platforms: fields
            .get("platforms")
            .filter(|v| !v.is_null())
            .map(|_| list("platforms"))
            .transpose()?,
        build_args: map("args")?,
        target: text("target")?,
        labels: map("labels")?,
        network: text("network")?,
        binfmt: None,
        secrets: (!secrets.is_empty()).then_some(Entries(secrets)),
        ssh: (!ssh.is_empty()).then_some(ssh),
        cache: (!cache_from.is_empty() || cache_to.is_some()).then_some(RawCache {
            from: Some(cache_from),
            to: cache_to,
        }),
        pull: boolean("pull")?,
        no_cache: boolean("no-cache")?,
        reproducible: None,
        provenance,
        sbom,
        annotations: (!annotations.is_empty()).then_some(Entries(annotations)),
        test: None,
        // bake has no signing key; `build --sign-key` signs its targets.
        sign: None,
        contexts: map("contexts")?,
    })
}

/// A string, number or boolean as text (bake writes `args = { N = 1 }` too).
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// bake's `tags`: full references, all of one repository (polyarch pushes one index to
/// one repository).
fn repository_and_tags(tags: &[String]) -> std::result::Result<(String, Vec<String>), String> {
    let mut repository: Option<(String, &str)> = None;
    let mut out = Vec::new();
    for text in tags {
        let reference =
            crate::base::reference::parse_reference(text).map_err(|e| format!("{text}: {e}"))?;
        if reference.digest().is_some() {
            return Err(format!("{text} names a digest; a tag is NAME[:TAG]"));
        }
        let name = format!("{}/{}", reference.registry(), reference.repository());
        match &repository {
            Some((first, first_text)) if *first != name => {
                return Err(format!(
                    "{text} names another repository than {first_text}; polyarch pushes one index to one repository, so tag {name} in another target or copy the index there"
                ))
            }
            Some(_) => {}
            None => repository = Some((name, text)),
        }
        let tag = reference.tag().unwrap_or("latest").to_string();
        if !out.contains(&tag) {
            out.push(tag);
        }
    }
    match repository {
        Some((name, _)) => Ok((name, out)),
        None => Err(
            "is missing; polyarch pushes the index by tag, add tags = [\"registry.example.com/app:v1\"]"
                .into(),
        ),
    }
}

/// buildx's `key=value,…`.
fn pairs(value: &str) -> std::result::Result<Vec<(&str, &str)>, String> {
    value
        .split(',')
        .map(|pair| {
            pair.split_once('=')
                .ok_or_else(|| format!("`{pair}` in `{value}` is not key=value"))
        })
        .collect()
}

/// `type=registry,ref=REF[,mode=…]` or a bare `REF`: the reference.
fn cache_ref(value: &str) -> std::result::Result<String, String> {
    if !value.contains('=') {
        return Ok(value.to_string());
    }
    let pairs = pairs(value)?;
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    match get("type") {
        Some("registry") | None => get("ref")
            .map(str::to_string)
            .ok_or_else(|| format!("`{value}` has no ref=; write type=registry,ref=REGISTRY/REPOSITORY:TAG")),
        Some(other) => Err(format!(
            "polyarch cannot honour a cache of type={other}; use type=registry,ref=REGISTRY/REPOSITORY:TAG"
        )),
    }
}

/// `output`: only pushing to the tags' registry, which is what `polyarch build` does.
fn check_output(value: &str) -> std::result::Result<(), String> {
    let pairs = pairs(value)?;
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    match (get("type"), get("push")) {
        (Some("registry"), None | Some("true")) | (Some("image"), Some("true")) => Ok(()),
        (Some("docker"), _) => Err(format!(
            "polyarch cannot honour `{value}`: it pushes the index, it does not load a Docker image; write type=registry"
        )),
        (Some("oci"), _) => Err(format!(
            "polyarch cannot honour `{value}` in a project file; write type=registry, and use `polyarch build --output oci:DIR` for a layout"
        )),
        _ => Err(format!(
            "polyarch cannot honour `{value}`: it pushes the index to the tags' registry; write type=registry"
        )),
    }
}

enum Attest {
    Provenance,
    Sbom,
}

/// `type=provenance[,mode=…][,disabled=true]` or `type=sbom[,disabled=true]`.
fn attestation(value: &str) -> std::result::Result<(Attest, bool), String> {
    let pairs = pairs(value)?;
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let on = get("disabled") != Some("true");
    match get("type") {
        Some("provenance") => Ok((Attest::Provenance, on)),
        Some("sbom") if get("generator").is_some() => Err(format!(
            "polyarch cannot honour a generator in `{value}`: it makes the SBOM itself from the image's layers; remove generator="
        )),
        Some("sbom") => Ok((Attest::Sbom, on)),
        _ => Err(format!(
            "polyarch cannot honour `{value}`: it attaches type=provenance and type=sbom; use one of those"
        )),
    }
}

/// `id=ID,src=PATH`, `id=ID,env=NAME` or `type=env,id=ID`: the secret by id.
fn secret(value: &str) -> std::result::Result<(String, RawSecret), String> {
    let pairs = pairs(value)?;
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    };
    let id = get("id")
        .ok_or_else(|| format!("`{value}` has no id=; write id=ID,src=PATH or id=ID,env=NAME"))?;
    let src = get("src").or_else(|| get("source"));
    let env = get("env");
    let raw = match (get("type").as_deref(), src, env) {
        (_, Some(_), Some(_)) => return Err(format!("`{value}` has both src= and env=; keep one")),
        (Some("env"), Some(name), None) | (_, None, Some(name)) => RawSecret {
            file: None,
            env: Some(name),
        },
        (Some("env"), None, None) => RawSecret {
            file: None,
            env: Some(id.clone()),
        },
        (_, Some(path), None) => RawSecret {
            file: Some(path),
            env: None,
        },
        (_, None, None) => {
            return Err(format!(
                "`{value}` says nowhere to read it; add src=PATH or env=NAME"
            ))
        }
    };
    Ok((id, raw))
}

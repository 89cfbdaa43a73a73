//! `polyarch init --from FILE`: bake and compose files written as the `polyarch.yaml` that
//! means the same. The files are resolved as `load` resolves them (variables, functions,
//! matrices, `inherits`) and each chosen target becomes the very `RawImage` a load
//! validates, so the written file plans as the original does. Comments say what was
//! computed and where polyarch's meaning differs from bake's.

use super::{chosen, flatten_groups, problem, project, raw_project, read, Definition, Kind};
use crate::project::checks::Cx;
use crate::project::contexts::{NamedContext, TARGET_PREFIX};
use crate::project::raw::{Entries, RawCache, RawImage, RawSecret};
use crate::project::values::{self, Source};
use crate::project::{LoadOptions, ProjectError, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

/// A `polyarch.yaml` written from bake or compose files.
#[derive(Debug)]
pub struct Converted {
    /// The file's text.
    pub text: String,
    /// The images it declares, in its order.
    pub images: Vec<String>,
    /// The files it was written from.
    sources: Vec<PathBuf>,
}

impl Converted {
    /// Writes the file at `path`, which must not exist unless `force` (and never be one of
    /// the files it was written from); a reader never sees it half written.
    pub fn write(&self, path: &Path, force: bool) -> Result<()> {
        let same = |source: &PathBuf| {
            source
                .canonicalize()
                .ok()
                .is_some_and(|s| path.canonicalize().ok() == Some(s))
        };
        if self.sources.iter().any(same) {
            return Err(ProjectError::Usage(format!(
                "-o {}: that is a file it is written from; write polyarch.yaml elsewhere",
                path.display()
            )));
        }
        if !force && path.symlink_metadata().is_ok() {
            return Err(ProjectError::Usage(format!(
                "{} already exists; pass --force to overwrite it, or -o PATH to write elsewhere",
                path.display()
            )));
        }
        let failed = |source: std::io::Error| ProjectError::Write {
            path: path.to_path_buf(),
            source,
        };
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        // 0666 less the umask, as any new file: a temporary file's own mode is 0600.
        std::fs::create_dir_all(dir).map_err(failed)?;
        let mut file = tempfile::Builder::new()
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(failed)?;
        std::io::Write::write_all(&mut file, self.text.as_bytes()).map_err(failed)?;
        file.persist(path).map_err(|e| failed(e.error))?;
        Ok(())
    }
}

/// The targets `options.targets` names (bake's `default` group when none), and those
/// they read as `target:` contexts, as `polyarch.yaml` text whose relative paths hold from
/// `dest`, the directory it will be written in.
pub(in crate::project) fn convert(
    cx: &mut Cx,
    sources: &[PathBuf],
    files: &[(Kind, String)],
    options: &LoadOptions,
    dest: &Path,
) -> Result<Converted> {
    let definition = read(cx, files, options)?;
    let kind = files[0].0;
    let groups = flatten_groups(&definition).map_err(|p| problem(cx, p))?;
    let mut names =
        chosen(kind, &definition, &groups, options.targets).map_err(|p| problem(cx, p))?;
    let linked = linked_targets(&definition, &mut names);
    // Refused here exactly as `plan` would refuse the original.
    project(
        cx,
        kind,
        &definition,
        &LoadOptions {
            targets: &names,
            ..*options
        },
    )?;
    let mut raw = raw_project(kind, &definition, &names).map_err(|p| problem(cx, p))?;
    // `project` above applied and checked these same `--set` values.
    values::apply_overrides(&mut raw, &cx.file, options.overrides)
        .expect("overrides applied once already");
    let mut out = Writer::default();
    header(&mut out, sources, &definition, options, &groups, &names);
    out.line(0, "version: 1");
    out.line(0, "images:");
    let rebase = Rebase::new(&cx.base, dest);
    for (name, raw) in raw.images.map(|e| e.0).unwrap_or_default() {
        let fields = definition.target(&name).expect("chosen names exist");
        if let Some(description) = fields.get("description").and_then(Value::as_str) {
            out.comment(2, description);
        }
        for (_, origin) in definition.origins.iter().filter(|(t, _)| *t == name) {
            out.comment(2, origin);
        }
        if let Some(by) = linked.iter().find(|(t, _)| *t == name).map(|(_, by)| by) {
            out.comment(
                2,
                &format!("{by} reads it as a target: context; bake built it only for that, polyarch builds and pushes it first"),
            );
        }
        out.line(2, &format!("{}:", key(&name)));
        write_image(&mut out, raw, fields, &rebase);
    }
    Ok(Converted {
        text: out.text,
        images: names,
        sources: sources.to_vec(),
    })
}

/// Adds to `names` the targets their `target:` contexts read, transitively: a
/// `polyarch.yaml` must declare them. Returns each added one with the target reading it.
fn linked_targets(definition: &Definition, names: &mut Vec<String>) -> Vec<(String, String)> {
    let mut added = Vec::new();
    let mut i = 0;
    while i < names.len() {
        let by = names[i].clone();
        let contexts = definition
            .target(&by)
            .and_then(|f| f.get("contexts"))
            .and_then(Value::as_object);
        for value in contexts.into_iter().flat_map(|c| c.values()) {
            let Some(other) = value.as_str().and_then(|v| v.strip_prefix(TARGET_PREFIX)) else {
                continue;
            };
            if definition.target(other).is_some() && !names.iter().any(|n| n == other) {
                names.push(other.to_string());
                added.push((other.to_string(), by.clone()));
            }
        }
        i += 1;
    }
    added
}

fn header(
    out: &mut Writer,
    sources: &[PathBuf],
    definition: &Definition,
    options: &LoadOptions,
    groups: &std::collections::BTreeMap<String, Vec<String>>,
    names: &[String],
) {
    let sources: Vec<String> = sources.iter().map(|s| s.display().to_string()).collect();
    out.comment(
        0,
        &format!(
            "Written by `polyarch init` from {}{}.",
            sources.join(", "),
            if sources.len() > 1 {
                " (merged in bake's order)"
            } else {
                ""
            }
        ),
    );
    out.comment(
        0,
        "Variables, functions, matrices and inherits were resolved when it was written:\nthe values below are fixed, the environment no longer changes them.",
    );
    for (source, value) in &definition.variables {
        let line = match source {
            Source::Env(name) => {
                let value = value
                    .clone()
                    .or_else(|| (options.env)(name).map(Value::String));
                let value = value.map_or_else(String::new, |v| format!(" = {v}"));
                format!("{name}{value}, from the environment")
            }
            Source::Default(name) => match value {
                Some(v) => format!("{name} = {v}, its default"),
                None => format!("{name} unset: the file's default"),
            },
            Source::Set(_) | Source::Epoch(_) => continue,
        };
        out.comment(0, &format!("  {line}"));
    }
    for set in options.overrides {
        out.comment(0, &format!("  --set {set}"));
    }
    let chosen = match options.targets {
        [] => "bake's default group".to_string(),
        given => format!("the targets named ({})", given.join(", ")),
    };
    out.comment(
        0,
        &format!("`polyarch build` with no names builds every image below: {chosen}."),
    );
    let named: Vec<String> = groups
        .iter()
        .filter(|(g, members)| *g != "default" && members.iter().all(|m| names.contains(m)))
        .map(|(g, members)| format!("  {g}: {}", members.join(" ")))
        .collect();
    if !named.is_empty() {
        out.comment(
            0,
            "polyarch.yaml has no groups; name a group's images on the command line instead:",
        );
        for line in named {
            out.comment(0, &line);
        }
    }
}

/// One image's fields, in the order a person writes them, with a comment where
/// polyarch's meaning differs from the bake field it came from.
fn write_image(out: &mut Writer, raw: RawImage, fields: &super::Fields, rebase: &Rebase) {
    // bake's reader sets none of binfmt, reproducible, test and sign: bake has no such fields.
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
        binfmt: _,
        secrets,
        ssh,
        cache,
        pull,
        no_cache,
        reproducible: _,
        provenance,
        sbom,
        sign: _,
        annotations,
        test: _,
        contexts,
    } = raw;
    let bake = |key: &str| -> Vec<String> {
        match fields.get(key) {
            Some(Value::Array(items)) => items.iter().filter_map(super::scalar).collect(),
            Some(v) => super::scalar(v).into_iter().collect(),
            None => Vec::new(),
        }
    };
    let i = 4;
    if let Some(repository) = repository {
        out.line(i, &format!("repository: {}", value(&repository)));
    }
    if let Some(tags) = tags {
        out.line(i, &format!("tags: {}", flow(&tags)));
    }
    if let Some(platforms) = platforms {
        out.line(i, &format!("platforms: {}", flow(&platforms)));
    }
    if let Some(context) = context {
        out.line(i, &format!("context: {}", value(&rebase.path(&context))));
    }
    if let Some(dockerfile) = dockerfile {
        out.line(i, &format!("dockerfile: {}", value(&dockerfile)));
    }
    if let Some(target) = target {
        out.line(i, &format!("target: {}", value(&target)));
    }
    for (field, entries) in [
        ("build_args", build_args),
        ("labels", labels),
        ("annotations", annotations),
    ] {
        map(out, i, field, entries, |v| v.to_string());
    }
    if let Some(Entries(secrets)) = secrets {
        out.line(i, "secrets:");
        for (id, RawSecret { file, env }) in secrets {
            out.line(i + 2, &format!("{}:", key(&id)));
            if let Some(file) = file {
                out.line(i + 4, &format!("file: {}", value(&rebase.path(&file))));
            }
            if let Some(env) = env {
                out.line(i + 4, &format!("env: {}", value(&env)));
            }
        }
    }
    if let Some(ssh) = ssh {
        let ssh: Vec<String> = ssh
            .iter()
            .map(|spec| match spec.split_once('=') {
                Some((id, socket)) => format!("{id}={}", rebase.path(socket)),
                None => spec.clone(),
            })
            .collect();
        out.line(i, &format!("ssh: {}", flow(&ssh)));
    }
    if let Some(Entries(contexts)) = &contexts {
        for (name, written) in contexts {
            if let Some(target) = written.strip_prefix(TARGET_PREFIX) {
                out.comment(
                    i,
                    &format!("{name}: polyarch builds and pushes {target} first and reads it by digest, where bake builds it into the cache only"),
                );
            }
        }
    }
    map(
        out,
        i,
        "contexts",
        contexts,
        |written| match NamedContext::parse(written, Path::new("")) {
            Ok(NamedContext::Dir(_)) => rebase.path(written),
            _ => written.to_string(),
        },
    );
    if let Some(network) = network {
        out.line(i, &format!("network: {}", value(&network)));
    }
    if let Some(RawCache { from, to }) = cache {
        out.comment(i, &said("cache-from", &bake("cache-from")));
        out.comment(i, &said("cache-to", &bake("cache-to")));
        out.comment(
            i,
            "polyarch keeps only each ref, reads and writes one tag per platform (TAG-linux-amd64) and exports every layer (mode=max)",
        );
        out.line(i, "cache:");
        if let Some(from) = from.filter(|f| !f.is_empty()) {
            out.line(i + 2, &format!("from: {}", flow(&from)));
        }
        if let Some(to) = to {
            out.line(i + 2, &format!("to: {}", value(&to)));
        }
    }
    for (field, setting) in [("pull", pull), ("no_cache", no_cache)] {
        if let Some(setting) = setting {
            out.line(i, &format!("{field}: {}", switch(&setting)));
        }
    }
    if provenance.is_some() || sbom.is_some() {
        out.comment(i, &said("attest", &bake("attest")));
        out.comment(
            i,
            "polyarch makes its own SLSA provenance and SPDX SBOM and attaches them to each platform image as OCI referrers",
        );
    }
    for (field, setting) in [("provenance", provenance), ("sbom", sbom)] {
        if let Some(setting) = setting {
            out.line(i, &format!("{field}: {}", switch(&setting)));
        }
    }
    let output = bake("output");
    if !output.is_empty() {
        out.comment(i, &said("output", &output));
        out.comment(i, "`polyarch build` always pushes to the tags' registry");
    }
}

/// What bake's file said for `field`, for a comment; empty when it said nothing.
fn said(field: &str, entries: &[String]) -> String {
    match entries {
        [] => String::new(),
        _ => format!("bake's {field}: {}", entries.join(" ")),
    }
}

/// `true` and `false` plain, as a person writes them; anything else as any value.
fn switch(setting: &str) -> String {
    match setting {
        "true" | "false" => setting.to_string(),
        other => value(other),
    }
}

/// A mapping of strings, each value as `shown` writes it.
fn map(
    out: &mut Writer,
    indent: usize,
    field: &str,
    entries: Option<Entries<String>>,
    shown: impl Fn(&str) -> String,
) {
    let Some(Entries(entries)) = entries else {
        return;
    };
    out.line(indent, &format!("{field}:"));
    for (k, v) in entries {
        out.line(indent + 2, &format!("{}: {}", key(&k), value(&shown(&v))));
    }
}

#[derive(Default)]
struct Writer {
    text: String,
}

impl Writer {
    fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.text, "{:indent$}{text}", "");
    }

    /// A comment; line breaks in `text` (a description's) stay inside it.
    fn comment(&mut self, indent: usize, text: &str) {
        for line in text.lines() {
            self.line(indent, format!("# {line}").trim_end());
        }
    }
}

/// Relative paths as written in the original, read from `from`, written for `to`.
struct Rebase {
    from: PathBuf,
    to: PathBuf,
}

impl Rebase {
    fn new(from: &Path, to: &Path) -> Rebase {
        Rebase {
            from: absolute(from),
            to: absolute(to),
        }
    }

    /// `written` (relative to the original's directory) relative to the new file's: as
    /// written when both are one directory; lexically (`..` is not resolved through
    /// symbolic links), as polyarch joins a project file's paths.
    fn path(&self, written: &str) -> String {
        if self.from == self.to || Path::new(written).is_absolute() {
            return written.to_string();
        }
        let target = lexical(&self.from.join(written));
        let common = target
            .components()
            .zip(self.to.components())
            .take_while(|(a, b)| a == b)
            .count();
        let mut out = PathBuf::new();
        for _ in self.to.components().skip(common) {
            out.push("..");
        }
        out.extend(target.components().skip(common));
        match out.as_os_str().is_empty() {
            true => ".".into(),
            false => out.display().to_string(),
        }
    }
}

fn absolute(path: &Path) -> PathBuf {
    lexical(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// `.` left out and `..` taking the component before it away.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A value polyarch.yaml reads through `${VAR}` interpolation: `$` doubled, then quoted
/// when YAML would read it as anything but this string.
fn value(text: &str) -> String {
    key(&text.replace('$', "$$"))
}

/// A list in flow style (`[a, b]`), each item a [`value`].
fn flow(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| value(i)).collect();
    format!("[{}]", items.join(", "))
}

/// A scalar YAML reads back as exactly `text`, in block and flow context: plain when that
/// is unambiguous, else double-quoted.
fn key(text: &str) -> String {
    if plain(text) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || matches!(c, '\u{feff}' | '\u{2028}' | '\u{2029}') => {
                let _ = match u32::from(c) {
                    n @ 0..=0xffff => write!(out, "\\u{n:04X}"),
                    n => write!(out, "\\U{n:08X}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether `text` may be written plain: a word of the characters of references, paths
/// and platforms, not one YAML 1.1 or 1.2 reads as a boolean, null or number.
fn plain(text: &str) -> bool {
    let Some(first) = text.chars().next() else {
        return false;
    };
    let word = (first.is_ascii_alphanumeric() || matches!(first, '/' | '.' | '_'))
        && text.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '/' | '.' | '_' | '-' | ':' | '@' | '+' | '=' | '$')
        })
        && !text.ends_with(':');
    // YAML 1.1 readers (editors, linters) take these as booleans, and digits with
    // these as numbers, times or dates.
    let ambiguous = matches!(
        text.to_ascii_lowercase().as_str(),
        "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
    ) || (text.contains(|c: char| c.is_ascii_digit())
        && text.chars().all(|c| {
            c.is_ascii_hexdigit()
                || matches!(c, '+' | '-' | '.' | '_' | ':' | 'x' | 'X' | 'o' | 'O')
        }));
    word && !ambiguous
        && serde_norway::from_str::<serde_norway::Value>(text)
            .is_ok_and(|v| v.as_str() == Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings YAML would read otherwise, or not at all, unquoted.
    const ODD: &[&str] = &[
        "",
        " ",
        "true",
        "False",
        "yes",
        "NO",
        "on",
        "y",
        "null",
        "~",
        "1",
        "1.10",
        "0x1F",
        "0o17",
        "1e3",
        ".inf",
        "-.inf",
        ".NaN",
        "12:30",
        "2024-01-01",
        "+1",
        "-",
        "-x",
        "?",
        ":",
        "a:",
        "a: b",
        "#x",
        "a #b",
        "[a]",
        "{a}",
        "a,b",
        "*x",
        "&x",
        "!x",
        "%x",
        "@x",
        "`x`",
        "|",
        ">",
        "'q'",
        "\"q\"",
        "back\\slash",
        "line\nbreak",
        "tab\there",
        "\r",
        "\u{0}",
        "\u{7f}",
        "\u{85}",
        "\u{feff}bom",
        "\u{2028}",
        "émoji 🦀",
        " lead",
        "trail ",
        "$HOME",
        "${TAG}",
        "$$",
        "a$",
        "=",
        "a=b",
        "type=registry,ref=r/c:x,mode=max",
        "linux/arm64/v8",
        "reg.example.com:5000/team/app",
        "docker-image://alpine:3.20",
    ];

    /// Deterministic strings of the characters YAML treats specially.
    fn generated() -> Vec<String> {
        let alphabet: Vec<char> = "ab1.-_:#,[]{}&*!|>'\"%@` \t\n\\$=?~/\u{85}é"
            .chars()
            .collect();
        let mut seed: u64 = 40;
        (0..2000)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = (seed >> 60) as usize;
                (0..len)
                    .map(|k| alphabet[((seed >> (k * 4 % 56)) as usize) % alphabet.len()])
                    .collect()
            })
            .collect()
    }

    #[test]
    fn odd_strings_round_trip_as_keys_values_and_list_items() {
        for text in ODD.iter().map(|s| s.to_string()).chain(generated()) {
            let document = format!(
                "{}: {}\nlist: [{}, x]\n",
                key(&text),
                key(&text),
                key(&text)
            );
            let read: serde_norway::Value = serde_norway::from_str(&document)
                .unwrap_or_else(|e| panic!("{text:?} as {document:?}: {e}"));
            let map = read.as_mapping().expect("a mapping");
            let (k, v) = map.iter().next().expect("one entry");
            assert_eq!(
                k.as_str(),
                Some(text.as_str()),
                "key {text:?} in {document:?}"
            );
            assert_eq!(
                v.as_str(),
                Some(text.as_str()),
                "value {text:?} in {document:?}"
            );
            assert_eq!(
                read["list"][0].as_str(),
                Some(text.as_str()),
                "item {text:?} in {document:?}"
            );
        }
    }

    #[test]
    fn references_paths_and_platforms_stay_plain() {
        for text in [
            "reg.example.com/team/app",
            "v1.2.3",
            "linux/arm64/v8",
            "./src",
            "app-debug-2-1",
            "KEY=id_test",
        ] {
            assert_eq!(key(text), text);
        }
        assert_eq!(value("a$b"), "a$$b");
        assert_eq!(key("1.10"), "\"1.10\"");
    }

    #[test]
    fn paths_are_rebased_onto_the_new_directory() {
        let rebase = Rebase::new(Path::new("/p/bake"), Path::new("/p/out/deep"));
        assert_eq!(rebase.path("."), "../../bake");
        assert_eq!(rebase.path("./src/"), "../../bake/src");
        assert_eq!(rebase.path("../other"), "../../other");
        assert_eq!(rebase.path("/abs/dir"), "/abs/dir");
        let inside = Rebase::new(Path::new("/p"), Path::new("/p/sub"));
        assert_eq!(inside.path("sub/x"), "x");
        assert_eq!(inside.path("sub"), ".");
        let same = Rebase::new(Path::new("/p/./q"), Path::new("/p/q"));
        assert_eq!(same.path("./as/written"), "./as/written");
    }
}

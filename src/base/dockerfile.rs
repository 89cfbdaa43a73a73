//! Just enough Dockerfile parsing to tell whether a build executes target-platform
//! binaries (a `RUN` in a stage built for the target platform that the target stage
//! depends on), i.e. whether a foreign platform needs QEMU emulation, and which images
//! outside the context a build reads.

use std::collections::{BTreeSet, HashMap, HashSet};

/// One logical instruction: keyword (upper-cased) and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instruction {
    keyword: String,
    args: String,
    /// The (0-based) line it starts on.
    line: usize,
}

#[derive(Debug, Default)]
struct Stage {
    name: Option<String>,
    /// The `FROM` image (or stage name), as written.
    base: String,
    /// `--platform=` value, when given.
    platform: Option<String>,
    has_run: bool,
    /// Stage references from `COPY --from=` / `RUN --mount=from=`.
    copies_from: Vec<String>,
}

/// A Dockerfile split into logical instructions.
struct Parsed {
    instructions: Vec<Instruction>,
    /// The `# syntax=` parser directive: the frontend image that reads the file.
    syntax: Option<String>,
    /// False when a heredoc (`<<EOF`) never ended: what follows it cannot be trusted.
    complete: bool,
}

impl Parsed {
    /// The instructions, when they alone say what a build reads: the file is complete and
    /// read by the standard Dockerfile frontend (another frontend may read anything; an
    /// unended heredoc hides what follows it).
    fn standard_instructions(self) -> Option<Vec<Instruction>> {
        let standard = self.syntax.as_deref().is_none_or(|s| {
            let s = s.strip_prefix("docker.io/").unwrap_or(s);
            s.starts_with("docker/dockerfile:") || s == "docker/dockerfile"
        });
        (self.complete && standard).then_some(self.instructions)
    }
}

/// Splits a Dockerfile into logical instructions: handles parser directives (`escape`,
/// `syntax`), comments, blank lines, line continuations (also across comment lines) and
/// heredoc bodies (skipped: they are file contents or script, not instructions).
fn parse(dockerfile: &str) -> Parsed {
    let mut escape = '\\';
    let mut syntax = None;
    let mut lines = dockerfile.lines().enumerate().peekable();
    // Parser directives: `# key=value` lines at the very top.
    while let Some((_, line)) = lines.peek() {
        let t = line.trim();
        let Some(rest) = t.strip_prefix('#') else {
            break;
        };
        let Some((key, value)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty() || key.contains(char::is_whitespace) {
            break;
        }
        match key.as_str() {
            "escape" => {
                if let Some(c) = value.trim().chars().next() {
                    escape = c;
                }
            }
            "syntax" => syntax = Some(value.trim().to_string()),
            _ => {}
        }
        lines.next();
    }

    let mut out = vec![];
    let mut current = String::new();
    let mut complete = true;
    let mut start = 0;
    while let Some((number, line)) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            continue; // comments, also inside continuations
        }
        if current.is_empty() && trimmed.trim().is_empty() {
            continue;
        }
        if current.is_empty() {
            start = number;
        }
        let body = line.trim_end();
        match body.strip_suffix(escape) {
            Some(cont) => {
                current.push_str(cont);
                current.push(' ');
            }
            None => {
                current.push_str(body);
                for (word, strip_tabs) in heredoc_words(&current) {
                    let ended = lines.by_ref().any(|(_, l)| {
                        (if strip_tabs {
                            l.trim_start_matches('\t')
                        } else {
                            l
                        }) == word
                    });
                    complete &= ended;
                }
                push_instruction(&mut out, &current, start);
                current.clear();
            }
        }
    }
    if !current.trim().is_empty() {
        push_instruction(&mut out, &current, start);
    }
    Parsed {
        instructions: out,
        syntax,
        complete,
    }
}

/// The heredocs a `RUN`, `COPY` or `ADD` line opens (`<<EOF`, `<<-EOF`, `<<"EOF"`), in
/// order, each with whether its terminator may be indented with tabs (`<<-`).
fn heredoc_words(instruction: &str) -> Vec<(String, bool)> {
    let keyword = instruction
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    if !matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") {
        return Vec::new();
    }
    instruction
        .split_whitespace()
        .filter_map(|word| {
            let rest = word.strip_prefix("<<")?;
            let (strip_tabs, rest) = match rest.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, rest),
            };
            let name = rest.trim_matches(|c| c == '"' || c == '\'');
            let name = name
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("");
            (!name.is_empty()).then(|| (name.to_string(), strip_tabs))
        })
        .collect()
}

fn push_instruction(out: &mut Vec<Instruction>, text: &str, line: usize) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    out.push(Instruction {
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_string(),
        line,
    });
}

/// `--flag=value` options at the start of `args`, and the remaining words.
fn flags_and_words(args: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut flags = vec![];
    let mut words = vec![];
    for word in args.split_whitespace() {
        if words.is_empty() {
            if let Some(flag) = word.strip_prefix("--") {
                let (k, v) = flag.split_once('=').unwrap_or((flag, ""));
                flags.push((k.to_ascii_lowercase(), v.to_string()));
                continue;
            }
        }
        words.push(word.to_string());
    }
    (flags, words)
}

fn stages(dockerfile: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = vec![];
    for ins in parse(dockerfile).instructions {
        match ins.keyword.as_str() {
            "FROM" => {
                let (flags, words) = flags_and_words(&ins.args);
                let platform = flags
                    .iter()
                    .find(|(k, _)| k == "platform")
                    .map(|(_, v)| v.clone());
                let name = match words.as_slice() {
                    [_, as_kw, name, ..] if as_kw.eq_ignore_ascii_case("as") => {
                        Some(name.to_ascii_lowercase())
                    }
                    _ => None,
                };
                stages.push(Stage {
                    name,
                    base: words.first().cloned().unwrap_or_default(),
                    platform,
                    ..Default::default()
                });
            }
            "RUN" | "COPY" | "ADD" => {
                let Some(stage) = stages.last_mut() else {
                    continue;
                };
                let (flags, _) = flags_and_words(&ins.args);
                if ins.keyword == "RUN" {
                    stage.has_run = true;
                    // RUN --mount=type=bind,from=<stage>
                    for (k, v) in &flags {
                        if k == "mount" {
                            for part in v.split(',') {
                                if let Some(from) = part.strip_prefix("from=") {
                                    stage.copies_from.push(from.to_string());
                                }
                            }
                        }
                    }
                } else {
                    for (k, v) in flags {
                        if k == "from" {
                            stage.copies_from.push(v);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    stages
}

/// Index of the stage a reference (`FROM x`, `COPY --from=x`) names, if it is a stage:
/// a stage name (case-insensitive) or a number of an earlier stage.
fn stage_ref(stages: &[Stage], before: usize, reference: &str) -> Option<usize> {
    let r = reference.to_ascii_lowercase();
    if let Some(i) = stages[..before]
        .iter()
        .position(|s| s.name.as_deref() == Some(r.as_str()))
    {
        return Some(i);
    }
    r.parse::<usize>().ok().filter(|&i| i < before)
}

/// Whether a stage is built for the build platform rather than the target platform.
fn on_build_platform(stage: &Stage) -> bool {
    matches!(
        stage.platform.as_deref().map(|p| p.trim_matches('"')),
        Some("$BUILDPLATFORM" | "${BUILDPLATFORM}")
    )
}

/// True iff building `target` (a stage name; default the last stage) runs a `RUN` in a
/// stage built for the target platform (a `FROM` without `--platform=$BUILDPLATFORM`)
/// that the target depends on (through `FROM <stage>`, `COPY --from=<stage>`,
/// `RUN --mount=from=<stage>`). A stage based on another stage inherits its platform.
/// An unknown target counts as the last stage.
pub fn needs_emulation(dockerfile: &str, target: Option<&str>) -> bool {
    let stages = stages(dockerfile);
    if stages.is_empty() {
        return false;
    }
    let start = target
        .and_then(|t| {
            let t = t.to_ascii_lowercase();
            stages
                .iter()
                .position(|s| s.name.as_deref() == Some(t.as_str()))
        })
        .unwrap_or(stages.len() - 1);

    // Which stages run on the build platform (inheriting through FROM <stage>).
    let mut build_platform = vec![false; stages.len()];
    for i in 0..stages.len() {
        build_platform[i] = match stage_ref(&stages, i, &stages[i].base) {
            Some(parent) if stages[i].platform.is_none() => build_platform[parent],
            _ => on_build_platform(&stages[i]),
        };
    }

    let mut seen = HashSet::new();
    let mut todo = vec![start];
    while let Some(i) = todo.pop() {
        if !seen.insert(i) {
            continue;
        }
        let stage = &stages[i];
        if stage.has_run && !build_platform[i] {
            return true;
        }
        if let Some(parent) = stage_ref(&stages, i, &stage.base) {
            todo.push(parent);
        }
        for from in &stage.copies_from {
            if let Some(dep) = stage_ref(&stages, i, from) {
                todo.push(dep);
            }
        }
    }
    false
}

/// The images a build reads besides its context (`FROM`, `COPY --from=`, `RUN
/// --mount=from=` naming no stage), each with the platform it is read for (a `FROM
/// --platform=` value, else `TARGETPLATFORM`), with `ARG`s substituted from `args` (build
/// args and the platform args). None when the build reads something that can change
/// while the Dockerfile, the context and those images stay the same (`ADD` of a URL or
/// git repository, a frontend other than `docker/dockerfile`), or when a reference cannot
/// be resolved here.
pub fn external_images(
    dockerfile: &str,
    args: &HashMap<String, String>,
) -> Option<Vec<(String, String)>> {
    let platform_args = [
        "TARGETPLATFORM",
        "TARGETOS",
        "TARGETARCH",
        "TARGETVARIANT",
        "BUILDPLATFORM",
        "BUILDOS",
        "BUILDARCH",
        "BUILDVARIANT",
    ];
    let mut vars: HashMap<String, String> = args
        .iter()
        .filter(|(k, _)| platform_args.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let target = args.get("TARGETPLATFORM").cloned();
    let mut stage_names: Vec<String> = Vec::new();
    let mut images = BTreeSet::new();
    let is_stage = |names: &[String], reference: &str| {
        let r = reference.to_ascii_lowercase();
        names.contains(&r) || r.parse::<usize>().is_ok_and(|i| i < names.len())
    };
    for ins in parse(dockerfile).standard_instructions()? {
        let (flags, words) = flags_and_words(&ins.args);
        match ins.keyword.as_str() {
            // Global ARGs (before the first FROM) are what FROM lines may use.
            "ARG" if stage_names.is_empty() => declare_global_args(&words, args, &mut vars),
            "FROM" => {
                let base = substitute(words.first()?, &vars)?;
                if !base.eq_ignore_ascii_case("scratch") && !is_stage(&stage_names, &base) {
                    let platform = match flags.iter().find(|(k, _)| k == "platform") {
                        Some((_, value)) => substitute(value, &vars)?,
                        None => target.clone()?,
                    };
                    images.insert((base, platform));
                }
                let name = match words.as_slice() {
                    [_, as_kw, name, ..] if as_kw.eq_ignore_ascii_case("as") => {
                        name.to_ascii_lowercase()
                    }
                    _ => format!("#{}", stage_names.len()),
                };
                stage_names.push(name);
            }
            "ADD"
                if words
                    .iter()
                    .any(|w| w.contains("://") || w.contains("git@")) =>
            {
                return None;
            }
            "COPY" | "ADD" | "RUN" => {
                let mut sources: Vec<&str> = Vec::new();
                for (key, value) in &flags {
                    match key.as_str() {
                        "from" => sources.push(value),
                        "mount" => {
                            sources.extend(value.split(',').filter_map(|p| p.strip_prefix("from=")))
                        }
                        _ => {}
                    }
                }
                for source in sources {
                    let source = substitute(source, &vars)?;
                    if !is_stage(&stage_names, &source) {
                        images.insert((source, target.clone()?));
                    }
                }
            }
            _ => {}
        }
    }
    Some(images.into_iter().collect())
}

/// A `FROM` naming an image rather than a stage or `scratch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromImage {
    /// The (0-based) line the instruction starts on.
    pub line: usize,
    /// The image word as written (`polyarch:base`, `${BASE}`).
    pub written: String,
    /// With the global `ARG`s substituted from `args` or their defaults; None when a
    /// variable cannot be resolved here (a platform arg, say).
    pub image: Option<String>,
    /// Whether it names its own platform (`--platform=`) rather than the target's.
    pub own_platform: bool,
}

/// A global `ARG` line's variables: the build arg given for each, else its default.
fn declare_global_args(
    words: &[String],
    args: &HashMap<String, String>,
    vars: &mut HashMap<String, String>,
) {
    for word in words {
        let (name, default) = word.split_once('=').unwrap_or((word, ""));
        let value = args.get(name).map(String::as_str).unwrap_or(default);
        vars.insert(name.to_string(), value.trim_matches('"').to_string());
    }
}

/// Every `FROM` of every stage that names an image (see [`FromImage`]), in file order.
pub fn from_images(dockerfile: &str, args: &HashMap<String, String>) -> Vec<FromImage> {
    let mut vars = HashMap::new();
    let mut stage_names: Vec<String> = Vec::new();
    let mut found = Vec::new();
    for ins in parse(dockerfile).instructions {
        let (flags, words) = flags_and_words(&ins.args);
        match ins.keyword.as_str() {
            "ARG" if stage_names.is_empty() => declare_global_args(&words, args, &mut vars),
            "FROM" => {
                let Some(written) = words.first() else {
                    continue;
                };
                let image = substitute(written, &vars);
                let stage = image.as_deref().is_some_and(|i| {
                    i.eq_ignore_ascii_case("scratch")
                        || stage_names.contains(&i.to_ascii_lowercase())
                });
                if !stage {
                    found.push(FromImage {
                        line: ins.line,
                        written: written.clone(),
                        image,
                        own_platform: flags.iter().any(|(k, _)| k == "platform"),
                    });
                }
                stage_names.push(match words.as_slice() {
                    [_, as_kw, name, ..] if as_kw.eq_ignore_ascii_case("as") => {
                        name.to_ascii_lowercase()
                    }
                    _ => String::new(),
                });
            }
            _ => {}
        }
    }
    found
}

/// `$NAME`, `${NAME}`, `${NAME:-word}` and `${NAME:+word}` from `vars`; None for anything
/// else, or a name not in `vars`.
fn substitute(text: &str, vars: &HashMap<String, String>) -> Option<String> {
    let text = text.trim_matches('"');
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (expression, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}')?;
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let (name, modifier) = match expression.split_once(':') {
            Some((name, modifier)) => (name, Some(modifier)),
            None => (expression, None),
        };
        let value = vars.get(name)?;
        match modifier {
            None => out.push_str(value),
            Some(m) if m.starts_with('-') => {
                out.push_str(if value.is_empty() { &m[1..] } else { value })
            }
            Some(m) if m.starts_with('+') => {
                if !value.is_empty() {
                    out.push_str(&m[1..])
                }
            }
            Some(_) => return None,
        }
        rest = tail;
    }
    out.push_str(rest);
    (!out.is_empty() && !out.contains('$')).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::{external_images, needs_emulation};
    use std::collections::HashMap;

    fn args(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn external_images_skip_stages_and_scratch() {
        let df = "\
ARG GO=1.22
FROM --platform=$BUILDPLATFORM golang:${GO} AS build
RUN --mount=type=cache,target=/root/.cache go build
FROM scratch
COPY --from=build /out/app /app
COPY --from=alpine:3 /bin/busybox /busybox
COPY --from=0 /etc/passwd /etc/passwd
";
        let platforms = [
            ("BUILDPLATFORM", "linux/amd64"),
            ("TARGETPLATFORM", "linux/arm64"),
        ];
        assert_eq!(
            external_images(df, &args(&platforms)),
            Some(pairs(&[
                ("alpine:3", "linux/arm64"),
                ("golang:1.22", "linux/amd64")
            ]))
        );
        // A build arg overrides the default.
        let overridden = [platforms[0], platforms[1], ("GO", "1.23")];
        assert_eq!(
            external_images(df, &args(&overridden)).unwrap()[1].0,
            "golang:1.23"
        );
        assert_eq!(
            external_images("FROM scratch\nCOPY a /a\n", &args(&[])),
            Some(vec![])
        );
    }

    #[test]
    fn external_images_follow_platform_args_and_mounts() {
        let df = "FROM base-$TARGETARCH\nRUN --mount=type=bind,from=tools:1,target=/t true\n";
        let arm64 = [("TARGETARCH", "arm64"), ("TARGETPLATFORM", "linux/arm64")];
        assert_eq!(
            external_images(df, &args(&arm64)),
            Some(pairs(&[
                ("base-arm64", "linux/arm64"),
                ("tools:1", "linux/arm64")
            ]))
        );
        // ${X:-default} with X empty.
        let df = "ARG V\nFROM img:${V:-latest}\n";
        assert_eq!(
            external_images(df, &args(&arm64)),
            Some(pairs(&[("img:latest", "linux/arm64")]))
        );
    }

    #[test]
    fn heredoc_bodies_are_not_instructions() {
        let df = "\
FROM scratch
ARG TARGETARCH
COPY <<-EOF /etc/conf
\tENV DIR=elsewhere
\tFROM evil:1
\tEOF
COPY <<'A' <<B /two/
COPY a /a
A
ADD https://example.com/x /x
B
COPY bin/${TARGETARCH} /bin
";
        let arm64 = args(&[("TARGETARCH", "arm64"), ("TARGETPLATFORM", "linux/arm64")]);
        assert_eq!(external_images(df, &arm64), Some(vec![]));
        // A heredoc that never ends hides the rest: nothing can be told.
        let df = "FROM scratch\nRUN <<EOF\necho\nCOPY x /x\n";
        assert_eq!(external_images(df, &arm64), None);
        // Instructions after a heredoc still count for emulation.
        assert!(needs_emulation(
            "FROM alpine\nCOPY <<EOF /a\nx\nEOF\nRUN true\n",
            None
        ));
    }

    #[test]
    fn only_the_dockerfile_frontend_is_understood() {
        let df = "FROM scratch\nCOPY a /a\n";
        for syntax in [
            "docker/dockerfile:1",
            "docker.io/docker/dockerfile:1.7-labs",
        ] {
            let text = format!("# syntax={syntax}\n{df}");
            assert_eq!(external_images(&text, &args(&[])), Some(vec![]), "{syntax}");
        }
        let custom = format!("# syntax=example.com/frontend:2\n{df}");
        assert_eq!(external_images(&custom, &args(&[])), None);
    }

    #[test]
    fn external_images_refuse_what_cannot_be_pinned() {
        // A remote ADD can change with nothing here changing.
        assert_eq!(
            external_images(
                "FROM scratch\nADD https://example.com/a.tgz /a\n",
                &args(&[])
            ),
            None
        );
        assert_eq!(
            external_images(
                "FROM scratch\nADD git@github.com:o/r.git /src\n",
                &args(&[])
            ),
            None
        );
        // A variable that is not a declared global ARG.
        assert_eq!(external_images("FROM $UNKNOWN\n", &args(&[])), None);
        assert_eq!(
            external_images("FROM img:${V?err}\nARG V\n", &args(&[])),
            None
        );
    }

    #[test]
    fn copy_only_scratch() {
        assert!(!needs_emulation("FROM scratch\nCOPY app /app\n", None));
        assert!(!needs_emulation("", None));
    }

    #[test]
    fn cross_compile_on_build_platform() {
        let df = "\
# syntax=docker/dockerfile:1
FROM --platform=$BUILDPLATFORM golang:1.22 AS build
ARG TARGETARCH
RUN GOARCH=$TARGETARCH go build -o /out/app .

FROM scratch
COPY --from=build /out/app /app
ENTRYPOINT [\"/app\"]
";
        assert!(!needs_emulation(df, None));
        // A stage based on a build-platform stage is on the build platform too.
        let df2 = "FROM --platform=${BUILDPLATFORM} golang AS base\nFROM base AS build\nRUN go build\nFROM scratch\nCOPY --from=build /a /a\n";
        assert!(!needs_emulation(df2, None));
    }

    #[test]
    fn run_in_final_stage() {
        assert!(needs_emulation(
            "FROM alpine\nRUN apk add --no-cache curl\n",
            None
        ));
        assert!(needs_emulation(
            "from --platform=$BUILDPLATFORM golang as build\nrun go build\nfrom alpine\ncopy --from=build /a /a\nrun chmod +x /a\n",
            None
        ));
    }

    #[test]
    fn unused_stage_with_run() {
        let df = "FROM alpine AS tools\nRUN apk add git\nFROM scratch AS final\nCOPY app /app\n";
        assert!(!needs_emulation(df, None));
        assert!(needs_emulation(df, Some("tools")));
        assert!(!needs_emulation(df, Some("FINAL")));
    }

    #[test]
    fn follows_dependencies() {
        // Target-platform RUN reached through FROM <stage>.
        let df = "FROM debian AS base\nRUN apt-get update\nFROM base\nCOPY x /x\n";
        assert!(needs_emulation(df, None));
        // … through COPY --from by index.
        let df = "FROM alpine\nRUN true\nFROM scratch\nCOPY --from=0 /x /x\n";
        assert!(needs_emulation(df, None));
        // COPY --from an external image is not a stage.
        let df = "FROM scratch\nCOPY --from=alpine:3 /bin/busybox /busybox\n";
        assert!(!needs_emulation(df, None));
        // RUN --mount from a target-platform stage.
        let df = "FROM alpine AS deps\nRUN apk add x\nFROM --platform=$BUILDPLATFORM alpine\nRUN --mount=type=bind,from=deps,target=/d ls /d\n";
        assert!(needs_emulation(df, None));
    }

    #[test]
    fn continuations_comments_directives() {
        let df = "# escape=`\n\nFROM scratch\n# RUN commented out\nCOPY a `\n  /a\n";
        assert!(!needs_emulation(df, None));
        let df = "# escape=`\nFROM alpine\nR`\n";
        // `R` continued with nothing: not a RUN.
        assert!(!needs_emulation(df, None));
        let df = "FROM --platform=$BUILDPLATFORM golang AS b\nRUN go \\\n  build\nFROM alpine\nCOPY --from=b \\\n# a comment inside\n  /a /a\nrun \\\n  true\n";
        assert!(needs_emulation(df, None));
        let df = "FROM scratch\n  # indented comment RUN\nCOPY a /a\n";
        assert!(!needs_emulation(df, None));
    }
}

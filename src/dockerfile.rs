//! Just enough Dockerfile parsing to tell whether a build executes target-platform
//! binaries (a `RUN` in a stage built for the target platform that the target stage
//! depends on), i.e. whether a foreign platform needs QEMU emulation.

use std::collections::HashSet;

/// One logical instruction: keyword (upper-cased) and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instruction {
    keyword: String,
    args: String,
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

/// Splits a Dockerfile into logical instructions: handles parser directives (`escape`),
/// comments, blank lines and line continuations (also across comment lines).
fn instructions(dockerfile: &str) -> Vec<Instruction> {
    let mut escape = '\\';
    let mut lines = dockerfile.lines().peekable();
    // Parser directives: `# key=value` lines at the very top.
    while let Some(line) = lines.peek() {
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
        if key == "escape" {
            if let Some(c) = value.trim().chars().next() {
                escape = c;
            }
        }
        lines.next();
    }

    let mut out = vec![];
    let mut current = String::new();
    for line in lines {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            continue; // comments, also inside continuations
        }
        if current.is_empty() && trimmed.trim().is_empty() {
            continue;
        }
        let body = line.trim_end();
        match body.strip_suffix(escape) {
            Some(cont) => {
                current.push_str(cont);
                current.push(' ');
            }
            None => {
                current.push_str(body);
                push_instruction(&mut out, &current);
                current.clear();
            }
        }
    }
    if !current.trim().is_empty() {
        push_instruction(&mut out, &current);
    }
    out
}

fn push_instruction(out: &mut Vec<Instruction>, text: &str) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    out.push(Instruction {
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_string(),
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
    for ins in instructions(dockerfile) {
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

#[cfg(test)]
mod tests {
    use super::needs_emulation;

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

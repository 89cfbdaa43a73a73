//! The book (docs/) and README.md held to the CLI they describe: the reference pages are
//! generated from the clap definition and the JSON Schemas and must match what is
//! committed, every internal link and anchor resolves, every `polyarch …` command line of an
//! example parses with polyarch's own clap definition, and every project-file example is
//! valid against `schema/polyarch.schema.json` and loads with polyarch's project loader.
//!
//! `make docs-gen` (POLYARCH_DOCS_REFRESH=1) rewrites the generated pages instead of
//! comparing them.

// The binary's clap definition itself, not a copy: the commands that read its fields are
// the binary's, so here they are never read.
#[allow(dead_code)]
#[path = "../src/cli/args.rs"]
mod args;
#[path = "docs/markdown.rs"]
mod markdown;
#[path = "docs/reference.rs"]
mod reference;

use clap::{CommandFactory, Parser};
use markdown::Page;
use polyarch::project::{LoadOptions, Project, Purpose};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book_src() -> PathBuf {
    repo().join("docs/src")
}

/// Every generated page: its path under docs/src and what it must hold.
fn generated_pages() -> Vec<(&'static str, String)> {
    let schema = |name: &str| -> serde_norway::Value {
        let path = repo().join("schema").join(name);
        let text = std::fs::read_to_string(&path).expect("schema file");
        // YAML reads JSON and keeps the fields in the file's order.
        serde_norway::from_str(&text).expect("schema is JSON")
    };
    vec![
        (
            "reference/commands.md",
            reference::commands_page(args::Cli::command()),
        ),
        (
            "reference/project-file.md",
            reference::schema_page(
                "Project file fields",
                "schema/polyarch.schema.json",
                "Every field of `polyarch.yaml`, from `schema/polyarch.schema.json` (what \
                 `polyarch schema project` prints, for editors). A map's keys are written `*` \
                 (`images.*` is one image), a list's items `[]`. The \
                 [project file guide](../guide/project-file.md) shows them at work.",
                &schema("polyarch.schema.json"),
            ),
        ),
        (
            "reference/coverage-record.md",
            reference::schema_page(
                "Coverage record fields",
                "schema/coverage.schema.json",
                "Every field of the coverage record (`polyarch/coverage/v1`) that `build`, \
                 `verify` and `assemble` write with `--record FILE` or `--output-format json`, \
                 from `schema/coverage.schema.json` (`polyarch schema coverage`). A list's \
                 items are written `[]`. [Records](records.md) shows one and says what the \
                 statuses mean.",
                &schema("coverage.schema.json"),
            ),
        ),
        (
            "reference/gate-record.md",
            reference::schema_page(
                "Gate record fields",
                "schema/gate.schema.json",
                "Every field of the record `polyarch gate` writes (`polyarch/gate/v1`), from \
                 `schema/gate.schema.json` (`polyarch schema gate`). A list's items are \
                 written `[]`. [The deploy gate](../guide/gate.md) explains the findings.",
                &schema("gate.schema.json"),
            ),
        ),
    ]
}

#[test]
fn reference_pages_match_the_cli_and_the_schemas() {
    let refresh = std::env::var_os("POLYARCH_DOCS_REFRESH").is_some();
    let mut stale = Vec::new();
    for (page, text) in generated_pages() {
        let path = book_src().join(page);
        if refresh {
            std::fs::write(&path, &text).expect("write a generated page");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(format!("docs/src/{page}"));
        }
    }
    assert!(
        stale.is_empty(),
        "{} no longer match src/cli/args.rs and schema/*.json: run `make docs-gen` to refresh \
         them, and commit the result",
        stale.join(", ")
    );
}

/// README.md and every page of the book, by path.
fn pages() -> BTreeMap<PathBuf, Page> {
    let mut pages = BTreeMap::new();
    let readme = repo().join("README.md");
    pages.insert(readme.clone(), read_page(&readme));
    let mut dirs = vec![book_src()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read docs/src") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.insert(path.clone(), read_page(&path));
            }
        }
    }
    pages
}

fn read_page(path: &Path) -> Page {
    markdown::parse(&std::fs::read_to_string(path).expect("read a markdown page"))
}

/// `a/b/../c` → `a/c`, without asking the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// What is wrong with the internal links of `page` (at `path`): a file that is not there,
/// an anchor no heading of the target has, or a book link leaving docs/src (the built
/// book serves nothing outside it).
fn link_problems(path: &Path, page: &Page, pages: &BTreeMap<PathBuf, Page>) -> Vec<String> {
    let in_book = path.starts_with(book_src());
    let dir = path.parent().expect("a page is in a directory");
    let mut problems = Vec::new();
    for link in &page.links {
        let target = link.target.as_str();
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target, None),
        };
        let at = format!("{}:{}: `{target}`", shown(path), link.line);
        let anchors = if file.is_empty() {
            &page.anchors
        } else {
            let resolved = normalise(&dir.join(file));
            if in_book && !resolved.starts_with(book_src()) {
                problems.push(format!(
                    "{at} leaves docs/src, which the built book cannot serve; link a book \
                     page, or name the file in backticks"
                ));
                continue;
            }
            if !resolved.exists() {
                problems.push(format!("{at}: there is no {}", shown(&resolved)));
                continue;
            }
            match (anchor, pages.get(&resolved)) {
                (None, _) => continue,
                (Some(_), Some(target)) => &target.anchors,
                (Some(_), None) => {
                    problems.push(format!("{at}: an anchor into a file that is not markdown"));
                    continue;
                }
            }
        };
        if let Some(anchor) = anchor {
            if !anchors.iter().any(|a| a == anchor) {
                let target = if file.is_empty() {
                    shown(path)
                } else {
                    file.to_string()
                };
                problems.push(format!(
                    "{at}: {target} has no heading whose anchor is #{anchor}"
                ));
            }
        }
    }
    for include in &page.includes {
        let file = include.target.split(':').next().unwrap_or_default();
        if !dir.join(file).exists() {
            problems.push(format!(
                "{}:{}: {{{{#include {}}}}}: no such file",
                shown(path),
                include.line,
                include.target
            ));
        }
    }
    problems
}

#[test]
fn links_in_the_book_and_the_readme_resolve() {
    let pages = pages();
    let problems: Vec<String> = pages
        .iter()
        .flat_map(|(path, page)| link_problems(path, page, &pages))
        .collect();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_book_page_is_in_the_summary() {
    let summary_path = book_src().join("SUMMARY.md");
    let summary = read_page(&summary_path);
    let listed: Vec<PathBuf> = summary
        .links
        .iter()
        .map(|link| normalise(&book_src().join(&link.target)))
        .collect();
    let orphans: Vec<String> = pages()
        .keys()
        .filter(|path| path.starts_with(book_src()) && **path != summary_path)
        .filter(|path| !listed.contains(path))
        .map(|path| shown(path))
        .collect();
    assert!(
        orphans.is_empty(),
        "not in docs/src/SUMMARY.md, so mdBook leaves them out of the book: {}",
        orphans.join(", ")
    );
}

/// The command lines of a page's shell examples, with their line numbers: every line of a
/// `sh`/`bash`/`shell` block, the `$ ` lines of a `console` block (the others are output),
/// and lines ending in `\` joined to the next.
fn command_lines(page: &Page) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    for block in &page.blocks {
        let console = match block.language() {
            "console" => true,
            "sh" | "bash" | "shell" => false,
            _ => continue,
        };
        let mut pending: Option<(usize, String)> = None;
        for (offset, line) in block.lines.iter().enumerate() {
            let number = block.first_line + offset;
            let (start, mut text) = match pending.take() {
                Some((start, text)) => (start, text + " " + line.trim()),
                None => {
                    let line = line.trim();
                    match line.strip_prefix("$ ") {
                        Some(command) => (number, command.to_string()),
                        None if console => continue,
                        None => (number, line.to_string()),
                    }
                }
            };
            if let Some(joined) = text.strip_suffix('\\') {
                text = joined.to_string();
                pending = Some((start, text));
                continue;
            }
            commands.push((start, text));
        }
    }
    commands
}

/// The `polyarch` commands of a page's shell examples: line, the line as written, and the
/// words from `polyarch` on (a pipeline or list may hold several). `docker [OPTIONS]
/// polyarch …`, the Docker CLI plugin, counts from its `polyarch`: the options before it
/// are the Docker CLI's.
fn polyarch_commands(page: &Page) -> Vec<(usize, String, Vec<String>)> {
    let mut found = Vec::new();
    for (line, command) in command_lines(page) {
        for words in markdown::shell_commands(&command) {
            let mut words: Vec<String> =
                words.into_iter().skip_while(|w| is_assignment(w)).collect();
            if words.first().map(String::as_str) == Some("docker") {
                words = words.into_iter().skip_while(|w| w != "polyarch").collect();
            }
            if words.first().map(String::as_str) == Some("polyarch") {
                found.push((line, command.clone(), words));
            }
        }
    }
    found
}

/// The commands of `page` that polyarch's clap definition refuses, each with clap's reason.
fn command_problems(file: &str, page: &Page) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, command, words) in polyarch_commands(page) {
        if let Err(error) = args::Cli::try_parse_from(words) {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if !matches!(error.kind(), DisplayHelp | DisplayVersion) {
                let reason = error.to_string();
                let reason = reason.lines().next().unwrap_or_default();
                problems.push(format!("{file}:{line}: `{command}`: {reason}"));
            }
        }
    }
    problems
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[test]
fn polyarch_command_lines_in_examples_parse() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, page) in pages() {
        checked += polyarch_commands(&page).len();
        problems.extend(command_problems(&shown(&path), &page));
    }
    assert!(
        checked > 20,
        "only {checked} polyarch commands found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "command lines polyarch would refuse:\n{}",
        problems.join("\n")
    );
}

/// A `yaml` block whose top-level keys are all project-file fields is a `polyarch.yaml`
/// example; the others (workflows, manifests, pool files) are not checked here.
fn project_examples(page: &Page) -> Vec<(usize, String)> {
    let schema = project_schema();
    let fields = schema["properties"].as_object().expect("schema properties");
    page.blocks
        .iter()
        .filter(|block| matches!(block.language(), "yaml" | "yml"))
        .filter_map(|block| {
            let text = block.lines.join("\n");
            let value: serde_json::Value = serde_norway::from_str(&text).ok()?;
            let keys = value.as_object()?;
            (!keys.is_empty() && keys.keys().all(|key| fields.contains_key(key)))
                .then_some((block.first_line, text))
        })
        .collect()
}

fn project_schema() -> serde_json::Value {
    let text = std::fs::read_to_string(repo().join("schema/polyarch.schema.json"))
        .expect("read the project schema");
    serde_json::from_str(&text).expect("the project schema is JSON")
}

/// What the schema and the project loader find wrong with each project-file example.
fn project_example_problems(file: &str, page: &Page) -> Vec<String> {
    let validator = jsonschema::validator_for(&project_schema()).expect("a valid JSON Schema");
    // The loader reads the file as `verify -f` does: repositories, tags and platforms,
    // not the contexts; every `${VAR}` stands for `1`.
    let dir = tempfile::tempdir().expect("temporary directory");
    let lookup = |_: &str| Some("1".to_string());
    let options = LoadOptions {
        purpose: Purpose::Verify,
        overrides: &[],
        env: &lookup,
        targets: &[],
    };
    let mut problems = Vec::new();
    for (line, text) in project_examples(page) {
        let value: serde_json::Value = serde_norway::from_str(&text).expect("parsed before");
        for error in validator.iter_errors(&value) {
            problems.push(format!(
                "{file}:{line}: schema: {} (at `{}`)",
                error,
                error.instance_path()
            ));
        }
        if let Err(error) = Project::parse(&dir.path().join("polyarch.yaml"), &text, &options) {
            problems.push(format!("{file}:{line}: loader: {error}"));
        }
    }
    problems
}

#[test]
fn project_file_examples_are_valid() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, page) in pages() {
        checked += project_examples(&page).len();
        problems.extend(project_example_problems(&shown(&path), &page));
    }
    assert!(
        checked > 5,
        "only {checked} project-file examples found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "project-file examples polyarch would refuse:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_catch_a_renamed_flag_a_bad_field_and_a_broken_link() {
    let page = markdown::parse(
        "# Example\n\n```console\n$ polyarch build --platfrom linux/arm64\nbuilt\n```\n\n\
         ```yaml\nversion: 1\nimages:\n  app: {repository: r/app, tags: [v1], context: ., platfroms: [linux/arm64]}\n```\n\n\
         See [build](reference/commands.md#polyarch-biuld) and [the top](#example).\n",
    );
    let commands = command_problems("example.md", &page);
    assert_eq!(commands.len(), 1, "{commands:?}");
    assert!(commands[0].contains("--platfrom"), "{}", commands[0]);

    let fields = project_example_problems("example.md", &page);
    assert!(
        fields
            .iter()
            .any(|p| p.starts_with("example.md:9: schema:")),
        "{fields:?}"
    );
    assert!(
        fields
            .iter()
            .any(|p| p.contains("loader:") && p.contains("platfroms")),
        "{fields:?}"
    );

    let links = link_problems(&book_src().join("example.md"), &page, &pages());
    assert_eq!(links.len(), 1, "{links:?}");
    assert!(links[0].contains("#polyarch-biuld"), "{}", links[0]);
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move detail into the book (docs/)"
    );
    for command in ["make demo", "make test"] {
        assert!(
            readme.contains(command),
            "README.md no longer says `{command}`"
        );
    }
}

//! The book's reference pages (docs/src/reference/) are generated from the clap
//! definition and the JSON Schemas, and must match what is committed.
//!
//! `make docs-gen` (POLYARCH_DOCS_REFRESH=1) rewrites the generated pages instead of
//! comparing them.

// The binary's clap definition itself, not a copy: the commands that read its fields are
// the binary's, so here they are never read.
#[allow(dead_code)]
#[path = "../src/cli/args.rs"]
mod args;
#[path = "docs/reference.rs"]
mod reference;

use clap::CommandFactory;
use std::path::PathBuf;

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

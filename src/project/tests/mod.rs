use super::names::check_repository;
use super::*;
use std::fs;
use tempfile::TempDir;

mod builders;
mod file;
mod images;
mod platform_tests;
mod values;

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
        Err(e @ ProjectError::File { .. }) => {
            let shown = e.to_string();
            let ProjectError::File { field, message, .. } = e else {
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
    assert!(
        m.contains(needle),
        "{text:?}: message lacks {needle:?}: {shown}"
    );
    assert!(
        m.contains(';') || m.contains("e.g.") || m.contains("use "),
        "{text:?}: no fix: {shown}"
    );
    shown
}

/// A refused project: its text, the field the error names, the fix the message
/// mentions, and what else the shown line holds.
type Refused<'a> = (String, &'a str, &'a str, &'a [&'a str]);

/// [`expect`] for every case, and each shown line holds its case's extras; a failure
/// names the case's text.
fn expect_all(dir: &TempDir, cases: &[Refused]) {
    for (text, field, needle, shows) in cases {
        let shown = expect(dir, text, field, needle);
        for extra in *shows {
            assert!(shown.contains(extra), "{text:?}: lacks {extra:?}: {shown}");
        }
    }
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

fn job_env(name: &str) -> Option<String> {
    env_from(
        &[
            ("VERSION", "v1.4.3"),
            ("REGISTRY", "127.0.0.1:5000/demo"),
            ("BAD_TAG", "not a tag"),
        ],
        name,
    )
}

/// The value of `name` in an environment written as a table.
fn env_from(vars: &[(&str, &str)], name: &str) -> Option<String> {
    vars.iter()
        .find(|(var, _)| *var == name)
        .map(|(_, value)| value.to_string())
}

fn parse_job(dir: &TempDir, text: &str, sets: &[&str], purpose: Purpose) -> Result<Project> {
    let overrides: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    let options = LoadOptions {
        purpose,
        overrides: &overrides,
        env: &job_env,
        targets: &[],
    };
    Project::parse(&dir.path().join("polyarch.yaml"), text, &options)
}

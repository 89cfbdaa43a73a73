//! `polyarch init`: the file it writes, and how it refuses to overwrite one.

mod support;

use std::path::Path;
use support::{polyarch, run};

const BAKE: &str = r#"
variable "TAG" { default = "v1" }
group "default" { targets = ["app"] }
target "app" {
  description = "the app"
  tags = ["reg.example.com/app:${TAG}"]
  platforms = ["linux/amd64", "linux/arm64"]
  args = { VERSION = "1.10", PRICE = "$5", YES = "yes", EMPTY = "" }
  labels = { "quote" = "say \"hi\"", "hash" = "a #b" }
  attest = ["type=sbom"]
}
"#;

fn project_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("docker-bake.hcl"), BAKE).unwrap();
    dir
}

fn init(dir: &Path, args: &[&str]) -> std::process::Output {
    run(polyarch()
        .current_dir(dir)
        .env_remove("TAG")
        .arg("init")
        .args(args))
}

/// With no --from, bake's own files here are read; the file written plans with the same
/// values, odd strings (`1.10`, `$5`, `yes`, quotes) kept as strings.
#[test]
fn init_finds_the_bake_file_and_writes_polyarch_yaml() {
    let dir = project_dir();
    let out = init(dir.path(), &[]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("wrote polyarch.yaml (app)"), "{stderr}");
    let text = std::fs::read_to_string(dir.path().join("polyarch.yaml")).unwrap();
    assert!(
        text.starts_with("# Written by `polyarch init` from docker-bake.hcl."),
        "{text}"
    );
    assert!(text.contains("#   TAG = \"v1\", its default"), "{text}");
    assert!(text.contains("  # the app\n  app:\n"), "{text}");
    assert!(text.contains("    tags: [v1]\n"), "{text}");
    assert!(text.contains("    sbom: true\n"), "{text}");

    let project = polyarch::project::Project::load(
        &dir.path().join("polyarch.yaml"),
        &polyarch::project::LoadOptions {
            purpose: polyarch::project::Purpose::Verify,
            env: &|_| None,
            ..Default::default()
        },
    )
    .unwrap();
    let app = &project.images[0];
    assert_eq!(app.repository, "reg.example.com/app");
    let args: Vec<(&str, &str)> = app
        .build_args
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        args,
        [
            ("EMPTY", ""),
            ("PRICE", "$5"),
            ("VERSION", "1.10"),
            ("YES", "yes")
        ]
    );
    assert_eq!(app.labels["quote"], "say \"hi\"");
    assert_eq!(app.labels["hash"], "a #b");
    assert!(app.sbom);
}

/// An existing polyarch.yaml is kept (exit 2, naming it and the fix) unless --force;
/// `-o -` writes to standard output and touches no file.
#[test]
fn init_keeps_an_existing_file_unless_forced() {
    let dir = project_dir();
    std::fs::write(dir.path().join("polyarch.yaml"), "mine\n").unwrap();
    let out = init(dir.path(), &["--from", "docker-bake.hcl"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("polyarch.yaml already exists; pass --force to overwrite it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("polyarch.yaml")).unwrap(),
        "mine\n"
    );

    let out = init(dir.path(), &["-o", "-"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("version: 1\nimages:\n"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("polyarch.yaml")).unwrap(),
        "mine\n"
    );

    let out = init(dir.path(), &["--force"]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(dir.path().join("polyarch.yaml")).unwrap();
    assert!(text.contains("version: 1"), "{text}");
}

/// What polyarch cannot build is refused as `plan` refuses it: exit 2 naming the
/// target's field; nothing is written.
#[test]
fn init_refuses_what_plan_refuses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("docker-bake.hcl"),
        "target \"default\" {\n  tags = [\"reg.example.com/a:1\"]\n  platforms = [\"linux/amd64\"]\n  shm-size = \"2g\"\n}\n",
    )
    .unwrap();
    let out = init(dir.path(), &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("docker-bake.hcl: target.default.shm-size: polyarch cannot honour it"),
        "{stderr}"
    );
    assert!(!dir.path().join("polyarch.yaml").exists());

    let empty = tempfile::tempdir().unwrap();
    let out = init(empty.path(), &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --from FILE"));
}

//! `SOURCE_DATE_EPOCH`: the same inputs built twice from scratch (`--no-cache`, another
//! registry, a copy of the context whose files have other times) push the same index
//! digest, whether the engine clamps the time stamps (containerd's image store pushing
//! itself) or polyarch does (an image exported from the engine's store).

mod support;

use std::fs;
use std::path::Path;
use std::process::Command;
use support::{hello_context, polyarch, run, skopeo_digest, unique_name, write_project, Registry};

const DOCKERFILE: &str = "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY notes.txt /notes.txt\nENTRYPOINT [\"/bin/busybox\", \"echo\", \"hello\"]\n";

/// A context in `dir` whose files all have modification time `mtime`.
fn context(dir: &Path, mtime: &str) {
    hello_context(dir, DOCKERFILE);
    fs::write(dir.join("notes.txt"), "release notes\n").unwrap();
    let status = Command::new("find")
        .arg(dir)
        .args(["-exec", "touch", "-h", "-d", mtime, "{}", "+"])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Builds the context in a fresh directory into a fresh registry with `epoch`; the
/// index digest and polyarch's output.
fn build(mtime: &str, epoch: &str) -> String {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    context(dir.path(), mtime);
    let repository = registry.repo(&unique_name("demo/reproducible"));
    let file = write_project(
        dir.path(),
        &repository,
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let out = run(polyarch()
        .args(["build", "--no-cache", "-f"])
        .arg(&file)
        .env("SOURCE_DATE_EPOCH", epoch));
    let output = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{output}");
    skopeo_digest(&format!("{repository}:v1"), None)
}

#[test]
fn the_same_inputs_push_the_same_digest() {
    let first = build("2026-01-02 03:04:05", "1700000000");
    let second = build("2026-06-07 08:09:10", "1700000000");
    assert_eq!(first, second, "two builds of the same inputs");
    let other_epoch = build("2026-01-02 03:04:05", "1700000001");
    assert_ne!(first, other_epoch, "the epoch is in the images");
}

/// `git -C dir ARGS` with a fixed author and commit date and no user configuration.
fn git(dir: &Path, args: &[&str]) {
    let out = run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=polyarch",
            "-c",
            "user.email=polyarch@example.org",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", "2026-01-02T03:04:05Z")
        .env("GIT_COMMITTER_DATE", "2026-01-02T03:04:05Z"));
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the checkout `dir` (`reproducible: true`, no SOURCE_DATE_EPOCH) with `--no-cache`
/// into a fresh registry; the index digest and the coverage record.
fn build_checkout(dir: &Path) -> (String, serde_json::Value) {
    let registry = Registry::start();
    let repository = registry.repo(&unique_name("demo/from-git"));
    fs::write(
        dir.join("polyarch.yaml"),
        format!("version: 1\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    reproducible: true\n"),
    )
    .unwrap();
    let out = run(polyarch()
        .args(["build", "--no-cache", "--output-format", "json", "-f"])
        .arg(dir.join("polyarch.yaml"))
        .env_remove("SOURCE_DATE_EPOCH"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = support::skopeo_config(&format!("{repository}:v1"), "arm64", None);
    assert_eq!(config["created"], "2026-01-02T03:04:05Z", "{config}");
    let record = serde_json::from_slice(&out.stdout).unwrap();
    (skopeo_digest(&format!("{repository}:v1"), None), record)
}

#[test]
fn reproducible_true_takes_the_commit_time_from_git() {
    let first = tempfile::tempdir().unwrap();
    context(first.path(), "2026-01-02 03:04:05");
    git(first.path(), &["init", "-q"]);
    git(first.path(), &["add", "Dockerfile", "bin", "notes.txt"]);
    git(first.path(), &["commit", "-qm", "release"]);
    // A clone has the same commit and other file times.
    let second = tempfile::tempdir().unwrap();
    git(
        first.path(),
        &["clone", "-q", ".", &second.path().display().to_string()],
    );
    let (one, record) = build_checkout(first.path());
    let (two, _) = build_checkout(second.path());
    assert_eq!(one, two, "two builds of the same commit");
    let values = record["values"].as_array().expect("values recorded");
    assert!(
        values
            .iter()
            .any(|v| v["field"] == "images.hello.source_date_epoch"
                && v["source"].as_str().is_some_and(|s| s.starts_with("git:"))),
        "{record}"
    );

    // Outside a checkout it is a project error naming the field.
    let outside = tempfile::tempdir().unwrap();
    context(outside.path(), "2026-01-02 03:04:05");
    fs::write(
        outside.path().join("polyarch.yaml"),
        "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:9/x\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n    reproducible: true\n",
    )
    .unwrap();
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(outside.path().join("polyarch.yaml"))
        .env_remove("SOURCE_DATE_EPOCH")
        .env("GIT_CEILING_DIRECTORIES", outside.path().parent().unwrap()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("images.hello.reproducible") && stderr.contains("not in a git checkout"),
        "{stderr}"
    );
}

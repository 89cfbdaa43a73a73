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

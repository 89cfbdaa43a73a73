//! `polyarch buildx build …`: a `docker buildx build` line, unchanged but for its first
//! words, builds, pushes and verifies the index as `polyarch build` does, and writes what
//! buildx writes after a build, with the values the registry shows. tests/buildx_reference.rs
//! runs lines both ways against buildx 0.29.1 itself.

mod support;

use std::process::{Command, Output};
use support::{hello_context, platforms_of, polyarch, run, unique_name, Registry, HELLO};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The index as the registry serves it: its bytes' digest, size and JSON.
fn raw_index(reference: &str) -> (String, u64, serde_json::Value) {
    let out = run(Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{reference}")));
    assert!(out.status.success(), "skopeo: {}", stderr(&out));
    (
        polyarch::base::oci::sha256_digest(&out.stdout),
        out.stdout.len() as u64,
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[test]
fn the_buildx_line_pushes_one_index_of_its_platforms_and_writes_buildx_metadata() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("buildx/hello"));
    let (v1, latest) = (format!("{repo}:v1"), format!("{repo}:latest"));

    let out = run(polyarch()
        .current_dir(dir.path())
        .args(["buildx", "build", "--platform", "linux/amd64,linux/arm64"])
        .args(["-t", &v1, "-t", &latest, "--push"])
        .args(["--metadata-file", "m.json", "--iidfile", "id", "."])
        .env("CI", "true"));
    assert_eq!(out.status.code(), Some(0), "buildx build: {}", stderr(&out));

    // Read back by an independent client: one index of exactly the two platforms.
    let (digest, size, index) = raw_index(&v1);
    assert_eq!(platforms_of(&index), ["linux/amd64", "linux/arm64"]);
    assert_eq!(raw_index(&latest).0, digest, "both tags name the index");

    // buildx's keys, with the values the registry shows.
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("m.json")).unwrap()).unwrap();
    assert_eq!(
        metadata,
        serde_json::json!({
            "containerimage.digest": digest,
            "image.name": format!("{v1},{latest}"),
            "containerimage.descriptor": {
                "mediaType": index["mediaType"],
                "digest": digest,
                "size": size,
            },
        })
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("id")).unwrap(),
        digest
    );

    // -q: the digest alone on stdout (the inputs are unchanged: the same index).
    let out = run(polyarch()
        .current_dir(dir.path())
        .args([
            "buildx",
            "build",
            "-q",
            "--platform",
            "linux/amd64,linux/arm64",
        ])
        .args(["-t", &v1, "--push", "."]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "buildx build -q: {}",
        stderr(&out)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{digest}\n"));
}

#[test]
fn flags_polyarch_cannot_honour_exit_2_naming_the_flag_and_what_to_use() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
    for (flag, instead) in [
        ("--load", "--push"),
        ("--builder=mybuilder", "DOCKER_CONTEXT"),
        ("--output=type=docker", "--output type=oci,dest=PATH"),
        ("--build-context=base=target:base", "`contexts:`"),
        ("--build-context=base=oci-layout:///l", "docker-image://REF"),
        ("--sbom=generator=docker/scanner", "no scanner image"),
        ("--frobnicate", ""),
    ] {
        let out = run(polyarch().current_dir(dir.path()).args([
            "buildx",
            "build",
            "-t",
            "127.0.0.1:1/app:v1",
            flag,
            ".",
        ]));
        let message = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {message}");
        let name = flag.split('=').next().unwrap();
        assert!(message.contains(name), "{flag}: {message}");
        assert!(message.contains(instead), "{flag}: {message}");
        assert!(out.stdout.is_empty(), "{flag}: printed {:?}", out.stdout);
    }
}

#[test]
fn without_push_or_output_it_builds_and_says_nothing_was_shipped() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let out = run(polyarch()
        .current_dir(dir.path())
        .args([
            "buildx",
            "build",
            "--platform",
            "linux/amd64",
            "--progress=plain",
        ])
        .args(["--iidfile", "id", "."]));
    assert_eq!(out.status.code(), Some(0), "buildx build: {}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing is shipped"),
        "no warning: {}",
        stderr(&out)
    );
    let digest = std::fs::read_to_string(dir.path().join("id")).unwrap();
    assert!(digest.starts_with("sha256:"), "{digest}");
}

#[test]
fn docker_polyarch_buildx_build_runs_the_same_line() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let config = tempfile::tempdir().unwrap();
    let plugins = config.path().join("cli-plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_polyarch"),
        plugins.join("docker-polyarch"),
    )
    .unwrap();
    let reference = format!("{}:v1", registry.repo(&unique_name("buildx/plugin")));
    let out = run(Command::new("docker")
        .current_dir(dir.path())
        .args([
            "polyarch",
            "buildx",
            "build",
            "-q",
            "--platform",
            "linux/amd64",
        ])
        .args(["-t", &reference, "--push", "."])
        .env("DOCKER_CONFIG", config.path()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "docker polyarch: {}",
        stderr(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", raw_index(&reference).0)
    );
}

//! The core pipeline against the real engine and a real registry: what a user (and an
//! independent client) sees after `polyarch build`.

mod support;

use serde_json::Value;
use std::process::{Command, Output};
use support::{
    hello_context, platforms_of, polyarch, run, skopeo_config, skopeo_digest, skopeo_inspect_raw,
    unique_name, write_project, Registry, HELLO,
};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn tags_of(reference_repo: &str) -> Vec<String> {
    let out = Command::new("skopeo")
        .args(["list-tags", "--tls-verify=false"])
        .arg(format!("docker://{reference_repo}"))
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["Tags"]
        .as_array()
        .map(|t| t.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn two_platform_image_is_one_index_with_exactly_the_declared_platforms() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("demo/hello"));
    let file = write_project(
        dir.path(),
        &repo,
        "[v1, latest]",
        "[linux/amd64, linux/arm64]",
    );
    // A name of its own, so other tests' builds on the shared engine never count as leftovers.
    let name = unique_name("twoplat");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("  hello:", &format!("  {name}:"))).unwrap();
    let record_path = dir.path().join("coverage.json");

    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .arg("--record")
        .arg(&record_path)
        .args(["--output-format", "json"]));
    assert_eq!(out.status.code(), Some(0), "build failed: {}", stderr(&out));

    // An independent client sees one OCI index with exactly the two platforms.
    let index = skopeo_inspect_raw(&format!("{repo}:v1"));
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(platforms_of(&index), ["linux/amd64", "linux/arm64"]);
    let manifests = index["manifests"].as_array().unwrap();
    assert!(
        manifests.iter().all(|m| m.get("annotations").is_none()),
        "attestation-like entries: {index}"
    );
    for (arch, _) in [("amd64", ()), ("arm64", ())] {
        let config = skopeo_config(&format!("{repo}:latest"), arch, None);
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["os"], "linux");
    }

    // Two tags, one index; no per-platform tags left behind.
    let v1 = skopeo_digest(&format!("{repo}:v1"), None);
    assert_eq!(v1, skopeo_digest(&format!("{repo}:latest"), None));
    let mut tags = tags_of(&repo);
    tags.sort();
    assert_eq!(tags, ["latest", "v1"]);

    // The record's digests are the registry's.
    let stdout: Value = serde_json::from_slice(&out.stdout).expect("record on stdout");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    assert_eq!(stdout["images"], record["images"]);
    assert_eq!(record["schema"], "polyarch/coverage/v1");
    assert_eq!(record["covered"], true);
    let image = &record["images"][0];
    assert_eq!(image["digest"], v1.as_str());
    assert_eq!(image["pinned"], format!("{repo}@{v1}"));
    assert_eq!(image["attestations"], serde_json::json!([]));
    assert_eq!(image["missing"], serde_json::json!([]));
    for (entry, platform) in manifests.iter().zip(image["platforms"].as_array().unwrap()) {
        assert_eq!(platform["digest"], entry["digest"]);
        assert_eq!(platform["status"], "ok");
        assert_eq!(platform["config_platform"], platform["platform"]);
    }

    // The engine pulls the arm64 image and finds an arm64 config. containerd's image store
    // keeps the whole index under the tag, and `image inspect` there describes the host's
    // platform: name the arm64 entry by its digest.
    let reference = match support::engines::engine_pushes_itself() {
        true => format!("{repo}@{}", manifests[1]["digest"].as_str().unwrap()),
        false => format!("{repo}:v1"),
    };
    let pulled = Command::new("docker")
        .args(["pull", "-q", "--platform", "linux/arm64", &reference])
        .output()
        .unwrap();
    assert!(
        pulled.status.success(),
        "docker pull: {}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let arch = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Architecture}}",
            &reference,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&arch.stdout).trim(), "arm64");
    let _ = Command::new("docker")
        .args(["rmi", "-f", &reference])
        .output();

    // Nothing polyarch created is left in the engine.
    let leftovers = Command::new("docker")
        .args(["images", "-q", "--filter"])
        .arg(format!("reference=polyarch-build/{name}:*"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&leftovers.stdout).trim().is_empty());
}

#[test]
fn failing_dockerfile_exits_3_and_pushes_nothing() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), "FROM scratch\nCOPY does-not-exist /x\n");
    let repo = registry.repo(&unique_name("demo/broken"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: build of hello for linux/"),
        "{err}"
    );
    assert!(last.contains("does-not-exist"), "{err}");
    assert!(
        err.contains("build log (failed):"),
        "the failing platform's log is not shown: {err}"
    );
    assert!(tags_of(&repo).is_empty(), "something was tagged");
}

/// On the containerd store both platforms build in one solve; a step that fails for one
/// platform only is still reported against that platform, with its log.
#[test]
fn a_step_failing_for_one_platform_names_that_platform() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY amd64-only-${TARGETARCH}.txt /x\n",
    );
    std::fs::write(dir.path().join("amd64-only-amd64.txt"), "x").unwrap();
    let repo = registry.repo(&unique_name("demo/one-fails"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: build of hello for linux/arm64 failed"),
        "{err}"
    );
    assert!(last.contains("amd64-only-arm64.txt"), "{err}");
    assert!(tags_of(&repo).is_empty(), "something was tagged");
}

#[test]
fn bad_project_files_exit_2_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let cases = [
        (
            "platforms: [linux/amd64, linux/arm64/v8, linux/arm64]",
            "images.hello.platforms[2]",
        ),
        (
            "platforms: [linux/amd64]\n    platfroms: [x]",
            "images.hello.platfroms",
        ),
        ("platforms: [linux/amd64/v9/z]", "images.hello.platforms[0]"),
        ("platforms: []", "images.hello.platforms"),
        ("platforms: linux/amd64", "images.hello.platforms"),
    ];
    for (platform_line, field) in cases {
        let file = dir.path().join("polyarch.yaml");
        std::fs::write(
            &file,
            format!("version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:1/x\n    tags: [v1]\n    context: .\n    {platform_line}\n"),
        )
        .unwrap();
        let out = run(polyarch().args(["build", "-f"]).arg(&file));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{platform_line}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{platform_line}: not one line: {err}"
        );
        assert!(
            err.contains(field),
            "{platform_line}: {err} does not name {field}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let file = dir.path().join("v2.yaml");
    std::fs::write(&file, "version: 2\nimages: {}\n").unwrap();
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("version 1"), "{}", stderr(&out));
}

#[test]
fn oci_layout_output_is_verified_and_accepted_by_skopeo() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = write_project(
        dir.path(),
        "127.0.0.1:1/unused/hello",
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let layout = dir.path().join("out");
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .arg("--output")
        .arg(format!("oci:{}", layout.display())));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(layout.join("oci-layout").is_file() && layout.join("index.json").is_file());

    let verified = run(polyarch()
        .arg("verify")
        .arg(format!("oci:{}:v1", layout.display()))
        .args([
            "--platform",
            "linux/amd64,linux/arm64",
            "--output-format",
            "json",
        ]));
    assert_eq!(verified.status.code(), Some(0), "{}", stderr(&verified));
    let record: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(record["covered"], true);

    let inspect = Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:v1", layout.display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let index: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2);

    let target = registry.repo(&unique_name("copied/hello"));
    let copy = Command::new("skopeo")
        .args(["copy", "--all", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://{target}:v1"))
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let copied = run(polyarch()
        .arg("verify")
        .arg(format!("{target}:v1"))
        .args(["--platform", "linux/amd64,linux/arm64"]));
    assert_eq!(copied.status.code(), Some(0), "{}", stderr(&copied));
}

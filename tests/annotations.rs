//! OCI annotations from the project file and `--annotation`, as a registry and skopeo see
//! them after `polyarch build`, on whichever engine `DOCKER_HOST` names (the classic store
//! writes its manifests through polyarch, the containerd store through BuildKit).

mod support;

use serde_json::Value;
use std::fs;
use std::path::Path;
use support::{hello_context, polyarch, run, skopeo_inspect_raw, unique_name, Registry, HELLO};

fn project(dir: &Path, repository: &str, version: &str) -> std::path::PathBuf {
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    annotations:\n      index,manifest:org.opencontainers.image.source: https://example.org/hello\n      org.opencontainers.image.version: \"{version}\"\n"
        ),
    )
    .unwrap();
    file
}

fn annotation<'a>(manifest: &'a Value, key: &str) -> Option<&'a str> {
    manifest["annotations"][key].as_str()
}

/// Each platform manifest of the index at `reference`, as the registry serves it.
fn manifests(repository: &str, index: &Value) -> Vec<Value> {
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            skopeo_inspect_raw(&format!(
                "{repository}@{}",
                entry["digest"].as_str().unwrap()
            ))
        })
        .collect()
}

#[test]
fn annotations_reach_the_index_and_every_manifest_and_follow_changes() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repository = registry.repo(&unique_name("demo/annotated"));
    let file = project(dir.path(), &repository, "1.0");
    let record = dir.path().join("record.json");
    let build = |extra: &[&str]| {
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .arg("--record")
            .arg(&record)
            .args(extra));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    build(&[
        "--annotation",
        "index:org.opencontainers.image.description=says hello",
    ]);

    let index = skopeo_inspect_raw(&format!("{repository}:v1"));
    assert_eq!(
        annotation(&index, "org.opencontainers.image.source"),
        Some("https://example.org/hello"),
        "{index}"
    );
    assert_eq!(
        annotation(&index, "org.opencontainers.image.description"),
        Some("says hello")
    );
    // Only platform manifests, annotated or not: still no attestation entries.
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2);
    for manifest in manifests(&repository, &index) {
        assert_eq!(
            annotation(&manifest, "org.opencontainers.image.source"),
            Some("https://example.org/hello"),
            "{manifest}"
        );
        assert_eq!(
            annotation(&manifest, "org.opencontainers.image.version"),
            Some("1.0")
        );
        assert_eq!(
            annotation(&manifest, "org.opencontainers.image.description"),
            None
        );
    }
    let written: Value = serde_json::from_slice(&fs::read(&record).unwrap()).unwrap();
    let image = &written["images"][0];
    assert_eq!(
        image["annotations"]["org.opencontainers.image.description"],
        "says hello"
    );
    assert!(image["warnings"].is_null(), "{image}");
    for platform in image["platforms"].as_array().unwrap() {
        assert_eq!(
            platform["annotations"]["org.opencontainers.image.version"],
            "1.0"
        );
    }

    // A new version is a new manifest, even though the image itself is unchanged.
    project(dir.path(), &repository, "1.1");
    build(&[]);
    let index = skopeo_inspect_raw(&format!("{repository}:v1"));
    assert_eq!(
        annotation(&index, "org.opencontainers.image.description"),
        None
    );
    for manifest in manifests(&repository, &index) {
        assert_eq!(
            annotation(&manifest, "org.opencontainers.image.version"),
            Some("1.1"),
            "{manifest}"
        );
    }
}

#[test]
fn a_bad_annotation_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:5000/x\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n    annotations:\n      layer:org.example.x: y\n",
    )
    .unwrap();
    let out = run(polyarch().args(["plan", "-f"]).arg(&file));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("images.hello.annotations.layer:org.example.x") && err.contains("index:"),
        "{err}"
    );
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .args(["--annotation", "org.example.x"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no `=`"), "{err}");
}

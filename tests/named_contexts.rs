//! Named build contexts (`contexts:` in polyarch.yaml, `--build-context` on the buildx
//! line): a directory (with its own `.dockerignore`), `docker-image://REF` and
//! `target:IMAGE` reach the Dockerfile's `FROM NAME` and `COPY --from=NAME` through
//! BuildKit's frontend, on engines whose BuildKit reads them (Docker 23+); the warm path
//! reuses a build until a file the named directory serves changes. Docker 20.10's BuildKit
//! 0.8 ignores them: the build is refused before it starts.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use support::engines::docker26_cli;
use support::{curl, layer_digests, polyarch, run, skopeo_inspect_raw, unique_name, Registry};

const ARCHES: [&str; 2] = ["amd64", "arm64"];

/// Whether the engine the tests build on (`DOCKER_HOST`) has Docker 23's API or later.
fn engine_reads_named_contexts() -> bool {
    let out = run(Command::new("docker").args(["version", "--format", "{{.Server.APIVersion}}"]));
    assert!(out.status.success(), "docker version: {out:?}");
    let api = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut parts = api.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (1, 42)
}

/// Every regular file of `reference`'s linux/`arch` image (its layers applied in
/// order, no whiteouts expected), with its content.
fn files(registry: &Registry, reference: &str, arch: &str) -> BTreeMap<String, String> {
    let index = skopeo_inspect_raw(reference);
    let entry = index["manifests"]
        .as_array()
        .expect("an index")
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap_or_else(|| panic!("{reference} has no {arch} entry: {index}"))
        .clone();
    let repository = reference.rsplit_once(':').unwrap().0;
    let manifest = skopeo_inspect_raw(&format!(
        "{repository}@{}",
        entry["digest"].as_str().unwrap()
    ));
    let path = repository.split_once('/').unwrap().1;
    let mut out = BTreeMap::new();
    for layer in manifest["layers"].as_array().unwrap() {
        let blob = curl(&[&format!(
            "{}/v2/{path}/blobs/{}",
            registry.url(),
            layer["digest"].as_str().unwrap()
        )]);
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&blob[..]));
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.header().entry_type().is_file() {
                let name = format!("/{}", entry.path().unwrap().display());
                let mut text = String::new();
                entry.read_to_string(&mut text).unwrap();
                out.insert(name, text);
            }
        }
    }
    out
}

/// The layer digests of `reference`'s linux/`arch` image.
fn layers(reference: &str, arch: &str) -> Vec<String> {
    let index = skopeo_inspect_raw(reference);
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap()
        .clone();
    let repository = reference.rsplit_once(':').unwrap().0;
    let manifest = skopeo_inspect_raw(&format!(
        "{repository}@{}",
        entry["digest"].as_str().unwrap()
    ));
    layer_digests(&manifest)
}

/// `polyarch build` of `file` with its own cache directory: exit code, stderr, record.
fn build(file: &Path) -> (Option<i32>, String, serde_json::Value) {
    let out = run(polyarch()
        .args(["build", "--output-format", "json", "-f"])
        .arg(file)
        .env("POLYARCH_CACHE_DIR", file.parent().unwrap().join("cache")));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let record = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (out.status.code(), stderr, record)
}

/// Whether every platform of image `name` in the record was reused without a build.
fn reused(record: &serde_json::Value, name: &str) -> bool {
    let image = record["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {record}"));
    image["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["build"]["reused"] == true)
}

/// A FROM-scratch image holding `/tool.txt`, pushed to `repository:v1` by polyarch, for
/// the `docker-image://` contexts.
fn push_tools(dir: &Path, repository: &str) {
    let context = dir.join("tools");
    fs::create_dir_all(&context).unwrap();
    fs::write(
        context.join("Dockerfile"),
        "FROM scratch\nCOPY tool.txt /tool.txt\n",
    )
    .unwrap();
    fs::write(context.join("tool.txt"), format!("tool of {repository}\n")).unwrap();
    let file = support::write_project(&context, repository, "[v1]", "[linux/amd64, linux/arm64]");
    let (code, stderr, _) = build(&file);
    assert_eq!(code, Some(0), "{stderr}");
}

/// A directory context with an ignored file in it.
fn assets(dir: &Path, unique: &str) -> std::path::PathBuf {
    let assets = dir.join("assets");
    fs::create_dir_all(&assets).unwrap();
    fs::write(assets.join("x"), format!("x one {unique}\n")).unwrap();
    fs::write(assets.join("secret.txt"), "never sent\n").unwrap();
    fs::write(assets.join(".dockerignore"), "secret.txt\n").unwrap();
    assets
}

#[test]
fn named_contexts_serve_a_directory_an_image_and_another_image_of_the_project() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let unique = unique_name("ctx");
    let [base, app, tools] =
        ["base", "app", "tools"].map(|name| registry.repo(&unique_name(&format!("ctx/{name}"))));
    assets(dir.path(), &unique);
    for name in ["base", "app"] {
        fs::create_dir_all(dir.path().join(name)).unwrap();
    }
    fs::write(
        dir.path().join("base/Dockerfile"),
        "FROM scratch\nCOPY base.txt /base.txt\n",
    )
    .unwrap();
    fs::write(dir.path().join("base/base.txt"), format!("base {unique}\n")).unwrap();
    fs::write(
        dir.path().join("app/Dockerfile"),
        "FROM base\nCOPY --from=assets / /assets/\nCOPY --from=tools /tool.txt /tool.txt\n",
    )
    .unwrap();
    let file = dir.path().join("polyarch.yaml");
    let image = |name: &str, repository: &str, extra: &str| {
        format!("  {name}:\n    repository: {repository}\n    tags: [v1]\n    context: {name}\n    platforms: [linux/amd64, linux/arm64]\n{extra}")
    };
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n{}{}",
            image(
                "app",
                &app,
                &format!("    contexts:\n      assets: assets\n      base: target:base\n      tools: docker-image://{tools}:v1\n")
            ),
            image("base", &base, "")
        ),
    )
    .unwrap();

    if !engine_reads_named_contexts() {
        let (code, stderr, _) = build(&file);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("images.app.contexts.") && stderr.contains("older than 0.10"),
            "{stderr}"
        );
        let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(error.len(), 1, "one line: {stderr}");
        return;
    }
    push_tools(dir.path(), &tools);

    let (code, stderr, record) = build(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !reused(&record, "app") && !reused(&record, "base"),
        "{record}"
    );
    for arch in ARCHES {
        let got = files(&registry, &format!("{app}:v1"), arch);
        let wanted: BTreeMap<String, String> = [
            ("/base.txt", format!("base {unique}\n")),
            ("/assets/x", format!("x one {unique}\n")),
            ("/assets/.dockerignore", "secret.txt\n".to_string()),
            ("/tool.txt", format!("tool of {tools}\n")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(got, wanted, "{arch}");
        // `FROM base` is the base image just pushed, layer for layer.
        assert_eq!(
            layers(&format!("{app}:v1"), arch)[0],
            layers(&format!("{base}:v1"), arch)[0]
        );
    }

    // Nothing changed, or only a file the directory's .dockerignore keeps out: reused.
    let (code, stderr, record) = build(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        reused(&record, "app") && reused(&record, "base"),
        "{record}"
    );
    fs::write(dir.path().join("assets/secret.txt"), "still never sent\n").unwrap();
    let (_, _, record) = build(&file);
    assert!(reused(&record, "app"), "an ignored file changed: {record}");

    // A file the named directory serves changed: app is built again, base is not.
    fs::write(dir.path().join("assets/x"), "x two\n").unwrap();
    let (code, stderr, record) = build(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !reused(&record, "app") && reused(&record, "base"),
        "{record}"
    );
    for arch in ARCHES {
        assert_eq!(
            files(&registry, &format!("{app}:v1"), arch)["/assets/x"],
            "x two\n"
        );
    }

    // `--build-context` on `polyarch build` replaces the file's entry of that name.
    let other = dir.path().join("other-assets");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("x"), "x from the flag\n").unwrap();
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .arg("--build-context")
        .arg(format!("assets={}", other.display()))
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for arch in ARCHES {
        let got = files(&registry, &format!("{app}:v1"), arch);
        assert_eq!(got["/assets/x"], "x from the flag\n");
        assert!(!got.contains_key("/assets/.dockerignore"), "{got:?}");
    }
}

/// `polyarch buildx build --build-context …` and Docker 26.1's buildx 0.13.1 with the same
/// line push the same files. The tools image's two platforms hold the same layer, so the
/// two platforms' COPY --from share its fetch, and BuildKit reports "context canceled" for
/// the request whose wait it cut short; the solve succeeds, and so must the build.
#[test]
fn the_buildx_line_takes_build_contexts_as_buildx_does() {
    if !engine_reads_named_contexts() {
        return;
    }
    let registry = &Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let unique = unique_name("bx");
    let [tools, ours, theirs] = ["tools", "polyarch", "buildx"]
        .map(|name| registry.repo(&unique_name(&format!("ctx-bx/{name}"))));
    push_tools(dir.path(), &tools);
    let assets = assets(dir.path(), &unique);
    let context = dir.path().join("ctx");
    fs::create_dir_all(&context).unwrap();
    fs::write(
        context.join("Dockerfile"),
        "FROM scratch\nCOPY --from=assets / /assets/\nCOPY --from=tools /tool.txt /tool.txt\n",
    )
    .unwrap();
    let line = |tag: &str| -> Vec<String> {
        [
            "buildx",
            "build",
            "--platform",
            "linux/amd64,linux/arm64",
            "--build-context",
            &format!("assets={}", assets.display()),
            "--build-context",
            &format!("tools=docker-image://{tools}:v1"),
            "--provenance=false",
            "-t",
            &format!("{tag}:v1"),
            "--push",
            ".",
        ]
        .map(str::to_string)
        .to_vec()
    };
    let out = run(polyarch()
        .current_dir(&context)
        .args(line(&ours))
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The same line through Docker 26.1's buildx 0.13.1 (containerd store): the same files.
    let out = run(docker26_cli("containerd")
        .current_dir(&context)
        .args(line(&theirs)));
    assert!(
        out.status.success(),
        "docker buildx: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for arch in ARCHES {
        let mine = files(registry, &format!("{ours}:v1"), arch);
        assert_eq!(
            mine,
            files(registry, &format!("{theirs}:v1"), arch),
            "{arch}"
        );
        assert!(
            mine.contains_key("/assets/x") && !mine.contains_key("/assets/secret.txt"),
            "{mine:?}"
        );
    }
}

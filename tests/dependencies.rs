//! Images built from each other: `FROM polyarch:NAME` or `FROM <another image's
//! repository>` builds after that image, from the index just pushed for it, on either
//! engine; a rebuilt base rebuilds its dependents; a cycle is refused before any build.

mod support;

use std::fs;
use std::path::Path;
use support::{
    curl, layer_digests, polyarch, run, run_with_stdin, skopeo_digest, skopeo_inspect_raw_creds,
    unique_name, Registry,
};

const PLATFORMS: [&str; 2] = ["amd64", "arm64"];

/// A project of `base` (FROM scratch + a file), `app` (`FROM polyarch:base`) and `tool`
/// (FROM base's repository and tag), each for linux/amd64 and linux/arm64.
fn project(dir: &Path, base: &str, app: &str, tool: &str) -> std::path::PathBuf {
    let write = |name: &str, dockerfile: String, file: &str| {
        fs::create_dir_all(dir.join(name)).unwrap();
        fs::write(dir.join(name).join("Dockerfile"), dockerfile).unwrap();
        // The base's repository name is unique to this run: no earlier build in the
        // engine's cache (with other file times) can stand in for these layers.
        fs::write(dir.join(name).join(file), format!("{name} {base}\n")).unwrap();
    };
    write(
        "base",
        "FROM scratch\nCOPY base.txt /base.txt\n".into(),
        "base.txt",
    );
    write(
        "app",
        "FROM polyarch:base AS runtime\nCOPY app.txt /app.txt\n".into(),
        "app.txt",
    );
    write(
        "tool",
        format!("ARG BASE={base}:v1\nFROM ${{BASE}}\nCOPY tool.txt /tool.txt\n"),
        "tool.txt",
    );
    let file = dir.join("polyarch.yaml");
    let image = |name: &str, repository: &str| {
        format!("  {name}:\n    repository: {repository}\n    tags: [v1]\n    context: {name}\n    platforms: [linux/amd64, linux/arm64]\n")
    };
    // Dependents first: the file's order is not the build order.
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n{}{}{}",
            image("app", app),
            image("tool", tool),
            image("base", base)
        ),
    )
    .unwrap();
    file
}

/// Credentials of an htpasswd registry, when the test uses one.
type Creds = Option<(&'static str, &'static str)>;

/// The layer digests of `reference`'s linux/`arch` entry, read from the registry.
fn layers(reference: &str, arch: &str, creds: Creds) -> Vec<String> {
    let index = skopeo_inspect_raw_creds(reference, creds);
    let entry = index["manifests"]
        .as_array()
        .expect("an index")
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap_or_else(|| panic!("{reference} has no {arch} entry: {index}"));
    let repository = reference.rsplit_once(':').unwrap().0;
    let digest = entry["digest"].as_str().unwrap();
    let manifest = skopeo_inspect_raw_creds(&format!("{repository}@{digest}"), creds);
    layer_digests(&manifest)
}

/// `polyarch build` of the whole project (with `--username/--password-stdin` and an
/// empty Docker config when `creds` are given): its progress and its record.
fn build(file: &Path, creds: Creds, extra: &[&str]) -> (String, serde_json::Value) {
    let mut cmd = polyarch();
    // Its own caches: concurrent tests' runs would overwrite what this one remembers.
    cmd.args(["build", "--output-format", "json", "-f"])
        .arg(file)
        .args(extra)
        .env("POLYARCH_CACHE_DIR", file.parent().unwrap().join("cache"));
    let out = match creds {
        Some((user, password)) => {
            let config = file.parent().unwrap().join("docker-config");
            fs::create_dir_all(&config).unwrap();
            cmd.args(["--username", user, "--password-stdin"])
                .env("DOCKER_CONFIG", config);
            run_with_stdin(&mut cmd, password)
        }
        None => run(&mut cmd),
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (stderr, serde_json::from_slice(&out.stdout).unwrap())
}

/// Whether the record says every platform of every image was reused without a build.
fn all_reused(record: &serde_json::Value) -> bool {
    record["images"].as_array().unwrap().iter().all(|image| {
        image["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["build"]["reused"] == true)
    })
}

/// The SLSA statement attached to `repository:v1`'s linux/`arch` image (through the
/// referrers tag schema, as this registry has no referrers API).
fn provenance(registry: &Registry, repository: &str, arch: &str) -> String {
    let index = skopeo_inspect_raw_creds(&format!("{repository}:v1"), None);
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap();
    let tag = entry["digest"].as_str().unwrap().replacen(':', "-", 1);
    let listing = skopeo_inspect_raw_creds(&format!("{repository}:{tag}"), None);
    let referrer = listing["manifests"][0]["digest"].as_str().unwrap();
    let manifest = skopeo_inspect_raw_creds(&format!("{repository}@{referrer}"), None);
    let blob = manifest["layers"][0]["digest"].as_str().unwrap();
    let path = repository.split_once('/').unwrap().1;
    String::from_utf8(curl(&[&format!(
        "{}/v2/{path}/blobs/{blob}",
        registry.url()
    )]))
    .unwrap()
}

/// The base's and each dependent's layers, per platform: a dependent's first layer is
/// the base's of the same platform.
fn check_built_from_base(base: &str, dependents: &[&str], creds: Creds) -> Vec<Vec<String>> {
    let mut seen = Vec::new();
    for arch in PLATFORMS {
        let base_layers = layers(&format!("{base}:v1"), arch, creds);
        assert_eq!(base_layers.len(), 1, "{arch}: {base_layers:?}");
        for dependent in dependents {
            let mine = layers(&format!("{dependent}:v1"), arch, creds);
            assert_eq!(mine.len(), 2, "{dependent} {arch}: {mine:?}");
            assert_eq!(
                mine[0], base_layers[0],
                "{dependent} {arch} is built FROM base"
            );
            seen.push(mine);
        }
    }
    seen
}

#[test]
fn dependents_build_from_the_digest_just_pushed() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let [base, app, tool] = ["base", "app", "tool"]
        .map(|name| registry.repo(&unique_name(&format!("demo/deps-{name}"))));
    let file = project(dir.path(), &base, &app, &tool);

    let plan = run(polyarch().args(["plan", "-f"]).arg(&file).arg("app"));
    let text = String::from_utf8_lossy(&plan.stdout);
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    assert!(text.starts_with("base "), "base plans first: {text}");
    assert!(text.contains("after: base"), "{text}");

    let (output, record) = build(&file, None, &["--provenance"]);
    assert!(
        output.contains(&format!("app builds FROM base as {base}@sha256:")),
        "{output}"
    );
    assert!(!all_reused(&record), "{record}");
    let first = check_built_from_base(&base, &[&app, &tool], None);
    let statement = provenance(&registry, &app, "arm64");
    let base_index = skopeo_digest(&format!("{base}:v1"), None);
    assert!(
        statement.contains(base_index.trim_start_matches("sha256:")),
        "app's provenance names the base it was built FROM ({base_index}): {statement}"
    );
    // Nothing changed: the dependents' copies of their Dockerfiles are the same, so the
    // warm path reuses everything.
    let (_, record) = build(&file, None, &[]);
    assert!(all_reused(&record), "{record}");

    // A changed base file rebuilds the base and, through its new digest, both dependents
    // (their own inputs are unchanged).
    fs::write(dir.path().join("base/base.txt"), "base, changed\n").unwrap();
    let (_, record) = build(&file, None, &[]);
    let rebuilt = |name: &str| {
        let image = record["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name);
        image.unwrap()["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["build"]["reused"] != true)
    };
    assert!(
        rebuilt("base") && rebuilt("app") && rebuilt("tool"),
        "{record}"
    );
    let second = check_built_from_base(&base, &[&app, &tool], None);
    for (before, after) in first.iter().zip(&second) {
        assert_ne!(before[0], after[0], "the new base layer");
        assert_eq!(before[1], after[1], "the dependent's own layer");
    }
}

#[test]
fn the_engine_pulls_the_base_with_the_registry_credentials() {
    const USER: &str = "depsuser";
    const PASS: &str = "deps-Pa55-91c2";
    let registry = Registry::start_htpasswd(USER, PASS);
    let dir = tempfile::tempdir().unwrap();
    let [base, app, tool] = ["base", "app", "tool"]
        .map(|name| registry.repo(&unique_name(&format!("demo/auth-deps-{name}"))));
    let file = project(dir.path(), &base, &app, &tool);
    build(&file, Some((USER, PASS)), &[]);
    check_built_from_base(&base, &[&app, &tool], Some((USER, PASS)));
}

#[test]
fn cycles_unknown_names_and_layouts_are_refused_before_any_build() {
    let dir = tempfile::tempdir().unwrap();
    for (name, from) in [("a", "polyarch:b"), ("b", "127.0.0.1:9/demo/a:v1")] {
        fs::create_dir_all(dir.path().join(name)).unwrap();
        fs::write(
            dir.path().join(name).join("Dockerfile"),
            format!("FROM {from}\nCOPY . /\n"),
        )
        .unwrap();
    }
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        "version: 1\nimages:\n  a:\n    repository: 127.0.0.1:9/demo/a\n    tags: [v1]\n    context: a\n    platforms: [linux/amd64]\n  b:\n    repository: 127.0.0.1:9/demo/b\n    tags: [v1]\n    context: b\n    platforms: [linux/amd64]\n",
    )
    .unwrap();
    let refused = |args: &[&str], wanted: &str| {
        let out = run(polyarch().args(args).arg("-f").arg(&file));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(wanted), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    };
    refused(&["build"], "images a → b → a build FROM each other");

    // A name no image has.
    fs::write(dir.path().join("b/Dockerfile"), "FROM scratch\n").unwrap();
    fs::write(
        dir.path().join("a/Dockerfile"),
        "FROM scratch\nFROM polyarch:c\n",
    )
    .unwrap();
    refused(&["build"], "images.a.dockerfile: ");
    refused(
        &["plan"],
        "line 2: FROM polyarch:c names no image of this project (it declares a, b)",
    );

    // A base this run builds for no platform would leave its dependent waiting.
    fs::write(
        dir.path().join("a/Dockerfile"),
        "FROM --platform=$BUILDPLATFORM polyarch:b AS tools\nFROM scratch\n",
    )
    .unwrap();
    let arm64_only = fs::read_to_string(&file).unwrap().replacen(
        "platforms: [linux/amd64]",
        "platforms: [linux/arm64]",
        1,
    );
    fs::write(&file, &arm64_only).unwrap();
    refused(
        &["build", "--platform", "linux/arm64"],
        "a builds FROM b, which this run builds for no platform (--platform linux/arm64)",
    );

    // An OCI layout cannot serve the base to the engine.
    fs::write(dir.path().join("a/Dockerfile"), "FROM polyarch:b\n").unwrap();
    fs::write(&file, arm64_only.replace("linux/arm64", "linux/amd64")).unwrap();
    let layout = dir.path().join("layout");
    refused(
        &[
            "build",
            "a",
            "--output",
            &format!("oci:{}", layout.display()),
        ],
        "a builds FROM b, which the engine must pull from a registry",
    );
    assert!(!layout.exists(), "nothing written");
}

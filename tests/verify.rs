//! Verification-only mode and the deploy gate against a real registry holding what other
//! tools push: single-arch tags, attestation entries, lying platforms, foreign binaries.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;
use support::gate::{deployment, Deploy};
use support::{curl, hello_context, polyarch, run, unique_name, write_project, Registry, HELLO};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn get_manifest(registry: &Registry, repo: &str, reference: &str) -> Vec<u8> {
    let url = format!("http://{}/v2/{repo}/manifests/{reference}", registry.host);
    curl(&["-H", &format!("Accept: {INDEX}, {MANIFEST}"), &url])
}

fn build(dir: &Path, dockerfile: &str, repository: &str, platforms: &str) {
    std::fs::create_dir_all(dir).unwrap();
    hello_context(dir, dockerfile);
    let file = write_project(dir, repository, "[v1]", platforms);
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn verify(reference: &str, platforms: &str, extra: &[&str]) -> (Output, Value) {
    let out = run(polyarch()
        .args([
            "verify",
            reference,
            "--platform",
            platforms,
            "--output-format",
            "json",
        ])
        .args(extra));
    let record = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, record)
}

fn entry(digest: &str, size: u64, arch: &str) -> Value {
    json!({"mediaType": MANIFEST, "digest": digest, "size": size, "platform": {"architecture": arch, "os": "linux"}})
}

#[test]
fn verify_finds_every_kind_of_gap_in_what_registries_hold() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("verify");
    let good = format!("{name}/good");
    build(
        &dir.path().join("good"),
        HELLO,
        &registry.repo(&good),
        "[linux/amd64, linux/arm64]",
    );
    let index: Value = serde_json::from_slice(&get_manifest(&registry, &good, "v1")).unwrap();
    let (amd, arm) = (&index["manifests"][0], &index["manifests"][1]);
    let amd_digest = amd["digest"].as_str().unwrap();
    let (amd_size, arm_size) = (amd["size"].as_u64().unwrap(), arm["size"].as_u64().unwrap());
    let arm_digest = arm["digest"].as_str().unwrap();
    let both = "linux/amd64,linux/arm64";

    let (out, record) = verify(&registry.repo(&format!("{good}:v1")), both, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(record["covered"], true);
    let pinned = record["images"][0]["pinned"].as_str().unwrap().to_string();

    // A digest reference verifies the same content.
    let (out, _) = verify(&pinned, both, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{pinned}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A single-platform tag (as a plain `docker push` makes) misses arm64.
    let single = get_manifest(&registry, &good, amd_digest);
    registry.put_manifest(&good, "amd-only", &single, MANIFEST);
    let (out, record) = verify(&registry.repo(&format!("{good}:amd-only")), both, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(record["images"][0]["missing"], json!(["linux/arm64"]));
    assert_eq!(record["images"][0]["platforms"][0]["status"], "ok");

    // buildx-style attestation entries are a gap.
    let mut attestation = entry(amd_digest, amd_size, "unknown");
    attestation["platform"]["os"] = json!("unknown");
    attestation["annotations"] = json!({"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": amd_digest});
    let with_attestation =
        json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [amd, arm, attestation]});
    registry.put_manifest(
        &good,
        "attested",
        with_attestation.to_string().as_bytes(),
        INDEX,
    );
    let (out, record) = verify(&registry.repo(&format!("{good}:attested")), both, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(record["images"][0]["attestations"], json!([amd_digest]));
    assert_eq!(record["images"][0]["missing"], json!([]));
    let text = run(polyarch().args([
        "verify",
        &registry.repo(&format!("{good}:attested")),
        "--platform",
        both,
    ]));
    assert!(String::from_utf8_lossy(&text.stdout).contains("unknown media type"));

    // Entries whose platform disagrees with their config.
    let swapped = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry(arm_digest, arm_size, "amd64"), entry(amd_digest, amd_size, "arm64")]});
    registry.put_manifest(&good, "swapped", swapped.to_string().as_bytes(), INDEX);
    let (out, record) = verify(&registry.repo(&format!("{good}:swapped")), both, &[]);
    assert_eq!(out.status.code(), Some(1));
    for platform in record["images"][0]["platforms"].as_array().unwrap() {
        assert_eq!(platform["status"], "config_mismatch", "{platform}");
    }

    // An unreachable reference is exit 3, naming it.
    let (out, _) = verify(&registry.repo(&format!("{good}:nope")), both, &[]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":nope"));
}

/// verify remembers what a tag named, to read its entries beside the tag next time: a tag
/// moved since is judged by what it names now, each time.
#[test]
fn verify_judges_a_moved_tag_by_what_it_names_now() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = unique_name("verify/moved");
    build(
        dir.path(),
        HELLO,
        &registry.repo(&repo),
        "[linux/amd64, linux/arm64]",
    );
    let index = get_manifest(&registry, &repo, "v1");
    let amd64 = serde_json::from_slice::<Value>(&index).unwrap()["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let single = get_manifest(&registry, &repo, &amd64);
    let cache = dir.path().join("cache");
    let tag = registry.repo(&format!("{repo}:v1"));
    let verify_tag = || {
        let out = run(polyarch()
            .env("POLYARCH_CACHE_DIR", &cache)
            .args(["verify", &tag, "--platform", "linux/amd64,linux/arm64"])
            .args(["--output-format", "json"]));
        let record: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), record)
    };

    for (moved_to, media_type, code) in [
        (None, INDEX, 0),
        (Some(&single), MANIFEST, 1),
        (Some(&index), INDEX, 0),
        (Some(&single), MANIFEST, 1),
    ] {
        if let Some(bytes) = moved_to {
            registry.put_manifest(&repo, "v1", bytes, media_type);
        }
        let (status, record) = verify_tag();
        assert_eq!(status, Some(code), "{record:#}");
        let missing = if code == 0 {
            json!([])
        } else {
            json!(["linux/arm64"])
        };
        assert_eq!(record["images"][0]["missing"], missing, "{record:#}");
    }
}

#[test]
fn deep_verify_catches_an_arm64_entry_holding_an_x86_64_binary() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let liar = registry.repo(&unique_name("verify/liar"));
    // COPY-only: builds for arm64 without emulation, but ships the amd64 binary.
    let dockerfile = "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"true\"]\n";
    build(dir.path(), dockerfile, &liar, "[linux/arm64]");
    let reference = format!("{liar}:v1");

    let (out, _) = verify(&reference, "linux/arm64", &[]);
    assert_eq!(out.status.code(), Some(0), "configs alone look fine");
    let (out, record) = verify(&reference, "linux/arm64", &["--deep"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let platform = &record["images"][0]["platforms"][0];
    assert_eq!(platform["status"], "binary_mismatch");
    let detail = platform["detail"].as_str().unwrap();
    assert!(
        detail.contains("/bin/busybox") && detail.contains("x86-64"),
        "{detail}"
    );

    let honest = registry.repo(&unique_name("verify/honest"));
    build(
        &dir.path().join("honest"),
        HELLO,
        &honest,
        "[linux/amd64, linux/arm64]",
    );
    let (out, record) = verify(
        &format!("{honest}:v1"),
        "linux/amd64,linux/arm64",
        &["--deep"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        record["images"][0]["platforms"][1]["deep"]["finding"],
        "match"
    );
}

/// The layers of the single-platform manifest `reference` names.
fn layer_digests(reference: &str) -> Vec<String> {
    let manifest = support::skopeo_inspect_raw(reference);
    let manifest = match manifest["manifests"].as_array() {
        // polyarch pushes an index even for one platform.
        Some(entries) => {
            let digest = entries[0]["digest"].as_str().unwrap();
            let repository = reference.rsplit_once(':').unwrap().0;
            support::skopeo_inspect_raw(&format!("{repository}@{digest}"))
        }
        None => manifest,
    };
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|layer| layer["digest"].as_str().unwrap().to_string())
        .collect()
}

const LIAR: &str =
    "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"true\"]\n";
const HONEST_ARM64: &str =
    "FROM scratch\nCOPY bin/arm64/busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"true\"]\n";

/// Issue 39, case 4: an arm64 entry shipping an x86-64 binary, whose layer a hostile
/// registry (or a tampered layout) answers with an honest arm64 layer's bytes. Read as
/// they come, those bytes would make the entry look covered.
#[test]
fn deep_verify_refuses_layer_bytes_the_manifest_does_not_name() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("verify/swapped");
    let (liar, honest) = (
        registry.repo(&format!("{name}/liar")),
        registry.repo(&format!("{name}/honest")),
    );
    build(&dir.path().join("liar"), LIAR, &liar, "[linux/arm64]");
    build(
        &dir.path().join("honest"),
        HONEST_ARM64,
        &honest,
        "[linux/arm64]",
    );
    let (liar_layers, honest_layers) = (
        layer_digests(&format!("{liar}:v1")),
        layer_digests(&format!("{honest}:v1")),
    );
    assert_eq!(liar_layers.len(), 1, "{liar_layers:?}");
    let honest_bytes = curl(&[&format!(
        "http://{}/v2/{name}/honest/blobs/{}",
        registry.host, honest_layers[0]
    )]);

    let proxy = proxy::Proxy::start(registry.port);
    proxy.add(
        proxy::Rule::new(
            "GET",
            &format!("/blobs/{}", liar_layers[0]),
            proxy::Fault::respond(200, "application/octet-stream", honest_bytes),
        )
        .always(),
    );
    let swapped = format!("{}:v1", proxy.repo(&format!("{name}/liar")));
    let (out, record) = verify(&swapped, "linux/arm64", &["--deep"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_ne!(record["covered"], true);
    assert!(
        stderr.contains(&format!("layer {} of", liar_layers[0]))
            && stderr.contains("does not match its digest"),
        "{stderr}"
    );
    // JSON events on stderr, then the one error line.
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");

    // The same swap in an OCI layout's blob file.
    let layouts = dir.path().join("layouts");
    for (context, image) in [("liar", "liar"), ("honest", "honest")] {
        let file = dir.path().join(context).join("polyarch.yaml");
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .arg("--output")
            .arg(format!("oci:{}", layouts.join(image).display())));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let blob = |image: &str, digest: &str| {
        layouts
            .join(image)
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    std::fs::copy(
        blob("honest", &honest_layers[0]),
        blob("liar", &liar_layers[0]),
    )
    .unwrap();
    let layout = format!("oci:{}:v1", layouts.join("liar").display());
    let (out, record) = verify(&layout, "linux/arm64", &["--deep"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_ne!(record["covered"], true);
    assert!(
        stderr.contains(&liar_layers[0]) && stderr.contains("corrupt"),
        "{stderr}"
    );
}

#[test]
fn gate_refuses_a_deploy_that_can_land_on_a_pool_its_image_does_not_cover() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("gate/app"));
    build(dir.path(), HELLO, &repo, "[linux/amd64]");
    let image = format!("{repo}:v1");
    let gate = |selector: &str| {
        let deploy = Deploy::write(
            dir.path(),
            &deployment("web", &image, None, selector),
            &[("general", "amd64", 3), ("graviton", "arm64", 2)],
        );
        run(&mut deploy.gate())
    };

    let refused = gate("");
    assert_eq!(
        refused.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(
        text.contains("graviton") && text.contains("arm64"),
        "{text}"
    );
    assert!(
        text.contains("kubernetes.io/arch"),
        "no nodeAffinity fix offered: {text}"
    );

    let pinned = gate("      nodeSelector: {kubernetes.io/arch: amd64}\n");
    assert_eq!(
        pinned.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&pinned.stdout)
    );
}

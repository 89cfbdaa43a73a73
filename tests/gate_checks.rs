//! The deploy gate checks what verify checks, through the CLI against a real registry
//! holding hand-made images (raw blob and manifest uploads, as other tools push them): an
//! arm64 entry whose config says amd64, an arm64 entry holding an x86-64 binary,
//! attestation entries, an image that is not there; and `--pin`'s manifests.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;
use support::gate::deployment;
use support::{busybox, polyarch, run, unique_name, Registry};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// Two kubectl nodes: amd64 (containerd 1.6.20) and a cordoned arm64 one (containerd 1.4.13).
const NODES: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"kind": "Node", "metadata": {"name": "x1", "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "eks.amazonaws.com/nodegroup": "general"}},
   "status": {"nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "containerRuntimeVersion": "containerd://1.6.20"}}},
  {"kind": "Node", "metadata": {"name": "a1", "labels": {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux", "eks.amazonaws.com/nodegroup": "graviton"}},
   "spec": {"unschedulable": true, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
   "status": {"nodeInfo": {"architecture": "arm64", "operatingSystem": "linux", "containerRuntimeVersion": "containerd://1.4.13"}}}
]}"#;

/// A descriptor of something pushed.
struct Pushed {
    digest: String,
    size: usize,
}

/// Uploads a blob (see [`Registry::put_blob`]); its descriptor.
fn put_blob(registry: &Registry, repo: &str, bytes: &[u8]) -> Pushed {
    Pushed {
        digest: registry.put_blob(repo, bytes),
        size: bytes.len(),
    }
}

/// A gzipped layer holding `/bin/busybox` built for `arch`; returns (diff_id, gzip bytes).
fn busybox_layer(arch: &str) -> (String, Vec<u8>) {
    let binary = std::fs::read(busybox(arch)).unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, "bin/busybox", binary.as_slice())
        .unwrap();
    let tar = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    (
        polyarch::base::oci::sha256_digest(&tar),
        gz.finish().unwrap(),
    )
}

/// Pushes an image manifest whose config says `config_arch` and whose layer holds the
/// busybox of `binary_arch`.
fn put_image(registry: &Registry, repo: &str, config_arch: &str, binary_arch: &str) -> Pushed {
    let (diff_id, layer) = busybox_layer(binary_arch);
    let layer = put_blob(registry, repo, &layer);
    let config = json!({
        "architecture": config_arch, "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "true"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}
    });
    let config = put_blob(registry, repo, config.to_string().as_bytes());
    let manifest = json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer.digest, "size": layer.size}]
    })
    .to_string();
    let digest = polyarch::base::oci::sha256_digest(manifest.as_bytes());
    registry.put_manifest(repo, &digest, manifest.as_bytes(), MANIFEST);
    Pushed {
        digest,
        size: manifest.len(),
    }
}

fn entry(image: &Pushed, arch: &str) -> Value {
    json!({"mediaType": MANIFEST, "digest": image.digest, "size": image.size,
           "platform": {"architecture": arch, "os": "linux"}})
}

fn put_index(registry: &Registry, repo: &str, tag: &str, entries: Vec<Value>) -> String {
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).to_string();
    registry.put_manifest(repo, tag, index.as_bytes(), INDEX)
}

/// One repository holding the hand-made tags the tests gate.
struct Images {
    _registry: Registry,
    repo: String,
    /// Index digests by tag.
    good: String,
}

impl Images {
    /// `good`: honest amd64 + arm64. `lying`: its arm64 entry is the amd64 image.
    /// `binliar`: its arm64 entry's config says arm64 but holds the x86-64 busybox.
    /// `attested`: `good` plus a buildx-style attestation entry.
    fn push() -> Images {
        let registry = Registry::start();
        let repo = unique_name("gate/hand");
        let amd = put_image(&registry, &repo, "amd64", "amd64");
        let arm = put_image(&registry, &repo, "arm64", "arm64");
        let binliar = put_image(&registry, &repo, "arm64", "amd64");
        let good = put_index(
            &registry,
            &repo,
            "good",
            vec![entry(&amd, "amd64"), entry(&arm, "arm64")],
        );
        put_index(
            &registry,
            &repo,
            "lying",
            vec![entry(&amd, "amd64"), entry(&amd, "arm64")],
        );
        put_index(
            &registry,
            &repo,
            "binliar",
            vec![entry(&amd, "amd64"), entry(&binliar, "arm64")],
        );
        let mut attestation = entry(&amd, "unknown");
        attestation["platform"]["os"] = json!("unknown");
        attestation["annotations"] = json!({"vnd.docker.reference.type": "attestation-manifest",
                                            "vnd.docker.reference.digest": amd.digest});
        put_index(
            &registry,
            &repo,
            "attested",
            vec![entry(&amd, "amd64"), entry(&arm, "arm64"), attestation],
        );
        Images {
            repo: registry.repo(&repo),
            _registry: registry,
            good,
        }
    }

    fn tag(&self, tag: &str) -> String {
        format!("{}:{tag}", self.repo)
    }
}

/// Runs the gate on `manifests` against [`NODES`]; returns its output and the record it
/// wrote (`--record`; null when it wrote none).
fn gate(dir: &Path, manifests: &[&Path], extra: &[&str]) -> (Output, Value) {
    let nodes = dir.join("nodes.json");
    std::fs::write(&nodes, NODES).unwrap();
    let record = dir.join(format!("{}.json", unique_name("record")));
    let mut cmd = polyarch();
    cmd.arg("gate");
    for m in manifests {
        cmd.arg("--manifests").arg(m);
    }
    cmd.arg("--nodes").arg(&nodes).arg("--record").arg(&record);
    let out = run(cmd.args(extra));
    let record = std::fs::read(&record)
        .map(|r| serde_json::from_slice(&r).unwrap())
        .unwrap_or(Value::Null);
    (out, record)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn code(out: &Output) -> Option<i32> {
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code()
}

fn findings<'a>(record: &'a Value, kind: &str) -> Vec<&'a Value> {
    record["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// Validates a gate record against `schema/gate.schema.json` with Python's jsonschema.
fn assert_schema_valid(record: &Value) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("record.json");
    std::fs::write(&file, record.to_string()).unwrap();
    let schema = support::repo_root().join("schema/gate.schema.json");
    let out = run(std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             jsonschema.Draft202012Validator(schema).validate(json.load(open(sys.argv[2])))",
        ])
        .arg(&schema)
        .arg(&file));
    assert!(
        out.status.success(),
        "record does not match schema/gate.schema.json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_entry_whose_config_or_binary_is_another_platform_is_a_gap_for_the_pools_pulling_it() {
    let images = Images::push();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("deploy.yaml");
    let write = |image: &str, extra: &str| {
        std::fs::write(&manifests, deployment("web", image, None, extra)).unwrap();
    };

    // The arm64 entry is the amd64 image: pods on the (cordoned) arm64 node would pull it.
    write(&images.tag("lying"), "");
    let (text, record) = gate(dir.path(), &[&manifests], &[]);
    assert_eq!(code(&text), Some(1), "{}", stdout(&text));
    let out = stdout(&text);
    assert!(
        out.contains("GAP Deployment shop/web container `web` (")
            && out.contains("lacks linux/arm64, needed by pool(s) graviton"),
        "{out}"
    );
    assert!(
        out.contains("its linux/arm64 entry is not a linux/arm64 image")
            && out.contains("its config says linux/amd64"),
        "{out}"
    );
    assert!(out.contains("values: [amd64]"), "no affinity fix: {out}");
    let gaps = findings(&record, "entry_mismatch");
    assert_eq!(gaps.len(), 1, "{record}");
    assert_eq!(gaps[0]["severity"], "gap");
    assert_eq!(gaps[0]["pools"], json!(["graviton"]));
    assert_eq!(gaps[0]["status"], "config_mismatch");
    assert_eq!(gaps[0]["platform"], "linux/arm64");
    assert_eq!(
        record["images"][0]["entries"][1]["status"],
        "config_mismatch"
    );
    assert_schema_valid(&record);

    // Kept on amd64, the workload never pulls that entry.
    write(
        &images.tag("lying"),
        "      nodeSelector: {kubernetes.io/arch: amd64}\n",
    );
    let (text, _) = gate(dir.path(), &[&manifests], &[]);
    assert_eq!(code(&text), Some(0), "{}", stdout(&text));

    // The config says arm64 but the binary is x86-64: only --deep sees it, as verify --deep.
    write(&images.tag("binliar"), "");
    let (text, _) = gate(dir.path(), &[&manifests], &[]);
    assert_eq!(
        code(&text),
        Some(0),
        "configs alone look fine: {}",
        stdout(&text)
    );
    let (text, record) = gate(dir.path(), &[&manifests], &["--deep"]);
    assert_eq!(
        code(&text),
        Some(1),
        "{}{}",
        stdout(&text),
        String::from_utf8_lossy(&text.stderr)
    );
    let gaps = findings(&record, "entry_mismatch");
    assert_eq!(gaps.len(), 1, "{record}");
    assert_eq!(gaps[0]["status"], "binary_mismatch");
    assert!(
        gaps[0]["message"].as_str().unwrap().contains("x86-64"),
        "{}",
        gaps[0]["message"]
    );
    assert_schema_valid(&record);

    // The honest index passes, deep too; its mutable tag still earns the re-tag warning.
    write(&images.tag("good"), "");
    let (text, record) = gate(dir.path(), &[&manifests], &["--deep"]);
    assert_eq!(code(&text), Some(0), "{}", stdout(&text));
    let out = stdout(&text);
    assert!(
        out.contains(&format!(
            "warning: Deployment shop/web container `web` ({}#1): image {} is a mutable tag pulled with imagePullPolicy: IfNotPresent",
            manifests.display(),
            images.tag("good")
        )) && out.contains(&format!("{}@{}", images.tag("good"), images.good)),
        "{out}"
    );
    assert_eq!(findings(&record, "pull_policy").len(), 1);
    assert_eq!(
        record["images"][0]["entries"][1]["deep"]["finding"],
        "match"
    );
}

#[test]
fn attestation_entries_warn_naming_the_nodes_runtimes_and_strict_refuses() {
    let images = Images::push();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("deploy.yaml");
    std::fs::write(
        &manifests,
        deployment("web", &images.tag("attested"), Some("Always"), ""),
    )
    .unwrap();

    let (text, record) = gate(dir.path(), &[&manifests], &[]);
    assert_eq!(code(&text), Some(0), "{}", stdout(&text));
    let out = stdout(&text);
    assert!(
        out.contains("warning: Deployment shop/web container `web`")
            && out.contains("has 1 attestation entry")
            && out.contains("unknown media type")
            && out
                .contains("the nodes it may land on run containerd://1.4.13, containerd://1.6.20"),
        "{out}"
    );
    let warned = findings(&record, "attestation");
    assert_eq!(warned.len(), 1);
    assert_eq!(warned[0]["severity"], "warning");
    assert_eq!(
        warned[0]["runtimes"],
        json!(["containerd://1.4.13", "containerd://1.6.20"])
    );
    assert_eq!(
        record["images"][0]["attestations"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // imagePullPolicy: Always: no re-tag warning.
    assert!(findings(&record, "pull_policy").is_empty());
    assert_schema_valid(&record);

    let (text, record) = gate(dir.path(), &[&manifests], &["--strict"]);
    assert_eq!(code(&text), Some(1), "{}", stdout(&text));
    let out = stdout(&text);
    assert!(
        out.contains("REFUSED Deployment shop/web container `web`")
            && out.contains("refused (--strict)"),
        "{out}"
    );
    assert_eq!(record["covered"], false);
    assert_eq!(findings(&record, "attestation")[0]["severity"], "gap");

    let help = run(polyarch().args(["gate", "--help"]));
    let help = stdout(&help);
    assert!(
        help.contains("--strict") && help.contains("--pin") && help.contains("--deep"),
        "{help}"
    );
    assert!(!help.contains("unknown media type"), "{help}");
}

#[test]
fn an_unreadable_image_is_reported_against_its_workload_while_the_rest_is_judged_and_recorded() {
    let images = Images::push();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("k8s");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("a.yaml"),
        deployment("gone", &images.tag("nope"), None, ""),
    )
    .unwrap();
    std::fs::write(
        manifests.join("b.yaml"),
        deployment("web", &images.tag("lying"), None, ""),
    )
    .unwrap();
    let (text, written) = gate(dir.path(), &[&manifests], &[]);
    assert_eq!(code(&text), Some(3), "{}", stdout(&text));
    let out = stdout(&text);
    let a = manifests.join("a.yaml");
    assert!(
        out.contains(&format!(
            "UNREADABLE Deployment shop/gone container `gone` ({}#1): image {} could not be read",
            a.display(),
            images.tag("nope")
        )),
        "{out}"
    );
    // The other workload is still judged and reported.
    assert!(
        out.contains("GAP Deployment shop/web") && out.contains("needed by pool(s) graviton"),
        "{out}"
    );
    assert!(
        out.contains("1 gap(s) in 2 container(s) of 2 workload(s); 1 container(s) not checked"),
        "{out}"
    );
    // The record is written in full, and is what --output-format json prints.
    assert_eq!(written["workloads"].as_array().unwrap().len(), 2);
    let unreadable = findings(&written, "unreadable");
    assert_eq!(unreadable.len(), 1);
    assert_eq!(unreadable[0]["severity"], "failure");
    assert_eq!(unreadable[0]["workload"], "Deployment shop/gone");
    assert!(written["workloads"][0]["containers"][0]["error"].is_string());
    assert_eq!(findings(&written, "entry_mismatch").len(), 1);
    let nodes = dir.path().join("nodes.json");
    let json = run(polyarch()
        .args(["gate", "--output-format", "json", "--manifests"])
        .arg(&manifests)
        .arg("--nodes")
        .arg(&nodes));
    assert_eq!(code(&json), Some(3));
    let printed: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(printed["findings"], written["findings"]);
    assert_schema_valid(&written);
}

#[test]
fn pin_writes_the_manifests_read_with_every_image_pinned_to_the_digest_checked() {
    let images = Images::push();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("k8s");
    std::fs::create_dir_all(manifests.join("jobs")).unwrap();
    let good = images.tag("good");
    let deploy = format!(
        "# Source: shop/templates/web.yaml\n{}        # keep me: the storefront\n        ports: [{{containerPort: 8080}}]\n---\n# a Service, written as is\napiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{ports: [{{port: 80}}]}}\n",
        deployment("web", &good, None, "")
    );
    std::fs::write(manifests.join("deploy.yaml"), &deploy).unwrap();
    let job = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: once}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - {{name: once, image: \"{good}\", imagePullPolicy: Always}}\n"
    );
    std::fs::write(manifests.join("jobs/once.yml"), &job).unwrap();
    let out_dir = dir.path().join("pinned");

    let (text, _) = gate(
        dir.path(),
        &[&manifests],
        &["--pin", out_dir.to_str().unwrap()],
    );
    assert_eq!(code(&text), Some(0), "{}", stdout(&text));
    let pinned = format!("{good}@{}", images.good);
    let written = std::fs::read_to_string(out_dir.join("deploy.yaml")).unwrap();
    // Only the image value changed; comments and the Service are as written.
    assert_eq!(
        written,
        deploy.replace(&format!("image: {good}\n"), &format!("image: {pinned}\n"))
    );
    assert!(written.contains("# keep me: the storefront") && written.contains("# a Service"));
    let job_written = std::fs::read_to_string(out_dir.join("jobs/once.yml")).unwrap();
    assert_eq!(
        job_written,
        job.replace(&format!("\"{good}\""), &format!("\"{pinned}\""))
    );
    // Parsed as YAML, every container image is the pinned reference.
    for text in [&written, &job_written] {
        let mut images_found = Vec::new();
        for doc in serde_norway::Deserializer::from_str(text) {
            let doc: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
            let spec = &doc["spec"]["template"]["spec"];
            for c in spec["containers"].as_sequence().into_iter().flatten() {
                images_found.push(c["image"].as_str().unwrap().to_string());
            }
        }
        assert_eq!(images_found, [pinned.as_str()]);
    }
    assert!(stdout(&text).contains(&format!(
        "pinned: {} -> {}: 1 image value(s)",
        manifests.join("deploy.yaml").display(),
        out_dir.join("deploy.yaml").display()
    )));

    // The pinned manifests pass the gate again, without the re-tag warning.
    let (text, record) = gate(dir.path(), &[&out_dir], &[]);
    assert_eq!(code(&text), Some(0), "{}", stdout(&text));
    assert!(findings(&record, "pull_policy").is_empty(), "{record}");

    // A directory holding files already is refused before any registry is asked.
    let (text, _) = gate(
        dir.path(),
        &[&manifests],
        &["--pin", out_dir.to_str().unwrap()],
    );
    assert_eq!(code(&text), Some(2));
    let err = String::from_utf8_lossy(&text.stderr);
    assert!(
        err.contains("not empty") && err.trim_end().lines().count() == 1,
        "{err}"
    );

    // The record lists what was written.
    let again = dir.path().join("pinned2");
    let (out, record) = gate(
        dir.path(),
        &[&manifests],
        &["--pin", again.to_str().unwrap()],
    );
    assert_eq!(code(&out), Some(0));
    let files: Vec<&str> = record["pinned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 2, "{record}");
    assert_schema_valid(&record);
}

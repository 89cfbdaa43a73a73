//! `polyarch buildx build LINE` against `docker buildx build LINE` itself: buildx 0.29.1
//! on Docker 28.5 with the containerd image store (scripts/engine28.sh), the reference the
//! buildx lines are written for. Each line is run both ways, each pushing to its own
//! repository of the test's registry; every platform image must hold the same files (path,
//! type, mode, owner, size, content, link target; not times, which a RUN sets as it runs)
//! and the same config (platform, env, entrypoint, cmd, workdir, user, labels, ports), and
//! both metadata files must have the same keys. buildx's own attestation entries are left
//! out of the comparison: polyarch attaches provenance as a referrer instead. The tests
//! are named `buildx_reference_` and pick Docker 28.5 themselves, so `make test` runs them
//! once.

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};
use support::{busybox, polyarch, run, unique_name, Registry};

/// buildx's metadata keys that polyarch does not write (the book's "Coming from buildx"):
/// the build's history ref and its provenance (polyarch solves each platform on its own and
/// attaches provenance to the images), and the config digest of an unindexed single image
/// (polyarch always pushes an index).
const NOT_WRITTEN: [&str; 3] = [
    "buildx.build.ref",
    "buildx.build.provenance",
    "containerimage.config.digest",
];

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `DOCKER_HOST`, `DOCKER_CONFIG` (buildx as a CLI plugin) and `PATH` for Docker 28.5,
/// started when it is not running.
fn docker28() -> Vec<(String, String)> {
    let script = support::repo_root().join("scripts/engine28.sh");
    let out = run(Command::new("bash")
        .arg(&script)
        .args(["start", "containerd"]));
    assert!(out.status.success(), "engine28.sh start: {}", stderr(&out));
    let out = run(Command::new("bash")
        .arg(&script)
        .args(["env", "containerd"]));
    assert!(out.status.success(), "engine28.sh env: {}", stderr(&out));
    let path = std::env::var("PATH").unwrap_or_default();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (key, value) = line.strip_prefix("export ")?.split_once('=')?;
            let value = value.replace("\"$PATH\"", &path).replace('"', "");
            Some((key.to_string(), value))
        })
        .collect()
}

/// One file system entry as a layer leaves it.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Entry {
    kind: char,
    mode: u32,
    owner: (u64, u64),
    size: u64,
    content: String,
    link: Option<String>,
}

/// The file system `reference`'s `arch` image unpacks to (whiteouts applied), and its config.
fn image(reference: &str, arch: &str) -> (BTreeMap<String, Entry>, Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", "--override-arch", arch])
        .arg(format!("docker://{reference}"))
        .arg(format!("dir:{}", dir.path().display())));
    assert!(
        out.status.success(),
        "skopeo copy {reference}: {}",
        stderr(&out)
    );
    let blob = |digest: &str| dir.path().join(digest.trim_start_matches("sha256:"));
    let manifest: Value =
        serde_json::from_slice(&fs::read(dir.path().join("manifest.json")).unwrap()).unwrap();
    let config: Value = serde_json::from_slice(
        &fs::read(blob(manifest["config"]["digest"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let mut files = BTreeMap::new();
    for layer in manifest["layers"].as_array().unwrap() {
        apply_layer(&blob(layer["digest"].as_str().unwrap()), &mut files);
    }
    (files, config)
}

fn apply_layer(path: &Path, files: &mut BTreeMap<String, Entry>) {
    let raw = fs::read(path).unwrap();
    let tar: Box<dyn Read> = match raw.starts_with(&[0x1f, 0x8b]) {
        true => Box::new(flate2::read::GzDecoder::new(&raw[..])),
        false => Box::new(&raw[..]),
    };
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        let (parent, base) = name.rsplit_once('/').unwrap_or(("", name.as_str()));
        if base == ".wh..wh..opq" {
            let prefix = format!("{parent}/");
            files.retain(|path, _| !path.starts_with(&prefix));
            continue;
        }
        if let Some(gone) = base.strip_prefix(".wh.") {
            let gone = if parent.is_empty() {
                gone.to_string()
            } else {
                format!("{parent}/{gone}")
            };
            let below = format!("{gone}/");
            files.retain(|path, _| path != &gone && !path.starts_with(&below));
            continue;
        }
        let header = entry.header().clone();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        files.insert(
            name,
            Entry {
                kind: match header.entry_type() {
                    tar::EntryType::Directory => 'd',
                    tar::EntryType::Symlink => 'l',
                    tar::EntryType::Link => 'h',
                    _ => 'f',
                },
                mode: header.mode().unwrap() & 0o7777,
                owner: (header.uid().unwrap(), header.gid().unwrap()),
                size: content.len() as u64,
                content: polyarch::base::oci::sha256_digest(&content),
                link: header
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned()),
            },
        );
    }
}

/// What a user compares of two configs: everything but times and build history.
fn comparable(config: &Value) -> Value {
    serde_json::json!({
        "os": config["os"],
        "architecture": config["architecture"],
        "variant": config["variant"],
        "config": config["config"],
    })
}

/// The platforms `reference` names: its index's entries, attestation entries left out, or
/// the one image buildx pushes unindexed for a single platform without attestations.
fn platforms(reference: &str) -> Vec<String> {
    let index = support::skopeo_inspect_raw(reference);
    if !index["manifests"].is_array() {
        let out = run(Command::new("skopeo")
            .args(["inspect", "--config", "--tls-verify=false"])
            .arg(format!("docker://{reference}")));
        assert!(
            out.status.success(),
            "skopeo inspect --config: {}",
            stderr(&out)
        );
        let config: Value = serde_json::from_slice(&out.stdout).unwrap();
        return vec![format!(
            "{}/{}",
            config["os"].as_str().unwrap(),
            config["architecture"].as_str().unwrap()
        )];
    }
    support::platforms_of(&index)
        .into_iter()
        .filter(|p| p != "unknown/unknown")
        .collect()
}

/// Runs `line` (buildx's arguments after `build`, with TAG and METADATA where the tag and
/// the metadata file go) through `docker buildx build` and `polyarch buildx build` in
/// `context`, then compares what each pushed.
fn both_ways(registry: &Registry, context: &Path, line: &[&str], stdin: Option<&str>) {
    let env = docker28();
    let name = unique_name("bxref");
    let mut pushed = Vec::new();
    for who in ["buildx", "polyarch"] {
        let tag = format!("{}:v1", registry.repo(&format!("{who}/{name}")));
        let metadata = context.join(format!("{who}-metadata.json"));
        let args: Vec<String> = line
            .iter()
            .map(|a| match *a {
                "TAG" => tag.clone(),
                "METADATA" => metadata.display().to_string(),
                other => other.to_string(),
            })
            .collect();
        let mut command = match who {
            "buildx" => Command::new("docker"),
            _ => polyarch(),
        };
        command.args(["buildx", "build"]);
        command
            .current_dir(context)
            .args(&args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("POLYARCH_CACHE_DIR", context.join(format!("{who}-cache")));
        let out = match stdin {
            Some(input) => support::run_with_stdin(&mut command, input),
            None => run(&mut command),
        };
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who} buildx build {line:?}: {}",
            stderr(&out)
        );
        let metadata: Value = serde_json::from_slice(&fs::read(&metadata).unwrap()).unwrap();
        pushed.push((who, tag, metadata));
    }
    let [(_, buildx_tag, buildx_metadata), (_, polyarch_tag, polyarch_metadata)] = &pushed[..]
    else {
        unreachable!()
    };
    // Every key polyarch writes is buildx's; of buildx's, only those the book's "Coming
    // from buildx" page names as not written are missing.
    let keys = |m: &Value| {
        m.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    let (buildx_keys, polyarch_keys) = (keys(buildx_metadata), keys(polyarch_metadata));
    assert!(
        polyarch_keys.is_subset(&buildx_keys),
        "{line:?}: {polyarch_keys:?} vs {buildx_keys:?}"
    );
    let not_written: BTreeSet<String> = buildx_keys.difference(&polyarch_keys).cloned().collect();
    assert!(
        not_written
            .iter()
            .all(|k| NOT_WRITTEN.contains(&k.as_str())),
        "{line:?}: polyarch does not write {not_written:?}"
    );
    let wanted = platforms(buildx_tag);
    assert_eq!(platforms(polyarch_tag), wanted, "{line:?}: platforms");
    for platform in &wanted {
        let arch = platform.rsplit('/').next().unwrap();
        let (buildx_files, buildx_config) = image(buildx_tag, arch);
        let (polyarch_files, polyarch_config) = image(polyarch_tag, arch);
        assert!(
            !buildx_files.is_empty(),
            "{line:?}: buildx pushed no files for {platform}"
        );
        assert_eq!(
            polyarch_files, buildx_files,
            "{line:?}: files of {platform}"
        );
        assert_eq!(
            comparable(&polyarch_config),
            comparable(&buildx_config),
            "{line:?}: config of {platform}"
        );
    }
}

/// A FROM-scratch context with busybox for both platforms and two Dockerfiles.
fn context() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["amd64", "arm64"] {
        let bin = dir.path().join("bin").join(arch);
        fs::create_dir_all(&bin).unwrap();
        fs::copy(busybox(arch), bin.join("busybox")).unwrap();
    }
    fs::create_dir_all(dir.path().join("etc")).unwrap();
    fs::write(dir.path().join("etc/app.conf"), "greeting=hello\n").unwrap();
    fs::write(
        dir.path().join(".dockerignore"),
        "*-cache\n*-metadata.json\nnotes.txt\n",
    )
    .unwrap();
    fs::write(dir.path().join("notes.txt"), "not in any image\n").unwrap();
    fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY --chown=1000:1000 --chmod=0640 etc/ /etc/app/\nCOPY . /ctx/\nENV MODE=release PATH=/bin\nWORKDIR /srv\nLABEL org.example.tier=web\nEXPOSE 8080/tcp\nUSER 1000:1000\nENTRYPOINT [\"/bin/busybox\", \"httpd\", \"-f\"]\nCMD [\"-p\", \"8080\"]\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("stages.Dockerfile"),
        "FROM scratch AS tools\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\n\nFROM tools AS built\nARG GREETING=none\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo $GREETING > /greeting && /bin/busybox mkdir -p /data && /bin/busybox ln -s /greeting /data/link && /bin/busybox rm -f /bin/busybox.unused\"]\n\nFROM scratch AS final\nCOPY --from=built /greeting /data/ /out/\nCOPY --from=tools /bin/busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"cat\", \"/out/greeting\"]\n\nFROM final AS debug\nENV DEBUG=1\n",
    )
    .unwrap();
    dir
}

#[test]
fn buildx_reference_two_platform_copy_line_pushes_the_same_images_and_metadata_keys() {
    let registry = Registry::start();
    let context = context();
    both_ways(
        &registry,
        context.path(),
        &[
            "--platform",
            "linux/amd64,linux/arm64",
            "-t",
            "TAG",
            "--push",
            "--metadata-file",
            "METADATA",
            ".",
        ],
        None,
    );
}

#[test]
fn buildx_reference_file_target_args_and_labels_push_the_same_image() {
    let registry = Registry::start();
    let context = context();
    both_ways(
        &registry,
        context.path(),
        &[
            "-f",
            "stages.Dockerfile",
            "--target",
            "final",
            "--build-arg",
            "GREETING=hi",
            "--label",
            "org.example.team=platform",
            "--platform",
            "linux/amd64",
            "-t",
            "TAG",
            "--push",
            "--provenance=false",
            "--metadata-file",
            "METADATA",
            ".",
        ],
        None,
    );
}

#[test]
fn buildx_reference_a_dockerfile_on_stdin_with_a_secret_pushes_the_same_image() {
    let registry = Registry::start();
    let context = context();
    fs::write(context.path().join("token.txt"), "s3cr3t-token").unwrap();
    both_ways(
        &registry,
        context.path(),
        &[
            "--platform",
            "linux/amd64",
            "--secret",
            "id=token,src=token.txt",
            "--annotation",
            "org.opencontainers.image.description=stdin",
            "-f",
            "-",
            "-t",
            "TAG",
            "--push",
            "--metadata-file",
            "METADATA",
            ".",
        ],
        Some("FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nRUN --mount=type=secret,id=token [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox wc -c < /run/secrets/token > /token-length\"]\n"),
    );
}

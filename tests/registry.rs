//! Registry reality: credentials as Docker finds them, TLS trust, transient faults and
//! atomic publishing, against real `docker-registry` instances (and a fault proxy).

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use proxy::{Fault, Proxy, Rule};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::{
    hello_context, polyarch, run, run_with_stdin, skopeo_digest, unique_name, write_project,
    Registry, HELLO,
};

/// A project for `repository` in a fresh dir, plus an empty DOCKER_CONFIG dir.
struct Project {
    dir: tempfile::TempDir,
    file: PathBuf,
}

impl Project {
    fn new(repository: &str, platforms: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        hello_context(dir.path(), HELLO);
        let file = write_project(dir.path(), repository, "[v1]", platforms);
        std::fs::create_dir_all(dir.path().join("docker-config")).unwrap();
        Project { dir, file }
    }

    fn record(&self) -> PathBuf {
        self.dir.path().join("coverage.json")
    }

    fn docker_config(&self) -> PathBuf {
        self.dir.path().join("docker-config")
    }

    /// `polyarch build` with an isolated environment (no host Docker config or CA).
    fn build(&self) -> Command {
        let mut cmd = polyarch();
        cmd.args(["build", "-f"])
            .arg(&self.file)
            .arg("--record")
            .arg(self.record())
            .env("DOCKER_CONFIG", self.docker_config())
            .env("POLYARCH_CERTS_D", self.dir.path().join("no-certs.d"))
            .env("POLYARCH_RETRY_BASE_MS", "50")
            .env_remove("SSL_CERT_FILE");
        cmd
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_exit(out: &Output, code: i32) {
    assert_eq!(out.status.code(), Some(code), "{}", text(out));
}

const USER: &str = "polyuser";
const PASS: &str = "s3cret-Pa55-7f3a";

#[test]
fn htpasswd_registry_accepts_cli_config_and_helper_credentials() {
    let registry = Registry::start_htpasswd(USER, PASS);
    let project = Project::new(&registry.repo(&unique_name("auth/hello")), "[linux/amd64]");

    let out = run_with_stdin(
        project
            .build()
            .args(["--username", USER, "--password-stdin"]),
        &format!("{PASS}\n"),
    );
    assert_exit(&out, 0);

    // `auths` with base64 user:pass under an https:// key, as `docker login` writes.
    let auth = base64(&format!("{USER}:{PASS}"));
    std::fs::write(
        project.docker_config().join("config.json"),
        format!(
            "{{\"auths\":{{\"https://{}\":{{\"auth\":\"{auth}\"}}}}}}",
            registry.host
        ),
    )
    .unwrap();
    let out = run(&mut project.build());
    assert_exit(&out, 0);

    // credsStore: a helper on PATH that only knows this registry.
    let bin = project.dir.path().join("bin-helper");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-polyarchtest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nserver=$(cat)\nif [ \"$server\" = \"{}\" ]; then\n  printf '{{\"ServerURL\":\"%s\",\"Username\":\"{USER}\",\"Secret\":\"{PASS}\"}}' \"$server\"\nelse\n  echo 'credentials not found in native keychain'; exit 1\nfi\n",
            registry.host
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        project.docker_config().join("config.json"),
        "{\"auths\":{},\"credsStore\":\"polyarchtest\"}",
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run(project.build().env("PATH", path));
    assert_exit(&out, 0);
}

#[test]
fn wrong_password_fails_first_without_building_or_leaking() {
    let registry = Registry::start_htpasswd(USER, PASS);
    let project = Project::new(&registry.repo(&unique_name("auth/hello")), "[linux/amd64]");
    let wrong = "wr0ng-Secret-91c2";
    // The config file has a wrong password too: the CLI one must be the one used.
    std::fs::write(
        project.docker_config().join("config.json"),
        format!(
            "{{\"auths\":{{\"{}\":{{\"auth\":\"{}\"}}}}}}",
            registry.host,
            base64(&format!("{USER}:{PASS}x"))
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_with_stdin(
        project
            .build()
            .args(["--username", USER, "--password-stdin", "-v"]),
        &format!("{wrong}\n"),
    );
    let took = started.elapsed();
    eprintln!("{}", text(&out));
    assert_exit(&out, 3);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("registry {}", registry.host))
            && stderr.contains("401 unauthorized")
            && stderr.contains("check credentials for this registry"),
        "{}",
        text(&out)
    );
    assert!(
        !stderr.contains("building with") && !stderr.contains("polyarch-build/"),
        "a build started: {}",
        text(&out)
    );
    let record = std::fs::read_to_string(project.record()).unwrap_or_default();
    for secret in [wrong, PASS] {
        for (name, haystack) in [
            ("stdout", String::from_utf8_lossy(&out.stdout).into_owned()),
            ("stderr", stderr.to_string()),
            ("record", record.clone()),
        ] {
            assert!(!haystack.contains(secret), "{name} leaks a password");
        }
    }
}

#[test]
fn tls_registry_is_trusted_through_ca_cert_or_certs_d_only() {
    let registry = Registry::start_tls();
    let project = Project::new(&registry.repo(&unique_name("tls/hello")), "[linux/amd64]");

    let out = run(&mut project.build());
    eprintln!("{}", text(&out));
    assert_exit(&out, 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("registry {}", registry.host))
            && stderr.contains("TLS")
            && stderr.contains("--ca-cert")
            && stderr.contains("ca.crt")
            && !stderr.contains("building with"),
        "{}",
        text(&out)
    );

    let out = run(project
        .build()
        .arg("--ca-cert")
        .arg(registry.ca_cert_path()));
    assert_exit(&out, 0);

    let certs_d = project.dir.path().join("certs.d");
    std::fs::create_dir_all(certs_d.join(&registry.host)).unwrap();
    std::fs::copy(
        registry.ca_cert_path(),
        certs_d.join(&registry.host).join("ca.crt"),
    )
    .unwrap();
    let out = run(project.build().env("POLYARCH_CERTS_D", &certs_d));
    assert_exit(&out, 0);

    // As with Docker, a registry named with --insecure-registry may speak TLS with a
    // certificate nobody vouches for.
    let out = run(project
        .build()
        .arg("--insecure-registry")
        .arg(&registry.host));
    assert_exit(&out, 0);
}

#[test]
fn transient_faults_are_retried_and_the_index_verifies() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let name = unique_name("faults/hello");
    let project = Project::new(&proxy.repo(&name), "[linux/amd64, linux/arm64]");

    // Connection dropped mid-upload, 503 once on a HEAD, 500 once on starting an upload,
    // 429 with Retry-After on the index, a slow manifest read.
    proxy.add(Rule::new(
        "PUT",
        "/blobs/uploads/",
        Fault::Drop { after_bytes: 4096 },
    ));
    proxy.add(Rule::new(
        "HEAD",
        "/blobs/sha256:",
        Fault::Status {
            code: 503,
            retry_after: None,
        },
    ));
    proxy.add(Rule::new(
        "POST",
        "/blobs/uploads/",
        Fault::Status {
            code: 500,
            retry_after: None,
        },
    ));
    proxy.add(Rule::new(
        "PUT",
        "/manifests/v1",
        Fault::Status {
            code: 429,
            retry_after: Some(1),
        },
    ));
    proxy.add(Rule::new(
        "GET",
        "/manifests/",
        Fault::Delay(Duration::from_millis(1500)),
    ));
    let started = Instant::now();
    let out = run(&mut project.build());
    assert_exit(&out, 0);
    let log = proxy.log();
    eprintln!("{}\n{log:#?}", text(&out));
    for fault in ["Drop {", "code: 503", "code: 500", "code: 429", "Delay("] {
        assert!(
            log.iter().any(|l| l.contains(fault)),
            "{fault} never fired: {log:#?}"
        );
    }
    // The record's index is what the tag resolves to.
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(project.record()).unwrap()).unwrap();
    let digest = skopeo_digest(&registry.repo(&format!("{name}:v1")), None);
    assert!(
        record.to_string().contains(&digest),
        "record lacks {digest}: {record}"
    );
    eprintln!("faulty run took {:?}", started.elapsed());
}

#[test]
fn permanent_upload_failure_exits_3_and_keeps_the_old_tag() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let name = unique_name("atomic/hello");
    let project = Project::new(&proxy.repo(&name), "[linux/amd64]");
    let out = run(&mut project.build());
    assert_exit(&out, 0);
    let old = skopeo_digest(&registry.repo(&format!("{name}:v1")), None);

    // A different config blob, so something has to be uploaded.
    std::fs::write(
        project.dir.path().join("Dockerfile"),
        format!("{HELLO}LABEL run=\"{}\"\n", unique_name("second")),
    )
    .unwrap();
    proxy.add(
        Rule::new(
            "PUT",
            "/blobs/uploads/",
            Fault::Status {
                code: 500,
                retry_after: None,
            },
        )
        .always(),
    );
    let started = Instant::now();
    let out = run(&mut project.build());
    eprintln!("{}", text(&out));
    assert_exit(&out, 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("registry {}", proxy.host)),
        "{}",
        text(&out)
    );
    // Who gave up, after its own retries: BuildKit pushing by itself, or polyarch.
    if support::engines::engine_pushes_itself() {
        assert!(
            stderr.contains("the engine could not push"),
            "{}",
            text(&out)
        );
    } else {
        assert!(
            stderr.contains("upload blob sha256:") && stderr.contains("after 5 attempts"),
            "{}",
            text(&out)
        );
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        skopeo_digest(&registry.repo(&format!("{name}:v1")), None),
        old,
        "the tag moved although the push failed"
    );
}

fn base64(input: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = input.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn shared_layers_upload_once_and_mount_across_repositories() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here and uploads a layer once per repository; polyarch's uploader, which mounts it, runs on the classic-store pass");
        return;
    }
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\n",
    );
    let (a, b) = (unique_name("shared/a"), unique_name("shared/b"));
    let file = dir.path().join("polyarch.yaml");
    std::fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  a:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n  b:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n",
            proxy.repo(&a),
            proxy.repo(&b)
        ),
    )
    .unwrap();
    let out = run(polyarch()
        .args(["build", "-j", "4", "-f"])
        .arg(&file)
        .env("DOCKER_CONFIG", dir.path()));
    assert_exit(&out, 0);
    let index = support::skopeo_inspect_raw(&registry.repo(&format!("{a}:v1")));
    let manifest = support::skopeo_inspect_raw(&format!(
        "{}@{}",
        registry.repo(&a),
        index["manifests"][0]["digest"].as_str().unwrap()
    ));
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let log = proxy.log();
    let puts = log
        .iter()
        .filter(|l| l.starts_with("PUT ") && l.contains(&layer.replace(':', "%3A")))
        .count();
    let mounts = log
        .iter()
        .filter(|l| l.starts_with("POST ") && l.contains("mount="))
        .count();
    assert_eq!(puts, 1, "layer {layer} uploaded {puts} times: {log:#?}");
    assert!(mounts >= 1, "no cross-repository mount: {log:#?}");
}

/// A project building `FROM scratch` on a base layer of this test's own (`base`, the same
/// bytes in every project of the test) and a layer of its own, for `repository`.
fn project_on_shared_base(base: &str, own: &str, repository: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base"), base).unwrap();
    std::fs::write(dir.path().join("own"), own).unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY base /base\nCOPY own /own\n",
    )
    .unwrap();
    let file = write_project(dir.path(), repository, "[v1]", "[linux/amd64]");
    (dir, file)
}

fn first_layer(reference: &str) -> String {
    let index = support::skopeo_inspect_raw(&format!("{reference}:v1"));
    let manifest = support::skopeo_inspect_raw(&format!(
        "{reference}@{}",
        index["manifests"][0]["digest"].as_str().unwrap()
    ));
    manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

/// What a later run does with a layer an earlier one pushed to another repository of the
/// registry: mounts it (the cache directory remembers where it went), and uploads it
/// when the remembered repository no longer has it, forgetting that place.
#[test]
fn a_later_run_mounts_a_layer_an_earlier_run_pushed_to_another_repository() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here (and labels each layer with its source repository to mount it later); polyarch's uploader runs on the classic-store pass");
        return;
    }
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let cache = tempfile::tempdir().unwrap();
    let base = unique_name("base");
    let build = |own: &str, repository: &str| {
        let (dir, file) = project_on_shared_base(&base, own, &proxy.repo(repository));
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .env("DOCKER_CONFIG", dir.path())
            .env("POLYARCH_CACHE_DIR", cache.path()));
        assert_exit(&out, 0);
    };
    let uploads_and_mounts = |from: usize, layer: &str| {
        let log = proxy.log();
        let quoted = layer.replace(':', "%3A");
        let of_layer = |l: &&String| l.contains(layer) || l.contains(&quoted);
        let uploads = log[from..]
            .iter()
            .filter(of_layer)
            .filter(|l| l.starts_with("PUT ") && l.contains("/blobs/uploads/"))
            .count();
        let mounts: Vec<String> = log[from..]
            .iter()
            .filter(of_layer)
            .filter(|l| l.starts_with("POST ") && l.contains("mount="))
            .cloned()
            .collect();
        (uploads, mounts)
    };

    let (first, second, third) = (
        unique_name("later/first"),
        unique_name("later/second"),
        unique_name("later/third"),
    );
    build("first", &first);
    let layer = first_layer(&registry.repo(&first));
    assert_eq!(uploads_and_mounts(0, &layer).0, 1, "{:#?}", proxy.log());

    // Another project, another run: the base is mounted from the first repository.
    let seen = proxy.log().len();
    build("second", &second);
    assert_eq!(first_layer(&registry.repo(&second)), layer);
    let (uploads, mounts) = uploads_and_mounts(seen, &layer);
    assert_eq!(uploads, 0, "uploaded again: {:#?}", &proxy.log()[seen..]);
    assert_eq!(mounts.len(), 1, "{mounts:#?}");
    assert!(
        mounts[0].contains(&format!("from={}", first.replace('/', "%2F"))),
        "{mounts:#?}"
    );

    // A remembered place that no longer holds the layer: the mount is declined, the layer
    // is uploaded, the place is forgotten.
    let blobs = cache.path().join("blobs.json");
    let remembered = std::fs::read_to_string(&blobs).unwrap();
    std::fs::write(
        &blobs,
        remembered
            .replace(&first, "later/gone")
            .replace(&second, "later/gone"),
    )
    .unwrap();
    let seen = proxy.log().len();
    build("third", &third);
    let (uploads, mounts) = uploads_and_mounts(seen, &layer);
    assert_eq!(
        (uploads, mounts.len()),
        (1, 1),
        "{:#?}",
        &proxy.log()[seen..]
    );
    let now: serde_json::Value = serde_json::from_slice(&std::fs::read(&blobs).unwrap()).unwrap();
    let places = &now[format!("{}|{layer}", proxy.host)]["value"];
    assert_eq!(places, &serde_json::json!([third]), "{now:#}");
}

/// A warm rerun reads each tag once: the read that finds it already at the index is the
/// read-back. A run that moves the tag reads it again after the move.
#[test]
fn a_warm_rerun_reads_the_tag_once_and_a_moving_run_reads_it_back() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let name = unique_name("warm/once");
    let project = Project::new(&proxy.repo(&name), "[linux/amd64]");
    let tag_reads = |from: usize| {
        proxy.log()[from..]
            .iter()
            .filter(|l| l.starts_with("GET ") && l.contains(&format!("{name}/manifests/v1")))
            .count()
    };
    let cache = project.dir.path().join("cache");
    let out = run(project.build().env("POLYARCH_CACHE_DIR", &cache));
    assert_exit(&out, 0);
    assert_eq!(tag_reads(0), 2, "{:#?}", proxy.log());
    // The read-back leaves what the tag names for a later verify or gate to read at once.
    let references = std::fs::read_to_string(cache.join("references.json")).unwrap();
    let served = skopeo_digest(&format!("{}:v1", registry.repo(&name)), None);
    assert!(
        references.contains(&format!("{}:v1", proxy.repo(&name))) && references.contains(&served),
        "{references}"
    );
    let seen = proxy.log().len();
    let out = run(project.build().env("POLYARCH_CACHE_DIR", &cache));
    assert_exit(&out, 0);
    assert_eq!(tag_reads(seen), 1, "{:#?}", &proxy.log()[seen..]);
}

/// Another push moves the tag between this run's push and its read-back: the run judges
/// the index the tag now names, not the one it pushed, and says that a push raced it.
#[test]
fn a_tag_moved_by_a_racing_push_before_the_read_back_is_a_gap_that_says_so() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let name = unique_name("race");
    let project = Project::new(&proxy.repo(&name), "[linux/amd64]");
    let cache = project.dir.path().join("cache");
    assert_exit(&run(project.build().env("POLYARCH_CACHE_DIR", &cache)), 0);
    let earlier = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}:v1", registry.repo(&name)))
        .output()
        .unwrap();
    assert!(earlier.status.success(), "{}", text(&earlier));
    let earlier_digest = skopeo_digest(&format!("{}:v1", registry.repo(&name)), None);

    // A label makes a new index; every read of the tag answers the earlier one, as if
    // another run had pushed it again right after this run's push.
    let yaml = std::fs::read_to_string(&project.file).unwrap();
    std::fs::write(
        &project.file,
        format!("{yaml}    labels: {{raced: \"yes\"}}\n"),
    )
    .unwrap();
    proxy.add(Rule {
        method: Some("GET".into()),
        path_contains: format!("{name}/manifests/v1"),
        fault: Fault::respond(
            200,
            "application/vnd.oci.image.index.v1+json",
            earlier.stdout,
        ),
        times: None,
    });
    let out = run(project.build().env("POLYARCH_CACHE_DIR", &cache));
    assert_exit(&out, 1);
    assert!(
        text(&out).contains("another push raced this one"),
        "{}",
        text(&out)
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.record()).unwrap()).unwrap();
    assert_eq!(record["images"][0]["digest"], earlier_digest, "{record:#}");
    assert_eq!(record["images"][0]["covered"], false, "{record:#}");
}

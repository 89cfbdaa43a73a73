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

#[test]
fn a_layer_an_earlier_run_pushed_is_mounted_into_a_new_repository() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here (its pusher mounts from the repositories its content store labels); polyarch's uploader runs on the classic-store pass");
        return;
    }
    let registry = Registry::start();
    // A monorepo: two services on one base layer, each its own project, built by two runs
    // that share polyarch's cache directory (as on one CI runner).
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\n",
    );
    std::fs::write(
        dir.path().join("Dockerfile.b"),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nCOPY Dockerfile.b /etc/service\n",
    )
    .unwrap();
    let (a, b) = (unique_name("mounts/a"), unique_name("mounts/b"));
    let cache = dir.path().join("cache");
    let run_project = |name: &str, reference: &str, dockerfile: &str| {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "version: 1\nimages:\n  {name}:\n    repository: {reference}\n    tags: [v1]\n    context: .\n    dockerfile: {dockerfile}\n    platforms: [linux/amd64]\n",
            ),
        )
        .unwrap();
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .env("DOCKER_CONFIG", dir.path())
            .env("POLYARCH_CACHE_DIR", &cache));
        assert_exit(&out, 0);
    };
    run_project("a", &registry.repo(&a), "Dockerfile");
    run_project("b", &registry.repo(&b), "Dockerfile.b");

    let layers = |repository: &str| -> Vec<String> {
        let index = support::skopeo_inspect_raw(&registry.repo(&format!("{repository}:v1")));
        let manifest = support::skopeo_inspect_raw(&format!(
            "{}@{}",
            registry.repo(repository),
            index["manifests"][0]["digest"].as_str().unwrap()
        ));
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    };
    let (in_a, in_b) = (layers(&a), layers(&b));
    let shared = &in_a[0];
    assert_eq!(
        &in_b[0], shared,
        "the base layer differs: {in_a:?} {in_b:?}"
    );
    // skopeo reads the second image, its shared layer from its own repository.
    let copied = tempfile::tempdir().unwrap();
    let out = run(Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", "--all"])
        .arg(format!("docker://{}:v1", registry.repo(&b)))
        .arg(format!("oci:{}:b", copied.path().display())));
    assert_exit(&out, 0);

    // The registry's access log: the second run mounted the shared layer (201) and
    // uploaded only its own one.
    let log = registry.log();
    let requests: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("/v2/{b}/blobs/")))
        .collect();
    let uploads = |digest: &str| {
        let encoded = digest.replace(':', "%3A");
        requests
            .iter()
            .filter(|l| l.contains("\"PUT ") && l.contains(&encoded))
            .count()
    };
    assert_eq!(uploads(shared), 0, "{requests:#?}");
    assert_eq!(uploads(&in_b[1]), 1, "{requests:#?}");
    assert!(
        requests.iter().any(|l| l.contains("\"POST ")
            && l.contains(&format!("mount={shared}"))
            && l.contains(&format!("from={a}"))
            && l.contains("\" 201 ")),
        "{requests:#?}"
    );

    // A repository remembered for a blob it no longer has (deleted since): the registry
    // declines the mount (202) and the blob goes up on the session that opened; the
    // stale repository is forgotten. The third run goes through a proxy that fails one
    // such upload: that blob goes up on a new session.
    let proxy = Proxy::start(registry.port);
    let places = cache.join("blobs.json");
    let gone = unique_name("mounts/gone");
    let text = std::fs::read_to_string(&places).unwrap();
    assert!(text.contains(&b), "{text}");
    let text = text.replace(&b, &gone).replace(&registry.host, &proxy.host);
    std::fs::write(&places, text).unwrap();
    let failed = in_b[1].replace(':', "%3A");
    proxy.add(Rule::new(
        "PUT",
        &failed,
        Fault::Status {
            code: 500,
            retry_after: None,
        },
    ));
    let c = unique_name("mounts/c");
    run_project("c", &proxy.repo(&c), "Dockerfile.b");
    assert_eq!(layers(&c), in_b);
    let log = registry.log();
    let requests: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("127.0.0.1 ") && l.contains(&format!("/v2/{c}/blobs/")))
        .collect();
    for layer in &in_b {
        let declined = format!("mount={layer}&from={gone} HTTP/1.1\" 202 ");
        assert!(
            requests.iter().any(|l| l.contains(&declined)),
            "{requests:#?}"
        );
        let encoded = layer.replace(':', "%3A");
        let puts: Vec<_> = requests
            .iter()
            .filter(|l| l.contains("\"PUT ") && l.contains(&encoded))
            .collect();
        assert_eq!(puts.len(), 1, "{requests:#?}");
        assert!(puts[0].contains("\" 201 "), "{requests:#?}");
    }
    assert!(
        proxy
            .log()
            .iter()
            .any(|l| l.starts_with("PUT ") && l.contains(&failed) && l.contains("500")),
        "{:#?}",
        proxy.log()
    );
    // One POST per blob (the declined mount's session carried its upload), and one more
    // for the new session of the failed upload.
    let count = |method: &str| requests.iter().filter(|l| l.contains(method)).count();
    assert_eq!(count("\"POST "), count("\"PUT ") + 1, "{requests:#?}");
    let text = std::fs::read_to_string(&places).unwrap();
    assert!(!text.contains(&gone), "{text}");
}

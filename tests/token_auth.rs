//! Against a token-auth registry, as every public registry is: one token for the whole
//! run, cross-repository mounts that take effect, verify, and a wrong password's error.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use proxy::Proxy;
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use support::token::TokenServer;
use support::{hello_context, polyarch, run, unique_name, Registry};

const USER: &str = "tokenuser";
const PASS: &str = "t0ken-Pa55-4e1b";
/// What buildx 0.13 fetched for 2 images × 2 platforms on this kind of registry (issue 16).
const BUILDX_FETCHES: usize = 8;

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

/// A Docker config dir whose `auths` hold the token server's user.
fn docker_config(dir: &Path, host: &str) -> std::path::PathBuf {
    let config = dir.join("docker-config");
    std::fs::create_dir_all(&config).unwrap();
    let auth = base64(&format!("{USER}:{PASS}"));
    std::fs::write(
        config.join("config.json"),
        format!("{{\"auths\":{{\"{host}\":{{\"auth\":\"{auth}\"}}}}}}"),
    )
    .unwrap();
    config
}

fn base64(input: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(input)
}

#[test]
fn two_images_push_with_one_token_mount_shared_layers_and_verify() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here (with its own tokens); polyarch's uploader runs on the classic-store pass");
        return;
    }
    let server = TokenServer::start(Some((USER, PASS)));
    let registry = Registry::start_token(&server);
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\n",
    );
    let (a, b) = (unique_name("tok/a"), unique_name("tok/b"));
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
    let config = docker_config(dir.path(), &proxy.host);
    // Its own cache: no other test's memory of where blobs went on a reused port.
    let cache = dir.path().join("cache");
    let out = run(polyarch()
        .args(["build", "-j", "4", "-f"])
        .arg(&file)
        .env("DOCKER_CONFIG", &config)
        .env("POLYARCH_CACHE_DIR", &cache));
    assert_exit(&out, 0);

    let requests = server.requests();
    eprintln!("token requests of the push: {requests:#?}");
    let fetches = requests.len();
    assert!(
        fetches <= BUILDX_FETCHES,
        "{fetches} token fetches for 2 images × 2 platforms (buildx: {BUILDX_FETCHES}): {requests:#?}"
    );
    assert_eq!(fetches, 1, "one token for the run: {requests:#?}");
    let scopes = &requests[0].scopes;
    for repo in [&a, &b] {
        assert!(
            scopes.contains(&format!("repository:{repo}:pull,push")),
            "{repo} not asked for: {scopes:?}"
        );
    }

    // The layer both images share is uploaded once and mounted into the other repository.
    let log = proxy.log();
    let uploads = log
        .iter()
        .filter(|l| {
            (l.starts_with("PUT ") || l.starts_with("PATCH ")) && l.contains("/blobs/uploads/")
        })
        .filter(|l| !l.contains("mount="))
        .count();
    let mounts = log
        .iter()
        .filter(|l| l.starts_with("POST ") && l.contains("mount="))
        .count();
    assert!(mounts >= 1, "no cross-repository mount: {log:#?}");
    let requests_per_push = log.len();
    eprintln!("registry requests of the push: {requests_per_push}, blob uploads: {uploads}, mounts: {mounts}");

    // verify reads both platforms back with one token of its own.
    let before = server.requests().len();
    let out = run(polyarch()
        .args([
            "verify",
            &proxy.repo(&format!("{a}:v1")),
            "--platform",
            "linux/amd64,linux/arm64",
        ])
        .env("DOCKER_CONFIG", &config));
    assert_exit(&out, 0);
    let verify_fetches = server.requests().len() - before;
    assert_eq!(verify_fetches, 1, "{:#?}", server.requests());

    // A later run of another project: its token may also pull from where the shared
    // layer went, so the layer is mounted from there, not uploaded.
    let c = unique_name("tok/c");
    std::fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  c:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n",
            proxy.repo(&c)
        ),
    )
    .unwrap();
    let (before, seen) = (server.requests().len(), proxy.log().len());
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .env("DOCKER_CONFIG", &config)
        .env("POLYARCH_CACHE_DIR", &cache));
    assert_exit(&out, 0);
    let scopes: Vec<String> = server.requests()[before..]
        .iter()
        .flat_map(|r| r.scopes.clone())
        .collect();
    assert!(
        scopes
            .iter()
            .any(|s| s == &format!("repository:{a}:pull") || s == &format!("repository:{b}:pull")),
        "the source was not asked for: {scopes:?}"
    );
    let log = &proxy.log()[seen..];
    let (uploads, mounts) = (
        log.iter()
            .filter(|l| l.starts_with("PUT ") && l.contains("/blobs/uploads/"))
            .count(),
        log.iter()
            .filter(|l| l.starts_with("POST ") && l.contains("mount="))
            .count(),
    );
    // The same build as image a's amd64: its layer and config are both mounted.
    assert_eq!((uploads, mounts), (0, 2), "{log:#?}");
}

#[test]
fn a_wrong_password_at_the_token_server_is_a_clear_auth_error() {
    let server = TokenServer::start(Some((USER, PASS)));
    let registry = Registry::start_token(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("docker-config")).unwrap();
    let reference = registry.repo(&format!("{}:v1", unique_name("tok/wrong")));
    let wrong = "wr0ng-T0ken-Secret";
    let mut child = polyarch()
        .args(["verify", &reference, "--platform", "linux/amd64"])
        .args(["--username", USER, "--password-stdin"])
        .env("DOCKER_CONFIG", dir.path().join("docker-config"))
        .env("POLYARCH_RETRY_BASE_MS", "50")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{wrong}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert!(
        error_lines.len() == 1
            && error_lines[0].contains(&format!("registry {}", registry.host))
            && error_lines[0].contains("401 unauthorized")
            && error_lines[0].contains("check credentials for this registry"),
        "{}",
        text(&out)
    );
    assert!(!stderr.contains(wrong), "stderr leaks the password");
    assert!(
        server.requests().iter().all(|r| r.status == 401),
        "{:#?}",
        server.requests()
    );
}

#[test]
fn a_refused_token_is_fetched_again_once_and_the_push_goes_on() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here (with its own tokens)");
        return;
    }
    let server = TokenServer::start(Some((USER, PASS)));
    let registry = Registry::start_token(&server);
    let proxy = Proxy::start(registry.port);
    // The first manifest push is refused as a registry refuses a lapsed token.
    proxy.add(proxy::Rule::new(
        "PUT",
        "/manifests/",
        proxy::Fault::Status {
            code: 401,
            retry_after: None,
        },
    ));
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), support::HELLO);
    let repo = proxy.repo(&unique_name("tok/renew"));
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let config = docker_config(dir.path(), &proxy.host);
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .env("DOCKER_CONFIG", &config));
    assert_exit(&out, 0);
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        2,
        "one token, and one after the 401: {requests:#?}"
    );
    assert!(requests
        .iter()
        .all(|r| r.status == 200 && r.scopes.len() == 1));
}

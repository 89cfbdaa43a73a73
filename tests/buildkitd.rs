//! polyarch on a standalone BuildKit daemon (scripts/buildkitd.sh): its workers'
//! platforms over unix and mutual TLS, and each TLS mistake refused before any build.

mod support;

use support::running::interrupt_while_running;
use support::supply_chain;

use polyarch::base::platform::Platform;
use polyarch::docker::buildkit::daemon::{Daemon, DaemonError};
use polyarch::docker::endpoint::{Endpoint, EndpointError, TlsFiles};
use std::path::Path;
use std::process::Command;

fn tls(dir: &Path) -> TlsFiles {
    TlsFiles {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("cert.pem")),
        key: Some(dir.join("key.pem")),
        skip_verify: false,
        server_name: None,
    }
}

async fn connect(address: &str, tls: Option<&TlsFiles>) -> Result<Daemon, DaemonError> {
    let endpoint = Endpoint::resolve(address, tls)?;
    let daemon = Daemon::connect(&endpoint).await?;
    // The first call: TLS 1.3 tells a refused client certificate only now.
    daemon.version().await?;
    Ok(daemon)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_lists_its_platforms_over_unix_and_mutual_tls() {
    let bk = support::buildkitd::shared();
    let amd64: Platform = "linux/amd64".parse().unwrap();
    for (address, files) in [(&bk.unix, None), (&bk.tcp, Some(tls(&bk.tls)))] {
        let daemon = connect(address, files.as_ref()).await.unwrap();
        let platforms = daemon.platforms().await.unwrap();
        assert!(platforms.contains(&amd64), "{address}: {platforms:?}");
        assert_eq!(
            daemon.version().await.unwrap(),
            support::buildkitd::binary_version()
        );
    }
}

/// A CA of its own, with a client certificate it signed: both unknown to the daemon.
fn other_ca(dir: &Path) {
    let sh = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other-ca -keyout ca.key -out ca.pem
printf 'extendedKeyUsage=clientAuth\n' >client.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=other -keyout key.pem -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile client.ext -out cert.pem"#;
    let out = Command::new("sh")
        .args(["-c", sh])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_mutual_tls_mistakes_are_refused_with_the_fix() {
    let bk = support::buildkitd::shared();
    let other = tempfile::tempdir().unwrap();
    other_ca(other.path());

    // The daemon's certificate checked against a CA that did not sign it.
    let wrong_ca = TlsFiles {
        ca: Some(other.path().join("ca.pem")),
        ..tls(&bk.tls)
    };
    let error = connect(&bk.tcp, Some(&wrong_ca)).await.err().unwrap();
    assert!(
        matches!(
            error,
            DaemonError::Endpoint(EndpointError::UntrustedServer { .. })
        ),
        "{error:?}"
    );

    // A name the daemon's certificate does not carry is refused, with the fix; the one it
    // carries (not the address's host) is accepted.
    let other_name = TlsFiles {
        server_name: Some("buildkitd.example".into()),
        ..tls(&bk.tls)
    };
    let error = connect(&bk.tcp, Some(&other_name)).await.err().unwrap();
    assert!(
        matches!(
            error,
            DaemonError::Endpoint(EndpointError::UntrustedServer { .. })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("tls: servername"), "{error}");
    let carried = TlsFiles {
        server_name: Some("localhost".into()),
        ..tls(&bk.tls)
    };
    connect(&bk.tcp, Some(&carried)).await.unwrap();

    // No client certificate, and one the daemon's CA did not sign.
    let no_cert = TlsFiles {
        cert: None,
        key: None,
        ..tls(&bk.tls)
    };
    let foreign_cert = TlsFiles {
        cert: Some(other.path().join("cert.pem")),
        key: Some(other.path().join("key.pem")),
        ..tls(&bk.tls)
    };
    for files in [no_cert, foreign_cert] {
        let error = connect(&bk.tcp, Some(&files)).await.err().unwrap();
        assert!(
            matches!(
                error,
                DaemonError::Endpoint(EndpointError::ClientCertRefused { .. })
            ),
            "{files:?}: {error:?}"
        );
    }

    // Plain text on the TLS listener.
    let error = connect(&bk.tcp, None).await.err().unwrap();
    assert!(matches!(error, DaemonError::NotGrpc { .. }), "{error:?}");
    let shown = error.to_string();
    assert!(
        !shown.contains('\n') && shown.contains("tls: ca, cert, key"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_builds_a_context_sent_through_its_control_session() {
    use polyarch::docker::buildkit::{solve_on, DockerfileBuild, Exporter, SessionAuth, Target};
    use std::collections::HashMap;
    let bk = support::buildkitd::shared();
    let context = tempfile::tempdir().unwrap();
    let marker = support::unique_name("marker");
    std::fs::write(context.path().join("marker"), &marker).unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        "FROM scratch\nCOPY marker /marker\n",
    )
    .unwrap();
    let daemon = connect(&bk.unix, None).await.unwrap();
    let build = DockerfileBuild {
        context: context.path(),
        dockerfile: Path::new("Dockerfile"),
        named_dirs: Vec::new(),
        frontend_attrs: HashMap::from([("platform".into(), "linux/amd64".into())]),
        entitlements: vec![],
        // Kept in the daemon's own store: the session is what is under test here.
        exporter: Exporter {
            kind: "image".into(),
            attrs: HashMap::from([("name".into(), format!("polyarch.test/{marker}"))]),
            file: None,
        },
        secrets: Default::default(),
        ssh: Default::default(),
        cache_from: vec![],
        cache_to: None,
        history: false,
        hashes: None,
    };
    let solved = solve_on(
        Target::Daemon(&daemon),
        build,
        SessionAuth::default(),
        |_| {},
    )
    .await
    .unwrap();
    let digest = &solved.exporter_response["containerimage.digest"];
    assert!(
        digest.starts_with("sha256:"),
        "{:?}",
        solved.exporter_response
    );
    // The context travelled through the session's file sync.
    assert!(!solved.transfers.is_empty());
}

/// A busybox context whose build RUNs a step for the target platform (under QEMU for
/// arm64 on this amd64 host), and a project building it for `platforms`.
fn run_step_project(dir: &Path, repository: &str, platforms: &str) -> std::path::PathBuf {
    support::hello_context(
        dir,
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox uname -m > /arch\"]\n",
    );
    let file = support::write_project(dir, repository, "[v1]", platforms);
    let name = support::unique_name("bkd");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("  hello:", &format!("  {name}:"))).unwrap();
    file
}

/// polyarch with `BUILDKIT_HOST` set and no Docker engine anywhere.
fn polyarch_on(daemon: &str) -> Command {
    let mut cmd = support::polyarch();
    cmd.env("BUILDKIT_HOST", daemon)
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env_remove("DOCKER_CONTEXT");
    cmd
}

#[test]
fn buildkitd_builds_two_platforms_with_a_qemu_run_and_no_docker_engine() {
    let binfmt = support::binfmt::BinfmtGuard::save();
    support::binfmt::register_qemu_aarch64(&binfmt);
    let bk = support::buildkitd::Private::start();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/two"));
    let file = run_step_project(dir.path(), &repo, "[linux/amd64, linux/arm64]");
    let record = dir.path().join("coverage.json");

    let out = support::run(
        polyarch_on(&bk.unix)
            .args(["build", "--sbom", "--sign-key"])
            .arg(supply_chain::fixture_key())
            .arg("-f")
            .arg(&file)
            .arg("--record")
            .arg(&record)
            .env("COSIGN_PASSWORD", supply_chain::FIXTURE_PASSWORD),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("on BuildKit daemon {}", bk.unix)),
        "{stderr}"
    );
    // SBOMs and signatures, as on every builder kind.
    supply_chain::assert_signed_with_sboms(
        &format!("{repo}:v1"),
        &supply_chain::fixture_public_key(),
    );

    // An independent client reads one index with both platforms.
    let index = support::skopeo_inspect_raw(&format!("{repo}:v1"));
    assert_eq!(
        support::platforms_of(&index),
        ["linux/amd64", "linux/arm64"],
        "{index}"
    );
    let arm64 = support::skopeo_config(&format!("{repo}:v1"), "arm64", None);
    assert_eq!(arm64["architecture"], "arm64", "{arm64}");

    // The record names the daemon as the builder of each platform.
    let text = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        text.matches(&format!("\"{}\"", bk.unix)).count(),
        2,
        "{text}"
    );

    // verify needs no engine either.
    let out = support::run(polyarch_on(&bk.unix).args(["verify", "-f"]).arg(&file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn buildkitd_refuses_a_platform_its_workers_cannot_run_before_any_build() {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/s390x"));
    let file = run_step_project(dir.path(), &repo, "[linux/amd64, linux/s390x]");

    let out = support::run(polyarch_on(&bk.unix).args(["build", "-f"]).arg(&file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.contains("linux/s390x"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        error.contains(&format!("BuildKit daemon {}", bk.unix))
            && error.contains("QEMU")
            && error.contains("native daemon"),
        "{error}"
    );
    // Nothing was built, so nothing was pushed.
    assert!(!stderr.contains("building on"), "{stderr}");
    let tags = support::run(
        Command::new("skopeo")
            .args(["list-tags", "--tls-verify=false"])
            .arg(format!("docker://{repo}")),
    );
    assert!(
        !String::from_utf8_lossy(&tags.stdout).contains("v1"),
        "{tags:?}"
    );
}

/// Builds leave no record in BuildKit's build history unless `--build-history` asks.
#[test]
fn buildkitd_records_a_build_in_its_history_only_with_build_history() {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    support::hello_context(dir.path(), support::HELLO);
    let repo = registry.repo(&support::unique_name("bkd/history"));
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let recorded = || {
        support::buildkitd::recorded_repositories(&bk.unix)
            .iter()
            .filter(|name| **name == repo)
            .count()
    };

    let out = support::run(polyarch_on(&bk.unix).args(["build", "-f"]).arg(&file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(recorded(), 0);

    let out = support::run(
        polyarch_on(&bk.unix)
            .args(["build", "--build-history", "--rebuild", "-f"])
            .arg(&file),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(recorded(), 1);
}

#[test]
fn buildkitd_named_in_builders_builds_its_platform_over_mutual_tls_beside_the_engine() {
    let binfmt = support::binfmt::BinfmtGuard::save();
    support::binfmt::register_qemu_aarch64(&binfmt);
    let bk = support::buildkitd::Private::start();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/mixed"));
    let file = run_step_project(dir.path(), &repo, "[linux/amd64, linux/arm64]");
    // The machine's engine may have no default bridge for RUN steps.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{text}    network: none\n")).unwrap();
    // The client's TLS files beside the project, named relative to it.
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    for name in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::copy(bk.tls.join(name), dir.path().join("certs").join(name)).unwrap();
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let builders = format!(
        "builders:\n  linux/arm64: {{buildkit: \"{}\", tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}\n",
        bk.tcp
    );
    std::fs::write(&file, format!("{builders}{text}")).unwrap();
    let record = dir.path().join("coverage.json");

    // amd64 on the machine's engine, arm64 on the daemon.
    let out = support::run(
        support::polyarch()
            .env_remove("BUILDKIT_HOST")
            .args(["build", "-f"])
            .arg(&file)
            .arg("--record")
            .arg(&record),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "linux/arm64 [build] building on BuildKit daemon {}",
            bk.tcp
        )),
        "{stderr}"
    );
    let arm64 = support::skopeo_config(&format!("{repo}:v1"), "arm64", None);
    assert_eq!(arm64["architecture"], "arm64", "{arm64}");
    let amd64 = support::skopeo_config(&format!("{repo}:v1"), "amd64", None);
    assert_eq!(amd64["architecture"], "amd64", "{amd64}");
    let text = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        text.matches(&format!("\"{}\"", bk.tcp)).count(),
        1,
        "{text}"
    );
}

#[test]
fn buildkitd_gets_secrets_and_honours_dockerignore_as_engines_do() {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/secret"));
    // The build itself checks: the secret arrives, the ignored file does not.
    support::hello_context(
        dir.path(),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nCOPY . /ctx/\nRUN --mount=type=secret,id=token [\"/bin/busybox\", \"sh\", \"-c\", \"test \\\"$(/bin/busybox cat /run/secrets/token)\\\" = s3cret && test -e /ctx/kept.txt && test ! -e /ctx/ignored.txt\"]\n",
    );
    std::fs::write(dir.path().join("kept.txt"), "kept").unwrap();
    std::fs::write(dir.path().join("ignored.txt"), "ignored").unwrap();
    std::fs::write(dir.path().join(".dockerignore"), "ignored.txt\n").unwrap();
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let text = std::fs::read_to_string(&file).unwrap();
    let name = support::unique_name("bkd");
    let text = text.replace("  hello:", &format!("  {name}:"));
    std::fs::write(
        &file,
        format!("{text}    secrets:\n      token: {{env: BKD_TOKEN}}\n"),
    )
    .unwrap();

    // --no-cache: BuildKit's cache key of a step leaves secrets out.
    let build = |token: &str| {
        support::run(
            polyarch_on(&bk.unix)
                .env("BKD_TOKEN", token)
                .args(["build", "--no-cache", "-f"])
                .arg(&file),
        )
    };
    let out = build("s3cret");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same check fails with another secret: the step really ran its test.
    let out = build("other");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("exit code: 1"), "{stderr}");
}

/// SIGINT while a `sleep` no other test runs is running on the daemon, as the build's RUN
/// step (`in_test` false) or as the image's `test:`: exit 130, and the daemon cancels
/// the solve when its client goes, so the command does not run on.
fn sigint_cancels_on_the_daemon(in_test: bool) {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = support::unique_name("bkdint");
    let seconds = (3000 + name.bytes().map(u32::from).sum::<u32>() % 5000).to_string();
    let sleep_step = format!("RUN [\"/bin/busybox\", \"sleep\", \"{seconds}\"]\n");
    let dockerfile = match in_test {
        true => support::HELLO.to_string(),
        false => format!("{}{sleep_step}", support::HELLO),
    };
    support::hello_context(dir.path(), &dockerfile);
    let repo = registry.repo(&support::unique_name("bkd/int"));
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let mut text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("  hello:", &format!("  {name}:"));
    if in_test {
        text += &format!("    test: {{run: [/bin/busybox, sleep, \"{seconds}\"], timeout: 2h}}\n");
    }
    std::fs::write(&file, text).unwrap();

    let mut command = polyarch_on(&bk.unix);
    command
        .args(["build", "-f"])
        .arg(&file)
        .env_remove("CI")
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache"));
    let interrupted =
        interrupt_while_running(command, &["/bin/busybox", "sleep", seconds.as_str()]);
    assert!(interrupted.stdout.is_empty(), "a record was printed");
    // The daemon cancels the solve when its client goes.
    interrupted.wait_step_gone();
    let tag = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{repo}:v1"))
        .output()
        .unwrap();
    assert!(!tag.status.success(), "the tag moved");
}

#[test]
fn buildkitd_sigint_mid_run_step_cancels_the_solve_on_the_daemon() {
    sigint_cancels_on_the_daemon(false);
}

#[test]
fn buildkitd_sigint_during_a_test_cancels_it_on_the_daemon() {
    sigint_cancels_on_the_daemon(true);
}

/// A CI job with no Docker engine: every platform has a daemon under `builders:`, so
/// `plan` and `build` need no engine; a platform left without one still does.
#[test]
fn buildkitd_builders_for_every_platform_need_no_docker_engine() {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/nodocker"));
    support::hello_context(dir.path(), support::HELLO);
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        format!(
            "builders:\n  linux/amd64: [{{buildkit: \"{}\"}}]\n{text}",
            bk.unix
        ),
    )
    .unwrap();
    let no_engine = |args: &[&str]| {
        let mut cmd = support::polyarch();
        cmd.args(args)
            .arg("-f")
            .arg(&file)
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .env_remove("BUILDKIT_HOST")
            .env_remove("DOCKER_CONTEXT");
        support::run(&mut cmd)
    };

    let out = no_engine(&["plan"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("BuildKit daemon {}", bk.unix)),
        "{stdout}"
    );
    let out = no_engine(&["build"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = support::skopeo_inspect_raw(&format!("{repo}:v1"));
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1, "{index}");

    // A second platform with no builder of its own needs the engine, which is down.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("[linux/amd64]\n", "[linux/amd64, linux/arm64]\n"),
    )
    .unwrap();
    let out = no_engine(&["build"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("unix:///nonexistent/docker.sock") && stderr.contains("down"),
        "{stderr}"
    );
}

#[test]
fn buildkitd_tests_each_platform_before_any_tag_moves() {
    let binfmt = support::binfmt::BinfmtGuard::save();
    support::binfmt::register_qemu_aarch64(&binfmt);
    let bk = support::buildkitd::Private::start();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/tested"));
    let file = run_step_project(dir.path(), &repo, "[linux/amd64, linux/arm64]");
    let project = std::fs::read_to_string(&file).unwrap();
    let record = dir.path().join("coverage.json");
    let build = |test: &str| {
        std::fs::write(&file, format!("{project}{test}")).unwrap();
        let out = support::run(
            polyarch_on(&bk.unix)
                .args(["build", "-f"])
                .arg(&file)
                .arg("--record")
                .arg(&record)
                .env("POLYARCH_CACHE_DIR", dir.path().join("cache")),
        );
        let text: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
        (out, text)
    };
    let test_of = |record: &serde_json::Value, platform: &str| {
        record["images"][0]["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["platform"] == platform)
            .map(|p| p["test"].clone())
            .unwrap()
    };

    // arm64 fails (under the daemon's QEMU): nothing is published.
    let (out, failed) = build(
        "    test: {run: [/bin/busybox, sh, -c, \"uname -m; [ $(uname -m) != aarch64 ] || exit 3\"]}\n",
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let arm = test_of(&failed, "linux/arm64");
    assert_eq!(arm["status"], "failed", "{failed:#}");
    assert_eq!(arm["exit_code"], 3, "{failed:#}");
    assert_eq!(arm["output_tail"][0], "aarch64", "{failed:#}");
    assert_eq!(test_of(&failed, "linux/amd64")["status"], "passed");
    let tag = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{repo}:v1"))
        .output()
        .unwrap();
    assert!(!tag.status.success(), "the tag moved");

    // Both pass: published, each platform's test in the record.
    let passing = "    test: {run: [/bin/busybox, cat, /arch]}\n";
    let (out, passed) = build(passing);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(test_of(&passed, "linux/arm64")["output_tail"][0], "aarch64");
    assert_eq!(
        support::skopeo_inspect_raw(&format!("{repo}:v1"))["manifests"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A warm rerun does not test again.
    let (out, warm) = build(passing);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for platform in ["linux/amd64", "linux/arm64"] {
        assert_eq!(test_of(&warm, platform)["earlier_run"], true, "{warm:#}");
    }

    // Past its timeout: cancelled on the daemon, timed out.
    let started = std::time::Instant::now();
    let (out, timed) = build(
        "    test: {run: [/bin/busybox, sleep, \"60\"], timeout: 2s, platforms: [linux/amd64]}\n",
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        test_of(&timed, "linux/amd64")["status"],
        "timed_out",
        "{timed:#}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(50));
}

#[test]
fn buildkitd_serves_a_named_directory_context_with_its_own_dockerignore() {
    let bk = support::buildkitd::shared();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&support::unique_name("bkd/contexts"));
    let assets = dir.path().join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    std::fs::write(assets.join("kept.txt"), "kept").unwrap();
    std::fs::write(assets.join("ignored.txt"), "ignored").unwrap();
    std::fs::write(assets.join(".dockerignore"), "ignored.txt\n").unwrap();
    // The build itself checks what arrived.
    support::hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY --from=assets / /assets/\n",
    );
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    let name = support::unique_name("bkd");
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replace("  hello:", &format!("  {name}:"));
    std::fs::write(&file, format!("{text}    contexts: {{assets: assets}}\n")).unwrap();
    let out = support::run(polyarch_on(&bk.unix).args(["build", "-f"]).arg(&file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for arch in ["amd64", "arm64"] {
        let index = support::skopeo_inspect_raw(&format!("{repo}:v1"));
        let entry = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["platform"]["architecture"] == arch)
            .unwrap()
            .clone();
        let manifest =
            support::skopeo_inspect_raw(&format!("{repo}@{}", entry["digest"].as_str().unwrap()));
        let last = manifest["layers"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        let path = repo.split_once('/').unwrap().1;
        let blob = support::curl(&[&format!(
            "{}/v2/{path}/blobs/{}",
            registry.url(),
            last["digest"].as_str().unwrap()
        )]);
        let mut names: Vec<String> = tar::Archive::new(flate2::read::GzDecoder::new(&blob[..]))
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .filter(|p| !p.ends_with('/'))
            .collect();
        names.sort();
        assert_eq!(names, ["assets/.dockerignore", "assets/kept.txt"], "{arch}");
    }
}

//! Podman 4.3 as the engine, through its Docker-compatible API (`scripts/podman.sh`):
//! what a Podman user checks after `polyarch build`. The tests are named `podman_` so that
//! `make test` runs them once, in a pass of their own.

mod support;

use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use support::engines::{podman_cli, podman_host};
use support::running::{interrupt_while_running, wait_until};
use support::supply_chain;
use support::{
    hello_context, platforms_of, polyarch, run, skopeo_inspect_raw, unique_name, Registry,
};

/// busybox per platform, a nonce so no other build made these layers, and a RUN step that
/// writes the architecture it ran on (QEMU for arm64 on this host).
const UNAME: &str = "FROM scratch
ARG TARGETARCH
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY nonce /nonce
RUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox uname -m > /arch\"]
ENTRYPOINT [\"/bin/busybox\", \"cat\", \"/arch\"]
";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A two-platform project in `dir` whose one image is named `name`, its context in
/// `dir/ctx` (the classic builder is sent the whole context: the run's cache directory
/// beside the project file must not be part of it).
fn project(dir: &Path, name: &str, repository: &str) -> std::path::PathBuf {
    let context = dir.join("ctx");
    fs::create_dir_all(&context).unwrap();
    hello_context(&context, UNAME);
    fs::write(context.join("nonce"), unique_name("nonce")).unwrap();
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  {name}:\n    repository: {repository}\n    tags: [v1]\n    context: ctx\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n"
        ),
    )
    .unwrap();
    file
}

/// polyarch aimed at Podman's service.
fn on_podman() -> Command {
    let mut cmd = polyarch();
    cmd.env("DOCKER_HOST", podman_host());
    cmd
}

/// `podman run --rm` without network on the service's storage, the image still to add.
/// Rootful Podman's default open-files limit is refused on this kind of host, so ask for less.
fn podman_run_command() -> Command {
    let mut cmd = podman_cli();
    cmd.args([
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    cmd
}

/// `podman run --platform P REF`, pulled from the registry: what the image prints.
fn podman_run(platform: &str, reference: &str) -> String {
    let out = run(podman_run_command().args([
        "--tls-verify=false",
        "--pull",
        "always",
        "--platform",
        platform,
        reference,
    ]));
    assert!(
        out.status.success(),
        "podman run {platform}: {}",
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn podman_two_platform_build_with_a_qemu_run_step_is_one_index_podman_runs() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("pmtwo");
    let repo = registry.repo(&unique_name("podman/two"));
    let file = project(dir.path(), &name, &repo);
    let images_before = podman_images();

    // With an SBOM and signatures, as on every engine kind.
    let out = run(on_podman()
        .args(["build", "--binfmt", "auto", "--output-format", "json"])
        .args(["--sbom", "--sign-key"])
        .arg(supply_chain::fixture_key())
        .arg("-f")
        .arg(&file)
        .env("COSIGN_PASSWORD", supply_chain::FIXTURE_PASSWORD)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");
    supply_chain::assert_signed_with_sboms(
        &format!("{repo}:v1"),
        &supply_chain::fixture_public_key(),
    );
    // One libpod build for both platforms (the context uploaded once), not a build each.
    assert!(
        log.contains("libpod build (linux/amd64, linux/arm64 in one build)"),
        "{log}"
    );
    assert!(!log.contains("classic builder"), "{log}");
    // Its platform images are gone from Podman, and no manifest list was made.
    let left: Vec<String> = podman_images()
        .into_iter()
        .filter(|i| !images_before.contains(i))
        .collect();
    assert!(left.is_empty(), "images left in Podman: {left:?}");
    let lists = run(podman_cli().args(["manifest", "exists", &format!("polyarch-build/{name}")]));
    assert!(!lists.status.success(), "a manifest list was left");

    // skopeo reads back one index with exactly the two platforms.
    let index = skopeo_inspect_raw(&format!("{repo}:v1"));
    let mut platforms = platforms_of(&index);
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index:#}");

    // Podman itself runs each platform's image; the RUN step ran on that architecture.
    assert_eq!(podman_run("linux/arm64", &format!("{repo}:v1")), "aarch64");
    assert_eq!(podman_run("linux/amd64", &format!("{repo}:v1")), "x86_64");
    let _ = run(podman_cli().args(["rmi", "-f", &format!("{repo}:v1")]));
}

#[test]
fn podman_doctor_names_podman_and_its_version() {
    let out = run(on_podman().args(["doctor", "--output-format", "json"]));
    let checks: Value = serde_json::from_slice(&out.stdout).expect("checks");
    let text = checks.to_string();
    assert!(text.contains("Podman 4."), "{checks:#}");
    assert!(text.contains("has no BuildKit"), "{checks:#}");
}

#[test]
fn podman_refuses_named_contexts_before_any_build_naming_the_field() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("assets")).unwrap();
    fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY --from=assets / /\n",
    )
    .unwrap();
    let file = support::write_project(
        dir.path(),
        &registry.repo(&unique_name("podman/ctx")),
        "[v1]",
        "[linux/amd64]",
    );
    let text = fs::read_to_string(&file).unwrap();
    fs::write(&file, format!("{text}    contexts: {{assets: assets}}\n")).unwrap();
    let out = run(on_podman().args(["build", "-f"]).arg(&file));
    let message = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{message}");
    assert!(
        message.contains("images.hello.contexts.assets") && message.contains("has no BuildKit"),
        "{message}"
    );
}

/// `polyarch build --output-format json` on Podman with its own cache directory (other
/// tests' runs never change what this one remembers) and, when given, the registry's
/// credentials on the command line; the record.
fn build_on_podman(file: &Path, creds: Option<(&str, &str)>) -> (String, Value) {
    let mut cmd = on_podman();
    cmd.args(["build", "--binfmt", "auto", "--output-format", "json", "-f"])
        .arg(file)
        .env("POLYARCH_CACHE_DIR", file.parent().unwrap().join("cache"));
    let out = match creds {
        Some((user, password)) => {
            let config = file.parent().unwrap().join("docker-config");
            fs::create_dir_all(&config).unwrap();
            cmd.args(["--username", user, "--password-stdin"])
                .env("DOCKER_CONFIG", config);
            support::run_with_stdin(&mut cmd, password)
        }
        None => run(&mut cmd),
    };
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (
        stderr(&out),
        serde_json::from_slice(&out.stdout).expect("record"),
    )
}

fn reused(record: &Value) -> Vec<bool> {
    record["images"][0]["platforms"]
        .as_array()
        .unwrap_or_else(|| panic!("no platforms: {record:#}"))
        .iter()
        .map(|p| p["build"]["reused"] == true)
        .collect()
}

/// Podman has no BuildKit to say what a build read: the classic build's whole context tar
/// stands in, so an unchanged rerun builds nothing and a changed file builds again.
#[test]
fn podman_warm_rerun_builds_nothing_and_a_changed_file_builds_again() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("pmwarm");
    let file = project(
        dir.path(),
        &name,
        &registry.repo(&unique_name("podman/warm")),
    );

    // A context long in place, as a user's: the build remembers the tar it sent by the
    // tree's stat, so warm reruns read no file of it.
    support::wait_until_settled(&dir.path().join("ctx"), std::time::Duration::from_secs(2));
    let (_, cold) = build_on_podman(&file, None);
    assert_eq!(reused(&cold), [false, false], "{cold:#}");
    let cache = dir.path().join("cache");
    let remembered = fs::read_to_string(cache.join("file-hashes.json")).unwrap();
    assert!(remembered.contains("classic-context-tar"), "{remembered}");
    // Podman's slow /version and /info, remembered for the process serving the socket.
    let engines = fs::read_to_string(cache.join("engines.json")).unwrap();
    assert!(engines.contains("Podman"), "{engines}");
    let (warm_log, warm) = build_on_podman(&file, None);
    assert_eq!(reused(&warm), [true, true], "{warm_log}");
    assert!(!warm_log.contains("building with"), "{warm_log}");
    assert_eq!(warm["images"][0]["digest"], cold["images"][0]["digest"]);

    // The same size, and the old mtime put back: the ctime still moved.
    let nonce = dir.path().join("ctx/nonce");
    let mtime = fs::metadata(&nonce).unwrap().modified().unwrap();
    let same_size = "x".repeat(fs::metadata(&nonce).unwrap().len() as usize);
    fs::write(&nonce, same_size).unwrap();
    let reopened = fs::File::options().write(true).open(&nonce).unwrap();
    reopened.set_modified(mtime).unwrap();
    drop(reopened);
    let (_, changed) = build_on_podman(&file, None);
    assert_eq!(reused(&changed), [false, false], "{changed:#}");
    assert_ne!(changed["images"][0]["digest"], cold["images"][0]["digest"]);

    fs::write(dir.path().join("ctx/nonce"), unique_name("changed")).unwrap();
    let (_, again) = build_on_podman(&file, None);
    assert_eq!(reused(&again), [false, false], "{again:#}");
    assert_ne!(again["images"][0]["digest"], changed["images"][0]["digest"]);
}

/// A base image in a registry that needs a login: libpod's build gets the command line's
/// credentials as `X-Registry-Config` (and `tlsVerify=false`, the loopback registry being
/// plain HTTP) and pulls it for both platforms; the RUN step runs on top of it. The
/// password is in neither the log, the record nor the image.
#[test]
fn podman_builds_from_a_base_in_a_private_registry() {
    const USER: &str = "pmuser";
    const PASS: &str = "pm-Pa55-7d1e";
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start_htpasswd(USER, PASS);
    let base_dir = tempfile::tempdir().unwrap();
    hello_context(
        base_dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\n",
    );
    let base = registry.repo(&unique_name("podman/base"));
    let base_file = base_dir.path().join("polyarch.yaml");
    fs::write(
        &base_file,
        format!("version: 1\nimages:\n  {}:\n    repository: {base}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n", unique_name("pmbase")),
    )
    .unwrap();
    build_on_podman(&base_file, Some((USER, PASS)));

    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM {base}:v1\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox uname -m > /arch\"]\nENTRYPOINT [\"/bin/busybox\", \"cat\", \"/arch\"]\n"),
    )
    .unwrap();
    let app = registry.repo(&unique_name("podman/app"));
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!("version: 1\nimages:\n  {}:\n    repository: {app}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n", unique_name("pmapp")),
    )
    .unwrap();
    let (log, record) = build_on_podman(&file, Some((USER, PASS)));
    assert_eq!(record["covered"], true, "{record:#}");
    assert!(log.contains("libpod build"), "{log}");
    assert!(!log.contains(PASS), "the password is in the log:\n{log}");
    assert!(
        !record.to_string().contains(PASS),
        "the password is in the record"
    );
    let index = support::skopeo_inspect_raw_creds(&format!("{app}:v1"), Some((USER, PASS)));
    assert_eq!(
        index["manifests"].as_array().map(Vec::len),
        Some(2),
        "{index:#}"
    );
    assert_in_no_blob(
        &format!("{app}:v1"),
        Some((USER, PASS)),
        dir.path(),
        &[PASS],
    );
}

/// Every blob of the image at `reference` (configs and layers, uncompressed), copied
/// with skopeo into `dir`, is free of each of `values`.
fn assert_in_no_blob(reference: &str, creds: Option<(&str, &str)>, dir: &Path, values: &[&str]) {
    let copied = dir.join(unique_name("copied"));
    let mut skopeo = Command::new("skopeo");
    skopeo.args(["copy", "--all", "--src-tls-verify=false"]);
    if let Some((user, password)) = creds {
        skopeo.arg("--src-creds").arg(format!("{user}:{password}"));
    }
    let out = run(skopeo
        .arg(format!("docker://{reference}"))
        .arg(format!("dir:{}", copied.display())));
    assert!(out.status.success(), "skopeo copy: {}", stderr(&out));
    for blob in fs::read_dir(&copied).unwrap() {
        let path = blob.unwrap().path();
        let raw = fs::read(&path).unwrap();
        let mut text = Vec::new();
        let readable = match raw.starts_with(&[0x1f, 0x8b]) {
            true => {
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&raw[..]), &mut text)
                    .is_ok()
            }
            false => {
                text = raw;
                true
            }
        };
        assert!(readable, "{} is not readable", path.display());
        for value in values {
            assert!(
                !text.windows(value.len()).any(|w| w == value.as_bytes()),
                "a secret value is in {}",
                path.display()
            );
        }
    }
}

/// Secrets on Podman: libpod's build takes them as files sent after the context (never
/// part of it); both platforms' RUN steps read them, and no value is in the log, the
/// record or the image.
#[test]
fn podman_build_reads_secrets_and_leaves_them_nowhere() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path().join("ctx");
    fs::create_dir_all(&context).unwrap();
    let token = unique_name("pm-token-s3cr3t");
    let npmrc = unique_name("//registry.example/:_authToken=pm-npm-s3cr3t");
    hello_context(
        &context,
        &format!(
            "FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN --mount=type=secret,id=token --mount=type=secret,id=npmrc [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox wc -c < /run/secrets/token > /len && /bin/busybox cat /run/secrets/npmrc | /bin/busybox wc -c >> /len && echo {}\"]\nENTRYPOINT [\"/bin/busybox\", \"cat\", \"/len\"]\n",
            unique_name("marker")
        ),
    );
    let repo = registry.repo(&unique_name("podman/secret"));
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  {}:\n    repository: {repo}\n    tags: [v1]\n    context: ctx\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n    secrets: {{token: {{env: POLYARCH_PM_TOKEN}}}}\n",
            unique_name("pmsecret")
        ),
    )
    .unwrap();
    let npmrc_file = dir.path().join("npmrc.secret");
    fs::write(&npmrc_file, &npmrc).unwrap();
    let out = run(on_podman()
        .args(["build", "--binfmt", "auto", "--output-format", "json", "-f"])
        .arg(&file)
        .arg("--secret")
        .arg(format!("id=npmrc,src={}", npmrc_file.display()))
        .env("POLYARCH_PM_TOKEN", &token)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("libpod build"), "{log}");
    let expected = format!("{}\n{}", token.len(), npmrc.len());
    assert_eq!(podman_run("linux/arm64", &format!("{repo}:v1")), expected);
    assert_eq!(podman_run("linux/amd64", &format!("{repo}:v1")), expected);
    let _ = run(podman_cli().args(["rmi", "-f", &format!("{repo}:v1")]));
    for value in [&token, &npmrc] {
        assert!(
            !log.contains(value.as_str()),
            "a secret value is in the log"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(value.as_str()),
            "a secret value is in the record"
        );
    }
    assert_in_no_blob(&format!("{repo}:v1"), None, dir.path(), &[&token, &npmrc]);
}

/// Buildah's build containers (`podman ps -a --external`).
fn build_containers() -> Vec<String> {
    let out = run(podman_cli().args(["ps", "-a", "--external", "--format", "{{.ID}} {{.Names}}"]));
    assert!(out.status.success(), "podman ps: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The images in Podman's storage without a name (IDs): what a build leaves behind.
fn podman_images() -> Vec<String> {
    let out = run(podman_cli().args([
        "images",
        "-a",
        "-q",
        "--no-trunc",
        "--filter",
        "dangling=true",
    ]));
    assert!(out.status.success(), "podman images: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Ctrl-C mid RUN step of a 2-platform libpod build: polyarch drops the build's
/// connection and removes Buildah's build containers, exits 130 within 2 s with no build
/// container left; Podman 4.3 cannot stop the step's process, which runs on to its end
/// but then has no container to commit from: no image appears, and no tag moves.
#[test]
fn podman_ctrl_c_mid_run_step_leaves_no_build_container() {
    // Also keeps the other Podman tests' build containers out of the before/after lists.
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path().join("ctx");
    fs::create_dir_all(&context).unwrap();
    let name = unique_name("pmint");
    // A sleep no other test runs (so its process names this build's step).
    let seconds = format!("6.{}", 100 + name.bytes().map(u32::from).sum::<u32>() % 900);
    hello_context(
        &context,
        &format!("FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN [\"/bin/busybox\", \"sleep\", \"{seconds}\"]\n"),
    );
    let repository = registry.repo(&unique_name("podman/int"));
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  {name}:\n    repository: {repository}\n    tags: [v1]\n    context: ctx\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n"
        ),
    )
    .unwrap();
    let before = build_containers();
    let images_before = podman_images();
    let mut command = on_podman();
    command
        .args(["build", "--binfmt", "auto", "-f"])
        .arg(&file)
        .env_remove("CI")
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache"));
    let interrupted =
        interrupt_while_running(command, &["/bin/busybox", "sleep", seconds.as_str()]);
    let (took, log) = (interrupted.exited, &interrupted.stderr);
    assert!(
        took < std::time::Duration::from_secs(2),
        "exited {took:?} after SIGINT:\n{log}"
    );
    assert!(log.contains("cannot stop a build step in flight"), "{log}");
    let left = || -> Vec<String> {
        build_containers()
            .into_iter()
            .filter(|c| !before.contains(c))
            .collect()
    };
    assert!(
        left().is_empty(),
        "build containers left: {:?}\n{log}",
        left()
    );
    // The step's process ends by itself; nothing is committed from it after.
    interrupted.wait_step_gone();
    let settled = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < settled {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(left().is_empty(), "build containers left: {:?}", left());
    let new_images: Vec<String> = podman_images()
        .into_iter()
        .filter(|i| !images_before.contains(i))
        .collect();
    assert!(new_images.is_empty(), "images left: {new_images:?}\n{log}");
    let tag = run(Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{repository}:v1")));
    assert!(!tag.status.success(), "the tag moved");
}

/// Containers polyarch's tests left on Podman (`podman ps -a`).
fn test_containers() -> Vec<String> {
    let out = run(podman_cli().args(["ps", "-a", "--format", "{{.Names}}"]));
    assert!(out.status.success(), "podman ps: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|name| name.starts_with("polyarch-test-"))
        .map(str::to_string)
        .collect()
}

/// `test:` on Podman: each platform's image is pulled by digest (over plain HTTP from the
/// loopback registry) and run as a container for its platform, arm64 under QEMU, before
/// any tag moves; a failure, a pass, a warm rerun, a timeout and Ctrl-C, with no container
/// left behind.
#[test]
fn podman_tests_each_platform_in_a_container_before_any_tag_moves() {
    // Keeps the other Podman tests' containers out of the before/after lists.
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let before = test_containers();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("podman/tested"));
    let name = unique_name("tested");
    let file = project(dir.path(), &name, &repo);
    let project_text = fs::read_to_string(&file).unwrap();
    let record = dir.path().join("coverage.json");
    let build = |test: &str| -> (Output, Value) {
        fs::write(&file, format!("{project_text}{test}")).unwrap();
        let out = run(on_podman()
            .args(["build", "-f"])
            .arg(&file)
            .arg("--record")
            .arg(&record)
            .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
        let text = fs::read_to_string(&record)
            .unwrap_or_else(|e| panic!("no record ({e}): {}", stderr(&out)));
        (out, serde_json::from_str(&text).unwrap())
    };
    let test_of = |record: &Value, platform: &str| -> Value {
        record["images"][0]["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["platform"] == platform)
            .map(|p| p["test"].clone())
            .unwrap()
    };

    let (out, failed) = build(
        "    test: {run: [/bin/busybox, sh, -c, \"cat /arch; [ $(cat /arch) != aarch64 ] || exit 3\"]}\n",
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let arm = test_of(&failed, "linux/arm64");
    assert_eq!(arm["status"], "failed", "{failed:#}");
    assert_eq!(arm["exit_code"], 3, "{failed:#}");
    assert_eq!(arm["output_tail"][0], "aarch64", "{failed:#}");
    assert_eq!(
        test_of(&failed, "linux/amd64")["status"],
        "passed",
        "{failed:#}"
    );
    let tag = run(Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{repo}:v1")));
    assert!(!tag.status.success(), "the tag moved");

    let passing = "    test: {run: [/bin/busybox, cat, /arch]}\n";
    let (out, passed) = build(passing);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(test_of(&passed, "linux/amd64")["output_tail"][0], "x86_64");
    assert_eq!(test_of(&passed, "linux/arm64")["output_tail"][0], "aarch64");
    assert_eq!(
        skopeo_inspect_raw(&format!("{repo}:v1"))["manifests"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (out, warm) = build(passing);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        test_of(&warm, "linux/arm64")["earlier_run"],
        true,
        "{warm:#}"
    );

    let started = std::time::Instant::now();
    let (out, timed) = build(
        "    test: {run: [/bin/busybox, sleep, \"60\"], timeout: 2s, platforms: [linux/amd64]}\n",
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        test_of(&timed, "linux/amd64")["status"],
        "timed_out",
        "{timed:#}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(40));

    // Ctrl-C during a test: exit 130 at once, the container removed.
    let seconds = (3000 + name.bytes().map(u32::from).sum::<u32>() % 5000).to_string();
    fs::write(
        &file,
        format!("{project_text}    test: {{run: [/bin/busybox, sleep, \"{seconds}\"], timeout: 2h, platforms: [linux/amd64]}}\n"),
    )
    .unwrap();
    let mut command = on_podman();
    command
        .args(["build", "-f"])
        .arg(&file)
        .env_remove("CI")
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache"));
    let interrupted =
        interrupt_while_running(command, &["/bin/busybox", "sleep", seconds.as_str()]);
    let left = || -> Vec<String> {
        let now = test_containers();
        now.into_iter().filter(|c| !before.contains(c)).collect()
    };
    interrupted.wait_step_gone();
    wait_until(
        || left().is_empty(),
        || format!("a test container is left: {:?}", left()),
    );

    // Ctrl-C during `verify --test` of the published tag: the container is gone by exit.
    let seconds = (8000 + name.bytes().map(u32::from).sum::<u32>() % 5000).to_string();
    fs::write(
        &file,
        format!("{project_text}    test: {{run: [/bin/busybox, sleep, \"{seconds}\"], timeout: 2h, platforms: [linux/amd64]}}\n"),
    )
    .unwrap();
    let mut command = on_podman();
    command
        .args(["verify", "--test", "-f"])
        .arg(&file)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache"));
    interrupt_while_running(command, &["/bin/busybox", "sleep", seconds.as_str()]);
    assert_eq!(
        left(),
        Vec::<String>::new(),
        "verify --test left its container"
    );
}

/// `--output oci:DIR` on Podman: both platforms of one libpod build in one OCI layout
/// (nothing pushed), which skopeo reads back as one index and from which Podman runs each
/// platform (the RUN step ran on that architecture).
#[test]
fn podman_two_platform_build_to_an_oci_layout_is_one_index_podman_runs() {
    // Also keeps the images pulled here out of the other tests' before/after lists.
    let _binfmt = support::binfmt::BinfmtGuard::save();
    // Podman names what it pulls from a layout after its path, which must be lower-case.
    let dir = tempfile::Builder::new()
        .prefix(&unique_name("pmoci"))
        .rand_bytes(0)
        .tempdir()
        .unwrap();
    // Never reached: the layout is the destination.
    let file = project(dir.path(), &unique_name("pmoci"), "127.0.0.1:1/podman/oci");
    let layout = dir.path().join("layout");
    let out = run(on_podman()
        .args([
            "build",
            "--binfmt",
            "auto",
            "--output-format",
            "json",
            "--output",
        ])
        .arg(format!("oci:{}", layout.display()))
        .arg("-f")
        .arg(&file)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");

    let reference = format!("oci:{}:v1", layout.display());
    let inspected = run(Command::new("skopeo").args(["inspect", "--raw", &reference]));
    assert!(inspected.status.success(), "skopeo: {}", stderr(&inspected));
    let index: Value = serde_json::from_slice(&inspected.stdout).expect("index");
    let mut platforms = platforms_of(&index);
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index:#}");

    for (platform, arch) in [("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")] {
        let pulled = run(podman_cli().args(["pull", "-q", "--platform", platform, &reference]));
        assert!(pulled.status.success(), "podman pull: {}", stderr(&pulled));
        let id = String::from_utf8_lossy(&pulled.stdout).trim().to_string();
        let ran = run(podman_run_command().arg(&id));
        let _ = run(podman_cli().args(["rmi", "-f", &id]));
        assert!(
            ran.status.success(),
            "podman run {platform}: {}",
            stderr(&ran)
        );
        assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), arch);
    }
}

/// A rerun trusts the emulation verdict an earlier run remembered. With the emulator gone
/// since (a reboot does that), Podman's build meets exec format error: polyarch probes
/// again, registers QEMU and builds, as on Docker.
#[test]
fn podman_rerun_registers_qemu_again_when_the_emulator_went_away() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let file = project(
        dir.path(),
        &unique_name("pmqemu"),
        &registry.repo(&unique_name("podman/qemu")),
    );
    build_on_podman(&file, None);
    for (name, content) in support::binfmt::entries() {
        if name.contains("aarch64") || content.contains("aarch64") {
            support::binfmt::unregister(&name);
        }
    }
    // A changed file, so that the RUN step runs again.
    fs::write(dir.path().join("ctx/nonce"), unique_name("changed")).unwrap();
    let (log, rerun) = build_on_podman(&file, None);
    assert!(
        log.contains("linux/arm64: the emulator an earlier run found")
            && log.contains("is gone; probing again"),
        "{log}"
    );
    let arm = &rerun["images"][0]["platforms"][1];
    assert_eq!(arm["platform"], "linux/arm64", "{rerun:#}");
    assert_eq!(arm["build"]["emulated"], true, "{rerun:#}");
}

//! Split runners, warm reruns and the read-only commands, as a CI release job uses them.

mod support;

use serde_json::Value;
use std::process::Output;
use support::{
    hello_context, polyarch, run, skopeo_digest, unique_name, write_project, Registry, HELLO,
};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn split_runner_parts_assemble_into_one_index_and_a_missing_part_publishes_nothing() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("split/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    let part = |arch: &str| {
        let path = dir.path().join(format!("part-{arch}.json"));
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .args([
                "--platform",
                &format!("linux/{arch}"),
                "--push-by-digest",
                "--record",
            ])
            .arg(&path));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        path
    };
    let arm = part("arm64");
    let amd = part("amd64");
    let tags = run(std::process::Command::new("skopeo")
        .args(["list-tags", "--tls-verify=false"])
        .arg(format!("docker://{repo}")));
    assert!(
        !String::from_utf8_lossy(&tags.stdout).contains("\"v1\""),
        "a part moved a tag"
    );

    let missing = run(polyarch().args(["assemble", "-f"]).arg(&file).arg(&arm));
    assert_eq!(missing.status.code(), Some(2));
    let message = stderr(&missing);
    assert!(
        message.contains("linux/amd64") && message.contains("part-arm64.json"),
        "{message}"
    );

    let doubled = run(polyarch()
        .args(["assemble", "-f"])
        .arg(&file)
        .arg(&arm)
        .arg(&amd)
        .arg(&arm));
    assert_eq!(doubled.status.code(), Some(2));
    assert!(
        stderr(&doubled).contains("more than one part"),
        "{}",
        stderr(&doubled)
    );

    let record = dir.path().join("coverage.json");
    let assembled = run(polyarch()
        .args(["assemble", "-f"])
        .arg(&file)
        .arg(&arm)
        .arg(&amd)
        .arg("--record")
        .arg(&record));
    assert_eq!(assembled.status.code(), Some(0), "{}", stderr(&assembled));
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(record["covered"], true);
    assert_eq!(
        record["images"][0]["digest"],
        skopeo_digest(&format!("{repo}:v1"), None).as_str()
    );
    let index = support::skopeo_inspect_raw(&format!("{repo}:v1"));
    let archs: Vec<&str> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    assert_eq!(
        archs,
        ["amd64", "arm64"],
        "index follows the project's platform order"
    );
}

#[test]
fn a_warm_rerun_builds_exports_and_uploads_nothing_and_says_so() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("warm/hello"));
    let file = write_project(
        dir.path(),
        &repo,
        "[v1, latest]",
        "[linux/amd64, linux/arm64]",
    );
    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("record.json");
    let build = |extra: &[&str]| {
        run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .arg("--record")
            .arg(&record)
            .args(extra)
            .env("POLYARCH_CACHE_DIR", cache.path()))
    };
    let cold = build(&[]);
    assert_eq!(cold.status.code(), Some(0), "{}", stderr(&cold));
    // Exported and uploaded by polyarch, or pushed by BuildKit itself (containerd store).
    let shipped = match support::engines::engine_pushes_itself() {
        true => "(by the engine)",
        false => "[export]",
    };
    assert!(stderr(&cold).contains(shipped), "{}", stderr(&cold));
    let digest = skopeo_digest(&format!("{repo}:v1"), None);

    let warm = build(&[]);
    assert_eq!(warm.status.code(), Some(0), "{}", stderr(&warm));
    let log = stderr(&warm);
    assert!(
        !log.contains("[build") && !log.contains("[export]") && !log.contains("[push]"),
        "warm run built, exported or pushed:\n{log}"
    );
    assert_eq!(
        log.matches("inputs unchanged").count(),
        2,
        "one per platform:\n{log}"
    );
    assert!(log.contains("nothing to publish"), "{log}");
    let summary = String::from_utf8_lossy(&warm.stdout);
    assert_eq!(
        summary.matches("inputs unchanged, not rebuilt").count(),
        2,
        "the summary says which builds were reused:\n{summary}"
    );
    assert_eq!(skopeo_digest(&format!("{repo}:latest"), None), digest);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(written["covered"], true);
    for platform in written["images"][0]["platforms"].as_array().unwrap() {
        assert_eq!(platform["build"]["reused"], true, "{platform}");
    }

    // --rebuild asks the engine, whose cache gives the same image IDs: still no upload.
    let rebuilt = build(&["--rebuild"]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", stderr(&rebuilt));
    let log = stderr(&rebuilt);
    assert!(log.contains("[build"), "{log}");
    // BuildKit pushing by itself finds every blob in the registry already.
    let unchanged = match support::engines::engine_pushes_itself() {
        true => "(by the engine)",
        false => "no export or upload",
    };
    assert_eq!(log.matches(unchanged).count(), 2, "{log}");
    assert_eq!(skopeo_digest(&format!("{repo}:v1"), None), digest);
}

#[test]
fn a_rerun_builds_again_when_a_file_or_the_base_image_changes() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let base = unique_name("polyarch-test-base");
    let base_image = |content: &str, more: &str| {
        let context = tempfile::tempdir().unwrap();
        std::fs::write(
            context.path().join("Dockerfile"),
            format!("FROM scratch\nCOPY v /v\n{more}"),
        )
        .unwrap();
        std::fs::write(context.path().join("v"), content).unwrap();
        let out = run(std::process::Command::new("docker")
            .args(["build", "-q", "--network", "none", "-t"])
            .arg(format!("{base}:current"))
            .arg(context.path()));
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let mut base_ids = vec![base_image("one", "")];
    hello_context(
        dir.path(),
        &format!(
            "FROM {base}:current\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\n"
        ),
    );
    let repo = registry.repo(&unique_name("inputs/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let cache = tempfile::tempdir().unwrap();
    let build = || build_and_read_tag(&file, cache.path(), &repo);
    let built_anew = |log: &str| log.contains("[build") && !log.contains("inputs unchanged");

    let (log, first) = build();
    assert!(built_anew(&log), "{log}");
    let (log, same) = build();
    assert!(log.contains("inputs unchanged"), "{log}");
    assert_eq!(same, first);

    // Another image under the same base tag: the build must see it.
    base_ids.push(base_image("two", ""));
    let (log, second) = build();
    assert!(built_anew(&log), "{log}");
    assert_ne!(second, first, "the new base must reach the registry");

    // A new timestamp alone is no change (as for BuildKit's cache).
    let busybox = dir.path().join("bin/amd64/busybox");
    let bytes = std::fs::read(&busybox).unwrap();
    std::fs::write(&busybox, &bytes).unwrap();
    let (log, _) = build();
    assert!(log.contains("inputs unchanged"), "{log}");

    // Nor is a file the Dockerfile does not read (a record written into the context).
    std::fs::write(dir.path().join("record.json"), "{}").unwrap();
    let (log, _) = build();
    assert!(log.contains("inputs unchanged"), "{log}");

    // New content is.
    let mut changed = bytes.clone();
    changed.extend_from_slice(b"appended");
    std::fs::write(&busybox, &changed).unwrap();
    let (log, third) = build();
    assert!(built_anew(&log), "{log}");
    assert_ne!(third, second);

    // A base's ONBUILD triggers run in the build and may read any context file: then
    // every file counts.
    std::fs::write(dir.path().join("extra"), "1").unwrap();
    base_ids.push(base_image("three", "ONBUILD COPY extra /extra\n"));
    let (log, fourth) = build();
    assert!(built_anew(&log), "{log}");
    std::fs::write(dir.path().join("extra"), "2").unwrap();
    let (log, fifth) = build();
    assert!(built_anew(&log), "{log}");
    assert_ne!(fifth, fourth, "the trigger copied the new file");

    let _ = run(std::process::Command::new("docker")
        .args(["rmi", "-f"])
        .args(base_ids));
}

/// A `polyarch build` of `file` remembering in `cache`: its progress lines and the digest
/// `repo:v1` then has in the registry.
fn build_and_read_tag(
    file: &std::path::Path,
    cache: &std::path::Path,
    repo: &str,
) -> (String, String) {
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(file)
        .env("POLYARCH_CACHE_DIR", cache));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (stderr(&out), skopeo_digest(&format!("{repo}:v1"), None))
}

/// What busybox `args` print inside the pushed image, pulled and run by the engine (which
/// then drops its copy).
fn busybox_in_image(reference: &str, args: &[&str]) -> String {
    let out = run(std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/bin/busybox",
        ])
        .arg(reference)
        .args(args));
    let _ = run(std::process::Command::new("docker").args(["rmi", "-f", reference]));
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `ls -a DIR` prints inside the pushed image.
fn listing_in_image(reference: &str, dir: &str) -> Vec<String> {
    busybox_in_image(reference, &["ls", "-a", dir])
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_dockerfile_specific_ignore_file_keeps_its_files_out_of_the_pushed_image() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY . /ctx\n",
    );
    std::fs::write(dir.path().join(".dockerignore"), "other.txt\n").unwrap();
    std::fs::write(dir.path().join("Dockerfile.dockerignore"), "secret.txt\n").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "do not ship").unwrap();
    std::fs::write(dir.path().join("other.txt"), "shipped").unwrap();
    let repo = registry.repo(&unique_name("ignore/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let files = listing_in_image(&format!("{repo}:v1"), "/ctx");
    assert!(!files.contains(&"secret.txt".to_string()), "{files:?}");
    // BuildKit reads the Dockerfile's own ignore file instead of the context's.
    assert!(files.contains(&"other.txt".to_string()), "{files:?}");
}

#[test]
fn a_rerun_builds_again_when_a_symlinked_source_changes() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY link.txt /l\n",
    );
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::fs::write(dir.path().join("real/t.txt"), "one").unwrap();
    std::os::unix::fs::symlink("real/t.txt", dir.path().join("link.txt")).unwrap();
    let repo = registry.repo(&unique_name("symlink/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let cache = tempfile::tempdir().unwrap();
    let build = || build_and_read_tag(&file, cache.path(), &repo);
    let (_, first) = build();
    let (log, same) = build();
    assert!(log.contains("inputs unchanged"), "{log}");
    assert_eq!(same, first);

    std::fs::write(dir.path().join("real/t.txt"), "two").unwrap();
    let (log, second) = build();
    assert!(!log.contains("inputs unchanged"), "{log}");
    assert_ne!(
        second, first,
        "the new target content must reach the registry"
    );
    assert_eq!(
        busybox_in_image(&format!("{repo}:v1"), &["cat", "/l"]),
        "two"
    );
}

#[test]
fn a_same_size_change_under_the_old_mtime_is_noticed_after_hashes_were_remembered() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY data.txt /data.txt\n",
    );
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "one").unwrap();
    let mtime = std::fs::metadata(&data).unwrap().modified().unwrap();
    let repo = registry.repo(&unique_name("hashes/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    let cache = tempfile::tempdir().unwrap();
    let build = || build_and_read_tag(&file, cache.path(), &repo);
    // Hashes are remembered only for files whose last change is seconds old: a context
    // long in place, not one written just now.
    support::wait_until_settled(dir.path(), std::time::Duration::from_secs(2));
    let (_, first) = build();
    let remembered = std::fs::read_to_string(cache.path().join("file-hashes.json")).unwrap();
    assert!(remembered.contains("data.txt"), "{remembered}");
    let (log, same) = build();
    assert_eq!(log.matches("inputs unchanged").count(), 2, "{log}");
    assert_eq!(same, first);

    // The same size, and the old mtime put back (as `touch -d` or an unpacked archive
    // would): the stat still differs (the ctime moved), so the file is read again and the
    // engine asked to build. (BuildKit's own file sync compares size and mtime only, so
    // it may then keep its copy of the old content, as it does for buildx.)
    std::fs::write(&data, "two").unwrap();
    let reopened = std::fs::File::options().write(true).open(&data).unwrap();
    reopened.set_modified(mtime).unwrap();
    drop(reopened);
    let (log, _) = build();
    assert!(
        log.contains("[build") && !log.contains("inputs unchanged"),
        "{log}"
    );
}

#[test]
fn a_base_the_engine_pulls_is_pinned_by_its_registry_digest() {
    let registry = Registry::start();
    let cache = tempfile::tempdir().unwrap();
    let build = |file: &std::path::Path| {
        let out = run(polyarch()
            .args(["build", "-f"])
            .arg(file)
            .env("POLYARCH_CACHE_DIR", cache.path()));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stderr(&out)
    };
    // The base is only in the registry: BuildKit pulls it for each build.
    let base_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        base_dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY v /v\n",
    )
    .unwrap();
    std::fs::write(base_dir.path().join("v"), "one").unwrap();
    let base = registry.repo(&unique_name("pulled/base"));
    let base_file = write_project(base_dir.path(), &base, "[\"1\"]", "[linux/amd64]");
    build(&base_file);
    let local = run(std::process::Command::new("docker")
        .args(["image", "inspect"])
        .arg(format!("{base}:1")));
    assert!(!local.status.success(), "the engine must not hold the base");

    let dir = tempfile::tempdir().unwrap();
    hello_context(
        dir.path(),
        &format!("FROM {base}:1\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\n"),
    );
    let repo = registry.repo(&unique_name("pulled/app"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let log = build(&file);
    assert!(!log.contains("inputs unchanged"), "{log}");
    let first = skopeo_digest(&format!("{repo}:v1"), None);
    let log = build(&file);
    assert!(log.contains("inputs unchanged"), "{log}");

    // The base's tag moves: the registry's answer changes, and so does the build.
    std::fs::write(base_dir.path().join("v"), "two").unwrap();
    build(&base_file);
    let log = build(&file);
    assert!(!log.contains("inputs unchanged"), "{log}");
    assert_ne!(skopeo_digest(&format!("{repo}:v1"), None), first);
}

#[test]
fn plan_and_doctor_describe_the_work_without_building() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("plan/hello"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");

    let plan = run(polyarch()
        .args(["plan", "-f"])
        .arg(&file)
        .args(["--output-format", "json"]));
    assert_eq!(plan.status.code(), Some(0), "{}", stderr(&plan));
    let lines: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let arm = lines
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["platform"] == "linux/arm64")
        .expect("arm64 planned");
    // COPY-only: a foreign platform that needs no emulation, whatever binfmt holds.
    assert_eq!(arm["execution"], "no_emulation_needed");

    let cache = tempfile::tempdir().unwrap();
    let doctor = || {
        run(polyarch()
            .env("POLYARCH_CACHE_DIR", cache.path())
            .args(["doctor", "-f"])
            .arg(&file))
    };
    let first = doctor();
    let text = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{text}");
    assert!(
        text.contains("ok   engine") && text.contains(&format!("ok   registry {repo}")),
        "{text}"
    );
    // dockerd's /version and /info are remembered for the process that answered them,
    // and the next run tells the same engine from that memory.
    let engines = std::fs::read_to_string(cache.path().join("engines.json")).unwrap();
    assert!(engines.contains("\"product\": \"Docker\""), "{engines}");
    let engine_lines = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains(" engine ") || l.contains(" buildkit "))
            .map(str::to_string)
            .collect()
    };
    let again = doctor();
    let told = engine_lines(&String::from_utf8_lossy(&again.stdout));
    assert_eq!(told, engine_lines(&text));
    assert_eq!(told.len(), 2, "{told:?}");

    let unreachable = write_project(
        dir.path(),
        "127.0.0.1:1/nobody/here",
        "[v1]",
        "[linux/amd64]",
    );
    let doctor = run(polyarch()
        .env("POLYARCH_CACHE_DIR", cache.path())
        .args(["doctor", "-f"])
        .arg(&unreachable));
    assert_eq!(doctor.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains("FAIL registry 127.0.0.1:1/nobody/here")
    );
}

#[test]
fn schema_completions_and_man_page_come_from_the_cli() {
    let schema = run(polyarch().arg("schema"));
    let parsed: Value = serde_json::from_slice(&schema.stdout).expect("project schema is JSON");
    assert!(parsed["properties"]["images"].is_object());
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(support::repo_root().join("schema/polyarch.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(parsed, shipped);
    let coverage = run(polyarch().args(["schema", "coverage"]));
    let parsed: Value = serde_json::from_slice(&coverage.stdout).unwrap();
    assert_eq!(
        parsed["properties"]["schema"]["const"],
        "polyarch/coverage/v1"
    );
    let gate = run(polyarch().args(["schema", "gate"]));
    let parsed: Value = serde_json::from_slice(&gate.stdout).unwrap();
    assert_eq!(parsed["properties"]["schema"]["const"], "polyarch/gate/v1");
    for shell in ["bash", "zsh", "fish"] {
        let out = run(polyarch().args(["completions", shell]));
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("assemble"));
    }
    let man = run(polyarch().arg("man"));
    assert!(String::from_utf8_lossy(&man.stdout).contains(".TH polyarch"));
    let help = run(polyarch().arg("--help"));
    assert!(String::from_utf8_lossy(&help.stdout).contains("130  interrupted"));
}

#[test]
fn the_engine_comes_from_the_current_docker_context() {
    let config = tempfile::tempdir().unwrap();
    let docker = |args: &[&str]| {
        run(std::process::Command::new("docker")
            .args(args)
            .env("DOCKER_CONFIG", config.path()))
    };
    let created = docker(&[
        "context",
        "create",
        "polyarch-test",
        "--docker",
        "host=unix:///var/run/docker.sock",
    ]);
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(docker(&["context", "use", "polyarch-test"])
        .status
        .success());
    let doctor = run(polyarch()
        .args(["doctor", "-f", "/nonexistent/polyarch.yaml"])
        .env("DOCKER_CONFIG", config.path())
        .env_remove("DOCKER_HOST"));
    assert_eq!(
        doctor.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let broken = run(polyarch()
        .args(["doctor", "-f", "/nonexistent/polyarch.yaml"])
        .env("DOCKER_CONFIG", config.path())
        .env("DOCKER_CONTEXT", "no-such-context")
        .env_remove("DOCKER_HOST"));
    assert_eq!(broken.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&broken.stdout).contains("no-such-context"));
}

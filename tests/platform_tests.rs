//! `test:`: each platform's pushed image runs its test on the builder that built it,
//! before any index is published or tag moves (issue 37, step 1: BuildKit builders).
//! Runs on whatever engine the default socket names (Docker 20.10 here; the Makefile
//! runs it on 26.1/28.5 with the containerd store too).

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::running::interrupt_while_running;
use support::{
    hello_context, polyarch, run, skopeo_digest, unique_name, write_project, Registry, HELLO,
};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The busybox image on `platforms`, named uniquely, with `test` appended to it.
fn project(dir: &Path, repo: &str, platforms: &str, test: &str) -> std::path::PathBuf {
    hello_context(dir, HELLO);
    let file = write_project(dir, repo, "[v1]", platforms);
    let name = unique_name("tested");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("  hello:", &format!("  {name}:")) + test,
    )
    .unwrap();
    file
}

/// `polyarch build` with what runs remember kept beside the project: a test never
/// trusts another test's verdicts.
fn build_command(file: &Path, record: &Path, extra: &[&str]) -> Command {
    let mut command = polyarch();
    command
        .args(["build", "-f"])
        .arg(file)
        .arg("--record")
        .arg(record)
        .args(extra)
        .env("POLYARCH_CACHE_DIR", file.with_file_name("cache"));
    command
}

fn build(file: &Path, record: &Path, extra: &[&str]) -> Output {
    run(&mut build_command(file, record, extra))
}

fn read_record(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the record was written"))
        .expect("the record is JSON")
}

fn platform<'r>(record: &'r Value, name: &str) -> &'r Value {
    record["images"][0]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["platform"] == name)
        .unwrap_or_else(|| panic!("no {name} in {record:#}"))
}

fn tag_exists(reference: &str) -> bool {
    Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn a_failing_arm64_test_publishes_nothing_and_names_the_platform() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    let test = "    test: {run: [/bin/busybox, sh, -c, \"uname -m; [ $(uname -m) != aarch64 ] || exit 3\"]}\n";
    let file = project(dir.path(), &repo, "[linux/amd64, linux/arm64]", test);
    let path = dir.path().join("coverage.json");

    let out = build(&file, &path, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(!tag_exists(&format!("{repo}:v1")), "the tag moved");

    let record = read_record(&path);
    assert_eq!(record["covered"], false);
    let image = &record["images"][0];
    assert!(image["unpublished"].is_string(), "{image:#}");
    let arm = platform(&record, "linux/arm64");
    assert_eq!(arm["status"], "test_failed", "{arm:#}");
    assert_eq!(arm["test"]["status"], "failed", "{arm:#}");
    assert_eq!(arm["test"]["exit_code"], 3, "{arm:#}");
    let tail: Vec<&str> = arm["test"]["output_tail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(tail.contains(&"aarch64"), "{tail:?}");
    let amd = platform(&record, "linux/amd64");
    assert_eq!(amd["test"]["status"], "passed", "{amd:#}");

    // What the user sees: the platform, the command, the status and the tail.
    let text = stdout(&out);
    assert!(text.contains("test failed with exit code 3"), "{text}");
    assert!(text.contains("      | aarch64"), "{text}");
    assert!(text.contains("not published"), "{text}");
}

#[test]
fn passing_tests_on_both_platforms_publish_with_a_test_per_platform() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    let test = "    test:\n      - run: [/bin/busybox, echo, ok]\n      - run: [/bin/busybox, sh, -c, \"test \\\"$MODE\\\" = fast\"]\n        env: {MODE: fast}\n        timeout: 30s\n";
    let file = project(dir.path(), &repo, "[linux/amd64, linux/arm64]", test);
    let path = dir.path().join("coverage.json");

    let out = build(&file, &path, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(tag_exists(&format!("{repo}:v1")));
    let record = read_record(&path);
    assert_eq!(record["covered"], true);
    for name in ["linux/amd64", "linux/arm64"] {
        let p = platform(&record, name);
        assert_eq!(p["status"], "ok", "{p:#}");
        assert_eq!(p["test"]["status"], "passed", "{p:#}");
        assert_eq!(p["test"]["exit_code"], 0, "{p:#}");
    }

    // A warm rerun of the same images with the same tests runs none of them again.
    let out = build(&file, &path, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("test passed (earlier run)"),
        "{}",
        stdout(&out)
    );
    let record = read_record(&path);
    for name in ["linux/amd64", "linux/arm64"] {
        let p = platform(&record, name);
        assert_eq!(p["test"]["status"], "passed", "{p:#}");
        assert_eq!(p["test"]["earlier_run"], true, "{p:#}");
    }
    // --rebuild tests again.
    let out = build(&file, &path, &["--rebuild"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record = read_record(&path);
    let arm = platform(&record, "linux/arm64");
    assert_eq!(arm["test"]["status"], "passed", "{arm:#}");
    assert!(arm["test"].get("earlier_run").is_none(), "{arm:#}");

    // --no-test runs nothing and says so.
    let out = build(&file, &path, &["--no-test"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record = read_record(&path);
    assert_eq!(
        platform(&record, "linux/arm64")["test"]["status"],
        "skipped"
    );
}

#[test]
fn a_test_past_its_timeout_is_cancelled_and_timed_out() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    let test = "    test: {run: [/bin/busybox, sleep, \"60\"], timeout: 2s}\n";
    let file = project(dir.path(), &repo, "[linux/amd64]", test);
    let path = dir.path().join("coverage.json");

    let started = Instant::now();
    let out = build(&file, &path, &[]);
    let took = started.elapsed().as_secs_f64();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(!tag_exists(&format!("{repo}:v1")), "the tag moved");
    let record = read_record(&path);
    let amd = platform(&record, "linux/amd64");
    assert_eq!(amd["test"]["status"], "timed_out", "{amd:#}");
    let seconds = amd["test"]["seconds"].as_f64().unwrap();
    assert!(seconds < 7.0, "the test ran {seconds}s past its 2s timeout");
    assert!(took < 55.0, "the run waited for the sleep: {took}s");
}

#[test]
fn sigint_during_a_test_cancels_it_and_keeps_the_earlier_tag() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    // A sleep no other test runs, so its process names this test's command.
    let name = unique_name("sleep");
    let seconds = (3000 + name.bytes().map(u32::from).sum::<u32>() % 5000).to_string();
    let test = format!("    test: {{run: [/bin/busybox, sleep, \"{seconds}\"], timeout: 2h}}\n");
    let file = project(dir.path(), &repo, "[linux/amd64]", &test);
    let path = dir.path().join("coverage.json");
    let out = build(&file, &path, &["--no-test"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let earlier = skopeo_digest(&format!("{repo}:v1"), None);

    let mut command = build_command(&file, &path, &[]);
    command.env_remove("CI");
    let interrupted =
        interrupt_while_running(command, &["/bin/busybox", "sleep", seconds.as_str()]);
    assert!(
        interrupted.exited < Duration::from_secs(5),
        "exit took {:?}:\n{}",
        interrupted.exited,
        interrupted.stderr
    );
    // The solve is cancelled in the builder: the command does not run on.
    interrupted.wait_step_gone();
    assert_eq!(
        skopeo_digest(&format!("{repo}:v1"), None),
        earlier,
        "the tag moved although the run was interrupted"
    );
}

#[test]
fn split_runners_test_their_platform_and_assemble_refuses_a_failed_part() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    let failing =
        "    test: {run: [/bin/busybox, sh, -c, \"[ $(uname -m) != aarch64 ] || exit 3\"]}\n";
    let file = project(dir.path(), &repo, "[linux/amd64, linux/arm64]", failing);
    let part = |arch: &str| {
        let path = dir.path().join(format!("part-{arch}.json"));
        let platform = format!("linux/{arch}");
        let out = build(&file, &path, &["--platform", &platform, "--push-by-digest"]);
        let part: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        (out, path, part)
    };
    let assemble = |parts: &[&Path]| {
        run(polyarch()
            .args(["assemble", "-f"])
            .arg(&file)
            .args(parts)
            .arg("--record")
            .arg(dir.path().join("assembled.json"))
            .env("POLYARCH_CACHE_DIR", dir.path().join("cache")))
    };

    let (out, amd, part_amd) = part("amd64");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        part_amd["images"][0]["platforms"][0]["test"]["status"],
        "passed"
    );
    // The arm64 runner's test fails: its job fails, and its part says why.
    let (out, arm, part_arm) = part("arm64");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let test = &part_arm["images"][0]["platforms"][0]["test"];
    assert_eq!(test["status"], "failed", "{part_arm:#}");
    assert_eq!(test["exit_code"], 3, "{part_arm:#}");

    let out = assemble(&[&amd, &arm]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("linux/arm64: its test failed on the runner that built it"),
        "{}",
        stderr(&out)
    );
    assert!(!tag_exists(&format!("{repo}:v1")), "the tag moved");

    // Fixed: the arm64 part passes and the index is published with each runner's test.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("|| exit 3", "|| exit 0")).unwrap();
    let (out, amd, _) = part("amd64");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (out, arm, _) = part("arm64");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = assemble(&[&amd, &arm]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(tag_exists(&format!("{repo}:v1")));
    let record = read_record(&dir.path().join("assembled.json"));
    assert_eq!(
        platform(&record, "linux/arm64")["test"]["status"],
        "passed",
        "{record:#}"
    );
}

#[test]
fn verify_test_runs_the_tests_in_what_the_tags_name_now() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("demo/tested"));
    let failing = "    test: {run: [/bin/busybox, sh, -c, \"uname -m; [ $(uname -m) != aarch64 ] || exit 3\"]}\n";
    let file = project(dir.path(), &repo, "[linux/amd64, linux/arm64]", failing);
    let path = dir.path().join("coverage.json");
    // Published untested, as a release before `test:` was added would be.
    let out = build(&file, &path, &["--no-test"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verify = |extra: &[&str]| {
        run(polyarch()
            .args(["verify", "-f"])
            .arg(&file)
            .arg("--record")
            .arg(&path)
            .args(extra)
            .env("POLYARCH_CACHE_DIR", dir.path().join("cache")))
    };

    let out = verify(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = verify(&["--test"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let record = read_record(&path);
    let arm = platform(&record, "linux/arm64");
    assert_eq!(arm["status"], "test_failed", "{arm:#}");
    assert_eq!(arm["test"]["exit_code"], 3, "{arm:#}");
    assert_eq!(arm["test"]["output_tail"][0], "aarch64", "{arm:#}");
    assert_eq!(platform(&record, "linux/amd64")["test"]["status"], "passed");
    assert!(
        stdout(&out).contains("test failed with exit code 3"),
        "{}",
        stdout(&out)
    );

    // Without an engine, tests cannot run: exit 3, naming the engine.
    let out = run(polyarch()
        .args(["verify", "--test", "-f"])
        .arg(&file)
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env_remove("DOCKER_CONTEXT")
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/docker.sock"),
        "{}",
        stderr(&out)
    );
}

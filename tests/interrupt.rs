//! Interrupted and killed runs (issue 6): a tag moves only when a run completes, and an
//! interrupted run leaves nothing behind in the engine or in $TMPDIR.
//!
//! Every test first publishes an OLD index to `v1` with a good run, then changes the
//! build context (a new layer) and interrupts a second run at some point, detected from
//! polyarch's plain stderr lines and from the fault proxy's request log (the proxy slows
//! the registry down so there is time to interrupt).

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use proxy::{Fault, Proxy, Rule};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::running::{interrupt_while_running, wait_until, Running};
use support::{hello_context, polyarch, run, skopeo_digest, unique_name, Registry, HELLO};

const PLATFORMS: &str = "[linux/amd64, linux/arm64]";

/// A 2-platform project whose `v1` already points at an OLD index, pushed through a
/// fault proxy in front of a real registry. The image name is unique so that the
/// temporary `polyarch-build/NAME:*` images of this test can be told from other runs'.
struct Fixture {
    registry: Registry,
    proxy: Proxy,
    /// The project's image name (and `polyarch-build/` repository component).
    image: String,
    /// Repository path in the registry.
    name: String,
    dir: tempfile::TempDir,
    file: PathBuf,
    old: String,
}

impl Fixture {
    fn new() -> Fixture {
        let registry = Registry::start();
        let proxy = Proxy::start(registry.port);
        let image = unique_name("intr");
        let name = unique_name("interrupt/hello");
        let dir = tempfile::tempdir().unwrap();
        hello_context(
            dir.path(),
            &format!("{HELLO}LABEL generation=\"old-{image}\"\n"),
        );
        std::fs::create_dir_all(dir.path().join("docker-config")).unwrap();
        let file = dir.path().join("polyarch.yaml");
        std::fs::write(
            &file,
            format!(
                "version: 1\nimages:\n  {image}:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: {PLATFORMS}\n",
                proxy.repo(&name)
            ),
        )
        .unwrap();
        let mut fixture = Fixture {
            registry,
            proxy,
            image,
            name,
            dir,
            file,
            old: String::new(),
        };
        let out = run(&mut fixture.build(None));
        assert_exit(&out, 0, "the first (old) run");
        fixture.old = fixture.tag_digest();

        // The next runs build something else: a new layer (so there are blobs to upload)
        // and a new config.
        let payload: Vec<u8> = (0..1_500_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ fixture.image.len() as u8)
            .collect();
        std::fs::write(fixture.dir.path().join("payload"), payload).unwrap();
        std::fs::write(
            fixture.dir.path().join("Dockerfile"),
            format!(
                "{HELLO}COPY payload /payload\nLABEL generation=\"new-{}\"\n",
                fixture.image
            ),
        )
        .unwrap();
        fixture
    }

    fn record(&self) -> PathBuf {
        self.dir.path().join("coverage.json")
    }

    /// `polyarch build` in an isolated environment; `tmp` becomes the child's TMPDIR.
    fn build(&self, tmp: Option<&Path>) -> Command {
        let mut cmd = polyarch();
        cmd.args(["build", "-f"])
            .arg(&self.file)
            .arg("--record")
            .arg(self.record())
            .env("DOCKER_CONFIG", self.dir.path().join("docker-config"))
            .env("POLYARCH_CERTS_D", self.dir.path().join("no-certs.d"))
            .env("POLYARCH_RETRY_BASE_MS", "50")
            .env_remove("SSL_CERT_FILE")
            .env_remove("CI");
        if let Some(tmp) = tmp {
            cmd.env("TMPDIR", tmp);
        }
        cmd
    }

    /// What `v1` resolves to, read from the registry directly (not through the proxy).
    fn tag_digest(&self) -> String {
        skopeo_digest(&self.registry.repo(&format!("{}:v1", self.name)), None)
    }

    /// `polyarch-build/IMAGE:*` images of this fixture still in the engine.
    fn temporary_images(&self) -> Vec<String> {
        let out = run(Command::new("docker").args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            &format!("reference=polyarch-build/{}", self.image),
        ]));
        assert!(out.status.success(), "docker images: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn remove_temporary_images(&self) {
        for tag in self.temporary_images() {
            let _ = run(Command::new("docker").args(["rmi", "-f", &tag]));
        }
    }

    /// A rerun without faults completes and moves `v1` to the index it recorded.
    fn rerun_moves_the_tag(&self) {
        self.proxy.clear();
        let tmp = tempfile::tempdir().unwrap();
        let out = run(&mut self.build(Some(tmp.path())));
        assert_exit(&out, 0, "the rerun");
        let now = self.tag_digest();
        assert_ne!(now, self.old, "the rerun did not move the tag");
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.record()).unwrap()).unwrap();
        assert_eq!(record["images"][0]["digest"], now.as_str(), "{record}");
        assert_eq!(record["covered"], true, "{record}");
        let images = self.temporary_images();
        assert!(
            images.is_empty(),
            "temporary images left after the rerun: {images:?}"
        );
        assert_empty_dir(tmp.path(), "TMPDIR after the rerun");
    }
}

fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_empty_dir(dir: &Path, what: &str) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "{what} {} holds {left:?}", dir.display());
}

fn container_ids() -> BTreeSet<String> {
    let out = run(Command::new("docker").args(["ps", "-a", "-q", "--no-trunc"]));
    assert!(out.status.success(), "docker ps: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Containers created since `before` that came from this fixture's builds (by their
/// image or name); other test binaries may share the engine.
fn new_containers(before: &BTreeSet<String>, fixture: &Fixture) -> Vec<String> {
    containers_of(before, &fixture.image)
}

/// Containers created since `before` from builds of `image` (by their image or name).
fn containers_of(before: &BTreeSet<String>, image: &str) -> Vec<String> {
    container_ids()
        .difference(before)
        .filter_map(|id| {
            let out = run(Command::new("docker").args([
                "inspect",
                "--format",
                "{{.Name}} {{.Config.Image}} {{json .Config.Labels}}",
                id,
            ]));
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            // Gone already, or someone else's.
            (out.status.success() && (text.contains(image) || text.contains("polyarch-build")))
                .then(|| format!("{id} {text}"))
        })
        .collect()
}

/// Interrupts a run with SIGINT once `at` says so, then checks what a user would:
/// exit 130, the old tag intact, nothing left in the engine or TMPDIR, a rerun works.
fn sigint_keeps_the_old_tag_and_cleans_up(
    fixture: &Fixture,
    at: impl FnOnce(&mut Running, &Fixture, usize),
) {
    let tmp = tempfile::tempdir().unwrap();
    let containers = container_ids();
    let since = fixture.proxy.log().len();
    let started = Instant::now();
    let mut running = Running::spawn(fixture.build(Some(tmp.path())));
    at(&mut running, fixture, since);
    let before_signal = running.stderr();
    running.signal("INT");
    let (status, stdout, stderr) = running.finish();
    eprintln!(
        "interrupted after {:?}\n--- before SIGINT\n{before_signal}\n--- all stderr\n{stderr}\n--- proxy\n{:#?}",
        started.elapsed(),
        fixture.proxy.log()
    );
    assert_eq!(
        status.code(),
        Some(130),
        "status {status}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stderr
            .lines()
            .last()
            .unwrap_or_default()
            .contains("interrupted"),
        "{stderr}"
    );
    assert!(stdout.trim().is_empty(), "a record was printed: {stdout}");
    // The proxy may still forward a request that was in flight, and the engine may still
    // be finishing a build whose client went away: what is left must be left for good.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        fixture.tag_digest(),
        fixture.old,
        "the tag moved although the run was interrupted"
    );
    let images = fixture.temporary_images();
    assert!(images.is_empty(), "temporary images left: {images:?}");
    let left = new_containers(&containers, fixture);
    assert!(left.is_empty(), "containers left: {left:?}");
    assert_empty_dir(tmp.path(), "TMPDIR");
    fixture.rerun_moves_the_tag();
}

/// Waits until the proxy's requests from index `since` on satisfy `pred`.
fn wait_proxy(fixture: &Fixture, since: usize, what: &str, pred: impl Fn(&[String]) -> bool) {
    wait_until(
        || pred(&fixture.proxy.log()[since..]),
        || format!("{what} never reached the proxy: {:#?}", fixture.proxy.log()),
    );
}

fn uploads_delayed(log: &[String]) -> bool {
    log.iter()
        .any(|l| l.starts_with("PUT ") && l.contains("/blobs/uploads/") && l.contains("Delay("))
}

fn slow_uploads(proxy: &Proxy) {
    proxy.add(
        Rule::new(
            "PUT",
            "/blobs/uploads/",
            Fault::Delay(Duration::from_secs(3)),
        )
        .always(),
    );
}

#[test]
fn sigint_during_build_keeps_the_old_tag_and_leaves_nothing() {
    let fixture = Fixture::new();
    sigint_keeps_the_old_tag_and_cleans_up(&fixture, |running, _, _| {
        running.wait_line("[build]");
    });
}

#[test]
fn sigint_mid_build_step_keeps_the_old_tag_and_leaves_nothing() {
    let fixture = Fixture::new();
    sigint_keeps_the_old_tag_and_cleans_up(&fixture, |running, _, _| {
        // BuildKit is running the Dockerfile's steps.
        running.wait_line("[build 1/2]");
    });
}

#[test]
fn sigint_during_export_keeps_the_old_tag_and_leaves_nothing() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here, so polyarch's own export and upload, which this interrupts, do not run (the classic-store pass covers them)");
        return;
    }
    let fixture = Fixture::new();
    sigint_keeps_the_old_tag_and_cleans_up(&fixture, |running, _, _| {
        running.wait_line("[export]");
    });
}

#[test]
fn sigint_during_push_keeps_the_old_tag_and_leaves_nothing() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here, so polyarch's own export and upload, which this interrupts, do not run (the classic-store pass covers them)");
        return;
    }
    let fixture = Fixture::new();
    slow_uploads(&fixture.proxy);
    sigint_keeps_the_old_tag_and_cleans_up(&fixture, |running, fixture, since| {
        running.wait_line("[push]");
        wait_proxy(fixture, since, "a blob upload", uploads_delayed);
    });
}

#[test]
fn sigint_just_before_publish_keeps_the_old_tag_and_leaves_nothing() {
    let fixture = Fixture::new();
    // Publishing asks where the tag points before it moves it: that answer is slow.
    fixture
        .proxy
        .add(Rule::new("GET", "/manifests/v1", Fault::Delay(Duration::from_secs(2))).always());
    sigint_keeps_the_old_tag_and_cleans_up(&fixture, |running, fixture, since| {
        running.wait_line("[publish]");
        // The tag's look-up is on its way; the tag PUT is not sent yet.
        wait_proxy(fixture, since, "the tag's look-up", |log| {
            log.iter()
                .any(|l| l.starts_with("GET ") && l.contains("/manifests/v1"))
        });
        assert!(
            !fixture.proxy.log()[since..]
                .iter()
                .any(|l| l.starts_with("PUT ") && l.contains("/manifests/v1")),
            "the tag was pushed before the interruption"
        );
    });
}

#[test]
fn sigkill_mid_push_keeps_the_old_tag_and_a_rerun_completes() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here, so polyarch's own export and upload, which this interrupts, do not run (the classic-store pass covers them)");
        return;
    }
    let fixture = Fixture::new();
    slow_uploads(&fixture.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let since = fixture.proxy.log().len();
    let mut running = Running::spawn(fixture.build(Some(tmp.path())));
    // Both platforms pushing: both builds have ended in the engine, so nothing the killed
    // run started can still appear there after its leftovers are removed below.
    let first = running.wait_line("[push]");
    running.wait_line(match first.contains("linux/amd64") {
        true => "linux/arm64 [push]",
        false => "linux/amd64 [push]",
    });
    wait_proxy(&fixture, since, "a blob upload", uploads_delayed);
    running.signal("KILL");
    let (status, _, stderr) = running.finish();
    assert_eq!(status.code(), None, "not killed: {status}\n{stderr}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        fixture.tag_digest(),
        fixture.old,
        "the tag moved although the run was killed"
    );
    // A killed process cannot clean up: its temporary images and spool may remain
    // (documented limitation). Remove them so they do not pile up.
    fixture.remove_temporary_images();
    fixture.rerun_moves_the_tag();
}

#[test]
fn registry_killed_mid_push_exits_3_naming_it_and_keeps_the_old_tag() {
    if support::engines::engine_pushes_itself() {
        eprintln!("not on this engine: BuildKit pushes by itself here, so polyarch's own export and upload, which this interrupts, do not run (the classic-store pass covers them)");
        return;
    }
    let mut fixture = Fixture::new();
    slow_uploads(&fixture.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let since = fixture.proxy.log().len();
    let mut running = Running::spawn(fixture.build(Some(tmp.path())));
    running.wait_line("[push]");
    wait_proxy(&fixture, since, "a blob upload", uploads_delayed);
    fixture.registry.stop();
    let (status, stdout, stderr) = running.finish();
    eprintln!(
        "--- stderr\n{stderr}\n--- proxy\n{:#?}",
        fixture.proxy.log()
    );
    assert_eq!(
        status.code(),
        Some(3),
        "status {status}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("error: registry {}", fixture.proxy.host)),
        "{stderr}"
    );
    assert!(fixture.temporary_images().is_empty());
    assert_empty_dir(tmp.path(), "TMPDIR");

    // Same port, same storage: the old index is still what v1 names.
    fixture.registry.restart();
    assert_eq!(
        fixture.tag_digest(),
        fixture.old,
        "the tag moved although the push failed"
    );
    fixture.rerun_moves_the_tag();
}

#[test]
fn sigint_mid_run_step_cancels_the_build_in_the_engine() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let image = unique_name("intrrun");
    // A sleep no other test runs, so its process names this build's RUN step.
    let seconds = (3000 + image.bytes().map(u32::from).sum::<u32>() % 5000).to_string();
    hello_context(
        dir.path(),
        &format!("{HELLO}RUN [\"/bin/busybox\", \"sleep\", \"{seconds}\"]\n"),
    );
    let file = dir.path().join("polyarch.yaml");
    std::fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  {image}:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n    network: none\n",
            registry.repo(&unique_name("interrupt/run"))
        ),
    )
    .unwrap();
    let containers = container_ids();
    let mut cmd = polyarch();
    cmd.args(["build", "-f"]).arg(&file).env_remove("CI");
    let interrupted = interrupt_while_running(cmd, &["/bin/busybox", "sleep", seconds.as_str()]);
    let (stdout, stderr, exited) = (&interrupted.stdout, &interrupted.stderr, interrupted.exited);
    assert!(stdout.trim().is_empty(), "a record was printed: {stdout}");
    // The engine cancels the solve: polyarch waits for no build to end by itself.
    assert!(
        exited < Duration::from_secs(5),
        "exit took {exited:?}:\n{stderr}"
    );
    interrupted.wait_step_gone();
    let left = run(Command::new("docker").args([
        "images",
        "-q",
        "--filter",
        &format!("reference=polyarch-build/{image}"),
    ]));
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "temporary images left: {left:?}"
    );
    let left = containers_of(&containers, &image);
    assert!(left.is_empty(), "containers left: {left:?}");
}

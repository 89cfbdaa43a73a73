//! Native builders per platform (`builders:` in polyarch.yaml) against a real second
//! Docker daemon started just for the test.
//!
//! The second dockerd gets its own data root, exec root, pid file, socket and managed
//! containerd (namespaced), `--bridge=none --iptables=false` in a network namespace of its
//! own, the `vfs` storage driver and an empty `--config-file`, so it neither touches nor
//! reads the shared daemon's setup (docker0 among it). It
//! is an amd64 engine assigned to `linux/arm64`; the fixture's only RUN is in a
//! `--platform=$BUILDPLATFORM` stage, so neither engine needs emulation.
//!
//! A second daemon that cannot start here fails the test with its log's last lines.

mod support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{
    hello_context, platforms_of, polyarch, run, skopeo_config, skopeo_inspect_raw, unique_name,
};
use support::{Registry, HELLO};

const DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A second dockerd on its own socket. Stopped (SIGTERM, then SIGKILL) and its
/// directories removed on drop, also when the test panics.
struct SecondDockerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl SecondDockerd {
    fn start() -> Result<SecondDockerd, String> {
        if Command::new("dockerd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return Err("no runnable `dockerd` binary on PATH".into());
        }
        // Short paths: unix socket paths (containerd's among them) are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("pa-dd-")
            .tempdir_in("/tmp")
            .map_err(|e| format!("temp dir: {e}"))?;
        let root = dir.path();
        fs::write(root.join("daemon.json"), "{}\n").map_err(|e| e.to_string())?;
        let log = fs::File::create(root.join("dockerd.log")).map_err(|e| e.to_string())?;
        let namespace = format!("polyarch-test-{}", std::process::id());
        let host_bridge = Path::new("/sys/class/net/docker0");
        let had_bridge = host_bridge.exists();
        // Its own network namespace: with `--bridge=none` dockerd deletes the interface
        // `docker0` of the namespace it starts in, which on the host is the machine's
        // engine's default bridge (RUN steps of later tests then fail).
        let child = Command::new("unshare")
            .args(["--net", "--", "dockerd"])
            .arg("--config-file")
            .arg(root.join("daemon.json"))
            .arg("--data-root")
            .arg(root.join("data"))
            .arg("--exec-root")
            .arg(root.join("exec"))
            .arg("--pidfile")
            .arg(root.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", root.join("docker.sock").display()))
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .args(["--storage-driver", "vfs"])
            .arg("--containerd-namespace")
            .arg(&namespace)
            .arg("--containerd-plugins-namespace")
            .arg(format!("{namespace}-plugins"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn dockerd: {e}"))?;
        let mut daemon = SecondDockerd { child, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                return Err(format!(
                    "dockerd exited during start-up ({status}); last log lines:\n{}",
                    daemon.log_tail(15)
                ));
            }
            if daemon.ping() {
                if had_bridge && !host_bridge.exists() {
                    return Err("the second dockerd deleted the machine's docker0".into());
                }
                return Ok(daemon);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "dockerd did not answer /_ping within {START_TIMEOUT:?}; last log lines:\n{}",
                    daemon.log_tail(15)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// The endpoint as written in `builders:`.
    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.") && answer.contains(" 200 ")
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for SecondDockerd {
    fn drop(&mut self) {
        // SIGTERM lets dockerd stop its managed containerd too; SIGKILL if it hangs.
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(self.child.id(), "-TERM");
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        // A containerd left behind by a killed dockerd.
        let pidfile = self.dir.path().join("exec/containerd/containerd.pid");
        if let Some(pid) = fs::read_to_string(pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            if Path::new(&format!("/proc/{pid}")).exists() {
                signal(pid, "-KILL");
            }
        }
        // `dir` (data root, exec root, socket, log) is removed when the TempDir drops.
    }
}

/// Both platforms' builds spend ~3 s in a RUN that executes for the *build* platform
/// (amd64 busybox, no emulation on either engine); the nonce defeats the shared daemon's
/// build cache. The target stage only COPYs.
const CLOCK: &str = "\
FROM --platform=$BUILDPLATFORM scratch AS clock
ARG BUILDARCH
COPY bin/${BUILDARCH}/busybox /bin/busybox
COPY nonce /nonce
RUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox sleep 3 && /bin/busybox cp /nonce /slept\"]
FROM scratch
ARG TARGETARCH
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY --from=clock /slept /slept
ENTRYPOINT [\"/bin/busybox\", \"echo\", \"hello\"]
";

fn project_with_builders(dir: &Path, repository: &str, arm64_builder: &str) -> PathBuf {
    let file = dir.join("polyarch.yaml");
    // `network: none`: the second daemon has no bridge, and BuildKit's RUN would
    // otherwise ask for one.
    fs::write(
        &file,
        format!(
            "version: 1\nbuilders:\n  linux/arm64: {arm64_builder}\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n"
        ),
    )
    .unwrap();
    file
}

/// Arrival time of each stderr line (JSON events), relative to the spawn.
struct Timed {
    at: Duration,
    event: Value,
}

#[test]
fn second_native_builder_builds_its_platform_in_parallel() {
    let test = "second_native_builder_builds_its_platform_in_parallel";
    let daemon = SecondDockerd::start()
        .unwrap_or_else(|reason| panic!("{test}: cannot start a second dockerd here: {reason}"));
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), CLOCK);
    fs::write(dir.path().join("nonce"), unique_name("nonce")).unwrap();
    let repo = registry.repo(&unique_name("demo/builders"));
    let file = project_with_builders(dir.path(), &repo, &daemon.endpoint());
    let record_path = dir.path().join("coverage.json");

    let started = Instant::now();
    let mut child = polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .arg("--record")
        .arg(&record_path)
        .args(["--output-format", "json"])
        .env_remove("DOCKER_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn polyarch");
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("stderr line");
            let at = started.elapsed();
            lines.push((at, line));
        }
        lines
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let wall = started.elapsed();
    let lines = reader.join().unwrap();
    let raw: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    assert_eq!(
        status.code(),
        Some(0),
        "build failed:\n{raw}\n--- second dockerd:\n{}",
        daemon.log_tail(20)
    );
    let events: Vec<Timed> = lines
        .iter()
        .map(|(at, l)| Timed {
            at: *at,
            event: serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")),
        })
        .collect();

    // The index is complete and each entry's config says its platform.
    let index = skopeo_inspect_raw(&format!("{repo}:v1"));
    let mut platforms = platforms_of(&index);
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index}");
    for arch in ["amd64", "arm64"] {
        assert_eq!(
            skopeo_config(&format!("{repo}:v1"), arch, None)["architecture"],
            arch
        );
    }

    // The record names the engine each platform was built on.
    let record: Value = serde_json::from_str(&fs::read_to_string(&record_path).unwrap()).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap(),
        record,
        "stdout is the record"
    );
    assert_eq!(record["covered"], true, "{record:#}");
    let mut seconds = BTreeMap::new();
    for p in record["images"][0]["platforms"].as_array().unwrap() {
        let platform = p["platform"].as_str().unwrap().to_string();
        let expected = match platform.as_str() {
            "linux/amd64" => DEFAULT_ENDPOINT.to_string(),
            "linux/arm64" => daemon.endpoint(),
            other => panic!("unexpected platform {other} in {record:#}"),
        };
        assert_eq!(p["build"]["builder"], expected.as_str(), "{p:#}");
        assert_eq!(p["build"]["emulated"], false, "{p:#}");
        seconds.insert(platform, p["build"]["seconds"].as_f64().unwrap());
    }
    assert_eq!(seconds.len(), 2, "{record:#}");

    // polyarch warned that the arm64 builder is not an arm64 engine.
    assert!(
        events.iter().any(|t| t.event["event"] == "warning"
            && t.event["message"]
                .as_str()
                .is_some_and(|m| m.contains(&daemon.endpoint()) && m.contains("linux/amd64"))),
        "no native-platform warning:\n{raw}"
    );

    // Build windows as polyarch reported them: from the unit's `build` phase event to its
    // next phase event (export). Both must be long (the 3 s RUN) and overlap.
    let window = |platform: &str| -> (Duration, Duration) {
        let phases: Vec<&Timed> = events
            .iter()
            .filter(|t| t.event["event"] == "phase" && t.event["platform"] == platform)
            .collect();
        let start = phases
            .iter()
            .position(|t| t.event["phase"] == "build")
            .unwrap_or_else(|| panic!("no build phase for {platform}:\n{raw}"));
        let end = phases[start + 1..]
            .iter()
            .find(|t| t.event["phase"] != "build")
            .unwrap_or_else(|| panic!("no phase after build for {platform}:\n{raw}"));
        (phases[start].at, end.at)
    };
    let (a_start, a_end) = window("linux/amd64");
    let (b_start, b_end) = window("linux/arm64");
    let overlap = a_end.min(b_end).saturating_sub(a_start.max(b_start));
    let report = format!(
        "amd64 build window {:.2}s..{:.2}s ({} s in record), arm64 {:.2}s..{:.2}s ({} s in record), overlap {:.2}s, wall {:.2}s",
        a_start.as_secs_f64(),
        a_end.as_secs_f64(),
        seconds["linux/amd64"],
        b_start.as_secs_f64(),
        b_end.as_secs_f64(),
        seconds["linux/arm64"],
        overlap.as_secs_f64(),
        wall.as_secs_f64()
    );
    eprintln!("{report}");
    for (name, (start, end)) in [("amd64", (a_start, a_end)), ("arm64", (b_start, b_end))] {
        assert!(
            end - start >= Duration::from_millis(2800),
            "{name} build took under the fixture's 3 s sleep — was it cached? {report}\n{raw}"
        );
    }
    assert!(
        overlap >= Duration::from_secs(2),
        "builds did not run in parallel: {report}\n{raw}"
    );
    // The same from the record alone: sequential builds would take at least the sum.
    let sum: f64 = seconds.values().sum();
    assert!(
        wall.as_secs_f64() < sum,
        "wall time not below the sum of build times: {report}"
    );
}

#[test]
fn unreachable_builder_fails_before_any_build() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("demo/unreachable"));
    let file = project_with_builders(dir.path(), &repo, "unix:///nonexistent.sock");

    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .env_remove("DOCKER_HOST"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{stderr}"));
    assert!(
        error.contains("unix:///nonexistent.sock") && error.contains("linux/arm64"),
        "error names neither builder nor platform: {error}"
    );
    assert_eq!(
        error.matches("docker engine:").count(),
        1,
        "repeated prefix: {error}"
    );
    assert!(
        !stderr.contains("[build") && !stderr.contains("[push]"),
        "a build or push started:\n{stderr}"
    );
    // Nothing reached the registry: no repository was created.
    let repositories = registry.data_dir().join("docker/registry/v2/repositories");
    let created: Vec<_> = fs::read_dir(&repositories)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(created.is_empty(), "pushed: {created:?}");
}

/// Writes what the kernel says the machine is, from a RUN step of the target platform.
const UNAME_ON_TARGET: &str = "\
FROM scratch
ARG TARGETARCH
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY nonce /nonce
RUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox uname -m > /arch\"]
";

/// `fallback: emulate` with a RUN step: the arm64 builder is down, so the default engine
/// builds arm64 under QEMU (registered by `--binfmt auto`, the host's binfmt_misc put
/// back as found afterwards), and the pushed arm64 image holds what that step wrote.
#[test]
fn a_down_builder_falls_back_to_a_run_step_under_qemu() {
    let _binfmt = support::binfmt::BinfmtGuard::save();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), UNAME_ON_TARGET);
    fs::write(dir.path().join("nonce"), unique_name("nonce")).unwrap();
    let repo = registry.repo(&unique_name("demo/fallback-qemu"));
    let down = "unix:///nonexistent-polyarch-fallback.sock";
    let file = project_with_builders(
        dir.path(),
        &repo,
        &format!("{{host: \"{down}\", fallback: emulate}}"),
    );
    let out = run(polyarch()
        .args(["build", "--binfmt", "auto", "--output-format", "json", "-f"])
        .arg(&file)
        // Nothing remembered about this engine's emulators from other runs.
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("\"warning\"")
            && l.contains(down)
            && l.contains("fallback: emulate")),
        "no fallback warning:\n{stderr}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");
    let arm = record["images"][0]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["platform"] == "linux/arm64")
        .unwrap_or_else(|| panic!("no arm64 entry: {record:#}"));
    assert_eq!(arm["build"]["emulated"], true, "{arm:#}");
    assert!(
        arm["build"]["fallback"]
            .as_str()
            .is_some_and(|f| f.contains(down)),
        "{arm:#}"
    );
    assert_eq!(
        skopeo_config(&format!("{repo}:v1"), "arm64", None)["architecture"],
        "arm64"
    );
    // The RUN step ran as arm64 code: under QEMU, `uname -m` says aarch64.
    let copy = tempfile::tempdir().unwrap();
    let script = format!(
        "skopeo --override-os linux --override-arch arm64 copy -q --src-tls-verify=false docker://{repo}:v1 dir:{out}
         for blob in {out}/*; do tar -xzOf \"$blob\" arch 2>/dev/null || true; done",
        out = copy.path().display()
    );
    let read = run(Command::new("bash").args(["-c", &script]));
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        "aarch64",
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
}

//! A farm: a list of BuildKit daemons for one platform. Each image sticks to one daemon
//! run after run (its cache is there), a down daemon's images go to the next one, and
//! `plan`/`doctor` say which daemon builds what. Every test starts its own two daemons
//! and builds linux/amd64 only, so no QEMU is involved.

mod support;

use polyarch::builder::{sticky_key, sticky_slot};
use serde_json::Value;
use std::path::{Path, PathBuf};
use support::buildkitd::Private;

/// A two-image project (`first`, `second`, each in a repository of its own) whose
/// linux/amd64 builds go to `daemons`; the second repository is picked so that the two
/// images are sticky to different slots of the list.
struct Farm {
    file: PathBuf,
    repos: [String; 2],
}

const NAMES: [&str; 2] = ["first", "second"];

fn farm_project(dir: &Path, registry: &support::Registry, daemons: &[&str]) -> Farm {
    support::hello_context(
        dir,
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nCOPY marker /marker\n",
    );
    std::fs::write(dir.join("marker"), support::unique_name("farm")).unwrap();
    let first = registry.repo(&support::unique_name("farm/first"));
    let slot = |repo: &str, name: &str| sticky_slot(&sticky_key(repo, name), daemons.len());
    let second = std::iter::repeat_with(|| registry.repo(&support::unique_name("farm/second")))
        .find(|repo| slot(repo, NAMES[1]) != slot(&first, NAMES[0]))
        .unwrap();
    let list: Vec<String> = daemons
        .iter()
        .map(|d| format!("{{buildkit: \"{d}\"}}"))
        .collect();
    let image = |name: &str, repo: &str| {
        format!("  {name}:\n    repository: {repo}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n")
    };
    let file = dir.join("polyarch.yaml");
    std::fs::write(
        &file,
        format!(
            "version: 1\nbuilders:\n  linux/amd64: [{}]\nimages:\n{}{}",
            list.join(", "),
            image(NAMES[0], &first),
            image(NAMES[1], &second)
        ),
    )
    .unwrap();
    Farm {
        file,
        repos: [first, second],
    }
}

impl Farm {
    /// The daemon of `daemons` that image `i` is sticky to.
    fn sticky<'a>(&self, i: usize, daemons: &[&'a str]) -> &'a str {
        daemons[sticky_slot(&sticky_key(&self.repos[i], NAMES[i]), daemons.len())]
    }

    /// `polyarch build --rebuild` (every run really builds), its exit code, stderr and
    /// the builder the record names for each image.
    fn build(&self) -> (Option<i32>, String, [String; 2]) {
        let out = support::run(
            support::polyarch()
                .env_remove("BUILDKIT_HOST")
                .args(["build", "--rebuild", "--output-format", "json", "-f"])
                .arg(&self.file),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let record: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let builder = |name: &str| {
            record["images"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|i| i["name"] == name)
                .and_then(|i| i["platforms"][0]["build"]["builder"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        (
            out.status.code(),
            stderr,
            [builder(NAMES[0]), builder(NAMES[1])],
        )
    }
}

#[test]
fn buildkitd_farm_keeps_each_image_on_the_same_daemon_across_runs() {
    let (one, two) = (Private::start(), Private::start());
    let daemons = [one.unix.as_str(), two.unix.as_str()];
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let farm = farm_project(dir.path(), &registry, &daemons);
    let expected = [farm.sticky(0, &daemons), farm.sticky(1, &daemons)];
    // The project was picked so that the two images spread over both daemons.
    assert_ne!(expected[0], expected[1]);

    for run in 1..=2 {
        let (code, stderr, builders) = farm.build();
        assert_eq!(code, Some(0), "run {run}: {stderr}");
        assert_eq!(
            builders,
            expected.map(str::to_string),
            "run {run}: {stderr}"
        );
        for daemon in daemons {
            assert!(
                stderr.contains(&format!("building on BuildKit daemon {daemon}")),
                "run {run}: {stderr}"
            );
        }
        assert!(!stderr.contains("unreachable"), "run {run}: {stderr}");
    }
}

#[test]
fn buildkitd_farm_moves_a_down_daemons_image_to_the_next_one() {
    let (mut one, mut two) = (Private::start(), Private::start());
    let daemons = [one.unix.clone(), two.unix.clone()];
    let daemons: Vec<&str> = daemons.iter().map(String::as_str).collect();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let farm = farm_project(dir.path(), &registry, &daemons);
    let (code, stderr, before) = farm.build();
    assert_eq!(code, Some(0), "{stderr}");

    // The first image's daemon goes down; the second image's stays up.
    let down = farm.sticky(0, &daemons);
    let up = farm.sticky(1, &daemons);
    assert_eq!(before, [down, up].map(str::to_string), "{stderr}");
    match down == one.unix {
        true => one.kill(),
        false => two.kill(),
    }

    let (code, stderr, after) = farm.build();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(after, [up, up].map(str::to_string), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.contains("warning") && l.contains(down))
        .unwrap_or_else(|| panic!("no warning naming {down}:\n{stderr}"));
    assert!(
        warning.contains("unreachable")
            && warning.contains(&format!("{} builds on {up} instead", NAMES[0])),
        "{warning}"
    );

    // The index the rerun published reads back whole.
    let out = support::run(
        support::polyarch()
            .env_remove("BUILDKIT_HOST")
            .args(["verify", "-f"])
            .arg(&farm.file),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `polyarch ARGS --output-format json -f FILE` with `env`: exit code, stdout as JSON.
fn json(args: &[&str], file: &Path, env: &[(&str, &str)]) -> (Option<i32>, Value, String) {
    let mut cmd = support::polyarch();
    cmd.env_remove("BUILDKIT_HOST").envs(env.iter().copied());
    let out = support::run(
        cmd.args(args)
            .args(["--output-format", "json", "-f"])
            .arg(file),
    );
    let stdout = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), stdout, shown)
}

/// The entry of a JSON list whose `field` is `value`.
fn entry<'a>(list: &'a Value, field: &str, value: &str) -> &'a Value {
    list.as_array()
        .into_iter()
        .flatten()
        .find(|e| e[field] == value)
        .unwrap_or_else(|| panic!("no {field} {value} in {list:#}"))
}

#[test]
fn buildkitd_farm_plan_and_doctor_name_the_daemon_of_each_image() {
    let (one, two) = (Private::start(), Private::start());
    let daemons = [one.unix.as_str(), two.unix.as_str()];
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let farm = farm_project(dir.path(), &registry, &daemons);

    let (code, lines, shown) = json(&["plan"], &farm.file, &[]);
    assert_eq!(code, Some(0), "{shown}");
    for (i, name) in NAMES.iter().enumerate() {
        let builder = entry(&lines, "image", name)["builder"].as_str().unwrap();
        assert!(
            builder.starts_with(&format!("BuildKit daemon {}", farm.sticky(i, &daemons)))
                && builder.contains("sticky"),
            "{name}: {builder}"
        );
    }

    let (code, checks, shown) = json(&["doctor"], &farm.file, &[]);
    assert_eq!(code, Some(0), "{shown}");
    for (place, daemon) in daemons.iter().enumerate() {
        let check = entry(&checks, "name", &format!("builder linux/amd64 [{place}]"));
        let image = (0..2)
            .find(|&i| farm.sticky(i, &daemons) == *daemon)
            .unwrap();
        let detail = check["detail"].as_str().unwrap();
        assert_eq!(check["verdict"], "ok", "{check}");
        assert!(
            detail.contains(&format!("BuildKit daemon {daemon} reachable"))
                && detail.ends_with(&format!("builds linux/amd64 of {}", NAMES[image])),
            "{detail}"
        );
    }

    // With BUILDKIT_HOST and no Docker engine, both name that daemon as the builder.
    let dir = tempfile::tempdir().unwrap();
    support::hello_context(
        dir.path(),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\n",
    );
    let repo = registry.repo(&support::unique_name("farm/host"));
    let file = support::write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let env = [
        ("BUILDKIT_HOST", one.unix.as_str()),
        ("DOCKER_HOST", "unix:///nonexistent/docker.sock"),
    ];
    let (code, lines, shown) = json(&["plan"], &file, &env);
    assert_eq!(code, Some(0), "{shown}");
    let builder = entry(&lines, "image", "hello")["builder"].as_str().unwrap();
    assert!(
        builder.starts_with(&format!("{} (BuildKit v", one.unix)),
        "{builder}"
    );
    let (code, checks, shown) = json(&["doctor"], &file, &env);
    assert_eq!(code, Some(0), "{shown}");
    let detail = entry(&checks, "name", "engine")["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "BuildKit daemon {} (BUILDKIT_HOST) reachable",
            one.unix
        )) && detail.contains("linux/amd64"),
        "{detail}"
    );
}

/// Kills the processes whose command line holds `nonce`: a RUN step the test left
/// running under a daemon it killed.
fn kill_holding(nonce: &str) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(nonce) {
            let pid = entry.file_name().to_string_lossy().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
        }
    }
}

#[test]
fn buildkitd_farm_moves_a_build_whose_daemon_is_lost_to_the_next_one() {
    use std::io::{BufRead, Read};
    let (mut one, mut two) = (Private::start(), Private::start());
    let daemons = [one.unix.clone(), two.unix.clone()];
    let daemons: Vec<&str> = daemons.iter().map(String::as_str).collect();
    let registry = support::Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let farm = farm_project(dir.path(), &registry, &daemons);
    // The first image's RUN waits as many seconds as `wait` says: long on its daemon,
    // which the test kills meanwhile, none on the next (the context is sent again).
    let nonce = support::unique_name("farm-lost");
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nCOPY wait /wait\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"i=0; while [ $i -lt $(/bin/busybox cat /wait) ]; do /bin/busybox sleep 1; i=$((i+1)); done\", \"{nonce}\"]\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("wait"), "60\n").unwrap();
    let text = std::fs::read_to_string(&farm.file).unwrap();
    // Only the first image: the second shares the context but not the wait.
    let first_only = &text[..text.find(&format!("  {}:", NAMES[1])).unwrap()];
    std::fs::write(&farm.file, first_only).unwrap();
    let (lost, next) = match farm.sticky(0, &daemons) == one.unix {
        true => (one.unix.clone(), two.unix.clone()),
        false => (two.unix.clone(), one.unix.clone()),
    };

    let mut child = support::polyarch()
        .env_remove("BUILDKIT_HOST")
        .args(["build", "--output-format", "json", "-f"])
        .arg(&farm.file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all.join("\n")
    });
    let mut stdout = child.stdout.take().unwrap();
    let record = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    // The RUN step started on the image's daemon: then that daemon goes.
    loop {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("the RUN step never started")
            });
        if line.contains("\"event\":\"step\"") && line.contains("RUN") {
            break;
        }
    }
    std::fs::write(dir.path().join("wait"), "0\n").unwrap();
    match lost == one.unix {
        true => one.kill(),
        false => two.kill(),
    }
    let status = child.wait().unwrap();
    kill_holding(&nonce);
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("\"warning\"")
            && l.contains("was lost during the build")
            && l.contains(&format!("builder {lost}"))
            && l.contains(&format!("building again on {next}"))),
        "no warning moving the build:\n{stderr}"
    );
    let record: Value = serde_json::from_str(&record.join().unwrap()).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");
    assert_eq!(
        record["images"][0]["platforms"][0]["build"]["builder"], next,
        "{record:#}"
    );
}

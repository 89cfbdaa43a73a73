//! A farm: a list of BuildKit daemons for one platform. Each image sticks to one daemon
//! run after run (its cache is there), a down daemon's images go to the next one, and
//! `plan`/`doctor` say which daemon builds what. Every test starts its own two daemons
//! and builds linux/amd64 only, so no QEMU is involved.

mod support;

use polyarch::build::{sticky_key, sticky_slot};
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

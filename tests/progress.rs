//! What `polyarch build` writes while it works, per output mode: plain timestamped lines
//! when stderr is not a terminal, JSON lines with `--output-format json`, and indicatif
//! redraws on a pseudo-terminal.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::{hello_context, polyarch, run, unique_name, write_project, Registry, HELLO};

/// A fresh two-platform hello project pushing to `registry`.
fn fixture(registry: &Registry) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = registry.repo(&unique_name("demo/progress"));
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64, linux/arm64]");
    (dir, file)
}

fn build(file: &Path, extra: &[&str]) -> Output {
    run(polyarch()
        .args(["build", "-f"])
        .arg(file)
        .args(extra)
        .env_remove("CI"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

fn is_stamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 9
        && [0, 1, 3, 4, 6, 7].iter().all(|&i| b[i].is_ascii_digit())
        && b[2] == b':'
        && b[5] == b':'
        && b[8] == b' '
}

#[test]
fn plain_lines_on_a_pipe_are_timestamped_and_free_of_control_characters() {
    let registry = Registry::start();
    let (_dir, file) = fixture(&registry);
    let out = build(&file, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.is_empty());
    for line in stderr.lines() {
        assert!(is_stamped(line), "not `HH:MM:SS …`: {line:?}\n{stderr}");
        assert!(
            !line.chars().any(|c| c.is_control()),
            "control character in {line:?}"
        );
    }
    assert!(!stderr.contains('\r') && !stderr.contains('\x1b'));
    for platform in ["linux/amd64", "linux/arm64"] {
        for phase in ["[build]", "[done]"] {
            assert!(
                stderr
                    .lines()
                    .any(|l| l.contains(platform) && l.contains(phase)),
                "no {phase} line for {platform}:\n{stderr}"
            );
        }
    }
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("every declared platform is covered"),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\x1b') && !stdout.contains('\r'),
        "{stdout:?}"
    );
}

#[test]
fn json_mode_is_event_lines_on_stderr_and_one_record_on_stdout() {
    let registry = Registry::start();
    let (_dir, file) = fixture(&registry);
    let out = build(&file, &["--output-format", "json"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let mut kinds = std::collections::BTreeSet::new();
    for line in stderr.lines() {
        let event: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        let kind = event["event"]
            .as_str()
            .unwrap_or_else(|| panic!("no \"event\" field: {line}"));
        kinds.insert(kind.to_string());
    }
    assert!(kinds.contains("phase"), "{kinds:?}");

    let stdout = text(&out.stdout);
    let documents: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"));
    assert_eq!(documents.len(), 1, "{stdout}");
    let record = &documents[0];
    assert_eq!(record["schema"], "polyarch/coverage/v1", "{record:#}");
    assert_eq!(record["covered"], true, "{record:#}");
    assert_eq!(
        stdout.trim_end(),
        stdout.trim(),
        "leading noise: {stdout:?}"
    );
}

fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

#[test]
fn terminal_mode_redraws_progress_and_ends_with_the_summary() {
    let has_script = Command::new("script")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_script,
        "util-linux `script` gives polyarch a pty here: apt-get install bsdutils (scripts/ensure-env.sh does)"
    );
    let registry = Registry::start();
    let (_dir, file) = fixture(&registry);
    let command = [
        env!("CARGO_BIN_EXE_polyarch"),
        "build",
        "-f",
        file.to_str().unwrap(),
    ]
    .map(shell_quote)
    .join(" ");
    // script(1) runs the command on a pty and copies everything it writes (stdout and
    // stderr together) to our stdout; -e passes the exit code through.
    let out = run(Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("CI"));
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{all}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains('\r'), "no carriage returns: {all:?}");
    assert!(all.contains("\x1b["), "no escape sequences: {all:?}");
    assert!(
        !all.lines().any(is_stamped),
        "plain-reporter lines on a terminal: {all:?}"
    );
    for platform in ["linux/amd64", "linux/arm64"] {
        assert!(all.contains(&format!("hello {platform}")), "{all:?}");
    }
    assert!(
        all.contains("every declared platform is covered"),
        "no final summary: {all:?}"
    );
}

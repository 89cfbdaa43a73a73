//! The GitHub Action (`action.yml`) run the way GitHub runs a composite action: its
//! `run:` steps in order with `bash --noprofile --norc -eo pipefail FILE`, each step's
//! `env:` with `${{ inputs.* }}` and `${{ steps.*.outputs.* }}` filled in, GITHUB_OUTPUT,
//! GITHUB_STEP_SUMMARY, GITHUB_ACTION_PATH and RUNNER_TEMP set; the action's outputs read
//! from its steps' outputs. `uses:` steps (the cargo cache) are GitHub's own and skipped.
//! Against a loopback registry: the split-runner flow (push by digest per platform, then
//! assemble), and a verify that finds a gap.

mod support;

use serde_norway::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{
    hello_context, repo_root, skopeo_digest, unique_name, write_project, Registry, HELLO,
};

type Outputs = BTreeMap<String, String>;

/// What one run of the action left: its outputs, the job summary, whether it succeeded.
struct Run {
    outputs: Outputs,
    summary: String,
    success: bool,
    /// Where the action had polyarch keep its memory: the directory its state cache saves.
    state_dir: PathBuf,
    /// RUNNER_TEMP, where the record goes by default; removed with the run.
    runner: tempfile::TempDir,
}

/// `${{ inputs.x }}`, `${{ steps.id.outputs.x }}` and `${{ github.action_path }}`, the
/// only expressions action.yml uses.
fn expand(text: &str, inputs: &Outputs, steps: &BTreeMap<String, Outputs>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").expect("closed expression") + start;
        let expr = rest[start + 3..end].trim();
        let value = if let Some(name) = expr.strip_prefix("inputs.") {
            inputs.get(name).cloned().unwrap_or_default()
        } else if let Some(path) = expr.strip_prefix("steps.") {
            let (id, name) = path.split_once(".outputs.").expect("steps.ID.outputs.NAME");
            steps
                .get(id)
                .and_then(|o| o.get(name))
                .cloned()
                .unwrap_or_default()
        } else if expr == "github.action_path" {
            repo_root().display().to_string()
        } else {
            panic!("action.yml uses an expression this test does not know: {expr}")
        };
        out.push_str(&value);
        rest = &rest[end + 2..];
    }
    out + rest
}

/// GITHUB_OUTPUT's `name=value` and `name<<DELIMITER` … `DELIMITER` lines.
fn read_outputs(file: &Path) -> Outputs {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut outputs = Outputs::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some((name, delimiter)) = line.split_once("<<") {
            let value: Vec<&str> = lines.by_ref().take_while(|l| *l != delimiter).collect();
            outputs.insert(name.into(), value.join("\n"));
        } else if let Some((name, value)) = line.split_once('=') {
            outputs.insert(name.into(), value.into());
        }
    }
    outputs
}

/// Runs action.yml with `given` inputs in `workspace`, as GitHub would.
fn run_action(workspace: &Path, given: &[(&str, &str)]) -> Run {
    let action: Value =
        serde_norway::from_str(&std::fs::read_to_string(repo_root().join("action.yml")).unwrap())
            .unwrap();
    assert_eq!(action["runs"]["using"].as_str(), Some("composite"));
    let mut inputs: Outputs = action["inputs"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let default = v["default"].as_str().unwrap_or_default();
            (k.as_str().unwrap().to_string(), default.to_string())
        })
        .collect();
    for (name, value) in given {
        assert!(inputs.contains_key(*name), "action.yml has no input {name}");
        inputs.insert(name.to_string(), value.to_string());
    }
    let runner = tempfile::tempdir().unwrap();
    let summary = runner.path().join("summary.md");
    let mut steps: BTreeMap<String, Outputs> = BTreeMap::new();
    let mut success = true;
    for (n, step) in action["runs"]["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .enumerate()
    {
        let Some(script) = step["run"].as_str() else {
            assert!(step["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/cache@")));
            continue;
        };
        assert_eq!(
            step["shell"].as_str(),
            Some("bash"),
            "step {n} names its shell"
        );
        let file = runner.path().join(format!("step-{n}.sh"));
        std::fs::write(&file, script).unwrap();
        let output = runner.path().join(format!("output-{n}"));
        let mut cmd = Command::new("bash");
        support::as_a_user_runs_cargo(&mut cmd)
            .args(["--noprofile", "--norc", "-eo", "pipefail"])
            .arg(&file)
            .current_dir(workspace)
            .env("GITHUB_ACTION_PATH", repo_root())
            .env("GITHUB_OUTPUT", &output)
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env("GITHUB_WORKSPACE", workspace)
            .env("RUNNER_TEMP", runner.path())
            .env("RUNNER_OS", "Linux")
            // A fresh runner's home cache: the memory is in it only if the action put it there.
            .env("XDG_CACHE_HOME", runner.path().join("home-cache"))
            .env_remove("POLYARCH_CACHE_DIR")
            .env("CI", "true");
        if let Some(env) = step["env"].as_mapping() {
            for (k, v) in env {
                cmd.env(
                    k.as_str().unwrap(),
                    expand(v.as_str().unwrap(), &inputs, &steps),
                );
            }
        }
        let out = cmd.output().unwrap();
        let id = step["id"].as_str().unwrap_or_default().to_string();
        steps.insert(id.clone(), read_outputs(&output));
        if !out.status.success() {
            eprintln!(
                "step {id} failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            success = false;
            break;
        }
    }
    let outputs = action["outputs"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let value = expand(v["value"].as_str().unwrap(), &inputs, &steps);
            (k.as_str().unwrap().to_string(), value)
        })
        .collect();
    let state_dir = steps
        .get("key")
        .and_then(|k| k.get("state-dir"))
        .map(PathBuf::from)
        .unwrap_or_default();
    Run {
        outputs,
        summary: std::fs::read_to_string(&summary).unwrap_or_default(),
        success,
        state_dir,
        runner,
    }
}

#[test]
fn the_split_runner_flow_publishes_one_index_and_a_gap_fails_the_step_with_its_table() {
    let registry = Registry::start();
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    hello_context(ws, HELLO);
    let repository = registry.repo(&unique_name("action/hello"));
    write_project(ws, &repository, "[v1]", "[linux/amd64, linux/arm64]");

    // One runner per platform pushes by digest and leaves a part record.
    for arch in ["amd64", "arm64"] {
        let part = format!("part-{arch}.json");
        let run = run_action(
            ws,
            &[
                ("platform", &format!("linux/{arch}")),
                ("push-by-digest", "true"),
                ("record", &part),
            ],
        );
        assert!(run.success, "build linux/{arch}");
        // The state cache saves the directory polyarch remembered its pushes in.
        assert!(
            run.state_dir.starts_with(run.runner.path()),
            "{}",
            run.state_dir.display()
        );
        assert!(
            run.state_dir.join("pushed.json").is_file(),
            "no memory of the pushed manifests in {}",
            run.state_dir.display()
        );
        assert_eq!(run.outputs["record"], part);
        assert_eq!(run.outputs["exit-code"], "0");
        assert!(ws.join(&part).is_file());
        assert!(
            run.summary
                .contains(&format!("| **hello** | linux/{arch} |")),
            "{}",
            run.summary
        );
    }

    // Then one job assembles them: the index digest is what the registry serves.
    let run = run_action(ws, &[("command", "assemble")]);
    assert!(run.success, "assemble");
    let digests: serde_json::Value = serde_json::from_str(&run.outputs["digests"]).unwrap();
    let served = skopeo_digest(&format!("{repository}:v1"), None);
    assert_eq!(
        digests["hello"].as_str(),
        Some(served.as_str()),
        "{digests}"
    );
    assert_eq!(run.outputs["covered"], "true");
    let record = PathBuf::from(&run.outputs["record"]);
    assert!(record.is_file(), "{}", record.display());
    assert!(
        run.summary
            .starts_with("### polyarch: ✅ every declared platform is covered"),
        "{}",
        run.summary
    );
    for arch in ["amd64", "arm64"] {
        assert!(
            run.summary.contains(&format!("linux/{arch} | ✅ covered")),
            "{}",
            run.summary
        );
    }

    // A platform the tag lacks: the step fails, and the summary says which.
    let run = run_action(
        ws,
        &[
            ("command", "verify"),
            (
                "set",
                "hello.platforms=linux/amd64,linux/arm64,linux/riscv64",
            ),
        ],
    );
    assert!(!run.success, "a gap fails the step");
    assert_eq!(run.outputs["exit-code"], "1");
    assert_eq!(run.outputs["covered"], "false");
    assert!(
        run.summary.contains("| linux/riscv64 | ❌ missing |"),
        "{}",
        run.summary
    );
}

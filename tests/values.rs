//! Values from the job through the real CLI: a release job builds with its version from the
//! environment and `--set`, and a deploy job, whose checkout holds the project file but no
//! context or Dockerfile, verifies and gates what it pushed.

mod support;

use serde_json::Value;
use std::path::Path;
use support::gate::{deployment, Deploy};
use support::{hello_context, polyarch, run, skopeo_digest, unique_name, Registry, HELLO};

/// A release pipeline's project file: registry and version come from the job.
const PROJECT: &str = "version: 1\nimages:\n  api:\n    repository: ${REGISTRY}/${REPO_PATH}\n    tags: [\"${VERSION:?the release version, e.g. v1.4.3}\", latest]\n    context: .\n    platforms: [linux/amd64]\n    build_args: {VERSION: \"${VERSION}\", COMMIT: \"${COMMIT:-unknown}\"}\n";

/// Asserts exit 0; the JSON on stdout.
fn ok(out: &std::process::Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn sources(record: &Value) -> Vec<(String, String)> {
    record["values"]
        .as_array()
        .unwrap_or_else(|| panic!("no values in {record}"))
        .iter()
        .map(|v| {
            (
                v["field"].as_str().unwrap().to_string(),
                v["source"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(field: &str, source: &str) -> (String, String) {
    (field.to_string(), source.to_string())
}

#[test]
fn a_release_job_builds_from_its_variables_and_a_deploy_job_verifies_without_build_inputs() {
    let registry = Registry::start();
    let release = tempfile::tempdir().unwrap();
    hello_context(release.path(), HELLO);
    let file = release.path().join("polyarch.yaml");
    std::fs::write(&file, PROJECT).unwrap();
    let repo_path = unique_name("values/api");
    let job = |cmd: &mut std::process::Command| {
        cmd.env("REGISTRY", format!("127.0.0.1:{}", registry.port))
            .env("REPO_PATH", &repo_path)
            .env("VERSION", "v1.4.3")
            .env_remove("COMMIT");
    };

    // Release: the version from the environment, one more tag and the platforms from --set.
    let mut build = polyarch();
    job(&mut build);
    let record = ok(&run(build.args(["build", "-f"]).arg(&file).args([
        "--set",
        "api.tags=v1.4.3,v1.4,latest",
        "--set",
        "*.platforms=linux/amd64,linux/arm64",
        "--output-format",
        "json",
    ])));
    assert_eq!(record["covered"], true);
    let image = &record["images"][0];
    assert_eq!(
        image["tags"],
        serde_json::json!(["v1.4.3", "v1.4", "latest"])
    );
    assert_eq!(image["declared"].as_array().unwrap().len(), 2);
    assert_eq!(
        sources(&record),
        vec![
            pair("images.api.tags", "set"),
            pair("images.api.platforms", "set"),
            pair("images.api.repository", "env:REGISTRY"),
            pair("images.api.repository", "env:REPO_PATH"),
            pair("images.api.build_args.VERSION", "env:VERSION"),
            pair("images.api.build_args.COMMIT", "default:COMMIT"),
        ]
    );
    let reference = format!("127.0.0.1:{}/{repo_path}:v1.4", registry.port);
    assert_eq!(
        skopeo_digest(&reference, None),
        image["digest"].as_str().unwrap()
    );

    // Deploy: the same project file, no context, no Dockerfile.
    let deploy = tempfile::tempdir().unwrap();
    let deployed = deploy.path().join("polyarch.yaml");
    std::fs::copy(&file, &deployed).unwrap();
    let mut verify = polyarch();
    job(&mut verify);
    let verified = ok(&run(verify
        .args(["verify", "-f"])
        .arg(&deployed)
        .args(["--output-format", "json"])));
    assert_eq!(verified["covered"], true);
    assert_eq!(verified["images"][0]["digest"], image["digest"]);
    assert!(
        sources(&verified).contains(&pair("images.api.tags[0]", "env:VERSION")),
        "{verified}"
    );
    // verify -f takes --set too, and an image without the file's tags is a gap, not a
    // complaint about build inputs.
    let mut verify = polyarch();
    job(&mut verify);
    let out = run(verify.args(["verify", "-f"]).arg(&deployed).args([
        "--set",
        "api.platforms=linux/amd64,linux/arm64,linux/arm/v7",
    ]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The gate, from the deploy checkout, on what was pushed.
    let checkout = Deploy::write(
        deploy.path(),
        &deployment("api", &reference, None, ""),
        &[("general", "amd64", 3), ("graviton", "arm64", 2)],
    );
    let out = run(checkout.gate().current_dir(deploy.path()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Building still needs the build inputs, and says which.
    let mut build = polyarch();
    job(&mut build);
    let out = run(build.args(["build", "-f"]).arg(&deployed));
    one_error(
        &out,
        &deployed,
        "images.api.dockerfile",
        &["does not exist"],
    );
}

/// Asserts exit 2 with one `error:` line starting with the file and field and naming
/// `needles`.
fn one_error(out: &std::process::Output, file: &Path, field: &str, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let prefix = match field {
        "" => "error: ".to_string(),
        _ => format!("error: {}: {field}: ", file.display()),
    };
    assert!(stderr.starts_with(&prefix), "expected {prefix:?}: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "no {needle:?}: {stderr}");
    }
    stderr.trim_end().to_string()
}

#[test]
fn unset_variables_and_bad_overrides_are_usage_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = dir.path().join("polyarch.yaml");
    std::fs::write(&file, PROJECT).unwrap();
    let polyarch = || {
        let mut cmd = polyarch();
        cmd.env("REGISTRY", "127.0.0.1:1")
            .env("REPO_PATH", "values/never")
            .env_remove("VERSION");
        cmd
    };
    // The file's own message for a required variable.
    for command in ["build", "plan", "verify", "assemble"] {
        let mut cmd = polyarch();
        cmd.args([command, "-f"]).arg(&file);
        if command == "assemble" {
            cmd.arg("part.json");
        }
        one_error(
            &run(&mut cmd),
            &file,
            "images.api.tags[0]",
            &["variable VERSION is not set: the release version, e.g. v1.4.3;"],
        );
    }
    // plan reads the file as build does, --set included.
    let out = run(polyarch()
        .args(["plan", "-f"])
        .arg(&file)
        .args(["--set", "*.platform=linux/arm64", "--output-format", "json"])
        .env("VERSION", "v1"));
    let lines = ok(&out);
    let planned: Vec<&str> = lines
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["platform"].as_str().unwrap())
        .collect();
    assert_eq!(planned, ["linux/arm64"]);
    // A variable without a default, where --set does not replace it.
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .args(["--set", "api.tags=v1"])
        .env("VERSION", "v1")
        .env_remove("REPO_PATH"));
    one_error(
        &out,
        &file,
        "images.api.repository",
        &["variable REPO_PATH is not set", "${REPO_PATH:-default}"],
    );
    // Bad --set values: each named, nothing else said.
    let with = |set: &str| {
        run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .args(["--set", set])
            .env("VERSION", "v1"))
    };
    one_error(
        &with("apx.tags=v1"),
        &file,
        "",
        &[
            "--set apx.tags=v1: no image of",
            "named `apx`; its images are api",
        ],
    );
    one_error(
        &with("api.tagz=v1"),
        &file,
        "",
        &[
            "--set api.tagz=v1: `tagz` is not a field",
            "did you mean tags?",
        ],
    );
    one_error(
        &with("api.tags=bad tag"),
        &file,
        "images.api.tags[0]",
        &[
            "not a valid tag",
            "(the value came from --set api.tags=bad tag)",
        ],
    );
    let out = with("api.tags");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: invalid value 'api.tags' for '--set <IMAGE.FIELD=VALUE>'")
            && stderr.contains("is not IMAGE.FIELD=VALUE"),
        "{stderr}"
    );
}

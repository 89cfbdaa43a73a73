//! bake and compose files as project files: `polyarch build -f docker-bake.hcl` builds
//! and pushes each target of the default group as one index of exactly its platforms, and
//! a compose file with no `-f` is found and planned.

mod support;

use std::process::Output;
use support::{
    hello_context, platforms_of, polyarch, run, skopeo_inspect_raw, unique_name, Registry, HELLO,
};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bake_file_pushes_each_target_as_an_index_of_its_platforms() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let (app, tool) = (
        registry.repo(&unique_name("bake/app")),
        registry.repo(&unique_name("bake/tool")),
    );
    std::fs::write(
        dir.path().join("docker-bake.hcl"),
        format!(
            r#"variable "TAG" {{ default = "dev" }}
group "default" {{ targets = ["app", "tool"] }}
target "_common" {{
  context = "."
  platforms = ["linux/amd64", "linux/arm64"]
}}
target "app" {{
  inherits = ["_common"]
  tags = ["{app}:${{TAG}}"]
}}
target "tool" {{
  inherits = ["_common"]
  tags = ["{tool}:${{TAG}}"]
  platforms = ["linux/arm64"]
  output = ["type=registry"]
}}
"#
        ),
    )
    .unwrap();

    let out = run(polyarch()
        .current_dir(dir.path())
        .args(["build", "-f", "docker-bake.hcl"])
        .env("TAG", "v1")
        .env("CI", "true"));
    assert_eq!(out.status.code(), Some(0), "build: {}", stderr(&out));
    assert_eq!(
        platforms_of(&skopeo_inspect_raw(&format!("{app}:v1"))),
        ["linux/amd64", "linux/arm64"]
    );
    assert_eq!(
        platforms_of(&skopeo_inspect_raw(&format!("{tool}:v1"))),
        ["linux/arm64"]
    );
}

#[test]
fn a_compose_file_is_found_without_f_and_planned() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  web:\n    image: 127.0.0.1:5000/compose/web:v1\n    build:\n      context: .\n      platforms: [linux/amd64, linux/arm64]\n  db:\n    image: postgres:16\n",
    )
    .unwrap();
    let out = run(polyarch()
        .current_dir(dir.path())
        .args(["plan", "--output-format", "json"]));
    assert_eq!(out.status.code(), Some(0), "plan: {}", stderr(&out));
    let lines: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let planned: Vec<String> = lines
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{} {}", l["image"], l["platform"]))
        .collect();
    assert_eq!(
        planned,
        [r#""web" "linux/amd64""#, r#""web" "linux/arm64""#]
    );

    // A build key polyarch cannot honour is refused by name, exit 2.
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  web:\n    image: 127.0.0.1:5000/compose/web:v1\n    build:\n      context: .\n      isolation: hyperv\n",
    )
    .unwrap();
    let out = run(polyarch().current_dir(dir.path()).args(["plan"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("compose.yaml: services.web.build.isolation: polyarch cannot honour it"),
        "{}",
        stderr(&out)
    );
}

use crate::project::{LoadOptions, Project, ProjectError, Purpose};
use std::path::Path;

fn env(name: &str) -> Option<String> {
    match name {
        "TAG" => Some("v9".into()),
        "PUSH_SBOM" => Some("true".into()),
        _ => None,
    }
}

fn load(file: &str, text: &str, targets: &[String]) -> Result<Project, ProjectError> {
    let options = LoadOptions {
        purpose: Purpose::Verify,
        overrides: &[],
        env: &env,
        targets,
    };
    Project::parse(Path::new(file), text, &options)
}

/// One image as a line: name repository tags platforms args dockerfile target.
fn shown(project: &Project) -> Vec<String> {
    project
        .images
        .iter()
        .map(|i| {
            format!(
                "{} {} {} {} {:?} {} {}",
                i.name,
                i.repository,
                i.tags.join(","),
                i.platforms
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                i.build_args,
                i.dockerfile.display(),
                i.target.as_deref().unwrap_or("-"),
            )
        })
        .collect()
}

const BAKE: &str = r#"
variable "REG" { default = "reg.example.com" }
variable "TAG" { default = "dev" }
variable "PUSH_SBOM" { default = false }
group "default" { targets = ["app", "tools"] }
group "tools" { targets = ["cli"] }
target "_base" {
  args = { A = "1", B = "2" }
  platforms = ["linux/amd64", "linux/arm64"]
  cache-from = ["type=registry,ref=${REG}/cache:app"]
}
target "app" {
  inherits = ["_base"]
  args = { B = "3" }
  tags = ["${REG}/team/app:${TAG}", "${REG}/team/app:latest"]
  dockerfile = "build/Dockerfile"
  attest = ["type=provenance,mode=max", PUSH_SBOM ? "type=sbom" : "type=sbom,disabled=true"]
  output = ["type=registry"]
}
target "cli" {
  inherits = ["app"]
  tags = [replace("${REG}/team/app:cli", "app", "cli")]
  target = lower("CLI")
  platforms = ["linux/arm64"]
  dockerfile = target.app.dockerfile
}
"#;

#[test]
fn bake_files_resolve_as_bake_does() {
    let cases: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "docker-bake.hcl",
            BAKE,
            &[],
            &[
                r#"app reg.example.com/team/app v9,latest linux/amd64,linux/arm64 {"A": "1", "B": "3"} build/Dockerfile -"#,
                r#"cli reg.example.com/team/cli cli linux/arm64 {"A": "1", "B": "3"} build/Dockerfile cli"#,
            ],
        ),
        (
            "docker-bake.hcl",
            BAKE,
            &["tools"],
            &[r#"cli reg.example.com/team/cli cli linux/arm64 {"A": "1", "B": "3"} build/Dockerfile cli"#],
        ),
        (
            "docker-bake.json",
            r#"{"variable": {"TAG": {"default": "dev"}},
                "group": {"default": {"targets": ["app"]}},
                "target": {"app": {"tags": ["reg.example.com/app:${TAG}"], "platforms": ["linux/riscv64"], "args": {"N": 1}}}}"#,
            &[],
            &[r#"app reg.example.com/app v9 linux/riscv64 {"N": "1"} Dockerfile -"#],
        ),
        (
            // try() in bake's JSON form; a field the target does not set reads as null, as
            // bake's does, and a target's field is read once it is resolved, never skipped.
            "docker-bake.json",
            r#"{"variable": {"V": {"default": {"a": "1"}}, "TAG": {"default": "dev"}},
                "target": {
                  "app": {"tags": ["reg.example.com/app:${try(V.b, TAG)}"], "platforms": "${try(target.base.platforms, [])}",
                          "args": {"D": "${jsonencode(try(target.base.dockerfile, 1))}", "A": "${try(V.a, 0)}"}},
                  "base": {"tags": ["reg.example.com/base:1"], "platforms": ["linux/s390x"]}}}"#,
            &["app"],
            &[r#"app reg.example.com/app v9 linux/s390x {"A": "1", "D": "null"} Dockerfile -"#],
        ),
        (
            "compose.yaml",
            "services:\n  web:\n    image: reg.example.com/web:v1\n    build:\n      context: .\n      dockerfile: web.Dockerfile\n      args: [X=1]\n      target: prod\n      platforms: [linux/amd64]\n      tags: [reg.example.com/web:latest]\n  db:\n    image: postgres\n",
            &[],
            &[r#"web reg.example.com/web latest linux/amd64 {"X": "1"} web.Dockerfile prod"#],
        ),
        (
            "docker-compose.yml",
            "services:\n  api:\n    image: reg.example.com/api:${TAG}\n    build:\n      context: .\n      x-bake:\n        platforms: [linux/arm64]\n",
            &[],
            &[r#"api reg.example.com/api v9 linux/arm64 {} Dockerfile -"#],
        ),
    ];
    for (file, text, targets, expected) in cases {
        let targets: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        let project = load(file, text, &targets).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(shown(&project), *expected, "{file} {targets:?}");
    }
}

#[test]
fn bake_settings_map_onto_polyarch_s() {
    let project = load("docker-bake.hcl", BAKE, &["app".into()]).unwrap();
    let app = &project.images[0];
    assert!(app.provenance && app.sbom);
    assert_eq!(app.cache_from.len(), 1);
    assert_eq!(app.cache_from[0].to_string(), "reg.example.com/cache:app");
    assert_eq!(project.expand(&["tools".into()]), ["cli"]);
}

#[test]
fn what_polyarch_cannot_honour_is_refused_by_name() {
    let target = |body: &str| {
        format!(
            "group \"default\" {{ targets = [\"app\"] }}\ntarget \"app\" {{\n  tags = [\"reg.example.com/app:v1\"]\n  platforms = [\"linux/amd64\"]\n  {body}\n}}\n"
        )
    };
    let cases: Vec<(String, &str, &str)> = vec![
        (target("dockerfile-inline = \"FROM scratch\""), "target.app.dockerfile-inline", "Dockerfile file"),
        (target("call = \"check\""), "target.app.call", "frontend methods"),
        (target("entitlements = [\"network.host\"]"), "target.app.entitlements", "entitlement"),
        (target("name = \"app-1\""), "target.app.name", "without matrix"),
        (target("output = [\"type=docker\"]"), "target.app.output[0]", "does not load a Docker image"),
        (target("output = [\"type=oci,dest=out\"]"), "target.app.output[0]", "--output oci:DIR"),
        (target("attest = [\"type=sbom,generator=me/scanner\"]"), "target.app.attest[0]", "remove generator="),
        (target("cache-to = [\"type=local,dest=/tmp/c\"]"), "target.app.cache-to", "type=registry"),
        (target("frobnicate = true"), "target.app.frobnicate", "not a field polyarch reads"),
        (target("args = { A = nope(1) }"), "target.app.args", "nope(), a function polyarch does not provide"),
        (
            "target \"app\" {\n  tags = [\"a.example.com/x:1\", \"b.example.com/y:1\"]\n}\ngroup \"default\" { targets = [\"app\"] }\n".into(),
            "target.app.tags",
            "one index to one repository",
        ),
        (
            "target \"app\" {\n  platforms = [\"linux/amd64\"]\n}\ngroup \"default\" { targets = [\"app\"] }\n".into(),
            "target.app.tags",
            "is missing",
        ),
        (
            "function \"f\" {\n  params = [x]\n  result = f(x)\n}\ngroup \"default\" { targets = [\"app\"] }\ntarget \"app\" {\n  args = { A = f(1) }\n}\n".into(),
            "target.app.args",
            "more than 32 deep",
        ),
        (
            "target \"app\" {\n  inherits = [\"app\"]\n}\n".into(),
            "target.app.inherits",
            "inherits from itself",
        ),
        (
            "target \"app\" {\n  tags = [\"reg.example.com/app:v1\"]\n}\n".into(),
            "",
            "no `default` group",
        ),
        (
            "group \"default\" { targets = [\"app\"] }\ntarget \"app\" {\n  tags = [\"reg.example.com/app:v1\"]\n  platforms = [\"linux/amd64\", \"windows/amd64\"]\n}\n".into(),
            "target.app.platforms[1]",
            "",
        ),
        (target("args = { \"A B\" = \"1\" }"), "target.app.args.A B", "not a build argument name"),
        (
            "group \"default\" { targets = [\"app\"] }\ntarget \"app\" {\n  tags = [\"reg.example.com/app:v1\"]\n}\n".into(),
            "target.app.platforms",
            "--set 'app.platforms=linux/amd64,linux/arm64'",
        ),
    ];
    for (text, field, wording) in &cases {
        match load("docker-bake.hcl", text, &[]) {
            Err(ProjectError::File {
                field: got,
                message,
                ..
            }) => {
                assert_eq!(got, *field, "{text}: {message}");
                assert!(message.contains(wording), "{text}: {message}");
            }
            other => panic!("{text}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn compose_build_keys_polyarch_cannot_honour_are_refused_by_name() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "services:\n  web:\n    image: reg.example.com/web:v1\n    build:\n      context: .\n      isolation: hyperv\n",
            "services.web.build.isolation",
            "polyarch cannot honour it",
        ),
        (
            "services:\n  web:\n    image: reg.example.com/web:v1\n    build:\n      context: .\n      secrets: [token]\n",
            "services.web.build.secrets",
            "does not declare",
        ),
    ];
    for (text, field, wording) in cases {
        match load("compose.yaml", text, &[]) {
            Err(ProjectError::File {
                field: got,
                message,
                ..
            }) => {
                assert_eq!(got, *field, "{text}: {message}");
                assert!(message.contains(wording), "{text}: {message}");
            }
            other => panic!("{text}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn compose_secrets_come_from_the_top_level_declaration() {
    let text = "services:\n  web:\n    image: reg.example.com/web:v1\n    build:\n      context: .\n      platforms: [linux/amd64]\n      secrets: [token, {source: key}]\nsecrets:\n  token:\n    environment: API_TOKEN\n  key:\n    file: ./key.txt\n";
    let project = load("compose.yaml", text, &[]).unwrap();
    let ids: Vec<&String> = project.images[0].secrets.keys().collect();
    assert_eq!(ids, ["key", "token"]);
}

#[test]
fn bake_contexts_and_compose_additional_contexts_are_named_contexts() {
    use crate::project::contexts::NamedContext;
    let bake = "group \"default\" {\n  targets = [\"app\", \"base\"]\n}\ntarget \"base\" {\n  tags = [\"reg.example.com/base:v1\"]\n  platforms = [\"linux/amd64\"]\n}\ntarget \"app\" {\n  tags = [\"reg.example.com/app:v1\"]\n  platforms = [\"linux/amd64\"]\n  contexts = { assets = \"./assets\", tools = \"docker-image://reg.example.com/tools:1\", base = \"target:base\" }\n}\n";
    let project = load("/src/docker-bake.hcl", bake, &[]).unwrap();
    let app = project.images.iter().find(|i| i.name == "app").unwrap();
    assert_eq!(
        app.contexts,
        std::collections::BTreeMap::from([
            (
                "assets".to_string(),
                NamedContext::Dir("/src/assets".into())
            ),
            ("base".to_string(), NamedContext::Target("base".into())),
            (
                "tools".to_string(),
                NamedContext::Image("reg.example.com/tools:1".into())
            ),
        ])
    );

    let compose = "services:\n  base:\n    image: reg.example.com/base:v1\n    build: {context: ., platforms: [linux/amd64]}\n  web:\n    image: reg.example.com/web:v1\n    build:\n      context: .\n      platforms: [linux/amd64]\n      additional_contexts: {base: \"service:base\"}\n";
    let project = load("/src/compose.yaml", compose, &[]).unwrap();
    let web = project.images.iter().find(|i| i.name == "web").unwrap();
    assert_eq!(
        web.contexts.get("base"),
        Some(&NamedContext::Target("base".into()))
    );
}

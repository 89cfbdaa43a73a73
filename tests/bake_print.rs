//! `polyarch plan --print` against `docker buildx bake --print` (buildx 0.29.1, Docker 28.5
//! from Debian sid, installed by scripts/engine28.sh; `bake --print` needs no builder):
//! for each file set below, both run in the same directory with the same arguments and
//! environment, and their JSON must be equal, group for group and target for target.
//! The cases exercise each feature polyarch reads in bake and compose files. This never
//! skips: without buildx the install fails the test.

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use support::engines::docker28_client;
use support::{polyarch, run};

/// One file set: its files, the arguments after `--print` (`-f`, target names) and the
/// environment both run with.
struct Case {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const FULL: &str = r#"
variable "REG" { default = "reg.example.com" }
variable "TAG" { default = "dev" }
variable "SBOM" { default = false }
group "default" { targets = ["tools", "app"] }
group "tools" {
  description = "the tools"
  targets = ["cli"]
}
target "_base" {
  args = { A = "1", B = "2", GONE = null }
  platforms = ["linux/amd64", "linux/arm64"]
  cache-from = ["type=registry,ref=${REG}/cache:app", "${REG}/cache:bare"]
  cache-to = ["type=registry,ref=${REG}/cache:app,mode=max"]
  attest = ["type=provenance,mode=min"]
  secret = ["id=tok,src=tok.txt"]
}
target "app" {
  inherits = ["_base"]
  description = "the app"
  args = { B = "3", NUM = 1 }
  labels = { "org.opencontainers.image.title" = "app", FLAG = true }
  annotations = ["index:org.opencontainers.image.vendor=me"]
  tags = ["${REG}/team/app:${TAG}", "${REG}/team/app:latest"]
  dockerfile = "build/Dockerfile"
  attest = ["type=provenance,mode=max", SBOM ? "type=sbom" : "type=sbom,disabled=true"]
  output = ["type=registry"]
  secret = ["id=env,env=APP_TOKEN", "id=tok,src=./tok.txt"]
  ssh = ["key=id_test"]
  network = "host"
  no-cache = true
  pull = false
  target = "final"
}
target "cli" {
  inherits = ["app"]
  context = "cli"
  tags = [replace("${REG}/team/app:cli", "app", "cli")]
  target = lower("CLI")
  platforms = ["linux/arm64"]
  dockerfile = target.app.dockerfile
  network = "none"
}
"#;

const JSON: &str = r#"{
  "variable": { "TAG": { "default": "v2" } },
  "group": { "default": { "targets": ["web"] } },
  "target": {
    "base": { "platforms": ["linux/amd64"], "args": { "X": "1" } },
    "web": {
      "inherits": ["base"],
      "tags": ["reg.example.com/web:${TAG}"],
      "args": { "Y": "${TAG}" },
      "cache-to": ["type=registry,ref=reg.example.com/web:cache"]
    }
  }
}"#;

const COMPOSE: &str = r#"
services:
  web:
    image: reg.example.com/web:${TAG:-v1}
    build:
      context: .
      dockerfile: web.Dockerfile
      args: [A=1, B=two]
      target: run
      labels: {team: web}
      platforms: [linux/amd64, linux/arm64]
      secrets: [tok]
      additional_contexts:
        assets: ./src
        base: docker-image://alpine:3.20
        w: service:worker
      x-bake:
        pull: true
        cache-from: [reg.example.com/web:cache]
  worker:
    image: reg.example.com/worker:v1
    build:
      context: ./worker
      tags: [reg.example.com/worker:edge]
      no_cache: true
  db:
    image: postgres:16
secrets:
  tok:
    file: ./tok.txt
"#;

const OVERRIDE_BASE: &str = r#"
variable "TAG" { default = "base" }
group "default" { targets = ["app"] }
target "app" {
  tags = ["reg.example.com/app:${TAG}"]
  args = { A = "1", B = "2" }
  platforms = ["linux/amd64"]
}
"#;

const OVERRIDE: &str = r#"
variable "TAG" { default = "override" }
target "app" {
  args = { B = "3" }
  platforms = ["linux/arm64"]
}
target "extra" { tags = ["reg.example.com/extra:1"] }
"#;

const MATRIX: &str = r#"
group "default" { targets = ["app", "plain"] }
target "app" {
  name = "app-${tgt}-${replace(ver, ".", "-")}"
  matrix = {
    tgt = ["release", "debug"]
    ver = ["1.0", "2.1"]
  }
  target = tgt
  args = { VERSION = ver }
  tags = ["reg.example.com/app:${tgt}-${ver}"]
}
target "plain" {
  name = "plain-${item.n}"
  matrix = { item = [{ n = "a", p = "linux/amd64" }, { n = "b", p = "linux/arm64" }] }
  platforms = [item.p]
  tags = ["reg.example.com/plain:${item.n}"]
}
"#;

const FUNCTIONS: &str = r#"
variable "REPO" { default = "reg.example.com/fn" }
variable "VERSION" { default = "1.2.3" }
function "tag" {
  params = [name, version]
  result = "${REPO}/${name}:${version}"
}
function "tags" {
  params = [name]
  variadic_params = versions
  result = [for v in versions : tag(name, v)]
}
function "major" {
  params = [v]
  result = split(".", v)[0]
}
group "default" { targets = ["app"] }
target "app" {
  tags = tags("app", VERSION, major(VERSION), "latest")
  args = {
    UP = upper("abc")
    TITLE = title("hello world")
    SUB = substr("abcdef", 1, 3)
    FMT = format("%s-%03d", "v", 7)
    JOINED = join(",", sort(distinct(["b", "a", "b"])))
    LEN = length(["x", "y"])
    MAX = max(3, 9, 2)
    MIN = min(3, 9, 2)
    ABS = absolute(-4)
    CEIL = ceil(1.2)
    FLOOR = floor(1.8)
    POW = pow(2, 10)
    B64 = base64encode("polyarch")
    UNB64 = base64decode("cG9seWFyY2g=")
    JSON = jsonencode({ a = 1, b = ["x"] })
    FROMJSON = jsondecode("{\"k\": \"v\"}").k
    URL = urlencode("a b&c")
    CONTAINS = contains(["a", "b"], "b")
    KEYS = join(",", keys({ z = 1, y = 2 }))
    LOOKUP = lookup({ a = "1" }, "b", "fallback")
    ELEMENT = element(["a", "b", "c"], 4)
    MERGED = jsonencode(merge({ a = 1 }, { b = 2 }))
    FLAT = join(",", flatten([["a"], ["b", ["c"]]]))
    REVERSED = join(",", reverselist(["1", "2", "3"]))
    SLICE = join(",", slice(["a", "b", "c", "d"], 1, 3))
    RANGE = jsonencode(range(3))
    TRIM = trim("--x--", "-")
    CHOMP = chomp("line\n")
    INDENT = indent(2, "a\nb")
    REGEX = regex_replace("v1.2.3", "[.]", "_")
    SHA = sha256("polyarch")
    COALESCE = coalesce("", "second")
    COMPACT = join(",", compact(["a", "", "b"]))
    ZIP = jsonencode(zipmap(["a", "b"], [1, 2]))
    DATE = formatdate("YYYY-MM-DD", "2024-03-05T10:20:30Z")
    TSADD = timeadd("2024-01-01T00:00:00Z", "36h")
    SANITIZE = sanitize("a/b:c")
    INT = int(3.9)
    PARSEINT = parseint("ff", 16)
    STRLEN = strlen("héllo")
    SIGNUM = signum(-3)
    LOG = log(16, 2)
    CSV = jsonencode(csvdecode("a,b\n1,2\n"))
    SETUNION = join(",", setunion(["a"], ["b"]))
    VALUES = join(",", values({ a = "1", b = "2" }))
    HAS = hasindex(["a"], 0)
    NOTEQ = notequal(1, 2)
    FMTLIST = jsonencode(formatlist("%s-%s", ["a", "b"], "x"))
    REGEXGROUPS = jsonencode(regex("(?P<maj>\\d+)\\.(?P<min>\\d+)", "v12.3"))
    REGEXALL = jsonencode(regexall("[0-9]", "a1b2"))
  }
}
"#;

const VALIDATION: &str = r#"
variable "PORT" {
  default = 8080
  validation {
    condition = PORT > 1024
    error_message = "PORT must be above 1024"
  }
}
variable "DEBUG" { default = false }
variable "NAME" { default = "svc" }
group "default" { targets = ["app"] }
target "app" {
  tags = ["reg.example.com/${NAME}:${PORT}"]
  args = {
    PORT = PORT, NEXT = PORT + 1, DEBUG = DEBUG ? "yes" : "no"
    WHERE = BAKE_CMD_CONTEXT, LOCAL = BAKE_LOCAL_PLATFORM
  }
}
"#;

const CONTEXTS: &str = r#"
group "default" { targets = ["app"] }
target "base" {
  tags = ["reg.example.com/base:1"]
}
target "app" {
  tags = ["reg.example.com/app:1"]
  contexts = {
    base = "target:base"
    alpine = "docker-image://alpine:3.20"
    src = "./src"
  }
}
"#;

/// try() and can(): fallbacks hit and not, in variable defaults, a validation, a user
/// function, target fields, a `for`, a matrix and its name; forward references
/// (`LATER`, `target.app.args.APP` from `worker`) resolved before a try may fall back.
const TRY: &str = r#"
variable "REGISTRY" { default = try(CUSTOM_REGISTRY, "reg.example.com") }
variable "TAG" { default = "v1.2.3" }
variable "VERSIONS" { default = { app = "1.0" } }
variable "EXTRA" { default = try(VERSIONS.extra, "none") }
variable "APPV" { default = try(VERSIONS["app"], "0") }
variable "LATER" { default = try(DECLARED_AFTER, "early") }
variable "DECLARED_AFTER" { default = "late" }
variable "PORT" {
  default = "8080"
  validation {
    condition = can(regex("^[0-9]+$", PORT))
    error_message = "PORT must be a number"
  }
}
function "version_of" {
  params = [name]
  result = try(VERSIONS[name], "0.0")
}
group "default" { targets = ["worker", "app", "flavours"] }
target "worker" {
  tags = try(target.worker-tags.tags, ["${REGISTRY}/worker:${APPV}"])
  labels = { "from.app" = try(target.app.args.APP, "none"), "port" = PORT }
  platforms = try(target.app.platforms, ["linux/amd64"])
}
target "base" {
  tags = ["reg.example.com/base:1"]
  platforms = ["linux/amd64", "linux/arm64"]
}
target "app" {
  tags = ["${REGISTRY}/app:${TAG}", "${REGISTRY}/app:${try(regex("^v([0-9]+)", TAG)[0], "dev")}"]
  platforms = try(target.base.platforms, ["linux/amd64"])
  args = {
    EXTRA = EXTRA
    APPV = APPV
    LATER = LATER
    RELEASE = can(regex("^v[0-9]", TAG))
    SNAPSHOT = can(regex("-snapshot$", TAG))
    WORKER = version_of("worker")
    APP = version_of("app")
    BASE_ARGS = jsonencode(try(target.base.args, {}))
    MISSING = try(target.nope.tags[0], "no target")
    LIST = join(",", [for k in ["app", "worker"] : try(VERSIONS[k], "-")])
    NESTED = try(try(VERSIONS.a, VERSIONS.b), try(VERSIONS.c, "inner"))
  }
}
target "flavours" {
  name = "flavour-${f}"
  matrix = { f = try(FLAVOURS, ["slim", "full"]) }
  tags = ["reg.example.com/flavour:${f}-${try({ slim = "s" }[f], f)}"]
  args = { OK = can({ slim = "s" }[f]) }
}
"#;

const CASES: &[Case] = &[
    Case {
        name: "every target field, groups, inherits, variables, target.NAME.attr",
        files: &[("docker-bake.hcl", FULL)],
        args: &[],
        env: &[("TAG", "v7"), ("SBOM", "true"), ("APP_TOKEN", "x")],
    },
    Case {
        name: "targets and groups named on the command line",
        files: &[("docker-bake.hcl", FULL)],
        args: &["-f", "docker-bake.hcl", "tools", "app"],
        env: &[],
    },
    Case {
        name: "bake's JSON form",
        files: &[("docker-bake.json", JSON)],
        args: &[],
        env: &[],
    },
    Case {
        name: "a compose file with x-bake",
        files: &[("compose.yaml", COMPOSE)],
        args: &[],
        env: &[("TAG", "v3")],
    },
    Case {
        name: "several -f merged in order",
        files: &[("base.hcl", OVERRIDE_BASE), ("more.hcl", OVERRIDE)],
        args: &["-f", "base.hcl", "-f", "more.hcl", "app", "extra"],
        env: &[],
    },
    Case {
        name: "the default search reads docker-bake.override.hcl too",
        files: &[
            ("docker-bake.hcl", OVERRIDE_BASE),
            ("docker-bake.override.hcl", OVERRIDE),
        ],
        args: &[],
        env: &[],
    },
    Case {
        name: "matrix and name",
        files: &[("docker-bake.hcl", MATRIX)],
        args: &[],
        env: &[],
    },
    Case {
        name: "a matrix target named on the command line",
        files: &[("docker-bake.hcl", MATRIX)],
        args: &["app-debug-2-1", "plain"],
        env: &[],
    },
    Case {
        name: "user functions and bake's standard library",
        files: &[("docker-bake.hcl", FUNCTIONS)],
        args: &[],
        env: &[("VERSION", "4.5.6")],
    },
    Case {
        name: "validation and typed environment overrides",
        files: &[("docker-bake.hcl", VALIDATION)],
        args: &[],
        env: &[("PORT", "9000"), ("DEBUG", "true")],
    },
    Case {
        name: "named contexts, a target: link pulled in",
        files: &[("docker-bake.hcl", CONTEXTS)],
        args: &[],
        env: &[],
    },
    Case {
        name: "try and can",
        files: &[("docker-bake.hcl", TRY)],
        args: &[],
        env: &[],
    },
    Case {
        name: "try and can, other fallbacks taken from the environment's values",
        files: &[("docker-bake.hcl", TRY)],
        args: &[],
        env: &[("TAG", "1.0-snapshot"), ("PORT", "9090")],
    },
];

/// A fresh directory with the case's files and what bake checks exists (the secret's
/// file, an ssh key, the contexts).
fn prepare(case: &Case) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in case.files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::write(dir.path().join("tok.txt"), "secret\n").unwrap();
    for sub in ["cli", "worker", "src", "build"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let key = run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(dir.path().join("id_test")));
    assert!(key.status.success(), "ssh-keygen: {key:?}");
    dir
}

/// The command with only the case's environment (and PATH, HOME), run in `dir`.
fn with_case(cmd: &mut Command, dir: &Path, case: &Case) -> Output {
    let own: Vec<_> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    cmd.current_dir(dir)
        .env_clear()
        .envs(own)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(case.env.iter().copied());
    run(cmd)
}

fn json(what: &str, case: &Case, out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{what} for {:?} failed ({}):\n{}",
        case.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what} for {:?} printed no JSON ({e}):\n{}",
            case.name,
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn plan_print_equals_buildx_bake_print() {
    let mut failures = Vec::new();
    for case in CASES {
        let dir = prepare(case);
        let bake = json(
            "docker buildx bake --print",
            case,
            &with_case(
                docker28_client()
                    .args(["buildx", "bake", "--print"])
                    .args(case.args),
                dir.path(),
                case,
            ),
        );
        let ours = with_case(
            polyarch().args(["plan", "--print"]).args(case.args),
            dir.path(),
            case,
        );
        if !ours.status.success() {
            failures.push(format!(
                "{}: polyarch plan --print failed: {}",
                case.name,
                String::from_utf8_lossy(&ours.stderr).trim()
            ));
            continue;
        }
        let (mut bake, mut ours) = (bake, json("polyarch plan --print", case, &ours));
        sort_group_targets(&mut bake);
        sort_group_targets(&mut ours);
        for part in ["group", "target"] {
            let (theirs, mine) = (&bake[part], &ours[part]);
            let names = |v: &Value| -> Vec<String> {
                v.as_object()
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default()
            };
            let mut all = names(theirs);
            all.extend(names(mine));
            all.sort();
            all.dedup();
            for name in all {
                if theirs.get(&name) != mine.get(&name) {
                    failures.push(format!(
                        "{}: {part} {name}:\n  bake:     {}\n  polyarch: {}",
                        case.name,
                        theirs.get(&name).map_or("(none)".into(), Value::to_string),
                        mine.get(&name).map_or("(none)".into(), Value::to_string),
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A group's members compare as a set: bake expands a matrix by ranging over a Go map,
/// so a matrix with two keys lists its targets in either key order from run to run
/// (buildx's own tests use ElementsMatch), and the order builds nothing differently.
fn sort_group_targets(print: &mut Value) {
    let Some(groups) = print.get_mut("group").and_then(Value::as_object_mut) else {
        return;
    };
    for group in groups.values_mut() {
        if let Some(targets) = group.get_mut("targets").and_then(Value::as_array_mut) {
            targets.sort_by_key(Value::to_string);
        }
    }
}

/// A field polyarch cannot honour is refused by name by --print too (exit 2), never
/// printed as if it would be built.
#[test]
fn plan_print_refuses_what_polyarch_cannot_honour() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("docker-bake.hcl"),
        "target \"default\" {\n  tags = [\"reg.example.com/a:1\"]\n  shm-size = \"2g\"\n}\n",
    )
    .unwrap();
    let out = run(polyarch().current_dir(dir.path()).args(["plan", "--print"]));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("docker-bake.hcl: target.default.shm-size: polyarch cannot honour it"),
        "{stderr}"
    );
}

/// Runs `case` through both, which must fail: bake saying `bake_says`, polyarch with
/// exit 2 and `we_say` on stderr.
fn fails_both(case: &Case, bake_says: &str, we_say: &str) {
    let dir = prepare(case);
    let bake = with_case(
        docker28_client().args(["buildx", "bake", "--print"]),
        dir.path(),
        case,
    );
    assert!(!bake.status.success(), "bake accepted {:?}", case.name);
    let stderr = String::from_utf8_lossy(&bake.stderr);
    assert!(stderr.contains(bake_says), "{stderr}");
    let ours = with_case(polyarch().args(["plan", "--print"]), dir.path(), case);
    assert_eq!(ours.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&ours.stderr);
    assert!(stderr.contains(we_say), "{stderr}");
}

/// A variable its validation refuses fails both: bake with its message, polyarch with
/// exit 2 naming the variable and the same message.
#[test]
fn a_refused_variable_fails_both() {
    let case = &Case {
        name: "validation refuses PORT=80",
        files: &[("docker-bake.hcl", VALIDATION)],
        args: &[],
        env: &[("PORT", "80")],
    };
    fails_both(
        case,
        "PORT must be above 1024",
        "variable.PORT.validation: PORT must be above 1024",
    );
}

/// A try() none of whose expressions succeeds fails both: bake saying no expression
/// succeeded, polyarch with exit 2 naming the field and saying the same.
#[test]
fn a_try_with_no_expression_that_succeeds_fails_both() {
    let case = &Case {
        name: "every try expression fails",
        files: &[(
            "docker-bake.hcl",
            r#"
variable "VERSIONS" { default = { app = "1.0" } }
target "default" {
  tags = ["reg.example.com/app:${try(VERSIONS.worker, UNDECLARED)}"]
}
"#,
        )],
        args: &[],
        env: &[],
    };
    fails_both(
        case,
        "no expression succeeded",
        "docker-bake.hcl: target.default.tags: calls try(), and no expression succeeded",
    );
}

/// `polyarch init` over every case above: the polyarch.yaml it writes (in another
/// directory, read with an empty environment) declares the images the original plans,
/// each with the same settings: tags, platforms, context, Dockerfile, args, labels,
/// annotations, secrets, SSH, cache, named contexts, switches.
#[test]
fn init_writes_a_polyarch_yaml_that_plans_as_the_original() {
    use polyarch::project::{ImageSpec, LoadOptions, Project, Purpose};
    let mut failures = Vec::new();
    for case in CASES {
        let dir = prepare(case);
        let (files, targets): (Vec<&str>, Vec<String>) = {
            let mut files = Vec::new();
            let mut targets = Vec::new();
            let mut args = case.args.iter();
            while let Some(arg) = args.next() {
                match *arg {
                    "-f" => files.push(*args.next().unwrap()),
                    name => targets.push(name.to_string()),
                }
            }
            (files, targets)
        };
        let mut init = polyarch();
        init.arg("init");
        for file in &files {
            init.args(["--from", file]);
        }
        // bake builds a target without platforms for this machine; polyarch needs them.
        let set: Vec<polyarch::project::Override> =
            vec!["*.platforms=linux/amd64".parse().unwrap()];
        let out = with_case(
            init.args(&targets)
                .args(["--set", "*.platforms=linux/amd64"])
                .args(["-o", "out/deep/polyarch.yaml"]),
            dir.path(),
            case,
        );
        if !out.status.success() {
            failures.push(format!(
                "{}: polyarch init failed: {}",
                case.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let written = dir.path().join("out/deep/polyarch.yaml");
        let generated = Project::load(
            &written,
            &LoadOptions {
                purpose: Purpose::Verify,
                env: &|_| None,
                ..LoadOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{}: the written file does not load: {e}", case.name));
        let names: Vec<String> = generated.images.iter().map(|i| i.name.clone()).collect();
        let paths: Vec<std::path::PathBuf> = match files.as_slice() {
            [] => case.files.iter().map(|(f, _)| dir.path().join(f)).collect(),
            given => given.iter().map(|f| dir.path().join(f)).collect(),
        };
        let env = |name: &str| {
            case.env
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let load = |targets: &[String]| {
            Project::load_files(
                &paths,
                &LoadOptions {
                    purpose: Purpose::Verify,
                    env: &env,
                    targets,
                    overrides: &set,
                },
            )
            .unwrap_or_else(|e| panic!("{}: the original does not load: {e}", case.name))
        };
        for planned in &load(&targets).images {
            if !names.contains(&planned.name) {
                failures.push(format!("{}: {} is not written", case.name, planned.name));
            }
        }
        let original = load(&names);
        let view = |image: &ImageSpec| {
            use polyarch::docker::buildkit::secrets::SecretSource;
            use polyarch::docker::buildkit::ssh::AgentSocket;
            use polyarch::project::contexts::NamedContext;
            use polyarch::project::Origin;
            let real = |p: &std::path::Path| p.canonicalize().unwrap_or(p.to_path_buf());
            let mut image = image.clone();
            image.context = real(&image.context);
            for secret in image.secrets.values_mut() {
                secret.origin = Origin::Field(String::new());
                if let SecretSource::File(path) = &secret.source {
                    secret.source = SecretSource::File(real(path));
                }
            }
            for agent in image.ssh.values_mut() {
                agent.origin = Origin::Field(String::new());
                if let AgentSocket::Path(path) = &agent.socket {
                    agent.socket = AgentSocket::Path(real(path));
                }
            }
            for context in image.contexts.values_mut() {
                if let NamedContext::Dir(path) = context {
                    *context = NamedContext::Dir(real(path));
                }
            }
            format!("{image:#?}")
        };
        for (theirs, mine) in original.images.iter().zip(&generated.images) {
            if view(theirs) != view(mine) {
                failures.push(format!(
                    "{}: image {}:\n  original: {}\n  written:  {}\n{}",
                    case.name,
                    theirs.name,
                    view(theirs),
                    view(mine),
                    std::fs::read_to_string(&written).unwrap()
                ));
            }
        }
        if original.images.len() != generated.images.len() {
            failures.push(format!("{}: image counts differ", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! Running one case through the CLI only: build, mutate, rerun, rerun with `--rebuild`,
//! compare what was published; optionally build the final tree with the Docker CLI
//! (Docker 26.1's CLI with buildx 0.13.1) on the same engine and compare the files.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use crate::layers;
use crate::model::{self, Case, Layout};
use crate::support;

/// Where and with what cases run.
pub struct Env {
    pub registry_host: String,
    /// The polyarch binary (the one cargo built, or POLYARCH_DIFF_BIN).
    pub bin: PathBuf,
    /// Parent of the cases' temporary directories.
    pub work: PathBuf,
    /// The engine polyarch builds on (None: the default, /var/run/docker.sock).
    pub docker_host: Option<String>,
    /// That engine's Dockerfile frontend knows `COPY --link` and heredocs.
    pub modern: bool,
    /// SOURCE_DATE_EPOCH for every build, where the engine keeps no build cache.
    pub epoch: Option<u64>,
    /// The Docker CLI for the comparison, when available.
    pub buildx: Option<Buildx>,
}

/// `docker buildx build` (Docker 26.1's CLI, buildx 0.13.1) aimed at polyarch's engine.
pub struct Buildx {
    /// The 26.1 `docker` binary.
    pub docker: PathBuf,
    /// A private DOCKER_CONFIG holding cli-plugins/docker-buildx.
    pub config: PathBuf,
    /// `oci` where the engine exports OCI layouts (containerd image store), else `tar`
    /// (the root file system: the docker driver on a classic store exports nothing else).
    pub output: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Published { digest: String, reused: bool },
    Failed { code: Option<i32>, message: String },
}

impl Outcome {
    pub fn digest(&self) -> Option<&str> {
        match self {
            Outcome::Published { digest, .. } => Some(digest),
            _ => None,
        }
    }
    /// What must agree between the reruns: the digest, or the exit code and the kind of
    /// failure (`error: build of IMAGE for PLATFORM failed`, `error: export of IMAGE`, …).
    /// BuildKit runs independent steps in parallel, so when several fail, which one it
    /// reports varies from run to run: the engine's own text is not compared.
    fn same(&self, other: &Outcome) -> bool {
        match (self, other) {
            (Outcome::Published { digest: a, .. }, Outcome::Published { digest: b, .. }) => a == b,
            (
                Outcome::Failed {
                    code: ca,
                    message: ma,
                },
                Outcome::Failed {
                    code: cb,
                    message: mb,
                },
            ) => ca == cb && failure_kind(ma) == failure_kind(mb),
            _ => false,
        }
    }
}

/// The first two `:`-separated fields of polyarch's error line.
fn failure_kind(message: &str) -> String {
    message.splitn(3, ':').take(2).collect::<Vec<_>>().join(":")
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Published { digest, reused } => write!(
                f,
                "published {digest}{}",
                if *reused {
                    " (build reused: inputs unchanged)"
                } else {
                    ""
                }
            ),
            Outcome::Failed { code, message } => write!(f, "failed (exit {code:?}): {message}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Disagreement {
    /// `stale`, `outcome`, `failure`, `tag`, `buildx-files`, `buildx-outcome`
    pub category: String,
    pub detail: String,
    /// For a disagreement where one side failed: the category and that failure with
    /// quoted names and steps left out, so that one defect met again in other cases is
    /// recognised (and not shrunk and saved again).
    pub signature: Option<String>,
}

/// `text` without what varies from case to case: quoted or back-quoted words.
pub fn signature_of(category: &str, side: &str, text: &str) -> String {
    let mut out = format!("{category}: {side}: ");
    let mut quote = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '`' => {
                quote = Some(c);
                out.push('…');
            }
            None => out.push(c),
        }
    }
    out
}

fn failed_signature(category: &str, side: &str, outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Failed { message, .. } => Some(signature_of(category, side, message)),
        _ => None,
    }
}

pub struct CaseResult {
    pub cold: Outcome,
    pub normal: Outcome,
    /// Whether each mutation applied (a mutation whose path is gone is a no-op).
    pub applied: Vec<bool>,
    /// None: not compared with the Docker CLI; Some(true): both built, same files;
    /// Some(false): both failed.
    pub compared: Option<bool>,
    pub disagreement: Option<Disagreement>,
    pub seconds: f64,
}

/// Replaces run-specific parts of an error message (paths, digests, BuildKit refs and
/// temporary mount names).
pub fn normalise(message: &str, root: &Path, registry: &str) -> String {
    let mut text = message.replace(&*root.to_string_lossy(), "<dir>");
    // `HOST:PORT/diff/c-…` (each case has a repository of its own).
    while let Some(i) = text.find(registry) {
        let rest = &text[i + registry.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._/-".contains(c)))
            .unwrap_or(rest.len());
        text = format!("{}<repository>{}", &text[..i], &rest[end..]);
    }
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let digits = word.chars().filter(|c| c.is_ascii_digit()).count();
        let idish = (word.len() >= 20
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && digits > 0)
            || digits >= 6;
        out.push_str(if idish { "<id>" } else { word });
        word.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// polyarch.yaml for `case` (context `ctx`, one platform, network none).
pub fn project_file(case: &Case, repository: &str, context: &str) -> String {
    let mut y = format!(
        "version: 1\nimages:\n  diff:\n    repository: {repository}\n    tags: [v1]\n    context: {}\n    dockerfile: {}\n    platforms: [linux/amd64]\n    network: none\n",
        yaml_str(context),
        yaml_str(&case.dockerfile_path)
    );
    if let Some(t) = &case.target {
        y.push_str(&format!("    target: {}\n", yaml_str(t)));
    }
    if !case.build_args.is_empty() {
        let items: Vec<String> = case
            .build_args
            .iter()
            .map(|(k, v)| format!("{}: {}", yaml_str(k), yaml_str(v)))
            .collect();
        y.push_str(&format!("    build_args: {{{}}}\n", items.join(", ")));
    }
    y
}

/// One `polyarch build` of the project in `root`.
pub fn run_polyarch(
    env: &Env,
    root: &Path,
    project: &str,
    cache: &Path,
    docker_host: Option<&str>,
    extra: &[&str],
) -> Outcome {
    let mut cmd = Command::new(&env.bin);
    cmd.arg("build")
        .arg("-f")
        .arg(root.join(project))
        .args(["--output-format", "json"])
        .args(extra)
        .env("POLYARCH_CACHE_DIR", cache)
        .env("CI", "true")
        .env_remove("SOURCE_DATE_EPOCH")
        .stdin(Stdio::null());
    if let Some(epoch) = env.epoch {
        cmd.env("SOURCE_DATE_EPOCH", epoch.to_string());
    }
    match docker_host {
        Some(h) => {
            cmd.env("DOCKER_HOST", h);
        }
        None => {
            cmd.env_remove("DOCKER_HOST");
        }
    }
    let out = cmd.output().expect("run polyarch");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let record: Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(e) => {
                return Outcome::Failed {
                    code: Some(0),
                    message: format!("record on stdout is not JSON ({e})"),
                }
            }
        };
        let image = &record["images"][0];
        Outcome::Published {
            digest: image["digest"].as_str().unwrap_or_default().to_string(),
            reused: image["platforms"][0]["build"]["reused"] == true,
        }
    } else {
        let message = stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("error"))
            .or(stderr.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("(no output)");
        Outcome::Failed {
            code: out.status.code(),
            message: normalise(message, root, &env.registry_host),
        }
    }
}

/// What the tag points at in the registry, read by skopeo.
fn tag_digest(reference: &str) -> Option<String> {
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--raw"])
        .arg(format!("docker://{reference}"))
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| ::polyarch::base::oci::sha256_digest(&out.stdout))
}

/// Panics when an outcome says the engine or the registry went away: then every case
/// would "fail the same way" and the test would pass without testing anything.
fn check_infrastructure(outcome: &Outcome) {
    if let Outcome::Failed { message, .. } = outcome {
        let down = [
            "cannot reach the engine",
            "connection refused",
            "Cannot connect to the Docker daemon",
        ];
        if down.iter().any(|d| message.contains(d)) {
            panic!("the engine or the registry is not answering, stopping: {message}");
        }
    }
}

/// Runs `case` from scratch in a new directory under `env.work`.
pub fn run_case(env: &Env, case: &Case, compare: bool) -> CaseResult {
    assert!(
        case.has_stage(),
        "refusing to build a Dockerfile without FROM (it makes Docker 20.10 panic):\n{}",
        case.dockerfile
    );
    let started = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("case-")
        .tempdir_in(&env.work)
        .expect("case dir");
    let root = tmp.path().to_path_buf();
    let layout = Layout::new(root.clone());
    model::materialize(case, &layout);
    let repo = format!("{}/{}", env.registry_host, support::unique_name("diff/c"));
    fs::write(
        root.join("polyarch.yaml"),
        project_file(case, &repo, &layout.ctx_name()),
    )
    .unwrap();
    let cache = root.join("cache");
    fs::create_dir(&cache).unwrap();
    let host = env.docker_host.as_deref();

    let cold = run_polyarch(env, &root, "polyarch.yaml", &cache, host, &[]);
    // The Docker CLI builds the same trees at the same points: the first tree now, the
    // mutated one after polyarch's reruns. BuildKit resends only what changed since its
    // last transfer of a directory (a file whose size and modification time are the same
    // is not resent, a directory's new mode is not seen), so both see the same history.
    let bx = env.buildx.as_ref().filter(|_| compare);
    let initial = bx.map(|bx| buildx(env, bx, case, &root, &root.join("buildx-initial.tar")));
    let applied: Vec<bool> = case
        .mutations
        .iter()
        .map(|m| model::apply(case, &layout, m))
        .collect();
    let normal = run_polyarch(env, &root, "polyarch.yaml", &cache, host, &[]);
    let normal_tag = normal
        .digest()
        .and_then(|_| tag_digest(&format!("{repo}:v1")));
    let rebuild = run_polyarch(env, &root, "polyarch.yaml", &cache, host, &["--rebuild"]);
    let rebuild_tag = rebuild
        .digest()
        .and_then(|_| tag_digest(&format!("{repo}:v1")));

    for o in [&cold, &normal, &rebuild] {
        check_infrastructure(o);
    }

    let mut disagreement = None;
    if !normal.same(&rebuild) {
        let category = match (&normal, &rebuild) {
            (Outcome::Published { .. }, Outcome::Published { .. }) => "stale",
            (Outcome::Failed { .. }, Outcome::Failed { .. }) => "failure",
            _ => "outcome",
        };
        let signature = match category {
            "outcome" => failed_signature(category, "rerun", &normal)
                .or_else(|| failed_signature(category, "--rebuild", &rebuild)),
            _ => None,
        };
        disagreement = Some(Disagreement {
            category: category.into(),
            detail: format!("first build: {cold}\nrerun:       {normal}\n--rebuild:   {rebuild}"),
            signature,
        });
    } else {
        for (outcome, tag) in [(&normal, &normal_tag), (&rebuild, &rebuild_tag)] {
            if let Some(d) = outcome.digest() {
                if tag.as_deref() != Some(d) {
                    disagreement = Some(Disagreement {
                        category: "tag".into(),
                        detail: format!("the record says {d}, {repo}:v1 is {tag:?}"),
                        signature: None,
                    });
                }
            }
        }
    }

    let mut compared = None;
    if let (Some(bx), Some(initial), None) = (bx, initial, &disagreement) {
        let result = compare_outputs(bx, &root, &cold, initial, &repo, "first tree", "initial")
            .and_then(|_| {
                let theirs = buildx(env, bx, case, &root, &root.join("buildx-final.tar"));
                compare_outputs(bx, &root, &rebuild, theirs, &repo, "mutated tree", "final")
            });
        match result {
            Ok(c) => compared = Some(c),
            Err(d) => disagreement = Some(d),
        }
    }
    CaseResult {
        cold,
        normal,
        applied,
        compared,
        disagreement,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// `docker buildx build` of `ctx` (as `case` says) on polyarch's engine, written to
/// `out` in `bx.output` form.
pub fn buildx(env: &Env, bx: &Buildx, case: &Case, root: &Path, out: &Path) -> Result<(), String> {
    let mut cmd = Command::new(&bx.docker);
    cmd.env("DOCKER_CONFIG", &bx.config).env(
        "DOCKER_HOST",
        env.docker_host
            .as_deref()
            .unwrap_or("unix:///var/run/docker.sock"),
    );
    cmd.args([
        "buildx",
        "build",
        "--platform",
        "linux/amd64",
        "--provenance=false",
        "--network",
        "none",
        "--progress",
        "plain",
    ]);
    let ctx = Layout::new(root.to_path_buf()).ctx();
    cmd.arg("-f").arg(ctx.join(&case.dockerfile_path));
    if let Some(t) = &case.target {
        cmd.args(["--target", t]);
    }
    for (k, v) in &case.build_args {
        cmd.arg("--build-arg").arg(format!("{k}={v}"));
    }
    cmd.arg("--output")
        .arg(format!("type={},dest={}", bx.output, out.display()));
    cmd.arg(&ctx);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .expect("run docker buildx");
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("ERROR"))
            .or(stderr.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("(no output)");
        Err(normalise(line, root, &env.registry_host))
    }
}

/// The files of `repo@digest` (copied by skopeo into an OCI layout under `dir`).
fn pushed_files(reference: &str, dir: &Path) -> Result<layers::Files, String> {
    let out = Command::new("skopeo")
        .args(["copy", "-q", "--src-tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .arg(format!("oci:{}:img", dir.display()))
        .stdin(Stdio::null())
        .output()
        .expect("run skopeo copy");
    if !out.status.success() {
        return Err(format!(
            "skopeo copy {reference}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    layers::image_files(dir)
}

/// Compares polyarch's `ours` (pushed to `repo`) with the Docker CLI's build of the same
/// tree (`theirs`, written to `buildx-NAME.tar`). Ok(true): same files; Ok(false): both
/// failed.
fn compare_outputs(
    bx: &Buildx,
    root: &Path,
    ours: &Outcome,
    theirs: Result<(), String>,
    repo: &str,
    tree: &str,
    name: &str,
) -> Result<bool, Disagreement> {
    match (ours, theirs) {
        (Outcome::Failed { .. }, Err(_)) => Ok(false),
        (Outcome::Published { digest, .. }, Ok(())) => {
            let out = root.join(format!("buildx-{name}.tar"));
            let read = || -> Result<(layers::Files, layers::Files), String> {
                let theirs = if bx.output == "oci" {
                    let dir = root.join(format!("buildx-{name}-oci"));
                    fs::create_dir_all(&dir).unwrap();
                    layers::untar(&out, &dir)?;
                    layers::image_files(&dir)?
                } else {
                    layers::rootfs_files(&out)?
                };
                let ours = pushed_files(
                    &format!("{repo}@{digest}"),
                    &root.join(format!("pushed-{name}-oci")),
                )?;
                Ok((ours, theirs))
            };
            let (ours, theirs) = read().map_err(|e| Disagreement {
                category: "buildx-read".into(),
                detail: e,
                signature: None,
            })?;
            let diff = layers::diff("polyarch", &ours, "buildx", &theirs);
            if diff.is_empty() {
                Ok(true)
            } else {
                Err(Disagreement {
                    signature: None,
                    category: "buildx-files".into(),
                    detail: format!(
                        "the {tree}'s image differs between polyarch and docker buildx:\n  {}",
                        diff.join("\n  ")
                    ),
                })
            }
        }
        (ours, theirs) => Err(Disagreement {
            signature: Some(match (&theirs, ours) {
                (Err(e), _) => signature_of("buildx-outcome", "docker buildx", e),
                (Ok(()), o) => {
                    failed_signature("buildx-outcome", "polyarch", o).unwrap_or_default()
                }
            }),
            category: "buildx-outcome".into(),
            detail: format!(
                "on the {tree}: polyarch {ours}; docker buildx {}",
                match theirs {
                    Ok(()) => "built the image".to_string(),
                    Err(e) => format!("failed: {e}"),
                }
            ),
        }),
    }
}

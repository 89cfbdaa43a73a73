//! Differential test of the warm path (issue 13): a rerun that skips the build because
//! its inputs key matches an earlier run must publish exactly what `--rebuild` (which
//! always asks the engine) publishes. Written against the CLI only, so it holds whatever
//! `inputs_key` becomes.
//!
//! Each case is a pure function of (seed, case index) and the engine's Dockerfile
//! frontend (`COPY --link` and heredocs only where it knows them: not Docker 20.10's, not
//! Podman 4.3's Buildah 1.28), built with SOURCE_DATE_EPOCH where the engine keeps no
//! build cache (Podman: two builds of a tree differ in their times): a random context
//! (files, empty and hidden directories, symlinks inside, outside, dangling and in
//! loops, modes 0644/0755/0600, zero-length and up to 2 MiB files, names with blanks and
//! unicode, a local tar), random `.dockerignore` / `<Dockerfile>.dockerignore`, a random
//! FROM-scratch Dockerfile (multi-stage, stages FROM earlier ones, COPY/ADD with globs,
//! JSON form, --chmod, --link, --from, ARG/ENV in source paths, --target,
//! RUN --mount=type=bind with the static busybox, ADD of a local tar, heredocs, ONBUILD
//! COPY), and 1-3 mutations (plus, in 5% of cases, an edit of a file outside the
//! context). The case is built,
//! mutated, rebuilt normally and with `--rebuild`; the two must publish the same digest,
//! or fail the same way (exit code and kind of failure). Every
//! `POLYARCH_DIFF_COMPARE_EVERY`-th case is also built with `docker buildx build`
//! (Docker 26.1's CLI, buildx 0.13.1, from scripts/engine26.sh) on the engine polyarch
//! used, the first tree after polyarch's first build and the mutated tree after its
//! reruns (so that BuildKit's incremental transfers have the same history for both: it
//! resends a file only when its size or modification time changed, and does not see a
//! directory's new mode), to an OCI layout where that engine can export one (containerd
//! image store) or to a root file system tar (classic store); each must have the same
//! files as the image polyarch pushed for that tree (paths, types, permission bits,
//! uid/gid, sizes, link targets, contents; times, user/group names and xattrs are not
//! compared; a hard link counts as the file it names). Each case's context directory
//! has a name of its own: BuildKit keeps what it was sent under the directory's name, and
//! a shared name lets one case's transfer leak into the next (seen with buildx on
//! Docker 20.10: a symlink of an earlier case).
//!
//! A disagreement is confirmed by a second run, shrunk (mutations, entries, Dockerfile
//! and ignore lines, options, contents), printed with a reproduction and saved under
//! tests/regressions/, whose cases run every time before the random ones.
//!
//! Knobs (environment):
//!   POLYARCH_DIFF_SEED=N|0xHEX|random   seed (default 0x13)
//!   POLYARCH_DIFF_CASES=N               number of random cases (default 24)
//!   POLYARCH_DIFF_FIRST=K               first case index (default 0)
//!   POLYARCH_DIFF_COMPARE_EVERY=K       compare with docker buildx every K-th case
//!                                       (default 4; 0: never)
//!   POLYARCH_DIFF_SHRINK=0              report without shrinking
//!   POLYARCH_DIFF_SHRINK_SECS=S         shrinking budget per disagreement (default 300)
//!   POLYARCH_DIFF_MAX_SHRINK=N          shrink at most N disagreements (default 3)
//!   POLYARCH_DIFF_SAVE=0                do not write tests/regressions/
//!   POLYARCH_DIFF_SAVE_DIR=DIR          save found cases there instead (long runs)
//!   POLYARCH_DIFF_REGRESSIONS=0         skip the saved regression cases
//!   POLYARCH_DIFF_REGRESSIONS_DIR=DIR   replay the cases saved there instead
//!   POLYARCH_DIFF_BIN=PATH              another polyarch binary (to check the test
//!                                       catches a known-bad build)
//!   DOCKER_HOST                         the engine polyarch builds on

mod support;

#[path = "differential/gen.rs"]
mod gen;
#[path = "differential/layers.rs"]
mod layers;
#[path = "differential/model.rs"]
mod model;
#[path = "differential/rng.rs"]
mod rng;
#[path = "differential/runner.rs"]
mod runner;
#[path = "differential/shrink.rs"]
mod shrink;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use model::{Case, Node};
use runner::{CaseResult, Env, Outcome};

const DEFAULT_SEED: u64 = 0x13;
const DEFAULT_CASES: u64 = 24;
const DEFAULT_COMPARE_EVERY: u64 = 4;
/// SOURCE_DATE_EPOCH of the cases on an engine without a build cache.
const CASE_EPOCH: u64 = 1_700_000_000;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}"))
        }
        _ => default,
    }
}

fn seed() -> u64 {
    match std::env::var("POLYARCH_DIFF_SEED").as_deref() {
        Ok("random") => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            rng::mix(nanos ^ std::process::id() as u64) & 0xFFFF_FFFF
        }
        _ => env_u64("POLYARCH_DIFF_SEED", DEFAULT_SEED),
    }
}

/// A saved case: what found it and the (shrunk) case itself.
#[derive(Debug, Serialize, Deserialize)]
struct Regression {
    found: Found,
    case: Case,
}

#[derive(Debug, Serialize, Deserialize)]
struct Found {
    /// Free text: what this case shows.
    note: String,
    seed: Option<u64>,
    case: Option<u64>,
    /// Category of the disagreement (`stale`, `outcome`, `failure`, `tag`,
    /// `buildx-files`, `buildx-outcome`).
    category: String,
    /// Also compare with docker buildx when replayed.
    compare: bool,
    detail: String,
    /// When one side failed: see `runner::Disagreement::signature` (one per engine where
    /// the defect shows differently). A random case that fails one of these ways is
    /// reported as this defect again, not shrunk and saved again.
    #[serde(default)]
    signatures: Vec<String>,
    /// A limit of Docker's classic image store that polyarch reports instead of building
    /// (this text is in its error there); on the containerd store the case must agree.
    #[serde(default)]
    classic_store_limit: Option<String>,
}

fn regressions_dir() -> PathBuf {
    support::repo_root().join("tests/regressions")
}

// ------------------------------------------------------------ engine-free tests

/// The generator reaches the shapes of the two defects fixed before (commit 635fd8b):
/// `COPY link.txt /l` with link.txt -> real/t.txt and real/t.txt changed; and a
/// secret.txt excluded only by `<Dockerfile>.dockerignore` in a context copied whole.
#[test]
fn generator_reaches_the_known_defect_shapes() {
    let (mut symlink, mut specific) = (vec![], vec![]);
    let total = 4000u64;
    for index in 0..total {
        let case = gen::generate(DEFAULT_SEED, index, false);
        let link_to_t = case.entries.iter().any(|e| {
            e.path == "link.txt"
                && matches!(&e.node, Node::Link { target } if target == "real/t.txt")
        });
        let copies = |word: &str| {
            case.dockerfile
                .lines()
                .any(|l| (l.contains("COPY") || l.contains("copy")) && l.contains(word))
        };
        if link_to_t
            && copies("link.txt")
            && case.mutations.iter().any(|m| {
                matches!(m, model::Mutation::Write { path, .. } | model::Mutation::FlipByte { path, .. } if path == "real/t.txt")
            })
        {
            symlink.push(index);
        }
        // A COPY or ADD of the whole context (`.` or `./`, plain or JSON form).
        let copies_all = case.dockerfile.lines().any(|l| {
            let up = l.to_ascii_uppercase();
            (up.starts_with("COPY") || up.starts_with("ADD"))
                && (l.split_whitespace().any(|w| w == "." || w == "./")
                    || l.contains("[\".\"")
                    || l.contains("[\"./\""))
        });
        if copies_all
            && case.entries.iter().any(|e| e.path == "secret.txt")
            && case
                .specific_ignore
                .as_deref()
                .is_some_and(|t| t.lines().any(|l| l == "secret.txt"))
            && !case.ignore.as_deref().is_some_and(|t| t.contains("secret"))
        {
            specific.push(index);
        }
    }
    eprintln!(
        "seed {DEFAULT_SEED:#x}, {total} cases: symlinked source changed in {} (first {:?}), secret.txt only in <Dockerfile>.dockerignore with COPY . in {} (first {:?})",
        symlink.len(),
        symlink.first(),
        specific.len(),
        specific.first()
    );
    assert!(
        !symlink.is_empty(),
        "no case copies link.txt -> real/t.txt and changes the target"
    );
    assert!(
        !specific.is_empty(),
        "no case excludes secret.txt only by Dockerfile.dockerignore"
    );
}

#[test]
fn cases_are_a_function_of_seed_and_index() {
    for index in 0..200 {
        for modern in [false, true] {
            let a = gen::generate(7, index, modern);
            let b = gen::generate(7, index, modern);
            assert_eq!(a, b);
            let json = serde_json::to_string(&a).unwrap();
            let back: Case = serde_json::from_str(&json).unwrap();
            assert_eq!(back, a, "JSON round trip of case {index}");
            if !modern {
                assert!(
                    !a.needs_modern_frontend(),
                    "case {index}:\n{}",
                    a.dockerfile
                );
            }
        }
    }
    assert_ne!(gen::generate(7, 1, false), gen::generate(8, 1, false));
}

// ------------------------------------------------------------ the engine test

/// A tiny project through polyarch itself, in a directory of its own under `work`.
struct Probe {
    dir: tempfile::TempDir,
}

impl Probe {
    fn new(work: &Path, dockerfile: &str) -> Probe {
        let dir = tempfile::tempdir_in(work).unwrap();
        fs::create_dir(dir.path().join("ctx")).unwrap();
        fs::write(dir.path().join("ctx/Dockerfile"), dockerfile).unwrap();
        fs::write(
            dir.path().join("polyarch.yaml"),
            "version: 1\nimages:\n  probe:\n    repository: 127.0.0.1:1/unused/probe\n    tags: [v1]\n    context: ctx\n    platforms: [linux/amd64]\n",
        )
        .unwrap();
        Probe { dir }
    }

    /// Builds it to the OCI layout `layout` (nothing pushed), with `extra` arguments: the
    /// index's digest when it built, else the error line.
    fn build(
        &self,
        bin: &Path,
        docker_host: Option<&str>,
        layout: &str,
        extra: &[&str],
    ) -> Result<String, String> {
        let dir = self.dir.path();
        let mut cmd = Command::new(bin);
        cmd.args(["build", "-f"])
            .arg(dir.join("polyarch.yaml"))
            .arg("--output")
            .arg(format!("oci:{}", dir.join(layout).display()))
            .args(extra)
            .env("POLYARCH_CACHE_DIR", dir.join("cache"))
            .env_remove("SOURCE_DATE_EPOCH")
            .stdin(Stdio::null());
        if let Some(h) = docker_host {
            cmd.env("DOCKER_HOST", h);
        }
        let out = cmd.output().expect("run polyarch");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string());
        }
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join(layout).join("index.json")).unwrap())
                .unwrap();
        Ok(index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string())
    }
}

fn engine_version(docker_host: Option<&str>) -> String {
    let mut cmd = Command::new("docker");
    cmd.args(["version", "--format", "{{.Server.Version}}"])
        .stdin(Stdio::null());
    if let Some(h) = docker_host {
        cmd.env("DOCKER_HOST", h);
    }
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Docker 26.1's CLI with buildx 0.13.1 (scripts/engine26.sh installs it), aimed at
/// polyarch's engine; its output form probed with a tiny build. None (with the reason on
/// stderr) when it cannot be had.
fn buildx_setup(env: &Env) -> Option<runner::Buildx> {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let found = std::panic::catch_unwind(|| {
        (
            support::engines::docker26_bin_dir().join("docker"),
            support::engines::docker26_config_dir(),
        )
    });
    std::panic::set_hook(quiet);
    let (docker, config) = match found {
        Ok(f) => f,
        Err(e) => {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!(
                "[differential] no docker buildx here, no comparison: {}",
                why.lines().next().unwrap_or("")
            );
            return None;
        }
    };
    let probe = Case {
        entries: vec![],
        dockerfile_path: "Dockerfile".into(),
        dockerfile: "FROM scratch\nCOPY Dockerfile /x\n".into(),
        ignore: None,
        specific_ignore: None,
        target: None,
        build_args: Default::default(),
        mutations: vec![],
    };
    let dir = tempfile::tempdir_in(&env.work).unwrap();
    model::materialize(&probe, &model::Layout::new(dir.path().to_path_buf()));
    let mut last = String::new();
    for output in ["oci", "tar"] {
        let bx = runner::Buildx {
            docker: docker.clone(),
            config: config.clone(),
            output,
        };
        match runner::buildx(env, &bx, &probe, dir.path(), &dir.path().join("probe.tar")) {
            Ok(()) => return Some(bx),
            Err(e) => last = e,
        }
    }
    eprintln!("[differential] docker buildx does not build here, no comparison: {last}");
    None
}

#[derive(Default)]
struct Stats {
    cases: u64,
    reused_agree: u64,
    rebuilt_agree: u64,
    failed_agree: u64,
    cold_failed: u64,
    noop_mutations: u64,
    mutations: u64,
    compared_same: u64,
    compared_both_failed: u64,
    seconds: Vec<f64>,
}

impl Stats {
    fn add(&mut self, r: &CaseResult) {
        self.cases += 1;
        self.seconds.push(r.seconds);
        self.mutations += r.applied.len() as u64;
        self.noop_mutations += r.applied.iter().filter(|a| !**a).count() as u64;
        if matches!(r.cold, Outcome::Failed { .. }) {
            self.cold_failed += 1;
        }
        if r.disagreement.is_none() {
            match &r.normal {
                Outcome::Published { reused: true, .. } => self.reused_agree += 1,
                Outcome::Published { .. } => self.rebuilt_agree += 1,
                Outcome::Failed { .. } => self.failed_agree += 1,
            }
        }
        match r.compared {
            Some(true) => self.compared_same += 1,
            Some(false) => self.compared_both_failed += 1,
            None => {}
        }
    }

    fn summary(&self) -> String {
        let mut s = self.seconds.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let total: f64 = s.iter().sum();
        let pct = |p: f64| {
            s.get(((s.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0.0)
        };
        format!(
            "{} cases: {} reruns reused the build and agreed, {} rebuilt and agreed, {} failed the same way in both reruns \
             ({} first builds failed); {} of {} mutations were no-ops; docker buildx comparison: {} same files, {} both failed; \
             time per case: mean {:.2}s, median {:.2}s, p90 {:.2}s, max {:.2}s (cases total {:.0}s)",
            self.cases,
            self.reused_agree,
            self.rebuilt_agree,
            self.failed_agree,
            self.cold_failed,
            self.noop_mutations,
            self.mutations,
            self.compared_same,
            self.compared_both_failed,
            if s.is_empty() { 0.0 } else { total / s.len() as f64 },
            pct(0.5),
            pct(0.9),
            s.last().copied().unwrap_or(0.0),
            total
        )
    }
}

fn report(case: &Case, r: &CaseResult) -> String {
    let d = r.disagreement.as_ref().unwrap();
    let mut applied = String::new();
    for (m, a) in case.mutations.iter().zip(&r.applied) {
        if !a {
            applied.push_str(&format!(
                "  (no-op: {})\n",
                model::describe_mutation(m).lines().next().unwrap()
            ));
        }
    }
    format!(
        "{}: {}\n{}{}",
        d.category,
        d.detail,
        applied,
        model::describe(case)
    )
}

fn save_regression(name: &str, reg: &Regression) -> PathBuf {
    let dir = std::env::var_os("POLYARCH_DIFF_SAVE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(regressions_dir);
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    fs::write(&path, serde_json::to_string_pretty(reg).unwrap() + "\n").unwrap();
    path
}

/// Replays tests/regressions/*.json; returns how many ran and the signatures of the
/// defects they stand for (file name, signature).
fn replay_regressions(env: &Env, failures: &mut Vec<String>) -> (usize, Vec<(String, String)>) {
    let mut signatures = vec![];
    let from = std::env::var_os("POLYARCH_DIFF_REGRESSIONS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(regressions_dir);
    let Ok(dir) = fs::read_dir(from) else {
        return (0, signatures);
    };
    let mut files: Vec<PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut ran = 0;
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(&file).unwrap();
        let reg: Regression = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a regression case: {e}", file.display()));
        for sig in &reg.found.signatures {
            signatures.push((name.clone(), sig.clone()));
        }
        if reg.case.needs_modern_frontend() && !env.modern {
            eprintln!("[differential] regression {name}: skipped, it needs Engine 23+'s Dockerfile frontend");
            continue;
        }
        let compare = reg.found.compare && env.buildx.is_some();
        let r = runner::run_case(env, &reg.case, compare);
        ran += 1;
        eprintln!(
            "[differential] regression {name}: {:.1}s {}",
            r.seconds,
            match &r.disagreement {
                None => format!("agrees ({})", r.normal),
                Some(d) => format!("DISAGREES ({})", d.category),
            }
        );
        let known = reg
            .found
            .classic_store_limit
            .as_ref()
            .filter(|_| !support::engines::engine_pushes_itself());
        if let (Some(limit), Some(_)) = (known, &r.disagreement) {
            let seen = report(&reg.case, &r);
            assert!(
                seen.contains(limit.as_str()),
                "regression {name}: expected the classic store's known limit ({limit}):\n{seen}"
            );
            eprintln!("[differential] regression {name}: the classic store's known limit, reported as such");
            continue;
        }
        if r.disagreement.is_some() {
            failures.push(format!(
                "regression {} ({}):\n{}",
                file.display(),
                reg.found.note,
                report(&reg.case, &r)
            ));
        }
    }
    (ran, signatures)
}

#[test]
fn differential() {
    let started = Instant::now();
    let seed = seed();
    let cases = env_u64("POLYARCH_DIFF_CASES", DEFAULT_CASES);
    let first = env_u64("POLYARCH_DIFF_FIRST", 0);
    let compare_every = env_u64("POLYARCH_DIFF_COMPARE_EVERY", DEFAULT_COMPARE_EVERY);
    let shrinking = env_u64("POLYARCH_DIFF_SHRINK", 1) != 0;
    let shrink_budget = Duration::from_secs(env_u64("POLYARCH_DIFF_SHRINK_SECS", 300));
    let max_shrink = env_u64("POLYARCH_DIFF_MAX_SHRINK", 3);
    let save = env_u64("POLYARCH_DIFF_SAVE", 1) != 0;
    let bin = std::env::var_os("POLYARCH_DIFF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_polyarch")));

    support::busybox("amd64");
    let registry = support::Registry::start();
    let work = tempfile::Builder::new()
        .prefix("polyarch-diff-")
        .tempdir()
        .unwrap();
    let docker_host = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty());
    let simplest = Probe::new(work.path(), "FROM scratch\nCOPY Dockerfile /x\n");
    let built = simplest.build(&bin, docker_host.as_deref(), "first", &[]);
    let rebuilt = simplest.build(&bin, docker_host.as_deref(), "again", &["--rebuild"]);
    let (built, rebuilt) = match (built, rebuilt) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            panic!("polyarch cannot build the simplest Dockerfile here: {e}")
        }
    };
    // An engine without a build cache (Podman's libpod build) writes each build with its
    // own times, so a rerun that reuses an image and `--rebuild` could never publish one
    // digest: there every build of the cases gets SOURCE_DATE_EPOCH.
    let epoch = (built != rebuilt).then_some(CASE_EPOCH);
    // The Dockerfile frontend knows `COPY --link` and heredocs (Engine 23+; not Docker
    // 20.10's built-in one, nor Podman 4.3's Buildah 1.28).
    let modern = Probe::new(work.path(), "FROM scratch\nCOPY --link <<EOF /x\nhi\nEOF\n")
        .build(&bin, docker_host.as_deref(), "out", &[])
        .is_ok();
    let mut env = Env {
        registry_host: registry.host.clone(),
        bin,
        work: work.path().to_path_buf(),
        docker_host: docker_host.clone(),
        modern,
        epoch,
        buildx: None,
    };
    if compare_every > 0 {
        env.buildx = buildx_setup(&env);
    }
    eprintln!(
        "[differential] seed {seed:#x}, cases {first}..{}, engine {} {} (frontend: {}; {}), buildx comparison: {}",
        first + cases,
        docker_host.as_deref().unwrap_or("default"),
        engine_version(docker_host.as_deref()),
        if modern { "--link and heredocs" } else { "no --link, no heredocs" },
        match epoch {
            Some(e) => format!("no build cache: SOURCE_DATE_EPOCH={e}"),
            None => "build cache".into(),
        },
        match &env.buildx {
            Some(bx) => format!("every {compare_every}th case, --output type={}", bx.output),
            None => "off".into(),
        }
    );

    let mut failures = vec![];
    let mut known = vec![];
    if env_u64("POLYARCH_DIFF_REGRESSIONS", 1) != 0 {
        let (ran, signatures) = replay_regressions(&env, &mut failures);
        known = signatures;
        eprintln!("[differential] {ran} regression cases replayed");
    }

    let mut stats = Stats::default();
    let mut flaky = vec![];
    let mut shrunk = 0;
    for index in first..first + cases {
        let case = gen::generate(seed, index, modern);
        let compare = compare_every > 0 && index % compare_every == 0 && env.buildx.is_some();
        let r = runner::run_case(&env, &case, compare);
        stats.add(&r);
        eprintln!(
            "[differential] case {index}: {:.1}s rerun {}{}",
            r.seconds,
            match &r.disagreement {
                None => match &r.normal {
                    Outcome::Published { reused: true, .. } => "reused, agrees".to_string(),
                    Outcome::Published { .. } => "rebuilt, agrees".to_string(),
                    Outcome::Failed { message, .. } => {
                        format!(
                            "failed, as --rebuild: {}",
                            message.chars().take(160).collect::<String>()
                        )
                    }
                },
                Some(d) => format!("DISAGREES ({})", d.category),
            },
            match r.compared {
                Some(true) => ", same files as docker buildx",
                Some(false) => ", docker buildx fails too",
                None => "",
            }
        );
        let Some(d) = r.disagreement.clone() else {
            continue;
        };
        let header = format!(
            "seed {seed:#x} case {index} (POLYARCH_DIFF_SEED={seed:#x} POLYARCH_DIFF_FIRST={index} POLYARCH_DIFF_CASES=1 cargo test --test differential differential)"
        );
        if let Some((file, _)) = known
            .iter()
            .find(|(_, sig)| d.signature.as_ref() == Some(sig))
        {
            failures.push(format!(
                "{header}: {}, the defect of regression {file} again ({})",
                d.category,
                d.detail.lines().next().unwrap_or("")
            ));
            continue;
        }
        // A disagreement that does not come back is reported, not failed on.
        let again = runner::run_case(&env, &case, compare);
        if again
            .disagreement
            .as_ref()
            .is_none_or(|d2| d2.category != d.category)
        {
            flaky.push(format!(
                "{header}: {} once, not on a second run:\n{}",
                d.category,
                report(&case, &r)
            ));
            continue;
        }
        let mut minimal = case.clone();
        if shrinking && shrunk < max_shrink {
            shrunk += 1;
            eprintln!(
                "[differential] case {index}: shrinking the {} disagreement…",
                d.category
            );
            let (small, attempts) = shrink::shrink(&case, shrink_budget, &mut |candidate| {
                // The same disagreement: same category and, where one side failed, the
                // same failure (else a shrunk case may show another defect).
                runner::run_case(&env, candidate, compare)
                    .disagreement
                    .is_some_and(|d2| d2.category == d.category && d2.signature == d.signature)
            });
            eprintln!("[differential] case {index}: shrunk in {attempts} attempts");
            minimal = small;
        }
        let last = runner::run_case(&env, &minimal, compare);
        let (shown, result) = match last.disagreement {
            Some(_) => (&minimal, last),
            None => (&case, r),
        };
        let mut message = format!("{header}:\n{}", report(shown, &result));
        if save {
            let path = save_regression(
                &format!("{}-seed{seed:x}-case{index}", d.category),
                &Regression {
                    found: Found {
                        note: format!("found by seed {seed:#x} case {index}"),
                        seed: Some(seed),
                        case: Some(index),
                        category: d.category.clone(),
                        compare,
                        detail: result.disagreement.as_ref().unwrap().detail.clone(),
                        signatures: result
                            .disagreement
                            .as_ref()
                            .unwrap()
                            .signature
                            .iter()
                            .cloned()
                            .collect(),
                        classic_store_limit: None,
                    },
                    case: shown.clone(),
                },
            );
            message.push_str(&format!("  saved as {}\n", path.display()));
        }
        if let Some(sig) = &result.disagreement.as_ref().unwrap().signature {
            known.push((format!("seed {seed:#x} case {index}"), sig.clone()));
        }
        failures.push(message);
    }

    let summary = stats.summary();
    eprintln!("[differential] {summary}");
    eprintln!(
        "[differential] whole test: {:.0}s",
        started.elapsed().as_secs_f64()
    );
    for f in &flaky {
        eprintln!("[differential] NOT REPRODUCED: {f}");
    }
    drop(registry);
    assert!(
        failures.is_empty(),
        "{} disagreement(s) between a rerun and --rebuild (or docker buildx):\n\n{}\n\n{summary}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Prints cases without running them: `POLYARCH_DIFF_SEED=… POLYARCH_DIFF_FIRST=…
/// POLYARCH_DIFF_CASES=… cargo test --test differential show -- --ignored --nocapture`
/// (POLYARCH_DIFF_MODERN=1 for Engine 23+'s frontend; POLYARCH_DIFF_CASE_FILE=F.json
/// for a saved regression). With POLYARCH_DIFF_OUT=DIR the (first) case is written
/// there (DIR/ctx-NAME, DIR/outside, DIR/polyarch.yaml for POLYARCH_DIFF_REPO), to build
/// by hand; run again with POLYARCH_DIFF_MUTATE=1 to apply its mutations to DIR.
#[test]
#[ignore]
fn show() {
    let seed = seed();
    let first = env_u64("POLYARCH_DIFF_FIRST", 0);
    let cases = env_u64("POLYARCH_DIFF_CASES", 3);
    let modern = env_u64("POLYARCH_DIFF_MODERN", 0) != 0;
    let list: Vec<(String, Case)> = match std::env::var("POLYARCH_DIFF_CASE_FILE") {
        Ok(f) => {
            let reg: Regression = serde_json::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
            vec![(f, reg.case)]
        }
        Err(_) => (first..first + cases)
            .map(|i| {
                (
                    format!("seed {seed:#x} case {i}"),
                    gen::generate(seed, i, modern),
                )
            })
            .collect(),
    };
    for (name, case) in &list {
        println!("--- {name}\n{}", model::describe(case));
    }
    if let Ok(out) = std::env::var("POLYARCH_DIFF_OUT") {
        let case = &list[0].1;
        let layout = model::Layout::new(PathBuf::from(&out));
        if env_u64("POLYARCH_DIFF_MUTATE", 0) != 0 {
            for m in &case.mutations {
                let applied = model::apply(case, &layout, m);
                println!(
                    "{} {}",
                    if applied { "applied" } else { "no-op  " },
                    model::describe_mutation(m)
                );
            }
        } else {
            model::materialize(case, &layout);
            let repo =
                std::env::var("POLYARCH_DIFF_REPO").unwrap_or("127.0.0.1:5000/diff/show".into());
            fs::write(
                layout.root.join("polyarch.yaml"),
                runner::project_file(case, &repo, &layout.ctx_name()),
            )
            .unwrap();
            println!("written to {out}");
        }
    }
}

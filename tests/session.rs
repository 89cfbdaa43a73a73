//! What builds take from this machine through the BuildKit session, as a user sees it:
//! secrets (read, never shipped or shown), SSH agents, registry credentials for base
//! images, and registry caches per platform. Each test starts its own registries and uses
//! unique names and Dockerfile markers, so engines shared with other tests are never
//! disturbed.

mod support;

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::engines::docker26_host;
use support::{hello_context, polyarch, run, run_with_stdin, unique_name, Registry, HELLO};

/// The machine's engine (Docker 20.10, classic store), for what only it shows.
const MACHINE: &str = "unix:///var/run/docker.sock";

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A build context with the busybox fixture, a Dockerfile and a one-image project
/// (`app`, tag v1, `network: none`, `extra` appended to the image's settings).
struct Build {
    dir: tempfile::TempDir,
    /// POLYARCH_CACHE_DIR of every run in this test.
    cache: tempfile::TempDir,
    file: PathBuf,
}

impl Build {
    fn new(dockerfile: &str, repository: &str, platforms: &str, extra: &str) -> Build {
        let dir = tempfile::tempdir().unwrap();
        hello_context(dir.path(), dockerfile);
        let file = dir.path().join("polyarch.yaml");
        std::fs::write(
            &file,
            format!(
                "version: 1\nimages:\n  app:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: {platforms}\n    network: none\n{extra}"
            ),
        )
        .unwrap();
        Build {
            dir,
            cache: tempfile::tempdir().unwrap(),
            file,
        }
    }

    /// `polyarch build -v -f FILE` on the engine at `docker_host`, else on the one the
    /// test run is given (`make test` runs these tests on each engine in turn).
    fn command(&self, docker_host: Option<&str>) -> Command {
        let mut cmd = polyarch();
        cmd.args(["build", "-v", "-f"])
            .arg(&self.file)
            .env("POLYARCH_CACHE_DIR", self.cache.path());
        if let Some(host) = docker_host {
            cmd.env("DOCKER_HOST", host).env_remove("DOCKER_CONTEXT");
        }
        cmd
    }
}

/// What a pushed image holds, read by skopeo: every blob (manifests, config, layers) as
/// stored, each gzip layer decompressed, and the files of its layers by path.
struct Pulled {
    blobs: Vec<Vec<u8>>,
    files: BTreeMap<String, Vec<u8>>,
}

fn pull(reference: &str, creds: Option<(&str, &str)>) -> Pulled {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("oci");
    let mut cmd = Command::new("skopeo");
    cmd.args(["copy", "--src-tls-verify=false"]);
    if let Some((user, pass)) = creds {
        cmd.arg(format!("--src-creds={user}:{pass}"));
    }
    let out = run(cmd
        .arg(format!("docker://{reference}"))
        .arg(format!("oci:{}:v1", layout.display())));
    assert!(out.status.success(), "skopeo copy: {}", text(&out));
    let mut pulled = Pulled {
        blobs: Vec::new(),
        files: BTreeMap::new(),
    };
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let raw = std::fs::read(entry.unwrap().path()).unwrap();
        let mut unpacked = Vec::new();
        if flate2::read::MultiGzDecoder::new(raw.as_slice())
            .read_to_end(&mut unpacked)
            .is_ok()
        {
            let mut archive = tar::Archive::new(unpacked.as_slice());
            if let Ok(entries) = archive.entries() {
                for mut file in entries.flatten() {
                    let path = file.path().unwrap().to_string_lossy().into_owned();
                    let mut content = Vec::new();
                    file.read_to_end(&mut content).unwrap();
                    pulled.files.insert(path, content);
                }
            }
            pulled.blobs.push(unpacked);
        }
        pulled.blobs.push(raw);
    }
    pulled
}

impl Pulled {
    fn file(&self, path: &str) -> String {
        let content = self
            .files
            .get(path)
            .unwrap_or_else(|| panic!("{path} not in the image: {:?}", self.files.keys()));
        String::from_utf8_lossy(content).trim().to_string()
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// BuildKit's cache keys leave secret values out (as with buildx), so each run's RUN step
/// carries a marker of its own: an earlier run's result must not answer for this one.
fn secrets_dockerfile(marker: &str) -> String {
    format!("FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN --mount=type=secret,id=token --mount=type=secret,id=npmrc [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox wc -c < /run/secrets/token > /len && /bin/busybox sha256sum < /run/secrets/npmrc > /npmrc.sum && echo {marker}\"]\nENTRYPOINT [\"/bin/busybox\", \"cat\", \"/len\"]\n")
}

/// (a) A secret from the environment (polyarch.yaml) and one from a file (--secret) are
/// read by the RUN step, and neither value reaches the pushed image, polyarch's output,
/// the record or its caches.
#[test]
fn secrets_are_read_by_the_build_and_found_nowhere_after_it() {
    let started = Instant::now();
    let registry = Registry::start();
    let repo = registry.repo(&unique_name("session/secret"));
    let token = unique_name("token-value-s3cr3t");
    let npmrc = unique_name("//registry.example/:_authToken=npm-s3cr3t");
    let build = Build::new(
        &secrets_dockerfile(&unique_name("secrets")),
        &repo,
        "[linux/amd64]",
        "    secrets: {token: {env: POLYARCH_TEST_TOKEN}}\n",
    );
    let npmrc_file = build.dir.path().join("npmrc.secret");
    std::fs::write(&npmrc_file, &npmrc).unwrap();
    let record = build.dir.path().join("record.json");
    let out = run(build
        .command(None)
        .env("POLYARCH_TEST_TOKEN", &token)
        .arg("--secret")
        .arg(format!("id=npmrc,src={}", npmrc_file.display()))
        .arg("--record")
        .arg(&record));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The image shows both secrets were read.
    let image = pull(&format!("{repo}:v1"), None);
    assert_eq!(image.file("len"), token.len().to_string());
    assert_eq!(
        image.file("npmrc.sum").split_whitespace().next().unwrap(),
        hex::encode(Sha256::digest(npmrc.as_bytes()))
    );
    // Neither value is anywhere a user could find it afterwards.
    let record_text = std::fs::read(&record).unwrap();
    let mut places: Vec<(String, Vec<u8>)> = vec![
        ("stdout".into(), out.stdout.clone()),
        ("stderr".into(), out.stderr.clone()),
        ("record".into(), record_text),
    ];
    for (i, blob) in image.blobs.iter().enumerate() {
        places.push((format!("pushed blob {i}"), blob.clone()));
    }
    let cached = files_under(build.cache.path());
    assert!(!cached.is_empty(), "polyarch wrote no cache files");
    for path in cached {
        places.push((path.display().to_string(), std::fs::read(&path).unwrap()));
    }
    for (place, bytes) in &places {
        for value in [&token, &npmrc] {
            assert!(!contains(bytes, value), "a secret value is in {place}");
        }
    }

    // A secret the Dockerfile requires but nobody gave: BuildKit's NotFound, named.
    std::fs::write(
        build.dir.path().join("Dockerfile"),
        format!("FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN --mount=type=secret,id=absent,required=true [\"/bin/busybox\", \"echo\", \"{}\"]\n", unique_name("absent")),
    )
    .unwrap();
    let out = run(build.command(None).env("POLYARCH_TEST_TOKEN", &token));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("absent") && error.contains("not found"),
        "{}",
        text(&out)
    );
    eprintln!("secrets test: {:.1}s", started.elapsed().as_secs_f64());
}

/// A throw-away `ssh-agent -D -a SOCK` holding a generated key; killed on drop.
struct Agent {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Agent {
        // Agent sockets live in short paths (sun_path is 108 bytes).
        let dir = tempfile::Builder::new()
            .prefix("pa-ssh-")
            .tempdir_in("/tmp")
            .unwrap();
        let socket = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ssh-agent (Debian package openssh-client)");
        let mut agent = Agent {
            child,
            socket,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.socket.exists() {
            assert!(
                matches!(agent.child.try_wait(), Ok(None)),
                "ssh-agent exited"
            );
            assert!(Instant::now() < deadline, "ssh-agent made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        let key = agent._dir.path().join("id_ed25519");
        let out = run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "polyarch-test", "-f"])
            .arg(&key));
        assert!(out.status.success(), "ssh-keygen: {}", text(&out));
        let out = run(Command::new("ssh-add")
            .arg(&key)
            .env("SSH_AUTH_SOCK", &agent.socket));
        assert!(out.status.success(), "ssh-add: {}", text(&out));
        agent
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (b) `ssh: [default]` forwards $SSH_AUTH_SOCK and `--ssh ID=SOCKET` another socket:
/// the RUN steps find an agent socket; without an agent nothing is built.
#[test]
fn ssh_agents_are_forwarded_and_a_missing_agent_is_a_usage_error() {
    let started = Instant::now();
    let agent = Agent::start();
    let registry = Registry::start();
    let repo = registry.repo(&unique_name("session/ssh"));
    // Unique steps: BuildKit's cache keys leave the agents out, and a cached step mounts
    // nothing (BuildKit 0.13 also keys a step by its input's content, so each step
    // carries the marker).
    let dockerfile = |marker: &str| {
        format!("FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN --mount=type=ssh [\"/bin/busybox\", \"sh\", \"-c\", \"test -S $SSH_AUTH_SOCK && echo ok > /ssh && echo {marker}\"]\nRUN --mount=type=ssh,id=work,required=true [\"/bin/busybox\", \"sh\", \"-c\", \"test -S $SSH_AUTH_SOCK && echo ok > /ssh-work && echo {marker}\"]\n")
    };
    let build = Build::new(
        &dockerfile(&unique_name("ssh")),
        &repo,
        "[linux/amd64]",
        "    ssh: [default]\n",
    );
    let out = run(build
        .command(None)
        .env("SSH_AUTH_SOCK", &agent.socket)
        .arg("--ssh")
        .arg(format!("work={}", agent.socket.display())));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let image = pull(&format!("{repo}:v1"), None);
    assert_eq!(image.file("ssh"), "ok");
    assert_eq!(image.file("ssh-work"), "ok");

    // No agent: a usage error naming the field, before any build.
    let out = run(build.command(None).env_remove("SSH_AUTH_SOCK"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("images.app.ssh[0]") && error.contains("SSH_AUTH_SOCK is not set"),
        "{}",
        text(&out)
    );
    assert!(!error.contains("[build]"), "something was built: {error}");

    // An id the Dockerfile requires but polyarch was not given: named, with the fix.
    std::fs::write(
        build.dir.path().join("Dockerfile"),
        dockerfile(&unique_name("ssh")),
    )
    .unwrap();
    let out = run(build.command(None).env("SSH_AUTH_SOCK", &agent.socket));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no SSH agent is forwarded as `work`"),
        "{}",
        text(&out)
    );
    eprintln!("ssh test: {:.1}s", started.elapsed().as_secs_f64());
}

/// (c) A base image in a registry with htpasswd auth: refused without credentials with a
/// message naming the registry, built with the credentials of a Docker config.json, and
/// with `--username/--password-stdin` when the image is pushed to that same registry.
fn private_base_image(docker_host: Option<&str>) {
    let started = Instant::now();
    let (user, pass) = ("builder", "base-pass-1");
    let private = Registry::start_htpasswd(user, pass);
    let public = Registry::start();
    let base_repo = private.repo(&unique_name("session/base"));
    let base = Build::new(HELLO, &base_repo, "[linux/amd64]", "");
    let out = run_with_stdin(
        base.command(docker_host)
            .args(["--username", user, "--password-stdin"]),
        pass,
    );
    assert_eq!(out.status.code(), Some(0), "base: {}", text(&out));

    let marker = unique_name("derived");
    let dockerfile = format!(
        "FROM {base_repo}:v1\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo {marker} > /derived\"]\n"
    );
    let app_repo = public.repo(&unique_name("session/app"));
    let app = Build::new(&dockerfile, &app_repo, "[linux/amd64]", "");
    let config = tempfile::tempdir().unwrap();

    // No credentials anywhere: the registry's refusal, naming the base.
    let out = run(app.command(docker_host).env("DOCKER_CONFIG", config.path()));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let error = String::from_utf8_lossy(&out.stderr);
    let error_line = error
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        error_line.contains(&private.host)
            && error_line.contains("docker login")
            && error_line.to_lowercase().contains("unauthorized"),
        "{}",
        text(&out)
    );

    // The Docker CLI's config.json, as `docker login` writes it.
    let auth = base64(format!("{user}:{pass}").as_bytes());
    std::fs::write(
        config.path().join("config.json"),
        format!(
            "{{\"auths\": {{\"{}\": {{\"auth\": \"{auth}\"}}}}}}",
            private.host
        ),
    )
    .unwrap();
    let out = run(app.command(docker_host).env("DOCKER_CONFIG", config.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let image = pull(&format!("{app_repo}:v1"), None);
    assert_eq!(image.file("derived"), marker);
    assert!(
        image.files.contains_key("bin/busybox"),
        "the base is missing"
    );

    // Pushed to the private registry itself: the command line's credentials serve the
    // base's pull too, with no config.json.
    let empty = tempfile::tempdir().unwrap();
    let own_repo = private.repo(&unique_name("session/own"));
    std::fs::write(
        &app.file,
        std::fs::read_to_string(&app.file)
            .unwrap()
            .replace(&app_repo, &own_repo),
    )
    .unwrap();
    let out = run_with_stdin(
        app.command(docker_host)
            .env("DOCKER_CONFIG", empty.path())
            .args(["--username", user, "--password-stdin"]),
        pass,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let image = pull(&format!("{own_repo}:v1"), Some((user, pass)));
    assert_eq!(image.file("derived"), marker);
    eprintln!(
        "private base on {}: {:.1}s",
        docker_host.unwrap_or("the given engine"),
        started.elapsed().as_secs_f64()
    );
}

/// Standard base64 with padding, as config.json's `auth` holds `user:password`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_private_base_image_is_pulled_with_docker_config_or_cli_credentials() {
    private_base_image(Some(MACHINE));
}

#[test]
fn a_private_base_image_is_pulled_on_docker26_containerd() {
    private_base_image(Some(&docker26_host("containerd")));
}

/// Two platforms with a RUN step that cross-compiles (runs on the build platform, so no
/// emulation) and writes a random marker per target platform: a cache hit keeps the
/// marker, a re-run prints MARKER and writes a new one.
fn cache_dockerfile(marker: &str) -> String {
    format!(
        "FROM --platform=$BUILDPLATFORM scratch AS gen\nARG BUILDARCH\nCOPY bin/${{BUILDARCH}}/busybox /bin/busybox\nARG TARGETARCH\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox cat /proc/sys/kernel/random/uuid > /marker && echo {marker}-$TARGETARCH\"]\nFROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nCOPY --from=gen /marker /marker\n"
    )
}

/// (d) `--cache-to` on Docker 26.1 with the containerd store writes one cache tag per
/// platform to a registry with htpasswd auth (credentials from the command line); an
/// engine that never ran the step (26.1's classic store) then takes it from that cache
/// with `--cache-from`. Docker 20.10 cannot export: one warning, and the build goes on.
#[test]
fn registry_cache_is_written_per_platform_and_read_back_by_another_engine() {
    let started = Instant::now();
    let (user, pass) = ("cacher", "cache-pass-1");
    let registry = Registry::start_htpasswd(user, pass);
    let repo = registry.repo(&unique_name("session/cached"));
    let cache = format!("{}:build", registry.repo(&unique_name("session/cache")));
    let marker = unique_name("cache-marker");
    let build = Build::new(
        &cache_dockerfile(&marker),
        &repo,
        "[linux/amd64, linux/arm64]",
        "",
    );
    let login = ["--username", user, "--password-stdin"];

    // As CI runs it, importing and exporting the same cache: on the first run there is
    // nothing to import yet, which is no failure.
    let containerd = docker26_host("containerd");
    let out = run_with_stdin(
        build
            .command(Some(&containerd))
            .args(["--cache-from", &cache, "--cache-to", &cache])
            .args(login),
        pass,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains(&format!(
            "warning: app linux/amd64: the cache {cache}-linux-amd64 could not be imported"
        )),
        "{}",
        text(&out)
    );
    // The step's own output line (its name shows the command too).
    let ran = |log: &str, arch: &str| log.contains(&format!("| {marker}-{arch}"));
    for arch in ["amd64", "arm64"] {
        assert!(
            ran(&log, arch),
            "the RUN step did not run for {arch}: {}",
            text(&out)
        );
    }
    let first = pull(&format!("{repo}:v1"), Some((user, pass)));
    // One cache per platform, neither overwriting the other.
    for platform in ["linux-amd64", "linux-arm64"] {
        let reference = format!("{cache}-{platform}");
        let cmd = run(Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("--creds={user}:{pass}"))
            .arg(format!("docker://{reference}")));
        assert!(
            cmd.status.success(),
            "no cache at {reference}: {}",
            text(&cmd)
        );
    }

    // An engine that never ran the step, importing: the step is not run again and the
    // image keeps the first build's marker.
    let classic = docker26_host("classic");
    let out = run_with_stdin(
        build
            .command(Some(&classic))
            .args(["--cache-from", &cache])
            .args(login),
        pass,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains(&format!(
            "importing cache manifest from {cache}-linux-amd64"
        )),
        "{}",
        text(&out)
    );
    for arch in ["amd64", "arm64"] {
        assert!(
            !ran(&log, arch),
            "the RUN step ran again for {arch}: {}",
            text(&out)
        );
    }
    let second = pull(&format!("{repo}:v1"), Some((user, pass)));
    assert_eq!(second.file("marker"), first.file("marker"));

    // Docker 20.10 (classic store): said once for both platforms, and built anyway.
    let out = run_with_stdin(
        build
            .command(Some(MACHINE))
            .args(["--cache-to", &cache])
            .args(login),
        pass,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("warning:") && l.contains("cannot export a registry cache"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", text(&out));
    eprintln!("cache test: {:.1}s", started.elapsed().as_secs_f64());
}

/// `--no-cache` runs every step again and skips polyarch's no-build warm path.
#[test]
fn no_cache_runs_every_step_again() {
    let started = Instant::now();
    let registry = Registry::start();
    let repo = registry.repo(&unique_name("session/nocache"));
    let marker = unique_name("nocache");
    let dockerfile = format!(
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${{TARGETARCH}}/busybox /bin/busybox\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"/bin/busybox cat /proc/sys/kernel/random/uuid > /marker && echo {marker}\"]\n"
    );
    let build = Build::new(&dockerfile, &repo, "[linux/amd64]", "");
    let ran = |out: &Output| String::from_utf8_lossy(&out.stderr).contains(&format!("| {marker}"));
    let first = run(&mut build.command(None));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(ran(&first), "{}", text(&first));
    let marker_of = || pull(&format!("{repo}:v1"), None).file("marker");
    let before = marker_of();

    let again = run(&mut build.command(None));
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(!ran(&again), "{}", text(&again));

    let fresh = run(build.command(None).arg("--no-cache"));
    assert_eq!(fresh.status.code(), Some(0), "{}", text(&fresh));
    assert!(ran(&fresh), "the step came from a cache: {}", text(&fresh));
    assert!(
        !String::from_utf8_lossy(&fresh.stderr).contains("inputs unchanged"),
        "{}",
        text(&fresh)
    );
    assert_ne!(marker_of(), before);
    eprintln!("no-cache test: {:.1}s", started.elapsed().as_secs_f64());
}

/// A tag the machine's engine holds, removed on drop.
struct LocalImage(String);

impl Drop for LocalImage {
    fn drop(&mut self) {
        let _ = run(Command::new("docker")
            .args(["image", "rm", "--force", &self.0])
            .env("DOCKER_HOST", MACHINE));
    }
}

/// `--pull` takes the base from its registry although the engine holds an older copy under
/// the same tag (the classic store's BuildKit prefers the engine's copy otherwise; on the
/// containerd store it resolves in the registry anyway).
#[test]
fn pull_takes_the_base_from_the_registry() {
    let started = Instant::now();
    let registry = Registry::start();
    let base_repo = registry.repo(&unique_name("session/pullbase"));
    let base_with = |generation: &str| {
        let dockerfile = format!("{HELLO}COPY generation /generation\n");
        let base = Build::new(&dockerfile, &base_repo, "[linux/amd64]", "");
        std::fs::write(base.dir.path().join("generation"), generation).unwrap();
        let out = run(&mut base.command(Some(MACHINE)));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    };
    base_with("old");
    let local = LocalImage(format!("{base_repo}:v1"));
    let out = run(Command::new("docker")
        .args(["pull", "--quiet", &local.0])
        .env("DOCKER_HOST", MACHINE));
    assert!(out.status.success(), "docker pull: {}", text(&out));
    base_with("new");

    let app_repo = registry.repo(&unique_name("session/pullapp"));
    let app = Build::new(
        &format!("FROM {base_repo}:v1\nCOPY bin/amd64/busybox /bin/app\n"),
        &app_repo,
        "[linux/amd64]",
        "",
    );
    let generation = || pull(&format!("{app_repo}:v1"), None).file("generation");
    let out = run(&mut app.command(Some(MACHINE)));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(generation(), "old", "the engine's copy is used by default");
    // No --rebuild: with --pull the warm path counts the base by its registry digest.
    let out = run(app.command(Some(MACHINE)).arg("--pull"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(generation(), "new");
    eprintln!("pull test: {:.1}s", started.elapsed().as_secs_f64());
}

//! Shared helpers for polyarch's integration tests. Use with `mod support;`.
//!
//! * [`Registry`]: a throw-away `docker-registry serve` (CNCF distribution v2,
//!   Debian package `docker-registry`) on a free 127.0.0.1 port, optionally with
//!   htpasswd auth and/or TLS; killed on drop.
//! * [`polyarch`]: a `Command` for the binary under test.
//! * [`busybox`]: path of the static busybox fixture for an architecture.
//! * [`skopeo_inspect_raw`], [`platforms_of`], [`skopeo_config`]: read back what was pushed.
//! * [`unique_name`]: collision-free names for repositories, tags, images.
#![allow(dead_code)]

pub mod binfmt;
pub mod buildkitd;
pub mod engines;
pub mod gate;
pub mod running;
pub mod supply_chain;
pub mod token;

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// Repository root (where Cargo.toml lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `Command` running the polyarch binary built for this test run.
pub fn polyarch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_polyarch"))
}

/// A name unique within this machine and run: `{prefix}-{pid}-{n}-{nanos}`
/// (lower-case, valid as a repository path component and as a tag).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{}-{:x}",
        prefix.to_ascii_lowercase(),
        std::process::id(),
        n,
        nanos
    )
}

// ------------------------------------------------------------------ fixtures

/// Path of Debian's static busybox for `arch` ("amd64" or "arm64"); runs
/// `fixtures/fetch-busybox.sh` when it is missing (that script locks, so
/// concurrent test binaries are fine).
pub fn busybox(arch: &str) -> PathBuf {
    let arch = match arch {
        "amd64" | "x86_64" | "linux/amd64" => "amd64",
        "arm64" | "aarch64" | "linux/arm64" | "linux/arm64/v8" => "arm64",
        other => panic!("no busybox fixture for architecture {other:?}"),
    };
    let path = repo_root()
        .join("fixtures/busybox")
        .join(arch)
        .join("busybox");
    if !path.is_file() {
        static FETCH: Mutex<()> = Mutex::new(());
        let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        if !path.is_file() {
            let out = Command::new("bash")
                .arg(repo_root().join("fixtures/fetch-busybox.sh"))
                .stdin(Stdio::null())
                .output()
                .expect("run fixtures/fetch-busybox.sh");
            assert!(
                out.status.success(),
                "fetch-busybox.sh failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(path.is_file(), "{} missing after fetch", path.display());
    path
}

// -------------------------------------------------------------------- skopeo

fn run_json(mut cmd: Command) -> serde_json::Value {
    let out = run_ok(&mut cmd);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{cmd:?}: output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn docker_ref(reference: &str) -> String {
    if reference.contains("://") {
        reference.to_string()
    } else {
        format!("docker://{reference}")
    }
}

/// `skopeo inspect --raw --tls-verify=false docker://REFERENCE`: the manifest
/// or index exactly as the registry serves it.
pub fn skopeo_inspect_raw(reference: &str) -> serde_json::Value {
    skopeo_inspect_raw_creds(reference, None)
}

/// The `os/architecture` of each entry of an index (as [`skopeo_inspect_raw`] reads it), in
/// the index's order: what a user names with `--platform`, so without the variant.
pub fn platforms_of(index: &serde_json::Value) -> Vec<String> {
    index["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("not an index: {index:#}"))
        .iter()
        .map(|m| {
            match (
                m["platform"]["os"].as_str(),
                m["platform"]["architecture"].as_str(),
            ) {
                (Some(os), Some(arch)) => format!("{os}/{arch}"),
                _ => panic!("an entry without a platform: {index:#}"),
            }
        })
        .collect()
}

/// The layer digests of an image manifest (as [`skopeo_inspect_raw`] reads it), in order.
pub fn layer_digests(manifest: &serde_json::Value) -> Vec<String> {
    manifest["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("not an image manifest: {manifest:#}"))
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// Like [`skopeo_inspect_raw`] with `--creds user:pass`.
pub fn skopeo_inspect_raw_creds(reference: &str, creds: Option<(&str, &str)>) -> serde_json::Value {
    let mut cmd = Command::new("skopeo");
    cmd.args(["inspect", "--raw", "--tls-verify=false"]);
    if let Some((u, p)) = creds {
        cmd.arg("--creds").arg(format!("{u}:{p}"));
    }
    cmd.arg(docker_ref(reference));
    run_json(cmd)
}

/// The image config (`skopeo inspect --config`) of the `linux/ARCH[/VARIANT]`
/// entry of REFERENCE (an index or a single manifest).
pub fn skopeo_config(reference: &str, arch: &str, variant: Option<&str>) -> serde_json::Value {
    let mut cmd = Command::new("skopeo");
    cmd.args(["--override-os", "linux", "--override-arch", arch]);
    if let Some(v) = variant {
        cmd.args(["--override-variant", v]);
    }
    cmd.args(["inspect", "--config", "--tls-verify=false"]);
    cmd.arg(docker_ref(reference));
    run_json(cmd)
}

// ------------------------------------------------------------------ registry

/// Options for [`Registry::start_with`].
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Require HTTP basic auth with this user and password (bcrypt htpasswd).
    pub htpasswd: Option<(String, String)>,
    /// Serve HTTPS with a leaf certificate (SAN IP:127.0.0.1) signed by a
    /// fresh test CA; see [`Registry::ca_cert_path`].
    pub tls: bool,
}

/// A running `docker-registry serve` on 127.0.0.1. Killed on drop.
pub struct Registry {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// `"127.0.0.1:PORT"`, for image references (`{host}/repo:tag`).
    pub host: String,
    /// Credentials when started with htpasswd.
    pub credentials: Option<(String, String)>,
    tls: bool,
    child: Child,
    dir: TempDir,
}

const REGISTRY_START_TIMEOUT: Duration = Duration::from_secs(10);
const REGISTRY_PORT_ATTEMPTS: usize = 5;

impl Registry {
    /// Plain HTTP, no auth.
    pub fn start() -> Registry {
        Self::start_with(RegistryOptions::default())
    }

    /// HTTP basic auth with the given credentials.
    pub fn start_htpasswd(user: &str, pass: &str) -> Registry {
        Self::start_with(RegistryOptions {
            htpasswd: Some((user.into(), pass.into())),
            tls: false,
        })
    }

    /// HTTPS with a test CA.
    pub fn start_tls() -> Registry {
        Self::start_with(RegistryOptions {
            htpasswd: None,
            tls: true,
        })
    }

    pub fn start_with(opts: RegistryOptions) -> Registry {
        Self::start_auth(opts, None)
    }

    /// `section`: the config's `auth:` section, when not the htpasswd one of `opts`.
    fn start_auth(opts: RegistryOptions, section: Option<String>) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("polyarch-registry-")
            .tempdir()
            .expect("registry temp dir");
        let root = dir.path();
        fs::create_dir_all(root.join("data")).unwrap();

        let mut auth = String::new();
        if let Some((user, pass)) = &opts.htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, pass])
                .stdin(Stdio::null())
                .output()
                .expect("run htpasswd (apache2-utils)");
            assert!(
                out.status.success(),
                "htpasswd failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            fs::write(root.join("htpasswd"), &out.stdout).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: polyarch-test\n    path: {}\n",
                root.join("htpasswd").display()
            );
        }
        if let Some(section) = section {
            auth = section;
        }
        if opts.tls {
            make_test_pki(root);
        }

        let mut last_log = String::new();
        for _ in 0..REGISTRY_PORT_ATTEMPTS {
            let port = free_port();
            let mut http = format!("http:\n  addr: 127.0.0.1:{port}\n");
            if opts.tls {
                http.push_str(&format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    root.join("server.crt").display(),
                    root.join("server.key").display()
                ));
            }
            let config = format!(
                "version: 0.1\n\
                 log:\n  level: info\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 {http}{auth}",
                root.join("data").display()
            );
            let config_path = root.join("config.yml");
            fs::write(&config_path, config).unwrap();
            let log_path = root.join("registry.log");
            let log = fs::File::create(&log_path).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry (Debian package docker-registry)");
            match wait_ready(&mut child, port, REGISTRY_START_TIMEOUT) {
                Ok(()) => {
                    return Registry {
                        port,
                        host: format!("127.0.0.1:{port}"),
                        credentials: opts.htpasswd.clone(),
                        tls: opts.tls,
                        child,
                        dir,
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_log = format!(
                        "{e}\n--- {}\n{}",
                        log_path.display(),
                        fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    if !last_log.contains("address already in use") {
                        panic!("docker-registry did not start: {last_log}");
                    }
                }
            }
        }
        panic!("docker-registry did not start after {REGISTRY_PORT_ATTEMPTS} ports: {last_log}");
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.host
        )
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// `{host}/{repository}`, e.g. `127.0.0.1:PORT/demo/hello`.
    pub fn repo(&self, repository: &str) -> String {
        format!("{}/{}", self.host, repository)
    }

    /// PEM of the CA that signed the server certificate (TLS registries only).
    pub fn ca_cert_path(&self) -> PathBuf {
        assert!(self.tls, "ca_cert_path() on a registry started without tls");
        self.dir.path().join("ca.crt")
    }

    /// A directory holding only `ca.crt`, usable as skopeo's `--cert-dir` or
    /// as `/etc/docker/certs.d/HOST/`-style trust directory.
    pub fn cert_dir(&self) -> PathBuf {
        assert!(self.tls, "cert_dir() on a registry started without tls");
        self.dir.path().join("certs.d")
    }

    /// The registry's config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yml")
    }

    /// Storage root (`storage.filesystem.rootdirectory`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Combined stdout/stderr of the registry so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// PID of the registry process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stop the registry now (also done on drop).
    pub fn stop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// Stop the registry (if running) and start it again on the same port, config and
    /// storage, as after a crash or a host reboot. The log is appended to.
    pub fn restart(&mut self) {
        self.stop();
        let log_path = self.dir.path().join("registry.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn docker-registry");
        if let Err(e) = wait_ready(&mut child, self.port, REGISTRY_START_TIMEOUT) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "docker-registry did not restart on port {}: {e}\n{}",
                self.port,
                self.log()
            );
        }
        self.child = child;
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago (bind 127.0.0.1:0, read, release).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Wait until `GET /v2/` gets any HTTP answer. A raw HTTP request works for
/// TLS listeners too: Go answers it with "HTTP/1.0 400 Bad Request".
fn wait_ready(child: &mut Child, port: u16, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("docker-registry exited early: {status}"));
        }
        if let Some(code) = http_status(port, "/v2/") {
            if code > 0 {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "GET /v2/ on port {port} did not answer within {timeout:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Status code of a plain-HTTP `GET path` on 127.0.0.1:port, `None` when
/// nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.take(4096).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Test PKI in `dir`: ca.key/ca.crt (CA:TRUE), server.key/server.crt signed
/// by it with SAN IP:127.0.0.1 (rustls refuses a self-signed CA as a leaf),
/// and certs.d/ca.crt.
fn make_test_pki(dir: &Path) {
    let p = |n: &str| dir.join(n);
    run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-sha256",
                "-days",
                "2",
                "-subj",
                "/CN=polyarch test CA",
            ])
            .arg("-keyout")
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("ca.crt"))
            .args([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]),
    );
    run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-sha256",
                "-subj",
                "/CN=127.0.0.1",
            ])
            .arg("-keyout")
            .arg(p("server.key"))
            .arg("-out")
            .arg(p("server.csr")),
    );
    fs::write(
        p("server.ext"),
        "basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\n\
         subjectAltName=IP:127.0.0.1\n",
    )
    .unwrap();
    run_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-sha256", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(p("server.csr"))
            .arg("-CA")
            .arg(p("ca.crt"))
            .arg("-CAkey")
            .arg(p("ca.key"))
            .arg("-extfile")
            .arg(p("server.ext"))
            .arg("-out")
            .arg(p("server.crt")),
    );
    fs::create_dir_all(p("certs.d")).unwrap();
    fs::copy(p("ca.crt"), p("certs.d/ca.crt")).unwrap();
}

/// The Dockerfile of the FROM-scratch busybox fixture: one static binary per platform.
pub const HELLO: &str = "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"echo\", \"hello\"]\n";

/// A FROM-scratch context holding Debian's static busybox for each platform.
pub fn hello_context(dir: &Path, dockerfile: &str) {
    fs::write(dir.join("Dockerfile"), dockerfile).unwrap();
    for arch in ["amd64", "arm64"] {
        let bin = dir.join("bin").join(arch);
        fs::create_dir_all(&bin).unwrap();
        fs::copy(busybox(arch), bin.join("busybox")).unwrap();
    }
}

/// A one-image `polyarch.yaml` in `dir` (context `.`).
pub fn write_project(dir: &Path, repository: &str, tags: &str, platforms: &str) -> PathBuf {
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  hello:\n    repository: {repository}\n    tags: {tags}\n    context: .\n    platforms: {platforms}\n"
        ),
    )
    .unwrap();
    file
}

/// Runs a command with no standard input.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run command")
}

/// Runs a command with `input` on its standard input (`--password-stdin`).
pub fn run_with_stdin(cmd: &mut Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the command");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("command output")
}

/// Digest of what `reference` resolves to, read from the registry with skopeo: the
/// sha256 of the manifest's raw bytes.
pub fn skopeo_digest(reference: &str, creds: Option<(&str, &str)>) -> String {
    let mut cmd = Command::new("skopeo");
    cmd.args(["inspect", "--tls-verify=false", "--raw"]);
    if let Some((u, p)) = creds {
        cmd.arg("--creds").arg(format!("{u}:{p}"));
    }
    let out = run(cmd.arg(docker_ref(reference)));
    assert!(
        out.status.success(),
        "skopeo inspect {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    polyarch::base::oci::sha256_digest(&out.stdout)
}

/// `curl -fsS ARGS`; panics with curl's message when it fails.
pub fn curl(args: &[&str]) -> Vec<u8> {
    let out = run(Command::new("curl").args(["-fsS"]).args(args));
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Registry {
    /// PUTs a raw manifest under `reference` (tag or digest), as other tools push them;
    /// returns its digest.
    pub fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        body: &[u8],
        media_type: &str,
    ) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.json");
        std::fs::write(&file, body).unwrap();
        curl(&[
            "-X",
            "PUT",
            "-H",
            &format!("Content-Type: {media_type}"),
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("http://{}/v2/{repo}/manifests/{reference}", self.host),
        ]);
        polyarch::base::oci::sha256_digest(body)
    }

    /// Uploads `body` as a blob of `repo` (an upload session, then its one PUT); returns
    /// its digest.
    pub fn put_blob(&self, repo: &str, body: &[u8]) -> String {
        let digest = polyarch::base::oci::sha256_digest(body);
        let headers = curl(&[
            "-X",
            "POST",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("http://{}/v2/{repo}/blobs/uploads/", self.host),
        ]);
        let headers = String::from_utf8_lossy(&headers);
        let location = headers
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
            })
            .map(|(_, v)| v.trim().to_string())
            .expect("an upload location");
        let location = match location.starts_with('/') {
            true => format!("http://{}{location}", self.host),
            false => location,
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("blob");
        std::fs::write(&file, body).unwrap();
        curl(&[
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("{location}{separator}digest={digest}"),
        ]);
        digest
    }
}

/// A command that runs cargo as a user would: without what `cargo test` sets for the
/// test itself (CARGO_PKG_*, CARGO_PRIMARY_PACKAGE, …), which would reach the inner
/// build's crates and make it another build than a user's; the target directory is this
/// test run's, so the release build is made once for every test using it.
pub fn as_a_user_runs_cargo(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" {
            cmd.env_remove(key);
        }
    }
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    cmd.env(
        "CARGO_TARGET_DIR",
        tmp.parent().expect("target/tmp has a parent"),
    )
}

/// Waits until every file under `dir` last changed more than `age` ago, as a context
/// long in place has.
pub fn wait_until_settled(dir: &std::path::Path, age: std::time::Duration) {
    use std::os::unix::fs::MetadataExt;
    let newest = |dir: &std::path::Path| {
        let mut newest = 0i64;
        let mut pending = vec![dir.to_path_buf()];
        while let Some(d) = pending.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let entry = entry.unwrap();
                let meta = entry.metadata().unwrap();
                newest = newest.max(meta.ctime());
                if meta.is_dir() {
                    pending.push(entry.path());
                }
            }
        }
        newest
    };
    let settled_before = |newest: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        // Whole seconds: the newest ctime rounded down, so one more second is added.
        now.as_secs() as i64 > newest + age.as_secs() as i64 + 1
    };
    while !settled_before(newest(dir)) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

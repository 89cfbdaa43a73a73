//! Builders on other hosts (issue 14): each test makes its own host, a network namespace
//! joined to this one by a veth pair (198.18.230.0/24), running Docker 26.1's dockerd
//! (scripts/engine26.sh installs it; containerd image store) listening on
//! `tcp://ADDR:2376` with `--tlsverify`, and, for ssh, an sshd with throw-away keys. The
//! engine sees neither this machine's files nor its loopback: polyarch sends the context
//! through the BuildKit session and, although that store could push by itself, exports
//! the image from the engine and pushes it to the loopback registry itself.
//!
//! Everything a test starts is stopped and removed on drop (dockerd, sshd, the
//! namespace with its veth pair, temp dirs), also when it fails. The tests are named
//! `netns_*`: they bring their own engine, so `make test` runs them once, not again in
//! its Docker 26.1 pass.

mod support;

use serde_json::Value;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::{hello_context, polyarch, repo_root, run, unique_name, Registry, HELLO};

const START_TIMEOUT: Duration = Duration::from_secs(40);
const ENGINE_PORT: u16 = 2376;

/// Runs `bash -c SCRIPT`; panics with its output when it fails.
fn sh(script: &str) -> String {
    let out = run(Command::new("bash").args(["-euo", "pipefail", "-c", script]));
    assert!(
        out.status.success(),
        "{script}\nfailed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The 26.1 prefix (`scripts/engine26.sh install`; a quick check when installed).
fn docker26_prefix() -> PathBuf {
    sh(&format!(
        "bash {}/scripts/engine26.sh install >&2",
        repo_root().display()
    ));
    let bin = PathBuf::from(
        sh(&format!(
            "bash {}/scripts/engine26.sh bin",
            repo_root().display()
        ))
        .trim(),
    );
    bin.parent()
        .and_then(Path::parent)
        .expect("prefix/usr/bin")
        .to_path_buf()
}

/// A test host: a network namespace with a veth pair, its dockerd (TLS on
/// `tcp://ADDR:2376`, a unix socket for ssh's `dial-stdio`) and optionally sshd.
struct TestHost {
    netns: String,
    /// The namespace's address (this machine's side of the veth pair is the one before).
    addr: String,
    dir: tempfile::TempDir,
    dockerd: Option<Child>,
    sshd: Option<Child>,
}

impl TestHost {
    fn new() -> TestHost {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // A /30 per host; pid and counter keep parallel runs apart.
        let block = (pid.wrapping_mul(7).wrapping_add(n * 13)) % 63;
        let host_addr = format!("198.18.230.{}", block * 4 + 1);
        let addr = format!("198.18.230.{}", block * 4 + 2);
        let netns = format!("pa14-{pid}-{n}");
        // Interface names: at most 15 bytes.
        let tag = format!("{:x}", (pid << 4) | (n & 0xf));
        let (veth_host, veth_ns) = (format!("pa14h{tag}"), format!("pa14n{tag}"));
        let dir = tempfile::Builder::new()
            .prefix("pa14-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let host = TestHost {
            netns: netns.clone(),
            addr: addr.clone(),
            dir,
            dockerd: None,
            sshd: None,
        };
        sh(&format!(
            "ip netns add {netns}
             ip link add {veth_host} type veth peer name {veth_ns} netns {netns}
             ip addr add {host_addr}/30 dev {veth_host}
             ip link set {veth_host} up
             ip -n {netns} addr add {addr}/30 dev {veth_ns}
             ip -n {netns} link set {veth_ns} up
             ip -n {netns} link set lo up"
        ));
        host
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn socket(&self) -> PathBuf {
        self.path("docker.sock")
    }

    /// A command run inside the namespace. `nsenter --net` only: `ip netns exec` would
    /// remount /sys, which breaks dockerd's cgroups.
    fn in_netns(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        cmd
    }

    /// CA, server certificate for the namespace's address, a client certificate, and a
    /// client certificate from another CA (`rogue`), as PEM files in the host's dir.
    fn make_pki(&self) {
        sh(&format!(
            r#"cd {dir}
            ca() {{ openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
                 -subj "/CN=$2" -keyout $1-key.pem -out $1.pem \
                 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null; }}
            leaf() {{ openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
                 -keyout $1-key.pem -out $1.csr 2>/dev/null
                 printf '%b\n' "$3" > $1.ext
                 openssl x509 -req -sha256 -days 2 -in $1.csr -CA $2.pem -CAkey $2-key.pem -CAcreateserial \
                 -extfile $1.ext -out $1.pem 2>/dev/null; }}
            ca ca "polyarch test engine CA"
            ca rogue "polyarch rogue CA"
            leaf server ca "subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth"
            leaf client ca "extendedKeyUsage=clientAuth"
            leaf intruder rogue "extendedKeyUsage=clientAuth""#,
            dir = self.dir.path().display(),
            addr = self.addr
        ));
    }

    /// Docker 26.1 in the namespace: own data root, exec root, pidfile, containerd
    /// namespaces and config file, no bridge, TLS with client certificates on the veth
    /// address, a unix socket for `docker system dial-stdio`.
    fn start_dockerd(&mut self) {
        self.make_pki();
        let prefix = docker26_prefix();
        // The containerd image store: an engine that pushes by itself when it reaches
        // the registry, which a loopback registry on this machine it does not.
        fs::write(
            self.path("daemon.json"),
            "{\"features\": {\"containerd-snapshotter\": true}}\n",
        )
        .unwrap();
        let log = fs::File::create(self.path("dockerd.log")).unwrap();
        let namespace = format!("polyarch-{}", self.netns);
        let path = format!(
            "{}:{}:{}",
            prefix.join("usr/bin").display(),
            prefix.join("usr/sbin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = self
            .in_netns(&prefix.join("usr/sbin/dockerd"))
            .arg("--config-file")
            .arg(self.path("daemon.json"))
            .arg("--data-root")
            .arg(self.path("data"))
            .arg("--exec-root")
            .arg(self.path("exec"))
            .arg("--pidfile")
            .arg(self.path("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("-H")
            .arg(format!("tcp://{}:{ENGINE_PORT}", self.addr))
            .arg("--tlsverify")
            .arg("--tlscacert")
            .arg(self.path("ca.pem"))
            .arg("--tlscert")
            .arg(self.path("server.pem"))
            .arg("--tlskey")
            .arg(self.path("server-key.pem"))
            .args(["--bridge", "none", "--iptables=false", "--ip6tables=false"])
            .arg("--containerd-namespace")
            .arg(&namespace)
            .arg("--containerd-plugins-namespace")
            .arg(format!("{namespace}-plugins"))
            .env("PATH", path)
            .env_remove("DOCKER_HOST")
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .env_remove("DOCKER_CONTEXT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn nsenter dockerd");
        self.dockerd = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.ping() {
            if let Some(Ok(Some(status))) = self.dockerd.as_mut().map(Child::try_wait) {
                panic!("dockerd exited ({status}):\n{}", self.log("dockerd.log"));
            }
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer within {START_TIMEOUT:?}:\n{}",
                self.log("dockerd.log")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The TLS listener comes up with the unix one; wait for it too.
        while std::net::TcpStream::connect((self.addr.as_str(), ENGINE_PORT)).is_err() {
            assert!(Instant::now() < deadline, "dockerd's TLS port never opened");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains(" 200 ")
    }

    /// sshd in the namespace on port 22 with a throw-away host key, letting in a
    /// throw-away client key; its sessions reach the namespace's dockerd. Returns a
    /// directory holding an `ssh` that uses this host's own client config (alias
    /// `arm-box`), for the front of polyarch's PATH: the machine's ~/.ssh stays untouched.
    fn start_sshd(&mut self) -> PathBuf {
        let dir = self.dir.path().display().to_string();
        let docker26_bin = docker26_prefix().join("usr/bin");
        sh(&format!(
            r#"cd {dir}
            ssh-keygen -q -t ed25519 -N '' -f host_key
            ssh-keygen -q -t ed25519 -N '' -f client_key
            cp client_key.pub authorized_keys
            echo "{addr} $(cut -d' ' -f1,2 host_key.pub)" > known_hosts
            cat > sshd_config <<EOF
Port 22
ListenAddress {addr}
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SetEnv DOCKER_HOST=unix://{dir}/docker.sock PATH={docker26_bin}:/usr/local/bin:/usr/bin:/bin
EOF
            cat > ssh_config <<EOF
Host arm-box
  HostName {addr}
  User root
  IdentityFile {dir}/client_key
  IdentitiesOnly yes
  UserKnownHostsFile {dir}/known_hosts
  StrictHostKeyChecking yes
  LogLevel ERROR
EOF
            mkdir -p bin
            printf '#!/bin/sh\nexec /usr/bin/ssh -F {dir}/ssh_config "$@"\n' > bin/ssh
            chmod +x bin/ssh"#,
            addr = self.addr,
            docker26_bin = docker26_bin.display(),
        ));
        // sshd's privilege separation directory, as its service would make it.
        fs::create_dir_all("/run/sshd").unwrap();
        let log = fs::File::create(self.path("sshd.log")).unwrap();
        let child = self
            .in_netns(Path::new("/usr/sbin/sshd"))
            .args(["-D", "-e", "-f"])
            .arg(self.path("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn sshd (Debian openssh-server)");
        self.sshd = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect((self.addr.as_str(), 22)).is_err() {
            if let Some(Ok(Some(status))) = self.sshd.as_mut().map(Child::try_wait) {
                panic!("sshd exited ({status}):\n{}", self.log("sshd.log"));
            }
            assert!(Instant::now() < deadline, "sshd never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.path("bin")
    }

    fn log(&self, name: &str) -> String {
        let text = fs::read_to_string(self.path(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

fn stop(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut sshd) = self.sshd.take() {
            stop(&mut sshd, Duration::from_secs(5));
        }
        if let Some(mut dockerd) = self.dockerd.take() {
            stop(&mut dockerd, Duration::from_secs(15));
            // A containerd left behind by a killed dockerd.
            if let Some(pid) = fs::read_to_string(self.path("exec/containerd/containerd.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
            {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        // What a killed dockerd leaves in its namespace (containerd's shims).
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        // Removes the namespace's end of the veth pair, and with it this machine's.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        // dockerd may leave its data root or snapshots mounted.
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.path("data"))
            .stderr(Stdio::null())
            .status();
    }
}

/// A two-platform project whose linux/arm64 builder is `builder` (YAML, as written).
fn project(dir: &Path, repository: &str, builder: &str) -> PathBuf {
    hello_context(dir, HELLO);
    fs::write(dir.join("nonce"), unique_name("nonce")).unwrap();
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nbuilders:\n  linux/arm64: {builder}\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n"
        ),
    )
    .unwrap();
    file
}

fn polyarch_in(envs: &[(&str, &str)]) -> Command {
    let mut cmd = polyarch();
    cmd.env_remove("DOCKER_CONTEXT")
        .env_remove("DOCKER_TLS_VERIFY")
        .env_remove("DOCKER_CERT_PATH");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// Builds, checks the record names the builder for linux/arm64 and that the pushed index
/// verifies; returns the time taken.
fn build_and_verify(
    file: &Path,
    repo: &str,
    envs: &[(&str, &str)],
    builder: &str,
    host: &TestHost,
) -> Duration {
    let started = Instant::now();
    let out = run(polyarch_in(envs)
        .args(["build", "--output-format", "json", "-f"])
        .arg(file));
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "build with {builder} failed:\n{stderr}\n--- dockerd:\n{}",
        host.log("dockerd.log")
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");
    let arm = record["images"][0]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["platform"] == "linux/arm64")
        .unwrap_or_else(|| panic!("no arm64 entry: {record:#}"));
    assert!(
        arm["build"]["builder"]
            .as_str()
            .is_some_and(|b| b.contains(builder)),
        "arm64 not built by {builder}: {arm:#}"
    );
    let verify = run(polyarch()
        .args(["verify", &format!("{repo}:v1")])
        .args(["--platform", "linux/amd64,linux/arm64"]));
    assert_eq!(
        verify.status.code(),
        Some(0),
        "verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    took
}

/// A Docker context as `docker context create NAME --docker host=…,ca=…,cert=…,key=…`
/// writes it, in a fresh DOCKER_CONFIG.
fn docker_context(config: &Path, name: &str, host: &str, tls_from: &TestHost) {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(name.as_bytes()));
    let meta = config.join("contexts/meta").join(&hash);
    fs::create_dir_all(&meta).unwrap();
    fs::write(
        meta.join("meta.json"),
        serde_json::json!({
            "Name": name,
            "Metadata": {},
            "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": false}}
        })
        .to_string(),
    )
    .unwrap();
    let tls = config.join("contexts/tls").join(&hash).join("docker");
    fs::create_dir_all(&tls).unwrap();
    for (from, to) in [
        ("ca.pem", "ca.pem"),
        ("client.pem", "cert.pem"),
        ("client-key.pem", "key.pem"),
    ] {
        fs::copy(tls_from.path(from), tls.join(to)).unwrap();
    }
    fs::write(config.join("config.json"), "{}\n").unwrap();
}

/// Copies the TLS files a project names (relative to it) into `dir/certs`.
fn certs_into(dir: &Path, host: &TestHost, files: &[(&str, &str)]) {
    fs::create_dir_all(dir.join("certs")).unwrap();
    for (from, to) in files {
        fs::copy(host.path(from), dir.join("certs").join(to)).unwrap();
    }
}

#[test]
fn netns_builders_over_tls_a_context_and_ssh_build_arm64() {
    let mut host = TestHost::new();
    host.start_dockerd();
    let ssh_bin = host.start_sshd();
    let registry = Registry::start();
    let tcp = format!("tcp://{}:{ENGINE_PORT}", host.addr);
    let mut timings = Vec::new();

    // 1. tcp:// with the project's own tls files, relative to the project file.
    let dir = tempfile::tempdir().unwrap();
    certs_into(
        dir.path(),
        &host,
        &[
            ("ca.pem", "ca.pem"),
            ("client.pem", "cert.pem"),
            ("client-key.pem", "key.pem"),
        ],
    );
    let repo = registry.repo(&unique_name("remote/tls"));
    let file = project(
        dir.path(),
        &repo,
        &format!("{{host: \"{tcp}\", tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}"),
    );
    // doctor reaches the builder over TLS, BuildKit's /grpc included.
    let doctor = run(polyarch_in(&[]).args(["doctor", "-f"]).arg(&file));
    let text = String::from_utf8_lossy(&doctor.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("builder linux/arm64"))
        .unwrap_or_else(|| panic!("no builder line in doctor:\n{text}"));
    assert!(
        line.starts_with("ok") && line.contains("BuildKit answers") && line.contains("(TLS)"),
        "{line}"
    );
    timings.push(("tls", build_and_verify(&file, &repo, &[], &tcp, &host)));

    // 2. A Docker context with TLS material, by name.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("docker-config");
    docker_context(&config, "arm-native", &tcp, &host);
    let repo = registry.repo(&unique_name("remote/context"));
    let file = project(dir.path(), &repo, "arm-native");
    let config = config.display().to_string();
    // The default engine by DOCKER_CONTEXT, and by DOCKER_HOST with DOCKER_TLS_VERIFY and
    // DOCKER_CERT_PATH, as the Docker CLI reads them.
    let cert_path = dir.path().join("cert-path");
    certs_into(
        &cert_path,
        &host,
        &[
            ("ca.pem", "ca.pem"),
            ("client.pem", "cert.pem"),
            ("client-key.pem", "key.pem"),
        ],
    );
    let cert_path = cert_path.join("certs").display().to_string();
    for envs in [
        vec![
            ("DOCKER_CONFIG", config.as_str()),
            ("DOCKER_CONTEXT", "arm-native"),
        ],
        vec![
            ("DOCKER_HOST", tcp.as_str()),
            ("DOCKER_TLS_VERIFY", "1"),
            ("DOCKER_CERT_PATH", cert_path.as_str()),
        ],
    ] {
        let mut doctor = polyarch_in(&[]);
        doctor.env_remove("DOCKER_HOST").arg("doctor");
        for (k, v) in &envs {
            doctor.env(k, v);
        }
        let out = run(&mut doctor);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines()
                .any(|l| l.starts_with("ok") && l.contains(" engine ") && l.contains(&tcp)),
            "{envs:?}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    timings.push((
        "context",
        build_and_verify(
            &file,
            &repo,
            &[("DOCKER_CONFIG", &config)],
            "arm-native",
            &host,
        ),
    ));

    // 3. ssh:// through the system ssh, with a host alias from the ssh config.
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("remote/ssh"));
    let file = project(dir.path(), &repo, "ssh://arm-box");
    let path = format!(
        "{}:{}",
        ssh_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    timings.push((
        "ssh",
        build_and_verify(&file, &repo, &[("PATH", &path)], "ssh://arm-box", &host),
    ));

    // 4. A list: the down builder is left out with a warning, and each image's arm64
    //    build goes to the builder it is sticky to, or after the down one to the next
    //    (the same engine, reached two ways).
    let dir = tempfile::tempdir().unwrap();
    certs_into(
        dir.path(),
        &host,
        &[
            ("ca.pem", "ca.pem"),
            ("client.pem", "cert.pem"),
            ("client-key.pem", "key.pem"),
        ],
    );
    hello_context(dir.path(), HELLO);
    let down = format!("tcp://{}:{}", host.addr, ENGINE_PORT + 1);
    let repos = [
        registry.repo(&unique_name("remote/one")),
        registry.repo(&unique_name("remote/two")),
    ];
    let image = |name: &str, repo: &str| {
        format!("  {name}:\n    repository: {repo}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n")
    };
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nbuilders:\n  linux/arm64:\n    - {down}\n    - {{host: \"{tcp}\", tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}\n    - ssh://arm-box\nimages:\n{}{}",
            image("one", &repos[0]),
            image("two", &repos[1])
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run(polyarch_in(&[("PATH", &path)])
        .args(["build", "--output-format", "json", "-f"])
        .arg(&file));
    timings.push(("list", started.elapsed()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("\"warning\"")
            && l.contains(&down)
            && l.contains("other builders")),
        "no warning about the down builder:\n{stderr}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    let arm_builder = |i: usize| {
        record["images"][i]["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["platform"] == "linux/arm64")
            .and_then(|p| p["build"]["builder"].as_str())
            .unwrap_or_else(|| panic!("no arm64 builder: {record:#}"))
            .to_string()
    };
    let sticky = |name: &str, repo: &str| match polyarch::builder::sticky_slot(
        &polyarch::builder::sticky_key(repo, name),
        3,
    ) {
        2 => "ssh://arm-box".to_string(),
        _ => tcp.clone(),
    };
    assert_eq!(
        [arm_builder(0), arm_builder(1)],
        [sticky("one", &repos[0]), sticky("two", &repos[1])],
        "{record:#}"
    );
    assert_eq!(record["covered"], true, "{record:#}");
    eprintln!("remote builds: {timings:?}");
}

/// Runs a build that must fail before building: exit 3, one error line naming the
/// builder with `expected` in it, nothing pushed.
fn refused(file: &Path, registry: &Registry, expected: &[&str]) {
    let out: Output = run(polyarch_in(&[]).args(["build", "-f"]).arg(file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let error = errors[0];
    assert!(error.contains("builder for linux/arm64"), "{error}");
    for word in expected {
        assert!(error.contains(word), "no `{word}` in: {error}");
    }
    assert!(
        !stderr.contains("[build") && !stderr.contains("[push]"),
        "a build or push started:\n{stderr}"
    );
    let repositories = registry.data_dir().join("docker/registry/v2/repositories");
    assert!(
        fs::read_dir(&repositories).map_or(true, |mut d| d.next().is_none()),
        "something was pushed"
    );
    eprintln!("{error}");
}

#[test]
fn netns_down_untrusted_and_refused_builders_fail_before_building_or_fall_back() {
    let mut host = TestHost::new();
    host.start_dockerd();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    certs_into(
        dir.path(),
        &host,
        &[
            ("ca.pem", "ca.pem"),
            ("client.pem", "cert.pem"),
            ("client-key.pem", "key.pem"),
            ("rogue.pem", "rogue-ca.pem"),
            ("intruder.pem", "intruder.pem"),
            ("intruder-key.pem", "intruder-key.pem"),
        ],
    );
    let repo = registry.repo(&unique_name("remote/refused"));
    let tls = |port: u16, ca: &str, cert: &str, key: &str| {
        format!(
            "{{host: \"tcp://{}:{port}\", tls: {{ca: certs/{ca}, cert: certs/{cert}, key: certs/{key}}}}}",
            host.addr
        )
    };

    // Nothing listens on that port in the namespace: down.
    let file = project(
        dir.path(),
        &repo,
        &tls(ENGINE_PORT + 1, "ca.pem", "cert.pem", "key.pem"),
    );
    refused(
        &file,
        &registry,
        &["is down or unreachable", "start dockerd"],
    );

    // A CA that did not sign the engine's certificate.
    let file = project(
        dir.path(),
        &repo,
        &tls(ENGINE_PORT, "rogue-ca.pem", "cert.pem", "key.pem"),
    );
    refused(&file, &registry, &["not trusted", "give the CA"]);

    // A client certificate the engine's CA did not sign.
    let file = project(
        dir.path(),
        &repo,
        &tls(ENGINE_PORT, "ca.pem", "intruder.pem", "intruder-key.pem"),
    );
    refused(
        &file,
        &registry,
        &["refused the client certificate", "--tlscacert"],
    );

    // TLS engine spoken to in plain HTTP.
    let file = project(
        dir.path(),
        &repo,
        &format!("tcp://{}:{ENGINE_PORT}", host.addr),
    );
    refused(&file, &registry, &["tls"]);

    // ssh to a port where no sshd listens: ssh's own message, and what to try.
    let file = project(dir.path(), &repo, &format!("ssh://root@{}:2222", host.addr));
    refused(&file, &registry, &["Connection refused", "docker version"]);

    // A builder on another host cannot pull what a dependent builds FROM from this
    // machine's loopback registry: refused before anything is built (exit 2).
    let deps = tempfile::tempdir().unwrap();
    fs::create_dir_all(deps.path().join("app")).unwrap();
    fs::write(deps.path().join("app/Dockerfile"), "FROM polyarch:hello\n").unwrap();
    let file = project(
        deps.path(),
        &repo,
        &tls(ENGINE_PORT, "ca.pem", "cert.pem", "key.pem"),
    );
    certs_into(
        deps.path(),
        &host,
        &[
            ("ca.pem", "ca.pem"),
            ("client.pem", "cert.pem"),
            ("client-key.pem", "key.pem"),
        ],
    );
    let app = format!(
        "  app:\n    repository: {}\n    tags: [v1]\n    context: app\n    platforms: [linux/amd64, linux/arm64]\n",
        registry.repo(&unique_name("remote/app"))
    );
    fs::write(&file, fs::read_to_string(&file).unwrap() + &app).unwrap();
    let out = run(polyarch_in(&[]).args(["build", "-f"]).arg(&file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert!(
        errors.len() == 1
            && errors[0].contains("app linux/arm64 builds FROM hello")
            && errors[0].contains("cannot pull")
            && errors[0].contains("this machine's loopback"),
        "{stderr}"
    );
    assert!(!stderr.contains("[build"), "a build started:\n{stderr}");

    // The down builder with `fallback: emulate`: arm64 builds on the default engine, and
    // the output and the record say so.
    let down = format!("tcp://{}:{}", host.addr, ENGINE_PORT + 1);
    let file = project(
        dir.path(),
        &repo,
        &format!("{{host: \"{down}\", fallback: emulate}}"),
    );
    let out = run(polyarch_in(&[])
        .args(["build", "--output-format", "json", "-f"])
        .arg(&file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("\"warning\"")
            && l.contains(&down)
            && l.contains("fallback: emulate")),
        "no fallback warning:\n{stderr}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("record");
    let arm = record["images"][0]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["platform"] == "linux/arm64")
        .unwrap_or_else(|| panic!("no arm64 entry: {record:#}"));
    assert!(
        arm["build"]["fallback"]
            .as_str()
            .is_some_and(|f| f.contains(&down) && f.contains("unreachable")),
        "{arm:#}"
    );
    assert!(
        arm["build"]["builder"]
            .as_str()
            .is_some_and(|b| !b.contains(&host.addr)),
        "{arm:#}"
    );
    assert_eq!(record["covered"], true, "{record:#}");
}

/// The builder map entry for `host` over TLS, its files copied into `dir/certs` under
/// `name`-prefixed names.
fn tls_builder(dir: &Path, host: &TestHost, name: &str) -> String {
    let (ca, cert, key) = (
        format!("{name}-ca.pem"),
        format!("{name}-cert.pem"),
        format!("{name}-key.pem"),
    );
    certs_into(
        dir,
        host,
        &[
            ("ca.pem", &ca),
            ("client.pem", &cert),
            ("client-key.pem", &key),
        ],
    );
    format!(
        "{{host: \"tcp://{}:{ENGINE_PORT}\", tls: {{ca: certs/{ca}, cert: certs/{cert}, key: certs/{key}}}}}",
        host.addr
    )
}

/// Kills every process whose command line holds `nonce` (the test's own RUN step, left
/// running by a killed engine).
fn kill_holding(nonce: &str) {
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(nonce) {
            let pid = entry.file_name().to_string_lossy().into_owned();
            let _ = Command::new("kill")
                .args(["-KILL", &pid])
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[test]
fn netns_a_build_whose_builder_is_lost_is_built_again_on_the_next_one() {
    let mut lost = TestHost::new();
    lost.start_dockerd();
    let mut next = TestHost::new();
    next.start_dockerd();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let repo = registry.repo(&unique_name("remote/retried"));
    let nonce = unique_name("retried");
    // The RUN step waits as many seconds as `wait` says: long on the first builder, which
    // the test kills meanwhile, none on the next (the context is sent again). The nonce
    // is the shell's $0, so the step left running on the killed engine can be found.
    hello_context(
        dir.path(),
        &format!(
            "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\nCOPY wait /wait\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"i=0; while [ $i -lt $(/bin/busybox cat /wait) ]; do /bin/busybox sleep 1; i=$((i+1)); done; /bin/busybox echo built > /built\", \"{nonce}\"]\n"
        ),
    );
    fs::write(dir.path().join("wait"), "120\n").unwrap();
    let mut builders = [
        tls_builder(dir.path(), &lost, "lost"),
        tls_builder(dir.path(), &next, "next"),
    ];
    // The image goes to the builder it is sticky to: put the one to lose there.
    if polyarch::builder::sticky_slot(&polyarch::builder::sticky_key(&repo, "retried"), 2) == 1 {
        builders.reverse();
    }
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nbuilders:\n  linux/amd64: [{}]\nimages:\n  retried:\n    repository: {repo}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n    network: none\n",
            builders.join(", ")
        ),
    )
    .unwrap();

    let mut child = polyarch_in(&[])
        .args(["build", "--output-format", "json", "-f"])
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn polyarch");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = Vec::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all
    });
    let mut stdout = child.stdout.take().unwrap();
    let record = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    // The RUN step started on the first builder: then it is lost.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the RUN step never started:\n{}", lost.log("dockerd.log"))
        });
        if line.contains("\"event\":\"step\"") && line.contains("RUN") {
            break;
        }
    }
    fs::write(dir.path().join("wait"), "0\n").unwrap();
    lost.dockerd.as_mut().unwrap().kill().unwrap();
    let status = child.wait().unwrap();
    kill_holding(&nonce);
    let stderr = reader.join().unwrap().join("\n");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("\"warning\"")
            && l.contains("was lost during the build")
            && l.contains(&format!("builder tcp://{}:", lost.addr))
            && l.contains(&format!("building again on tcp://{}:", next.addr))),
        "no retry warning:\n{stderr}"
    );
    let record: Value = serde_json::from_str(&record.join().unwrap()).expect("record");
    assert_eq!(record["covered"], true, "{record:#}");
    let amd = &record["images"][0]["platforms"][0];
    assert_eq!(amd["platform"], "linux/amd64", "{record:#}");
    assert!(
        amd["build"]["builder"]
            .as_str()
            .is_some_and(|b| b.contains(&next.addr)),
        "{amd:#}"
    );
    let verify = run(polyarch()
        .args(["verify", &format!("{repo}:v1")])
        .args(["--platform", "linux/amd64"]));
    assert_eq!(
        verify.status.code(),
        Some(0),
        "verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    // The pushed image holds what the RUN step wrote on the next builder.
    let copy = tempfile::tempdir().unwrap();
    let built = sh(&format!(
        "skopeo copy -q --src-tls-verify=false docker://{repo}:v1 dir:{out}
         for blob in {out}/*; do tar -xzOf \"$blob\" built 2>/dev/null || true; done",
        out = copy.path().display()
    ));
    assert_eq!(built.trim(), "built", "{stderr}");
}

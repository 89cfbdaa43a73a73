//! Smoke test of the registry harness in tests/support.
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{Registry, RegistryOptions};

/// HTTP status of `curl URL` with extra args (no output on success bodies).
fn curl_status(url: &str, extra: &[&str]) -> u16 {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let code = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    code.parse().expect("curl status code")
}

fn pid_alive(pid: u32) -> bool {
    // A killed-and-reaped child has no /proc entry (zombies would show "Z").
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}

fn assert_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "registry pid {pid} survived drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn registries_start_answer_and_stop() {
    let plain = Registry::start();
    let auth = Registry::start_with(RegistryOptions {
        htpasswd: Some(("tester".into(), "s3cret".into())),
        tls: false,
    });
    let tls = Registry::start_with(RegistryOptions {
        htpasswd: None,
        tls: true,
    });
    assert_eq!(plain.host, format!("127.0.0.1:{}", plain.port));
    let ports = [plain.port, auth.port, tls.port];
    assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);

    // plain
    assert_eq!(support::http_status(plain.port, "/v2/"), Some(200));
    assert_eq!(curl_status(&format!("{}/v2/", plain.url()), &[]), 200);

    // htpasswd: 401 without, 200 with credentials
    assert_eq!(support::http_status(auth.port, "/v2/"), Some(401));
    assert_eq!(curl_status(&format!("{}/v2/", auth.url()), &[]), 401);
    assert_eq!(
        curl_status(&format!("{}/v2/", auth.url()), &["-u", "tester:s3cret"]),
        200
    );
    assert_eq!(
        curl_status(&format!("{}/v2/", auth.url()), &["-u", "tester:wrong"]),
        401
    );

    // TLS: verified against the test CA (no -k)
    assert!(tls.url().starts_with("https://127.0.0.1:"));
    let ca = tls.ca_cert_path();
    assert!(ca.is_file());
    assert_eq!(
        curl_status(
            &format!("{}/v2/", tls.url()),
            &["--cacert", ca.to_str().unwrap()]
        ),
        200
    );
    // ...and not trusted without it
    let untrusted = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "--max-time", "5"])
        .arg(format!("{}/v2/", tls.url()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !untrusted.status.success(),
        "TLS registry trusted without CA"
    );

    let pids = [plain.pid(), auth.pid(), tls.pid()];
    for pid in pids {
        assert!(pid_alive(pid));
    }
    drop(plain);
    drop(auth);
    drop(tls);
    for pid in pids {
        assert_gone(pid);
    }
    for port in ports {
        assert_eq!(
            support::http_status(port, "/v2/"),
            None,
            "port {port} still answers"
        );
    }
}

#[test]
fn unique_names_differ() {
    let a = support::unique_name("Repo");
    let b = support::unique_name("Repo");
    assert_ne!(a, b);
    assert!(a.starts_with("repo-"));
}

#[test]
fn busybox_fixtures_are_present() {
    for arch in ["amd64", "arm64"] {
        let p = support::busybox(arch);
        assert!(p.is_file(), "{}", p.display());
    }
}

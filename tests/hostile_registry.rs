//! A registry polyarch does not control cannot exhaust or hang it (issue 39): endless error
//! bodies and token answers are read up to their limits only, a trickling or silent server
//! is given up on at the request deadline, `--timeout` bounds a whole `verify` or `gate`,
//! a registry reached over TLS cannot draw credentials to a plain-HTTP token realm, and
//! indexes fanning out, indexes of 20,000 entries and referrers listings of 20,000 are
//! refused at their limits rather than read. Each run exits 3 with one clean error line,
//! within 128 MiB and its deadline.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::gate::{deployment, Deploy};
use support::token::TokenServer;
use support::Registry;

/// Most memory a run may take, whatever the server sends (KiB, as GNU time's %M).
const MAX_PEAK_KIB: u64 = 128 * 1024;
/// The per-request deadline the runs are given (`POLYARCH_REGISTRY_TIMEOUT`).
const DEADLINE: Duration = Duration::from_secs(3);
/// Start-up, the answer's wording and the exit, on a loaded two-core machine.
const SLACK: Duration = Duration::from_secs(5);

/// What the hostile server answers a request.
#[derive(Clone, Copy)]
enum Answer {
    /// `status` with an endless body, control bytes and all, until the client hangs up.
    Endless(u16),
    /// 401 with a Bearer challenge naming this server's `/token`.
    Challenge,
    /// A 200 whose JSON never ends: `{"token":"aaaa…`.
    EndlessToken,
    /// The head at once, then the body one byte every 500 ms.
    Trickle,
    /// Nothing at all, until the client hangs up.
    Silent,
    /// What [`serve_content`] put at the path; 404 elsewhere.
    Content,
}

/// Manifests a hostile registry serves for [`Answer::Content`], by request path; each
/// test puts its own under a repository of its own.
static CONTENT: std::sync::Mutex<Vec<(String, String, Vec<u8>)>> =
    std::sync::Mutex::new(Vec::new());

/// Serves `body` as `media_type` at `/v2/{repository}/{kind}/{reference}`; returns the
/// body's digest.
fn serve_content(
    repository: &str,
    kind: &str,
    reference: &str,
    media_type: &str,
    body: Vec<u8>,
) -> String {
    use sha2::Digest as _;
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
    let path = format!("/v2/{repository}/{kind}/{reference}");
    let mut content = CONTENT.lock().unwrap();
    content.push((path.clone(), media_type.to_string(), body.clone()));
    if kind != "referrers" {
        content.push((
            path.replace(reference, &digest),
            media_type.to_string(),
            body,
        ));
    }
    digest
}

fn answer_content(stream: &mut TcpStream, path: &str) -> std::io::Result<()> {
    let found = CONTENT
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _, _)| p == path)
        .cloned();
    match found {
        Some((_, media_type, body)) => {
            write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Length: {}\r\n\r\n", body.len())?;
            stream.write_all(&body)
        }
        None if path == "/v2/" => write!(stream, "HTTP/1.1 200 OK\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Length: 2\r\n\r\n{{}}"),
        None => {
            let body = r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
            write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        }
    }
}

/// A server on a kernel-chosen 127.0.0.1 port answering each request as `answer(path)`
/// says; its threads end with the test binary.
fn hostile(answer: fn(&str) -> Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{address}/token");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let realm = realm.clone();
            std::thread::spawn(move || serve(stream, answer, &realm));
        }
    });
    address
}

fn serve(mut stream: TcpStream, answer: fn(&str) -> Answer, realm: &str) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    while let Some(path) = request_path(&mut reader) {
        let sent = match answer(&path) {
            Answer::Challenge => {
                let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
                write!(stream, "HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            }
            Answer::Endless(status) => endless(
                &mut stream,
                &format!("HTTP/1.1 {status} Hostile\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"),
                b"\x1b[31mdown\x07\r\n",
            ),
            Answer::EndlessToken => endless(
                &mut stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"token\":\"",
                b"a",
            ),
            Answer::Trickle => trickle(&mut stream),
            Answer::Content => answer_content(&mut stream, &path),
            Answer::Silent => {
                // Returns when the client hangs up.
                let _ = reader.read(&mut [0u8; 1]);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The path of the next request on the connection; None at its end, or for what is no
/// HTTP request (a TLS hello, which is then refused at once, as servers do).
fn request_path(reader: &mut impl BufRead) -> Option<String> {
    if !reader.fill_buf().ok()?.first()?.is_ascii_uppercase() {
        return None;
    }
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split(' ').nth(1)?.to_string();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            return Some(path);
        }
    }
}

fn endless(stream: &mut TcpStream, head: &str, pattern: &[u8]) -> std::io::Result<()> {
    stream.write_all(head.as_bytes())?;
    let chunk: Vec<u8> = pattern.iter().copied().cycle().take(64 * 1024).collect();
    loop {
        stream.write_all(&chunk)?;
    }
}

fn trickle(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.index.v1+json\r\nDocker-Distribution-Api-Version: registry/2.0\r\nContent-Length: 1000\r\n\r\n{")?;
    loop {
        // Pacing the reply, not waiting for anything.
        std::thread::sleep(Duration::from_millis(500));
        stream.write_all(b" ")?;
    }
}

/// One polyarch run: its output, wall time and peak resident memory.
struct Run {
    out: Output,
    wall: Duration,
    peak_kib: u64,
}

/// Runs polyarch under GNU time with `env`, a fresh cache and Docker config, and fast
/// retries; `stdin` is piped in.
fn run(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let peak = dir.path().join("peak");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M", "-o"])
        .arg(&peak)
        .arg(env!("CARGO_BIN_EXE_polyarch"))
        .args(args)
        .env("POLYARCH_CACHE_DIR", dir.path().join("cache"))
        .env("DOCKER_CONFIG", dir.path().join("docker"))
        .env("POLYARCH_RETRY_BASE_MS", "10")
        .env_remove("POLYARCH_REGISTRY_TIMEOUT")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .expect("run /usr/bin/time (Debian package time)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let wall = started.elapsed();
    let peak_kib = read_peak(&peak);
    Run {
        out,
        wall,
        peak_kib,
    }
}

/// GNU time's `%M` (KiB), the last line of its output file.
fn read_peak(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    let last = text.lines().last().unwrap_or_default();
    last.trim()
        .parse()
        .unwrap_or_else(|_| panic!("GNU time wrote {text:?}"))
}

/// Exit 3, one `error:` line naming each of `names`, no raw control bytes, within
/// [`MAX_PEAK_KIB`] and `wall`.
fn assert_clean_failure(case: &str, run: &Run, names: &[&str], wall: Duration) {
    let stderr = String::from_utf8_lossy(&run.out.stderr);
    eprintln!(
        "{case}: exit {:?}, {:.1} s, peak {} MiB: {}",
        run.out.status.code(),
        run.wall.as_secs_f64(),
        run.peak_kib / 1024,
        stderr.trim_end()
    );
    assert_eq!(run.out.status.code(), Some(3), "{case}: {stderr}");
    assert!(
        !stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{case}: control bytes in {stderr:?}"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{case}: {stderr}");
    for name in names {
        assert!(
            errors[0].contains(name),
            "{case}: no {name:?} in {}",
            errors[0]
        );
    }
    assert!(
        run.peak_kib <= MAX_PEAK_KIB,
        "{case}: peak {} KiB",
        run.peak_kib
    );
    assert!(run.wall <= wall, "{case}: took {:?}", run.wall);
}

/// `verify` of a tag on `address`, with the short request deadline.
fn verify(address: &str) -> Run {
    let reference = format!("{address}/hostile/app:v1");
    let deadline = format!("{}s", DEADLINE.as_secs());
    run(
        &["verify", &reference, "--platform", "linux/amd64"],
        &[("POLYARCH_REGISTRY_TIMEOUT", &deadline)],
        "",
    )
}

#[test]
fn an_endless_error_body_is_read_up_to_its_limit() {
    let address = hostile(|_| Answer::Endless(503));
    let run = verify(&address);
    assert_clean_failure(
        "endless 503 body",
        &run,
        &[&address, "503", "after 5 attempts"],
        SLACK,
    );
}

#[test]
fn an_endless_token_answer_is_refused_at_its_limit() {
    let address = hostile(|path| match path.starts_with("/token") {
        true => Answer::EndlessToken,
        false => Answer::Challenge,
    });
    let run = verify(&address);
    let names = [address.as_str(), "authenticate", "larger than 1 MiB"];
    assert_clean_failure("endless token", &run, &names, SLACK);
}

#[test]
fn a_trickling_reply_is_given_up_at_the_deadline() {
    let address = hostile(|_| Answer::Trickle);
    let run = verify(&address);
    let names = [address.as_str(), "no complete answer within 3s"];
    assert_clean_failure("trickle", &run, &names, DEADLINE + SLACK);
}

#[test]
fn a_silent_server_is_given_up_at_the_deadline() {
    let address = hostile(|_| Answer::Silent);
    let run = verify(&address);
    let names = [address.as_str(), "no complete answer within 3s"];
    assert_clean_failure("silent", &run, &names, DEADLINE + SLACK);
}

#[test]
fn a_silent_token_server_is_given_up_at_the_deadline() {
    let address = hostile(|path| match path.starts_with("/token") {
        true => Answer::Silent,
        false => Answer::Challenge,
    });
    let run = verify(&address);
    let names = [
        address.as_str(),
        "authenticate",
        "no complete answer within 3s",
    ];
    assert_clean_failure("silent token server", &run, &names, DEADLINE + SLACK);
}

/// With the default 60 s request deadline, `--timeout` ends the whole command.
#[test]
fn timeout_bounds_a_whole_verify_and_gate() {
    let address = hostile(|_| Answer::Silent);
    let reference = format!("{address}/hostile/app:v1");
    let limit = Duration::from_secs(2);
    let run_verify = run(
        &[
            "verify",
            &reference,
            "--platform",
            "linux/amd64",
            "--timeout",
            "2s",
        ],
        &[],
        "",
    );
    let names = [
        format!("verify {reference}"),
        "did not finish within --timeout 2s".to_string(),
    ];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_clean_failure("verify --timeout", &run_verify, &names, limit + SLACK);

    let dir = tempfile::tempdir().unwrap();
    let deploy = Deploy::write(
        dir.path(),
        &deployment("app", &reference, None, ""),
        &[("general", "amd64", 1)],
    );
    let run_gate = run(
        &[
            "gate",
            "--manifests",
            deploy.manifests.to_str().unwrap(),
            "--nodes",
            deploy.pools.to_str().unwrap(),
            "--timeout",
            "2s",
        ],
        &[],
        "",
    );
    let names = ["gate did not finish within --timeout 2s"];
    assert_clean_failure("gate --timeout", &run_gate, &names, limit + SLACK);
}

/// A TLS registry naming a plain-HTTP token realm: the credentials are not sent there.
/// The realm's host cannot even be resolved, so nothing could have reached it either way;
/// what is checked is that polyarch refuses before asking, naming the realm and the fix.
#[test]
fn a_tls_registry_cannot_draw_credentials_to_a_plain_http_realm() {
    let server = TokenServer::start(Some(("user", "secret")));
    let realm = "http://token.polyarch-test.invalid/token";
    let registry = Registry::start_token_at(&server, realm, true);
    let reference = registry.repo("hostile/app:v1");
    let ca = registry.ca_cert_path();
    let run = run(
        &[
            "verify",
            &reference,
            "--platform",
            "linux/amd64",
            "--ca-cert",
            ca.to_str().unwrap(),
            "--username",
            "user",
            "--password-stdin",
        ],
        &[],
        "secret\n",
    );
    let names = [
        registry.host.as_str(),
        realm,
        "--insecure-registry token.polyarch-test.invalid",
    ];
    assert_clean_failure("plain realm", &run, &names, SLACK);
}

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn index_of(entries: &[serde_json::Value], marker: &str) -> Vec<u8> {
    serde_json::json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries,
                       "annotations": {"marker": marker}})
    .to_string()
    .into_bytes()
}

fn descriptor(media_type: &str, digest: &str, arch: Option<&str>) -> serde_json::Value {
    let mut d = serde_json::json!({"mediaType": media_type, "digest": digest, "size": 100});
    if let Some(arch) = arch {
        d["platform"] = serde_json::json!({"architecture": arch, "os": "linux"});
    }
    d
}

/// `verify` of `{repository}:v1` on the content server, with the short request deadline.
fn verify_content(repository: &str) -> Run {
    let address = hostile(|_| Answer::Content);
    let deadline = format!("{}s", DEADLINE.as_secs());
    run(
        &[
            "verify",
            &format!("{address}/{repository}:v1"),
            "--platform",
            "linux/amd64",
        ],
        &[("POLYARCH_REGISTRY_TIMEOUT", &deadline)],
        "",
    )
}

/// Issue 39, case 1: nested indexes 64 wide (about 50 KB over a few requests took 3 GB).
#[test]
fn nested_indexes_fanning_out_stop_at_the_entry_budget() {
    let repository = "hostile/fanout";
    let missing = |i: usize| format!("sha256:{i:064x}");
    let level1: Vec<serde_json::Value> = (0..64)
        .map(|i| {
            let entries: Vec<_> = (0..64)
                .map(|j| descriptor(INDEX, &missing(i * 64 + j), None))
                .collect();
            let digest = serve_content(
                repository,
                "manifests",
                &format!("level1-{i}"),
                INDEX,
                index_of(&entries, &i.to_string()),
            );
            descriptor(INDEX, &digest, None)
        })
        .collect();
    serve_content(
        repository,
        "manifests",
        "v1",
        INDEX,
        index_of(&level1, "top"),
    );
    let run = verify_content(repository);
    assert_clean_failure(
        "fan-out",
        &run,
        &[repository, "more than 1024 entries"],
        SLACK,
    );
}

/// Issue 39, case 2: an index of 20,000 entries (43,000 requests and 812 MB before).
#[test]
fn an_index_of_twenty_thousand_entries_is_refused_unread() {
    let repository = "hostile/wide";
    let entry = descriptor(MANIFEST, &format!("sha256:{:064x}", 1), Some("amd64"));
    serve_content(
        repository,
        "manifests",
        "v1",
        INDEX,
        index_of(&vec![entry; 20_000], "wide"),
    );
    let run = verify_content(repository);
    assert_clean_failure(
        "20,000 entries",
        &run,
        &[repository, "more than 1024 entries"],
        SLACK,
    );
}

/// Issue 39, case 9: 20,000 referrers listed for a platform manifest (13,500 requests
/// one after another, still going after 300 s).
#[test]
fn a_referrers_listing_of_twenty_thousand_is_refused_unread() {
    let repository = "hostile/referred";
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let config_digest = serve_content(
        repository,
        "blobs",
        "config",
        "application/vnd.oci.image.config.v1+json",
        config,
    );
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": 74},
        "layers": []});
    let manifest_digest = serve_content(
        repository,
        "manifests",
        "amd64",
        MANIFEST,
        manifest.to_string().into_bytes(),
    );
    serve_content(
        repository,
        "manifests",
        "v1",
        INDEX,
        index_of(
            &[descriptor(MANIFEST, &manifest_digest, Some("amd64"))],
            "one",
        ),
    );
    let referrers: Vec<_> = (0..20_000)
        .map(|i| descriptor(MANIFEST, &format!("sha256:{i:064x}"), None))
        .collect();
    serve_content(
        repository,
        "referrers",
        &manifest_digest,
        INDEX,
        index_of(&referrers, "many"),
    );
    let run = verify_content(repository);
    assert_clean_failure(
        "20,000 referrers",
        &run,
        &[repository, &manifest_digest, "20000 referrers", "256"],
        SLACK,
    );
}

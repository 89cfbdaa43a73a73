//! Issue 39, item 3: `verify --deep` reads hostile layers within bounded memory and time.
//! Layers of GNU long names (10,000 names of 100 KiB; one name of 1 GiB) are written as
//! gzip members, one per MiB of the name repeated, so the test never holds a big name in
//! memory or on disk; polyarch decompresses them as any layer.

mod support;

use flate2::write::GzEncoder;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{polyarch, run, unique_name, Registry};

const MIB: u64 = 1 << 20;
/// What a polyarch run may take at most, as `/usr/bin/time` reports it.
const PEAK_RSS_KIB: u64 = 128 * 1024;

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A 512-byte tar header (GNU magic) of `kind` for `size` bytes of data.
fn header(name: &str, kind: u8, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_mode(0o755);
    h.set_size(size);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A gzip layer of `count` files, each named by a GNU long name (`L`) of `name_len` bytes:
/// `a`s, then `/` and the file's number in 5 digits. What the names share (the header,
/// each whole MiB of `a`s, the rest of them) is a gzip member compressed once and repeated.
fn long_name_layer(count: usize, name_len: u64) -> Vec<u8> {
    let filler = name_len - 6;
    let mut shared = gzip(&header("././@LongLink", b'L', name_len));
    let mib = gzip(&vec![b'a'; MIB as usize]);
    for _ in 0..filler / MIB {
        shared.extend_from_slice(&mib);
    }
    shared.extend(gzip(&vec![b'a'; (filler % MIB) as usize]));
    let mut blob = Vec::new();
    for i in 0..count {
        let mut tail = format!("/{i:05}").into_bytes();
        tail.resize(tail.len() + ((512 - name_len % 512) % 512) as usize, 0);
        tail.extend(header("app", b'0', 0));
        blob.extend_from_slice(&shared);
        blob.extend(gzip(&tail));
    }
    blob.extend(gzip(&[0u8; 1024]));
    blob
}

/// Writes an OCI layout in `dir` holding `layer` as the one layer of a linux/arm64 image
/// tagged `v1`.
fn write_layout(dir: &Path, layer: &[u8]) {
    let config = json!({
        "architecture": "arm64", "os": "linux",
        "config": {"Entrypoint": ["/app"]},
        "rootfs": {"type": "layers", "diff_ids": []}
    })
    .to_string();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256(config.as_bytes()), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha256(layer), "size": layer.len()}]
    })
    .to_string();
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [config.as_bytes(), manifest.as_bytes(), layer] {
        let name = sha256(blob);
        std::fs::write(blobs.join(name.trim_start_matches("sha256:")), blob).unwrap();
    }
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": sha256(manifest.as_bytes()), "size": manifest.len(),
                       "platform": {"architecture": "arm64", "os": "linux"},
                       "annotations": {"org.opencontainers.image.ref.name": "v1"}}]
    });
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// Runs `polyarch verify REFERENCE --deep` under `/usr/bin/time`; its exit code, stderr
/// without time's line, peak RSS in KiB and wall time.
fn deep_verify(reference: &str) -> (Option<i32>, String, u64, Duration) {
    let started = Instant::now();
    let out = run(std::process::Command::new("/usr/bin/time")
        .args(["-f", "peak-rss-kib=%M"])
        .arg(polyarch().get_program())
        .args(["verify", reference, "--platform", "linux/arm64", "--deep"]));
    let wall = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (rss, rest): (Vec<&str>, Vec<&str>) =
        stderr.lines().partition(|l| l.starts_with("peak-rss-kib="));
    let rss = rss
        .first()
        .and_then(|l| l["peak-rss-kib=".len()..].parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {stderr}"));
    (out.status.code(), rest.join("\n"), rss, wall)
}

/// Exit 3, in one error line naming the reference and `limit`, printable, bounded.
fn assert_refused(reference: &str, limit: &str) {
    let (code, stderr, rss, wall) = deep_verify(reference);
    eprintln!("{reference}: exit {code:?}, peak RSS {rss} KiB, {wall:?}");
    assert_eq!(code, Some(3), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(reference.trim_start_matches("oci:").trim_end_matches(":v1"))
            && errors[0].contains(limit),
        "{stderr}"
    );
    assert!(
        !stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{stderr:?}"
    );
    assert!(rss <= PEAK_RSS_KIB, "peak RSS {rss} KiB: {stderr}");
    assert!(wall < Duration::from_secs(30), "{wall:?}: {stderr}");
}

#[test]
fn ten_thousand_long_names_of_100_kib_are_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    write_layout(dir.path(), &long_name_layer(10_000, 100 * 1024));
    let reference = format!("oci:{}:v1", dir.path().display());
    assert_refused(&reference, "longer than 4096 bytes");
}

#[test]
fn one_long_name_of_1_gib_is_refused_in_bounded_memory_from_a_layout_and_a_registry() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    write_layout(&layout, &long_name_layer(1, 1024 * MIB));
    assert_refused(&format!("oci:{}:v1", layout.display()), "1 MiB");

    let registry = Registry::start();
    let repo = registry.repo(&unique_name("deep/long-name"));
    let out = run(std::process::Command::new("skopeo").args([
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{}:v1", layout.display()),
        &format!("docker://{repo}:v1"),
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_refused(&format!("{repo}:v1"), "1 MiB");
}

//! `export_image` against the real engine: build small `FROM scratch` images with the
//! docker CLI, export them, and check every digest and size against the spooled files.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use flate2::read::MultiGzDecoder;
use polyarch::base::progress::Silent;
use polyarch::base::progress::{Event, Phase, Reporter};
use polyarch::builder::export::early::{EarlyLayer, EarlyUploads};
use polyarch::builder::export::{export_image, ExportedImage};
use polyarch::docker::engine::Engine;
use sha2::{Digest, Sha256};

/// Removes the test image when dropped, whether the test passed or not.
struct ImageGuard(String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, Option<u64>)>>);

impl Reporter for Recorder {
    fn report(&self, event: Event) {
        if let Event::Bytes {
            phase: Phase::Export,
            done,
            total,
            ..
        } = event
        {
            self.0.lock().unwrap().push((done, total));
        }
    }
}

fn unique_name() -> String {
    format!(
        "polyarch-test-export-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// `docker build -q -t <name> <ctx>`; returns the image ID and a guard removing it.
fn build(ctx: &Path) -> (String, ImageGuard) {
    let name = unique_name();
    let guard = ImageGuard(name.clone());
    let out = Command::new("docker")
        .args(["build", "-q", "-t", &name])
        .arg(ctx)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("run docker build");
    assert!(
        out.status.success(),
        "docker build failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(id.starts_with("sha256:"), "unexpected build output {id:?}");
    (id, guard)
}

fn sha256_file(path: &Path) -> (String, u64) {
    let mut file = std::fs::File::open(path).unwrap();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    (format!("sha256:{}", hex::encode(hasher.finalize())), size)
}

/// Files (path → contents) of a gzipped layer tar.
fn layer_files(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(MultiGzDecoder::new(std::fs::File::open(path).unwrap()));
    let mut files = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.push((name, data));
        }
    }
    files
}

fn config_diff_ids(image: &ExportedImage) -> Vec<String> {
    let config: serde_json::Value = serde_json::from_slice(&image.config).unwrap();
    config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

fn check_layers(image: &ExportedImage) {
    let diff_ids: Vec<String> = image.layers.iter().map(|l| l.diff_id.clone()).collect();
    assert_eq!(config_diff_ids(image), diff_ids);
    for layer in &image.layers {
        assert!(layer.path.starts_with(image.spool.path()));
        assert_eq!(
            layer.media_type,
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let (digest, size) = sha256_file(&layer.path);
        assert_eq!(layer.digest, digest, "{}", layer.path.display());
        assert_eq!(layer.size, size, "{}", layer.path.display());
    }
}

fn write(path: &Path, data: &[u8]) {
    std::fs::File::create(path)
        .unwrap()
        .write_all(data)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_a_small_image_from_the_engine() {
    let ctx = tempfile::tempdir().unwrap();
    write(&ctx.path().join("a.txt"), b"polyarch export test: a\n");
    write(&ctx.path().join("b.txt"), b"polyarch export test: b\n");
    write(
        &ctx.path().join("c.txt"),
        b"polyarch export test: c, a different size\n",
    );
    // The fourth step recreates the first layer byte for byte, so the engine's save
    // stream stores it as a symlink to the first layer's tar.
    write(
        &ctx.path().join("Dockerfile"),
        b"FROM scratch\nCOPY a.txt /a.txt\nCOPY b.txt /b.txt\nCOPY c.txt /a.txt\nCOPY a.txt /a.txt\n",
    );
    let (id, _guard) = build(ctx.path());

    let engine = Engine::connect().await.expect("engine");
    let recorder = Recorder::default();
    let image = export_image(&engine.docker, &id, "export-test", None, None, &recorder)
        .await
        .expect("export");

    // The classic store names an image by its config's digest; the containerd store by
    // its manifest's.
    if !engine.containerd_store {
        assert_eq!(image.config_digest, id);
    }
    assert_eq!(image.layers.len(), 4);
    check_layers(&image);
    assert_eq!(
        layer_files(&image.layers[0].path),
        vec![("a.txt".to_string(), b"polyarch export test: a\n".to_vec())]
    );
    assert_eq!(
        layer_files(&image.layers[1].path),
        vec![("b.txt".to_string(), b"polyarch export test: b\n".to_vec())]
    );
    assert_eq!(image.layers[3].diff_id, image.layers[0].diff_id);
    assert_eq!(image.layers[3].digest, image.layers[0].digest);

    let events = recorder.0.lock().unwrap();
    assert!(!events.is_empty(), "no export progress reported");
    assert!(events
        .iter()
        .all(|(done, total)| *done > 0 && total.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_image_is_an_export_error() {
    let engine = Engine::connect().await.expect("engine");
    let missing = format!("sha256:{}", "0".repeat(64));
    let err = export_image(
        &engine.docker,
        &missing,
        "missing",
        None,
        None,
        &polyarch::base::progress::Silent,
    )
    .await
    .expect_err("exporting a missing image must fail");
    let message = err.to_string();
    let err = polyarch::Error::from(err);
    assert!(matches!(err, polyarch::Error::Export { .. }), "{message}");
    assert_eq!(err.to_string(), message);
    assert!(
        message.contains("missing") && !message.contains('\n'),
        "{message}"
    );
}

/// Takes every layer offered while exported but the ones in `refuse`, and keeps what the
/// upload of each would have sent.
#[derive(Default)]
struct Collected {
    refuse: Vec<String>,
    offered: Mutex<Vec<String>>,
    sent: Mutex<Vec<(String, Vec<u8>, String)>>,
}

impl EarlyUploads for Collected {
    fn claim(&self, diff_id: &str) -> bool {
        self.offered.lock().unwrap().push(diff_id.to_string());
        !self.refuse.iter().any(|r| r == diff_id)
    }

    fn upload(&self, mut layer: EarlyLayer) -> futures_util::future::LocalBoxFuture<'_, ()> {
        Box::pin(async move {
            let mut bytes = Vec::new();
            while let Some(chunk) = layer.chunks.recv().await {
                bytes.extend_from_slice(&chunk);
            }
            let digest = layer.digest.await.expect("the layer's digest");
            let sent = (layer.diff_id, bytes, digest.to_string());
            self.sent.lock().unwrap().push(sent);
        })
    }
}

/// `size` bytes of xorshift output: incompressible, the same for the same seed.
fn noise(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..size / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn random_file(path: &Path, size: usize, seed: u64) {
    write(path, &noise(size, seed));
}

/// Layers of 1 MiB and more go to the upload while they are spooled: the same bytes as the
/// spooled blob, its digest, under the diff ID the save stream names (on Docker ≤ 24 told
/// by the layer directory's v1 ID). A refused layer is only spooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_layers_are_sent_while_they_are_exported() {
    let ctx = tempfile::tempdir().unwrap();
    write(
        &ctx.path().join("small.txt"),
        b"polyarch early upload test\n",
    );
    random_file(&ctx.path().join("big1.bin"), 2 << 20, 7);
    random_file(&ctx.path().join("big2.bin"), 3 << 19, 11);
    write(
        &ctx.path().join("Dockerfile"),
        b"FROM scratch\nCOPY small.txt /small.txt\nCOPY big1.bin /big1.bin\nCOPY big2.bin /big2.bin\nENV EARLY=1\n",
    );
    let (id, _guard) = build(ctx.path());
    let engine = Engine::connect().await.expect("engine");
    let probe = export_image(&engine.docker, &id, "early-test", None, None, &Silent)
        .await
        .expect("export");
    let (big1, big2) = (&probe.layers[1].diff_id, &probe.layers[2].diff_id);

    let early = Collected {
        refuse: vec![big2.clone()],
        ..Default::default()
    };
    let image = export_image(
        &engine.docker,
        &id,
        "early-test",
        None,
        Some(&early),
        &Silent,
    )
    .await
    .expect("export");
    check_layers(&image);
    let sent = early.sent.lock().unwrap();
    if engine.containerd_store {
        // That store saves its layers compressed: they are spooled as they are.
        assert!(sent.is_empty());
        return;
    }
    let mut offered = early.offered.lock().unwrap().clone();
    offered.sort();
    let mut big = vec![big1.clone(), big2.clone()];
    big.sort();
    assert_eq!(
        offered, big,
        "only the layers of 1 MiB and more are offered"
    );
    assert_eq!(sent.len(), 1, "the refused layer is not sent");
    let (diff_id, bytes, digest) = &sent[0];
    let layer = &image.layers[1];
    assert_eq!(diff_id, &layer.diff_id);
    assert_eq!(digest, &layer.digest.to_string());
    assert_eq!(bytes, &std::fs::read(&layer.path).unwrap());
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Takes ~130 s in a debug build here (miniz_oxide and sha2 unoptimised, ~2 MB/s), so it
/// is ignored by default: `cargo test --test export -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow in debug builds (~130 s for 300 MiB); run with --ignored"]
async fn big_layer_exports_in_bounded_memory() {
    const MIB: usize = 1 << 20;
    const SIZE_MIB: usize = 300;
    let ctx = tempfile::tempdir().unwrap();
    {
        // 1 MiB of xorshift output repeated: incompressible for gzip's 32 KiB window.
        let block = noise(MIB, 0x2545_f491_4f6c_dd1d);
        let mut file =
            std::io::BufWriter::new(std::fs::File::create(ctx.path().join("big.bin")).unwrap());
        for _ in 0..SIZE_MIB {
            file.write_all(&block).unwrap();
        }
        file.flush().unwrap();
    }
    write(
        &ctx.path().join("Dockerfile"),
        b"FROM scratch\nCOPY big.bin /big.bin\n",
    );
    let (id, _guard) = build(ctx.path());
    let engine = Engine::connect().await.expect("engine");

    // Reset the peak RSS (Linux ≥ 4.0) so VmHWM measures the export alone; where
    // that is not allowed, compare against the peak so far.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = vm_hwm_kib();
    let start = Instant::now();
    let image = export_image(
        &engine.docker,
        &id,
        "export-big-test",
        None,
        None,
        &polyarch::base::progress::Silent,
    )
    .await
    .expect("export");
    let elapsed = start.elapsed();
    let after = vm_hwm_kib();

    let layer = &image.layers[0];
    let mb = (SIZE_MIB * MIB) as f64 / 1e6;
    println!(
        "big layer: {SIZE_MIB} MiB in {:.1} s = {:.0} MB/s; gzip {} bytes; VmHWM {} KiB before, {} KiB after (reset: {reset})",
        elapsed.as_secs_f64(),
        mb / elapsed.as_secs_f64(),
        layer.size,
        before,
        after
    );
    assert_eq!(image.config_digest, id);
    check_layers(&image);
    let growth_kib = after.saturating_sub(if reset { 0 } else { before });
    let limit_kib = 64 * 1024;
    assert!(
        growth_kib < limit_kib,
        "peak RSS during export {growth_kib} KiB (limit {limit_kib} KiB)"
    );
}

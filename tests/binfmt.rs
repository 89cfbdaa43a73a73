//! binfmt detection and registration against the real engine and kernel.
//!
//! Everything that touches binfmt_misc runs in ONE test function, under a file lock, with
//! a guard that saves the host's binfmt_misc state first and restores exactly that state
//! on drop (also when a case panics).

use polyarch::base::progress::{Event, Reporter};
use polyarch::builder::binfmt::{
    Emulation, EmulationError, EmulationStatus, Runnable, BINFMT_MISC,
};
use polyarch::builder::cleanup::Cleanup;
use polyarch::docker::engine::Engine;
use polyarch::project::BinfmtMode;
use polyarch::Platform;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod support;

use support::binfmt::{entries, unregister, BinfmtGuard};

/// A Dockerfile whose target-platform stage RUNs a command: needs emulation when foreign.
const RUNS_ON_TARGET: &str = "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nRUN [\"/bin/busybox\", \"mkdir\", \"/made-on-target\"]\nENTRYPOINT [\"/bin/busybox\", \"uname\", \"-m\"]\n";

/// `polyarch build` of a one-image project in `dir` (RUN steps without a network: a
/// hand-started engine may have no bridge), with `fields` added to the image.
fn polyarch_build(
    dir: &Path,
    dockerfile: &str,
    repository: &str,
    mode: &str,
    fields: &str,
) -> std::process::Output {
    fs::create_dir_all(dir).unwrap();
    support::hello_context(dir, dockerfile);
    let file = support::write_project(dir, repository, "[v1]", "[linux/amd64, linux/arm64]");
    let mut text = fs::read_to_string(&file).unwrap();
    text.push_str("    network: none\n");
    text.push_str(fields);
    fs::write(&file, text).unwrap();
    support::run(
        support::polyarch()
            .args(["build", "--binfmt", mode, "--output-format", "json", "-f"])
            .arg(&file)
            // Cases in one work dir share what runs remember about the engine.
            .env("POLYARCH_CACHE_DIR", dir.parent().unwrap().join("cache")),
    )
}

#[derive(Default)]
struct Collect(Mutex<Vec<String>>);

impl Reporter for Collect {
    fn report(&self, event: Event) {
        let line = match event {
            Event::Phase { message, .. } => format!("phase: {message}"),
            Event::Warning { message } => format!("warning: {message}"),
            Event::Note { message } => format!("note: {message}"),
            other => format!("{other:?}"),
        };
        eprintln!("  [reporter] {line}");
        self.0.lock().unwrap().push(line);
    }
}

fn p(s: &str) -> Platform {
    s.parse().unwrap()
}

/// Names of engine objects (images, containers) of a run.
fn leftovers(run_id: &str) -> Vec<String> {
    let images = Command::new("docker")
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
        .output()
        .unwrap();
    let containers = Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&images.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&containers.stdout).lines())
        .filter(|l| l.contains(run_id))
        .map(str::to_string)
        .collect()
}

/// Removes a run's containers and images even when a case panics (the library's own
/// cleanup is async and a panic skips it).
struct Sweep(Vec<String>);

impl Drop for Sweep {
    fn drop(&mut self) {
        for id in &self.0 {
            for name in leftovers(id) {
                let _ = Command::new("docker").args(["rm", "-f", &name]).output();
                let _ = Command::new("docker").args(["rmi", "-f", &name]).output();
            }
        }
    }
}

fn installer_images() -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            polyarch::builder::binfmt::INSTALLER_REPOSITORY,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binfmt_on_the_real_engine() {
    let guard = BinfmtGuard::save();
    let installers_before = installer_images();
    // Make sure arm64 is not registered (the guard puts back whatever was there).
    for (name, content) in entries() {
        if name.contains("aarch64") || content.contains("aarch64") {
            unregister(&name);
        }
    }
    // The CLI, with arm64 unregistered: `never` refuses a RUN on arm64 before building,
    // while a COPY-only arm64 build needs no emulation and succeeds.
    let registry = support::Registry::start();
    let work = tempfile::tempdir().unwrap();
    let refused = polyarch_build(
        &work.path().join("never-run"),
        RUNS_ON_TARGET,
        &registry.repo("binfmt/never-run"),
        "never",
        "",
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("linux/arm64") && !stderr.contains("[build"),
        "{stderr}"
    );
    let copy_only = polyarch_build(
        &work.path().join("never-copy"),
        support::HELLO,
        &registry.repo("binfmt/never-copy"),
        "never",
        "",
    );
    assert_eq!(
        copy_only.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&copy_only.stderr)
    );

    let engine = Engine::connect().await.expect("engine");
    let native = engine.native.clone();
    assert_eq!(
        native,
        p("linux/amd64"),
        "these cases assume an amd64 engine"
    );
    let arm64 = p("linux/arm64");
    let reporter = Collect::default();

    // native → Native
    let cleanup = Cleanup::default();
    let emu = Emulation::new(engine.clone(), &cleanup);
    let mut sweep = Sweep(vec![emu.run_id().to_string()]);
    assert_eq!(emu.probe(&native).await.unwrap(), Runnable::Native);

    // 386 on amd64 is decided by probe.
    let t = Instant::now();
    let r386 = emu.probe(&p("linux/386")).await.unwrap();
    eprintln!(
        "probe linux/386 (build + run): {:?} → {r386:?}",
        t.elapsed()
    );

    // foreign arm64, unregistered → NotRunnable
    let t = Instant::now();
    assert_eq!(emu.probe(&arm64).await.unwrap(), Runnable::NotRunnable);
    eprintln!("probe linux/arm64 (build + run): {:?}", t.elapsed());
    emu.forget(&arm64);
    let t = Instant::now();
    assert_eq!(emu.probe(&arm64).await.unwrap(), Runnable::NotRunnable);
    eprintln!("probe linux/arm64 (run only): {:?}", t.elapsed());
    let t = Instant::now();
    assert_eq!(emu.probe(&arm64).await.unwrap(), Runnable::NotRunnable);
    eprintln!("probe linux/arm64 (cached): {:?}", t.elapsed());

    // never → error naming linux/arm64 and both fixes, before touching the engine
    let never = Emulation::new(engine.clone(), &cleanup);
    sweep.0.push(never.run_id().to_string());
    let err = never
        .ensure(
            std::slice::from_ref(&arm64),
            BinfmtMode::Never,
            None,
            &reporter,
        )
        .await
        .unwrap_err();
    let msg = err.to_string();
    eprintln!("never: {msg}");
    assert!(matches!(err, EmulationError::Never { .. }));
    assert!(msg.contains("linux/arm64"), "{msg}");
    assert!(
        msg.contains("binfmt: auto") && msg.contains("builders:"),
        "{msg}"
    );
    assert!(leftovers(never.run_id()).is_empty() && reporter.0.lock().unwrap().is_empty());
    never.remove_probe_images().await;

    // require → error, nothing registered
    let before = entries();
    let err = emu
        .ensure(
            std::slice::from_ref(&arm64),
            BinfmtMode::Require,
            None,
            &reporter,
        )
        .await
        .unwrap_err();
    eprintln!("require: {err}");
    assert!(matches!(err, EmulationError::Required { .. }));
    assert!(err.to_string().contains("linux/arm64"));
    assert_eq!(entries(), before, "require must not register");

    // auto → registers, then Emulated, and the probe image runs under docker run
    let t = Instant::now();
    let statuses = emu
        .ensure(
            &[arm64.clone(), native.clone()],
            BinfmtMode::Auto,
            None,
            &reporter,
        )
        .await;
    eprintln!("auto ensure (registration + re-probe): {:?}", t.elapsed());
    eprintln!("entries after auto: {:#?}", entries());
    let statuses = statuses.unwrap();
    assert_eq!(
        statuses,
        vec![
            (
                arm64.clone(),
                EmulationStatus::Emulated {
                    registered_now: true
                }
            ),
            (native.clone(), EmulationStatus::Native),
        ]
    );
    let entry = fs::read_to_string(Path::new(BINFMT_MISC).join("qemu-aarch64")).unwrap();
    eprintln!("qemu-aarch64 entry:\n{entry}");
    assert!(entry.contains("flags: POCF"), "{entry}");
    let t = Instant::now();
    assert_eq!(emu.probe(&arm64).await.unwrap(), Runnable::Emulated);
    eprintln!("probe linux/arm64 (cached after ensure): {:?}", t.elapsed());
    emu.forget(&arm64);
    let t = Instant::now();
    assert_eq!(emu.probe(&arm64).await.unwrap(), Runnable::Emulated);
    eprintln!("probe linux/arm64 (emulated run): {:?}", t.elapsed());

    let image = emu.probe_image(&arm64).await.unwrap();
    let name = format!("polyarch-binfmt-test-{}", emu.run_id());
    let st = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--name",
            &name,
            "--network",
            "none",
            "--platform",
            "linux/arm64",
            &image,
        ])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(42), "docker run of {image}");

    // A second auto ensure is a no-op (cached, registered_now false after re-probe).
    let again = Emulation::new(engine.clone(), &cleanup);
    sweep.0.push(again.run_id().to_string());
    let statuses = again
        .ensure(
            std::slice::from_ref(&arm64),
            BinfmtMode::Auto,
            None,
            &reporter,
        )
        .await
        .unwrap();
    assert_eq!(
        statuses,
        vec![(
            arm64.clone(),
            EmulationStatus::Emulated {
                registered_now: false
            }
        )]
    );
    again.remove_probe_images().await;
    assert!(leftovers(again.run_id()).is_empty());

    emu.remove_probe_images().await;
    assert_eq!(leftovers(emu.run_id()), Vec::<String>::new());

    // A probe cut off once its image is loaded (an interrupted run drops it) leaves its
    // image, and its container if it was running, to the run's cleanup, which removes them.
    let cut_off = Cleanup::default();
    let cut = Emulation::new(engine.clone(), &cut_off);
    let cut_id = cut.run_id().to_string();
    sweep.0.push(cut_id.clone());
    let loaded = async {
        while leftovers(&cut_id).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let i386 = p("linux/386");
    tokio::select! {
        _ = cut.probe(&i386) => {}
        _ = loaded => {}
    }
    drop(cut);
    assert!(!leftovers(&cut_id).is_empty(), "the probe image is gone");
    cut_off.run(Duration::ZERO, &reporter).await;
    assert_eq!(leftovers(&cut_id), Vec::<String>::new());

    // The CLI under `auto` builds the RUN on arm64 (emulated), and the pushed arm64 image's
    // command runs under `docker run --platform linux/arm64`.
    // Start from an unmounted binfmt_misc with arm64 unregistered: on kernels with
    // sandboxed binfmt_misc instances, polyarch must keep one mounted for the
    // registration to outlive its installer container.
    for (name, content) in entries() {
        if name.contains("aarch64") || content.contains("aarch64") {
            unregister(&name);
        }
    }
    let _ = Command::new("umount").arg(BINFMT_MISC).status();
    let repository = registry.repo("binfmt/auto-run");
    let built = polyarch_build(
        &work.path().join("auto-run"),
        RUNS_ON_TARGET,
        &repository,
        "auto",
        "",
    );
    assert_eq!(
        built.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let record: serde_json::Value = serde_json::from_slice(&built.stdout).unwrap();
    let arm = &record["images"][0]["platforms"][1];
    assert_eq!(arm["platform"], "linux/arm64");
    assert_eq!(arm["build"]["emulated"], true, "{record}");
    let reference = format!("{repository}:v1");
    let ran = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--pull",
            "always",
            "--platform",
            "linux/arm64",
            &reference,
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        "aarch64",
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );

    // A rerun trusts the verdict the run above remembered. With the emulator gone since
    // (a reboot does that), its build meets exec format error: it probes again, registers
    // and still succeeds.
    for (name, content) in entries() {
        if name.contains("aarch64") || content.contains("aarch64") {
            unregister(&name);
        }
    }
    let rerun = polyarch_build(
        &work.path().join("auto-rerun"),
        // A RUN no earlier run cached, so it executes.
        &RUNS_ON_TARGET.replace(
            "/made-on-target",
            &format!("/{}", support::unique_name("rerun")),
        ),
        &registry.repo("binfmt/auto-rerun"),
        "auto",
        "",
    );
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert_eq!(rerun.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("linux/arm64: the emulator an earlier run found")
            && stderr.contains("is gone; probing again"),
        "{stderr}"
    );
    let record: serde_json::Value = serde_json::from_slice(&rerun.stdout).unwrap();
    assert_eq!(
        record["images"][0]["platforms"][1]["build"]["emulated"], true,
        "{record}"
    );
    assert!(
        entries()
            .iter()
            .any(|(name, content)| name.contains("aarch64") || content.contains("aarch64")),
        "the rerun registered arm64 again"
    );

    let _ = Command::new("docker")
        .args(["rmi", "-f", &reference])
        .output();
    drop(sweep);
    drop(guard);
    // The assembled installer image is kept by design (the entries pin interpreters in
    // it); the guard has unregistered them, so remove the images this test added.
    for image in installer_images() {
        if !installers_before.contains(&image) {
            let _ = Command::new("docker").args(["rmi", &image]).output();
        }
    }
}

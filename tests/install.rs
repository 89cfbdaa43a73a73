//! How users get polyarch: `cargo install --locked --path .`, `make install` and the
//! release archive of `make dist`, each run and its result used as a user would.
//! The release build is shared with scripts/release-env.sh's flags and the test run's
//! target directory, so it is built once.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::repo_root;

/// A bash script run in the checkout with the release build's environment.
fn in_checkout(script: &str) -> Output {
    let out = support::as_a_user_runs_cargo(&mut Command::new("bash"))
        .arg("-c")
        .arg(format!("source scripts/release-env.sh && {script}"))
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn make_dist_twice_gives_the_same_archive_holding_what_the_readme_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("one"), tmp.path().join("two"));
    for dir in [&first, &second] {
        in_checkout(&format!("make -s dist DIST_DIR={}", dir.display()));
    }
    let archive = |dir: &Path| -> PathBuf {
        let found: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one archive in {}: {found:?}",
            dir.display()
        );
        found[0].clone()
    };
    let (a, b) = (archive(&first), archive(&second));
    assert_eq!(a.file_name(), b.file_name());
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "two `make dist` runs differ: {} {}",
        a.display(),
        b.display()
    );

    // Unpacked, every file is listed in SHA256SUMS and matches it, and the binary runs.
    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = Path::new("tar");
    run(
        tar,
        &[
            "-xzf",
            a.to_str().unwrap(),
            "-C",
            unpacked.to_str().unwrap(),
        ],
    );
    let top = std::fs::read_dir(&unpacked)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for file in [
        "polyarch",
        "man/polyarch.1",
        "completions/polyarch.bash",
        "completions/_polyarch",
        "completions/polyarch.fish",
        "LICENSE",
        "NOTICE",
        "SHA256SUMS",
    ] {
        assert!(top.join(file).is_file(), "{file} in {}", a.display());
    }
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&top)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let version = run(&top.join("polyarch"), &["--version"]);
    assert!(version.starts_with("polyarch "), "{version}");
}

#[test]
fn cargo_install_from_the_checkout_gives_a_working_polyarch() {
    let root = tempfile::tempdir().unwrap();
    in_checkout(&format!(
        "\"${{CARGO:-cargo}}\" install --quiet --locked --path . --root {}",
        root.path().display()
    ));
    let bin = root.path().join("bin/polyarch");
    let version = run(&bin, &["--version"]);
    assert_eq!(
        version.trim(),
        format!("polyarch {}", env!("CARGO_PKG_VERSION"))
    );
    let schema = run(&bin, &["schema", "coverage"]);
    assert!(schema.contains("polyarch/coverage/v1"), "{schema}");
}

#[test]
fn make_install_puts_binary_man_page_completions_and_the_docker_plugin_where_asked() {
    let dest = tempfile::tempdir().unwrap();
    let docker_config = tempfile::tempdir().unwrap();
    in_checkout(&format!(
        "DOCKER_CONFIG={} make -s install PREFIX=/opt/pa DESTDIR={} DOCKER_PLUGIN=user",
        docker_config.path().display(),
        dest.path().display()
    ));
    let plugin = docker_config.path().join("cli-plugins/docker-polyarch");
    let metadata: serde_json::Value =
        serde_json::from_str(&run(&plugin, &["docker-cli-plugin-metadata"])).unwrap();
    assert_eq!(metadata["SchemaVersion"], "0.1.0", "{metadata}");
    let prefix = dest.path().join("opt/pa");
    let man = std::fs::read_to_string(prefix.join("share/man/man1/polyarch.1")).unwrap();
    assert!(man.contains(".TH polyarch"), "{man}");
    for completion in [
        "share/bash-completion/completions/polyarch",
        "share/zsh/site-functions/_polyarch",
        "share/fish/vendor_completions.d/polyarch.fish",
    ] {
        let text = std::fs::read_to_string(prefix.join(completion)).unwrap();
        assert!(text.contains("polyarch"), "{completion}: {text}");
    }
    let help = run(&prefix.join("bin/polyarch"), &["--help"]);
    assert!(help.contains("gate"), "{help}");
}

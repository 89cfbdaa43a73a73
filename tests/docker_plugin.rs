//! `docker polyarch …`: the binary installed as a Docker CLI plugin in a temporary
//! DOCKER_CONFIG, driven by the real docker CLI (the machine's, and Docker 26.1's from
//! scripts/engine26.sh when it is there): the CLI lists it, runs it, and the engine the
//! CLI's --host, --context or current context names is the one polyarch uses.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{hello_context, run, unique_name, write_project, Registry, HELLO};

/// A DOCKER_CONFIG holding only the plugin, as `make install DOCKER_PLUGIN=user` leaves it.
fn config_with_plugin() -> tempfile::TempDir {
    let config = tempfile::tempdir().unwrap();
    let plugins = config.path().join("cli-plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_polyarch"),
        plugins.join("docker-polyarch"),
    )
    .unwrap();
    config
}

/// The docker CLIs on this machine: the machine's, and Docker 26.1's.
fn docker_clis() -> Vec<PathBuf> {
    let mut clis = vec![PathBuf::from("docker")];
    let engine26 = run(Command::new("bash")
        .arg(support::repo_root().join("scripts/engine26.sh"))
        .arg("bin"));
    let dir = String::from_utf8_lossy(&engine26.stdout).trim().to_string();
    if engine26.status.success() && Path::new(&dir).join("docker").is_file() {
        clis.push(Path::new(&dir).join("docker"));
    }
    clis
}

/// `docker ARGS` with only the temporary config: no DOCKER_HOST or DOCKER_CONTEXT from
/// the test's environment.
fn docker(cli: &Path, config: &Path, args: &[&str]) -> Output {
    run(Command::new(cli)
        .args(args)
        .env("DOCKER_CONFIG", config)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .env("CI", "true"))
}

fn stdout_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn docker_lists_and_runs_the_plugin_on_the_engine_its_flags_and_context_name() {
    let config = config_with_plugin();
    let cfg = config.path();
    for cli in docker_clis() {
        let name = cli.display().to_string();
        let help = stdout_ok(&docker(&cli, cfg, &["--help"]), &name);
        assert!(
            help.lines().any(|l| l.trim_start().starts_with("polyarch")),
            "{name} --help lists the plugin: {help}"
        );

        let version = stdout_ok(&docker(&cli, cfg, &["polyarch", "version"]), &name);
        assert!(
            version.starts_with(&format!("polyarch {}\n", env!("CARGO_PKG_VERSION"))),
            "{version}"
        );

        let host = "unix:///run/polyarch-plugin-test-none.sock";
        let by_flag = stdout_ok(
            &docker(&cli, cfg, &["-H", host, "polyarch", "version"]),
            &name,
        );
        assert!(by_flag.contains(&format!("engine: {host}")), "{by_flag}");

        let context = unique_name("pa-ctx");
        let ctx_host = "unix:///run/polyarch-plugin-test-ctx.sock";
        let create = docker(
            &cli,
            cfg,
            &[
                "context",
                "create",
                &context,
                "--docker",
                &format!("host={ctx_host}"),
            ],
        );
        stdout_ok(&create, "docker context create");
        let by_context = stdout_ok(
            &docker(&cli, cfg, &["--context", &context, "polyarch", "version"]),
            &name,
        );
        assert!(
            by_context.contains(&format!("engine: {context} ({ctx_host})")),
            "{by_context}"
        );
        stdout_ok(
            &docker(&cli, cfg, &["context", "use", &context]),
            "docker context use",
        );
        let current = stdout_ok(&docker(&cli, cfg, &["polyarch", "version"]), &name);
        assert!(current.contains(&format!("({ctx_host})")), "{current}");
        stdout_ok(
            &docker(&cli, cfg, &["context", "use", "default"]),
            "docker context use",
        );
        stdout_ok(
            &docker(&cli, cfg, &["context", "rm", &context]),
            "docker context rm",
        );

        // A usage error is polyarch's, with its exit code, under the plugin's name.
        let bad = docker(&cli, cfg, &["polyarch", "build", "--jobs", "0"]);
        assert_eq!(
            bad.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&bad.stderr)
        );
    }
}

#[test]
fn docker_polyarch_build_pushes_and_verifies_a_from_scratch_project() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repository = registry.repo(&unique_name("plugin/hello"));
    let file = write_project(
        dir.path(),
        &repository,
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let record = dir.path().join("record.json");
    let config = config_with_plugin();
    // The engine the tests use, named to the docker CLI by -H (not by the environment).
    let engine = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into());
    let cli = docker_clis().pop().expect("a docker CLI");
    let out = docker(
        &cli,
        config.path(),
        &[
            "-H",
            &engine,
            "polyarch",
            "build",
            "-f",
            file.to_str().unwrap(),
            "--record",
            record.to_str().unwrap(),
            "--output-format",
            "markdown",
        ],
    );
    let table = stdout_ok(&out, "docker polyarch build");
    assert!(
        table.starts_with("### polyarch: ✅ every declared platform is covered"),
        "{table}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(record["covered"], true, "{record}");
    let platforms: Vec<&str> = record["images"][0]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["platform"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    let pushed = support::skopeo_inspect_raw(&format!("{repository}:v1"));
    assert_eq!(
        pushed["manifests"].as_array().map(Vec::len),
        Some(2),
        "{pushed}"
    );
}

/// Docker 26.1's CLI (the machine's 20.10 has no plugin socket).
fn docker26() -> PathBuf {
    let cli = docker_clis().pop().expect("a docker CLI");
    assert!(
        cli.is_absolute(),
        "Docker 26.1's CLI (scripts/engine26.sh bin) is needed: scripts/ensure-env.sh installs it"
    );
    cli
}

#[test]
fn interrupting_the_docker_cli_stops_the_plugin_through_its_socket() {
    use std::net::TcpListener;
    use std::time::{Duration, Instant};
    // A "registry" that accepts and never answers: verify waits on it until interrupted.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted, connected) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let held = listener.accept();
        let _ = accepted.send(());
        // Kept open until the test ends.
        std::thread::sleep(Duration::from_secs(120));
        drop(held);
    });
    let config = config_with_plugin();
    let reference = format!("127.0.0.1:{port}/{}:v1", unique_name("hang"));
    // Output to pipes, not a terminal: the CLI then does not pass the signal on, it
    // closes the plugin socket.
    let mut child = Command::new(docker26())
        .args([
            "polyarch",
            "verify",
            &reference,
            "--platform",
            "linux/amd64",
        ])
        .env("DOCKER_CONFIG", config.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    connected
        .recv_timeout(Duration::from_secs(30))
        .expect("polyarch reached the registry");
    let kill = run(Command::new("kill").args(["-INT", &child.id().to_string()]));
    assert!(kill.status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "docker polyarch still runs after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
}

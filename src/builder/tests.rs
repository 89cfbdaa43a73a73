use super::platforms::PlatformLogs;
use super::*;
use crate::builder::binfmt::EmulationError;
use bollard_buildkit_proto::moby::buildkit::v1::{Vertex, VertexLog};

struct Recorded(std::sync::Mutex<Vec<Event>>);

impl Reporter for Recorded {
    fn report(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

fn vertex(digest: &str, name: &str, inputs: &[&str], error: &str) -> Vertex {
    Vertex {
        digest: digest.into(),
        name: name.into(),
        inputs: inputs.iter().map(|i| i.to_string()).collect(),
        error: error.into(),
        started: Some(Default::default()),
        ..Default::default()
    }
}

/// The steps of a two-platform solve as BuildKit lists them: an exec-form RUN has no
/// platform in its name, and may come before the step it builds on.
fn copies_listed_out_of_order() -> StatusResponse {
    StatusResponse {
        vertexes: vec![
            vertex("run-arm", "[2/2] RUN [\"/app\"]", &["copy-arm"], ""),
            vertex("ctx", "[internal] load build context", &[], ""),
            vertex("copy-arm", "[linux/arm64 1/2] COPY app /app", &["ctx"], ""),
            vertex("copy-amd", "[linux/amd64 1/2] COPY app /app", &["ctx"], ""),
            vertex("run-amd", "[2/2] RUN [\"/app\"]", &["copy-amd"], ""),
        ],
        ..Default::default()
    }
}

/// The arm64 RUN fails with `exec format error`; the amd64 one is cancelled with it.
fn arm64_fails_and_amd64_is_cancelled() -> StatusResponse {
    StatusResponse {
        vertexes: vec![
            vertex(
                "run-arm",
                "[2/2] RUN [\"/app\"]",
                &["copy-arm"],
                "exit code: 255",
            ),
            vertex(
                "run-amd",
                "[2/2] RUN [\"/app\"]",
                &["copy-amd"],
                "context canceled",
            ),
        ],
        logs: vec![VertexLog {
            vertex: "run-arm".into(),
            msg: b"exec /app: exec format error\n".to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Each step event reported: (platform, step name).
fn recorded_steps(recorded: &Recorded) -> Vec<(String, String)> {
    recorded
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| match event {
            Event::Step { platform, name, .. } => Some((platform.to_string(), name.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_multi_platform_solve_reports_each_step_against_its_platform() {
    let platforms: Vec<Platform> = vec![
        "linux/amd64".parse().unwrap(),
        "linux/arm64".parse().unwrap(),
    ];
    let native: Platform = "linux/amd64".parse().unwrap();
    let recorded = Recorded(Default::default());
    let started = BuildStage::default();
    let mut logs = PlatformLogs::new("api", &platforms, &native, &started, &recorded);
    logs.route(copies_listed_out_of_order());
    logs.route(arm64_fails_and_amd64_is_cancelled());
    let steps = recorded_steps(&recorded);
    for platform in ["linux/amd64", "linux/arm64"] {
        let mut mine: Vec<&str> = steps
            .iter()
            .filter(|(p, _)| p == platform)
            .map(|(_, name)| name.as_str())
            .collect();
        mine.sort();
        assert_eq!(
            mine,
            [
                "[1/2] COPY app /app",
                "[2/2] RUN [\"/app\"]",
                "[internal] load build context"
            ],
            "{platform}"
        );
    }
    // The platform whose own step failed explains the failure, not the one cancelled.
    let failed = logs.failed().unwrap();
    assert_eq!(logs.logs[failed].platform.to_string(), "linux/arm64");
    assert!(!logs.logs[failed].shared_failure);
    assert!(matches!(
        logs.logs[failed].failure("exit code: 255", |m| BuilderError::Build {
            image: "api".into(),
            platform: "linux/arm64".into(),
            source: BuildError::StepFailed(m),
        }),
        BuilderError::Emulation(kind) if matches!(*kind, EmulationError::ExecFormat { .. })
    ));
}

#[test]
fn exec_format_error_means_missing_emulation_only_on_a_foreign_platform() {
    let platform: Platform = "linux/arm64".parse().unwrap();
    let started = BuildStage::default();
    let failure = |foreign: bool| {
        let mut log = BuildLog {
            image: "api",
            platform: &platform,
            foreign,
            shared_failure: false,
            reporter: &crate::base::progress::Silent,
            stage: &started,
            tail: VecDeque::from(["exec /app: exec format error".to_string()]),
            vertex_names: HashMap::new(),
            started: Vec::new(),
            current_step: Some("RUN /app".into()),
            vertex_error: None,
        };
        log.failure("process did not complete successfully", |message| {
            BuilderError::Build {
                image: "api".into(),
                platform: platform.to_string(),
                source: BuildError::StepFailed(message),
            }
        })
    };
    assert!(matches!(
        failure(true),
        BuilderError::Emulation(kind) if matches!(*kind, EmulationError::ExecFormat { .. })
    ));
    // A program of another architecture copied into the image, run on the engine's own
    // platform: the build's failure, with the step and the log line that says why.
    match failure(false) {
        BuilderError::Build {
            source: BuildError::StepFailed(message),
            ..
        } => {
            assert!(message.contains("at step `RUN /app`"), "{message}");
            assert!(message.contains("exec format error"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn build_args_match_buildx() {
    let args: HashMap<_, _> = platform_build_args(
        &"linux/arm64".parse().unwrap(),
        &"linux/amd64".parse().unwrap(),
    )
    .into_iter()
    .collect();
    assert_eq!(args["TARGETPLATFORM"], "linux/arm64/v8");
    assert_eq!(args["TARGETARCH"], "arm64");
    assert_eq!(args["TARGETVARIANT"], "v8");
    assert_eq!(args["BUILDPLATFORM"], "linux/amd64");
    assert_eq!(args["BUILDVARIANT"], "");
}

#[test]
fn a_dockerfile_specific_ignore_file_replaces_the_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("build")).unwrap();
    for f in [
        "build/app.Dockerfile",
        "secret.txt",
        "other.txt",
        "Dockerfile",
    ] {
        std::fs::write(root.join(f), f).unwrap();
    }
    std::fs::write(root.join(".dockerignore"), "other.txt\n").unwrap();
    std::fs::write(
        root.join("build/app.Dockerfile.dockerignore"),
        "secret.txt\n",
    )
    .unwrap();
    let sent = |dockerfile: &str| -> Vec<String> {
        ContextFilter::load(root, Path::new(dockerfile))
            .unwrap()
            .files(root)
            .unwrap()
            .into_iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    };
    let specific = sent("build/app.Dockerfile");
    assert!(
        !specific.contains(&"secret.txt".to_string()),
        "{specific:?}"
    );
    assert!(specific.contains(&"other.txt".to_string()), "{specific:?}");
    assert!(specific.contains(&"build/app.Dockerfile.dockerignore".to_string()));
    // Another Dockerfile of the same context still reads the context's file.
    let plain = sent("Dockerfile");
    assert!(plain.contains(&"secret.txt".to_string()), "{plain:?}");
    assert!(!plain.contains(&"other.txt".to_string()), "{plain:?}");
}

#[test]
fn parses_step_counters() {
    assert_eq!(classic_step("Step 2/5 : COPY . /"), Some((2, 5)));
    assert_eq!(buildkit_step("[stage-1 3/4] RUN make"), Some((3, 4)));
    assert_eq!(buildkit_step("[2/3] COPY a b"), Some((2, 3)));
    assert_eq!(buildkit_step("[internal] load metadata"), None);
}

#[test]
fn dockerignore_is_anchored_with_exceptions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("logs")).unwrap();
    std::fs::create_dir_all(root.join("src/logs")).unwrap();
    for f in [
        "Dockerfile",
        "a.txt",
        "b.md",
        "logs/x",
        "logs/keep",
        "src/logs/y",
        "secret.key",
    ] {
        std::fs::write(root.join(f), f).unwrap();
    }
    std::fs::write(
        root.join(".dockerignore"),
        "# c\nlogs\n!logs/keep\n*.md\n/secret.key\nDockerfile\n",
    )
    .unwrap();
    let files: Vec<String> = ContextFilter::load(root, Path::new("Dockerfile"))
        .unwrap()
        .files(root)
        .unwrap()
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    for expected in [
        "Dockerfile",
        ".dockerignore",
        "a.txt",
        "logs/keep",
        "src/logs/y",
    ] {
        assert!(
            files.contains(&expected.to_string()),
            "{expected} missing from {files:?}"
        );
    }
    for excluded in ["b.md", "logs/x", "secret.key"] {
        assert!(
            !files.contains(&excluded.to_string()),
            "{excluded} sent: {files:?}"
        );
    }
}

#[test]
fn the_engines_message_is_classified_in_one_place() {
    let platform: Platform = "linux/amd64".parse().unwrap();
    let started = BuildStage::default();
    let mut log = BuildLog::new(
        "api",
        &platform,
        false,
        &started,
        &crate::base::progress::Silent,
    );
    log.step("[2/2] RUN make", 2, Some(2));
    log.line("compiling");
    match log.classify(&Stopped::Lost("transport error: connection closed".into())) {
        Some(BuildError::BuilderLost(message)) => {
            assert!(message.starts_with("transport error"), "{message}");
            assert!(message.contains("at step `[2/2] RUN make`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let digest =
        "failed to get digest sha256:abc: open /var/lib/docker/image: no such file or directory";
    assert!(matches!(
        log.classify(&Stopped::Failed(digest.into())),
        Some(BuildError::ImageLost(_))
    ));
    // A failing step is the build's own failure, explained with its log by the caller.
    assert!(log
        .classify(&Stopped::Failed("exit code: 2".into()))
        .is_none());
}

#[test]
fn named_contexts_become_frontend_inputs_as_buildx_sends_them() {
    use crate::project::contexts::NamedContext;
    let spec = crate::project::ImageSpec {
        contexts: [
            ("assets", NamedContext::Dir("/src/assets".into())),
            ("context", NamedContext::Dir("/src/other".into())),
            (
                "base",
                NamedContext::Image("r.example/base@sha256:1".into()),
            ),
        ]
        .into_iter()
        .map(|(name, context)| (name.to_string(), context))
        .collect(),
        ..crate::project::test_image("v1")
    };
    let (attrs, _) = frontend_attrs(&spec, "linux/amd64");
    assert_eq!(attrs["context:assets"], "local:assets");
    // The two names the main build serves are not taken over.
    assert_eq!(attrs["context:context"], "local:_context");
    assert_eq!(
        attrs["context:base"],
        "docker-image://r.example/base@sha256:1"
    );
    assert_eq!(
        attrs["frontend.caps"],
        "moby.buildkit.frontend.contexts+forward"
    );
    let served = crate::project::contexts::session_dirs(&spec.contexts);
    assert_eq!(
        served,
        [
            ("assets".to_string(), std::path::Path::new("/src/assets")),
            ("_context".to_string(), std::path::Path::new("/src/other")),
        ]
    );
    let (none, _) = frontend_attrs(&crate::project::test_image("v1"), "linux/amd64");
    assert!(!none
        .keys()
        .any(|k| k.starts_with("context:") || k == "frontend.caps"));
}

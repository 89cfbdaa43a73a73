//! `test:`: a platform's pushed image runs a command on the builder that built it, as one
//! BuildKit solve of `FROM <repository>@<digest>` plus the command as a `RUN`, exported
//! nowhere. BuildKit runs a foreign platform under the same QEMU as its build.

use super::cleanup::Cleanup;
use super::error::BuilderError;
use crate::base::digest::Digest;
use crate::base::progress::{Event, Phase, Reporter};
use crate::docker::buildkit;
use crate::docker::engine::{Engine, Product};
use crate::project::platform_test::PlatformTest;
use crate::project::ImageSpec;
use crate::registry::RegistryOptions;
use crate::Platform;
use bollard_buildkit_proto::moby::buildkit::v1::StatusResponse;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Lines of a test's output kept for the record.
pub const OUTPUT_TAIL: usize = 20;

mod container;

/// How a test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStatus {
    Passed,
    /// A non-zero exit, a signal, or a program the platform cannot run.
    Failed,
    /// Cancelled by polyarch at the entry's `timeout`.
    TimedOut,
}

/// What one test of one platform did.
#[derive(Debug, Clone)]
pub struct TestOutcome {
    pub status: TestStatus,
    pub exit_code: Option<i64>,
    pub seconds: f64,
    /// The last [`OUTPUT_TAIL`] lines the command wrote, then BuildKit's failure.
    pub output_tail: Vec<String>,
}

impl TestOutcome {
    /// The kernel could not run the command's binary: no emulator for its architecture.
    pub fn exec_format_error(&self) -> bool {
        self.status == TestStatus::Failed
            && self
                .output_tail
                .iter()
                .any(|line| line.contains("exec format error"))
    }
}

/// Why a test could not be run at all (no verdict on the image).
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    /// The builder cannot run tests: no BuildKit (Podman, the classic builder).
    #[error("{0}")]
    Unsupported(String),
    /// The builder went away or refused the session.
    #[error("{0}")]
    Lost(String),
    /// BuildKit failed before the command started (e.g. fetching the image).
    #[error("the test did not start: {0}")]
    NotStarted(String),
    #[error("writing the test's Dockerfile: {0}")]
    Io(#[source] std::io::Error),
}

/// One test of one pushed platform image.
#[derive(Clone, Copy)]
pub struct TestOf<'a> {
    pub spec: &'a ImageSpec,
    pub platform: &'a Platform,
    /// The platform manifest pushed by digest.
    pub digest: &'a Digest,
    pub test: &'a PlatformTest,
    /// How polyarch reaches registries: a builder without BuildKit pulls the image itself.
    pub registry: &'a RegistryOptions,
    /// Where a test's container is recorded, so an interrupted run removes it.
    pub cleanup: &'a Cleanup,
    pub reporter: &'a dyn Reporter,
}

/// The Dockerfile of a test: the pushed image by digest, then the command as a `RUN`
/// (exec form, JSON), its env as build args (so any value passes unquoted), workdir and
/// user.
pub fn test_dockerfile(repository: &str, digest: &Digest, test: &PlatformTest) -> String {
    let mut lines = vec![format!("FROM {repository}@{digest}")];
    for key in test.env.keys() {
        lines.push(format!("ARG {key}"));
    }
    if let Some(dir) = &test.workdir {
        lines.push(format!("WORKDIR {dir}"));
    }
    if let Some(user) = &test.user {
        lines.push(format!("USER {user}"));
    }
    let argv = serde_json::to_string(&test.run.argv()).unwrap_or_default();
    lines.push(format!("RUN {argv}"));
    lines.join("\n") + "\n"
}

/// Runs `of` on `engine`: in a BuildKit solve, whose timeout cancels it (dropping it
/// cancels the build in BuildKit), or on Podman in a container.
pub async fn test_on_engine(engine: &Engine, of: TestOf<'_>) -> Result<TestOutcome, BuilderError> {
    let TestOf {
        spec,
        platform,
        digest,
        test,
        reporter,
        ..
    } = of;
    let error = |source: TestError| BuilderError::Test {
        image: spec.name.clone(),
        platform: platform.to_string(),
        source,
    };
    reporter.report(Event::Phase {
        image: spec.name.clone(),
        platform: Some(platform.clone()),
        phase: Phase::Test,
        message: format!("testing {}", test.run.shown()),
    });
    if !engine.buildkit {
        return match engine.product {
            Product::Podman => container::test_in_container(engine, &of)
                .await
                .map_err(error),
            _ => Err(error(TestError::Unsupported(unsupported(&engine.endpoint)))),
        };
    }
    let dir = tempfile::Builder::new()
        .prefix("polyarch-test-")
        .tempdir()
        .map_err(|e| error(TestError::Io(e)))?;
    std::fs::write(
        dir.path().join("Dockerfile"),
        test_dockerfile(&spec.repository, digest, test),
    )
    .map_err(|e| error(TestError::Io(e)))?;
    let mut attrs: HashMap<String, String> = HashMap::from([
        ("platform".to_string(), platform.to_string()),
        // Every run runs the command: a cached RUN would be no test.
        ("no-cache".to_string(), String::new()),
    ]);
    for (key, value) in &test.env {
        attrs.insert(format!("build-arg:{key}"), value.clone());
    }
    let entitlements = super::network_attrs(test.network, &mut attrs);
    let build = buildkit::DockerfileBuild {
        context: dir.path(),
        dockerfile: std::path::Path::new("Dockerfile"),
        named_dirs: Vec::new(),
        frontend_attrs: attrs,
        entitlements,
        // No export: the image is already pushed; the solve only runs the command.
        exporter: buildkit::Exporter {
            kind: String::new(),
            attrs: HashMap::new(),
            file: None,
        },
        secrets: buildkit::secrets::SecretStore::new(Default::default()),
        ssh: buildkit::ssh::SshAgents::new(Default::default()),
        cache_from: Vec::new(),
        cache_to: None,
        history: false,
        hashes: None,
    };
    let mut output = Output::default();
    let started = Instant::now();
    let solve = buildkit::solve_on(
        super::solve_target(engine),
        build,
        super::session_auth(spec),
        |status| output.read(status),
    );
    let solved = tokio::time::timeout(test.timeout, solve).await;
    let seconds = started.elapsed().as_secs_f64();
    let (status, exit_code) = match solved {
        Err(_elapsed) => {
            output.push_line(format!(
                "polyarch: cancelled after {} (the test's timeout)",
                crate::base::duration::show(test.timeout)
            ));
            (TestStatus::TimedOut, None)
        }
        Ok(Ok(_)) => (TestStatus::Passed, Some(0)),
        Ok(Err(e @ (buildkit::SolveError::Connect { .. } | buildkit::SolveError::Lost(_)))) => {
            return Err(error(TestError::Lost(e.to_string())))
        }
        Ok(Err(e)) if !output.command_started => {
            return Err(error(TestError::NotStarted(e.to_string())))
        }
        Ok(Err(e)) => {
            let message = e.to_string();
            output.push_line(crate::base::text::one_line(&message));
            (TestStatus::Failed, exit_code(&message))
        }
    };
    Ok(TestOutcome {
        status,
        exit_code,
        seconds,
        output_tail: output.tail.into_iter().collect(),
    })
}

/// Why `endpoint` (a Docker engine with the classic builder only) cannot run a test, with
/// the fix.
pub fn unsupported(endpoint: &str) -> String {
    format!("the engine at {endpoint} has no BuildKit (the classic builder): enable BuildKit there (Docker 18.09+), build this image on a BuildKit-capable engine or a buildkitd, or run with --no-test")
}

/// The exit code in BuildKit's failure: "… did not complete successfully: exit code: 3"
/// (BuildKit 0.9+) or "executor failed running […]: exit code: 3" (0.8).
fn exit_code(message: &str) -> Option<i64> {
    let (_, rest) = message.rsplit_once("exit code: ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The command's output as BuildKit streams it, last lines only.
#[derive(Default)]
struct Output {
    tail: VecDeque<String>,
    partial: Vec<u8>,
    /// The `RUN` vertex began: a failure from here on is the test's.
    command_started: bool,
    run_vertex: Option<String>,
}

impl Output {
    fn read(&mut self, status: StatusResponse) {
        for vertex in &status.vertexes {
            if vertex.name.contains("] RUN ") {
                self.run_vertex.get_or_insert_with(|| vertex.digest.clone());
                if vertex.started.is_some() {
                    self.command_started = true;
                }
            }
        }
        for log in status.logs {
            if self.run_vertex.as_ref() != Some(&log.vertex) {
                continue;
            }
            self.partial.extend_from_slice(&log.msg);
            while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=end).collect();
                self.push_line(String::from_utf8_lossy(&line[..end]).into_owned());
            }
        }
    }

    fn push_line(&mut self, line: String) {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            self.push(String::from_utf8_lossy(&rest).into_owned());
        }
        self.push(line);
    }

    fn push(&mut self, line: String) {
        let line = line.trim_end_matches('\r').to_string();
        if self.tail.len() == OUTPUT_TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::platform_test::TestCommand;
    use crate::project::Network;

    fn test(run: TestCommand) -> PlatformTest {
        PlatformTest {
            run,
            timeout: std::time::Duration::from_secs(5),
            env: [("MODE".to_string(), "a \"b\" $c".to_string())].into(),
            network: Network::None,
            user: Some("nobody".into()),
            workdir: Some("/srv".into()),
            platforms: Vec::new(),
        }
    }

    #[test]
    fn the_dockerfile_runs_the_pushed_image_by_digest() {
        let digest: Digest = format!("sha256:{}", "a".repeat(64)).parse().unwrap();
        let shell = test(TestCommand::Shell("echo \"$MODE\"\nexit 3".into()));
        assert_eq!(
            test_dockerfile("127.0.0.1:5000/app", &digest, &shell),
            format!("FROM 127.0.0.1:5000/app@{digest}\nARG MODE\nWORKDIR /srv\nUSER nobody\nRUN [\"/bin/sh\",\"-c\",\"echo \\\"$MODE\\\"\\nexit 3\"]\n")
        );
    }

    #[test]
    fn the_exit_code_is_read_from_either_buildkits_words() {
        assert_eq!(
            exit_code("process \"/bin/sh -c false\" did not complete successfully: exit code: 3"),
            Some(3)
        );
        assert_eq!(
            exit_code("executor failed running [/bin/busybox sh -c x]: exit code: 1"),
            Some(1)
        );
        assert_eq!(exit_code("failed to run: exec format error"), None);
    }

    #[test]
    fn only_the_last_lines_of_the_commands_output_are_kept() {
        let mut output = Output {
            run_vertex: Some("run".into()),
            ..Default::default()
        };
        let logs = (0..30)
            .map(|i| bollard_buildkit_proto::moby::buildkit::v1::VertexLog {
                vertex: "run".into(),
                msg: format!("line {i}\n").into_bytes(),
                ..Default::default()
            })
            .chain([bollard_buildkit_proto::moby::buildkit::v1::VertexLog {
                vertex: "pull".into(),
                msg: b"not the command's\n".to_vec(),
                ..Default::default()
            }])
            .collect();
        output.read(StatusResponse {
            logs,
            ..Default::default()
        });
        assert_eq!(output.tail.len(), OUTPUT_TAIL);
        assert_eq!(output.tail.front().map(String::as_str), Some("line 10"));
        assert_eq!(output.tail.back().map(String::as_str), Some("line 29"));
    }
}

//! A platform's test where the builder has no BuildKit (Podman's compatible API): the
//! pushed image pulled by digest through libpod (which can be told a registry speaks plain
//! HTTP), a container created for the platform, run to its end or timeout, then removed.

use super::{TestError, TestOf, TestOutcome, TestStatus, OUTPUT_TAIL};
use crate::docker::container::{ContainerRun, Ended};
use crate::docker::engine::Engine;
use crate::docker::libpod::{self, PullAccess};
use crate::project::Network;
use crate::registry::{credentials, parse_reference};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Runs `of` in a container on `engine` (Podman); a test that could not start its command
/// (exec format error, a missing binary) fails with the engine's words in its tail.
pub(super) async fn test_in_container(
    engine: &Engine,
    of: &TestOf<'_>,
) -> Result<TestOutcome, TestError> {
    let TestOf {
        spec,
        platform,
        digest,
        test,
        registry,
        cleanup,
        ..
    } = *of;
    let repository =
        parse_reference(&spec.repository).map_err(|e| TestError::NotStarted(e.to_string()))?;
    let host = repository.registry().to_string();
    let access = PullAccess {
        tls_verify: !registry.allows_plain_http(&host),
        credential: match spec.login.clone() {
            Some(login) => Some(login),
            None => credentials::resolve(&host, None)
                .map_err(|e| TestError::NotStarted(e.to_string()))?,
        },
    };
    let image = format!("{}@{digest}", spec.repository);
    let started = Instant::now();
    libpod::pull(&engine.location, &image, platform, &access)
        .await
        .map_err(|e| TestError::NotStarted(e.to_string()))?;
    let mut argv = test.run.argv().into_iter();
    let name = container_name();
    let run = ContainerRun {
        name: &name,
        image: &image,
        platform: Some(platform),
        // The command alone, as the BuildKit path's RUN runs it: not the image's entrypoint.
        entrypoint: argv.next().map(|program| vec![program]),
        cmd: Some(argv.collect()),
        env: test.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        user: test.user.clone(),
        workdir: test.workdir.clone(),
        network: match test.network {
            Network::None => Some("none"),
            Network::Host => Some("host"),
            Network::Default => None,
        },
        host_config: Default::default(),
    };
    let outcome = cleanup
        .run_container(engine, run, test.timeout)
        .await
        .map_err(|e| TestError::Lost(e.to_string()))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut tail = last_lines(&outcome.logs);
    let (status, exit_code) = match outcome.ended {
        Ended::Exited(0) => (TestStatus::Passed, Some(0)),
        Ended::Exited(code) => (TestStatus::Failed, Some(code)),
        Ended::NotStarted(refusal) => {
            tail.push(crate::base::text::one_line(&refusal));
            (TestStatus::Failed, None)
        }
        Ended::NotCreated(refusal) => return Err(TestError::NotStarted(refusal)),
        Ended::TimedOut => {
            tail.push(format!(
                "polyarch: stopped after {} (the test's timeout)",
                crate::base::duration::show(test.timeout)
            ));
            (TestStatus::TimedOut, None)
        }
    };
    if tail.len() > OUTPUT_TAIL + 1 {
        tail.drain(..tail.len() - OUTPUT_TAIL - 1);
    }
    Ok(TestOutcome {
        status,
        exit_code,
        seconds,
        output_tail: tail,
    })
}

/// A name no other run or test of this process uses.
fn container_name() -> String {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    format!(
        "polyarch-test-{}-{}",
        std::process::id(),
        SERIAL.fetch_add(1, Ordering::Relaxed)
    )
}

/// The last [`OUTPUT_TAIL`] lines of a container's output.
fn last_lines(logs: &str) -> Vec<String> {
    let lines: Vec<String> = logs
        .lines()
        .map(|line| line.trim_end_matches('\r').to_string())
        .collect();
    let skip = lines.len().saturating_sub(OUTPUT_TAIL);
    lines.into_iter().skip(skip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_lines_of_a_containers_output_are_kept() {
        let logs: String = (0..30).map(|i| format!("line {i}\r\n")).collect();
        let tail = last_lines(&logs);
        assert_eq!(tail.len(), OUTPUT_TAIL);
        assert_eq!(tail[0], "line 10");
        assert_eq!(tail[OUTPUT_TAIL - 1], "line 29");
        assert!(last_lines("").is_empty());
    }
}

//! `test:`: each platform's pushed image runs its tests after every platform of the run is
//! pushed by digest and before any index is published or tag moves. An image with a
//! failing test is not published: its record says which platform failed and how.

use crate::base::digest::Digest;
use crate::base::progress::{Event, Phase, Reporter};
use crate::builder::platform_test::{self, TestError, TestOutcome};
use crate::builder::Builders;
use crate::docker::engine::{Engine, Product};
use crate::flows::cache::TestMemory;
use crate::project::plan::Plan;
use crate::project::platform_test::PlatformTest;
use crate::project::ImageSpec;
use crate::publish::store::ImageStore;
use crate::publish::{index_of, publish_all, Pushed};
use crate::verify::coverage_record::{
    ImageCoverage, PlatformCoverage, PlatformStatus, TestRecord, TestStatus,
};
use crate::verify::ReadMemory;
use crate::{Error, Platform, Result};
use std::collections::BTreeMap;

/// Each tested platform's record, by image name and platform.
pub(crate) type TestResults = BTreeMap<(String, Platform), TestRecord>;

/// The tests an image runs on `platform`, in the project file's order.
pub(crate) fn tests_on<'i>(image: &'i ImageSpec, platform: &Platform) -> Vec<&'i PlatformTest> {
    image
        .tests
        .iter()
        .filter(|test| test.platforms.contains(platform))
        .collect()
}

/// Refuses, before anything is built, a run that would test a platform where tests
/// cannot run: on a Docker engine without BuildKit, or into an OCI layout. `--no-test` lets it
/// through.
pub(super) fn check_testable(plan: &Plan<'_>, builders: &Builders, layout: bool) -> Result<()> {
    for unit in &plan.units {
        if tests_on(unit.image, &unit.platform).is_empty() {
            continue;
        }
        let refuse = |why: String| Error::Test {
            image: unit.image.name.clone(),
            platform: unit.platform.to_string(),
            source: TestError::Unsupported(why),
        };
        if layout {
            return Err(refuse("tests run the image pulled from the registry by digest, and --output oci: pushes nothing: push to a registry, or run with --no-test".into()));
        }
        let engine = builders.for_unit(unit);
        // Podman runs tests as containers; only a classic-builder engine cannot.
        if !engine.buildkit && engine.product != Product::Podman {
            return Err(refuse(platform_test::unsupported(&engine.endpoint)));
        }
    }
    Ok(())
}

/// The engine that built `pushed`: the builder its build info names, else the default.
pub(super) fn builder_of<'b>(builders: &'b Builders, pushed: &Pushed) -> &'b Engine {
    let named = pushed.build.builder.as_deref();
    builders
        .by_platform
        .values()
        .flatten()
        .chain(std::iter::once(&builders.default))
        .find(|engine| Some(engine.endpoint.as_str()) == named)
        .unwrap_or(&builders.default)
}

/// What earlier runs' tests passed, and whether this run may trust them (not with
/// `--rebuild`; an image with `no_cache` always tests again).
pub(crate) struct Earlier<'m> {
    pub memory: &'m TestMemory,
    pub trusted: bool,
}

/// The key a platform's passing tests are remembered by: the image by digest and every
/// setting of its tests, so a changed command, env or timeout runs them again. The
/// settings are hashed as explicit JSON, not as Rust's Debug text, which a toolchain or
/// polyarch release may word differently (forgetting every earlier pass).
fn remembered_as(digest: &Digest, tests: &[&PlatformTest]) -> String {
    let settings: Vec<serde_json::Value> = tests
        .iter()
        .map(|test| {
            serde_json::json!({
                "run": test.run.argv(),
                "timeout_ms": test.timeout.as_millis().to_string(),
                "env": test.env,
                "network": test.network,
                "user": test.user,
                "workdir": test.workdir,
                "platforms": test.platforms.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })
        })
        .collect();
    let text = serde_json::Value::Array(settings).to_string();
    format!("{digest} {}", Digest::of(text.as_bytes()))
}

/// Runs every test of every pushed platform, `jobs` at once; a platform stops at its
/// first failing entry. A platform whose image and tests passed in an earlier run is not
/// run again. A test that cannot run at all (a lost builder) is the run's error.
pub(crate) async fn run_tests(
    images: &[(&ImageSpec, Vec<&Pushed>)],
    jobs: usize,
    earlier: Earlier<'_>,
    reporter: &dyn Reporter,
    run: impl AsyncFn(&ImageSpec, &Pushed, &PlatformTest) -> Result<TestOutcome>,
) -> Result<TestResults> {
    let limit = tokio::sync::Semaphore::new(jobs.max(1));
    let (limit, run, earlier) = (&limit, &run, &earlier);
    let platforms = images.iter().flat_map(|(image, pushed)| {
        pushed
            .iter()
            .map(move |p| (*image, *p, tests_on(image, &p.platform)))
    });
    let tested =
        futures_util::future::try_join_all(platforms.filter(|(_, _, t)| !t.is_empty()).map(
            |(image, pushed, tests)| async move {
                let key = remembered_as(&pushed.entry.digest, &tests);
                let passed_before = (earlier.trusted && !image.no_cache)
                    .then(|| earlier.memory.passed(&key))
                    .flatten();
                let record = match passed_before {
                    Some(record) => TestRecord {
                        earlier_run: true,
                        ..record
                    },
                    None => {
                        let mut ran: Vec<(&PlatformTest, TestOutcome)> = Vec::new();
                        for test in tests {
                            let _job = limit.acquire().await.map_err(|_| Error::Interrupted)?;
                            let outcome = run(image, pushed, test).await?;
                            let passed = outcome.status == platform_test::TestStatus::Passed;
                            ran.push((test, outcome));
                            if !passed {
                                break;
                            }
                        }
                        let record = record_of(&ran);
                        if record.status == TestStatus::Passed {
                            earlier.memory.remember(&key, record.clone());
                        }
                        record
                    }
                };
                reporter.report(Event::Phase {
                    image: image.name.clone(),
                    platform: Some(pushed.platform.clone()),
                    phase: Phase::Test,
                    message: match record.status {
                        TestStatus::Passed if record.earlier_run => {
                            "test passed (earlier run)".to_string()
                        }
                        TestStatus::Passed => {
                            format!("test passed ({:.1}s)", record.seconds.unwrap_or(0.0))
                        }
                        _ => format!("test {}: {}", status_word(record.status), record.command),
                    },
                });
                Ok::<_, Error>(((image.name.clone(), pushed.platform.clone()), record))
            },
        ))
        .await?;
    Ok(tested.into_iter().collect())
}

/// `--no-test`: every platform that has tests is recorded as skipped.
pub(super) fn skipped(images: &[(&ImageSpec, Vec<&Pushed>)]) -> TestResults {
    let mut results = TestResults::new();
    for (image, pushed) in images {
        for p in pushed {
            let tests = tests_on(image, &p.platform);
            if tests.is_empty() {
                continue;
            }
            results.insert(
                (image.name.clone(), p.platform.clone()),
                TestRecord {
                    status: TestStatus::Skipped,
                    command: commands(&tests),
                    exit_code: None,
                    seconds: None,
                    output_tail: Vec::new(),
                    earlier_run: false,
                },
            );
        }
    }
    results
}

fn commands(tests: &[&PlatformTest]) -> String {
    tests
        .iter()
        .map(|t| t.run.shown())
        .collect::<Vec<_>>()
        .join("; ")
}

pub(crate) fn status_word(status: TestStatus) -> &'static str {
    match status {
        TestStatus::Passed => "passed",
        TestStatus::Failed => "failed",
        TestStatus::TimedOut => "timed out",
        TestStatus::Skipped => "skipped",
    }
}

/// One platform's record from its entries as they ran: the last one (the failing one,
/// when one failed), with every command and the seconds of all.
fn record_of(ran: &[(&PlatformTest, TestOutcome)]) -> TestRecord {
    let seconds: f64 = ran.iter().map(|(_, o)| o.seconds).sum();
    let Some((last, outcome)) = ran.last() else {
        return TestRecord {
            status: TestStatus::Skipped,
            command: String::new(),
            exit_code: None,
            seconds: None,
            output_tail: Vec::new(),
            earlier_run: false,
        };
    };
    let status = match outcome.status {
        platform_test::TestStatus::Passed => TestStatus::Passed,
        platform_test::TestStatus::Failed => TestStatus::Failed,
        platform_test::TestStatus::TimedOut => TestStatus::TimedOut,
    };
    let command = match status {
        TestStatus::Passed => ran
            .iter()
            .map(|(t, _)| t.run.shown())
            .collect::<Vec<_>>()
            .join("; "),
        _ => last.run.shown(),
    };
    TestRecord {
        status,
        command,
        exit_code: outcome.exit_code,
        seconds: Some((seconds * 100.0).round() / 100.0),
        output_tail: outcome.output_tail.clone(),
        earlier_run: false,
    }
}

/// Publishes every image none of whose platforms failed a test; an image with a failing
/// test moves no tag and publishes no index, and is recorded as not covered. Each
/// platform's record carries its test.
pub(super) async fn publish_tested(
    destination: &impl ImageStore,
    images: &[(&ImageSpec, Vec<&Pushed>)],
    results: &TestResults,
    memory: &dyn ReadMemory,
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<Vec<ImageCoverage>> {
    let image_failed = |image: &ImageSpec| {
        results
            .iter()
            .any(|((name, _), record)| *name == image.name && record.failed())
    };
    let passing: Vec<(&ImageSpec, Vec<&Pushed>)> = images
        .iter()
        .filter(|(image, _)| !image_failed(image))
        .map(|(image, pushed)| (*image, pushed.clone()))
        .collect();
    let mut published = publish_all(destination, &passing, memory, interrupt, reporter)
        .await?
        .into_iter();
    let mut coverage = Vec::new();
    for (image, pushed) in images {
        let one = match image_failed(image) {
            true => {
                reporter.report(Event::Warning {
                    message: format!(
                        "{}: a platform's test failed; nothing was published for it and no tag moved",
                        image.name
                    ),
                });
                unpublished(image, pushed)?
            }
            false => match published.next() {
                Some(one) => one,
                None => continue,
            },
        };
        coverage.push(one);
    }
    attach_results(&mut coverage, results);
    Ok(coverage)
}

/// The record of an image not published because a platform's test failed.
fn unpublished(image: &ImageSpec, pushed: &[&Pushed]) -> Result<ImageCoverage> {
    let mut mine = pushed.to_vec();
    let index = index_of(image, &mut mine)?;
    let platforms = image
        .platforms
        .iter()
        .map(|declared| {
            let p = mine.iter().find(|p| p.platform == *declared);
            PlatformCoverage {
                platform: declared.clone(),
                digest: p.map(|p| p.entry.digest.clone()),
                config_platform: None,
                size: p.map(|p| p.entry.size),
                status: PlatformStatus::Ok,
                annotations: BTreeMap::new(),
                detail: None,
                deep: None,
                build: p.map(|p| p.build.clone()),
                attached: Vec::new(),
                test: None,
                sbom: None,
                signed: None,
            }
        })
        .collect();
    Ok(ImageCoverage {
        name: image.name.clone(),
        reference: format!("{}:{}", image.repository, image.tags[0]),
        tags: image.tags.clone(),
        digest: index.digest.clone(),
        pinned: String::new(),
        media_type: index.media_type.to_string(),
        size: Some(index.bytes.len() as u64),
        annotations: BTreeMap::new(),
        declared: image.platforms.clone(),
        platforms,
        missing: Vec::new(),
        unexpected: Vec::new(),
        attestations: Vec::new(),
        warnings: Vec::new(),
        covered: false,
        unpublished: Some(
            "a platform's test failed: the index was not published and no tag moved".into(),
        ),
        signed: None,
    })
}

/// Gives each platform's record its test, and marks a failed one as a gap.
pub(crate) fn attach_results(coverage: &mut [ImageCoverage], results: &TestResults) {
    for image in coverage {
        for platform in &mut image.platforms {
            platform.test = results
                .get(&(image.name.clone(), platform.platform.clone()))
                .cloned();
            if platform.test.as_ref().is_some_and(TestRecord::failed) {
                platform.status = PlatformStatus::TestFailed;
                image.covered = false;
            }
        }
    }
}

#[cfg(test)]
mod tests;

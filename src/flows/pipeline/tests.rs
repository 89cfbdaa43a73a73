//! A unit's build against the in-memory builder and image store: what reaches the
//! store, and when nothing does; which builder a unit moves on to.

use super::retry::build_moving_on;
use super::unit::{build_and_push, pushed_key};
use super::Run;
use crate::base::digest::Digest;
use crate::base::progress::{Event, Phase, Reporter};
use crate::builder::build_inputs::RemoteBases;
use crate::builder::cleanup::Cleanup;
use crate::builder::fake::{FakeBuilder, Script};
use crate::builder::file_hashes::FileHashes;
use crate::builder::BuildError;
use crate::flows::cache::{BuildMemory, PushCache};
use crate::project::plan::Unit;
use crate::project::test_image as image;
use crate::project::ImageSpec;
use crate::publish::store::fake::FakeStore;
use crate::publish::Pushed;
use crate::registry::RegistryOptions;
use crate::{Error, Platform};
use std::sync::Mutex;

#[derive(Default)]
struct Recorded(Mutex<Vec<Event>>);

impl Reporter for Recorded {
    fn report(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Recorded {
    fn warnings(&self) -> Vec<String> {
        let events = self.0.lock().unwrap();
        let warnings = events.iter().filter_map(|event| match event {
            Event::Warning { message } => Some(message.clone()),
            _ => None,
        });
        warnings.collect()
    }

    /// The message the unit ended with.
    fn done(&self) -> Option<String> {
        let events = self.0.lock().unwrap();
        events.iter().rev().find_map(|event| match event {
            Event::Phase {
                phase: Phase::Done,
                message,
                ..
            } => Some(message.clone()),
            _ => None,
        })
    }
}

/// A run of its own, remembering in memory only.
fn run<'a>(cleanup: &'a Cleanup, reporter: &'a Recorded) -> Run<'a> {
    Run {
        id: "run1".into(),
        cleanup,
        cache: PushCache::in_memory(),
        builds: BuildMemory::in_memory(),
        trust_inputs: true,
        registry: RegistryOptions::default(),
        replays: crate::builder::build_inputs::Replays::new(FileHashes::open(None)),
        bases: RemoteBases::new(&RegistryOptions::default()),
        reporter,
        fallbacks: Default::default(),
        early: super::early::EarlySends::new(crate::flows::cache::LayerDigests::in_memory()),
    }
}

fn arm64() -> Platform {
    Platform::linux("arm64", None)
}

fn unit(image: &ImageSpec) -> Unit<'_> {
    Unit {
        image,
        platform: arm64(),
        foreign: true,
    }
}

/// Why a unit was not pushed.
fn failure(outcome: crate::Result<Pushed>) -> Error {
    match outcome {
        Err(error) => error,
        Ok(pushed) => panic!("pushed {}", pushed.entry.digest),
    }
}

const TEMPORARY: &str = "remove polyarch-build/api:linux-arm64-run1";

#[tokio::test]
async fn a_built_unit_is_pushed_as_layers_config_and_manifest_by_digest() {
    let (api, store) = (image("v1"), FakeStore::default());
    let builder = FakeBuilder::new("unix:///var/run/docker.sock", Script::Builds(arm64()));
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);

    let pushed = build_and_push(&builder, &store, &unit(&api), false, &run)
        .await
        .unwrap();

    // The index entry names the manifest pushed, and the manifest what was pushed before it.
    let bytes = store.manifests.lock().unwrap()[pushed.entry.digest.as_str()].clone();
    assert_eq!(Digest::of(&bytes), pushed.entry.digest);
    assert_eq!(pushed.entry.size, bytes.len() as u64);
    assert_eq!(pushed.entry.platform.normalized(), arm64());
    let manifest: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let digest =
        |descriptor: &serde_json::Value| descriptor["digest"].as_str().unwrap().to_string();
    assert_eq!(
        store.calls(),
        vec![
            // Sent while it was exported.
            format!("early layer {}", digest(&manifest["layers"][0])),
            format!("config {}", digest(&manifest["config"])),
            format!("manifest {}", pushed.entry.digest),
        ]
    );
    // No tag: publishing moves tags once every platform is pushed.
    assert!(store.tags.lock().unwrap().is_empty());

    // The image is the config's digest; its temporary tag is gone once exported.
    let id = digest(&manifest["config"]);
    let exported = format!("export {id}");
    assert_eq!(
        builder.calls(),
        vec!["build linux/arm64", exported.as_str(), TEMPORARY]
    );
    assert_eq!(
        reporter.done(),
        Some(format!("pushed {}", pushed.entry.digest))
    );
    assert_eq!(
        pushed.build.builder.as_deref(),
        Some(builder.endpoint.as_str())
    );
    assert!(!pushed.build.reused);
    // Remembered, so that the next run that builds this image pushes nothing.
    let cached = run.cache.get(&api.repository, &pushed_key(&api, &id));
    assert_eq!(cached.map(|c| c.digest), Some(pushed.entry.digest));
}

#[tokio::test]
async fn an_image_built_for_another_platform_is_refused_and_nothing_is_pushed() {
    let (api, store) = (image("v1"), FakeStore::default());
    let amd64 = Platform::linux("amd64", None);
    let builder = FakeBuilder::new("unix:///var/run/docker.sock", Script::Builds(amd64));
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);

    let error = failure(build_and_push(&builder, &store, &unit(&api), false, &run).await);

    assert!(matches!(
        error,
        Error::Build {
            source: BuildError::WrongPlatform(_),
            ..
        }
    ));
    assert_eq!(
        error.to_string(),
        "build of api for linux/arm64 failed: the engine built an image for linux/amd64 instead; it cannot build for linux/arm64 (upgrade the engine or use a native builder)"
    );
    assert_eq!(error.exit_code(), 3);
    assert!(store.calls().is_empty());
    assert!(store.manifests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_image_an_earlier_run_pushed_is_neither_exported_nor_uploaded_again() {
    let (api, store) = (image("v1"), FakeStore::default());
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    // One run's cache stands for what an earlier run saved.
    let run = run(&cleanup, &reporter);
    let earlier = FakeBuilder::new("unix:///var/run/docker.sock", Script::Builds(arm64()));
    let first = build_and_push(&earlier, &store, &unit(&api), false, &run)
        .await
        .unwrap();
    let uploads = store.calls();

    let builder = FakeBuilder::new("unix:///var/run/docker.sock", Script::Builds(arm64()));
    let again = build_and_push(&builder, &store, &unit(&api), false, &run)
        .await
        .unwrap();

    assert_eq!(again.entry, first.entry);
    assert_eq!(store.calls(), uploads);
    assert_eq!(builder.calls(), vec!["build linux/arm64", TEMPORARY]);
    let done = reporter.done().unwrap();
    assert!(
        done.ends_with(&format!(
            ": already pushed as {}, no export or upload",
            first.entry.digest
        )),
        "{done}"
    );
}

#[tokio::test]
async fn an_image_the_engine_pushed_itself_is_not_exported() {
    let (api, store) = (image("v1"), FakeStore::default());
    let mut builder = FakeBuilder::new("unix:///var/run/docker.sock", Script::Builds(arm64()));
    builder.containerd_store = true;
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);

    let pushed = build_and_push(&builder, &store, &unit(&api), false, &run)
        .await
        .unwrap();

    assert_eq!(builder.calls(), vec!["build linux/arm64"]);
    assert!(store.calls().is_empty());
    assert_eq!(pushed.entry.platform.normalized(), arm64());
    assert_eq!(
        reporter.done(),
        Some(format!("pushed {} (by the engine)", pushed.entry.digest))
    );
    let cached = run.cache.get(
        &api.repository,
        &pushed_key(&api, pushed.entry.digest.as_str()),
    );
    assert_eq!(cached.map(|c| c.digest), Some(pushed.entry.digest));
}

#[tokio::test]
async fn a_unit_whose_builder_is_lost_moves_on_to_the_next_that_answers() {
    let (api, store) = (image("v1"), FakeStore::default());
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);
    let mut down = FakeBuilder::new("ssh://arm-2", Script::Builds(arm64()));
    down.answers = false;
    let builders = [
        FakeBuilder::new("ssh://arm-1", Script::Lost),
        down,
        FakeBuilder::new("ssh://arm-3", Script::Builds(arm64())),
    ];
    let unit = unit(&api);

    let pushed = build_moving_on(&unit, &builders[0], &builders, &reporter, async |b| {
        build_and_push(b, &store, &unit, false, &run).await
    })
    .await
    .unwrap();

    assert_eq!(pushed.build.builder.as_deref(), Some("ssh://arm-3"));
    assert_eq!(
        reporter.warnings(),
        vec!["api linux/arm64: builder ssh://arm-1 was lost during the build (connection reset by peer); building again on ssh://arm-3"]
    );
    assert!(builders[1].calls().is_empty());
    assert_eq!(store.calls().len(), 3);
}

#[tokio::test]
async fn a_failing_dockerfile_is_not_built_again_elsewhere() {
    let (api, store) = (image("v1"), FakeStore::default());
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);
    let builders = [
        FakeBuilder::new("ssh://arm-1", Script::StepFails),
        FakeBuilder::new("ssh://arm-2", Script::Builds(arm64())),
    ];
    let unit = unit(&api);

    let error = failure(
        build_moving_on(&unit, &builders[0], &builders, &reporter, async |b| {
            build_and_push(b, &store, &unit, false, &run).await
        })
        .await,
    );

    assert!(matches!(
        error,
        Error::Build {
            source: BuildError::StepFailed(_),
            ..
        }
    ));
    assert!(builders[1].calls().is_empty());
    assert!(reporter.warnings().is_empty());
    assert!(store.calls().is_empty());
}

#[tokio::test]
async fn when_every_builder_is_lost_the_last_loss_is_the_error() {
    let (api, store) = (image("v1"), FakeStore::default());
    let (cleanup, reporter) = (Cleanup::default(), Recorded::default());
    let run = run(&cleanup, &reporter);
    let builders = [
        FakeBuilder::new("ssh://arm-1", Script::Lost),
        FakeBuilder::new("ssh://arm-2", Script::Lost),
    ];
    let unit = unit(&api);

    let error = failure(
        build_moving_on(&unit, &builders[1], &builders, &reporter, async |b| {
            build_and_push(b, &store, &unit, false, &run).await
        })
        .await,
    );

    // Round the list from the lost one: arm-2, then arm-1, each once.
    assert_eq!(builders[0].calls(), vec!["build linux/arm64"]);
    assert_eq!(builders[1].calls(), vec!["build linux/arm64"]);
    assert_eq!(
        reporter.warnings(),
        vec!["api linux/arm64: builder ssh://arm-2 was lost during the build (connection reset by peer); building again on ssh://arm-1"]
    );
    assert!(matches!(
        error,
        Error::Build {
            source: BuildError::BuilderLost(_),
            ..
        }
    ));
}

#[test]
fn solves_the_engine_pushes_run_many_at_once_unless_jobs_bounds_them() {
    use super::job_limits;
    let (own, pushed_by_engine) = job_limits(None);
    assert_eq!(own, 2);
    assert!(pushed_by_engine >= 10, "{pushed_by_engine}");
    assert_eq!(job_limits(Some(3)), (3, 3));
}

//! Tests run between the push by digest and the publish: an image with a failing test
//! moves no tag; the others publish; every platform's record carries its test.

use super::*;
use crate::base::oci::{ConfigPlatform, IndexEntry};
use crate::base::progress::Silent;
use crate::builder::platform_test::TestStatus as Outcome;
use crate::project::platform_test::TestCommand;
use crate::project::test_image;
use crate::publish::store::fake::FakeStore;
use crate::verify::coverage_record::BuildInfo;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

fn pushed(image: &str, arch: &str, c: char) -> Pushed {
    Pushed {
        image: image.into(),
        platform: Platform::linux(arch, None),
        entry: IndexEntry {
            digest: format!("sha256:{}", c.to_string().repeat(64))
                .parse()
                .unwrap(),
            size: 500,
            platform: ConfigPlatform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: None,
            },
        },
        build: BuildInfo::default(),
    }
}

/// Images `api` and `web`, both linux/amd64 and linux/arm64, each with `test:`.
fn images() -> (ImageSpec, ImageSpec) {
    let mut api = test_image("v1");
    api.tests = vec![PlatformTest {
        run: TestCommand::Exec(vec!["/bin/app".into(), "--version".into()]),
        timeout: std::time::Duration::from_secs(5),
        env: BTreeMap::new(),
        network: crate::project::Network::None,
        user: None,
        workdir: None,
        platforms: api.platforms.clone(),
    }];
    let mut web = test_image("w1");
    web.tests = api.tests.clone();
    web.name = "web".into();
    web.repository = "127.0.0.1:5000/web".into();
    (api, web)
}

fn outcome(status: Outcome) -> TestOutcome {
    TestOutcome {
        status,
        exit_code: match status {
            Outcome::Passed => Some(0),
            Outcome::Failed => Some(3),
            Outcome::TimedOut => None,
        },
        seconds: 0.5,
        output_tail: vec!["uname: aarch64".into()],
    }
}

#[tokio::test]
async fn a_failing_platform_stops_its_image_and_the_others_publish() {
    let (api, web) = images();
    let units = [
        pushed("api", "amd64", 'a'),
        pushed("api", "arm64", 'b'),
        pushed("web", "amd64", 'c'),
        pushed("web", "arm64", 'd'),
    ];
    let of = |name: &str| units.iter().filter(|p| p.image == name).collect::<Vec<_>>();
    let list = vec![(&api, of("api")), (&web, of("web"))];
    let store = FakeStore::default();
    let ran = Mutex::new(Vec::new());
    let memory = TestMemory::in_memory();
    let results = run_tests(
        &list,
        2,
        Earlier {
            memory: &memory,
            trusted: true,
        },
        &Silent,
        async |image: &ImageSpec, p: &Pushed, _: &PlatformTest| {
            // Nothing is tagged while the tests run.
            assert!(store.tags.lock().unwrap().is_empty());
            ran.lock()
                .unwrap()
                .push(format!("{} {}", image.name, p.platform));
            let arm = p.platform.architecture == "arm64";
            Ok(outcome(match (image.name.as_str(), arm) {
                ("api", true) => Outcome::Failed,
                _ => Outcome::Passed,
            }))
        },
    )
    .await
    .unwrap();
    assert_eq!(ran.lock().unwrap().len(), 4);
    let coverage = publish_tested(
        &store,
        &list,
        &results,
        &(),
        &CancellationToken::new(),
        &Silent,
    )
    .await
    .unwrap();

    // api: no tag moved, no index pushed; the record names the failing platform.
    assert_eq!(store.tag_of("v1"), None);
    assert!(
        !store.calls().iter().any(|c| c.contains("api")),
        "{:?}",
        store.calls()
    );
    let api_record = &coverage[0];
    assert_eq!(api_record.name, "api");
    assert!(!api_record.covered);
    assert!(api_record.unpublished.is_some());
    assert!(api_record.pinned.is_empty());
    let arm = &api_record.platforms[1];
    assert_eq!(arm.status, PlatformStatus::TestFailed);
    let test = arm.test.as_ref().unwrap();
    assert_eq!(test.status, TestStatus::Failed);
    assert_eq!(test.exit_code, Some(3));
    assert_eq!(test.command, "[\"/bin/app\",\"--version\"]");
    assert_eq!(test.output_tail, ["uname: aarch64"]);
    assert_eq!(
        api_record.platforms[0].test.as_ref().unwrap().status,
        TestStatus::Passed
    );

    // web: published and read back, each platform with its passed test.
    let web_record = &coverage[1];
    assert!(web_record.covered, "{web_record:?}");
    assert!(web_record.unpublished.is_none());
    assert!(web_record
        .platforms
        .iter()
        .all(|p| p.test.as_ref().unwrap().status == TestStatus::Passed));
    assert!(store.tag_of("w1").is_some(), "{:?}", store.calls());
}

#[tokio::test]
async fn a_platform_stops_at_its_first_failing_entry_and_a_timeout_is_a_gap() {
    let (mut api, _) = images();
    let mut second = api.tests[0].clone();
    second.run = TestCommand::Shell("never runs".into());
    api.tests.push(second);
    let units = [pushed("api", "amd64", 'a'), pushed("api", "arm64", 'b')];
    let list = vec![(&api, units.iter().collect::<Vec<_>>())];
    let ran = Mutex::new(0);
    let memory = TestMemory::in_memory();
    let results = run_tests(
        &list,
        1,
        Earlier {
            memory: &memory,
            trusted: true,
        },
        &Silent,
        async |_: &ImageSpec, p: &Pushed, _: &PlatformTest| {
            *ran.lock().unwrap() += 1;
            Ok(outcome(match p.platform.architecture.as_str() {
                "arm64" => Outcome::TimedOut,
                _ => Outcome::Passed,
            }))
        },
    )
    .await
    .unwrap();
    // amd64 runs both entries; arm64 stops at the first.
    assert_eq!(*ran.lock().unwrap(), 3);
    let amd = &results[&("api".to_string(), Platform::linux("amd64", None))];
    assert_eq!(amd.command, "[\"/bin/app\",\"--version\"]; never runs");
    let arm = &results[&("api".to_string(), Platform::linux("arm64", None))];
    assert_eq!(arm.status, TestStatus::TimedOut);
    assert_eq!(arm.exit_code, None);
}

/// Runs `api`'s tests on both platforms with `memory`, arm64 failing when `arm_fails`;
/// returns the platforms that ran and the results.
async fn tested_with(
    api: &ImageSpec,
    memory: &TestMemory,
    trusted: bool,
    arm_fails: bool,
) -> (Vec<String>, TestResults) {
    let units = [pushed("api", "amd64", 'a'), pushed("api", "arm64", 'b')];
    let list = vec![(api, units.iter().collect::<Vec<_>>())];
    let ran = Mutex::new(Vec::new());
    let results = run_tests(
        &list,
        2,
        Earlier { memory, trusted },
        &Silent,
        async |_: &ImageSpec, p: &Pushed, _: &PlatformTest| {
            ran.lock().unwrap().push(p.platform.to_string());
            let arm = p.platform.architecture == "arm64";
            Ok(outcome(match arm && arm_fails {
                true => Outcome::Failed,
                false => Outcome::Passed,
            }))
        },
    )
    .await
    .unwrap();
    let mut ran = ran.into_inner().unwrap();
    ran.sort();
    (ran, results)
}

#[tokio::test]
async fn a_rerun_tests_only_what_did_not_pass_on_the_same_image_with_the_same_tests() {
    let (mut api, _) = images();
    let memory = TestMemory::in_memory();
    let arm64 = ("api".to_string(), Platform::linux("arm64", None));
    let amd64 = ("api".to_string(), Platform::linux("amd64", None));

    let (ran, _) = tested_with(&api, &memory, true, true).await;
    assert_eq!(ran, ["linux/amd64", "linux/arm64"]);
    // amd64 passed before; the failed arm64 runs again.
    let (ran, results) = tested_with(&api, &memory, true, false).await;
    assert_eq!(ran, ["linux/arm64"]);
    assert!(results[&amd64].earlier_run);
    assert_eq!(results[&amd64].status, TestStatus::Passed);
    assert!(!results[&arm64].earlier_run);
    // Both passed: nothing runs.
    let (ran, results) = tested_with(&api, &memory, true, false).await;
    assert!(ran.is_empty(), "{ran:?}");
    assert!(results[&arm64].earlier_run);
    // --rebuild, a changed test, and no_cache each test again.
    let (ran, _) = tested_with(&api, &memory, false, false).await;
    assert_eq!(ran.len(), 2);
    api.tests[0].timeout = std::time::Duration::from_secs(6);
    let (ran, _) = tested_with(&api, &memory, true, false).await;
    assert_eq!(ran.len(), 2);
    api.no_cache = true;
    let (ran, _) = tested_with(&api, &memory, true, false).await;
    assert_eq!(ran.len(), 2);
}

#[tokio::test]
async fn no_test_records_skipped_and_publishes() {
    let (api, _) = images();
    let units = [pushed("api", "amd64", 'a'), pushed("api", "arm64", 'b')];
    let list = vec![(&api, units.iter().collect::<Vec<_>>())];
    let results = skipped(&list);
    let store = FakeStore::default();
    let coverage = publish_tested(
        &store,
        &list,
        &results,
        &(),
        &CancellationToken::new(),
        &Silent,
    )
    .await
    .unwrap();
    assert!(coverage[0].covered);
    assert!(store.tag_of("v1").is_some());
    assert!(coverage[0]
        .platforms
        .iter()
        .all(|p| p.test.as_ref().unwrap().status == TestStatus::Skipped));
}

/// `tests.json` outlives polyarch releases: the key of the same image and tests stays the
/// same text, and each setting changes it.
#[test]
fn the_remembered_key_is_pinned_and_names_every_setting() {
    let (api, _) = images();
    let digest = pushed("api", "amd64", 'a').entry.digest;
    let key = |test: &PlatformTest| remembered_as(&digest, &[test]);
    let base = &api.tests[0];
    assert_eq!(key(base), PINNED_KEY);
    let mut changed = vec![base.clone(); 6];
    changed[0].run = TestCommand::Exec(vec!["/bin/app".into()]);
    changed[1].timeout = std::time::Duration::from_millis(5001);
    changed[2].env.insert("A".into(), "1".into());
    changed[3].network = crate::project::Network::Host;
    changed[4].user = Some("nobody".into());
    changed[5].platforms.pop();
    let keys: std::collections::BTreeSet<String> = changed.iter().map(key).collect();
    assert_eq!(keys.len(), changed.len());
    assert!(!keys.contains(PINNED_KEY));
}

const PINNED_KEY: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa sha256:c3b57140543c9395b3b59ce9f5e97799bd11ffd73680253155ba5254bcacc0d9";

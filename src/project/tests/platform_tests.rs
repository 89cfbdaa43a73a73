//! `test:` of an image: its shape, defaults and mistakes.

use super::*;
use crate::project::platform_test::{TestCommand, DEFAULT_TEST_TIMEOUT};

fn two_platforms(test: &str) -> String {
    replacing("platforms", "    platforms: [linux/amd64, linux/arm64]") + test
}

#[test]
fn a_test_is_one_entry_or_a_list_with_defaults() {
    let d = fixture();
    let one = parse_in(
        &d,
        &two_platforms("    test: {run: [/bin/app, --version]}\n"),
    )
    .unwrap();
    let tests = &one.images[0].tests;
    assert_eq!(tests.len(), 1);
    assert_eq!(
        tests[0].run,
        TestCommand::Exec(vec!["/bin/app".into(), "--version".into()])
    );
    assert_eq!(tests[0].timeout, DEFAULT_TEST_TIMEOUT);
    assert_eq!(tests[0].network, Network::None);
    assert_eq!(tests[0].platforms.len(), 2, "every platform of the image");

    let list = "    test:\n      - run: \"app --version | grep $HOME\"\n        timeout: 1m30s\n        env: {MODE: fast}\n        network: host\n        user: nobody\n        workdir: /srv\n        platforms: [linux/arm64]\n      - run: [/bin/true]\n";
    let many = parse_in(&d, &two_platforms(list)).unwrap();
    let tests = &many.images[0].tests;
    assert_eq!(tests.len(), 2);
    // The shell form is kept as written, `$` and all: it is the shell's.
    assert_eq!(
        tests[0].run,
        TestCommand::Shell("app --version | grep $HOME".into())
    );
    assert_eq!(
        tests[0].run.argv(),
        ["/bin/sh", "-c", "app --version | grep $HOME"]
    );
    assert_eq!(tests[0].timeout, std::time::Duration::from_secs(90));
    assert_eq!(tests[0].env.get("MODE").map(String::as_str), Some("fast"));
    assert_eq!(tests[0].network, Network::Host);
    assert_eq!(tests[0].user.as_deref(), Some("nobody"));
    assert_eq!(tests[0].workdir.as_deref(), Some("/srv"));
    assert_eq!(tests[0].platforms, ["linux/arm64".parse().unwrap()]);
    assert!(parse_in(&d, &with_image("")).unwrap().images[0]
        .tests
        .is_empty());
}

#[test]
fn test_errors() {
    let d = fixture();
    let t = |test: &str| two_platforms(&format!("    test: {test}\n"));
    let f = "images.hello.test";
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (t("{timeout: 5s}"), "images.hello.test.run", "missing; add the command", &[]),
        (t("{run: []}"), "images.hello.test.run", "names no program", &[]),
        (t("{run: \"  \"}"), "images.hello.test.run", "/bin/sh -c", &[]),
        (t("{run: [/bin/true], timeout: soon}"), "images.hello.test.timeout", "e.g. 30s", &["soon"]),
        (t("{run: [/bin/true], timeout: 0s}"), "images.hello.test.timeout", "more than zero", &[]),
        (t("{run: [/bin/true], network: bridge}"), "images.hello.test.network", "none", &["bridge"]),
        (t("{run: [/bin/true], env: {1X: a}}"), "images.hello.test.env.1X", "APP_MODE", &[]),
        (t("{run: [/bin/true], workdir: app}"), "images.hello.test.workdir", "absolute", &[]),
        (t("{run: [/bin/true], user: \"\"}"), "images.hello.test.user", "non-empty", &[]),
        (t("{run: [/bin/true], platforms: [linux/s390x]}"), "images.hello.test.platforms[0]", "not a platform of this image", &["linux/amd64, linux/arm64"]),
        (t("{run: [/bin/true], platforms: []}"), "images.hello.test.platforms", "remove `platforms:`", &[]),
        (t("[{run: [/bin/true]}, {run: [/bin/true], color: red}]"), "images.hello.test[1].color", "run", &[]),
        (t("[]"), f, "at least one entry", &[]),
        (t("yes"), f, "a test", &[]),
    ];
    expect_all(&d, cases);
}

//! Each image's fields, and the build flags laid over them.

use super::*;
use crate::project::contexts::NamedContext;

#[test]
fn images_errors() {
    let d = fixture();
    let renamed = |name: &str| with_image("").replace("hello:", name);
    let twice = format!("{}  hello:\n    tags: [v2]\n", with_image(""));
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        ("version: 1\n".into(), "images", "add at least one", &[]),
        ("version: 1\nimages: {}\n".into(), "images", "add at least one", &[]),
        ("version: 1\nimages:\n".into(), "images", "add at least one", &[]),
        ("version: 1\nimages: [a, b]\n".into(), "images", "NAME:", &[]),
        (renamed("Hello:"), "images.Hello", "e.g. `hello`", &["not a valid image name"]),
        (renamed("-x:"), "images.-x", "lowercase letters", &[]),
        ("version: 1\nimages:\n  hello: 5\n".into(), "images.hello", "repository, tags", &[]),
        ("version: 1\nimages:\n  hello:\n".into(), "images.hello.repository", "missing; add it", &[]),
        (twice, "images.hello", "names must be unique", &[]),
    ];
    expect_all(&d, cases);
    // A key repeated inside an image is serde's duplicate-field error, at that key.
    let (f, m, _) = project_err(parse_in(&d, &with_image("    tags: [v2]\n")));
    assert_eq!(f, "images.hello.tags");
    assert!(m.contains("given twice") && m.contains("keep one"), "{m}");
}

#[test]
fn platform_errors() {
    let d = fixture();
    let plats = |list: &str| replacing("platforms", &format!("    platforms: {list}"));
    let f = "images.hello.platforms";
    let twice = "[linux/arm64, linux/amd64, linux/arm64/v8]";
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (plats("[linux/amd64, plan10/amd64]"), "images.hello.platforms[1]", "e.g. linux/amd64", &["plan10"]),
        (plats(twice), "images.hello.platforms[2]", "remove one", &["platforms[0]", "`linux/arm64`"]),
        (plats("[]"), f, "at least one", &[]),
        (replacing("platforms", ""), f, "platforms: [linux/amd64", &[]),
        (plats("linux/amd64"), f, "platforms: [linux/amd64", &[]),
        (plats("[[linux/amd64]]"), "images.hello.platforms[0]", "expected a single value", &[]),
    ];
    expect_all(&d, cases);
}

#[test]
fn tag_errors() {
    let d = fixture();
    let tags = |list: &str| replacing("tags", &format!("    tags: {list}"));
    let f = "images.hello.tags";
    let long = format!("[{}]", "a".repeat(129));
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (tags("[v1, \"v 2\"]"), "images.hello.tags[1]", "not a valid tag", &[]),
        (tags("[.hidden]"), "images.hello.tags[0]", "not starting with", &[]),
        (tags("[-x]"), "images.hello.tags[0]", "not starting with", &[]),
        (tags(&long), "images.hello.tags[0]", "1 to 128", &[]),
        (tags("[v1, latest, v1]"), "images.hello.tags[2]", "remove the duplicate", &["tags[0]"]),
        (tags("[]"), f, "at least one tag", &[]),
        (replacing("tags", ""), f, "tags: [v1, latest]", &[]),
        (tags("v1"), f, "tags: [v1, latest]", &[]),
    ];
    expect_all(&d, cases);
    for ok in [
        format!("[{}]", "a".repeat(128)),
        "[_x, V1.2-rc_3, 2]".into(),
    ] {
        assert!(parse_in(&d, &tags(&ok)).is_ok(), "tags: {ok}");
    }
}

#[test]
fn repository_errors() {
    let d = fixture();
    let f = "images.hello.repository";
    let repo = |r: &str| replacing("repository", &format!("    repository: {r}"));
    let long = format!("x/{}", "a".repeat(260));
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (repo("127.0.0.1:5000/Demo/hello"), f, "write `127.0.0.1:5000/demo/hello`", &[]),
        (repo("127.0.0.1:5000/demo/hello:v1"), f, "put the tag under `tags:`",
            &["`repository: 127.0.0.1:5000/demo/hello`"]),
        (repo("hello:v1"), f, "under `tags:`", &[]),
        (repo("demo/hello@sha256:0123abcd"), f, "put tags under `tags:`", &[]),
        (repo("\"\""), f, "set it to where the image is pushed", &[]),
        (replacing("repository", ""), f, "missing; add it", &[]),
        (repo("127.0.0.1:5000"), f, "only a registry host", &[]),
        (repo("\"[::1]:5000\""), f, "only a registry host", &[]),
        (repo("localhost:99999/x"), f, "0 to 65535", &[]),
        (repo("localhost:5000//x"), f, "empty path component", &[]),
        (repo("demo/"), f, "empty path component", &[]),
        (repo("demo/he!lo"), f, "contains `!`", &[]),
        (repo("demo/-hello"), f, "misplaced separator", &[]),
        (repo("demo/hel..lo"), f, "misplaced separator", &[]),
        (repo("demo/hel___lo"), f, "misplaced separator", &[]),
        (repo("bad_host.example.com/x"), f, "not a valid host name", &[]),
        (repo("\"[zz::1]:5000/x\""), f, "not an IPv6 address", &[]),
        (repo(&long), f, "at most 255", &[]),
        (repo("[a, b]"), f, "repository: registry.example.com", &[]),
    ];
    expect_all(&d, cases);
}

#[test]
fn repository_grammar() {
    for ok in [
        "hello",
        "library/hello",
        "demo/hello",
        "localhost/x",
        "localhost:5000/x",
        "127.0.0.1:5000/demo/hello",
        "[::1]:5000/demo/hello",
        "[::1]/x",
        "registry.example.com/team/app",
        "ghcr.io/a_b/c__d/e---f/g.h",
        "example.com",
        "Registry.Example.com:443/app",
    ] {
        assert_eq!(check_repository(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "a//b",
        "/a",
        "a/",
        "A/b",
        "a/b:c",
        "a@sha256:00",
        "a/_b",
        "a/b_",
        "a/b-",
        "a/b.-c",
        "host:/x",
        "[::1/x",
        "[::1]x/y",
        "ex ample/x",
        "é/x",
    ] {
        assert!(check_repository(bad).is_err(), "{bad} accepted");
    }
}

/// The project file and the registry client judge names by one grammar: over many
/// generated repositories (hosts good and bad, components of every separator, lengths
/// around the limit), `repository:` is accepted exactly when the registry would parse it.
#[test]
fn repository_check_agrees_with_the_registry_parser() {
    let hosts = [
        "r.io",
        "localhost",
        "localhost:5000",
        "127.0.0.1:5000",
        "[::1]:5000",
        "[::1]",
        "Registry.Example.com:443",
        "index.docker.io",
        "docker.io",
        "x.y:0",
        "r.io:65535",
        "r.io:65536",
        "r.io:99999",
        "r.io:",
        ":5000",
        "bad_host.io",
        "-a.io",
        "a-.io",
        "a..b",
        "[::1",
        "[zz::1]:5000",
        "[::1]x",
        "[::1]:x",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % below as u64) as usize
    };
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut repo = String::new();
        match next(4) {
            0 => {}
            1 => {
                let alphabet = b"ab1.-:[]_";
                for _ in 0..1 + next(6) {
                    repo.push(alphabet[next(alphabet.len())] as char);
                }
                repo.push('/');
            }
            _ => repo.push_str(&format!("{}/", hosts[next(hosts.len())])),
        }
        for i in 0..1 + next(4) {
            if i > 0 {
                repo.push('/');
            }
            if next(20) == 0 {
                repo.push_str(&"a".repeat(240 + next(25)));
                continue;
            }
            let words = ["a", "b1", "0", "a.b", "a_b", "a__b", "a---b", "demo"];
            if next(3) > 0 {
                repo.push_str(words[next(words.len())]);
                continue;
            }
            let alphabet = b"aaab09.._--_A! ";
            for _ in 0..next(7) {
                repo.push(alphabet[next(alphabet.len())] as char);
            }
        }
        let ours = check_repository(&repo);
        let registry = crate::registry::parse_reference(&repo);
        assert_eq!(
            ours.is_ok(),
            registry.is_ok(),
            "{repo:?}: project {ours:?}, registry {:?}",
            registry.err().map(|e| e.to_string())
        );
        accepted += usize::from(ours.is_ok());
    }
    assert!(
        (2_000..18_000).contains(&accepted),
        "{accepted} of 20000 accepted"
    );
}

#[test]
fn context_and_dockerfile_errors() {
    let d = fixture();
    let ctx = |c: &str| replacing("context", &format!("    context: {c}"));
    let file = |f: &str| with_image(&format!("    dockerfile: {f}\n"));
    let (c, df) = ("images.hello.context", "images.hello.dockerfile");
    let root = d.path().canonicalize().unwrap().display().to_string();
    let outside = ctx("app") + "    dockerfile: ../Dockerfile\n";
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (ctx("missing-dir"), c, "create it or fix the path", &["missing-dir"]),
        (ctx("notadir"), c, "not a directory", &[]),
        (ctx("\"\""), c, "context: .", &[]),
        (replacing("context", ""), c, "missing; add it", &[]),
        (file("Nope.Dockerfile"), df, "create it or set `dockerfile:`", &["Nope.Dockerfile", &root]),
        // Default Dockerfile missing in the context: still names the field and path.
        (ctx("app"), df, "does not exist", &["app/Dockerfile"]),
        (file("app/Dockerfile.d"), df, "not a file", &[]),
        (file("/etc/hostname"), df, "relative to the context", &[]),
        (outside, df, "outside the context", &[]),
        (file("\"\""), df, "remove the key", &[]),
    ];
    expect_all(&d, cases);
    let ok = parse_in(&d, &file("./app/Dockerfile.release")).unwrap();
    assert_eq!(
        ok.images[0].dockerfile,
        PathBuf::from("app/Dockerfile.release")
    );
}

#[test]
fn enum_errors() {
    let d = fixture();
    let top = |line: &str| format!("{line}\n{}", with_image(""));
    let image = |line: &str| with_image(&format!("    {line}\n"));
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (image("network: bridge"), "images.hello.network", "default, host, none", &["`bridge`"]),
        (image("binfmt: sometimes"), "images.hello.binfmt", "auto, never, require", &[]),
        (top("binfmt: Auto"), "binfmt", "auto, never, require", &[]),
        (image("network: {a: b}"), "images.hello.network", "network: default", &[]),
        (top("binfmt_image: \"\""), "binfmt_image", "tonistiigi/binfmt", &[]),
        (image("target: \"\""), "images.hello.target", "remove `target:`", &[]),
        (image("build_args: {\"A=B\": x}"), "images.hello.build_args.A=B", "without `=`", &[]),
        (image("build_args: [A]"), "images.hello.build_args", "GREETING: hello", &[]),
        (image("labels: {\"\": x}"), "images.hello.labels.", "org.opencontainers", &[]),
        (image("no_cache: yes"), "images.hello.no_cache",
            "write `no_cache: true` or `no_cache: false`", &[]),
        (top("reproducible: \"1\""), "reproducible",
            "`1` is not a boolean; write `reproducible: true` or `reproducible: false`", &[]),
    ];
    expect_all(&d, cases);
}

#[test]
fn secrets_ssh_cache_pull_and_no_cache_are_read() {
    let d = fixture();
    let project = parse_in(
            &d,
            &with_image(
                "    secrets: {npmrc: {file: conf/npmrc}, token: {env: API_TOKEN}}\n    ssh: [default, work=run/agent.sock]\n    cache: {from: [127.0.0.1:5000/demo/hello:cache, other], to: 127.0.0.1:5000/demo/hello:cache}\n    pull: true\n    no_cache: false\n",
            ),
        )
        .unwrap();
    let image = &project.images[0];
    assert_eq!(
        image.secrets["npmrc"].source,
        SecretSource::File(d.path().join("conf/npmrc"))
    );
    assert_eq!(
        image.secrets["npmrc"].origin,
        Origin::Field("images.hello.secrets.npmrc.file".into())
    );
    assert_eq!(
        image.secrets["token"].source,
        SecretSource::Env("API_TOKEN".into())
    );
    assert_eq!(image.ssh["default"].socket, AgentSocket::FromEnv);
    assert_eq!(
        image.ssh["work"].socket,
        AgentSocket::Path(d.path().join("run/agent.sock"))
    );
    let arm64: Platform = "linux/arm64".parse().unwrap();
    let armv7: Platform = "linux/arm/v7".parse().unwrap();
    assert_eq!(
        image.cache_to.as_ref().unwrap().for_platform(&arm64),
        "127.0.0.1:5000/demo/hello:cache-linux-arm64"
    );
    assert_eq!(
        image.cache_from[1].for_platform(&armv7),
        "docker.io/library/other:latest-linux-arm-v7"
    );
    assert!(image.pull);
    assert!(!image.no_cache);
    let plain = parse_in(&d, &with_image("")).unwrap();
    assert!(plain.images[0].secrets.is_empty() && plain.images[0].cache_to.is_none());
}

#[test]
fn secrets_ssh_cache_mistakes_name_the_field() {
    let d = fixture();
    let cases: &[(&str, &str, &str)] = &[
            ("    secrets: {a: {file: x, env: Y}}\n", "images.hello.secrets.a", "both file and env"),
            ("    secrets: {a: {}}\n", "images.hello.secrets.a", "neither file nor env"),
            ("    secrets: {a: {fil: x}}\n", "images.hello.secrets.a.fil", "did you mean file?"),
            ("    secrets: {a: {env: \"A B\"}}\n", "images.hello.secrets.a.env", "not an environment variable name"),
            ("    secrets: {a: {file: \"\"}}\n", "images.hello.secrets.a.file", "is empty"),
            ("    secrets: {\"a,b\": {env: X}}\n", "images.hello.secrets.a,b", "not a secret id"),
            ("    secrets: [a]\n", "images.hello.secrets", "expected a mapping"),
            ("    ssh: default\n", "images.hello.ssh", "expected a list"),
            ("    ssh: [default, default]\n", "images.hello.ssh[1]", "again"),
            ("    ssh: [\"x=\"]\n", "images.hello.ssh[0]", "no socket path"),
            ("    ssh: [\"x=a,b\"]\n", "images.hello.ssh[0]", "one agent socket"),
            ("    cache: {from: x:cache}\n", "images.hello.cache.from", "expected a list"),
            ("    cache: {to: [x]}\n", "images.hello.cache.to", "expected a single value"),
            ("    cache: {to: \"Reg/X:y\"}\n", "images.hello.cache.to", "not an image reference"),
            ("    cache: {to: \"x@sha256:0000000000000000000000000000000000000000000000000000000000000000\"}\n", "images.hello.cache.to", "names a digest"),
            ("    cache: {from: [a], too: b}\n", "images.hello.cache.too", "did you mean to?"),
            ("    pull: yes\n", "images.hello.pull", "write `pull: true`"),
            ("    no_cache: 1\n", "images.hello.no_cache", "not a boolean"),
        ];
    for (extra, field, needle) in cases {
        let (f, m, shown) = project_err(parse_in(&d, &with_image(extra)));
        assert_eq!(&f, field, "{extra}: {shown}");
        assert!(m.contains(needle), "{extra}: {shown}");
    }
    let long = format!("    cache: {{to: \"x:{}\"}}\n", "a".repeat(120));
    let (f, m, _) = project_err(parse_in(&d, &with_image(&long)));
    assert_eq!(f, "images.hello.cache.to");
    assert!(m.contains("longer than 128"), "{m}");
}

#[test]
fn build_flags_add_to_and_override_the_file() {
    let d = fixture();
    fs::write(d.path().join("npmrc"), "registry=x").unwrap();
    let text = format!(
            "{}  other:\n    repository: 127.0.0.1:5000/demo/other\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n",
            with_image("    secrets: {npmrc: {file: npmrc}, token: {env: POLYARCH_TEST_UNSET_VARIABLE}}\n    cache: {from: [127.0.0.1:5000/demo/hello:cache]}\n")
        );
    let mut project = parse_in(&d, &text).unwrap();
    // The file's token comes from an unset variable: refused, naming the field.
    let error = project
        .clone()
        .prepare_build(&["hello".into()], &BuildFlags::default(), None)
        .unwrap_err()
        .to_string();
    assert!(
            error.contains("images.hello.secrets.token.env: environment variable POLYARCH_TEST_UNSET_VARIABLE is not set"),
            "{error}"
        );
    let token: SecretFlag = "id=token,env=PATH".parse().unwrap();
    let cache: CacheRef = "127.0.0.1:5000/demo/cache:x".parse().unwrap();
    let flags = BuildFlags {
        secrets: vec![token],
        cache_from: vec![cache.clone()],
        cache_to: Some(cache.clone()),
        no_cache: true,
        ..Default::default()
    };
    // --cache-to for two images would mix their caches.
    let error = project
        .clone()
        .prepare_build(&[], &flags, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("--cache-to") && error.contains("2 images"),
        "{error}"
    );
    let login = Credential::Basic {
        username: "u".into(),
        password: "p".into(),
    };
    project
        .prepare_build(&["hello".into()], &flags, Some(login.clone()))
        .unwrap();
    let hello = project.image("hello").unwrap();
    assert_eq!(
        hello.secrets["token"].source,
        SecretSource::Env("PATH".into())
    );
    assert!(matches!(hello.secrets["token"].origin, Origin::Flag(_)));
    assert_eq!(hello.cache_from.len(), 2);
    assert_eq!(hello.cache_to.as_ref(), Some(&cache));
    assert!(hello.no_cache && !hello.pull);
    assert_eq!(hello.login, Some(login));
    // An image not built is left alone.
    let other = project.image("other").unwrap();
    assert!(other.secrets.is_empty() && !other.no_cache && other.login.is_none());

    let missing: SecretFlag = "id=x,src=/nonexistent/polyarch-secret".parse().unwrap();
    let error = parse_in(&d, &text)
        .unwrap()
        .prepare_build(
            &["other".into()],
            &BuildFlags {
                secrets: vec![missing],
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
    assert!(matches!(error, ProjectError::Usage(_)), "{error}");
    assert!(
            error
                .to_string()
                .starts_with("--secret id=x,src=/nonexistent/polyarch-secret: /nonexistent/polyarch-secret does not exist"),
            "{error}"
        );
}

#[test]
fn verify_reads_no_build_inputs() {
    let d = tempfile::tempdir().unwrap();
    let text = "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:5000/demo/hello\n    tags: [v1]\n    context: app\n    dockerfile: build/Dockerfile\n    platforms: [linux/amd64]\n";
    let (f, _, _) = project_err(parse_job(&d, text, &[], Purpose::Build));
    assert_eq!(f, "images.hello.context");
    let p = parse_job(&d, text, &[], Purpose::Verify).unwrap();
    assert_eq!(p.images[0].tags, ["v1"]);
    // What can be told without the disk is still checked.
    let absolute = text.replace("build/Dockerfile", "/abs/Dockerfile");
    let (f, m, _) = project_err(parse_job(&d, &absolute, &[], Purpose::Verify));
    assert_eq!(f, "images.hello.dockerfile");
    assert!(m.contains("is absolute"), "{m}");
    let empty = text.replace("context: app", "context: \"\"");
    let (f, _, _) = project_err(parse_job(&d, &empty, &[], Purpose::Verify));
    assert_eq!(f, "images.hello.context");
}

#[test]
fn named_contexts_are_read_and_their_mistakes_name_the_field() {
    let d = fixture();
    let p = parse_in(
        &d,
        &with_image("    contexts: {assets: app, tools: \"docker-image://127.0.0.1:5000/tools:v1\", base: \"target:other\"}\n"),
    )
    .unwrap();
    let contexts = &p.images[0].contexts;
    assert_eq!(
        contexts["assets"],
        NamedContext::Dir(d.path().join("app").canonicalize().unwrap())
    );
    assert_eq!(
        contexts["tools"],
        NamedContext::Image("127.0.0.1:5000/tools:v1".into())
    );
    assert_eq!(contexts["base"], NamedContext::Target("other".into()));
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str)] = &[
        ("    contexts: {assets: nothere}\n", "images.hello.contexts.assets", "does not exist"),
        ("    contexts: {assets: notadir}\n", "images.hello.contexts.assets", "is not a directory"),
        ("    contexts: {assets: \"\"}\n", "images.hello.contexts.assets", "is empty"),
        ("    contexts: {Assets: app}\n", "images.hello.contexts.Assets", "not a context name"),
        ("    contexts: {x: \"docker-image://A/b\"}\n", "images.hello.contexts.x", "image reference"),
        ("    contexts: {x: \"target:hello\"}\n", "images.hello.contexts.x", "this image itself"),
        ("    contexts: {x: \"oci-layout://l\"}\n", "images.hello.contexts.x", "docker-image://REF"),
        ("    contexts: [app]\n", "images.hello.contexts", "expected a mapping"),
    ];
    for (extra, field, needle) in cases {
        let (f, m, shown) = project_err(parse_in(&d, &with_image(extra)));
        assert_eq!(&f, field, "{extra}: {shown}");
        assert!(m.contains(needle), "{extra}: {shown}");
    }
}

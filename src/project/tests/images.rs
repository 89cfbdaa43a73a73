//! Each image's fields, and the build flags laid over them.

use super::*;

#[test]
fn images_errors() {
    let d = fixture();
    expect(&d, "version: 1\n", "images", "add at least one");
    expect(&d, "version: 1\nimages: {}\n", "images", "add at least one");
    expect(&d, "version: 1\nimages:\n", "images", "add at least one");
    expect(&d, "version: 1\nimages: [a, b]\n", "images", "NAME:");
    let s = expect(
        &d,
        &with_image("").replace("hello:", "Hello:"),
        "images.Hello",
        "e.g. `hello`",
    );
    assert!(s.contains("not a valid image name"), "{s}");
    expect(
        &d,
        &with_image("").replace("hello:", "-x:"),
        "images.-x",
        "lowercase letters",
    );
    expect(
        &d,
        "version: 1\nimages:\n  hello: 5\n",
        "images.hello",
        "repository, tags",
    );
    expect(
        &d,
        "version: 1\nimages:\n  hello:\n",
        "images.hello.repository",
        "missing; add it",
    );
    expect(
        &d,
        &format!("{}  hello:\n    tags: [v2]\n", with_image("")),
        "images.hello",
        "names must be unique",
    );
    // A key repeated inside an image is serde's duplicate-field error, at that key.
    let (f, m, _) = project_err(parse_in(&d, &with_image("    tags: [v2]\n")));
    assert_eq!(f, "images.hello.tags");
    assert!(m.contains("given twice") && m.contains("keep one"), "{m}");
}

#[test]
fn platform_errors() {
    let d = fixture();
    let s = expect(
        &d,
        &replacing("platforms", "    platforms: [linux/amd64, plan10/amd64]"),
        "images.hello.platforms[1]",
        "e.g. linux/amd64",
    );
    assert!(s.contains("plan10"), "{s}");
    let s = expect(
        &d,
        &replacing(
            "platforms",
            "    platforms: [linux/arm64, linux/amd64, linux/arm64/v8]",
        ),
        "images.hello.platforms[2]",
        "remove one",
    );
    assert!(
        s.contains("platforms[0]") && s.contains("`linux/arm64`"),
        "{s}"
    );
    expect(
        &d,
        &replacing("platforms", "    platforms: []"),
        "images.hello.platforms",
        "at least one",
    );
    expect(
        &d,
        &replacing("platforms", ""),
        "images.hello.platforms",
        "platforms: [linux/amd64",
    );
    expect(
        &d,
        &replacing("platforms", "    platforms: linux/amd64"),
        "images.hello.platforms",
        "platforms: [linux/amd64",
    );
    expect(
        &d,
        &replacing("platforms", "    platforms: [[linux/amd64]]"),
        "images.hello.platforms[0]",
        "expected a single value",
    );
}

#[test]
fn tag_errors() {
    let d = fixture();
    expect(
        &d,
        &replacing("tags", "    tags: [v1, \"v 2\"]"),
        "images.hello.tags[1]",
        "not a valid tag",
    );
    expect(
        &d,
        &replacing("tags", "    tags: [.hidden]"),
        "images.hello.tags[0]",
        "not starting with",
    );
    expect(
        &d,
        &replacing("tags", "    tags: [-x]"),
        "images.hello.tags[0]",
        "not starting with",
    );
    let long = "a".repeat(129);
    expect(
        &d,
        &replacing("tags", &format!("    tags: [{long}]")),
        "images.hello.tags[0]",
        "1 to 128",
    );
    assert!(parse_in(
        &d,
        &replacing("tags", &format!("    tags: [{}]", "a".repeat(128)))
    )
    .is_ok());
    let s = expect(
        &d,
        &replacing("tags", "    tags: [v1, latest, v1]"),
        "images.hello.tags[2]",
        "remove the duplicate",
    );
    assert!(s.contains("tags[0]"), "{s}");
    expect(
        &d,
        &replacing("tags", "    tags: []"),
        "images.hello.tags",
        "at least one tag",
    );
    expect(
        &d,
        &replacing("tags", ""),
        "images.hello.tags",
        "tags: [v1, latest]",
    );
    expect(
        &d,
        &replacing("tags", "    tags: v1"),
        "images.hello.tags",
        "tags: [v1, latest]",
    );
    assert!(parse_in(&d, &replacing("tags", "    tags: [_x, V1.2-rc_3, 2]")).is_ok());
}

#[test]
fn repository_errors() {
    let d = fixture();
    let f = "images.hello.repository";
    let repo = |r: &str| replacing("repository", &format!("    repository: {r}"));
    expect(
        &d,
        &repo("127.0.0.1:5000/Demo/hello"),
        f,
        "write `127.0.0.1:5000/demo/hello`",
    );
    let s = expect(
        &d,
        &repo("127.0.0.1:5000/demo/hello:v1"),
        f,
        "put the tag under `tags:`",
    );
    assert!(s.contains("`repository: 127.0.0.1:5000/demo/hello`"), "{s}");
    expect(&d, &repo("hello:v1"), f, "under `tags:`");
    expect(
        &d,
        &repo("demo/hello@sha256:0123abcd"),
        f,
        "put tags under `tags:`",
    );
    expect(&d, &repo("\"\""), f, "set it to where the image is pushed");
    expect(&d, &replacing("repository", ""), f, "missing; add it");
    expect(&d, &repo("127.0.0.1:5000"), f, "only a registry host");
    expect(&d, &repo("\"[::1]:5000\""), f, "only a registry host");
    expect(&d, &repo("localhost:99999/x"), f, "0 to 65535");
    expect(&d, &repo("localhost:5000//x"), f, "empty path component");
    expect(&d, &repo("demo/"), f, "empty path component");
    expect(&d, &repo("demo/he!lo"), f, "contains `!`");
    expect(&d, &repo("demo/-hello"), f, "misplaced separator");
    expect(&d, &repo("demo/hel..lo"), f, "misplaced separator");
    expect(&d, &repo("demo/hel___lo"), f, "misplaced separator");
    expect(
        &d,
        &repo("bad_host.example.com/x"),
        f,
        "not a valid host name",
    );
    expect(&d, &repo("\"[zz::1]:5000/x\""), f, "not an IPv6 address");
    expect(
        &d,
        &repo(&format!("x/{}", "a".repeat(260))),
        f,
        "at most 255",
    );
    expect(&d, &repo("[a, b]"), f, "repository: registry.example.com");
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
    let s = expect(
        &d,
        &ctx("missing-dir"),
        "images.hello.context",
        "create it or fix the path",
    );
    assert!(s.contains("missing-dir"), "{s}");
    expect(
        &d,
        &ctx("notadir"),
        "images.hello.context",
        "not a directory",
    );
    expect(&d, &ctx("\"\""), "images.hello.context", "context: .");
    expect(
        &d,
        &replacing("context", ""),
        "images.hello.context",
        "missing; add it",
    );

    let s = expect(
        &d,
        &with_image("    dockerfile: Nope.Dockerfile\n"),
        "images.hello.dockerfile",
        "create it or set `dockerfile:`",
    );
    assert!(
        s.contains("Nope.Dockerfile")
            && s.contains(&d.path().canonicalize().unwrap().display().to_string()),
        "{s}"
    );
    // Default Dockerfile missing in the context: still names the field and path.
    let s = expect(&d, &ctx("app"), "images.hello.dockerfile", "does not exist");
    assert!(s.contains("app/Dockerfile"), "{s}");
    expect(
        &d,
        &with_image("    dockerfile: app/Dockerfile.d\n"),
        "images.hello.dockerfile",
        "not a file",
    );
    expect(
        &d,
        &with_image("    dockerfile: /etc/hostname\n"),
        "images.hello.dockerfile",
        "relative to the context",
    );
    let outside = replacing("context", "    context: app") + "    dockerfile: ../Dockerfile\n";
    expect(
        &d,
        &outside,
        "images.hello.dockerfile",
        "outside the context",
    );
    expect(
        &d,
        &with_image("    dockerfile: \"\"\n"),
        "images.hello.dockerfile",
        "remove the key",
    );
    let ok = parse_in(
        &d,
        &with_image("    dockerfile: ./app/Dockerfile.release\n"),
    )
    .unwrap();
    assert_eq!(
        ok.images[0].dockerfile,
        PathBuf::from("app/Dockerfile.release")
    );
}

#[test]
fn enum_errors() {
    let d = fixture();
    let s = expect(
        &d,
        &with_image("    network: bridge\n"),
        "images.hello.network",
        "default, host, none",
    );
    assert!(s.contains("`bridge`"), "{s}");
    expect(
        &d,
        &with_image("    binfmt: sometimes\n"),
        "images.hello.binfmt",
        "auto, never, require",
    );
    expect(
        &d,
        &format!("binfmt: Auto\n{}", with_image("")),
        "binfmt",
        "auto, never, require",
    );
    expect(
        &d,
        &with_image("    network: {a: b}\n"),
        "images.hello.network",
        "network: default",
    );
    expect(
        &d,
        &format!("binfmt_image: \"\"\n{}", with_image("")),
        "binfmt_image",
        "tonistiigi/binfmt",
    );
    expect(
        &d,
        &with_image("    target: \"\"\n"),
        "images.hello.target",
        "remove `target:`",
    );
    expect(
        &d,
        &with_image("    build_args: {\"A=B\": x}\n"),
        "images.hello.build_args.A=B",
        "without `=`",
    );
    expect(
        &d,
        &with_image("    build_args: [A]\n"),
        "images.hello.build_args",
        "GREETING: hello",
    );
    expect(
        &d,
        &with_image("    labels: {\"\": x}\n"),
        "images.hello.labels.",
        "org.opencontainers",
    );
    expect(
        &d,
        &with_image("    no_cache: yes\n"),
        "images.hello.no_cache",
        "write `no_cache: true` or `no_cache: false`",
    );
    expect(
        &d,
        &format!("reproducible: \"1\"\n{}", with_image("")),
        "reproducible",
        "`1` is not a boolean; write `reproducible: true` or `reproducible: false`",
    );
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
    assert_eq!(error.exit_code(), 2);
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

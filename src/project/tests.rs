use super::names::check_repository;
use super::*;
use std::fs;
use tempfile::TempDir;

/// A project directory with a Dockerfile, a sub-context and a plain file.
fn fixture() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
    fs::create_dir(dir.path().join("app")).unwrap();
    fs::write(
        dir.path().join("app/Dockerfile.release"),
        "FROM scratch AS release\n",
    )
    .unwrap();
    fs::create_dir(dir.path().join("app/Dockerfile.d")).unwrap();
    fs::write(dir.path().join("notadir"), "x").unwrap();
    dir
}

fn parse_in(dir: &TempDir, text: &str) -> Result<Project> {
    Project::parse(
        &dir.path().join("polyarch.yaml"),
        text,
        &LoadOptions::default(),
    )
}

/// A minimal valid image with `extra` lines appended to its settings.
fn with_image(extra: &str) -> String {
    format!(
            "version: 1\nimages:\n  hello:\n    repository: 127.0.0.1:5000/demo/hello\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n{extra}"
        )
}

/// Replaces one line (`key: ...`) of the minimal image.
fn replacing(key: &str, line: &str) -> String {
    with_image("")
        .lines()
        .map(|l| {
            if l.trim_start().starts_with(&format!("{key}:")) {
                line.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn project_err(r: Result<Project>) -> (String, String, String) {
    match r {
        Err(e @ Error::Project { .. }) => {
            let shown = e.to_string();
            let Error::Project { field, message, .. } = e else {
                unreachable!()
            };
            assert!(
                !shown.contains('\n') && !shown.contains('\r'),
                "multi-line: {shown:?}"
            );
            (field, message, shown)
        }
        Err(other) => panic!("not a project error: {other}"),
        Ok(_) => panic!("parsed"),
    }
}

/// Asserts the failure is at `field` and the message mentions `needle` (the fix).
fn expect(dir: &TempDir, text: &str, field: &str, needle: &str) -> String {
    let (f, m, shown) = project_err(parse_in(dir, text));
    assert_eq!(f, field, "wrong field for {text:?}: {shown}");
    assert!(m.contains(needle), "message lacks {needle:?}: {shown}");
    assert!(
        m.contains(';') || m.contains("e.g.") || m.contains("use "),
        "no fix: {shown}"
    );
    shown
}

const FULL: &str = r#"
version: 1
binfmt: require
binfmt_image: tonistiigi/binfmt:qemu-v8
builders:
  linux/arm64/v8: unix:///run/arm-docker.sock
  linux/arm/v7: tcp://pi.local:2375
images:
  zeta:
    repository: 127.0.0.1:5000/demo/hello
    tags: [v1, latest, "1.10"]
    context: app
    dockerfile: Dockerfile.release
    platforms: [linux/amd64, linux/aarch64, linux/arm/v7]
    build_args: {GREETING: hello, COUNT: 3, DEBUG: true, VERSION: 1.10}
    target: release
    labels: {org.opencontainers.image.source: https://example.org/x}
    network: host
    binfmt: never
  alpha:
    repository: docker.io/library/alpha
    tags: [edge]
    context: .
    platforms: [linux/amd64]
"#;

#[test]
fn full_valid_file() {
    let dir = fixture();
    let p = parse_in(&dir, FULL).unwrap();
    assert_eq!(p.binfmt, BinfmtMode::Require);
    assert_eq!(p.binfmt_image.as_deref(), Some("tonistiigi/binfmt:qemu-v8"));
    assert_eq!(p.builders.len(), 2);
    assert_eq!(
        p.builders
            .get(&"linux/arm64".parse().unwrap())
            .map(|b| b[0].host.as_str()),
        Some("unix:///run/arm-docker.sock")
    );
    let names: Vec<&str> = p.images.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha"], "declaration order kept");
    let z = p.image("zeta").unwrap();
    assert_eq!(z.repository, "127.0.0.1:5000/demo/hello");
    assert_eq!(z.tags, ["v1", "latest", "1.10"]);
    assert_eq!(z.context, dir.path().join("app").canonicalize().unwrap());
    assert!(z.context.is_absolute());
    assert_eq!(z.dockerfile, PathBuf::from("Dockerfile.release"));
    let plats: Vec<String> = z.platforms.iter().map(ToString::to_string).collect();
    assert_eq!(plats, ["linux/amd64", "linux/arm64", "linux/arm/v7"]);
    assert_eq!(z.build_args["GREETING"], "hello");
    assert_eq!(z.build_args["COUNT"], "3");
    assert_eq!(z.build_args["DEBUG"], "true");
    assert_eq!(z.build_args["VERSION"], "1.10", "scalars kept as written");
    assert_eq!(z.target.as_deref(), Some("release"));
    assert_eq!(
        z.labels["org.opencontainers.image.source"],
        "https://example.org/x"
    );
    assert_eq!(z.network, Network::Host);
    assert_eq!(z.binfmt, Some(BinfmtMode::Never));
    assert_eq!(z.binfmt_mode(p.binfmt), BinfmtMode::Never);
    let a = p.image("alpha").unwrap();
    assert_eq!(a.binfmt_mode(p.binfmt), BinfmtMode::Require);
}

#[test]
fn defaults() {
    let dir = fixture();
    let p = parse_in(&dir, &with_image("")).unwrap();
    assert_eq!(p.binfmt, BinfmtMode::Auto);
    assert!(p.binfmt_image.is_none());
    assert!(p.builders.is_empty());
    let i = &p.images[0];
    assert_eq!(i.dockerfile, PathBuf::from("Dockerfile"));
    assert_eq!(i.network, Network::Default);
    assert_eq!(i.binfmt, None);
    assert!(i.target.is_none() && i.build_args.is_empty() && i.labels.is_empty());
    assert_eq!(i.context, dir.path().canonicalize().unwrap());
}

#[test]
fn load_reads_file_and_reports_missing() {
    let dir = fixture();
    let file = dir.path().join("polyarch.yaml");
    fs::write(&file, with_image("")).unwrap();
    assert_eq!(
        Project::load(&file, &LoadOptions::default())
            .unwrap()
            .images
            .len(),
        1
    );

    let missing = dir.path().join("nope.yaml");
    let (f, m, shown) = project_err(Project::load(&missing, &LoadOptions::default()));
    assert_eq!(f, "");
    assert!(m.contains("-f FILE"), "{shown}");
    assert!(shown.contains("nope.yaml"), "{shown}");

    let (_, m, _) = project_err(Project::load(dir.path(), &LoadOptions::default()));
    assert!(m.contains("is a directory"), "{m}");

    let bin = dir.path().join("bin.yaml");
    fs::write(&bin, [0xff, 0xfe, 0x00, b'a']).unwrap();
    let (_, m, _) = project_err(Project::load(&bin, &LoadOptions::default()));
    assert!(m.contains("UTF-8"), "{m}");
}

#[test]
fn relative_project_file_uses_current_directory() {
    // No parent directory: contexts resolve against `.`; a missing one names it.
    let (f, m, _) = project_err(Project::parse(
        Path::new("polyarch.yaml"),
        &replacing("context", "    context: definitely-not-here-xyz"),
        &LoadOptions::default(),
    ));
    assert_eq!(f, "images.hello.context");
    assert!(
        m.contains("definitely-not-here-xyz") && m.contains("create it"),
        "{m}"
    );
}

#[test]
fn version_errors() {
    let d = fixture();
    let body = "images:\n  hello:\n    repository: x/y\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n";
    expect(&d, body, "version", "add `version: 1`");
    let s = expect(
        &d,
        &format!("version: 2\n{body}"),
        "version",
        "reads version 1",
    );
    assert!(s.contains("unsupported version 2"), "{s}");
    expect(
        &d,
        &format!("version: \"1\"\n{body}"),
        "version",
        "without quotes",
    );
    expect(
        &d,
        &format!("version: 1e999\n{body}"),
        "version",
        "write `version: 1`",
    );
    expect(
        &d,
        &format!("version: 99999999999999999999999999999999\n{body}"),
        "version",
        "reads version 1",
    );
    expect(
        &d,
        &format!("version: -1\n{body}"),
        "version",
        "reads version 1",
    );
    expect(
        &d,
        &format!("version: [1]\n{body}"),
        "version",
        "write `version: 1`",
    );
    // An unsupported version wins over version-1 field errors.
    expect(
        &d,
        "version: 2\nfuture_key: 1\n",
        "version",
        "newer polyarch",
    );
    // 1.0 is the number one.
    assert!(parse_in(&d, &with_image("").replace("version: 1", "version: 1.0")).is_ok());
}

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
}

#[test]
fn builder_errors() {
    let d = fixture();
    let b = |lines: &str| format!("builders:\n{lines}{}", with_image(""));
    let s = expect(
        &d,
        &b("  plan10/arm64: unix:///x\n"),
        "builders.plan10/arm64",
        "e.g. linux/amd64",
    );
    assert!(s.contains("unknown operating system"), "{s}");
    let s = expect(
        &d,
        &b("  linux/arm64: unix:///a\n  linux/arm64/v8: unix:///b\n"),
        "builders.linux/arm64/v8",
        "keep one",
    );
    assert!(s.contains("builders.linux/arm64 "), "{s}");
    expect(
        &d,
        &b("  linux/arm64: \"\"\n"),
        "builders.linux/arm64",
        "docker context name",
    );
    expect(
        &d,
        &b("  linux/arm64: 5\n"),
        "builders.linux/arm64",
        "builders: {linux/arm64",
    );
    expect(
        &d,
        "version: 1\nbuilders: x\n",
        "builders",
        "builders: {linux/arm64",
    );
}

#[test]
fn builders_take_every_endpoint_form() {
    let d = fixture();
    fs::create_dir(d.path().join("certs")).unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        fs::write(d.path().join("certs").join(f), "").unwrap();
    }
    let text = format!(
            "builders:\n  linux/arm64: ssh://ci@arm-box:2222\n  linux/arm/v7: {{host: tcp://10.0.0.7:2376, tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}\n  linux/riscv64: riscv-ctx\n{}",
            with_image("")
        );
    let p = parse_in(&d, &text).unwrap();
    let get = |platform: &str| p.builders[&platform.parse::<Platform>().unwrap()][0].clone();
    assert_eq!(get("linux/arm64").host, "ssh://ci@arm-box:2222");
    assert!(get("linux/arm64").tls.is_none());
    let tls = get("linux/arm/v7").tls.unwrap();
    assert_eq!(
        tls.ca,
        Some(d.path().join("certs/ca.pem")),
        "relative to the file"
    );
    assert_eq!(tls.key, Some(d.path().join("certs/key.pem")));
    assert_eq!(get("linux/riscv64").to_string(), "riscv-ctx");
    assert_eq!(get("linux/arm64").fallback, Fallback::None);
    let text = format!(
        "builders:\n  linux/arm64: {{host: ssh://arm-box, fallback: emulate}}\n{}",
        with_image("")
    );
    let p = parse_in(&d, &text).unwrap();
    assert_eq!(
        p.builders[&"linux/arm64".parse::<Platform>().unwrap()][0].fallback,
        Fallback::Emulate
    );
    let text = format!(
        "builders:\n  linux/arm64: [ssh://a, {{host: ssh://b, fallback: emulate}}]\n{}",
        with_image("")
    );
    let p = parse_in(&d, &text).unwrap();
    let list = &p.builders[&"linux/arm64".parse::<Platform>().unwrap()];
    let hosts: Vec<&str> = list.iter().map(|b| b.host.as_str()).collect();
    assert_eq!(hosts, ["ssh://a", "ssh://b"]);
}

#[test]
fn builder_map_errors() {
    let d = fixture();
    let b = |line: &str| format!("builders:\n  linux/arm64: {line}\n{}", with_image(""));
    expect(
        &d,
        &b("{tls: {ca: ca.pem}}"),
        "builders.linux/arm64.host",
        "host: tcp://",
    );
    expect(
        &d,
        &b("ftp://arm-box"),
        "builders.linux/arm64",
        "unsupported scheme",
    );
    expect(
        &d,
        &b("{host: \"tcp://h:port\"}"),
        "builders.linux/arm64.host",
        "port is not a number",
    );
    expect(
        &d,
        &b("{host: \"ssh://arm-box\", tls: {ca: ca.pem}}"),
        "builders.linux/arm64.tls",
        "tcp:// hosts only",
    );
    expect(
        &d,
        &b("{host: \"tcp://h:2376\", tls: {ca: missing.pem}}"),
        "builders.linux/arm64.tls.ca",
        "does not exist",
    );
    fs::write(d.path().join("cert.pem"), "").unwrap();
    expect(
        &d,
        &b("{host: \"tcp://h:2376\", tls: {cert: cert.pem}}"),
        "builders.linux/arm64.tls",
        "no key",
    );
    expect(
        &d,
        &b("{host: \"tcp://h:2376\", tls: {}}"),
        "builders.linux/arm64.tls",
        "give ca",
    );
    expect(&d, &b("[]"), "builders.linux/arm64", "empty list");
    expect(
        &d,
        &b("[ssh://a, {host: \"ftp://b\"}]"),
        "builders.linux/arm64[1].host",
        "unsupported scheme",
    );
    expect(&d, &b("[[ssh://a]]"), "builders.linux/arm64[0]", "one list");
    expect(
        &d,
        &b("{host: \"tcp://h:2376\", fallback: qemu}"),
        "builders.linux/arm64.fallback",
        "use one of none, emulate",
    );
    let s = expect(
        &d,
        &b("{host: \"tcp://h:2376\", tsl: {}}"),
        "builders.linux/arm64.tsl",
        "did you mean tls?",
    );
    assert!(s.contains("host, tls"), "{s}");
}

#[test]
fn unknown_fields() {
    let d = fixture();
    let s = expect(
        &d,
        &with_image("    platfroms: [linux/arm64]\n"),
        "images.hello.platfroms",
        "did you mean platforms?",
    );
    assert!(
        s.contains("unknown field") && s.contains("expected one of repository, tags, context"),
        "{s}"
    );
    assert!(!s.contains('`') || s.contains("did you mean"), "{s}");
    let s = expect(
        &d,
        &format!("imagez: {{}}\n{}", with_image("")),
        "imagez",
        "did you mean images?",
    );
    assert!(s.contains("expected one of version, binfmt"), "{s}");
    expect(
        &d,
        &with_image("    zzzzzz: 1\n"),
        "images.hello.zzzzzz",
        "expected one of",
    );
}

#[test]
fn yaml_syntax_error_names_line_and_column() {
    let d = fixture();
    let text = "version: 1\nimages:\n  hello:\n    tags: [v1\n    context: .\n";
    let (f, m, shown) = project_err(parse_in(&d, text));
    assert_eq!(f, "");
    assert!(m.starts_with("YAML syntax error at line "), "{shown}");
    assert!(m.contains(", column "), "{shown}");
    assert!(m.contains("fix the"), "{shown}");
    let (_, m, _) = project_err(parse_in(&d, "version: 1\n images: x\n  - y\n"));
    assert!(m.contains("line 2") || m.contains("line 3"), "{m}");
}

#[test]
fn type_error_reports_location() {
    let d = fixture();
    let (f, m, _) = project_err(parse_in(&d, &replacing("tags", "    tags: {a: b}")));
    assert_eq!(f, "images.hello.tags");
    assert!(
        m.starts_with("expected a list, found a mapping (line 5, column"),
        "{m}"
    );
}

#[test]
fn garbage_never_panics() {
    let d = fixture();
    let deep_seq = "[".repeat(5000);
    let deep_map = "a: {".repeat(2000);
    let bomb = "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nversion: 1\n";
    let mut inputs: Vec<String> = [
        "",
        " ",
        "\n\n",
        "# only a comment\n",
        "---",
        "---\n...\n",
        "~",
        "null",
        "[1, 2]",
        "just a string",
        "42",
        "{",
        "}",
        "[",
        "\"",
        "'",
        ":",
        "- - -",
        "? [a]\n: b\n",
        "\0\u{1}\u{7f}",
        "\u{feff}version: 1",
        "version: 1\n---\nversion: 1\n",
        "version: 1\nimages: !!binary aGVsbG8=\n",
        "version: !!str 1\n",
        "version: 1\nimages: *nope\n",
        "version: 1\n<<: {images: {}}\n",
        "version: 1\nimages:\n  ? [a, b]\n  : {}\n",
        "version: 1\nimages:\n  hello: {tags: 99999999999999999999999999999999999}\n",
        "version: 1\nimages:\n  hello: {platforms: [1e999, -0, .nan]}\n",
        "version: 0x1\n",
        "version: .inf\n",
        "version: 18446744073709551617\n",
        "version: -9223372036854775809\n",
        "version: 1\nimages: {a: {b: {c: {d: e}}}}\n",
        "\tversion: 1",
        "version: 1\nimages:\n\thello: {}\n",
        "!!map {version: 1}",
        "%YAML 1.2\n---\nversion: 1\n",
        "%TAG ! tag:x,2000:\n--- !foo\nversion: 1\n",
        "version: 1\nimages: {\"\\n\": {}}\n",
        "version: 1\nimages: {\"a\\nb\": {repository: \"x\\ny\"}}\n",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    inputs.push(deep_seq);
    inputs.push(deep_map);
    inputs.push(bomb.to_string());
    inputs.push(format!(
        "version: 1\nimages:\n  hello:\n    tags: [{}]\n",
        "9".repeat(100_000)
    ));
    // Every truncation of a valid document.
    let full = FULL.to_string();
    let mut cut: Vec<String> = full
        .char_indices()
        .map(|(i, _)| full[..i].to_string())
        .collect();
    inputs.append(&mut cut);
    for input in inputs {
        match parse_in(&d, &input) {
            Ok(_) => {}
            Err(e) => {
                let s = e.to_string();
                assert!(
                    !s.contains('\n') && !s.contains('\r'),
                    "multi-line for {input:?}: {s:?}"
                );
                assert!(matches!(e, Error::Project { .. }), "{s}");
            }
        }
    }
}

#[test]
fn empty_and_non_mapping_documents() {
    let d = fixture();
    for empty in ["", "  \n", "# c\n", "---\n", "~\n"] {
        let (f, m, _) = project_err(parse_in(&d, empty));
        assert_eq!(f, "");
        assert!(
            m.contains("the file is empty") && m.contains("version: 1"),
            "{empty:?}: {m}"
        );
    }
    for (doc, what) in [
        ("[1, 2]", "a list"),
        ("hello", "the string `hello`"),
        ("7", "the number 7"),
    ] {
        let (f, m, _) = project_err(parse_in(&d, doc));
        assert_eq!(f, "");
        assert!(
            m.contains(what) && m.contains("not a mapping") && m.contains("version: 1"),
            "{m}"
        );
    }
}

#[test]
fn messages_stay_on_one_line_with_hostile_values() {
    let d = fixture();
    let (_, m, _) = project_err(parse_in(&d, &replacing("tags", "    tags: [\"a\\nb\"]")));
    assert!(m.contains("a\\nb"), "{m}");
    let (f, _, _) = project_err(parse_in(&d, "version: 1\nimages: {\"a\\nb\": {}}\n"));
    assert!(!f.contains('\n'));
}

fn schema() -> serde_json::Value {
    serde_json::from_str(SCHEMA_JSON).expect("schema/polyarch.schema.json is JSON")
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(fields: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn schema_matches_parser() {
    let s = schema();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(keys(&s["properties"]), sorted(PROJECT_FIELDS));
    assert_eq!(
        keys(&s["$defs"]["image"]["properties"]),
        sorted(IMAGE_FIELDS)
    );
    assert_eq!(s["additionalProperties"], false);
    assert_eq!(s["$defs"]["image"]["additionalProperties"], false);
    assert_eq!(s["properties"]["version"]["const"], SUPPORTED_VERSION);
    let enum_of = |v: &serde_json::Value| -> Vec<String> {
        v["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(enum_of(&s["$defs"]["binfmt"]), ["auto", "never", "require"]);
    assert_eq!(enum_of(&s["$defs"]["network"]), ["default", "host", "none"]);
    let mut req: Vec<&str> = s["$defs"]["image"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    req.sort();
    assert_eq!(req, ["context", "platforms", "repository", "tags"]);
}

/// The lists the parser's serde derive actually accepts, read back from its own
/// unknown-field message, equal the published constants (and so the schema).
#[test]
fn field_lists_match_serde() {
    let d = fixture();
    let listed = |text: &str| -> Vec<String> {
        let (_, m, _) = project_err(parse_in(&d, text));
        let list = m.split("expected one of ").nth(1).unwrap();
        let mut v: Vec<String> = list.split(", ").map(str::to_string).collect();
        v.sort();
        v
    };
    assert_eq!(
        listed(&with_image("    qqqqqqqq: 1\n")),
        sorted(IMAGE_FIELDS)
    );
    assert_eq!(
        listed(&format!("qqqqqqqq: 1\n{}", with_image(""))),
        sorted(PROJECT_FIELDS)
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

fn job_env(name: &str) -> Option<String> {
    match name {
        "VERSION" => Some("v1.4.3".into()),
        "REGISTRY" => Some("127.0.0.1:5000/demo".into()),
        "BAD_TAG" => Some("not a tag".into()),
        _ => None,
    }
}

fn parse_job(dir: &TempDir, text: &str, sets: &[&str], purpose: Purpose) -> Result<Project> {
    let overrides: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    let options = LoadOptions {
        purpose,
        overrides: &overrides,
        env: &job_env,
    };
    Project::parse(&dir.path().join("polyarch.yaml"), text, &options)
}

const JOB: &str = "version: 1\nimages:\n  api:\n    repository: ${REGISTRY}/api\n    tags: [\"${VERSION}\", latest]\n    context: .\n    platforms: [linux/amd64]\n    build_args: {VERSION: \"${VERSION:-dev}\", COMMIT: \"${COMMIT:-unknown}\"}\n    labels: {org.opencontainers.image.version: $VERSION}\n  web:\n    repository: 127.0.0.1:5000/demo/web\n    tags: [\"${WEB_TAG:-edge}\"]\n    context: .\n    platforms: [linux/amd64]\n";

#[test]
fn variables_fill_values_and_are_recorded() {
    let d = fixture();
    let p = parse_job(&d, JOB, &[], Purpose::Build).unwrap();
    let api = p.image("api").unwrap();
    assert_eq!(api.repository, "127.0.0.1:5000/demo/api");
    assert_eq!(api.tags, ["v1.4.3", "latest"]);
    assert_eq!(api.build_args["VERSION"], "v1.4.3");
    assert_eq!(api.build_args["COMMIT"], "unknown");
    assert_eq!(api.labels["org.opencontainers.image.version"], "v1.4.3");
    assert_eq!(p.image("web").unwrap().tags, ["edge"]);
    let sources: Vec<(String, String)> = p
        .values_for(&["api".into()])
        .into_iter()
        .map(|v| (v.field, v.source))
        .collect();
    let pair = |f: &str, s: &str| (f.to_string(), s.to_string());
    assert_eq!(
        sources,
        vec![
            pair("images.api.repository", "env:REGISTRY"),
            pair("images.api.tags[0]", "env:VERSION"),
            pair("images.api.build_args.VERSION", "env:VERSION"),
            pair("images.api.build_args.COMMIT", "default:COMMIT"),
            pair(
                "images.api.labels.org.opencontainers.image.version",
                "env:VERSION"
            ),
        ]
    );
    assert_eq!(p.values_for(&[]).len(), 6, "all images");
    // A file without variables has nothing to record.
    assert!(parse_in(&d, FULL).unwrap().values_for(&[]).is_empty());
}

#[test]
fn an_unset_variable_names_the_field_and_variable() {
    let d = fixture();
    let text = JOB.replace("${VERSION}\", latest", "${RELEASE}\", latest");
    let (f, m, shown) = project_err(parse_job(&d, &text, &[], Purpose::Build));
    assert_eq!(f, "images.api.tags[0]");
    assert!(
        m.contains("variable RELEASE is not set") && m.contains("${RELEASE:-default}"),
        "{shown}"
    );
    assert!(
        shown.starts_with(&format!(
            "{}: images.api.tags[0]: ",
            d.path().join("polyarch.yaml").display()
        )),
        "{shown}"
    );
    let text = JOB.replace(
        "${REGISTRY}/api",
        "\"${REGISTRY_HOST:?the registry to push to}/api\"",
    );
    let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
    assert_eq!(f, "images.api.repository");
    assert!(
        m.contains("REGISTRY_HOST is not set: the registry to push to;"),
        "{m}"
    );
    // Keys are names, not values: left alone.
    let text = with_image("    build_args: {$NOT_A_VARIABLE: x}\n");
    assert!(parse_in(&d, &text)
        .unwrap()
        .image("hello")
        .unwrap()
        .build_args
        .contains_key("$NOT_A_VARIABLE"));
    // A value from the job is validated like any other, and traced to its variable.
    let text = JOB.replace("${VERSION}\", latest", "${BAD_TAG}\", latest");
    let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
    assert_eq!(f, "images.api.tags[0]");
    assert!(
        m.contains("is not a valid tag") && m.ends_with("(the value came from $BAD_TAG)"),
        "{m}"
    );
    // Every variable of a bad value is named.
    let text = JOB.replace("${REGISTRY}/api", "${REGISTRY}/${BAD_TAG}");
    let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
    assert_eq!(f, "images.api.repository");
    assert!(
        m.ends_with("(the value came from $REGISTRY, $BAD_TAG)"),
        "{m}"
    );
    // `[${VERSION}]` is YAML's mapping inside a list: the fix is to quote it.
    let text = JOB.replace("[\"${VERSION}\", latest]", "[${VERSION}, latest]");
    let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
    assert_eq!(f, "");
    assert!(
        m.contains("line 5") && m.contains("quote values holding `${…}`"),
        "{m}"
    );
    let (_, m, _) = project_err(parse_in(&d, "version: 1\nimages: [\n"));
    assert!(m.contains("fix the indentation"), "{m}");
}

#[test]
fn set_overrides_the_file() {
    let d = fixture();
    let p = parse_job(
        &d,
        JOB,
        &[
            "api.tags=v2.0.0, latest",
            "*.platforms=linux/arm64,linux/amd64",
            "api.args.VERSION=1.2",
            "api.labels.org.example.team=core",
            "web.target=release",
            "web.dockerfile=app/Dockerfile.release",
        ],
        Purpose::Build,
    )
    .unwrap();
    let api = p.image("api").unwrap();
    assert_eq!(api.tags, ["v2.0.0", "latest"]);
    assert_eq!(api.platforms.len(), 2);
    assert_eq!(api.build_args["VERSION"], "1.2");
    assert_eq!(api.labels["org.example.team"], "core");
    let web = p.image("web").unwrap();
    assert_eq!(web.platforms, api.platforms);
    assert_eq!(web.target.as_deref(), Some("release"));
    assert_eq!(web.dockerfile, Path::new("app/Dockerfile.release"));
    let sources = p.values_for(&["api".into()]);
    let of = |field: &str| {
        sources
            .iter()
            .filter(|v| v.field == field)
            .map(|v| v.source.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(of("images.api.tags"), ["set"]);
    assert!(
        of("images.api.tags[0]").is_empty(),
        "the file's ${{VERSION}} was replaced"
    );
    assert_eq!(of("images.api.build_args.VERSION"), ["set"]);
    assert_eq!(of("images.api.build_args.COMMIT"), ["default:COMMIT"]);
    // A --set value is taken literally, and spares the field it replaces from the
    // file's unset variable.
    let text = JOB.replace("${VERSION}\", latest", "${RELEASE}\", latest");
    let p = parse_job(
        &d,
        &text,
        &["api.tags=v1", "api.args.X=$HOME"],
        Purpose::Build,
    )
    .unwrap();
    assert_eq!(p.image("api").unwrap().build_args["X"], "$HOME");
    // The later of two wins.
    let p = parse_job(&d, JOB, &["api.tags=a", "api.tags=b"], Purpose::Build).unwrap();
    assert_eq!(p.image("api").unwrap().tags, ["b"]);
}

#[test]
fn a_bad_set_is_a_usage_error_naming_it() {
    let d = fixture();
    let usage = |sets: &[&str]| match parse_job(&d, JOB, sets, Purpose::Build) {
        Err(Error::Usage(m)) => m,
        other => panic!("not a usage error: {other:?}"),
    };
    let m = usage(&["apx.tags=v1"]);
    assert!(
        m.starts_with("--set apx.tags=v1: no image of ")
            && m.ends_with("is named `apx`; its images are api, web"),
        "{m}"
    );
    let m = usage(&["api.platfroms=linux/arm64"]);
    assert!(
        m.starts_with("--set api.platfroms=linux/arm64: `platfroms` is not a field")
            && m.contains("did you mean platforms?"),
        "{m}"
    );
    // A value --set gives is validated at its field, naming the flag.
    let (f, m, _) = project_err(parse_job(
        &d,
        JOB,
        &["api.platforms=linux/foo"],
        Purpose::Build,
    ));
    assert_eq!(f, "images.api.platforms[0]");
    assert!(
        m.ends_with("(the value came from --set api.platforms=linux/foo)"),
        "{m}"
    );
    let (f, m, _) = project_err(parse_job(&d, JOB, &["api.tags="], Purpose::Build));
    assert_eq!(f, "images.api.tags");
    assert!(
        m.contains("is empty") && m.contains("--set api.tags="),
        "{m}"
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

/// The CI job's environment, as the examples under examples/ci/ expect it.
fn ci_job(name: &str) -> Option<String> {
    match name {
        "REGISTRY" => Some("ghcr.io".to_string()),
        "VERSION" => Some("v1.4.3".to_string()),
        "ARM_BUILDER" => Some("ssh://ci@arm-box.example.com".to_string()),
        _ => None,
    }
}

/// A project file of examples/ci/ and the options to read it in the CI job.
fn ci_example(file: &str) -> (PathBuf, LoadOptions<'static>) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/ci")
        .join(file);
    let options = LoadOptions {
        purpose: Purpose::Verify,
        overrides: &[],
        env: &ci_job,
    };
    (file, options)
}

/// The CI example's project file takes its registry and version from the job.
#[test]
fn the_ci_example_reads_its_release_from_the_environment() {
    let (file, options) = ci_example("polyarch.yaml");
    let p = Project::load(&file, &options).unwrap();
    let api = p.image("api").unwrap();
    assert_eq!(api.repository, "ghcr.io/acme/api");
    assert_eq!(api.tags, ["v1.4.3", "latest"]);
    assert_eq!(api.labels["org.opencontainers.image.revision"], "unknown");
    let without = LoadOptions {
        env: &|name: &str| ci_job(name).filter(|_| name != "VERSION"),
        ..options
    };
    let (f, m, _) = project_err(Project::load(&file, &without));
    assert_eq!(f, "images.api.tags[0]");
    assert!(m.contains("VERSION is not set: the release version"), "{m}");
}

/// The ssh builder example names its builder from the job too.
#[test]
fn the_ssh_builder_example_takes_its_builder_from_the_environment() {
    let (file, options) = ci_example("polyarch-ssh.yaml");
    let p = Project::load(&file, &options).unwrap();
    let arm = &p.builders[&"linux/arm64".parse::<Platform>().unwrap()][0];
    assert_eq!(arm.host, "ssh://ci@arm-box.example.com");
    assert!(!arm.endpoint().unwrap().is_local());
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

//! `builders:` in every form.

use super::*;

#[test]
fn builder_errors() {
    let d = fixture();
    let b = |lines: &str| format!("builders:\n{lines}{}", with_image(""));
    let twice = b("  linux/arm64: unix:///a\n  linux/arm64/v8: unix:///b\n");
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (b("  plan10/arm64: unix:///x\n"), "builders.plan10/arm64", "e.g. linux/amd64",
            &["unknown operating system"]),
        (twice, "builders.linux/arm64/v8", "keep one", &["builders.linux/arm64 "]),
        (b("  linux/arm64: \"\"\n"), "builders.linux/arm64", "docker context name", &[]),
        (b("  linux/arm64: 5\n"), "builders.linux/arm64", "builders: {linux/arm64", &[]),
        ("version: 1\nbuilders: x\n".into(), "builders", "builders: {linux/arm64", &[]),
    ];
    expect_all(&d, cases);
}

#[test]
fn builders_take_every_endpoint_form() {
    let d = fixture();
    fs::create_dir(d.path().join("certs")).unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        fs::write(d.path().join("certs").join(f), "").unwrap();
    }
    let text = format!(
            "builders:\n  linux/arm64: ssh://ci@arm-box:2222\n  linux/arm/v7: {{host: tcp://10.0.0.7:2376, tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem, servername: engine.internal}}}}\n  linux/riscv64: riscv-ctx\n{}",
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
    assert_eq!(tls.server_name.as_deref(), Some("engine.internal"));
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
    let f = "builders.linux/arm64";
    fs::write(d.path().join("cert.pem"), "").unwrap();
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (b("{tls: {ca: ca.pem}}"), "builders.linux/arm64.host", "host: tcp://", &[]),
        (b("ftp://arm-box"), f, "unsupported scheme", &[]),
        (b("{host: \"tcp://h:port\"}"), "builders.linux/arm64.host", "port is not a number", &[]),
        (b("{host: \"ssh://arm-box\", tls: {ca: ca.pem}}"), "builders.linux/arm64.tls",
            "tcp:// hosts only", &[]),
        (b("{host: \"tcp://h:2376\", tls: {ca: missing.pem}}"), "builders.linux/arm64.tls.ca",
            "does not exist", &[]),
        (b("{host: \"tcp://h:2376\", tls: {cert: cert.pem}}"), "builders.linux/arm64.tls",
            "no key", &[]),
        (b("{host: \"tcp://h:2376\", tls: {}}"), "builders.linux/arm64.tls", "give ca", &[]),
        (b("{buildkit: \"tcp://h:1234\", tls: {ca: cert.pem, servername: \" \"}}"),
            "builders.linux/arm64.tls.servername", "give the host name", &[]),
        (b("[]"), f, "empty list", &[]),
        (b("[ssh://a, {host: \"ftp://b\"}]"), "builders.linux/arm64[1].host",
            "unsupported scheme", &[]),
        (b("[[ssh://a]]"), "builders.linux/arm64[0]", "one list", &[]),
        (b("{host: \"tcp://h:2376\", buildkit: \"tcp://h:1234\"}"), f,
            "host for a Docker engine or buildkit for a BuildKit daemon", &[]),
        (b("{buildkit: arm-ctx}"), "builders.linux/arm64.buildkit", "not an address", &[]),
        (b("{buildkit: \"unix:///bk.sock\", tls: {ca: cert.pem}}"), "builders.linux/arm64.tls",
            "tcp:// hosts only", &[]),
        (b("{host: \"tcp://h:2376\", fallback: qemu}"), "builders.linux/arm64.fallback",
            "use one of none, emulate", &[]),
        (b("{host: \"tcp://h:2376\", tsl: {}}"), "builders.linux/arm64.tsl", "did you mean tls?",
            &["host, buildkit, tls"]),
    ];
    expect_all(&d, cases);
}

#[test]
fn a_builder_can_be_a_buildkit_daemon() {
    let d = fixture();
    fs::create_dir(d.path().join("certs")).unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        fs::write(d.path().join("certs").join(f), "").unwrap();
    }
    let text = format!(
        "builders:\n  linux/arm64: {{buildkit: tcp://arm-bk:1234, tls: {{ca: certs/ca.pem, cert: certs/cert.pem, key: certs/key.pem}}}}\n  linux/s390x: [unix:///run/docker.sock, {{buildkit: unix:///run/buildkit/buildkitd.sock}}]\n{}",
        with_image("")
    );
    let p = parse_in(&d, &text).unwrap();
    let get = |platform: &str| p.builders[&platform.parse::<Platform>().unwrap()].clone();
    let arm64 = &get("linux/arm64")[0];
    assert!(arm64.buildkit);
    assert_eq!(arm64.host, "tcp://arm-bk:1234");
    assert_eq!(
        arm64.tls.as_ref().unwrap().cert,
        Some(d.path().join("certs/cert.pem"))
    );
    assert_eq!(arm64.to_string(), "BuildKit daemon tcp://arm-bk:1234 (TLS)");
    let s390x = get("linux/s390x");
    assert!(!s390x[0].buildkit && s390x[1].buildkit);
}

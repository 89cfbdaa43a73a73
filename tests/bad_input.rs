//! Robustness: every bad input a user (or a registry) can hand polyarch gives one error
//! line naming what is wrong, the documented exit code, no panic, and pushes nothing.
//!
//! Three tables: project-file mistakes (exit 2), command-line mistakes (exit 2) and
//! registry answers that are not what was asked for (exit 3). Cases that show a defect in
//! polyarch assert the correct behaviour in their own tests at the end.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use polyarch::base::oci::sha256_digest;
use proxy::{Fault, Proxy, Rule};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use support::{hello_context, polyarch, run, unique_name, write_project, Registry, HELLO};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

// ------------------------------------------------------------------------- checks

/// How the error is expected to be shown.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// stderr is exactly the one `error:` line (nothing started before it).
    Alone,
    /// clap's usage error: one `error:` line, then clap's indented details, `Usage:` and
    /// `For more information` lines. The needles must appear before `Usage:`.
    Clap,
    /// One `error:` line after timestamped progress lines (`HH:MM:SS image [phase] …`).
    AfterProgress,
}

fn is_progress(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 9
        && b[..8].iter().enumerate().all(|(i, c)| {
            if i == 2 || i == 5 {
                *c == b':'
            } else {
                c.is_ascii_digit()
            }
        })
        && b[8] == b' '
}

/// Asserts exit code, one error line, the needles in the error, no panic; returns the
/// error line.
fn check(case: &str, out: &Output, code: i32, shape: Shape, needles: &[String]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let show = || {
        format!(
            "case `{case}`: status {}\n--- stdout\n{}\n--- stderr\n{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        )
    };
    assert!(!stderr.contains("panicked"), "panic: {}", show());
    assert_eq!(out.status.code(), Some(code), "exit code: {}", show());
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "not exactly one `error:` line: {}", show());
    let error = errors[0].to_string();
    let shown = match shape {
        Shape::Alone => {
            assert_eq!(
                stderr.trim_end().lines().count(),
                1,
                "stderr is more than the error line: {}",
                show()
            );
            error.clone()
        }
        Shape::AfterProgress => {
            for line in stderr.lines().filter(|l| !l.starts_with("error:")) {
                assert!(
                    is_progress(line),
                    "not a progress line: {line:?}: {}",
                    show()
                );
            }
            assert!(
                stderr.trim_end().ends_with(&error),
                "the error is not the last line: {}",
                show()
            );
            error.clone()
        }
        Shape::Clap => {
            assert!(stderr.starts_with("error:"), "{}", show());
            stderr
                .split("\nUsage:")
                .next()
                .unwrap()
                .split("\nFor more information")
                .next()
                .unwrap()
                .to_string()
        }
    };
    for needle in needles {
        assert!(
            shown.contains(needle.as_str()),
            "case `{case}`: the error does not name {needle:?}: {}",
            show()
        );
    }
    if code != 0 && code != 1 {
        assert!(
            out.stdout.is_empty(),
            "case `{case}`: output on stdout despite the failure: {}",
            show()
        );
    }
    error
}

// ------------------------------------------------------------------ registry access

/// Body of a plain-HTTP GET on 127.0.0.1:port (the registry answers with Connection: close).
fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect registry");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

fn catalog(registry: &Registry) -> Vec<String> {
    let (code, body) = http_get(registry.port, "/v2/_catalog");
    assert_eq!(code, 200, "GET /v2/_catalog: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

fn tags(registry: &Registry, repo: &str) -> Vec<String> {
    let (code, body) = http_get(registry.port, &format!("/v2/{repo}/tags/list"));
    if code == 404 {
        return Vec::new();
    }
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut tags: Vec<String> = v["tags"]
        .as_array()
        .map(|t| t.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    tags.sort();
    tags
}

/// An image manifest (no layers: verify reads manifests and configs only) for `config`.
fn image_manifest(registry: &Registry, repo: &str, config: &[u8]) -> Vec<u8> {
    let digest = registry.put_blob(repo, config);
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": digest, "size": config.len()},
        "layers": []
    }))
    .unwrap()
}

fn index_of(entries: &[(&[u8], &str)]) -> Vec<u8> {
    let manifests: Vec<Value> = entries
        .iter()
        .map(|(m, arch)| {
            json!({"mediaType": MANIFEST, "digest": sha256_digest(m), "size": m.len(),
                   "platform": {"architecture": arch, "os": "linux"}})
        })
        .collect();
    serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}))
        .unwrap()
}

// --------------------------------------------------------------- project-file table

/// What `-f` points at.
#[derive(Clone, Copy)]
enum FileArg {
    /// `polyarch.yaml` in the case's directory, holding the case's text.
    Written,
    /// The case's directory itself.
    Dir,
    /// A file that does not exist.
    Missing,
}

struct ProjectCase {
    name: &'static str,
    /// `build` or `plan`.
    command: &'static str,
    text: Vec<u8>,
    file: FileArg,
    /// The field path, right after `FILE: ` (empty: the whole file).
    field: &'static str,
    /// More text the error must hold (a value, a line/column, a suggestion).
    also: Vec<&'static str>,
}

/// The valid one-image project for `repository`, with `key: value` lines replaced
/// (`None` removes the key) and `extra` lines appended to the image's settings.
fn project_text(repository: &str, replace: &[(&str, Option<&str>)], extra: &str) -> String {
    let mut lines = vec![
        ("repository", repository.to_string()),
        ("tags", "[v1]".to_string()),
        ("context", ".".to_string()),
        ("platforms", "[linux/amd64]".to_string()),
    ];
    for (key, value) in replace {
        let i = lines.iter().position(|(k, _)| k == key).unwrap();
        match value {
            Some(v) => lines[i].1 = v.to_string(),
            None => {
                lines.remove(i);
            }
        }
    }
    let mut text = String::from("version: 1\nimages:\n  hello:\n");
    for (k, v) in lines {
        text.push_str(&format!("    {k}: {v}\n"));
    }
    text.push_str(extra);
    text
}

#[test]
fn project_file_mistakes_exit_2_with_one_line_naming_file_and_field() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo_path = unique_name("bad/project");
    let repo = registry.repo(&repo_path);
    let r = repo.as_str();
    let p = |replace: &[(&str, Option<&str>)], extra: &str| {
        project_text(r, replace, extra).into_bytes()
    };
    let with_repo = |value: String| project_text(&value, &[], "").into_bytes();
    let long_tag = format!("[{}]", "a".repeat(129));
    let case = |name, text: Vec<u8>, field, also: &[&'static str]| ProjectCase {
        name,
        command: "build",
        text,
        file: FileArg::Written,
        field,
        also: also.to_vec(),
    };

    let mut cases = vec![
        // Unknown keys.
        case(
            "unknown top-level key",
            format!("{}colour: red\n", project_text(r, &[], "")).into_bytes(),
            "colour",
            &["unknown field", "line 8, column 1", "images"],
        ),
        case(
            "image key typo",
            p(&[], "    platfroms: [linux/arm64]\n"),
            "images.hello.platfroms",
            &["unknown field", "did you mean platforms?"],
        ),
        case(
            "image key typo (tag)",
            p(&[], "    tag: [v2]\n"),
            "images.hello.tag",
            &["did you mean tags?"],
        ),
        // Wrong types.
        case(
            "tags is a string",
            p(&[("tags", Some("v1"))], ""),
            "images.hello.tags",
            &["expected a list", "line 5"],
        ),
        case(
            "tags is a number",
            p(&[("tags", Some("5"))], ""),
            "images.hello.tags",
            &["expected a list"],
        ),
        case(
            "platforms is a map",
            p(&[("platforms", Some("{linux: amd64}"))], ""),
            "images.hello.platforms",
            &["expected a list", "found a mapping"],
        ),
        case(
            "platforms is a string",
            p(&[("platforms", Some("linux/amd64"))], ""),
            "images.hello.platforms",
            &["expected a list"],
        ),
        case(
            "build_args value is a list",
            p(&[], "    build_args: {GREETING: [a, b]}\n"),
            "images.hello.build_args.GREETING",
            &["found a list"],
        ),
        case(
            "build_args is a list",
            p(&[], "    build_args: [GREETING=hi]\n"),
            "images.hello.build_args",
            &["expected a mapping"],
        ),
        case(
            "build_args name with =",
            p(&[], "    build_args: {\"A=B\": x}\n"),
            "images.hello.build_args.A=B",
            &["not a build argument name"],
        ),
        case(
            "images is a list",
            b"version: 1\nimages: [hello]\n".to_vec(),
            "images",
            &["expected a mapping"],
        ),
        case(
            "top level is a list",
            b"- version: 1\n".to_vec(),
            "",
            &["not a mapping"],
        ),
        case(
            "version is a word",
            b"version: one\nimages: {}\n".to_vec(),
            "version",
            &["`one`", "version: 1"],
        ),
        case(
            "version is quoted",
            b"version: \"1\"\nimages: {}\n".to_vec(),
            "version",
            &["without quotes"],
        ),
        case(
            "version 2",
            b"version: 2\nimages: {}\n".to_vec(),
            "version",
            &["unsupported version 2"],
        ),
        case(
            "version missing",
            b"images: {}\n".to_vec(),
            "version",
            &["missing"],
        ),
        case(
            "no images",
            b"version: 1\n".to_vec(),
            "images",
            &["no images declared"],
        ),
        // Missing and empty required fields.
        case(
            "missing repository",
            p(&[("repository", None)], ""),
            "images.hello.repository",
            &["missing"],
        ),
        case(
            "missing tags",
            p(&[("tags", None)], ""),
            "images.hello.tags",
            &["missing"],
        ),
        case(
            "missing context",
            p(&[("context", None)], ""),
            "images.hello.context",
            &["missing"],
        ),
        case(
            "missing platforms",
            p(&[("platforms", None)], ""),
            "images.hello.platforms",
            &["missing"],
        ),
        case(
            "image without settings",
            b"version: 1\nimages:\n  hello:\n".to_vec(),
            "images.hello.repository",
            &["missing"],
        ),
        case(
            "empty tags",
            p(&[("tags", Some("[]"))], ""),
            "images.hello.tags",
            &["is empty"],
        ),
        // Tags.
        case(
            "tag starting with -",
            p(&[("tags", Some("[v1, -bad]"))], ""),
            "images.hello.tags[1]",
            &["`-bad`", "not a valid tag"],
        ),
        case(
            "tag with : and uppercase",
            p(&[("tags", Some("[\"UPPER:x\"]"))], ""),
            "images.hello.tags[0]",
            &["`UPPER:x`"],
        ),
        case(
            "tag of 129 characters",
            p(&[("tags", Some(&long_tag))], ""),
            "images.hello.tags[0]",
            &["not a valid tag", "128"],
        ),
        case(
            "tag repeated",
            p(&[("tags", Some("[v1, v1]"))], ""),
            "images.hello.tags[1]",
            &["repeats tags[0]"],
        ),
        // Repository.
        case(
            "repository with a tag",
            with_repo(format!("{r}:v1")),
            "images.hello.repository",
            &["includes a tag", "tags:"],
        ),
        case(
            "repository with a digest",
            with_repo(format!("{r}@sha256:{}", "a".repeat(64))),
            "images.hello.repository",
            &["includes a digest"],
        ),
        case(
            "repository with uppercase",
            with_repo(format!("{}/Demo/Hello", registry.host)),
            "images.hello.repository",
            &["uppercase", "demo/hello"],
        ),
        case(
            "repository with https://",
            with_repo(format!("https://{r}")),
            "images.hello.repository",
            &["https:"],
        ),
        case(
            "repository is only a host",
            with_repo(registry.host.clone()),
            "images.hello.repository",
            &["only a registry host"],
        ),
        case(
            "repository with //",
            with_repo(format!("{}//x", registry.host)),
            "images.hello.repository",
            &["empty path component"],
        ),
        case(
            "repository empty",
            with_repo("\"\"".into()),
            "images.hello.repository",
            &["is empty"],
        ),
        // Platforms.
        case(
            "empty platforms",
            p(&[("platforms", Some("[]"))], ""),
            "images.hello.platforms",
            &["is empty"],
        ),
        case(
            "platform linux/",
            p(&[("platforms", Some("[linux/amd64, linux/]"))], ""),
            "images.hello.platforms[1]",
            &["`linux/`", "empty part"],
        ),
        case(
            "platform /amd64",
            p(&[("platforms", Some("[/amd64]"))], ""),
            "images.hello.platforms[0]",
            &["`/amd64`"],
        ),
        case(
            "platform unknown os",
            p(&[("platforms", Some("[plan10/amd64]"))], ""),
            "images.hello.platforms[0]",
            &["unknown operating system `plan10`"],
        ),
        case(
            "platform with four parts",
            p(&[("platforms", Some("[linux/arm/v7/x]"))], ""),
            "images.hello.platforms[0]",
            &["more than three parts"],
        ),
        case(
            "platform with a space",
            p(&[("platforms", Some("[\"linux/am d64\"]"))], ""),
            "images.hello.platforms[0]",
            &["`linux/am d64`"],
        ),
        case(
            "arm64 and arm64/v8",
            p(&[("platforms", Some("[linux/arm64, linux/arm64/v8]"))], ""),
            "images.hello.platforms[1]",
            &["same platform as platforms[0]", "linux/arm64"],
        ),
        case(
            "arm and arm/v7",
            p(&[("platforms", Some("[linux/arm, linux/arm/v7]"))], ""),
            "images.hello.platforms[1]",
            &["same platform as platforms[0]", "linux/arm/v7"],
        ),
        case(
            "x86_64 and amd64",
            p(&[("platforms", Some("[linux/amd64, linux/x86_64]"))], ""),
            "images.hello.platforms[1]",
            &["same platform as platforms[0]"],
        ),
        // Paths.
        case(
            "missing context dir",
            p(&[("context", Some("no-such-dir"))], ""),
            "images.hello.context",
            &["no-such-dir", "does not exist"],
        ),
        case(
            "context is a file",
            p(&[("context", Some("Dockerfile"))], ""),
            "images.hello.context",
            &["not a directory"],
        ),
        case(
            "missing dockerfile",
            p(&[], "    dockerfile: Nope.Dockerfile\n"),
            "images.hello.dockerfile",
            &["Nope.Dockerfile", "does not exist"],
        ),
        case(
            "absolute dockerfile",
            p(&[], "    dockerfile: /etc/hostname\n"),
            "images.hello.dockerfile",
            &["absolute"],
        ),
        // Enumerations.
        case(
            "image binfmt: sometimes",
            p(&[], "    binfmt: sometimes\n"),
            "images.hello.binfmt",
            &["`sometimes`", "auto, never, require"],
        ),
        case(
            "top-level binfmt: sometimes",
            format!("binfmt: sometimes\n{}", project_text(r, &[], "")).into_bytes(),
            "binfmt",
            &["`sometimes`"],
        ),
        case(
            "network: bridge0",
            p(&[], "    network: bridge0\n"),
            "images.hello.network",
            &["`bridge0`", "default, host, none"],
        ),
        case(
            "target with a space",
            p(&[], "    target: \"a b\"\n"),
            "images.hello.target",
            &["whitespace"],
        ),
        case(
            "builder for a bad platform",
            format!(
                "builders: {{\"linux/\": unix:///x.sock}}\n{}",
                project_text(r, &[], "")
            )
            .into_bytes(),
            "builders.linux/",
            &["empty part"],
        ),
        case(
            "builder endpoint empty",
            format!(
                "builders: {{linux/arm64: \"\"}}\n{}",
                project_text(r, &[], "")
            )
            .into_bytes(),
            "builders.linux/arm64",
            &["is empty"],
        ),
        case(
            "image name uppercase",
            project_text(r, &[], "")
                .replace("  hello:", "  Hello:")
                .into_bytes(),
            "images.Hello",
            &["not a valid image name", "`hello`"],
        ),
        case(
            "key given twice",
            p(&[], "    tags: [v2]\n"),
            "images.hello.tags",
            &["given twice"],
        ),
        // YAML syntax.
        case(
            "unclosed bracket",
            p(&[("platforms", Some("[linux/amd64"))], ""),
            "",
            &["YAML syntax error at line 8, column 1"],
        ),
        case(
            "tab indentation",
            project_text(r, &[], "")
                .replace("    tags:", "\ttags:")
                .into_bytes(),
            "",
            &["YAML syntax error at line 5, column 1"],
        ),
        case(
            "unclosed quote",
            p(&[], "    target: \"abc\n"),
            "",
            &["YAML syntax error at line 9, column 1", "quoted scalar"],
        ),
        case(
            "two documents",
            format!("{}---\nversion: 1\n", project_text(r, &[], "")).into_bytes(),
            "",
            &["more than one document"],
        ),
        case("empty file", Vec::new(), "", &["the file is empty"]),
        case(
            "only comments",
            b"# nothing yet\n".to_vec(),
            "",
            &["the file is empty"],
        ),
        case(
            "not UTF-8",
            {
                let mut t = project_text(r, &[], "").into_bytes();
                t.extend_from_slice(b"    target: caf\xe9\n");
                t
            },
            "",
            &["not UTF-8", "offset"],
        ),
        // Secrets, SSH agents, registry cache, pull and no_cache.
        case(
            "secret with file and env",
            p(&[], "    secrets: {token: {file: t.txt, env: TOKEN}}\n"),
            "images.hello.secrets.token",
            &["both file and env"],
        ),
        case(
            "secret with neither file nor env",
            p(&[], "    secrets: {token: {}}\n"),
            "images.hello.secrets.token",
            &["neither file nor env", "{env: VARIABLE}"],
        ),
        case(
            "secret key typo",
            p(&[], "    secrets: {token: {evn: TOKEN}}\n"),
            "images.hello.secrets.token.evn",
            &["did you mean env?"],
        ),
        case(
            "secrets as a list",
            p(&[], "    secrets: [token]\n"),
            "images.hello.secrets",
            &["expected a mapping", "secrets: {token: {env: API_TOKEN}"],
        ),
        case(
            "secret id with a comma",
            p(&[], "    secrets: {\"a,b\": {env: TOKEN}}\n"),
            "images.hello.secrets.a,b",
            &["not a secret id"],
        ),
        case(
            "secret env with a space",
            p(&[], "    secrets: {token: {env: \"API TOKEN\"}}\n"),
            "images.hello.secrets.token.env",
            &["not an environment variable name"],
        ),
        case(
            "secret from an unset variable",
            p(
                &[],
                "    secrets: {token: {env: POLYARCH_BAD_INPUT_UNSET_VARIABLE}}\n",
            ),
            "images.hello.secrets.token.env",
            &["POLYARCH_BAD_INPUT_UNSET_VARIABLE is not set", "export it"],
        ),
        case(
            "secret from a missing file",
            p(&[], "    secrets: {npmrc: {file: no-such.npmrc}}\n"),
            "images.hello.secrets.npmrc.file",
            &["no-such.npmrc does not exist"],
        ),
        case(
            "secret from a directory",
            p(&[], "    secrets: {npmrc: {file: bin}}\n"),
            "images.hello.secrets.npmrc.file",
            &["not a regular file"],
        ),
        case(
            "ssh as a string",
            p(&[], "    ssh: default\n"),
            "images.hello.ssh",
            &["expected a list", "ssh: [default]"],
        ),
        case(
            "ssh id twice",
            p(&[], "    ssh: [default, \"default=/tmp/x.sock\"]\n"),
            "images.hello.ssh[1]",
            &["again", "ssh[0]"],
        ),
        case(
            "ssh socket that does not exist",
            p(&[], "    ssh: [\"work=no-agent.sock\"]\n"),
            "images.hello.ssh[0]",
            &["no-agent.sock does not exist", "ssh-agent"],
        ),
        case(
            "ssh key file instead of a socket",
            p(&[], "    ssh: [\"work=Dockerfile\"]\n"),
            "images.hello.ssh[0]",
            &["not an SSH agent socket", "ssh-add"],
        ),
        case(
            "cache.from is a string",
            p(&[], "    cache: {from: 127.0.0.1:5000/c:cache}\n"),
            "images.hello.cache.from",
            &["expected a list"],
        ),
        case(
            "cache key typo",
            p(&[], "    cache: {too: 127.0.0.1:5000/c:cache}\n"),
            "images.hello.cache.too",
            &["did you mean to?"],
        ),
        case(
            "cache.to with a digest",
            p(&[], "    cache: {to: \"127.0.0.1:5000/c@sha256:0000000000000000000000000000000000000000000000000000000000000000\"}\n"),
            "images.hello.cache.to",
            &["names a digest", "a cache is a tag"],
        ),
        case(
            "cache.from uppercase",
            p(&[], "    cache: {from: [\"127.0.0.1:5000/Cache:x\"]}\n"),
            "images.hello.cache.from[0]",
            &["not an image reference", "uppercase"],
        ),
        case(
            "pull: yes",
            p(&[], "    pull: yes\n"),
            "images.hello.pull",
            &["`yes` is not a boolean", "pull: true"],
        ),
        case(
            "no_cache: 1",
            p(&[], "    no_cache: 1\n"),
            "images.hello.no_cache",
            &["`1` is not a boolean"],
        ),
    ];
    cases.push(ProjectCase {
        name: "-f is a directory",
        command: "build",
        text: Vec::new(),
        file: FileArg::Dir,
        field: "",
        also: vec!["is a directory"],
    });
    cases.push(ProjectCase {
        name: "-f names a missing file",
        command: "build",
        text: Vec::new(),
        file: FileArg::Missing,
        field: "",
        also: vec!["no such file"],
    });
    // `plan` validates the same way and builds nothing.
    cases.push(ProjectCase {
        name: "plan: image key typo",
        command: "plan",
        text: p(&[], "    platfroms: [linux/arm64]\n"),
        file: FileArg::Written,
        field: "images.hello.platfroms",
        also: vec!["did you mean platforms?"],
    });
    cases.push(ProjectCase {
        name: "plan: duplicate platform",
        command: "plan",
        text: p(&[("platforms", Some("[linux/arm64, linux/arm64/v8]"))], ""),
        file: FileArg::Written,
        field: "images.hello.platforms[1]",
        also: vec!["same platform"],
    });
    cases.push(ProjectCase {
        name: "plan: missing dockerfile",
        command: "plan",
        text: p(&[], "    dockerfile: Nope.Dockerfile\n"),
        file: FileArg::Written,
        field: "images.hello.dockerfile",
        also: vec![],
    });
    cases.push(ProjectCase {
        name: "plan: -f is a directory",
        command: "plan",
        text: Vec::new(),
        file: FileArg::Dir,
        field: "",
        also: vec!["is a directory"],
    });

    // Sanity: the base project is valid (plan accepts it), so each case fails for its own reason.
    let base = dir.path().join("polyarch.yaml");
    std::fs::write(&base, project_text(r, &[], "")).unwrap();
    let out = run(polyarch().args(["plan", "-f"]).arg(&base));
    assert_eq!(
        out.status.code(),
        Some(0),
        "base project: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    for c in &cases {
        let file = match c.file {
            FileArg::Written => {
                std::fs::write(&base, &c.text).unwrap();
                base.clone()
            }
            FileArg::Dir => dir.path().to_path_buf(),
            FileArg::Missing => dir.path().join("missing.yaml"),
        };
        let out = run(polyarch().arg(c.command).arg("-f").arg(&file));
        let mut needles = vec![file.display().to_string()];
        needles.extend(c.also.iter().map(|s| s.to_string()));
        let error = check(c.name, &out, 2, Shape::Alone, &needles);
        eprintln!("{}: {error}", c.name);
        let prefix = if c.field.is_empty() {
            format!("error: {}: ", file.display())
        } else {
            format!("error: {}: {}: ", file.display(), c.field)
        };
        assert!(
            error.starts_with(&prefix),
            "case `{}`: expected the error to start with {prefix:?}: {error}",
            c.name
        );
        assert!(
            catalog(&registry).is_empty(),
            "case `{}`: something was pushed: {:?}",
            c.name,
            catalog(&registry)
        );
    }
    assert!(tags(&registry, &repo_path).is_empty());
}

// ---------------------------------------------------------------- command-line table

struct CliCase {
    name: &'static str,
    args: Vec<String>,
    shape: Shape,
    /// Text the error must hold (the flag, the value, the reference).
    needles: Vec<String>,
}

#[test]
fn bad_command_lines_exit_2_with_one_line_naming_the_flag() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo_path = unique_name("bad/cli");
    let repo = registry.repo(&repo_path);
    let file = write_project(dir.path(), &repo, "[v1]", "[linux/amd64]");
    let f = file.display().to_string();
    let layout = dir.path().join("layout").display().to_string();
    std::fs::write(dir.path().join("garbage.json"), "not json\n").unwrap();
    std::fs::write(dir.path().join("empty-object.json"), "{}\n").unwrap();
    std::fs::write(dir.path().join("deploy.yaml"), "kind: Pod\n").unwrap();
    let garbage = dir.path().join("garbage.json").display().to_string();
    let empty_object = dir.path().join("empty-object.json").display().to_string();
    let deploy = dir.path().join("deploy.yaml").display().to_string();
    let host = registry.host.clone();

    let c = |name, args: &[&str], shape, needles: &[&str]| CliCase {
        name,
        args: args.iter().map(|s| s.to_string()).collect(),
        shape,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    };
    let short_digest = format!("{repo}@sha256:abc");
    let upper_path = format!("{host}/UPPER/x:y");
    let bad_tag = format!("{repo}:-bad");
    let missing_secret = format!("id=t,src={}", dir.path().join("no-such-secret").display());
    let missing_socket = format!("work={}", dir.path().join("no-agent.sock").display());
    let short_digest_cache = format!("{repo}@sha256:{}", "0".repeat(64));
    let two = dir.path().join("two.yaml");
    std::fs::write(
        &two,
        format!(
            "version: 1\nimages:\n  one:\n    repository: {repo}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n  two:\n    repository: {repo}-two\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n"
        ),
    )
    .unwrap();
    let two = two.display().to_string();
    let cases = vec![
        c(
            "--username without --password-stdin",
            &["build", "-f", &f, "--username", "u"],
            Shape::Clap,
            &["--password-stdin"],
        ),
        c(
            "--password-stdin without --username",
            &["build", "-f", &f, "--password-stdin"],
            Shape::Clap,
            &["--username"],
        ),
        c(
            "--password-stdin with empty stdin",
            &["build", "-f", &f, "--username", "u", "--password-stdin"],
            Shape::Alone,
            &["--password-stdin", "empty"],
        ),
        c(
            "--push-by-digest with --output",
            &[
                "build",
                "-f",
                &f,
                "--push-by-digest",
                "--output",
                &format!("oci:{layout}"),
            ],
            Shape::Alone,
            &["--push-by-digest", "--output"],
        ),
        c(
            "--output without oci:",
            &["build", "-f", &f, "--output", &layout],
            Shape::Alone,
            &["--output", "oci:DIR"],
        ),
        c(
            "--output oci:DIR:TAG",
            &["build", "-f", &f, "--output", &format!("oci:{layout}:v1")],
            Shape::Alone,
            &["--output", "oci:DIR"],
        ),
        c(
            "--platform malformed",
            &["build", "-f", &f, "--platform", "linux/"],
            Shape::Clap,
            &["--platform", "`linux/`"],
        ),
        c(
            "--platform not declared",
            &["build", "-f", &f, "--platform", "linux/arm64"],
            Shape::Alone,
            &["--platform linux/arm64", "not declared", &f],
        ),
        c(
            "image not declared",
            &["build", "-f", &f, "nosuch"],
            Shape::Alone,
            &["`nosuch`", &f],
        ),
        c(
            "--binfmt bad mode",
            &["build", "-f", &f, "--binfmt", "sometimes"],
            Shape::Clap,
            &["--binfmt", "sometimes"],
        ),
        c(
            "--output-format yaml",
            &["build", "-f", &f, "--output-format", "yaml"],
            Shape::Clap,
            &["--output-format", "yaml"],
        ),
        c(
            "-j not a number",
            &["build", "-f", &f, "-j", "two"],
            Shape::Clap,
            &["--jobs", "two"],
        ),
        c(
            "-j 0",
            &["build", "-f", &f, "-j", "0"],
            Shape::Clap,
            &["--jobs", "0"],
        ),
        c(
            "unknown flag",
            &["build", "-f", &f, "--frobnicate"],
            Shape::Clap,
            &["--frobnicate"],
        ),
        c(
            "verify without REFERENCE or -f",
            &["verify"],
            Shape::Clap,
            &["<REFERENCE|IMAGE>", "--platform"],
        ),
        c(
            "verify REFERENCE without --platform",
            &["verify", &format!("{repo}:v1")],
            Shape::Clap,
            &["--platform"],
        ),
        c(
            "verify -f with --platform",
            &["verify", "-f", &f, "--platform", "linux/amd64"],
            Shape::Clap,
            &["--file", "--platform"],
        ),
        c(
            "verify two references",
            &[
                "verify",
                &format!("{repo}:v1"),
                &format!("{repo}:v2"),
                "--platform",
                "linux/amd64",
            ],
            Shape::Alone,
            &["one REFERENCE"],
        ),
        c(
            "verify short digest",
            &["verify", &short_digest, "--platform", "linux/amd64"],
            Shape::Alone,
            &[&short_digest, "not an image reference"],
        ),
        c(
            "verify uppercase path",
            &["verify", &upper_path, "--platform", "linux/amd64"],
            Shape::Alone,
            &[&upper_path, "not an image reference"],
        ),
        c(
            "verify tag starting with -",
            &["verify", &bad_tag, "--platform", "linux/amd64"],
            Shape::Alone,
            &[&bad_tag, "not an image reference"],
        ),
        c(
            "verify bad --platform",
            &[
                "verify",
                &format!("{repo}:v1"),
                "--platform",
                "linux/amd64,plan10/x",
            ],
            Shape::Clap,
            &["--platform", "plan10"],
        ),
        c(
            "verify oci: dir that is no layout",
            &[
                "verify",
                &format!("oci:{layout}"),
                "--platform",
                "linux/amd64",
            ],
            Shape::Alone,
            &[&layout, "not an OCI image layout"],
        ),
        c(
            "verify -f unknown image",
            &["verify", "-f", &f, "nosuch"],
            Shape::Alone,
            &["`nosuch`", &f],
        ),
        c(
            "gate without --nodes",
            &["gate", "--manifests", &deploy],
            Shape::Clap,
            &["--nodes"],
        ),
        c(
            "gate without --manifests",
            &["gate", "--nodes", &deploy],
            Shape::Clap,
            &["--manifests"],
        ),
        c(
            "assemble without parts",
            &["assemble", "-f", &f],
            Shape::Clap,
            &["<PART>"],
        ),
        c(
            "assemble part that is not JSON",
            &["assemble", "-f", &f, &garbage],
            Shape::Alone,
            &[&garbage, "not a polyarch part record"],
        ),
        c(
            "assemble part that is {}",
            &["assemble", "-f", &f, &empty_object],
            Shape::Alone,
            &[&empty_object, "schema"],
        ),
        c(
            "schema of nothing",
            &["schema", "nothing"],
            Shape::Clap,
            &["nothing"],
        ),
        c(
            "completions for tcsh",
            &["completions", "tcsh"],
            Shape::Clap,
            &["tcsh"],
        ),
        c(
            "unknown subcommand",
            &["frobnicate"],
            Shape::Clap,
            &["frobnicate"],
        ),
        c(
            "--secret without id",
            &["build", "-f", &f, "--secret", "env=TOKEN"],
            Shape::Clap,
            &["--secret", "env=TOKEN", "no id"],
        ),
        c(
            "--secret with an unknown key",
            &["build", "-f", &f, "--secret", "id=t,colour=red"],
            Shape::Clap,
            &["--secret", "unknown key `colour`"],
        ),
        c(
            "--secret with src and env",
            &["build", "-f", &f, "--secret", "id=t,src=a,env=B"],
            Shape::Clap,
            &["--secret", "both src and env"],
        ),
        c(
            "--secret from an unset variable",
            &[
                "build",
                "-f",
                &f,
                "--secret",
                "id=t,env=POLYARCH_BAD_INPUT_UNSET_VARIABLE",
            ],
            Shape::Alone,
            &[
                "--secret id=t,env=POLYARCH_BAD_INPUT_UNSET_VARIABLE:",
                "is not set",
            ],
        ),
        c(
            "--secret from a missing file",
            &["build", "-f", &f, "--secret", &missing_secret],
            Shape::Alone,
            &[&format!("--secret {missing_secret}:"), "does not exist"],
        ),
        c(
            "--ssh with two paths",
            &["build", "-f", &f, "--ssh", "work=a.sock,b.sock"],
            Shape::Clap,
            &["--ssh", "several paths"],
        ),
        c(
            "--ssh socket that does not exist",
            &["build", "-f", &f, "--ssh", &missing_socket],
            Shape::Alone,
            &[&format!("--ssh {missing_socket}:"), "does not exist"],
        ),
        c(
            "--cache-to with a digest",
            &["build", "-f", &f, "--cache-to", &short_digest_cache],
            Shape::Clap,
            &["--cache-to", "names a digest"],
        ),
        c(
            "--cache-from uppercase",
            &["build", "-f", &f, "--cache-from", &upper_path],
            Shape::Clap,
            &["--cache-from", "not an image reference"],
        ),
        c(
            "--cache-to for two images",
            &["build", "-f", &two, "--cache-to", &format!("{repo}:cache")],
            Shape::Alone,
            &["--cache-to", "2 images", "overwrite each other's cache"],
        ),
        c("no subcommand", &[], Shape::Clap, &[]),
    ];
    for case in &cases {
        let out = run(polyarch()
            .args(&case.args)
            .env("DOCKER_CONFIG", dir.path().join("no-docker-config"))
            .env("POLYARCH_RETRY_BASE_MS", "50")
            .env_remove("CI"));
        // `polyarch` with no subcommand prints help on stderr and exits 2: no `error:` line.
        if case.args.is_empty() {
            assert_eq!(out.status.code(), Some(2), "case `{}`", case.name);
            assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
            continue;
        }
        let error = check(case.name, &out, 2, case.shape, &case.needles);
        eprintln!("{}: {error}", case.name);
        assert!(
            catalog(&registry).is_empty(),
            "case `{}`: something was pushed: {:?}",
            case.name,
            catalog(&registry)
        );
    }
    assert!(
        !Path::new(&layout).join("index.json").exists(),
        "a layout was written"
    );
}

// ------------------------------------------------------------------ registry table

struct Crafted {
    repo: String,
    /// Digest of the index tagged `v1`.
    index: String,
    /// The linux/amd64 image manifest (bytes and digest).
    manifest: Vec<u8>,
    manifest_digest: String,
    config_digest: String,
}

/// `REPO:v1` = an index with one linux/amd64 entry, pushed with curl (no engine needed).
fn craft(registry: &Registry) -> Crafted {
    let repo = unique_name("bad/answers");
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap();
    let manifest = image_manifest(registry, &repo, &config);
    let manifest_digest =
        registry.put_manifest(&repo, &sha256_digest(&manifest), &manifest, MANIFEST);
    let index = registry.put_manifest(&repo, "v1", &index_of(&[(&manifest, "amd64")]), INDEX);
    Crafted {
        repo,
        index,
        manifest,
        manifest_digest,
        config_digest: sha256_digest(&config),
    }
}

struct AnswerCase {
    name: &'static str,
    /// The reference to verify, through the proxy.
    reference: String,
    rule: Option<Rule>,
    code: i32,
    needles: Vec<String>,
}

#[test]
fn registry_answers_that_are_not_what_was_asked_for_exit_3_naming_the_reference() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let crafted = craft(&registry);
    let repo = &crafted.repo;
    let tag_ref = format!("{}:v1", proxy.repo(repo));
    let digest_ref = format!("{}@{}", proxy.repo(repo), crafted.index);

    // Also stored in the registry: a tag whose entry's config blob is not JSON.
    let garbage_config = image_manifest(&registry, repo, b"not json");
    registry.put_manifest(
        repo,
        &sha256_digest(&garbage_config),
        &garbage_config,
        MANIFEST,
    );
    registry.put_manifest(
        repo,
        "garbage-config",
        &index_of(&[(&garbage_config, "amd64")]),
        INDEX,
    );
    let before = tags(&registry, repo);
    assert_eq!(before, ["garbage-config", "v1"]);

    let tag_path = format!("/v2/{repo}/manifests/v1");
    let rule = |path: &str, fault: Fault| Some(Rule::new("GET", path, fault).always());
    let case = |name, reference: &str, rule, code, needles: &[&str]| AnswerCase {
        name,
        reference: reference.to_string(),
        rule,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    };
    let manifest_path = format!("/manifests/{}", crafted.manifest_digest);
    let not_json = sha256_digest(b"not json");
    let config_path = format!("/blobs/{}", crafted.config_digest);
    let cases = vec![
        case(
            "baseline: the crafted index verifies",
            &tag_ref,
            None,
            0,
            &[],
        ),
        case("baseline: by digest", &digest_ref, None, 0, &[]),
        case(
            "index answered 200 `not json` as an OCI index",
            &tag_ref,
            rule(&tag_path, Fault::respond(200, INDEX, "not json")),
            3,
            &[&tag_ref, "not valid JSON"],
        ),
        case(
            "index answered 200 with an HTML page",
            &tag_ref,
            rule(
                &tag_path,
                Fault::respond(
                    200,
                    "text/html",
                    "<html><body>Sign in to the Wi-Fi</body></html>",
                ),
            ),
            3,
            &[&tag_ref],
        ),
        case(
            "index answered 200 with an empty body",
            &tag_ref,
            rule(&tag_path, Fault::respond(200, INDEX, "")),
            3,
            &[&tag_ref],
        ),
        case(
            "index answered 200 with a JSON array",
            &tag_ref,
            rule(&tag_path, Fault::respond(200, INDEX, "[1, 2, 3]")),
            3,
            &[&tag_ref],
        ),
        case(
            "index answered 404 with a body that is not JSON",
            &tag_ref,
            rule(
                &tag_path,
                Fault::respond(404, "text/plain", "404 page not found\n"),
            ),
            3,
            &[&tag_ref, "404"],
        ),
        case(
            "index answered 500 with HTML, every time",
            &tag_ref,
            rule(
                &tag_path,
                Fault::respond(
                    500,
                    "text/html",
                    "<h1>Internal Server Error</h1>\n<p>oops</p>",
                ),
            ),
            3,
            &[&tag_ref, "500"],
        ),
        case(
            "digest reference answered with another manifest",
            &digest_ref,
            rule(
                &format!("/manifests/{}", crafted.index),
                Fault::Respond {
                    code: 200,
                    content_type: MANIFEST.into(),
                    body: crafted.manifest.clone(),
                },
            ),
            3,
            // Both digests: the one asked for and the one of what came back.
            &[&crafted.index, &crafted.manifest_digest],
        ),
        case(
            "index body cut after 20 bytes",
            &tag_ref,
            rule(&tag_path, Fault::DropResponse { after_bytes: 20 }),
            3,
            &[&tag_ref],
        ),
        case(
            "index body cut after 0 bytes",
            &tag_ref,
            rule(&tag_path, Fault::DropResponse { after_bytes: 0 }),
            3,
            &[&tag_ref],
        ),
        case(
            "entry manifest answered `not json`",
            &tag_ref,
            rule(&manifest_path, Fault::respond(200, MANIFEST, "not json")),
            3,
            &[&crafted.manifest_digest, &not_json],
        ),
        case(
            "entry manifest body cut",
            &tag_ref,
            rule(&manifest_path, Fault::DropResponse { after_bytes: 10 }),
            3,
            &[&crafted.manifest_digest],
        ),
        case(
            "config blob answered `not json`",
            &tag_ref,
            rule(
                &config_path,
                Fault::respond(200, "application/octet-stream", "not json"),
            ),
            3,
            &[&crafted.config_digest, &not_json],
        ),
        case(
            "config blob body cut",
            &tag_ref,
            rule(&config_path, Fault::DropResponse { after_bytes: 5 }),
            3,
            &[&crafted.config_digest],
        ),
    ];
    for c in &cases {
        proxy.clear();
        let seen = proxy.log().len();
        if let Some(rule) = &c.rule {
            proxy.add(rule.clone());
        }
        let out = run(polyarch()
            .args(["verify", &c.reference, "--platform", "linux/amd64"])
            .env("POLYARCH_RETRY_BASE_MS", "20"));
        if c.code == 0 {
            assert_eq!(
                out.status.code(),
                Some(0),
                "case `{}`: {}",
                c.name,
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let error = check(c.name, &out, c.code, Shape::AfterProgress, &c.needles);
            eprintln!("{}: {error}", c.name);
        }
        if c.rule.is_some() {
            assert!(
                proxy.log()[seen..].iter().any(|l| !l.ends_with("-> None")),
                "case `{}`: the fault never applied: {:#?}",
                c.name,
                proxy.log()
            );
        }
        assert_eq!(
            tags(&registry, repo),
            before,
            "case `{}`: tags changed",
            c.name
        );
        assert_eq!(
            catalog(&registry),
            std::slice::from_ref(repo),
            "case `{}`",
            c.name
        );
    }
    proxy.clear();

    // A config blob that really is not JSON (its digest is right): not a registry failure
    // but an image that cannot say what it runs on, so the entry is a gap (exit 1).
    let reference = format!("{}:garbage-config", proxy.repo(repo));
    let out = run(polyarch().args([
        "verify",
        &reference,
        "--platform",
        "linux/amd64",
        "--output-format",
        "json",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("error:"),
        "{stderr}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("record on stdout");
    let image = &record["images"][0];
    assert_eq!(image["covered"], false, "{record}");
    assert!(
        image["warnings"].to_string().contains("not valid JSON"),
        "no warning about the config: {record}"
    );
    assert_eq!(tags(&registry, repo), before);
}

// ------------------------------------------------------------- defects (ignored)

/// Runs `polyarch ARGS` and asserts exit 2 with one line naming `needles`.
fn assert_usage_error(case: &str, cmd: &mut Command, needles: &[String]) {
    let out = run(cmd.env("POLYARCH_RETRY_BASE_MS", "20"));
    check(case, &out, 2, Shape::Alone, needles);
}

#[test]
fn platforms_that_are_not_os_arch_are_refused() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    // A context every platform can build from (COPY of a fixed path), so an accepted
    // platform really gets pushed.
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY bin/amd64/busybox /bin/busybox\n",
    )
    .unwrap();
    for platform in ["linux", "linux/foo", "linux/arm/v9"] {
        let repo_path = unique_name("bad/platform");
        let file = write_project(
            dir.path(),
            &registry.repo(&repo_path),
            "[v1]",
            &format!("[{platform}]"),
        );
        assert_usage_error(
            platform,
            polyarch().args(["build", "-f"]).arg(&file),
            &[
                file.display().to_string(),
                "images.hello.platforms[0]".into(),
                format!("`{platform}`"),
            ],
        );
        assert!(tags(&registry, &repo_path).is_empty(), "{platform}: pushed");
    }
}

#[test]
fn repository_with_a_scheme_names_the_scheme() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = write_project(
        dir.path(),
        "https://127.0.0.1:5000/x",
        "[v1]",
        "[linux/amd64]",
    );
    assert_usage_error(
        "scheme",
        polyarch().args(["plan", "-f"]).arg(&file),
        &[
            "images.hello.repository".into(),
            "https://".into(),
            "127.0.0.1:5000/x".into(),
        ],
    );
}

#[test]
fn project_file_with_a_utf8_bom_is_read() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = write_project(dir.path(), "127.0.0.1:5000/x", "[v1]", "[linux/amd64]");
    let mut text = b"\xef\xbb\xbf".to_vec();
    text.extend(std::fs::read(&file).unwrap());
    std::fs::write(&file, text).unwrap();
    let out = run(polyarch().args(["plan", "-f"]).arg(&file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn verify_refuses_an_uppercase_repository_without_a_host() {
    assert_usage_error(
        "UPPER/x:y",
        polyarch().args(["verify", "UPPER/x:y", "--platform", "linux/amd64"]),
        &["`UPPER/x:y`".into(), "not an image reference".into()],
    );
}

#[test]
fn missing_input_files_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = write_project(dir.path(), "127.0.0.1:5000/x", "[v1]", "[linux/amd64]");
    let missing: PathBuf = dir.path().join("part-missing.json");
    assert_usage_error(
        "assemble missing part",
        polyarch().args(["assemble", "-f"]).arg(&file).arg(&missing),
        &[missing.display().to_string()],
    );
    let nodes = dir.path().join("nodes.yaml");
    std::fs::write(&nodes, "pools: []\n").unwrap();
    assert_usage_error(
        "gate missing manifests",
        polyarch()
            .args(["gate", "--manifests"])
            .arg(&missing)
            .arg("--nodes")
            .arg(&nodes),
        &[missing.display().to_string()],
    );
}

/// One cut response for `path_contains`, then normal answers: verify of `REPO:v1` must
/// retry and pass (the README: connection errors are retried, 5 attempts).
fn verify_after_one_cut_answer(what: &str) -> Output {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let crafted = craft(&registry);
    let path = match what {
        "index" => format!("/v2/{}/manifests/v1", crafted.repo),
        "entry" => format!("/manifests/{}", crafted.manifest_digest),
        "config" => format!("/blobs/{}", crafted.config_digest),
        other => panic!("{other}"),
    };
    proxy.add(Rule::new(
        "GET",
        &path,
        Fault::DropResponse { after_bytes: 5 },
    ));
    let out = run(polyarch()
        .args([
            "verify",
            &format!("{}:v1", proxy.repo(&crafted.repo)),
            "--platform",
            "linux/amd64",
        ])
        .env("POLYARCH_RETRY_BASE_MS", "20"));
    assert!(
        proxy.log().iter().any(|l| l.contains("DropResponse")),
        "{what}: the fault never applied: {:#?}",
        proxy.log()
    );
    out
}

#[test]
fn one_cut_manifest_answer_is_retried() {
    for what in ["index", "entry"] {
        let out = verify_after_one_cut_answer(what);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn one_cut_config_blob_answer_is_retried() {
    let out = verify_after_one_cut_answer("config");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ssh_default_without_an_agent_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = dir.path().join("polyarch.yaml");
    std::fs::write(
        &file,
        project_text("127.0.0.1:5000/x", &[], "    ssh: [default]\n"),
    )
    .unwrap();
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .env_remove("SSH_AUTH_SOCK"));
    let error = check(
        "ssh: [default] without an agent",
        &out,
        2,
        Shape::Alone,
        &[
            format!("{}: images.hello.ssh[0]:", file.display()),
            "SSH_AUTH_SOCK is not set".into(),
        ],
    );
    eprintln!("{error}");
    let plain = write_project(dir.path(), "127.0.0.1:5000/x", "[v1]", "[linux/amd64]");
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&plain)
        .args(["--ssh", "default"])
        .env_remove("SSH_AUTH_SOCK"));
    check(
        "--ssh default without an agent",
        &out,
        2,
        Shape::Alone,
        &["--ssh default:".into(), "SSH_AUTH_SOCK is not set".into()],
    );
}

// ------------------------------------------------------------------ hostile input

/// ESC, BEL and CR as a registry may serve them: an OSC that retitles the terminal, a
/// screen clear, and a carriage return that would overwrite the line.
const HOSTILE: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\r";

#[test]
fn registry_values_with_terminal_escapes_are_printed_escaped_and_recorded_as_they_are() {
    let registry = Registry::start();
    let repo = unique_name("bad/escapes");
    let entrypoint = format!("/bin/app{HOSTILE}");
    let config = serde_json::to_vec(&json!({
        "architecture": "arm64", "os": "linux", "variant": format!("v8{HOSTILE}"),
        "config": {"Entrypoint": [entrypoint]},
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap();
    let manifest = image_manifest(&registry, &repo, &config);
    registry.put_manifest(&repo, &sha256_digest(&manifest), &manifest, MANIFEST);
    let odd = format!("application/x-odd{HOSTILE}");
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
        {"mediaType": MANIFEST, "digest": sha256_digest(&manifest), "size": manifest.len(),
         "platform": {"architecture": "arm64", "os": "linux", "variant": format!("v8{HOSTILE}")}},
        // The registry takes any media type for a manifest it holds.
        {"mediaType": odd, "digest": sha256_digest(&manifest), "size": manifest.len()},
    ]});
    registry.put_manifest(&repo, "v1", &serde_json::to_vec(&index).unwrap(), INDEX);
    let reference = registry.repo(&format!("{repo}:v1"));
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record.json");
    let verify = |format: &str| {
        run(polyarch()
            .args(["verify", &reference, "--platform", "linux/arm64", "--deep"])
            .args(["--output-format", format, "--record"])
            .arg(&record)
            .env("DOCKER_CONFIG", dir.path().join("no-docker-config"))
            .env_remove("CI"))
    };
    for format in ["text", "markdown"] {
        let out = verify(format);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        eprintln!("--- {format}\n{stdout}{stderr}");
        for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
            assert!(
                !text.contains(['\u{1b}', '\u{7}', '\r']),
                "{format}: a raw control byte on {name}: {text:?}"
            );
        }
        // What was there is still shown, escaped.
        assert!(stdout.contains("\\u{1b}"), "{format}: {stdout}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // The record keeps each value as served (a variant lowercased, as containerd
    // normalises platforms), control characters included.
    let text = std::fs::read_to_string(&record).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    let strings = all_strings(&value);
    let variant = format!("v8{HOSTILE}").to_lowercase();
    for original in [&odd, &entrypoint, &variant] {
        assert!(
            strings.iter().any(|s| s.contains(original.as_str())),
            "{original:?} not kept in the record: {text}"
        );
    }
}

fn all_strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(all_strings).collect(),
        Value::Object(map) => map.values().flat_map(all_strings).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn nesting_beyond_the_limits_is_refused_at_once_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let deep = 100_000;
    let defaults = "${A:-".repeat(20_000) + "x" + &"}".repeat(20_000);
    let project = |tags: &str| {
        format!("version: 1\nimages:\n  api:\n    repository: localhost:5000/api\n    tags: {tags}\n    platforms: [linux/amd64]\n")
    };
    let pools = write(
        "pools.yaml",
        "pools:\n- {name: general, labels: {kubernetes.io/os: linux, kubernetes.io/arch: amd64}}\n"
            .into(),
    );
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: r.example/app:1\n    args: ";
    let cases = [
        (
            "project file: ${A:-…} nested 20,000 deep",
            write("interpolation.yaml", project(&format!("[\"{defaults}\"]"))),
            vec![
                "interpolation.yaml",
                "images.api.tags[0]",
                "nest more than 32 deep",
            ],
        ),
        (
            "project file: flow nested 100,000 deep",
            write(
                "flow.yaml",
                project(&("[".repeat(deep) + &"]".repeat(deep))),
            ),
            vec!["flow.yaml", "more than 256 levels deep at line 5"],
        ),
        (
            "project file: block sequences nested 100,000 deep",
            write("block.yaml", project(&format!("\n{}x", "- ".repeat(deep)))),
            vec!["block.yaml", "more than 256 levels deep at line 6"],
        ),
        (
            "gate manifest: flow nested 100,000 deep",
            write("pod-flow.yaml", format!("{pod}{}", "{a: ".repeat(deep))),
            vec!["pod-flow.yaml", "more than 256 levels deep at line 8"],
        ),
        (
            "gate manifest: block sequences nested 100,000 deep",
            write("pod-block.yaml", format!("{pod}\n{}x", "  - ".repeat(deep))),
            vec!["pod-block.yaml", "more than 256 levels deep at line 9"],
        ),
    ];
    for (case, file, needles) in cases {
        let mut cmd = polyarch();
        if case.starts_with("gate") {
            cmd.args(["gate", "--manifests"])
                .arg(&file)
                .arg("--nodes")
                .arg(&pools);
        } else {
            cmd.args(["plan", "-f"]).arg(&file);
        }
        let started = std::time::Instant::now();
        let out = run(cmd.env_remove("CI"));
        let took = started.elapsed();
        let needles: Vec<String> = needles.into_iter().map(String::from).collect();
        let error = check(case, &out, 2, Shape::Alone, &needles);
        eprintln!("{case}: {took:?}: {error}");
        // Was a stack overflow (abort) and 16–90 s of CPU.
        assert!(took < Duration::from_secs(2), "{case}: took {took:?}");
    }
}

#[test]
fn a_project_file_fifty_levels_deep_is_read_past_the_nesting_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("polyarch.yaml");
    let labels = (0..50)
        .map(|i| format!("{}k{i}:\n", " ".repeat(6 + 2 * i)))
        .collect::<String>();
    std::fs::write(&file, format!("version: 1\nimages:\n  api:\n    repository: localhost:5000/api\n    labels:\n{labels}")).unwrap();
    let out = run(polyarch().args(["plan", "-f"]).arg(&file).env_remove("CI"));
    // Refused by validation, for its labels, not by the nesting check.
    let error = check(
        "labels 50 deep",
        &out,
        2,
        Shape::Alone,
        &["images.api.labels".to_string()],
    );
    assert!(!error.contains("levels deep"), "{error}");
}

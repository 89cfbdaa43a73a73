//! The file as a whole: loading, version, syntax, unknown fields, the schema.

use super::*;

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
    let v = |value: &str| format!("version: {value}\n{body}");
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (body.into(), "version", "add `version: 1`", &[]),
        (v("2"), "version", "reads version 1", &["unsupported version 2"]),
        (v("\"1\""), "version", "without quotes", &[]),
        (v("1e999"), "version", "write `version: 1`", &[]),
        (v("99999999999999999999999999999999"), "version", "reads version 1", &[]),
        (v("-1"), "version", "reads version 1", &[]),
        (v("[1]"), "version", "write `version: 1`", &[]),
        // An unsupported version wins over version-1 field errors.
        ("version: 2\nfuture_key: 1\n".into(), "version", "newer polyarch", &[]),
    ];
    expect_all(&d, cases);
    // 1.0 is the number one.
    assert!(parse_in(&d, &with_image("").replace("version: 1", "version: 1.0")).is_ok());
}

#[test]
fn unknown_fields() {
    let d = fixture();
    let listed = "expected one of repository, tags, context";
    #[rustfmt::skip]
    let cases: &[Refused] = &[
        (with_image("    platfroms: [linux/arm64]\n"), "images.hello.platfroms",
            "did you mean platforms?", &["unknown field", listed]),
        (format!("imagez: {{}}\n{}", with_image("")), "imagez", "did you mean images?",
            &["expected one of version, binfmt"]),
        (with_image("    zzzzzz: 1\n"), "images.hello.zzzzzz", "expected one of", &[]),
    ];
    expect_all(&d, cases);
    let s = expect(&d, &cases[0].0, cases[0].1, cases[0].2);
    assert!(!s.contains('`') || s.contains("did you mean"), "{s}");
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
                assert!(matches!(e, ProjectError::File { .. }), "{s}");
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

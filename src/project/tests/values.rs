//! The job's values: `${VAR}`, `--set` and the CI examples that use them.

use super::*;

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
    let release = JOB.replace("${VERSION}\", latest", "${RELEASE}\", latest");
    let (_, _, shown) = project_err(parse_job(&d, &release, &[], Purpose::Build));
    assert!(
        shown.starts_with(&format!(
            "{}: images.api.tags[0]: ",
            d.path().join("polyarch.yaml").display()
        )),
        "{shown}"
    );
    // Each case: what JOB's text becomes, the field named, what the message holds and
    // how it ends.
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, &[&str], &str)] = &[
        ("${VERSION}\", latest", "${RELEASE}\", latest", "images.api.tags[0]",
            &["variable RELEASE is not set", "${RELEASE:-default}"], ""),
        ("${REGISTRY}/api", "\"${REGISTRY_HOST:?the registry to push to}/api\"",
            "images.api.repository", &["REGISTRY_HOST is not set: the registry to push to;"], ""),
        // A value from the job is validated like any other, and traced to its variable.
        ("${VERSION}\", latest", "${BAD_TAG}\", latest", "images.api.tags[0]",
            &["is not a valid tag"], "(the value came from $BAD_TAG)"),
        // Every variable of a bad value is named.
        ("${REGISTRY}/api", "${REGISTRY}/${BAD_TAG}", "images.api.repository",
            &[], "(the value came from $REGISTRY, $BAD_TAG)"),
        // `[${VERSION}]` is YAML's mapping inside a list: the fix is to quote it.
        ("[\"${VERSION}\", latest]", "[${VERSION}, latest]", "",
            &["line 5", "quote values holding `${…}`"], ""),
    ];
    for (from, to, field, holds, ends) in cases {
        let text = JOB.replace(from, to);
        let (f, m, _) = project_err(parse_job(&d, &text, &[], Purpose::Build));
        assert_eq!(f, *field, "{to}: {m}");
        for h in *holds {
            assert!(m.contains(h), "{to}: lacks {h:?}: {m}");
        }
        assert!(m.ends_with(ends), "{to}: does not end {ends:?}: {m}");
    }
    // Keys are names, not values: left alone.
    let text = with_image("    build_args: {$NOT_A_VARIABLE: x}\n");
    assert!(parse_in(&d, &text)
        .unwrap()
        .image("hello")
        .unwrap()
        .build_args
        .contains_key("$NOT_A_VARIABLE"));
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
        Err(ProjectError::Usage(m)) => m,
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

/// The CI job's environment, as the examples under examples/ci/ expect it.
fn ci_job(name: &str) -> Option<String> {
    env_from(
        &[
            ("REGISTRY", "ghcr.io"),
            ("VERSION", "v1.4.3"),
            ("ARM_BUILDER", "ssh://ci@arm-box.example.com"),
        ],
        name,
    )
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
        targets: &[],
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

/// The BuildKit farm example names two TLS daemons per platform, one certificate name.
#[test]
fn the_buildkit_farm_example_names_two_daemons_per_platform() {
    let (file, options) = ci_example("polyarch-buildkit.yaml");
    let p = Project::load(&file, &options).unwrap();
    for arch in ["amd64", "arm64"] {
        let daemons = &p.builders[&format!("linux/{arch}").parse::<Platform>().unwrap()];
        assert_eq!(daemons.len(), 2);
        for (n, daemon) in daemons.iter().enumerate() {
            assert!(daemon.buildkit);
            assert_eq!(
                daemon.host,
                format!("tcp://buildkitd-{arch}-{n}.buildkitd-{arch}.buildkit.svc:1234")
            );
            let tls = daemon.tls.as_ref().unwrap();
            assert_eq!(tls.server_name.as_deref(), Some("buildkitd"));
            assert_eq!(tls.ca, Some(file.parent().unwrap().join("certs/ca.pem")));
        }
    }
}

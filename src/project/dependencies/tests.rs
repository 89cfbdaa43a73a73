use super::*;
use crate::project::{LoadOptions, Purpose};

/// A project of `images` (`name: repository, tags`), read without its build inputs.
fn project(images: &[(&str, &str, &str)]) -> Project {
    let mut text = String::from("version: 1\nimages:\n");
    for (name, repository, tags) in images {
        text += &format!(
            "  {name}:\n    repository: {repository}\n    tags: {tags}\n    context: {name}\n    platforms: [linux/amd64]\n"
        );
    }
    let options = LoadOptions {
        purpose: Purpose::Verify,
        ..LoadOptions::default()
    };
    Project::parse(Path::new("/tmp/polyarch.yaml"), &text, &options).unwrap()
}

/// Images of these names, each pushed to `127.0.0.1:5000/demo/NAME` with the tag v1.
fn local(names: &[&str]) -> Project {
    let repositories: Vec<String> = names
        .iter()
        .map(|name| format!("127.0.0.1:5000/demo/{name}"))
        .collect();
    let images: Vec<(&str, &str, &str)> = names
        .iter()
        .zip(&repositories)
        .map(|(name, repository)| (*name, repository.as_str(), "[v1]"))
        .collect();
    project(&images)
}

/// The graph of `project` with these Dockerfiles, in image order.
fn graph(project: &Project, dockerfiles: &[&str]) -> Result<Graph> {
    let texts: Vec<(&ImageSpec, String)> = project
        .images
        .iter()
        .zip(dockerfiles)
        .map(|(image, text)| (image, text.to_string()))
        .collect();
    Graph::from_texts(&project.file, &texts)
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn dependencies_build_first_and_independent_images_keep_project_order() {
    let p = project(&[
        ("app", "127.0.0.1:5000/demo/app", "[v1]"),
        ("tools", "127.0.0.1:5000/demo/tools", "[v1]"),
        ("base", "127.0.0.1:5000/demo/base", "[v1, latest]"),
    ]);
    let g = graph(
        &p,
        &[
            "FROM polyarch:base AS build\nFROM 127.0.0.1:5000/demo/tools:v1\nCOPY --from=build /a /a\n",
            "FROM scratch\n",
            "FROM scratch\nCOPY a /a\n",
        ],
    )
    .unwrap();
    assert_eq!(g.dependencies("app"), names(&["base", "tools"]));
    assert!(g.has_dependents("base") && !g.has_dependents("app"));
    assert_eq!(
        g.order(&names(&["app", "tools", "base"])),
        names(&["tools", "base", "app"])
    );
    // Selecting a dependent brings in what it builds FROM.
    assert_eq!(g.order(&names(&["app"])), names(&["tools", "base", "app"]));
    assert_eq!(g.order(&names(&["base"])), names(&["base"]));
}

#[test]
fn repositories_match_with_host_port_and_tags() {
    let p = project(&[
        ("base", "127.0.0.1:5000/demo/base", "[v1, latest]"),
        ("hub", "docker.io/library/alpine", "[edge]"),
        ("app", "127.0.0.1:5000/demo/app", "[v1]"),
    ]);
    let edges_of = |from: &str| {
        let g = graph(&p, &["FROM scratch\n", "FROM scratch\n", from]).unwrap();
        g.dependencies("app")
    };
    assert_eq!(
        edges_of("FROM 127.0.0.1:5000/demo/base\n"),
        names(&["base"])
    );
    assert_eq!(
        edges_of("FROM 127.0.0.1:5000/demo/base:v1\n"),
        names(&["base"])
    );
    // Another tag is an earlier release, a digest a pinned image: not this build's.
    assert!(edges_of("FROM 127.0.0.1:5000/demo/base:v0\n").is_empty());
    let digest = format!("sha256:{}", "a".repeat(64));
    assert!(edges_of(&format!("FROM 127.0.0.1:5000/demo/base@{digest}\n")).is_empty());
    // Another port or host is another registry.
    assert!(edges_of("FROM 127.0.0.1:5001/demo/base\n").is_empty());
    assert!(edges_of("FROM localhost:5000/demo/base\n").is_empty());
    // Docker Hub's short names are normalised as the engine does.
    assert_eq!(edges_of("FROM alpine:edge\n"), names(&["hub"]));
    assert!(edges_of("FROM alpine:3\n").is_empty());
    // Build args reach global ARGs in FROM.
    assert_eq!(
        edges_of("ARG BASE=polyarch:base\nFROM ${BASE} AS b\nFROM b\n"),
        names(&["base"])
    );
}

#[test]
fn unknown_names_cycles_and_missing_platforms_are_project_errors() {
    let p = local(&["a", "b"]);
    let lines = "FROM lines or contexts: /tmp/a/Dockerfile line 1, /tmp/b/Dockerfile line 1";
    // Each case: the two Dockerfiles, what the one-line message holds and how it ends.
    #[rustfmt::skip]
    let cases: &[([&str; 2], &[&str], &str)] = &[
        (["FROM scratch\n", "FROM scratch\nFROM polyarch:c\n"],
            &["images.b.dockerfile", "line 2: FROM polyarch:c names no image", "it declares a, b"], ""),
        (["FROM polyarch:b\n", "FROM 127.0.0.1:5000/demo/a:v1\n"],
            &["images a → b → a build FROM each other"], lines),
        (["FROM scratch\n", "FROM scratch\nCOPY --from=polyarch:a /a /a\n"],
            &["line 2: only FROM may name"], ""),
        (["FROM polyarch:a\n", "FROM scratch\n"], &["images a → a"], ""),
    ];
    for (dockerfiles, holds, ends) in cases {
        let error = graph(&p, dockerfiles).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, ProjectError::File { .. }), "{text}");
        for h in *holds {
            assert!(text.contains(h), "{dockerfiles:?}: lacks {h:?}: {text}");
        }
        assert!(text.ends_with(ends), "{dockerfiles:?}: {text}");
        assert!(!text.contains('\n'), "{text}");
    }

    // A dependent's platform the base does not build, unless the FROM names its own.
    let text = "version: 1\nimages:\n  base: {repository: r.example/base, tags: [v1], context: base, platforms: [linux/amd64]}\n  app: {repository: r.example/app, tags: [v1], context: app, platforms: [linux/amd64, linux/arm64]}\n";
    let options = LoadOptions {
        purpose: Purpose::Verify,
        ..LoadOptions::default()
    };
    let p = Project::parse(Path::new("/tmp/polyarch.yaml"), text, &options).unwrap();
    let error = graph(&p, &["FROM scratch\n", "FROM polyarch:base\n"]).unwrap_err();
    assert!(
        error.to_string().contains(
            "images.app.platforms: linux/arm64 is not a platform of base, which app builds FROM"
        ),
        "{error}"
    );
    let own = "FROM --platform=$BUILDPLATFORM polyarch:base AS tools\nFROM scratch\n";
    assert_eq!(
        graph(&p, &["FROM scratch\n", own])
            .unwrap()
            .dependencies("app"),
        names(&["base"])
    );
}

#[test]
fn rewriting_keeps_flags_stage_names_and_other_lines() {
    let p = local(&["base", "app"]);
    let text = "# syntax=docker/dockerfile:1\r\nFROM --platform=$BUILDPLATFORM polyarch:base AS tools\r\nCOPY <<EOF /x\r\nFROM polyarch:base\r\nEOF\r\nfrom \\\r\n  polyarch:base\r\nCOPY --from=tools /a /a\r\n";
    let g = graph(&p, &["FROM scratch\n", text]).unwrap();
    assert_eq!(g.edges("app").len(), 2, "{:?}", g.edges("app"));
    let pinned = BTreeMap::from([(
        "base".to_string(),
        "127.0.0.1:5000/demo/base@sha256:1".to_string(),
    )]);
    assert_eq!(
        rewrite(text, g.edges("app"), &pinned),
        "# syntax=docker/dockerfile:1\r\nFROM --platform=$BUILDPLATFORM 127.0.0.1:5000/demo/base@sha256:1 AS tools\r\nCOPY <<EOF /x\r\nFROM polyarch:base\r\nEOF\r\nfrom \\\r\n  127.0.0.1:5000/demo/base@sha256:1\r\nCOPY --from=tools /a /a\r\n"
    );
    assert_eq!(
        replace_word("FROM xpolyarch:base", "polyarch:base", "y"),
        None
    );
}

#[test]
fn target_contexts_order_builds_and_are_checked_like_from() {
    let parse = |images: &str| {
        let options = LoadOptions {
            purpose: Purpose::Verify,
            ..LoadOptions::default()
        };
        let text = format!("version: 1\nimages:\n{images}");
        Project::parse(Path::new("/tmp/polyarch.yaml"), &text, &options).unwrap()
    };
    let image = |name: &str, platforms: &str, contexts: &str| {
        format!("  {name}: {{repository: r.example/{name}, tags: [v1], context: {name}, platforms: [{platforms}], contexts: {{{contexts}}}}}\n")
    };
    let p = parse(&format!(
        "{}{}",
        image(
            "app",
            "linux/amd64",
            "base: 'target:base', assets: ./assets"
        ),
        image("base", "linux/amd64, linux/arm64", "")
    ));
    // `FROM base` reads the context, not docker.io/library/base.
    let g = graph(
        &p,
        &["FROM base\nCOPY --from=assets /x /x\n", "FROM scratch\n"],
    )
    .unwrap();
    assert!(g.edges("app").is_empty());
    assert_eq!(
        g.targets("app"),
        &[("base".to_string(), "base".to_string())]
    );
    assert_eq!(g.dependencies("app"), names(&["base"]));
    assert!(g.has_dependents("base"));
    assert_eq!(g.order(&names(&["app"])), names(&["base", "app"]));

    // A cycle through a context names the context's field.
    let p = parse(&format!(
        "{}{}",
        image("a", "linux/amd64", "b: 'target:b'"),
        image("b", "linux/amd64", "")
    ));
    let error = graph(&p, &["FROM b\n", "FROM polyarch:a\n"])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("images a → b → a build FROM each other"),
        "{error}"
    );
    assert!(
        error.contains("contexts: images.a.contexts.b, /tmp/b/Dockerfile line 1"),
        "{error}"
    );

    // Unknown images and missing platforms are errors naming the context.
    let p = parse(&image("a", "linux/amd64", "b: 'target:nope'"));
    let error = graph(&p, &["FROM b\n"]).unwrap_err().to_string();
    assert!(
        error.contains(
            "images.a.contexts.b: `target:nope` names no image of this project (it declares a)"
        ),
        "{error}"
    );
    let p = parse(&format!(
        "{}{}",
        image("a", "linux/amd64, linux/arm64", "b: 'target:b'"),
        image("b", "linux/amd64", "")
    ));
    let error = graph(&p, &["FROM b\n", "FROM scratch\n"])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("images.a.contexts.b: linux/arm64 is not a platform of b"),
        "{error}"
    );
}

//! buildx lines → the project and flags polyarch builds, and every refusal.

use super::*;
use clap::Parser;
use std::io::Cursor;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Line {
    #[command(flatten)]
    args: BuildxBuildArgs,
}

/// A context directory with a Dockerfile (and one in `sub/`), kept for the test.
fn context() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/Dockerfile.web"), "FROM scratch\n").unwrap();
    dir
}

fn env(name: &str) -> Option<String> {
    match name {
        "FROM_ENV" => Some("env-value".into()),
        _ => None,
    }
}

/// `line` (buildx's words after `build`) translated in `cwd`, stdin holding `stdin`.
fn translate_in(cwd: &Path, line: &str, stdin: &str) -> Result<BuildxJob> {
    let words = std::iter::once("build").chain(line.split_whitespace());
    let args = Line::try_parse_from(words)
        .unwrap_or_else(|e| panic!("{line}: {e}"))
        .args;
    translate(
        args,
        Surroundings {
            cwd,
            env: &env,
            stdin: &mut Cursor::new(stdin.as_bytes().to_vec()),
        },
    )
}

fn job(line: &str) -> BuildxJob {
    let dir = context();
    translate_in(dir.path(), line, "").unwrap_or_else(|e| panic!("{line}: {e}"))
}

fn refusal(line: &str) -> String {
    let dir = context();
    match translate_in(dir.path(), line, "") {
        Ok(_) => panic!("{line}: translated, expected a refusal"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_common_line_is_one_image_pushed_with_its_tags_and_platforms() {
    let job = job("--platform linux/amd64,linux/arm64 -t 127.0.0.1:5000/team/app:v1 -t 127.0.0.1:5000/team/app:latest --push .");
    let image = &job.project.images[0];
    assert_eq!(image.name, "app");
    assert_eq!(image.repository, "127.0.0.1:5000/team/app");
    assert_eq!(image.tags, ["v1", "latest"]);
    let platforms: Vec<String> = image.platforms.iter().map(|p| p.to_string()).collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    assert_eq!(image.dockerfile, PathBuf::from("Dockerfile"));
    assert_eq!(job.destination, Destination::Registry);
    assert_eq!(
        job.image_names,
        [
            "127.0.0.1:5000/team/app:v1",
            "127.0.0.1:5000/team/app:latest"
        ]
    );
    assert!(!job.platform_from_engine);
}

/// Each row: a line, and what it must set.
#[test]
fn flags_map_onto_the_image_and_build_flags() {
    type Check = fn(&BuildxJob) -> bool;
    let rows: &[(&str, Check)] = &[
        ("-t app .", |j| {
            j.project.images[0].repository == "docker.io/library/app"
                && j.project.images[0].tags == ["latest"]
        }),
        ("-t r.io/a:1 -t r.io/a:1 .", |j| {
            j.project.images[0].tags == ["1"]
        }),
        (
            "--platform linux/amd64 --platform linux/arm64,linux/amd64 .",
            |j| j.project.images[0].platforms.len() == 2,
        ),
        (". ", |j| {
            j.platform_from_engine && j.destination == Destination::Nowhere
        }),
        ("-f sub/Dockerfile.web .", |j| {
            j.project.images[0].dockerfile == Path::new("sub/Dockerfile.web")
        }),
        (
            "--build-arg A=1 --build-arg A=2 --build-arg FROM_ENV --build-arg UNSET .",
            |j| {
                let args = &j.project.images[0].build_args;
                args["A"] == "2" && args["FROM_ENV"] == "env-value" && !args.contains_key("UNSET")
            },
        ),
        ("--target final .", |j| {
            j.project.images[0].target.as_deref() == Some("final")
        }),
        ("--label a=b --label empty .", |j| {
            let labels = &j.project.images[0].labels;
            labels["a"] == "b" && labels["empty"].is_empty()
        }),
        ("--annotation index:k=v --annotation k2=v2 .", |j| {
            j.flags.annotations.len() == 2
        }),
        ("--secret id=tok,env=TOKEN .", |j| {
            j.flags.secrets[0].id == "tok"
        }),
        ("--ssh default .", |j| j.flags.ssh[0].id == "default"),
        (
            "--cache-from r.io/a:cache --cache-from type=registry,ref=r.io/b:c .",
            |j| j.flags.cache_from.len() == 2 && j.flags.cache_from[1].to_string() == "r.io/b:c",
        ),
        (
            "--cache-to type=registry,ref=r.io/a:cache,mode=max .",
            |j| {
                j.flags
                    .cache_to
                    .as_ref()
                    .map(ToString::to_string)
                    .as_deref()
                    == Some("r.io/a:cache")
            },
        ),
        ("--pull --no-cache .", |j| j.flags.pull && j.flags.no_cache),
        ("--network host .", |j| {
            j.project.images[0].network == Network::Host
        }),
        ("--network none .", |j| {
            j.project.images[0].network == Network::None
        }),
        ("--provenance .", |j| j.flags.provenance),
        ("--provenance=mode=max .", |j| j.flags.provenance),
        ("--provenance=false .", |j| !j.flags.provenance),
        ("--attest type=provenance,mode=min .", |j| {
            j.flags.provenance
        }),
        (
            "--provenance=true --attest type=provenance,disabled=true .",
            |j| !j.flags.provenance,
        ),
        ("--sbom=false .", |j| !j.flags.sbom && !j.flags.provenance),
        ("--sbom .", |j| j.flags.sbom),
        ("--sbom=true --attest type=sbom,disabled=true .", |j| {
            !j.flags.sbom
        }),
        ("--attest type=sbom .", |j| {
            j.flags.sbom && !j.flags.provenance
        }),
        ("--call=build .", |j| j.destination == Destination::Nowhere),
        ("--metadata-file m.json --iidfile id .", |j| {
            j.metadata_file.as_deref() == Some(Path::new("m.json"))
                && j.iidfile.as_deref() == Some(Path::new("id"))
        }),
        ("-t r.io/a:1 --output type=registry .", |j| {
            j.destination == Destination::Registry
        }),
        ("-t r.io/a:1 --output type=image,push=true .", |j| {
            j.destination == Destination::Registry
        }),
        ("-t r.io/a:1 --push --output type=registry .", |j| {
            j.destination == Destination::Registry
        }),
        ("--output type=image,name=r.io/a:2,push=true .", |j| {
            j.project.images[0].tags == ["2"] && j.image_names == ["r.io/a:2"]
        }),
        (
            "--output type=oci,dest=out.tar .",
            |j| matches!(&j.destination, Destination::Layout { dest, tar: true } if dest.ends_with("out.tar")),
        ),
        ("--output type=oci,dest=layout,tar=false .", |j| {
            matches!(&j.destination, Destination::Layout { tar: false, .. })
        }),
        ("-q .", |j| j.quiet && j.progress == Progress::Quiet),
        ("--progress=rawjson .", |j| j.progress == Progress::Rawjson),
        ("--progress plain .", |j| j.progress == Progress::Plain),
        ("--record r.json .", |j| {
            j.record.as_deref() == Some(Path::new("r.json"))
        }),
    ];
    for (line, check) in rows {
        assert!(check(&job(line)), "{line}");
    }
}

#[test]
fn every_refusal_names_its_flag_and_a_fix() {
    let rows = [
        ("--load .", "--load", "--push"),
        ("--builder b .", "--builder b", "DOCKER_CONTEXT"),
        (
            "--call=outline .",
            "--call=outline",
            "docker buildx build --call",
        ),
        ("--check .", "--check", "docker buildx build --check"),
        (
            "--sbom=generator=img .",
            "--sbom=generator=img",
            "no scanner image",
        ),
        (
            "--attest type=sbom,generator=img .",
            "--attest type=sbom,generator=img",
            "no scanner image",
        ),
        ("--add-host h:1.2.3.4 .", "--add-host", "/etc/hosts"),
        ("--allow network.host .", "--allow", "--network host"),
        ("--no-cache-filter a .", "--no-cache-filter", "--no-cache"),
        ("--shm-size 1g .", "--shm-size", "drop"),
        ("--ulimit nofile=1 .", "--ulimit", "drop"),
        ("--cgroup-parent x .", "--cgroup-parent", "drop"),
        ("--output type=docker .", "type=docker", "--push"),
        ("--output type=local,dest=x .", "type=local", "type=oci"),
        ("--output type=tar,dest=x .", "type=tar", "type=oci"),
        ("--output out .", "--output out", "type=oci"),
        ("--output type=image .", "type=image", "push=true"),
        (
            "--output type=registry,push=false .",
            "push=false",
            "type=oci",
        ),
        (
            "--output type=registry,compression=zstd .",
            "compression",
            "drop",
        ),
        ("--output type=oci .", "type=oci", "dest=PATH"),
        (
            "-t r.io/a:1 --push --output type=oci,dest=x .",
            "--push with --output",
            "keep one",
        ),
        ("-t r.io/a:1 -t r.io/b:1 .", "-t r.io/b:1", "-t r.io/a:1"),
        (
            "-t r.io/a@sha256:0000000000000000000000000000000000000000000000000000000000000000 .",
            "-t",
            "digest",
        ),
        ("-t Bad:1 .", "-t Bad:1", "not an image reference"),
        ("--push .", "--push", "-t REGISTRY/REPOSITORY:TAG"),
        (
            "--cache-from type=gha .",
            "--cache-from type=gha",
            "type=registry",
        ),
        (
            "--cache-to type=registry,ref=r.io/a:c,mode=min .",
            "mode=min",
            "mode=max",
        ),
        (
            "--cache-to r.io/a:c --cache-to r.io/a:d .",
            "--cache-to r.io/a:d",
            "keep one",
        ),
        (
            "--cache-from type=registry,ref=r.io/a:c,oci-mediatype=true .",
            "oci-mediatype",
            "drop",
        ),
        (
            "--platform windows/amd64 .",
            "--platform windows/amd64",
            "linux/amd64",
        ),
        ("--platform linux/nonsense-arch/x/y .", "--platform", ""),
        ("--network bridge .", "--network bridge", "host or none"),
        ("--provenance=builder-id=x .", "--provenance", "mode=max"),
        ("--attest type=vex .", "--attest", "type=provenance"),
        ("--build-arg =x .", "--build-arg", "KEY=VALUE"),
        ("--label =x .", "--label", "KEY=VALUE"),
        ("--secret nonsense .", "--secret", "key=value"),
        ("--annotation novalue .", "--annotation", "KEY=VALUE"),
        ("-f missing .", "-f", "no such Dockerfile"),
        ("missing", "context missing", "directory"),
        (
            "https://github.com/a/b.git",
            "https://github.com/a/b.git",
            "clone",
        ),
    ];
    for (line, flag, fix) in rows {
        let message = refusal(line);
        assert!(
            message.contains(flag),
            "{line}: {message} does not name {flag}"
        );
        assert!(
            message.contains(fix),
            "{line}: {message} does not say {fix}"
        );
        assert!(!message.contains('\n'), "{line}: {message} is not one line");
    }
}

#[test]
fn a_dockerfile_outside_the_context_or_on_stdin_is_kept_apart_from_it() {
    let dir = context();
    let job = translate_in(&dir.path().join("sub"), "-f ../Dockerfile .", "").unwrap();
    let image = &job.project.images[0];
    assert!(image.dockerfile.is_absolute(), "{image:?}");
    assert_eq!(
        image.context,
        dir.path().join("sub").canonicalize().unwrap()
    );

    let job = translate_in(
        dir.path(),
        "-t r.io/a:1 -f - .",
        "FROM scratch\nLABEL a=b\n",
    )
    .unwrap();
    let image = &job.project.images[0];
    assert_eq!(
        std::fs::read_to_string(image.context.join(&image.dockerfile)).unwrap(),
        "FROM scratch\nLABEL a=b\n"
    );
    assert!(!image.dockerfile.starts_with(&image.context), "{image:?}");
}

#[test]
fn the_context_dash_is_the_dockerfile_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let job = translate_in(dir.path(), "-t r.io/a:1 -", "FROM scratch\nLABEL a=b\n").unwrap();
    let image = &job.project.images[0];
    let held = job.stdin_context.as_ref().expect("a temporary context");
    assert_eq!(image.context, held.path());
    assert_eq!(
        std::fs::read_to_string(image.context.join(&image.dockerfile)).unwrap(),
        "FROM scratch\nLABEL a=b\n"
    );
    let mut tar = vec![0u8; 512];
    tar[257..262].copy_from_slice(b"ustar");
    let message = translate_in(dir.path(), "-", std::str::from_utf8(&tar).unwrap())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(message.contains("unpack it"), "{message}");
    let message = translate_in(dir.path(), "-f x -", "FROM scratch\n")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(message.contains("drop -f"), "{message}");
}

#[test]
fn unknown_flags_are_clap_errors_naming_them() {
    let error = Line::try_parse_from(["build", "--frobnicate", "."])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("--frobnicate"), "{error}");
}

/// Generated: the same flags in every order, and repeated, give the same job (a later
/// value wins only where buildx's does, and no flag is lost to a neighbour's value).
#[test]
fn flag_order_and_repetition_do_not_change_the_job() {
    let flags = [
        "-t r.io/team/app:v1",
        "--platform linux/amd64,linux/arm64",
        "--build-arg A=1",
        "--label l=v",
        "--target final",
        "--cache-from r.io/team/app:cache",
        "--push",
        "--pull",
        "--provenance=true",
        "--network host",
    ];
    let summary = |job: &BuildxJob| {
        let image = &job.project.images[0];
        format!(
            "{} {:?} {:?} {:?} {:?} {:?} {:?} {} {} {:?} {:?}",
            image.repository,
            image.tags,
            image.platforms,
            image.build_args,
            image.labels,
            image.target,
            job.flags.cache_from,
            job.flags.pull,
            job.flags.provenance,
            image.network,
            job.destination
        )
    };
    let expected = summary(&job(&format!("{} .", flags.join(" "))));
    // Every rotation, each reversed, each with the list repeated: 40 lines.
    for shift in 0..flags.len() {
        let mut order: Vec<&str> = flags.to_vec();
        order.rotate_left(shift);
        for reversed in [false, true] {
            if reversed {
                order.reverse();
            }
            for repeat in [1, 2] {
                let line = format!("{} .", order.repeat(repeat).join(" "));
                assert_eq!(summary(&job(&line)), expected, "{line}");
            }
        }
    }
}

#[test]
fn source_date_epoch_comes_from_the_environment_as_buildx_passes_it() {
    let dir = context();
    let args = Line::try_parse_from(["build", "."]).unwrap().args;
    let env = |name: &str| (name == "SOURCE_DATE_EPOCH").then(|| "1700000000".to_string());
    let job = translate(
        args,
        Surroundings {
            cwd: dir.path(),
            env: &env,
            stdin: &mut Cursor::new(Vec::new()),
        },
    )
    .unwrap();
    assert_eq!(
        job.flags.source_date_epoch.map(|(s, _)| s),
        Some(1_700_000_000)
    );
}

#[test]
fn metadata_has_buildx_keys_for_the_index_read_back() {
    let image = ImageCoverage {
        name: "app".into(),
        reference: "r.io/a:1".into(),
        tags: vec!["1".into(), "latest".into()],
        digest: format!("sha256:{}", "a".repeat(64)).parse().unwrap(),
        pinned: String::new(),
        media_type: "application/vnd.oci.image.index.v1+json".into(),
        size: Some(855),
        annotations: Default::default(),
        declared: Vec::new(),
        platforms: Vec::new(),
        missing: Vec::new(),
        unexpected: Vec::new(),
        attestations: Vec::new(),
        warnings: Vec::new(),
        covered: true,
        unpublished: None,
        signed: None,
    };
    let names = ["r.io/a:1".to_string(), "r.io/a:latest".to_string()];
    let digest = format!("sha256:{}", "a".repeat(64));
    assert_eq!(
        metadata(&image, &names),
        serde_json::json!({
            "containerimage.digest": digest,
            "image.name": "r.io/a:1,r.io/a:latest",
            "containerimage.descriptor": {
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": digest,
                "size": 855,
            },
        })
    );
    assert!(metadata(&image, &[]).get("image.name").is_none());
}

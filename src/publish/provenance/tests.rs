use super::*;
use crate::base::attachment::*;
use crate::base::oci::{self, ConfigPlatform, IndexEntry};
use crate::project::{LoadOptions, Project, Purpose};
use crate::verify::coverage_record::BuildInfo;
use crate::verify::coverage_record::BuildWindow;

fn image() -> ImageSpec {
    let text = "version: 1\nimages:\n  api:\n    context: .\n    repository: 127.0.0.1:5000/team/api\n    tags: [v1]\n    platforms: [linux/amd64, linux/arm64]\n    target: release\n    build_args: {TOKEN: s3cr3t-value, GREETING: hello}\n    secrets: {npmrc: {env: NPM_TOKEN}}\n    provenance: true\n";
    let options = LoadOptions {
        purpose: Purpose::Verify,
        ..LoadOptions::default()
    };
    let project = Project::parse(std::path::Path::new("polyarch.yaml"), text, &options)
        .expect("test project parses");
    project.images[0].clone()
}

fn pushed(window: Option<BuildWindow>) -> Pushed {
    Pushed {
        image: "api".into(),
        platform: Platform::linux("arm64", None),
        entry: IndexEntry {
            digest: format!("sha256:{}", "b".repeat(64)).parse().unwrap(),
            size: 480,
            platform: ConfigPlatform {
                os: "linux".into(),
                architecture: "arm64".into(),
                variant: None,
            },
        },
        build: BuildInfo {
            emulated: true,
            seconds: 2.5,
            reused: false,
            builder: Some("unix:///var/run/docker.sock".into()),
            fallback: None,
            window,
        },
    }
}

#[test]
fn the_statement_names_the_platform_manifest_and_the_build_but_no_values() {
    let image = image();
    assert!(image.provenance && image.require_provenance);
    let built = statement(&image, &pushed(Some(BuildWindow::ending_now(2.5))), "run-1");
    assert_eq!(built["_type"], STATEMENT_TYPE);
    assert_eq!(built["predicateType"], SLSA_PROVENANCE);
    let subject = &built["subject"][0];
    assert_eq!(subject["digest"]["sha256"], "b".repeat(64));
    assert_eq!(
        subject["name"],
        "pkg:docker/127.0.0.1:5000/team/api@v1?platform=linux%2Farm64"
    );
    let definition = &built["predicate"]["buildDefinition"];
    assert_eq!(definition["buildType"], BUILD_TYPE);
    let external = &definition["externalParameters"];
    assert_eq!(external["platform"], "linux/arm64");
    assert_eq!(external["target"], "release");
    assert_eq!(external["dockerfile"], "Dockerfile");
    assert_eq!(external["build_args"], json!(["GREETING", "TOKEN"]));
    assert_eq!(external["secrets"], json!(["npmrc"]));
    let text = built.to_string();
    for value in ["s3cr3t-value", "hello", "NPM_TOKEN"] {
        assert!(!text.contains(value), "{value} leaked: {text}");
    }
    let run = &built["predicate"]["runDetails"];
    assert_eq!(run["builder"]["id"], "unix:///var/run/docker.sock");
    assert_eq!(run["metadata"]["invocationId"], "run-1");
    let started = run["metadata"]["startedOn"].as_str().unwrap();
    let finished = run["metadata"]["finishedOn"].as_str().unwrap();
    assert!(started < finished, "{started} {finished}");
    // A reused build has no window: no times are claimed.
    let reused = statement(&image, &pushed(None), "run-2");
    assert!(reused["predicate"]["runDetails"]["metadata"]
        .get("startedOn")
        .is_none());
}

#[test]
fn the_referrer_is_an_in_toto_artifact_whose_subject_is_the_platform_manifest() {
    let pushed = pushed(None);
    let statement = statement(&image(), &pushed, "run");
    let referrer = referrer(&pushed, &statement);
    let manifest: Value = serde_json::from_slice(&referrer.manifest.bytes).unwrap();
    assert_eq!(
        referrer.manifest.digest,
        Digest::of(&referrer.manifest.bytes)
    );
    assert_eq!(manifest["mediaType"], oci::OCI_MANIFEST);
    assert_eq!(manifest["artifactType"], IN_TOTO);
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.empty.v1+json"
    );
    assert_eq!(
        manifest["config"]["digest"],
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    assert_eq!(manifest["subject"]["digest"], pushed.entry.digest.as_str());
    assert_eq!(manifest["subject"]["size"], 480);
    let layer = &manifest["layers"][0];
    assert_eq!(layer["mediaType"], IN_TOTO);
    assert_eq!(layer["annotations"][PREDICATE_TYPE], SLSA_PROVENANCE);
    let (bytes, digest) = &referrer.layer;
    assert_eq!(layer["digest"], digest.as_str());
    assert_eq!(serde_json::from_slice::<Value>(bytes).unwrap(), statement);
    assert_eq!(
        check_referrer(&referrer.manifest.bytes, &pushed.entry.digest).unwrap(),
        Some(SLSA_PROVENANCE.to_string())
    );
    let other: Digest = format!("sha256:{}", "c".repeat(64)).parse().unwrap();
    assert!(matches!(
        check_referrer(&referrer.manifest.bytes, &other),
        Err(ReferrerError::OtherSubject { .. })
    ));
    assert!(matches!(
        check_referrer(b"not json", &other),
        Err(ReferrerError::NotJson(_))
    ));
}

#[test]
fn the_tag_schema_keeps_other_referrers_and_replaces_one_of_the_same_digest() {
    let pushed = pushed(None);
    let referrer = referrer(&pushed, &statement(&image(), &pushed, "run"));
    assert_eq!(
        referrers_tag(&pushed.entry.digest),
        format!("sha256-{}", "b".repeat(64))
    );
    let signature = json!({
        "mediaType": oci::OCI_MANIFEST,
        "digest": format!("sha256:{}", "d".repeat(64)),
        "size": 300,
        "artifactType": "application/vnd.dev.cosign.artifact.sig.v1+json",
    });
    let mut stale = referrer.descriptor();
    stale["annotations"] = json!({});
    let mut referrers = Referrers {
        subject: pushed.entry.digest.clone(),
        listed: vec![signature.clone(), stale],
        by: ListedBy::TagSchema,
    };
    referrers.add(referrer.descriptor());
    let index = referrers.tag_schema_index();
    assert_eq!(index.media_type, oci::OCI_INDEX);
    let parsed: Value = serde_json::from_slice(&index.bytes).unwrap();
    let listed = parsed["manifests"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2, "{parsed}");
    assert_eq!(listed[0], signature);
    assert_eq!(listed[1], referrer.descriptor());
    let found = attached(&listed);
    assert_eq!(found[1].predicate_type.as_deref(), Some(SLSA_PROVENANCE));
    assert!(found[1].is_provenance() && !found[0].is_provenance());
    assert!(referrer.already_in(&referrers));
    referrers.listed.truncate(1);
    assert!(!referrer.already_in(&referrers));
}

#[test]
fn base_images_the_dockerfile_names_are_the_resolved_dependencies() {
    let dir = tempfile::tempdir().unwrap();
    let pinned = format!("sha256:{}", "e".repeat(64));
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!(
            "FROM golang:1.22 AS build\nRUN true\nFROM registry.example.com/base@{pinned}\nCOPY --from=build /x /x\nCOPY --from=build /y /y\n"
        ),
    )
    .unwrap();
    let text = "version: 1\nimages:\n  api:\n    context: .\n    repository: 127.0.0.1:5000/api\n    tags: [v1]\n    platforms: [linux/arm64]\n";
    let project = Project::parse(
        &dir.path().join("polyarch.yaml"),
        text,
        &LoadOptions::default(),
    )
    .expect("test project parses");
    let built = statement(&project.images[0], &pushed(None), "run");
    let dependencies = &built["predicate"]["buildDefinition"]["resolvedDependencies"];
    assert_eq!(
        dependencies,
        &json!([
            {"uri": "pkg:docker/docker.io/library/golang@1.22?platform=linux%2Farm64"},
            {"uri": "pkg:docker/registry.example.com/base?platform=linux%2Farm64",
             "digest": {"sha256": "e".repeat(64)}},
        ]),
        "{built}"
    );
}

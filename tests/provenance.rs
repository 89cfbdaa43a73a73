//! `provenance: true`: SLSA provenance attached to each platform manifest as an OCI
//! referrer, read back by skopeo and raw HTTP requests (the distribution registry 2.8 has
//! no referrers API, so the referrers tag schema is what is written), the index left with
//! exactly the platform manifests, and `verify --require-provenance`; on whichever engine
//! `DOCKER_HOST` names.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use proxy::{Fault, Proxy, Rule};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use support::{
    curl, hello_context, http_status, platforms_of, polyarch, run, skopeo_inspect_raw, unique_name,
    Registry, HELLO,
};

const SLSA: &str = "https://slsa.dev/provenance/v1";
const IN_TOTO: &str = "application/vnd.in-toto+json";
/// A build-arg value that must never reach the statement.
const ARG_VALUE: &str = "not-for-provenance-7f3a";

fn project(dir: &Path, repository: &str, provenance: bool) -> PathBuf {
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    build_args: {{GREETING: {ARG_VALUE}}}\n    provenance: {provenance}\n"
        ),
    )
    .unwrap();
    file
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn build(file: &Path, extra: &[&str]) -> Output {
    run(polyarch()
        .args(["build", "--output-format", "json", "-f"])
        .arg(file)
        .args(extra))
}

fn verify(reference: &str, extra: &[&str]) -> Output {
    run(polyarch()
        .args(["verify", reference, "--platform", "linux/amd64,linux/arm64"])
        .args(extra))
}

/// The platform entries of the index a tag points at: exactly the two platform
/// manifests, nothing attached to the index itself.
fn platform_entries(reference: &str) -> Vec<Value> {
    let index = skopeo_inspect_raw(reference);
    let entries = index["manifests"].as_array().unwrap().clone();
    assert_eq!(
        platforms_of(&index),
        ["linux/amd64", "linux/arm64"],
        "{index}"
    );
    assert!(
        entries.iter().all(
            |e| e["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
                && e.get("artifactType").is_none()
                && e.get("annotations").is_none()
        ),
        "{index}"
    );
    assert!(index.get("subject").is_none(), "{index}");
    entries
}

/// Checks one platform manifest's provenance as a user would with skopeo and curl; returns
/// the referrer's digest.
fn check_referrer(registry: &Registry, repo: &str, subject: &str) -> String {
    // No referrers API on this registry: the tag schema is what clients read.
    let api = format!("/v2/{repo}/referrers/{subject}");
    assert_eq!(http_status(registry.port, &api), Some(404));
    let tag = subject.replacen(':', "-", 1);
    let listing = skopeo_inspect_raw(&format!("{}:{tag}", registry.repo(repo)));
    assert_eq!(
        listing["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let listed = listing["manifests"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listing}");
    assert_eq!(listed[0]["artifactType"], IN_TOTO);
    assert_eq!(listed[0]["annotations"]["in-toto.io/predicate-type"], SLSA);
    let digest = listed[0]["digest"].as_str().unwrap().to_string();

    let manifest = skopeo_inspect_raw(&format!("{}@{digest}", registry.repo(repo)));
    assert_eq!(manifest["artifactType"], IN_TOTO, "{manifest}");
    assert_eq!(manifest["subject"]["digest"], subject);
    assert_eq!(
        manifest["config"]["digest"],
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    let layer = &manifest["layers"][0];
    assert_eq!(layer["mediaType"], IN_TOTO);
    let blob = layer["digest"].as_str().unwrap();
    let bytes = curl(&[&format!("{}/v2/{repo}/blobs/{blob}", registry.url())]);
    assert_eq!(polyarch::base::oci::sha256_digest(&bytes), blob);
    let statement: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(statement["predicateType"], SLSA);
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        subject.trim_start_matches("sha256:")
    );
    let definition = &statement["predicate"]["buildDefinition"];
    assert_eq!(
        definition["externalParameters"]["build_args"],
        serde_json::json!(["GREETING"])
    );
    assert!(!statement.to_string().contains(ARG_VALUE), "{statement}");
    let run_details = &statement["predicate"]["runDetails"];
    assert!(run_details["builder"]["id"].is_string(), "{statement}");
    assert!(run_details["metadata"]["invocationId"].is_string());
    digest
}

#[test]
fn provenance_is_a_referrer_of_each_platform_manifest_and_the_index_stays_clean() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/provenance");
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = project(dir.path(), &registry.repo(&repo), true);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries = platform_entries(&reference);
    let mut referrers = Vec::new();
    for (entry, recorded) in entries
        .iter()
        .zip(record["images"][0]["platforms"].as_array().unwrap())
    {
        let subject = entry["digest"].as_str().unwrap();
        let referrer = check_referrer(&registry, &repo, subject);
        assert_eq!(recorded["status"], "ok", "{recorded}");
        assert_eq!(
            recorded["attached"][0]["digest"],
            referrer.as_str(),
            "{recorded}"
        );
        assert_eq!(recorded["attached"][0]["predicate_type"], SLSA);
        referrers.push(referrer);
    }
    assert_ne!(referrers[0], referrers[1]);

    // verify reads it back and lists it; requiring it is satisfied.
    let out = verify(&reference, &["--require-provenance"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text.matches(&format!("attached: {SLSA}")).count(),
        2,
        "{text}"
    );

    // A rerun keeps the provenance each manifest has: no second referrer.
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (entry, referrer) in platform_entries(&reference).iter().zip(&referrers) {
        let subject = entry["digest"].as_str().unwrap();
        assert_eq!(&check_referrer(&registry, &repo, subject), referrer);
    }
}

#[test]
fn require_provenance_makes_an_image_without_it_a_gap_until_it_is_built_with_it() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/unattested");
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = project(dir.path(), &registry.repo(&repo), false);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(record["images"][0]["platforms"][0]
        .get("attached")
        .is_none());
    let tag = |entry: &Value| {
        format!(
            "/v2/{repo}/manifests/{}",
            entry["digest"].as_str().unwrap().replacen(':', "-", 1)
        )
    };
    for entry in platform_entries(&reference) {
        assert_eq!(http_status(registry.port, &tag(&entry)), Some(404));
    }

    assert_eq!(verify(&reference, &[]).status.code(), Some(0));
    let out = verify(&reference, &["--require-provenance"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    for platform in ["linux/amd64", "linux/arm64"] {
        let line = text
            .lines()
            .find(|l| l.contains("no SLSA provenance attached") && l.contains(platform))
            .unwrap_or_else(|| panic!("no gap line for {platform}: {text}"));
        assert!(
            line.contains(&reference) && line.contains("provenance: true"),
            "{line}"
        );
    }
    assert!(text.contains("provenance_missing"), "{text}");
    let out = run(polyarch()
        .args([
            "verify",
            "--output-format",
            "json",
            "--require-provenance",
            "-f",
        ])
        .arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        record["images"][0]["platforms"][1]["status"],
        "provenance_missing"
    );

    // --provenance attaches it to the images already pushed; then the gap is closed.
    let out = build(&file, &["--provenance", "--require-provenance"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for entry in platform_entries(&reference) {
        check_referrer(&registry, &repo, entry["digest"].as_str().unwrap());
    }
    assert_eq!(
        verify(&reference, &["--require-provenance"]).status.code(),
        Some(0)
    );
}

#[test]
fn an_oci_layout_output_refuses_provenance_before_building() {
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let file = project(dir.path(), "127.0.0.1:5000/never/pushed", true);
    let layout = dir.path().join("layout");
    let out = run(polyarch()
        .args(["build", "-f"])
        .arg(&file)
        .arg("--output")
        .arg(format!("oci:{}", layout.display())));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("provenance") && err.contains("registry") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!layout.exists());
}

/// A registry with the referrers API, played by a proxy answering
/// `GET /v2/NAME/referrers/DIGEST` with what the registry behind it holds under the tag
/// schema, and hiding those tags: verify reads through the API, and a rerun finds the
/// provenance there and writes no tag.
#[test]
fn a_registry_with_the_referrers_api_is_read_through_it_and_gets_no_tag() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/api");
    let file = project(dir.path(), &registry.repo(&repo), true);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for entry in platform_entries(&format!("{}:v1", registry.repo(&repo))) {
        let subject = entry["digest"].as_str().unwrap();
        let tag = subject.replacen(':', "-", 1);
        let listing = curl(&[
            "-H",
            "Accept: application/vnd.oci.image.index.v1+json",
            &format!("{}/v2/{repo}/manifests/{tag}", registry.url()),
        ]);
        let index = "application/vnd.oci.image.index.v1+json";
        proxy.add(
            Rule::new(
                "GET",
                &format!("/referrers/{subject}"),
                Fault::respond(200, index, listing),
            )
            .always(),
        );
        proxy.add(
            Rule::new(
                "GET",
                &format!("/manifests/{tag}"),
                Fault::respond(404, "text/plain", ""),
            )
            .always(),
        );
        proxy.add(
            Rule::new(
                "HEAD",
                &format!("/manifests/{tag}"),
                Fault::respond(404, "text/plain", ""),
            )
            .always(),
        );
    }

    let reference = format!("{}:v1", proxy.repo(&repo));
    let out = verify(&reference, &["--require-provenance"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text.matches(&format!("attached: {SLSA}")).count(),
        2,
        "{text}"
    );

    let file = project(dir.path(), &proxy.repo(&repo), true);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already has SLSA provenance attached; kept"),
        "{}",
        stderr(&out)
    );
    let log = proxy.log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("GET") && l.contains("/referrers/")),
        "{log:#?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.starts_with("PUT") && l.contains("/manifests/sha256-")),
        "{log:#?}"
    );
}

/// A registry whose referrers endpoint answers something that is not a listing: one line
/// naming the reference, exit 3 where provenance is needed, a warning where it is not.
/// A statement the run has just made goes in without a HEAD first (no registry can hold
/// it yet: asking would only add a round trip), and its referrer manifest before the
/// listing that names it.
#[test]
fn a_new_statement_is_uploaded_unasked_and_listed_after_its_manifest() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/unasked");
    let file = project(dir.path(), &proxy.repo(&repo), true);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = proxy.log();
    let sent = |method: &str, path: &str| {
        let line = format!("{method} /v2/{repo}/{path}");
        log.iter().position(|l| l.starts_with(&line))
    };
    for entry in platform_entries(&format!("{}:v1", registry.repo(&repo))) {
        let subject = entry["digest"].as_str().unwrap();
        let referrer = check_referrer(&registry, &repo, subject);
        let manifest = skopeo_inspect_raw(&format!("{}@{referrer}", registry.repo(&repo)));
        let statement = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(
            sent("HEAD", &format!("blobs/{statement}")),
            None,
            "{log:#?}"
        );
        let pushed = sent("PUT", &format!("manifests/{referrer}"));
        let listed = sent(
            "PUT",
            &format!("manifests/{}", subject.replacen(':', "-", 1)),
        );
        assert!(
            matches!((pushed, listed), (Some(p), Some(l)) if p < l),
            "{log:#?}"
        );
    }
}

#[test]
fn a_garbled_referrers_answer_is_one_line_and_never_a_panic() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/garbled");
    proxy.add(
        Rule::new(
            "GET",
            "/referrers/",
            Fault::respond(200, "application/json", "{not json"),
        )
        .always(),
    );
    let file = project(dir.path(), &proxy.repo(&repo), false);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = record["images"][0]["warnings"].to_string();
    assert!(
        warnings.contains("cannot list what is attached"),
        "{record}"
    );

    let reference = format!("{}:v1", proxy.repo(&repo));
    let out = verify(&reference, &["--require-provenance"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    let error: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error.len(), 1, "{err}");
    assert!(
        error[0].contains("referrers listing is not an OCI image index")
            && error[0].contains(&reference),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let file = project(dir.path(), &proxy.repo(&repo), true);
    let out = build(&file, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("referrers") && !err.contains("panicked"),
        "{err}"
    );
}

/// Split runners: parts pushed by digest carry no provenance; `assemble` attaches it before
/// the tag moves, from what the parts record (no build times: they ran elsewhere).
#[test]
fn assemble_attaches_provenance_to_the_parts_before_tagging() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/assembled");
    let file = project(dir.path(), &registry.repo(&repo), true);
    let part = dir.path().join("part.json");
    let out = run(polyarch()
        .args(["build", "--push-by-digest", "-f"])
        .arg(&file)
        .arg("--record")
        .arg(&part));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recorded: Value = serde_json::from_slice(&fs::read(&part).unwrap()).unwrap();
    for platform in recorded["images"][0]["platforms"].as_array().unwrap() {
        let tag = platform["digest"].as_str().unwrap().replacen(':', "-", 1);
        let path = format!("/v2/{repo}/manifests/{tag}");
        assert_eq!(http_status(registry.port, &path), Some(404), "{tag}");
    }

    let out = run(polyarch()
        .args(["assemble", "--output-format", "json", "-f"])
        .arg(&file)
        .arg(&part));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for entry in platform_entries(&format!("{}:v1", registry.repo(&repo))) {
        check_referrer(&registry, &repo, entry["digest"].as_str().unwrap());
    }
}

/// A registry that refuses what the referrer needs: exit 3 naming why and what to do, and
/// the tag does not move.
#[test]
fn a_refused_referrer_moves_no_tag() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let repo = unique_name("demo/refused");
    let file = project(dir.path(), &proxy.repo(&repo), false);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = polyarch::base::oci::sha256_digest(&curl(&[
        "-H",
        "Accept: application/vnd.oci.image.index.v1+json",
        &format!("{}/v2/{repo}/manifests/v1", registry.url()),
    ]));

    // The referrers tag schema's index is refused (only polyarch puts `sha256-…` tags; an
    // engine pushing platform manifests puts them by digest).
    let invalid = r#"{"errors":[{"code":"MANIFEST_INVALID","message":"manifest invalid"}]}"#;
    proxy.add(Rule::new(
        "PUT",
        "/manifests/sha256-",
        Fault::respond(400, "application/json", invalid),
    ));
    let file = project(dir.path(), &proxy.repo(&repo), true);
    let out = run(polyarch()
        .args(["build", "--annotation", "index:org.example.run=2", "-f"])
        .arg(&file));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    let error: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error.len(), 1, "{err}");
    assert!(
        error[0].contains("provenance") && error[0].contains("no tag moved"),
        "{err}"
    );
    let now = polyarch::base::oci::sha256_digest(&curl(&[
        "-H",
        "Accept: application/vnd.oci.image.index.v1+json",
        &format!("{}/v2/{repo}/manifests/v1", registry.url()),
    ]));
    assert_eq!(now, before, "the tag moved");
}

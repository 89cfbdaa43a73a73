//! `sign: {key: PATH}` and `--sign-key`: the index and both platform manifests of a
//! FROM-scratch build signed before any tag moves, as Sigstore bundles attached as OCI
//! referrers (the distribution registry has no referrers API: the tag schema), beside
//! provenance. Checked by polyarch's own code and by cosign 3 (scripts/cosign.sh fetches
//! Debian sid's), with a key generated here and one made by `cosign generate-key-pair`.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use polyarch::sign::{self, PublicKey};
use proxy::Proxy;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::gate::{deployment, Deploy};
use support::supply_chain::{cosign_tree, cosign_verify};
use support::{
    curl, hello_context, polyarch, run, skopeo_inspect_raw, unique_name, Registry, HELLO,
};

const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A P-256 key pair made by openssl: `(private PKCS#8 PEM, public PEM)`.
fn openssl_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub"));
    let out = run(Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&private));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public));
    assert!(out.status.success(), "{}", stderr(&out));
    (private, public)
}

/// The bundles the referrers tag lists for `subject`.
fn bundles(registry: &Registry, repo: &str, subject: &str) -> Vec<Vec<u8>> {
    let tag = subject.replacen(':', "-", 1);
    let listing = skopeo_inspect_raw(&format!("{}:{tag}", registry.repo(repo)));
    listing["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["artifactType"] == BUNDLE)
        .map(|d| {
            let digest = d["digest"].as_str().unwrap();
            let manifest = skopeo_inspect_raw(&format!("{}@{digest}", registry.repo(repo)));
            assert_eq!(manifest["subject"]["digest"], subject, "{manifest}");
            assert_eq!(manifest["artifactType"], BUNDLE, "{manifest}");
            let blob = manifest["layers"][0]["digest"].as_str().unwrap();
            curl(&[&format!("{}/v2/{repo}/blobs/{blob}", registry.url())])
        })
        .collect()
}

/// What polyarch signs of the image at `reference`: its index's digest, then each
/// platform manifest's.
fn subjects(reference: &str) -> Vec<String> {
    let index = skopeo_inspect_raw(reference);
    let platforms = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["digest"].as_str().unwrap().to_string());
    std::iter::once(support::skopeo_digest(reference, None))
        .chain(platforms)
        .collect()
}

#[test]
fn the_index_and_each_platform_are_signed_as_cosign_verifies() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let (_, public) = openssl_key(dir.path(), "signer");
    let (_, other) = openssl_key(dir.path(), "other");
    let repo = unique_name("demo/sign");
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = dir.path().join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  hello:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64, linux/arm64]\n    provenance: true\n    sign: {{key: signer.pem}}\n",
            registry.repo(&repo)
        ),
    )
    .unwrap();
    let out = run(polyarch().args(["build", "-f"]).arg(&file));
    assert!(out.status.success(), "{}", stderr(&out));

    let subjects = subjects(&reference);
    let index_digest = subjects[0].clone();
    assert_eq!(subjects.len(), 3, "{subjects:?}");
    let keys = [PublicKey::load(&public).unwrap()];
    let others = [PublicKey::load(&other).unwrap()];
    for subject in &subjects {
        let found = bundles(&registry, &repo, subject);
        assert_eq!(found.len(), 1, "{subject}");
        let digest = subject.parse().unwrap();
        sign::check(&found[0], &digest, &keys).unwrap();
        assert_eq!(
            sign::check(&found[0], &digest, &others).unwrap_err(),
            sign::SignatureGap::OtherKey
        );
    }

    // A rerun signs alike (RFC 6979): no second bundle. With --require-signature it
    // reads its signatures back: by its own key, then by a --key given.
    let out = run(polyarch()
        .args(["build", "--require-signature", "-f"])
        .arg(&file));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(bundles(&registry, &repo, &index_digest).len(), 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches(&format!("signed by {}", keys[0].fingerprint))
            .count(),
        3,
        "{text}"
    );
    let out = run(polyarch()
        .args(["build", "--require-signature", "--key"])
        .arg(&other)
        .arg("-f")
        .arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("signed by none of the keys given"), "{text}");

    // polyarch's own read-back: any one key given suffices; another key's is a gap.
    let verify = |keys: &[&Path]| {
        let mut command = polyarch();
        command.args(["verify", "--require-signature"]);
        for key in keys {
            command.arg("--key").arg(key);
        }
        run(command.args([&reference, "--platform", "linux/amd64,linux/arm64"]))
    };
    let out = verify(&[&other, &public]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("signed by {}", keys[0].fingerprint)),
        "{text}"
    );
    let out = verify(&[&other]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("linux/arm64") && text.contains("signed by none of the keys given"),
        "{text}"
    );

    // With -f, an image with `sign:` is checked anyway, with its own key's public half.
    let out = run(polyarch().args(["verify", "-f"]).arg(&file));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches(&format!("signed by {}", keys[0].fingerprint))
            .count(),
        3,
        "{text}"
    );

    // gate applies the same policy to the images a deploy runs.
    let deploy = Deploy::write(
        dir.path(),
        &deployment("app", &reference, None, ""),
        &[("general", "amd64", 1)],
    );
    let gate = |key: &Path| {
        run(deploy
            .gate()
            .args(["--require-signature", "--key"])
            .arg(key))
    };
    let out = gate(&public);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let out = gate(&other);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("REFUSED") && text.contains("signed by none of the keys given"),
        "{text}"
    );

    let by_digest = subjects
        .iter()
        .map(|s| format!("{}@{s}", registry.repo(&repo)));
    for target in std::iter::once(reference.clone()).chain(by_digest) {
        let out = cosign_verify(&public, &target);
        assert!(
            out.status.success(),
            "cosign verify {target}: {}",
            stderr(&out)
        );
        let claims: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(claims.as_array().is_some_and(|c| !c.is_empty()), "{claims}");
        let out = cosign_verify(&other, &target);
        assert!(
            !out.status.success(),
            "cosign accepted another key for {target}"
        );
        // `cosign tree` lists the signature (and provenance, on a platform manifest).
        let tree = cosign_tree(&target);
        assert!(
            tree.contains("https://sigstore.dev/cosign/sign/v1"),
            "{tree}"
        );
        assert_eq!(
            tree.contains("application/vnd.in-toto+json"),
            subjects[1..].iter().any(|s| target.ends_with(s.as_str())),
            "{target}: {tree}"
        );
    }
}

#[test]
fn a_cosign_key_signs_with_its_password_and_a_wrong_one_is_refused() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let fixtures = support::repo_root().join("fixtures/sign");
    let repo = unique_name("demo/sign-cosign");
    let file = support::write_project(
        dir.path(),
        &registry.repo(&repo),
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let key = fixtures.join("cosign.key");
    // Its own memory: what the rerun below remembers of the key is this test's alone.
    let cache = tempfile::tempdir().unwrap();
    let build_with = |password: &str, extra: &[&str]| {
        run(polyarch()
            .args(["build", "-f"])
            .arg(&file)
            .arg("--sign-key")
            .arg(&key)
            .args(extra)
            .env("COSIGN_PASSWORD", password)
            .env("POLYARCH_CACHE_DIR", cache.path()))
    };
    let build = |password: &str| build_with(password, &[]);
    // The key opens beside the build, so a wrong password is found at the first
    // signature: after the platform manifests are pushed, before the tag moves. With
    // --require-signature too: the key that checks the signatures is only waited for
    // once there is something to check.
    for extra in [&[][..], &["--require-signature"]] {
        let out = build_with("wrong", extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        let text = stderr(&out);
        let last = text.trim().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ")
                && last.contains("cosign.key")
                && last.contains("COSIGN_PASSWORD"),
            "{extra:?}: {text}"
        );
        // Both platforms got done first (pushed, or on the second run found pushed).
        let done = text.lines().filter(|l| l.contains(" [done] ")).count();
        assert_eq!(done, 2, "{extra:?}: {text}");
        let tag = format!("/v2/{repo}/manifests/v1");
        assert_eq!(support::http_status(registry.port, &tag), Some(404));
    }

    let out = build("polyarch-fixture");
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = format!("{}:v1", registry.repo(&repo));
    let digest = support::skopeo_digest(&reference, None);
    let keys = [PublicKey::load(&fixtures.join("cosign.pub")).unwrap()];
    let found = bundles(&registry, &repo, &digest);
    sign::check(&found[0], &digest.parse().unwrap(), &keys).unwrap();
    let out = cosign_verify(&fixtures.join("cosign.pub"), &reference);
    assert!(out.status.success(), "cosign verify: {}", stderr(&out));

    // A rerun with nothing new to sign never opens the key (its public half is
    // remembered): even a wrong password goes unasked, and every signature is kept.
    let out = build("wrong");
    assert!(out.status.success(), "{}", stderr(&out));
    let kept = stderr(&out)
        .lines()
        .filter(|l| l.contains("already has this key's signature") && l.ends_with("kept"))
        .count();
    assert_eq!(kept, 3, "{}", stderr(&out));
    assert_eq!(bundles(&registry, &repo, &digest).len(), found.len());
}

#[test]
fn verify_refuses_an_unsigned_image_and_cosign_and_polyarch_keep_each_others_entries() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let fixtures = support::repo_root().join("fixtures/sign");
    let repo = unique_name("demo/unsigned");
    let file = support::write_project(
        dir.path(),
        &registry.repo(&repo),
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let out = run(polyarch().args(["build", "--provenance", "-f"]).arg(&file));
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = format!("{}:v1", registry.repo(&repo));
    let verify_with = |key: &Path, extra: &[&str]| {
        run(polyarch()
            .args(["verify", "--require-signature", "--key"])
            .arg(key)
            .args(extra)
            .args([&reference, "--platform", "linux/amd64,linux/arm64"]))
    };
    let verify = || verify_with(&fixtures.join("cosign.pub"), &[]);
    let out = verify();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("has no signature attached"), "{text}");

    // cosign signs the index and each platform manifest by digest, as polyarch does.
    // Offline and log-less: cosign 3 refuses `--tlog-upload=false` beside its TUF signing
    // config, and without one (`--use-signing-config=false`) writes its older format, so
    // it is given a signing config with no services.
    let no_services = dir.path().join("signing-config.json");
    fs::write(
        &no_services,
        r#"{"mediaType":"application/vnd.dev.sigstore.signingconfig.v0.2+json","rekorTlogConfig":{},"tsaConfig":{}}"#,
    )
    .unwrap();
    let cosign = support::supply_chain::cosign();
    for digest in subjects(&reference) {
        let out = run(Command::new(&cosign)
            .args([
                "sign",
                "--yes",
                "--allow-insecure-registry",
                "--allow-http-registry",
                "--key",
            ])
            .arg(fixtures.join("cosign.key"))
            .arg("--signing-config")
            .arg(&no_services)
            .arg(format!("{}@{digest}", registry.repo(&repo)))
            .env("COSIGN_PASSWORD", support::supply_chain::FIXTURE_PASSWORD)
            .env("TUF_ROOT", tempfile::tempdir().unwrap().path()));
        assert!(
            out.status.success(),
            "cosign sign {digest}: {}",
            stderr(&out)
        );
    }
    let out = verify_with(&fixtures.join("cosign.pub"), &["--require-provenance"]);
    assert!(
        out.status.success(),
        "cosign's signatures, beside polyarch's provenance: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );

    // A rebuild attaching an SBOM and polyarch's own signature (another key) keeps
    // cosign's signatures and the provenance: each tool's entries survive the other's.
    let (own, own_public) = openssl_key(dir.path(), "own");
    let out = run(polyarch()
        .args(["build", "--provenance", "--sbom", "--sign-key"])
        .arg(&own)
        .arg("-f")
        .arg(&file));
    assert!(out.status.success(), "{}", stderr(&out));
    for key in [fixtures.join("cosign.pub"), own_public] {
        let out = verify_with(&key, &["--require-provenance", "--require-sbom"]);
        assert!(
            out.status.success(),
            "{}: {}{}",
            key.display(),
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
    let out = cosign_verify(&fixtures.join("cosign.pub"), &reference);
    assert!(out.status.success(), "cosign verify: {}", stderr(&out));
}

/// A signature that does not cover what it is attached to never counts: one whose payload
/// was rewritten (tampered), and a valid one copied from another image's manifest. verify
/// and gate each refuse both with exit 1.
#[test]
fn a_tampered_or_copied_signature_is_refused_by_verify_and_gate() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let (private, public) = openssl_key(dir.path(), "signer");
    let project = |repo: &str, sign: bool| {
        let file = dir.path().join(format!("{}.yaml", repo.replace('/', "-")));
        fs::write(
            &file,
            format!(
                "version: 1\nimages:\n  hello:\n    repository: {}\n    tags: [v1]\n    context: .\n    platforms: [linux/amd64]\n{}",
                registry.repo(repo),
                if sign {
                    format!("    sign: {{key: {}}}\n", private.display())
                } else {
                    // Another image than the signed one: another config.
                    "    labels: {variant: unsigned}\n".to_string()
                }
            ),
        )
        .unwrap();
        let out = run(polyarch().args(["build", "-f"]).arg(&file));
        assert!(out.status.success(), "{}", stderr(&out));
        let reference = format!("{}:v1", registry.repo(repo));
        let digest = support::skopeo_digest(&reference, None);
        (reference, digest)
    };
    let signed_repo = unique_name("demo/tampered");
    let (signed, signed_digest) = project(&signed_repo, true);
    let other_repo = unique_name("demo/copied");
    let (unsigned, unsigned_digest) = project(&other_repo, false);
    assert_ne!(signed_digest, unsigned_digest);

    // The index's one bundle referrer: its manifest, and the bundle itself.
    let listing = skopeo_inspect_raw(&format!(
        "{}:{}",
        registry.repo(&signed_repo),
        signed_digest.replacen(':', "-", 1)
    ));
    let bundle_entry = listing["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["artifactType"] == BUNDLE)
        .unwrap()
        .clone();
    let referrer = skopeo_inspect_raw(&format!(
        "{}@{}",
        registry.repo(&signed_repo),
        bundle_entry["digest"].as_str().unwrap()
    ));
    let bundle = bundles(&registry, &signed_repo, &signed_digest).remove(0);

    let refused = |reference: &str, what: &str, why: &str| {
        let out = run(polyarch()
            .args(["verify", "--require-signature", "--key"])
            .arg(&public)
            .args([reference, "--platform", "linux/amd64"]));
        assert_eq!(
            out.status.code(),
            Some(1),
            "verify, {what}: {}",
            stderr(&out)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(why), "verify, {what}: {text}");
        let deploy = Deploy::write(
            dir.path(),
            &deployment("app", reference, Some("Always"), ""),
            &[("general", "amd64", 1)],
        );
        let out = run(deploy
            .gate()
            .args(["--require-signature", "--key"])
            .arg(&public));
        assert_eq!(out.status.code(), Some(1), "gate, {what}: {}", stderr(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("REFUSED"),
            "gate, {what}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    // Attaches `bundle` to `subject` in `repo` as the only referrer its tag lists.
    let attach = |repo: &str, subject: &str, bundle: &[u8]| {
        let layer = registry.put_blob(repo, bundle);
        registry.put_blob(repo, b"{}");
        let mut manifest = referrer.clone();
        manifest["layers"][0]["digest"] = layer.clone().into();
        manifest["layers"][0]["size"] = bundle.len().into();
        manifest["subject"]["digest"] = subject.into();
        let bytes = serde_json::to_vec(&manifest).unwrap();
        let digest = registry.put_manifest(
            repo,
            "latest-referrer",
            &bytes,
            "application/vnd.oci.image.manifest.v1+json",
        );
        let mut entry = bundle_entry.clone();
        entry["digest"] = digest.into();
        entry["size"] = bytes.len().into();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [entry],
        });
        registry.put_manifest(
            repo,
            &subject.replacen(':', "-", 1),
            &serde_json::to_vec(&index).unwrap(),
            "application/vnd.oci.image.index.v1+json",
        );
    };

    // Copied: the signed index's valid bundle attached to the other image's index.
    attach(&other_repo, &unsigned_digest, &bundle);
    refused(
        &unsigned,
        "a signature copied from another digest",
        &format!("signs {signed_digest}, not {unsigned_digest}"),
    );

    // Tampered: the payload names the other digest, the signature left as it was.
    let mut tampered: Value = serde_json::from_slice(&bundle).unwrap();
    let payload = b64
        .decode(tampered["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let forged = String::from_utf8(payload).unwrap().replace(
        signed_digest.trim_start_matches("sha256:"),
        unsigned_digest.trim_start_matches("sha256:"),
    );
    tampered["dsseEnvelope"]["payload"] = b64.encode(forged).into();
    attach(
        &other_repo,
        &unsigned_digest,
        &serde_json::to_vec(&tampered).unwrap(),
    );
    refused(
        &unsigned,
        "a tampered payload",
        "is signed by none of the keys given",
    );

    // The signed image itself still passes: the refusals are about the copies.
    let out = run(polyarch()
        .args(["verify", "--require-signature", "--key"])
        .arg(&public)
        .args([signed.as_str(), "--platform", "linux/amd64"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A build with provenance, an SBOM and a signature writes each subject's referrers tag
/// (the distribution registry has no referrers API) once, listing all its attachments,
/// and a rerun that finds them all writes none.
#[test]
fn each_subjects_referrers_tag_is_written_once_for_all_its_attachments() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    hello_context(dir.path(), HELLO);
    let (key, _) = openssl_key(dir.path(), "signer");
    let repo = unique_name("demo/sign-once");
    let file = support::write_project(
        dir.path(),
        &proxy.repo(&repo),
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let cache = tempfile::tempdir().unwrap();
    let build = || {
        run(polyarch()
            .args(["build", "--provenance", "--sbom", "--sign-key"])
            .arg(&key)
            .arg("-f")
            .arg(&file)
            .env("POLYARCH_CACHE_DIR", cache.path()))
    };
    // Referrers tag → how many times it was written, from the requests since `from`.
    let written = |from: usize| {
        let mut writes = BTreeMap::<String, usize>::new();
        for line in &proxy.log()[from..] {
            let Some(target) = line.strip_prefix("PUT ") else {
                continue;
            };
            if let Some((_, tag)) = target.split_once("/manifests/sha256-") {
                let tag = tag.split_whitespace().next().unwrap_or_default();
                *writes.entry(format!("sha256-{tag}")).or_default() += 1;
            }
        }
        writes
    };
    let out = build();
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = format!("{}:v1", registry.repo(&repo));
    let tags: Vec<String> = subjects(&reference)
        .iter()
        .map(|s| s.replacen(':', "-", 1))
        .collect();
    let once: BTreeMap<String, usize> = tags.iter().map(|t| (t.clone(), 1)).collect();
    assert_eq!(written(0), once, "{:#?}", proxy.log());
    // Each platform's one index lists its provenance, SBOM and signature; the index's,
    // its signature.
    for (n, tag) in tags.iter().enumerate() {
        let listed = skopeo_inspect_raw(&format!("{}:{tag}", registry.repo(&repo)));
        let expected = if n == 0 { 1 } else { 3 };
        assert_eq!(
            listed["manifests"].as_array().unwrap().len(),
            expected,
            "{listed}"
        );
    }

    let before = proxy.log().len();
    let out = build();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(written(before), BTreeMap::new(), "{}", stderr(&out));
}

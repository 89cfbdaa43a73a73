//! `sbom: true`: an SPDX SBOM made by polyarch from each platform image's layers (a
//! FROM-scratch image holding a dpkg status file, a distroless status.d entry that an
//! upper layer deletes, an apk database and os-release), attached as an OCI referrer of
//! each platform manifest beside provenance (the distribution registry has no referrers
//! API: the tag schema), read back by `polyarch sbom` and `verify --sbom`, and validated
//! by the SPDX project's own `pyspdxtools`; on whichever engine `DOCKER_HOST` names.

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use proxy::Proxy;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::gate::{deployment, Deploy};
use support::supply_chain::assert_spdx_tools_accept;
use support::{
    as_a_user_runs_cargo, busybox, curl, hello_context, layer_digests, polyarch, repo_root, run,
    skopeo_inspect_raw, unique_name, write_project, Registry, HELLO,
};

const SPDX: &str = "https://spdx.dev/Document";
const SLSA: &str = "https://slsa.dev/provenance/v1";

/// The upper layer's RUN deletes the distroless tzdata entry (a whiteout) with the build
/// machine's busybox, which runs natively for either target platform and deletes itself.
const DOCKERFILE: &str = "FROM scratch
ARG TARGETARCH
ARG BUILDARCH
COPY rootfs/${TARGETARCH}/ /
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY bin/${BUILDARCH}/busybox /tmp/busybox
RUN [\"/tmp/busybox\", \"rm\", \"/var/lib/dpkg/status.d/tzdata\", \"/tmp/busybox\"]
ENTRYPOINT [\"/bin/busybox\", \"echo\", \"hello\"]
";

/// The packages each platform's SBOM must list: `(purl, licence declared)`.
fn expected(arch: &str) -> Vec<(String, String)> {
    let apk_arch = if arch == "amd64" { "x86_64" } else { "aarch64" };
    let mut out = vec![
        (
            format!("pkg:deb/debian/base-files@12.4%2Bdeb12u5?arch={arch}&distro=debian-12"),
            "NOASSERTION".to_string(),
        ),
        (
            format!("pkg:deb/debian/libc6@2.36-9%2Bdeb12u7?arch={arch}&distro=debian-12"),
            "NOASSERTION".to_string(),
        ),
        (
            format!("pkg:apk/debian/musl@1.2.4-r2?arch={apk_arch}&distro=debian-12"),
            "MIT".to_string(),
        ),
        (
            format!("pkg:apk/debian/busybox@1.36.1-r15?arch={apk_arch}&distro=debian-12"),
            "GPL-2.0-only".to_string(),
        ),
    ];
    out.sort();
    out
}

fn context(dir: &Path) {
    fs::write(dir.join("Dockerfile"), DOCKERFILE).unwrap();
    for arch in ["amd64", "arm64"] {
        let bin = dir.join("bin").join(arch);
        fs::create_dir_all(&bin).unwrap();
        fs::copy(busybox(arch), bin.join("busybox")).unwrap();
        let root = dir.join("rootfs").join(arch);
        let apk_arch = if arch == "amd64" { "x86_64" } else { "aarch64" };
        let files = [
            (
                "etc/os-release",
                "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n"
                    .to_string(),
            ),
            (
                "var/lib/dpkg/status",
                format!("Package: base-files\nStatus: install ok installed\nArchitecture: {arch}\nVersion: 12.4+deb12u5\nDescription: Debian base system\n miscellaneous files\n\nPackage: libc6\nStatus: install ok installed\nArchitecture: {arch}\nSource: glibc\nVersion: 2.36-9+deb12u7\n"),
            ),
            (
                "var/lib/dpkg/status.d/tzdata",
                "Package: tzdata\nVersion: 2024a-0+deb12u1\nArchitecture: all\n".to_string(),
            ),
            (
                "lib/apk/db/installed",
                format!("C:Q1abc=\nP:musl\nV:1.2.4-r2\nA:{apk_arch}\nL:MIT\n\nC:Q1def=\nP:busybox\nV:1.36.1-r15\nA:{apk_arch}\nL:GPL-2.0-only\n"),
            ),
        ];
        for (path, text) in files {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
    }
}

fn project(dir: &Path, repository: &str, sbom: bool) -> PathBuf {
    project_for(dir, repository, sbom, "[linux/amd64, linux/arm64]")
}

fn project_for(dir: &Path, repository: &str, sbom: bool, platforms: &str) -> PathBuf {
    let file = dir.join("polyarch.yaml");
    fs::write(
        &file,
        format!(
            "version: 1\nimages:\n  hello:\n    repository: {repository}\n    tags: [v1]\n    context: .\n    platforms: {platforms}\n    provenance: true\n    sbom: {sbom}\n"
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

fn sbom(reference: &str, platform: &str) -> Output {
    run(polyarch().args(["sbom", reference, "--platform", platform]))
}

/// The platform manifests the index lists: exactly two, nothing attached as an entry.
fn platform_entries(reference: &str) -> Vec<(String, String)> {
    let index = skopeo_inspect_raw(reference);
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{index}");
    entries
        .iter()
        .map(|e| {
            assert!(e.get("artifactType").is_none(), "{index}");
            (
                e["platform"]["architecture"].as_str().unwrap().to_string(),
                e["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The SBOM referrer of `subject` as the referrers tag schema lists it (beside the
/// provenance), its statement checked; returns the referrer's digest.
fn check_referrer(registry: &Registry, repo: &str, subject: &str) -> String {
    let tag = subject.replacen(':', "-", 1);
    let listing = skopeo_inspect_raw(&format!("{}:{tag}", registry.repo(repo)));
    let listed = listing["manifests"].as_array().unwrap();
    let types: Vec<&str> = listed
        .iter()
        .map(|d| {
            d["annotations"]["in-toto.io/predicate-type"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(types.len(), 2, "{listing}");
    assert!(types.contains(&SLSA) && types.contains(&SPDX), "{listing}");
    let entry = listed
        .iter()
        .find(|d| d["annotations"]["in-toto.io/predicate-type"] == SPDX)
        .unwrap();
    assert_eq!(entry["artifactType"], "application/vnd.in-toto+json");
    let digest = entry["digest"].as_str().unwrap().to_string();
    let manifest = skopeo_inspect_raw(&format!("{}@{digest}", registry.repo(repo)));
    assert_eq!(manifest["subject"]["digest"], subject, "{manifest}");
    let blob = manifest["layers"][0]["digest"].as_str().unwrap();
    let bytes = curl(&[&format!("{}/v2/{repo}/blobs/{blob}", registry.url())]);
    let statement: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(statement["predicateType"], SPDX);
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        subject.trim_start_matches("sha256:")
    );
    assert_eq!(statement["predicate"]["spdxVersion"], "SPDX-2.3");
    digest
}

/// Builds `dir/rootfs` as a one-platform (linux/amd64) FROM-scratch image with `sbom: true`
/// and returns its SBOM as `polyarch sbom` reads it back, checked by `pyspdxtools`.
fn sbom_of_rootfs(dir: &Path, name: &str) -> Value {
    let registry = Registry::start();
    fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY rootfs/ /\n").unwrap();
    let repo = unique_name(name);
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = project_for(dir, &registry.repo(&repo), true, "[linux/amd64]");
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = sbom(&reference, "linux/amd64");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_spdx_tools_accept(&dir.join("sbom.spdx.json"), &out.stdout);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The SBOM's packages of one purl type: `(name, versionInfo, purl, licenseDeclared)`,
/// sorted.
fn packages_of(document: &Value, purl_type: &str) -> Vec<[String; 4]> {
    let mut out: Vec<[String; 4]> = document["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let purl = p["externalRefs"][0]["referenceLocator"].as_str()?;
            purl.starts_with(&format!("pkg:{purl_type}/")).then(|| {
                [
                    &p["name"],
                    &p["versionInfo"],
                    &p["externalRefs"][0]["referenceLocator"],
                    &p["licenseDeclared"],
                ]
                .map(|v| v.as_str().unwrap().to_string())
            })
        })
        .collect();
    out.sort();
    out
}

/// Runs a tool the tests check polyarch against; its standard output.
fn tool(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `(purl, licenseDeclared)` of every package but the image itself, sorted.
fn packages(document: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = document["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["SPDXID"] != "SPDXRef-Image")
        .map(|p| {
            (
                p["externalRefs"][0]["referenceLocator"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                p["licenseDeclared"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn each_platform_gets_an_sbom_of_its_layers_that_spdx_tools_accept() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    context(dir.path());
    let repo = unique_name("demo/sbom");
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = project(dir.path(), &registry.repo(&repo), true);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let mut referrers = Vec::new();
    for (arch, subject) in platform_entries(&reference) {
        referrers.push(check_referrer(&registry, &repo, &subject));
        let out = sbom(&reference, &format!("linux/{arch}"));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let document: Value = serde_json::from_slice(&out.stdout).unwrap();
        // The deleted status.d entry is not there; everything else is, with its purl.
        assert_eq!(packages(&document), expected(&arch), "{document}");
        assert!(document["name"].as_str().unwrap().contains(&subject));
        assert!(document["documentNamespace"]
            .as_str()
            .unwrap()
            .contains(subject.trim_start_matches("sha256:")));
        let sources: Vec<&str> = document["packages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["sourceInfo"].as_str())
            .collect();
        assert!(
            sources.contains(&"acquired package info from /var/lib/dpkg/status")
                && sources.contains(&"acquired package info from /lib/apk/db/installed"),
            "{sources:?}"
        );
        assert_spdx_tools_accept(&dir.path().join(format!("{arch}.spdx.json")), &out.stdout);
    }

    // verify --sbom reads them back and counts their packages.
    let out = run(polyarch().args([
        "verify",
        &reference,
        "--platform",
        "linux/amd64,linux/arm64",
        "--sbom",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text.matches("sbom: 4 packages (apk 2, deb 2)").count(),
        2,
        "{text}"
    );

    // A rerun keeps the SBOM each manifest has: no second referrer, no new document.
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for ((_, subject), referrer) in platform_entries(&reference).iter().zip(&referrers) {
        assert_eq!(&check_referrer(&registry, &repo, subject), referrer);
    }
}

#[test]
fn an_image_without_an_sbom_is_a_gap_for_require_sbom_and_polyarch_sbom_says_so() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    context(dir.path());
    let repo = unique_name("demo/nosbom");
    let reference = format!("{}:v1", registry.repo(&repo));
    let file = project(dir.path(), &registry.repo(&repo), false);
    let out = build(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = sbom(&reference, "linux/arm64");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(
        err.contains("has no SBOM attached") && err.contains("sbom: true"),
        "{err}"
    );
    let out = sbom(&reference, "linux/s390x");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("linux/amd64, linux/arm64"),
        "{}",
        stderr(&out)
    );

    let out = run(polyarch().args([
        "verify",
        "--output-format",
        "json",
        &reference,
        "--platform",
        "linux/amd64,linux/arm64",
        "--sbom",
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    for platform in record["images"][0]["platforms"].as_array().unwrap() {
        assert_eq!(platform["status"], "sbom_missing", "{platform}");
    }
    // --require-sbom on verify, build and gate: the same gap, named.
    let out = run(polyarch().args([
        "verify",
        &reference,
        "--platform",
        "linux/amd64,linux/arm64",
        "--require-sbom",
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("linux/arm64") && text.contains("has no SBOM attached"),
        "{text}"
    );
    let out = build(&file, &["--require-sbom"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let deploy = Deploy::write(
        dir.path(),
        &deployment("app", &reference, Some("Always"), ""),
        &[("graviton", "arm64", 1)],
    );
    let gate = || {
        run(deploy
            .gate()
            .args(["--require-sbom", "--output-format", "json"]))
    };
    let out = gate();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["kind"])
        .collect();
    assert_eq!(kinds, ["sbom_missing", "sbom_missing"], "{report:#}");

    // --sbom attaches it to the images already pushed; then the gap is closed.
    let out = build(&file, &["--sbom"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = gate();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = sbom(&reference, "linux/arm64");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let document: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(packages(&document), expected("arm64"));
}

/// Two tiny noarch packages, one with an epoch, as rpmbuild builds them.
const RPM_SPECS: [(&str, &str); 2] = [
    (
        "hello",
        "Name: polyarch-hello\nVersion: 1.2.3\nRelease: 4.fc40\nEpoch: 2\nSummary: a test package\nLicense: MIT AND Apache-2.0\nBuildArch: noarch\n%description\nA test package.\n%files\n",
    ),
    (
        "tools",
        "Name: polyarch-tools\nVersion: 0.9\nRelease: 1\nSummary: another\nLicense: MIT\nBuildArch: noarch\n%description\nAnother.\n%files\n",
    ),
];

#[test]
fn the_rpm_packages_of_an_image_are_those_rpm_itself_lists() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("rpmbuild");
    let db = dir.path().join("rootfs/var/lib/rpm");
    fs::create_dir_all(top.join("SPECS")).unwrap();
    fs::create_dir_all(&db).unwrap();
    // Debian's rpm writes sqlite databases by default; said here so that it always does.
    let rpm = |what: &[&str]| {
        let mut cmd = Command::new("rpm");
        cmd.args(["--define", "_db_backend sqlite", "--dbpath"])
            .arg(&db)
            .args(what);
        cmd
    };
    for (name, spec) in RPM_SPECS {
        let path = top.join("SPECS").join(format!("{name}.spec"));
        fs::write(&path, spec).unwrap();
        tool(
            Command::new("rpmbuild")
                .args(["-bb", "--quiet", "--nodeps", "--define"])
                .arg(format!("_topdir {}", top.display()))
                .arg(&path),
        );
    }
    tool(&mut rpm(&["--initdb"]));
    let built: Vec<PathBuf> = fs::read_dir(top.join("RPMS/noarch"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(built.len(), 2, "{built:?}");
    tool(rpm(&["-i", "--justdb", "--nodeps", "--noscripts"]).args(&built));
    assert!(db.join("rpmdb.sqlite").is_file());
    let listed = tool(&mut rpm(&[
        "-qa",
        "--qf",
        "%{NAME} %|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE} %{ARCH} %{LICENSE}\n",
    ]));
    let mut expected: Vec<String> = listed.lines().map(str::to_string).collect();
    expected.sort();
    assert_eq!(expected.len(), 2, "{listed}");
    // rpm leaves its lock, and SQLite's -wal and -shm files, beside the database: in the
    // image too, as a package manager's RUN step leaves them.
    fs::create_dir_all(dir.path().join("rootfs/etc")).unwrap();
    fs::write(
        dir.path().join("rootfs/etc/os-release"),
        "NAME=\"Fedora Linux\"\nID=fedora\nVERSION_ID=40\n",
    )
    .unwrap();

    let document = sbom_of_rootfs(dir.path(), "demo/sbom-rpm");
    let found = packages_of(&document, "rpm");
    let got: Vec<String> = found
        .iter()
        .map(|[name, version, purl, license]| {
            let arch = purl
                .split("arch=")
                .nth(1)
                .unwrap()
                .split('&')
                .next()
                .unwrap();
            format!("{name} {version} {arch} {license}")
        })
        .collect();
    assert_eq!(got, expected, "{document}");
    let purls: Vec<&str> = found.iter().map(|p| p[2].as_str()).collect();
    assert_eq!(
        purls,
        [
            "pkg:rpm/fedora/polyarch-hello@1.2.3-4.fc40?arch=noarch&distro=fedora-40&epoch=2",
            "pkg:rpm/fedora/polyarch-tools@0.9-1?arch=noarch&distro=fedora-40",
        ]
    );
    assert!(
        document["packages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["SPDXID"] != "SPDXRef-Image")
            .all(|p| p["sourceInfo"] == "acquired package info from /var/lib/rpm/rpmdb.sqlite"),
        "{document}"
    );
    assert!(document.get("comment").is_none(), "{document}");
}

/// A module written by the test in `dir`: its go.mod (module `path`) and one source file.
fn go_module(dir: &Path, path: &str, body: &str) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("go.mod"), format!("module {path}\n\ngo 1.18\n")).unwrap();
    fs::write(dir.join("lib.go"), body).unwrap();
}

/// A module proxy in a directory (GOPROXY=file://…) serving `module@version` from `src`:
/// `@v/list`, `.info`, `.mod` and the module zip (written with Python's zipfile).
fn go_proxy_module(proxy: &Path, src: &Path, module: &str, version: &str) {
    let at = proxy.join(module).join("@v");
    fs::create_dir_all(&at).unwrap();
    fs::write(at.join("list"), format!("{version}\n")).unwrap();
    fs::write(
        at.join(format!("{version}.info")),
        format!("{{\"Version\":\"{version}\"}}"),
    )
    .unwrap();
    fs::copy(src.join("go.mod"), at.join(format!("{version}.mod"))).unwrap();
    tool(Command::new("python3").args([
        "-c",
        "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z:\n    for f in ('go.mod', 'lib.go'):\n        z.write(sys.argv[2] + '/' + f, sys.argv[3] + '/' + f)",
    ])
    .arg(at.join(format!("{version}.zip")))
    .arg(src)
    .arg(format!("{module}@{version}")));
}

/// What `go version -m` prints of a binary, as the SBOM states it: the Go version as
/// `stdlib`, the main module, each dependency, a `=>` replacement standing for the module
/// it replaces (a directory replacement keeping the module's path).
fn go_version_m(binary: &Path) -> Vec<(String, String)> {
    let text = tool(Command::new("go").arg("version").arg("-m").arg(binary));
    let mut lines = text.lines();
    let go = lines.next().unwrap().rsplit_once(": ").unwrap().1;
    let mut modules = vec![("stdlib".to_string(), go.to_string())];
    for line in lines {
        match line.trim_start().split('\t').collect::<Vec<_>>()[..] {
            ["mod" | "dep", path, version, ..] => modules.push((path.into(), version.into())),
            ["=>", path, version, ..] => {
                let last = modules.last_mut().unwrap();
                if !path.starts_with(['.', '/']) {
                    last.0 = path.into();
                }
                last.1 = version.into();
            }
            _ => {}
        }
    }
    modules.sort();
    modules
}

#[test]
fn the_go_modules_of_a_binary_are_those_go_version_m_prints() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let proxy = dir.path().join("proxy");
    // A versioned dependency and a fork that replaces another, from a local module proxy,
    // and one replaced by a directory: all three kinds of `dep` line.
    for (module, version) in [
        ("example.com/polyarch/lib", "v1.4.2"),
        ("example.com/polyarch/fork", "v1.0.1"),
    ] {
        let name = module.rsplit('/').next().unwrap();
        go_module(
            &src.join(name),
            module,
            &format!("package {name}\n\nfunc Name() string {{ return \"{name}\" }}\n"),
        );
        go_proxy_module(&proxy, &src.join(name), module, version);
    }
    go_module(
        &src.join("local"),
        "example.com/polyarch/local",
        "package local\n\nfunc Name() string { return \"local\" }\n",
    );
    let app = src.join("app");
    fs::create_dir_all(&app).unwrap();
    fs::write(
        app.join("go.mod"),
        "module example.com/polyarch/app\n\ngo 1.18\n\nrequire (\n\texample.com/polyarch/lib v1.4.2\n\texample.com/polyarch/old v1.0.0\n\texample.com/polyarch/local v0.3.0\n)\n\nreplace example.com/polyarch/old => example.com/polyarch/fork v1.0.1\n\nreplace example.com/polyarch/local => ../local\n",
    )
    .unwrap();
    fs::write(
        app.join("main.go"),
        "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/polyarch/lib\"\n\t\"example.com/polyarch/local\"\n\told \"example.com/polyarch/old\"\n)\n\nfunc main() { fmt.Println(lib.Name(), old.Name(), local.Name()) }\n",
    )
    .unwrap();
    let bin = dir.path().join("rootfs/usr/local/bin");
    fs::create_dir_all(&bin).unwrap();
    let go_dir = |name: &str| dir.path().join("go").join(name);
    tool(
        Command::new("go")
            .args(["build", "-trimpath", "-o"])
            .arg(bin.join("app"))
            .arg(".")
            .current_dir(&app)
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", format!("file://{}", proxy.display()))
            .env("GOSUMDB", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GOOS", "linux")
            .env("GOARCH", "amd64")
            .env("CGO_ENABLED", "0")
            .env("GOPATH", go_dir("path"))
            .env("GOCACHE", go_dir("cache"))
            .env("GOMODCACHE", go_dir("mod")),
    );
    let expected = go_version_m(&bin.join("app"));
    let dependencies: Vec<&str> = expected.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(
        dependencies,
        [
            "example.com/polyarch/app",
            "example.com/polyarch/fork",
            "example.com/polyarch/lib",
            "example.com/polyarch/local",
            "stdlib"
        ],
        "{expected:?}"
    );

    let document = sbom_of_rootfs(dir.path(), "demo/sbom-go");
    let found = packages_of(&document, "golang");
    let got: Vec<(String, String)> = found
        .iter()
        .map(|[name, version, ..]| (name.clone(), version.clone()))
        .collect();
    assert_eq!(got, expected, "{document}");
    let purls: Vec<&str> = found.iter().map(|p| p[2].as_str()).collect();
    assert!(
        purls.contains(&"pkg:golang/example.com/polyarch/lib@v1.4.2")
            && purls.contains(&"pkg:golang/example.com/polyarch/fork@v1.0.1"),
        "{purls:?}"
    );
}

#[test]
fn the_crates_of_a_cargo_auditable_binary_are_those_cargo_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    // An application with a path dependency: no registry is needed to build it.
    for (name, manifest, file, code) in [
        (
            "dep",
            "[package]\nname = \"polyarch-dep\"\nversion = \"0.2.0\"\nedition = \"2021\"\n",
            "lib.rs",
            "pub fn name() -> &'static str { \"dep\" }\n",
        ),
        (
            "app",
            "[package]\nname = \"polyarch-app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\npolyarch-dep = { path = \"../dep\" }\n\n[workspace]\n",
            "main.rs",
            "fn main() { println!(\"{}\", polyarch_dep::name()); }\n",
        ),
    ] {
        fs::create_dir_all(src.join(name).join("src")).unwrap();
        fs::write(src.join(name).join("Cargo.toml"), manifest).unwrap();
        fs::write(src.join(name).join("src").join(file), code).unwrap();
    }
    let auditable = tool(
        Command::new("bash")
            .arg(repo_root().join("scripts/crate-tool.sh"))
            .args(["cargo-auditable", "path"]),
    );
    // `cargo auditable` runs the `cargo-auditable` found on PATH.
    let path = format!(
        "{}:{}",
        Path::new(auditable.trim()).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let manifest = src.join("app/Cargo.toml");
    tool(
        as_a_user_runs_cargo(&mut Command::new("cargo"))
            .args([
                "auditable",
                "build",
                "--release",
                "--offline",
                "--manifest-path",
            ])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .env("PATH", path),
    );
    let bin = dir.path().join("rootfs/usr/local/bin");
    fs::create_dir_all(&bin).unwrap();
    fs::copy(
        dir.path().join("target/release/polyarch-app"),
        bin.join("app"),
    )
    .unwrap();
    // What cargo itself resolved for the build.
    let metadata: Value = serde_json::from_str(&tool(
        as_a_user_runs_cargo(&mut Command::new("cargo"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--offline",
                "--manifest-path",
            ])
            .arg(&manifest),
    ))
    .unwrap();
    let mut expected: Vec<(String, String)> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["version"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(expected.len(), 2, "{metadata}");

    let document = sbom_of_rootfs(dir.path(), "demo/sbom-cargo");
    let found = packages_of(&document, "cargo");
    let got: Vec<(String, String)> = found
        .iter()
        .map(|[name, version, ..]| (name.clone(), version.clone()))
        .collect();
    assert_eq!(got, expected, "{document}");
    assert_eq!(found[0][2], "pkg:cargo/polyarch-app@0.1.0");
}

/// The build host's own dpkg database copied into an image: the SBOM's deb packages are
/// what `dpkg-query` lists as installed (`ii`) from it, name, version and architecture.
#[test]
fn the_deb_packages_of_the_hosts_own_dpkg_database_are_those_dpkg_query_lists() {
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("rootfs/var/lib/dpkg");
    fs::create_dir_all(&admin).unwrap();
    fs::copy("/var/lib/dpkg/status", admin.join("status")).unwrap();
    fs::create_dir_all(dir.path().join("rootfs/etc")).unwrap();
    fs::copy("/etc/os-release", dir.path().join("rootfs/etc/os-release")).unwrap();
    let listed = tool(
        Command::new("dpkg-query")
            .arg(format!("--admindir={}", admin.display()))
            .args([
                "-W",
                "-f",
                "${db:Status-Abbrev}|${Package} ${Version} ${Architecture}\n",
            ]),
    );
    let mut wanted: Vec<String> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("ii |"))
        .map(str::to_string)
        .collect();
    wanted.sort();
    assert!(
        wanted.len() > 100,
        "the host lists {} packages",
        wanted.len()
    );

    let document = sbom_of_rootfs(dir.path(), "demo/hostdpkg");
    let mut found: Vec<String> = packages_of(&document, "deb")
        .into_iter()
        .map(|[name, version, purl, _]| {
            let arch = purl
                .split(['?', '&'])
                .find_map(|q| q.strip_prefix("arch="))
                .unwrap_or_default()
                .to_string();
            format!("{name} {version} {arch}")
        })
        .collect();
    found.sort();
    assert_eq!(found, wanted);
}

/// A layer both platforms hold (the same file copied into each) is read from the registry
/// once for their two SBOMs; every other layer once too.
#[test]
fn a_layer_both_platforms_share_is_read_once_for_their_sboms() {
    let registry = Registry::start();
    let proxy = Proxy::start(registry.port);
    let dir = tempfile::tempdir().unwrap();
    // Into `/`, which the layer does not hold: a directory the COPY made (`/etc`) would
    // carry the time of each platform's step, and two steps a second apart would give
    // the platforms two different layers.
    hello_context(dir.path(), &format!("{HELLO}COPY shared.txt /shared.txt\n"));
    fs::write(
        dir.path().join("shared.txt"),
        "the same on every platform\n",
    )
    .unwrap();
    let repo = unique_name("demo/sbom-shared");
    let file = write_project(
        dir.path(),
        &proxy.repo(&repo),
        "[v1]",
        "[linux/amd64, linux/arm64]",
    );
    let cache = tempfile::tempdir().unwrap();
    let out = run(polyarch()
        .args(["build", "--sbom", "-f"])
        .arg(&file)
        .env("POLYARCH_CACHE_DIR", cache.path()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let index = skopeo_inspect_raw(&format!("{}:v1", registry.repo(&repo)));
    let layers: Vec<Vec<String>> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let digest = entry["digest"].as_str().unwrap();
            layer_digests(&skopeo_inspect_raw(&format!(
                "{}@{digest}",
                registry.repo(&repo)
            )))
        })
        .collect();
    assert_eq!(layers.len(), 2, "{index}");
    let shared: Vec<&String> = layers[0].iter().filter(|d| layers[1].contains(d)).collect();
    assert_eq!(shared.len(), 1, "{layers:?}");
    let reads = |log: &[String], digest: &str| {
        log.iter()
            .filter(|line| line.starts_with("GET ") && line.contains(&format!("/blobs/{digest}")))
            .count()
    };
    let log = proxy.log();
    for digest in layers.iter().flatten() {
        assert_eq!(reads(&log, digest), 1, "{digest}: {log:#?}");
    }

    // A rerun that builds nothing keeps the SBOMs: no layer is read again (nor ahead).
    let again = run(polyarch()
        .args(["build", "--sbom", "-f"])
        .arg(&file)
        .env("POLYARCH_CACHE_DIR", cache.path()));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("already has an SBOM attached; kept").count(),
        2,
        "{stderr}"
    );
    let log = proxy.log();
    for digest in layers.iter().flatten() {
        assert_eq!(reads(&log, digest), 1, "{digest}: {log:#?}");
    }
}

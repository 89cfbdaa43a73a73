//! `build --output oci:DIR` on a standalone BuildKit daemon: the daemon's `oci` exporter
//! sends each platform image back through the session, and polyarch writes the layout.

mod support;

use serde_json::Value;
use std::process::Command;
use support::{run, unique_name, Registry};

#[test]
fn buildkitd_writes_an_oci_layout_that_skopeo_reads_and_copies() {
    let bk = support::buildkitd::shared();
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    support::hello_context(
        dir.path(),
        "FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo built > /built\"]\n",
    );
    // The repository is never reached: the image goes to the layout only.
    let file = support::write_project(
        dir.path(),
        "127.0.0.1:1/unused/hello",
        "[v1]",
        "[linux/amd64]",
    );
    let name = unique_name("bkdoci");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("  hello:", &format!("  {name}:"))).unwrap();
    let layout = dir.path().join("out");

    let out = run(support::polyarch()
        .env("BUILDKIT_HOST", &bk.unix)
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env_remove("DOCKER_CONTEXT")
        .args(["build", "-f"])
        .arg(&file)
        .arg("--output")
        .arg(format!("oci:{}", layout.display())));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("on BuildKit daemon {}", bk.unix)),
        "{stderr}"
    );

    let inspect = run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:v1", layout.display())));
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let index: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(manifests[0]["platform"]["os"], "linux", "{index}");
    assert_eq!(manifests[0]["platform"]["architecture"], "amd64", "{index}");

    let target = registry.repo(&unique_name("bkdoci/copied"));
    let copy = run(Command::new("skopeo")
        .args(["copy", "--all", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://{target}:v1")));
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let config = support::skopeo_config(&format!("{target}:v1"), "amd64", None);
    assert_eq!(config["architecture"], "amd64", "{config}");
}

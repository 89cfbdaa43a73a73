//! polyarch on a standalone BuildKit daemon (scripts/buildkitd.sh): its workers'
//! platforms over unix and mutual TLS, and each TLS mistake refused before any build.

mod support;

use polyarch::buildkit::daemon::{Daemon, DaemonError};
use polyarch::endpoint::{Endpoint, EndpointError, TlsFiles};
use polyarch::platform::Platform;
use std::path::Path;
use std::process::Command;

fn tls(dir: &Path) -> TlsFiles {
    TlsFiles {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("cert.pem")),
        key: Some(dir.join("key.pem")),
        skip_verify: false,
    }
}

async fn connect(address: &str, tls: Option<&TlsFiles>) -> Result<Daemon, DaemonError> {
    let endpoint = Endpoint::resolve(address, tls)?;
    let daemon = Daemon::connect(&endpoint).await?;
    // The first call: TLS 1.3 tells a refused client certificate only now.
    daemon.version().await?;
    Ok(daemon)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_lists_its_platforms_over_unix_and_mutual_tls() {
    let bk = support::buildkitd::shared();
    let amd64: Platform = "linux/amd64".parse().unwrap();
    for (address, files) in [(&bk.unix, None), (&bk.tcp, Some(tls(&bk.tls)))] {
        let daemon = connect(address, files.as_ref()).await.unwrap();
        let platforms = daemon.platforms().await.unwrap();
        assert!(platforms.contains(&amd64), "{address}: {platforms:?}");
        assert_eq!(daemon.version().await.unwrap(), "v0.32.2");
    }
}

/// A CA of its own, with a client certificate it signed: both unknown to the daemon.
fn other_ca(dir: &Path) {
    let sh = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other-ca -keyout ca.key -out ca.pem
printf 'extendedKeyUsage=clientAuth\n' >client.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=other -keyout key.pem -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile client.ext -out cert.pem"#;
    let out = Command::new("sh")
        .args(["-c", sh])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_mutual_tls_mistakes_are_refused_with_the_fix() {
    let bk = support::buildkitd::shared();
    let other = tempfile::tempdir().unwrap();
    other_ca(other.path());

    // The daemon's certificate checked against a CA that did not sign it.
    let wrong_ca = TlsFiles {
        ca: Some(other.path().join("ca.pem")),
        ..tls(&bk.tls)
    };
    let error = connect(&bk.tcp, Some(&wrong_ca)).await.err().unwrap();
    assert!(
        matches!(
            error,
            DaemonError::Endpoint(EndpointError::UntrustedServer { .. })
        ),
        "{error:?}"
    );

    // No client certificate, and one the daemon's CA did not sign.
    let no_cert = TlsFiles {
        cert: None,
        key: None,
        ..tls(&bk.tls)
    };
    let foreign_cert = TlsFiles {
        cert: Some(other.path().join("cert.pem")),
        key: Some(other.path().join("key.pem")),
        ..tls(&bk.tls)
    };
    for files in [no_cert, foreign_cert] {
        let error = connect(&bk.tcp, Some(&files)).await.err().unwrap();
        assert!(
            matches!(
                error,
                DaemonError::Endpoint(EndpointError::ClientCertRefused { .. })
            ),
            "{files:?}: {error:?}"
        );
    }

    // Plain text on the TLS listener.
    let error = connect(&bk.tcp, None).await.err().unwrap();
    assert!(matches!(error, DaemonError::NotGrpc { .. }), "{error:?}");
    let shown = error.to_string();
    assert!(
        !shown.contains('\n') && shown.contains("tls: ca, cert, key"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildkitd_builds_a_context_sent_through_its_control_session() {
    use polyarch::buildkit::{solve_on, DockerfileBuild, Exporter, SessionAuth, Target};
    use std::collections::HashMap;
    let bk = support::buildkitd::shared();
    let context = tempfile::tempdir().unwrap();
    let marker = support::unique_name("marker");
    std::fs::write(context.path().join("marker"), &marker).unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        "FROM scratch\nCOPY marker /marker\n",
    )
    .unwrap();
    let daemon = connect(&bk.unix, None).await.unwrap();
    let build = DockerfileBuild {
        context: context.path(),
        dockerfile: Path::new("Dockerfile"),
        frontend_attrs: HashMap::from([("platform".into(), "linux/amd64".into())]),
        entitlements: vec![],
        // Kept in the daemon's own store: the session is what is under test here.
        exporter: Exporter {
            kind: "image".into(),
            attrs: HashMap::from([("name".into(), format!("polyarch.test/{marker}"))]),
        },
        secrets: Default::default(),
        ssh: Default::default(),
        cache_from: vec![],
        cache_to: None,
    };
    let solved = solve_on(
        Target::Daemon(&daemon),
        build,
        SessionAuth::default(),
        |_| {},
    )
    .await
    .unwrap();
    let digest = &solved.exporter_response["containerimage.digest"];
    assert!(
        digest.starts_with("sha256:"),
        "{:?}",
        solved.exporter_response
    );
    // The context travelled through the session's file sync.
    assert!(!solved.transfers.is_empty());
}

//! The HTTP clients of a run, each built on first use: building one loads the system's
//! CA store.

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::Client;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The registry clients, each built on first use.
pub(super) struct Clients {
    /// Extra CAs to trust (`--ca-cert`, often `SSL_CERT_FILE`, the whole system bundle;
    /// Docker's `certs.d`), read by the first verified client only: a run that speaks
    /// plain HTTP or unverified TLS never reads them.
    pub(super) ca_files: Vec<PathBuf>,
    pub(super) extra_root_certificates: OnceLock<Vec<Certificate>>,
    /// HTTPS, verified against the system roots plus the extra CAs.
    pub(super) https: OnceLock<Client>,
    /// HTTPS without certificate checks: telling TLS from plain HTTP, and
    /// `--insecure-registry` hosts that speak TLS.
    pub(super) unverified: OnceLock<Client>,
    /// Plain HTTP for loopback and `--insecure-registry` registries.
    pub(super) plain: OnceLock<Client>,
    /// reqwest itself, verified and not, for what oci-client cannot share: the `/v2/`
    /// challenge of a TLS registry and token fetches.
    pub(super) http: OnceLock<reqwest::Client>,
    pub(super) http_unverified: OnceLock<reqwest::Client>,
}

impl Clients {
    /// The extra CAs, read on first use. `Registry::new` saw each file exist; one that
    /// cannot be read now is left out, as a file that is no PEM certificate is, and the
    /// registry's certificate is then refused with the `--ca-cert` advice.
    fn extra_root_certificates(&self) -> &[Certificate] {
        self.extra_root_certificates.get_or_init(|| {
            self.ca_files
                .iter()
                .filter_map(|path| std::fs::read(path).ok())
                .map(|data| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data,
                })
                .collect()
        })
    }

    fn config(&self, protocol: ClientProtocol, verified: bool) -> ClientConfig {
        ClientConfig {
            protocol,
            // One streaming PUT per blob: the size is known from the spool file.
            use_monolithic_push: true,
            extra_root_certificates: if verified {
                self.extra_root_certificates().to_vec()
            } else {
                Vec::new()
            },
            accept_invalid_certificates: !verified,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        }
    }

    pub(super) fn https(&self) -> &Client {
        self.https
            .get_or_init(|| Client::new(self.config(ClientProtocol::Https, true)))
    }

    pub(super) fn unverified(&self) -> &Client {
        self.unverified
            .get_or_init(|| Client::new(self.config(ClientProtocol::Https, false)))
    }

    pub(super) fn http(&self, verified: bool) -> &reqwest::Client {
        let cell = if verified {
            &self.http
        } else {
            &self.http_unverified
        };
        cell.get_or_init(|| {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(60))
                .danger_accept_invalid_certs(!verified);
            if verified {
                // A file that is no PEM certificate fails oci-client's clients already.
                for pem in self.extra_root_certificates() {
                    if let Ok(certificate) = reqwest::Certificate::from_pem(&pem.data) {
                        builder = builder.add_root_certificate(certificate);
                    }
                }
            }
            // As oci-client's own clients: a builder that fails falls back to the default.
            builder.build().unwrap_or_else(|_| reqwest::Client::new())
        })
    }

    /// Unverified, as Docker treats insecure registries: a registry trusted over plain
    /// HTTP gains nothing from checking an HTTPS redirect's certificate (what arrives is
    /// checked by digest), and building a verifier reads the system's CA store, most of a
    /// `verify`'s start-up.
    pub(super) fn plain(&self) -> &Client {
        self.plain
            .get_or_init(|| Client::new(self.config(ClientProtocol::Http, false)))
    }
}

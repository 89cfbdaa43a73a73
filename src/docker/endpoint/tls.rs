//! TLS to an engine: the Docker CLI's CA, client certificate and key files, or no
//! verification for a context that skips it.

use super::*;

impl Tls {
    pub(super) fn load(endpoint: &str, host: &str, files: &TlsFiles) -> Result<Tls, EndpointError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| EndpointError::TlsFile {
                path: path.to_path_buf(),
                source,
            })
        };
        let material = |path: &Path, reason: &str| EndpointError::TlsMaterial {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| EndpointError::TlsSetup {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?;
        let builder = if files.skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            match &files.ca {
                // As the Docker CLI: the given CA only, not the system roots besides.
                Some(ca) => {
                    let pem = read(ca)?;
                    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&pem)
                        .collect::<Result<_, _>>()
                        .map_err(|_| material(ca, "not a PEM certificate file"))?;
                    let (added, _) = roots.add_parsable_certificates(certs);
                    if added == 0 {
                        return Err(material(ca, "holds no usable CA certificate"));
                    }
                }
                None => {
                    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                }
            }
            builder.with_root_certificates(roots)
        };
        let config = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                let pem = read(cert)?;
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<_, _>>()
                    .map_err(|_| material(cert, "not a PEM certificate file"))?;
                if chain.is_empty() {
                    return Err(material(cert, "holds no certificate"));
                }
                let key_pem = read(key)?;
                let private = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|_| material(key, "holds no PEM private key"))?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| material(key, &format!("does not fit the certificate: {e}")))?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), None) => return Err(material(cert, "a client certificate needs its key")),
            (None, Some(key)) => return Err(material(key, "a client key needs its certificate")),
        };
        let name = files.server_name.as_deref().unwrap_or(host);
        let server_name =
            ServerName::try_from(name.to_string()).map_err(|_| EndpointError::Address {
                address: endpoint.to_string(),
                reason: format!("`{name}` is not a host name or IP address TLS can check"),
            })?;
        Ok(Tls {
            config: Arc::new(config),
            server_name,
        })
    }
}

/// `SkipTLSVerify`: the engine's certificate is taken as it is; signatures are still
/// checked so the handshake itself stays sound.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

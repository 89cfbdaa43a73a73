//! Signing and public keys: a PKCS#8 ECDSA P-256 PEM, or the encrypted private key
//! `cosign generate-key-pair` writes (scrypt, then NaCl secretbox, around a PKCS#8 DER).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::XSalsa20Poly1305;
use p256::ecdsa;
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// The PEM labels cosign writes its encrypted private keys under (the older one first).
const COSIGN_LABELS: [&str; 2] = [
    "ENCRYPTED COSIGN PRIVATE KEY",
    "ENCRYPTED SIGSTORE PRIVATE KEY",
];
/// How to make a key polyarch reads, said wherever one is refused.
const MAKE_ONE: &str = "give a key from `cosign generate-key-pair` or a PKCS#8 ECDSA P-256 PEM \
                        (`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`)";

/// Why a key cannot be used. Each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the key {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is an encrypted cosign key and no password was given; set COSIGN_PASSWORD \
         or pass --sign-password-stdin"
    )]
    NoPassword { path: PathBuf },
    #[error(
        "{path}: wrong password for this cosign key; set COSIGN_PASSWORD (or \
         --sign-password-stdin) to the one given to `cosign generate-key-pair`"
    )]
    WrongPassword { path: PathBuf },
    #[error("{path} is not a signing key polyarch can use ({why}); {MAKE_ONE}")]
    Unsupported { path: PathBuf, why: String },
    #[error(
        "{path} is not an ECDSA P-256 public key ({why}); give the PEM public key \
         (`cosign.pub`, or `openssl pkey -pubout` of the private key)"
    )]
    NotPublic { path: PathBuf, why: String },
}

/// A private key to sign with.
pub struct SigningKey {
    pub(crate) key: ecdsa::SigningKey,
    /// Its public key's fingerprint (see [`PublicKey::fingerprint`]).
    pub fingerprint: String,
}

/// A public key to check signatures with.
#[derive(Debug, Clone)]
pub struct PublicKey {
    pub(crate) key: ecdsa::VerifyingKey,
    pub path: PathBuf,
    /// base64 of the SHA-256 of its DER (SubjectPublicKeyInfo): the `hint` cosign writes
    /// into a bundle, so the two tools name a key alike.
    pub fingerprint: String,
}

impl std::fmt::Debug for SigningKey {
    // Never the private scalar, even in a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.fingerprint)
    }
}

impl SigningKey {
    /// Reads the private key at `path`; `password` opens a cosign key (an empty one is a
    /// password too: `cosign generate-key-pair` allows it).
    pub fn load(path: &Path, password: Option<&str>) -> Result<SigningKey, KeyError> {
        let text = read(path)?;
        SigningKey::parse(path, &text, password)
    }

    fn parse(path: &Path, text: &str, password: Option<&str>) -> Result<SigningKey, KeyError> {
        let unsupported = |why: &str| KeyError::Unsupported {
            path: path.to_path_buf(),
            why: why.to_string(),
        };
        let (label, der) = pem_block(text).ok_or_else(|| unsupported("no PEM block"))?;
        let key = if COSIGN_LABELS.contains(&label.as_str()) {
            let password = password.ok_or_else(|| KeyError::NoPassword {
                path: path.to_path_buf(),
            })?;
            let plain = decrypt_cosign(path, &der, password)?;
            ecdsa::SigningKey::from_pkcs8_der(&plain)
                .map_err(|_| unsupported("the decrypted key is not ECDSA P-256"))?
        } else if label == "PRIVATE KEY" {
            ecdsa::SigningKey::from_pkcs8_der(&der)
                .map_err(|_| unsupported("a PKCS#8 key, but not ECDSA P-256"))?
        } else {
            return Err(unsupported(&format!("a PEM block of type {label}")));
        };
        let fingerprint = fingerprint(key.verifying_key());
        Ok(SigningKey { key, fingerprint })
    }

    /// Its public key, as `verify --key` reads it.
    pub fn public_key(&self) -> ecdsa::VerifyingKey {
        *self.key.verifying_key()
    }

    /// Its public key to check signatures with, named after the private key's `path`.
    pub fn public(&self, path: &Path) -> PublicKey {
        PublicKey {
            key: self.public_key(),
            path: path.to_path_buf(),
            fingerprint: self.fingerprint.clone(),
        }
    }

    /// A new key, for tests.
    #[cfg(test)]
    pub(crate) fn random() -> SigningKey {
        let key = ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let fingerprint = fingerprint(key.verifying_key());
        SigningKey { key, fingerprint }
    }
}

impl PublicKey {
    /// Reads a PEM public key (`-----BEGIN PUBLIC KEY-----`, as `cosign.pub`).
    pub fn load(path: &Path) -> Result<PublicKey, KeyError> {
        let text = read(path)?;
        let key =
            ecdsa::VerifyingKey::from_public_key_pem(&text).map_err(|e| KeyError::NotPublic {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        Ok(PublicKey {
            fingerprint: fingerprint(&key),
            key,
            path: path.to_path_buf(),
        })
    }
}

fn read(path: &Path) -> Result<String, KeyError> {
    std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn fingerprint(key: &ecdsa::VerifyingKey) -> String {
    let der = key.to_public_key_der().expect("a P-256 public key encodes");
    BASE64.encode(Sha256::digest(der.as_bytes()))
}

/// The first PEM block of `text`: its label and decoded body.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + "-----BEGIN ".len()..];
    let (label, rest) = rest.split_once("-----")?;
    let end = rest.find(&format!("-----END {label}-----"))?;
    let body: String = rest[..end]
        .lines()
        .filter(|l| !l.contains(':')) // RFC 1421 headers, which cosign does not write
        .collect::<String>()
        .split_whitespace()
        .collect();
    Some((label.to_string(), BASE64.decode(body).ok()?))
}

/// What is inside cosign's PEM block.
#[derive(Deserialize)]
struct Encrypted {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

#[derive(Deserialize)]
#[allow(non_snake_case)] // cosign's field names
struct ScryptParams {
    N: u64,
    r: u32,
    p: u32,
}

#[derive(Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// Opens cosign's encrypted key: scrypt(password, salt) is the secretbox key.
fn decrypt_cosign(path: &Path, json: &[u8], password: &str) -> Result<Vec<u8>, KeyError> {
    let corrupt = |why: String| KeyError::Unsupported {
        path: path.to_path_buf(),
        why,
    };
    let sealed: Encrypted =
        serde_json::from_slice(json).map_err(|e| corrupt(format!("corrupt cosign key: {e}")))?;
    if sealed.kdf.name != "scrypt" || sealed.cipher.name != "nacl/secretbox" {
        return Err(corrupt(format!(
            "a cosign key sealed with {} and {}, not scrypt and nacl/secretbox",
            sealed.kdf.name, sealed.cipher.name
        )));
    }
    let ScryptParams { N, r, p } = sealed.kdf.params;
    let log_n = match N {
        n if n.is_power_of_two() && n > 1 && n <= 1 << 22 => n.trailing_zeros() as u8,
        n => {
            return Err(corrupt(format!(
                "scrypt N of {n} is not a power of two up to 2^22"
            )))
        }
    };
    let params = scrypt::Params::new(log_n, r, p, 32)
        .map_err(|e| corrupt(format!("scrypt parameters: {e}")))?;
    let decode = |what: &str, text: &str| {
        BASE64
            .decode(text)
            .map_err(|e| corrupt(format!("corrupt cosign key: its {what}: {e}")))
    };
    let salt = decode("salt", &sealed.kdf.salt)?;
    let nonce = decode("nonce", &sealed.cipher.nonce)?;
    let ciphertext = decode("ciphertext", &sealed.ciphertext)?;
    if nonce.len() != 24 {
        return Err(corrupt(
            "corrupt cosign key: its nonce is not 24 bytes".into(),
        ));
    }
    let mut key = [0u8; 32];
    scrypt::scrypt(password.as_bytes(), &salt, &params, &mut key)
        .expect("32 bytes is a valid scrypt output length");
    XSalsa20Poly1305::new(&key.into())
        .decrypt(nonce.as_slice().into(), ciphertext.as_slice())
        // A secretbox that does not open: the password (or the ciphertext) is wrong.
        .map_err(|_| KeyError::WrongPassword {
            path: path.to_path_buf(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::pkcs8::{EncodePrivateKey, LineEnding};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/sign")
            .join(name)
    }

    #[test]
    fn reads_a_pkcs8_pem_generated_here() {
        let key = ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        let loaded = SigningKey::parse(Path::new("k.pem"), &pem, None).unwrap();
        assert_eq!(loaded.public_key(), *key.verifying_key());
    }

    #[test]
    fn opens_a_key_made_by_cosign_generate_key_pair() {
        let path = fixture("cosign.key");
        let key = SigningKey::load(&path, Some("polyarch-fixture")).unwrap();
        let public = PublicKey::load(&fixture("cosign.pub")).unwrap();
        assert_eq!(key.public_key(), public.key);
        assert_eq!(key.fingerprint, public.fingerprint);
    }

    #[test]
    fn a_wrong_or_missing_password_names_the_file_and_the_fix() {
        let path = fixture("cosign.key");
        let wrong = SigningKey::load(&path, Some("nope")).unwrap_err();
        assert!(matches!(wrong, KeyError::WrongPassword { .. }), "{wrong}");
        assert!(wrong.to_string().contains("cosign.key"), "{wrong}");
        assert!(wrong.to_string().contains("COSIGN_PASSWORD"), "{wrong}");
        let none = SigningKey::load(&path, None).unwrap_err();
        assert!(matches!(none, KeyError::NoPassword { .. }), "{none}");
    }

    #[test]
    fn corrupt_and_unsupported_keys_are_refused_by_name() {
        let path = Path::new("bad.pem");
        for text in [
            "not a key",
            "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\ne30=\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        ] {
            let error = SigningKey::parse(path, text, Some("pw")).unwrap_err();
            assert!(matches!(error, KeyError::Unsupported { .. }), "{error}");
            let line = error.to_string();
            assert!(line.contains("bad.pem") && line.contains("cosign generate-key-pair"));
            assert!(!line.contains('\n'), "{line}");
        }
        let error = PublicKey::load(&fixture("cosign.key")).unwrap_err();
        assert!(matches!(error, KeyError::NotPublic { .. }), "{error}");
    }
}

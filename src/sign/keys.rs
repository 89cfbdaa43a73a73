//! Signing and public keys: a PKCS#8 ECDSA P-256 PEM, or the encrypted private key
//! `cosign generate-key-pair` writes (scrypt, then NaCl secretbox, around a PKCS#8 DER).

use crate::base::digest::Digest;
use crate::base::memory::Store;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::XSalsa20Poly1305;
use futures_util::future::{BoxFuture, FutureExt as _, Shared};
use p256::ecdsa;
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        Closed::parse(path, text, password)?.open()
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

/// A private key read and checked, not opened yet: a cosign key's scrypt costs 0.14 s of
/// CPU or more (N = 65536: 64 MiB), which only the signing needs.
#[derive(Clone)]
enum Closed {
    Plain(ecdsa::SigningKey),
    Cosign {
        path: PathBuf,
        sealed: Sealed,
        password: String,
    },
}

impl Closed {
    /// Everything that can be checked without the scrypt: the file, its PEM block, the
    /// sealed JSON and its parameters, and that a password was given.
    fn parse(path: &Path, text: &str, password: Option<&str>) -> Result<Closed, KeyError> {
        let unsupported = |why: &str| KeyError::Unsupported {
            path: path.to_path_buf(),
            why: why.to_string(),
        };
        let (label, der) = pem_block(text).ok_or_else(|| unsupported("no PEM block"))?;
        if COSIGN_LABELS.contains(&label.as_str()) {
            let password = password.ok_or_else(|| KeyError::NoPassword {
                path: path.to_path_buf(),
            })?;
            Ok(Closed::Cosign {
                path: path.to_path_buf(),
                sealed: Sealed::parse(path, &der)?,
                password: password.to_string(),
            })
        } else if label == "PRIVATE KEY" {
            ecdsa::SigningKey::from_pkcs8_der(&der)
                .map(Closed::Plain)
                .map_err(|_| unsupported("a PKCS#8 key, but not ECDSA P-256"))
        } else {
            Err(unsupported(&format!("a PEM block of type {label}")))
        }
    }

    fn open(self) -> Result<SigningKey, KeyError> {
        let key = match self {
            Closed::Plain(key) => key,
            Closed::Cosign {
                path,
                sealed,
                password,
            } => {
                let plain = sealed.open(&path, &password)?;
                ecdsa::SigningKey::from_pkcs8_der(&plain).map_err(|_| KeyError::Unsupported {
                    path,
                    why: "the decrypted key is not ECDSA P-256".into(),
                })?
            }
        };
        let fingerprint = fingerprint(key.verifying_key());
        Ok(SigningKey { key, fingerprint })
    }
}

/// A signing key for a run: read and checked when the run starts, so a missing file or
/// password is refused before anything builds, and opened on a thread of its own once a
/// build starts, so a cold build hides the scrypt behind its solve and a warm rerun that
/// signs nothing new never pays it. Only a wrong password waits until the first
/// signature (before any tag moves).
pub struct OpeningKey {
    opening: Shared<BoxFuture<'static, Opened>>,
    /// The key and where its opening goes: until [`OpeningKey::begin`] starts it, then
    /// (a cosign key) until the first signature, which opens it again at full priority
    /// if the lowest-priority opening has not finished.
    openers: std::sync::Mutex<Openers>,
    /// The signatures it attached before, by key file, repository and subject: the
    /// referrer manifest's digest. Its digest is its content, so a referrers listing
    /// that names it says the manifest is signed by this key, with nothing opened or
    /// read; a manifest signed before but forgotten is signed again, to the same bytes.
    made: Store<Digest>,
    /// The SHA-256 of the key file.
    file: String,
}

type Opened = Result<Arc<SigningKey>, Arc<KeyError>>;

/// Where the key's opening stands, for who opens it next.
enum Openers {
    /// Nothing started: a build starts it at the lowest priority, a signature at full.
    Unopened(Closed, Sender),
    /// Opening at the lowest priority beside the build; a copy in case a signature
    /// cannot wait for it.
    Yielding(Closed, Sender),
    /// Nothing more to start.
    Started,
}

/// How a thread that opens the key runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    /// At nice 19, beside the build.
    Yielding,
    /// As the rest of the run.
    Full,
}

impl Openers {
    /// The opening to start when a build starts (`signing`: false) or a signature waits
    /// for the key (true), and at which priority. The build's opening yields to the
    /// engine; once a signature waits, the engine is done, and an opening at nice 19
    /// would then wait behind the run's own reading of layers and the registry: the
    /// signature starts the scrypt again at full priority, and the first opening to
    /// finish is the key. That costs one more scrypt's CPU and memory (64 MiB) only on a
    /// run whose build left it too little idle CPU to finish.
    fn next(&mut self, signing: bool, done: bool) -> Option<(Closed, Sender, Priority)> {
        match (std::mem::replace(self, Openers::Started), signing) {
            (Openers::Unopened(closed, send), false) => {
                if matches!(closed, Closed::Cosign { .. }) {
                    *self = Openers::Yielding(closed.clone(), send.clone());
                }
                Some((closed, send, Priority::Yielding))
            }
            (Openers::Unopened(closed, send), true) => Some((closed, send, Priority::Full)),
            (Openers::Yielding(closed, send), true) if !done => {
                Some((closed, send, Priority::Full))
            }
            (kept @ Openers::Yielding(..), false) => {
                *self = kept;
                None
            }
            (Openers::Yielding(..) | Openers::Started, _) => None,
        }
    }
}

type Sender = tokio::sync::mpsc::Sender<Opened>;

impl std::fmt::Debug for OpeningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpeningKey({:?})", self.opening.peek())
    }
}

impl OpeningKey {
    /// Reads and checks the key at `path` now; opens it in the background.
    pub fn start(path: &Path, password: Option<&str>) -> Result<OpeningKey, KeyError> {
        let text = read(path)?;
        let closed = Closed::parse(path, &text, password)?;
        let file = format!("sha256:{:x}", Sha256::digest(text.as_bytes()));
        // Room for both openers' answers: the first one is the key.
        let (send, mut receive) = tokio::sync::mpsc::channel(2);
        let path = path.to_path_buf();
        let opening = async move {
            receive.recv().await.unwrap_or_else(|| {
                Err(Arc::new(KeyError::Unsupported {
                    path,
                    why: "opening it stopped half-way".into(),
                }))
            })
        };
        Ok(OpeningKey {
            opening: opening.boxed().shared(),
            openers: std::sync::Mutex::new(Openers::Unopened(closed, send)),
            made: Store::open("signatures.json"),
            file,
        })
    }

    /// Starts opening the key on a thread of its own, at the lowest priority, once a
    /// build starts (it hides the scrypt).
    pub fn begin(&self) {
        self.start_next(false);
    }

    /// Starts what [`Openers::next`] says, on a plain thread, not the runtime's blocking
    /// pool, so a run that never signs exits without waiting for it.
    fn start_next(&self, signing: bool) {
        // Polled once: an answer already sent counts as done even if nobody awaited it.
        let done = self.opening.clone().now_or_never().is_some();
        let next = self.openers.lock().expect("key lock").next(signing, done);
        if let Some((closed, send, priority)) = next {
            std::thread::spawn(move || {
                if priority == Priority::Yielding {
                    yield_to_the_build();
                }
                // The second opener's answer finds the first one taken: nobody waits.
                let _ = send.try_send(closed.open().map(Arc::new).map_err(Arc::new));
            });
        }
    }

    /// `key`, already open, remembering what it signs in `made` (a signatures.json),
    /// else in memory only: for tests of the flows that sign.
    #[cfg(test)]
    pub(crate) fn opened_for_tests(key: SigningKey, made: Option<PathBuf>) -> OpeningKey {
        let opened: Opened = Ok(Arc::new(key));
        OpeningKey {
            opening: async move { opened }.boxed().shared(),
            openers: std::sync::Mutex::new(Openers::Started),
            made: Store::at(made),
            file: "sha256:test".into(),
        }
    }

    /// The referrer this key attached to `subject` in `repository` before, if any.
    pub fn made_before(&self, repository: &str, subject: &Digest) -> Option<Digest> {
        self.made.get(&self.made_key(repository, subject))
    }

    /// Remembers the referrer this key's signature of `subject` is attached as, until
    /// [`OpeningKey::save_made`].
    pub fn remember_made(&self, repository: &str, subject: &Digest, referrer: &Digest) {
        self.made
            .put(self.made_key(repository, subject), referrer.clone());
    }

    /// signatures.json's key for this key's signature of `subject` in `repository`.
    fn made_key(&self, repository: &str, subject: &Digest) -> String {
        format!("{} {repository}@{subject}", self.file)
    }

    /// Writes down (signatures.json) the signatures remembered since it was read, once a
    /// run's publishing ends; nothing when there are none.
    pub fn save_made(&self) {
        self.made.save();
    }

    /// The opened key, waiting for the opening (once, however many ask), which a
    /// signature hurries (see [`Openers::next`]).
    pub async fn opened(&self) -> Opened {
        self.start_next(true);
        self.opening.clone().await
    }
}

/// Lowers the calling thread to the lowest CPU priority (nice 19; on Linux the nice value
/// is per thread): the scrypt it runs beside a cold build then takes only CPU the engine
/// leaves idle, instead of slowing the build's export on a machine with few cores. The
/// signature waits for it only once the engine is done. Best effort: a refusal leaves the
/// thread as it was.
fn yield_to_the_build() {
    #[cfg(target_os = "linux")]
    {
        let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
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

/// cosign's sealed key, decoded and its parameters checked.
#[derive(Clone)]
struct Sealed {
    params: scrypt::Params,
    salt: Vec<u8>,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
}

impl Sealed {
    fn parse(path: &Path, json: &[u8]) -> Result<Sealed, KeyError> {
        let corrupt = |why: String| KeyError::Unsupported {
            path: path.to_path_buf(),
            why,
        };
        let sealed: Encrypted = serde_json::from_slice(json)
            .map_err(|e| corrupt(format!("corrupt cosign key: {e}")))?;
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
        let params = scrypt::Params::new(log_n, r, p)
            .map_err(|e| corrupt(format!("scrypt parameters: {e}")))?;
        let decode = |what: &str, text: &str| {
            BASE64
                .decode(text)
                .map_err(|e| corrupt(format!("corrupt cosign key: its {what}: {e}")))
        };
        let nonce = decode("nonce", &sealed.cipher.nonce)?;
        if nonce.len() != 24 {
            return Err(corrupt(
                "corrupt cosign key: its nonce is not 24 bytes".into(),
            ));
        }
        Ok(Sealed {
            params,
            salt: decode("salt", &sealed.kdf.salt)?,
            nonce,
            ciphertext: decode("ciphertext", &sealed.ciphertext)?,
        })
    }

    /// scrypt(password, salt) is the secretbox key.
    fn open(&self, path: &Path, password: &str) -> Result<Vec<u8>, KeyError> {
        let mut key = [0u8; 32];
        scrypt::scrypt(password.as_bytes(), &self.salt, &self.params, &mut key)
            .expect("32 bytes is a valid scrypt output length");
        XSalsa20Poly1305::new(&key.into())
            .decrypt(self.nonce.as_slice().into(), self.ciphertext.as_slice())
            // A secretbox that does not open: the password (or the ciphertext) is wrong.
            .map_err(|_| KeyError::WrongPassword {
                path: path.to_path_buf(),
            })
    }
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

    /// The scrypt's thread runs at the lowest priority, and only that thread.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_key_opens_on_a_thread_that_yields_to_everything_else() {
        let priority = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let before = priority().unwrap();
        let opening = std::thread::spawn(move || {
            yield_to_the_build();
            priority().unwrap()
        });
        assert_eq!(opening.join().unwrap(), 19);
        assert_eq!(priority().unwrap(), before);
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

    /// What can be checked without the scrypt is refused at once; a wrong password only
    /// when the key is opened, and then to everyone who waits for it.
    #[tokio::test]
    async fn an_opening_key_refuses_at_once_all_but_a_wrong_password() {
        let path = fixture("cosign.key");
        let none = OpeningKey::start(&path, None).unwrap_err();
        assert!(matches!(none, KeyError::NoPassword { .. }), "{none}");
        let gone = OpeningKey::start(&fixture("missing.key"), Some("pw")).unwrap_err();
        assert!(matches!(gone, KeyError::Read { .. }), "{gone}");
        let wrong = OpeningKey::start(&path, Some("nope")).unwrap();
        let (first, second) = tokio::join!(wrong.opened(), wrong.opened());
        for refused in [first.unwrap_err(), second.unwrap_err()] {
            assert!(
                matches!(*refused, KeyError::WrongPassword { .. }),
                "{refused}"
            );
        }
        let right = OpeningKey::start(&path, Some("polyarch-fixture")).unwrap();
        let public = PublicKey::load(&fixture("cosign.pub")).unwrap();
        assert_eq!(
            right.opened().await.unwrap().fingerprint,
            public.fingerprint
        );
        // Begun beside a build, then hurried by a signature: two openers, one key.
        let hurried = OpeningKey::start(&path, Some("polyarch-fixture")).unwrap();
        hurried.begin();
        let (first, second) = tokio::join!(hurried.opened(), hurried.opened());
        for opened in [first.unwrap(), second.unwrap()] {
            assert_eq!(opened.fingerprint, public.fingerprint);
        }
    }

    /// A build opens a cosign key at the lowest priority; a signature that finds it still
    /// opening opens it again at full priority, once. A finished opening, a plain key, or
    /// a signature with no build before it, opens it once.
    #[test]
    fn a_signature_hurries_a_cosign_key_still_opening_once() {
        use Priority::{Full, Yielding};
        let path = fixture("cosign.key");
        let text = std::fs::read_to_string(&path).unwrap();
        let cosign = Closed::parse(&path, &text, Some("polyarch-fixture")).unwrap();
        let plain = Closed::Plain(SigningKey::random().key);
        let (send, _receive) = tokio::sync::mpsc::channel(2);
        // (signing, done) for each call, and the priority of what each call starts.
        let started = |closed: &Closed, calls: &[(bool, bool)]| -> Vec<Option<Priority>> {
            let mut openers = Openers::Unopened(closed.clone(), send.clone());
            (calls.iter())
                .map(|&(signing, done)| openers.next(signing, done).map(|(.., p)| p))
                .collect::<Vec<_>>()
        };
        let (build, slow_signature) = ((false, false), (true, false));
        assert_eq!(
            started(&cosign, &[build, build, slow_signature, slow_signature]),
            [Some(Yielding), None, Some(Full), None]
        );
        assert_eq!(
            started(&cosign, &[build, (true, true), slow_signature]),
            [Some(Yielding), None, None]
        );
        assert_eq!(
            started(&cosign, &[slow_signature, build, slow_signature]),
            [Some(Full), None, None]
        );
        assert_eq!(
            started(&plain, &[build, slow_signature]),
            [Some(Yielding), None]
        );
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

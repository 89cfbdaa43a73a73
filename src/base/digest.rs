//! Content digests: `algorithm:hex`, parsed once where they come in (registry and engine
//! answers, record files, `@sha256:` references) and carried as [`Digest`] after that.
//!
//! Our own rather than oci-spec's `Digest`, which takes any algorithm name (`md5:…`
//! parses) and is not `Ord`. Reading accepts the three algorithms the OCI image spec
//! registers, since a registry may answer with sha384 or sha512; polyarch itself only
//! writes sha256.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

/// A valid `algorithm:hex` digest, held as its text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

/// What is wrong with a digest; its text completes "digest `…` ", as callers word it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("has no `algorithm:`")]
    NoAlgorithm,
    #[error("is not hexadecimal")]
    NotHex,
    #[error("has uppercase hex digits; digests are lowercase")]
    Uppercase,
    #[error("uses an unsupported algorithm (sha256, sha384 or sha512)")]
    Algorithm,
    #[error("has the wrong length for its algorithm")]
    Length,
}

impl Digest {
    /// The sha256 digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::finish(Sha256::new_with_prefix(bytes))
    }

    /// The sha256 digest of everything fed to `hasher`.
    pub fn finish(hasher: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn algorithm(&self) -> &str {
        self.0
            .split_once(':')
            .map_or("", |(algorithm, _)| algorithm)
    }

    /// The hex digits after `algorithm:`.
    pub fn hex(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, hex)| hex)
    }

    /// The first 12 hex digits, as `docker images` shows them.
    pub fn short(&self) -> &str {
        &self.hex()[..12]
    }

    /// The same digest as oci-spec's type, for its descriptor builders.
    pub fn to_oci(&self) -> oci_spec::image::Digest {
        // oci-spec's grammar is wider than ours, so this cannot fail.
        oci_spec::image::Digest::from_str(&self.0).expect("a valid digest is an OCI digest")
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(text: &str) -> Result<Self, DigestError> {
        let (algorithm, hex) = text.split_once(':').ok_or(DigestError::NoAlgorithm)?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(DigestError::NotHex);
        }
        if hex.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(DigestError::Uppercase);
        }
        let length = match algorithm {
            "sha256" => 64,
            "sha384" => 96,
            "sha512" => 128,
            _ => return Err(DigestError::Algorithm),
        };
        if hex.len() != length {
            return Err(DigestError::Length);
        }
        Ok(Digest(text.to_string()))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<String> for Digest {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<&str> for Digest {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map_err(|why| serde::de::Error::custom(format!("digest `{text}` {why}")))
    }
}

/// A hash in the algorithm of the digest it will be compared with (a registry may name
/// layers by sha384 or sha512).
pub enum Hasher {
    Sha256(Sha256),
    Sha384(Sha384),
    Sha512(Sha512),
}

impl Hasher {
    pub fn like(digest: &Digest) -> Hasher {
        match digest.algorithm() {
            "sha384" => Hasher::Sha384(Sha384::new()),
            "sha512" => Hasher::Sha512(Sha512::new()),
            _ => Hasher::Sha256(Sha256::new()),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Sha384(h) => h.update(bytes),
            Hasher::Sha512(h) => h.update(bytes),
        }
    }

    pub fn finish(self) -> Digest {
        let (algorithm, hex) = match self {
            Hasher::Sha256(h) => ("sha256", hex::encode(h.finalize())),
            Hasher::Sha384(h) => ("sha384", hex::encode(h.finalize())),
            Hasher::Sha512(h) => ("sha512", hex::encode(h.finalize())),
        };
        Digest(format!("{algorithm}:{hex}"))
    }
}

/// Passes a blob's bytes through while hashing them, for a reader that must not trust what
/// it is handed (`verify --deep` reads layers a registry or layout serves). At the end of
/// the stream the digest of what passed is left in [`HashingReader::seen`]; the owner
/// compares it with the digest the manifest names once the reading is done.
pub struct HashingReader<R> {
    inner: R,
    hasher: Option<Hasher>,
    seen: Arc<OnceLock<Digest>>,
}

impl<R: Read> HashingReader<R> {
    /// Hashes in `expected`'s algorithm; the returned cell is filled at the end of `inner`.
    pub fn new(inner: R, expected: &Digest) -> (HashingReader<R>, Arc<OnceLock<Digest>>) {
        let seen = Arc::new(OnceLock::new());
        let reader = HashingReader {
            inner,
            hasher: Some(Hasher::like(expected)),
            seen: Arc::clone(&seen),
        };
        (reader, seen)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            if let Some(hasher) = self.hasher.take() {
                let _ = self.seen.set(hasher.finish());
            }
        } else if let Some(hasher) = &mut self.hasher {
            hasher.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// The first of `layers` (the digest a manifest names, and what its bytes hashed to when
/// read to the end) whose bytes are not what the manifest names. A layer not read to its
/// end (the reader stopped at an error, which is reported as such) is not judged.
pub fn first_mismatch<'a>(
    layers: impl IntoIterator<Item = (&'a Digest, &'a OnceLock<Digest>)>,
) -> Option<(Digest, Digest)> {
    layers.into_iter().find_map(|(expected, seen)| {
        seen.get()
            .filter(|computed| *computed != expected)
            .map(|computed| (expected.clone(), computed.clone()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hashing_reader_tells_what_passed_in_the_expected_algorithm() {
        for algorithm in ["sha256", "sha384", "sha512"] {
            let expected: Digest = match algorithm {
                "sha256" => Digest::of(b"layer").to_string(),
                "sha384" => format!("sha384:{}", hex::encode(Sha384::digest(b"layer"))),
                _ => format!("sha512:{}", hex::encode(Sha512::digest(b"layer"))),
            }
            .parse()
            .unwrap();
            let (mut reader, seen) = HashingReader::new(&b"layer"[..], &expected);
            assert!(seen.get().is_none());
            io::copy(&mut reader, &mut io::sink()).unwrap();
            assert_eq!(seen.get(), Some(&expected));
            assert_eq!(first_mismatch([(&expected, &*seen)]), None);

            let (mut reader, other) = HashingReader::new(&b"other bytes"[..], &expected);
            io::copy(&mut reader, &mut io::sink()).unwrap();
            let (named, computed) =
                first_mismatch([(&expected, &*seen), (&expected, &*other)]).expect("a mismatch");
            assert_eq!(named, expected);
            assert_eq!(computed.algorithm(), algorithm);
            assert_ne!(computed, expected);
        }
    }

    #[test]
    fn a_layer_not_read_to_its_end_is_not_judged() {
        let expected = Digest::of(b"a long layer");
        let (mut reader, seen) = HashingReader::new(&b"a long layer"[..], &expected);
        let mut first = [0u8; 4];
        reader.read_exact(&mut first).unwrap();
        assert_eq!(first_mismatch([(&expected, &*seen)]), None);
    }

    fn sha256(hex: &str) -> String {
        format!("sha256:{hex}")
    }

    #[test]
    fn parses_and_displays_the_same_text() {
        for text in [
            sha256(&"0123456789abcdef".repeat(4)),
            format!("sha384:{}", "a".repeat(96)),
            format!("sha512:{}", "f".repeat(128)),
        ] {
            let digest: Digest = text.parse().unwrap();
            assert_eq!(digest.to_string(), text);
            assert_eq!(digest.as_str(), text);
            assert_eq!(digest.to_oci().to_string(), text);
        }
        let digest = Digest::of(b"");
        assert_eq!(
            digest.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(digest.algorithm(), "sha256");
        assert_eq!(digest.hex(), &digest.as_str()[7..]);
        assert_eq!(digest.short(), "e3b0c44298fc");
        assert_eq!(digest.as_str().parse::<Digest>().unwrap(), digest);
    }

    #[test]
    fn rejects_what_is_not_a_digest() {
        let cases = [
            ("sha256:abc".to_string(), DigestError::Length),
            ("sha256:".to_string(), DigestError::Length),
            (sha256(&"A".repeat(64)), DigestError::Uppercase),
            (sha256(&format!("{}g", "a".repeat(63))), DigestError::NotHex),
            ("a".repeat(64), DigestError::NoAlgorithm),
            (format!(":{}", "a".repeat(64)), DigestError::Algorithm),
            (format!("md5:{}", "a".repeat(32)), DigestError::Algorithm),
            (format!("SHA256:{}", "a".repeat(64)), DigestError::Algorithm),
            (format!("sha512:{}", "a".repeat(64)), DigestError::Length),
            (
                format!(" {}", sha256(&"a".repeat(64))),
                DigestError::Algorithm,
            ),
            (
                format!("{}\n", sha256(&"a".repeat(64))),
                DigestError::NotHex,
            ),
        ];
        for (text, why) in &cases {
            assert_eq!(text.parse::<Digest>(), Err(*why), "{text:?}");
        }
    }

    /// The grammar written the plain way, to hold the parser to.
    fn valid(text: &str) -> bool {
        ["sha256:", "sha384:", "sha512:"].iter().any(|prefix| {
            text.strip_prefix(prefix).is_some_and(|hex| {
                hex.len() == prefix[3..6].parse::<usize>().unwrap() / 4
                    && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
            })
        })
    }

    #[test]
    fn random_text_parses_exactly_when_it_is_a_digest() {
        // splitmix64 with a fixed seed: the same cases every run, no dependency.
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let prefixes = [
            "sha256:", "sha384:", "sha512:", "md5:", "sha256", "", "Sha256:",
        ];
        let alphabet: Vec<char> = "0123456789abcdefABCDEFg:xé \u{0}".chars().collect();
        let mut accepted = 0;
        for _ in 0..20_000 {
            let prefix = prefixes[next() as usize % prefixes.len()];
            // Mostly the right lengths, so that valid digests come up often.
            let length = match next() % 4 {
                0 => 64,
                1 => 96,
                2 => 128,
                _ => next() as usize % 140,
            };
            let hex_only = next() % 2 == 0;
            let body: String = (0..length)
                .map(|_| {
                    let pick = next() as usize;
                    if hex_only {
                        alphabet[pick % 16]
                    } else {
                        alphabet[pick % alphabet.len()]
                    }
                })
                .collect();
            let text = format!("{prefix}{body}");
            let parsed = text.parse::<Digest>();
            assert_eq!(parsed.is_ok(), valid(&text), "{text:?}");
            if let Ok(digest) = parsed {
                assert_eq!(digest.as_str(), text);
                accepted += 1;
            }
        }
        assert!(accepted > 1000, "only {accepted} valid cases generated");
    }

    #[test]
    fn serde_writes_and_reads_the_plain_string() {
        let digest = Digest::of(b"polyarch");
        let json = serde_json::to_string(&digest).unwrap();
        assert_eq!(json, format!("\"{digest}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), digest);
        let bad = serde_json::from_str::<Digest>("\"sha256:abc\"").unwrap_err();
        assert!(
            bad.to_string()
                .contains("digest `sha256:abc` has the wrong length"),
            "{bad}"
        );
    }
}

//! The raw, loosely typed shape of the file: every field optional, every scalar a string.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::marker::PhantomData;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProject {
    // Checked in the first pass; kept here so `deny_unknown_fields` accepts it.
    #[allow(dead_code)]
    pub(super) version: Option<serde_norway::Value>,
    pub(super) binfmt: Option<String>,
    pub(super) binfmt_image: Option<String>,
    pub(super) reproducible: Option<String>,
    pub(super) builders: Option<Entries<RawBuilder>>,
    pub(super) images: Option<Entries<RawImage>>,
}

/// A builder: an address or context name, or `{host, tls, fallback}`; or a list of them.
pub(super) enum RawBuilder {
    Address(String),
    Map(RawBuilderMap),
    List(Vec<RawBuilder>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBuilderMap {
    pub(super) host: Option<String>,
    /// A standalone BuildKit daemon's address, in place of `host`.
    pub(super) buildkit: Option<String>,
    pub(super) tls: Option<RawTls>,
    pub(super) fallback: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) servername: Option<String>,
}

impl<'de> Deserialize<'de> for RawBuilder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawBuilder;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "an engine address, a context name, a mapping with host (or buildkit) and tls, or a list of them",
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<RawBuilder, A::Error> {
                let mut list = Vec::new();
                while let Some(one) = seq.next_element::<RawBuilder>()? {
                    list.push(one);
                }
                Ok(RawBuilder::List(list))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawBuilder, E> {
                Ok(RawBuilder::Address(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<RawBuilder, A::Error> {
                RawBuilderMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawBuilder::Map)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawImage {
    pub(super) repository: Option<String>,
    pub(super) tags: Option<Vec<String>>,
    pub(super) context: Option<String>,
    pub(super) dockerfile: Option<String>,
    pub(super) platforms: Option<Vec<String>>,
    pub(super) build_args: Option<Entries<String>>,
    pub(super) target: Option<String>,
    pub(super) labels: Option<Entries<String>>,
    pub(super) network: Option<String>,
    pub(super) binfmt: Option<String>,
    pub(super) secrets: Option<Entries<RawSecret>>,
    pub(super) ssh: Option<Vec<String>>,
    pub(super) cache: Option<RawCache>,
    pub(super) pull: Option<String>,
    pub(super) no_cache: Option<String>,
    pub(super) reproducible: Option<String>,
    pub(super) provenance: Option<String>,
    pub(super) sbom: Option<String>,
    pub(super) sign: Option<RawSign>,
    pub(super) annotations: Option<Entries<String>>,
    pub(super) test: Option<RawTests>,
    pub(super) contexts: Option<Entries<String>>,
}

/// `test:`: one entry or a list of them.
pub(super) enum RawTests {
    One(RawTest),
    List(Vec<RawTest>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTest {
    pub(super) run: Option<RawRun>,
    pub(super) timeout: Option<String>,
    pub(super) env: Option<Entries<String>>,
    pub(super) network: Option<String>,
    pub(super) user: Option<String>,
    pub(super) workdir: Option<String>,
    pub(super) platforms: Option<Vec<String>>,
}

/// A test's `run:`: exec form (a list) or shell form (a string).
pub(super) enum RawRun {
    Exec(Vec<String>),
    Shell(String),
}

impl<'de> Deserialize<'de> for RawTests {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawTests;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a test (a mapping with run, timeout, env, network, user, workdir, platforms) or a list of them")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<RawTests, A::Error> {
                let mut list = Vec::new();
                while let Some(one) = seq.next_element::<RawTest>()? {
                    list.push(one);
                }
                Ok(RawTests::List(list))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<RawTests, A::Error> {
                RawTest::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawTests::One)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for RawRun {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawRun;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command: a list (exec form) or a string (run by /bin/sh -c)")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<RawRun, A::Error> {
                let mut list = Vec::new();
                while let Some(one) = seq.next_element::<String>()? {
                    list.push(one);
                }
                Ok(RawRun::Exec(list))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawRun, E> {
                Ok(RawRun::Shell(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    pub(super) file: Option<String>,
    pub(super) env: Option<String>,
}

/// `sign:`: the private key that signs the image's index and platform manifests.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSign {
    pub(super) key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
    pub(super) from: Option<Vec<String>>,
    pub(super) to: Option<String>,
}

/// A mapping kept in file order (images are built and reported in declaration order).
/// Scalars deserialize as written, so `GREETING: 1.10` stays `"1.10"`.
pub(super) struct Entries<T>(pub(super) Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<T>()?;
                    out.push((key, value));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

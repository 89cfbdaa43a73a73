//! Message shaping: serde's errors turned into the file's field paths and a fix.

use super::SUPPORTED_VERSION;
use serde::de::{Deserializer, MapAccess, Visitor};
use std::fmt;

pub(super) enum Seg {
    Key(String),
    Index(usize),
}

pub(super) fn seg_path(segs: &[Seg]) -> String {
    let mut out = String::new();
    for s in segs {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Turns serde's wording into `problem; fix` for a person editing YAML.
pub(super) fn humanize(raw: &str, segs: &[Seg], at: &str) -> String {
    if let Some(rest) = raw.strip_prefix("unknown field `") {
        let (name, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        if expected.is_empty() {
            return format!("unknown field{at}; remove it");
        }
        let suggestion = closest(name, &expected)
            .map(|s| format!(" did you mean {s}?"))
            .unwrap_or_default();
        return format!(
            "unknown field{at};{suggestion} expected one of {}",
            expected.join(", ")
        );
    }
    if let Some(rest) = raw.strip_prefix("invalid type: ") {
        let (found, expected) = rest
            .rsplit_once(", expected ")
            .unwrap_or((rest, "something else"));
        return format!(
            "expected {}, found {}{at}; {}",
            describe_expected(expected),
            describe_found(found),
            hint(segs)
        );
    }
    if raw.starts_with("recursion limit exceeded") {
        return format!(
            "the document is nested too deeply{at}; flatten it to the documented layout"
        );
    }
    if raw.starts_with("repetition limit exceeded") {
        return format!("too many alias expansions{at}; remove the repeated `*alias` references");
    }
    format!("{}{at}; {}", clip_long(raw, 200), hint(segs))
}

fn describe_expected(e: &str) -> String {
    match e {
        "a sequence" => "a list".into(),
        "a map" | "a mapping" => "a mapping".into(),
        "struct RawProject" => "a mapping".into(),
        "struct RawImage" => "a mapping of image settings".into(),
        "struct RawSecret" => "a mapping with file or env".into(),
        "struct RawCache" => "a mapping with from and to".into(),
        "struct RawBuilderMap" => "a mapping with host, tls and fallback".into(),
        "struct RawTls" => "a mapping with ca, cert, key and servername".into(),
        "a string" | "a borrowed string" => "a single value".into(),
        other => other.to_string(),
    }
}

fn describe_found(f: &str) -> String {
    match f {
        "map" => "a mapping".into(),
        "sequence" => "a list".into(),
        "unit value" => "nothing".into(),
        other => clip_long(other, 60),
    }
}

/// What the field should look like, by its position in the document.
fn hint(segs: &[Seg]) -> String {
    let keys: Vec<&str> = segs
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect();
    let field = match keys.as_slice() {
        [] => {
            return format!("write `key: value` lines starting with `version: {SUPPORTED_VERSION}`")
        }
        ["images"] => {
            return "write each image as `NAME:` followed by its indented settings".into()
        }
        ["images", _] => {
            return "give the image its settings as a mapping: repository, tags, context, platforms"
                .into()
        }
        ["images", _, f, ..] => *f,
        [f, ..] => *f,
    };
    let example = match field {
        "repository" => "repository: registry.example.com/team/app",
        "tags" => "tags: [v1, latest]",
        "context" => "context: .",
        "dockerfile" => "dockerfile: Dockerfile",
        "platforms" => "platforms: [linux/amd64, linux/arm64]",
        "build_args" => "build_args: {GREETING: hello}",
        "labels" => "labels: {org.opencontainers.image.source: https://example.org/x}",
        "target" => "target: release",
        "network" => "network: default",
        "binfmt" => "binfmt: auto",
        "secrets" => "secrets: {token: {env: API_TOKEN}, npmrc: {file: ./npmrc}}",
        "ssh" => "ssh: [default]",
        "cache" => "cache: {from: [registry.example.com/app:buildcache], to: registry.example.com/app:buildcache}",
        "pull" => "pull: true",
        "no_cache" => "no_cache: true",
        "reproducible" => "reproducible: true",
        "provenance" => "provenance: true",
        "sbom" => "sbom: true",
        "binfmt_image" => "binfmt_image: tonistiigi/binfmt",
        "builders" => "builders: {linux/arm64: unix:///run/arm-docker.sock}",
        "version" => "version: 1",
        _ => return "see schema/polyarch.schema.json for the expected layout".into(),
    };
    format!("write it like `{example}`")
}

/// A near-miss spelling (edit distance ≤ 2, or ≤ a third of the word).
pub(super) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .iter()
        .map(|c| (levenshtein(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(64).collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A shallow look at a YAML value: enough to check `version` before anything else, and
/// accepting every well-formed document (unlike `Value`, which rejects huge integers).
pub(super) enum Shallow {
    Null,
    Bool(bool),
    /// Integer as decimal text, so any width compares exactly.
    Int(String),
    Float(f64),
    Str(String),
    List,
    /// A mapping, with its `version` entry when looked at the top level.
    Map(Option<Box<Shallow>>),
    Tagged,
}

impl Shallow {
    pub(super) fn deserialize_top<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Shallow, D::Error> {
        serde::de::DeserializeSeed::deserialize(ShallowSeed { top: true }, d)
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Shallow::Null => "nothing".into(),
            Shallow::Bool(b) => format!("the boolean {b}"),
            Shallow::Int(n) => format!("the number {}", clip(n)),
            Shallow::Float(f) => format!("the number {f}"),
            Shallow::Str(s) => format!("the string {}", q(s)),
            Shallow::List => "a list".into(),
            Shallow::Map(_) => "a mapping".into(),
            Shallow::Tagged => "a tagged value".into(),
        }
    }
}

#[derive(Clone, Copy)]
struct ShallowSeed {
    top: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for ShallowSeed {
    type Value = Shallow;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Shallow, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ShallowSeed {
    type Value = Shallow;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_i128<E>(self, v: i128) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_u128<E>(self, v: u128) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Int(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Str(v.to_string()))
    }
    fn visit_unit<E>(self) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Shallow, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Shallow, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Shallow::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Shallow, A::Error> {
        let mut version = None;
        while let Some(key) = map.next_key_seed(ShallowSeed { top: false })? {
            match key {
                Shallow::Str(k) if self.top && k == "version" => {
                    version = Some(Box::new(map.next_value_seed(ShallowSeed { top: false })?));
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Shallow::Map(version))
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(
        self,
        data: A,
    ) -> std::result::Result<Shallow, A::Error> {
        use serde::de::VariantAccess;
        let (_, variant) = data.variant::<serde::de::IgnoredAny>()?;
        variant.newtype_variant::<serde::de::IgnoredAny>()?;
        Ok(Shallow::Tagged)
    }
}

/// Drops serde_norway's ` at line N column M` / ` at position N` (we report them our way).
pub(super) fn strip_marks(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(" at ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 4..];
        let skip = mark_len(after);
        if skip == 0 {
            out.push_str(" at ");
            rest = after;
        } else {
            rest = &after[skip..];
        }
    }
    out.push_str(rest);
    out
}

/// Length of a leading `line N column M` or `position N`, else 0.
fn mark_len(s: &str) -> usize {
    fn digits(s: &str) -> usize {
        s.bytes().take_while(u8::is_ascii_digit).count()
    }
    if let Some(r) = s.strip_prefix("line ") {
        let n = digits(r);
        if n > 0 {
            if let Some(r2) = r[n..].strip_prefix(" column ") {
                let m = digits(r2);
                if m > 0 {
                    return 5 + n + 8 + m;
                }
            }
        }
    } else if let Some(r) = s.strip_prefix("position ") {
        let n = digits(r);
        if n > 0 {
            return 9 + n;
        }
    }
    0
}

/// Quotes user text for a message: escaped so it stays on one line, and clipped.
pub(super) fn q(s: &str) -> String {
    format!("`{}`", clip(s))
}

pub(super) fn clip(s: &str) -> String {
    clip_long(s, 80)
}

pub(super) fn clip_long(s: &str, max: usize) -> String {
    let escaped = crate::base::text::printable(s);
    if escaped.chars().count() > max {
        let head: String = escaped.chars().take(max).collect();
        format!("{head}…")
    } else {
        escaped.into_owned()
    }
}

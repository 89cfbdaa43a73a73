//! Reading generic YAML values with errors that name `file#document`, the field path and
//! the fix.

use super::*;
use crate::base::yaml_depth::{check_depth, MAX_YAML_DEPTH};

/// The non-empty documents of a YAML stream (or a JSON file holding one or more values),
/// with their 1-based index. Stops at the first syntax error.
pub(crate) fn documents(file: &Path, text: &str) -> Result<Vec<(usize, Value)>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let is_json = file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let one_line = |e: &dyn fmt::Display| e.to_string().replace('\n', " ");
    let mut docs = Vec::new();
    if is_json {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        for (i, item) in stream.enumerate() {
            let index = i + 1;
            let json = item.map_err(|e| {
                K8sError::Usage(format!(
                    "{}#{index}: not valid JSON: {}; fix the file or export it again",
                    file.display(),
                    one_line(&e)
                ))
            })?;
            let value = serde_norway::to_value(json).map_err(|e| {
                K8sError::Usage(format!("{}#{index}: {}", file.display(), one_line(&e)))
            })?;
            if !value.is_null() {
                docs.push((index, value));
            }
        }
    } else {
        // Before the parser, whose time grows with the depth at every token.
        check_depth(text, MAX_YAML_DEPTH)
            .map_err(|e| K8sError::Usage(format!("{}: {e}", file.display())))?;
        // The iterator keeps yielding the same error after a syntax error, so stop at once.
        for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
            let index = i + 1;
            let syntax = |e: serde_norway::Error| {
                K8sError::Usage(format!(
                    "{}#{index}: not valid YAML: {}; fix the document (render Helm charts with \
                     `helm template` and kustomizations with `kustomize build` first)",
                    file.display(),
                    one_line(&e)
                ))
            };
            let mut value = Value::deserialize(de).map_err(syntax)?;
            value.apply_merge().map_err(syntax)?;
            if !untag(&value).is_null() {
                docs.push((index, value));
            }
        }
    }
    Ok(docs)
}

/// Error builder for one document.
pub(super) struct At<'a> {
    pub(super) src: &'a str,
}

impl At<'_> {
    pub(super) fn err(&self, path: &str, message: impl fmt::Display) -> K8sError {
        if path.is_empty() {
            K8sError::Usage(format!("{}: {message}", self.src))
        } else {
            K8sError::Usage(format!("{}: {path}: {message}", self.src))
        }
    }
}

pub(super) fn untag(v: &Value) -> &Value {
    let mut v = v;
    while let Value::Tagged(t) = v {
        v = &t.value;
    }
    v
}

/// `v[key]`, with tags stripped and `null` treated as absent.
pub(super) fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match untag(v) {
        Value::Mapping(m) => m.get(key).map(untag).filter(|v| !v.is_null()),
        _ => None,
    }
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match untag(v) {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

pub(super) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// A scalar as Kubernetes would read it into a string field.
pub(super) fn scalar(v: &Value) -> Option<String> {
    match untag(v) {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn opt_string(at: &At, parent: &Value, base: &str, key: &str) -> Result<Option<String>> {
    match field(parent, key) {
        None => Ok(None),
        Some(v) => scalar(v).map(Some).ok_or_else(|| {
            at.err(
                &join(base, key),
                format!("must be a string, found {}", type_name(v)),
            )
        }),
    }
}

fn opt_mapping<'a>(
    at: &At,
    parent: &'a Value,
    base: &str,
    key: &str,
) -> Result<Option<&'a Mapping>> {
    match field(parent, key) {
        None => Ok(None),
        Some(Value::Mapping(m)) => Ok(Some(m)),
        Some(v) => Err(at.err(
            &join(base, key),
            format!("must be a mapping, found {}", type_name(v)),
        )),
    }
}

pub(super) fn seq<'a>(at: &At, parent: &'a Value, base: &str, key: &str) -> Result<&'a [Value]> {
    match field(parent, key) {
        None => Ok(&[]),
        Some(Value::Sequence(s)) => Ok(s),
        Some(v) => Err(at.err(
            &join(base, key),
            format!("must be a list, found {}", type_name(v)),
        )),
    }
}

pub(super) fn string_map(
    at: &At,
    parent: &Value,
    base: &str,
    key: &str,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let path = join(base, key);
    if let Some(m) = opt_mapping(at, parent, base, key)? {
        for (k, v) in m {
            let k =
                scalar(k).ok_or_else(|| at.err(&path, format!("has {} as a key", type_name(k))))?;
            let v = match untag(v) {
                Value::Null => String::new(),
                other => scalar(other).ok_or_else(|| {
                    at.err(
                        &format!("{path}.{k}"),
                        format!("must be a string, found {}", type_name(other)),
                    )
                })?,
            };
            out.insert(k, v);
        }
    }
    Ok(out)
}

pub(super) fn expect_mapping<'a>(at: &At, v: &'a Value, path: &str) -> Result<&'a Value> {
    let v = untag(v);
    if v.is_mapping() {
        Ok(v)
    } else {
        Err(at.err(path, format!("must be a mapping, found {}", type_name(v))))
    }
}

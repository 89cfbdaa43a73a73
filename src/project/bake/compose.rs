//! Compose files: each service with `build:` is a target, as bake reads them; `image:` is
//! its first tag, and `x-bake` adds bake's own fields.

use super::{Definition, Fields, Problem};
use crate::project::values::{interpolate, Lookup, Source};
use serde_json::{Map, Value};

type Result<T> = std::result::Result<T, Problem>;

/// compose's build keys and bake's names for them.
const KEYS: &[(&str, &str)] = &[
    ("context", "context"),
    ("dockerfile", "dockerfile"),
    ("args", "args"),
    ("target", "target"),
    ("platforms", "platforms"),
    ("tags", "tags"),
    ("labels", "labels"),
    ("secrets", "secret"),
    ("ssh", "ssh"),
    ("network", "network"),
    ("no_cache", "no-cache"),
    ("pull", "pull"),
    ("cache_from", "cache-from"),
    ("cache_to", "cache-to"),
    ("x-bake", "x-bake"),
    // Read so that the refusal names them.
    ("dockerfile_inline", "dockerfile-inline"),
    ("additional_contexts", "contexts"),
    ("shm_size", "shm-size"),
    ("extra_hosts", "extra-hosts"),
    ("ulimits", "ulimits"),
    ("entitlements", "entitlements"),
];

/// compose's key for a bake field, for messages.
pub(super) fn key_of(field: &str) -> &str {
    KEYS.iter()
        .find(|(_, bake)| *bake == field)
        .map_or(field, |(compose, _)| compose)
}

pub(super) fn read(text: &str, env: Lookup) -> Result<Definition> {
    let mut file: Value = serde_norway::from_str(text)
        .map_err(|e| Problem::at("", format!("is not valid YAML ({e}); fix the syntax")))?;
    // compose interpolates `${VAR}` before it reads anything, as polyarch.yaml does.
    let mut used = Vec::new();
    expand(&mut file, String::new(), env, &mut used)?;
    let services = match file.get("services") {
        Some(Value::Object(services)) => services.clone(),
        Some(_) => return Err(Problem::at("services", "is not a mapping of services")),
        None => Map::new(),
    };
    let secrets = file.get("secrets").cloned().unwrap_or(Value::Null);
    let mut targets = Vec::new();
    for (name, service) in services {
        let at = |key: &str| format!("services.{name}.build.{key}");
        let build = match service.get("build") {
            None | Some(Value::Null) => continue,
            Some(Value::String(context)) => {
                Map::from_iter([("context".to_string(), Value::String(context.clone()))])
            }
            Some(Value::Object(build)) => build.clone(),
            Some(_) => {
                return Err(Problem::at(
                    format!("services.{name}.build"),
                    "is not a context path or a mapping; write build: . or build: {context: .}",
                ))
            }
        };
        let mut fields = Fields::new();
        for (key, value) in build {
            let Some((_, bake)) = KEYS.iter().find(|(k, _)| *k == key) else {
                return Err(Problem::at(
                    at(&key),
                    format!(
                        "polyarch cannot honour it; remove it (it reads {})",
                        KEYS[..15]
                            .iter()
                            .map(|(k, _)| *k)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            let value = match *bake {
                "args" | "labels" => pairs_map(value).map_err(|m| Problem::at(at(&key), m))?,
                "secret" => Value::Array(
                    list(&value)
                        .iter()
                        .map(|s| secret(s, &secrets).map(Value::String))
                        .collect::<Result<_>>()
                        .map_err(|p| Problem::at(at(&key), p.message))?,
                ),
                _ => value,
            };
            fields.insert(bake.to_string(), value);
        }
        if let Some(Value::Object(extra)) = fields.remove("x-bake") {
            for (key, value) in extra {
                match (key.as_str(), fields.get_mut(&key), value) {
                    ("tags", Some(Value::Array(tags)), Value::Array(more)) => tags.extend(more),
                    (_, _, value) => {
                        fields.insert(key, value);
                    }
                }
            }
        }
        // As bake: `image:` is the tag when the build names none.
        if let Some(Value::String(image)) = service.get("image") {
            if !matches!(fields.get("tags"), Some(Value::Array(tags)) if !tags.is_empty()) {
                fields.insert(
                    "tags".into(),
                    Value::Array(vec![Value::String(image.clone())]),
                );
            }
        }
        if let Some(Value::String(context)) = fields.get_mut("context") {
            *context = clean_path(context);
        }
        // compose's `service:NAME` is bake's `target:NAME`.
        if let Some(Value::Object(contexts)) = fields.get_mut("contexts") {
            for value in contexts.values_mut() {
                let Some(text) = value.as_str() else { continue };
                if let Some(service) = text.strip_prefix("service:") {
                    *value = Value::String(format!("target:{service}"));
                } else if !text.contains(':') {
                    *value = Value::String(clean_path(text));
                }
            }
        }
        targets.push((name, fields));
    }
    // bake's `default` group: every service that builds.
    let mut all: Vec<String> = targets.iter().map(|(t, _)| t.clone()).collect();
    all.sort();
    Ok(Definition {
        descriptions: Vec::new(),
        groups: if all.is_empty() {
            Vec::new()
        } else {
            vec![("default".to_string(), all)]
        },
        targets,
        variables: used.into_iter().map(|source| (source, None)).collect(),
        origins: Vec::new(),
    })
}

/// Interpolates every string of `value`; each variable read is added to `used` once.
fn expand(value: &mut Value, field: String, env: Lookup, used: &mut Vec<Source>) -> Result<()> {
    match value {
        Value::String(s) if s.contains('$') => {
            let mut read = Vec::new();
            *s = interpolate(s, env, &mut read)
                .map_err(|why| Problem::at(field, why.to_string()))?;
            for source in read {
                if !used.contains(&source) {
                    used.push(source);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand(item, format!("{field}[{i}]"), env, used)?;
            }
        }
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                let at = match field.is_empty() {
                    true => key.clone(),
                    false => format!("{field}.{key}"),
                };
                expand(item, at, env, used)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn list(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// compose's `KEY: value` mapping or `["KEY=value"]` list, as a mapping; a list entry
/// without `=` (a value from compose's environment) is left out, as bake does.
fn pairs_map(value: Value) -> std::result::Result<Value, String> {
    match value {
        Value::Object(_) | Value::Null => Ok(value),
        Value::Array(items) => Ok(Value::Object(
            items
                .iter()
                .filter_map(|i| i.as_str()?.split_once('='))
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect(),
        )),
        _ => Err("is not a mapping or a list of KEY=VALUE".into()),
    }
}

/// A build secret by name (or `{source: NAME}`), read from the top-level `secrets:`
/// entry's `file` or `environment`, in bake's `id=…,src=…|env=…` form.
fn secret(entry: &Value, secrets: &Value) -> Result<String> {
    let name = match entry {
        Value::String(name) => name.as_str(),
        Value::Object(long) => long
            .get("source")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        _ => "",
    };
    let declared = secrets.get(name).ok_or_else(|| {
        Problem::at(
            "",
            format!("names the secret `{name}`, which the top-level secrets: does not declare; add secrets: {{{name}: {{file: PATH}}}}"),
        )
    })?;
    if let Some(file) = declared.get("file").and_then(Value::as_str) {
        Ok(format!("id={name},src={}", clean_path(file)))
    } else if let Some(env) = declared.get("environment").and_then(Value::as_str) {
        Ok(format!("id={name},env={env}"))
    } else {
        Err(Problem::at(
            "",
            format!("the secret `{name}` has neither file nor environment in the top-level secrets:; give one"),
        ))
    }
}

/// A relative path as compose writes it back (`./sub/` → `sub`, `./` → `.`).
fn clean_path(path: &str) -> String {
    if path.contains("://") || path.starts_with('/') {
        return path.to_string();
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

//! `polyarch plan --print`: the resolved definition in the shape `docker buildx bake
//! --print` writes: `{"group": {NAME: {"targets": […]}}, "target": {NAME: {…}}}`, each
//! target with bake's field names, its list entries parsed as bake parses them
//! (`cache-from`, `attest`, `output`, `secret`, `ssh` as objects), empty fields left
//! out, and bake's defaults written in (`context` ".", `dockerfile` "Dockerfile").

use super::{scalar, Definition, Fields, Problem};
use serde_json::{json, Map, Value};

type Result<T> = std::result::Result<T, Problem>;

/// The groups and targets bake prints for `names` (its `default` group when none): each
/// named group with the groups under it, the targets they reach, and a `default` group
/// holding the names given; targets a `target:NAME` context links are added, building
/// to the cache only, as bake adds them.
pub(super) fn print(definition: &Definition, names: &[String]) -> Result<Value> {
    let default = ["default".to_string()];
    let names = if names.is_empty() {
        &default[..]
    } else {
        names
    };
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    let mut targets: Map<String, Value> = Map::new();
    for name in names {
        let (reached, visited) = resolve_group(definition, name);
        for target in reached {
            let fields = find(definition, &target)?;
            targets.insert(target.clone(), Value::Object(shape(&target, fields)?));
        }
        for group in visited {
            if !groups.iter().any(|(g, _)| *g == group) {
                let members = definition
                    .groups
                    .iter()
                    .find(|(g, _)| *g == group)
                    .map(|(_, m)| m.clone())
                    .unwrap_or_default();
                groups.push((group, members));
            }
        }
    }
    let has_default = groups.iter().any(|(g, _)| g == "default");
    for name in names {
        if has_default && name == "default" {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| g == "default") {
            Some((_, members)) => members.push(name.clone()),
            None => groups.push(("default".into(), vec![name.clone()])),
        }
    }
    if let Some((_, members)) = groups.iter_mut().find(|(g, _)| g == "default") {
        dedup(members);
        members.sort();
    }
    link(definition, &mut targets)?;
    let mut out = Map::new();
    if !groups.is_empty() {
        out.insert(
            "group".into(),
            Value::Object(
                groups
                    .into_iter()
                    .map(|(name, members)| {
                        let mut group = json!({ "targets": members });
                        if let Some((_, d)) = definition
                            .descriptions
                            .iter()
                            .rev()
                            .find(|(g, d)| *g == name && !d.is_empty())
                        {
                            group["description"] = d.clone().into();
                        }
                        (name, group)
                    })
                    .collect(),
            ),
        );
    }
    out.insert("target".into(), Value::Object(targets));
    Ok(Value::Object(out))
}

fn find<'a>(definition: &'a Definition, name: &str) -> Result<&'a Fields> {
    definition.target(name).ok_or_else(|| {
        Problem::at(
            "",
            format!("has no target or group named `{name}`; name one the file declares"),
        )
    })
}

/// The targets a name reaches and the groups visited on the way, as bake walks them: a
/// name that is no group is a target.
fn resolve_group(definition: &Definition, name: &str) -> (Vec<String>, Vec<String>) {
    fn walk(
        definition: &Definition,
        name: &str,
        seen: &mut Vec<String>,
    ) -> (Vec<String>, Vec<String>) {
        let Some((_, members)) = definition.groups.iter().find(|(g, _)| g == name) else {
            return (vec![name.to_string()], Vec::new());
        };
        if seen.iter().any(|s| s == name) {
            return (Vec::new(), Vec::new());
        }
        seen.push(name.to_string());
        let (mut targets, mut groups) = (Vec::new(), vec![name.to_string()]);
        for member in members {
            let (t, g) = walk(definition, member, seen);
            targets.extend(t);
            groups.extend(g);
        }
        (targets, groups)
    }
    let (mut targets, mut groups) = walk(definition, name, &mut Vec::new());
    dedup(&mut targets);
    dedup(&mut groups);
    (targets, groups)
}

fn dedup(items: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    items.retain(|i| seen.insert(i.clone()));
}

/// Targets named by another's `target:NAME` context and not printed yet: added with
/// `output` `cacheonly`, as bake builds them only for the linking target.
fn link(definition: &Definition, targets: &mut Map<String, Value>) -> Result<()> {
    let mut pending: Vec<String> = targets.keys().cloned().collect();
    while let Some(name) = pending.pop() {
        let linked: Vec<String> = targets[&name]
            .get("contexts")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|c| c.values())
            .filter_map(|v| v.as_str()?.strip_prefix("target:").map(str::to_string))
            .collect();
        for other in linked {
            if other == name {
                return Err(Problem::at(
                    format!("target.{name}.contexts"),
                    format!("links target:{name} to itself; name another target"),
                ));
            }
            if !targets.contains_key(&other) {
                let mut fields = shape(&other, find(definition, &other)?)?;
                fields.insert("output".into(), json!([{ "type": "cacheonly" }]));
                targets.insert(other.clone(), Value::Object(fields));
                pending.push(other);
            }
        }
    }
    Ok(())
}

/// One target's fields as bake prints them.
pub(super) fn shape(name: &str, fields: &Fields) -> Result<Map<String, Value>> {
    let at = |key: &str| format!("target.{name}.{key}");
    let mut out = Map::new();
    let get = |key: &str| fields.get(key).filter(|v| !v.is_null());
    let text = |key: &str| -> Result<Option<String>> {
        get(key)
            .map(|v| scalar(v).ok_or_else(|| Problem::at(at(key), "is not a string; write one")))
            .transpose()
    };
    let list = |key: &str| -> Result<Vec<String>> {
        match get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| {
                    scalar(v)
                        .ok_or_else(|| Problem::at(at(key), "holds a value that is not a string"))
                })
                .collect(),
            Some(v) => scalar(v)
                .map(|s| vec![s])
                .ok_or_else(|| Problem::at(at(key), "is not a list; write [\"…\"]")),
        }
    };
    let map = |key: &str| -> Result<Map<String, Value>> {
        match get(key) {
            None => Ok(Map::new()),
            Some(Value::Object(entries)) => entries
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    scalar(v)
                        .map(|s| (k.clone(), Value::String(s)))
                        .ok_or_else(|| Problem::at(format!("{}.{k}", at(key)), "is not a string"))
                })
                .collect(),
            Some(_) => Err(Problem::at(
                at(key),
                "is not a map; write { KEY = \"value\" }",
            )),
        }
    };
    let put_list = |out: &mut Map<String, Value>, key: &str, items: Vec<Value>| {
        if !items.is_empty() {
            out.insert(key.into(), Value::Array(items));
        }
    };
    if let Some(d) = text("description")?.filter(|d| !d.is_empty()) {
        out.insert("description".into(), d.into());
    }
    // Lists of strings once each, as bake's removeDupesStr leaves them.
    let strings = |mut items: Vec<String>| {
        dedup(&mut items);
        items.into_iter().map(Value::String).collect()
    };
    put_list(&mut out, "annotations", strings(list("annotations")?));
    let attest = list("attest")?
        .iter()
        .map(|a| attest(a).map_err(|m| Problem::at(at("attest"), m)))
        .collect::<Result<Vec<_>>>()?;
    put_list(&mut out, "attest", last_by(attest, "type"));
    out.insert(
        "context".into(),
        text("context")?.unwrap_or_else(|| ".".into()).into(),
    );
    let mut contexts = map("contexts")?;
    contexts.retain(|_, v| v.as_str() != Some(""));
    if !contexts.is_empty() {
        out.insert("contexts".into(), Value::Object(contexts));
    }
    out.insert(
        "dockerfile".into(),
        text("dockerfile")?
            .unwrap_or_else(|| "Dockerfile".into())
            .into(),
    );
    if let Some(inline) = text("dockerfile-inline")? {
        out.insert("dockerfile-inline".into(), inline.into());
    }
    for key in ["args", "labels"] {
        let entries = map(key)?;
        if !entries.is_empty() {
            out.insert(key.into(), Value::Object(entries));
        }
    }
    put_list(&mut out, "tags", strings(list("tags")?));
    for key in ["cache-from", "cache-to"] {
        let entries = list(key)?
            .iter()
            .map(|c| typed_fields(c, "registry", "ref").map_err(|m| Problem::at(at(key), m)))
            .collect::<Result<Vec<_>>>()?;
        put_list(&mut out, key, remove_dupes(entries));
    }
    if let Some(target) = text("target")? {
        out.insert("target".into(), target.into());
    }
    let secrets = list("secret")?
        .iter()
        .map(|s| secret(s).map_err(|m| Problem::at(at("secret"), m)))
        .collect::<Result<Vec<_>>>()?;
    put_list(&mut out, "secret", last_by(secrets, "id"));
    let ssh = list("ssh")?
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| ssh(s))
        .collect();
    put_list(&mut out, "ssh", last_by(ssh, "id"));
    put_list(&mut out, "platforms", strings(list("platforms")?));
    let outputs = list("output")?
        .iter()
        .map(|o| typed_fields(o, "local", "dest").map_err(|m| Problem::at(at("output"), m)))
        .collect::<Result<Vec<_>>>()?;
    put_list(&mut out, "output", remove_dupes(outputs));
    for key in ["pull", "no-cache"] {
        match get(key) {
            None => {}
            Some(Value::Bool(b)) => {
                out.insert(key.into(), (*b).into());
            }
            Some(v) => match scalar(v).as_deref() {
                Some("true") => {
                    out.insert(key.into(), true.into());
                }
                Some("false") => {
                    out.insert(key.into(), false.into());
                }
                _ => return Err(Problem::at(at(key), "is not true or false")),
            },
        }
    }
    if let Some(network) = text("network")? {
        out.insert("network".into(), network.into());
    }
    put_list(
        &mut out,
        "entitlements",
        strings(list(super::hcl::GRANTED)?),
    );
    Ok(out)
}

/// buildx's CSV fields (`a=b,"c=d,e"`).
fn fields(value: &str) -> std::result::Result<Vec<String>, String> {
    csv_fields(value).collect()
}

/// Splits one CSV record, honouring double quotes as Go's encoding/csv does.
fn csv_fields(value: &str) -> impl Iterator<Item = std::result::Result<String, String>> + '_ {
    let mut chars = value.chars().peekable();
    let mut done = value.is_empty();
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Some(Err(format!("`{value}` has an unclosed quote"))),
                }
            }
            match chars.next() {
                Some(',') => {}
                None => done = true,
                Some(_) => return Some(Err(format!("`{value}` has text after a quoted field"))),
            }
        } else {
            loop {
                match chars.next() {
                    Some(',') => break,
                    Some(c) => field.push(c),
                    None => {
                        done = true;
                        break;
                    }
                }
            }
        }
        Some(Ok(field))
    })
}

fn attest(value: &str) -> std::result::Result<Value, String> {
    let mut out = Map::new();
    for field in fields(value)? {
        let (key, v) = field
            .split_once('=')
            .ok_or_else(|| format!("invalid value {field}"))?;
        match key.trim().to_lowercase().as_str() {
            "disabled" => match v.to_lowercase().as_str() {
                "true" | "1" | "t" => {
                    out.insert("disabled".into(), true.into());
                }
                "false" | "0" | "f" => {
                    out.remove("disabled");
                }
                _ => return Err(format!("invalid value {field}")),
            },
            "type" => {
                out.insert("type".into(), v.into());
            }
            _ => {
                out.insert(key.into(), v.into());
            }
        }
    }
    if !out.contains_key("type") {
        return Err(format!("`{value}`: attestation type not specified"));
    }
    Ok(Value::Object(out))
}

/// A `cache-from`, `cache-to` or `output` entry as bake parses it: `type=…` with more
/// `key=value` fields (keys lowercased), or one bare value, which bake reads as the field
/// `bare_key` of type `bare_type` (a registry cache's `ref`, a local output's `dest`).
fn typed_fields(
    value: &str,
    bare_type: &str,
    bare_key: &str,
) -> std::result::Result<Value, String> {
    let fields = fields(value)?;
    if let [one] = fields.as_slice() {
        if !one.contains('=') {
            return Ok(json!({ "type": bare_type, bare_key: one }));
        }
    }
    let mut out = Map::new();
    for field in &fields {
        let (key, v) = field
            .split_once('=')
            .ok_or_else(|| format!("invalid value {field}"))?;
        out.insert(key.to_lowercase(), v.into());
    }
    if !out.contains_key("type") {
        return Err(format!("type is required for {value:?}"));
    }
    Ok(Value::Object(out))
}

fn secret(value: &str) -> std::result::Result<Value, String> {
    let (mut id, mut src, mut env, mut kind) = (None, None, None, None);
    for field in fields(value)? {
        let (key, v) = field
            .split_once('=')
            .ok_or_else(|| format!("invalid field '{field}' must be a key=value pair"))?;
        match key.to_lowercase().as_str() {
            "type" if v == "file" || v == "env" => kind = Some(v.to_string()),
            "type" => return Err(format!("unsupported secret type {v:?}")),
            "id" => id = Some(v.to_string()),
            "src" | "source" => src = Some(v.to_string()),
            "env" => env = Some(v.to_string()),
            other => return Err(format!("unexpected key '{other}' in '{field}'")),
        }
    }
    if kind.as_deref() == Some("env") && env.is_none() {
        env = src.take();
    }
    let mut out = Map::new();
    for (key, v) in [("id", id), ("src", src), ("env", env)] {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.insert(key.into(), v.into());
        }
    }
    Ok(Value::Object(out))
}

fn ssh(value: &str) -> Value {
    let mut out = Map::new();
    let (id, paths) = match value.split_once('=') {
        Some((id, paths)) => (id, Some(paths)),
        None => (value, None),
    };
    if !id.is_empty() {
        out.insert("id".into(), id.into());
    }
    if let Some(paths) = paths {
        out.insert("paths".into(), paths.split(',').collect::<Vec<_>>().into());
    }
    Value::Object(out)
}

/// One entry per `key` (an attestation's type, a secret's id), a later one taking the
/// earlier one's place, as bake merges them.
fn last_by(items: Vec<Value>, key: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        match out.iter_mut().find(|o| o.get(key) == item.get(key)) {
            Some(slot) => *slot = item,
            None => out.push(item),
        }
    }
    out
}

/// Equal entries once, the way bake's removeDupes leaves them: walking back from the
/// end, an entry equal to a later one is dropped and the last entry takes the later
/// one's place.
fn remove_dupes(mut items: Vec<Value>) -> Vec<Value> {
    if items.len() < 2 {
        return items;
    }
    for i in (0..items.len() - 1).rev() {
        if let Some(j) = (i + 1..items.len()).find(|&j| items[i] == items[j]) {
            let last = items.len() - 1;
            items.swap(j, last);
            items.pop();
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::typed_fields;
    use serde_json::json;

    #[test]
    fn a_bare_value_is_the_default_types_field() {
        assert_eq!(
            typed_fields("registry.test/app:cache", "registry", "ref"),
            Ok(json!({ "type": "registry", "ref": "registry.test/app:cache" }))
        );
        assert_eq!(
            typed_fields("out", "local", "dest"),
            Ok(json!({ "type": "local", "dest": "out" }))
        );
    }

    #[test]
    fn fields_keep_their_values_under_lowercased_keys() {
        assert_eq!(
            typed_fields(r#"Type=oci,DEST=a,"annotation=x=1,2""#, "local", "dest"),
            Ok(json!({ "type": "oci", "dest": "a", "annotation": "x=1,2" }))
        );
    }

    #[test]
    fn fields_without_a_type_or_without_a_value_are_refused() {
        assert!(typed_fields("ref=registry.test/app", "registry", "ref")
            .is_err_and(|e| e.contains("type is required")));
        assert!(typed_fields("type=registry,ref", "registry", "ref")
            .is_err_and(|e| e.contains("invalid value ref")));
    }
}

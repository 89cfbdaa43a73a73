//! bake's HCL (and its JSON form) resolved as bake does: `variable` blocks (default,
//! `validation`, the environment's value by the variable's name), `${}` interpolation,
//! a part of bake's standard library, `target.NAME.attr` references, then `inherits`.

use super::eval::{self, evaluate, Waiting};
use super::functions::{self, UserFunction};
use super::{Definition, Fields, Problem};
use crate::project::values::{Lookup, Source};
use hcl::eval::{Context, ErrorKind};
use hcl::{Body, Expression, Value};
use serde_json::Value as Json;

type Result<T> = std::result::Result<T, Problem>;

/// A file's top level, by kind: variables, targets and groups with their unevaluated
/// attributes (a name declared twice merges, the later attribute winning, as bake does).
#[derive(Default)]
struct Blocks {
    variables: Vec<Variable>,
    functions: Vec<UserFunction>,
    targets: Vec<(String, Vec<(String, Expression)>)>,
    groups: Vec<(String, Vec<(String, Expression)>)>,
}

struct Variable {
    name: String,
    default: Option<Expression>,
    /// `validation { condition, error_message }` blocks.
    validations: Vec<(Expression, Option<Expression>)>,
}

/// Several HCL and JSON files as bake reads them together: one body, a later file's
/// blocks merged into the earlier ones of the same name, attribute by attribute.
pub(super) fn read_many(files: &[(bool, &str)], env: Lookup) -> Result<Definition> {
    let mut all = Blocks::default();
    for (json, text) in files {
        let more = if *json {
            parse_json(text)?
        } else {
            parse_hcl(text)?
        };
        for function in more.functions {
            all.functions.retain(|f| f.name != function.name);
            all.functions.push(function);
        }
        for variable in more.variables {
            match all.variables.iter_mut().find(|v| v.name == variable.name) {
                Some(old) => {
                    if variable.default.is_some() {
                        old.default = variable.default;
                    }
                    old.validations.extend(variable.validations);
                }
                None => all.variables.push(variable),
            }
        }
        for (list, more) in [
            (&mut all.targets, more.targets),
            (&mut all.groups, more.groups),
        ] {
            for (name, attributes) in more {
                match list.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, old)) => old.extend(attributes),
                    None => list.push((name, attributes)),
                }
            }
        }
    }
    resolve(all, env)
}

fn parse_hcl(text: &str) -> Result<Blocks> {
    let body = hcl::parse(text).map_err(|e| {
        Problem::at(
            "",
            format!(
                "is not valid HCL ({}); fix the syntax",
                e.to_string().trim()
            ),
        )
    })?;
    blocks(&body)
}

/// bake's JSON form: the same blocks as objects (`{"target": {"app": {…}}}`), its
/// strings templates as in HCL.
fn parse_json(text: &str) -> Result<Blocks> {
    let json: Json = serde_json::from_str(text)
        .map_err(|e| Problem::at("", format!("is not valid JSON ({e}); fix the syntax")))?;
    let Json::Object(top) = json else {
        return Err(Problem::at(
            "",
            "is not a JSON object; write {\"target\": {…}}",
        ));
    };
    let mut found = Blocks::default();
    for (kind, entries) in top {
        let Json::Object(entries) = entries else {
            return Err(Problem::at(
                kind,
                "is not an object of named blocks; write {\"NAME\": {…}}",
            ));
        };
        for (name, fields) in entries {
            let Json::Object(fields) = fields else {
                return Err(Problem::at(
                    format!("{kind}.{name}"),
                    "is not an object; write {…}",
                ));
            };
            let attributes: Vec<(String, Expression)> =
                fields.into_iter().map(|(k, v)| (k, template(v))).collect();
            match kind.as_str() {
                "variable" => found.variables.push(Variable {
                    name,
                    default: attributes
                        .into_iter()
                        .find(|(k, _)| k == "default")
                        .map(|(_, e)| e),
                    validations: Vec::new(),
                }),
                "target" => found.targets.push((name, attributes)),
                "group" => found.groups.push((name, attributes)),
                other => return Err(unknown_block(other)),
            }
        }
    }
    Ok(found)
}

/// A JSON value as an HCL expression, its strings read as templates (`"${TAG}"`).
fn template(value: Json) -> Expression {
    match value {
        Json::String(s) if s.contains("${") || s.contains("%{") => {
            Expression::TemplateExpr(Box::new(hcl::TemplateExpr::QuotedString(s)))
        }
        Json::Array(items) => Expression::Array(items.into_iter().map(template).collect()),
        Json::Object(map) => Expression::Object(
            map.into_iter()
                .map(|(k, v)| (hcl::ObjectKey::from(k), template(v)))
                .collect(),
        ),
        other => hcl::to_expression(&other).unwrap_or(Expression::Null),
    }
}

fn unknown_block(kind: &str) -> Problem {
    let fix = match kind {
        "function" => "write functions in HCL; bake's JSON form of them is not read",
        _ => "bake files hold variable, function, target and group blocks; remove it",
    };
    Problem::at(
        kind,
        format!("polyarch cannot honour `{kind}` blocks: {fix}"),
    )
}

fn blocks(body: &Body) -> Result<Blocks> {
    let mut found = Blocks::default();
    // Top-level attributes are variables too, in older bake files.
    for attribute in body.attributes() {
        found.variables.push(Variable {
            name: attribute.key().to_string(),
            default: Some(attribute.expr().clone()),
            validations: Vec::new(),
        });
    }
    for block in body.blocks() {
        let kind = block.identifier();
        let name = match block.labels() {
            [one] => one.as_str().to_string(),
            _ => {
                return Err(Problem::at(
                    kind,
                    format!("a {kind} block takes one name, e.g. {kind} \"app\" {{ … }}"),
                ))
            }
        };
        let attributes = || -> Vec<(String, Expression)> {
            block
                .body()
                .attributes()
                .map(|a| (a.key().to_string(), a.expr().clone()))
                .collect()
        };
        match kind {
            "function" => found.functions.push(function(&name, block.body())?),
            "variable" => {
                let mut validations = Vec::new();
                for inner in block.body().blocks() {
                    if inner.identifier() != "validation" {
                        return Err(Problem::at(
                            format!("variable.{name}.{}", inner.identifier()),
                            "is not a block a variable holds; remove it (bake knows validation)",
                        ));
                    }
                    let get = |key: &str| {
                        inner
                            .body()
                            .attributes()
                            .find(|a| a.key() == key)
                            .map(|a| a.expr().clone())
                    };
                    let condition = get("condition").ok_or_else(|| {
                        Problem::at(
                            format!("variable.{name}.validation"),
                            "has no condition; add one",
                        )
                    })?;
                    validations.push((condition, get("error_message")));
                }
                let default = attributes()
                    .into_iter()
                    .find(|(k, _)| k == "default")
                    .map(|(_, e)| e);
                found.variables.push(Variable {
                    name,
                    default,
                    validations,
                });
            }
            "target" | "group" => {
                if let Some(inner) = block.body().blocks().next() {
                    return Err(Problem::at(
                        format!("{kind}.{name}.{}", inner.identifier()),
                        "is a block; a target's fields are attributes, write KEY = VALUE",
                    ));
                }
                let list = match kind {
                    "target" => &mut found.targets,
                    _ => &mut found.groups,
                };
                match list.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, existing)) => existing.extend(attributes()),
                    None => list.push((name, attributes())),
                }
            }
            other => return Err(unknown_block(other)),
        }
    }
    Ok(found)
}

/// A `function "NAME" { params = [a, b]  variadic_params = rest  result = … }` block.
fn function(name: &str, body: &Body) -> Result<UserFunction> {
    let at = |key: &str| format!("function.{name}.{key}");
    let get = |key: &str| body.attributes().find(|a| a.key() == key).map(|a| a.expr());
    let identifier = |e: &Expression, key: &str| match e {
        Expression::Variable(v) => Ok(v.to_string()),
        _ => Err(Problem::at(
            at(key),
            "holds a value that is not a bare name; write [a, b]",
        )),
    };
    let params = match get("params") {
        Some(Expression::Array(items)) => items
            .iter()
            .map(|e| identifier(e, "params"))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
        Some(_) => {
            return Err(Problem::at(
                at("params"),
                "is not a list of names; write [a, b]",
            ))
        }
    };
    let variadic = get("variadic_params")
        .map(|e| identifier(e, "variadic_params"))
        .transpose()?;
    let result = get("result")
        .cloned()
        .ok_or_else(|| Problem::at(at("result"), "is missing; add result = …"))?;
    if let Some(block) = body.blocks().next() {
        return Err(Problem::at(
            at(block.identifier()),
            "is a block; a function holds params, variadic_params and result",
        ));
    }
    Ok(UserFunction {
        name: name.to_string(),
        params,
        variadic,
        result,
    })
}

/// Evaluates the blocks: variables first (each may use those before it is resolved),
/// then groups, then targets attribute by attribute (an attribute may name another
/// target's, `target.NAME.attr`), then inheritance.
fn resolve(blocks: Blocks, env: Lookup) -> Result<Definition> {
    let mut context = functions::context(&blocks.functions)?;
    // bake's built-in variables (a file's own variable of the name wins).
    context.declare_var("BAKE_CMD_CONTEXT", "cwd://");
    context.declare_var("BAKE_LOCAL_PLATFORM", local_platform());
    let mut pending: Vec<&Variable> = blocks.variables.iter().collect();
    let mut variables = Vec::new();
    while !pending.is_empty() {
        functions::set_scope(&context);
        eval::set_waiting(Waiting {
            variables: pending.iter().map(|v| v.name.clone()).collect(),
            fields: Vec::new(),
        });
        let mut stuck = None;
        let before = pending.len();
        pending.retain(|variable| {
            let default = match &variable.default {
                Some(expression) => match evaluate(expression, &context) {
                    Ok(value) => value,
                    Err(e) => {
                        stuck.get_or_insert((variable.name.clone(), e));
                        return true;
                    }
                },
                None => Value::String(String::new()),
            };
            let (source, value) = match env(&variable.name) {
                Some(text) => (
                    Source::Env(variable.name.clone()),
                    typed_like(&default, text),
                ),
                None => (Source::Default(variable.name.clone()), default),
            };
            variables.push((source, Some(to_json(&value))));
            context.declare_var(variable.name.clone(), value);
            false
        });
        if pending.len() == before {
            let (name, e) = stuck.expect("a stuck variable kept its error");
            return Err(evaluation(format!("variable.{name}.default"), &e));
        }
    }
    functions::set_scope(&context);
    eval::set_waiting(Waiting::default());
    for variable in &blocks.variables {
        for (condition, message) in &variable.validations {
            let field = format!("variable.{}.validation", variable.name);
            match evaluate(condition, &context) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let said = message
                        .as_ref()
                        .and_then(|m| evaluate(m, &context).ok())
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| "the value is refused by its validation".into());
                    return Err(Problem::at(
                        field,
                        format!("{said}; set {} to a value it accepts", variable.name),
                    ));
                }
                Ok(_) => {
                    return Err(Problem::at(
                        field,
                        "condition is not true or false; write a comparison",
                    ))
                }
                Err(e) => return Err(evaluation(field, &e)),
            }
        }
    }

    let mut groups = Vec::new();
    let mut descriptions = Vec::new();
    for (name, attributes) in &blocks.groups {
        let mut targets = Vec::new();
        for (key, expression) in attributes {
            let field = format!("group.{name}.{key}");
            match key.as_str() {
                "targets" => {
                    let value = evaluate(expression, &context)
                        .map_err(|e| evaluation(field.clone(), &e))?;
                    let Value::Array(items) = value else {
                        return Err(Problem::at(
                            field,
                            "is not a list; write targets = [\"app\"]",
                        ));
                    };
                    for item in items {
                        let Value::String(s) = item else {
                            return Err(Problem::at(
                                field,
                                "holds a value that is not a name; write targets = [\"app\"]",
                            ));
                        };
                        targets.push(s);
                    }
                }
                "description" => {
                    if let Ok(Value::String(d)) = evaluate(expression, &context) {
                        descriptions.push((name.clone(), d));
                    }
                }
                _ => {
                    return Err(Problem::at(
                        field,
                        "is not a group field; a group holds targets (and description)",
                    ))
                }
            }
        }
        groups.push((name.clone(), targets));
    }

    let (targets, renamed) = expand_matrices(&blocks.targets, &context)?;
    let mut origins: Vec<(String, String)> = targets
        .iter()
        .filter(|t| !t.locals.is_empty())
        .map(|t| {
            let values: Vec<String> = t
                .locals
                .iter()
                .rev()
                .map(|(k, v)| format!("{k} = {}", to_json(v)))
                .collect();
            (
                t.name.clone(),
                format!(
                    "from the matrix of target {} ({})",
                    t.block,
                    values.join(", ")
                ),
            )
        })
        .collect();
    for (name, members) in renamed {
        if !groups.iter().any(|(g, _)| *g == name) {
            groups.push((name, members));
        }
    }
    // Attributes evaluated so far, per target: what `target.NAME.attr` reads.
    let mut own: Vec<(String, hcl::Map<String, Value>)> = targets
        .iter()
        .map(|t| (t.name.clone(), hcl::Map::new()))
        .collect();
    let mut pending: Vec<(usize, &String, &Expression)> = targets
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.attributes.iter().map(move |(k, e)| (i, *k, *e)))
        .collect();
    while !pending.is_empty() {
        let mut scope = context.clone();
        scope.declare_var(
            "target",
            Value::Object(
                own.iter()
                    .zip(&targets)
                    .map(|((name, fields), target)| {
                        (
                            name.clone(),
                            Value::Object(as_referenced(name, fields, target)),
                        )
                    })
                    .collect(),
            ),
        );
        eval::set_waiting(Waiting {
            variables: Vec::new(),
            fields: pending
                .iter()
                .map(|(i, key, _)| (own[*i].0.clone(), (*key).clone()))
                .collect(),
        });
        let before = pending.len();
        let mut stuck = None;
        pending.retain(|(i, key, expression)| {
            let evaluated = match targets[*i].locals.as_slice() {
                [] => evaluate(expression, &scope),
                locals => {
                    let mut scope = scope.clone();
                    for (k, v) in locals {
                        scope.declare_var(k.clone(), v.clone());
                    }
                    evaluate(expression, &scope)
                }
            };
            match evaluated {
                Ok(value) => {
                    // A second block of the same name (a later file's) merges as bake does.
                    match own[*i].1.get_mut(*key) {
                        Some(old) => combine(key, old, value),
                        None => {
                            own[*i].1.insert((*key).clone(), value);
                        }
                    }
                    false
                }
                Err(e) => {
                    stuck.get_or_insert((format!("target.{}.{key}", own[*i].0), e));
                    true
                }
            }
        });
        if pending.len() == before {
            let (field, e) = stuck.expect("a stuck attribute kept its error");
            return Err(evaluation(field, &e));
        }
    }
    eval::set_waiting(Waiting::default());
    let own: Vec<(String, Fields)> = own
        .into_iter()
        .map(|(name, fields)| match to_json(&Value::Object(fields)) {
            Json::Object(map) => (name, map),
            _ => unreachable!("an object stays an object"),
        })
        .collect();
    for (name, fields) in &own {
        if let Some(Json::Array(parents)) = fields.get("inherits") {
            let parents: Vec<&str> = parents.iter().filter_map(Json::as_str).collect();
            origins.push((name.clone(), format!("inherits {}", parents.join(", "))));
        }
    }
    let mut targets = Vec::new();
    for (name, _) in &own {
        targets.push((name.clone(), inherited(&own, name, &mut Vec::new())?));
    }
    Ok(Definition {
        groups,
        targets,
        descriptions,
        variables,
        origins,
    })
}

/// A target as `target.NAME` reads it: its fields evaluated so far and, as bake decodes
/// a block into its whole Target, each field the block does not set as bake's empty value
/// (null; an empty list or text for some), so `try(target.base.tags, …)` gives null.
fn as_referenced(
    name: &str,
    fields: &hcl::Map<String, Value>,
    target: &Expanded,
) -> hcl::Map<String, Value> {
    let mut all = fields.clone();
    // Every field of bake's Target (buildx's bake.Target): those polyarch reads, those it
    // refuses, and the name.
    let fields = super::FIELDS
        .iter()
        .chain(super::REFUSED.iter().map(|(field, _)| field));
    for field in fields.chain(&["name"]) {
        if !target.attributes.iter().any(|(key, _)| key == field) && !all.contains_key(*field) {
            let unset = match *field {
                "attest" | "cache-from" | "cache-to" | "output" | "secret" | "ssh" => {
                    Value::Array(Vec::new())
                }
                "description" => Value::String(String::new()),
                "name" => Value::String(name.to_string()),
                _ => Value::Null,
            };
            all.insert((*field).to_string(), unset);
        }
    }
    all
}

fn to_json(value: &Value) -> Json {
    serde_json::to_value(value).expect("HCL values are JSON")
}

/// One target to evaluate: a block, or one combination of a block's `matrix`, with the
/// matrix's values in scope.
struct Expanded<'a> {
    name: String,
    /// The block's own name (a matrix's combinations are renamed).
    block: &'a String,
    attributes: Vec<(&'a String, &'a Expression)>,
    locals: Vec<(String, Value)>,
}

/// Each target with a `matrix` made one target per combination of its values (the
/// first key in sorted order varying fastest), named by its `name` expression; the block's name becomes
/// a group of them, as bake renames it.
#[allow(clippy::type_complexity)]
fn expand_matrices<'a>(
    targets: &'a [(String, Vec<(String, Expression)>)],
    context: &Context,
) -> Result<(Vec<Expanded<'a>>, Vec<(String, Vec<String>)>)> {
    let mut out = Vec::new();
    let mut renamed = Vec::new();
    for (name, attributes) in targets {
        let get = |key: &str| {
            attributes
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, e)| e)
        };
        let rest = || {
            attributes
                .iter()
                .filter(|(k, _)| k != "matrix" && k != "name")
                .map(|(k, e)| (k, e))
                .collect::<Vec<_>>()
        };
        let Some(matrix) = get("matrix") else {
            if get("name").is_some() {
                return Err(Problem::at(
                    format!("target.{name}.name"),
                    "is given without matrix; remove it or add a matrix",
                ));
            }
            out.push(Expanded {
                name: name.clone(),
                block: name,
                attributes: rest(),
                locals: Vec::new(),
            });
            continue;
        };
        let field = format!("target.{name}.matrix");
        let Value::Object(axes) =
            evaluate(matrix, context).map_err(|e| evaluation(field.clone(), &e))?
        else {
            return Err(Problem::at(
                field,
                "is not a map of lists; write { KEY = [\"a\", \"b\"] }",
            ));
        };
        // bake's keys are sorted, the last varying slowest.
        let mut axes: Vec<(String, Value)> = axes.into_iter().collect();
        axes.sort_by(|a, b| b.0.cmp(&a.0));
        let mut combinations: Vec<Vec<(String, Value)>> = vec![Vec::new()];
        for (key, values) in axes {
            let Value::Array(values) = values else {
                return Err(Problem::at(
                    format!("{field}.{key}"),
                    "is not a list; write [\"a\", \"b\"]",
                ));
            };
            combinations = combinations
                .into_iter()
                .flat_map(|c| {
                    let key = &key;
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.push((key.clone(), v.clone()));
                        c
                    })
                })
                .collect();
        }
        let mut names = Vec::new();
        for locals in combinations {
            let renamed_to = match get("name") {
                Some(expression) => {
                    let mut scope = context.clone();
                    for (k, v) in &locals {
                        scope.declare_var(k.clone(), v.clone());
                    }
                    match evaluate(expression, &scope)
                        .map_err(|e| evaluation(format!("target.{name}.name"), &e))?
                    {
                        Value::String(s) => s,
                        _ => {
                            return Err(Problem::at(
                                format!("target.{name}.name"),
                                "is not a string; write name = \"app-${v}\"",
                            ))
                        }
                    }
                }
                None => name.clone(),
            };
            if renamed_to.is_empty()
                || !renamed_to
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(Problem::at(
                    format!("target.{name}.name"),
                    format!(
                        "gives `{renamed_to}`; a target name holds only letters, digits, _ and -"
                    ),
                ));
            }
            if names.contains(&renamed_to) {
                return Err(Problem::at(
                    format!("target.{name}.name"),
                    format!("gives `{renamed_to}` twice; use every matrix value in the name"),
                ));
            }
            names.push(renamed_to.clone());
            out.push(Expanded {
                name: renamed_to,
                block: name,
                attributes: rest(),
                locals,
            });
        }
        if names.len() != 1 || names[0] != *name {
            renamed.push((name.clone(), names));
        }
    }
    Ok((out, renamed))
}

/// A target's fields with its `inherits` applied in order, later winning, as bake merges
/// them: `args` and `labels` key by key, the lists that add up (`annotations`, `attest`,
/// `cache-from`, `secret`, `ssh`) appended, every other field replaced.
fn inherited(own: &[(String, Fields)], name: &str, trail: &mut Vec<String>) -> Result<Fields> {
    let field = format!("target.{name}.inherits");
    if trail.iter().any(|t| t == name) {
        return Err(Problem::at(
            field,
            format!(
                "inherits from itself ({} → {name}); remove one of them",
                trail.join(" → ")
            ),
        ));
    }
    let Some((_, fields)) = own.iter().find(|(n, _)| n == name) else {
        return Err(Problem::at(
            format!(
                "target.{}.inherits",
                trail.last().map_or(name, String::as_str)
            ),
            format!("names `{name}`, which is no target of the file; define it or remove it"),
        ));
    };
    let parents: Vec<String> = match fields.get("inherits") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Problem::at(&field, "holds a value that is not a target name"))
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(Problem::at(
                field,
                "is not a list; write inherits = [\"base\"]",
            ))
        }
    };
    trail.push(name.to_string());
    let mut merged = Fields::new();
    for parent in &parents {
        merge(&mut merged, inherited(own, parent, trail)?);
    }
    trail.pop();
    merge(&mut merged, fields.clone());
    merged.remove("inherits");
    // bake grants a host network's entitlement, and a target inherits what its parents
    // were granted.
    if merged.get("network").and_then(Json::as_str) == Some("host") {
        let granted = merged
            .entry(GRANTED)
            .or_insert_with(|| Json::Array(Vec::new()));
        if let Json::Array(list) = granted {
            list.push("network.host".into());
        }
    }
    Ok(merged)
}

/// The fields bake merges key by key, and the lists it appends; any other field is
/// replaced.
const KEYED: &[&str] = &["args", "labels", "contexts", "extra-hosts"];
const APPENDED: &[&str] = &[
    GRANTED,
    "annotations",
    "attest",
    "cache-from",
    "secret",
    "ssh",
    "no-cache-filter",
    "ulimits",
    "entitlements",
];

/// The entitlements bake grants a target by itself (not the file's `entitlements`, which
/// polyarch refuses): printed by `plan --print`, ignored otherwise.
pub(super) const GRANTED: &str = "granted-entitlements";

fn merge(into: &mut Fields, from: Fields) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (_, Json::Null) => {}
            (Some(Json::Object(old)), Json::Object(new)) if KEYED.contains(&key.as_str()) => {
                old.extend(new.into_iter().filter(|(_, v)| !v.is_null()))
            }
            (Some(Json::Array(old)), Json::Array(new)) if APPENDED.contains(&key.as_str()) => {
                old.extend(new)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// [`merge`] for one attribute of a target declared twice.
fn combine(key: &str, old: &mut Value, new: Value) {
    match (old, new) {
        (_, Value::Null) => {}
        (Value::Object(old), Value::Object(new)) if KEYED.contains(&key) => {
            old.extend(new.into_iter().filter(|(_, v)| !v.is_null()))
        }
        (Value::Array(old), Value::Array(new)) if APPENDED.contains(&key) => old.extend(new),
        (old, new) => *old = new,
    }
}

/// This machine's platform as bake writes it (containerd's default spec).
fn local_platform() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "linux/amd64",
        "aarch64" => "linux/arm64/v8",
        "arm" => "linux/arm/v7",
        "riscv64" => "linux/riscv64",
        "powerpc64" => "linux/ppc64le",
        "s390x" => "linux/s390x",
        _ => "linux/amd64",
    }
}

/// The environment's text as the default's type, as bake reads an override.
fn typed_like(default: &Value, text: String) -> Value {
    match default {
        Value::Bool(_) => match text.as_str() {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => Value::String(text),
        },
        Value::Number(_) => text
            .parse::<i64>()
            .map(Value::from)
            .or_else(|_| text.parse::<f64>().map(Value::from))
            .unwrap_or(Value::String(text)),
        _ => Value::String(text),
    }
}

/// An evaluation error at `field`, worded with the fix.
fn evaluation(field: String, e: &hcl::eval::Error) -> Problem {
    let message = match e.kind() {
        ErrorKind::UndefinedVar(name) => format!(
            "uses `{name}`, which is no variable of the file; declare variable \"{name}\" {{ default = … }}"
        ),
        ErrorKind::UndefinedFunc(name) => format!(
            "calls {name}(), a function polyarch does not provide (it has {}); compute the value in a variable, or set it from the environment",
            super::functions::NAMES.join(", ")
        ),
        ErrorKind::FuncCall(name, why) if name.name.as_str() == "try" => format!(
            "calls try(), and {why}; at least one expression must produce a successful result: end it with a fallback that always does"
        ),
        _ => format!("cannot be evaluated ({e}); fix the expression"),
    };
    Problem::at(field, message)
}

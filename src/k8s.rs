//! The scheduling side of `polyarch gate`: which node pools each workload in a set of
//! Kubernetes manifests may be scheduled onto, and whether every container image provides
//! the os/arch of every such pool.
//!
//! Pure logic, no I/O besides reading the input files and no printing: the caller (the
//! `gate` module) looks images up in the registry and hands the results to [`evaluate`] as
//! a closure.
//!
//! Inputs are parsed as generic values (`serde_norway::Value`) so unknown fields never break
//! parsing; every malformed input becomes one `Error::Usage` line naming
//! `file#document` (1-based), the field path and the fix.

use crate::error::{Error, Result};
use crate::platform::Platform;
use serde::{Deserialize, Serialize};
use serde_norway::{Mapping, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

/// Schema tag of [`GateRecord`].
pub const GATE_SCHEMA: &str = "polyarch/gate/v1";

const ARCH_LABEL: &str = "kubernetes.io/arch";
const OS_LABEL: &str = "kubernetes.io/os";
const BETA_ARCH_LABEL: &str = "beta.kubernetes.io/arch";
const BETA_OS_LABEL: &str = "beta.kubernetes.io/os";

/// Node labels that name the pool a node belongs to, in order of preference.
pub const POOL_LABELS: &[&str] = &[
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "alpha.eksctl.io/nodegroup-name",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "karpenter.sh/nodepool",
    "karpenter.sh/provisioner-name",
    "node.kubernetes.io/pool",
    "doks.digitalocean.com/node-pool",
    "kops.k8s.io/instancegroup",
    "node-pool",
];

/// Taints the node lifecycle controller sets for transient node conditions (cordoned,
/// not ready, …). They say nothing about which hardware a workload may land on, so
/// scheduling ignores them: a cordoned arm64 node is still an arm64 node.
const CONDITION_TAINT_PREFIXES: &[&str] = &[
    "node.kubernetes.io/",
    "node.cloudprovider.kubernetes.io/uninitialized",
];

// ---------------------------------------------------------------------------------------
// Workloads

/// One pod-creating object from the manifests.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// `file#doc` (1-based document index); `file#doc/items/i` for items of a `List`.
    pub source: String,
    /// The 1-based document index within its file, and the item index within a `List`.
    pub document: usize,
    pub item: Option<usize>,
    /// Where the pod spec sits in the object (`spec.template.spec`, …), for fix hints.
    pub pod_spec_path: String,
    pub node_selector: BTreeMap<String, String>,
    /// `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`;
    /// `None` when the workload has no required node affinity. Terms are ORed.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
    /// `spec.nodeName`: the pod bypasses the scheduler and goes to that node.
    pub node_name: Option<String>,
    /// Containers first, then init containers, each in document order.
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub init: bool,
    /// Position in `containers` (or `initContainers` when `init`).
    pub index: usize,
    /// `imagePullPolicy` as written (Always, IfNotPresent or Never); `None` when not written.
    pub pull_policy: Option<String>,
}

/// One node selector term: all expressions and fields must match (AND).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSelectorTerm {
    pub match_expressions: Vec<Requirement>,
    /// Only `metadata.name` exists in Kubernetes.
    pub match_fields: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toleration {
    /// Empty with `Exists` tolerates every taint.
    pub key: String,
    pub operator: TolerationOperator,
    pub value: String,
    /// `None` matches every effect.
    pub effect: Option<TaintEffect>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
        })
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        })
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

impl Workload {
    /// `namespace/name`, or `name` when the manifest sets no namespace.
    pub fn qualified_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    fn uses_node_names(&self) -> bool {
        self.node_name.is_some()
            || self
                .required_terms
                .iter()
                .flatten()
                .any(|t| !t.match_fields.is_empty())
    }
}

/// One manifest file as read: its text is kept so `gate --pin` can write it back pinned.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    pub path: PathBuf,
    /// Its path relative to the `--manifests` directory it was found in, or its file name.
    pub relative: PathBuf,
    pub text: String,
    pub workloads: Vec<Workload>,
}

/// Loads every manifest file from Kubernetes manifest files or directories (recursively,
/// `*.yaml`, `*.yml`, `*.json`, sorted; hidden entries skipped) with its workloads. Files
/// named explicitly are read whatever their extension.
pub fn load_manifests(paths: &[PathBuf]) -> Result<Vec<ManifestFile>> {
    let mut out = Vec::new();
    for path in paths {
        for file in manifest_files(path)? {
            let text = read_text(&file)?;
            let workloads = parse_workloads(&file, &text)?;
            let relative = match file.strip_prefix(path) {
                Ok(r) if !r.as_os_str().is_empty() => r.to_path_buf(),
                _ => file
                    .file_name()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| file.clone()),
            };
            out.push(ManifestFile {
                path: file,
                relative,
                text,
                workloads,
            });
        }
    }
    Ok(out)
}

/// Parses one manifest file's text (multi-document YAML, or JSON when `file` ends in
/// `.json`). `file` is only used for messages and the format choice.
pub fn parse_workloads(file: &Path, text: &str) -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    for (index, doc) in documents(file, text)? {
        let src = format!("{}#{index}", file.display());
        collect_object(&src, index, None, &doc, None, &mut out)?;
    }
    Ok(out)
}

fn manifest_files(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::input(path, e))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    walk(path, &mut out)?;
    out.sort();
    if out.is_empty() {
        return Err(Error::Usage(format!(
            "{}: the directory has no *.yaml, *.yml or *.json files; pass rendered manifests \
             (e.g. `helm template … > deploy.yaml` or `kustomize build … > deploy.yaml`)",
            path.display()
        )));
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::input(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let file_type = entry.file_type().map_err(|e| Error::io(&path, e))?;
        // Symlinked directories are not followed (no loops); symlinked files are read.
        if file_type.is_dir() {
            walk(&path, out)?;
        } else if is_manifest_name(&path) && (file_type.is_file() || path.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}

fn is_manifest_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["yaml", "yml", "json"].contains(&e.to_ascii_lowercase().as_str()))
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::input(path, e))?;
    String::from_utf8(bytes).map_err(|_| {
        Error::Usage(format!(
            "{}: not UTF-8 text; pass Kubernetes YAML or JSON",
            path.display()
        ))
    })
}

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
                Error::Usage(format!(
                    "{}#{index}: not valid JSON: {}; fix the file or export it again",
                    file.display(),
                    one_line(&e)
                ))
            })?;
            let value = serde_norway::to_value(json).map_err(|e| {
                Error::Usage(format!("{}#{index}: {}", file.display(), one_line(&e)))
            })?;
            if !value.is_null() {
                docs.push((index, value));
            }
        }
    } else {
        // The iterator keeps yielding the same error after a syntax error, so stop at once.
        for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
            let index = i + 1;
            let syntax = |e: serde_norway::Error| {
                Error::Usage(format!(
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
struct At<'a> {
    src: &'a str,
}

impl At<'_> {
    fn err(&self, path: &str, message: impl fmt::Display) -> Error {
        if path.is_empty() {
            Error::Usage(format!("{}: {message}", self.src))
        } else {
            Error::Usage(format!("{}: {path}: {message}", self.src))
        }
    }
}

fn untag(v: &Value) -> &Value {
    let mut v = v;
    while let Value::Tagged(t) = v {
        v = &t.value;
    }
    v
}

/// `v[key]`, with tags stripped and `null` treated as absent.
fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match untag(v) {
        Value::Mapping(m) => m.get(key).map(untag).filter(|v| !v.is_null()),
        _ => None,
    }
}

fn type_name(v: &Value) -> &'static str {
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

fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// A scalar as Kubernetes would read it into a string field.
fn scalar(v: &Value) -> Option<String> {
    match untag(v) {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn opt_string(at: &At, parent: &Value, base: &str, key: &str) -> Result<Option<String>> {
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

fn seq<'a>(at: &At, parent: &'a Value, base: &str, key: &str) -> Result<&'a [Value]> {
    match field(parent, key) {
        None => Ok(&[]),
        Some(Value::Sequence(s)) => Ok(s),
        Some(v) => Err(at.err(
            &join(base, key),
            format!("must be a list, found {}", type_name(v)),
        )),
    }
}

fn string_map(at: &At, parent: &Value, base: &str, key: &str) -> Result<BTreeMap<String, String>> {
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

fn expect_mapping<'a>(at: &At, v: &'a Value, path: &str) -> Result<&'a Value> {
    let v = untag(v);
    if v.is_mapping() {
        Ok(v)
    } else {
        Err(at.err(path, format!("must be a mapping, found {}", type_name(v))))
    }
}

fn collect_object(
    src: &str,
    document: usize,
    item: Option<usize>,
    value: &Value,
    inferred_kind: Option<&str>,
    out: &mut Vec<Workload>,
) -> Result<()> {
    let at = At { src };
    let value = untag(value);
    if !value.is_mapping() {
        return Err(at.err(
            "",
            format!(
                "is {}, not a Kubernetes object (a mapping with apiVersion and kind); \
                 pass rendered manifests",
                type_name(value)
            ),
        ));
    }
    let kind = match (opt_string(&at, value, "", "kind")?, inferred_kind) {
        (Some(k), _) if !k.is_empty() => k,
        (_, Some(k)) => k.to_string(),
        _ => {
            return Err(at.err(
                "",
                "has no `kind`, so it is not a Kubernetes object; pass rendered manifests \
                 (`helm template`, `kustomize build`), not chart sources or values files",
            ))
        }
    };
    if kind.ends_with("List") && item.is_none() {
        // `kind: List` (kubectl) or a typed list (`DeploymentList`, whose items omit kind).
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        for (i, item) in seq(&at, value, "", "items")?.iter().enumerate() {
            if untag(item).is_null() {
                continue;
            }
            let item_src = format!("{src}/items/{i}");
            collect_object(&item_src, document, Some(i), item, item_kind, out)?;
        }
        return Ok(());
    }
    let pod_spec_path = match kind.as_str() {
        "Pod" => "spec",
        "CronJob" => "spec.jobTemplate.spec.template.spec",
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicaSet"
        | "ReplicationController" => "spec.template.spec",
        _ => return Ok(()),
    };
    let place = (document, item);
    out.push(parse_workload(&at, &kind, value, pod_spec_path, place)?);
    Ok(())
}

fn parse_workload(
    at: &At,
    kind: &str,
    obj: &Value,
    pod_spec_path: &str,
    (document, item): (usize, Option<usize>),
) -> Result<Workload> {
    let metadata = match field(obj, "metadata") {
        Some(m) => expect_mapping(at, m, "metadata")?,
        None => &Value::Null,
    };
    let name = match opt_string(at, metadata, "metadata", "name")? {
        Some(n) if !n.is_empty() => n,
        _ => match opt_string(at, metadata, "metadata", "generateName")? {
            Some(g) if !g.is_empty() => format!("{g}*"),
            _ => {
                return Err(at.err(
                    "metadata.name",
                    format!("missing; every {kind} needs a name"),
                ))
            }
        },
    };
    let namespace = opt_string(at, metadata, "metadata", "namespace")?.filter(|n| !n.is_empty());

    let mut spec = obj;
    let mut walked = String::new();
    for key in pod_spec_path.split('.') {
        walked = join(&walked, key);
        spec = match field(spec, key) {
            Some(v) => expect_mapping(at, v, &walked)?,
            None => {
                return Err(at.err(
                    &walked,
                    format!("missing; a {kind} needs its pod spec at `{pod_spec_path}`"),
                ))
            }
        };
    }
    let base = pod_spec_path;

    let node_selector = string_map(at, spec, base, "nodeSelector")?;
    let node_name = opt_string(at, spec, base, "nodeName")?.filter(|n| !n.is_empty());

    let mut required_terms = None;
    let affinity_path = join(base, "affinity.nodeAffinity");
    let node_affinity = field(spec, "affinity").and_then(|a| field(a, "nodeAffinity"));
    if let Some(na) = node_affinity {
        let na = expect_mapping(at, na, &affinity_path)?;
        let req_path = join(
            &affinity_path,
            "requiredDuringSchedulingIgnoredDuringExecution",
        );
        if let Some(req) = field(na, "requiredDuringSchedulingIgnoredDuringExecution") {
            let req = expect_mapping(at, req, &req_path)?;
            let mut terms = Vec::new();
            for (i, t) in seq(at, req, &req_path, "nodeSelectorTerms")?
                .iter()
                .enumerate()
            {
                let tpath = format!("{req_path}.nodeSelectorTerms[{i}]");
                terms.push(parse_term(at, t, &tpath)?);
            }
            required_terms = Some(terms);
        }
    }

    let mut tolerations = Vec::new();
    for (i, t) in seq(at, spec, base, "tolerations")?.iter().enumerate() {
        tolerations.push(parse_toleration(
            at,
            t,
            &format!("{base}.tolerations[{i}]"),
        )?);
    }

    let mut containers = Vec::new();
    for (key, init) in [("containers", false), ("initContainers", true)] {
        for (i, c) in seq(at, spec, base, key)?.iter().enumerate() {
            let cpath = format!("{base}.{key}[{i}]");
            let c = expect_mapping(at, c, &cpath)?;
            let name = opt_string(at, c, &cpath, "name")?
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    at.err(
                        &join(&cpath, "name"),
                        "missing; every container needs a name",
                    )
                })?;
            let image = opt_string(at, c, &cpath, "image")?
                .map(|i| i.trim().to_string())
                .filter(|i| !i.is_empty())
                .ok_or_else(|| {
                    at.err(
                        &join(&cpath, "image"),
                        format!("missing for container `{name}`; every container needs an image"),
                    )
                })?;
            let pull_policy = match opt_string(at, c, &cpath, "imagePullPolicy")?.as_deref() {
                None | Some("") => None,
                Some(p @ ("Always" | "IfNotPresent" | "Never")) => Some(p.to_string()),
                Some(other) => {
                    return Err(at.err(
                        &join(&cpath, "imagePullPolicy"),
                        format!("`{other}` is not one of Always, IfNotPresent, Never"),
                    ))
                }
            };
            containers.push(Container {
                name,
                image,
                init,
                index: i,
                pull_policy,
            });
        }
    }
    if !containers.iter().any(|c| !c.init) {
        return Err(at.err(
            &join(base, "containers"),
            format!("missing or empty; a {kind} needs at least one container"),
        ));
    }

    Ok(Workload {
        kind: kind.to_string(),
        namespace,
        name,
        source: at.src.to_string(),
        document,
        item,
        pod_spec_path: pod_spec_path.to_string(),
        node_selector,
        required_terms,
        tolerations,
        node_name,
        containers,
    })
}

fn parse_term(at: &At, t: &Value, path: &str) -> Result<NodeSelectorTerm> {
    let t = expect_mapping(at, t, path)?;
    let mut term = NodeSelectorTerm::default();
    for (key, fields) in [("matchExpressions", false), ("matchFields", true)] {
        for (i, r) in seq(at, t, path, key)?.iter().enumerate() {
            let rpath = format!("{path}.{key}[{i}]");
            let req = parse_requirement(at, r, &rpath)?;
            if fields {
                if req.key != "metadata.name" {
                    return Err(at.err(
                        &join(&rpath, "key"),
                        format!(
                            "`{}` is not a node field; matchFields supports only `metadata.name`",
                            req.key
                        ),
                    ));
                }
                term.match_fields.push(req);
            } else {
                term.match_expressions.push(req);
            }
        }
    }
    Ok(term)
}

fn parse_requirement(at: &At, r: &Value, path: &str) -> Result<Requirement> {
    let r = expect_mapping(at, r, path)?;
    let key = opt_string(at, r, path, "key")?
        .filter(|k| !k.is_empty())
        .ok_or_else(|| at.err(&join(path, "key"), "missing"))?;
    let op = opt_string(at, r, path, "operator")?.unwrap_or_default();
    let operator = match op.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        other => {
            return Err(at.err(
                &join(path, "operator"),
                format!("`{other}` is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
            ))
        }
    };
    let vpath = join(path, "values");
    let mut values = Vec::new();
    for (i, v) in seq(at, r, path, "values")?.iter().enumerate() {
        values.push(scalar(v).ok_or_else(|| {
            at.err(
                &format!("{vpath}[{i}]"),
                format!("must be a string, found {}", type_name(v)),
            )
        })?);
    }
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => {
            return Err(at.err(&vpath, format!("`{operator}` needs at least one value")))
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            return Err(at.err(&vpath, format!("`{operator}` takes no values; remove them")))
        }
        Operator::Gt | Operator::Lt
            if values.len() != 1 || values[0].trim().parse::<i64>().is_err() =>
        {
            return Err(at.err(
                &vpath,
                format!("`{operator}` needs exactly one integer value"),
            ))
        }
        _ => {}
    }
    Ok(Requirement {
        key,
        operator,
        values,
    })
}

fn parse_effect(at: &At, v: Option<String>, path: &str) -> Result<Option<TaintEffect>> {
    match v.as_deref() {
        None | Some("") => Ok(None),
        Some("NoSchedule") => Ok(Some(TaintEffect::NoSchedule)),
        Some("PreferNoSchedule") => Ok(Some(TaintEffect::PreferNoSchedule)),
        Some("NoExecute") => Ok(Some(TaintEffect::NoExecute)),
        Some(other) => Err(at.err(
            path,
            format!("`{other}` is not one of NoSchedule, PreferNoSchedule, NoExecute"),
        )),
    }
}

fn parse_toleration(at: &At, t: &Value, path: &str) -> Result<Toleration> {
    let t = expect_mapping(at, t, path)?;
    let key = opt_string(at, t, path, "key")?.unwrap_or_default();
    let operator = match opt_string(at, t, path, "operator")?.as_deref() {
        None | Some("") | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(other) => {
            return Err(at.err(
                &join(path, "operator"),
                format!("`{other}` is not Equal or Exists"),
            ))
        }
    };
    let value = opt_string(at, t, path, "value")?.unwrap_or_default();
    let effect = parse_effect(
        at,
        opt_string(at, t, path, "effect")?,
        &join(path, "effect"),
    )?;
    if key.is_empty() && operator == TolerationOperator::Equal {
        return Err(at.err(
            path,
            "an empty key needs `operator: Exists` (to tolerate every taint)",
        ));
    }
    if operator == TolerationOperator::Exists && !value.is_empty() {
        return Err(at.err(
            &join(path, "value"),
            "must be empty with `operator: Exists`",
        ));
    }
    Ok(Toleration {
        key,
        operator,
        value,
        effect,
    })
}

fn parse_taint(at: &At, t: &Value, path: &str) -> Result<Taint> {
    let t = expect_mapping(at, t, path)?;
    let key = opt_string(at, t, path, "key")?
        .filter(|k| !k.is_empty())
        .ok_or_else(|| at.err(&join(path, "key"), "missing"))?;
    let value = opt_string(at, t, path, "value")?.unwrap_or_default();
    let effect = parse_effect(
        at,
        opt_string(at, t, path, "effect")?,
        &join(path, "effect"),
    )?
    .ok_or_else(|| {
        at.err(
            &join(path, "effect"),
            "missing; use NoSchedule, PreferNoSchedule or NoExecute",
        )
    })?;
    Ok(Taint { key, value, effect })
}

// ---------------------------------------------------------------------------------------
// Node pools

/// A group of nodes with one os/arch.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePool {
    pub name: String,
    /// The pool's os/arch (what `kubernetes.io/os` and `kubernetes.io/arch` say).
    pub platform: Platform,
    /// Labels every member has (pool files: as declared, plus the `beta.` aliases).
    pub labels: BTreeMap<String, String>,
    /// Taints every member has.
    pub taints: Vec<Taint>,
    /// Nodes in the pool (a pool file's `count`, default 1; may be 0 for scaled-down pools).
    pub count: u64,
    /// The members scheduling is evaluated against: one per node for `kubectl get nodes`
    /// input; one unnamed template for a pool-file pool.
    pub nodes: Vec<NodeShape>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    /// `None` for pool-file pools, whose node names are unknown.
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// `status.nodeInfo.containerRuntimeVersion` (`containerd://1.7.13`); `None` for
    /// pool-file pools.
    pub runtime: Option<String>,
}

/// Loads node pools from `kubectl get nodes -o json|yaml` output (a `List`/`NodeList` of
/// `Node`s) or from a pool file (`pools: [{name, labels, taints, count, platform?}]`).
pub fn load_nodes(path: &Path) -> Result<Vec<NodePool>> {
    let text = read_text(path)?;
    parse_nodes(path, &text)
}

/// [`load_nodes`] on text already read; `file` names it in messages and picks JSON or YAML.
pub fn parse_nodes(file: &Path, text: &str) -> Result<Vec<NodePool>> {
    let mut pools: Vec<NodePool> = Vec::new();
    let mut nodes = Vec::new();
    for (index, doc) in documents(file, text)? {
        let src = format!("{}#{index}", file.display());
        let at = At { src: &src };
        let doc = untag(&doc);
        if !doc.is_mapping() {
            return Err(at.err("", format!("is {}; {NODES_HINT}", type_name(doc))));
        }
        let kind = opt_string(&at, doc, "", "kind")?.unwrap_or_default();
        if field(doc, "pools").is_some() {
            pools.extend(parse_pool_file(&at, doc)?);
        } else if kind == "Node" {
            nodes.push(parse_node(&at, doc, "")?);
        } else if kind.ends_with("List") || field(doc, "items").is_some() {
            for (i, item) in seq(&at, doc, "", "items")?.iter().enumerate() {
                let path = format!("items[{i}]");
                let item_kind = opt_string(&at, item, &path, "kind")?;
                if item_kind.as_deref().is_some_and(|k| k != "Node") {
                    return Err(at.err(
                        &path,
                        format!(
                            "is a {}, not a Node; {NODES_HINT}",
                            item_kind.unwrap_or_default()
                        ),
                    ));
                }
                nodes.push(parse_node(&at, item, &path)?);
            }
        } else {
            return Err(at.err("", NODES_HINT));
        }
    }
    pools.extend(group_nodes(nodes));
    if pools.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no nodes or pools found; {NODES_HINT}",
            file.display()
        )));
    }
    let mut seen = BTreeSet::new();
    for p in &pools {
        if !seen.insert(p.name.as_str()) {
            return Err(Error::Usage(format!(
                "{}: pool `{}` is defined twice; give each pool a unique name",
                file.display(),
                p.name
            )));
        }
    }
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(pools)
}

const NODES_HINT: &str = "expected `kubectl get nodes -o json` output (a List of Node) or a pool \
     file (`pools: [{name, labels: {kubernetes.io/arch: arm64}, taints, count}]`)";

struct ParsedNode {
    name: String,
    /// `(label key, value)` of the pool label, if any.
    pool: Option<(String, String)>,
    platform: Platform,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    runtime: Option<String>,
}

fn parse_node(at: &At, node: &Value, base: &str) -> Result<ParsedNode> {
    let node = expect_mapping(at, node, if base.is_empty() { "node" } else { base })?;
    let meta_path = join(base, "metadata");
    let metadata = match field(node, "metadata") {
        Some(m) => expect_mapping(at, m, &meta_path)?,
        None => &Value::Null,
    };
    let name = opt_string(at, metadata, &meta_path, "name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            at.err(
                &join(&meta_path, "name"),
                "missing; every node needs a name",
            )
        })?;
    let labels = string_map(at, metadata, &meta_path, "labels")?;
    let spec_path = join(base, "spec");
    let mut taints = Vec::new();
    if let Some(spec) = field(node, "spec") {
        for (i, t) in seq(at, spec, &spec_path, "taints")?.iter().enumerate() {
            taints.push(parse_taint(at, t, &format!("{spec_path}.taints[{i}]"))?);
        }
    }
    let info_path = join(base, "status.nodeInfo");
    let info = field(node, "status").and_then(|s| field(s, "nodeInfo"));
    let info_os = match info {
        Some(i) => opt_string(at, i, &info_path, "operatingSystem")?,
        None => None,
    };
    let info_arch = match info {
        Some(i) => opt_string(at, i, &info_path, "architecture")?,
        None => None,
    };
    let runtime = match info {
        Some(i) => opt_string(at, i, &info_path, "containerRuntimeVersion")?,
        None => None,
    }
    .filter(|r| !r.is_empty());
    let pool = POOL_LABELS.iter().find_map(|k| {
        labels
            .get(*k)
            .filter(|v| !v.is_empty())
            .map(|v| (k.to_string(), v.clone()))
    });
    let arch = labels
        .get(ARCH_LABEL)
        .or_else(|| labels.get(BETA_ARCH_LABEL))
        .cloned()
        .or(info_arch)
        .filter(|a| !a.is_empty());
    let Some(arch) = arch else {
        let pool_name = pool.as_ref().map_or(name.as_str(), |(_, v)| v.as_str());
        return Err(at.err(
            base,
            format!(
                "node `{name}` (pool `{pool_name}`) has no `{ARCH_LABEL}` label and no \
                 status.nodeInfo.architecture; export the nodes again with \
                 `kubectl get nodes -o json`, or label the node: \
                 `kubectl label node {name} {ARCH_LABEL}=<amd64|arm64>`"
            ),
        ));
    };
    let os = labels
        .get(OS_LABEL)
        .or_else(|| labels.get(BETA_OS_LABEL))
        .cloned()
        .or(info_os)
        .filter(|o| !o.is_empty())
        .unwrap_or_else(|| "linux".to_string());
    Ok(ParsedNode {
        name,
        pool,
        platform: Platform::new(&os, &arch, None),
        labels,
        taints,
        runtime,
    })
}

/// Groups nodes by pool label (else one pool per node). A pool spanning several
/// platforms (e.g. a multi-arch Karpenter NodePool) is split into `name[os/arch]` pools.
fn group_nodes(nodes: Vec<ParsedNode>) -> Vec<NodePool> {
    let mut groups: BTreeMap<String, BTreeMap<String, Vec<ParsedNode>>> = BTreeMap::new();
    for n in nodes {
        let pool = n.pool.as_ref().map_or(n.name.clone(), |(_, v)| v.clone());
        groups
            .entry(pool)
            .or_default()
            .entry(n.platform.os_arch())
            .or_default()
            .push(n);
    }
    let mut out = Vec::new();
    for (pool, by_platform) in groups {
        let split = by_platform.len() > 1;
        for (os_arch, members) in by_platform {
            let name = if split {
                format!("{pool}[{os_arch}]")
            } else {
                pool.clone()
            };
            let platform = members[0].platform.clone();
            let mut labels = members[0].labels.clone();
            let mut taints = members[0].taints.clone();
            for m in &members[1..] {
                labels.retain(|k, v| m.labels.get(k) == Some(v));
                taints.retain(|t| m.taints.contains(t));
            }
            out.push(NodePool {
                name,
                platform,
                labels,
                taints,
                count: members.len() as u64,
                nodes: members
                    .into_iter()
                    .map(|m| NodeShape {
                        name: Some(m.name),
                        labels: m.labels,
                        taints: m.taints,
                        runtime: m.runtime,
                    })
                    .collect(),
            });
        }
    }
    out
}

fn parse_pool_file(at: &At, doc: &Value) -> Result<Vec<NodePool>> {
    if let Some(m) = doc.as_mapping() {
        for k in m.keys() {
            let k = scalar(k).unwrap_or_default();
            if k != "pools" {
                return Err(at.err(&k, "unknown key in a pool file; only `pools` is allowed"));
            }
        }
    }
    let mut out = Vec::new();
    for (i, p) in seq(at, doc, "", "pools")?.iter().enumerate() {
        let path = format!("pools[{i}]");
        let p = expect_mapping(at, p, &path)?;
        if let Some(m) = p.as_mapping() {
            for k in m.keys() {
                let k = scalar(k).unwrap_or_default();
                if !["name", "labels", "taints", "count", "platform"].contains(&k.as_str()) {
                    return Err(at.err(
                        &join(&path, &k),
                        "unknown key; a pool has name, labels, taints, count and platform",
                    ));
                }
            }
        }
        let name = opt_string(at, p, &path, "name")?
            .filter(|n| !n.is_empty())
            .ok_or_else(|| at.err(&join(&path, "name"), "missing; every pool needs a name"))?;
        let path = format!("{path} (`{name}`)");
        let mut labels = string_map(at, p, &path, "labels")?;
        let mut taints = Vec::new();
        for (j, t) in seq(at, p, &path, "taints")?.iter().enumerate() {
            taints.push(parse_taint(at, t, &format!("{path}.taints[{j}]"))?);
        }
        let count = match field(p, "count") {
            None => 1,
            Some(v) => v.as_u64().ok_or_else(|| {
                at.err(
                    &join(&path, "count"),
                    format!("must be a whole number >= 0, found {}", type_name(v)),
                )
            })?,
        };
        let declared = match opt_string(at, p, &path, "platform")? {
            Some(s) => Some(
                s.parse::<Platform>()
                    .map_err(|e| at.err(&join(&path, "platform"), e))?,
            ),
            None => None,
        };
        let label = |keys: [&str; 2]| -> Result<Option<String>> {
            let a = labels.get(keys[0]).filter(|v| !v.is_empty());
            let b = labels.get(keys[1]).filter(|v| !v.is_empty());
            match (a, b) {
                (Some(a), Some(b)) if a != b => Err(at.err(
                    &join(&path, "labels"),
                    format!(
                        "`{}: {a}` and `{}: {b}` disagree; keep one",
                        keys[0], keys[1]
                    ),
                )),
                (a, b) => Ok(a.or(b).cloned()),
            }
        };
        let arch = label([ARCH_LABEL, BETA_ARCH_LABEL])?;
        let os = label([OS_LABEL, BETA_OS_LABEL])?;
        let platform = match (arch, declared) {
            (None, None) => {
                return Err(at.err(
                    &path,
                    format!(
                        "no `{ARCH_LABEL}` label; add `labels: {{{ARCH_LABEL}: arm64, {OS_LABEL}: linux}}` \
                         (or `platform: linux/arm64`) to pool `{name}`"
                    ),
                ))
            }
            (None, Some(d)) => {
                if let Some(os) = &os {
                    if Platform::new(os, "amd64", None).os != d.os {
                        return Err(at.err(&path, format!("`{OS_LABEL}: {os}` disagrees with `platform: {d}`")));
                    }
                }
                Platform::new(&d.os, &d.architecture, None)
            }
            (Some(arch), declared) => {
                let p = Platform::new(os.as_deref().unwrap_or("linux"), &arch, None);
                if let Some(d) = declared {
                    if d.os_arch() != p.os_arch() {
                        return Err(at.err(
                            &path,
                            format!("`platform: {d}` disagrees with its labels ({})", p.os_arch()),
                        ));
                    }
                }
                p
            }
        };
        // Both spellings, normalised the way kubelet sets them, so selectors on either match.
        for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
            labels.insert(key.to_string(), platform.architecture.clone());
        }
        for key in [OS_LABEL, BETA_OS_LABEL] {
            labels.insert(key.to_string(), platform.os.clone());
        }
        out.push(NodePool {
            name,
            platform,
            labels: labels.clone(),
            taints: taints.clone(),
            count,
            nodes: vec![NodeShape {
                name: None,
                labels,
                taints,
                runtime: None,
            }],
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Scheduling

/// The pools at least one of whose nodes the workload's pods may be scheduled onto:
/// `nodeSelector`, required node affinity and `NoSchedule`/`NoExecute` taints.
pub fn schedulable_pools<'a>(workload: &Workload, pools: &'a [NodePool]) -> Vec<&'a NodePool> {
    pools
        .iter()
        .filter(|p| p.nodes.iter().any(|n| node_fits(workload, n)))
        .collect()
}

fn node_fits(w: &Workload, node: &NodeShape) -> bool {
    if let (Some(wanted), Some(name)) = (&w.node_name, &node.name) {
        if wanted != name {
            return false;
        }
    }
    let selector_ok = w
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let affinity_ok = match &w.required_terms {
        None => true,
        Some(terms) => terms.iter().any(|t| term_matches(t, node)),
    };
    selector_ok && affinity_ok && taints_tolerated(w, node)
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeShape) -> bool {
    // An empty term matches no node (as in the scheduler).
    if term.match_expressions.is_empty() && term.match_fields.is_empty() {
        return false;
    }
    term.match_expressions
        .iter()
        .all(|r| r.matches(node.labels.get(&r.key).map(String::as_str)))
        && term.match_fields.iter().all(|r| match &node.name {
            Some(name) => r.matches(Some(name)),
            // Pool-file pools have no node names: assume some node matches (stricter gate).
            None => true,
        })
}

impl Requirement {
    /// Whether a label value (or its absence) satisfies this requirement.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let int = |s: &str| s.trim().parse::<i64>().ok();
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => !value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (
                    value.and_then(int),
                    self.values.first().and_then(|b| int(b)),
                ) else {
                    return false;
                };
                if self.operator == Operator::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

impl Toleration {
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if self.key.is_empty() {
            return self.operator == TolerationOperator::Exists;
        }
        self.key == taint.key
            && match self.operator {
                TolerationOperator::Exists => true,
                TolerationOperator::Equal => self.value == taint.value,
            }
    }
}

fn is_condition_taint(key: &str) -> bool {
    CONDITION_TAINT_PREFIXES.iter().any(|p| key.starts_with(p))
}

fn taints_tolerated(w: &Workload, node: &NodeShape) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect != TaintEffect::PreferNoSchedule && !is_condition_taint(&t.key))
        // A pod with nodeName skips the scheduler; only the kubelet's NoExecute check applies.
        .filter(|t| !(w.node_name.is_some() && t.effect == TaintEffect::NoSchedule))
        .all(|t| w.tolerations.iter().any(|tol| tol.tolerates(t)))
}

// ---------------------------------------------------------------------------------------
// Gate evaluation and record

/// What an image reference provides, as the caller looked it up in the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvidedPlatforms {
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: Option<String>,
    /// Platforms of the index's image manifests (attestation entries excluded or not:
    /// `unknown/unknown` never matches a pool).
    pub platforms: Vec<Platform>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRecord {
    /// [`GATE_SCHEMA`].
    pub schema: String,
    pub covered: bool,
    pub workloads: Vec<WorkloadGate>,
    /// Findings that are not gaps (unschedulable workloads, unverifiable node names, …).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadGate {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// `file#doc`.
    pub source: String,
    pub containers: Vec<ContainerGate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerGate {
    pub container: String,
    pub init: bool,
    pub image: String,
    pub digest: Option<String>,
    /// Names of the pools the workload may be scheduled onto.
    pub pools: Vec<String>,
    /// `os/arch` of those pools.
    pub needed: Vec<String>,
    /// Platforms the image provides (with variants, e.g. `linux/arm/v7`).
    pub provided: Vec<String>,
    /// `needed` minus the provided `os/arch`es.
    pub missing: Vec<String>,
    /// The reachable pools whose `os/arch` is missing.
    pub missing_pools: Vec<String>,
    pub covered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixes: Option<Fixes>,
    /// Why the image could not be read (the gate then exits 3); nothing else was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Two ways to close a gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fixes {
    /// (a) for an image built by polyarch: its `platforms:` line in `polyarch.yaml`
    /// with the missing platforms added.
    pub polyarch_platforms: String,
    /// (b) a `nodeAffinity` YAML snippet keeping the pod on archs every one of its images
    /// provides (merged with its existing required terms); `None` when no reachable pool
    /// would remain.
    pub node_affinity: Option<String>,
    /// Where the snippet goes in the manifest (`spec.template.spec`, …).
    pub node_affinity_path: String,
}

/// Checks every container of every workload against the pools it may be scheduled onto.
/// `provided` is called once per distinct image reference. An image it could not read (its
/// error says why) is recorded against each container using it, which is then not covered
/// and restricts no fix: one unreadable image must not hide what the others show.
pub fn evaluate(
    workloads: &[Workload],
    pools: &[NodePool],
    provided: &dyn Fn(&str) -> Result<ProvidedPlatforms, String>,
) -> GateRecord {
    let mut cache: HashMap<String, Result<ProvidedPlatforms, String>> = HashMap::new();
    let mut warnings = Vec::new();
    let mut out = Vec::new();
    if workloads.is_empty() {
        warnings.push(
            "the manifests contain no workloads (Deployment, StatefulSet, DaemonSet, Job, \
             CronJob, Pod, ReplicaSet, ReplicationController); nothing was checked"
                .to_string(),
        );
    }
    for w in workloads {
        let label = format!("{} {} ({})", w.kind, w.qualified_name(), w.source);
        let reachable = schedulable_pools(w, pools);
        if reachable.is_empty() {
            warnings.push(format!(
                "{label}: no node pool matches its nodeSelector, node affinity and tolerations; \
                 it cannot be scheduled, so its images were not checked against any pool"
            ));
        }
        if w.uses_node_names()
            && reachable
                .iter()
                .any(|p| p.nodes.iter().any(|n| n.name.is_none()))
        {
            warnings.push(format!(
                "{label}: selects nodes by name (nodeName or matchFields), which pools from a \
                 pool file cannot check; those pools were counted as reachable"
            ));
        }
        let needed: BTreeSet<String> = reachable.iter().map(|p| p.platform.os_arch()).collect();
        let pool_names: Vec<String> = reachable.iter().map(|p| p.name.clone()).collect();

        // os/arch every image of the pod provides, among the needed ones.
        let mut allowed = needed.clone();
        let mut containers = Vec::new();
        for c in &w.containers {
            let looked_up = cache
                .entry(c.image.clone())
                .or_insert_with(|| provided(&c.image));
            let p = match looked_up {
                Ok(p) => p,
                Err(error) => {
                    containers.push(ContainerGate {
                        container: c.name.clone(),
                        init: c.init,
                        image: c.image.clone(),
                        digest: None,
                        pools: pool_names.clone(),
                        needed: needed.iter().cloned().collect(),
                        provided: Vec::new(),
                        missing: Vec::new(),
                        missing_pools: Vec::new(),
                        covered: false,
                        fixes: None,
                        error: Some(error.clone()),
                    });
                    continue;
                }
            };
            let provided_os_arch: BTreeSet<String> =
                p.platforms.iter().map(Platform::os_arch).collect();
            allowed.retain(|a| provided_os_arch.contains(a));
            let missing: Vec<String> = needed.difference(&provided_os_arch).cloned().collect();
            let missing_pools = reachable
                .iter()
                .filter(|pool| missing.contains(&pool.platform.os_arch()))
                .map(|pool| pool.name.clone())
                .collect();
            let mut provided_list: Vec<String> =
                p.platforms.iter().map(|p| p.to_string()).collect();
            provided_list.sort();
            provided_list.dedup();
            containers.push(ContainerGate {
                container: c.name.clone(),
                init: c.init,
                image: c.image.clone(),
                digest: p.digest.clone(),
                pools: pool_names.clone(),
                needed: needed.iter().cloned().collect(),
                provided: provided_list,
                covered: missing.is_empty(),
                missing,
                missing_pools,
                fixes: None,
                error: None,
            });
        }
        let snippet = affinity_snippet(w, &allowed, &needed);
        for (c, gate) in w.containers.iter().zip(containers.iter_mut()) {
            let Ok(provided) = &cache[&c.image] else {
                continue;
            };
            if gate.covered {
                continue;
            }
            let mut platforms: Vec<String> = provided
                .platforms
                .iter()
                .filter(|p| p.os != "unknown")
                .map(|p| p.to_string())
                .collect();
            platforms.extend(gate.missing.iter().cloned());
            platforms.sort();
            platforms.dedup();
            gate.fixes = Some(Fixes {
                polyarch_platforms: format!("platforms: [{}]", platforms.join(", ")),
                node_affinity: snippet.clone(),
                node_affinity_path: w.pod_spec_path.clone(),
            });
        }
        out.push(WorkloadGate {
            kind: w.kind.clone(),
            namespace: w.namespace.clone(),
            name: w.name.clone(),
            source: w.source.clone(),
            containers,
        });
    }
    let covered = out.iter().flat_map(|w| &w.containers).all(|c| c.covered);
    GateRecord {
        schema: GATE_SCHEMA.to_string(),
        covered,
        workloads: out,
        warnings,
    }
}

/// The workload's required node affinity with a `kubernetes.io/arch In [...]` expression
/// (per OS when pools span several) added to each existing term.
fn affinity_snippet(
    w: &Workload,
    allowed: &BTreeSet<String>,
    needed: &BTreeSet<String>,
) -> Option<String> {
    if allowed.is_empty() {
        return None;
    }
    let mut by_os: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for a in allowed {
        let (os, arch) = a.split_once('/').unwrap_or(("linux", a));
        by_os.entry(os).or_default().push(arch);
    }
    let single_os = needed
        .iter()
        .map(|n| n.split_once('/').map_or("linux", |(os, _)| os))
        .collect::<BTreeSet<_>>()
        .len()
        <= 1;
    let added: Vec<Vec<Requirement>> = by_os
        .into_iter()
        .map(|(os, archs)| {
            let mut exprs = Vec::new();
            if !single_os {
                exprs.push(Requirement {
                    key: OS_LABEL.to_string(),
                    operator: Operator::In,
                    values: vec![os.to_string()],
                });
            }
            exprs.push(Requirement {
                key: ARCH_LABEL.to_string(),
                operator: Operator::In,
                values: archs.into_iter().map(str::to_string).collect(),
            });
            exprs
        })
        .collect();
    let existing = w
        .required_terms
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| vec![NodeSelectorTerm::default()]);
    let mut terms = Vec::new();
    for term in &existing {
        for extra in &added {
            let mut t = term.clone();
            // Replace an existing arch restriction rather than ANDing two of them.
            if extra.iter().any(|e| e.key == ARCH_LABEL) {
                t.match_expressions.retain(|e| {
                    !(e.key == ARCH_LABEL || e.key == BETA_ARCH_LABEL) || e.operator != Operator::In
                });
            }
            t.match_expressions.extend(extra.iter().cloned());
            terms.push(t);
        }
    }
    let mut s = String::from(
        "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      nodeSelectorTerms:\n",
    );
    for t in &terms {
        let mut first = true;
        for (key, reqs) in [
            ("matchExpressions", &t.match_expressions),
            ("matchFields", &t.match_fields),
        ] {
            if reqs.is_empty() {
                continue;
            }
            s.push_str(if first { "      - " } else { "        " });
            first = false;
            s.push_str(key);
            s.push_str(":\n");
            for r in reqs {
                s.push_str(&format!("        - key: {}\n", yaml_scalar(&r.key)));
                s.push_str(&format!("          operator: {}\n", r.operator));
                if !r.values.is_empty() {
                    let values: Vec<String> = r.values.iter().map(|v| yaml_scalar(v)).collect();
                    s.push_str(&format!("          values: [{}]\n", values.join(", ")));
                }
            }
        }
    }
    Some(s)
}

/// A string as a YAML scalar that reads back as that string (quoted when it would not).
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/'))
        && !s.starts_with(['-', '.'])
        && matches!(serde_norway::from_str::<Value>(s), Ok(Value::String(ref p)) if p == s);
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).expect("strings serialise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/k8s")
            .join(name)
    }

    fn p(s: &str) -> Platform {
        s.parse().unwrap()
    }

    fn load_workloads(paths: &[PathBuf]) -> Result<Vec<Workload>> {
        let files = load_manifests(paths)?;
        Ok(files.into_iter().flat_map(|f| f.workloads).collect())
    }

    fn workloads(yaml: &str) -> Vec<Workload> {
        parse_workloads(Path::new("test.yaml"), yaml).unwrap()
    }

    fn one(pod_spec: &str) -> Workload {
        let indented: String = pod_spec.lines().map(|l| format!("      {l}\n")).collect();
        let yaml = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\n\
             spec:\n  template:\n    spec:\n{indented}"
        );
        let mut w = workloads(&yaml);
        assert_eq!(w.len(), 1);
        w.remove(0)
    }

    const CONTAINERS: &str = "containers:\n- name: app\n  image: example/app:1\n";

    fn pools(yaml: &str) -> Vec<NodePool> {
        parse_nodes(Path::new("pools.yaml"), yaml).unwrap()
    }

    fn two_pools() -> Vec<NodePool> {
        pools(
            "pools:\n\
             - {name: amd, labels: {kubernetes.io/arch: amd64}}\n\
             - {name: arm, labels: {kubernetes.io/arch: arm64}}\n",
        )
    }

    fn tainted_arm() -> Vec<NodePool> {
        pools(
            "pools:\n\
             - {name: amd, labels: {kubernetes.io/arch: amd64}}\n\
             - name: arm\n  labels: {kubernetes.io/arch: arm64}\n  \
               taints: [{key: dedicated, value: arm, effect: NoSchedule}]\n",
        )
    }

    fn names(pools: Vec<&NodePool>) -> Vec<&str> {
        pools.into_iter().map(|p| p.name.as_str()).collect()
    }

    fn amd64_only(_: &str) -> Result<ProvidedPlatforms, String> {
        Ok(ProvidedPlatforms {
            digest: Some("sha256:aaaa".into()),
            platforms: vec![p("linux/amd64"), p("unknown/unknown")],
        })
    }

    fn gate(w: &Workload, pools: &[NodePool]) -> GateRecord {
        evaluate(std::slice::from_ref(w), pools, &amd64_only)
    }

    #[test]
    fn no_affinity_over_both_archs_with_amd64_image_is_a_gap_naming_the_arm_pool() {
        let w = one(CONTAINERS);
        let rec = gate(&w, &two_pools());
        assert!(!rec.covered);
        let c = &rec.workloads[0].containers[0];
        assert_eq!(c.pools, ["amd", "arm"]);
        assert_eq!(c.needed, ["linux/amd64", "linux/arm64"]);
        assert_eq!(c.provided, ["linux/amd64", "unknown/unknown"]);
        assert_eq!(c.missing, ["linux/arm64"]);
        assert_eq!(c.missing_pools, ["arm"]);
        assert_eq!(c.digest.as_deref(), Some("sha256:aaaa"));
        let fixes = c.fixes.as_ref().unwrap();
        assert_eq!(
            fixes.polyarch_platforms,
            "platforms: [linux/amd64, linux/arm64]"
        );
        assert_eq!(fixes.node_affinity_path, "spec.template.spec");
        assert_eq!(
            fixes.node_affinity.as_deref().unwrap(),
            "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
             nodeSelectorTerms:\n      - matchExpressions:\n        - key: kubernetes.io/arch\n          \
             operator: In\n          values: [amd64]\n"
        );
    }

    #[test]
    fn snippet_reads_back_and_makes_the_workload_covered() {
        let w = one(CONTAINERS);
        let rec = gate(&w, &two_pools());
        let snippet = rec.workloads[0].containers[0]
            .fixes
            .as_ref()
            .unwrap()
            .node_affinity
            .clone()
            .unwrap();
        let fixed = one(&format!("{CONTAINERS}{snippet}"));
        let rec = gate(&fixed, &two_pools());
        assert!(rec.covered, "{rec:?}");
    }

    #[test]
    fn arch_node_selector_passes() {
        for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
            let w = one(&format!("nodeSelector: {{{key}: amd64}}\n{CONTAINERS}"));
            assert_eq!(names(schedulable_pools(&w, &two_pools())), ["amd"]);
            let rec = gate(&w, &two_pools());
            assert!(rec.covered, "{rec:?}");
            assert!(rec.workloads[0].containers[0].fixes.is_none());
        }
    }

    #[test]
    fn tainted_arm_pool_without_toleration_passes() {
        let w = one(CONTAINERS);
        assert_eq!(names(schedulable_pools(&w, &tainted_arm())), ["amd"]);
        assert!(gate(&w, &tainted_arm()).covered);
    }

    #[test]
    fn matching_toleration_makes_a_gap() {
        for tol in [
            "{key: dedicated, operator: Equal, value: arm, effect: NoSchedule}",
            "{key: dedicated, value: arm}",
            "{key: dedicated, operator: Exists}",
            "{operator: Exists}",
        ] {
            let w = one(&format!("tolerations: [{tol}]\n{CONTAINERS}"));
            let rec = gate(&w, &tainted_arm());
            assert!(!rec.covered, "{tol}");
            assert_eq!(rec.workloads[0].containers[0].missing_pools, ["arm"]);
        }
        for tol in [
            "{key: dedicated, value: x86}",
            "{key: dedicated, operator: Exists, effect: NoExecute}",
            "{key: other, operator: Exists}",
        ] {
            let w = one(&format!("tolerations: [{tol}]\n{CONTAINERS}"));
            assert!(gate(&w, &tainted_arm()).covered, "{tol}");
        }
    }

    #[test]
    fn prefer_no_schedule_and_condition_taints_are_ignored() {
        let pools = pools(
            "pools:\n\
             - name: arm\n  labels: {kubernetes.io/arch: arm64}\n  taints:\n  \
             - {key: soft, effect: PreferNoSchedule}\n  \
             - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}\n",
        );
        let w = one(CONTAINERS);
        assert_eq!(names(schedulable_pools(&w, &pools)), ["arm"]);
    }

    #[test]
    fn cordoned_and_condition_tainted_nodes_stay_reachable() {
        // A cordon or a not-ready node is lifted without a deploy: its arch still counts.
        let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "kind: List\nitems:\n\
             - metadata: {name: a, labels: {kubernetes.io/arch: arm64}}\n  spec:\n    \
               unschedulable: true\n    taints:\n    \
               - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}\n    \
               - {key: node.kubernetes.io/not-ready, effect: NoExecute}\n    \
               - {key: node.cloudprovider.kubernetes.io/uninitialized, value: \"true\", effect: NoSchedule}\n",
        )
        .unwrap();
        assert_eq!(names(schedulable_pools(&one(CONTAINERS), &pools)), ["a"]);
    }

    #[test]
    fn containers_keep_their_place_and_pull_policy() {
        let ws = workloads(
            "kind: ConfigMap\n---\nkind: List\nitems:\n- kind: Pod\n  metadata: {name: p}\n  spec:\n    \
             initContainers: [{name: i, image: a}]\n    containers:\n    - {name: c0, image: b}\n    \
             - {name: c1, image: c, imagePullPolicy: Always}\n",
        );
        let w = &ws[0];
        assert_eq!((w.document, w.item), (2, Some(0)));
        let got: Vec<(&str, bool, usize, Option<&str>)> = w
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.init, c.index, c.pull_policy.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("c0", false, 0, None),
                ("c1", false, 1, Some("Always")),
                ("i", true, 0, None)
            ]
        );
        let err = parse_workloads(
            Path::new("test.yaml"),
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i, imagePullPolicy: Sometimes}]}\n",
        )
        .unwrap_err();
        assert!(matches!(err, Error::Usage(_)));
        assert!(
            err.to_string().starts_with(
                "test.yaml#1: spec.containers[0].imagePullPolicy: `Sometimes` is not one of Always, IfNotPresent, Never"
            ),
            "{err}"
        );
    }

    #[test]
    fn no_execute_taint_needs_toleration() {
        let pools = pools(
            "pools:\n- name: arm\n  labels: {kubernetes.io/arch: arm64}\n  \
             taints: [{key: k, value: v, effect: NoExecute}]\n",
        );
        assert!(schedulable_pools(&one(CONTAINERS), &pools).is_empty());
        let w = one(&format!(
            "tolerations: [{{key: k, value: v, effect: NoExecute, tolerationSeconds: 30}}]\n{CONTAINERS}"
        ));
        assert_eq!(names(schedulable_pools(&w, &pools)), ["arm"]);
    }

    fn affinity(exprs: &str) -> String {
        format!(
            "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
             nodeSelectorTerms:\n{exprs}{CONTAINERS}"
        )
    }

    #[test]
    fn not_in_arm64_affinity_passes() {
        let w = one(&affinity(
            "      - matchExpressions:\n        - {key: kubernetes.io/arch, operator: NotIn, values: [arm64]}\n",
        ));
        assert_eq!(names(schedulable_pools(&w, &two_pools())), ["amd"]);
        assert!(gate(&w, &two_pools()).covered);
    }

    #[test]
    fn gt_lt_numeric() {
        let pools = pools(
            "pools:\n\
             - {name: small, labels: {kubernetes.io/arch: amd64, cpu: \"4\"}}\n\
             - {name: big, labels: {kubernetes.io/arch: arm64, cpu: \"64\"}}\n\
             - {name: odd, labels: {kubernetes.io/arch: arm64, cpu: lots}}\n",
        );
        let gt = one(&affinity(
            "      - matchExpressions: [{key: cpu, operator: Gt, values: [\"8\"]}]\n",
        ));
        assert_eq!(names(schedulable_pools(&gt, &pools)), ["big"]);
        let lt = one(&affinity(
            "      - matchExpressions: [{key: cpu, operator: Lt, values: [\"8\"]}]\n",
        ));
        assert_eq!(names(schedulable_pools(&lt, &pools)), ["small"]);
        // Numeric, not lexicographic: "64" > "8".
        let lt = one(&affinity(
            "      - matchExpressions: [{key: cpu, operator: Lt, values: [\"10\"]}]\n",
        ));
        assert_eq!(names(schedulable_pools(&lt, &pools)), ["small"]);
    }

    #[test]
    fn several_terms_or_and_expressions_and() {
        let pools = pools(
            "pools:\n\
             - {name: a, labels: {kubernetes.io/arch: amd64, zone: x}}\n\
             - {name: b, labels: {kubernetes.io/arch: arm64, zone: y}}\n\
             - {name: c, labels: {kubernetes.io/arch: arm64, zone: x, gpu: \"true\"}}\n",
        );
        let or = one(&affinity(
            "      - matchExpressions: [{key: zone, operator: In, values: [y]}]\n\
             \x20     - matchExpressions: [{key: gpu, operator: Exists}]\n",
        ));
        assert_eq!(names(schedulable_pools(&or, &pools)), ["b", "c"]);
        let and = one(&affinity(
            "      - matchExpressions:\n        - {key: zone, operator: In, values: [x]}\n        \
             - {key: gpu, operator: DoesNotExist}\n",
        ));
        assert_eq!(names(schedulable_pools(&and, &pools)), ["a"]);
        // An empty term matches nothing; an empty term list matches nothing.
        let empty = one(&affinity("      - {}\n"));
        assert!(schedulable_pools(&empty, &pools).is_empty());
        let rec = gate(&empty, &pools);
        assert!(rec.covered);
        assert_eq!(rec.warnings.len(), 1);
        assert!(
            rec.warnings[0].contains("no node pool matches"),
            "{:?}",
            rec.warnings
        );
    }

    #[test]
    fn snippet_merges_into_existing_terms() {
        let pools = pools(
            "pools:\n\
             - {name: a, labels: {kubernetes.io/arch: amd64, zone: x}}\n\
             - {name: b, labels: {kubernetes.io/arch: arm64, zone: x}}\n\
             - {name: c, labels: {kubernetes.io/arch: amd64, zone: \"1\"}}\n",
        );
        let w = one(&affinity(
            "      - matchExpressions: [{key: zone, operator: In, values: [x, \"1\"]}]\n",
        ));
        let rec = gate(&w, &pools);
        let snippet = rec.workloads[0].containers[0]
            .fixes
            .as_ref()
            .unwrap()
            .node_affinity
            .clone()
            .unwrap();
        assert!(
            snippet.contains("- key: zone\n          operator: In\n          values: [x, \"1\"]\n"),
            "{snippet}"
        );
        let fixed = one(&format!("{CONTAINERS}{snippet}"));
        assert_eq!(names(schedulable_pools(&fixed, &pools)), ["a", "c"]);
        assert!(gate(&fixed, &pools).covered);
    }

    #[test]
    fn pod_snippet_uses_archs_every_image_has_and_none_when_nothing_remains() {
        let w = one("containers:\n- {name: a, image: amd}\n- {name: b, image: arm}\n");
        let provided = |image: &str| -> Result<ProvidedPlatforms, String> {
            Ok(ProvidedPlatforms {
                digest: None,
                platforms: vec![if image == "amd" {
                    p("linux/amd64")
                } else {
                    p("linux/arm64/v8")
                }],
            })
        };
        let rec = evaluate(&[w], &two_pools(), &provided);
        let cs = &rec.workloads[0].containers;
        assert_eq!(cs[0].missing, ["linux/arm64"]);
        assert_eq!(cs[1].missing, ["linux/amd64"]);
        assert_eq!(cs[1].provided, ["linux/arm64"]);
        assert!(cs[0].fixes.as_ref().unwrap().node_affinity.is_none());
    }

    #[test]
    fn arm64_v8_image_covers_arm64_pool() {
        let w = one(CONTAINERS);
        let provided = |_: &str| -> Result<ProvidedPlatforms, String> {
            Ok(ProvidedPlatforms {
                digest: None,
                platforms: vec![p("linux/amd64"), p("linux/arm64/v8")],
            })
        };
        assert!(evaluate(&[w], &two_pools(), &provided).covered);
    }

    #[test]
    fn provided_is_called_once_per_image_and_errors_are_recorded_per_container() {
        let w = one("containers:\n- {name: a, image: same}\n- {name: b, image: same}\n");
        let calls = std::cell::Cell::new(0);
        let provided = |_: &str| -> Result<ProvidedPlatforms, String> {
            calls.set(calls.get() + 1);
            amd64_only("")
        };
        evaluate(std::slice::from_ref(&w), &two_pools(), &provided);
        assert_eq!(calls.get(), 1);

        // One unreadable image: its containers carry the error; the other is still judged.
        let w = one("containers:\n- {name: a, image: gone}\n- {name: b, image: there}\n");
        let some_fail = |image: &str| -> Result<ProvidedPlatforms, String> {
            if image == "gone" {
                Err("registry r.io: manifest unknown".into())
            } else {
                amd64_only(image)
            }
        };
        let rec = evaluate(&[w], &two_pools(), &some_fail);
        assert!(!rec.covered);
        let (gone, there) = (
            &rec.workloads[0].containers[0],
            &rec.workloads[0].containers[1],
        );
        assert!(!gone.covered && gone.missing.is_empty() && gone.fixes.is_none());
        assert!(gone.error.as_deref().unwrap().contains("manifest unknown"));
        assert_eq!(there.missing, ["linux/arm64"]);
        assert!(there.error.is_none());
        // The unreadable image restricts nothing: the snippet keeps amd64 for `there`.
        let snippet = there.fixes.as_ref().unwrap().node_affinity.as_deref();
        assert!(snippet.unwrap().contains("values: [amd64]"));
    }

    #[test]
    fn kubectl_nodes_fixture() {
        let pools = load_nodes(&fixture("nodes.json")).unwrap();
        let summary: Vec<(&str, String, u64)> = pools
            .iter()
            .map(|p| (p.name.as_str(), p.platform.to_string(), p.count))
            .collect();
        assert_eq!(
            summary,
            [
                ("arm-batch", "linux/arm64".to_string(), 1),
                ("arm-pool", "linux/arm64".to_string(), 1),
                ("default-pool", "linux/amd64".to_string(), 2),
            ]
        );
        let default = &pools[2];
        // Common labels only: hostname and zone differ between the two nodes.
        assert_eq!(
            default.labels.get("cloud.google.com/gke-nodepool").unwrap(),
            "default-pool"
        );
        assert!(!default.labels.contains_key("kubernetes.io/hostname"));
        assert_eq!(default.nodes.len(), 2);
        assert_eq!(
            default.nodes[0].runtime.as_deref(),
            Some("containerd://1.7.13")
        );
        assert_eq!(pools[0].taints.len(), 2);

        let w = one(CONTAINERS);
        assert_eq!(
            names(schedulable_pools(&w, &pools)),
            ["arm-pool", "default-pool"]
        );
        let rec = gate(&w, &pools);
        assert_eq!(rec.workloads[0].containers[0].missing_pools, ["arm-pool"]);

        // Per-node labels still select: one zone-c node only.
        let zoned = one(&format!(
            "nodeSelector: {{topology.kubernetes.io/zone: europe-west1-c}}\n{CONTAINERS}"
        ));
        assert_eq!(names(schedulable_pools(&zoned, &pools)), ["default-pool"]);
        // matchFields on node names.
        let by_name = one(&affinity(
            "      - matchFields: [{key: metadata.name, operator: In, values: [gke-demo-arm-pool-5a6b7c8d-k2m4]}]\n",
        ));
        assert_eq!(names(schedulable_pools(&by_name, &pools)), ["arm-pool"]);
        assert!(gate(&by_name, &pools).warnings.is_empty());
    }

    #[test]
    fn deploy_fixture_with_kubectl_nodes() {
        let ws = load_workloads(&[fixture("deploy.yaml")]).unwrap();
        let summary: Vec<(&str, String, &str)> = ws
            .iter()
            .map(|w| {
                (
                    w.kind.as_str(),
                    w.qualified_name(),
                    w.source.rsplit('/').next().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("Deployment", "shop/web".to_string(), "deploy.yaml#1"),
                (
                    "CronJob",
                    "shop/nightly-report".to_string(),
                    "deploy.yaml#4"
                ),
            ]
        );
        let web = &ws[0];
        let cs: Vec<(&str, &str, bool)> = web
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.image.as_str(), c.init))
            .collect();
        assert_eq!(
            cs,
            [
                ("web", "ghcr.io/example/shop-web:1.4.2", false),
                ("metrics", "docker.io/prom/statsd-exporter:v0.26.0", false),
                ("migrate", "ghcr.io/example/shop-migrate:1.4.2", true),
            ]
        );
        let cron = &ws[1];
        assert_eq!(cron.pod_spec_path, "spec.jobTemplate.spec.template.spec");
        assert_eq!(cron.tolerations.len(), 1);

        let pools = load_nodes(&fixture("nodes.json")).unwrap();
        let provided = |image: &str| -> Result<ProvidedPlatforms, String> {
            if image.contains("statsd") {
                amd64_only(image)
            } else {
                Ok(ProvidedPlatforms {
                    digest: Some("sha256:bbbb".into()),
                    platforms: vec![p("linux/amd64"), p("linux/arm64")],
                })
            }
        };
        let rec = evaluate(&ws, &pools, &provided);
        assert!(!rec.covered);
        let gaps: Vec<(&str, &str)> = rec
            .workloads
            .iter()
            .flat_map(|w| w.containers.iter().map(move |c| (w.name.as_str(), c)))
            .filter(|(_, c)| !c.covered)
            .map(|(w, c)| (w, c.container.as_str()))
            .collect();
        assert_eq!(gaps, [("web", "metrics")]);
        // The CronJob tolerates the tainted arm pool and selects arm64.
        assert_eq!(
            rec.workloads[1].containers[0].pools,
            ["arm-batch", "arm-pool"]
        );

        let json = serde_json::to_string_pretty(&rec).unwrap();
        assert!(json.contains("\"schema\": \"polyarch/gate/v1\""));
        assert!(json.contains("\"missing_pools\""));
        let back: GateRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, rec);
    }

    #[test]
    fn pool_file_fixture_adds_beta_aliases_and_normalises() {
        let pools = load_nodes(&fixture("pools.yaml")).unwrap();
        let summary: Vec<(&str, String, u64)> = pools
            .iter()
            .map(|p| (p.name.as_str(), p.platform.to_string(), p.count))
            .collect();
        assert_eq!(
            summary,
            [
                ("general", "linux/amd64".to_string(), 3),
                ("graviton", "linux/arm64".to_string(), 2),
                ("graviton-spot", "linux/arm64".to_string(), 0),
            ]
        );
        for pool in &pools {
            for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
                assert_eq!(
                    pool.labels[key], pool.platform.architecture,
                    "{}",
                    pool.name
                );
            }
            for key in [OS_LABEL, BETA_OS_LABEL] {
                assert_eq!(pool.labels[key], "linux");
            }
        }
        let w = one(&format!(
            "nodeSelector: {{beta.kubernetes.io/arch: arm64}}\n{CONTAINERS}"
        ));
        assert_eq!(names(schedulable_pools(&w, &pools)), ["graviton"]);
        // matchFields cannot be checked against a pool file: counted as reachable, warned.
        let by_name = one(&affinity(
            "      - matchFields: [{key: metadata.name, operator: In, values: [ip-10-0-0-1]}]\n",
        ));
        let rec = gate(&by_name, &pools);
        assert_eq!(
            rec.workloads[0].containers[0].pools,
            ["general", "graviton"]
        );
        assert!(
            rec.warnings.iter().any(|w| w.contains("by name")),
            "{:?}",
            rec.warnings
        );
    }

    #[test]
    fn pool_file_json_and_platform_shorthand() {
        let pools = parse_nodes(
            Path::new("pools.json"),
            r#"{"pools": [{"name": "win", "platform": "windows/amd64"}, {"name": "pi", "labels": {"kubernetes.io/arch": "arm"}}]}"#,
        )
        .unwrap();
        assert_eq!(pools[0].name, "pi");
        assert_eq!(pools[0].platform.os_arch(), "linux/arm");
        assert_eq!(pools[1].platform.os_arch(), "windows/amd64");
        assert_eq!(pools[1].labels[OS_LABEL], "windows");
    }

    #[test]
    fn multi_os_snippet_has_one_term_per_os() {
        let pools = pools(
            "pools:\n- {name: lin, platform: linux/amd64}\n- {name: win, platform: windows/amd64}\n\
             - {name: arm, platform: linux/arm64}\n",
        );
        let w = one(CONTAINERS);
        let provided = |_: &str| -> Result<ProvidedPlatforms, String> {
            Ok(ProvidedPlatforms {
                digest: None,
                platforms: vec![p("linux/amd64"), p("windows/amd64")],
            })
        };
        let rec = evaluate(std::slice::from_ref(&w), &pools, &provided);
        let c = &rec.workloads[0].containers[0];
        assert_eq!(c.missing_pools, ["arm"]);
        let snippet = c.fixes.as_ref().unwrap().node_affinity.clone().unwrap();
        let fixed = one(&format!("{CONTAINERS}{snippet}"));
        assert_eq!(names(schedulable_pools(&fixed, &pools)), ["lin", "win"]);
    }

    #[test]
    fn nodes_without_arch_are_refused_with_the_fix() {
        let err = parse_nodes(
            Path::new("pools.yaml"),
            "pools:\n- {name: mystery, labels: {a: b}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("pools.yaml#1")
                && err.contains("`mystery`")
                && err.contains("kubernetes.io/arch: arm64"),
            "{err}"
        );
        assert!(!err.contains('\n'));
        let err = parse_nodes(
            Path::new("nodes.json"),
            r#"{"kind":"List","items":[{"kind":"Node","metadata":{"name":"n1","labels":{"cloud.google.com/gke-nodepool":"p"}}}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("node `n1` (pool `p`)") && err.contains("kubectl label node n1"),
            "{err}"
        );
    }

    #[test]
    fn node_info_fallback_and_unlabelled_nodes_are_their_own_pool() {
        let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "apiVersion: v1\nkind: NodeList\nitems:\n\
             - metadata: {name: n1}\n  status: {nodeInfo: {operatingSystem: linux, architecture: arm64}}\n\
             - metadata: {name: n2, labels: {beta.kubernetes.io/arch: amd64}}\n",
        )
        .unwrap();
        let summary: Vec<(&str, String)> = pools
            .iter()
            .map(|p| (p.name.as_str(), p.platform.os_arch()))
            .collect();
        assert_eq!(
            summary,
            [("n1", "linux/arm64".into()), ("n2", "linux/amd64".into())]
        );
    }

    #[test]
    fn mixed_arch_pool_is_split() {
        let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "kind: List\nitems:\n\
             - metadata: {name: a, labels: {karpenter.sh/nodepool: default, kubernetes.io/arch: amd64}}\n\
             - metadata: {name: b, labels: {karpenter.sh/nodepool: default, kubernetes.io/arch: arm64}}\n",
        )
        .unwrap();
        let n: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(n, ["default[linux/amd64]", "default[linux/arm64]"]);
    }

    #[test]
    fn bad_node_inputs_are_errors() {
        for (file, text, want) in [
            ("n.yaml", "kind: Deployment\n", "expected `kubectl get nodes"),
            ("n.yaml", "", "no nodes or pools"),
            ("n.yaml", "pools:\n- {name: a, platform: linux/amd64}\n- {name: a, platform: linux/amd64}\n", "defined twice"),
            ("n.yaml", "pools:\n- {name: a, lables: {}}\n", "unknown key"),
            ("n.yaml", "pools:\n- {name: a, platform: linux/amd64, count: -1}\n", "count"),
            ("n.yaml", "pools:\n- {name: a, platform: linux/amd64, taints: [{key: k, effect: Sometimes}]}\n", "Sometimes"),
            ("n.yaml", "pools:\n- {name: a, platform: linux/arm64, labels: {kubernetes.io/arch: amd64}}\n", "disagrees"),
            ("n.yaml", "kind: List\nitems:\n- kind: Pod\n  metadata: {name: x}\n", "not a Node"),
            ("n.json", "{\"kind\": \"List\", \"items\": [", "not valid JSON"),
        ] {
            let err = parse_nodes(Path::new(file), text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.starts_with(file), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn lists_typed_lists_and_kinds() {
        let ws = workloads(
            "apiVersion: v1\nkind: List\nitems:\n\
             - {kind: Pod, metadata: {name: p}, spec: {containers: [{name: c, image: i}]}}\n\
             - {kind: Service, metadata: {name: s}}\n\
             ---\n\
             apiVersion: apps/v1\nkind: DeploymentList\nitems:\n\
             - {metadata: {name: d}, spec: {template: {spec: {containers: [{name: c, image: i}]}}}}\n\
             ---\n\
             kind: StatefulSet\nmetadata: {name: ss}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: DaemonSet\nmetadata: {name: ds}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: Job\nmetadata: {generateName: job-}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: ReplicaSet\nmetadata: {name: rs}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: ReplicationController\nmetadata: {name: rc}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             ---\n\
             # only a comment\n",
        );
        let got: Vec<(String, String, String)> = ws
            .iter()
            .map(|w| (w.kind.clone(), w.name.clone(), w.source.clone()))
            .collect();
        let want = [
            ("Pod", "p", "test.yaml#1/items/0"),
            ("Deployment", "d", "test.yaml#2/items/0"),
            ("StatefulSet", "ss", "test.yaml#3"),
            ("DaemonSet", "ds", "test.yaml#4"),
            ("Job", "job-*", "test.yaml#5"),
            ("ReplicaSet", "rs", "test.yaml#6"),
            ("ReplicationController", "rc", "test.yaml#7"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(got, want);
        assert!(ws.iter().all(|w| w.namespace.is_none()));
    }

    #[test]
    fn json_manifests_and_unknown_fields() {
        let ws = parse_workloads(
            Path::new("pod.json"),
            "\u{feff}{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"x-unknown\":[1,{\"a\":null}]},\
             \"spec\":{\"nodeSelector\":{\"kubernetes.io/arch\":\"arm64\"},\"containers\":[{\"name\":\"c\",\"image\":\"i\",\"weird\":{}}]}}\n\
             {\"kind\":\"ConfigMap\"}",
        )
        .unwrap();
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].node_selector[ARCH_LABEL], "arm64");
    }

    #[test]
    fn directories_are_walked_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let pod = |n: &str| {
            format!("kind: Pod\nmetadata: {{name: {n}}}\nspec: {{containers: [{{name: c, image: i}}]}}\n")
        };
        std::fs::create_dir_all(dir.path().join("b/nested")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("b/nested/z.yml"), pod("z")).unwrap();
        std::fs::write(dir.path().join("a.yaml"), pod("a")).unwrap();
        std::fs::write(dir.path().join("c.json"), r#"{"kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#).unwrap();
        std::fs::write(dir.path().join("README.md"), "not yaml: [").unwrap();
        std::fs::write(dir.path().join(".git/x.yaml"), "garbage: [").unwrap();
        let ws = load_workloads(&[dir.path().to_path_buf()]).unwrap();
        let n: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(n, ["a", "z", "c"]);
        // `gate --pin` writes each file under the same path relative to its directory.
        let files = load_manifests(&[dir.path().to_path_buf(), dir.path().join("a.yaml")]).unwrap();
        let relative: Vec<&Path> = files.iter().map(|f| f.relative.as_path()).collect();
        assert_eq!(
            relative,
            [
                Path::new("a.yaml"),
                Path::new("b/nested/z.yml"),
                Path::new("c.json"),
                Path::new("a.yaml")
            ]
        );

        let empty = tempfile::tempdir().unwrap();
        let err = load_workloads(&[empty.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no *.yaml"), "{err}");
        // A path named on the command line that does not exist is a usage error (exit 2).
        let missing = load_workloads(&[dir.path().join("nope.yaml")]).unwrap_err();
        assert!(
            matches!(&missing, Error::Usage(m) if m.contains("nope.yaml")),
            "{missing}"
        );
    }

    #[test]
    fn malformed_workloads_name_file_document_and_field() {
        let deploy = |spec: &str| {
            format!("---\nkind: ConfigMap\n---\nkind: Deployment\nmetadata: {{name: w}}\nspec: {spec}\n")
        };
        for (text, want) in [
            (deploy("{}"), "test.yaml#2: spec.template: missing"),
            (deploy("{template: []}"), "test.yaml#2: spec.template: must be a mapping, found a list"),
            (deploy("{template: {spec: {containers: {name: c}}}}"), "spec.template.spec.containers: must be a list"),
            (deploy("{template: {spec: {containers: []}}}"), "at least one container"),
            (deploy("{template: {spec: {containers: [{name: c}]}}}"), "spec.template.spec.containers[0].image: missing for container `c`"),
            (deploy("{template: {spec: {containers: [{image: i}]}}}"), "containers[0].name: missing"),
            (deploy("{template: {spec: {containers: [c]}}}"), "containers[0]: must be a mapping, found a string"),
            (deploy("{template: {spec: {nodeSelector: [a], containers: [{name: c, image: i}]}}}"), "nodeSelector: must be a mapping"),
            (deploy("{template: {spec: {nodeSelector: {a: [1]}, containers: [{name: c, image: i}]}}}"), "nodeSelector.a: must be a string"),
            (deploy("{template: {spec: {tolerations: [{value: x}], containers: [{name: c, image: i}]}}}"), "operator: Exists"),
            (deploy("{template: {spec: {tolerations: [{key: k, operator: Maybe}], containers: [{name: c, image: i}]}}}"), "`Maybe` is not Equal or Exists"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Like, values: [b]}]}]}}}, containers: [{name: c, image: i}]}}}"), "nodeSelectorTerms[0].matchExpressions[0].operator: `Like`"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Gt, values: [x]}]}]}}}, containers: [{name: c, image: i}]}}}"), "exactly one integer"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: In}]}]}}}, containers: [{name: c, image: i}]}}}"), "at least one value"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: spec.x, operator: In, values: [a]}]}]}}}, containers: [{name: c, image: i}]}}}"), "only `metadata.name`"),
            ("kind: Pod\nspec: {containers: [{name: c, image: i}]}\n".to_string(), "metadata.name: missing"),
            ("just a string\n".to_string(), "test.yaml#1: is a string, not a Kubernetes object"),
            ("- a\n- b\n".to_string(), "is a list"),
            ("replicas: 3\nimage: nginx\n".to_string(), "has no `kind`"),
            ("kind: [Deployment]\n".to_string(), "kind: must be a string"),
        ] {
            let err = parse_workloads(Path::new("test.yaml"), &text).unwrap_err();
            assert!(matches!(err, Error::Usage(_)));
            assert_eq!(err.exit_code(), 2);
            let err = err.to_string();
            assert!(err.contains(want), "{text:?}\n  got: {err}\n want: {want}");
            assert!(err.starts_with("test.yaml#"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn garbage_and_truncated_documents_never_panic() {
        let full = std::fs::read_to_string(fixture("deploy.yaml")).unwrap();
        let nodes = std::fs::read_to_string(fixture("nodes.json")).unwrap();
        let pools_yaml = std::fs::read_to_string(fixture("pools.yaml")).unwrap();
        // Every truncation of the fixtures parses or fails with a one-line message.
        for text in [&full, &pools_yaml] {
            for cut in (0..text.len()).filter(|i| text.is_char_boundary(*i)) {
                let part = &text[..cut];
                if let Err(e) = parse_workloads(Path::new("t.yaml"), part) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
                if let Err(e) = parse_nodes(Path::new("t.yaml"), part) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
        }
        for cut in (0..nodes.len()).step_by(7) {
            let part = &nodes[..cut];
            let _ = parse_nodes(Path::new("t.json"), part);
            let _ = parse_workloads(Path::new("t.json"), part);
            let _ = parse_nodes(Path::new("t.yaml"), part);
        }
        for garbage in [
            "\0\0\0",
            "{{ .Values.image }}",
            "image: {{ .Values.image }}\n",
            "kind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n    image: x\n  bad",
            "kind: Deployment\nspec: {template: {spec: {containers: [{name: c, image: i}",
            ":\n:\n- - -\n",
            "---\n...\n---\n%YAML 1.1\n",
            "a: &a [*a]\n",
            "a: !!binary AAAA\n",
            "kind: !custom Deployment\nmetadata: {name: x}\nspec: !t {template: {spec: {containers: [{name: c, image: i}]}}}\n",
            "\t- tab\n",
            "kind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: 1, image: 2}], nodeSelector: {1: 2, ? [a] : b}}}}\n",
            &"[".repeat(10_000),
            &format!("kind: Pod\nmetadata: {{name: x}}\nspec: {}", "{a: ".repeat(5_000)),
            "<<: {kind: Pod}\nmetadata: {name: m}\nspec: {containers: [{name: c, image: i}]}\n",
            "<<: 3\n",
        ] {
            for file in ["g.yaml", "g.json"] {
                if let Err(e) = parse_workloads(Path::new(file), garbage) {
                    assert!(e.to_string().starts_with(file), "{e}");
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
                if let Err(e) = parse_nodes(Path::new(file), garbage) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
        }
        // Merge keys are applied; tags are looked through.
        let ws = workloads(
            "<<: {kind: Pod}\nmetadata: {name: m}\nspec: {containers: [{name: c, image: i}]}\n",
        );
        assert_eq!(ws[0].kind, "Pod");
        let ws = workloads("kind: !custom Deployment\nmetadata: {name: x}\nspec: !t {template: {spec: {containers: [{name: c, image: i}]}}}\n");
        assert_eq!(ws[0].name, "x");
    }

    #[test]
    fn syntax_errors_name_the_document() {
        let err = parse_workloads(
            Path::new("deploy.yaml"),
            "kind: ConfigMap\n---\nkind: Pod\nmetadata: {name: [unclosed\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("deploy.yaml#2: not valid YAML"), "{err}");
        assert!(err.contains("helm template"), "{err}");
    }

    #[test]
    fn node_name_pins_and_skips_no_schedule() {
        let pools = load_nodes(&fixture("nodes.json")).unwrap();
        let w = one(&format!(
            "nodeName: gke-demo-arm-batch-1e2f3a4b-q9r8\n{CONTAINERS}"
        ));
        assert_eq!(names(schedulable_pools(&w, &pools)), ["arm-batch"]);
    }

    #[test]
    fn yaml_scalars_quote_what_would_not_read_back() {
        assert_eq!(yaml_scalar("amd64"), "amd64");
        assert_eq!(yaml_scalar("kubernetes.io/arch"), "kubernetes.io/arch");
        for s in [
            "true", "1", "null", "yes", "", "a b", "-x", "~", "1e3", "0x1f",
        ] {
            let q = yaml_scalar(s);
            let back: String = serde_norway::from_str(&q).unwrap();
            assert_eq!(back, s, "{q}");
        }
    }
}

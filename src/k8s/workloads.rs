//! Kubernetes manifests: finding the files, and the workloads (pod templates) in them.

use super::yaml::*;
use super::*;

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
    let meta = std::fs::metadata(path).map_err(|e| K8sError::unreadable_argument(path, e))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    walk(path, &mut out)?;
    out.sort();
    if out.is_empty() {
        return Err(K8sError::Usage(format!(
            "{}: the directory has no *.yaml, *.yml or *.json files; pass rendered manifests \
             (e.g. `helm template … > deploy.yaml` or `kustomize build … > deploy.yaml`)",
            path.display()
        )));
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| K8sError::unreadable_argument(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| K8sError::io(dir, e))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let file_type = entry.file_type().map_err(|e| K8sError::io(&path, e))?;
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

pub(super) fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| K8sError::unreadable_argument(path, e))?;
    String::from_utf8(bytes).map_err(|_| {
        K8sError::Usage(format!(
            "{}: not UTF-8 text; pass Kubernetes YAML or JSON",
            path.display()
        ))
    })
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
    let (name, namespace) = workload_name(at, kind, obj)?;
    let spec = pod_spec(at, kind, obj, pod_spec_path)?;
    let base = pod_spec_path;

    let node_selector = string_map(at, spec, base, "nodeSelector")?;
    let node_name = opt_string(at, spec, base, "nodeName")?.filter(|n| !n.is_empty());
    let required_terms = required_terms(at, spec, base)?;

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
            containers.push(parse_container(
                at,
                c,
                &format!("{base}.{key}[{i}]"),
                init,
                i,
            )?);
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

/// `metadata.name` (or `generateName` with a `*`) and `metadata.namespace`.
fn workload_name(at: &At, kind: &str, obj: &Value) -> Result<(String, Option<String>)> {
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
    Ok((name, namespace))
}

/// The pod spec at `pod_spec_path` (`spec.template.spec`, …) of the object.
fn pod_spec<'a>(at: &At, kind: &str, obj: &'a Value, pod_spec_path: &str) -> Result<&'a Value> {
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
    Ok(spec)
}

/// The node affinity's required terms; None when the pod spec has none.
fn required_terms(at: &At, spec: &Value, base: &str) -> Result<Option<Vec<NodeSelectorTerm>>> {
    let affinity_path = join(base, "affinity.nodeAffinity");
    let Some(na) = field(spec, "affinity").and_then(|a| field(a, "nodeAffinity")) else {
        return Ok(None);
    };
    let na = expect_mapping(at, na, &affinity_path)?;
    let req_path = join(
        &affinity_path,
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
    let Some(req) = field(na, "requiredDuringSchedulingIgnoredDuringExecution") else {
        return Ok(None);
    };
    let req = expect_mapping(at, req, &req_path)?;
    let mut terms = Vec::new();
    for (i, t) in seq(at, req, &req_path, "nodeSelectorTerms")?
        .iter()
        .enumerate()
    {
        let tpath = format!("{req_path}.nodeSelectorTerms[{i}]");
        terms.push(parse_term(at, t, &tpath)?);
    }
    Ok(Some(terms))
}

/// One container (or init container) at `cpath`: its name, image and pull policy.
fn parse_container(at: &At, c: &Value, cpath: &str, init: bool, index: usize) -> Result<Container> {
    let c = expect_mapping(at, c, cpath)?;
    let name = opt_string(at, c, cpath, "name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            at.err(
                &join(cpath, "name"),
                "missing; every container needs a name",
            )
        })?;
    let image = opt_string(at, c, cpath, "image")?
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .ok_or_else(|| {
            at.err(
                &join(cpath, "image"),
                format!("missing for container `{name}`; every container needs an image"),
            )
        })?;
    let pull_policy = match opt_string(at, c, cpath, "imagePullPolicy")?.as_deref() {
        None | Some("") => None,
        Some(p @ ("Always" | "IfNotPresent" | "Never")) => Some(p.to_string()),
        Some(other) => {
            return Err(at.err(
                &join(cpath, "imagePullPolicy"),
                format!("`{other}` is not one of Always, IfNotPresent, Never"),
            ))
        }
    };
    Ok(Container {
        name,
        image,
        init,
        index,
        pull_policy,
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

pub(super) fn parse_taint(at: &At, t: &Value, path: &str) -> Result<Taint> {
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

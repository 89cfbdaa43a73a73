//! Node pools: `kubectl get nodes -o json` output or a hand-written pool file, grouped by
//! os/arch and the pool labels.

use super::yaml::*;
use super::*;

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
        return Err(K8sError::Usage(format!(
            "{}: no nodes or pools found; {NODES_HINT}",
            file.display()
        )));
    }
    let mut seen = BTreeSet::new();
    for p in &pools {
        if !seen.insert(p.name.as_str()) {
            return Err(K8sError::Usage(format!(
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
        out.push(parse_pool(at, p, &format!("pools[{i}]"))?);
    }
    Ok(out)
}

/// One pool of a pool file at `path` (`pools[N]`).
fn parse_pool(at: &At, p: &Value, path: &str) -> Result<NodePool> {
    let p = expect_mapping(at, p, path)?;
    if let Some(m) = p.as_mapping() {
        for k in m.keys() {
            let k = scalar(k).unwrap_or_default();
            if !["name", "labels", "taints", "count", "platform"].contains(&k.as_str()) {
                return Err(at.err(
                    &join(path, &k),
                    "unknown key; a pool has name, labels, taints, count and platform",
                ));
            }
        }
    }
    let name = opt_string(at, p, path, "name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| at.err(&join(path, "name"), "missing; every pool needs a name"))?;
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
    let platform = pool_platform(at, &path, &name, &labels, declared)?;
    // Both spellings, normalised the way kubelet sets them, so selectors on either match.
    for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
        labels.insert(key.to_string(), platform.architecture.clone());
    }
    for key in [OS_LABEL, BETA_OS_LABEL] {
        labels.insert(key.to_string(), platform.os.clone());
    }
    Ok(NodePool {
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
    })
}

/// The pool's platform from its labels (either spelling) and its `platform:`, which
/// must agree.
fn pool_platform(
    at: &At,
    path: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    declared: Option<Platform>,
) -> Result<Platform> {
    let label = |keys: [&str; 2]| -> Result<Option<String>> {
        let a = labels.get(keys[0]).filter(|v| !v.is_empty());
        let b = labels.get(keys[1]).filter(|v| !v.is_empty());
        match (a, b) {
            (Some(a), Some(b)) if a != b => Err(at.err(
                &join(path, "labels"),
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
    Ok(match (arch, declared) {
        (None, None) => {
            return Err(at.err(
                path,
                format!(
                    "no `{ARCH_LABEL}` label; add `labels: {{{ARCH_LABEL}: arm64, {OS_LABEL}: linux}}` \
                     (or `platform: linux/arm64`) to pool `{name}`"
                ),
            ))
        }
        (None, Some(d)) => {
            if let Some(os) = &os {
                if Platform::new(os, "amd64", None).os != d.os {
                    return Err(at.err(path, format!("`{OS_LABEL}: {os}` disagrees with `platform: {d}`")));
                }
            }
            Platform::new(&d.os, &d.architecture, None)
        }
        (Some(arch), declared) => {
            let p = Platform::new(os.as_deref().unwrap_or("linux"), &arch, None);
            if let Some(d) = declared {
                if d.os_arch() != p.os_arch() {
                    return Err(at.err(
                        path,
                        format!("`platform: {d}` disagrees with its labels ({})", p.os_arch()),
                    ));
                }
            }
            p
        }
    })
}

//! Whether every image of every workload provides the platforms of the pools its pods may
//! land on, and the fix when it does not.

use super::*;
use crate::base::digest::Digest;

/// What an image reference provides, as the caller looked it up in the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvidedPlatforms {
    /// Digest of the index (or single manifest) the reference resolves to.
    pub digest: Option<Digest>,
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
    pub digest: Option<Digest>,
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
pub fn evaluate<E: fmt::Display>(
    workloads: &[Workload],
    pools: &[NodePool],
    provided: &dyn Fn(&str) -> Result<ProvidedPlatforms, E>,
) -> GateRecord {
    let mut cache: HashMap<String, Result<ProvidedPlatforms, E>> = HashMap::new();
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
        let reachable = schedulable_pools(w, pools);
        warnings.extend(reach_warnings(w, &reachable));
        let needed: BTreeSet<String> = reachable.iter().map(|p| p.platform.os_arch()).collect();

        // os/arch every image of the pod provides, among the needed ones.
        let mut allowed = needed.clone();
        let mut containers = Vec::new();
        for c in &w.containers {
            let looked_up = cache
                .entry(c.image.clone())
                .or_insert_with(|| provided(&c.image));
            if let Ok(p) = looked_up {
                let provided_os_arch: BTreeSet<String> =
                    p.platforms.iter().map(Platform::os_arch).collect();
                allowed.retain(|a| provided_os_arch.contains(a));
            }
            containers.push(container_gate(c, looked_up, &needed, &reachable));
        }
        let snippet = affinity_snippet(w, &allowed, &needed);
        for (c, gate) in w.containers.iter().zip(containers.iter_mut()) {
            if let Ok(provided) = &cache[&c.image] {
                add_fixes(gate, provided, &snippet, w);
            }
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

/// What cannot be judged about where a workload lands.
fn reach_warnings(w: &Workload, reachable: &[&NodePool]) -> Vec<String> {
    let label = format!("{} {} ({})", w.kind, w.qualified_name(), w.source);
    let mut warnings = Vec::new();
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
    warnings
}

/// One container judged against the os/arch its reachable pools need.
fn container_gate<E: fmt::Display>(
    c: &Container,
    looked_up: &Result<ProvidedPlatforms, E>,
    needed: &BTreeSet<String>,
    reachable: &[&NodePool],
) -> ContainerGate {
    let mut gate = ContainerGate {
        container: c.name.clone(),
        init: c.init,
        image: c.image.clone(),
        digest: None,
        pools: reachable.iter().map(|p| p.name.clone()).collect(),
        needed: needed.iter().cloned().collect(),
        provided: Vec::new(),
        missing: Vec::new(),
        missing_pools: Vec::new(),
        covered: false,
        fixes: None,
        error: None,
    };
    let p = match looked_up {
        Ok(p) => p,
        Err(error) => {
            gate.error = Some(error.to_string());
            return gate;
        }
    };
    let provided_os_arch: BTreeSet<String> = p.platforms.iter().map(Platform::os_arch).collect();
    let missing: Vec<String> = needed.difference(&provided_os_arch).cloned().collect();
    gate.missing_pools = reachable
        .iter()
        .filter(|pool| missing.contains(&pool.platform.os_arch()))
        .map(|pool| pool.name.clone())
        .collect();
    let mut provided_list: Vec<String> = p.platforms.iter().map(|p| p.to_string()).collect();
    provided_list.sort();
    provided_list.dedup();
    gate.digest = p.digest.clone();
    gate.provided = provided_list;
    gate.covered = missing.is_empty();
    gate.missing = missing;
    gate
}

/// The two fixes for a container with a gap: the platforms to build, or the affinity
/// keeping the pod where its images run.
fn add_fixes(
    gate: &mut ContainerGate,
    provided: &ProvidedPlatforms,
    snippet: &Option<String>,
    w: &Workload,
) {
    if gate.covered {
        return;
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
    Some(affinity_yaml(&terms))
}

/// The `affinity:` block a pod spec needs for `terms`, as YAML to paste.
fn affinity_yaml(terms: &[NodeSelectorTerm]) -> String {
    let mut s = String::from(
        "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      nodeSelectorTerms:\n",
    );
    for t in terms {
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
    s
}

/// A string as a YAML scalar that reads back as that string (quoted when it would not).
pub(super) fn yaml_scalar(s: &str) -> String {
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

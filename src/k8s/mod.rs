//! The scheduling side of `polyarch gate`: which node pools each workload in a set of
//! Kubernetes manifests may be scheduled onto, and whether every container image provides
//! the os/arch of every such pool.
//!
//! Pure logic, no I/O besides reading the input files and no printing: the caller (the
//! `gate` module) looks images up in the registry and hands the results to [`evaluate`] as
//! a closure.
//!
//! Inputs are parsed as generic values (`serde_norway::Value`) so unknown fields never break
//! parsing; every malformed input becomes one `K8sError::Usage` line naming
//! `file#document` (1-based), the field path and the fix.

use crate::base::platform::Platform;
use serde::{Deserialize, Serialize};
use serde_norway::{Mapping, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

mod coverage;
mod nodes;
mod scheduling;
mod workloads;
mod yaml;

pub use coverage::*;
pub use nodes::*;
pub use scheduling::*;
pub use workloads::*;
pub(crate) use yaml::documents;

/// What reading node lists and manifests refuses. The crate-wide `Error` keeps the kind:
/// `Usage` exits 2, `Io` 3.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// A malformed input, or a file named on the command line that cannot be read: one
    /// line naming `file#document`, the field path and the fix.
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl K8sError {
    fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        K8sError::Io {
            path: path.into(),
            source,
        }
    }

    fn unreadable_argument(path: &Path, source: std::io::Error) -> Self {
        K8sError::Usage(crate::base::text::unreadable_argument(path, &source))
    }
}

pub type Result<T, E = K8sError> = std::result::Result<T, E>;

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

#[cfg(test)]
mod tests;

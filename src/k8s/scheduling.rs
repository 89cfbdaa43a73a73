//! Where a workload's pods may land: node selectors, required node affinity, taints and
//! tolerations.

use super::*;

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

//! The gate's report as markdown: node pools × workloads, then each gap with its fixes.

use super::{cell, code};
use polyarch::flows::gate::{FindingKind, GateReport, Severity};
use polyarch::k8s::{ContainerGate, WorkloadGate};

/// Every pool a pod of the manifests may land on, in the order the report names them.
fn pools(report: &GateReport) -> Vec<&str> {
    let mut pools: Vec<&str> = Vec::new();
    let named = report.record.workloads.iter().flat_map(|w| &w.containers);
    for pool in named.flat_map(|c| &c.pools) {
        if !pools.contains(&pool.as_str()) {
            pools.push(pool);
        }
    }
    pools
}

fn workload_name(w: &WorkloadGate) -> String {
    match &w.namespace {
        Some(ns) => format!("{} {ns}/{}", w.kind, w.name),
        None => format!("{} {}", w.kind, w.name),
    }
}

/// What a pool pulls for a container: not scheduled there, unreadable, missing, an entry
/// that is another platform than it claims, or covered.
fn verdict(report: &GateReport, w: &WorkloadGate, c: &ContainerGate, pool: &str) -> String {
    if !c.pools.iter().any(|p| p == pool) {
        return "·".into();
    }
    if c.error.is_some() {
        return "⚠️ unreadable".into();
    }
    if c.missing_pools.iter().any(|p| p == pool) {
        return "❌ missing".into();
    }
    let mismatch = report.findings.iter().find(|f| {
        f.kind == FindingKind::EntryMismatch
            && f.source == w.source
            && f.container == c.container
            && f.pools.iter().any(|p| p == pool)
    });
    match mismatch.and_then(|f| f.platform.as_deref()) {
        Some(platform) => format!("❌ mismatch ({platform})"),
        None => "✅".into(),
    }
}

/// The report: a headline, the table, each gap with its fixes, then refusals, failures
/// and warnings as the text rendering lists them.
pub fn gate(report: &GateReport) -> String {
    let record = &report.record;
    let mut out = if record.covered {
        "### polyarch gate: ✅ every pool a pod may land on is covered\n\n".to_string()
    } else {
        "### polyarch gate: ❌ refused\n\n".to_string()
    };
    let pools = pools(report);
    out += "| workload | container | image |";
    for pool in &pools {
        out += &format!(" {} |", cell(pool));
    }
    out += &format!("\n|---|---|---|{}\n", "---|".repeat(pools.len()));
    for w in &record.workloads {
        for c in &w.containers {
            let init = if c.init { " (init)" } else { "" };
            out += &format!(
                "| {} | {}{init} | {} |",
                cell(&workload_name(w)),
                code(&c.container),
                code(&c.image)
            );
            for pool in &pools {
                out += &format!(" {} |", verdict(report, w, c, pool));
            }
            out += "\n";
        }
    }
    out += "\n· not scheduled there\n";
    let gaps: Vec<String> = record
        .workloads
        .iter()
        .flat_map(|w| w.containers.iter().map(move |c| (w, c)))
        .filter(|(_, c)| !c.covered && c.error.is_none())
        .map(|(w, c)| gap(w, c))
        .collect();
    if !gaps.is_empty() {
        out += "\n**Gaps and fixes**\n\n";
        out += &gaps.concat();
    }
    out += &findings(report);
    out
}

/// One container's gap and the two ways to close it.
fn gap(w: &WorkloadGate, c: &ContainerGate) -> String {
    let mut out = format!(
        "- {} {} ({}): {} lacks {}, needed by pool(s) {}\n",
        cell(&workload_name(w)),
        code(&c.container),
        code(&w.source),
        code(&c.image),
        if c.missing.is_empty() {
            "no os/arch (an entry is another platform than it claims)".to_string()
        } else {
            c.missing.join(", ")
        },
        if c.missing_pools.is_empty() {
            "–".to_string()
        } else {
            c.missing_pools.join(", ")
        },
    );
    let Some(fixes) = &c.fixes else {
        return out;
    };
    out += &format!(
        "  - fix: if polyarch builds this image, in its `polyarch.yaml` entry: {}\n",
        code(&fixes.polyarch_platforms)
    );
    match &fixes.node_affinity {
        Some(snippet) => {
            out += &format!(
                "  - or keep the workload off those pools, under {}:\n\n    ```yaml\n",
                code(&fixes.node_affinity_path)
            );
            for line in snippet.lines() {
                out += &format!("    {line}\n");
            }
            out += "    ```\n";
        }
        None => out += "  - no node affinity helps: no pool it can reach runs an arch all its images provide\n",
    }
    out
}

/// Refusals and failures first, then warnings, one line each.
fn findings(report: &GateReport) -> String {
    let mut lines: Vec<(u8, String)> = Vec::new();
    for f in &report.findings {
        let (rank, prefix) = match (f.severity, f.kind) {
            (Severity::Gap, FindingKind::EntryMismatch) => (0, "mismatch:"),
            (Severity::Failure, _) => (0, "unreadable:"),
            (Severity::Gap, _) => (0, "refused:"),
            (Severity::Warning, _) => (1, "warning:"),
        };
        lines.push((rank, format!("**{prefix}** {}", cell(&f.message))));
    }
    for image in &report.images {
        for w in &image.warnings {
            lines.push((
                1,
                format!("**warning:** image {}: {}", code(&image.image), cell(w)),
            ));
        }
    }
    for w in &report.record.warnings {
        lines.push((1, format!("**warning:** {}", cell(w))));
    }
    lines.sort_by_key(|(rank, _)| *rank);
    if lines.is_empty() {
        return String::new();
    }
    let mut out = "\n**Findings**\n\n".to_string();
    for (_, line) in lines {
        out += &format!("- {line}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyarch::flows::gate::Finding;

    /// The gate's report for two workloads: one image that cannot be read, one gap, and
    /// re-tag warnings (written by the gate's unit test of an unreadable image).
    const UNREADABLE: &str = include_str!("../../../../fixtures/gate/unreadable-report.json");

    #[test]
    fn pools_are_columns_and_each_gap_comes_with_its_fixes() {
        let report: GateReport = serde_json::from_str(UNREADABLE).unwrap();
        assert_eq!(
            gate(&report),
            include_str!("../../../../fixtures/gate/unreadable-report.md")
        );
    }

    #[test]
    fn an_entry_of_another_platform_is_a_mismatch_in_the_pools_that_pull_it() {
        let mut report: GateReport = serde_json::from_str(UNREADABLE).unwrap();
        let finding = Finding {
            kind: FindingKind::EntryMismatch,
            severity: Severity::Gap,
            source: "apps.yaml#2".into(),
            workload: "Deployment b".into(),
            container: "b".into(),
            image: "r.io/amd:v1".into(),
            message: "its linux/amd64 entry is linux/arm64".into(),
            platform: Some("linux/amd64".into()),
            pools: vec!["general".into()],
            ..serde_json::from_str(
                r#"{"kind":"unreadable","severity":"failure","source":"","workload":"","container":"","image":"","message":""}"#,
            )
            .unwrap()
        };
        report.findings.push(finding);
        let table = gate(&report);
        assert!(
            table.contains(
                "| Deployment b | `b` | `r.io/amd:v1` | ❌ mismatch (linux/amd64) | ❌ missing |"
            ),
            "{table}"
        );
        assert!(
            table.find("**mismatch:**") < table.find("**warning:**"),
            "{table}"
        );
    }
}

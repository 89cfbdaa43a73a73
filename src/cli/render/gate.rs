//! The gate's report as text for the terminal.

use polyarch::flows::gate::{Finding, FindingKind, GateReport, Severity};
use polyarch::k8s::{ContainerGate, WorkloadGate};

/// The report for the terminal: each gap with why and its fixes, images that could not be
/// read, refusals, warnings, the pinned files, and a summary line.
pub fn render_text(report: &GateReport) -> String {
    let record = &report.record;
    let mut s = String::new();
    let (mut gaps, mut checked, mut unreadable) = (0, 0, 0);
    for w in &record.workloads {
        let name = match &w.namespace {
            Some(ns) => format!("{ns}/{}", w.name),
            None => w.name.clone(),
        };
        for c in &w.containers {
            checked += 1;
            if c.error.is_some() {
                unreadable += 1;
                continue;
            }
            if c.covered {
                continue;
            }
            gaps += 1;
            if c.missing.is_empty() {
                continue;
            }
            gap(&mut s, report, w, c, &name);
        }
    }
    // Refusals and failures first, then warnings: what stops the deploy stays on top.
    let (warnings, stops): (Vec<&Finding>, Vec<&Finding>) = report
        .findings
        .iter()
        .partition(|f| f.severity == Severity::Warning);
    for f in stops.into_iter().chain(warnings) {
        let prefix = match (f.severity, f.kind) {
            (Severity::Failure, _) => "UNREADABLE",
            (Severity::Gap, FindingKind::EntryMismatch) => continue,
            (Severity::Gap, _) => "REFUSED",
            (Severity::Warning, _) => "warning:",
        };
        s.push_str(&format!("{prefix} {}\n", f.message));
    }
    for image in &report.images {
        for w in &image.warnings {
            s.push_str(&format!("warning: image {}: {w}\n", image.image));
        }
    }
    for w in &record.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    for p in &report.pinned {
        let how = if p.reserialised {
            " (re-serialised: comments and formatting dropped)"
        } else {
            ""
        };
        s.push_str(&format!(
            "pinned: {} -> {}: {} image value(s){how}\n",
            p.source, p.path, p.pinned
        ));
    }
    let workloads = record.workloads.len();
    if record.covered {
        s.push_str(&format!(
            "covered: {checked} container(s) in {workloads} workload(s) have images for every pool they can be scheduled onto\n"
        ));
    } else {
        s.push_str(&format!(
            "not covered: {gaps} gap(s) in {checked} container(s) of {workloads} workload(s)"
        ));
        if unreadable > 0 {
            s.push_str(&format!(
                "; {unreadable} container(s) not checked: their image could not be read"
            ));
        }
        s.push('\n');
    }
    s
}

/// One container's gap: what it lacks, entries that are not what they claim, the fixes.
fn gap(s: &mut String, report: &GateReport, w: &WorkloadGate, c: &ContainerGate, name: &str) {
    let init = if c.init {
        "init container"
    } else {
        "container"
    };
    let digest = c
        .digest
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    s.push_str(&format!(
        "GAP {} {name} {init} `{}` ({}): image {}{digest} lacks {}, needed by pool(s) {}\n",
        w.kind,
        c.container,
        w.source,
        c.image,
        c.missing.join(", "),
        c.missing_pools.join(", "),
    ));
    for f in report.findings.iter().filter(|f| {
        f.kind == FindingKind::EntryMismatch && f.source == w.source && f.container == c.container
    }) {
        let platform = f.platform.as_deref().unwrap_or_default();
        let detail = report
            .images
            .iter()
            .filter(|i| i.image == c.image)
            .flat_map(|i| &i.entries)
            // Two entries may name one manifest (that is how an index lies).
            .find(|e| e.digest == f.entry && e.platform.to_string() == platform)
            .and_then(|e| e.detail.as_deref())
            .unwrap_or("another platform");
        s.push_str(&format!(
            "  its {platform} entry is not a {platform} image: {detail}\n"
        ));
    }
    if let Some(f) = &c.fixes {
        s.push_str(&format!(
            "  fix: if polyarch builds this image, set in its polyarch.yaml entry: {}\n",
            f.polyarch_platforms
        ));
        match &f.node_affinity {
            Some(snippet) => {
                s.push_str(&format!(
                    "  or keep the workload off those pools; under {}:\n",
                    f.node_affinity_path
                ));
                for line in snippet.lines() {
                    s.push_str("    ");
                    s.push_str(line);
                    s.push('\n');
                }
            }
            None => s.push_str(
                "  (no node affinity helps: no pool it can reach runs an arch all its images provide)\n",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate's report for two workloads: one image that cannot be read, one gap, and
    /// re-tag warnings (written by the gate's unit test of an unreadable image).
    const UNREADABLE: &str = include_str!("../../../fixtures/gate/unreadable-report.json");

    #[test]
    fn what_stops_the_deploy_comes_first_and_the_summary_counts_what_was_not_checked() {
        let report: GateReport = serde_json::from_str(UNREADABLE).unwrap();
        let text = render_text(&report);
        assert!(
            text.contains("UNREADABLE Deployment a container `a` (apps.yaml#1): image r.io/gone:v1 could not be read"),
            "{text}"
        );
        assert!(
            text.contains("GAP Deployment b container `b` (apps.yaml#2)"),
            "{text}"
        );
        assert!(text.find("UNREADABLE") < text.find("warning:"), "{text}");
        assert!(
            text.contains(
                "not covered: 1 gap(s) in 2 container(s) of 2 workload(s); 1 container(s) not checked"
            ),
            "{text}"
        );
    }
}

//! `polyarch plan` and `polyarch doctor` as text for the terminal.

use polyarch::flows::doctor::{Check, Verdict};
use polyarch::flows::plan_report::PlanLine;

/// One line per image × platform: how it builds and where; the images it waits for.
pub fn render_plan(lines: &[PlanLine]) -> String {
    let mut out = String::new();
    for line in lines {
        out += &format!(
            "{:<12} {:<16} {:<52} builder {}\n",
            line.image,
            line.platform.to_string(),
            line.execution.describe(),
            line.builder
        );
        if !line.after.is_empty() {
            out += &format!(
                "  after: {} (builds FROM it, by the digest just pushed)\n",
                line.after.join(", ")
            );
        }
        if let Some(w) = &line.warning {
            out += &format!("  warning: {w}\n");
        }
    }
    out
}

/// One line per check, with the fix under each that is not ok.
pub fn render_checks(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let tag = match c.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        out += &format!("{tag} {:<32} {}\n", c.name, c.detail);
        if let (Some(fix), false) = (&c.fix, c.verdict == Verdict::Ok) {
            out += &format!("     fix: {fix}\n");
        }
    }
    out
}

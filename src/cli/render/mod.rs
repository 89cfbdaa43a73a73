//! Text for the terminal: the library hands back data, the CLI words it.

use polyarch::base::text::printable;
use polyarch::verify::coverage_record::{
    CoverageRecord, PlatformCoverage, Signed, TestRecord, TestStatus,
};

pub mod doctor;
pub mod gate;
pub mod markdown;

/// Prints rendered text (a summary, a table) to standard output with each line made
/// printable: the renderer's own line breaks stay, and a value's control characters, a
/// line break included, are escaped.
pub fn print(text: &str) {
    let lines: Vec<_> = text.split('\n').map(printable).collect();
    print!("{}", lines.join("\n"));
}

fn human_size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1_000_000.0)
    } else {
        format!("{:.1} kB", bytes as f64 / 1_000.0)
    }
}

/// The human summary of a coverage record, printed in text mode.
pub fn coverage_text(record: &CoverageRecord) -> String {
    let mut out = String::new();
    for image in &record.images {
        let verdict = if image.covered {
            "covered"
        } else {
            "NOT covered"
        };
        out += &format!(
            "{} {} -> {} ({})\n",
            image.name,
            image.reference,
            image.digest.short(),
            verdict
        );
        if let Some(signed) = &image.signed {
            out += &format!("  index {}\n", signature(signed));
        }
        for p in &image.platforms {
            out += &platform_lines(p);
        }
        for digest in &image.attestations {
            out += &format!(
                "  attestation entry {digest}: older containerd fails on it with \"unknown media type\"; push without provenance/SBOM (buildx --provenance=false --sbom=false)\n"
            );
        }
        for warning in &image.warnings {
            out += &format!("  warning: {warning}\n");
        }
        let native = image
            .platforms
            .iter()
            .filter_map(|p| p.build.as_ref())
            .find(|b| !b.emulated && b.seconds > 0.0);
        for p in &image.platforms {
            if let (Some(build), Some(native)) = (&p.build, native) {
                if build.emulated && !build.reused {
                    out += &format!(
                        "  {} built under QEMU emulation: {:.1}x the native build time\n",
                        p.platform,
                        build.seconds / native.seconds
                    );
                }
            }
        }
        if let Some(why) = &image.unpublished {
            out += &format!("  not published: {why}\n");
            continue;
        }
        out += &format!("  pin: {}\n", image.pinned);
        if !image.tags.is_empty() {
            out += "  note: tags are mutable; nodes with imagePullPolicy: IfNotPresent keep a re-pushed tag's old image (possibly a stale architecture): deploy the pinned digest\n";
        }
    }
    out += if record.covered {
        "every declared platform is covered\n"
    } else {
        "coverage gap: see above\n"
    };
    out
}

/// A platform's line (status, digest, size, how it was built), its detail and what is
/// attached to it.
fn platform_lines(p: &PlatformCoverage) -> String {
    let mut out = String::new();
    let status = serde_json::to_value(&p.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let digest = p
        .digest
        .as_ref()
        .map_or("-", polyarch::base::digest::Digest::short);
    let size = p.size.map(human_size).unwrap_or_else(|| "-".into());
    let build = p.build.as_ref().map_or(String::new(), |b| {
        let fallback = if b.fallback.is_some() {
            ", its builder unreachable (fallback: emulate)"
        } else {
            ""
        };
        if b.reused {
            format!("  inputs unchanged, not rebuilt{fallback}")
        } else {
            let emulated = if b.emulated { " (emulated)" } else { "" };
            format!("  built in {:.1}s{emulated}{fallback}", b.seconds)
        }
    });
    out += &format!(
        "  {:<16} {:<15} {:<12} {:>9}{build}\n",
        p.platform.to_string(),
        status,
        digest,
        size
    );
    if let Some(detail) = &p.detail {
        out += &format!("    {detail}\n");
    }
    if let Some(test) = &p.test {
        out += &test_lines(test);
    }
    for attached in &p.attached {
        let kind = match (&attached.predicate_type, &attached.artifact_type) {
            (Some(predicate), _) => predicate.as_str(),
            (None, Some(artifact)) => artifact.as_str(),
            (None, None) => "an artifact",
        };
        out += &format!(
            "    attached: {kind} ({})\n",
            polyarch::base::oci::short_digest(&attached.digest)
        );
    }
    if let Some(counts) = &p.sbom {
        let total: usize = counts.values().sum();
        let kinds: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let kinds = match kinds.is_empty() {
            true => String::new(),
            false => format!(" ({})", kinds.join(", ")),
        };
        out += &format!("    sbom: {total} packages{kinds}\n");
    }
    if let Some(signed) = p.signed.as_ref().filter(|s| s.verified) {
        out += &format!("    {}\n", signature(signed));
    }
    out
}

/// `signed by KEY`, or the gap (a platform's is its detail too, so it is said once).
fn signature(signed: &Signed) -> String {
    match (&signed.key, &signed.gap) {
        (Some(key), _) if signed.verified => format!("signed by {key}"),
        (_, Some(gap)) => format!("not signed: {gap}"),
        _ => "not signed".into(),
    }
}

/// A platform's test: one line when it passed or was skipped; a failure's command,
/// status and output tail.
pub(super) fn test_lines(test: &TestRecord) -> String {
    let seconds = test
        .seconds
        .map_or(String::new(), |s| format!(" in {s:.1}s"));
    match test.status {
        TestStatus::Passed if test.earlier_run => {
            format!("    test passed (earlier run): {}\n", test.command)
        }
        TestStatus::Passed => format!("    test passed{seconds}: {}\n", test.command),
        TestStatus::Skipped => format!("    test skipped (--no-test): {}\n", test.command),
        TestStatus::Failed | TestStatus::TimedOut => {
            let how = match (test.status, test.exit_code) {
                (TestStatus::TimedOut, _) => "timed out".to_string(),
                (_, Some(code)) => format!("failed with exit code {code}"),
                _ => "failed".to_string(),
            };
            let mut out = format!("    test {how}{seconds}: {}\n", test.command);
            if !test.output_tail.is_empty() {
                out += &format!("    last {} lines of its output:\n", test.output_tail.len());
                for line in &test.output_tail {
                    out += &format!("      | {line}\n");
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyarch::verify::coverage_record::{
        BuildInfo, ImageCoverage, PlatformCoverage, PlatformStatus,
    };
    use std::collections::BTreeMap;

    #[test]
    fn the_summary_tells_reused_builds_from_emulated_ones() {
        let platform = |name: &str, build: BuildInfo| PlatformCoverage {
            platform: name.parse().unwrap(),
            digest: Some(format!("sha256:{}", "a".repeat(64)).parse().unwrap()),
            config_platform: Some(name.parse().unwrap()),
            size: Some(900),
            status: PlatformStatus::Ok,
            annotations: BTreeMap::new(),
            detail: None,
            deep: None,
            build: Some(build),
            attached: Vec::new(),
            test: None,
            sbom: None,
            signed: None,
        };
        let image = ImageCoverage {
            name: "x".into(),
            reference: "r.io/x:t".into(),
            tags: vec!["t".into()],
            digest: format!("sha256:{}", "b".repeat(64)).parse().unwrap(),
            pinned: "r.io/x@sha256:…".into(),
            media_type: "application/vnd.oci.image.index.v1+json".into(),
            size: None,
            annotations: BTreeMap::new(),
            declared: vec![
                "linux/amd64".parse().unwrap(),
                "linux/arm64".parse().unwrap(),
            ],
            platforms: vec![
                platform(
                    "linux/amd64",
                    BuildInfo {
                        seconds: 1.0,
                        ..Default::default()
                    },
                ),
                platform(
                    "linux/arm64",
                    BuildInfo {
                        emulated: true,
                        reused: true,
                        ..Default::default()
                    },
                ),
            ],
            missing: vec![],
            unexpected: vec![],
            attestations: vec![],
            warnings: vec![],
            covered: true,
            unpublished: None,
            signed: None,
        };
        let mut failed = image.clone();
        failed.covered = false;
        failed.pinned = String::new();
        failed.unpublished = Some("a platform's test failed".into());
        failed.platforms[1].status = polyarch::verify::coverage_record::PlatformStatus::TestFailed;
        failed.platforms[1].test = Some(TestRecord {
            status: TestStatus::Failed,
            command: "[\"/bin/app\"]".into(),
            exit_code: Some(3),
            seconds: Some(0.4),
            output_tail: vec!["app: error while loading shared libraries\u{1b}[0m".into()],
            earlier_run: false,
        });
        let shown = coverage_text(&CoverageRecord::new(vec![failed.clone()]));
        assert!(
            shown.contains("    test failed with exit code 3 in 0.4s: [\"/bin/app\"]"),
            "{shown}"
        );
        assert!(
            shown.contains("      | app: error while loading shared libraries"),
            "{shown}"
        );
        assert!(
            shown.contains("  not published: a platform's test failed"),
            "{shown}"
        );
        assert!(!shown.contains("pin:"), "{shown}");
        let table = markdown::coverage(&CoverageRecord::new(vec![failed]));
        assert!(table.contains("❌ test failed"), "{table}");
        assert!(
            table.contains("**x linux/arm64**: test failed, exit code 3"),
            "{table}"
        );
        assert!(table.contains("not published"), "{table}");
        let text = coverage_text(&CoverageRecord::new(vec![image]));
        assert!(text.contains("built in 1.0s"), "{text}");
        assert!(text.contains("inputs unchanged, not rebuilt"), "{text}");
        // Nothing ran under QEMU in this run, so no emulation cost is claimed.
        assert!(!text.contains("QEMU"), "{text}");
    }
}

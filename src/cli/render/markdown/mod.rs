//! Markdown for job summaries and merge-request comments (`--output-format markdown`):
//! the same records the text and JSON renderings print, as tables read at a glance.

pub mod gate;

use polyarch::base::digest::Digest;
use polyarch::verify::coverage_record::{
    CoverageRecord, ImageCoverage, PartRecord, PlatformCoverage, PlatformStatus, TestStatus,
};

/// A table cell: pipes would end the cell and newlines the row.
pub(super) fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Inline code that survives any text: a backtick inside widens the fence.
pub(super) fn code(text: &str) -> String {
    let text = cell(text);
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

fn short(digest: Option<&Digest>) -> String {
    digest.map_or_else(|| "–".to_string(), |d| code(d.short()))
}

/// A platform's verdict as a reader of the table wants it: covered, emulated (covered,
/// but built under QEMU), missing or a mismatch, with what the entry really is.
fn status(p: &PlatformCoverage) -> String {
    let emulated = p.build.as_ref().is_some_and(|b| b.emulated);
    match p.status {
        PlatformStatus::Ok if emulated => "🟡 emulated".into(),
        PlatformStatus::Ok => "✅ covered".into(),
        PlatformStatus::Missing => "❌ missing".into(),
        PlatformStatus::ConfigMismatch => match &p.config_platform {
            Some(actual) => format!("❌ mismatch (config: {actual})"),
            None => "❌ mismatch (config)".into(),
        },
        PlatformStatus::BinaryMismatch => "❌ mismatch (binary)".into(),
        PlatformStatus::ProvenanceMissing => "❌ no provenance".into(),
        PlatformStatus::TestFailed => match p.test.as_ref().map(|t| t.status) {
            Some(TestStatus::TimedOut) => "❌ test timed out".into(),
            _ => "❌ test failed".into(),
        },
        PlatformStatus::SbomMissing => "❌ no SBOM".into(),
        PlatformStatus::SignatureMissing => "❌ not signed".into(),
    }
}

fn build(p: &PlatformCoverage) -> String {
    match &p.build {
        None => "–".into(),
        Some(b) if b.reused => "unchanged, not rebuilt".into(),
        Some(b) => {
            let how = if b.emulated { "QEMU" } else { "native" };
            let fallback = if b.fallback.is_some() {
                ", builder unreachable"
            } else {
                ""
            };
            format!("{how}, {:.1} s{fallback}", b.seconds)
        }
    }
}

fn provenance(p: &PlatformCoverage) -> &'static str {
    match (p.attached.iter().any(|a| a.is_provenance()), &p.digest) {
        (true, _) => "✅ attached",
        (false, None) => "–",
        (false, Some(_)) => "none",
    }
}

/// The coverage record: a headline, one row per image × declared platform, then what to
/// deploy and every finding the text rendering words.
pub fn coverage(record: &CoverageRecord) -> String {
    let mut out = if record.covered {
        "### polyarch: ✅ every declared platform is covered\n\n".to_string()
    } else {
        "### polyarch: ❌ coverage gap\n\n".to_string()
    };
    out += "| image | platform | status | digest | build | provenance |\n";
    out += "|---|---|---|---|---|---|\n";
    for image in &record.images {
        for (i, p) in image.platforms.iter().enumerate() {
            let name = if i == 0 {
                format!("**{}**", cell(&image.name))
            } else {
                String::new()
            };
            out += &format!(
                "| {name} | {} | {} | {} | {} | {} |\n",
                p.platform,
                status(p),
                short(p.digest.as_ref()),
                build(p),
                provenance(p)
            );
        }
    }
    out += "\n";
    for image in &record.images {
        match &image.unpublished {
            Some(why) => {
                out += &format!(
                    "- **{}** {}: not published ({})\n",
                    cell(&image.name),
                    code(&image.reference),
                    cell(why)
                )
            }
            None => {
                out += &format!(
                    "- **{}** {}: index {}, deploy {}\n",
                    cell(&image.name),
                    code(&image.reference),
                    code(image.digest.short()),
                    code(&image.pinned)
                )
            }
        }
    }
    let notes: Vec<String> = record.images.iter().flat_map(notes).collect();
    if !notes.is_empty() {
        out += "\n**Findings**\n\n";
        for note in notes {
            out += &format!("- {}\n", cell(&note));
        }
    }
    out += &failed_tests(record);
    out
}

/// Each failed test's platform, command, status and output tail, in a fenced block.
fn failed_tests(record: &CoverageRecord) -> String {
    let mut out = String::new();
    for image in &record.images {
        for p in &image.platforms {
            let Some(test) = &p.test else { continue };
            let status = match test.status {
                TestStatus::Failed => match test.exit_code {
                    Some(code) => format!("failed, exit code {code}"),
                    None => "failed".to_string(),
                },
                TestStatus::TimedOut => "timed out".to_string(),
                TestStatus::Passed | TestStatus::Skipped => continue,
            };
            out += &format!(
                "\n**{} {}**: test {status}: {}\n\n",
                cell(&image.name),
                p.platform,
                code(&test.command)
            );
            let fence = if test.output_tail.iter().any(|l| l.contains("```")) {
                "~~~~"
            } else {
                "```"
            };
            out += &format!("{fence}\n");
            for line in &test.output_tail {
                out += &format!("{line}\n");
            }
            out += &format!("{fence}\n");
        }
    }
    out
}

/// One image's findings, each a line: gap details, attestation entries, warnings.
fn notes(image: &ImageCoverage) -> Vec<String> {
    let mut notes: Vec<String> = image
        .platforms
        .iter()
        .filter_map(|p| {
            p.detail
                .as_ref()
                .map(|d| format!("{} {}: {d}", image.name, p.platform))
        })
        .collect();
    if let Some(gap) = image.signed.as_ref().and_then(|s| s.gap.as_ref()) {
        notes.push(format!("{}: {gap}", image.name));
    }
    for platform in &image.unexpected {
        notes.push(format!(
            "{}: the index also holds {platform}, which is not declared",
            image.name
        ));
    }
    for digest in &image.attestations {
        notes.push(format!(
            "{}: attestation entry {digest}: older containerd fails on it with \"unknown media type\"",
            image.name
        ));
    }
    notes.extend(
        image
            .warnings
            .iter()
            .map(|w| format!("{}: {w}", image.name)),
    );
    notes
}

/// `build --push-by-digest`: what this runner pushed, for `assemble` to publish.
pub fn part(part: &PartRecord) -> String {
    let mut out = "### polyarch: pushed by digest (a part for `polyarch assemble`)\n\n".to_string();
    out += "| image | platform | digest | build |\n|---|---|---|---|\n";
    for image in &part.images {
        for (i, p) in image.platforms.iter().enumerate() {
            let name = if i == 0 {
                format!("**{}**", cell(&image.name))
            } else {
                String::new()
            };
            let how = if p.build.reused {
                "unchanged, not rebuilt".to_string()
            } else if p.build.emulated {
                format!("QEMU, {:.1} s", p.build.seconds)
            } else {
                format!("native, {:.1} s", p.build.seconds)
            };
            out += &format!(
                "| {name} | {} | {} | {how} |\n",
                p.platform,
                code(p.digest.short())
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `polyarch build --record` of two images (one with provenance: true) on Docker 20.10,
    /// arm64 under QEMU, against a loopback registry.
    const BUILD: &str = include_str!("../../../../fixtures/records/build.json");
    /// `polyarch verify --record` of an amd64-only tag against three platforms.
    const VERIFY_GAP: &str = include_str!("../../../../fixtures/records/verify-gap.json");

    #[test]
    fn a_covered_build_shows_each_platform_emulated_or_native_with_its_provenance() {
        let record: CoverageRecord = serde_json::from_str(BUILD).unwrap();
        assert_eq!(
            coverage(&record),
            include_str!("../../../../fixtures/records/build.md")
        );
    }

    #[test]
    fn a_gap_is_a_missing_row_and_a_finding_naming_the_reference() {
        let record: CoverageRecord = serde_json::from_str(VERIFY_GAP).unwrap();
        let table = coverage(&record);
        assert_eq!(
            table,
            include_str!("../../../../fixtures/records/verify-gap.md")
        );
        assert!(
            table.starts_with("### polyarch: ❌ coverage gap"),
            "{table}"
        );
        assert!(
            table.contains("| linux/riscv64 | ❌ missing | – | – | – |"),
            "{table}"
        );
    }

    #[test]
    fn a_mismatch_names_what_the_entry_really_is_and_cells_stay_cells() {
        let mut record: CoverageRecord = serde_json::from_str(VERIFY_GAP).unwrap();
        let entry = &mut record.images[0].platforms[0];
        entry.status = PlatformStatus::ConfigMismatch;
        entry.config_platform = Some("linux/arm64".parse().unwrap());
        entry.detail = Some("config says a|b".into());
        let table = coverage(&record);
        assert!(
            table.contains("❌ mismatch (config: linux/arm64)"),
            "{table}"
        );
        assert!(table.contains("config says a\\|b"), "{table}");
    }
}

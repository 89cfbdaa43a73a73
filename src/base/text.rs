//! Text helpers every area's messages use.

use std::path::Path;

/// Collapses a multi-line message (engine or registry output, a quoted project value)
/// into one line: no control characters reach the terminal.
pub fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a file the user named on the command line that cannot be read says: the path, why,
/// and the fix.
pub fn unreadable_argument(path: &Path, source: &std::io::Error) -> String {
    format!(
        "{}: cannot read it ({source}); check the path on the command line",
        path.display()
    )
}

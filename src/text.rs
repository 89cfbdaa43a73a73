//! Text helpers every area's messages use.

/// Collapses a multi-line message (engine or registry output, a quoted project value)
/// into one line: no control characters reach the terminal.
pub fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

//! Text helpers every area's messages use.

use std::borrow::Cow;
use std::path::Path;

/// `text` with every control character (ESC, BEL, CR, LF, …) and bidirectional override
/// written as its Rust escape (`\u{1b}`, `\r`): what a registry, image or file holds can
/// then neither move the cursor, recolour or retitle the terminal, nor reorder or fake a
/// line, and the reader still sees that it was there. The one cleaner for everything
/// printed; JSON output keeps the original value (serde escapes it).
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hostile) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hostile(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Control characters, and the bidi embeddings, overrides and isolates that make a
/// terminal show text in another order than it is.
fn hostile(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Collapses a multi-line message (engine or registry output, a quoted project value)
/// into one line: whitespace runs become one space and other control characters are
/// escaped by [`printable`].
pub fn one_line(text: &str) -> String {
    let words = text
        .split(char::is_whitespace)
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    printable(&words).into_owned()
}

/// What a file the user named on the command line that cannot be read says: the path, why,
/// and the fix.
pub fn unreadable_argument(path: &Path, source: &std::io::Error) -> String {
    format!(
        "{}: cannot read it ({source}); check the path on the command line",
        path.display()
    )
}

/// `4 MiB`, `16 KiB` or bytes: how messages name a size limit.
pub fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_terminal_controls_and_keeps_the_rest() {
        assert_eq!(
            printable("v8\u{1b}]0;pwned\u{7}\r\n\u{202e}x"),
            "v8\\u{1b}]0;pwned\\u{7}\\r\\n\\u{202e}x"
        );
        assert!(matches!(printable("linux/arm64 ü €"), Cow::Borrowed(_)));
        assert!(!printable("\u{9b}31m\u{7f}").chars().any(char::is_control));
    }

    #[test]
    fn one_line_collapses_whitespace_and_escapes_other_controls() {
        assert_eq!(one_line(" a\r\n\tb  c\n"), "a b c");
        assert_eq!(one_line("red \u{1b}[31mtext"), "red \\u{1b}[31mtext");
    }
}

//! How deeply a YAML text nests, read before a parser sees it. The YAML parser behind
//! serde checks its depth only after scanning the whole text, and its scanner's cost
//! grows with the depth at every token: 100,000 `[` took a minute of CPU. This pass tokenises
//! just enough (flow brackets, block indentation and `- `/`? `/`: ` indicators, and what
//! hides them: quotes, comments, block and multi-line plain scalars) to follow the
//! scanner's nesting, in one linear pass.

/// The deepest nesting a YAML input may have: far beyond any project file or manifest
/// (serde refuses more than 128 levels later anyway), and cheap for the scanner.
pub const MAX_YAML_DEPTH: usize = 256;

/// A YAML text that nests deeper than the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("YAML nests more than {limit} levels deep at line {line}; flatten it")]
pub struct TooDeep {
    /// 1-based, as the YAML parser counts lines.
    pub line: usize,
    pub limit: usize,
}

/// `Err` when `text` nests collections more than `limit` deep.
pub fn check_depth(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan {
        limit,
        line: 0,
        indents: Vec::new(),
        flow: 0,
        within: Within::Tokens,
    };
    // The scanner breaks lines at each of these, so a comment or scalar ends there too.
    for (i, line) in text
        .split(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
        .enumerate()
    {
        scan.line = i + 1;
        let chars: Vec<char> = line.chars().collect();
        scan.read_line(&chars)?;
    }
    Ok(())
}

/// What a line break leaves open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Within {
    Tokens,
    /// A plain scalar that may continue on the next line.
    Plain,
    /// A quoted scalar: `'` or `"`.
    Quoted(char),
    /// The lines of a `|` or `>` scalar: those indented at least `indent` (found from its
    /// first line unless given), the blank lines before it being `blank` wide.
    Block {
        indent: Option<usize>,
        at_least: usize,
        blank: usize,
    },
}

struct Scan {
    limit: usize,
    line: usize,
    /// The columns of the open block collections, as the scanner rolls them.
    indents: Vec<usize>,
    flow: usize,
    within: Within,
}

fn is_blank(c: Option<&char>) -> bool {
    matches!(c, None | Some(' ' | '\t'))
}

fn is_flow_indicator(c: char) -> bool {
    matches!(c, ',' | '[' | ']' | '{' | '}')
}

impl Scan {
    fn check(&self) -> Result<(), TooDeep> {
        match self.indents.len() + self.flow > self.limit {
            true => Err(TooDeep {
                line: self.line,
                limit: self.limit,
            }),
            false => Ok(()),
        }
    }

    /// A block collection starting at `column`, if it is deeper than the open one.
    fn roll(&mut self, column: usize) -> Result<(), TooDeep> {
        if self.indents.last().is_none_or(|&top| top < column) {
            self.indents.push(column);
        }
        self.check()
    }

    fn read_line(&mut self, line: &[char]) -> Result<(), TooDeep> {
        let indent = line
            .iter()
            .take_while(|c| **c == ' ' || **c == '\t')
            .count();
        let blank = indent == line.len();
        let mut start = indent;
        // `---` and `...` end a document, and everything open in it.
        if matches!(line, ['-', '-', '-', ..] | ['.', '.', '.', ..]) && is_blank(line.get(3)) {
            self.indents.clear();
            self.flow = 0;
            self.within = Within::Tokens;
            start = 3;
        }
        // Whether the line starts afresh, not inside a scalar the last one left open.
        let mut fresh = true;
        match self.within {
            Within::Block {
                indent: Some(n), ..
            } if blank || indent >= n => return Ok(()),
            Within::Block {
                indent: None,
                at_least,
                blank: widest,
            } => {
                if line.iter().all(|c| *c == ' ') {
                    self.within = Within::Block {
                        indent: None,
                        at_least,
                        blank: widest.max(line.len()),
                    };
                    return Ok(());
                }
                let n = widest.max(indent).max(at_least);
                if indent >= n {
                    self.within = Within::Block {
                        indent: Some(n),
                        at_least,
                        blank: widest,
                    };
                    return Ok(());
                }
            }
            Within::Quoted(quote) => match closing_quote(line, 0, quote) {
                Some(end) => (start, fresh) = (end, false),
                None => return Ok(()),
            },
            Within::Plain if blank => return Ok(()),
            // A plain scalar goes on while the lines are indented past its collection.
            Within::Plain
                if self.flow > 0 || self.indents.last().is_none_or(|&top| indent > top) =>
            {
                fresh = false;
                if line[indent] == '#' {
                    self.within = Within::Tokens;
                    return Ok(());
                }
                match self.plain_end(line, indent) {
                    Some(end) => start = end,
                    None => return Ok(()),
                }
            }
            _ => {}
        }
        self.within = Within::Tokens;
        if fresh && self.flow == 0 {
            if blank || line[0] == '%' {
                return Ok(());
            }
            while self.indents.last().is_some_and(|&top| top > indent) {
                self.indents.pop();
            }
        }
        self.tokens(line, start)
    }

    /// Reads the tokens of `line` from `i`.
    fn tokens(&mut self, line: &[char], mut i: usize) -> Result<(), TooDeep> {
        // Where the token a `: ` would make a mapping key starts.
        let mut key: Option<usize> = None;
        loop {
            while is_blank(line.get(i)) && i < line.len() {
                i += 1;
            }
            let Some(&c) = line.get(i) else {
                return Ok(());
            };
            let blank_after = is_blank(line.get(i + 1));
            match c {
                '#' => return Ok(()),
                '[' | '{' => {
                    key.get_or_insert(i);
                    self.flow += 1;
                    self.check()?;
                    i += 1;
                }
                ']' | '}' => {
                    self.flow = self.flow.saturating_sub(1);
                    i += 1;
                }
                ',' => i += 1,
                '-' if blank_after => {
                    if self.flow == 0 {
                        self.roll(i)?;
                        key = None;
                    }
                    i += 1;
                }
                '?' | ':' if self.flow > 0 || blank_after => {
                    if self.flow == 0 {
                        self.roll(if c == ':' { key.unwrap_or(i) } else { i })?;
                        key = None;
                    }
                    i += 1;
                }
                '&' | '*' => {
                    key.get_or_insert(i);
                    i += 1;
                    while line
                        .get(i)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                    {
                        i += 1;
                    }
                }
                '!' => {
                    key.get_or_insert(i);
                    i += 1;
                    if line.get(i) == Some(&'<') {
                        i = line[i..]
                            .iter()
                            .position(|c| *c == '>')
                            .map_or(line.len(), |p| i + p + 1);
                    } else {
                        while line.get(i).is_some_and(|c| {
                            c.is_ascii_alphanumeric() || "-_;/?:@&=+$.%!~*'()".contains(*c)
                        }) {
                            i += 1;
                        }
                    }
                }
                '|' | '>' if self.flow == 0 => {
                    let explicit = line[i + 1..]
                        .iter()
                        .take_while(|c| matches!(c, '+' | '-' | '1'..='9'))
                        .find_map(|c| c.to_digit(10));
                    let base = self.indents.last().map(|&top| top + 1);
                    self.within = Within::Block {
                        indent: explicit.map(|n| base.map_or(n as usize, |b| b - 1 + n as usize)),
                        at_least: base.unwrap_or(1),
                        blank: 0,
                    };
                    return Ok(());
                }
                '\'' | '"' => {
                    key.get_or_insert(i);
                    match closing_quote(line, i + 1, c) {
                        Some(end) => i = end,
                        None => {
                            self.within = Within::Quoted(c);
                            return Ok(());
                        }
                    }
                }
                _ => {
                    key.get_or_insert(i);
                    match self.plain_end(line, i + 1) {
                        Some(end) => i = end,
                        None => {
                            self.within = Within::Plain;
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Where a plain scalar running at `i` ends on `line` (at a `: `, a comment or, in
    /// flow, an indicator); `None` when it reaches the line's end.
    fn plain_end(&self, line: &[char], mut i: usize) -> Option<usize> {
        while let Some(&c) = line.get(i) {
            match c {
                ' ' | '\t' => {
                    while is_blank(line.get(i)) && i < line.len() {
                        i += 1;
                    }
                    if line.get(i) == Some(&'#') {
                        return Some(i);
                    }
                    continue;
                }
                ':' if is_blank(line.get(i + 1)) => return Some(i),
                ':' if self.flow > 0
                    && line
                        .get(i + 1)
                        .is_some_and(|c| is_flow_indicator(*c) || *c == '?') =>
                {
                    return Some(i)
                }
                c if self.flow > 0 && is_flow_indicator(c) => return Some(i),
                _ => {}
            }
            i += 1;
        }
        None
    }
}

/// The index after the quote closing a `quote`d scalar whose text starts at `i`.
fn closing_quote(line: &[char], mut i: usize, quote: char) -> Option<usize> {
    while let Some(&c) = line.get(i) {
        match (quote, c) {
            ('"', '\\') => i += 1,
            ('\'', '\'') if line.get(i + 1) == Some(&'\'') => i += 1,
            (q, c) if q == c => return Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str) -> bool {
        check_depth(text, 8).is_ok()
    }

    /// Block mappings nested `n` deep by indentation.
    fn block(n: usize) -> String {
        (0..n)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect::<String>()
            + &" ".repeat(n)
            + "v\n"
    }

    #[test]
    fn flow_and_block_nesting_are_both_counted() {
        assert!(depth_ok(&format!("a: {}1{}", "[".repeat(7), "]".repeat(7))));
        assert!(!depth_ok(&format!(
            "a: {}1{}",
            "[".repeat(8),
            "]".repeat(8)
        )));
        assert!(!depth_ok(&format!("a: {}", "{b: ".repeat(9))));
        assert!(depth_ok(&block(8)));
        assert!(!depth_ok(&block(9)));
        // `- - -` and `? ? ?` nest on one line; sequences under a key nest a level each.
        assert!(depth_ok(&format!("{}x", "- ".repeat(8))));
        assert!(!depth_ok(&format!("{}x", "- ".repeat(9))));
        assert!(!depth_ok(&format!("{}x", "? ".repeat(9))));
        assert!(!depth_ok(&format!("a:\n  - b: {}", "[".repeat(7))));
        assert_eq!(
            check_depth(&format!("x: 1\ny: {}", "[".repeat(300)), MAX_YAML_DEPTH),
            Err(TooDeep {
                line: 2,
                limit: MAX_YAML_DEPTH
            })
        );
    }

    #[test]
    fn balanced_siblings_and_unindented_lines_give_the_depth_back() {
        let siblings = "a: [[[1]]]\n".repeat(100) + &block(7).repeat(50);
        assert!(depth_ok(&siblings));
        assert!(depth_ok(&"- [1, {a: [2]}]\n".repeat(1000)));
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_count() {
        let quiet = "\
a: \"[[[[[[[[[\"\n\
b: '{{{{{{{{{{ it''s [[[[[[['\n\
c: text [[[[[[[[[ with brackets\n\
d: x # [[[[[[[[[[\n\
e: |\n  [[[[[[[[[[\n  {{{{{{{{{{\n\
f: >-\n    [[[[[[[[[[\n\
g: \"multi\n  [[[[[[[[[[ line\"\n\
h: plain\n  [[[[[[[[[[ continued\n\
i: [\"]]]]]]]]]]\", ']]]]]]]]]', a]\n\
";
        assert_eq!(check_depth(quiet, 8), Ok(()));
    }

    #[test]
    fn closers_hidden_in_scalars_do_not_hide_openers() {
        // Each line really opens one level and closes none: `]` is in a quote or comment.
        for hidden in ["[ \"]\",", "[ ']',", "[ #]", "[ !<a]b> x,"] {
            let nested = format!("x: {}", format!("{hidden}\n").repeat(20));
            assert!(!depth_ok(&nested), "{hidden}");
        }
        // A quote inside a plain scalar is text: what follows still counts.
        assert!(!depth_ok(&format!(
            "a: x \"y\nb: {}\nc: z\"",
            "[".repeat(9)
        )));
        // So is a line break the scanner sees that `\n` does not split on.
        assert!(!depth_ok(&format!("a: 1 # c\rb: {}", "[".repeat(9))));
        // Lines less indented than a block scalar's first line end it.
        assert!(!depth_ok(&format!("a: |\n    t\nb: {}", "[".repeat(9))));
    }

    #[test]
    fn real_files_fifty_deep_pass_the_default_limit() {
        let flow = format!("a: {}1{}", "[".repeat(50), "]".repeat(50));
        for text in [block(50), flow, format!("{}x", "- ".repeat(50))] {
            assert_eq!(check_depth(&text, MAX_YAML_DEPTH), Ok(()));
            assert!(serde_norway::from_str::<serde_norway::Value>(&text).is_ok());
        }
    }

    #[test]
    fn documents_start_afresh() {
        let docs = format!("{}\n---\n{}", block(7), block(7));
        assert!(depth_ok(&docs));
    }
}

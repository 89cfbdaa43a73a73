//! Just enough markdown for the checks: fenced code blocks, links and the anchors headings
//! get. Headings are ATX (`## …`) and fences backticks or tildes, as the book writes them.

/// A fenced code block.
pub struct Block {
    /// The fence's info string, e.g. `console` or `yaml`.
    pub info: String,
    /// 1-based line of the first line inside the fence.
    pub first_line: usize,
    pub lines: Vec<String>,
}

impl Block {
    /// The first word of the info string: `yaml` for ```` ```yaml ````.
    pub fn language(&self) -> &str {
        self.info
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()
            .unwrap_or_default()
    }
}

/// A link's target as written: `other.md#anchor`, `#anchor`, `https://…`.
pub struct Link {
    pub line: usize,
    pub target: String,
}

pub struct Page {
    pub blocks: Vec<Block>,
    pub links: Vec<Link>,
    /// The ids mdBook (and GitHub) give the headings, in order.
    pub anchors: Vec<String>,
    /// mdBook `{{#include PATH}}` directives, as written.
    pub includes: Vec<Link>,
}

pub fn parse(text: &str) -> Page {
    let mut page = Page {
        blocks: Vec::new(),
        links: Vec::new(),
        anchors: Vec::new(),
        includes: Vec::new(),
    };
    // The fence that opened the current block: its character and length.
    let mut fence: Option<(char, usize)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if let Some((ch, len)) = fence {
            let closing = trimmed.chars().take_while(|&c| c == ch).count();
            if closing >= len && trimmed[closing..].trim().is_empty() {
                fence = None;
            } else if let Some(block) = page.blocks.last_mut() {
                block.lines.push(line.to_string());
            }
            continue;
        }
        if let Some(ch) = trimmed.chars().next().filter(|c| *c == '`' || *c == '~') {
            let len = trimmed.chars().take_while(|&c| c == ch).count();
            if len >= 3 {
                fence = Some((ch, len));
                page.blocks.push(Block {
                    info: trimmed[len..].trim().to_string(),
                    first_line: number + 1,
                    lines: Vec::new(),
                });
                continue;
            }
        }
        if let Some(heading) = heading(line) {
            let base = anchor(&heading);
            let mut id = base.clone();
            let mut n = 1;
            while page.anchors.contains(&id) {
                id = format!("{base}-{n}");
                n += 1;
            }
            page.anchors.push(id);
        }
        if let Some(rest) = trimmed.strip_prefix("{{#include ") {
            let target = rest.trim_end_matches("}}").trim();
            page.includes.push(Link {
                line: number,
                target: target.to_string(),
            });
        }
        for target in link_targets(line) {
            page.links.push(Link {
                line: number,
                target,
            });
        }
    }
    page
}

/// The text of an ATX heading line.
fn heading(line: &str) -> Option<String> {
    let hashes = line.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
        return None;
    }
    Some(
        line[hashes..]
            .trim()
            .trim_end_matches('#')
            .trim()
            .to_string(),
    )
}

/// The id mdBook gives a heading (GitHub's rule is the same for these pages): the text
/// without markup, lowercase, whitespace to `-`, and everything but letters, digits, `_`
/// and `-` dropped.
pub fn anchor(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link keeps its text only.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.chars()
        .filter_map(|ch| {
            if ch.is_alphanumeric() || ch == '_' || ch == '-' {
                Some(ch.to_ascii_lowercase())
            } else if ch.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The targets of the inline links (`[text](target)`, images too) and of a reference
/// definition (`[label]: target`) on a line, leaving code spans out.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(end) = trimmed.find("]:") {
            if let Some(target) = trimmed[end + 2..].split_whitespace().next() {
                targets.push(target.to_string());
                return targets;
            }
        }
    }
    let outside_code = without_code_spans(line);
    let mut rest = outside_code.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let mut depth = 0;
        let end = after
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map(|(i, _)| i)
            .unwrap_or(after.len());
        // `(target "title")`: the target is the first word.
        if let Some(target) = after[..end].split_whitespace().next() {
            targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        }
        rest = &after[end..];
    }
    targets
}

/// The line with every code span blanked out, so `` `a[0](b)` `` is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch != '`' {
            out.push(ch);
            continue;
        }
        let mut ticks = 1;
        while chars.peek() == Some(&'`') {
            chars.next();
            ticks += 1;
        }
        // Skip to the closing run of the same length; an unclosed run is text.
        let rest: String = chars.clone().collect();
        let closing = "`".repeat(ticks);
        match rest.find(&closing) {
            Some(end) => {
                out.push(' ');
                for _ in 0..rest[..end + ticks].chars().count() {
                    chars.next();
                }
            }
            None => out.push_str(&closing),
        }
    }
    out
}

/// The commands of a shell line, each as the words sh would split it into: quotes removed,
/// `\` escapes honoured, and an expansion (`$VAR`, `${VAR}`, `$(…)`) standing for a value
/// that fits most places: `1` as a whole word (`--source-date-epoch "$(git …)"`), `amd64`
/// inside one (`linux/$ARCH`). A pipe or a list operator (`|`, `&&`, `||`, `;`, `&`) starts the next command, a
/// redirection and its target are left out, and a comment ends the line.
pub fn shell_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    const EXPANSION: char = '\u{0}';
    let end_word = |word: &mut String, in_word: &mut bool, words: &mut Vec<String>| {
        if *in_word {
            let text = std::mem::take(word);
            words.push(if text == EXPANSION.to_string() {
                "1".to_string()
            } else {
                text.replace(EXPANSION, "amd64")
            });
            *in_word = false;
        }
    };
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => word.push(c),
            (_, '$') if matches!(chars.peek(), Some('(') | Some('{')) => {
                let open = chars.next().unwrap_or('(');
                let close = if open == '(' { ')' } else { '}' };
                let mut depth = 1;
                for c in chars.by_ref() {
                    if c == open {
                        depth += 1;
                    } else if c == close {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                }
                word.push(EXPANSION);
                in_word = true;
            }
            (_, '$')
                if chars
                    .peek()
                    .is_some_and(|c| c.is_alphanumeric() || *c == '_') =>
            {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                {
                    chars.next();
                }
                word.push(EXPANSION);
                in_word = true;
            }
            (_, '\\') => {
                if let Some(c) = chars.next() {
                    word.push(c);
                }
                in_word = true;
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => end_word(&mut word, &mut in_word, &mut words),
            (None, '#') if !in_word => break,
            (None, '|' | '&' | ';') => {
                end_word(&mut word, &mut in_word, &mut words);
                while chars.peek().is_some_and(|c| matches!(c, '|' | '&')) {
                    chars.next();
                }
                if !words.is_empty() {
                    commands.push(std::mem::take(&mut words));
                }
            }
            (None, '>' | '<') => {
                // `2>&1`, `> file`, `<<'EOF'`: the file descriptor before it and the target
                // after it are the shell's, not the command's.
                if word.chars().all(|c| c.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                }
                end_word(&mut word, &mut in_word, &mut words);
                while chars.peek().is_some_and(|c| matches!(c, '>' | '<' | '&')) {
                    chars.next();
                }
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                while chars.peek().is_some_and(|c| !c.is_whitespace()) {
                    chars.next();
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut words);
    if !words.is_empty() {
        commands.push(words);
    }
    commands
}

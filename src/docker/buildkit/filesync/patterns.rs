//! Patterns, with moby/patternmatcher's semantics.

use super::*;

#[derive(Clone, Debug)]
pub(super) struct Matcher {
    pub(super) patterns: Vec<Pattern>,
}

#[derive(Clone, Debug)]
pub(super) struct Pattern {
    /// The cleaned pattern without its `!`.
    pub(super) text: String,
    pub(super) exclusion: bool,
    pub(super) kind: Kind,
}

/// patternmatcher's fast paths, and the general case it hands to a regexp.
#[derive(Clone, Debug)]
pub(super) enum Kind {
    Exact,
    /// Ends in `**` with no other wildcard: a plain string prefix.
    Prefix,
    /// Starts with `**` with no other wildcard: a plain string suffix.
    Suffix,
    Tokens(Vec<Token>),
}

#[derive(Clone, Debug)]
pub(super) enum Token {
    Char(char),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `?`: one character other than `/`.
    AnyOne,
    /// `*`: any run of characters other than `/`.
    AnyRun,
    /// `**/` inside a pattern: nothing, or anything ending in `/`.
    DirPrefix,
    /// `**` ending a pattern that has other wildcards: anything.
    Rest,
}

impl Matcher {
    pub(super) fn new(patterns: &[String], kind: &'static str) -> Result<Self, SyncError> {
        let mut compiled = Vec::new();
        for raw in patterns {
            let bad = |reason| SyncError::BadPattern {
                kind,
                pattern: raw.clone(),
                reason,
            };
            let trimmed = raw.trim();
            if trimmed.is_empty() {
                continue;
            }
            let cleaned = go_clean(trimmed);
            let (exclusion, text) = match cleaned.strip_prefix('!') {
                Some("") => return Err(bad("\"!\" alone excludes nothing")),
                Some(rest) => (true, rest.to_string()),
                None => (false, cleaned.clone()),
            };
            let kind = compile(&text).map_err(bad)?;
            compiled.push(Pattern {
                text,
                exclusion,
                kind,
            });
        }
        Ok(Matcher { patterns: compiled })
    }

    /// patternmatcher's MatchesUsingParentResults: whether `path` matches, and per pattern
    /// whether it or a parent matched, for the children's call. The walk always passes the
    /// parent's results below the top level, where paths have no parent to check.
    pub(super) fn matches(&self, path: &str, parent: Option<&[bool]>) -> (bool, Vec<bool>) {
        let mut matched = false;
        let mut info = vec![false; self.patterns.len()];
        for (i, pattern) in self.patterns.iter().enumerate() {
            let mut hit = parent.and_then(|p| p.get(i).copied()).unwrap_or(false);
            if !hit {
                // Only a pattern that can change the outcome is evaluated.
                if pattern.exclusion != matched {
                    continue;
                }
                hit = pattern.matches(path);
            }
            info[i] = hit;
            if hit {
                matched = !pattern.exclusion;
            }
        }
        (matched, info)
    }

    /// patternmatcher's MatchesOrParentMatches: each pattern that can change the outcome is
    /// checked against `path` and, failing that, against each of its parents.
    pub(super) fn matches_or_parent_matches(&self, path: &str) -> bool {
        let parents: Vec<&str> = path
            .match_indices('/')
            .map(|(end, _)| &path[..end])
            .collect();
        let mut matched = false;
        for pattern in &self.patterns {
            if pattern.exclusion != matched {
                continue;
            }
            if pattern.matches(path) || parents.iter().any(|p| pattern.matches(p)) {
                matched = !pattern.exclusion;
            }
        }
        matched
    }

    /// Whether a pattern of this polarity names something below `dir`, so the directory
    /// must be walked even though it does not pass the filter itself.
    pub(super) fn may_match_inside(&self, dir: &str, exclusions: bool) -> bool {
        let dir = format!("{dir}/");
        self.patterns
            .iter()
            .filter(|p| p.exclusion == exclusions)
            .any(|p| format!("{}/", without_trailing_glob(&p.text)).starts_with(&dir))
    }
}

impl Pattern {
    pub(super) fn matches(&self, path: &str) -> bool {
        match &self.kind {
            Kind::Exact => path == self.text,
            Kind::Prefix => path.starts_with(&self.text[..self.text.len() - 2]),
            Kind::Suffix => {
                let suffix = &self.text[2..];
                // `**/foo` also matches `foo` itself.
                path.ends_with(suffix) || suffix.strip_prefix('/') == Some(path)
            }
            Kind::Tokens(tokens) => match_tokens(tokens, path),
        }
    }
}

/// Translates a cleaned pattern as patternmatcher's compile does, including which fast
/// path it takes. Syntax errors are those Go's filepath.Match reports.
fn compile(pattern: &str) -> Result<Kind, &'static str> {
    #[derive(PartialEq)]
    enum Detected {
        Exact,
        Prefix,
        Suffix,
        Tokens,
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut detected = Detected::Exact;
    let mut pos = 0;
    let mut first = true;
    while pos < chars.len() {
        let ch = chars[pos];
        pos += 1;
        match ch {
            '*' if chars.get(pos) == Some(&'*') => {
                pos += 1;
                if chars.get(pos) == Some(&'/') {
                    pos += 1;
                }
                if pos == chars.len() {
                    if detected == Detected::Exact {
                        detected = Detected::Prefix;
                    } else {
                        tokens.push(Token::Rest);
                        detected = Detected::Tokens;
                    }
                } else {
                    tokens.push(Token::DirPrefix);
                    detected = Detected::Tokens;
                }
                if first {
                    detected = Detected::Suffix;
                }
            }
            '*' => {
                tokens.push(Token::AnyRun);
                detected = Detected::Tokens;
            }
            '?' => {
                tokens.push(Token::AnyOne);
                detected = Detected::Tokens;
            }
            '\\' => {
                let escaped = chars.get(pos).ok_or("trailing backslash")?;
                pos += 1;
                tokens.push(Token::Char(*escaped));
                detected = Detected::Tokens;
            }
            '[' => {
                let (class, next) = parse_class(&chars, pos)?;
                pos = next;
                tokens.push(class);
                detected = Detected::Tokens;
            }
            ']' => {
                tokens.push(Token::Char(']'));
                detected = Detected::Tokens;
            }
            other => tokens.push(Token::Char(other)),
        }
        first = false;
    }
    Ok(match detected {
        Detected::Exact => Kind::Exact,
        Detected::Prefix => Kind::Prefix,
        Detected::Suffix => Kind::Suffix,
        Detected::Tokens => Kind::Tokens(tokens),
    })
}

/// A `[...]` class after its `[`, with filepath.Match's grammar: `^` negates, `a-z` ranges,
/// `\` escapes, and an unescaped `-` or `]` where a character belongs is an error.
pub(super) fn parse_class(chars: &[char], mut pos: usize) -> Result<(Token, usize), &'static str> {
    let class_char = |pos: usize| -> Result<(char, usize), &'static str> {
        match chars.get(pos) {
            None => Err("unterminated character class"),
            Some('-' | ']') => Err("bad character class"),
            Some('\\') => chars
                .get(pos + 1)
                .map(|c| (*c, pos + 2))
                .ok_or("unterminated character class"),
            Some(c) => Ok((*c, pos + 1)),
        }
    };
    let negated = chars.get(pos) == Some(&'^');
    if negated {
        pos += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if chars.get(pos) == Some(&']') && !ranges.is_empty() {
            return Ok((Token::Class { negated, ranges }, pos + 1));
        }
        let (lo, next) = class_char(pos)?;
        pos = next;
        let mut hi = lo;
        if chars.get(pos) == Some(&'-') {
            (hi, pos) = class_char(pos + 1)?;
            if hi < lo {
                return Err("bad range in character class");
            }
        }
        ranges.push((lo, hi));
    }
}

/// Whether `tokens` match all of `text`, by tracking every position reachable so far.
pub(super) fn match_tokens(tokens: &[Token], text: &str) -> bool {
    let text: Vec<char> = text.chars().collect();
    let n = text.len();
    let mut states = vec![false; n + 1];
    states[0] = true;
    for token in tokens {
        let mut next = vec![false; n + 1];
        for start in (0..=n).filter(|&j| states[j]) {
            let current = text.get(start).copied();
            match token {
                Token::Char(c) => {
                    if current == Some(*c) {
                        next[start + 1] = true;
                    }
                }
                Token::Class { negated, ranges } => {
                    if let Some(c) = current {
                        let inside = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                        if inside != *negated {
                            next[start + 1] = true;
                        }
                    }
                }
                Token::AnyOne => {
                    if current.is_some_and(|c| c != '/') {
                        next[start + 1] = true;
                    }
                }
                Token::AnyRun => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '/' {
                            break;
                        }
                        next[end + 1] = true;
                    }
                }
                // Go's regexp `.` does not match a newline.
                Token::DirPrefix => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '\n' {
                            break;
                        }
                        if c == '/' {
                            next[end + 1] = true;
                        }
                    }
                }
                Token::Rest => {
                    next[start] = true;
                    for (end, &c) in text.iter().enumerate().skip(start) {
                        if c == '\n' {
                            break;
                        }
                        next[end + 1] = true;
                    }
                }
            }
        }
        states = next;
    }
    states[n]
}

/// Go's filepath.Clean for `/`-separated paths.
pub(super) fn go_clean(path: &str) -> String {
    if path.is_empty() {
        return ".".to_string();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            name => parts.push(name),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".to_string(),
        (false, false) => body,
    }
}

/// Go's filepath.Join of two elements.
pub(super) fn go_join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => String::new(),
        (true, false) => go_clean(b),
        (false, true) => go_clean(a),
        (false, false) => go_clean(&format!("{a}/{b}")),
    }
}

/// Go's filepath.Dir and Base of a cleaned relative path.
pub(super) fn split_dir_base(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or((".", path))
}

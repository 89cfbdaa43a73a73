//! Greedy shrinking of a failing case: drop mutations, entries, Dockerfile lines,
//! ignore lines and options (halves first, then one at a time), and simplify contents,
//! keeping each step that still fails the same way.

use std::time::{Duration, Instant};

use crate::model::{Case, Content, Mutation, Node};

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_string).collect()
}

fn unlines(lines: &[String]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// Chunks of `n` items to drop: halves, quarters, …, single items.
fn chunks(n: usize) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut size = n / 2;
    while size >= 1 {
        let mut start = 0;
        while start < n {
            out.push((start, (start + size).min(n)));
            start += size;
        }
        if size == 1 {
            break;
        }
        size /= 2;
    }
    if n == 1 {
        out.push((0, 1));
    }
    out
}

fn without<T: Clone>(items: &[T], (a, b): (usize, usize)) -> Vec<T> {
    items[..a].iter().chain(&items[b..]).cloned().collect()
}

/// Smaller variants of `case`, most promising first.
fn variants(case: &Case) -> Vec<Case> {
    let mut out = vec![];
    for c in chunks(case.mutations.len()) {
        let mut v = case.clone();
        v.mutations = without(&case.mutations, c);
        out.push(v);
    }
    for c in chunks(case.entries.len()) {
        let mut v = case.clone();
        v.entries = without(&case.entries, c);
        out.push(v);
    }
    let df = lines(&case.dockerfile);
    // Whole stages (FROM to the next FROM), and everything from a FROM on.
    let froms: Vec<usize> = df
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .map(|(i, _)| i)
        .collect();
    for (k, &start) in froms.iter().enumerate() {
        let end = froms.get(k + 1).copied().unwrap_or(df.len());
        for range in [(start, end), (start, df.len())] {
            let mut v = case.clone();
            v.dockerfile = unlines(&without(&df, range));
            out.push(v);
        }
    }
    for c in chunks(df.len()) {
        let mut v = case.clone();
        v.dockerfile = unlines(&without(&df, c));
        out.push(v);
    }
    for specific in [false, true] {
        let text = if specific {
            &case.specific_ignore
        } else {
            &case.ignore
        };
        if let Some(t) = text {
            let mut v = case.clone();
            *(if specific {
                &mut v.specific_ignore
            } else {
                &mut v.ignore
            }) = None;
            out.push(v);
            let ls = lines(t);
            for c in chunks(ls.len()) {
                let mut v = case.clone();
                let new = Some(unlines(&without(&ls, c)));
                if specific {
                    v.specific_ignore = new;
                } else {
                    v.ignore = new;
                }
                out.push(v);
            }
        }
    }
    // Lines of the ignore files that mutations write.
    for (i, m) in case.mutations.iter().enumerate() {
        if let Mutation::SetIgnore {
            specific,
            text: Some(t),
        } = m
        {
            let ls = lines(t);
            for c in chunks(ls.len()) {
                let mut v = case.clone();
                v.mutations[i] = Mutation::SetIgnore {
                    specific: *specific,
                    text: Some(unlines(&without(&ls, c))),
                };
                out.push(v);
            }
        }
    }
    if case.target.is_some() {
        let mut v = case.clone();
        v.target = None;
        out.push(v);
    }
    for k in case.build_args.keys() {
        let mut v = case.clone();
        v.build_args.remove(k);
        out.push(v);
    }
    // Simpler contents: large or long files become one short line.
    for (i, e) in case.entries.iter().enumerate() {
        if let Node::File { content, mode } = &e.node {
            let simple = match content {
                Content::Random { .. } => true,
                Content::Text(t) => t.len() > 8,
                _ => false,
            };
            if simple {
                let mut v = case.clone();
                v.entries[i].node = Node::File {
                    content: Content::Text("x\n".into()),
                    mode: *mode,
                };
                out.push(v);
            }
        }
    }
    for (i, m) in case.mutations.iter().enumerate() {
        if let Mutation::Write { content, .. } = m {
            if !matches!(content, Content::Text(t) if t.len() <= 8) {
                let mut v = case.clone();
                if let Mutation::Write { content, .. } = &mut v.mutations[i] {
                    *content = Content::Text("y\n".into());
                }
                out.push(v);
            }
        }
    }
    out
}

/// Shrinks `case` while `fails` holds, within `budget`. Returns the smallest failing
/// case found and the number of attempts. After a step that still fails, the scan goes on
/// from the same place in the new case's variants; a variant seen before is not run again.
pub fn shrink(
    case: &Case,
    budget: Duration,
    fails: &mut dyn FnMut(&Case) -> bool,
) -> (Case, usize) {
    let started = Instant::now();
    let mut current = case.clone();
    let mut attempts = 0;
    let mut seen = std::collections::HashSet::new();
    seen.insert(serde_json::to_string(&current).unwrap());
    let mut position = 0;
    loop {
        let all = variants(&current);
        let n = all.len();
        let mut progressed = false;
        for k in 0..n {
            let i = (position + k) % n;
            let v = &all[i];
            if !v.has_stage() || !seen.insert(serde_json::to_string(v).unwrap()) {
                continue;
            }
            if started.elapsed() > budget {
                eprintln!(
                    "[differential] shrink budget ({budget:?}) spent after {attempts} attempts"
                );
                return (current, attempts);
            }
            attempts += 1;
            if fails(v) {
                current = v.clone();
                position = i;
                progressed = true;
                break;
            }
        }
        if !progressed {
            return (current, attempts);
        }
    }
}

//! Image names, repositories and tags, as distribution's `reference` grammar spells them.

use super::*;

/// `[a-z0-9][a-z0-9._-]*`: names are typed on the command line and used in file names.
pub(super) fn valid_image_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

/// Distribution's tag grammar `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub(super) fn valid_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// A distribution reference *name* (no tag, no digest); `Err` is the one-line message.
pub(super) fn check_repository(repo: &str) -> std::result::Result<(), String> {
    const EXAMPLE: &str = "e.g. `registry.example.com/team/app` or `127.0.0.1:5000/demo/hello`";
    if repo.trim().is_empty() {
        return Err(format!(
            "is empty; set it to where the image is pushed, {EXAMPLE}"
        ));
    }
    if repo.contains(char::is_whitespace) {
        return Err(format!(
            "{} contains whitespace; remove it, {EXAMPLE}",
            q(repo)
        ));
    }
    if let Some((scheme, rest)) = repo.split_once("://") {
        return Err(format!(
            "{} starts with a URL scheme (`{scheme}://`); write `repository: {}` (TLS or plain HTTP is worked out per registry)",
            q(repo),
            clip(rest)
        ));
    }
    if let Some((name, digest)) = repo.split_once('@') {
        return Err(format!(
            "{} includes a digest (`@{}`); remove it and write `repository: {}` (polyarch pushes by tag, put tags under `tags:`)",
            q(repo),
            clip(digest),
            clip(name)
        ));
    }
    if repo.len() > 255 {
        return Err(format!(
            "is {} characters long; repository names are at most 255, shorten it",
            repo.len()
        ));
    }
    let comps: Vec<&str> = repo.split('/').collect();
    let first_is_domain = |c: &str| c.contains('.') || c.contains(':') || c == "localhost";
    if comps.len() == 1 && repo.contains(':') && check_domain(repo).is_ok() {
        return Err(format!(
            "{} is only a registry host; add the repository path, e.g. `{}/team/app`",
            q(repo),
            clip(repo)
        ));
    }
    let last = comps[comps.len() - 1];
    if let Some((_, tag)) = last.rsplit_once(':') {
        let without = &repo[..repo.len() - tag.len() - 1];
        return Err(format!(
            "{} includes a tag (`:{}`); write `repository: {}` and put the tag under `tags:`",
            q(repo),
            clip(tag),
            clip(without)
        ));
    }
    let path: &[&str] = if comps.len() > 1 && first_is_domain(comps[0]) {
        check_domain(comps[0]).map_err(|m| format!("registry host {} {m}", q(comps[0])))?;
        &comps[1..]
    } else {
        &comps[..]
    };
    if path
        .iter()
        .any(|c| c.chars().any(|ch| ch.is_ascii_uppercase()))
    {
        let lowered: Vec<String> = path.iter().map(|c| c.to_ascii_lowercase()).collect();
        let fixed = if path.len() < comps.len() {
            format!("{}/{}", comps[0], lowered.join("/"))
        } else {
            lowered.join("/")
        };
        return Err(format!(
            "{} has uppercase letters in its path; repository paths are lowercase, write `{}`",
            q(repo),
            clip(&fixed)
        ));
    }
    for c in path {
        check_path_component(c).map_err(|m| format!("{}: {m}", q(repo)))?;
    }
    Ok(())
}

/// `host[:port]`: a DNS name, IPv4 or `[IPv6]`.
fn check_domain(d: &str) -> std::result::Result<(), String> {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("has `[` without `]`; write IPv6 hosts as `[::1]:5000`".into());
        };
        let ip = &rest[..end];
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "has {} which is not an IPv6 address; fix it, e.g. `[::1]:5000`",
                q(ip)
            ));
        }
        let after = &rest[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (None, Some(p)),
            None if after.is_empty() => (None, None),
            None => return Err("has text after `]`; write `[ADDRESS]:PORT`".into()),
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(host) = host {
        let ok_label = |l: &str| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !host.split('.').all(ok_label) {
            return Err(
                "is not a valid host name; use letters, digits, `-` and `.` (e.g. registry.example.com:5000)"
                    .into(),
            );
        }
    }
    if let Some(port) = port {
        if port.is_empty()
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port.parse::<u16>().is_err()
        {
            return Err(format!(
                "has port {} which is not a number from 0 to 65535; fix it, e.g. `localhost:5000`",
                q(port)
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn check_path_component(c: &str) -> std::result::Result<(), String> {
    if c.is_empty() {
        return Err("has an empty path component (`//`, or a leading or trailing `/`); remove the extra `/`".into());
    }
    if let Some(bad) = c.chars().find(|ch| {
        !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-'))
    }) {
        return Err(format!(
            "{} contains {}; repository paths use lowercase letters, digits and the separators `.`, `_`, `__`, `-`",
            q(c),
            q(&bad.to_string())
        ));
    }
    let alnum = |ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit();
    let bad_sep = || {
        format!(
            "{} has a misplaced separator; components start and end with a letter or digit and separate words with one `.`, one `_`, `__`, or dashes",
            q(c)
        )
    };
    let mut sep = String::new();
    let mut seen_alnum = false;
    for ch in c.chars() {
        if alnum(ch) {
            if !sep.is_empty() {
                let ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|s| s == '-');
                if !ok || !seen_alnum {
                    return Err(bad_sep());
                }
                sep.clear();
            }
            seen_alnum = true;
        } else {
            sep.push(ch);
        }
    }
    if !sep.is_empty() || !seen_alnum {
        return Err(bad_sep());
    }
    Ok(())
}

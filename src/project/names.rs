//! Image names, repositories and tags, as distribution's `reference` grammar spells them.

use super::diagnostics::{clip, q};

use crate::base::reference::{
    check_host, is_path_component, normalise, split_host, HostError, MAX_PATH_LENGTH,
};

/// `[a-z0-9][a-z0-9._-]*`: names are typed on the command line and used in file names.
pub(super) fn valid_image_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
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
    let (host, path) = split_host(repo);
    check_length(repo, host, path)?;
    let comps: Vec<&str> = repo.split('/').collect();
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
    if let Some(host) = host {
        check_domain(host).map_err(|m| format!("registry host {} {m}", q(host)))?;
    }
    check_path(repo, host, path)
}

/// The limit is on the path as pushed; only Docker Hub's `library/` makes it longer.
fn check_length(repo: &str, host: Option<&str>, path: &str) -> std::result::Result<(), String> {
    let pushed = normalise(host, path).1;
    if pushed.len() > MAX_PATH_LENGTH && repo.len() > MAX_PATH_LENGTH {
        Err(format!(
            "is {} characters long; repository names are at most 255, shorten it",
            repo.len()
        ))
    } else if pushed.len() > MAX_PATH_LENGTH {
        Err(format!(
            "is {} characters long as Docker Hub's `{}`; repository paths are at most 255, shorten it",
            pushed.len(),
            clip(&pushed)
        ))
    } else {
        Ok(())
    }
}

/// The path's components: lowercase (the fix spelled out) and each in the grammar.
fn check_path(repo: &str, host: Option<&str>, path: &str) -> std::result::Result<(), String> {
    let path: Vec<&str> = path.split('/').collect();
    if path
        .iter()
        .any(|c| c.chars().any(|ch| ch.is_ascii_uppercase()))
    {
        let lowered: Vec<String> = path.iter().map(|c| c.to_ascii_lowercase()).collect();
        let fixed = if let Some(host) = host {
            format!("{host}/{}", lowered.join("/"))
        } else {
            lowered.join("/")
        };
        return Err(format!(
            "{} has uppercase letters in its path; repository paths are lowercase, write `{}`",
            q(repo),
            clip(&fixed)
        ));
    }
    for c in &path {
        check_path_component(c).map_err(|m| format!("{}: {m}", q(repo)))?;
    }
    Ok(())
}

/// `host[:port]`: a DNS name, IPv4 or `[IPv6]`, in the shared grammar's terms.
fn check_domain(d: &str) -> std::result::Result<(), String> {
    check_host(d).map_err(|e| match e {
        HostError::Unclosed => "has `[` without `]`; write IPv6 hosts as `[::1]:5000`".into(),
        HostError::NotIpv6(ip) => format!(
            "has {} which is not an IPv6 address; fix it, e.g. `[::1]:5000`",
            q(ip)
        ),
        HostError::AfterBracket => "has text after `]`; write `[ADDRESS]:PORT`".into(),
        HostError::Name => "is not a valid host name; use letters, digits, `-` and `.` (e.g. registry.example.com:5000)"
            .into(),
        HostError::Port(port) => format!(
            "has port {} which is not a number from 0 to 65535; fix it, e.g. `localhost:5000`",
            q(port)
        ),
    })
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn check_path_component(c: &str) -> std::result::Result<(), String> {
    if is_path_component(c) {
        return Ok(());
    }
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
    Err(format!(
            "{} has a misplaced separator; components start and end with a letter or digit and separate words with one `.`, one `_`, `__`, or dashes",
            q(c)
        ))
}

//! Image references: the grammar and Docker Hub normalisation of distribution's
//! `reference` package, written out once for the whole crate. The registry client parses
//! references with it and the project file judges `repository:` and `tags:` by it, each
//! wording its own messages.

use crate::base::digest::Digest;
use oci_client::Reference;

/// Repository paths (as normalised: `library/` included) are at most this long.
pub const MAX_PATH_LENGTH: usize = 255;

/// A text that is not an image reference: the message quotes it and names the forms
/// accepted. A usage error wherever it surfaces.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReferenceError(String);

/// Parses `[host[:port]/]path[:tag][@digest]` with the grammar and Docker Hub
/// normalisation of distribution's `reference` package. Written out rather than taken
/// from oci-spec, whose regex (Unicode `\w` repeated 128 times) costs ~15 ms to compile in
/// every process; unlike it, bracketed IPv6 hosts are accepted.
pub fn parse_reference(reference: &str) -> Result<Reference, ReferenceError> {
    let invalid = |why: String| {
        ReferenceError(format!(
            "`{reference}` is not an image reference ({why}); use host[:port]/path:tag or host[:port]/path@sha256:…"
        ))
    };
    if reference.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    let last_slash = rest.rfind('/');
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        _ => (rest, None),
    };
    let (host, path) = split_host(name);
    if let Some(host) = host {
        check_host(host).map_err(|why| invalid(format!("registry `{host}` {}", why.brief())))?;
    }
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid(format!(
            "repository path `{path}` has uppercase letters; paths are lowercase"
        )));
    }
    if let Some(component) = path.split('/').find(|c| !is_path_component(c)) {
        return Err(invalid(format!(
            "path component `{component}` is not lowercase letters and digits joined by `.`, `_`, `__` or dashes"
        )));
    }
    if let Some(tag) = tag.filter(|tag| !is_tag(tag)) {
        return Err(invalid(format!(
            "tag `{tag}` is not 1-128 letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)"
        )));
    }
    if let Some(digest) = digest {
        digest
            .parse::<Digest>()
            .map_err(|why| invalid(format!("digest `{digest}` {why}")))?;
    }
    let (registry, path) = normalise(host, path);
    // Checked as normalised, so what parses prints back as something that parses.
    if path.len() > MAX_PATH_LENGTH {
        return Err(invalid(
            "the repository path is longer than 255 characters".into(),
        ));
    }
    let registry = registry.to_string();
    Ok(match (tag, digest) {
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, path, tag.into(), digest.into())
        }
        (Some(tag), None) => Reference::with_tag(registry, path, tag.into()),
        (None, Some(digest)) => Reference::with_digest(registry, path, digest.into()),
        (None, None) => Reference::with_tag(registry, path, "latest".into()),
    })
}

/// A name's registry host, if its first component names one (has a `.` or `:`, is
/// `localhost` or a bracketed address), and the repository path after it.
pub fn split_host(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
        {
            (Some(first), path)
        }
        _ => (None, name),
    }
}

/// Docker Hub's spelling: `docker.io` for no host or `index.docker.io`, and `library/`
/// before a path of one component there.
pub fn normalise<'a>(host: Option<&'a str>, path: &str) -> (&'a str, String) {
    let registry = match host {
        None | Some("index.docker.io") => "docker.io",
        Some(host) => host,
    };
    if registry == "docker.io" && !path.contains('/') {
        (registry, format!("library/{path}"))
    } else {
        (registry, path.to_string())
    }
}

/// What is wrong with a registry host; each caller words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError<'a> {
    /// `[` without `]`.
    Unclosed,
    /// Between the brackets: not an IPv6 address.
    NotIpv6(&'a str),
    /// Something other than `:PORT` after `]`.
    AfterBracket,
    /// Not DNS labels (letters, digits, inner dashes) joined by dots.
    Name,
    /// The port: not a number from 0 to 65535.
    Port(&'a str),
}

impl HostError<'_> {
    /// The registry client's wording.
    fn brief(&self) -> &'static str {
        match self {
            HostError::Unclosed => "has no closing `]`",
            HostError::NotIpv6(_) => "is not an IPv6 address in brackets",
            HostError::AfterBracket => "has text after `]`",
            HostError::Name => "is not a host name",
            HostError::Port(_) => "has a port that is not a number from 0 to 65535",
        }
    }
}

/// `host[:port]`: DNS labels, an IPv4 address or a bracketed IPv6 address; the port a
/// number a socket can use (distribution takes any digits, but such a host is unreachable).
pub fn check_host(host: &str) -> Result<(), HostError<'_>> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (address, after) = rest.split_once(']').ok_or(HostError::Unclosed)?;
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(HostError::NotIpv6(address));
            }
            match after.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None if after.is_empty() => (None, None),
                None => return Err(HostError::AfterBracket),
            }
        }
        None => match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        },
    };
    let label = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.is_some_and(|n| !n.split('.').all(label)) {
        return Err(HostError::Name);
    }
    if let Some(port) = port {
        if !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
            return Err(HostError::Port(port));
        }
    }
    Ok(())
}

/// Lowercase letters and digits, joined by `.`, `_`, `__` or any number of dashes.
pub fn is_path_component(component: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !component.starts_with(alnum) || !component.ends_with(alnum) {
        return false;
    }
    component
        .split(alnum)
        .filter(|separator| !separator.is_empty())
        .all(|separator| {
            matches!(separator, "." | "_" | "__") || separator.chars().all(|c| c == '-')
        })
}

/// `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    tag.len() <= 128
        && chars.next().is_some_and(word)
        && chars.all(|c| word(c) || c == '.' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_distribution_and_oci_spec_parse_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let same = [
            "busybox".to_string(),
            "busybox:1.36".into(),
            "library/busybox".into(),
            "index.docker.io/x/y:z".into(),
            "ghcr.io/o/r/deep/path:v1.2.3-rc_1".into(),
            "127.0.0.1:5000/a/b".into(),
            "localhost/a".into(),
            "localhost:5000/a--b/c__d.e:t".into(),
            "test.com:tag".into(),
            format!("reg.example:443/a@{digest}"),
            format!("reg.example/a:t@{digest}"),
            format!("busybox@{digest}"),
        ];
        for text in &same {
            let ours = parse_reference(text).unwrap();
            let theirs: Reference = text.parse().unwrap();
            assert_eq!(ours.whole(), theirs.whole(), "{text}");
            assert_eq!(ours.registry(), theirs.registry(), "{text}");
            assert_eq!(ours.repository(), theirs.repository(), "{text}");
            assert_eq!(ours.tag(), theirs.tag(), "{text}");
            assert_eq!(ours.digest(), theirs.digest(), "{text}");
        }
        let rejected = [
            "".to_string(),
            "UPPER/x:y".into(),
            "r.io/Upper:y".into(),
            "r.io/a/:t".into(),
            "r.io/-a:t".into(),
            "r.io/a...b:t".into(),
            "r.io/a:.t".into(),
            format!("r.io/a:{}", "t".repeat(129)),
            "r.io/a@sha256:abc".into(),
            format!("r.io/a@sha256:{}", "A".repeat(64)),
            format!("r.io/a@md5:{}", "a".repeat(32)),
            "r.io:port/a:t".into(),
            "r.io:65536/a:t".into(),
            "bad_host.io/a:t".into(),
            "[::1/a:t".into(),
        ];
        for text in &rejected {
            assert!(parse_reference(text).is_err(), "{text} accepted");
        }
        // Found by fuzzing: a 250-character Docker Hub name is 258 with `library/`.
        let long = "a".repeat(250);
        assert!(parse_reference(&long).is_err());
        assert!(parse_reference(&format!("r.io/{long}")).is_ok());
        let v6 = parse_reference("[::1]:5000/a/b:t").unwrap();
        assert_eq!((v6.registry(), v6.repository()), ("[::1]:5000", "a/b"));
    }
}

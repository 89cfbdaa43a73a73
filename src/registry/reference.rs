//! Image references: the grammar and Docker Hub normalisation of distribution's
//! `reference` package, written out once for the whole crate.

use crate::{Error, Result};
use oci_client::Reference;

/// Parses `[host[:port]/]path[:tag][@digest]` with the grammar and Docker Hub
/// normalisation of distribution's `reference` package. Written out rather than taken
/// from oci-spec, whose regex (Unicode `\w` repeated 128 times) costs ~15 ms to compile in
/// every process; unlike it, bracketed IPv6 hosts are accepted.
pub fn parse_reference(reference: &str) -> Result<Reference> {
    let invalid = |why: String| {
        Error::Usage(format!(
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
    let (registry, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
        {
            check_host(first).map_err(|why| invalid(format!("registry `{first}` {why}")))?;
            (first.to_string(), path.to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
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
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if tag.len() > 128
            || !chars.next().is_some_and(word)
            || !chars.all(|c| word(c) || c == '.' || c == '-')
        {
            return Err(invalid(format!(
                "tag `{tag}` is not 1-128 letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)"
            )));
        }
    }
    if let Some(digest) = digest {
        check_digest(digest).map_err(|why| invalid(format!("digest `{digest}` {why}")))?;
    }
    let registry = if registry == "index.docker.io" {
        "docker.io".to_string()
    } else {
        registry
    };
    let path = if registry == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    // Checked as normalised, so what parses prints back as something that parses.
    if path.len() > 255 {
        return Err(invalid(
            "the repository path is longer than 255 characters".into(),
        ));
    }
    Ok(match (tag, digest) {
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, path, tag.into(), digest.into())
        }
        (Some(tag), None) => Reference::with_tag(registry, path, tag.into()),
        (None, Some(digest)) => Reference::with_digest(registry, path, digest.into()),
        (None, None) => Reference::with_tag(registry, path, "latest".into()),
    })
}

/// `host[:port]`: DNS labels, an IPv4 address or a bracketed IPv6 address.
fn check_host(host: &str) -> std::result::Result<(), &'static str> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (address, after) = rest.split_once(']').ok_or("has no closing `]`")?;
            address
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| "is not an IPv6 address in brackets")?;
            if after.is_empty() {
                return Ok(());
            }
            (
                None,
                Some(after.strip_prefix(':').ok_or("has text after `]`")?),
            )
        }
        None => match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        },
    };
    if port.is_some_and(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
        return Err("has a port that is not a number");
    }
    let label = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.is_some_and(|n| !n.split('.').all(label)) {
        return Err("is not a host name");
    }
    Ok(())
}

/// Lowercase letters and digits, joined by `.`, `_`, `__` or any number of dashes.
fn is_path_component(component: &str) -> bool {
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

/// `algorithm:hex`, with the hex length the algorithm requires.
fn check_digest(digest: &str) -> std::result::Result<(), &'static str> {
    let (algorithm, hex) = digest.split_once(':').ok_or("has no `algorithm:`")?;
    if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("is not hexadecimal");
    }
    let length = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err("uses an unsupported algorithm (sha256, sha384 or sha512)"),
    };
    if hex.len() != length {
        return Err("has the wrong length for its algorithm");
    }
    Ok(())
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
            format!("r.io/a@md5:{}", "a".repeat(32)),
            "r.io:port/a:t".into(),
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

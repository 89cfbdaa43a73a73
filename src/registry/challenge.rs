//! A registry's `WWW-Authenticate` challenge, as the probe and the token flow read it.

/// A registry's `WWW-Authenticate: Bearer realm="…",service="…"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Challenge {
    pub realm: String,
    pub service: Option<String>,
}

/// The Bearer challenge in a `WWW-Authenticate` value; None for Basic or anything else.
pub(super) fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let (mut realm, mut service) = (None, None);
    for (key, value) in auth_params(params) {
        match key.to_ascii_lowercase().as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            _ => {}
        }
    }
    Some(Challenge {
        realm: realm?,
        service,
    })
}

/// `key=value` and `key="quoted, value"` pairs separated by commas.
fn auth_params(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, tail) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').unwrap_or(quoted.len());
                (
                    quoted[..end].to_string(),
                    quoted.get(end + 1..).unwrap_or(""),
                )
            }
            None => {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_string(), &after[end..])
            }
        };
        pairs.push((key, value));
        rest = tail.trim_start().trim_start_matches(',');
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_as_registries_write_them() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull,push",error="insufficient_scope""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://auth.docker.io/token");
        assert_eq!(c.service.as_deref(), Some("registry.docker.io"));
        let bare = parse_challenge("bearer realm=http://127.0.0.1:1/token").unwrap();
        assert_eq!(
            (bare.realm.as_str(), bare.service),
            ("http://127.0.0.1:1/token", None)
        );
        assert_eq!(parse_challenge(r#"Basic realm="r""#), None);
        assert_eq!(parse_challenge(r#"Bearer service="s""#), None);
    }
}

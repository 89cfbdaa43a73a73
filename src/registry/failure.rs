//! How a failed registry call is classified (retried or not) and worded.

use super::probe::certs_d_root;
use super::{ClientError, RegistryError};
use crate::base::text::one_line;
use oci_client::errors::OciDistributionError;
use oci_client::Reference;
use std::time::Duration;

/// How a failed call should be treated.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Failure {
    /// Retry after at least this long (429 `Retry-After`, default 1 s).
    Transient(Duration),
    /// The certificate chain is not trusted: no retry, a TLS fix.
    Tls,
    Permanent,
    /// The body went past this many bytes: a retry would read as much again.
    TooLarge(usize),
    /// No complete answer within the request's deadline: a server that silent or that slow
    /// would only multiply the wait if asked again.
    TimedOut(Duration),
}

pub(super) fn digest_mismatch(
    reference: &Reference,
    expected: &str,
    computed: &str,
) -> ClientError {
    ClientError::registry(
        reference.registry(),
        RegistryError::DigestMismatch {
            reference: reference.to_string(),
            expected: expected.to_string(),
            computed: computed.to_string(),
        },
    )
}

/// The error and its sources, on one line.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    strip_urls(&one_line(&text))
}

/// URLs in error text lose any `user:pass@` and query string (upload state, tokens).
pub(super) fn strip_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | ',' | '"' | '\''))
            .unwrap_or(rest.len());
        let url = &rest[..end];
        let url = match url.find('/') {
            Some(slash) => match url[..slash].rfind('@') {
                Some(a) => &url[a + 1..],
                None => url,
            },
            None => url.rsplit('@').next().unwrap_or(url),
        };
        out.push_str(url.split('?').next().unwrap_or(url));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

pub(super) fn status_of(error: &OciDistributionError) -> Option<u16> {
    match error {
        OciDistributionError::RequestError(e) => e.status().map(|s| s.as_u16()),
        OciDistributionError::ServerError { code, .. } => Some(*code),
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => Some(401),
        OciDistributionError::RegistryError { envelope, .. } => {
            let text = envelope.to_string().to_ascii_uppercase();
            if text.contains("TOOMANYREQUESTS") {
                Some(429)
            } else if text.contains("UNAUTHORIZED") {
                Some(401)
            } else if text.contains("DENIED") {
                Some(403)
            } else {
                Some(400)
            }
        }
        _ => None,
    }
}

/// 5xx, 429 and transport failures (resets, timeouts, refused connections) are
/// transient; 4xx answers, certificate problems and local errors are not.
pub(super) fn classify(error: &OciDistributionError) -> Failure {
    if let Some(code) = status_of(error) {
        return match code {
            // oci-client does not expose response headers, so Retry-After cannot be read;
            // wait at least its common value.
            429 => Failure::Transient(Duration::from_secs(1)),
            500..=599 => Failure::Transient(Duration::ZERO),
            _ => Failure::Permanent,
        };
    }
    match error {
        OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => {
            let text = chain(error).to_ascii_lowercase();
            if text.contains("certificate") || text.contains("unknownissuer") {
                Failure::Tls
            } else {
                Failure::Transient(Duration::ZERO)
            }
        }
        _ => Failure::Permanent,
    }
}

/// One failed attempt of a call, as much as retrying and wording it need.
#[derive(Debug)]
pub(super) struct Attempt {
    pub status: Option<u16>,
    pub failure: Failure,
    pub detail: String,
    /// What failed, kept as the registry error's source (None: a reply that is well
    /// formed HTTP but not what was asked for).
    pub cause: Option<OciDistributionError>,
}

impl From<OciDistributionError> for Attempt {
    fn from(error: OciDistributionError) -> Self {
        Attempt {
            status: status_of(&error),
            failure: classify(&error),
            detail: chain(&error),
            cause: Some(error),
        }
    }
}

impl From<reqwest::Error> for Attempt {
    fn from(error: reqwest::Error) -> Self {
        Attempt::from(OciDistributionError::RequestError(error))
    }
}

impl Attempt {
    /// No complete answer within `deadline`.
    pub fn timed_out(deadline: Duration) -> Self {
        Attempt {
            status: None,
            failure: Failure::TimedOut(deadline),
            detail: String::new(),
            cause: None,
        }
    }

    /// An answer of `status` whose body went past `limit` bytes.
    pub fn too_large(status: u16, limit: usize) -> Self {
        Attempt {
            status: Some(status),
            failure: Failure::TooLarge(limit),
            detail: format!(
                "the answer is larger than {}",
                crate::base::text::size(limit)
            ),
            cause: None,
        }
    }

    /// An HTTP answer of `status` that is not what was asked for.
    pub fn answered(status: u16, url: &str, detail: String) -> Self {
        Attempt::from(OciDistributionError::ServerError {
            code: status,
            url: url.to_string(),
            message: detail,
        })
    }
}

pub(super) fn registry_error(
    reference: &Reference,
    what: &str,
    attempt: Attempt,
    attempts: u32,
) -> ClientError {
    let registry = reference.registry().to_string();
    let Attempt {
        status,
        failure,
        detail,
        cause: source,
    } = attempt;
    let (what, reference) = (what.to_string(), reference.to_string());
    let kind = if let Failure::TooLarge(limit) = failure {
        RegistryError::TooLarge {
            what,
            reference,
            limit,
        }
    } else if let Failure::TimedOut(deadline) = failure {
        RegistryError::TimedOut {
            what,
            reference,
            deadline,
        }
    } else if matches!(status, Some(401)) {
        RegistryError::Unauthorized {
            what,
            reference,
            registry: registry.clone(),
            source,
        }
    } else if matches!(status, Some(403)) {
        RegistryError::Denied {
            what,
            reference,
            registry: registry.clone(),
            source,
        }
    } else if failure == Failure::Tls {
        RegistryError::Untrusted {
            what,
            reference,
            ca_path: certs_d_root().join(&registry).join("ca.crt"),
            registry: registry.clone(),
            detail,
            source,
        }
    } else if matches!(failure, Failure::Transient(_)) {
        RegistryError::Unavailable {
            what,
            reference,
            attempts,
            answered: status.is_some(),
            detail,
            source,
        }
    } else {
        RegistryError::Refused {
            what,
            reference,
            detail,
            source,
        }
    };
    ClientError::registry(registry, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_urls_lose_credentials_and_queries() {
        assert_eq!(
            strip_urls("url (http://u:p@h:1/v2/x?_state=abc&digest=d), code: 500"),
            "url (http://h:1/v2/x), code: 500"
        );
    }

    fn reference() -> Reference {
        "r.io/a/b:v1".parse().unwrap()
    }

    #[test]
    fn a_failed_call_is_typed_by_what_the_registry_answered() {
        let denied = registry_error(
            &reference(),
            "read manifest",
            Attempt::answered(403, "https://r.io/v2/", "no".into()),
            1,
        );
        assert_eq!(
            denied.to_string(),
            "registry r.io: 403 denied: cannot read manifest for r.io/a/b:v1: the credentials for r.io lack permission for this repository"
        );
        let ClientError::Registry { source, .. } = &denied else {
            panic!("{denied:?}");
        };
        assert!(matches!(**source, RegistryError::Denied { .. }));

        let failing = registry_error(
            &reference(),
            "push blob",
            Attempt::answered(503, "https://r.io/v2/", "down".into()),
            3,
        );
        let ClientError::Registry { source, .. } = &failing else {
            panic!("{failing:?}");
        };
        assert!(matches!(
            **source,
            RegistryError::Unavailable {
                attempts: 3,
                answered: true,
                ..
            }
        ));
        let text = failing.to_string();
        assert!(
            text.starts_with("registry r.io: cannot push blob for r.io/a/b:v1 after 3 attempts: "),
            "{text}"
        );
        assert!(
            text.ends_with("; the registry keeps failing, try again later"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_call_keeps_the_client_error_as_its_source() {
        use std::error::Error as _;
        let error = registry_error(
            &reference(),
            "read manifest",
            Attempt::answered(401, "https://r.io/v2/", String::new()),
            1,
        );
        let kind = error.source().unwrap();
        let client = kind.source().unwrap();
        assert!(matches!(
            client.downcast_ref::<OciDistributionError>(),
            Some(OciDistributionError::ServerError { code: 401, .. })
        ));
        // A reply that is no client error has no source, only its detail.
        let no_token = Attempt {
            status: Some(200),
            failure: Failure::Permanent,
            detail: "the token server answered no token".into(),
            cause: None,
        };
        let error = registry_error(&reference(), "authenticate", no_token, 1);
        assert_eq!(
            error.to_string(),
            "registry r.io: cannot authenticate for r.io/a/b:v1: the token server answered no token"
        );
        assert!(error.source().unwrap().source().is_none());
    }

    #[test]
    fn limits_passed_are_their_own_kinds() {
        let large = registry_error(
            &reference(),
            "authenticate",
            Attempt::too_large(200, 1 << 20),
            1,
        );
        assert_eq!(
            large.to_string(),
            "registry r.io: cannot authenticate for r.io/a/b:v1: the answer is larger than 1 MiB; refusing to read more"
        );
        let ClientError::Registry { source, .. } = &large else {
            panic!("{large:?}");
        };
        assert!(matches!(**source, RegistryError::TooLarge { limit, .. } if limit == 1 << 20));
        let late = Attempt::timed_out(Duration::from_secs(60));
        let late = registry_error(&reference(), "read manifest", late, 1);
        let ClientError::Registry { source, .. } = &late else {
            panic!("{late:?}");
        };
        assert!(matches!(
            **source,
            RegistryError::TimedOut { deadline, .. } if deadline == Duration::from_secs(60)
        ));
        assert!(
            late.to_string().contains("no complete answer within 1m;"),
            "{late}"
        );
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "http://h/v2/".into(),
            message: String::new(),
        };
        assert_eq!(classify(&server(503)), Failure::Transient(Duration::ZERO));
        assert_eq!(
            classify(&server(429)),
            Failure::Transient(Duration::from_secs(1))
        );
        for code in [400, 401, 403, 404] {
            assert_eq!(classify(&server(code)), Failure::Permanent, "{code}");
        }
    }
}

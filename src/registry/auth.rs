//! Bearer tokens as Docker's token spec has them. A token server round trip costs 100 ms
//! or more on a real network, so a run holds one token per registry for its whole
//! repository set (every scope in one request, as buildx and containerd ask), shared by
//! all calls, and fetches again only on expiry or when a call needs a scope it lacks.

use super::body::{error_text, read_limited, MAX_TOKEN_ANSWER};
use super::challenge::{parse_challenge, Challenge};
use super::failure::{registry_error, Attempt, Failure};
use super::probe::{has_port, is_loopback};
use super::{ClientError, Registry, RegistryError, Result, Scheme};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Repositories and whether each is pushed to (push implies pull).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Scopes(BTreeMap<String, bool>);

impl Scopes {
    pub fn add(&mut self, repository: &str, push: bool) {
        *self.0.entry(repository.to_string()).or_insert(push) |= push;
    }

    pub fn covers(&self, repository: &str, push: bool) -> bool {
        self.0
            .get(repository)
            .is_some_and(|&pushed| pushed || !push)
    }

    /// One `scope` parameter per repository, as the token spec spells them.
    pub fn parameters(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(repository, push)| {
                let actions = if *push { "pull,push" } else { "pull" };
                format!("repository:{repository}:{actions}")
            })
            .collect()
    }
}

/// A token server's answer (`token`, or OAuth's `access_token`).
#[derive(Debug, Deserialize)]
pub(super) struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

impl TokenAnswer {
    pub fn token(self) -> Option<(String, Option<u64>)> {
        let token = self.token.or(self.access_token)?;
        Some((token, self.expires_in))
    }
}

/// The token spec's default lifetime when the answer names none.
const DEFAULT_LIFETIME: u64 = 60;

#[derive(Debug)]
struct Granted {
    token: String,
    scopes: Scopes,
    /// A little before it expires, so no request carries a token that lapses in flight.
    renew_at: Instant,
}

/// One registry's token and the scopes the run wants.
#[derive(Debug, Default)]
pub(super) struct Tokens {
    wanted: Scopes,
    granted: Option<Granted>,
}

impl Tokens {
    /// Declares a repository the run will use, so the next fetch asks for it too.
    pub fn want(&mut self, repository: &str, push: bool) {
        self.wanted.add(repository, push);
    }

    /// The token held, when it covers `repository` (`push`) and is not about to expire.
    pub fn current(&self, repository: &str, push: bool, now: Instant) -> Option<String> {
        self.granted
            .as_ref()
            .filter(|g| now < g.renew_at && g.scopes.covers(repository, push))
            .map(|g| g.token.clone())
    }

    /// What the next fetch asks for: every wanted scope and this one.
    pub fn ask_with(&mut self, repository: &str, push: bool) -> Scopes {
        self.want(repository, push);
        self.wanted.clone()
    }

    pub fn store(&mut self, token: String, asked: Scopes, expires_in: Option<u64>, now: Instant) {
        let lifetime = Duration::from_secs(expires_in.unwrap_or(DEFAULT_LIFETIME).max(1));
        self.granted = Some(Granted {
            token,
            scopes: asked,
            renew_at: now + lifetime.mul_f64(0.9),
        });
    }

    /// A request with `token` was refused: the next call fetches a new one, unless a
    /// concurrent call already replaced it.
    pub fn reject(&mut self, token: &str) {
        if self.granted.as_ref().is_some_and(|g| g.token == token) {
            self.granted = None;
        }
    }
}

impl Registry {
    /// The token realm of the reference's registry, asked once: from its plain `/v2/`
    /// answer when there was one, else by `GET /v2/`. None for registries without one, and
    /// for identity tokens (and the empty bearer), which are presented as they are.
    pub(super) async fn challenge(&self, reference: &Reference) -> Option<Challenge> {
        let host = reference.registry();
        let cell = self
            .challenges
            .lock()
            .expect("challenge lock")
            .entry(host.to_string())
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            if !matches!(
                self.auth_for(host),
                Ok(RegistryAuth::Anonymous | RegistryAuth::Basic(..))
            ) {
                return None;
            }
            // With a port, the scheme probe already heard the registry's challenge.
            if self.plain_capable.contains(host) && has_port(reference.resolve_registry()) {
                if let Scheme::Plain { bearer, .. } = self.scheme(host, reference).await {
                    return bearer;
                }
            }
            let (base, client) = self.base(reference).await;
            let asked = client.get(format!("{base}/v2/")).send();
            let answer = tokio::time::timeout(self.deadline, asked)
                .await
                .ok()?
                .ok()?;
            let header = answer.headers().get(reqwest::header::WWW_AUTHENTICATE)?;
            parse_challenge(header.to_str().ok()?)
        })
        .await
        .clone()
    }

    pub(super) fn token_state(&self, registry: &str) -> Arc<tokio::sync::Mutex<Tokens>> {
        self.tokens
            .lock()
            .expect("token lock")
            .entry(registry.to_string())
            .or_default()
            .clone()
    }

    /// Declares a repository the run will use (`push`: and push to), before any call, so
    /// the registry's one token is asked for all of them at once.
    pub async fn declare(&self, reference: &Reference, push: bool) {
        let state = self.token_state(reference.registry());
        state.lock().await.want(reference.repository(), push);
    }

    /// The run's token for the reference's registry, covering its repository (`push`: for
    /// pushing too): the one held, or one fetched for every scope the run wants. Calls
    /// wait for each other here, so concurrent ones share one fetch.
    pub(super) async fn token(
        &self,
        reference: &Reference,
        challenge: &Challenge,
        push: bool,
    ) -> Result<String> {
        let state = self.token_state(reference.registry());
        let mut tokens = state.lock().await;
        if let Some(token) = tokens.current(reference.repository(), push, Instant::now()) {
            return Ok(token);
        }
        self.refuse_downgrade(reference, challenge).await?;
        let asked = tokens.ask_with(reference.repository(), push);
        let credentials = match self.auth_for(reference.registry())? {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        };
        let fetched = self
            .retrying(reference.registry(), self.deadline, || {
                self.fetch_token(challenge, &asked, credentials.as_ref())
            })
            .await;
        let (token, expires_in) =
            fetched.map_err(|(failed, n)| registry_error(reference, "authenticate", failed, n))?;
        tokens.store(token.clone(), asked, expires_in, Instant::now());
        Ok(token)
    }

    /// A registry reached over TLS that names a plain-HTTP realm would have credentials
    /// and tokens cross the network in the clear: refused, unless the realm's host is one
    /// trusted over plain HTTP anyway (loopback, `--insecure-registry`).
    async fn refuse_downgrade(&self, reference: &Reference, challenge: &Challenge) -> Result<()> {
        let plain = challenge.realm.get(..7);
        let Some(host) = plain
            .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
            .map(|_| authority(&challenge.realm[7..]))
        else {
            return Ok(());
        };
        let (base, _) = self.base(reference).await;
        if !base.starts_with("https://") || self.trusts_plain(host) {
            return Ok(());
        }
        Err(ClientError::registry(
            reference.registry(),
            RegistryError::PlainRealm {
                reference: reference.to_string(),
                realm: challenge.realm.clone(),
                host: host.to_string(),
            },
        ))
    }

    /// Whether `host` (`host[:port]`) is spoken to without TLS checks anyway: loopback, or
    /// named by `--insecure-registry` (with its port, or without one).
    fn trusts_plain(&self, host: &str) -> bool {
        let name = match host.rsplit_once(':') {
            Some((name, _)) if has_port(host) => name,
            _ => host,
        };
        is_loopback(host) || self.insecure.contains(host) || self.insecure.contains(name)
    }

    /// One `GET realm?service=…&scope=…&scope=…`, as Docker's token spec has it.
    pub(super) async fn fetch_token(
        &self,
        challenge: &Challenge,
        scopes: &Scopes,
        credentials: Option<&(String, String)>,
    ) -> std::result::Result<(String, Option<u64>), Attempt> {
        let mut query: Vec<(&str, String)> = scopes
            .parameters()
            .into_iter()
            .map(|scope| ("scope", scope))
            .collect();
        if let Some(service) = &challenge.service {
            query.push(("service", service.clone()));
        }
        // A realm on an `--insecure-registry` host is trusted as that registry is.
        let realm_host = challenge
            .realm
            .split_once("://")
            .map(|(_, rest)| authority(rest));
        let verified = !realm_host.is_some_and(|host| self.insecure.contains(host));
        let mut request = self
            .clients
            .http(verified)
            .get(&challenge.realm)
            .query(&query);
        if let Some((user, password)) = credentials {
            request = request.basic_auth(user, Some(password));
        }
        let answer = request.send().await?;
        let status = answer.status().as_u16();
        if !(200..300).contains(&status) {
            let text = error_text(answer).await;
            return Err(Attempt::answered(status, &challenge.realm, text));
        }
        let body = read_limited(answer, MAX_TOKEN_ANSWER).await?;
        serde_json::from_slice::<TokenAnswer>(&body)
            .ok()
            .and_then(TokenAnswer::token)
            .ok_or_else(|| Attempt {
                status: Some(status),
                failure: Failure::Permanent,
                detail: format!("the token server {} answered no token", challenge.realm),
                cause: None,
            })
    }
}

/// `host[:port]` of a URL without its scheme: up to the path, query or user info.
fn authority(rest: &str) -> &str {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_union_and_push_implies_pull() {
        let mut s = Scopes::default();
        s.add("b", false);
        s.add("a", true);
        s.add("b", true);
        s.add("a", false);
        assert_eq!(
            s.parameters(),
            ["repository:a:pull,push", "repository:b:pull,push"]
        );
        assert!(s.covers("a", false) && s.covers("a", true) && !s.covers("c", false));
    }

    #[test]
    fn one_token_serves_every_declared_repository_until_it_expires() {
        let now = Instant::now();
        let mut tokens = Tokens::default();
        tokens.want("a", true);
        tokens.want("b", true);
        assert_eq!(tokens.current("a", true, now), None);
        let asked = tokens.ask_with("a", true);
        assert_eq!(asked.parameters().len(), 2);
        tokens.store("t1".into(), asked, Some(300), now);
        for repo in ["a", "b"] {
            assert_eq!(tokens.current(repo, true, now).as_deref(), Some("t1"));
            assert_eq!(tokens.current(repo, false, now).as_deref(), Some("t1"));
        }
        // Renewed a little before `expires_in`, and after the default 60 s without one.
        assert!(tokens
            .current("a", true, now + Duration::from_secs(269))
            .is_some());
        assert_eq!(
            tokens.current("a", true, now + Duration::from_secs(271)),
            None
        );
        tokens.store("t2".into(), tokens.wanted.clone(), None, now);
        assert_eq!(
            tokens.current("a", true, now + Duration::from_secs(55)),
            None
        );
    }

    #[test]
    fn a_new_scope_or_a_refusal_fetches_again_with_the_union() {
        let now = Instant::now();
        let mut tokens = Tokens::default();
        let asked = tokens.ask_with("a", true);
        tokens.store("t1".into(), asked, Some(300), now);
        // A mount source or an undeclared repository: not covered, asked with the rest.
        assert_eq!(tokens.current("src", false, now), None);
        let asked = tokens.ask_with("src", false);
        assert_eq!(
            asked.parameters(),
            ["repository:a:pull,push", "repository:src:pull"]
        );
        tokens.store("t2".into(), asked, Some(300), now);
        // A stale refusal does not drop the newer token; a refusal of the current one does.
        tokens.reject("t1");
        assert_eq!(tokens.current("a", true, now).as_deref(), Some("t2"));
        tokens.reject("t2");
        assert_eq!(tokens.current("a", true, now), None);
        assert_eq!(tokens.ask_with("a", true).parameters().len(), 2);
    }

    #[test]
    fn plain_realms_are_trusted_on_loopback_and_insecure_hosts_only() {
        assert_eq!(authority("h.example:5001/token?x=1"), "h.example:5001");
        assert_eq!(authority("user:pw@h.example/token"), "h.example");
        let options = super::super::RegistryOptions {
            insecure: vec!["auth.example:8080".into(), "bare.example".into()],
            ..Default::default()
        };
        let registry = Registry::new(&[], &options).unwrap();
        for host in [
            "127.0.0.1:9",
            "localhost",
            "auth.example:8080",
            "bare.example:81",
        ] {
            assert!(registry.trusts_plain(host), "{host}");
        }
        for host in [
            "auth.example",
            "auth.example:80",
            "evil.example",
            "10.0.0.1:5000",
        ] {
            assert!(!registry.trusts_plain(host), "{host}");
        }
    }

    #[test]
    fn answers_give_token_or_access_token() {
        let a: TokenAnswer =
            serde_json::from_str(r#"{"access_token":"x","expires_in":5}"#).unwrap();
        assert_eq!(a.token(), Some(("x".into(), Some(5))));
        let b: TokenAnswer = serde_json::from_str(r#"{"token":"y"}"#).unwrap();
        assert_eq!(b.token(), Some(("y".into(), None)));
        let none: TokenAnswer = serde_json::from_str("{}").unwrap();
        assert_eq!(none.token(), None);
    }
}

//! Build secrets (`RUN --mount=type=secret,id=…`): where each one comes from, a check
//! that it can be read before any build starts, and the session's
//! `moby.buildkit.secrets.v1.Secrets` service, which reads a value only when BuildKit asks
//! for it. Values are never logged, stored, hashed or kept after the answer.

use bollard_buildkit_proto::moby::buildkit::secrets::v1::secrets_server::Secrets;
use bollard_buildkit_proto::moby::buildkit::secrets::v1::{GetSecretRequest, GetSecretResponse};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tonic::{Request, Response, Status};

/// BuildKit refuses larger secrets (`secretsprovider.MaxSecretSize`).
pub const MAX_SECRET_BYTES: u64 = 500 * 1024;

/// Where a secret's value is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// A file's content.
    File(PathBuf),
    /// An environment variable of this process, by name.
    Env(String),
}

/// Why a secret cannot be read. Messages name the file or variable and the fix, never
/// the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} is not set; export it before running polyarch, or read the secret from a file instead")]
    EnvUnset(String),
    #[error("{} does not exist; create it or fix the path", .0.display())]
    Missing(PathBuf),
    #[error("{} is not a regular file; point it at the file holding the secret", .0.display())]
    NotAFile(PathBuf),
    #[error("cannot read {} ({source}); fix its permissions or the path", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is {size} bytes; BuildKit takes secrets of at most 500 KiB", path.display())]
    TooBig { path: PathBuf, size: u64 },
    #[error(
        "environment variable {name} holds {size} bytes; BuildKit takes secrets of at most 500 KiB"
    )]
    EnvTooBig { name: String, size: u64 },
}

impl SecretSource {
    /// Checks that the secret can be read now (without keeping its value), so a missing
    /// one fails before any build.
    pub fn check(&self) -> Result<(), SecretError> {
        match self {
            SecretSource::Env(name) => env_value(name).map(drop),
            SecretSource::File(path) => {
                let meta = std::fs::metadata(path).map_err(|e| file_error(path, e))?;
                if !meta.is_file() {
                    return Err(SecretError::NotAFile(path.clone()));
                }
                if meta.len() > MAX_SECRET_BYTES {
                    return Err(SecretError::TooBig {
                        path: path.clone(),
                        size: meta.len(),
                    });
                }
                // Opening proves the permissions; nothing is read.
                std::fs::File::open(path)
                    .map(drop)
                    .map_err(|e| file_error(path, e))
            }
        }
    }

    /// The value, read now.
    pub fn read(&self) -> Result<Vec<u8>, SecretError> {
        match self {
            SecretSource::Env(name) => env_value(name),
            SecretSource::File(path) => {
                self.check()?;
                std::fs::read(path).map_err(|e| file_error(path, e))
            }
        }
    }
}

fn env_value(name: &str) -> Result<Vec<u8>, SecretError> {
    use std::os::unix::ffi::OsStringExt;
    let value = std::env::var_os(name)
        .ok_or_else(|| SecretError::EnvUnset(name.to_string()))?
        .into_vec();
    if value.len() as u64 > MAX_SECRET_BYTES {
        return Err(SecretError::EnvTooBig {
            name: name.to_string(),
            size: value.len() as u64,
        });
    }
    Ok(value)
}

fn file_error(path: &Path, source: std::io::Error) -> SecretError {
    if source.kind() == std::io::ErrorKind::NotFound {
        SecretError::Missing(path.to_path_buf())
    } else {
        SecretError::Unreadable {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether `id` can name a secret or an SSH agent both in polyarch.yaml and on the
/// command line (`id=…` fields are separated by `,` and `=`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && !id
            .chars()
            .any(|c| c == ',' || c == '=' || c.is_whitespace() || c.is_control())
}

/// `--secret` as buildx spells it: comma-separated `id=ID`, `src=PATH` (or `source=`),
/// `env=NAME` and `type=file|env`. With neither `src` nor `env`, buildx reads the
/// environment variable named ID when it is set, else the file named ID; so does this.
/// Relative paths are relative to `cwd`. The error is the fix, for clap to show.
pub fn parse_flag(text: &str, cwd: &Path) -> Result<(String, SecretSource), String> {
    let (mut id, mut src, mut env, mut kind) = (None, None, None, None);
    for field in text.split(',') {
        let Some((key, value)) = field.split_once('=') else {
            return Err(format!(
                "`{field}` is not key=value; write id=ID,env=NAME or id=ID,src=PATH"
            ));
        };
        match key.to_ascii_lowercase().as_str() {
            "id" => id = Some(value),
            "src" | "source" => src = Some(value),
            "env" => env = Some(value),
            "type" if value == "file" || value == "env" => kind = Some(value),
            "type" => return Err(format!("type `{value}` is not file or env")),
            _ => {
                return Err(format!(
                    "unknown key `{key}`; use id, src (or source), env and type"
                ))
            }
        }
    }
    let id = id.ok_or("no id; write id=ID,env=NAME or id=ID,src=PATH")?;
    if !valid_id(id) {
        return Err(format!(
            "id `{id}` is not a secret id; use a name without `,`, `=` or spaces"
        ));
    }
    // `type=env,src=NAME` names a variable, as in buildx.
    let (src, env) = match (kind, src, env) {
        (Some("env"), Some(name), None) => (None, Some(name)),
        other => (other.1, other.2),
    };
    let source = match (src, env) {
        (Some(_), Some(_)) => {
            return Err("both src and env given; a secret comes from one of them".into())
        }
        (Some(""), None) | (None, Some("")) => return Err("empty src or env".into()),
        (Some(path), None) => SecretSource::File(cwd.join(path)),
        (None, Some(name)) => SecretSource::Env(name.to_string()),
        (None, None) if std::env::var_os(id).is_some() => SecretSource::Env(id.to_string()),
        (None, None) => SecretSource::File(cwd.join(id)),
    };
    Ok((id.to_string(), source))
}

/// The secrets one build may read, served to BuildKit by id.
#[derive(Debug, Default, Clone)]
pub struct SecretStore {
    sources: BTreeMap<String, SecretSource>,
}

impl SecretStore {
    pub fn new(sources: BTreeMap<String, SecretSource>) -> SecretStore {
        SecretStore { sources }
    }
}

#[tonic::async_trait]
impl Secrets for SecretStore {
    async fn get_secret(
        &self,
        request: Request<GetSecretRequest>,
    ) -> Result<Response<GetSecretResponse>, Status> {
        let id = request.into_inner().id;
        // NotFound makes BuildKit say "secret ID: not found" (or skip an optional mount),
        // as with buildx.
        let source = self
            .sources
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("secret {id} not found")))?;
        let data = source
            .read()
            .map_err(|e| Status::failed_precondition(format!("secret {id}: {e}")))?;
        Ok(Response::new(GetSecretResponse { data }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_buildx_spellings() {
        let cwd = Path::new("/work");
        assert_eq!(
            parse_flag("id=token,env=API_TOKEN", cwd),
            Ok(("token".into(), SecretSource::Env("API_TOKEN".into())))
        );
        assert_eq!(
            parse_flag("id=npmrc,src=conf/npmrc", cwd),
            Ok((
                "npmrc".into(),
                SecretSource::File("/work/conf/npmrc".into())
            ))
        );
        assert_eq!(
            parse_flag("type=file,id=a,source=/etc/a", cwd),
            Ok(("a".into(), SecretSource::File("/etc/a".into())))
        );
        assert_eq!(
            parse_flag("type=env,id=a,src=A_VAR", cwd),
            Ok(("a".into(), SecretSource::Env("A_VAR".into())))
        );
        assert_eq!(
            parse_flag("id=polyarch-no-such-variable", cwd),
            Ok((
                "polyarch-no-such-variable".into(),
                SecretSource::File("/work/polyarch-no-such-variable".into())
            ))
        );
        for bad in [
            "env=A",
            "id=a,src=x,env=A",
            "id=a,colour=red",
            "id=a,type=ssh",
            "id=,env=A",
            "id=a,env=",
            "token",
        ] {
            assert!(parse_flag(bad, cwd).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_file_secret_is_checked_without_keeping_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let missing = SecretSource::File(file.clone());
        assert!(matches!(missing.check(), Err(SecretError::Missing(_))));
        std::fs::write(&file, "s3cr3t").unwrap();
        missing.check().unwrap();
        assert_eq!(missing.read().unwrap(), b"s3cr3t");
        let dir_source = SecretSource::File(dir.path().to_path_buf());
        assert!(matches!(dir_source.check(), Err(SecretError::NotAFile(_))));
        std::fs::write(&file, vec![b'x'; MAX_SECRET_BYTES as usize + 1]).unwrap();
        let error = missing.check().unwrap_err().to_string();
        assert!(error.contains("500 KiB"), "{error}");
        assert!(!error.contains("xxx"), "{error}");
    }

    #[tokio::test]
    async fn an_unknown_id_is_not_found() {
        let store = SecretStore::new(BTreeMap::from([(
            "token".to_string(),
            SecretSource::Env("PATH".into()),
        )]));
        let ask = |id: &str| {
            Request::new(GetSecretRequest {
                id: id.into(),
                annotations: Default::default(),
            })
        };
        let status = store.get_secret(ask("other")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        let found = store.get_secret(ask("token")).await.unwrap().into_inner();
        assert_eq!(
            found.data,
            std::env::var("PATH").unwrap().into_bytes(),
            "read when asked"
        );
    }
}

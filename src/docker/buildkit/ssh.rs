//! SSH agent forwarding (`RUN --mount=type=ssh[,id=…]`): which agent socket each id
//! forwards, a check that it is there before any build starts, and the session's
//! `moby.sshforward.v1.SSH` service. BuildKit calls `ForwardAgent` once per connection a
//! build step makes to its socket, naming the id in the `buildkit.ssh.id` metadata
//! (BuildKit's session/sshforward); each call gets its own connection to the agent.
//!
//! As buildx does, the build may only list keys and ask for signatures: requests to add,
//! remove or lock keys, and extensions, are answered with the agent protocol's failure
//! and never reach the agent.

use bollard_buildkit_proto::moby::sshforward::v1::ssh_server::Ssh;
use bollard_buildkit_proto::moby::sshforward::v1::{
    BytesMessage, CheckAgentRequest, CheckAgentResponse,
};
use futures_util::{Stream, StreamExt};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// The id `RUN --mount=type=ssh` uses when it names none.
pub const DEFAULT_ID: &str = "default";

/// The metadata key BuildKit names the agent id under in `ForwardAgent`.
const ID_METADATA: &str = "buildkit.ssh.id";

/// OpenSSH's agent refuses messages longer than this (`AGENT_MAX_LEN`).
const MAX_MESSAGE: usize = 256 * 1024;

/// `SSH_AGENT_FAILURE`, as a whole message.
const FAILURE: [u8; 5] = [0, 0, 0, 1, 5];
/// `SSH2_AGENTC_REQUEST_IDENTITIES` and `SSH2_AGENTC_SIGN_REQUEST`: what a build may ask.
const ALLOWED: [u8; 2] = [11, 13];

/// Where the agent forwarded under an id is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSocket {
    /// `$SSH_AUTH_SOCK` of this process.
    FromEnv,
    /// An agent's socket.
    Path(PathBuf),
}

/// Why an agent cannot be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("SSH_AUTH_SOCK is not set, so there is no SSH agent to forward; start one (eval $(ssh-agent); ssh-add) or give the agent's socket as ID=PATH")]
    NoAgent,
    #[error("{} does not exist; start the SSH agent (ssh-agent -a PATH) or fix the path", .0.display())]
    Missing(PathBuf),
    #[error("{} is a file, not an SSH agent socket; polyarch forwards agents only: load the key with ssh-add and give the agent's socket", .0.display())]
    NotASocket(PathBuf),
    #[error("cannot read {} ({source}); fix its permissions or the path", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AgentSocket {
    /// The socket path, checked to be a socket now.
    pub fn resolve(&self) -> Result<PathBuf, SshError> {
        let path = match self {
            AgentSocket::FromEnv => match std::env::var_os("SSH_AUTH_SOCK") {
                Some(path) if !path.is_empty() => PathBuf::from(path),
                _ => return Err(SshError::NoAgent),
            },
            AgentSocket::Path(path) => path.clone(),
        };
        let meta = std::fs::metadata(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                SshError::Missing(path.clone())
            } else {
                SshError::Unreadable {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
            return Err(SshError::NotASocket(path));
        }
        Ok(path)
    }
}

/// One `ssh:` entry or `--ssh` value as buildx spells it: `default`, `ID` (both forward
/// `$SSH_AUTH_SOCK`) or `ID=SOCKET` (relative to `base`). The error is the fix.
pub fn parse_spec(text: &str, base: &Path) -> Result<(String, AgentSocket), String> {
    let (id, path) = match text.split_once('=') {
        Some((id, path)) => (id, Some(path)),
        None => (text, None),
    };
    if !super::secrets::valid_id(id) {
        return Err(format!(
            "`{id}` is not an SSH id; write default, ID or ID=SOCKET (an id has no `,`, `=` or spaces)"
        ));
    }
    let socket = match path {
        None => AgentSocket::FromEnv,
        Some("") => return Err(format!("`{text}` has no socket path after `=`; write {id}=SOCKET or just {id} for $SSH_AUTH_SOCK")),
        Some(path) if path.contains(',') => {
            return Err(format!(
                "`{text}` lists several paths; polyarch forwards one agent socket per id (load keys into that agent with ssh-add)"
            ))
        }
        Some(path) => AgentSocket::Path(base.join(path)),
    };
    Ok((id.to_string(), socket))
}

/// The agents one build may use, by id, with their checked socket paths.
#[derive(Debug, Default, Clone)]
pub struct SshAgents {
    sockets: BTreeMap<String, PathBuf>,
}

impl SshAgents {
    pub fn new(sockets: BTreeMap<String, PathBuf>) -> SshAgents {
        SshAgents { sockets }
    }

    fn socket(&self, id: &str) -> Result<&PathBuf, Status> {
        self.sockets.get(id).ok_or_else(|| {
            Status::not_found(format!(
                "no SSH agent is forwarded as `{id}`; add `ssh: [{id}]` to the image in polyarch.yaml or pass --ssh {id}"
            ))
        })
    }
}

#[tonic::async_trait]
impl Ssh for SshAgents {
    async fn check_agent(
        &self,
        request: Request<CheckAgentRequest>,
    ) -> Result<Response<CheckAgentResponse>, Status> {
        let id = request.into_inner().id;
        self.socket(if id.is_empty() { DEFAULT_ID } else { &id })?;
        Ok(Response::new(CheckAgentResponse {}))
    }

    type ForwardAgentStream = tokio_stream::wrappers::ReceiverStream<Result<BytesMessage, Status>>;

    async fn forward_agent(
        &self,
        request: Request<tonic::Streaming<BytesMessage>>,
    ) -> Result<Response<Self::ForwardAgentStream>, Status> {
        let id = request
            .metadata()
            .get(ID_METADATA)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(DEFAULT_ID)
            .to_string();
        let socket = self.socket(&id)?;
        let agent = UnixStream::connect(socket).await.map_err(|e| {
            Status::unavailable(format!(
                "cannot connect to the SSH agent at {}: {e}",
                socket.display()
            ))
        })?;
        let (answers, stream) = mpsc::channel(8);
        tokio::spawn(relay(request.into_inner(), agent, answers));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            stream,
        )))
    }
}

/// Passes the build's agent requests to the agent one at a time (the protocol is strictly
/// request/answer), refusing what a build may not do. Ends when either side does.
async fn relay(
    mut requests: impl Stream<Item = Result<BytesMessage, Status>> + Unpin,
    mut agent: UnixStream,
    answers: mpsc::Sender<Result<BytesMessage, Status>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        while let Some(frame) = take_message(&mut pending) {
            let Ok(frame) = frame else { return };
            let answer = if frame.get(4).is_some_and(|kind| ALLOWED.contains(kind)) {
                match ask(&mut agent, &frame).await {
                    Ok(answer) => answer,
                    Err(_) => return,
                }
            } else {
                FAILURE.to_vec()
            };
            if answers
                .send(Ok(BytesMessage { data: answer }))
                .await
                .is_err()
            {
                return;
            }
        }
        match requests.next().await {
            Some(Ok(chunk)) => pending.extend_from_slice(&chunk.data),
            _ => return,
        }
    }
}

/// The next whole message (length prefix included) at the start of `pending`; an error
/// for one longer than any agent accepts.
fn take_message(pending: &mut Vec<u8>) -> Option<Result<Vec<u8>, ()>> {
    let length = u32::from_be_bytes(pending.get(..4)?.try_into().ok()?) as usize;
    if length > MAX_MESSAGE {
        return Some(Err(()));
    }
    if pending.len() < 4 + length {
        return None;
    }
    Some(Ok(pending.drain(..4 + length).collect()))
}

async fn ask(agent: &mut UnixStream, request: &[u8]) -> std::io::Result<Vec<u8>> {
    agent.write_all(request).await?;
    let mut length = [0u8; 4];
    agent.read_exact(&mut length).await?;
    let size = u32::from_be_bytes(length) as usize;
    if size > MAX_MESSAGE {
        return Err(std::io::Error::other("the SSH agent's answer is too long"));
    }
    let mut answer = vec![0u8; 4 + size];
    answer[..4].copy_from_slice(&length);
    agent.read_exact(&mut answer[4..]).await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_buildx_spellings() {
        let base = Path::new("/p");
        assert_eq!(
            parse_spec("default", base),
            Ok(("default".into(), AgentSocket::FromEnv))
        );
        assert_eq!(
            parse_spec("github=run/agent.sock", base),
            Ok((
                "github".into(),
                AgentSocket::Path("/p/run/agent.sock".into())
            ))
        );
        for bad in ["", "a b", "x=", "x=a,b", "=path"] {
            assert!(parse_spec(bad, base).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_key_file_is_not_an_agent() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id_ed25519");
        std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\n").unwrap();
        let error = AgentSocket::Path(key).resolve().unwrap_err().to_string();
        assert!(error.contains("ssh-add"), "{error}");
        assert!(matches!(
            AgentSocket::Path(dir.path().join("nothing")).resolve(),
            Err(SshError::Missing(_))
        ));
    }

    /// A fake agent that answers every request with one message and records what reached it.
    #[tokio::test]
    async fn only_listing_and_signing_reach_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let agent = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            loop {
                let mut length = [0u8; 4];
                if conn.read_exact(&mut length).await.is_err() {
                    return seen;
                }
                let mut body = vec![0u8; u32::from_be_bytes(length) as usize];
                conn.read_exact(&mut body).await.unwrap();
                seen.push(body[0]);
                // SSH2_AGENT_IDENTITIES_ANSWER with no keys.
                conn.write_all(&[0, 0, 0, 5, 12, 0, 0, 0, 0]).await.unwrap();
            }
        });
        let conn = UnixStream::connect(&path).await.unwrap();
        // List (split across chunks), add a key (refused), remove all (refused), list.
        let chunks = vec![
            vec![0, 0],
            vec![0, 1, 11, 0, 0, 0, 3, 17, 1],
            vec![2, 0, 0, 0, 1, 19, 0, 0, 0, 1, 11],
        ];
        let requests = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|data| Ok(BytesMessage { data }))
                .collect::<Vec<_>>(),
        );
        let (tx, mut rx) = mpsc::channel(8);
        relay(requests, conn, tx).await;
        let mut answers = Vec::new();
        while let Some(Ok(m)) = rx.recv().await {
            answers.push(m.data);
        }
        let listed = vec![0, 0, 0, 5, 12, 0, 0, 0, 0];
        assert_eq!(
            answers,
            vec![listed.clone(), FAILURE.to_vec(), FAILURE.to_vec(), listed]
        );
        assert_eq!(agent.await.unwrap(), vec![11, 11]);
    }
}

//! One container run to its end on an engine: created, started, waited for up to a
//! deadline, its output read, then removed. A run cut off (its future dropped) leaves its
//! container: run it through [`crate::builder::cleanup::Cleanup::run_container`], which
//! records it for removal.

use crate::base::platform::Platform;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use std::time::Duration;

/// What to run.
pub struct ContainerRun<'a> {
    pub name: &'a str,
    pub image: &'a str,
    pub platform: Option<&'a Platform>,
    /// In place of the image's own entrypoint, when given.
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    /// `none`, `host`, or `None` for the engine's default network.
    pub network: Option<&'a str>,
    pub host_config: HostConfig,
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Exited(i64),
    /// The engine would not create it (e.g. the image is missing).
    NotCreated(String),
    /// The engine created it but could not start its command (e.g. `exec format error`).
    NotStarted(String),
    /// Still running at the deadline: killed and removed.
    TimedOut,
}

#[derive(Debug)]
pub struct Outcome {
    pub ended: Ended,
    /// Its stdout and stderr, as the engine logged them.
    pub logs: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("waiting for {container}: {source}")]
    Wait {
        container: String,
        #[source]
        source: DockerError,
    },
    #[error("waiting for {container}: no status")]
    NoStatus { container: String },
}

/// Removes container `name`, running or not; one already gone is no error.
pub async fn remove(docker: &Docker, name: &str) {
    let force = RemoveContainerOptionsBuilder::default().force(true).build();
    let _ = docker.remove_container(name, Some(force)).await;
}

/// Runs `run` to its end, or until `timeout`; the container is gone afterwards.
pub async fn run_to_end(
    docker: &Docker,
    run: ContainerRun<'_>,
    timeout: Duration,
) -> Result<Outcome, ContainerError> {
    let mut options = CreateContainerOptionsBuilder::default().name(run.name);
    if let Some(platform) = run.platform {
        options = options.platform(&platform.to_string());
    }
    let body = ContainerCreateBody {
        image: Some(run.image.to_string()),
        entrypoint: run.entrypoint,
        cmd: run.cmd,
        env: (!run.env.is_empty()).then_some(run.env),
        user: run.user,
        working_dir: run.workdir,
        network_disabled: Some(run.network == Some("none")),
        host_config: Some(HostConfig {
            network_mode: run.network.map(str::to_string),
            // Rootful Podman passes on the Docker API's default limits (1048576 open
            // files) which runc may not raise to; these containers need few of either.
            ulimits: Some(
                ["nofile", "nproc"]
                    .into_iter()
                    .map(|name| ResourcesUlimits {
                        name: Some(name.into()),
                        soft: Some(1024),
                        hard: Some(1024),
                    })
                    .collect(),
            ),
            ..run.host_config
        }),
        ..Default::default()
    };
    if let Err(e) = docker.create_container(Some(options.build()), body).await {
        return Ok(Outcome {
            ended: Ended::NotCreated(e.to_string()),
            logs: String::new(),
        });
    }
    let ended = start_and_wait(docker, run.name, timeout).await;
    let logs = logs(docker, run.name).await;
    remove(docker, run.name).await;
    Ok(Outcome {
        ended: ended?,
        logs,
    })
}

async fn start_and_wait(
    docker: &Docker,
    name: &str,
    timeout: Duration,
) -> Result<Ended, ContainerError> {
    if let Err(e) = docker.start_container(name, None).await {
        return Ok(Ended::NotStarted(e.to_string()));
    }
    let not_running = WaitContainerOptionsBuilder::default()
        .condition("not-running")
        .build();
    let mut wait = docker.wait_container(name, Some(not_running));
    let Ok(waited) = tokio::time::timeout(timeout, wait.next()).await else {
        return Ok(Ended::TimedOut);
    };
    match waited {
        Some(Ok(r)) => Ok(Ended::Exited(r.status_code)),
        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(Ended::Exited(code)),
        Some(Err(source)) => Err(ContainerError::Wait {
            container: name.to_string(),
            source,
        }),
        None => Err(ContainerError::NoStatus {
            container: name.to_string(),
        }),
    }
}

/// The end of a run's output kept: a chatty command must not fill memory.
const LOG_TAIL_BYTES: usize = 64 * 1024;

async fn logs(docker: &Docker, name: &str) -> String {
    let mut out = String::new();
    let both = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .build();
    let mut stream = docker.logs(name, Some(both));
    while let Some(Ok(chunk)) = stream.next().await {
        out.push_str(&chunk.to_string());
        if out.len() > 2 * LOG_TAIL_BYTES {
            let mut cut = out.len() - LOG_TAIL_BYTES;
            while !out.is_char_boundary(cut) {
                cut += 1;
            }
            out.drain(..cut);
        }
    }
    out
}

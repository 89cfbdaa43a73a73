//! The Docker Engine connection: where it is, what it runs natively, what builder it has.

use crate::platform::Platform;
use crate::{Error, Result};
use bollard::Docker;

#[derive(Clone)]
pub struct Engine {
    pub docker: Docker,
    /// The engine's own platform from `/version` (Os/Arch), refined by `/info`.
    pub native: Platform,
    pub api_version: String,
    pub server_version: String,
    /// Whether `/build?version=2` (BuildKit) is available.
    pub buildkit: bool,
    /// Where the engine was reached, for messages.
    pub endpoint: String,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("endpoint", &self.endpoint)
            .field("native", &self.native.to_string())
            .field("api_version", &self.api_version)
            .finish()
    }
}

impl Engine {
    /// Connects the way the Docker CLI does by default (`DOCKER_HOST`, else the local socket)
    /// and negotiates the API version.
    pub async fn connect() -> Result<Engine> {
        let endpoint =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        let docker = Docker::connect_with_defaults()
            .map_err(|e| Error::Engine(format!("cannot connect to {endpoint}: {e}")))?;
        Self::from_docker(docker, endpoint).await
    }

    pub async fn from_docker(docker: Docker, endpoint: String) -> Result<Engine> {
        let unreachable = |e: bollard::errors::Error| {
            Error::Engine(format!(
                "cannot reach the engine at {endpoint}: {e}; start dockerd or set DOCKER_HOST"
            ))
        };
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        let version = docker.version().await.map_err(unreachable)?;
        let info = docker.info().await.map_err(unreachable)?;
        let os = version
            .os
            .clone()
            .or(info.os_type.clone())
            .unwrap_or_else(|| "linux".into());
        let arch = version
            .arch
            .clone()
            .or(info.architecture.clone())
            .unwrap_or_else(|| std::env::consts::ARCH.into());
        let native = Platform::new(&os, &arch, None);
        let api_version = version.api_version.clone().unwrap_or_default();
        let buildkit = api_at_least(&api_version, 1, 39) && os == "linux";
        Ok(Engine {
            docker,
            native,
            api_version,
            server_version: version.version.unwrap_or_default(),
            buildkit,
            endpoint,
        })
    }
}

fn api_at_least(version: &str, major: u32, minor: u32) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn compares_api_versions() {
        assert!(super::api_at_least("1.41", 1, 39));
        assert!(super::api_at_least("1.44", 1, 39));
        assert!(!super::api_at_least("1.38", 1, 39));
    }
}

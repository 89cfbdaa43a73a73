//! The Docker Engine connection: where it is, what it runs natively, what builder it has.

use crate::endpoint::{Endpoint, EndpointError};
use crate::platform::Platform;
use crate::Result;
use bollard::Docker;

#[derive(Clone)]
pub struct Engine {
    pub docker: Docker,
    /// The engine's own platform from `/version` (Os/Arch), refined by `/info`.
    pub native: Platform,
    pub api_version: String,
    pub server_version: String,
    /// Whether the engine has BuildKit, reached through `/grpc` and `/session`.
    pub buildkit: bool,
    /// Whether images live in containerd's image store rather than the classic one.
    pub containerd_store: bool,
    /// Where the engine was reached, as the user named it, for messages and records.
    pub endpoint: String,
    /// How to reach it again (REST, BuildKit's upgrades) and whether it is on this machine.
    pub location: Endpoint,
    /// Endpoint, engine ID and kernel: what earlier runs' findings about this engine's
    /// kernel (registered emulators) are remembered under.
    pub identity: String,
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
    /// Connects the way the Docker CLI does by default (`DOCKER_HOST` with
    /// `DOCKER_TLS_VERIFY`, else `DOCKER_CONTEXT` or config.json's `currentContext`, else
    /// the local socket) and negotiates the API version.
    pub async fn connect() -> Result<Engine> {
        let location = Endpoint::default_engine()?;
        Ok(Self::connect_to(location).await?)
    }

    /// Reaches the engine at `location`: a probe first, so that a down engine, a TLS or ssh
    /// failure is told as such, then the version and info the build needs.
    pub async fn connect_to(location: Endpoint) -> Result<Engine, EndpointError> {
        location.probe().await?;
        let endpoint = location.name.clone();
        let unanswered = |source: bollard::errors::Error| EndpointError::Api {
            endpoint: endpoint.clone(),
            source,
        };
        let docker = location.docker().map_err(unanswered)?;
        let docker = docker.negotiate_version().await.map_err(unanswered)?;
        let version = docker.version().await.map_err(unanswered)?;
        let info = docker.info().await.map_err(unanswered)?;
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
        let containerd_store = info.driver_status.iter().flatten().any(|pair| {
            pair.first().is_some_and(|k| k == "driver-type")
                && pair
                    .get(1)
                    .is_some_and(|v| v == "io.containerd.snapshotter.v1")
        });
        let identity = format!(
            "{endpoint}|{}|{}",
            info.id.as_deref().unwrap_or_default(),
            info.kernel_version.as_deref().unwrap_or_default()
        );
        Ok(Engine {
            identity,
            docker,
            native,
            api_version,
            server_version: version.version.unwrap_or_default(),
            buildkit,
            containerd_store,
            endpoint,
            location,
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

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
    /// Whether the engine has BuildKit, reached through `/grpc` and `/session`.
    pub buildkit: bool,
    /// Whether images live in containerd's image store rather than the classic one.
    pub containerd_store: bool,
    /// Where the engine was reached, for messages.
    pub endpoint: String,
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
    /// Connects the way the Docker CLI does by default (`DOCKER_HOST`, else the local socket)
    /// and negotiates the API version.
    pub async fn connect() -> Result<Engine> {
        // As the Docker CLI: DOCKER_HOST, else DOCKER_CONTEXT or config.json's
        // currentContext, else the local socket.
        if std::env::var_os("DOCKER_HOST").is_none() {
            if let Some(context) = current_context() {
                return Self::connect_endpoint(&context_host(&context)?).await;
            }
        }
        let endpoint =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        let docker = Docker::connect_with_defaults()
            .map_err(|e| Error::Engine(format!("cannot connect to {endpoint}: {e}")))?;
        Self::from_docker(docker, endpoint).await
    }

    /// Connects to a builder endpoint from `builders:`: `unix:///path`, `tcp://host:port`
    /// (plain; a TLS engine is reached through a Docker context or DOCKER_HOST), or the
    /// name of a Docker context.
    pub async fn connect_endpoint(endpoint: &str) -> Result<Engine> {
        let cannot = |e: bollard::errors::Error| {
            Error::Engine(format!("cannot connect to builder {endpoint}: {e}"))
        };
        let docker = if endpoint.starts_with("unix://") {
            Docker::connect_with_socket(endpoint, 120, bollard::API_DEFAULT_VERSION)
                .map_err(cannot)?
        } else if endpoint.starts_with("tcp://") || endpoint.starts_with("http://") {
            Docker::connect_with_http(endpoint, 120, bollard::API_DEFAULT_VERSION)
                .map_err(cannot)?
        } else {
            let host = context_host(endpoint)?;
            return Box::pin(Self::connect_endpoint(&host)).await;
        };
        Self::from_docker(docker, endpoint.to_string()).await
    }

    pub async fn from_docker(docker: Docker, endpoint: String) -> Result<Engine> {
        let unreachable = |e: bollard::errors::Error| {
            Error::Engine(format!(
                "cannot reach the engine at {endpoint}: {e}; start dockerd there, or point DOCKER_HOST (or the `builders:` entry) at a running engine"
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
        })
    }
}

fn docker_config_dir() -> std::path::PathBuf {
    crate::credentials::config_dir().unwrap_or_default()
}

/// The context `docker context use` selected, unless it is the built-in default.
fn current_context() -> Option<String> {
    let name = std::env::var("DOCKER_CONTEXT").ok().or_else(|| {
        let text = std::fs::read_to_string(docker_config_dir().join("config.json")).ok()?;
        let config: serde_json::Value = serde_json::from_str(&text).ok()?;
        config["currentContext"].as_str().map(str::to_string)
    })?;
    (!name.is_empty() && name != "default").then_some(name)
}

/// The engine address of a Docker context, as `docker context use NAME` would select it.
fn context_host(name: &str) -> Result<String> {
    use sha2::Digest;
    let meta = docker_config_dir()
        .join("contexts/meta")
        .join(hex::encode(sha2::Sha256::digest(name.as_bytes())))
        .join("meta.json");
    let text = std::fs::read_to_string(&meta).map_err(|_| {
        Error::Engine(format!(
            "`{name}` is neither a unix:// or tcp:// engine address nor a Docker context (no {}); create it with `docker context create {name} --docker host=…`",
            meta.display()
        ))
    })?;
    let parsed: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Engine(format!("{}: not valid JSON: {e}", meta.display())))?;
    parsed["Endpoints"]["docker"]["Host"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Engine(format!(
                "{}: context `{name}` has no docker endpoint",
                meta.display()
            ))
        })
}

/// The engines a build uses: the default one, and a native builder per platform from
/// the project's `builders:`.
#[derive(Debug, Clone)]
pub struct Builders {
    pub default: Engine,
    pub by_platform: std::collections::BTreeMap<Platform, Engine>,
}

impl Builders {
    /// Connects every builder the plan needs, so an unreachable one fails before any build.
    pub async fn connect(
        default: Engine,
        endpoints: &std::collections::BTreeMap<Platform, String>,
        needed: &[Platform],
    ) -> Result<Builders> {
        let mut by_platform = std::collections::BTreeMap::new();
        for (platform, endpoint) in endpoints {
            if !needed.contains(platform) {
                continue;
            }
            let engine = Engine::connect_endpoint(endpoint).await.map_err(|e| {
                // The inner error is an `Error::Engine` too; keep one "docker engine:" prefix.
                let detail = match e {
                    Error::Engine(message) => message,
                    other => other.to_string(),
                };
                Error::Engine(format!(
                    "builder for {platform} ({endpoint}) is unreachable: {detail}"
                ))
            })?;
            by_platform.insert(platform.clone(), engine);
        }
        Ok(Builders {
            default,
            by_platform,
        })
    }

    pub fn for_platform(&self, platform: &Platform) -> &Engine {
        self.by_platform.get(platform).unwrap_or(&self.default)
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

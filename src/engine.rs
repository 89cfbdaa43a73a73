//! The Docker Engine connection: where it is, what it runs natively, what builder it has.

use crate::endpoint::{Endpoint, EndpointError};
use crate::plan::{Plan, Unit};
use crate::platform::Platform;
use crate::progress::{Event, Reporter};
use crate::project::{BuilderSpec, Fallback};
use crate::{Error, Result};
use bollard::Docker;
use std::collections::BTreeMap;

#[derive(Clone)]
pub struct Engine {
    pub docker: Docker,
    /// The engine's own platform from `/version` (Os/Arch), refined by `/info`.
    pub native: Platform,
    pub api_version: String,
    pub server_version: String,
    /// Which engine answers the Docker API: Docker, or Podman's compatible service.
    pub product: Product,
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

/// The engine behind the Docker API, told by `/version`'s components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    Docker,
    /// Podman's Docker-compatible service: no BuildKit (`/grpc`, `/session`), its `/build`
    /// is Buildah's, one platform per request.
    Podman,
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Product::Docker => "Docker",
            Product::Podman => "Podman",
        })
    }
}

impl Product {
    /// Podman names itself "Podman Engine" among `/version`'s components; Docker names
    /// "Engine".
    fn from_components<'a>(mut names: impl Iterator<Item = &'a str>) -> Product {
        if names.any(|name| name.starts_with("Podman")) {
            Product::Podman
        } else {
            Product::Docker
        }
    }
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
    /// The engine's product and version, e.g. "Docker 28.5.2" or "Podman 4.3.1".
    pub fn product_version(&self) -> String {
        format!("{} {}", self.product, self.server_version)
    }

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
        let product =
            Product::from_components(version.components.iter().flatten().map(|c| c.name.as_str()));
        // Podman reports API 1.41 but serves neither `/grpc` nor `/session`.
        let buildkit =
            api_at_least(&api_version, 1, 39) && os == "linux" && product == Product::Docker;
        let containerd_store = info.driver_status.iter().flatten().any(|pair| {
            pair.first().is_some_and(|k| k == "driver-type")
                && pair
                    .get(1)
                    .is_some_and(|v| v == "io.containerd.snapshotter.v1")
        });
        // Podman makes up a new `ID` on every `/info`: its storage root names it instead.
        let id = match product {
            Product::Docker => info.id.as_deref(),
            Product::Podman => info.docker_root_dir.as_deref(),
        };
        let identity = format!(
            "{endpoint}|{}|{}",
            id.unwrap_or_default(),
            info.kernel_version.as_deref().unwrap_or_default()
        );
        Ok(Engine {
            identity,
            docker,
            native,
            api_version,
            server_version: version.version.unwrap_or_default(),
            product,
            buildkit,
            containerd_store,
            endpoint,
            location,
        })
    }
}

/// The engines a build uses: the default one, and native builders per platform from
/// the project's `builders:`.
#[derive(Debug, Clone)]
pub struct Builders {
    pub default: Engine,
    /// The reachable builders of each platform, in the file's order.
    pub by_platform: BTreeMap<Platform, Vec<Engine>>,
    /// Platforms whose builders were all unreachable and that build on the default engine
    /// instead (`fallback: emulate`), with why.
    pub fallbacks: BTreeMap<Platform, String>,
    /// The plan's images in order: the i-th image's build of a platform goes to that
    /// platform's builder i mod n, spreading images over a list of builders.
    images: Vec<String>,
}

impl Builders {
    /// Connects every builder the plan needs, so an unreachable one fails before any
    /// build. In a list, an unreachable builder is left out (with a warning) while another
    /// answers; when none does and one has `fallback: emulate`, the default engine takes
    /// the platform.
    pub async fn connect(
        default: Engine,
        specs: &BTreeMap<Platform, Vec<BuilderSpec>>,
        plan: &Plan<'_>,
        reporter: &dyn Reporter,
    ) -> Result<Builders> {
        let mut by_platform = BTreeMap::new();
        let mut fallbacks = BTreeMap::new();
        for (platform, specs) in specs {
            if !plan.units.iter().any(|u| &u.platform == platform) {
                continue;
            }
            let mut reachable = Vec::new();
            let mut failures = Vec::new();
            for spec in specs {
                match async { Engine::connect_to(spec.endpoint()?).await }.await {
                    Ok(engine) => reachable.push(engine),
                    Err(source) => failures.push((spec, source)),
                }
            }
            if !reachable.is_empty() {
                for (spec, source) in failures {
                    reporter.report(Event::Warning {
                        message: format!(
                            "builder {spec} for {platform} is unreachable: {source}; its builds go to the platform's other builders"
                        ),
                    });
                }
                by_platform.insert(platform.clone(), reachable);
                continue;
            }
            let emulate = specs.iter().any(|s| s.fallback == Fallback::Emulate);
            let Some((spec, source)) = failures.into_iter().next() else {
                continue;
            };
            if !emulate {
                return Err(Error::Builder {
                    platform: platform.to_string(),
                    source,
                });
            }
            let why = format!("builder {spec} is unreachable: {source}");
            reporter.report(Event::Warning {
                message: format!(
                    "{why}; building {platform} on {} instead, under QEMU where it runs anything (fallback: emulate)",
                    default.endpoint
                ),
            });
            fallbacks.insert(platform.clone(), why);
        }
        Ok(Builders {
            default,
            by_platform,
            fallbacks,
            images: plan.images.iter().map(|i| i.name.clone()).collect(),
        })
    }

    /// The engine that builds `unit`: one of its platform's builders, else the default.
    pub fn for_unit(&self, unit: &Unit<'_>) -> &Engine {
        match self.by_platform.get(&unit.platform) {
            Some(engines) if !engines.is_empty() => {
                let slot = self
                    .images
                    .iter()
                    .position(|name| *name == unit.image.name)
                    .unwrap_or(0);
                &engines[slot % engines.len()]
            }
            _ => &self.default,
        }
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
    fn tells_podman_from_docker_by_its_components() {
        use super::Product;
        let podman = ["Podman Engine", "Conmon", "OCI Runtime (runc)"];
        assert_eq!(
            Product::from_components(podman.into_iter()),
            Product::Podman
        );
        let docker = ["Engine", "containerd", "runc", "docker-init"];
        assert_eq!(
            Product::from_components(docker.into_iter()),
            Product::Docker
        );
    }

    #[test]
    fn compares_api_versions() {
        assert!(super::api_at_least("1.41", 1, 39));
        assert!(super::api_at_least("1.44", 1, 39));
        assert!(!super::api_at_least("1.38", 1, 39));
    }
}

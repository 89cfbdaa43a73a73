//! The Docker Engine connection: where it is, what it runs natively, what builder it has.

use crate::base::join;
use crate::base::memory::Store;
use crate::base::platform::Platform;
use crate::docker::buildkit::daemon::{Daemon, DaemonError};
use crate::docker::endpoint::{Endpoint, EndpointError, TlsFiles};
use bollard::Docker;

/// Why the engine, or the BuildKit daemon builds go to, cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("docker engine: {0}")]
    Engine(#[source] EndpointError),
    /// Boxed, as the daemon's errors are large and every `Result` should stay small.
    #[error(transparent)]
    Daemon(Box<DaemonError>),
}

impl From<EndpointError> for ConnectError {
    fn from(error: EndpointError) -> Self {
        ConnectError::Engine(error)
    }
}

impl From<DaemonError> for ConnectError {
    fn from(error: DaemonError) -> Self {
        ConnectError::Daemon(Box::new(error))
    }
}

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
    /// Set when this is a standalone BuildKit daemon rather than a Docker engine: no Docker
    /// API answers there, so builds solve through its control API and push by digest.
    pub daemon: Option<Standalone>,
}

/// A standalone BuildKit daemon in place of an engine, and what its workers run.
#[derive(Clone)]
pub struct Standalone {
    pub daemon: Daemon,
    /// The platforms its workers list (natively or through the host's QEMU).
    pub platforms: Vec<Platform>,
}

/// The engine behind the Docker API, told by `/version`'s components.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Product {
    Docker,
    /// Podman's Docker-compatible service: no BuildKit (`/grpc`, `/session`), its `/build`
    /// is Buildah's, one platform per request.
    Podman,
    /// A standalone BuildKit daemon (`buildkitd`): no Docker API at all.
    BuildKit,
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Product::Docker => "Docker",
            Product::Podman => "Podman",
            Product::BuildKit => "BuildKit",
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

    /// Whether its BuildKit's Dockerfile frontend reads named contexts (`context:NAME`
    /// attributes, frontend 1.4 in BuildKit 0.10+): a standalone daemon, or Docker 23
    /// (API 1.42, BuildKit 0.11) and later. Docker 20.10's BuildKit 0.8 ignores them.
    pub fn named_contexts(&self) -> bool {
        self.buildkit && (self.daemon.is_some() || api_at_least(&self.api_version, 1, 42))
    }

    /// Connects the way the Docker CLI does by default (`DOCKER_HOST` with
    /// `DOCKER_TLS_VERIFY`, else `DOCKER_CONTEXT` or config.json's `currentContext`, else
    /// the local socket) and asks what it is (version, info).
    pub async fn connect() -> Result<Engine, ConnectError> {
        let location = Endpoint::default_engine()?;
        Ok(Self::connect_to(location).await?)
    }

    /// Where builds go: the BuildKit daemon `BUILDKIT_HOST` names (buildctl's variable;
    /// for `tcp://` with mutual TLS, `BUILDKIT_TLS_DIR` holds `ca.pem`, `cert.pem`,
    /// `key.pem` or `ca.crt`, `tls.crt`, `tls.key`, as buildctl's `--tlsdir`, and
    /// `BUILDKIT_TLS_SERVERNAME` its `--tlsservername`), else the
    /// Docker engine [`Engine::connect`] finds.
    pub async fn connect_builder() -> Result<Engine, ConnectError> {
        let Some(address) = std::env::var("BUILDKIT_HOST")
            .ok()
            .filter(|a| !a.is_empty())
        else {
            return Self::connect().await;
        };
        let tls = std::env::var_os("BUILDKIT_TLS_DIR")
            .filter(|d| !d.is_empty())
            .map(|dir| TlsFiles {
                server_name: std::env::var("BUILDKIT_TLS_SERVERNAME")
                    .ok()
                    .filter(|n| !n.is_empty()),
                ..tls_dir(std::path::Path::new(&dir))
            });
        let location = Endpoint::resolve(&address, tls.as_ref())?;
        Ok(Self::connect_daemon(location).await?)
    }

    /// Reaches the engine at `location`: a probe first, so that a down engine, a TLS or ssh
    /// failure is told as such, then the version and info the build needs.
    pub async fn connect_to(location: Endpoint) -> Result<Engine, EndpointError> {
        let endpoint = location.name.clone();
        let unanswered = |source: bollard::errors::Error| EndpointError::Api {
            endpoint: endpoint.clone(),
            source,
        };
        // Who serves a Unix socket is asked first (one connect, well under a millisecond):
        // an engine process remembered answers neither `/version` nor `/info` again.
        let serving = match location.unix_path() {
            Some(path) => serving_engine(path).await,
            None => None,
        };
        let memory = serving.as_ref().map(|_| ProbeMemory::load());
        let remembered = match (&memory, &serving) {
            (Some(memory), Some(serving)) => memory.get(&endpoint, serving),
            _ => None,
        };
        // The client is made after the probe or beside it, never before: bollard refuses a
        // missing socket itself, which would hide the probe's "down" behind an API error.
        let (docker, probed) = match remembered {
            Some(probed) => {
                location.probe().await?;
                (location.docker().map_err(unanswered)?, probed)
            }
            None => {
                // One `/version`, beside `/info`: Docker answers each in 7–8 ms, Podman in
                // 0.2–0.3 s. No `negotiate_version` (a second `/version`): bollard's request
                // paths carry no `/vX.Y` prefix, so every engine answers at the API version
                // it serves. Both are asked beside the probe, whose failure is the one told.
                let answers = async {
                    let docker = location.docker().map_err(unanswered)?;
                    let (version, info) =
                        tokio::try_join!(docker.version(), docker.info()).map_err(unanswered)?;
                    Ok((docker, version, info))
                };
                let ((), (docker, version, info)) =
                    join::primary_first(location.probe(), answers).await?;
                let probed = Probed::of(version, info);
                if let (Some(memory), Some(serving)) = (memory, serving) {
                    memory.put(&endpoint, serving, &probed);
                }
                (docker, probed)
            }
        };
        let native = Platform::new(&probed.os, &probed.arch, None);
        // Podman reports API 1.41 but serves neither `/grpc` nor `/session`.
        let buildkit = api_at_least(&probed.api_version, 1, 39)
            && probed.os == "linux"
            && probed.product == Product::Docker;
        let identity = format!("{endpoint}|{}|{}", probed.id, probed.kernel);
        Ok(Engine {
            identity,
            docker,
            native,
            api_version: probed.api_version,
            server_version: probed.server_version,
            product: probed.product,
            buildkit,
            containerd_store: probed.containerd_store,
            endpoint,
            location,
            daemon: None,
        })
    }

    /// Reaches the BuildKit daemon at `location` (as `BUILDKIT_HOST` names one): its
    /// version and its workers' platforms, the first being its native one.
    pub async fn connect_daemon(location: Endpoint) -> Result<Engine, DaemonError> {
        let daemon = Daemon::connect(&location).await?;
        let version = daemon.version().await?;
        let platforms = daemon.platforms().await?;
        let endpoint = location.name.clone();
        let native = platforms
            .first()
            .cloned()
            .unwrap_or_else(|| Platform::new("linux", std::env::consts::ARCH, None));
        // Never called for a daemon: every build goes through its control API. Creating
        // the client connects nothing.
        let docker = location.docker().map_err(|source| EndpointError::Api {
            endpoint: endpoint.clone(),
            source,
        })?;
        Ok(Engine {
            identity: format!("{endpoint}|buildkitd"),
            docker,
            native,
            api_version: String::new(),
            server_version: version,
            product: Product::BuildKit,
            buildkit: true,
            // It pushes images to registries itself, as containerd's image store does.
            containerd_store: true,
            endpoint,
            location,
            daemon: Some(Standalone { daemon, platforms }),
        })
    }

    /// How messages name it: "BuildKit daemon unix:///…" or "the engine at …".
    pub fn described(&self) -> String {
        match self.daemon {
            Some(_) => format!("BuildKit daemon {}", self.endpoint),
            None => format!("the engine at {}", self.endpoint),
        }
    }
}

/// What an engine's `/version` and `/info` said that a run needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Probed {
    os: String,
    arch: String,
    api_version: String,
    server_version: String,
    product: Product,
    /// The engine's ID; Podman's storage root, as Podman makes up a new `ID` on every
    /// `/info`.
    id: String,
    kernel: String,
    containerd_store: bool,
}

impl Probed {
    fn of(version: bollard::models::SystemVersion, info: bollard::models::SystemInfo) -> Probed {
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
        let product =
            Product::from_components(version.components.iter().flatten().map(|c| c.name.as_str()));
        let containerd_store = info.driver_status.iter().flatten().any(|pair| {
            pair.first().is_some_and(|k| k == "driver-type")
                && pair
                    .get(1)
                    .is_some_and(|v| v == "io.containerd.snapshotter.v1")
        });
        let id = match product {
            Product::Docker | Product::BuildKit => info.id,
            Product::Podman => info.docker_root_dir,
        };
        Probed {
            os,
            arch,
            api_version: version.api_version.unwrap_or_default(),
            server_version: version.version.unwrap_or_default(),
            product,
            id: id.unwrap_or_default(),
            kernel: info.kernel_version.unwrap_or_default(),
            containerd_store,
        }
    }
}

/// Engine processes whose answers are remembered while they run, by the command name the
/// kernel keeps for them (`/proc/PID/stat`, readable by any user, unlike `/proc/PID/exe`
/// of another user's process).
const REMEMBERED_ENGINES: [&str; 2] = ["dockerd", "podman"];

/// The engine process serving the socket at `path`, named so that no other process, now
/// or after a restart or reboot, has the same name: its pid, its start time (clock ticks
/// since boot) and the boot's ID. None unless the socket's listener is `dockerd` or
/// Podman itself (a socket systemd listens on, or a forwarder's, may be served by another
/// process later).
async fn serving_engine(path: &std::path::Path) -> Option<String> {
    let stream = tokio::net::UnixStream::connect(path).await.ok()?;
    let pid = stream.peer_cred().ok()?.pid()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (command, fields) = stat.split_once(" (")?.1.rsplit_once(')')?;
    if !REMEMBERED_ENGINES.contains(&command) {
        return None;
    }
    // Fields after the command's closing parenthesis start at the 3rd; the 22nd is the
    // start time.
    let started = fields.split_whitespace().nth(19)?.to_string();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(format!("{pid}|{started}|{}", boot.trim()))
}

/// What an engine's `/version` and `/info` said, per endpoint, for the process that served
/// them (`engines.json` in the cache directory): Docker answers each in 7–8 ms, Podman in
/// 0.2–0.4 s (it runs its OCI runtime's and conmon's `--version` every time), and none of
/// what [`Probed`] keeps changes while the process runs (a reload by SIGHUP changes
/// neither versions, ID, kernel nor image store).
struct ProbeMemory(Store<(String, Probed)>);

impl ProbeMemory {
    fn load() -> ProbeMemory {
        ProbeMemory(Store::open("engines.json"))
    }

    /// What `endpoint` said while `serving` served it.
    fn get(&self, endpoint: &str, serving: &str) -> Option<Probed> {
        let (process, probed) = self.0.get(endpoint)?;
        (process == serving).then_some(probed)
    }

    /// Remembers `probed` for `endpoint` while `serving` serves it; an unwritable cache
    /// only costs the next run the probe.
    fn put(self, endpoint: &str, serving: String, probed: &Probed) {
        self.0.put(endpoint.to_string(), (serving, probed.clone()));
        self.0.save();
    }
}

/// The TLS files in `dir` under either of the names buildctl's `--tlsdir` takes.
fn tls_dir(dir: &std::path::Path) -> TlsFiles {
    let kubernetes = dir.join("tls.crt").exists() && !dir.join("cert.pem").exists();
    let (ca, cert, key) = match kubernetes {
        true => ("ca.crt", "tls.crt", "tls.key"),
        false => ("ca.pem", "cert.pem", "key.pem"),
    };
    TlsFiles {
        ca: Some(dir.join(ca)),
        cert: Some(dir.join(cert)),
        key: Some(dir.join(key)),
        skip_verify: false,
        server_name: None,
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

    fn podman() -> super::Probed {
        super::Probed {
            os: "linux".into(),
            arch: "amd64".into(),
            api_version: "1.41".into(),
            server_version: "4.3.1".into(),
            product: super::Product::Podman,
            id: "/var/lib/containers/storage".into(),
            kernel: "6.1.0".into(),
            containerd_store: false,
        }
    }

    #[test]
    fn a_probe_is_remembered_for_the_process_that_answered_it_only() {
        use super::ProbeMemory;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache/engines.json");
        let memory = || ProbeMemory(crate::base::memory::Store::at(Some(path.clone())));
        let endpoint = "unix:///run/podman/podman.sock";
        memory().put(endpoint, "41|900|boot-a".into(), &podman());
        assert_eq!(memory().get(endpoint, "41|900|boot-a"), Some(podman()));
        // Restarted (another start time, perhaps the same pid), or after a reboot.
        assert_eq!(memory().get(endpoint, "41|950|boot-a"), None);
        assert_eq!(memory().get(endpoint, "41|900|boot-b"), None);
        assert_eq!(memory().get("unix:///other.sock", "41|900|boot-a"), None);
        // The next process's answers replace the last one's.
        memory().put(endpoint, "57|990|boot-a".into(), &podman());
        assert_eq!(memory().get(endpoint, "41|900|boot-a"), None);
    }

    #[tokio::test]
    async fn only_an_engine_process_listening_itself_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        // This test binary listens: not an engine, so nothing is remembered for it.
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        assert_eq!(super::serving_engine(&path).await, None);
    }

    /// The user is told the engine is down, not that it answered a ping but not the API.
    #[tokio::test]
    async fn a_missing_socket_is_an_engine_that_is_down() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let location = crate::docker::endpoint::Endpoint::resolve(
            &format!("unix://{}", socket.display()),
            None,
        )
        .unwrap();
        let refused = super::Engine::connect_to(location).await.err().unwrap();
        assert!(
            matches!(refused, super::EndpointError::Down { .. }),
            "{refused:?}"
        );
    }

    #[test]
    fn compares_api_versions() {
        assert!(super::api_at_least("1.41", 1, 39));
        assert!(super::api_at_least("1.44", 1, 39));
        assert!(!super::api_at_least("1.38", 1, 39));
    }
}

//! The library's typed errors. Each message says what failed, on what, and what to do;
//! `exit_code` maps them to the CLI's documented exit codes.

use crate::publish::layout::LayoutError;
use crate::registry::credentials::CredentialsError;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A mistake in the project file: `file: field: problem; fix`.
    #[error("{}: {}{message}", file.display(), if field.is_empty() { String::new() } else { format!("{field}: ") })]
    Project {
        file: PathBuf,
        field: String,
        message: String,
    },

    /// Bad command-line input that clap cannot catch (flag combinations, references).
    #[error("{0}")]
    Usage(String),

    /// The signing key does not open (a wrong password): found at the first signature,
    /// before any tag moves.
    #[error(transparent)]
    SigningKey(std::sync::Arc<crate::sign::KeyError>),

    /// A reference (on the command line or in a file) that does not parse.
    #[error(transparent)]
    Reference(#[from] crate::base::reference::ReferenceError),

    /// The default engine cannot be resolved or reached.
    #[error("docker engine: {0}")]
    Endpoint(#[from] crate::docker::endpoint::EndpointError),

    /// A standalone BuildKit daemon cannot be reached or cannot build what is asked;
    /// its messages name the daemon. Boxed, as `Registry`'s.
    #[error(transparent)]
    Daemon(Box<crate::docker::buildkit::daemon::DaemonError>),

    /// A native builder from `builders:` cannot be resolved or reached.
    #[error("docker engine: builder for {platform}: {source}")]
    Builder {
        platform: String,
        #[source]
        source: crate::docker::endpoint::EndpointError,
    },

    /// A platform build failed; `source` says what kind of failure (a lost builder, a
    /// failing step with its last log lines, …) and carries the message.
    #[error("build of {image} for {platform} failed: {source}")]
    Build {
        image: String,
        platform: String,
        #[source]
        source: crate::builder::BuildError,
    },

    /// A platform's `test:` could not be run: no verdict on the image (a failing test is
    /// a coverage gap in the record, not an error). Refused up front (exit 2) where the
    /// builder has no BuildKit.
    #[error("test of {image} for {platform}: {source}")]
    Test {
        image: String,
        platform: String,
        #[source]
        source: crate::builder::platform_test::TestError,
    },

    /// Emulation is missing, cannot be registered, or the engine failed to probe it;
    /// `source` says which (a build that hit "exec format error" is `ExecFormat`). Boxed, as
    /// `Registry`'s, so that every `Result` stays small.
    #[error("{}: {}", .0.area(), .0)]
    Emulation(#[source] Box<crate::builder::binfmt::EmulationError>),

    #[error("export of {image}: {source}")]
    Export {
        image: String,
        #[source]
        source: crate::builder::export::ExportError,
    },

    /// A registry call failed; `source` says what kind of failure.
    #[error("registry {registry}: {source}")]
    Registry {
        registry: String,
        #[source]
        source: Box<crate::registry::RegistryError>,
    },

    /// Registry credentials cannot be found: a Docker config to fix (exit 2) or a file or
    /// credential helper that fails (exit 3).
    #[error(transparent)]
    Credentials(#[from] CredentialsError),

    /// An OCI layout (`--output oci:DIR`, `verify oci:DIR`) cannot be written or read: not
    /// what was asked for (exit 2), or I/O and corrupt blobs (exit 3).
    #[error(transparent)]
    Layout(#[from] LayoutError),

    /// A build's settings key cannot be computed (its Dockerfile cannot be read).
    #[error(transparent)]
    Inputs(#[from] crate::builder::build_inputs::InputsError),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An image's SBOM cannot be made: a layer that cannot be read or is past a limit.
    #[error("sbom: {0}")]
    Sbom(#[source] Box<crate::sbom::SbomError>),

    #[error("interrupted")]
    Interrupted,

    /// `--timeout` passed before the command finished; `what` names the command and what
    /// it was checking.
    #[error("{what} did not finish within --timeout {}: a registry is answering too slowly or not at all; check it, or allow more time", crate::base::duration::show(*limit))]
    TimedOut {
        what: String,
        limit: std::time::Duration,
    },
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Project { .. }
            | Error::Usage(_)
            | Error::Reference(_)
            | Error::SigningKey(_) => 2,
            Error::Credentials(CredentialsError::Config { .. } | CredentialsError::Auth { .. }) => {
                2
            }
            Error::Layout(error) => match error {
                LayoutError::Io { .. }
                | LayoutError::CorruptBlob { .. }
                | LayoutError::LayerRefused { .. } => 3,
                LayoutError::NotSha256 { .. }
                | LayoutError::NotALayout { .. }
                | LayoutError::IndexJson { .. }
                | LayoutError::NoManifestsList { .. }
                | LayoutError::MissingBlob { .. }
                | LayoutError::NoManifest { .. }
                | LayoutError::SeveralManifests { .. }
                | LayoutError::Inspection(_) => 2,
            },
            Error::Test {
                source: crate::builder::platform_test::TestError::Unsupported(_),
                ..
            } => 2,
            Error::Interrupted => 130,
            _ => 3,
        }
    }

    /// A file polyarch reads or writes on its own (project-relative paths, the cache, the
    /// spool, outputs) that fails: a failure (exit 3). A file the user named on the command
    /// line that cannot be read is theirs to fix: a usage error (exit 2) worded by
    /// [`crate::base::text::unreadable_argument`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// A project file's mistakes and bad command-line values stay usage errors (exit 2), a
/// file it names that cannot be read stays an I/O error (exit 3).
impl From<crate::project::ProjectError> for Error {
    fn from(error: crate::project::ProjectError) -> Self {
        use crate::project::ProjectError;
        match error {
            ProjectError::File {
                file,
                field,
                message,
            } => Error::Project {
                file,
                field,
                message,
            },
            ProjectError::Usage(message) => Error::Usage(message),
            ProjectError::Read { path, source } | ProjectError::Write { path, source } => {
                Error::Io { path, source }
            }
        }
    }
}

/// A buildx line polyarch refuses, or a value it cannot take, is a usage error (exit 2);
/// the Dockerfile on standard input that cannot be read, a failure.
impl From<crate::flows::buildx::BuildxError> for Error {
    fn from(error: crate::flows::buildx::BuildxError) -> Self {
        use crate::flows::buildx::BuildxError;
        match error {
            BuildxError::Io { what, source } => Error::Io {
                path: PathBuf::from(what),
                source,
            },
            usage => Error::Usage(crate::base::text::one_line(&usage.to_string())),
        }
    }
}

/// A registry's failure keeps its registry and kind; credentials and a CA file that cannot
/// be read keep theirs.
impl From<crate::registry::ClientError> for Error {
    fn from(error: crate::registry::ClientError) -> Self {
        use crate::registry::ClientError;
        match error {
            ClientError::Registry { registry, source } => Error::Registry { registry, source },
            ClientError::Credentials(error) => Error::Credentials(error),
            ClientError::CaFile { path, source } => Error::Io { path, source },
        }
    }
}

impl From<crate::builder::export::ImageExportError> for Error {
    fn from(error: crate::builder::export::ImageExportError) -> Self {
        Error::Export {
            image: error.image,
            source: error.source,
        }
    }
}

/// Verify's failures cost what the source's (registry, layout) or the content's cost.
impl<E: Into<Error>> From<crate::verify::VerifyError<E>> for Error {
    fn from(error: crate::verify::VerifyError<E>) -> Self {
        use crate::verify::VerifyError;
        match error {
            VerifyError::Source(error) => error.into(),
            VerifyError::Content(error) => error.into(),
            VerifyError::Reference(error) => Error::Reference(error),
        }
    }
}

/// A destination's failures keep their kinds; provenance asked of a layout is the user's
/// to fix (exit 2).
impl From<crate::publish::store::StoreError> for Error {
    fn from(error: crate::publish::store::StoreError) -> Self {
        use crate::publish::store::StoreError;
        match error {
            StoreError::Registry(error) => error.into(),
            StoreError::Layout(error) => Error::Layout(error),
            StoreError::Reference(error) => Error::Reference(error),
            StoreError::AttachInLayout { .. } => Error::Usage(error.to_string()),
            StoreError::Sbom(error) => error.into(),
        }
    }
}

/// An SBOM's registry failures keep their kinds; a layer it cannot read is a failure.
impl From<crate::sbom::SbomError> for Error {
    fn from(error: crate::sbom::SbomError) -> Self {
        match error {
            crate::sbom::SbomError::Registry(error) => error.into(),
            other => Error::Sbom(Box::new(other)),
        }
    }
}

impl From<crate::publish::PublishError> for Error {
    fn from(error: crate::publish::PublishError) -> Self {
        use crate::publish::PublishError;
        match error {
            PublishError::Store(error) => error.into(),
            PublishError::Reference(error) => Error::Reference(error),
            PublishError::Interrupted => Error::Interrupted,
            PublishError::SigningKey(error) => Error::SigningKey(error),
        }
    }
}

/// The build area's failures keep the variants the pipeline matches on (a lost builder,
/// missing emulation) and their messages.
impl From<crate::builder::BuilderError> for Error {
    fn from(error: crate::builder::BuilderError) -> Self {
        use crate::builder::BuilderError;
        match error {
            BuilderError::Build {
                image,
                platform,
                source,
            } => Error::Build {
                image,
                platform,
                source,
            },
            BuilderError::Test {
                image,
                platform,
                source,
            } => Error::Test {
                image,
                platform,
                source,
            },
            BuilderError::Unreachable { platform, source } => Error::Builder { platform, source },
            BuilderError::Connect(error) => error.into(),
            BuilderError::Emulation(error) => Error::Emulation(error),
            BuilderError::Export(error) => error.into(),
            BuilderError::Registry(error) => error.into(),
            BuilderError::Credentials(error) => Error::Credentials(error),
            BuilderError::Inputs(error) => Error::Inputs(error),
            BuilderError::Io { path, source } => Error::Io { path, source },
        }
    }
}

impl From<crate::builder::binfmt::EmulationError> for Error {
    fn from(error: crate::builder::binfmt::EmulationError) -> Self {
        Error::Emulation(Box::new(error))
    }
}

/// The engine or the BuildKit daemon keeps its own variant, and so its message.
impl From<crate::docker::engine::ConnectError> for Error {
    fn from(error: crate::docker::engine::ConnectError) -> Self {
        match error {
            crate::docker::engine::ConnectError::Engine(error) => Error::Endpoint(error),
            crate::docker::engine::ConnectError::Daemon(error) => Error::Daemon(error),
        }
    }
}

impl From<crate::docker::buildkit::daemon::DaemonError> for Error {
    fn from(error: crate::docker::buildkit::daemon::DaemonError) -> Self {
        Error::Daemon(Box::new(error))
    }
}

/// Gate input mistakes stay usage errors (exit 2), failures to read stay I/O errors (exit 3).
impl From<crate::k8s::K8sError> for Error {
    fn from(error: crate::k8s::K8sError) -> Self {
        match error {
            crate::k8s::K8sError::Usage(message) => Error::Usage(message),
            crate::k8s::K8sError::Io { path, source } => Error::Io { path, source },
        }
    }
}

/// A part file's mistakes stay usage errors (exit 2), failures to write stay I/O errors (3).
impl From<crate::verify::coverage_record::RecordError> for Error {
    fn from(error: crate::verify::coverage_record::RecordError) -> Self {
        match error {
            crate::verify::coverage_record::RecordError::Usage(message) => Error::Usage(message),
            crate::verify::coverage_record::RecordError::Io { path, source } => {
                Error::Io { path, source }
            }
        }
    }
}

/// Exit codes as documented in `--help` and the book (docs/src/reference/exit-codes.md).
pub mod exit {
    pub const COVERED: i32 = 0;
    pub const GAP: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const FAILURE: i32 = 3;
    pub const INTERRUPTED: i32 = 130;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::platform::Platform;

    fn platform(text: &str) -> Platform {
        text.parse().unwrap()
    }

    /// Each area's error keeps its exit code through `?` into the crate-wide `Error`.
    fn exit_of(error: impl Into<Error>) -> i32 {
        error.into().exit_code()
    }

    #[test]
    fn project_mistakes_are_usage_errors_and_unreadable_files_failures() {
        use crate::project::ProjectError;
        let file = ProjectError::File {
            file: "polyarch.yaml".into(),
            field: "images.a.dockerfile".into(),
            message: "line 2: FROM polyarch:c names no image".into(),
        };
        let file = Error::from(file);
        assert_eq!(
            file.to_string(),
            "polyarch.yaml: images.a.dockerfile: line 2: FROM polyarch:c names no image"
        );
        assert_eq!(file.exit_code(), exit::USAGE);
        assert_eq!(exit_of(ProjectError::Usage("--set".into())), exit::USAGE);
        let read = ProjectError::Read {
            path: "a/Dockerfile".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert_eq!(exit_of(read), exit::FAILURE);
        let write = ProjectError::Write {
            path: "polyarch.yaml".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert_eq!(exit_of(write), exit::FAILURE);
    }

    #[test]
    fn an_unreadable_dockerfile_on_the_warm_path_is_a_failure() {
        let error = Error::from(crate::builder::build_inputs::InputsError::Dockerfile {
            path: "app/Dockerfile".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        });
        assert_eq!(error.to_string(), "app/Dockerfile: permission denied");
        assert_eq!(error.exit_code(), exit::FAILURE);
    }

    #[test]
    fn a_docker_config_to_fix_is_a_usage_error_and_a_failing_helper_a_failure() {
        use crate::registry::credentials::HelperError;
        let config = CredentialsError::Config {
            path: "config.json".into(),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        assert_eq!(exit_of(config), exit::USAGE);
        let auth = CredentialsError::Auth {
            path: "config.json".into(),
            registry: "r.io".into(),
        };
        assert_eq!(exit_of(auth), exit::USAGE);
        let read = CredentialsError::Read {
            path: "config.json".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        let read = Error::from(read);
        assert_eq!(read.to_string(), "config.json: permission denied");
        assert_eq!(read.exit_code(), exit::FAILURE);
        let helper = CredentialsError::Helper {
            registry: "r.io".into(),
            program: "docker-credential-pass".into(),
            source: HelperError::Wait(std::io::ErrorKind::Interrupted.into()),
        };
        assert_eq!(exit_of(helper), exit::FAILURE);
    }

    #[test]
    fn a_layout_that_is_not_what_was_asked_for_is_a_usage_error_and_damage_a_failure() {
        let dir = std::path::PathBuf::from("out");
        let not_a_layout = Error::from(LayoutError::NotALayout { dir: dir.clone() });
        assert_eq!(
            not_a_layout.to_string(),
            "out is not an OCI image layout (no oci-layout/index.json); build into it with --output oci:out"
        );
        assert_eq!(not_a_layout.exit_code(), exit::USAGE);
        let no_tag = LayoutError::NoManifest {
            dir: dir.clone(),
            tag: Some("v1".into()),
        };
        assert_eq!(no_tag.to_string(), "out: no manifest tagged `v1`");
        assert_eq!(exit_of(no_tag), exit::USAGE);
        let digest = crate::base::digest::Digest::of(b"a");
        let corrupt = Error::from(LayoutError::CorruptBlob {
            dir: dir.clone(),
            digest: digest.clone(),
            computed: crate::base::digest::Digest::of(b"b"),
        });
        assert!(corrupt
            .to_string()
            .starts_with(&format!("registry out: blob {digest} is corrupt (")));
        assert_eq!(corrupt.exit_code(), exit::FAILURE);
        let io = LayoutError::Io {
            path: dir.join("index.json"),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert_eq!(exit_of(io), exit::FAILURE);
    }

    #[test]
    fn registry_client_errors_keep_their_registry_kind_and_exit_code() {
        use crate::registry::{ClientError, RegistryError};
        let not_found = Error::from(ClientError::registry(
            "r.io",
            RegistryError::NotFound {
                what: "read manifest".into(),
                reference: "r.io/a:v1".into(),
            },
        ));
        assert_eq!(
            not_found.to_string(),
            "registry r.io: cannot read manifest for r.io/a:v1: not found"
        );
        assert!(matches!(
            &not_found,
            Error::Registry { registry, source }
                if registry == "r.io" && matches!(**source, RegistryError::NotFound { .. })
        ));
        assert_eq!(not_found.exit_code(), exit::FAILURE);
        let ca_file = Error::from(ClientError::CaFile {
            path: "ca.pem".into(),
            source: std::io::ErrorKind::NotFound.into(),
        });
        assert!(matches!(ca_file, Error::Io { .. }));
        assert_eq!(ca_file.to_string(), "ca.pem: entity not found");
        let config = ClientError::from(CredentialsError::Auth {
            path: "config.json".into(),
            registry: "r.io".into(),
        });
        assert_eq!(exit_of(config), exit::USAGE);
    }

    #[test]
    fn an_engine_that_cannot_be_reached_says_so_as_before_and_is_a_failure() {
        use crate::docker::endpoint::EndpointError;
        use crate::docker::engine::ConnectError;
        let unknown = || EndpointError::UnknownContext {
            name: "nope".into(),
            meta: "meta.json".into(),
        };
        let connect = ConnectError::from(unknown());
        let error = Error::from(unknown());
        assert_eq!(connect.to_string(), error.to_string());
        assert!(error
            .to_string()
            .starts_with("docker engine: `nope` is neither"));
        let error = Error::from(connect);
        assert!(matches!(
            error,
            Error::Endpoint(EndpointError::UnknownContext { .. })
        ));
        assert_eq!(error.exit_code(), exit::FAILURE);
    }

    #[test]
    fn verify_errors_cost_what_their_source_or_content_costs() {
        use crate::registry::{ClientError, RegistryError};
        use crate::verify::VerifyError;
        let layout = VerifyError::Source(LayoutError::NoManifest {
            dir: "out".into(),
            tag: None,
        });
        let layout = Error::from(layout);
        assert_eq!(layout.to_string(), "out: no manifest at all");
        assert_eq!(layout.exit_code(), exit::USAGE);
        let content = VerifyError::<LayoutError>::Content(ClientError::registry(
            "r.io",
            RegistryError::EntryNotImage {
                reference: "r.io/a:v1".into(),
                digest: "sha256:ab".into(),
            },
        ));
        let content = Error::from(content);
        assert!(matches!(content, Error::Registry { .. }));
        assert_eq!(
            content.to_string(),
            "registry r.io: cannot read r.io/a:v1: entry sha256:ab is not an image manifest"
        );
        assert_eq!(content.exit_code(), exit::FAILURE);
        let tag = crate::base::reference::parse_reference("r.io/a:bad tag").unwrap_err();
        assert_eq!(exit_of(VerifyError::<ClientError>::from(tag)), exit::USAGE);
    }

    #[test]
    fn provenance_asked_of_a_layout_is_a_usage_error_and_a_corrupt_read_back_a_failure() {
        use crate::publish::store::StoreError;
        let attach = Error::from(StoreError::AttachInLayout {
            dir: "out".into(),
            image: "api".into(),
        });
        assert_eq!(
            attach.to_string(),
            "--output oci:out: provenance and SBOMs are attached in a registry only; push to the registry, or build api without them"
        );
        assert_eq!(attach.exit_code(), exit::USAGE);
        let corrupt = StoreError::from(crate::verify::VerifyError::Source(
            LayoutError::CorruptBlob {
                dir: "out".into(),
                digest: crate::base::digest::Digest::of(b"a"),
                computed: crate::base::digest::Digest::of(b"b"),
            },
        ));
        assert!(matches!(corrupt, StoreError::Layout(_)));
        assert_eq!(exit_of(corrupt), exit::FAILURE);
    }

    #[test]
    fn a_publish_interrupted_before_its_tags_move_exits_130() {
        use crate::publish::PublishError;
        let interrupted = Error::from(PublishError::Interrupted);
        assert!(matches!(interrupted, Error::Interrupted));
        assert_eq!(interrupted.to_string(), "interrupted");
        assert_eq!(interrupted.exit_code(), exit::INTERRUPTED);
    }

    #[test]
    fn the_build_area_s_errors_keep_the_variants_the_pipeline_matches_on() {
        use crate::builder::binfmt::EmulationError;
        use crate::builder::{BuildError, BuilderError};
        let lost = Error::from(BuilderError::Build {
            image: "api".into(),
            platform: "linux/arm64".into(),
            source: BuildError::BuilderLost("transport error".into()),
        });
        assert_eq!(
            lost.to_string(),
            "build of api for linux/arm64 failed: transport error"
        );
        assert!(matches!(
            lost,
            Error::Build {
                source: BuildError::BuilderLost(_),
                ..
            }
        ));
        let exec = EmulationError::ExecFormat {
            platform: platform("linux/arm64"),
        };
        let exec = Error::from(BuilderError::from(exec));
        assert_eq!(
            exec.to_string(),
            Error::from(EmulationError::ExecFormat {
                platform: platform("linux/arm64"),
            })
            .to_string()
        );
        assert!(
            matches!(&exec, Error::Emulation(kind) if matches!(**kind, EmulationError::ExecFormat { .. }))
        );
        let unreachable = BuilderError::Unreachable {
            platform: "linux/arm64".into(),
            source: crate::docker::endpoint::EndpointError::UnknownContext {
                name: "arm".into(),
                meta: "meta.json".into(),
            },
        };
        let text = unreachable.to_string();
        let unreachable = Error::from(unreachable);
        assert!(matches!(unreachable, Error::Builder { .. }));
        assert_eq!(unreachable.to_string(), text);
        assert_eq!(unreachable.exit_code(), exit::FAILURE);
    }

    #[test]
    fn emulation_errors_are_failures_and_say_their_area() {
        use crate::builder::binfmt::EmulationError;
        let never = EmulationError::Never {
            platforms: vec![platform("linux/arm64")],
            native: platform("linux/amd64"),
        };
        let archive = EmulationError::Archive {
            path: "probe".into(),
            source: std::io::ErrorKind::OutOfMemory.into(),
        };
        assert_eq!(
            Error::from(archive).to_string(),
            "emulation: probe: out of memory"
        );
        for error in [
            never,
            EmulationError::Container(crate::docker::container::ContainerError::NoStatus {
                container: "polyarch-probe-1".into(),
            }),
        ] {
            assert_eq!(exit_of(error), exit::FAILURE);
        }
    }
}

//! The command line as clap reads it: commands, their flags and their help.

use clap::{Parser, Subcommand, ValueEnum};
use polyarch::base::annotations::AnnotationFlag;
use polyarch::base::duration::parse_duration;
pub use polyarch::flows::buildx::BuildxBuildArgs;
use polyarch::project::contexts::ContextFlag;
use polyarch::project::{BinfmtMode, CacheRef, Override, SecretFlag, SshFlag};
use polyarch::Platform;
use std::path::PathBuf;
use std::time::Duration;

const GATE_EXIT_CODES: &str = "Exit codes:\n  0    every pool a pod may land on is covered (warnings may remain: attestation entries, mutable tags pulled with IfNotPresent)\n  1    refused: a reachable pool's os/arch is missing, or the entry it would pull is another platform (config; --deep: binary), or --strict and an attestation entry\n  2    usage, manifest or nodes-file error\n  3    an image could not be read (the others are still checked and recorded)\n  130  interrupted";
const EXIT_CODES: &str = "Exit codes:\n  0    every declared platform is covered\n  1    a coverage gap was found (missing platform, config mismatch, attestation entry, no provenance with --require-provenance, no SBOM with --require-sbom or --sbom, no signature by a --key with --require-signature)\n  2    usage or project-file error\n  3    engine, build or registry failure\n  130  interrupted";

#[derive(Parser)]
#[command(name = "polyarch", version, about = "Build and ship multi-architecture container images, and prove they cover the hardware they will run on", after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
    /// Tables for job summaries and merge-request comments.
    Markdown,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SchemaKind {
    Project,
    Coverage,
    Gate,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BinfmtArg {
    Auto,
    Never,
    Require,
}

impl From<BinfmtArg> for BinfmtMode {
    fn from(arg: BinfmtArg) -> Self {
        match arg {
            BinfmtArg::Auto => BinfmtMode::Auto,
            BinfmtArg::Never => BinfmtMode::Never,
            BinfmtArg::Require => BinfmtMode::Require,
        }
    }
}

#[derive(clap::Args)]
pub struct Output {
    /// Write the record (JSON) to this file: the coverage record, or for `gate` the gate
    /// record.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// text: human summary on stdout; json: the record on stdout and JSON-lines events on
    /// stderr; markdown: coverage tables on stdout (job summaries, merge-request comments).
    #[arg(long, value_enum, default_value = "text")]
    pub output_format: OutputFormat,
    /// Plain lines instead of progress bars, and less of them.
    #[arg(long, short)]
    pub quiet: bool,
    /// Show build output of every platform.
    #[arg(long, short)]
    pub verbose: bool,
}

#[derive(clap::Args)]
pub struct RegistryArgs {
    /// Treat this registry (host[:port]) as Docker treats an insecure one: TLS without
    /// certificate checks, or plain HTTP. Loopback registries may always speak plain HTTP.
    #[arg(long, value_name = "HOST")]
    pub insecure_registry: Vec<String>,
    /// Registry user name; the password is read from stdin (--password-stdin).
    #[arg(long, requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Trust this CA certificate (PEM) for registry TLS.
    #[arg(long, value_name = "FILE", env = "SSL_CERT_FILE")]
    pub ca_cert: Option<PathBuf>,
}

// Parsed once per process: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Build every declared platform, push one index per tag, read it back and report coverage.
    #[command(after_help = EXIT_CODES)]
    Build(BuildArgs),
    /// Check existing tags: a reference against --platform, or a project's images against
    /// their declared platforms. Needs no engine.
    #[command(after_help = EXIT_CODES)]
    Verify(VerifyArgs),
    /// Publish the parts that split runners pushed by digest as one index per image, then
    /// read it back. Nothing is published when a declared platform has no part or two.
    #[command(after_help = EXIT_CODES)]
    Assemble(AssembleArgs),
    /// Show, without building, how each image × platform would build on this engine.
    Plan(PlanArgs),
    /// Write the polyarch.yaml equivalent to bake or compose files, with comments where
    /// a value was computed or its meaning differs from bake's.
    Init(InitArgs),
    /// Check engine, BuildKit, emulation and registries in one go; exit 0 only when all
    /// declared work can run.
    Doctor(DoctorArgs),
    /// Print a JSON Schema: of the project file (for editors), the coverage record or the
    /// gate record.
    Schema(SchemaArgs),
    /// Print shell completions.
    Completions(CompletionsArgs),
    /// Print the man page (roff).
    Man,
    /// Print polyarch's version and the engine it would use (for `docker polyarch
    /// version`: the one the Docker CLI's --context, --host or DOCKER_CONFIG selected).
    Version,
    /// Write the SPDX SBOM attached to one platform of an image to standard output
    /// (exit 1 when none is attached).
    Sbom(SbomArgs),
    /// Refuse a deploy whose images do not cover every node pool its pods may land on.
    #[command(after_help = GATE_EXIT_CODES)]
    Gate(GateArgs),
    /// Run a `docker buildx build` line as it is: prefix it with `polyarch` and the one
    /// image it names is built, pushed and verified as `build` does.
    Buildx(BuildxArgs),
}

#[derive(clap::Args)]
pub struct BuildxArgs {
    #[command(subcommand)]
    pub command: BuildxCommand,
}

#[derive(Subcommand)]
pub enum BuildxCommand {
    /// `docker buildx build`'s flags and context, unchanged; a flag polyarch has no
    /// equivalent for is refused (exit 2) naming what to use instead. Without --push or
    /// --output the image is built and verified in a temporary OCI layout, and nothing
    /// is shipped.
    // A repeated single-valued flag takes its last value, as buildx's do.
    #[command(after_help = EXIT_CODES, args_override_self = true)]
    Build(BuildxBuildArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// The project file; bake and compose files may be given several times, merged in
    /// bake's order.
    #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
    pub file: Vec<PathBuf>,
    /// Images to build (all when none are named).
    pub images: Vec<String>,
    /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
    /// dockerfile, platforms, target; lists comma-separated) or
    /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
    #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
    pub set: Vec<Override>,
    /// Only these platforms (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub platform: Vec<Platform>,
    /// Solves (one per platform, or one per image whose platforms build together) and
    /// uploads running at once [default: 2; solves the engine pushes itself: 16].
    #[arg(long, short = 'j', value_parser = parse_jobs)]
    pub jobs: Option<usize>,
    /// How to treat foreign platforms that need emulation (overrides polyarch.yaml).
    #[arg(long, value_enum, value_name = "MODE")]
    pub binfmt: Option<BinfmtArg>,
    /// Installer image for QEMU binfmt registration (default tonistiigi/binfmt, or one
    /// assembled from the host's qemu-user-static when it cannot be pulled).
    #[arg(long, value_name = "IMAGE")]
    pub binfmt_image: Option<String>,
    /// Build even when a platform's inputs (context, Dockerfile, build args, base
    /// image IDs) match what an earlier run built and pushed.
    #[arg(long)]
    pub rebuild: bool,
    /// Run each image's `test:` in every platform's pushed image before any tag moves
    /// (the default when `test:` is set).
    #[arg(long, overrides_with = "no_test")]
    pub test: bool,
    /// Do not run the images' `test:`; the record says skipped.
    #[arg(long, overrides_with = "test")]
    pub no_test: bool,
    /// A secret the build may mount (`RUN --mount=type=secret,id=ID`), read from an
    /// environment variable or a file when the build asks; adds to, or replaces by id,
    /// each image's `secrets:`. Repeatable.
    #[arg(long, value_name = "id=ID,env=NAME|id=ID,src=PATH")]
    pub secret: Vec<SecretFlag>,
    /// A named context the Dockerfile reads as `FROM NAME` or `COPY --from=NAME`: a
    /// directory (relative to the working directory) or docker-image://REF, as buildx's
    /// flag; adds to, or replaces by name, each image's `contexts:`. Repeatable.
    #[arg(
        long = "build-context",
        value_name = "NAME=DIR|NAME=docker-image://REF"
    )]
    pub build_context: Vec<ContextFlag>,
    /// An SSH agent the build may use (`RUN --mount=type=ssh[,id=ID]`): `default` or
    /// ID forwards $SSH_AUTH_SOCK, ID=SOCKET another agent's socket; adds to, or
    /// replaces by id, each image's `ssh:`. Repeatable.
    #[arg(long, value_name = "default|ID[=SOCKET]")]
    pub ssh: Vec<SshFlag>,
    /// Import build cache from this registry reference; each platform reads the tag
    /// with `-OS-ARCH[-VARIANT]` appended (`app:cache` → `app:cache-linux-arm64`).
    /// Adds to each image's `cache.from`. Repeatable.
    #[arg(long, value_name = "REF")]
    pub cache_from: Vec<CacheRef>,
    /// Export the build cache (every step, mode=max) to this registry reference, one
    /// tag per platform as for --cache-from; replaces the image's `cache.to`. Needs an
    /// engine with the containerd image store (others warn and skip the export).
    #[arg(long, value_name = "REF")]
    pub cache_to: Option<CacheRef>,
    /// Pull every base image, even one the engine already holds.
    #[arg(long)]
    pub pull: bool,
    /// Run every build step, using no cached result; implies --rebuild.
    #[arg(long)]
    pub no_cache: bool,
    /// An OCI annotation, as buildx spells it: [index:|manifest:|index,manifest:]KEY=VALUE
    /// (no prefix: on each platform manifest). Added to each image's `annotations:`.
    /// Repeatable.
    #[arg(long, value_name = "[TYPES:]KEY=VALUE")]
    pub annotation: Vec<AnnotationFlag>,
    /// Build reproducibly: every time stamp in the images (files, config, history) at
    /// most this many seconds since 1970, e.g. the release commit's time
    /// (`git log -1 --format=%ct`); the same inputs then push the same digests.
    #[arg(long, value_name = "SECONDS", env = "SOURCE_DATE_EPOCH")]
    pub source_date_epoch: Option<u64>,
    /// Attach SLSA provenance to every platform image built (as each image's
    /// `provenance: true`): an OCI referrer of its manifest, never an index entry.
    #[arg(long)]
    pub provenance: bool,
    /// A platform image without SLSA provenance attached is a coverage gap (exit 1).
    #[arg(long)]
    pub require_provenance: bool,
    /// Attach an SPDX SBOM to every platform image built (as each image's `sbom: true`),
    /// made by polyarch from the image's layers: an OCI referrer beside provenance.
    #[arg(long)]
    pub sbom: bool,
    /// A platform image read back without an SBOM attached is a coverage gap (exit 1).
    /// Images with `sbom: true` require it anyway.
    #[arg(long)]
    pub require_sbom: bool,
    /// After the push, the index and each platform manifest read back must carry a
    /// signature by one of the --key keys (or, with none given, by the image's own signing
    /// key); a missing or bad one is a coverage gap (exit 1).
    #[arg(long)]
    pub require_signature: bool,
    /// A PEM public key (`cosign.pub`) that signatures may be made by; repeatable, any one
    /// suffices.
    #[arg(long = "key", value_name = "PUB.pem", requires = "require_signature")]
    pub keys: Vec<PathBuf>,
    /// Sign the index and every platform manifest with this private key before any tag
    /// moves (as each image's `sign: {key: PATH}`): a key from `cosign generate-key-pair`
    /// (its password from COSIGN_PASSWORD or --sign-password-stdin) or a PKCS#8 ECDSA
    /// P-256 PEM. The signatures are Sigstore bundles attached as OCI referrers, as
    /// `cosign sign --key` writes them.
    #[arg(long, value_name = "PATH")]
    pub sign_key: Option<std::path::PathBuf>,
    /// Read the signing key's password from stdin (instead of COSIGN_PASSWORD).
    #[arg(long, conflicts_with = "password_stdin")]
    pub sign_password_stdin: bool,
    /// Record each build in the BuildKit's build history (`docker buildx history`,
    /// Docker Desktop's Builds view), as `docker buildx build` does. Off by default: the
    /// engine spends ~50 ms after every push writing the record and its provenance.
    #[arg(long)]
    pub build_history: bool,
    /// Split runners: push this runner's platforms by digest and record them as a part
    /// (--record FILE) for `polyarch assemble`; no tag moves.
    #[arg(long)]
    pub push_by_digest: bool,
    /// Write an OCI image layout instead of pushing: `oci:DIR`.
    #[arg(long, value_name = "oci:DIR")]
    pub output: Option<String>,
    #[command(flatten)]
    pub output_args: Output,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// A tag or digest reference (`host/repo:tag`, `host/repo@sha256:…`); with -f, the
    /// images to verify (all when none are named).
    #[arg(value_name = "REFERENCE|IMAGE", required_unless_present = "file")]
    pub targets: Vec<String>,
    /// Platforms the reference must provide (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub platform: Vec<Platform>,
    /// Verify the images of this project file instead.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
    /// dockerfile, platforms, target; lists comma-separated) or
    /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
    #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE", requires = "file")]
    pub set: Vec<Override>,
    /// Also stream each platform's layers and check that its entrypoint binary is built
    /// for that platform (ELF machine, class, endianness).
    #[arg(long)]
    pub deep: bool,
    /// A platform entry without SLSA provenance attached (an OCI referrer with predicate
    /// type https://slsa.dev/provenance/v1) is a coverage gap (exit 1). With -f, images
    /// with `provenance: true` require it anyway.
    #[arg(long)]
    pub require_provenance: bool,
    /// Also run each image's `test:` in the platform images its tags name now, on the
    /// default engine (a foreign platform under QEMU); a failed test is a gap (exit 1).
    /// Needs an engine with BuildKit.
    #[arg(long, requires = "file")]
    pub test: bool,
    /// Read the SBOM attached to each platform entry and print its package counts; an
    /// entry without one is a coverage gap (exit 1), as with --require-sbom.
    #[arg(long)]
    pub sbom: bool,
    /// A platform entry without an SBOM attached (an OCI referrer with predicate type
    /// https://spdx.dev/Document) is a coverage gap (exit 1). With -f, images with
    /// `sbom: true` require it anyway.
    #[arg(long)]
    pub require_sbom: bool,
    /// The index and each platform manifest must carry a signature (a Sigstore bundle
    /// attached as an OCI referrer, by polyarch or `cosign sign --key`) by one of the
    /// --key keys over its digest; a missing or bad one is a coverage gap (exit 1). With
    /// -f, images with `sign:` require it anyway.
    #[arg(long)]
    pub require_signature: bool,
    /// A PEM public key (`cosign.pub`) that signatures may be made by; repeatable, any one
    /// suffices. With -f and none given, each `sign:` image's own key's public half.
    #[arg(long = "key", value_name = "PUB.pem")]
    pub keys: Vec<PathBuf>,
    /// Give up (exit 3) when the whole check takes longer: 90s, 5m, 1m30s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct SbomArgs {
    /// A tag or digest reference (`host/repo:tag`, `host/repo@sha256:…`).
    #[arg(value_name = "REFERENCE")]
    pub reference: String,
    /// The platform whose SBOM to write, e.g. linux/arm64.
    #[arg(long)]
    pub platform: Platform,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct AssembleArgs {
    #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
    pub file: PathBuf,
    /// Part records written by `build --push-by-digest --record FILE`.
    #[arg(required = true, value_name = "PART")]
    pub parts: Vec<PathBuf>,
    /// Only these images (all images found in the parts by default).
    #[arg(long = "image")]
    pub images: Vec<String>,
    /// Publish parts whose platforms were not tested (built with --no-test or without
    /// `test:`); a part whose test failed is refused all the same.
    #[arg(long)]
    pub no_test: bool,
    /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
    /// dockerfile, platforms, target; lists comma-separated) or
    /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
    #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
    pub set: Vec<Override>,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct PlanArgs {
    /// The project file; bake and compose files may be given several times, merged in
    /// bake's order.
    #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
    pub file: Vec<PathBuf>,
    /// Images to plan (all when none are named).
    pub images: Vec<String>,
    /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
    /// dockerfile, platforms, target; lists comma-separated) or
    /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
    #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
    pub set: Vec<Override>,
    /// Emulation mode to plan with (overrides polyarch.yaml).
    #[arg(long, value_enum, value_name = "MODE")]
    pub binfmt: Option<BinfmtArg>,
    #[arg(long, value_enum, default_value = "text")]
    pub output_format: OutputFormat,
    /// Print a bake or compose file's resolved definition as `docker buildx bake --print`
    /// does (JSON: group, target) instead of the plan; no engine is asked.
    #[arg(long, conflicts_with_all = ["set", "binfmt"])]
    pub print: bool,
}

#[derive(clap::Args)]
pub struct InitArgs {
    /// A bake or compose file to convert; several are merged in bake's order, as several
    /// -f are. Default: bake's own files found here (docker-bake.hcl, compose.yaml, …).
    #[arg(long = "from", value_name = "FILE")]
    pub from: Vec<PathBuf>,
    /// Targets or groups to write (bake's default group when none are named); the
    /// targets they read as `target:` contexts are written too.
    pub targets: Vec<String>,
    /// Where to write it; `-` writes to standard output.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "PATH",
        default_value = "polyarch.yaml"
    )]
    pub output: PathBuf,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Override a resolved value before it is written: IMAGE.FIELD=VALUE, as for plan
    /// (e.g. `'*.platforms=linux/amd64,linux/arm64'` where bake's targets have none).
    #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
    pub set: Vec<Override>,
}

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Also check this project's platforms and registries (when the file exists).
    #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
    pub file: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub output_format: OutputFormat,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct SchemaArgs {
    #[arg(value_enum, default_value = "project")]
    pub which: SchemaKind,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub struct GateArgs {
    /// Kubernetes YAML files or directories (helm template / kustomize build output).
    #[arg(long, required = true, value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
    /// `kubectl get nodes -o json` output, or a pool file (`pools: [{name, labels, taints, count}]`).
    #[arg(long, value_name = "FILE")]
    pub nodes: PathBuf,
    /// Also check each entry's entrypoint binary against its platform (streams the layers).
    #[arg(long)]
    pub deep: bool,
    /// Refuse images whose index has attestation entries (unknown/unknown) instead of warning.
    #[arg(long)]
    pub strict: bool,
    /// Refuse images with a platform entry that has no SBOM attached (an OCI referrer with
    /// predicate type https://spdx.dev/Document).
    #[arg(long)]
    pub require_sbom: bool,
    /// Refuse images whose index or platform manifests lack a signature (a Sigstore bundle
    /// attached as an OCI referrer, by polyarch or `cosign sign --key`) by one of the --key
    /// keys over their digest.
    #[arg(long, requires = "keys")]
    pub require_signature: bool,
    /// A PEM public key (`cosign.pub`) signatures may be made by; repeatable, any one suffices.
    #[arg(long = "key", value_name = "PUB.pem", requires = "require_signature")]
    pub keys: Vec<PathBuf>,
    /// Write the manifests into this new or empty directory with every image checked
    /// pinned to the digest checked (repo:tag@sha256:…), ready for `kubectl apply -f DIR`.
    #[arg(long, value_name = "DIR")]
    pub pin: Option<PathBuf>,
    /// Give up (exit 3) when the whole gate takes longer: 90s, 5m, 1m30s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// `--jobs`: a count of at least one.
fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("at least 1 is needed (one build or upload at a time)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a number")),
    }
}

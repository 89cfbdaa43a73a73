//! The polyarch CLI: parses arguments, picks a reporter, runs the library, maps the
//! outcome to the documented exit codes.

use clap::{Parser, Subcommand, ValueEnum};
use polyarch::annotations::AnnotationFlag;
use polyarch::cleanup::Cleanup;
use polyarch::credentials::Credential;
use polyarch::engine::Engine;
use polyarch::error::exit;
use polyarch::pipeline::{self, BuildOptions};
use polyarch::progress::{JsonReporter, PlainReporter, Reporter, TerminalReporter};
use polyarch::project::{
    BinfmtMode, BuildFlags, CacheRef, LoadOptions, Override, Project, Purpose, SecretFlag, SshFlag,
};
use polyarch::record::CoverageRecord;
use polyarch::registry::RegistryOptions;
use polyarch::{Error, Platform};
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

const GATE_EXIT_CODES: &str = "Exit codes:\n  0    every pool a pod may land on is covered (warnings may remain: attestation entries, mutable tags pulled with IfNotPresent)\n  1    refused: a reachable pool's os/arch is missing, or the entry it would pull is another platform (config; --deep: binary), or --strict and an attestation entry\n  2    usage, manifest or nodes-file error\n  3    an image could not be read (the others are still checked and recorded)\n  130  interrupted";
const EXIT_CODES: &str = "Exit codes:\n  0    every declared platform is covered\n  1    a coverage gap was found (missing platform, config mismatch, attestation entry)\n  2    usage or project-file error\n  3    engine, build or registry failure\n  130  interrupted";

#[derive(Parser)]
#[command(name = "polyarch", version, about = "Build and ship multi-architecture container images, and prove they cover the hardware they will run on", after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum SchemaKind {
    Project,
    Coverage,
    Gate,
}

#[derive(Clone, Copy, ValueEnum)]
enum BinfmtArg {
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
struct Output {
    /// Write the coverage record (JSON) to this file.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// text: human summary on stdout; json: the record on stdout and JSON-lines events on stderr.
    #[arg(long, value_enum, default_value = "text")]
    output_format: OutputFormat,
    /// Plain lines instead of progress bars, and less of them.
    #[arg(long, short)]
    quiet: bool,
    /// Show build output of every platform.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(clap::Args)]
struct RegistryArgs {
    /// Treat this registry (host[:port]) as Docker treats an insecure one: TLS without
    /// certificate checks, or plain HTTP. Loopback registries may always speak plain HTTP.
    #[arg(long, value_name = "HOST")]
    insecure_registry: Vec<String>,
    /// Registry user name; the password is read from stdin (--password-stdin).
    #[arg(long, requires = "password_stdin")]
    username: Option<String>,
    /// Read the registry password from standard input.
    #[arg(long, requires = "username")]
    password_stdin: bool,
    /// Trust this CA certificate (PEM) for registry TLS.
    #[arg(long, value_name = "FILE", env = "SSL_CERT_FILE")]
    ca_cert: Option<PathBuf>,
}

// Parsed once per process: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Build every declared platform, push one index per tag, read it back and report coverage.
    #[command(after_help = EXIT_CODES)]
    Build {
        /// The project file.
        #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
        file: PathBuf,
        /// Images to build (all when none are named).
        images: Vec<String>,
        /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
        /// dockerfile, platforms, target; lists comma-separated) or
        /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
        #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
        set: Vec<Override>,
        /// Only these platforms (comma-separated).
        #[arg(long, value_delimiter = ',')]
        platform: Vec<Platform>,
        /// Solves (one per platform, or one per image whose platforms build together) and uploads running at once.
        #[arg(long, short = 'j', default_value_t = 2, value_parser = parse_jobs)]
        jobs: usize,
        /// How to treat foreign platforms that need emulation (overrides polyarch.yaml).
        #[arg(long, value_enum, value_name = "MODE")]
        binfmt: Option<BinfmtArg>,
        /// Installer image for QEMU binfmt registration (default tonistiigi/binfmt, or one
        /// assembled from the host's qemu-user-static when it cannot be pulled).
        #[arg(long, value_name = "IMAGE")]
        binfmt_image: Option<String>,
        /// Build even when a platform's inputs (context, Dockerfile, build args, base
        /// image IDs) match what an earlier run built and pushed.
        #[arg(long)]
        rebuild: bool,
        /// A secret the build may mount (`RUN --mount=type=secret,id=ID`), read from an
        /// environment variable or a file when the build asks; adds to, or replaces by id,
        /// each image's `secrets:`. Repeatable.
        #[arg(long, value_name = "id=ID,env=NAME|id=ID,src=PATH")]
        secret: Vec<SecretFlag>,
        /// An SSH agent the build may use (`RUN --mount=type=ssh[,id=ID]`): `default` or
        /// ID forwards $SSH_AUTH_SOCK, ID=SOCKET another agent's socket; adds to, or
        /// replaces by id, each image's `ssh:`. Repeatable.
        #[arg(long, value_name = "default|ID[=SOCKET]")]
        ssh: Vec<SshFlag>,
        /// Import build cache from this registry reference; each platform reads the tag
        /// with `-OS-ARCH[-VARIANT]` appended (`app:cache` → `app:cache-linux-arm64`).
        /// Adds to each image's `cache.from`. Repeatable.
        #[arg(long, value_name = "REF")]
        cache_from: Vec<CacheRef>,
        /// Export the build cache (every step, mode=max) to this registry reference, one
        /// tag per platform as for --cache-from; replaces the image's `cache.to`. Needs an
        /// engine with the containerd image store (others warn and skip the export).
        #[arg(long, value_name = "REF")]
        cache_to: Option<CacheRef>,
        /// Pull every base image, even one the engine already holds.
        #[arg(long)]
        pull: bool,
        /// Run every build step, using no cached result; implies --rebuild.
        #[arg(long)]
        no_cache: bool,
        /// An OCI annotation, as buildx spells it: [index:|manifest:|index,manifest:]KEY=VALUE
        /// (no prefix: on each platform manifest). Added to each image's `annotations:`.
        /// Repeatable.
        #[arg(long, value_name = "[TYPES:]KEY=VALUE")]
        annotation: Vec<AnnotationFlag>,
        /// Build reproducibly: every time stamp in the images (files, config, history) at
        /// most this many seconds since 1970, e.g. the release commit's time
        /// (`git log -1 --format=%ct`); the same inputs then push the same digests.
        #[arg(long, value_name = "SECONDS", env = "SOURCE_DATE_EPOCH")]
        source_date_epoch: Option<u64>,
        /// Split runners: push this runner's platforms by digest and record them as a part
        /// (--record FILE) for `polyarch assemble`; no tag moves.
        #[arg(long)]
        push_by_digest: bool,
        /// Write an OCI image layout instead of pushing: `oci:DIR`.
        #[arg(long, value_name = "oci:DIR")]
        output: Option<String>,
        #[command(flatten)]
        output_args: Output,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Check existing tags: a reference against --platform, or a project's images against
    /// their declared platforms. Needs no engine.
    #[command(after_help = EXIT_CODES)]
    Verify {
        /// A tag or digest reference (`host/repo:tag`, `host/repo@sha256:…`); with -f, the
        /// images to verify (all when none are named).
        #[arg(value_name = "REFERENCE|IMAGE", required_unless_present = "file")]
        targets: Vec<String>,
        /// Platforms the reference must provide (comma-separated).
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "file",
            conflicts_with = "file"
        )]
        platform: Vec<Platform>,
        /// Verify the images of this project file instead.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
        /// dockerfile, platforms, target; lists comma-separated) or
        /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
        #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE", requires = "file")]
        set: Vec<Override>,
        /// Also stream each platform's layers and check that its entrypoint binary is built
        /// for that platform (ELF machine, class, endianness).
        #[arg(long)]
        deep: bool,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Publish the parts that split runners pushed by digest as one index per image, then
    /// read it back. Nothing is published when a declared platform has no part or two.
    #[command(after_help = EXIT_CODES)]
    Assemble {
        #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
        file: PathBuf,
        /// Part records written by `build --push-by-digest --record FILE`.
        #[arg(required = true, value_name = "PART")]
        parts: Vec<PathBuf>,
        /// Only these images (all images found in the parts by default).
        #[arg(long = "image")]
        images: Vec<String>,
        /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
        /// dockerfile, platforms, target; lists comma-separated) or
        /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
        #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
        set: Vec<Override>,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Show, without building, how each image × platform would build on this engine.
    Plan {
        #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
        file: PathBuf,
        /// Images to plan (all when none are named).
        images: Vec<String>,
        /// Override a project-file value: IMAGE.FIELD=VALUE (repository, tags, context,
        /// dockerfile, platforms, target; lists comma-separated) or
        /// IMAGE.build_args.NAME=VALUE / IMAGE.labels.KEY=VALUE. IMAGE may use `*`. Repeatable.
        #[arg(long = "set", value_name = "IMAGE.FIELD=VALUE")]
        set: Vec<Override>,
        /// Emulation mode to plan with (overrides polyarch.yaml).
        #[arg(long, value_enum, value_name = "MODE")]
        binfmt: Option<BinfmtArg>,
        #[arg(long, value_enum, default_value = "text")]
        output_format: OutputFormat,
    },
    /// Check engine, BuildKit, emulation and registries in one go; exit 0 only when all
    /// declared work can run.
    Doctor {
        /// Also check this project's platforms and registries (when the file exists).
        #[arg(short = 'f', long = "file", default_value = "polyarch.yaml")]
        file: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        output_format: OutputFormat,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Print a JSON Schema: of the project file (for editors) or of the coverage record.
    Schema {
        #[arg(value_enum, default_value = "project")]
        which: SchemaKind,
    },
    /// Print shell completions.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
    /// Refuse a deploy whose images do not cover every node pool its pods may land on.
    #[command(after_help = GATE_EXIT_CODES)]
    Gate {
        /// Kubernetes YAML files or directories (helm template / kustomize build output).
        #[arg(long, required = true, value_name = "PATH")]
        manifests: Vec<PathBuf>,
        /// `kubectl get nodes -o json` output, or a pool file (`pools: [{name, labels, taints, count}]`).
        #[arg(long, value_name = "FILE")]
        nodes: PathBuf,
        /// Also check each entry's entrypoint binary against its platform (streams the layers).
        #[arg(long)]
        deep: bool,
        /// Refuse images whose index has attestation entries (unknown/unknown) instead of warning.
        #[arg(long)]
        strict: bool,
        /// Write the manifests into this new or empty directory with every image checked
        /// pinned to the digest checked (repo:tag@sha256:…), ready for `kubectl apply -f DIR`.
        #[arg(long, value_name = "DIR")]
        pin: Option<PathBuf>,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

fn reporter(output: &Output) -> Box<dyn Reporter> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    if output.output_format == OutputFormat::Json {
        Box::new(JsonReporter)
    } else if std::io::stderr().is_terminal() && !output.quiet && !ci {
        Box::new(TerminalReporter::new())
    } else {
        Box::new(PlainReporter::new(output.verbose))
    }
}

fn registry_options(args: &RegistryArgs) -> Result<RegistryOptions, Error> {
    let credentials = match &args.username {
        Some(user) => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .map_err(|e| {
                    Error::Usage(format!("--password-stdin: cannot read standard input: {e}"))
                })?;
            let password = password.trim_end_matches(['\r', '\n']).to_string();
            if password.is_empty() {
                return Err(Error::Usage(
                    "--password-stdin: standard input was empty; pipe the password in".into(),
                ));
            }
            Some((user.clone(), password))
        }
        None => None,
    };
    Ok(RegistryOptions {
        insecure: args.insecure_registry.clone(),
        credentials,
        ca_certs: args.ca_cert.iter().cloned().collect(),
        ..Default::default()
    })
}

/// Prints the record the way the output format asks and turns coverage into the exit code.
fn finish(record: &CoverageRecord, output: &Output) -> Result<i32, Error> {
    if let Some(path) = &output.record {
        record.write(path)?;
    }
    match output.output_format {
        OutputFormat::Json => println!("{}", record.to_json()),
        OutputFormat::Text => print!("{}", record.render_text()),
    }
    Ok(if record.covered {
        exit::COVERED
    } else {
        exit::GAP
    })
}

/// How a command reads the project file: for what, with its `--set` values.
fn loading(purpose: Purpose, overrides: &[Override]) -> LoadOptions<'_> {
    LoadOptions {
        purpose,
        overrides,
        ..Default::default()
    }
}

/// `--jobs`: a count of at least one.
fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("at least 1 is needed (one build or upload at a time)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a number")),
    }
}

/// After an interrupt or failure, builds cut off mid-way may still tag their image in
/// the engine: give cleanup time to catch those.
/// An interrupt cuts builds off mid-step, and a loaded engine may take several seconds to
/// finish one; a failure has usually let them end.
fn cleanup_grace<T>(outcome: &Result<T, Error>) -> std::time::Duration {
    match outcome {
        Ok(_) => std::time::Duration::ZERO,
        Err(Error::Interrupted) => std::time::Duration::from_secs(10),
        Err(_) => std::time::Duration::from_secs(3),
    }
}

/// First SIGINT cancels the work (a publish in progress still completes); a second one
/// exits at once.
fn interrupt_on_sigint() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(exit::INTERRUPTED);
            }
        }
    });
    token
}

async fn run(command: Command) -> Result<i32, Error> {
    let interrupt = interrupt_on_sigint();
    match command {
        Command::Build {
            file,
            images,
            set,
            platform,
            jobs,
            binfmt,
            binfmt_image,
            rebuild,
            secret,
            ssh,
            cache_from,
            cache_to,
            pull,
            no_cache,
            annotation,
            source_date_epoch,
            push_by_digest,
            output: destination,
            output_args: output,
            registry,
        } => {
            let mut project = Project::load(&file, &loading(Purpose::Build, &set))?;
            let layout = match destination {
                None => None,
                Some(d) => match polyarch::layout::parse_layout_reference(&d) {
                    Some((dir, None)) => Some(dir),
                    _ => {
                        return Err(Error::Usage(format!(
                            "--output {d}: expected oci:DIR (tags come from polyarch.yaml)"
                        )))
                    }
                },
            };
            let registry = registry_options(&registry)?;
            let login = registry
                .credentials
                .clone()
                .map(|(username, password)| Credential::Basic { username, password });
            let flags = BuildFlags {
                secrets: secret,
                ssh,
                cache_from,
                cache_to,
                pull,
                no_cache,
                annotations: annotation,
                source_date_epoch,
            };
            project.prepare_build(&images, &flags, login)?;
            let options = BuildOptions {
                images,
                platforms: platform,
                registry,
                jobs,
                layout,
                binfmt: binfmt.map(Into::into),
                binfmt_image,
                rebuild,
                interrupt: interrupt.clone(),
            };
            let reporter = reporter(&output);
            let engine = Engine::connect().await?;
            let cleanup = Cleanup::default();
            if push_by_digest {
                let outcome =
                    pipeline::build_part(&project, &engine, &options, &cleanup, reporter.as_ref())
                        .await;
                cleanup
                    .run(cleanup_grace(&outcome), reporter.as_ref())
                    .await;
                drop(reporter);
                let part = outcome?;
                if let Some(path) = &output.record {
                    std::fs::write(path, part.to_json() + "\n").map_err(|e| Error::io(path, e))?;
                }
                if output.output_format == OutputFormat::Json || output.record.is_none() {
                    println!("{}", part.to_json());
                }
                return Ok(exit::COVERED);
            }
            let outcome =
                pipeline::build(&project, &engine, &options, &cleanup, reporter.as_ref()).await;
            cleanup
                .run(cleanup_grace(&outcome), reporter.as_ref())
                .await;
            drop(reporter);
            finish(&outcome?.with_values(&project), &output)
        }
        Command::Assemble {
            file,
            parts,
            images,
            set,
            output,
            registry,
        } => {
            let project = Project::load(&file, &loading(Purpose::Verify, &set))?;
            let parts = parts
                .into_iter()
                .map(|path| polyarch::record::PartRecord::load(&path).map(|part| (path, part)))
                .collect::<Result<Vec<_>, _>>()?;
            let options = registry_options(&registry)?;
            let reporter = reporter(&output);
            let outcome = polyarch::assemble::assemble(
                &project,
                &parts,
                &images,
                &options,
                &interrupt,
                reporter.as_ref(),
            )
            .await;
            drop(reporter);
            finish(&outcome?.with_values(&project), &output)
        }
        Command::Plan {
            file,
            images,
            set,
            binfmt,
            output_format,
        } => {
            let project = Project::load(&file, &loading(Purpose::Build, &set))?;
            let engine = Engine::connect().await?;
            let options = BuildOptions {
                images,
                binfmt: binfmt.map(Into::into),
                ..Default::default()
            };
            let lines = polyarch::doctor::plan_report(&project, &engine, &options).await?;
            match output_format {
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&lines).expect("serialises")
                ),
                OutputFormat::Text => print!("{}", polyarch::doctor::render_plan(&lines)),
            }
            Ok(exit::COVERED)
        }
        Command::Doctor {
            file,
            output_format,
            registry,
        } => {
            let project = if file.exists() {
                Some(Project::load(&file, &LoadOptions::default())?)
            } else {
                None
            };
            let options = BuildOptions {
                registry: registry_options(&registry)?,
                ..Default::default()
            };
            let checks = polyarch::doctor::doctor(project.as_ref(), &options).await;
            match output_format {
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&checks).expect("serialises")
                ),
                OutputFormat::Text => print!("{}", polyarch::doctor::render_checks(&checks)),
            }
            let failed = checks
                .iter()
                .any(|c| c.verdict == polyarch::doctor::Verdict::Fail);
            Ok(if failed { exit::FAILURE } else { exit::COVERED })
        }
        Command::Schema { which } => {
            print!(
                "{}",
                match which {
                    SchemaKind::Project => polyarch::project::SCHEMA_JSON,
                    SchemaKind::Coverage => polyarch::record::SCHEMA_JSON,
                    SchemaKind::Gate => polyarch::gate::SCHEMA_JSON,
                }
            );
            Ok(exit::COVERED)
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "polyarch",
                &mut std::io::stdout(),
            );
            Ok(exit::COVERED)
        }
        Command::Man => {
            let man = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            man.render(&mut std::io::stdout())
                .map_err(|e| Error::io("stdout", e))?;
            Ok(exit::COVERED)
        }
        Command::Gate {
            manifests,
            nodes,
            deep,
            strict,
            pin,
            output,
            registry,
        } => {
            let options = polyarch::gate::GateOptions {
                manifests,
                nodes,
                deep,
                strict,
                pin,
            };
            let registry = registry_options(&registry)?;
            let reporter = reporter(&output);
            let report = tokio::select! {
                report = polyarch::gate::run(&options, &registry, reporter.as_ref()) => report?,
                _ = interrupt.cancelled() => return Err(Error::Interrupted),
            };
            drop(reporter);
            if let Some(path) = &output.record {
                report.write(path)?;
            }
            match output.output_format {
                OutputFormat::Json => println!("{}", report.to_json()),
                OutputFormat::Text => print!("{}", polyarch::gate::render_text(&report)),
            }
            Ok(report.exit_code())
        }
        Command::Verify {
            targets,
            platform,
            file,
            set,
            deep,
            output,
            registry,
        } => {
            let options = registry_options(&registry)?;
            let reporter = reporter(&output);
            let work = async {
                match (targets.as_slice(), &file) {
                    ([reference], None) => {
                        polyarch::verify::verify_reference(reference, &platform, &options, deep, reporter.as_ref()).await
                    }
                    (images, Some(file)) => {
                        let project = Project::load(file, &loading(Purpose::Verify, &set))?;
                        polyarch::verify::verify_project(&project, images, &options, deep, reporter.as_ref())
                            .await
                            .map(|record| record.with_values(&project))
                    }
                    _ => Err(Error::Usage(
                        "verify takes one REFERENCE with --platform, or -f polyarch.yaml [IMAGE ...]".into(),
                    )),
                }
            };
            let outcome = tokio::select! {
                outcome = work => outcome,
                _ = interrupt.cancelled() => Err(Error::Interrupted),
            };
            drop(reporter);
            finish(&outcome?, &output)
        }
    }
}

#[tokio::main]
async fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match run(cli.command).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    };
    std::process::exit(code);
}

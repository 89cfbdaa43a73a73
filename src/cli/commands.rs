//! One function per command: read the inputs, run the library, print what it found and
//! turn it into the documented exit code.

use super::args::*;
use super::report::{JsonReporter, PlainReporter, TerminalReporter};
use polyarch::base::progress::{Reporter, Silent};
use polyarch::builder::cleanup::Cleanup;
use polyarch::flows::error::exit;
use polyarch::flows::pipeline::{self, BuildOptions};
use polyarch::project::dependencies::Graph;
use polyarch::project::source_date_epoch::EpochSource;
use polyarch::project::{BuildFlags, LoadOptions, Override, Project, Purpose};
use polyarch::registry::credentials::Credential;
use polyarch::registry::RegistryOptions;
use polyarch::sign::PublicKey;
use polyarch::verify::coverage_record::{CoverageRecord, PartRecord};
use polyarch::Error;
use std::collections::BTreeMap;
use std::future::Future;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub async fn run(command: Command) -> Result<i32, Error> {
    let interrupt = interrupt_on_sigint();
    match command {
        Command::Build(args) => build(args, &interrupt).await,
        Command::Buildx(BuildxArgs {
            command: BuildxCommand::Build(args),
        }) => buildx(args, &interrupt).await,
        Command::Assemble(args) => assemble(args, &interrupt).await,
        Command::Verify(args) => {
            let what = match (args.targets.as_slice(), &args.file) {
                ([reference], None) => format!("verify {reference}"),
                (_, Some(file)) => format!("verify -f {}", file.display()),
                _ => "verify".to_string(),
            };
            let limit = args.timeout;
            let cleanup = Cleanup::default();
            let verified =
                until_interrupted(&interrupt, within(limit, what, verify(args, &cleanup))).await;
            // `--test` containers that an interrupt or `--timeout` cut off, before exit.
            cleanup.run(Duration::ZERO, &Silent).await;
            verified
        }
        Command::Gate(args) => {
            let limit = args.timeout;
            until_interrupted(&interrupt, within(limit, "gate".into(), gate(args))).await
        }
        Command::Plan(args) => plan(args).await,
        Command::Init(args) => init(args),
        Command::Sbom(args) => sbom(args).await,
        Command::Doctor(args) => doctor(args).await,
        Command::Schema(SchemaArgs { which }) => {
            print!(
                "{}",
                match which {
                    SchemaKind::Project => polyarch::project::SCHEMA_JSON,
                    SchemaKind::Coverage => polyarch::verify::coverage_record::SCHEMA_JSON,
                    SchemaKind::Gate => polyarch::flows::gate::SCHEMA_JSON,
                }
            );
            Ok(exit::COVERED)
        }
        Command::Completions(CompletionsArgs { shell }) => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "polyarch",
                &mut std::io::stdout(),
            );
            Ok(exit::COVERED)
        }
        Command::Version => {
            println!("polyarch {}", env!("CARGO_PKG_VERSION"));
            // Where builds would go, without connecting: what a plugin call selected.
            match polyarch::docker::endpoint::Endpoint::default_engine() {
                Ok(engine) if engine.name == engine.address() => {
                    println!("engine: {}", engine.name)
                }
                Ok(engine) => println!("engine: {} ({})", engine.name, engine.address()),
                Err(e) => println!("engine: {e}"),
            }
            Ok(exit::COVERED)
        }
        Command::Man => {
            let man = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            man.render(&mut std::io::stdout())
                .map_err(|e| Error::io("stdout", e))?;
            Ok(exit::COVERED)
        }
    }
}

/// Read-only commands stop where they are on SIGINT; build and assemble take the token
/// themselves, since a publish that has begun must complete.
async fn until_interrupted(
    interrupt: &CancellationToken,
    work: impl Future<Output = Result<i32, Error>>,
) -> Result<i32, Error> {
    tokio::select! {
        outcome = work => outcome,
        _ = interrupt.cancelled() => Err(Error::Interrupted),
    }
}

/// `--timeout`: the whole command within `limit`, else a failure naming `what` timed out.
async fn within(
    limit: Option<Duration>,
    what: String,
    work: impl Future<Output = Result<i32, Error>>,
) -> Result<i32, Error> {
    let Some(limit) = limit else {
        return work.await;
    };
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or(Err(Error::TimedOut { what, limit }))
}

/// Whether `--source-date-epoch` or the environment gave the epoch (clap reads both into
/// one value): the environment's when it holds that very value.
fn epoch_source(seconds: u64) -> EpochSource {
    let from_env = std::env::var("SOURCE_DATE_EPOCH").ok();
    match from_env.and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(env) if env == seconds => EpochSource::Env,
        _ => EpochSource::Flag,
    }
}

async fn build(args: BuildArgs, interrupt: &CancellationToken) -> Result<i32, Error> {
    let BuildArgs {
        file,
        images,
        set,
        platform,
        jobs,
        binfmt,
        binfmt_image,
        rebuild,
        test: _,
        no_test,
        secret,
        build_context,
        ssh,
        cache_from,
        cache_to,
        pull,
        no_cache,
        annotation,
        source_date_epoch,
        provenance,
        require_provenance,
        sbom,
        require_sbom,
        require_signature,
        keys,
        sign_key,
        sign_password_stdin,
        build_history,
        push_by_digest,
        output: destination,
        output_args: output,
        registry,
    } = args;
    let files = project_files(&file);
    let mut project = Project::load_files(&files, &loading(Purpose::Build, &set, &images))?;
    let images = project.expand(&images);
    let layout = destination.as_deref().map(layout_dir).transpose()?;
    let registry = registry_options(&registry)?;
    let login = registry
        .credentials
        .clone()
        .map(|(username, password)| Credential::Basic { username, password });
    let flags = BuildFlags {
        contexts: build_context,
        secrets: secret,
        ssh,
        cache_from,
        cache_to,
        pull,
        no_cache,
        annotations: annotation,
        source_date_epoch: source_date_epoch.map(|seconds| (seconds, epoch_source(seconds))),
        provenance,
        require_provenance,
        sbom,
        require_sbom,
        sign_key,
        sign_password: sign_password(sign_password_stdin)?,
        build_history,
    };
    // Selecting an image builds the images of the project it builds FROM too, with the
    // same flags, as bake builds a target's `target:` contexts. A cycle is refused here,
    // before any engine is asked.
    polyarch::project::plan::select(&project, &images)?;
    let graph = Graph::of(&project)?;
    let images = match images.is_empty() {
        true => images,
        false => graph.order(&images),
    };
    project.prepare_build(&images, &flags, login)?;
    if require_signature && push_by_digest {
        return Err(Error::Usage(
            "--require-signature: a --push-by-digest part has no index to check; check the assembled index with `polyarch verify -f polyarch.yaml --require-signature`".into(),
        ));
    }
    // Known before anything builds: a missing key is a usage error, not a late gap. The
    // keys themselves are awaited only to check, after the build (a signing key opens
    // beside it).
    let signing = match require_signature {
        true => signature_checks(&project, &images, true, &public_keys(&keys)?)?,
        false => BTreeMap::new(),
    };
    let options = BuildOptions {
        images,
        platforms: platform,
        registry,
        jobs,
        layout,
        binfmt: binfmt.map(Into::into),
        binfmt_image,
        rebuild,
        skip_tests: no_test,
        interrupt: interrupt.clone(),
    };
    run_build(&project, &options, push_by_digest, signing, &output).await
}

/// Builds (the whole job, or `--push-by-digest`'s part), then removes what the run left in
/// the engines, whether or not it succeeded.
async fn run_build(
    project: &Project,
    options: &BuildOptions,
    push_by_digest: bool,
    signing: BTreeMap<String, CheckKeys>,
    output: &Output,
) -> Result<i32, Error> {
    let reporter = reporter(output);
    if push_by_digest {
        // Reached by the pipeline beside the registry.
        let engine = async {
            Ok(
                polyarch::builder::default_engine(project, &options.images, &options.platforms)
                    .await?,
            )
        };
        let cleanup = Cleanup::default();
        let outcome =
            pipeline::build_part(project, engine, options, &cleanup, reporter.as_ref()).await;
        cleanup
            .run(cleanup_grace(&outcome), reporter.as_ref())
            .await;
        drop(reporter);
        return write_part(&outcome?, output);
    }
    let outcome = build_and_verify(project, options, reporter.as_ref()).await;
    drop(reporter);
    let mut record = outcome?;
    if !signing.is_empty() {
        let signing = check_keys(signing).await?;
        polyarch::flows::signatures::require(&mut record, &signing, &options.registry).await?;
    }
    finish(&record.with_values(project), output)
}

/// The whole job up to the record read back, then removes what the run left in the
/// engines, whether or not it succeeded.
async fn build_and_verify(
    project: &Project,
    options: &BuildOptions,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord, Error> {
    // Reached by the pipeline beside the registry.
    let engine = async {
        Ok(polyarch::builder::default_engine(project, &options.images, &options.platforms).await?)
    };
    let cleanup = Cleanup::default();
    let outcome = pipeline::build(project, engine, options, &cleanup, reporter).await;
    cleanup.run(cleanup_grace(&outcome), reporter).await;
    outcome
}

/// `polyarch buildx build …`: the line read into a one-image project, built, pushed (or
/// laid out) and verified as `build` does; then what buildx writes after a build.
async fn buildx(args: BuildxBuildArgs, interrupt: &CancellationToken) -> Result<i32, Error> {
    use polyarch::flows::buildx::{self, Destination, Surroundings};
    let cwd = std::env::current_dir().map_err(|e| Error::io(".", e))?;
    let env = |name: &str| std::env::var(name).ok();
    let mut job = buildx::translate(
        args,
        Surroundings {
            cwd: &cwd,
            env: &env,
            stdin: &mut std::io::stdin(),
        },
    )?;
    if job.platform_from_engine {
        // buildx builds for its builder's own platform; polyarch's builder is the engine.
        let engine = polyarch::docker::engine::Engine::connect_builder().await?;
        job.project.images[0].platforms = vec![engine.native];
    }
    job.project.prepare_build(&[], &job.flags, None)?;
    let reporter = progress_reporter(job.progress);
    // A tar file or no destination at all: the layout lives in a temporary directory.
    let scratch = match job.destination {
        Destination::Registry | Destination::Layout { tar: false, .. } => None,
        _ => Some(
            tempfile::Builder::new()
                .prefix("polyarch-buildx-")
                .tempdir()
                .map_err(|e| Error::io(std::env::temp_dir(), e))?,
        ),
    };
    let layout = match (&job.destination, &scratch) {
        (Destination::Layout { dest, tar: false }, _) => Some(dest.clone()),
        (_, Some(dir)) => Some(dir.path().join("layout")),
        _ => None,
    };
    if job.destination == Destination::Nowhere {
        let message = "no --push or --output: the image is built and verified in a temporary OCI layout, then removed, so nothing is shipped; add --push, or --output type=oci,dest=PATH".to_string();
        match job.progress {
            // Said even when quiet, as buildx does.
            buildx::Progress::Quiet => eprintln!("warning: {message}"),
            _ => reporter.report(polyarch::base::progress::Event::Warning { message }),
        }
    }
    let options = BuildOptions {
        registry: registry_options(&RegistryArgs {
            insecure_registry: Vec::new(),
            username: None,
            password_stdin: false,
            ca_cert: std::env::var_os("SSL_CERT_FILE").map(Into::into),
        })?,
        layout: layout.clone(),
        interrupt: interrupt.clone(),
        ..Default::default()
    };
    let outcome = build_and_verify(&job.project, &options, reporter.as_ref()).await;
    drop(reporter);
    let record = outcome?.with_values(&job.project);
    if let (Destination::Layout { dest, tar: true }, Some(dir)) = (&job.destination, &layout) {
        buildx::pack_layout(dir, dest).map_err(|e| Error::io(dest, e))?;
    }
    let image = record
        .images
        .first()
        .filter(|image| image.unpublished.is_none());
    if let Some(image) = image {
        if let Some(path) = &job.metadata_file {
            let json = serde_json::to_string_pretty(&buildx::metadata(image, &job.image_names))
                .expect("serialises");
            std::fs::write(path, json + "\n").map_err(|e| Error::io(path, e))?;
        }
        if let Some(path) = &job.iidfile {
            std::fs::write(path, image.digest.as_str()).map_err(|e| Error::io(path, e))?;
        }
    }
    let output = Output {
        record: job.record.clone(),
        output_format: OutputFormat::Text,
        quiet: job.quiet,
        verbose: false,
    };
    if !job.quiet {
        return finish(&record, &output);
    }
    if let Some(path) = &output.record {
        record.write(path)?;
    }
    if let Some(image) = image {
        println!("{}", image.digest);
    }
    Ok(match record.covered {
        true => exit::COVERED,
        false => exit::GAP,
    })
}

/// `--progress` (or `-q`) as one of polyarch's reporters.
fn progress_reporter(progress: polyarch::flows::buildx::Progress) -> Box<dyn Reporter> {
    use polyarch::flows::buildx::Progress;
    match progress {
        Progress::Auto => reporter(&Output {
            record: None,
            output_format: OutputFormat::Text,
            quiet: false,
            verbose: false,
        }),
        Progress::Plain => Box::new(PlainReporter::new(true)),
        Progress::Tty => Box::new(TerminalReporter::new()),
        Progress::Rawjson => Box::new(JsonReporter),
        Progress::Quiet => Box::new(polyarch::base::progress::Silent),
    }
}

/// `--output oci:DIR`: the layout directory (tags come from polyarch.yaml).
fn layout_dir(destination: &str) -> Result<std::path::PathBuf, Error> {
    match polyarch::publish::layout::parse_layout_reference(destination) {
        Some((dir, None)) => Ok(dir),
        _ => Err(Error::Usage(format!(
            "--output {destination}: expected oci:DIR (tags come from polyarch.yaml)"
        ))),
    }
}

/// `--push-by-digest`: the part record, to `--record` and (or) standard output.
fn write_part(part: &PartRecord, output: &Output) -> Result<i32, Error> {
    if let Some(path) = &output.record {
        std::fs::write(path, part.to_json() + "\n").map_err(|e| Error::io(path, e))?;
    }
    match output.output_format {
        OutputFormat::Markdown => super::render::print(&super::render::markdown::part(part)),
        OutputFormat::Json => println!("{}", part.to_json()),
        OutputFormat::Text if output.record.is_none() => println!("{}", part.to_json()),
        OutputFormat::Text => {}
    }
    // A platform whose test failed is a gap: `assemble` will refuse this part.
    let mut test_failed = false;
    for image in &part.images {
        for platform in &image.platforms {
            let Some(test) = platform.test.as_ref().filter(|t| t.failed()) else {
                continue;
            };
            test_failed = true;
            if output.output_format == OutputFormat::Text {
                eprint!(
                    "{} {}: not assembled until fixed\n{}",
                    image.name,
                    platform.platform,
                    super::render::test_lines(test)
                );
            }
        }
    }
    Ok(match test_failed {
        true => exit::GAP,
        false => exit::COVERED,
    })
}

async fn assemble(args: AssembleArgs, interrupt: &CancellationToken) -> Result<i32, Error> {
    let file = project_file(&args.file);
    let project = Project::load(&file, &loading(Purpose::Verify, &args.set, &args.images))?;
    let images = project.expand(&args.images);
    let parts = args
        .parts
        .into_iter()
        .map(|path| PartRecord::load(&path).map(|part| (path, part)))
        .collect::<Result<Vec<_>, _>>()?;
    let options = registry_options(&args.registry)?;
    let reporter = reporter(&args.output);
    let outcome = polyarch::flows::assemble::assemble(
        &project,
        &parts,
        &images,
        args.no_test,
        &options,
        interrupt,
        reporter.as_ref(),
    )
    .await;
    drop(reporter);
    finish(&outcome?.with_values(&project), &args.output)
}

async fn verify(args: VerifyArgs, cleanup: &Cleanup) -> Result<i32, Error> {
    let options = registry_options(&args.registry)?;
    let checks = polyarch::verify::Checks {
        deep: args.deep,
        require_provenance: args.require_provenance,
        require_sbom: args.require_sbom || args.sbom,
    };
    let reporter = reporter(&args.output);
    let memory = polyarch::flows::cache::VerifyMemory::open();
    let public = public_keys(&args.keys)?;
    if args.require_signature && public.is_empty() && args.file.is_none() {
        return Err(Error::Usage(
            "--require-signature needs --key PUB.pem (the public key of the signer; repeatable)"
                .into(),
        ));
    }
    // Image name → the keys its signatures are checked with; an image not named is not.
    let mut signing = BTreeMap::new();
    let outcome = match (args.targets.as_slice(), &args.file) {
        ([reference], None) => {
            polyarch::flows::verify_by_name::verify_reference(
                reference,
                &args.platform,
                &options,
                checks,
                &memory,
                reporter.as_ref(),
            )
            .await
        }
        (images, Some(file)) => {
            let project = Project::load(file, &loading(Purpose::Verify, &args.set, images))?;
            let images = &project.expand(images);
            let keys = signature_checks(&project, images, args.require_signature, &public)?;
            signing = check_keys(keys).await?;
            let verified = polyarch::flows::verify_by_name::verify_project(
                &project,
                images,
                &options,
                checks,
                &memory,
                reporter.as_ref(),
            )
            .await;
            match verified {
                Ok(record) if args.test => {
                    let engine = async {
                        Ok(polyarch::builder::default_engine(&project, images, &[]).await?)
                    };
                    polyarch::flows::verify_tests::test_verified(
                        &project,
                        record.images,
                        engine,
                        &options,
                        pipeline::DEFAULT_JOBS,
                        cleanup,
                        reporter.as_ref(),
                    )
                    .await
                    .map(CoverageRecord::new)
                }
                other => other,
            }
            .map(|record| record.with_values(&project))
        }
        _ => Err(Error::Usage(
            "verify takes one REFERENCE with --platform, or -f polyarch.yaml [IMAGE ...]".into(),
        )),
    };
    memory.save();
    drop(reporter);
    let mut record = outcome?;
    if args.sbom {
        polyarch::flows::sbom::count_packages(&mut record, &options).await?;
    }
    if args.file.is_none() && args.require_signature {
        signing.extend(
            record
                .images
                .iter()
                .map(|i| (i.name.clone(), public.clone())),
        );
    }
    if !signing.is_empty() {
        polyarch::flows::signatures::require(&mut record, &signing, &options).await?;
    }
    finish(&record, &args.output)
}

/// `polyarch sbom REF --platform P`: the attached SPDX document, or why there is none
/// (exit 1).
async fn sbom(args: SbomArgs) -> Result<i32, Error> {
    use polyarch::flows::sbom::{attached, Found};
    let options = registry_options(&args.registry)?;
    match attached(&args.reference, &args.platform, &options).await? {
        Found::Document(document) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&document).expect("a document serialises")
            );
            Ok(exit::COVERED)
        }
        Found::NoSbom(subject) => {
            eprintln!(
                "error: {} {} ({subject}) has no SBOM attached; build it with `sbom: true` in polyarch.yaml (or `polyarch build --sbom`)",
                args.reference, args.platform
            );
            Ok(exit::GAP)
        }
        Found::NoPlatform(platforms) => {
            let had: Vec<String> = platforms.iter().map(ToString::to_string).collect();
            eprintln!(
                "error: {} has no {} image (it has: {}); ask for one of those",
                args.reference,
                args.platform,
                if had.is_empty() {
                    "none".into()
                } else {
                    had.join(", ")
                }
            );
            Ok(exit::GAP)
        }
    }
}

async fn gate(args: GateArgs) -> Result<i32, Error> {
    let options = polyarch::flows::gate::GateOptions {
        manifests: args.manifests,
        nodes: args.nodes,
        deep: args.deep,
        strict: args.strict,
        require_sbom: args.require_sbom,
        pin: args.pin,
        keys: public_keys(&args.keys)?,
    };
    let registry = registry_options(&args.registry)?;
    let reporter = reporter(&args.output);
    let memory = polyarch::flows::cache::VerifyMemory::open();
    let report = polyarch::flows::gate::run(&options, &registry, &memory, reporter.as_ref()).await;
    memory.save();
    let report = report?;
    drop(reporter);
    if let Some(path) = &args.output.record {
        report.write(path)?;
    }
    match args.output.output_format {
        OutputFormat::Json => println!("{}", report.to_json()),
        OutputFormat::Text => super::render::print(&super::render::gate::render_text(&report)),
        OutputFormat::Markdown => {
            super::render::print(&super::render::markdown::gate::gate(&report))
        }
    }
    Ok(report.exit_code())
}

async fn plan(args: PlanArgs) -> Result<i32, Error> {
    tables_not_offered("plan", args.output_format)?;
    let files = project_files(&args.file);
    if args.print {
        let options = loading(Purpose::Verify, &args.set, &args.images);
        println!("{}", Project::print_bake(&files, &options)?);
        return Ok(exit::COVERED);
    }
    let project = Project::load_files(&files, &loading(Purpose::Build, &args.set, &args.images))?;
    let options = BuildOptions {
        images: project.expand(&args.images),
        binfmt: args.binfmt.map(Into::into),
        ..Default::default()
    };
    let engine =
        polyarch::builder::default_engine(&project, &options.images, &options.platforms).await?;
    let lines = polyarch::flows::plan_report::plan_report(&project, &engine, &options).await?;
    match args.output_format {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&lines).expect("serialises")
        ),
        _ => super::render::print(&super::render::doctor::render_plan(&lines)),
    }
    Ok(exit::COVERED)
}

fn init(args: InitArgs) -> Result<i32, Error> {
    let from = match args.from.as_slice() {
        [] => polyarch::project::DEFAULT_FILES[1..]
            .iter()
            .map(PathBuf::from)
            .filter(|f| f.is_file())
            .collect(),
        given => given.to_vec(),
    };
    if from.is_empty() {
        return Err(Error::Usage(
            "init: no bake or compose file here (docker-bake.hcl, compose.yaml, …); pass --from FILE".into(),
        ));
    }
    let to_stdout = args.output == Path::new("-");
    let dest = match args.output.parent() {
        Some(dir) if !to_stdout && !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let converted = Project::convert_bake(
        &from,
        &loading(Purpose::Verify, &args.set, &args.targets),
        &dest,
    )?;
    if to_stdout {
        print!("{}", converted.text);
    } else {
        converted.write(&args.output, args.force)?;
        eprintln!(
            "wrote {} ({}); check it with `polyarch plan -f {}`",
            args.output.display(),
            converted.images.join(", "),
            args.output.display()
        );
    }
    Ok(exit::COVERED)
}

async fn doctor(args: DoctorArgs) -> Result<i32, Error> {
    tables_not_offered("doctor", args.output_format)?;
    let file = project_file(&args.file);
    let project = if file.exists() {
        Some(Project::load(&file, &LoadOptions::default())?)
    } else {
        None
    };
    let options = BuildOptions {
        registry: registry_options(&args.registry)?,
        ..Default::default()
    };
    let checks = polyarch::flows::doctor::doctor(project.as_ref(), &options).await;
    match args.output_format {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&checks).expect("serialises")
        ),
        _ => super::render::print(&super::render::doctor::render_checks(&checks)),
    }
    let failed = checks
        .iter()
        .any(|c| c.verdict == polyarch::flows::doctor::Verdict::Fail);
    Ok(if failed { exit::FAILURE } else { exit::COVERED })
}

/// Coverage tables are for the commands that read images back; the others print text.
fn tables_not_offered(command: &str, format: OutputFormat) -> Result<(), Error> {
    match format {
        OutputFormat::Markdown => Err(Error::Usage(format!(
            "{command} --output-format markdown: markdown tables are for build, verify, assemble and gate; use text or json"
        ))),
        _ => Ok(()),
    }
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

/// `--key`: the public keys signatures are checked with.
fn public_keys(paths: &[PathBuf]) -> Result<Vec<PublicKey>, Error> {
    paths
        .iter()
        .map(|p| PublicKey::load(p).map_err(|e| Error::Usage(e.to_string())))
        .collect()
}

/// Where the public keys that check an image's signatures come from.
enum CheckKeys {
    /// `--key`.
    Given(Vec<PublicKey>),
    /// The public half of the image's signing key, opened for this build.
    Signer(PathBuf, std::sync::Arc<polyarch::sign::OpeningKey>),
    /// The public half of the image's signing key file, opened with COSIGN_PASSWORD.
    File(PathBuf),
}

/// With -f, which images' signatures are checked and where their keys come from: every
/// image with `--require-signature`, and an image with `sign:` anyway; `--key` when
/// given, else the public half of the image's own signing key. Decided before anything
/// runs (an image with no key to check with is a usage error), while the keys themselves
/// are only needed once there is something to check ([`check_keys`]).
fn signature_checks(
    project: &Project,
    selected: &[String],
    required: bool,
    public: &[PublicKey],
) -> Result<BTreeMap<String, CheckKeys>, Error> {
    let mut out = BTreeMap::new();
    let images = project
        .images
        .iter()
        .filter(|i| selected.is_empty() || selected.contains(&i.name));
    for image in images {
        let keys = match (&image.sign_key, &image.signer) {
            _ if !public.is_empty() && (required || image.sign_key.is_some()) => {
                CheckKeys::Given(public.to_vec())
            }
            (Some(path), Some(signer)) => CheckKeys::Signer(path.clone(), signer.clone()),
            (Some(path), None) => CheckKeys::File(path.clone()),
            (None, _) if required => {
                return Err(Error::Usage(format!(
                    "--require-signature: image {} has no `sign:` key to check its signatures with; pass --key PUB.pem",
                    image.name
                )))
            }
            (None, _) => continue,
        };
        out.insert(image.name.clone(), keys);
    }
    Ok(out)
}

/// The public keys of [`signature_checks`]: a build's signing key is waited for (it opened
/// beside the build), a key file is opened here.
async fn check_keys(
    checks: BTreeMap<String, CheckKeys>,
) -> Result<BTreeMap<String, Vec<PublicKey>>, Error> {
    let mut out = BTreeMap::new();
    for (image, keys) in checks {
        let keys = match keys {
            CheckKeys::Given(keys) => keys,
            // Opened for this build (its password may have come from stdin).
            CheckKeys::Signer(path, signer) => {
                let opened = signer.opened().await.map_err(Error::SigningKey)?;
                vec![opened.public(&path)]
            }
            CheckKeys::File(path) => {
                let password = std::env::var("COSIGN_PASSWORD").ok();
                let key = polyarch::sign::SigningKey::load(&path, password.as_deref())
                    .map_err(|e| Error::Usage(e.to_string()))?;
                vec![key.public(&path)]
            }
        };
        out.insert(image, keys);
    }
    Ok(out)
}

/// A cosign key's password: `--sign-password-stdin`, else `COSIGN_PASSWORD` (as cosign
/// reads it); none when neither is given, which only a cosign key refuses.
fn sign_password(from_stdin: bool) -> Result<Option<String>, Error> {
    if !from_stdin {
        return Ok(std::env::var("COSIGN_PASSWORD").ok());
    }
    let mut password = String::new();
    std::io::stdin()
        .read_to_string(&mut password)
        .map_err(|e| {
            Error::Usage(format!(
                "--sign-password-stdin: cannot read standard input: {e}"
            ))
        })?;
    Ok(Some(password.trim_end_matches(['\r', '\n']).to_string()))
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
    // Tests and slow links set the per-request deadline; a value that is no duration is
    // refused rather than ignored.
    let deadline = match std::env::var("POLYARCH_REGISTRY_TIMEOUT") {
        Ok(text) if !text.trim().is_empty() => Some(
            polyarch::base::duration::parse_duration(&text)
                .map_err(|e| Error::Usage(format!("POLYARCH_REGISTRY_TIMEOUT: {e}")))?,
        ),
        _ => None,
    };
    Ok(RegistryOptions {
        insecure: args.insecure_registry.clone(),
        credentials,
        ca_certs: args.ca_cert.iter().cloned().collect(),
        deadline,
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
        OutputFormat::Text => super::render::print(&super::render::coverage_text(record)),
        OutputFormat::Markdown => super::render::print(&super::render::markdown::coverage(record)),
    }
    Ok(if record.covered {
        exit::COVERED
    } else {
        exit::GAP
    })
}

/// How a command reads the project file: for what, with its `--set` values.
fn loading<'a>(
    purpose: Purpose,
    overrides: &'a [Override],
    targets: &'a [String],
) -> LoadOptions<'a> {
    LoadOptions {
        purpose,
        overrides,
        targets,
        ..Default::default()
    }
}

/// `-f`'s default, `polyarch.yaml`, when it is absent: the first of bake's own files found
/// here, in bake's order, so a project with only a bake or compose file needs no `-f`.
fn project_file(given: &Path) -> PathBuf {
    let default = Path::new(polyarch::project::DEFAULT_FILES[0]);
    if given != default || given.exists() {
        return given.to_path_buf();
    }
    polyarch::project::DEFAULT_FILES
        .iter()
        .map(PathBuf::from)
        .find(|f| f.is_file())
        .unwrap_or_else(|| given.to_path_buf())
}

/// `-f` given once or more; its default, `polyarch.yaml`, when absent: every one of
/// bake's own files found here, read together in bake's order.
fn project_files(given: &[PathBuf]) -> Vec<PathBuf> {
    let default = Path::new(polyarch::project::DEFAULT_FILES[0]);
    if given != [default] || default.exists() {
        return given.to_vec();
    }
    let found: Vec<PathBuf> = polyarch::project::DEFAULT_FILES
        .iter()
        .map(PathBuf::from)
        .filter(|f| f.is_file())
        .collect();
    if found.is_empty() {
        given.to_vec()
    } else {
        found
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
    let cli = token.clone();
    super::plugin::on_cli_interrupt(move || cli.cancel());
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

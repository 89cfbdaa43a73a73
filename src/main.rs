//! The polyarch CLI: parses arguments, picks a reporter, runs the library, maps the
//! outcome to the documented exit codes. Installed as `docker-polyarch`, it is the Docker
//! CLI plugin `docker polyarch` (`cli::plugin`).

mod cli;

use clap::{CommandFactory, FromArgMatches};
use cli::args::Cli;
use cli::plugin::Invocation;
use polyarch::flows::error::exit;

fn main() {
    let (args, bin_name) = match cli::plugin::invocation(std::env::args_os().collect()) {
        Ok(Invocation::Standalone(args)) => (args, "polyarch"),
        Ok(Invocation::Metadata) => {
            println!("{}", cli::plugin::metadata());
            std::process::exit(exit::COVERED);
        }
        Ok(Invocation::Plugin { args, env }) => {
            // Before the runtime starts its threads: the engine and credential look-ups
            // read these as the Docker CLI would have.
            for (key, value) in env {
                match value {
                    Some(value) => std::env::set_var(key, value),
                    None => std::env::remove_var(key),
                }
            }
            (args, "docker polyarch")
        }
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(exit::USAGE);
        }
    };
    let parsed = Cli::command()
        .bin_name(bin_name)
        .try_get_matches_from(args)
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let mut builder = match cli.command {
        // A few small concurrent reads: one thread polls them all, with no worker threads
        // to start and no wake-ups between threads. `--deep` hashes whole layers as they
        // stream: those keep a thread per core.
        cli::args::Command::Verify(ref args) if !args.deep => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(exit::FAILURE);
        }
    };
    let code = match runtime.block_on(cli::commands::run(cli.command)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!(
                "error: {}",
                polyarch::base::text::printable(&error.to_string())
            );
            error.exit_code()
        }
    };
    // Work an interrupt or failure cut off may still hold temporary files (a layer
    // spool, an upload): shutting the runtime down drops those tasks, so their files
    // are removed before the exit. The bound keeps a stuck blocking call from holding
    // the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}

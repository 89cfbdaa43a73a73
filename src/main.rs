//! The polyarch CLI: parses arguments, picks a reporter, runs the library, maps the
//! outcome to the documented exit codes.

mod cli;

use clap::Parser;
use cli::args::Cli;
use polyarch::error::exit;

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
    let code = match cli::commands::run(cli.command).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    };
    std::process::exit(code);
}

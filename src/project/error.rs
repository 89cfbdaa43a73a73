//! What went wrong with a project: a mistake in its file, a command-line value it cannot
//! take, or a file it names that cannot be read. The crate-wide `Error` keeps the kind:
//! `File` and `Usage` exit 2, `Read` and `Write` 3.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// A mistake in the project file: `file: field: problem; fix`.
    #[error("{}: {}{message}", file.display(), if field.is_empty() { String::new() } else { format!("{field}: ") })]
    File {
        file: PathBuf,
        /// The field's path (`images.app.platforms`); empty for the file as a whole.
        field: String,
        message: String,
    },
    /// A command-line value the project cannot take (`--set`, `--secret`, `--cache-to`).
    #[error("{0}")]
    Usage(String),
    /// A file the project names (an image's Dockerfile) that cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A project file `init` writes that cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

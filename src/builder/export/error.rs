//! What kind of export failure happened: the engine, the save stream, the spool, or an
//! image the stream holds that is not whole; each variant renders the message users have
//! always seen after `export of {image}: `.

use crate::base::oci::OciError;
use crate::builder::export::reproducible::ReproducibleError;
use std::io;
use std::path::PathBuf;

/// The export of one image failed: which image, and what kind of failure.
#[derive(Debug, thiserror::Error)]
#[error("export of {image}: {source}")]
pub struct ImageExportError {
    pub image: String,
    #[source]
    pub source: ExportError,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The engine refused the export, or its stream broke off.
    #[error("{}", super::engine_error_message(source, image_id))]
    Engine {
        image_id: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("the export worker failed: {0}")]
    Worker(#[source] tokio::task::JoinError),
    #[error("cannot create a spool directory: {0}")]
    SpoolDir(#[source] io::Error),
    #[error("cannot read the daemon's OCI layout {}: {source}", file.display())]
    LayoutFile {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the spool {}: {source}", file.display())]
    SpoolWrite {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `what`: the spooled file, as the archive names it.
    #[error("cannot read back spooled {what}: {source}")]
    SpoolRead {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot spool layer `{path}`: {source}")]
    SpoolLayer {
        path: String,
        #[source]
        source: io::Error,
    },
    /// Reading the save stream failed; `what` says where in it.
    #[error("{what}: {source}")]
    Stream {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("`{path}` is not a valid gzip stream: {source}")]
    Gzip {
        path: String,
        #[source]
        source: io::Error,
    },
    /// A manifest or config of the save stream that is not the JSON it should be.
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The save stream does not hold one whole, consistent image (truncated, links out
    /// of the archive, digests that disagree); the text says what is wrong where.
    #[error("{0}")]
    Malformed(String),
    /// The exported image cannot be described as an OCI image (its config, a digest).
    #[error("{0}")]
    Content(#[source] OciError),
    /// Rewriting the image for SOURCE_DATE_EPOCH failed.
    #[error("{0}")]
    Reproducible(#[source] ReproducibleError),
    /// The SOURCE_DATE_EPOCH rewrite stopped before it finished (a panic, a shutdown).
    #[error("{0}")]
    RewriteStopped(#[source] tokio::task::JoinError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// An engine stream that breaks off.
    struct Broken;

    impl io::Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "engine went away",
            ))
        }
    }

    #[test]
    fn a_broken_save_stream_is_a_stream_error_with_the_read_error_kept() {
        let dir = tempfile::tempdir().unwrap();
        let error = super::super::read_save_stream(Broken, dir.path(), "api", None).unwrap_err();
        let ImageExportError { image, source } = &error;
        assert_eq!(image, "api");
        assert!(matches!(source, ExportError::Stream { .. }), "{source:?}");
        assert!(error.to_string().contains("engine went away"), "{error}");
        let read = error.source().and_then(|e| e.source()).unwrap();
        assert!(read.downcast_ref::<io::Error>().is_some());
    }

    #[test]
    fn oci_and_reproducible_failures_keep_their_cause() {
        let config = crate::base::oci::ConfigPlatform::from_config(b"{").unwrap_err();
        let error = ExportError::Content(config);
        assert!(error
            .to_string()
            .starts_with("image config is not valid JSON: "));
        let oci = error.source().unwrap();
        assert!(oci
            .source()
            .unwrap()
            .downcast_ref::<serde_json::Error>()
            .is_some());

        let rewrite =
            crate::builder::export::reproducible::normalise_config(b"{", 1, &[]).unwrap_err();
        let error = ExportError::Reproducible(rewrite);
        assert!(error.to_string().starts_with("image config is not JSON: "));
        let reproducible = error.source().unwrap();
        assert!(reproducible.source().unwrap().is::<serde_json::Error>());
    }
}

//! What a destination fails with: the registry's or the layout's own failure, read-back
//! content that is not what it should be, a tag that is no reference, provenance or an
//! SBOM asked of a layout, or an SBOM that could not be made.

use crate::base::reference::ReferenceError;
use crate::publish::layout::LayoutError;
use crate::registry::ClientError;
use crate::sbom::SbomError;
use crate::verify::VerifyError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Registry(#[from] ClientError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// Layout readers (skopeo, containerd) have no referrers convention to follow.
    #[error("--output oci:{}: provenance and SBOMs are attached in a registry only; push to the registry, or build {image} without them", dir.display())]
    AttachInLayout { dir: PathBuf, image: String },
    /// An SBOM that could not be made: a layer that cannot be read, or the registry's failure.
    #[error(transparent)]
    Sbom(#[from] SbomError),
}

/// Read-back through the registry: its failures stay the registry's.
impl From<VerifyError<ClientError>> for StoreError {
    fn from(error: VerifyError<ClientError>) -> Self {
        match error {
            VerifyError::Source(error) | VerifyError::Content(error) => StoreError::Registry(error),
            VerifyError::Reference(error) => StoreError::Reference(error),
        }
    }
}

/// Read-back through the layout: its failures stay the layout's; content that is not
/// what it should be is worded as a registry's, as verify words it.
impl From<VerifyError<LayoutError>> for StoreError {
    fn from(error: VerifyError<LayoutError>) -> Self {
        match error {
            VerifyError::Source(error) => StoreError::Layout(error),
            VerifyError::Content(error) => StoreError::Registry(error),
            VerifyError::Reference(error) => StoreError::Reference(error),
        }
    }
}

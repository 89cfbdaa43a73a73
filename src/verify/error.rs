//! What verify fails with: the source's own failure, content it handed over that is not
//! what it should be, or an image tag that is not a reference.

use crate::base::reference::ReferenceError;
use crate::registry::ClientError;

/// `E`: the source's error ([`super::ContentSource::Error`]), kept as it is so that the
/// caller decides what it costs.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError<E> {
    /// The source could not hand over what was asked for.
    #[error(transparent)]
    Source(E),
    /// What the source handed over is not valid content; named under its registry (an OCI
    /// layout: its reference), as a registry's failure is.
    #[error(transparent)]
    Content(ClientError),
    /// An image's tag that does not make a reference.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
}

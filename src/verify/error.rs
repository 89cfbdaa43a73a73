//! What verify fails with: the source's own failure, content it handed over that is not
//! what it should be, or an image tag that is not a reference.

use super::target::Target;
use crate::base::digest::Digest;
use crate::base::oci;
use crate::base::reference::ReferenceError;
use crate::registry::{ClientError, RegistryError};

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

/// Content under `target` that does not parse as what it claims to be.
pub(super) fn unreadable<E>(target: &Target, source: oci::OciError) -> VerifyError<E> {
    let reference = target.reference.clone();
    target_error(target, RegistryError::Unreadable { reference, source })
}

/// A registry error about `target`, under its registry (an OCI layout: its reference).
pub(super) fn target_error<E>(target: &Target, source: RegistryError) -> VerifyError<E> {
    let registry = match crate::registry::parse_reference(&target.reference) {
        Ok(r) if !target.reference.starts_with("oci:") => r.registry().to_string(),
        _ => target.reference.clone(),
    };
    VerifyError::Content(ClientError::registry(registry, source))
}

/// A digest a manifest names, as oci-spec read it (any algorithm) into ours.
pub(super) fn parse_digest<E>(
    target: &Target,
    digest: &oci_spec::image::Digest,
) -> Result<Digest, VerifyError<E>> {
    digest.as_ref().parse().map_err(|source| {
        let value = digest.to_string();
        unreadable(target, oci::OciError::Digest { value, source })
    })
}

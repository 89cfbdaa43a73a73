//! polyarch: build multi-architecture container images, push one OCI index per tag
//! without attestation entries, and prove the pushed index covers the declared platforms.
//!
//! Data flows one way: project → plan → build → export → push → verify → record.
//!
//! The source is laid out in areas whose imports only point down (`tests/layering.rs`
//! checks it; `ARCHITECTURE.md` draws it): flows → publish → verify → builder → project →
//! docker → registry → base, with k8s beside them on base.

pub mod base;
pub mod builder;
pub mod docker;
pub mod flows;
pub mod k8s;
pub mod project;
pub mod publish;
pub mod registry;
pub mod sbom;
pub mod sign;
pub mod verify;

pub use base::platform::Platform;
pub use flows::error::{Error, Result};

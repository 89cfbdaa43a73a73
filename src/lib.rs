//! polyarch: build multi-architecture container images, push one OCI index per tag
//! without attestation entries, and prove the pushed index covers the declared platforms.
//!
//! Data flows one way: project → plan → build → export → push → verify → record.

pub mod annotations;
pub mod assemble;
pub mod attachment;
pub mod binfmt;
pub mod build;
pub mod buildkit;
pub mod cache;
pub mod cleanup;
pub mod credentials;
pub mod deep;
pub mod dependencies;
pub mod digest;
pub mod dockerfile;
pub mod doctor;
pub mod elf;
pub mod endpoint;
pub mod engine;
pub mod epoch;
pub mod error;
pub mod export;
pub mod gate;
pub mod image_path;
pub mod inputs;
pub mod k8s;
pub mod layout;
pub mod oci;
pub mod pipeline;
pub mod plan;
pub mod plan_report;
pub mod platform;
pub mod progress;
pub mod project;
pub mod provenance;
pub mod publish;
pub mod record;
pub mod reference;
pub mod registry;
pub mod reproducible;
pub mod store;
pub mod text;
pub mod verify;
pub mod verify_by_name;
pub use error::{Error, Result};
pub use platform::Platform;

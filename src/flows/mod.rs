//! The commands end to end, on top of every other area: the build pipeline, assembling
//! records, `verify`/`gate`/`plan`/`doctor`/`sbom` by name, the run's cache, and the crate-wide
//! [`error::Error`] with its exit codes (one variant per area's error, so errors only
//! point down).

pub mod assemble;
pub mod buildx;
pub mod cache;
pub mod doctor;
pub mod error;
pub mod gate;
pub mod pipeline;
pub mod plan_report;
pub mod sbom;
pub mod signatures;
pub mod verify_by_name;
pub mod verify_tests;

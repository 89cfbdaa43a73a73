//! Reading a reference back (never from memory) and judging whether it covers the declared
//! platforms: one entry per platform, each entry's config agreeing with the entry, and no
//! attestation entries (older containerd fails on them with "unknown media type").
//!
//! Imports run one way: `image` → `verdict` → `contents` (the index walk) → `entry` (one
//! entry's checks) → `attached`, `error`, `source`, `target`.

mod attached;
mod contents;
pub mod coverage_record;
mod entry;
pub mod entrypoint;
mod error;
#[cfg(test)]
mod fake;
mod image;
pub mod remote_layers;
pub mod signed;
mod source;
mod target;
mod verdict;

pub use contents::{read_contents, Contents};
pub use error::VerifyError;
pub use image::verify_image;
pub use source::{ContentSource, ReadMemory, RegistrySource};
pub use target::{Checks, Target};
pub use verdict::verify;

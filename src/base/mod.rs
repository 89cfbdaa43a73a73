//! The vocabulary every other area speaks: digests, platforms, references, image paths,
//! OCI documents and annotations, the referrers vocabulary, ELF headers, Dockerfile
//! reading, reporter events and text helpers. Imports no other area.

pub mod annotations;
pub mod attachment;
pub mod digest;
pub mod dockerfile;
pub mod elf;
pub mod files;
pub mod image_path;
pub mod join;
pub mod oci;
pub mod platform;
pub mod progress;
pub mod reference;
pub mod text;

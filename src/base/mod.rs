//! The vocabulary every other area speaks: digests, platforms, references, image paths,
//! OCI documents and annotations, the referrers vocabulary, ELF headers, Dockerfile
//! reading, reporter events, durations, text helpers, YAML's nesting depth, the limits
//! `--deep` reads layers within and the streamed reading of a layer. Imports no other area.

pub mod annotations;
pub mod attachment;
pub mod digest;
pub mod dockerfile;
pub mod duration;
pub mod elf;
pub mod files;
pub mod image_path;
pub mod join;
pub mod layer_limits;
pub mod layer_stream;
pub mod memory;
pub mod oci;
pub mod platform;
pub mod progress;
pub mod reference;
pub mod text;
pub mod yaml_depth;

/// Where polyarch keeps what it remembers: `$POLYARCH_CACHE_DIR`,
/// `$XDG_CACHE_HOME/polyarch` or `~/.cache/polyarch`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    std::env::var_os("POLYARCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("polyarch")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/polyarch")))
}

//! The limits `verify --deep` reads an image's layers within, so that no layer, however
//! made, makes it hold more than a bounded amount of memory: past one, the image is
//! refused (the layer's reader, registry or layout, reports it as its failure).

use super::text::size;

/// Which limit a layer went past; each carries its value, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayerLimit {
    #[error("an entry name longer than {limit} bytes (PATH_MAX)")]
    Name { limit: usize },
    #[error("a link target longer than {limit} bytes (PATH_MAX)")]
    LinkTarget { limit: usize },
    /// GNU long name and long link entries, PAX headers and sparse maps of one entry.
    #[error("more than {} of tar headers for one entry", size(*limit))]
    EntryHeaders { limit: usize },
    #[error("more than {limit} paths in the image")]
    Paths { limit: usize },
    #[error("more than {} of path names and link targets in the image", size(*limit))]
    NameBytes { limit: usize },
}

/// The layer (1-based, in rootfs order) that went past `limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("layer {layer} has {limit}; --deep reads no further")]
pub struct LayerRefused {
    pub layer: usize,
    #[source]
    pub limit: LayerLimit,
}

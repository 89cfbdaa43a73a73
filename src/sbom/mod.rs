//! SBOMs (`sbom: true`): polyarch reads each platform image's layers itself, as streams,
//! and catalogs what they install: Debian, Alpine and RPM (sqlite) package databases, the
//! build info Go embeds in its binaries and `cargo auditable`'s dependency lists. The
//! catalog is written as an SPDX 2.3 document inside an in-toto statement and attached as
//! an OCI referrer of the platform manifest, beside provenance. No scanner image runs, so it is
//! the same on every engine.

mod apk;
mod binary;
mod dpkg;
mod golang;
mod layers;
mod os_release;
pub mod remote;
mod rpm;
pub mod spdx;

pub use os_release::Distro;

use crate::base::layer_limits::LayerLimit;
use crate::base::layer_stream::{apply_layers, Stop};
use crate::base::text::one_line;
use crate::registry::ClientError;
pub use layers::LayerFacts;
use layers::{Found, Tree};
use std::io::{self, Read};

/// Where a package comes from, which names its purl type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ecosystem {
    Deb,
    Apk,
    Rpm,
    Golang,
    Cargo,
}

impl Ecosystem {
    /// The purl type.
    pub fn purl_type(self) -> &'static str {
        match self {
            Ecosystem::Deb => "deb",
            Ecosystem::Apk => "apk",
            Ecosystem::Rpm => "rpm",
            Ecosystem::Golang => "golang",
            Ecosystem::Cargo => "cargo",
        }
    }
}

/// One package found in an image.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub ecosystem: Ecosystem,
    pub name: String,
    /// As the database writes it; rpm's `[EPOCH:]VERSION-RELEASE`.
    pub version: String,
    pub arch: Option<String>,
    /// The licence as the database gives it (apk's `L:`, rpm's `LICENSE`); None where it
    /// gives none.
    pub license: Option<String>,
    /// The file in the image it was read from, e.g. `/var/lib/dpkg/status`.
    pub source: String,
}

/// What one image's layers hold, sorted, each package once per file it was read from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    pub packages: Vec<Package>,
    pub distro: Distro,
    /// Databases and binaries seen but not read, one line each.
    pub warnings: Vec<String>,
}

/// Why an image's SBOM could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum SbomError {
    #[error(transparent)]
    Registry(#[from] ClientError),
    #[error("{reference}: layer {layer} cannot be read for its SBOM ({reason}); push its layers gzip-compressed or uncompressed, or build it without `sbom: true`")]
    Layer {
        reference: String,
        layer: usize,
        reason: String,
    },
    #[error("{reference}: layer {layer} has {limit}; no SBOM is made of it: build it without `sbom: true`")]
    Refused {
        reference: String,
        layer: usize,
        #[source]
        limit: LayerLimit,
    },
    #[error("{reference}: reading the layers for the SBOM failed: {source}")]
    Reader {
        reference: String,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("{reference}: {what} is not what it should be: {reason}")]
    Content {
        reference: String,
        what: String,
        reason: String,
    },
}

/// Why the layers could not be cataloged: layer `n` (1-based) unreadable or past a limit.
#[derive(Debug)]
pub enum LayersError {
    Unreadable { layer: usize, error: io::Error },
    Refused { layer: usize, limit: LayerLimit },
}

/// Catalogs an image from its layer tars (decompressed or gzip) in rootfs order, each
/// read once, to its end.
pub fn catalog(layers: Vec<Box<dyn Read + Send>>) -> Result<Catalog, LayersError> {
    let read = layers
        .into_iter()
        .enumerate()
        .map(|(i, layer)| read_layer(i + 1, layer).map(std::sync::Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(lay_layers(&read))
}

/// Reads one layer tar (decompressed or gzip) on its own, to its end, as the `n`th
/// (1-based) layer of an image: what it holds for the catalogers, to lay over the layers
/// below it with [`lay_layers`].
pub fn read_layer(n: usize, layer: Box<dyn Read + Send>) -> Result<LayerFacts, LayersError> {
    let mut facts = None;
    apply_layers(vec![layer], |layer| {
        facts = Some(LayerFacts::read(layer)?);
        Ok(())
    })
    .map_err(|(_, stop)| LayersError::at(n, stop))?;
    Ok(facts.unwrap_or_default())
}

/// Catalogs an image from its layers read one by one ([`read_layer`]), in rootfs order.
pub fn lay_layers(layers: &[std::sync::Arc<LayerFacts>]) -> Catalog {
    let mut tree = Tree::default();
    for layer in layers {
        tree.lay(layer);
    }
    cataloged(tree)
}

fn cataloged(tree: Tree) -> Catalog {
    let mut catalog = Catalog::default();
    // /etc/os-release wins over /usr/lib/os-release, which it usually links to.
    for (path, found) in tree.found.into_iter().rev() {
        match found {
            Found::Packages(mut packages, not_read) => {
                catalog.packages.append(&mut packages);
                catalog.warnings.extend(not_read.as_deref().map(one_line));
            }
            Found::OsRelease(distro) if path == "etc/os-release" || catalog.distro.id.is_none() => {
                catalog.distro = distro;
            }
            Found::OsRelease(_) => {}
            Found::NotRead(why) => catalog.warnings.push(one_line(&why)),
        }
    }
    catalog.packages.sort();
    catalog.packages.dedup();
    catalog.warnings.sort();
    catalog
}

impl LayersError {
    fn at(layer: usize, stop: Stop) -> LayersError {
        match stop {
            Stop::Unreadable(error) => LayersError::Unreadable { layer, error },
            Stop::Refused(limit) => LayersError::Refused { layer, limit },
        }
    }
}

#[cfg(test)]
mod tests;

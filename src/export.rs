//! Getting a built image out of the engine as a stream (`docker save`), in either layout
//! the engine writes: Engine ≤ 24's `<id>/layer.tar` + `manifest.json` (last), or the
//! OCI image layout of Engine 25+. Each layer is hashed (diff_id) and gzipped with its
//! sha256 computed on the fly, spooled to a temporary file so that memory stays bounded
//! and an upload can be restarted without exporting again.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct ExportedLayer {
    /// sha256 of the uncompressed tar, as in the config's `rootfs.diff_ids`.
    pub diff_id: String,
    /// sha256 of the compressed blob as pushed.
    pub digest: String,
    /// Size of the compressed blob.
    pub size: u64,
    /// `application/vnd.oci.image.layer.v1.tar+gzip`.
    pub media_type: String,
    /// The compressed blob on disk, inside the export's spool directory.
    pub path: PathBuf,
}

#[derive(Debug)]
pub struct ExportedImage {
    /// The image config JSON exactly as the engine stored it (its sha256 is the image ID).
    pub config: Vec<u8>,
    pub config_digest: String,
    /// Layers in rootfs order.
    pub layers: Vec<ExportedLayer>,
    /// Keeps the spooled layers alive; deleted on drop.
    pub spool: tempfile::TempDir,
}

pub async fn export_image(
    _docker: &bollard::Docker,
    _image_id: &str,
    _image_name: &str,
    _platform: Option<&crate::Platform>,
    _reporter: &dyn crate::progress::Reporter,
) -> crate::Result<ExportedImage> {
    todo!("export")
}

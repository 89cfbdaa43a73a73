//! `verify --deep` against a registry: an image's layers streamed from the registry into
//! [`entrypoint::inspect`], which reads them on a blocking thread, each hashed as it is read.
//! Its failures are the registry client's ([`ClientError`]), a layer whose bytes are not
//! the ones its manifest names and a layer past one of `--deep`'s limits among them; what
//! it cannot read is a [`Finding::Unreadable`].

use crate::base::digest::{first_mismatch, Digest, Hasher};
use crate::base::platform::Platform;
use crate::builder::export::ChannelReader;
use crate::registry::{ClientError, RegistryError};
use crate::verify::entrypoint::{self, DeepReport, Finding};
use std::io::{self, Read};
use std::sync::OnceLock;

/// Streams an image's layers from the registry, one after another (bounded memory), and
/// runs [`entrypoint::inspect`] on them. gzip layers are decompressed (by media type or magic);
/// zstd layers give [`Finding::Unreadable`]; non-distributable (foreign) layers are skipped
/// with a note in `detail`. Registry failures are `Err`.
pub async fn inspect_remote(
    registry: &crate::registry::Registry,
    reference: &oci_client::Reference,
    config: &[u8],
    layer_digests: &[(crate::base::digest::Digest, String)],
    platform: &Platform,
) -> Result<DeepReport, ClientError> {
    let mut skipped = Vec::new();
    let mut wanted = Vec::new();
    for (digest, media_type) in layer_digests {
        if media_type.contains("nondistributable") || media_type.contains("foreign") {
            skipped.push(digest.short().to_string());
            continue;
        }
        if media_type.contains("zstd") {
            return Ok(DeepReport {
                executable: None,
                finding: Finding::Unreadable,
                detail: format!(
                    "layer {} is zstd-compressed ({media_type}); zstd layers not supported",
                    digest.short()
                ),
            });
        }
        wanted.push(digest.clone());
    }
    let config_bytes = config.to_vec();
    let owned_platform = platform.clone();
    let inspected = read_layers(registry, reference, &wanted, move |readers| {
        entrypoint::inspect(&config_bytes, readers, &owned_platform)
    })
    .await?;
    let kind = match inspected {
        Ok(Ok(report)) => Ok(report),
        Ok(Err(source)) => Err(RegistryError::LayerRefused {
            reference: reference.to_string(),
            source,
        }),
        Err(source) => Err(RegistryError::Inspection {
            reference: reference.to_string(),
            source,
        }),
    };
    let mut report = kind.map_err(|kind| ClientError::registry(reference.registry(), kind))?;
    if !skipped.is_empty() {
        report.detail += &format!(
            " (skipped non-distributable layer{} {})",
            if skipped.len() == 1 { "" } else { "s" },
            skipped.join(", ")
        );
    }
    Ok(report)
}

/// Streams the `wanted` layers from the registry, one after another (bounded memory), to
/// `consume` on a blocking thread, each hashed as it is read: `verify --deep` and the
/// SBOM catalogers read an image's layers this way. A registry failure, or a layer read
/// to its end whose bytes are not the ones its digest names, is `Err`; the consumer's
/// panic is the inner `Err`.
pub async fn read_layers<T: Send + 'static>(
    registry: &crate::registry::Registry,
    reference: &oci_client::Reference,
    wanted: &[Digest],
    consume: impl FnOnce(Vec<Box<dyn Read + Send>>) -> T + Send + 'static,
) -> Result<Result<T, tokio::task::JoinError>, ClientError> {
    let mut senders = Vec::new();
    let mut readers: Vec<Box<dyn Read + Send>> = Vec::new();
    for _ in wanted {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        senders.push(tx);
        readers.push(Box::new(ChannelReader::new(rx)));
    }
    // Hashed as they arrive, beside the consumer's gunzip and tar reading.
    let hashed: Vec<OnceLock<Digest>> = wanted.iter().map(|_| OnceLock::new()).collect();
    let consumer = tokio::task::spawn_blocking(move || consume(readers));
    let pump = pump_layers(registry, reference, wanted, senders, &hashed);
    let (pumped, consumed) = tokio::join!(pump, consumer);
    pumped?;
    if let Some((digest, computed)) = first_mismatch(wanted.iter().zip(&hashed)) {
        return Err(ClientError::registry(
            reference.registry(),
            RegistryError::LayerDigest {
                digest: digest.to_string(),
                reference: reference.to_string(),
                computed: computed.to_string(),
            },
        ));
    }
    Ok(consumed)
}

/// Streams each wanted layer from the registry to the inspector's reader, until the
/// inspector stops reading; a failed read is handed to the inspector too. What a layer's
/// bytes hash to is left in `hashed` once all of them were handed over.
async fn pump_layers(
    registry: &crate::registry::Registry,
    reference: &oci_client::Reference,
    wanted: &[Digest],
    senders: Vec<tokio::sync::mpsc::Sender<io::Result<bytes::Bytes>>>,
    hashed: &[OnceLock<Digest>],
) -> Result<(), ClientError> {
    use futures_util::StreamExt;
    for ((digest, tx), hashed) in wanted.iter().zip(senders).zip(hashed) {
        if tx.is_closed() {
            // The inspector has stopped reading (it reached a verdict or failed).
            return Ok(());
        }
        let stream = registry.blob_stream(reference, digest).await?;
        let mut stream = std::pin::pin!(stream);
        let mut hasher = Hasher::like(digest);
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    hasher.update(&bytes);
                    if tx.send(Ok(bytes)).await.is_err() {
                        return Ok(());
                    }
                }
                Err(e) => {
                    let kind = e.kind();
                    let error = RegistryError::Layer {
                        digest: digest.to_string(),
                        reference: reference.to_string(),
                        source: e,
                    };
                    let _ = tx.send(Err(io::Error::new(kind, error.to_string()))).await;
                    return Err(ClientError::registry(reference.registry(), error));
                }
            }
        }
        let _ = hashed.set(hasher.finish());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(dead_code)]
    fn inspect_remote_is_send(
        registry: &crate::registry::Registry,
        reference: &oci_client::Reference,
    ) {
        fn is_send<T: Send>(_: T) {}
        let platform: Platform = "linux/arm64".parse().unwrap();
        is_send(inspect_remote(registry, reference, b"", &[], &platform));
    }
}

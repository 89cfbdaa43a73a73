//! Layers sent to the registry while they are exported (`builder::export::early`): which
//! ones a run sends, and the wait of an export whose layer another export of the run is
//! sending (a platform-independent `COPY` makes the same layer in every platform's image).

use crate::base::digest::Digest;
use crate::builder::export::early::{EarlyLayer, EarlyUploads};
use crate::builder::export::ExportedLayer;
use crate::flows::cache::LayerDigests;
use crate::publish::store::ImageStore;
use futures_util::future::LocalBoxFuture;
use oci_client::Reference;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;

/// A run's early uploads.
pub(super) struct EarlySends {
    digests: LayerDigests,
    /// Layers (by diff ID) an export of this run sends, and whether that has ended.
    sending: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl EarlySends {
    pub(super) fn new(digests: LayerDigests) -> EarlySends {
        EarlySends {
            digests,
            sending: Mutex::default(),
        }
    }

    /// What an export's layers compressed to, for the next export of the same layers.
    pub(super) fn remember(&self, layers: &[ExportedLayer]) {
        for layer in layers {
            self.digests.remember(&layer.diff_id, &layer.digest);
        }
    }

    /// Waits until no export of this run is still sending the layer `diff_id`, so that
    /// its push finds the blob there instead of uploading it as well.
    pub(super) async fn settled(&self, diff_id: &str) {
        let ended = self
            .sending
            .lock()
            .expect("sending lock")
            .get(diff_id)
            .map(|s| s.subscribe());
        if let Some(mut ended) = ended {
            let _ = ended.wait_for(|ended| *ended).await;
        }
    }

    pub(super) fn save(&self) {
        self.digests.save()
    }

    /// Early uploads of one image's layers to `reference`'s repository of `store`.
    pub(super) fn to<'a, S: ImageStore>(
        &'a self,
        store: &'a S,
        reference: Reference,
    ) -> UnitSends<'a, S> {
        UnitSends {
            sends: self,
            store,
            reference,
        }
    }
}

pub(super) struct UnitSends<'a, S> {
    sends: &'a EarlySends,
    store: &'a S,
    reference: Reference,
}

impl<S: ImageStore> EarlyUploads for UnitSends<'_, S> {
    fn claim(&self, diff_id: &str) -> bool {
        let known = |digest: Digest| self.store.knows_blob(&self.reference, &digest);
        if self.sends.digests.get(diff_id).is_some_and(known) {
            return false;
        }
        let mut sending = self.sends.sending.lock().expect("sending lock");
        if sending.contains_key(diff_id) {
            return false;
        }
        sending.insert(diff_id.to_string(), watch::channel(false).0);
        true
    }

    fn upload(&self, layer: EarlyLayer) -> LocalBoxFuture<'_, ()> {
        // Ended however it ends, even dropped before it ran: a push waiting for it goes on.
        let ended = Ended {
            sends: self.sends,
            diff_id: layer.diff_id.clone(),
        };
        Box::pin(async move {
            let _ended = ended;
            self.store.put_early_layer(&self.reference, layer).await;
        })
    }
}

struct Ended<'a> {
    sends: &'a EarlySends,
    diff_id: String,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if let Some(ended) = self
            .sends
            .sending
            .lock()
            .expect("sending lock")
            .get(&self.diff_id)
        {
            ended.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::store::fake::FakeStore;
    use bytes::Bytes;

    fn layer(diff_id: &str, bytes: &'static [u8]) -> (EarlyLayer, impl FnOnce()) {
        let (chunks, chunks_rx) = tokio::sync::mpsc::channel(1);
        let (digest, digest_rx) = tokio::sync::oneshot::channel();
        let send = move || {
            chunks.try_send(Bytes::from_static(bytes)).unwrap();
            digest.send(Digest::of(bytes)).unwrap();
        };
        let layer = EarlyLayer {
            diff_id: diff_id.into(),
            chunks: chunks_rx,
            digest: digest_rx,
        };
        (layer, send)
    }

    /// Two platforms' images share a layer: the first export sends it, the second neither
    /// sends it nor pushes it before that upload ended; a layer an earlier run put in the
    /// registry is not sent at all.
    #[tokio::test]
    async fn a_layer_is_sent_once_per_run_and_not_when_the_registry_has_it() {
        let store = FakeStore::default();
        let reference: Reference = "registry.test/app:v1".parse().unwrap();
        let sends = EarlySends::new(LayerDigests::in_memory());
        let (amd64, arm64) = (
            sends.to(&store, reference.clone()),
            sends.to(&store, reference.clone()),
        );

        assert!(amd64.claim("sha256:shared"));
        assert!(!arm64.claim("sha256:shared"), "claimed by the other export");
        let (shared, send) = layer("sha256:shared", b"shared layer");
        let upload = amd64.upload(shared);
        let waiting = sends.settled("sha256:shared");
        tokio::pin!(waiting);
        assert!(futures_util::poll!(&mut waiting).is_pending());
        send();
        upload.await;
        waiting.await;
        let sent = format!("early layer {}", Digest::of(b"shared layer"));
        assert_eq!(store.calls(), vec![sent]);

        // An upload dropped before it ran (its export was cancelled) does not leave
        // another platform's push waiting.
        assert!(amd64.claim("sha256:cancelled"));
        drop(amd64.upload(layer("sha256:cancelled", b"cancelled").0));
        sends.settled("sha256:cancelled").await;

        // A later run's export of a layer whose blob the store knows does not send it.
        let later = EarlySends::new(LayerDigests::in_memory());
        later.remember(&[ExportedLayer {
            diff_id: "sha256:shared".into(),
            digest: Digest::of(b"shared layer"),
            size: 12,
            media_type: String::new(),
            path: Default::default(),
        }]);
        assert!(!later.to(&store, reference.clone()).claim("sha256:shared"));
        assert!(later.to(&store, reference).claim("sha256:new"));
    }
}

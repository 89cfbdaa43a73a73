//! Sending a layer to the registry while it is exported. The compressed bytes the spool
//! receives also go to an upload that is finished once the layer's digest is known, so
//! the upload overlaps the export instead of following it (`docker push` too compresses
//! while it uploads). Only a layer the registry is not known to hold is sent this way
//! ([`EarlyUploads::claim`] decides by its diff ID, which the save stream names before
//! the layer's bytes); every other layer, and any whose early upload fails, is pushed
//! from the spool afterwards as before.

use super::*;
use futures_util::future::LocalBoxFuture;
use std::collections::BTreeMap;
use tokio::sync::oneshot;

/// Layers smaller than this are pushed from the spool: their upload is short anyway.
const EARLY_MIN: u64 = 1 << 20;
/// Compressed members (up to ~1 MiB each) waiting for the upload: the export waits for a
/// registry slower than itself rather than hold more in memory.
const EARLY_DEPTH: usize = 4;

/// A layer offered to [`EarlyUploads`] as its export begins.
pub struct EarlyLayer {
    /// The diff ID the save stream names for it (checked against its bytes at the end).
    pub diff_id: String,
    /// Its compressed bytes as they are spooled. They end with the layer, or early when
    /// the export stops.
    pub chunks: mpsc::Receiver<Bytes>,
    /// Its compressed digest once all of it was sent; dropped when the export failed.
    pub digest: oneshot::Receiver<Digest>,
}

/// Where layers may go while they are exported.
pub trait EarlyUploads {
    /// Whether to send the layer with `diff_id` now: not when the registry is known to
    /// hold it already, or another export of this run sends it.
    fn claim(&self, diff_id: &str) -> bool;
    /// Uploads a claimed layer; a failure leaves it to the push from the spool.
    fn upload(&self, layer: EarlyLayer) -> LocalBoxFuture<'_, ()>;
}

/// The worker's side of early uploads: where to offer layers, and what it needs to tell
/// which diff ID a Docker ≤ 24 layer directory holds.
pub(super) struct EarlyOffers {
    pub(super) offers: mpsc::Sender<EarlyLayer>,
    /// The image's diff IDs in rootfs order, from the engine's inspect; awaited when
    /// first needed.
    pub(super) diff_ids: DiffIds,
    /// The last `<dir>/json` entry seen: Docker writes it just before `<dir>/layer.tar`.
    pub(super) legacy_json: Option<(String, Vec<u8>)>,
}

pub(super) struct DiffIds {
    coming: Option<oneshot::Receiver<Vec<String>>>,
    known: Vec<String>,
}

impl DiffIds {
    pub(super) fn coming(ids: oneshot::Receiver<Vec<String>>) -> DiffIds {
        DiffIds {
            coming: Some(ids),
            known: Vec::new(),
        }
    }

    /// The diff IDs, waiting for them the first time; none when the inspect failed.
    fn get(&mut self) -> &[String] {
        if let Some(coming) = self.coming.take() {
            self.known = coming.blocking_recv().unwrap_or_default();
        }
        &self.known
    }
}

/// The sending half of one offered layer.
pub(super) struct Sending {
    pub(super) chunks: mpsc::Sender<Bytes>,
    pub(super) digest: oneshot::Sender<Digest>,
}

impl EarlyOffers {
    /// Offers the layer at `path` (its diff ID told by its name or its directory's
    /// `json`); None when it is not offered or nobody takes it.
    pub(super) fn offer(&mut self, path: &str, size: u64) -> Option<Sending> {
        if size < EARLY_MIN {
            return None;
        }
        let diff_id = self.named_diff_id(path)?;
        let (chunks, chunks_rx) = mpsc::channel(EARLY_DEPTH);
        let (digest, digest_rx) = oneshot::channel();
        let layer = EarlyLayer {
            diff_id,
            chunks: chunks_rx,
            digest: digest_rx,
        };
        self.offers.blocking_send(layer).ok()?;
        Some(Sending { chunks, digest })
    }

    /// Podman names its layers `<diff id hex>.tar` and an OCI layout `blobs/sha256/<hex>`;
    /// Docker ≤ 24 names the directory by a v1 ID derived from the diff IDs.
    fn named_diff_id(&mut self, path: &str) -> Option<String> {
        if let Some(dir) = path.strip_suffix("/layer.tar") {
            let (json_dir, json) = self.legacy_json.take()?;
            return (json_dir == dir)
                .then(|| legacy_diff_id(dir, &json, self.diff_ids.get()))
                .flatten();
        }
        let hex = path
            .strip_prefix("blobs/sha256/")
            .or_else(|| path.strip_suffix(".tar").filter(|p| !p.contains('/')))?;
        let digest: Digest = format!("sha256:{hex}").parse().ok()?;
        Some(digest.to_string())
    }
}

/// Which of `diff_ids` a Docker ≤ 24 save directory holds. Its name is the v1 ID Docker
/// derives from its `json` without `id` and `parent`, plus the layer's chain ID and the
/// parent's ID (moby `image/v1.CreateID`, as `image/tarexport/save.go` calls it: `os` is
/// only part of it for the last layer). None when no position gives the name.
pub(super) fn legacy_diff_id(dir: &str, json: &[u8], diff_ids: &[String]) -> Option<String> {
    let mut fields = top_level_fields(json)?;
    fields.remove("id");
    if let Some(parent) = fields.remove("parent") {
        let parent: String = serde_json::from_str(&parent).ok()?;
        fields.insert(
            "parent".into(),
            serde_json::to_string(&format!("sha256:{parent}")).ok()?,
        );
    }
    let mut chain = String::new();
    for (i, diff_id) in diff_ids.iter().enumerate() {
        chain = match i {
            0 => diff_id.clone(),
            _ => Digest::of(format!("{chain} {diff_id}").as_bytes()).to_string(),
        };
        let last = i + 1 == diff_ids.len();
        let mut named = fields.clone();
        if !last {
            named.remove("os");
        }
        named.insert("layer_id".into(), serde_json::to_string(&chain).ok()?);
        // Go writes a map's keys sorted, and raw values as they are (already compact).
        let members: Vec<String> = named
            .iter()
            .map(|(key, value)| format!("{}:{value}", serde_json::Value::from(key.as_str())))
            .collect();
        let text = format!("{{{}}}", members.join(","));
        if Digest::of(text.as_bytes()).hex() == dir {
            return Some(diff_id.clone());
        }
    }
    None
}

/// The members of a JSON object, each value as its raw text.
fn top_level_fields(json: &[u8]) -> Option<BTreeMap<String, String>> {
    let text = std::str::from_utf8(json).ok()?.trim();
    let mut rest = text.strip_prefix('{')?.trim_start();
    let mut fields = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('}') {
        return after.is_empty().then_some(fields);
    }
    loop {
        let (key, after) = one_value::<String>(rest)?;
        let after = after.trim_start().strip_prefix(':')?.trim_start();
        let (_, after_value) = one_value::<serde::de::IgnoredAny>(after)?;
        let raw = &after[..after.len() - after_value.len()];
        fields.insert(key, raw.to_string());
        let after = after_value.trim_start();
        if let Some(after) = after.strip_prefix(',') {
            rest = after.trim_start();
        } else {
            return after.strip_prefix('}')?.trim().is_empty().then_some(fields);
        }
    }
}

/// The JSON value `text` starts with, and what follows it.
fn one_value<T: serde::de::DeserializeOwned>(text: &str) -> Option<(T, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

/// Passes what is written on to `inner` and, while the upload takes it, to `to`.
pub(super) struct Tee<W> {
    pub(super) inner: W,
    pub(super) to: Option<mpsc::Sender<Bytes>>,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write_all(buf)?;
        if let Some(to) = &self.to {
            if to.blocking_send(Bytes::copy_from_slice(buf)).is_err() {
                // The upload stopped: the layer is pushed from the spool instead.
                self.to = None;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of `docker save` on Docker 20.10 (moby `image/tarexport`), with its
    /// `json` and the image's diff IDs as the engine's inspect gives them.
    const DIFF_IDS: [&str; 3] = [
        "sha256:9629f8de585eb755d299445e01dadd7329c1904205afd81d92dff42e8cc0ca93",
        "sha256:8dfaadb2836ca1503a931e81facc8178b68eb2b56cac517756b457790e95646d",
        "sha256:68846eee9665ae032222fdb280f979f45363b28c3aea4f153211d54b6177eda7",
    ];
    const ZERO_CONFIG: &str = r#"{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,"Cmd":null,"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":null}"#;

    fn ids() -> Vec<String> {
        DIFF_IDS.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn docker_save_directories_are_told_by_their_v1_id() {
        let first = format!(
            r#"{{"id":"59d36f7bee0e1563838734bb0987f5b3e306cb82eb877b1775e9dfe66ccc502d","created":"1970-01-01T00:00:00Z","container_config":{ZERO_CONFIG},"os":"linux"}}"#
        );
        let second = format!(
            r#"{{"id":"08512565236c403c744f777f787267a5c1aa3d821e82846ce9ecedf760ec495e","parent":"59d36f7bee0e1563838734bb0987f5b3e306cb82eb877b1775e9dfe66ccc502d","created":"1970-01-01T00:00:00Z","container_config":{ZERO_CONFIG},"os":"linux"}}"#
        );
        let last = format!(
            r#"{{"id":"e8e32865d68d8c365e1c617904fa376ec1330b3ed997fb65efdcc7e9b58f9ba0","parent":"08512565236c403c744f777f787267a5c1aa3d821e82846ce9ecedf760ec495e","created":"2026-12-06T04:56:29.631066907Z","container_config":{ZERO_CONFIG},"config":{{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":null,"Image":"","Volumes":null,"WorkingDir":"/","Entrypoint":null,"OnBuild":null,"Labels":null}},"architecture":"amd64","os":"linux"}}"#
        );
        let cases = [
            (
                "59d36f7bee0e1563838734bb0987f5b3e306cb82eb877b1775e9dfe66ccc502d",
                &first,
                0,
            ),
            (
                "08512565236c403c744f777f787267a5c1aa3d821e82846ce9ecedf760ec495e",
                &second,
                1,
            ),
            (
                "e8e32865d68d8c365e1c617904fa376ec1330b3ed997fb65efdcc7e9b58f9ba0",
                &last,
                2,
            ),
        ];
        for (dir, json, position) in cases {
            assert_eq!(
                legacy_diff_id(dir, json.as_bytes(), &ids()).as_deref(),
                Some(DIFF_IDS[position]),
                "{dir}"
            );
        }
        // Another image's diff IDs, or a json that is not the directory's, tell nothing.
        assert_eq!(
            legacy_diff_id(cases[0].0, first.as_bytes(), &ids()[1..]),
            None
        );
        assert_eq!(legacy_diff_id(cases[1].0, first.as_bytes(), &ids()), None);
        assert_eq!(legacy_diff_id(cases[0].0, b"not json", &ids()), None);
    }
}

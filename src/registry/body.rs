//! Every body polyarch reads from a registry or token server goes through here, so that a
//! hostile answer (a 1 GiB error page, an endless token) costs at most its limit in memory:
//! reading stops at the limit instead of checking after the whole body arrived.

use super::failure::Attempt;
use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};

/// Largest manifest, config, referrers listing or tag list polyarch reads; real ones are a
/// few KiB.
pub(super) const MAX_JSON_BLOB: usize = 4 * 1024 * 1024;
/// Largest token server answer; real tokens are a few KiB.
pub(super) const MAX_TOKEN_ANSWER: usize = 1024 * 1024;
/// How much of a refusal's body is kept for its message; the rest is never read.
pub(super) const MAX_ERROR_BODY: usize = 16 * 1024;

/// The first `limit` bytes of a body, and whether it went on past them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Capped {
    pub bytes: Vec<u8>,
    pub more: bool,
}

/// Reads `chunks` until they end or `limit` bytes arrived; what follows is not read.
pub(super) async fn read_capped<E>(
    chunks: impl Stream<Item = Result<Bytes, E>>,
    limit: usize,
) -> Result<Capped, E> {
    let mut chunks = std::pin::pin!(chunks);
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.try_next().await? {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Capped { bytes, more: true });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Capped { bytes, more: false })
}

/// The whole body, when it is at most `limit` bytes; a larger one (announced or found while
/// reading) fails the attempt as too large, and is not retried.
pub(super) async fn read_limited(
    response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, Attempt> {
    let announced = response.content_length().unwrap_or(0);
    let status = response.status().as_u16();
    if announced > limit as u64 {
        return Err(Attempt::too_large(status, limit));
    }
    let read = read_capped(response.bytes_stream(), limit).await?;
    match read.more {
        true => Err(Attempt::too_large(status, limit)),
        false => Ok(read.bytes),
    }
}

/// A manifest, config, referrers listing or tag list: at most [`MAX_JSON_BLOB`].
pub(super) async fn read_json(response: reqwest::Response) -> Result<Vec<u8>, Attempt> {
    read_limited(response, MAX_JSON_BLOB).await
}

/// The start of a refusal's body as text (at most [`MAX_ERROR_BODY`]), for its message;
/// empty when it cannot be read.
pub(super) async fn error_text(response: reqwest::Response) -> String {
    let read = read_capped(response.bytes_stream(), MAX_ERROR_BODY).await;
    read.map(|r| String::from_utf8_lossy(&r.bytes).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An endless body of 64 KiB chunks, counting the chunks handed out.
    fn endless(pulled: &AtomicUsize) -> impl Stream<Item = Result<Bytes, std::io::Error>> + '_ {
        futures_util::stream::repeat_with(move || {
            pulled.fetch_add(1, Ordering::Relaxed);
            Ok(Bytes::from(vec![b'x'; 64 * 1024]))
        })
    }

    #[tokio::test]
    async fn an_endless_body_is_read_up_to_its_limit_only() {
        let pulled = AtomicUsize::new(0);
        let read = read_capped(endless(&pulled), MAX_ERROR_BODY).await.unwrap();
        assert_eq!((read.bytes.len(), read.more), (MAX_ERROR_BODY, true));
        assert_eq!(pulled.load(Ordering::Relaxed), 1);

        let read = read_capped(endless(&pulled), MAX_TOKEN_ANSWER)
            .await
            .unwrap();
        assert_eq!((read.bytes.len(), read.more), (MAX_TOKEN_ANSWER, true));
        // 16 chunks fill 1 MiB, the 17th shows there is more; no chunk after that is asked.
        assert_eq!(pulled.load(Ordering::Relaxed), 1 + 17);
    }

    #[tokio::test]
    async fn a_body_within_its_limit_is_read_whole() {
        let chunks = || {
            let chunks = ["ab", "cd", ""].map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            futures_util::stream::iter(chunks)
        };
        let exact = read_capped(chunks(), 4).await;
        assert_eq!(
            exact.unwrap(),
            Capped {
                bytes: b"abcd".to_vec(),
                more: false
            }
        );
        let over = read_capped(chunks(), 3).await;
        assert_eq!(
            over.unwrap(),
            Capped {
                bytes: b"abc".to_vec(),
                more: true
            }
        );
    }

    #[tokio::test]
    async fn a_broken_body_is_its_error() {
        let broken = futures_util::stream::iter([
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("reset")),
        ]);
        let error = read_capped(broken, 16).await.unwrap_err();
        assert_eq!(error.to_string(), "reset");
    }

    #[test]
    fn sizes_are_named_in_their_unit() {
        use crate::base::text::size;
        assert_eq!(size(MAX_JSON_BLOB), "4 MiB");
        assert_eq!(size(MAX_ERROR_BODY), "16 KiB");
        assert_eq!(size(1000), "1000 bytes");
    }
}

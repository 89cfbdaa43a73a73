//! What a run created in the engines (temporary images), removed when it ends, fails or
//! is interrupted.

use crate::base::progress::{Event, Reporter};
use crate::docker::engine::{Engine, Product};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What a run created in the engines, so an interrupted or failed run can remove it.
#[derive(Default, Clone)]
pub struct Cleanup {
    images: Arc<Mutex<Vec<Temporary>>>,
}

/// A temporary image a build writes.
#[derive(Clone)]
struct Temporary {
    engine: Engine,
    tag: String,
    /// Whether the engine may still write the tag after its build was cut off: always for
    /// the classic builder, which runs on without its client; for BuildKit only once its
    /// exporter has started, since cutting the session cancels the solve before that.
    may_appear: Arc<AtomicBool>,
}

impl Cleanup {
    /// Records `tag`; the flag returned is `Temporary::may_appear`, for the build to set.
    pub fn add(&self, engine: &Engine, tag: &str) -> Arc<AtomicBool> {
        let may_appear = Arc::new(AtomicBool::new(!engine.buildkit));
        self.images.lock().expect("cleanup lock").push(Temporary {
            engine: engine.clone(),
            tag: tag.to_string(),
            may_appear: may_appear.clone(),
        });
        may_appear
    }

    /// Removes `tag`; true once it is gone. A tag not there yet (a build cut off may still
    /// write it) or one the engine would not remove (still in use) stays recorded.
    pub async fn remove(&self, engine: &Engine, tag: &str) -> bool {
        let removed = engine
            .docker
            .remove_image(
                tag,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .is_ok();
        if removed {
            self.images
                .lock()
                .expect("cleanup lock")
                .retain(|t| !(t.tag == tag && t.engine.endpoint == engine.endpoint));
        }
        removed
    }

    /// Removes every temporary image still recorded; safe to call more than once.
    ///
    /// A build whose client went away (an interrupted run) can still finish in the engine
    /// and tag its image after the first attempt: what is left is retried every 100 ms
    /// for up to `grace`, which the reporter is told about.
    pub async fn run(&self, grace: std::time::Duration, reporter: &dyn Reporter) {
        let deadline = tokio::time::Instant::now() + grace;
        let mut images: Vec<Temporary> = self.images.lock().expect("cleanup lock").clone();
        let mut first = true;
        loop {
            let mut left = Vec::new();
            for image in images {
                if !self.remove(&image.engine, &image.tag).await
                    && image.may_appear.load(Ordering::SeqCst)
                {
                    left.push(image);
                }
            }
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                return;
            }
            if first {
                first = false;
                if let Some(podman) = left.iter().find(|i| i.engine.product == Product::Podman) {
                    reporter.report(Event::Warning {
                        message: format!(
                            "{} at {} cannot cancel a build in flight: its current step runs to its end before Podman drops the build and its Buildah containers (`podman ps -a --external` lists them meanwhile; `podman rm -f ID` removes one at once)",
                            podman.engine.product_version(),
                            podman.engine.endpoint
                        ),
                    });
                }
                reporter.report(Event::Note {
                    message: format!(
                        "waiting up to {}s for {} cut-off build(s) to end in the engine, to remove their temporary images; interrupt again to exit now",
                        grace.as_secs(),
                        left.len()
                    ),
                });
            }
            images = left;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

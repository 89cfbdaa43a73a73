//! What a run created in the engines (temporary images, test containers), removed when it
//! ends, fails or is interrupted.

use crate::base::progress::{Event, Reporter};
use crate::docker::engine::{Engine, Product};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// BuildKit's status stream trails the engine: a solve cut off in its last step may
/// already be exporting although its "exporting to" status never arrived (seen on a
/// loaded Docker 20.10). Cleanup gives such a build this long to show its image.
const STATUS_LAG: Duration = Duration::from_secs(2);

/// How far a build got, as cleanup needs to know it: whether the engine may still write
/// the temporary tag after the build is cut off.
#[derive(Default)]
pub struct BuildStage {
    solving: AtomicBool,
    exporting: AtomicBool,
}

impl BuildStage {
    /// BuildKit started a step: the solve is under way in the engine.
    pub fn solving(&self) {
        self.solving.store(true, Ordering::SeqCst);
    }

    /// The engine began writing the image: it may appear even if the build is cut off.
    pub fn exporting(&self) {
        self.exporting.store(true, Ordering::SeqCst);
    }

    /// How long after a cut-off the tag may still appear.
    fn may_appear_for(&self, grace: Duration) -> Duration {
        if self.exporting.load(Ordering::SeqCst) {
            grace
        } else if self.solving.load(Ordering::SeqCst) {
            grace.min(STATUS_LAG)
        } else {
            Duration::ZERO
        }
    }
}

/// What a run created in the engines, so an interrupted or failed run can remove it.
#[derive(Default, Clone)]
pub struct Cleanup {
    images: Arc<Mutex<Vec<Temporary>>>,
    /// Containers a test runs, by engine: removed here when the run was cut off.
    containers: Arc<Mutex<Vec<(Engine, String)>>>,
}

/// A temporary image a build writes.
#[derive(Clone)]
struct Temporary {
    engine: Engine,
    tag: String,
    /// Whether the engine may still write the tag after its build was cut off: always for
    /// the classic builder, which runs on without its client; for BuildKit once its
    /// exporter has started (cutting the session cancels the solve before that), and
    /// briefly while it solves.
    stage: Arc<BuildStage>,
}

impl Cleanup {
    /// Records `tag`; the stage returned is for the build to mark.
    pub fn add(&self, engine: &Engine, tag: &str) -> Arc<BuildStage> {
        let stage = Arc::new(BuildStage {
            solving: AtomicBool::new(false),
            exporting: AtomicBool::new(!engine.buildkit),
        });
        self.images.lock().expect("cleanup lock").push(Temporary {
            engine: engine.clone(),
            tag: tag.to_string(),
            stage: stage.clone(),
        });
        stage
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

    /// Records a container `name` on `engine`, until [`Cleanup::container_removed`].
    pub fn add_container(&self, engine: &Engine, name: &str) {
        let mut containers = self.containers.lock().expect("cleanup lock");
        containers.push((engine.clone(), name.to_string()));
    }

    /// The container's own run removed it.
    pub fn container_removed(&self, name: &str) {
        let mut containers = self.containers.lock().expect("cleanup lock");
        containers.retain(|(_, n)| n != name);
    }

    /// Removes every container and temporary image still recorded; safe to call more than
    /// once.
    ///
    /// A build whose client went away (an interrupted run) can still finish in the engine
    /// and tag its image after the first attempt: what is left is retried every 100 ms
    /// for up to `grace` (see [`BuildStage`]), which the reporter is told about.
    pub async fn run(&self, grace: Duration, reporter: &dyn Reporter) {
        let containers = std::mem::take(&mut *self.containers.lock().expect("cleanup lock"));
        for (engine, name) in containers {
            crate::docker::container::remove(&engine.docker, &name).await;
        }
        let started = tokio::time::Instant::now();
        let mut images: Vec<Temporary> = self.images.lock().expect("cleanup lock").clone();
        let mut first = true;
        loop {
            let mut left = Vec::new();
            for image in images {
                let waited = started.elapsed();
                if !self.remove(&image.engine, &image.tag).await
                    && waited < image.stage.may_appear_for(grace)
                {
                    left.push(image);
                }
            }
            if left.is_empty() {
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
                        left.iter()
                            .map(|i| i.stage.may_appear_for(grace).as_secs())
                            .max()
                            .unwrap_or_default(),
                        left.len()
                    ),
                });
            }
            images = left;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_build_is_waited_for_by_how_far_the_engine_got() {
        let grace = Duration::from_secs(10);
        let stage = BuildStage::default();
        assert_eq!(stage.may_appear_for(grace), Duration::ZERO, "never started");
        stage.solving();
        assert_eq!(
            stage.may_appear_for(grace),
            STATUS_LAG,
            "its status may trail"
        );
        assert_eq!(
            stage.may_appear_for(Duration::from_secs(1)),
            Duration::from_secs(1),
            "never past the grace"
        );
        stage.exporting();
        assert_eq!(
            stage.may_appear_for(grace),
            grace,
            "the engine is writing it"
        );
    }
}

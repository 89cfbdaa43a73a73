//! What a run created in the engines (temporary images, test and probe containers, probe
//! images), removed when it ends, fails or is interrupted.

use crate::base::progress::{Event, Reporter};
use crate::docker::container::{self, run_to_end, ContainerError, ContainerRun, Outcome};
use crate::docker::engine::{Engine, Product};
use crate::docker::libpod::{self, BuildContainer};
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
    /// Containers run (a test, an emulation probe), by engine: removed here when the run
    /// was cut off.
    containers: Arc<Mutex<Vec<(Engine, String)>>>,
    /// Builds through libpod: what each may leave in Podman.
    libpod: Arc<Mutex<Vec<Arc<LibpodBuildRecord>>>>,
}

/// What a build through libpod (`/libpod/build`) may leave in Podman: Buildah's build
/// containers while it runs, and the images it wrote.
pub struct LibpodBuildRecord {
    engine: Engine,
    /// Buildah's containers before the build began: none of them is this build's.
    before: Vec<String>,
    /// The images the Dockerfile's stages are FROM: Buildah's containers name them.
    bases: Vec<String>,
    running: AtomicBool,
    /// IDs (short or full) of the images the build said it wrote.
    images: Mutex<Vec<String>>,
}

impl LibpodBuildRecord {
    /// The build ended by itself: Buildah removed its containers.
    pub fn ended(&self) {
        self.running.store(false, Ordering::SeqCst);
    }

    /// The build said it wrote the image `id` (short or full).
    pub fn image_seen(&self, id: &str) {
        let mut images = self.images.lock().expect("cleanup lock");
        if !images.iter().any(|i| i == id) {
            images.push(id.to_string());
        }
    }

    /// The image `full` is recorded on its own now ([`Cleanup::add_built`]).
    pub fn forget_seen(&self, full: &str) {
        let full = full.trim_start_matches("sha256:");
        let mut images = self.images.lock().expect("cleanup lock");
        images.retain(|i| !full.starts_with(i.as_str()));
    }

    /// Whether a build container listed now is this build's: made since it began, for
    /// one of its stages.
    fn owns(&self, container: &BuildContainer) -> bool {
        !self.before.contains(&container.id)
            && self
                .bases
                .iter()
                .any(|base| same_image(base, &container.image))
    }
}

/// Whether two names are one image as Podman writes them (`docker.io/library/` and
/// `:latest` implied).
fn same_image(a: &str, b: &str) -> bool {
    fn plain(name: &str) -> &str {
        let name = ["docker.io/library/", "docker.io/", "localhost/"]
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix))
            .unwrap_or(name);
        name.strip_suffix(":latest").unwrap_or(name)
    }
    plain(a) == plain(b)
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

    /// Records an image already there (one a build wrote, by its ID; a probe image), so
    /// removing it is never waited for.
    pub fn add_built(&self, engine: &Engine, id: &str) {
        self.images.lock().expect("cleanup lock").push(Temporary {
            engine: engine.clone(),
            tag: id.to_string(),
            stage: Arc::new(BuildStage::default()),
        });
    }

    /// Records a libpod build about to start on `engine`, with Buildah's containers
    /// `before` it and its stages' `bases`.
    pub fn add_libpod_build(
        &self,
        engine: &Engine,
        before: Vec<BuildContainer>,
        bases: Vec<String>,
    ) -> Arc<LibpodBuildRecord> {
        let record = Arc::new(LibpodBuildRecord {
            engine: engine.clone(),
            before: before.into_iter().map(|c| c.id).collect(),
            bases,
            running: AtomicBool::new(true),
            images: Mutex::new(Vec::new()),
        });
        self.libpod
            .lock()
            .expect("cleanup lock")
            .push(record.clone());
        record
    }

    /// Removes what a libpod build left: while it runs, Buildah's containers for it (its
    /// step in flight can then no longer commit); the images it said it wrote. How many
    /// build containers it removed.
    async fn remove_libpod_build(record: &LibpodBuildRecord) -> usize {
        let endpoint = &record.engine.location;
        let mut removed = 0;
        if record.running.swap(false, Ordering::SeqCst) {
            if let Ok(containers) = libpod::build_containers(endpoint).await {
                let ours = containers.iter().filter(|c| record.owns(c));
                removed = futures_util::future::join_all(
                    ours.map(|c| libpod::remove_container(endpoint, &c.id)),
                )
                .await
                .into_iter()
                .filter(|gone| *gone)
                .count();
            }
        }
        let images = std::mem::take(&mut *record.images.lock().expect("cleanup lock"));
        for id in images {
            let _ = record
                .engine
                .docker
                .remove_image(
                    &id,
                    None::<bollard::query_parameters::RemoveImageOptions>,
                    None,
                )
                .await;
        }
        removed
    }

    /// Runs a container on `engine` to its end or `timeout` ([`run_to_end`], which removes
    /// it), recorded meanwhile: one cut off by an interrupt or a deadline is removed by
    /// [`Cleanup::run`].
    pub async fn run_container(
        &self,
        engine: &Engine,
        run: ContainerRun<'_>,
        timeout: Duration,
    ) -> Result<Outcome, ContainerError> {
        let name = run.name.to_string();
        self.containers
            .lock()
            .expect("cleanup lock")
            .push((engine.clone(), name.clone()));
        let outcome = run_to_end(&engine.docker, run, timeout).await;
        self.containers
            .lock()
            .expect("cleanup lock")
            .retain(|(_, n)| *n != name);
        outcome
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
            container::remove(&engine.docker, &name).await;
        }
        let builds = std::mem::take(&mut *self.libpod.lock().expect("cleanup lock"));
        for build in builds {
            if Self::remove_libpod_build(&build).await > 0 {
                reporter.report(Event::Warning {
                    message: format!(
                        "{} at {} cannot stop a build step in flight: polyarch removed the build's containers, so nothing of it is committed, but a RUN step's process runs on to its end",
                        build.engine.product_version(),
                        build.engine.endpoint
                    ),
                });
            }
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

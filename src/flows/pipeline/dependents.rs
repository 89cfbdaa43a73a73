//! Images built from each other, in a run. A dependent waits until the index of each image
//! it builds `FROM` is in the registry by digest (no tag moves yet), then builds from a copy
//! of its Dockerfile whose `FROM` lines name `REPO@sha256:<index digest>`: BuildKit then
//! uses exactly what was just pushed and picks each platform's entry itself, on every
//! engine (named contexts would need BuildKit 0.10+, and Docker 20.10 has 0.8). The
//! copy's path is in the build's settings and its text in what the build read, so a
//! rebuilt base also rebuilds its dependents on the warm path. A `target:` named context
//! becomes `docker-image://REPO@sha256:<index digest>` the same way, and that reference
//! is in the settings key.

use super::Run;
use crate::base::digest::Digest;
use crate::base::progress::Event;
use crate::builder::Builders;
use crate::project::contexts::NamedContext;
use crate::project::dependencies::{self, Graph};
use crate::project::plan::Plan;
use crate::project::ImageSpec;
use crate::publish::store::{Destination, ImageStore};
use crate::publish::{index_of, Pushed};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio::sync::watch;

/// The pinned reference (`REPO@sha256:<index>`) of each image another builds `FROM`,
/// once its index is pushed.
pub(super) struct Pins {
    pins: BTreeMap<String, watch::Sender<Option<String>>>,
}

impl Pins {
    pub(super) fn new(plan: &Plan<'_>) -> Pins {
        let pins = plan
            .images
            .iter()
            .filter(|image| plan.dependencies.has_dependents(&image.name))
            .map(|image| (image.name.clone(), watch::channel(None).0))
            .collect();
        Pins { pins }
    }

    /// When another image builds `FROM` this one: pushes the index of its platform
    /// manifests by digest (the one publishing will tag) and lets the dependents start.
    pub(super) async fn pushed(
        &self,
        destination: &Destination,
        image: &ImageSpec,
        pushed: &[Pushed],
    ) -> Result<()> {
        let Some(pin) = self.pins.get(&image.name) else {
            return Ok(());
        };
        let mut mine: Vec<&Pushed> = pushed.iter().collect();
        let index = index_of(image, &mut mine)?;
        destination
            .put_manifest(&image.first_tag()?, &index)
            .await?;
        pin.send_replace(Some(format!("{}@{}", image.repository, index.digest)));
        Ok(())
    }

    /// Waits for the images `names` to be pushed; their pinned references by name.
    async fn wait(&self, names: &[String]) -> Result<BTreeMap<String, String>> {
        let mut pinned = BTreeMap::new();
        for name in names {
            let Some(pin) = self.pins.get(name) else {
                continue;
            };
            let mut receiver = pin.subscribe();
            let reference = receiver
                .wait_for(Option::is_some)
                .await
                .map_err(|_| Error::Interrupted)?
                .clone()
                .unwrap_or_default();
            pinned.insert(name.clone(), reference);
        }
        Ok(pinned)
    }
}

/// What `image` builds from once the images it builds from are pushed: a copy of it whose
/// Dockerfile names its `FROM`s by digest and whose `target:` contexts are those digests'
/// `docker-image://` references; None for an image building from none.
pub(super) async fn rebased(
    image: &ImageSpec,
    graph: &Graph,
    pins: &Pins,
    run: &Run<'_>,
) -> Result<Option<ImageSpec>> {
    let edges = graph.edges(&image.name);
    let targets = graph.targets(&image.name);
    if edges.is_empty() && targets.is_empty() {
        return Ok(None);
    }
    let pinned = pins.wait(&graph.dependencies(&image.name)).await?;
    for (name, reference) in &pinned {
        run.reporter.report(Event::Note {
            message: format!("{} builds FROM {name} as {reference}", image.name),
        });
    }
    let mut contexts = image.contexts.clone();
    for (context, name) in targets {
        if let Some(reference) = pinned.get(name) {
            contexts.insert(context.clone(), NamedContext::Image(reference.clone()));
        }
    }
    if edges.is_empty() {
        return Ok(Some(ImageSpec {
            contexts,
            ..image.clone()
        }));
    }
    let original = image.context.join(&image.dockerfile);
    let text = std::fs::read(&original).map_err(|e| Error::io(&original, e))?;
    let rewritten = dependencies::rewrite(&String::from_utf8_lossy(&text), edges, &pinned);
    let root = crate::base::cache_dir().unwrap_or_else(std::env::temp_dir);
    let dockerfile = write_copy(&root.join("dockerfiles"), &original, &rewritten)?;
    Ok(Some(ImageSpec {
        // Absolute: the context stays where it is, the Dockerfile is the copy.
        dockerfile,
        contexts,
        ..image.clone()
    }))
}

/// Writes `text` as a Dockerfile named as `original` is, with its own ignore file
/// (`<name>.dockerignore`) beside it when it has one, into a directory of `root` named by
/// their content: the same text gets the same path in every run (a key of the warm path),
/// and concurrent runs write the same bytes.
fn write_copy(root: &Path, original: &Path, text: &str) -> Result<PathBuf> {
    let name = original
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "Dockerfile".into());
    let ignore_name = format!("{name}.dockerignore");
    let ignore = std::fs::read(original.with_file_name(&ignore_name)).ok();
    let mut content = format!("{name}\n{text}").into_bytes();
    content.extend(ignore.iter().flatten());
    let dir = root.join(&Digest::of(&content).hex()[..16]);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let write = |file: &str, bytes: &[u8]| {
        let path = dir.join(file);
        // Renamed into place, so a concurrent reader never sees half a file.
        let partial = dir.join(format!(".{file}.{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&partial, bytes)
            .and_then(|_| std::fs::rename(&partial, &path))
            .map_err(|e| Error::io(&path, e))
    };
    write(&name, text.as_bytes())?;
    if let Some(ignore) = &ignore {
        write(&ignore_name, ignore)?;
    }
    Ok(dir.join(name))
}

/// `--output oci:DIR` holds images, while a dependent's engine pulls what it builds
/// `FROM` from a registry.
pub(super) fn check_layout(plan: &Plan<'_>, dir: &Path) -> Result<()> {
    match plan
        .images
        .iter()
        .find(|i| !plan.dependencies.dependencies(&i.name).is_empty())
    {
        Some(image) => Err(Error::Usage(format!(
            "--output oci:{}: {} builds FROM {}, which the engine must pull from a registry; push to the registry (drop --output)",
            dir.display(),
            image.name,
            plan.dependencies.dependencies(&image.name).join(", ")
        ))),
        None => Ok(()),
    }
}

/// Before anything is built: every builder of an image with named contexts must have a
/// Dockerfile frontend that reads them; elsewhere `COPY --from=NAME` would pull an image
/// NAME instead.
pub(super) fn check_named_contexts(plan: &Plan<'_>, builders: &Builders) -> Result<()> {
    for unit in &plan.units {
        let Some(name) = unit.image.contexts.keys().next() else {
            continue;
        };
        let engine = builders.for_unit(unit);
        if engine.named_contexts() {
            continue;
        }
        let why = match engine.buildkit {
            false => "has no BuildKit",
            true => {
                "has a BuildKit older than 0.10, whose Dockerfile frontend ignores named contexts"
            }
        };
        return Err(Error::Usage(format!(
            "images.{}.contexts.{name}: {} {}: the builder {} ({}, API {}) {why}; build it on Docker 23 or later, or a BuildKit daemon (`builders:`, DOCKER_HOST, BUILDKIT_HOST), or drop the named contexts",
            unit.image.name,
            unit.image.name,
            unit.platform,
            engine.endpoint,
            engine.product_version(),
            engine.api_version
        )));
    }
    Ok(())
}

/// Before anything is built: every engine building a dependent must be able to pull
/// what it builds `FROM` from the registry.
pub(super) fn check_reachable(plan: &Plan<'_>, builders: &Builders, run: &Run<'_>) -> Result<()> {
    for unit in &plan.units {
        for name in plan.dependencies.dependencies(&unit.image.name) {
            let Some(base) = plan.images.iter().find(|i| i.name == name) else {
                continue;
            };
            let engine = builders.for_unit(unit);
            let loopback = crate::registry::parse_reference(&base.repository)
                .is_ok_and(|r| crate::registry::is_loopback(r.registry()));
            let why = match (engine.buildkit, run.engine_reaches(base, engine), loopback) {
                (false, ..) => "it has no BuildKit",
                (true, true, _) => continue,
                (true, false, true) => "it runs on another host, and the registry is on this machine's loopback",
                (true, false, false) => "the registry needs polyarch's own --insecure-registry or --ca-cert, which the engine does not have",
            };
            return Err(Error::Usage(format!(
                "{} {} builds FROM {name}, and its builder {} cannot pull {} ({why}); name the registry by an address that builder reaches, or build {} on this machine",
                unit.image.name, unit.platform, engine.endpoint, base.repository, unit.platform
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::write_copy;

    #[test]
    fn copies_are_named_by_content_and_keep_their_ignore_file() {
        let root = tempfile::tempdir().unwrap();
        let context = tempfile::tempdir().unwrap();
        let original = context.path().join("app.Dockerfile");
        std::fs::write(
            context.path().join("app.Dockerfile.dockerignore"),
            "secret\n",
        )
        .unwrap();
        let first = write_copy(root.path(), &original, "FROM r/base@sha256:1\n").unwrap();
        assert_eq!(first.file_name().unwrap(), "app.Dockerfile");
        assert_eq!(
            std::fs::read_to_string(&first).unwrap(),
            "FROM r/base@sha256:1\n"
        );
        let ignore = first.with_file_name("app.Dockerfile.dockerignore");
        assert_eq!(std::fs::read_to_string(ignore).unwrap(), "secret\n");
        // The same text again: the same path, for the warm path's keys.
        let again = write_copy(root.path(), &original, "FROM r/base@sha256:1\n").unwrap();
        assert_eq!(first, again);
        // A new base digest, or a changed ignore file: another copy.
        let rebuilt = write_copy(root.path(), &original, "FROM r/base@sha256:2\n").unwrap();
        assert_ne!(first.parent(), rebuilt.parent());
        std::fs::write(
            context.path().join("app.Dockerfile.dockerignore"),
            "other\n",
        )
        .unwrap();
        let ignored = write_copy(root.path(), &original, "FROM r/base@sha256:1\n").unwrap();
        assert_ne!(first.parent(), ignored.parent());
        // No partial files are left behind.
        let names: Vec<_> = std::fs::read_dir(first.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}

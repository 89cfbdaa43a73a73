//! The build plan: which image × platform units to build, resolved against the engine.

use crate::project::dependencies::Graph;
use crate::project::{ImageSpec, Project, ProjectError};
use crate::Platform;

type Result<T, E = ProjectError> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct Unit<'a> {
    pub image: &'a ImageSpec,
    pub platform: Platform,
    /// The platform is not the engine's own, so RUN steps (if any) need emulation.
    pub foreign: bool,
}

#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// In build order: an image after the images of the project it builds `FROM`.
    pub images: Vec<&'a ImageSpec>,
    /// Which images build `FROM` which.
    pub dependencies: Graph,
    pub units: Vec<Unit<'a>>,
    pub native: Platform,
}

/// What a run builds, checked before any engine is asked: every error of the plan is here,
/// none depends on the engine.
#[derive(Debug, Clone)]
pub struct Selection<'a> {
    /// In build order: an image after the images of the project it builds `FROM`.
    pub images: Vec<&'a ImageSpec>,
    dependencies: Graph,
    units: Vec<(&'a ImageSpec, Platform)>,
}

impl<'a> Selection<'a> {
    /// The plan on an engine whose own platform is `native`.
    pub fn on(self, native: &Platform) -> Plan<'a> {
        Plan {
            images: self.images,
            dependencies: self.dependencies,
            units: self
                .units
                .into_iter()
                .map(|(image, platform)| Unit {
                    image,
                    foreign: platform.os_arch() != native.os_arch(),
                    platform,
                })
                .collect(),
            native: native.clone(),
        }
    }
}

/// Selects the named images (all when none are named) and the images of the project they
/// build `FROM`, and expands them per platform. `only` restricts every image to those
/// platforms (split runners build one each).
pub fn plan<'a>(
    project: &'a Project,
    selected: &[String],
    only: &[Platform],
    native: &Platform,
) -> Result<Plan<'a>> {
    Ok(selection(project, selected, only)?.on(native))
}

/// [`plan`] before the engine's platform is known.
pub fn selection<'a>(
    project: &'a Project,
    selected: &[String],
    only: &[Platform],
) -> Result<Selection<'a>> {
    let dependencies = Graph::of(project)?;
    let names: Vec<String> = select(project, selected)?
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let images: Vec<&ImageSpec> = dependencies
        .order(&names)
        .iter()
        .filter_map(|name| project.image(name))
        .collect();
    for platform in only {
        if !images.iter().any(|i| i.platforms.contains(platform)) {
            return Err(ProjectError::Usage(format!(
                "--platform {platform} is not declared by any selected image in {}",
                project.file.display()
            )));
        }
    }
    let units: Vec<(&ImageSpec, Platform)> = images
        .iter()
        .flat_map(|image| {
            image
                .platforms
                .iter()
                .filter(|p| only.is_empty() || only.contains(p))
                .map(move |platform| (*image, platform.clone()))
        })
        .collect();
    // A dependent waits for what it builds FROM: that must be built in this run.
    for (image, _) in &units {
        for base in dependencies.dependencies(&image.name) {
            if !units.iter().any(|(u, _)| u.name == base) {
                return Err(ProjectError::Usage(format!(
                    "{} builds FROM {base}, which this run builds for no platform (--platform {}); add a platform of {base} to --platform",
                    image.name,
                    only.iter().map(Platform::to_string).collect::<Vec<_>>().join(",")
                )));
            }
        }
    }
    Ok(Selection {
        images,
        dependencies,
        units,
    })
}

/// The named images (all when none are named), in project order; an unknown name is a
/// usage error listing the images the project declares.
pub fn select<'a>(project: &'a Project, selected: &[String]) -> Result<Vec<&'a ImageSpec>> {
    for name in selected {
        if !project.images.iter().any(|i| &i.name == name) {
            let known: Vec<&str> = project.images.iter().map(|i| i.name.as_str()).collect();
            return Err(ProjectError::Usage(format!(
                "no image named `{name}` in {}; it declares: {}",
                project.file.display(),
                known.join(", ")
            )));
        }
    }
    Ok(project
        .images
        .iter()
        .filter(|i| selected.is_empty() || selected.contains(&i.name))
        .collect())
}

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

/// Selects the named images (all when none are named) and the images of the project they
/// build `FROM`, and expands them per platform. `only` restricts every image to those
/// platforms (split runners build one each).
pub fn plan<'a>(
    project: &'a Project,
    selected: &[String],
    only: &[Platform],
    native: &Platform,
) -> Result<Plan<'a>> {
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
    let units = images
        .iter()
        .flat_map(|image| {
            image
                .platforms
                .iter()
                .filter(|p| only.is_empty() || only.contains(p))
                .map(move |platform| Unit {
                    image,
                    platform: platform.clone(),
                    foreign: platform.os_arch() != native.os_arch(),
                })
        })
        .collect::<Vec<Unit<'a>>>();
    // A dependent waits for what it builds FROM: that must be built in this run.
    for unit in &units {
        for base in dependencies.dependencies(&unit.image.name) {
            if !units.iter().any(|u| u.image.name == base) {
                return Err(ProjectError::Usage(format!(
                    "{} builds FROM {base}, which this run builds for no platform (--platform {}); add a platform of {base} to --platform",
                    unit.image.name,
                    only.iter().map(Platform::to_string).collect::<Vec<_>>().join(",")
                )));
            }
        }
    }
    Ok(Plan {
        images,
        dependencies,
        units,
        native: native.clone(),
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

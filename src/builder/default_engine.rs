//! The run's default engine: where builds without a builder of their own go, and whose
//! platform the plan calls native.

use super::builders::connect_spec;
use super::BuilderError;
use crate::base::platform::Platform;
use crate::docker::endpoint::EndpointError;
use crate::docker::engine::{ConnectError, Engine};
use crate::project::Project;

/// `BUILDKIT_HOST`'s daemon, else the Docker engine the CLI would use. When that engine
/// is down but every platform of the selected images has builders (a CI job with no
/// Docker whose platforms all build on BuildKit daemons or remote engines), nothing would
/// build on it: the first builder that answers stands in for it.
pub async fn default_engine(
    project: &Project,
    images: &[String],
    platforms: &[Platform],
) -> Result<Engine, BuilderError> {
    let down = match Engine::connect_builder().await {
        Err(down @ ConnectError::Engine(EndpointError::Down { .. })) => down,
        other => return Ok(other?),
    };
    // An unknown image name is the plan's to report, once there is an engine.
    let all_have_builders = project
        .images
        .iter()
        .filter(|image| images.is_empty() || images.contains(&image.name))
        .flat_map(|image| &image.platforms)
        .filter(|p| platforms.is_empty() || platforms.contains(p))
        .all(|p| project.builders.contains_key(p));
    if all_have_builders {
        for spec in project.builders.values().flatten() {
            if let Ok(engine) = connect_spec(spec).await {
                return Ok(engine);
            }
        }
    }
    Err(down.into())
}

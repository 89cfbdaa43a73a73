//! The engines one run builds on: the default engine and the native builders of each
//! platform from the project's `builders:`, connected for the plan at hand. It reads the
//! plan and the project, so it lives with the builds rather than in the connection module.

use super::{BuilderError, Result};
use crate::engine::{ConnectError, Engine};
use crate::plan::{Plan, Unit};
use crate::platform::Platform;
use crate::progress::{Event, Reporter};
use crate::project::{BuilderSpec, Fallback};
use std::collections::BTreeMap;

/// The engines a build uses: the default one, and native builders per platform from
/// the project's `builders:`.
#[derive(Debug, Clone)]
pub struct Builders {
    pub default: Engine,
    /// The reachable builders of each platform, in the file's order.
    pub by_platform: BTreeMap<Platform, Vec<Engine>>,
    /// Platforms whose builders were all unreachable and that build on the default engine
    /// instead (`fallback: emulate`), with why.
    pub fallbacks: BTreeMap<Platform, String>,
    /// The plan's images in order: the i-th image's build of a platform goes to that
    /// platform's builder i mod n, spreading images over a list of builders.
    images: Vec<String>,
}

/// Connects one builder of `builders:`: a Docker engine, or a BuildKit daemon.
pub(super) async fn connect(spec: &BuilderSpec) -> Result<Engine, ConnectError> {
    let endpoint = spec.endpoint()?;
    Ok(match spec.buildkit {
        true => Engine::connect_daemon(endpoint).await?,
        false => Engine::connect_to(endpoint).await?,
    })
}

impl Builders {
    /// Connects every builder the plan needs, so an unreachable one fails before any
    /// build. In a list, an unreachable builder is left out (with a warning) while another
    /// answers; when none does and one has `fallback: emulate`, the default engine takes
    /// the platform.
    pub async fn connect(
        default: Engine,
        specs: &BTreeMap<Platform, Vec<BuilderSpec>>,
        plan: &Plan<'_>,
        reporter: &dyn Reporter,
    ) -> Result<Builders> {
        let mut by_platform = BTreeMap::new();
        let mut fallbacks = BTreeMap::new();
        for (platform, specs) in specs {
            if !plan.units.iter().any(|u| &u.platform == platform) {
                continue;
            }
            let mut reachable = Vec::new();
            let mut failures = Vec::new();
            for spec in specs {
                match connect(spec).await {
                    Ok(engine) => reachable.push(engine),
                    Err(source) => failures.push((spec, source)),
                }
            }
            if !reachable.is_empty() {
                for (spec, source) in failures {
                    reporter.report(Event::Warning {
                        message: format!(
                            "builder {spec} for {platform} is unreachable: {source}; its builds go to the platform's other builders"
                        ),
                    });
                }
                by_platform.insert(platform.clone(), reachable);
                continue;
            }
            let emulate = specs.iter().any(|s| s.fallback == Fallback::Emulate);
            let Some((spec, source)) = failures.into_iter().next() else {
                continue;
            };
            if !emulate {
                return Err(match source {
                    ConnectError::Engine(source) => BuilderError::Unreachable {
                        platform: platform.to_string(),
                        source,
                    },
                    // A daemon's errors name it and the fix already.
                    other => BuilderError::Connect(other),
                });
            }
            let why = format!("builder {spec} is unreachable: {source}");
            reporter.report(Event::Warning {
                message: format!(
                    "{why}; building {platform} on {} instead, under QEMU where it runs anything (fallback: emulate)",
                    default.endpoint
                ),
            });
            fallbacks.insert(platform.clone(), why);
        }
        Ok(Builders {
            default,
            by_platform,
            fallbacks,
            images: plan.images.iter().map(|i| i.name.clone()).collect(),
        })
    }

    /// The engine that builds `unit`: one of its platform's builders, else the default.
    pub fn for_unit(&self, unit: &Unit<'_>) -> &Engine {
        match self.by_platform.get(&unit.platform) {
            Some(engines) if !engines.is_empty() => {
                let slot = self
                    .images
                    .iter()
                    .position(|name| *name == unit.image.name)
                    .unwrap_or(0);
                &engines[slot % engines.len()]
            }
            _ => &self.default,
        }
    }
}

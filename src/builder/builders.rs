//! The engines one run builds on: the default engine and the native builders of each
//! platform from the project's `builders:`, connected for the plan at hand. It reads the
//! plan and the project, so it lives with the builds rather than in the connection module.

use super::{BuilderError, Result};
use crate::base::platform::Platform;
use crate::base::progress::{Event, Reporter};
use crate::docker::engine::{ConnectError, Engine};
use crate::project::plan::{Plan, Unit};
use crate::project::{BuilderSpec, Fallback};
use sha2::{Digest, Sha256};
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
    /// Each platform's list as the file gives it: a builder's place in `by_platform`, or
    /// none when it is down. An image's slot is taken over this whole list, so one
    /// daemon going down moves only the images sticky to it.
    listed: BTreeMap<Platform, Vec<Option<usize>>>,
}

/// Connects one builder of `builders:`: a Docker engine, or a BuildKit daemon.
pub async fn connect_spec(spec: &BuilderSpec) -> Result<Engine, ConnectError> {
    let endpoint = spec.endpoint()?;
    Ok(match spec.buildkit {
        true => Engine::connect_daemon(endpoint).await?,
        false => Engine::connect_to(endpoint).await?,
    })
}

/// What an image is sticky by: its repository (where the project publishes it, the same
/// from every checkout, runner and machine, unlike a path) and its name.
pub fn sticky_key(repository: &str, name: &str) -> String {
    format!("{repository}\n{name}")
}

/// The slot `key` is sticky to in a list of `len` builders: its sha256 modulo `len`, so
/// the same image lands on the same builder (and its cache) run after run, and images
/// spread over the list (as buildx's `loadbalance=sticky`).
pub fn sticky_slot(key: &str, len: usize) -> usize {
    let digest = Sha256::digest(key.as_bytes());
    let number = digest
        .iter()
        .take(8)
        .fold(0u64, |n, b| n << 8 | u64::from(*b));
    (number % len.max(1) as u64) as usize
}

/// The builder of `listed` (none where down) that takes `key`, with its place in the
/// list: its sticky slot, or when that one is down the next one round the list that
/// answers.
pub fn sticky_choice<T: Copy>(key: &str, listed: &[Option<T>]) -> Option<(usize, T)> {
    let start = sticky_slot(key, listed.len());
    (0..listed.len())
        .map(|step| (start + step) % listed.len())
        .find_map(|place| listed[place].map(|builder| (place, builder)))
}

/// One platform's list connected: the builders that answer, each listed builder's place
/// among them, and the ones that did not answer with why.
async fn connect_list(
    specs: &[BuilderSpec],
) -> (Vec<Engine>, Vec<Option<usize>>, Vec<(usize, ConnectError)>) {
    let (mut reachable, mut listed, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for (place, spec) in specs.iter().enumerate() {
        match connect_spec(spec).await {
            Ok(engine) => {
                listed.push(Some(reachable.len()));
                reachable.push(engine);
            }
            Err(source) => {
                listed.push(None);
                failures.push((place, source));
            }
        }
    }
    (reachable, listed, failures)
}

impl Builders {
    /// Connects every builder the plan needs, so an unreachable one fails before any
    /// build. In a list, an unreachable builder is left out (with a warning naming the
    /// images it would have built and where they go) while another answers; when none
    /// does and one has `fallback: emulate`, the default engine takes the platform.
    pub async fn connect(
        default: Engine,
        specs: &BTreeMap<Platform, Vec<BuilderSpec>>,
        plan: &Plan<'_>,
        reporter: &dyn Reporter,
    ) -> Result<Builders> {
        let mut builders = Builders {
            default,
            by_platform: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
            listed: BTreeMap::new(),
        };
        for (platform, specs) in specs {
            if !plan.units.iter().any(|u| &u.platform == platform) {
                continue;
            }
            let (reachable, listed, failures) = connect_list(specs).await;
            if !reachable.is_empty() {
                for (place, source) in failures {
                    let moved = moved_images(plan, platform, place, &listed, &reachable);
                    reporter.report(Event::Warning {
                        message: format!(
                            "builder {} for {platform} is unreachable: {source}; {moved}",
                            specs[place]
                        ),
                    });
                }
                builders.by_platform.insert(platform.clone(), reachable);
                builders.listed.insert(platform.clone(), listed);
                continue;
            }
            let emulate = specs.iter().any(|s| s.fallback == Fallback::Emulate);
            let Some((place, source)) = failures.into_iter().next() else {
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
            let why = format!("builder {} is unreachable: {source}", specs[place]);
            reporter.report(Event::Warning {
                message: format!(
                    "{why}; building {platform} on {} instead, under QEMU where it runs anything (fallback: emulate)",
                    builders.default.endpoint
                ),
            });
            builders.fallbacks.insert(platform.clone(), why);
        }
        Ok(builders)
    }

    /// The engine that builds `unit`: the builder of its platform's list it is sticky to
    /// (or the next that answers), else the default.
    pub fn for_unit(&self, unit: &Unit<'_>) -> &Engine {
        let engines = self.by_platform.get(&unit.platform);
        let listed = self.listed.get(&unit.platform);
        match (engines, listed) {
            (Some(engines), Some(listed)) => sticky_choice(
                &sticky_key(&unit.image.repository, &unit.image.name),
                listed,
            )
            .and_then(|(_, i)| engines.get(i))
            .unwrap_or(&self.default),
            _ => &self.default,
        }
    }
}

/// Where the plan's images sticky to the down builder at `down` of a platform's list go
/// instead, for the warning that names it.
fn moved_images(
    plan: &Plan<'_>,
    platform: &Platform,
    down: usize,
    listed: &[Option<usize>],
    reachable: &[Engine],
) -> String {
    let moved: Vec<String> = plan
        .units
        .iter()
        .filter(|u| &u.platform == platform)
        .filter(|u| {
            sticky_slot(
                &sticky_key(&u.image.repository, &u.image.name),
                listed.len(),
            ) == down
        })
        .filter_map(|u| {
            let (_, i) = sticky_choice(&sticky_key(&u.image.repository, &u.image.name), listed)?;
            Some(format!(
                "{} builds on {} instead",
                u.image.name,
                reachable.get(i)?.endpoint
            ))
        })
        .collect();
    let others = "its builds go to the platform's other builders";
    match moved.is_empty() {
        true => others.into(),
        false => format!("{others} ({})", moved.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_sticky_to_the_same_slot_every_time() {
        let key = "registry.example/team/api\napi";
        let slot = sticky_slot(key, 3);
        assert!(slot < 3);
        for _ in 0..5 {
            assert_eq!(sticky_slot(key, 3), slot);
        }
        // sha256, not a per-process hash: the same on every machine (`sha256sum`, first 8 bytes).
        assert_eq!(sticky_slot("registry.example/team/api\napi", 1000), 795);
    }

    #[test]
    fn images_spread_over_the_list() {
        let mut counts = [0usize; 3];
        for i in 0..300 {
            counts[sticky_slot(&format!("r.example/p/img{i}\nimg{i}"), 3)] += 1;
        }
        assert!(counts.iter().all(|&n| n > 60), "{counts:?}");
    }

    #[test]
    fn a_down_builder_hands_its_images_to_the_next_one_round_the_list() {
        let key = "r.example/p/web\nweb";
        let all = [Some('a'), Some('b'), Some('c')];
        let (sticky, builder) = sticky_choice(key, &all).unwrap();
        assert_eq!(builder, all[sticky].unwrap());
        let mut one_down = all;
        one_down[sticky] = None;
        let next = (sticky + 1) % 3;
        assert_eq!(
            sticky_choice(key, &one_down),
            Some((next, all[next].unwrap()))
        );
        // The others keep theirs: only the down builder's images move.
        let other = (0..50)
            .map(|i| format!("r.example/p/i{i}\ni{i}"))
            .find(|k| sticky_slot(k, 3) != sticky)
            .unwrap();
        assert_eq!(
            sticky_choice(&other, &one_down),
            sticky_choice(&other, &all)
        );
        assert_eq!(sticky_choice::<char>(key, &[None, None, None]), None);
        assert_eq!(sticky_choice::<char>(key, &[]), None);
    }
}

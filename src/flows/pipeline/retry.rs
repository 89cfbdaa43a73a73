//! A build whose builder went away mid-run is run again on the next builder of its
//! platform's list that answers; a build that failed by itself (a failing step) never is.

use super::{unit::build_and_push, Shared};
use crate::base::progress::{Event, Reporter};
use crate::builder::binfmt::EmulationError;
use crate::builder::{BuildError, Builder};
use crate::docker::engine::Engine;
use crate::project::plan::Unit;
use crate::publish::Pushed;
use crate::{Error, Result};

/// Whether `error` says the builder was lost rather than that the build failed.
pub(super) fn builder_lost(error: &Error) -> bool {
    matches!(
        error,
        Error::Build {
            source: BuildError::BuilderLost(_),
            ..
        }
    )
}

/// Whether `error` says the build hit a foreign binary the kernel cannot run: the
/// remembered verdict that emulation works is then probed again.
pub(super) fn missing_emulation(error: &Error) -> bool {
    matches!(error, Error::Emulation(kind) if matches!(**kind, EmulationError::ExecFormat { .. }))
}

/// The builders of a list of `len` to try, in turn, after builder `lost` failed with
/// `error`: the others, from the one after it round the list; none unless the builder
/// was lost.
pub(super) fn retry_order(error: &Error, len: usize, lost: usize) -> Vec<usize> {
    if !builder_lost(error) || lost >= len {
        return Vec::new();
    }
    (1..len).map(|step| (lost + step) % len).collect()
}

/// Builds `unit` on its builder and, when that builder is lost during the build, on
/// each other builder of the platform's list that answers.
pub(super) async fn build_on_builders(unit: &Unit<'_>, shared: &Shared<'_>) -> Result<Pushed> {
    let list: &[Engine] = shared
        .builders
        .by_platform
        .get(&unit.platform)
        .map_or(&[], Vec::as_slice);
    let first = shared.builders.for_unit(unit);
    let build = async |engine: &Engine| build_on(engine, unit, shared).await;
    build_moving_on(unit, first, list, shared.run.reporter, build).await
}

/// Runs `build` on `first` and, while the builder it ran on is lost, on each other
/// builder of `list` that answers a probe, until one succeeds or fails for another
/// reason.
pub(super) async fn build_moving_on<B: Builder>(
    unit: &Unit<'_>,
    first: &B,
    list: &[B],
    reporter: &dyn Reporter,
    build: impl AsyncFn(&B) -> Result<Pushed>,
) -> Result<Pushed> {
    let error = match build(first).await {
        Err(error) => error,
        built => return built,
    };
    let Some(position) = list.iter().position(|b| b.endpoint() == first.endpoint()) else {
        return Err(error);
    };
    let (mut error, mut lost) = (error, first);
    for next in retry_order(&error, list.len(), position) {
        let candidate = &list[next];
        if !candidate.answers().await {
            continue;
        }
        let why = match &error {
            Error::Build { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        reporter.report(Event::Warning {
            message: format!(
                "{} {}: builder {} was lost during the build ({why}); building again on {}",
                unit.image.name,
                unit.platform,
                lost.endpoint(),
                candidate.endpoint()
            ),
        });
        match build(candidate).await {
            Err(again) if builder_lost(&again) => (error, lost) = (again, candidate),
            outcome => return outcome,
        }
    }
    Err(error)
}

/// One build of `unit` on `engine`; a remembered emulation verdict the build proves wrong
/// is probed again and the build retried once.
async fn build_on(engine: &Engine, unit: &Unit<'_>, shared: &Shared<'_>) -> Result<Pushed> {
    let (destination, emulation, run) = (shared.destination, shared.emulation, shared.run);
    let emulated = emulation.is_emulated(unit);
    match build_and_push(engine, destination, unit, emulated, run).await {
        Err(error) if missing_emulation(&error) && emulation.was_remembered(unit) => {
            let emulated = emulation.recheck(engine, unit, run.reporter).await?;
            build_and_push(engine, destination, unit, emulated, run).await
        }
        outcome => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_error(source: BuildError) -> Error {
        Error::Build {
            image: "api".into(),
            platform: "linux/arm64".into(),
            source,
        }
    }

    #[test]
    fn a_lost_builder_is_followed_by_the_others_in_turn() {
        let lost = build_error(BuildError::BuilderLost("transport error".into()));
        assert_eq!(retry_order(&lost, 3, 0), vec![1, 2]);
        assert_eq!(retry_order(&lost, 3, 1), vec![2, 0]);
        assert_eq!(retry_order(&lost, 3, 2), vec![0, 1]);
        // A single builder has no other to go to.
        assert!(retry_order(&lost, 1, 0).is_empty());
        assert!(retry_order(&lost, 2, 5).is_empty());
    }

    #[test]
    fn a_build_that_failed_by_itself_is_never_retried() {
        for source in [
            BuildError::StepFailed("exit code: 1 at step `RUN false`".into()),
            BuildError::WrongPlatform("built for linux/amd64".into()),
            BuildError::ImageLost("failed to get digest".into()),
            BuildError::Request("`secrets` needs BuildKit".into()),
            BuildError::Answer("no ID".into()),
        ] {
            assert!(retry_order(&build_error(source), 3, 0).is_empty());
        }
        for other in [
            Error::Emulation(Box::new(EmulationError::ExecFormat {
                platform: "linux/arm64".parse().unwrap(),
            })),
            Error::Interrupted,
            Error::Registry {
                registry: "r".into(),
                source: crate::registry::RegistryError::Refused {
                    what: "push".into(),
                    reference: "r/api".into(),
                    detail: "refused".into(),
                    source: None,
                }
                .into(),
            },
        ] {
            assert!(retry_order(&other, 3, 0).is_empty());
        }
    }

    #[test]
    fn only_an_exec_format_error_makes_emulation_be_probed_again() {
        let arm64: crate::Platform = "linux/arm64".parse().unwrap();
        let exec_format = EmulationError::ExecFormat {
            platform: arm64.clone(),
        };
        assert!(missing_emulation(&Error::Emulation(Box::new(exec_format))));
        let never = EmulationError::Never {
            platforms: vec![arm64.clone()],
            native: "linux/amd64".parse().unwrap(),
        };
        assert!(!missing_emulation(&Error::Emulation(Box::new(never))));
        // The words alone decide nothing: a step that printed them failed by itself.
        let step = BuildError::StepFailed(format!(
            "emulation for {arm64} is not registered on this engine: exec format error"
        ));
        assert!(!missing_emulation(&build_error(step)));
    }

    #[test]
    fn the_message_is_the_same_whatever_the_kind() {
        let error = build_error(BuildError::BuilderLost("transport error".into()));
        assert_eq!(
            error.to_string(),
            "build of api for linux/arm64 failed: transport error"
        );
        assert_eq!(error.exit_code(), 3);
    }
}

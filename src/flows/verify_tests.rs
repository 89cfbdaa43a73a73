//! `verify -f --test`: the images' `test:` run in the platform images their tags name now,
//! on the default engine (a foreign platform under QEMU, registered per `binfmt:` as for a
//! build), as `build` runs them before a tag moves. A failed test is a gap in the record.

use crate::base::oci::{ConfigPlatform, IndexEntry};
use crate::base::progress::Reporter;
use crate::builder::binfmt::Emulation;
use crate::builder::cleanup::Cleanup;
use crate::builder::platform_test::{test_on_engine, TestOf};
use crate::docker::engine::Engine;
use crate::flows::cache::TestMemory;
use crate::flows::pipeline::platform_tests::{attach_results, run_tests, tests_on, Earlier};
use crate::project::{ImageSpec, Project};
use crate::publish::Pushed;
use crate::registry::RegistryOptions;
use crate::verify::coverage_record::{BuildInfo, ImageCoverage};
use crate::{Error, Result};
use std::future::Future;

/// Tests the platforms `verified` found in each image's index; the engine is reached only
/// when some platform has a test. Earlier passes of the same digest and tests count.
pub async fn test_verified(
    project: &Project,
    mut verified: Vec<ImageCoverage>,
    engine: impl Future<Output = Result<Engine>>,
    registry: &RegistryOptions,
    jobs: usize,
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<Vec<ImageCoverage>> {
    let tested = tested_platforms(project, &verified);
    if tested.iter().all(|(_, pushed)| pushed.is_empty()) {
        return Ok(verified);
    }
    let engine = engine.await?;
    emulate_foreign(project, &engine, &tested, cleanup, reporter).await?;
    let images: Vec<(&ImageSpec, Vec<&Pushed>)> = tested
        .iter()
        .map(|(image, pushed)| (*image, pushed.iter().collect()))
        .collect();
    let memory = TestMemory::open();
    let results = run_tests(
        &images,
        jobs,
        Earlier {
            memory: &memory,
            trusted: true,
        },
        reporter,
        async |spec: &ImageSpec, pushed: &Pushed, test| {
            let of = TestOf {
                spec,
                platform: &pushed.platform,
                digest: &pushed.entry.digest,
                test,
                registry,
                cleanup,
                reporter,
            };
            Ok(test_on_engine(&engine, of).await?)
        },
    )
    .await;
    memory.save();
    attach_results(&mut verified, &results?);
    Ok(verified)
}

/// Each verified image's spec, with the platforms its index holds that it has tests for.
fn tested_platforms<'p>(
    project: &'p Project,
    verified: &[ImageCoverage],
) -> Vec<(&'p ImageSpec, Vec<Pushed>)> {
    verified
        .iter()
        .filter_map(|image| {
            let spec = project.images.iter().find(|s| s.name == image.name)?;
            let pushed = image
                .platforms
                .iter()
                .filter(|p| !tests_on(spec, &p.platform).is_empty())
                .filter_map(|p| {
                    Some(Pushed {
                        image: spec.name.clone(),
                        platform: p.platform.clone(),
                        entry: IndexEntry {
                            digest: p.digest.clone()?,
                            size: p.size.unwrap_or(0),
                            platform: ConfigPlatform {
                                os: p.platform.os.clone(),
                                architecture: p.platform.architecture.clone(),
                                variant: p.platform.variant.clone(),
                            },
                        },
                        build: BuildInfo::default(),
                    })
                })
                .collect();
            Some((spec, pushed))
        })
        .collect()
}

/// Makes each foreign platform to be tested runnable on `engine`, per its image's
/// `binfmt:` mode, as a build of it would.
async fn emulate_foreign(
    project: &Project,
    engine: &Engine,
    tested: &[(&ImageSpec, Vec<Pushed>)],
    cleanup: &Cleanup,
    reporter: &dyn Reporter,
) -> Result<()> {
    let emulation = Emulation::new(engine.clone(), cleanup);
    let mut ensured = Ok(());
    for (image, pushed) in tested {
        let foreign: Vec<_> = pushed
            .iter()
            .map(|p| p.platform.clone())
            .filter(|p| p.os_arch() != engine.native.os_arch())
            .collect();
        if foreign.is_empty() {
            continue;
        }
        let mode = image.binfmt.unwrap_or(project.binfmt);
        let installer = project.binfmt_image.as_deref();
        if let Err(e) = emulation.ensure(&foreign, mode, installer, reporter).await {
            ensured = Err(Error::from(e));
            break;
        }
    }
    // Probe images are per run; registrations stay, as a build's do.
    emulation.remove_probe_images().await;
    ensured
}

//! `assemble`: the parts that split runners pushed by digest, checked against the project
//! (every declared platform exactly once, in the right repository, the config agreeing),
//! then published as one index per image.

use crate::base::digest::Digest;
use crate::base::oci::{self, ConfigPlatform, IndexEntry, OciError};
use crate::base::progress::Reporter;
use crate::flows::cache::VerifyMemory;
use crate::project::plan;
use crate::project::{ImageSpec, Project};
use crate::publish::store::{connect_registry, Destination};
use crate::publish::{publish_all, Pushed};
use crate::registry::RegistryError::{self, Content, PartNotImage};
use crate::registry::{Registry, RegistryOptions};
use crate::verify::coverage_record::{CoverageRecord, PartPlatform, PartRecord, TestStatus};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// A part file as read: where it came from and what it records.
pub type PartFile = (PathBuf, PartRecord);

/// `assemble`: checks every part is in the registry and covers the declared platforms
/// exactly once, that no part's test failed and (unless `skip_tests`) that each tested
/// platform's test passed on its runner, then publishes each image's index to its tags and reads it back.
/// Nothing is published when any part is missing, doubled, wrong or failed its test.
pub async fn assemble(
    project: &Project,
    parts: &[PartFile],
    selected: &[String],
    skip_tests: bool,
    options: &RegistryOptions,
    interrupt: &tokio_util::sync::CancellationToken,
    reporter: &dyn Reporter,
) -> Result<CoverageRecord> {
    let named: Vec<String> = if selected.is_empty() {
        project
            .images
            .iter()
            .filter(|i| {
                parts
                    .iter()
                    .any(|(_, p)| p.images.iter().any(|pi| pi.name == i.name))
            })
            .map(|i| i.name.clone())
            .collect()
    } else {
        selected.to_vec()
    };
    if named.is_empty() {
        return Err(Error::Usage(format!(
            "the part files name no image of {}",
            project.file.display()
        )));
    }
    let images = plan::select(project, &named)?;
    // Every part is matched before the registry is asked anything.
    let matched = images
        .iter()
        .map(|image| match_parts(project, image, parts))
        .collect::<Result<Vec<_>>>()?;
    for (image, platforms) in images.iter().zip(&matched) {
        platforms
            .iter()
            .try_for_each(|part| check_tested(image, part, skip_tests))?;
    }
    let registry = connect_registry(&images, options, true).await?;
    let mut ready = Vec::new();
    for (image, platforms) in images.iter().zip(matched.iter()) {
        let mut pushed = Vec::new();
        for part in platforms {
            pushed.push(check_part(&registry, image, part).await?);
        }
        ready.push((image, pushed));
    }
    let destination = Destination::Registry(registry);
    let ready: Vec<(&ImageSpec, Vec<&Pushed>)> = ready
        .iter()
        .map(|(image, pushed)| (**image, pushed.iter().collect()))
        .collect();
    let memory = VerifyMemory::open();
    let published = publish_all(&destination, &ready, &memory, interrupt, reporter).await;
    memory.save();
    let mut published = published?;
    // Each platform's record carries the test its runner ran.
    for (image, parts) in published.iter_mut().zip(&matched) {
        for platform in &mut image.platforms {
            platform.test = parts
                .iter()
                .find(|part| part.platform == platform.platform)
                .and_then(|part| part.test.clone());
        }
    }
    Ok(CoverageRecord::new(published))
}

/// A part's platform: its runner's test must not have failed, and where the image tests
/// it, must have passed (unless `skip_tests`).
fn check_tested(image: &ImageSpec, part: &PartPlatform, skip_tests: bool) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::Usage(format!(
            "{} {}: {why}",
            image.name, part.platform
        )))
    };
    let tested = image
        .tests
        .iter()
        .any(|t| t.platforms.contains(&part.platform));
    match &part.test {
        Some(test) if test.failed() => refuse(format!(
            "its test failed on the runner that built it ({}{}); fix the image and rebuild that part",
            test.command,
            test.exit_code
                .map_or(String::new(), |code| format!(", exit code {code}"))
        )),
        _ if skip_tests || !tested => Ok(()),
        Some(test) if test.status == TestStatus::Skipped => refuse(
            "its part was built with --no-test while the project file gives it a test:; rebuild the part without --no-test, or assemble with --no-test".into(),
        ),
        Some(_) => Ok(()),
        None => refuse(
            "its part records no test while the project file gives it a test:; rebuild the part with this project file, or assemble with --no-test".into(),
        ),
    }
}

/// The part platform for each of `image`'s declared platforms, in declared order: each
/// in exactly one part, pushed to the image's repository, and no part platform the image
/// does not declare.
fn match_parts<'p>(
    project: &Project,
    image: &ImageSpec,
    parts: &'p [PartFile],
) -> Result<Vec<&'p PartPlatform>> {
    let mut found: Vec<(&Path, &PartPlatform)> = Vec::new();
    for (file, part) in parts {
        for part_image in part.images.iter().filter(|pi| pi.name == image.name) {
            if part_image.repository != image.repository {
                return Err(Error::Usage(format!(
                    "{}: image {} was pushed to {}, but {} declares {}; rebuild the part",
                    file.display(),
                    image.name,
                    part_image.repository,
                    project.file.display(),
                    image.repository
                )));
            }
            found.extend(part_image.platforms.iter().map(|p| (file.as_path(), p)));
        }
    }
    if let Some((file, platform)) = found
        .iter()
        .find(|(_, p)| !image.platforms.contains(&p.platform))
    {
        return Err(Error::Usage(format!(
            "{}: {} {} is not declared in {}; remove the part or declare the platform",
            file.display(),
            image.name,
            platform.platform,
            project.file.display()
        )));
    }
    let names = |files: &mut dyn Iterator<Item = &Path>| {
        files
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    image
        .platforms
        .iter()
        .map(|declared| {
            let holders: Vec<&(&Path, &PartPlatform)> = found
                .iter()
                .filter(|(_, p)| &p.platform == declared)
                .collect();
            match holders.as_slice() {
                [] => Err(Error::Usage(format!(
                    "{} {declared} has no part among {}; build it with `polyarch build --platform {declared} --push-by-digest --record FILE`",
                    image.name,
                    names(&mut parts.iter().map(|(f, _)| f.as_path()))
                ))),
                [(_, part)] => Ok(*part),
                several => Err(Error::Usage(format!(
                    "{} {declared} is in more than one part ({}); keep one",
                    image.name,
                    names(&mut several.iter().map(|(f, _)| *f))
                ))),
            }
        })
        .collect()
}

/// Reads a part's manifest and config back from the registry (digest-checked) and takes
/// the index entry's platform from the config, as a fresh build would.
async fn check_part(registry: &Registry, image: &ImageSpec, part: &PartPlatform) -> Result<Pushed> {
    let reference = image
        .first_tag()?
        .clone_with_digest(part.digest.to_string());
    let (bytes, _) = registry.get_manifest(&reference).await?;
    let not_image = |source: RegistryError| Error::Registry {
        registry: reference.registry().to_string(),
        source: source.into(),
    };
    let manifest = match oci::parse_manifest(&bytes).map_err(|e| not_image(Content(e)))? {
        oci::Parsed::Image { manifest, .. } => manifest,
        _ => {
            return Err(not_image(PartNotImage {
                reference: reference.to_string(),
            }))
        }
    };
    let config_digest = manifest.config().digest().as_ref();
    let config_digest: Digest = config_digest.parse().map_err(|source| {
        not_image(Content(OciError::Digest {
            value: config_digest.to_string(),
            source,
        }))
    })?;
    let config = registry.get_json_blob(&reference, &config_digest).await?;
    let config_platform =
        ConfigPlatform::from_config(&config).map_err(|e| not_image(Content(e)))?;
    if config_platform.normalized() != part.platform {
        return Err(not_image(RegistryError::PartPlatform {
            reference: reference.to_string(),
            claimed: part.platform.to_string(),
            found: config_platform.normalized().to_string(),
        }));
    }
    Ok(Pushed {
        image: image.name.clone(),
        platform: part.platform.clone(),
        entry: IndexEntry {
            digest: part.digest.clone(),
            size: bytes.len() as u64,
            platform: config_platform,
        },
        build: part.build.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::{LoadOptions, Purpose};
    use crate::verify::coverage_record::{BuildInfo, PartImage, TestRecord};
    use crate::Platform;

    fn project() -> Project {
        let text = "version: 1\nimages:\n  api:\n    context: .\n    repository: 127.0.0.1:5000/api\n    tags: [v1]\n    platforms: [linux/amd64, linux/arm64]\n";
        let options = LoadOptions {
            purpose: Purpose::Verify,
            ..LoadOptions::default()
        };
        Project::parse(Path::new("polyarch.yaml"), text, &options).expect("test project parses")
    }

    fn part(file: &str, repository: &str, arches: &[&str]) -> PartFile {
        let platforms = arches
            .iter()
            .map(|arch| PartPlatform {
                platform: Platform::linux(arch, None),
                digest: format!("sha256:{}", arch.len().to_string().repeat(64))
                    .parse()
                    .unwrap(),
                size: 400,
                build: BuildInfo {
                    seconds: 1.0,
                    ..Default::default()
                },
                test: None,
            })
            .collect();
        let image = PartImage {
            name: "api".into(),
            repository: repository.into(),
            platforms,
        };
        (PathBuf::from(file), PartRecord::new(vec![image]))
    }

    fn usage(outcome: Result<Vec<&PartPlatform>>) -> String {
        match outcome {
            Err(Error::Usage(message)) => message,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    const REPO: &str = "127.0.0.1:5000/api";

    #[test]
    fn a_tested_platform_needs_its_runners_test_to_have_passed() {
        let project = project();
        let text = "version: 1\nimages:\n  api:\n    context: .\n    repository: 127.0.0.1:5000/api\n    tags: [v1]\n    platforms: [linux/amd64, linux/arm64]\n    test: {run: [/bin/app], platforms: [linux/arm64]}\n";
        let options = LoadOptions {
            purpose: Purpose::Verify,
            ..LoadOptions::default()
        };
        let tested = Project::parse(Path::new("polyarch.yaml"), text, &options).unwrap();
        let (_, record) = part("p.json", REPO, &["amd64", "arm64"]);
        let [amd, arm] = [
            &record.images[0].platforms[0],
            &record.images[0].platforms[1],
        ];
        let with = |status: TestStatus, exit_code: Option<i64>| PartPlatform {
            test: Some(TestRecord {
                status,
                command: "[\"/bin/app\"]".into(),
                exit_code,
                seconds: Some(0.2),
                output_tail: Vec::new(),
                earlier_run: false,
            }),
            ..arm.clone()
        };
        let message = |outcome: Result<()>| match outcome {
            Err(Error::Usage(message)) => message,
            other => panic!("expected a usage error, got {other:?}"),
        };
        let image = &tested.images[0];
        // Untested amd64 needs nothing; arm64 with no test recorded is refused.
        check_tested(image, amd, false).unwrap();
        let no_test = message(check_tested(image, arm, false));
        assert!(
            no_test.contains("api linux/arm64: its part records no test")
                && no_test.contains("assemble with --no-test"),
            "{no_test}"
        );
        check_tested(image, arm, true).unwrap();
        check_tested(image, &with(TestStatus::Passed, Some(0)), false).unwrap();
        let skipped = message(check_tested(image, &with(TestStatus::Skipped, None), false));
        assert!(skipped.contains("built with --no-test"), "{skipped}");
        // A failed test is refused even with --no-test, and where no test is declared.
        let failed = with(TestStatus::Failed, Some(3));
        for (image, skip) in [(image, true), (&project.images[0], false)] {
            let refused = message(check_tested(image, &failed, skip));
            assert!(
                refused.contains(
                    "its test failed on the runner that built it ([\"/bin/app\"], exit code 3)"
                ),
                "{refused}"
            );
        }
    }

    #[test]
    fn one_part_per_platform_is_taken_in_declared_order() {
        let project = project();
        let parts = [
            part("arm.json", REPO, &["arm64"]),
            part("amd.json", REPO, &["amd64"]),
        ];
        let matched = match_parts(&project, &project.images[0], &parts).unwrap();
        let platforms: Vec<String> = matched.iter().map(|p| p.platform.to_string()).collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    }

    #[test]
    fn a_missing_platform_names_the_parts_read_and_the_command_that_builds_it() {
        let project = project();
        let parts = [part("amd.json", REPO, &["amd64"])];
        let message = usage(match_parts(&project, &project.images[0], &parts));
        assert!(
            message.contains("api linux/arm64 has no part among amd.json"),
            "{message}"
        );
        assert!(
            message.contains("polyarch build --platform linux/arm64 --push-by-digest"),
            "{message}"
        );
    }

    #[test]
    fn a_platform_in_two_parts_names_both() {
        let project = project();
        let parts = [
            part("a.json", REPO, &["amd64", "arm64"]),
            part("b.json", REPO, &["arm64"]),
        ];
        let message = usage(match_parts(&project, &project.images[0], &parts));
        assert!(
            message.contains("linux/arm64 is in more than one part (a.json, b.json)"),
            "{message}"
        );
    }

    #[test]
    fn an_undeclared_platform_is_refused() {
        let project = project();
        let parts = [part("a.json", REPO, &["amd64", "arm64", "riscv64"])];
        let message = usage(match_parts(&project, &project.images[0], &parts));
        assert!(
            message.contains("a.json: api linux/riscv64 is not declared"),
            "{message}"
        );
    }

    #[test]
    fn a_part_pushed_to_another_repository_is_refused() {
        let project = project();
        let parts = [
            part("a.json", REPO, &["amd64"]),
            part("b.json", "127.0.0.1:5000/other", &["arm64"]),
        ];
        let message = usage(match_parts(&project, &project.images[0], &parts));
        assert!(
            message.contains("b.json: image api was pushed to 127.0.0.1:5000/other"),
            "{message}"
        );
    }
}

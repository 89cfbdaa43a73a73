//! `polyarch doctor`: whether everything a build needs is in place, without building
//! anything.

use crate::builder::{connect_spec, sticky_key, sticky_slot};
use crate::docker::engine::Engine;
use crate::flows::pipeline::BuildOptions;
use crate::flows::plan_report::{plan_report, Execution};
use crate::project::{BuilderSpec, Fallback, Project};
use crate::registry::Registry;
use crate::Platform;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &str, verdict: Verdict, detail: String, fix: Option<&str>) -> Check {
    Check {
        name: name.to_string(),
        verdict,
        detail,
        fix: fix.map(str::to_string),
    }
}

/// Every check in one go; the caller exits 0 only when none failed.
pub async fn doctor(project: Option<&Project>, options: &BuildOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    let engine = match Engine::connect_builder().await {
        Ok(engine) => {
            checks.push(engine_check(&engine));
            engine
        }
        Err(e) => {
            let fix = match std::env::var_os("BUILDKIT_HOST").is_some_and(|h| !h.is_empty()) {
                true => "start buildkitd at BUILDKIT_HOST, or unset it to build on a Docker engine",
                false => "start dockerd, or point DOCKER_HOST at a running engine",
            };
            checks.push(check("engine", Verdict::Fail, e.to_string(), Some(fix)));
            return checks;
        }
    };
    checks.extend(host_checks(&engine));
    let Some(project) = project else {
        return checks;
    };
    for (platform, list) in &project.builders {
        for (i, spec) in list.iter().enumerate() {
            let name = if list.len() > 1 {
                format!("builder {platform} [{i}]")
            } else {
                format!("builder {platform}")
            };
            let builds = sticky_images(project, platform, list.len(), i);
            checks.push(builder_check(name, spec, list.len() > 1, &builds).await);
        }
    }
    checks.extend(platform_checks(project, &engine, options).await);
    checks.extend(registry_checks(project, options).await);
    checks
}

/// Where builds go by default: the engine, or the daemon `BUILDKIT_HOST` names.
fn engine_check(engine: &Engine) -> Check {
    let detail = match &engine.daemon {
        Some(standalone) => format!(
            "{} (BUILDKIT_HOST) reachable: {}, its workers run {}; every platform without a builder under `builders:` builds there",
            engine.described(),
            engine.product_version(),
            platform_list(&standalone.platforms)
        ),
        None => format!(
            "{} reachable: {} (API {}), {}",
            engine.endpoint,
            engine.product_version(),
            engine.api_version,
            engine.native
        ),
    };
    check("engine", Verdict::Ok, detail, None)
}

fn platform_list(platforms: &[Platform]) -> String {
    let names: Vec<String> = platforms.iter().map(Platform::to_string).collect();
    names.join(", ")
}

/// "; builds api, web": the project's images of `platform` that the builder at `place`
/// of a list of `len` takes (all of them when it is alone, else those sticky to it).
fn sticky_images(project: &Project, platform: &Platform, len: usize, place: usize) -> String {
    let names: Vec<&str> = project
        .images
        .iter()
        .filter(|i| i.platforms.contains(platform))
        .filter(|i| len == 1 || sticky_slot(&sticky_key(&i.repository, &i.name), len) == place)
        .map(|i| i.name.as_str())
        .collect();
    match names.is_empty() {
        true => format!("; builds no image's {platform} while the list's others answer"),
        false => format!("; builds {platform} of {}", names.join(", ")),
    }
}

/// BuildKit on the engine, and binfmt_misc where the engine is this host.
fn host_checks(engine: &Engine) -> Vec<Check> {
    let mut checks = Vec::new();
    if engine.daemon.is_some() {
        // A daemon's workers say what it runs; polyarch registers nothing on its host.
        checks.push(check(
            "buildkit",
            Verdict::Ok,
            "standalone daemon: builds solve through its control API and it pushes each platform image by digest itself".into(),
            None,
        ));
        return checks;
    }
    checks.push(if engine.buildkit {
        check(
            "buildkit",
            Verdict::Ok,
            format!(
                "BuildKit available through its session protocol; {} image store",
                if engine.containerd_store {
                    "containerd"
                } else {
                    "classic"
                }
            ),
            None,
        )
    } else if engine.product == crate::docker::engine::Product::Podman {
        check(
            "buildkit",
            Verdict::Warn,
            format!(
                "{} has no BuildKit: each platform builds through its Docker-compatible /build (Buildah), one request per platform; secrets, ssh and registry cache are refused",
                engine.product_version()
            ),
            Some("for BuildKit-only features build on a Docker engine (DOCKER_HOST) or give the platform a Docker builder under `builders:`"),
        )
    } else {
        check(
            "buildkit",
            Verdict::Warn,
            format!(
                "API {} has no BuildKit; the classic builder is used with TARGET* args injected",
                engine.api_version
            ),
            Some("upgrade the engine to 18.09+ (API 1.39+)"),
        )
    });
    if engine.location.is_local() {
        let mounted = std::path::Path::new("/proc/sys/fs/binfmt_misc/status").exists();
        checks.push(if mounted {
            check("binfmt_misc", Verdict::Ok, "mounted at /proc/sys/fs/binfmt_misc".into(), None)
        } else {
            check(
                "binfmt_misc",
                Verdict::Warn,
                "not mounted on this host; foreign RUN steps need it".into(),
                Some("polyarch mounts it when it registers emulation (binfmt: auto), or: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"),
            )
        });
    }
    checks
}

/// One line per image × platform: how it will build.
async fn platform_checks(project: &Project, engine: &Engine, options: &BuildOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    match plan_report(project, engine, options).await {
        Ok(lines) => {
            for line in lines {
                let verdict = match line.execution {
                    Execution::NotRunnable => Verdict::Fail,
                    Execution::EmulatedRegistered | Execution::EmulatedWillRegister => {
                        Verdict::Warn
                    }
                    _ => Verdict::Ok,
                };
                checks.push(Check {
                    name: format!("platform {} {}", line.image, line.platform),
                    verdict,
                    detail: line.execution.describe().to_string(),
                    fix: line.warning,
                });
            }
        }
        Err(e) => checks.push(check("platforms", Verdict::Fail, e.to_string(), None)),
    }
    checks
}

/// Each image's registry: reachable, and accepting pushes with the credentials given.
async fn registry_checks(project: &Project, options: &BuildOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    for image in &project.images {
        let outcome = async {
            let reference = image.first_tag()?;
            let registry = Registry::new(&[reference.registry().to_string()], &options.registry)?;
            registry.probe(&reference, true).await?;
            Ok::<_, crate::Error>(())
        }
        .await;
        checks.push(match outcome {
            Ok(()) => check(
                &format!("registry {}", image.repository),
                Verdict::Ok,
                "reachable and accepts pushes".into(),
                None,
            ),
            Err(e) => check(
                &format!("registry {}", image.repository),
                Verdict::Fail,
                e.to_string(),
                Some("start the registry, or check credentials (docker login / --username --password-stdin)"),
            ),
        });
    }
    checks
}

/// One line per builder: reachable (TLS or ssh included), BuildKit answering on it, and
/// which images it builds (`builds`). `in_list`: other builders of the platform can take
/// its builds while it is down.
async fn builder_check(name: String, spec: &BuilderSpec, in_list: bool, builds: &str) -> Check {
    let engine = match connect_spec(spec).await {
        Ok(engine) => engine,
        Err(e) if in_list => {
            return check(
                &name,
                Verdict::Warn,
                format!("{e}{builds}"),
                Some("the platform's other builders take its builds while it is unreachable (the next one in the list)"),
            )
        }
        Err(e) if spec.fallback == Fallback::Emulate => {
            return check(
                &name,
                Verdict::Warn,
                e.to_string(),
                Some("with fallback: emulate, builds of this platform run on the default engine under QEMU until the builder is back"),
            )
        }
        Err(e) => return check(&name, Verdict::Fail, e.to_string(), None),
    };
    if let Some(standalone) = &engine.daemon {
        let detail = format!(
            "{} reachable: {}, its workers run {}{builds}",
            engine.described(),
            engine.product_version(),
            platform_list(&standalone.platforms)
        );
        return check(&name, Verdict::Ok, detail, None);
    }
    let reached = format!(
        "{} reachable: {} (API {}), {}",
        engine.location.address(),
        engine.product_version(),
        engine.api_version,
        engine.native
    );
    if !engine.buildkit {
        return check(
            &name,
            Verdict::Warn,
            format!("{reached}; no BuildKit, the classic builder is used"),
            Some("upgrade the engine to 18.09+ (API 1.39+)"),
        );
    }
    match crate::docker::buildkit::reachable(&engine.location).await {
        Ok(()) => check(
            &name,
            Verdict::Ok,
            format!("{reached}, BuildKit answers{builds}"),
            None,
        ),
        Err(e) => check(
            &name,
            Verdict::Fail,
            format!("{reached}, but BuildKit's /grpc does not answer: {e}"),
            Some("check the engine's BuildKit (dockerd's features.buildkit) and what sits between polyarch and the engine"),
        ),
    }
}

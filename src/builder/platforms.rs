//! Several platforms of one image in one solve: BuildKit pushes each platform manifest
//! by digest, and the status stream is told apart per platform.

use super::*;

/// What one solve for several platforms pushed: an index of their manifests, by digest.
#[derive(Debug, Clone)]
pub struct BuiltIndex {
    /// The index BuildKit pushed; polyarch reads its platform manifests and publishes its
    /// own index of them.
    pub digest: Digest,
    pub seconds: f64,
    /// What BuildKit read of the context, for all the platforms.
    pub transfers: Vec<Transfer>,
}

/// Builds `spec` for every one of `platforms` in one solve whose image exporter pushes
/// them by digest to `repository` (an engine on containerd's image store): one session,
/// one context transfer and one exporter run for the image instead of one per platform.
/// Each platform's steps and logs are reported as its own build's would be.
/// `manifests_pushed` hears of the platform manifests once the exporter has pushed them,
/// before the solve returns (see [`PushWatch`]).
pub async fn build_platforms(
    engine: &Engine,
    spec: &ImageSpec,
    platforms: &[Platform],
    repository: &str,
    hashes: &std::sync::Arc<super::file_hashes::FileHashes>,
    manifests_pushed: &(dyn Fn(&[Digest]) + Sync),
    reporter: &dyn Reporter,
) -> Result<BuiltIndex> {
    let started = Instant::now();
    // Nothing is written to the engine, so nothing waits on the exporter having started.
    let stage = BuildStage::default();
    let mut logs = PlatformLogs::new(&spec.name, platforms, &engine.native, &stage, reporter);
    let solved = {
        let mut watch = PushWatch::default();
        let mut on_status = |status: StatusResponse| {
            if let Some(pushed) = watch.pushed(&status) {
                manifests_pushed(&pushed);
            }
            logs.route(status)
        };
        let exporter = registry_exporter(engine, repository, spec);
        solve_in_session(
            engine,
            spec,
            platforms,
            exporter,
            hashes,
            reporter,
            &mut on_status,
        )
        .await
    };
    // A solve BuildKit answered with success succeeded, whatever its steps said: the
    // platforms' requests share the steps they have in common (a base image's layers
    // both copy from), and the one whose wait was cut short reports "context canceled"
    // for it, as buildx shows (CANCELED) and builds on.
    let error = match solved {
        Ok(solved) => {
            let digest = pushed_manifest_digest(&solved.exporter_response).ok_or_else(|| {
                BuilderError::Build {
                    image: spec.name.clone(),
                    platform: platform_list(platforms),
                    source: BuildError::Answer(format!(
                        "the engine pushed to {repository} but did not say which index ({:?})",
                        solved.exporter_response
                    )),
                }
            })?;
            return Ok(BuiltIndex {
                digest,
                seconds: started.elapsed().as_secs_f64(),
                transfers: solved.transfers,
            });
        }
        Err(error) => error,
    };
    let (stopped, failed) = (Stopped::from(error), logs.failed().unwrap_or(0));
    let log = &mut logs.logs[failed];
    let platform = log.platform;
    let shared = log.shared_failure;
    let names = if shared {
        platform_list(platforms)
    } else {
        platform.to_string()
    };
    let exporting = log
        .current_step
        .as_deref()
        .is_some_and(|step| step.starts_with("exporting to"));
    let failed = |source| BuilderError::Build {
        image: spec.name.clone(),
        platform: names.clone(),
        source,
    };
    // A lost image is built again by the caller only per platform; here it is the
    // build's failure as before.
    if let Some(lost @ BuildError::BuilderLost(_)) = log.classify(&stopped) {
        return Err(failed(lost));
    }
    let message = stopped.message();
    if exporting {
        return Err(push_failure(spec, &names, repository, message));
    }
    Err(log.failure(message, |m| failed(BuildError::StepFailed(m))))
}

fn platform_list(platforms: &[Platform]) -> String {
    platforms
        .iter()
        .map(Platform::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// One [`BuildLog`] per platform of a multi-platform solve. BuildKit names a platform's
/// vertices `[linux/arm64 2/4] RUN …`: each goes to its platform's log without the
/// platform (as a single-platform build names it), a vertex of no platform (the context
/// transfer, the exporter) to every log.
pub(super) struct PlatformLogs<'a> {
    pub(super) logs: Vec<BuildLog<'a>>,
    /// Which log each vertex went to (`None`: all), for the logs that name it.
    vertices: HashMap<String, Option<usize>>,
}

impl<'a> PlatformLogs<'a> {
    pub(super) fn new(
        image: &'a str,
        platforms: &'a [Platform],
        native: &Platform,
        stage: &'a BuildStage,
        reporter: &'a dyn Reporter,
    ) -> Self {
        let logs = BuildLog::per_platform(image, platforms, native, stage, reporter);
        PlatformLogs {
            logs,
            vertices: HashMap::new(),
        }
    }

    pub(super) fn route(&mut self, status: StatusResponse) {
        let mut parts: Vec<StatusResponse> = vec![StatusResponse::default(); self.logs.len()];
        let mut vertexes = status.vertexes;
        for vertex in &mut vertexes {
            if let Some((index, name)) = self.split_platform(&vertex.name) {
                vertex.name = name;
                self.vertices.insert(vertex.digest.clone(), Some(index));
            }
        }
        // Some steps carry no platform in their name (an exec-form RUN is `[2/2] RUN [...]`
        // for every platform): such a step belongs to the platform of the steps it builds
        // on, which a status lists in no particular order.
        loop {
            let mut found = false;
            for vertex in &vertexes {
                if self
                    .vertices
                    .get(&vertex.digest)
                    .copied()
                    .flatten()
                    .is_none()
                {
                    if let Some(index) = self.platform_of_inputs(&vertex.inputs) {
                        self.vertices.insert(vertex.digest.clone(), Some(index));
                        found = true;
                    }
                }
            }
            if !found {
                break;
            }
        }
        for vertex in vertexes {
            let target = self.vertices.get(&vertex.digest).copied().flatten();
            self.vertices.insert(vertex.digest.clone(), target);
            match target {
                Some(index) => parts[index].vertexes.push(vertex),
                None => {
                    for part in &mut parts {
                        part.vertexes.push(vertex.clone());
                    }
                }
            }
        }
        for log in status.logs {
            match self.vertices.get(&log.vertex).copied().flatten() {
                Some(index) => parts[index].logs.push(log),
                None => {
                    for part in &mut parts {
                        part.logs.push(log.clone());
                    }
                }
            }
        }
        for (log, part) in self.logs.iter_mut().zip(parts) {
            if part.vertexes.is_empty() && part.logs.is_empty() {
                continue;
            }
            let shared_error = part
                .vertexes
                .iter()
                .any(|v| !v.error.is_empty() && self.vertices[&v.digest].is_none());
            if shared_error && log.vertex_error.is_none() {
                log.shared_failure = true;
            }
            log.consume(BuildInfo {
                aux: Some(BuildInfoAux::BuildKit(part)),
                ..Default::default()
            });
        }
    }

    /// The one platform the `inputs` vertices were routed to, if they agree on one.
    fn platform_of_inputs(&self, inputs: &[String]) -> Option<usize> {
        let mut routed = inputs
            .iter()
            .filter_map(|input| self.vertices.get(input).copied().flatten());
        let first = routed.next()?;
        routed.all(|index| index == first).then_some(first)
    }

    /// The log of the platform whose vertex named in `[PLATFORM …]` is one of ours, and the
    /// name without it.
    fn split_platform(&self, name: &str) -> Option<(usize, String)> {
        let inner = name.strip_prefix('[')?;
        let end = inner.find([' ', ']'])?;
        let platform: Platform = inner[..end].parse().ok()?;
        let index = self.logs.iter().position(|log| *log.platform == platform)?;
        let rest = &inner[end..];
        let name = match rest.strip_prefix(' ') {
            Some(rest) => format!("[{rest}"),
            None => rest.trim_start_matches(']').trim_start().to_string(),
        };
        Some((index, name))
    }

    /// The log that explains the failure: a platform whose own step failed first, rather
    /// than one cancelled because another failed.
    pub(super) fn failed(&self) -> Option<usize> {
        let cancelled = |log: &BuildLog<'_>| {
            log.vertex_error
                .as_deref()
                .is_some_and(|e| e.contains("context canceled"))
        };
        self.logs
            .iter()
            .position(|log| log.vertex_error.is_some() && !cancelled(log))
            .or_else(|| self.logs.iter().position(|log| log.vertex_error.is_some()))
    }
}

/// The manifests an image exporter pushed, known from its progress: BuildKit names each
/// manifest it writes (`exporting manifest sha256:…`; the index is `exporting manifest
/// list …`), then pushes the layers and then every manifest (`pushing manifest for
/// REPO`). When that push completes the manifests are in the registry, some 20 ms before
/// the solve returns, and their layers can be read from there.
#[derive(Debug, Default)]
struct PushWatch {
    manifests: Vec<Digest>,
    told: bool,
}

impl PushWatch {
    /// The manifests exported, once: with the status saying their push completed.
    fn pushed(&mut self, status: &StatusResponse) -> Option<Vec<Digest>> {
        for step in &status.statuses {
            let exported = (step.id.strip_prefix("exporting manifest "))
                .and_then(|digest| digest.parse::<Digest>().ok());
            if let Some(digest) = exported {
                if !self.manifests.contains(&digest) {
                    self.manifests.push(digest);
                }
            } else if step.id.starts_with("pushing manifest for ")
                && step.completed.is_some()
                && !self.told
            {
                self.told = true;
                return Some(self.manifests.clone());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard_buildkit_proto::moby::buildkit::v1::VertexStatus;

    fn status(id: &str, completed: bool) -> StatusResponse {
        StatusResponse {
            statuses: vec![VertexStatus {
                id: id.to_string(),
                completed: completed.then(Default::default),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    const AMD64: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const ARM64: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const INDEX: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

    #[test]
    fn the_platform_manifests_are_told_once_their_push_completed() {
        let mut watch = PushWatch::default();
        let exported = [
            format!("exporting manifest {AMD64}"),
            format!("exporting config {INDEX}"),
            format!("exporting manifest {ARM64}"),
            format!("exporting manifest {AMD64}"),
            format!("exporting manifest list {INDEX}"),
            "pushing layers".to_string(),
        ];
        for id in &exported {
            assert_eq!(watch.pushed(&status(id, true)), None, "{id}");
        }
        let pushing = "pushing manifest for 127.0.0.1:5000/app";
        assert_eq!(watch.pushed(&status(pushing, false)), None);
        let told = watch.pushed(&status(pushing, true));
        let expected: Vec<Digest> = [AMD64, ARM64].iter().map(|d| d.parse().unwrap()).collect();
        assert_eq!(told, Some(expected));
        assert_eq!(watch.pushed(&status(pushing, true)), None, "told twice");
    }

    #[test]
    fn a_solve_that_pushes_nothing_tells_nothing() {
        let mut watch = PushWatch::default();
        for id in [
            format!("exporting manifest {AMD64}"),
            "exporting to image".into(),
        ] {
            assert_eq!(watch.pushed(&status(&id, true)), None);
        }
    }
}

//! A platform's build log: steps and lines to the reporter, a bounded tail for the error.

use super::*;

/// Turns the engine's build stream (BuildKit status or classic lines) into events and
/// keeps what is needed to explain a failure.
pub(super) struct BuildLog<'a> {
    pub(super) image: &'a str,
    pub(super) platform: &'a Platform,
    /// The engine runs this platform's programs only under emulation.
    pub(super) foreign: bool,
    /// In a multi-platform solve, the first error came from a step of no one platform.
    pub(super) shared_failure: bool,
    pub(super) reporter: &'a dyn Reporter,
    pub(super) stage: &'a BuildStage,
    pub(super) tail: VecDeque<String>,
    pub(super) vertex_names: HashMap<String, String>,
    pub(super) started: Vec<String>,
    pub(super) current_step: Option<String>,
    pub(super) vertex_error: Option<String>,
}

impl<'a> BuildLog<'a> {
    pub(super) fn new(
        image: &'a str,
        platform: &'a Platform,
        foreign: bool,
        stage: &'a BuildStage,
        reporter: &'a dyn Reporter,
    ) -> Self {
        BuildLog {
            image,
            platform,
            foreign,
            shared_failure: false,
            reporter,
            stage,
            tail: VecDeque::new(),
            vertex_names: HashMap::new(),
            started: Vec::new(),
            current_step: None,
            vertex_error: None,
        }
    }

    /// One log per platform of a build of `image` for several at once on an engine
    /// whose own platform is `native` (the others are foreign: emulated).
    pub(super) fn per_platform(
        image: &'a str,
        platforms: &'a [Platform],
        native: &Platform,
        stage: &'a BuildStage,
        reporter: &'a dyn Reporter,
    ) -> Vec<Self> {
        platforms
            .iter()
            .map(|platform| {
                let foreign = platform.os_arch() != native.os_arch();
                BuildLog::new(image, platform, foreign, stage, reporter)
            })
            .collect()
    }

    pub(super) fn line(&mut self, line: &str) {
        let line = line.trim_end();
        if line.is_empty() {
            return;
        }
        if self.tail.len() == LOG_TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
        self.reporter.report(Event::Log {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            line: line.to_string(),
        });
    }

    pub(super) fn step(&mut self, name: &str, step: u32, total: Option<u32>) {
        self.current_step = Some(name.to_string());
        self.reporter.report(Event::Step {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            step,
            total,
            name: name.to_string(),
        });
    }

    pub(super) fn consume(&mut self, info: BuildInfo) {
        if let Some(text) = &info.stream {
            for line in text.lines() {
                // Classic builder: "Step 2/5 : COPY . /src"
                if let Some((n, m)) = classic_step(line) {
                    let name = line.split_once(" : ").map_or(line, |(_, s)| s).to_string();
                    self.step(&name, n, Some(m));
                }
                self.line(line);
            }
        }
        if let Some(BuildInfoAux::BuildKit(status)) = info.aux {
            for vertex in status.vertexes {
                self.vertex_names
                    .insert(vertex.digest.clone(), vertex.name.clone());
                if vertex.started.is_some() && !self.started.contains(&vertex.digest) {
                    self.started.push(vertex.digest.clone());
                    self.stage.solving();
                    // BuildKit's exporters name their vertex "exporting to image" (or to
                    // another destination).
                    if vertex.name.starts_with("exporting to") {
                        self.stage.exporting();
                    }
                    let (n, m) = buildkit_step(&vertex.name).unzip();
                    self.step(&vertex.name, n.unwrap_or(0), m);
                }
                if !vertex.error.is_empty() && self.vertex_error.is_none() {
                    self.current_step = Some(vertex.name.clone());
                    self.vertex_error = Some(vertex.error.clone());
                }
            }
            for log in status.logs {
                let text = String::from_utf8_lossy(&log.msg).to_string();
                for line in text.lines() {
                    self.line(line);
                }
            }
        }
    }

    /// The engine's error message followed by the build's last log lines.
    pub(super) fn with_tail(&self, message: &str) -> String {
        let mut text = message.to_string();
        for line in &self.tail {
            text.push('\n');
            text.push_str(line);
        }
        text
    }

    pub(super) fn failure(
        &mut self,
        message: &str,
        failed: impl Fn(String) -> BuilderError,
    ) -> BuilderError {
        // Missing emulation is said in one line; the log adds nothing to it. On the engine's
        // own platform the same error means a program built for another one: the build's
        // own failure, with its log.
        if self.foreign && self.with_tail(message).contains("exec format error") {
            return BuilderError::Emulation(Box::new(
                crate::builder::binfmt::EmulationError::ExecFormat {
                    platform: self.platform.clone(),
                },
            ));
        }
        self.reporter.report(Event::FailedLog {
            image: self.image.to_string(),
            platform: self.platform.clone(),
            lines: self.tail.iter().cloned().collect(),
        });
        failed(self.summary(message))
    }

    /// The message in one line with the step it stopped at and the last lines of output.
    pub(super) fn summary(&self, message: &str) -> String {
        let step = self
            .current_step
            .as_deref()
            .map(|s| format!(" at step `{s}`"))
            .unwrap_or_default();
        let tail: Vec<String> = self.tail.iter().rev().take(5).rev().cloned().collect();
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!("; last output: {}", tail.join(" | "))
        };
        format!("{}{step}{tail}", one_line(message))
    }
}

pub(super) fn classic_step(line: &str) -> Option<(u32, u32)> {
    let rest = line.strip_prefix("Step ")?;
    let (frac, _) = rest.split_once(' ')?;
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// BuildKit names Dockerfile steps "[stage 2/5] RUN …" or "[2/5] COPY …".
pub(super) fn buildkit_step(name: &str) -> Option<(u32, u32)> {
    let inner = name.strip_prefix('[')?.split_once(']')?.0;
    let frac = inner.rsplit(' ').next()?;
    let (n, m) = frac.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

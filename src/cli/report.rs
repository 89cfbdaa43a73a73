//! The reporters the CLI hands the library: progress bars on a terminal, plain
//! timestamped lines otherwise, or JSON lines. They print, so they live in the binary.

use polyarch::base::progress::{Event, Phase, Reporter};
use polyarch::base::text::printable;
use polyarch::Platform;

fn unit_label(image: &str, platform: Option<&Platform>) -> String {
    match platform {
        Some(p) => format!("{image} {p}"),
        None => image.to_string(),
    }
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}

/// Plain timestamped lines for logs and CI: control characters escaped, build output only
/// when `verbose` (a failing build's tail is in its error either way).
pub struct PlainReporter {
    pub verbose: bool,
    last_bytes: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl PlainReporter {
    pub fn new(verbose: bool) -> Self {
        PlainReporter {
            verbose,
            last_bytes: Default::default(),
        }
    }

    fn line(&self, text: &str) {
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!("{:02}:{:02}:{:02}", now.hour(), now.minute(), now.second());
        eprintln!("{stamp} {}", printable(text));
    }
}

impl Reporter for PlainReporter {
    fn report(&self, event: Event) {
        match event {
            Event::Phase {
                image,
                platform,
                phase,
                message,
            } => self.line(&format!(
                "{} [{}] {message}",
                unit_label(&image, platform.as_ref()),
                serde_json::to_value(phase)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )),
            Event::Step {
                image,
                platform,
                step,
                total,
                name,
            } => {
                if step > 0 || self.verbose {
                    let counter = total.map_or(String::new(), |t| format!(" {step}/{t}"));
                    self.line(&format!("{image} {platform} [build{counter}] {name}"));
                }
            }
            Event::Log {
                image,
                platform,
                line,
            } => {
                if self.verbose {
                    self.line(&format!("{image} {platform} | {line}"));
                }
            }
            Event::Bytes {
                image,
                platform,
                phase,
                done,
                total,
            } => {
                // One line per 64 MB (and at the end) keeps logs readable.
                let key = format!("{}{phase:?}", unit_label(&image, platform.as_ref()));
                let mut last = self.last_bytes.lock().expect("reporter lock");
                let previous = last.get(&key).copied().unwrap_or(0);
                let finished = total.is_some_and(|t| done >= t);
                if done >= previous + 64_000_000 || (finished && done != previous) {
                    last.insert(key, done);
                    let of = total.map_or(String::new(), |t| format!(" of {}", megabytes(t)));
                    self.line(
                        &format!(
                            "{} [{phase:?}] {}{of}",
                            unit_label(&image, platform.as_ref()),
                            megabytes(done)
                        )
                        .to_lowercase(),
                    );
                }
            }
            Event::FailedLog {
                image,
                platform,
                lines,
            } => {
                self.line(&format!("{image} {platform} build log (failed):"));
                for line in lines {
                    self.line(&format!("{image} {platform} | {line}"));
                }
            }
            Event::Warning { message } => self.line(&format!("warning: {message}")),
            Event::Note { message } => self.line(&message),
        }
    }
}

/// JSON lines on stderr, one event per line, for machines.
pub struct JsonReporter;

impl Reporter for JsonReporter {
    fn report(&self, event: Event) {
        if let Ok(line) = serde_json::to_string(&event) {
            eprintln!("{line}");
        }
    }
}

/// One indicatif bar per image × platform on a terminal.
pub struct TerminalReporter {
    multi: indicatif::MultiProgress,
    bars: std::sync::Mutex<std::collections::BTreeMap<String, indicatif::ProgressBar>>,
}

impl Default for TerminalReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl TerminalReporter {
    pub fn new() -> Self {
        TerminalReporter {
            multi: indicatif::MultiProgress::with_draw_target(
                indicatif::ProgressDrawTarget::stderr(),
            ),
            bars: Default::default(),
        }
    }

    /// A line above the bars.
    fn say(&self, text: &str) {
        let _ = self.multi.println(printable(text));
    }

    fn bar(&self, label: &str) -> indicatif::ProgressBar {
        let mut bars = self.bars.lock().expect("reporter lock");
        bars.entry(label.to_string())
            .or_insert_with(|| {
                let bar = self.multi.add(indicatif::ProgressBar::new_spinner());
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{spinner} {prefix:<28} [{elapsed:>4}] {msg}",
                    )
                    .expect("valid template"),
                );
                bar.set_prefix(printable(label).into_owned());
                bar.enable_steady_tick(std::time::Duration::from_millis(120));
                bar
            })
            .clone()
    }
}

impl Reporter for TerminalReporter {
    fn report(&self, event: Event) {
        match event {
            Event::Phase {
                image,
                platform,
                phase,
                message,
            } => {
                let bar = self.bar(&unit_label(&image, platform.as_ref()));
                if phase == Phase::Done {
                    bar.finish_with_message(printable(&message).into_owned());
                } else {
                    bar.set_message(
                        printable(&format!("{phase:?}: {message}").to_lowercase()).into_owned(),
                    );
                }
            }
            Event::Step {
                image,
                platform,
                step,
                total,
                name,
            } => {
                let counter = total.map_or(String::new(), |t| format!(" {step}/{t}"));
                self.bar(&unit_label(&image, Some(&platform)))
                    .set_message(printable(&format!("build{counter}: {name}")).into_owned());
            }
            Event::Log { .. } => {}
            Event::Bytes {
                image,
                platform,
                phase,
                done,
                total,
            } => {
                let of = total.map_or(String::new(), |t| format!(" / {}", megabytes(t)));
                self.bar(&unit_label(&image, platform.as_ref()))
                    .set_message(format!("{phase:?}: {}{of}", megabytes(done)).to_lowercase());
            }
            Event::FailedLog {
                image,
                platform,
                lines,
            } => {
                self.say(&format!("{image} {platform} build log (failed):"));
                for line in lines {
                    self.say(&format!("  {line}"));
                }
            }
            Event::Warning { message } => {
                self.say(&format!("warning: {message}"));
            }
            Event::Note { message } => {
                self.say(&message);
            }
        }
    }
}

impl Drop for TerminalReporter {
    fn drop(&mut self) {
        for bar in self.bars.lock().expect("reporter lock").values() {
            if !bar.is_finished() {
                bar.abandon();
            }
        }
    }
}

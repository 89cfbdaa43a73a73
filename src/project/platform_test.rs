//! `test:` of an image: commands run in each platform's pushed image before any tag moves.

use super::checks::{pick, Cx};
use super::raw::{RawRun, RawTest, RawTests};
use super::{Network, Result, NETWORKS};
use crate::base::duration::parse_duration;
use crate::base::platform::Platform;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a test may run when its entry names no `timeout`.
pub const DEFAULT_TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a test runs: exec form (a list) or shell form (a string, run by `/bin/sh -c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestCommand {
    Exec(Vec<String>),
    Shell(String),
}

impl TestCommand {
    /// The argument vector the image runs.
    pub fn argv(&self) -> Vec<String> {
        match self {
            TestCommand::Exec(args) => args.clone(),
            TestCommand::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        }
    }

    /// The command as the project file wrote it, for records and messages.
    pub fn shown(&self) -> String {
        match self {
            TestCommand::Exec(args) => serde_json::to_string(args).unwrap_or_default(),
            TestCommand::Shell(line) => line.clone(),
        }
    }
}

/// One entry of `test:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformTest {
    pub run: TestCommand,
    pub timeout: Duration,
    pub env: BTreeMap<String, String>,
    /// `none` unless the entry says otherwise (not the image's build network).
    pub network: Network,
    pub user: Option<String>,
    pub workdir: Option<String>,
    /// The platforms it runs on: the entry's subset, else every platform of the image.
    pub platforms: Vec<Platform>,
}

impl Cx {
    /// The image's `test:` entries, in order; `platforms` are the image's.
    pub(super) fn platform_tests(
        &self,
        name: &str,
        raw: Option<RawTests>,
        platforms: &[Platform],
    ) -> Result<Vec<PlatformTest>> {
        let (entries, listed) = match raw {
            None => return Ok(Vec::new()),
            Some(RawTests::One(one)) => (vec![one], false),
            Some(RawTests::List(list)) => (list, true),
        };
        if entries.is_empty() {
            return Err(self.err(
                format!("images.{name}.test"),
                "is an empty list; give at least one entry, e.g. `test: {run: [\"/usr/bin/app\", \"--version\"]}`, or remove `test:`",
            ));
        }
        entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                let at = match listed {
                    true => format!("images.{name}.test[{i}]"),
                    false => format!("images.{name}.test"),
                };
                self.platform_test(&at, entry, platforms)
            })
            .collect()
    }

    fn platform_test(&self, at: &str, raw: RawTest, image: &[Platform]) -> Result<PlatformTest> {
        let field = |f: &str| format!("{at}.{f}");
        let run = match raw.run {
            None => {
                return Err(self.err(
                    field("run"),
                    "missing; add the command to run in each platform's image, e.g. `run: [\"/usr/bin/app\", \"--version\"]` or `run: \"app --version\"`",
                ))
            }
            Some(RawRun::Exec(args)) => {
                if args.is_empty() || args[0].trim().is_empty() {
                    return Err(self.err(
                        field("run"),
                        "names no program; give the program and its arguments, e.g. `run: [\"/usr/bin/app\", \"--version\"]`",
                    ));
                }
                TestCommand::Exec(args)
            }
            Some(RawRun::Shell(line)) => {
                if line.trim().is_empty() {
                    return Err(self.err(
                        field("run"),
                        "is empty; give a shell command, e.g. `run: \"app --version\"` (run by /bin/sh -c)",
                    ));
                }
                TestCommand::Shell(line)
            }
        };
        let timeout = match raw.timeout {
            Some(text) => parse_duration(&text)
                .map_err(|m| self.err(field("timeout"), format!("{m}; e.g. `timeout: 30s`")))?,
            None => DEFAULT_TEST_TIMEOUT,
        };
        let mut env = BTreeMap::new();
        for (key, value) in raw.env.map(|e| e.0).unwrap_or_default() {
            if !valid_env_name(&key) {
                return Err(self.err(
                    field(&format!("env.{key}")),
                    "is no environment variable name: use letters, digits and _, not starting with a digit, e.g. `APP_MODE`",
                ));
            }
            env.insert(key, value);
        }
        let network = match raw.network {
            Some(s) => {
                pick(&s, NETWORKS, "network mode").map_err(|m| self.err(field("network"), m))?
            }
            None => Network::None,
        };
        let user = self.test_word(
            &field("user"),
            raw.user,
            "e.g. `user: \"1000:1000\"` or `user: nobody`",
        )?;
        let workdir = self.test_word(&field("workdir"), raw.workdir, "e.g. `workdir: /app`")?;
        if let Some(dir) = &workdir {
            if !dir.starts_with('/') {
                return Err(self.err(
                    field("workdir"),
                    format!("`{dir}` is relative; give an absolute directory in the image, e.g. `workdir: /app`"),
                ));
            }
        }
        let platforms = match raw.platforms {
            None => image.to_vec(),
            Some(list) if list.is_empty() => {
                return Err(self.err(
                    field("platforms"),
                    "is empty; name some of the image's platforms, or remove `platforms:` to test on every one",
                ))
            }
            Some(list) => {
                let mut chosen: Vec<Platform> = Vec::new();
                for (i, text) in list.iter().enumerate() {
                    let at = field(&format!("platforms[{i}]"));
                    let platform: Platform = text.parse().map_err(|e| self.err(&at, format!("{e}")))?;
                    if !image.contains(&platform) {
                        let names: Vec<String> = image.iter().map(Platform::to_string).collect();
                        return Err(self.err(
                            at,
                            format!(
                                "`{text}` is not a platform of this image ({}); name one of them, or add it to the image's `platforms:`",
                                names.join(", ")
                            ),
                        ));
                    }
                    if !chosen.contains(&platform) {
                        chosen.push(platform);
                    }
                }
                chosen
            }
        };
        Ok(PlatformTest {
            run,
            timeout,
            env,
            network,
            user,
            workdir,
            platforms,
        })
    }

    /// A one-line, non-empty value (`user`, `workdir`).
    fn test_word(&self, at: &str, value: Option<String>, example: &str) -> Result<Option<String>> {
        match value {
            Some(v) if v.trim().is_empty() || v.contains(['\n', '\r']) => Err(self.err(
                at,
                format!("must be one non-empty line; {example}, or remove it"),
            )),
            other => Ok(other),
        }
    }
}

fn valid_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

//! `verify --deep`: does each platform's entrypoint binary match the platform?
//!
//! An `arm64` entry whose entrypoint is an x86-64 binary dies with `exec format error` on
//! arm64 nodes. [`inspect`] streams an image's layers once each, in order, building an
//! in-memory index of the merged filesystem (never extracting, never holding whole files),
//! resolves the command the way Docker/runc would, and reads the ELF header of the file
//! that would be executed (following `#!` interpreters and the ELF loader).
//!
//! Layers may be given decompressed or gzip-compressed: the gzip magic is detected.
//! zstd-compressed layers are reported as [`Finding::Unreadable`].
//!
//! Memory is bounded whatever the layers hold: file heads are kept up to a cap (past it a
//! file is kept without its head), and names, tar headers and the index of paths have
//! limits ([`LIMITS`]) past which the image is refused ([`LayerRefused`]).

use crate::base::layer_limits::{LayerLimit, LayerRefused};
use crate::base::layer_stream::{apply_layers, Stop};
use crate::base::platform::Platform;
use crate::base::text::{self, one_line};
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};

mod fs;

use crate::base::elf::*;
use fs::*;

/// Bytes kept of each regular file with an exec bit: ELF header, program headers, PT_INTERP.
const EXEC_PREFIX: u64 = 4096;
/// Bytes kept of other regular files: enough for a `#!` line (Linux reads 256).
const OTHER_PREFIX: u64 = 256;
/// Longest entry name and link target: Linux's PATH_MAX.
const MAX_NAME: usize = 4096;

/// What one inspection keeps at most: with the index's own overhead (some 100 bytes a
/// path) and the tar crate's one entry of headers, under about 80 MiB whatever the layers
/// hold.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Bytes of file heads; past it files are kept without theirs.
    retained: usize,
    /// Tar headers read for one entry: GNU long name and long link, PAX header, sparse map.
    entry_headers: usize,
    /// Paths in the index (with the whiteouts of the layer being read).
    paths: usize,
    /// Bytes of those paths and of symlink targets.
    name_bytes: usize,
}

const LIMITS: Limits = Limits {
    retained: 32 << 20,
    entry_headers: 1 << 20,
    paths: 250_000,
    name_bytes: 16 << 20,
};
/// Symlinks followed while resolving one path, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// Nested `#!` interpreters followed, as Linux's binfmt recursion limit.
const MAX_SCRIPT_DEPTH: usize = 4;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepReport {
    /// The resolved path in the image of the file that would be executed (the script for
    /// `#!` scripts); when it cannot be resolved, argv0 as the config spells it.
    pub executable: Option<String>,
    pub finding: Finding,
    /// One line, for humans.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The executable (or its `#!` interpreter, and its ELF loader when present) is an ELF
    /// for the platform's machine, class and byte order.
    Match,
    /// The executable, its interpreter or its loader is an ELF for another machine.
    BinaryMismatch { found: String },
    /// argv0 (or a PATH lookup of it) does not resolve to a file in the image.
    MissingEntrypoint,
    /// The config has neither Entrypoint nor Cmd.
    NoEntrypoint,
    /// A `#!` interpreter, or a dynamic ELF's PT_INTERP loader, is missing from the image.
    InterpreterMissing { interpreter: String },
    /// The executable is neither an ELF nor a `#!` script.
    NotElf,
    /// Could not judge: malformed layers or config, truncated ELF, the retention cap, an
    /// unsupported compression or a platform without a known ELF machine.
    Unreadable,
}

struct Command {
    argv: Vec<String>,
    path: String,
    cwd: String,
}

fn string_list(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        // Some old configs carry a string; Docker would run it through a shell.
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => {
            vec!["/bin/sh".into(), "-c".into(), s.clone()]
        }
        _ => Vec::new(),
    }
}

fn command(config: &[u8]) -> serde_json::Result<Command> {
    let value: serde_json::Value = serde_json::from_slice(config)?;
    let c = value.get("config");
    let entrypoint = string_list(c.and_then(|c| c.get("Entrypoint")));
    let cmd = string_list(c.and_then(|c| c.get("Cmd")));
    let argv = if entrypoint.is_empty() {
        cmd
    } else {
        entrypoint.into_iter().chain(cmd).collect()
    };
    let env = string_list(c.and_then(|c| c.get("Env")));
    let path = env
        .iter()
        .rev()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH)
        .to_string();
    let cwd = c
        .and_then(|c| c.get("WorkingDir"))
        .and_then(|w| w.as_str())
        .filter(|w| !w.is_empty())
        .unwrap_or("/")
        .to_string();
    Ok(Command { argv, path, cwd })
}

fn report(executable: Option<String>, finding: Finding, detail: String) -> DeepReport {
    DeepReport {
        executable,
        finding,
        detail,
    }
}

fn unreadable(detail: String) -> DeepReport {
    report(None, Finding::Unreadable, detail)
}

/// Inspects an image: `config` is its config JSON, `layers` its layer tars (decompressed or
/// gzip) in rootfs order, each read once, sequentially. A layer past one of [`LIMITS`] is
/// `Err`; reading stops there.
pub fn inspect(
    config: &[u8],
    layers: Vec<Box<dyn Read + Send>>,
    platform: &Platform,
) -> Result<DeepReport, LayerRefused> {
    inspect_within(config, layers, platform, LIMITS)
}

fn inspect_within(
    config: &[u8],
    layers: Vec<Box<dyn Read + Send>>,
    platform: &Platform,
    limits: Limits,
) -> Result<DeepReport, LayerRefused> {
    let command = match command(config) {
        Ok(c) => c,
        Err(e) => return Ok(unreadable(format!("image config is not JSON: {e}"))),
    };
    let Some(argv0) = command.argv.first().cloned() else {
        return Ok(report(
            None,
            Finding::NoEntrypoint,
            "the image config has neither Entrypoint nor Cmd".into(),
        ));
    };
    if argv0.is_empty() {
        return Ok(report(
            None,
            Finding::NoEntrypoint,
            "the image's command starts with an empty string".into(),
        ));
    }
    let mut fs = Fs::new(limits);
    match apply_layers(layers, |layer| fs.apply_layer(layer)) {
        Ok(()) => {}
        Err((layer, Stop::Unreadable(e))) => {
            return Ok(unreadable(format!(
                "layer {layer} of the image cannot be read: {}",
                one_line(&e.to_string())
            )))
        }
        Err((layer, Stop::Refused(limit))) => return Err(LayerRefused { layer, limit }),
    }
    let inspector = Inspector {
        fs: &fs,
        platform,
        command: &command,
    };
    Ok(inspector.run(&argv0))
}

struct Inspector<'a> {
    fs: &'a Fs,
    platform: &'a Platform,
    command: &'a Command,
}

/// The outcome of examining one file.
struct Verdict {
    finding: Finding,
    detail: String,
}

/// Why `exec.LookPath` finds no executable `name` on the container's PATH.
#[derive(Debug, thiserror::Error)]
enum NotOnPath {
    #[error("`{name}` is not on PATH={path}")]
    Absent { name: String, path: String },
    /// `found`: the first match, a file without an execute bit.
    #[error("`{name}` is not on PATH={path} ({found} exists but is not executable)")]
    NotExecutable {
        name: String,
        path: String,
        found: String,
    },
}

impl Inspector<'_> {
    fn run(&self, argv0: &str) -> DeepReport {
        let located = if argv0.contains('/') {
            self.fs
                .resolve(&self.command.cwd, argv0)
                .map_err(|e| e.describe(argv0))
        } else {
            self.look_path(argv0).map_err(|e| e.to_string())
        };
        let (resolved, node) = match located {
            Ok(found) => found,
            Err(detail) => {
                return report(
                    Some(argv0.to_string()),
                    Finding::MissingEntrypoint,
                    format!("entrypoint {detail}"),
                )
            }
        };
        let shown = if resolved == argv0 {
            resolved.clone()
        } else {
            format!("{argv0} -> {resolved}")
        };
        let verdict = self.examine(&shown, node, 0);
        report(Some(resolved), verdict.finding, verdict.detail)
    }

    /// `exec.LookPath` in the container: the first PATH entry holding an executable file.
    fn look_path(&self, name: &str) -> std::result::Result<(String, &Node), NotOnPath> {
        let mut not_executable = None;
        for dir in self.command.path.split(':') {
            let dir = if dir.is_empty() { "." } else { dir };
            let candidate = format!("{}/{name}", dir.trim_end_matches('/'));
            if let Ok((resolved, node)) = self.fs.resolve(&self.command.cwd, &candidate) {
                match node {
                    Node::File { mode, .. } if mode & 0o111 != 0 => return Ok((resolved, node)),
                    Node::File { .. } => {
                        not_executable.get_or_insert(resolved);
                    }
                    _ => {}
                }
            }
        }
        let (name, path) = (name.to_string(), self.command.path.clone());
        Err(match not_executable {
            Some(found) => NotOnPath::NotExecutable { name, path, found },
            None => NotOnPath::Absent { name, path },
        })
    }

    fn examine(&self, shown: &str, node: &Node, depth: usize) -> Verdict {
        let (mode, size, head) = match node {
            Node::Dir => {
                return Verdict {
                    finding: Finding::MissingEntrypoint,
                    detail: format!("entrypoint {shown} is a directory"),
                }
            }
            Node::Other(kind) => {
                return Verdict {
                    finding: Finding::NotElf,
                    detail: format!("entrypoint {shown} is {kind}"),
                }
            }
            Node::Symlink(_) => {
                return Verdict {
                    finding: Finding::Unreadable,
                    detail: format!("{shown} is an unresolved symlink"),
                }
            }
            Node::File { mode, size, head } => (*mode, *size, head),
        };
        let Some(head) = head else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!(
                    "{shown} was not retained: the image has more than {} of file headers (the --deep cap)",
                    text::size(self.fs.limits.retained)
                ),
            };
        };
        let mut verdict = if head.starts_with(b"\x7fELF") {
            self.examine_elf(shown, head)
        } else if head.starts_with(b"#!") {
            self.examine_script(shown, head, depth)
        } else if size == 0 {
            Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} is an empty file"),
            }
        } else {
            Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} is neither an ELF binary nor a #! script"),
            }
        };
        if mode & 0o111 == 0 {
            verdict.detail += &format!("; note: it is not executable (mode {:04o})", mode & 0o7777);
        }
        verdict
    }

    fn examine_elf(&self, shown: &str, head: &[u8]) -> Verdict {
        let Some(ident) = elf_machine(head) else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!("{shown} has a truncated or malformed ELF header"),
            };
        };
        let Some((machine, class, endian)) = expected_machine(self.platform) else {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!(
                    "{shown} is {}; no known ELF machine for {} to compare with",
                    ident.describe(),
                    self.platform
                ),
            };
        };
        if (ident.machine, ident.class, ident.endian) != (machine, class, endian) {
            return Verdict {
                finding: Finding::BinaryMismatch {
                    found: ident.describe(),
                },
                detail: format!(
                    "{shown} is {} but the entry is {} (expects {})",
                    ident.short(),
                    self.platform,
                    expected_short(self.platform).unwrap_or_default()
                ),
            };
        }
        let matched = |how: String| Verdict {
            finding: Finding::Match,
            detail: format!(
                "{shown} is {}, {how}; matches {}",
                ident.short(),
                self.platform
            ),
        };
        match &ident.linkage {
            None => matched("linkage unknown (program headers beyond the first 4 KiB)".into()),
            Some(Linkage::Static) => matched("static".into()),
            Some(Linkage::Dynamic { interpreter: None }) => {
                matched("dynamic (loader path beyond the first 4 KiB; not checked)".into())
            }
            Some(Linkage::Dynamic {
                interpreter: Some(loader),
            }) => match self.fs.resolve("/", loader) {
                Err(_) => Verdict {
                    finding: Finding::InterpreterMissing {
                        interpreter: loader.clone(),
                    },
                    detail: format!(
                        "{shown} is {}, dynamic, but its loader {loader} is missing from the image (exec fails with \"no such file or directory\")",
                        ident.short()
                    ),
                },
                Ok((resolved, Node::File { head: Some(h), .. })) => match elf_machine(h) {
                    Some(l) if (l.machine, l.class, l.endian) != (machine, class, endian) => Verdict {
                        finding: Finding::BinaryMismatch { found: l.describe() },
                        detail: format!(
                            "{shown} is {} but its loader {loader} ({resolved}) is {}; the entry is {}",
                            ident.short(),
                            l.short(),
                            self.platform
                        ),
                    },
                    Some(_) => matched(format!("dynamic (loader {loader} present)")),
                    None => matched(format!(
                        "dynamic (loader {loader} present but not an ELF I can read)"
                    )),
                },
                Ok(_) => matched(format!("dynamic (loader {loader} present, not checked)")),
            },
        }
    }

    fn examine_script(&self, shown: &str, head: &[u8], depth: usize) -> Verdict {
        if depth >= MAX_SCRIPT_DEPTH {
            return Verdict {
                finding: Finding::Unreadable,
                detail: format!("{shown}: more than {MAX_SCRIPT_DEPTH} nested #! interpreters"),
            };
        }
        let line = head[2..].split(|&c| c == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.split([' ', '\t', '\r']).filter(|w| !w.is_empty());
        let Some(interpreter) = words.next().map(str::to_string) else {
            return Verdict {
                finding: Finding::NotElf,
                detail: format!("{shown} has an empty #! line"),
            };
        };
        let argument = words.next().map(str::to_string);
        let (resolved, node) = match self.fs.resolve(&self.command.cwd, &interpreter) {
            Ok(found) => found,
            Err(e) => {
                return Verdict {
                    finding: Finding::InterpreterMissing {
                        interpreter: interpreter.clone(),
                    },
                    detail: format!(
                        "{shown} is a #!{interpreter} script but {}",
                        e.describe(&interpreter)
                    ),
                }
            }
        };
        let inner_shown = if resolved == interpreter {
            resolved.clone()
        } else {
            format!("{interpreter} -> {resolved}")
        };
        let inner = self.examine(&inner_shown, node, depth + 1);
        let mut verdict = Verdict {
            detail: format!("{shown} is a #!{interpreter} script: {}", inner.detail),
            finding: inner.finding,
        };
        // `#!/usr/bin/env prog`: env must find prog on PATH, and prog must run too.
        if verdict.finding == Finding::Match && interpreter.rsplit('/').next() == Some("env") {
            if let Some(program) = argument.filter(|a| !a.starts_with('-') && !a.contains('=')) {
                let located = if program.contains('/') {
                    self.fs
                        .resolve(&self.command.cwd, &program)
                        .map_err(|e| e.describe(&program))
                } else {
                    self.look_path(&program).map_err(|e| e.to_string())
                };
                verdict = match located {
                    Err(e) => Verdict {
                        finding: Finding::InterpreterMissing {
                            interpreter: program.clone(),
                        },
                        detail: format!("{shown} runs `env {program}` but {e}"),
                    },
                    Ok((p, node)) => {
                        let inner = self.examine(&p, node, depth + 1);
                        Verdict {
                            detail: format!("{shown} runs `env {program}`: {}", inner.detail),
                            finding: inner.finding,
                        }
                    }
                };
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests;

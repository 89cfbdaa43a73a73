//! Named build contexts (`contexts:` per image, `--build-context NAME=VALUE`): what a
//! Dockerfile's `FROM NAME`, `COPY --from=NAME` or `RUN --mount=from=NAME` reads in place
//! of an image of that name, as buildx and BuildKit's Dockerfile frontend (1.4+) take them.

use super::diagnostics::q;
use crate::base::reference::parse_reference;
use std::path::{Path, PathBuf};

/// What a named context is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedContext {
    /// A directory (absolute), served to BuildKit through the session by file sync, with
    /// its own `.dockerignore` applied by BuildKit's frontend.
    Dir(PathBuf),
    /// An image reference (a tag or a digest), `docker-image://REF`.
    Image(String),
    /// Another image of the project (`target:NAME`): built first, then read as
    /// [`NamedContext::Image`] by the digest of the index just pushed for it.
    Target(String),
}

/// The prefix of an image context.
pub const IMAGE_PREFIX: &str = "docker-image://";
/// The prefix of a context naming another image of the project.
pub const TARGET_PREFIX: &str = "target:";

impl NamedContext {
    /// Reads a value as buildx writes it; a directory is relative to `base`. The error
    /// is the problem and the fix.
    pub fn parse(value: &str, base: &Path) -> Result<NamedContext, String> {
        let value = value.trim();
        if value.is_empty() {
            return Err(format!(
                "is empty; give a directory, `{IMAGE_PREFIX}REF` or `{TARGET_PREFIX}IMAGE`"
            ));
        }
        if let Some(reference) = value.strip_prefix(IMAGE_PREFIX) {
            return match parse_reference(reference) {
                Ok(_) => Ok(NamedContext::Image(reference.to_string())),
                Err(e) => Err(format!(
                    "{}: {e}; write an image reference, e.g. `{IMAGE_PREFIX}registry.example.com/base:v1`",
                    q(value)
                )),
            };
        }
        if let Some(image) = value.strip_prefix(TARGET_PREFIX) {
            return match image.trim() {
                "" => Err(format!(
                    "{} names no image; write `{TARGET_PREFIX}NAME` with NAME an image of this project",
                    q(value)
                )),
                name => Ok(NamedContext::Target(name.to_string())),
            };
        }
        if value.starts_with("oci-layout://") {
            return Err(format!(
                "{}: OCI layout contexts are not supported; push the layout to a registry (e.g. `skopeo copy oci:DIR docker://REF`) and use `{IMAGE_PREFIX}REF`",
                q(value)
            ));
        }
        if value.contains("://") || value.starts_with("git@") {
            return Err(format!(
                "{}: remote (git or URL) contexts are not supported; check the files out and name the directory",
                q(value)
            ));
        }
        Ok(NamedContext::Dir(base.join(value)))
    }

    /// The `context:NAME` frontend attribute's value for the context `name`: a directory
    /// as the session directory serving it.
    pub fn frontend_value(&self, name: &str) -> String {
        match self {
            NamedContext::Dir(_) => format!("local:{}", session_dir_name(name)),
            other => other.written(),
        }
    }

    /// The value as buildx writes it (a directory as its path).
    pub fn written(&self) -> String {
        match self {
            NamedContext::Dir(dir) => dir.display().to_string(),
            NamedContext::Image(reference) => format!("{IMAGE_PREFIX}{reference}"),
            NamedContext::Target(name) => format!("{TARGET_PREFIX}{name}"),
        }
    }
}

/// The directories of `contexts` by the session directory names they are served as.
pub fn session_dirs(
    contexts: &std::collections::BTreeMap<String, NamedContext>,
) -> Vec<(String, &Path)> {
    contexts
        .iter()
        .filter_map(|(name, context)| match context {
            NamedContext::Dir(dir) => Some((session_dir_name(name), dir.as_path())),
            _ => None,
        })
        .collect()
}

/// The session directory a directory context `name` is served as: its own name, as
/// buildx names it, with `_` before the two names the main build uses.
pub fn session_dir_name(name: &str) -> String {
    match name {
        "context" | "dockerfile" => format!("_{name}"),
        other => other.to_string(),
    }
}

/// What a context's name must be: a lowercase image name (BuildKit looks contexts up by
/// the name a `FROM` or `--from=` writes, read as an image reference).
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && !name.contains(|c: char| c.is_ascii_uppercase() || c.is_whitespace() || c == '=')
        && parse_reference(name).is_ok_and(|r| r.digest().is_none());
    match valid {
        true => Ok(()),
        false => Err(format!(
            "{} is not a context name; use the lowercase name the Dockerfile writes in `FROM NAME` or `COPY --from=NAME`, e.g. `assets`",
            q(name)
        )),
    }
}

/// `NAME=VALUE` as `--build-context` gives it; the directory relative to `base`.
pub fn parse_flag(text: &str, base: &Path) -> Result<(String, NamedContext), String> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(format!(
            "{} is not NAME=VALUE; write e.g. `--build-context assets=./assets`",
            q(text)
        ));
    };
    check_name(name)?;
    Ok((name.to_string(), NamedContext::parse(value, base)?))
}

/// One `--build-context NAME=VALUE` (`build`, `buildx build`), parsed: a directory
/// (relative to the working directory, which must exist) or `docker-image://REF`; it adds
/// to, or replaces by name, each image's `contexts:`. `target:` is a project file's:
/// the build order is known before the flags are read.
#[derive(Debug, Clone)]
pub struct ContextFlag {
    pub name: String,
    pub context: NamedContext,
}

impl std::str::FromStr for ContextFlag {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
        let (name, context) = parse_flag(text, &cwd)?;
        let context = match context {
            NamedContext::Target(_) => {
                return Err(
                    "`target:` names another image of a project file; write it under the image's `contexts:` there, or give a directory or docker-image://REF"
                        .into(),
                )
            }
            NamedContext::Dir(dir) => NamedContext::Dir(dir.canonicalize().map_err(|e| {
                format!("{} is not a directory ({e}); give an existing directory", dir.display())
            })?),
            other => other,
        };
        if let NamedContext::Dir(dir) = &context {
            if !dir.is_dir() {
                return Err(format!(
                    "{} is not a directory; give a directory",
                    dir.display()
                ));
            }
        }
        Ok(ContextFlag { name, context })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_buildx_writes_them() {
        let base = Path::new("/p");
        assert_eq!(
            NamedContext::parse("assets", base),
            Ok(NamedContext::Dir("/p/assets".into()))
        );
        assert_eq!(
            NamedContext::parse("/abs/dir", base),
            Ok(NamedContext::Dir("/abs/dir".into()))
        );
        assert_eq!(
            NamedContext::parse("docker-image://127.0.0.1:5000/base:v1", base),
            Ok(NamedContext::Image("127.0.0.1:5000/base:v1".into()))
        );
        let digest = format!("docker-image://alpine@sha256:{}", "a".repeat(64));
        assert!(matches!(
            NamedContext::parse(&digest, base),
            Ok(NamedContext::Image(_))
        ));
        assert_eq!(
            NamedContext::parse("target:base", base),
            Ok(NamedContext::Target("base".into()))
        );
        for (bad, says) in [
            ("", "is empty"),
            ("target:", "names no image"),
            ("docker-image://UPPER/x", "image reference"),
            ("oci-layout:///tmp/l", "skopeo copy"),
            ("https://github.com/a/b.git", "check the files out"),
            ("git@github.com:a/b.git", "check the files out"),
        ] {
            let error = NamedContext::parse(bad, base).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn names_are_image_names_and_flags_name_value_pairs() {
        for good in ["assets", "base", "team/base", "base:v1", "a.b-c_d"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Assets", "a b", "a=b", "-x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_flag("assets=./a", Path::new("/w")),
            Ok(("assets".into(), NamedContext::Dir("/w/./a".into())))
        );
        assert!(parse_flag("assets", Path::new("/w"))
            .unwrap_err()
            .contains("NAME=VALUE"));
        assert!(parse_flag("BAD=x", Path::new("/w"))
            .unwrap_err()
            .contains("not a context name"));
    }

    #[test]
    fn flags_take_existing_directories_and_images_but_no_targets() {
        let dir = tempfile::tempdir().unwrap();
        let flag: ContextFlag = format!("assets={}", dir.path().display()).parse().unwrap();
        assert_eq!(flag.name, "assets");
        assert_eq!(
            flag.context,
            NamedContext::Dir(dir.path().canonicalize().unwrap())
        );
        let image: ContextFlag = "base=docker-image://r.example/base:v1".parse().unwrap();
        assert_eq!(
            image.context,
            NamedContext::Image("r.example/base:v1".into())
        );
        let missing = format!("assets={}/nothere", dir.path().display());
        assert!(missing
            .parse::<ContextFlag>()
            .unwrap_err()
            .contains("not a directory"));
        assert!("base=target:base"
            .parse::<ContextFlag>()
            .unwrap_err()
            .contains("contexts:"));
    }
}

//! Where an image's `SOURCE_DATE_EPOCH` comes from: given explicitly (`--source-date-epoch`
//! or the environment), or with `reproducible: true` the time of the last commit of the
//! context's git checkout, as `--source-date-epoch $(git log -1 --format=%ct)` gives it.
//! An explicit value wins, so a release job can still pin one epoch for every image.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where an epoch came from, as the coverage record's `values` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochSource {
    /// `SOURCE_DATE_EPOCH` in the environment.
    Env,
    /// `--source-date-epoch`.
    Flag,
    /// The last commit of the context's checkout.
    Git { commit: String },
}

impl EpochSource {
    /// `env:SOURCE_DATE_EPOCH`, `flag:--source-date-epoch` or `git:COMMIT`.
    pub fn record(&self) -> String {
        match self {
            EpochSource::Env => "env:SOURCE_DATE_EPOCH".into(),
            EpochSource::Flag => "flag:--source-date-epoch".into(),
            EpochSource::Git { commit } => format!("git:{commit}"),
        }
    }
}

/// The epoch an image builds with: the explicit one when given, else with `reproducible`
/// the commit time of `context`'s checkout, else none.
pub fn choose(
    explicit: Option<(u64, EpochSource)>,
    reproducible: bool,
    context: &Path,
) -> Result<Option<(u64, EpochSource)>, EpochError> {
    match explicit {
        Some(given) => Ok(Some(given)),
        None if reproducible => commit_time(context).map(Some),
        None => Ok(None),
    }
}

/// What to do when git cannot tell the commit time.
const FIX: &str =
    "commit the context to git, or give the time yourself with SOURCE_DATE_EPOCH or --source-date-epoch";

/// Why git could not tell the commit time of a context's checkout. The text says why and
/// the fix, without the field (the caller names it).
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("needs git to read the commit time, and git is not installed; install git, or {FIX}")]
    GitMissing(#[source] std::io::Error),
    #[error("cannot run git ({0}); {FIX}")]
    GitUnrunnable(#[source] std::io::Error),
    #[error("the context {} is not in a git checkout (git: {said}); {FIX}", dir.display())]
    NotACheckout { dir: PathBuf, said: String },
    #[error("the context {} is in a git checkout without a commit yet (git: {said}); {FIX}", dir.display())]
    NoCommitYet { dir: PathBuf, said: String },
    #[error("the context {} has no last commit git can read (git: {said}); {FIX}", dir.display())]
    NoLastCommit { dir: PathBuf, said: String },
    #[error("the git checkout of {} has no commit yet; {FIX}", dir.display())]
    UnreadableLog { dir: PathBuf },
}

/// `git log -1 --format='%ct %H'` in `dir`: the committer time of its checkout's last
/// commit (what `%ct` gives, so amending or rebasing moves it) and that commit.
pub fn commit_time(dir: &Path) -> Result<(u64, EpochSource), EpochError> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["log", "-1", "--format=%ct %H"])
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => EpochError::GitMissing(e),
            _ => EpochError::GitUnrunnable(e),
        })?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        let said = said.lines().next().unwrap_or("").trim().to_string();
        let dir = dir.to_path_buf();
        // git says why in words of its own; the common two get ours.
        return Err(if said.contains("not a git repository") {
            EpochError::NotACheckout { dir, said }
        } else if said.contains("does not have any commits") {
            EpochError::NoCommitYet { dir, said }
        } else {
            EpochError::NoLastCommit { dir, said }
        });
    }
    parse_log(&String::from_utf8_lossy(&output.stdout)).ok_or_else(|| EpochError::UnreadableLog {
        dir: dir.to_path_buf(),
    })
}

/// `SECONDS COMMIT` as `git log --format='%ct %H'` prints it.
fn parse_log(text: &str) -> Option<(u64, EpochSource)> {
    let (seconds, commit) = text.trim().split_once(' ')?;
    let commit = commit.trim();
    let hex = !commit.is_empty() && commit.chars().all(|c| c.is_ascii_hexdigit());
    Some((
        seconds.parse().ok()?,
        EpochSource::Git {
            commit: hex.then(|| commit.to_string())?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let status = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_DATE", "2026-01-02T03:04:05Z")
            .env("GIT_COMMITTER_DATE", "2026-01-02T03:04:05Z")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    #[test]
    fn the_log_line_is_read() {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            parse_log(&format!("1767323045 {commit}\n")),
            Some((
                1767323045,
                EpochSource::Git {
                    commit: commit.into()
                }
            ))
        );
        assert_eq!(parse_log(""), None);
        assert_eq!(parse_log("soon abc\n"), None);
        assert_eq!(parse_log("1767323045 not-a-commit\n"), None);
    }

    #[test]
    fn an_explicit_epoch_wins_over_git() {
        let outside = tempfile::tempdir().unwrap();
        // Never asks git when the epoch is given, so no checkout is needed.
        assert_eq!(
            choose(Some((7, EpochSource::Flag)), true, outside.path()).unwrap(),
            Some((7, EpochSource::Flag))
        );
        assert_eq!(choose(None, false, outside.path()).unwrap(), None);
        let error = choose(None, true, outside.path()).unwrap_err();
        assert!(matches!(error, EpochError::NotACheckout { .. }), "{error}");
        let error = error.to_string();
        assert!(error.contains("SOURCE_DATE_EPOCH"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }

    #[test]
    fn the_top_level_reproducible_is_every_images_default() {
        use crate::project::{LoadOptions, Project, Purpose};
        let text = "version: 1\nreproducible: true\nimages:\n  a: {repository: r.example/a, tags: [v1], context: a, platforms: [linux/amd64]}\n  b: {repository: r.example/b, tags: [v1], context: b, platforms: [linux/amd64], reproducible: false}\n";
        let options = LoadOptions {
            purpose: Purpose::Verify,
            ..LoadOptions::default()
        };
        let file = Path::new("/tmp/polyarch.yaml");
        let project = Project::parse(file, text, &options).unwrap();
        assert!(project.image("a").unwrap().reproducible);
        assert!(!project.image("b").unwrap().reproducible, "its own wins");
        let plain = text.replace("reproducible: true\n", "");
        let project = Project::parse(file, &plain, &options).unwrap();
        assert!(!project.image("a").unwrap().reproducible);
        let wrong = text.replace("reproducible: true", "reproducible: yes");
        let error = Project::parse(file, &wrong, &options)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("reproducible: `yes` is not a boolean"),
            "{error}"
        );
    }

    #[test]
    fn the_commit_time_of_the_checkout() {
        let repo = tempfile::tempdir().unwrap();
        git(repo.path(), &["init", "-q"]);
        let empty = commit_time(repo.path()).unwrap_err();
        assert!(matches!(empty, EpochError::NoCommitYet { .. }), "{empty}");
        std::fs::create_dir(repo.path().join("app")).unwrap();
        std::fs::write(repo.path().join("app/file"), "x").unwrap();
        git(repo.path(), &["add", "."]);
        git(
            repo.path(),
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "commit",
                "-qm",
                "one",
            ],
        );
        // A context below the checkout's root reads the same commit.
        let (seconds, source) = commit_time(&repo.path().join("app")).unwrap();
        assert_eq!(seconds, 1767323045);
        assert!(source.record().starts_with("git:"), "{source:?}");
        assert_eq!(EpochSource::Env.record(), "env:SOURCE_DATE_EPOCH");
    }
}

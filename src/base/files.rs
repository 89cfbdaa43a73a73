//! Files replaced whole: readers see the old contents or the new, never a part.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file of its own in the same directory,
/// renamed over `path`: a reader never sees a half-written file, and writers running at
/// once (two runs sharing a cache directory) never rename each other's partial files.
/// Missing parent directories are made.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut partial = tempfile::NamedTempFile::new_in(dir)?;
    partial.write_all(bytes)?;
    partial.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_replaced_whole_and_no_partial_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace(&path, b"old").unwrap();
        replace(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn missing_parent_directories_are_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache/polyarch/state.json");
        replace(&path, b"state").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"state");
    }
}

//! Paths inside an image or archive: relative to its root, `/`-separated, never climbing
//! out. Layer entries, links and save-stream names are all read through these, as
//! containerd cleans them.

/// Lexically normalises a path: no leading `./` or `/`, `.` and `..` resolved; the root is
/// `""`. `None` when it climbs out of the root.
pub fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The directory and the name of a normalised path (`""` for a top-level entry's directory).
pub fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// `dir/name`, or `name` at the root.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Where a link at `entry` pointing at `target` leads, from the root.
pub fn link_target(entry: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return normalize(target);
    }
    normalize(&join(split_parent(entry).0, target))
}

/// The keys of `tree` (normalized image paths) below directory `path` (`""`: the root),
/// for a whiteout or an opaque directory to remove.
pub fn below<V>(tree: &std::collections::BTreeMap<String, V>, path: &str) -> Vec<String> {
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    };
    tree.range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_and_never_leave_the_root() {
        assert_eq!(normalize("./x//y/./z").as_deref(), Some("x/y/z"));
        assert_eq!(normalize("/a/../b").as_deref(), Some("b"));
        assert_eq!(normalize("./").as_deref(), Some(""));
        for escaping in ["../x", "x/../../y", "/../x"] {
            assert_eq!(normalize(escaping), None, "{escaping}");
        }
    }

    #[test]
    fn links_resolve_from_their_directory_or_the_root() {
        assert_eq!(
            link_target("usr/bin/sh", "busybox").as_deref(),
            Some("usr/bin/busybox")
        );
        assert_eq!(
            link_target("usr/bin/sh", "../../bin/sh").as_deref(),
            Some("bin/sh")
        );
        assert_eq!(
            link_target("usr/bin/sh", "/bin/sh").as_deref(),
            Some("bin/sh")
        );
        assert_eq!(link_target("sh", "x").as_deref(), Some("x"));
        assert_eq!(link_target("a/sh", "../../../x"), None);
    }
}

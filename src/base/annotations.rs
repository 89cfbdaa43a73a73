//! OCI annotations for an image's index and platform manifests, named as buildx names them:
//! `[TYPES:]KEY` where TYPES is `index`, `manifest` or both (`index,manifest`); without
//! TYPES an annotation goes on the platform manifests, as with `docker buildx build
//! --annotation`. Registries read the index's (GHCR links a package to its repository from
//! `org.opencontainers.image.source` there), clients and scanners the manifests'.

use serde::Serialize;
use std::collections::BTreeMap;

/// What goes on the index polyarch publishes and on every platform manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Annotations {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub index: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub manifest: BTreeMap<String, String>,
}

/// Why an annotation name was refused (shown after the field or flag that gave it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnnotationError(String);

impl Annotations {
    pub fn is_empty(&self) -> bool {
        self.index.is_empty() && self.manifest.is_empty()
    }

    /// Adds `[TYPES:]KEY` = `value`; a later value for the same key and place wins.
    pub fn add(&mut self, name: &str, value: &str) -> Result<(), AnnotationError> {
        let flag = AnnotationFlag::new(name, value)?;
        self.insert(&flag);
        Ok(())
    }

    pub fn insert(&mut self, flag: &AnnotationFlag) {
        if flag.index {
            self.index.insert(flag.key.clone(), flag.value.clone());
        }
        if flag.manifest {
            self.manifest.insert(flag.key.clone(), flag.value.clone());
        }
    }
}

/// One annotation and where it goes: `--annotation [TYPES:]KEY=VALUE`, or an entry of
/// `annotations:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationFlag {
    pub index: bool,
    pub manifest: bool,
    pub key: String,
    pub value: String,
}

impl AnnotationFlag {
    fn new(name: &str, value: &str) -> Result<Self, AnnotationError> {
        let (index, manifest, key) = match name.split_once(':') {
            Some((types, key)) if types.split(',').all(|t| matches!(t, "index" | "manifest")) => (
                types.split(',').any(|t| t == "index"),
                types.split(',').any(|t| t == "manifest"),
                key,
            ),
            Some((types, _)) if !types.contains('.') && !types.contains('/') => {
                return Err(AnnotationError(format!(
                    "`{types}` is not a place for an annotation; use index:, manifest: or index,manifest: (or none, for the manifests)"
                )))
            }
            _ => (false, true, name),
        };
        if key.trim().is_empty() || key.contains(char::is_whitespace) {
            return Err(AnnotationError(format!(
                "`{key}` is not an annotation key; use a key without spaces such as org.opencontainers.image.source"
            )));
        }
        Ok(AnnotationFlag {
            index,
            manifest,
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

impl std::str::FromStr for AnnotationFlag {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, value) = text.split_once('=').ok_or_else(|| {
            format!("`{text}` has no `=`; write [index:|manifest:|index,manifest:]KEY=VALUE")
        })?;
        AnnotationFlag::new(name, value).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_where_buildx_puts_them() {
        let mut a = Annotations::default();
        a.add("org.opencontainers.image.version", "1.4.3").unwrap();
        a.add("index:org.opencontainers.image.description", "api")
            .unwrap();
        a.add(
            "index,manifest:org.opencontainers.image.source",
            "https://example.org/api",
        )
        .unwrap();
        assert_eq!(
            a.manifest.keys().collect::<Vec<_>>(),
            [
                "org.opencontainers.image.source",
                "org.opencontainers.image.version"
            ]
        );
        assert_eq!(
            a.index.keys().collect::<Vec<_>>(),
            [
                "org.opencontainers.image.description",
                "org.opencontainers.image.source"
            ]
        );
        // A key may itself hold a colon after a dotted prefix (a URL-like key).
        a.add("com.example/x:y", "1").unwrap();
        assert_eq!(a.manifest["com.example/x:y"], "1");
    }

    #[test]
    fn bad_names_and_flags_say_how_to_write_them() {
        let mut a = Annotations::default();
        assert!(a.add("layer:x", "1").unwrap_err().0.contains("index:"));
        assert!(a
            .add("index:", "1")
            .unwrap_err()
            .0
            .contains("not an annotation key"));
        assert!("index:k"
            .parse::<AnnotationFlag>()
            .unwrap_err()
            .contains("no `=`"));
        let flag: AnnotationFlag = "manifest:k=v=w".parse().unwrap();
        assert_eq!((flag.key.as_str(), flag.value.as_str()), ("k", "v=w"));
        assert!(flag.manifest && !flag.index);
    }
}

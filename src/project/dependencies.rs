//! Images built from each other. An image whose Dockerfile `FROM`s another image of the
//! project — `polyarch:NAME`, or that image's repository with no tag or one of its tags —
//! builds after it, from the index just pushed for it (as bake's `target:` contexts do).
//! A named context `target:NAME` (`contexts:`) is an edge too, used by digest the same way.
//! The graph is made from the Dockerfiles before anything is built: a `polyarch:NAME`
//! or `target:NAME` naming no image, or images building from each other, is a project error.

use crate::base::dockerfile;
use crate::project::contexts::NamedContext;
use crate::project::{ImageSpec, Project, ProjectError};
use crate::registry::parse_reference;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

type Result<T, E = ProjectError> = std::result::Result<T, E>;

/// How a Dockerfile names another image of the project without its registry.
pub const PREFIX: &str = "polyarch:";

/// A `FROM` naming another image of the project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The (0-based) Dockerfile line the `FROM` starts on.
    pub line: usize,
    /// The image word as written there, which the build replaces.
    pub written: String,
    /// The name of the image it names.
    pub image: String,
}

/// Which images each image of the project builds `FROM`.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// Per image name, its `FROM`s naming images of the project (absent: none).
    edges: BTreeMap<String, Vec<Edge>>,
    /// Per image name, its named contexts `target:IMAGE`: (context name, image name).
    targets: BTreeMap<String, Vec<(String, String)>>,
    /// Image names in project order.
    names: Vec<String>,
}

impl Graph {
    /// Reads every image's Dockerfile (build args substituted into global `ARG`s).
    pub fn of(project: &Project) -> Result<Graph> {
        let mut texts = Vec::new();
        for image in &project.images {
            let path = image.context.join(&image.dockerfile);
            // Lossy: FROM lines are ASCII, and a stray byte elsewhere is BuildKit's to judge.
            let bytes = std::fs::read(&path).map_err(|source| ProjectError::Read {
                path: path.clone(),
                source,
            })?;
            texts.push((image, String::from_utf8_lossy(&bytes).into_owned()));
        }
        Graph::from_texts(&project.file, &texts)
    }

    /// The graph of these images and their Dockerfiles' text; `file` names the project
    /// file in errors.
    pub fn from_texts(file: &Path, images: &[(&ImageSpec, String)]) -> Result<Graph> {
        let specs: Vec<&ImageSpec> = images.iter().map(|(spec, _)| *spec).collect();
        let mut graph = Graph {
            names: specs.iter().map(|s| s.name.clone()).collect(),
            ..Graph::default()
        };
        for (spec, text) in images {
            let edges = edges_of(file, spec, text, &specs)?;
            if !edges.is_empty() {
                graph.edges.insert(spec.name.clone(), edges);
            }
            let targets = targets_of(file, spec, &specs)?;
            if !targets.is_empty() {
                graph.targets.insert(spec.name.clone(), targets);
            }
        }
        if let Some(cycle) = graph.cycle() {
            let lines: Vec<String> = cycle
                .windows(2)
                .filter_map(|pair| {
                    let spec = specs.iter().find(|s| s.name == pair[0])?;
                    if let Some((context, _)) =
                        graph.targets(&pair[0]).iter().find(|(_, i)| *i == pair[1])
                    {
                        return Some(format!("images.{}.contexts.{context}", pair[0]));
                    }
                    let edge = graph.edges(&pair[0]).iter().find(|e| e.image == pair[1])?;
                    let path = spec.context.join(&spec.dockerfile);
                    Some(format!("{} line {}", path.display(), edge.line + 1))
                })
                .collect();
            return Err(project_error(
                file,
                "images".into(),
                format!(
                    "images {} build FROM each other, so none can be built first; remove one of these FROM lines or contexts: {}",
                    cycle.join(" → "),
                    lines.join(", ")
                ),
            ));
        }
        Ok(graph)
    }

    /// The `FROM`s of `image` naming images of the project.
    pub fn edges(&self, image: &str) -> &[Edge] {
        self.edges.get(image).map(Vec::as_slice).unwrap_or_default()
    }

    /// The named contexts `target:IMAGE` of `image`: (context name, image name).
    pub fn targets(&self, image: &str) -> &[(String, String)] {
        self.targets
            .get(image)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The images `image` builds from directly (`FROM`, `target:` contexts), each once,
    /// sorted.
    pub fn dependencies(&self, image: &str) -> Vec<String> {
        let from = self.edges(image).iter().map(|e| &e.image);
        let names: BTreeSet<&String> = from
            .chain(self.targets(image).iter().map(|(_, i)| i))
            .collect();
        names.into_iter().cloned().collect()
    }

    /// Whether another image builds from this one.
    pub fn has_dependents(&self, image: &str) -> bool {
        self.edges.values().flatten().any(|e| e.image == image)
            || self.targets.values().flatten().any(|(_, i)| i == image)
    }

    /// `selected` with every image they build `FROM`, directly or not, in build order:
    /// an image after the images it builds FROM, otherwise in project order.
    pub fn order(&self, selected: &[String]) -> Vec<String> {
        let mut wanted: BTreeSet<String> = selected.iter().cloned().collect();
        let mut todo: Vec<String> = selected.to_vec();
        while let Some(name) = todo.pop() {
            for dependency in self.dependencies(&name) {
                if wanted.insert(dependency.clone()) {
                    todo.push(dependency);
                }
            }
        }
        let mut ordered: Vec<String> = Vec::new();
        while ordered.len() < wanted.len() {
            // Acyclic (checked when made): each pass places at least one image.
            let next = self.names.iter().find(|name| {
                wanted.contains(*name)
                    && !ordered.contains(name)
                    && self.dependencies(name).iter().all(|d| ordered.contains(d))
            });
            match next {
                Some(name) => ordered.push(name.clone()),
                None => break,
            }
        }
        ordered
    }

    /// A path `a → b → … → a` when images build FROM each other.
    fn cycle(&self) -> Option<Vec<String>> {
        fn visit(
            graph: &Graph,
            name: &str,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| p == name) {
                let mut cycle = path[at..].to_vec();
                cycle.push(name.to_string());
                return Some(cycle);
            }
            if done.contains(name) {
                return None;
            }
            path.push(name.to_string());
            for dependency in graph.dependencies(name) {
                if let Some(cycle) = visit(graph, &dependency, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(name.to_string());
            None
        }
        let mut done = BTreeSet::new();
        self.names
            .iter()
            .find_map(|name| visit(self, name, &mut Vec::new(), &mut done))
    }
}

/// The `FROM`s of `spec`'s Dockerfile `text` naming images of the project (`specs`).
fn edges_of(file: &Path, spec: &ImageSpec, text: &str, specs: &[&ImageSpec]) -> Result<Vec<Edge>> {
    let dockerfile = spec.context.join(&spec.dockerfile);
    if let Some((line, _)) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(&format!("from={PREFIX}")))
    {
        return Err(project_error(
            file,
            format!("images.{}.dockerfile", spec.name),
            format!(
                "{} line {}: only FROM may name an image of the project ({PREFIX}NAME), not --from=; write `FROM {PREFIX}NAME AS name` and use --from=name",
                dockerfile.display(),
                line + 1
            ),
        ));
    }
    let args: HashMap<String, String> = spec.build_args.clone().into_iter().collect();
    let mut edges = Vec::new();
    for from in dockerfile::from_images(text, &args) {
        let Some(written) = from.image else { continue };
        // A named context of that name is what BuildKit reads, not an image.
        if spec.contexts.contains_key(&written) {
            continue;
        }
        let target = project_image(&written, specs).map_err(|message| {
            project_error(
                file,
                format!("images.{}.dockerfile", spec.name),
                format!("{} line {}: {message}", dockerfile.display(), from.line + 1),
            )
        })?;
        if let Some(target) = target {
            let missing = spec
                .platforms
                .iter()
                .find(|p| !target.platforms.contains(p));
            if let (false, Some(platform)) = (from.own_platform, missing) {
                return Err(project_error(
                    file,
                    format!("images.{}.platforms", spec.name),
                    format!(
                        "{platform} is not a platform of {}, which {} builds FROM ({} line {}); add it to {}'s platforms, or remove it here",
                        target.name,
                        spec.name,
                        dockerfile.display(),
                        from.line + 1,
                        target.name
                    ),
                ));
            }
            edges.push(Edge {
                line: from.line,
                written: from.written,
                image: target.name.clone(),
            });
        }
    }
    Ok(edges)
}

/// The named contexts `target:IMAGE` of `spec`: each must name another image of the
/// project (`specs`) built for every platform of `spec`.
fn targets_of(
    file: &Path,
    spec: &ImageSpec,
    specs: &[&ImageSpec],
) -> Result<Vec<(String, String)>> {
    let mut targets = Vec::new();
    for (context, value) in &spec.contexts {
        let NamedContext::Target(name) = value else {
            continue;
        };
        let field = format!("images.{}.contexts.{context}", spec.name);
        let Some(target) = specs.iter().find(|s| s.name == *name) else {
            return Err(project_error(
                file,
                field,
                format!(
                    "`target:{name}` names no image of this project (it declares {}); name one of them",
                    specs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        if let Some(platform) = spec
            .platforms
            .iter()
            .find(|p| !target.platforms.contains(p))
        {
            return Err(project_error(
                file,
                field,
                format!(
                    "{platform} is not a platform of {name}, which {} reads as context {context}; add it to {name}'s platforms, or remove it from {}'s",
                    spec.name, spec.name
                ),
            ));
        }
        targets.push((context.clone(), name.clone()));
    }
    Ok(targets)
}

fn project_error(file: &Path, field: String, message: String) -> ProjectError {
    ProjectError::File {
        file: file.to_path_buf(),
        field,
        message,
    }
}

/// The image of the project a `FROM` names, if any: `polyarch:NAME` (an unknown NAME is
/// an error), or an image's repository (registry host and port included) with no tag or
/// one of the image's tags. A digest pins another image, so it never names one here.
fn project_image<'a>(
    from: &str,
    images: &[&'a ImageSpec],
) -> std::result::Result<Option<&'a ImageSpec>, String> {
    if let Some(name) = from.strip_prefix(PREFIX) {
        return match images.iter().find(|i| i.name == name) {
            Some(image) => Ok(Some(image)),
            None => Err(format!(
                "FROM {from} names no image of this project (it declares {}); name one of them, or the image's repository",
                images.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
        };
    }
    let Ok(reference) = parse_reference(from) else {
        return Ok(None);
    };
    if reference.digest().is_some() {
        return Ok(None);
    }
    let written_tag = reference_tag(from);
    Ok(images.iter().copied().find(|image| {
        parse_reference(&image.repository).is_ok_and(|repository| {
            repository.registry() == reference.registry()
                && repository.repository() == reference.repository()
                && written_tag.is_none_or(|tag| image.tags.iter().any(|t| t == tag))
        })
    }))
}

/// The tag written in a reference (`host:5000/a/b:v1` → `v1`; none for `host:5000/a/b`).
fn reference_tag(reference: &str) -> Option<&str> {
    let name = reference.split('@').next().unwrap_or(reference);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, tag)| tag)
}

/// The Dockerfile with the image word of each `FROM` in `edges` replaced by the
/// reference `pinned` holds for its image (`REGISTRY/REPO@sha256:…`); flags (`--platform`),
/// `AS NAME`, comments and line endings are kept.
pub fn rewrite(text: &str, edges: &[Edge], pinned: &BTreeMap<String, String>) -> String {
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    for edge in edges {
        let Some(reference) = pinned.get(&edge.image) else {
            continue;
        };
        // The word is on the FROM's first line, or a continuation line after it.
        for line in lines.iter_mut().skip(edge.line) {
            if let Some(replaced) = replace_word(line, &edge.written, reference) {
                *line = replaced;
                break;
            }
        }
    }
    lines.concat()
}

/// `line` with the first whitespace-delimited `word` replaced by `with`.
fn replace_word(line: &str, word: &str, with: &str) -> Option<String> {
    let mut from = 0;
    while let Some(found) = line[from..].find(word) {
        let at = from + found;
        let end = at + word.len();
        let before = line[..at].chars().next_back();
        let after = line[end..].chars().next();
        if before.is_none_or(char::is_whitespace) && after.is_none_or(char::is_whitespace) {
            return Some(format!("{}{with}{}", &line[..at], &line[end..]));
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests;

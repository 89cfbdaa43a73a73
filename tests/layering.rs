//! The floor plan of `src/`, written once: which area each module belongs to and which
//! areas it may import. Reads every `crate::` path of every library file (imports and paths
//! in code alike) and fails naming the file, the import and the rule for any arrow that
//! points up or sideways. `ARCHITECTURE.md` ("Areas") says the same in prose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Areas from the top down: (area, the areas it may import). An area is a folder of
/// `src/` (a top-level module); its own files may import each other freely.
const AREAS: &[(&str, &[&str])] = &[
    (
        "flows",
        &[
            "publish", "sbom", "verify", "sign", "builder", "project", "docker", "registry", "k8s",
            "base",
        ],
    ),
    (
        "publish",
        &[
            "sbom", "verify", "sign", "builder", "project", "docker", "registry", "base",
        ],
    ),
    (
        "sbom",
        &[
            "verify", "sign", "builder", "project", "docker", "registry", "base",
        ],
    ),
    (
        "verify",
        &["sign", "builder", "project", "docker", "registry", "base"],
    ),
    // Keys and signatures: pure, below every area that signs or checks.
    ("sign", &["base"]),
    (
        "builder",
        &["project", "sign", "docker", "registry", "base"],
    ),
    ("project", &["sign", "docker", "registry", "base"]),
    ("docker", &["registry", "base"]),
    ("registry", &["base"]),
    ("k8s", &["base"]),
    ("base", &[]),
];

fn area_of(module: &str) -> Option<&'static str> {
    AREAS
        .iter()
        .find(|(area, _)| *area == module)
        .map(|(area, _)| *area)
}

fn may_import(from: &str, to: &str) -> bool {
    from == to
        || AREAS
            .iter()
            .any(|(area, allowed)| *area == from && allowed.contains(&to))
}

/// Drops comments, string and char literals, so that only code is searched.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if let Some(hashes) = raw_string_start(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body
                + rest[body..]
                    .find(&close)
                    .map_or(rest.len() - body, |end| end + close.len());
            out.push_str("\"\"");
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            let ch = rest.chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn raw_string_start(rest: &str) -> Option<usize> {
    let after = rest.strip_prefix('r')?;
    let hashes = after.len() - after.trim_start_matches('#').len();
    after[hashes..].starts_with('"').then_some(hashes)
}

/// The first segment of every path under `crate::`, with `use crate::{a::X, b}` groups
/// split into `a` and `b`.
fn crate_modules(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `$crate::` or `polyarch_crate::`: not this crate's root
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(end, _)| end);
            let mut depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend(first_identifier(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            found.extend(first_identifier(rest));
        }
    }
    found
}

fn first_identifier(text: &str) -> Option<String> {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (end > 0).then(|| text[..end].to_string())
}

/// `pub use module::{Name, …};` in `lib.rs`: `crate::Name` belongs to `module`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in code_only(lib).lines() {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        // `pub use flows::error::{Error, Result};` after the move: the first segment.
        let (Some((module, _)), Some((_, items))) = (path.split_once("::"), path.rsplit_once("::"))
        else {
            continue;
        };
        for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
            names.insert(item.trim().to_string(), module.to_string());
        }
    }
    names
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Every library file's imports of other modules: (file, its module, imported module).
fn imports() -> Vec<(String, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexported = reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for path in files {
        let relative = path.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs").to_string();
        // The binary (main.rs, cli/) sits on top and may use every area; lib.rs lists them.
        if ["main", "cli", "lib"].contains(&module.as_str()) {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        for imported in crate_modules(&code) {
            let imported = reexported.get(&imported).cloned().unwrap_or(imported);
            if imported != module && imported != "self" {
                found.push((
                    format!("src/{}", relative.display()),
                    module.clone(),
                    imported,
                ));
            }
        }
    }
    found
}

#[test]
fn every_module_has_an_area() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = BTreeSet::new();
    for (file, module, imported) in imports() {
        for name in [&module, &imported] {
            if area_of(name).is_none() {
                missing.insert(format!("{name} (in {file})"));
            }
        }
    }
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let module = name.trim_end_matches(".rs");
        if !["main", "cli", "lib"].contains(&module) && area_of(module).is_none() {
            missing.insert(format!("{module} (src/{name})"));
        }
    }
    assert!(
        missing.is_empty(),
        "modules with no area; add each to AREAS in tests/layering.rs and to ARCHITECTURE.md:\n  {}",
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn imports_point_down() {
    let mut wrong = Vec::new();
    let mut named = BTreeSet::new();
    for (file, module, imported) in imports() {
        let (Some(from), Some(to)) = (area_of(&module), area_of(&imported)) else {
            continue; // every_module_has_an_area names it
        };
        if may_import(from, to) {
            continue;
        }
        if named.insert((file.clone(), imported.clone())) {
            wrong.push(format!(
                "{file}: `crate::{imported}` ({to}) is not below {module} ({from}); \
                 {from} may import only {:?}",
                AREAS.iter().find(|(a, _)| *a == from).unwrap().1
            ));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[test]
fn reads_grouped_and_inline_paths() {
    let code = code_only(
        "use crate::{a::X, b::{Y, Z}, C};\n// crate::comment\nlet s = \"crate::base::text\";\nf(crate::d::g());",
    );
    assert_eq!(crate_modules(&code), ["a", "b", "C", "d"]);
}

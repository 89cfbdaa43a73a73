//! `gate --pin DIR`: the manifests written back with every image checked pinned to the
//! digest checked, changing only those values in the text as written.

use super::*;

/// `--pin DIR` must be new or empty (`kubectl apply -f DIR` applies every file in it, stale
/// ones too) and no two manifest files may land on the same name in it.
pub(super) fn check_pin_dir(dir: &Path, files: &[ManifestFile]) -> Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::Usage(format!(
                    "--pin {}: the directory is not empty; name a new or empty directory \
                     (`kubectl apply -f DIR` would apply stale files too)",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::Usage(format!(
                "--pin {}: {e}; name a new or empty directory",
                dir.display()
            )))
        }
    }
    let mut seen: BTreeMap<&Path, &Path> = BTreeMap::new();
    for f in files {
        if let Some(first) = seen.insert(&f.relative, &f.path) {
            return Err(Error::Usage(format!(
                "--pin {}: {} and {} would both be written as {}; gate them in separate runs \
                 or pass their common parent directory to --manifests",
                dir.display(),
                first.display(),
                f.path.display(),
                f.relative.display()
            )));
        }
    }
    Ok(())
}

/// `image@digest`, or the image as written when it already names a digest.
fn pinned_reference(image: &str, digest: &Digest) -> String {
    if image.contains('@') {
        image.to_string()
    } else {
        format!("{image}@{digest}")
    }
}

pub(super) fn pin(
    files: &[ManifestFile],
    images: &[ImageCheck],
    dir: &Path,
) -> Result<Vec<PinnedFile>> {
    let digests: BTreeMap<&str, &Digest> = images
        .iter()
        .filter_map(|i| Some((i.image.as_str(), i.digest.as_ref()?)))
        .collect();
    let mut out = Vec::new();
    for file in files {
        let (text, pinned, reserialised) = pin_file(file, &digests)?;
        let path = dir.join(&file.relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        out.push(PinnedFile {
            source: file.path.display().to_string(),
            path: path.display().to_string(),
            pinned,
            reserialised,
        });
    }
    Ok(out)
}

/// A manifest file's text with every checked image pinned, and how many values were. The
/// values are replaced in the text as written (comments and layout kept) when that reads
/// back as exactly the expected documents; otherwise the documents are written re-serialised.
pub(super) fn pin_file(
    file: &ManifestFile,
    digests: &BTreeMap<&str, &Digest>,
) -> Result<(String, usize, bool)> {
    let mut expected = k8s::documents(&file.path, &file.text)?;
    let mut pins: BTreeMap<&str, String> = BTreeMap::new();
    let mut pinned = 0;
    for w in &file.workloads {
        for c in &w.containers {
            let Some(digest) = digests.get(c.image.as_str()) else {
                continue;
            };
            let to = pinned_reference(&c.image, digest);
            if to == c.image {
                continue;
            }
            let doc = expected.iter_mut().find(|(i, _)| *i == w.document);
            if doc.and_then(|(_, v)| set_image(v, w, c, &to)).is_some() {
                pins.insert(&c.image, to);
                pinned += 1;
            }
        }
    }
    if pins.is_empty() {
        return Ok((file.text.clone(), 0, false));
    }
    let spans: Vec<Range<usize>> = if is_json(&file.path) {
        // JSON has no comments to keep and rarely more than one value: one span.
        std::iter::once(0..file.text.len()).collect()
    } else {
        let docs: BTreeSet<usize> = file.workloads.iter().map(|w| w.document).collect();
        yaml_document_spans(&file.text)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| docs.contains(&(i + 1)))
            .map(|(_, span)| span)
            .collect()
    };
    let text = replace_in_spans(&file.text, &spans, &pins);
    if k8s::documents(&file.path, &text).ok().as_ref() == Some(&expected) {
        return Ok((text, pinned, false));
    }
    Ok((serialise(&file.path, &expected)?, pinned, true))
}

fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

fn untag_mut(v: &mut Value) -> &mut Value {
    match v {
        Value::Tagged(t) => untag_mut(&mut t.value),
        other => other,
    }
}

/// Sets the container's `image` in its parsed document.
fn set_image(doc: &mut Value, w: &Workload, c: &Container, to: &str) -> Option<()> {
    let mut v = untag_mut(doc);
    if let Some(item) = w.item {
        v = untag_mut(v.get_mut("items")?.get_mut(item)?);
    }
    for key in w.pod_spec_path.split('.') {
        v = untag_mut(v.get_mut(key)?);
    }
    let list = if c.init {
        "initContainers"
    } else {
        "containers"
    };
    let container = untag_mut(untag_mut(v.get_mut(list)?).get_mut(c.index)?);
    *container.get_mut("image")? = Value::String(to.to_string());
    Some(())
}

fn serialise(file: &Path, docs: &[(usize, Value)]) -> Result<String> {
    let failed = |e: String| Error::io(file, std::io::Error::other(e));
    let mut out = String::new();
    for (_, doc) in docs {
        if is_json(file) {
            out += &serde_json::to_string_pretty(doc).map_err(|e| failed(e.to_string()))?;
            out.push('\n');
        } else {
            out += "---\n";
            out += &serde_norway::to_string(doc).map_err(|e| failed(e.to_string()))?;
        }
    }
    Ok(out)
}

/// Byte ranges of a YAML stream's documents, numbered as the parser numbers them (the
/// first is document 1): a `---` line starts one, and text before the first `---` is one
/// only when it holds more than comments and directives.
pub(super) fn yaml_document_spans(text: &str) -> Vec<Range<usize>> {
    let mut starts = Vec::new();
    let mut preamble = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let marker =
            line.starts_with("---") && line[3..].chars().next().is_none_or(char::is_whitespace);
        if marker {
            starts.push(offset);
        } else if starts.is_empty() {
            let t = line.trim_start_matches('\u{feff}').trim();
            preamble |= !(t.is_empty() || t.starts_with('#') || t.starts_with('%'));
        }
        offset += line.len();
    }
    if preamble {
        starts.insert(0, 0);
    }
    starts
        .iter()
        .enumerate()
        .map(|(i, &start)| start..starts.get(i + 1).copied().unwrap_or(text.len()))
        .collect()
}

fn replace_in_spans(text: &str, spans: &[Range<usize>], pins: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len() + 80 * pins.len());
    let mut copied = 0;
    for span in spans {
        out.push_str(&text[copied..span.start]);
        out.push_str(&replace_image_values(&text[span.clone()], pins));
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Replaces the value of every `image` key whose value is one of `pins`' keys, keeping its
/// quoting and everything around it.
pub(super) fn replace_image_values(text: &str, pins: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, _) in text.match_indices("image") {
        let Some(value) = image_value(text, at) else {
            continue;
        };
        let Some(to) = pins.get(&text[value.clone()]) else {
            continue;
        };
        out.push_str(&text[copied..value.start]);
        out.push_str(to);
        copied = value.end;
    }
    out.push_str(&text[copied..]);
    out
}

/// The byte range of the value of the `image` key whose name starts at `at`: `image: v`,
/// `- image: v`, `{…, image: v}`, `"image": "v"`, plain or quoted (quotes excluded). `None`
/// for anything else (`imagePullPolicy`, `baseimage`, a quoted value with escapes).
fn image_value(text: &str, at: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let (key_start, mut i) = match at.checked_sub(1).map(|b| bytes[b]) {
        Some(q @ (b'"' | b'\'')) if bytes.get(at + 5) == Some(&q) => (at - 1, at + 6),
        Some(b'"' | b'\'') => return None,
        _ => (at, at + 5),
    };
    let line_start = text[..key_start].rfind('\n').map_or(0, |n| n + 1);
    let lead = text[line_start..key_start].trim_end();
    let flow = lead.ends_with('{') || lead.ends_with(',');
    if !flow && !lead.chars().all(|c| c == '-' || c == ' ') {
        return None;
    }
    let blanks = |i: &mut usize| {
        while matches!(bytes.get(*i), Some(b' ' | b'\t')) {
            *i += 1;
        }
    };
    blanks(&mut i);
    if bytes.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    // A plain key needs a blank after its colon; a quoted one (JSON) need not.
    if key_start == at && !matches!(bytes.get(i), Some(b' ' | b'\t')) {
        return None;
    }
    blanks(&mut i);
    match *bytes.get(i)? {
        q @ (b'"' | b'\'') => {
            let start = i + 1;
            let end = start + text[start..].find(q as char)?;
            // Escapes (`\` in double quotes, `''` in single) would need unescaping: leave those.
            if text[start..end].contains('\\') || bytes.get(end + 1) == Some(&q) {
                return None;
            }
            Some(start..end)
        }
        _ => {
            let rest = &text[i..];
            let mut end = rest.find(['\n', '\r']).unwrap_or(rest.len());
            if let Some(comment) = rest[..end].find(" #") {
                end = comment;
            }
            if flow {
                if let Some(stop) = rest[..end].find([',', '}', ']']) {
                    end = stop;
                }
            }
            let value = rest[..end].trim_end();
            (!value.is_empty()).then_some(i..i + value.len())
        }
    }
}

//! Finding the image in what a save stream held: `manifest.json` or an OCI index,
//! following links between entries.

use super::*;

#[derive(Deserialize)]
pub(super) struct ConfigJson {
    pub(super) rootfs: RootFs,
}

#[derive(Deserialize)]
pub(super) struct RootFs {
    #[serde(default)]
    pub(super) diff_ids: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LegacyManifest {
    pub(super) config: String,
    #[serde(default)]
    pub(super) layers: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciDescriptor {
    #[serde(default)]
    pub(super) media_type: Option<String>,
    pub(super) digest: String,
    #[serde(default)]
    pub(super) platform: Option<OciPlatform>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Deserialize)]
struct OciPlatform {
    #[serde(default)]
    pub(super) os: String,
    #[serde(default)]
    pub(super) architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

/// An OCI image index or image manifest (told apart by which fields are present).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciDocument {
    #[serde(default)]
    pub(super) media_type: Option<String>,
    #[serde(default)]
    pub(super) manifests: Option<Vec<OciDescriptor>>,
    #[serde(default)]
    pub(super) config: Option<OciDescriptor>,
    #[serde(default)]
    pub(super) layers: Option<Vec<OciDescriptor>>,
}

pub(super) struct Resolver<'a> {
    pub(super) items: HashMap<String, Item>,
    pub(super) spool: &'a Path,
    pub(super) image: &'a str,
    pub(super) spooled: usize,
    pub(super) buf: Vec<u8>,
}

impl Resolver<'_> {
    pub(super) fn err(&self, message: String) -> ImageExportError {
        self.fail(ExportError::Malformed(message))
    }

    pub(super) fn fail(&self, source: ExportError) -> ImageExportError {
        ImageExportError {
            image: self.image.to_string(),
            source,
        }
    }

    /// Follows links from `path` to the entry that holds data.
    pub(super) fn resolve(&self, path: &str, what: &str) -> Result<String> {
        let mut current = image_path::normalize(path)
            .ok_or_else(|| self.err(format!("{what} `{path}` points outside the archive")))?;
        for _ in 0..MAX_LINK_HOPS {
            match self.items.get(&current) {
                Some(Item::Link(target)) => current = target.clone(),
                Some(_) => return Ok(current),
                None if current == path => {
                    return Err(self.err(format!(
                    "{what} `{path}` is referenced by the manifest but absent from the save stream"
                )))
                }
                None => {
                    return Err(self.err(format!(
                        "{what} `{path}` links to `{current}`, which is absent from the save stream"
                    )))
                }
            }
        }
        Err(self.err(format!("{what} `{path}`: too many links (a link loop?)")))
    }

    pub(super) fn json(&self, path: &str, what: &str) -> Result<Vec<u8>> {
        let key = self.resolve(path, what)?;
        match &self.items[&key] {
            Item::Small(data) => Ok(data.clone()),
            Item::Raw(file) => std::fs::read(file).map_err(|source| {
                let what = format!("{what} `{path}`");
                self.fail(ExportError::SpoolRead { what, source })
            }),
            Item::Layer(_) | Item::Unsupported(_) => Err(self.err(format!(
                "{what} `{path}` is not JSON (it looks like layer data)"
            ))),
            Item::Link(_) => Err(self.err(format!("{what} `{path}`: unresolved link"))),
        }
    }

    pub(super) fn layer(&mut self, path: &str) -> Result<ExportedLayer> {
        let key = self.resolve(path, "layer")?;
        let data = match self.items.get(&key) {
            Some(Item::Layer(layer)) => return Ok(layer.clone()),
            Some(Item::Unsupported(kind)) => {
                return Err(self.err(format!(
                    "layer `{path}` is {kind}-compressed, which polyarch cannot re-export as gzip"
                )))
            }
            Some(Item::Small(data)) => Source::Memory(data.clone()),
            Some(Item::Raw(file)) => Source::File(file.clone()),
            _ => return Err(self.err(format!("layer `{path}`: unresolved link"))),
        };
        // A small layer that looked like JSON was kept in memory: process it now.
        self.spooled += 1;
        let file = self.spool.join(format!("layer-{}.tar.gz", self.spooled));
        let src: Box<dyn Read> = match data {
            Source::Memory(bytes) => Box::new(io::Cursor::new(bytes)),
            Source::File(raw) => Box::new(File::open(&raw).map_err(|source| {
                let what = format!("`{path}`");
                self.fail(ExportError::SpoolRead { what, source })
            })?),
        };
        let mut buf = std::mem::take(&mut self.buf);
        let result = spool_tar_layer(src, &file, &mut buf, None);
        self.buf = buf;
        let layer = result.map_err(|e| match e {
            SpoolError::Read(source) | SpoolError::Write(source) | SpoolError::Gzip(source) => {
                let path = path.to_string();
                self.fail(ExportError::SpoolLayer { path, source })
            }
        })?;
        self.items.insert(key, Item::Layer(layer.clone()));
        Ok(layer)
    }

    /// The config path and layer paths, from `manifest.json` or else `index.json`.
    pub(super) fn find_manifest(
        &self,
        platform: Option<&Platform>,
    ) -> Result<(String, Vec<String>)> {
        if self.items.contains_key("manifest.json") {
            let data = self.json("manifest.json", "manifest")?;
            let manifests: Vec<LegacyManifest> =
                serde_json::from_slice(&data).map_err(|source| {
                    let what = "manifest.json is not a save manifest".into();
                    self.fail(ExportError::Json { what, source })
                })?;
            let mut manifests = manifests.into_iter();
            return match (manifests.next(), manifests.next()) {
                (Some(m), None) => Ok((m.config, m.layers)),
                (None, _) => Err(self.err("manifest.json lists no image".into())),
                (Some(_), Some(_)) => Err(self
                    .err("manifest.json lists several images; export one image at a time".into())),
            };
        }
        if !self.items.contains_key("index.json") {
            return Err(self.err(
                "the save stream has no manifest.json (nor an OCI index.json): not a docker save archive, or truncated"
                    .into(),
            ));
        }
        let mut path = "index.json".to_string();
        for _ in 0..4 {
            let data = self.json(&path, "manifest")?;
            let doc: OciDocument = serde_json::from_slice(&data).map_err(|source| {
                let what = format!("`{path}` is not an OCI index or manifest");
                self.fail(ExportError::Json { what, source })
            })?;
            if let Some(manifests) = doc.manifests {
                let chosen = choose_manifest(&manifests, platform)
                    .ok_or_else(|| self.err(format!("`{path}` lists no usable image manifest")))?;
                path = blob_path(&chosen.digest)
                    .ok_or_else(|| self.err(format!("`{path}`: bad digest `{}`", chosen.digest)))?;
                continue;
            }
            let (Some(config), Some(layers)) = (doc.config, doc.layers) else {
                return Err(self.err(format!(
                    "`{path}` ({}) is neither an image index nor an image manifest",
                    doc.media_type.as_deref().unwrap_or("no mediaType")
                )));
            };
            let bad = |d: &str| self.err(format!("`{path}`: bad digest `{d}`"));
            let config_path = blob_path(&config.digest).ok_or_else(|| bad(&config.digest))?;
            let mut layer_paths = Vec::with_capacity(layers.len());
            for layer in &layers {
                layer_paths.push(blob_path(&layer.digest).ok_or_else(|| bad(&layer.digest))?);
            }
            return Ok((config_path, layer_paths));
        }
        Err(self.err("index.json nests indexes too deeply".into()))
    }
}

enum Source {
    Memory(Vec<u8>),
    File(PathBuf),
}

pub(super) fn blob_path(digest: &str) -> Option<String> {
    let digest: Digest = digest.parse().ok()?;
    Some(format!("blobs/{}/{}", digest.algorithm(), digest.hex()))
}

fn choose_manifest<'a>(
    manifests: &'a [OciDescriptor],
    platform: Option<&Platform>,
) -> Option<&'a OciDescriptor> {
    let usable: Vec<&OciDescriptor> = manifests
        .iter()
        .filter(|m| {
            m.annotations
                .get("vnd.docker.reference.type")
                .is_none_or(|t| t != "attestation-manifest")
                && m.platform
                    .as_ref()
                    .is_none_or(|p| p.os != "unknown" && p.architecture != "unknown")
                && m.media_type
                    .as_deref()
                    .is_none_or(|t| t.contains("manifest") || t.contains("index"))
        })
        .collect();
    if let Some(wanted) = platform {
        let matching = usable.iter().find(|m| {
            m.platform.as_ref().is_some_and(|p| {
                Platform::new(&p.os, &p.architecture, p.variant.as_deref()) == *wanted
            })
        });
        if let Some(m) = matching {
            return Some(m);
        }
    }
    usable.first().copied()
}

use super::*;
use flate2::read::MultiGzDecoder;

fn layer_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn hex_of(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn config_json(diff_ids: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

enum E<'a> {
    File(&'a str, Vec<u8>),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

fn archive(entries: Vec<E>) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        match e {
            E::File(name, data) => {
                h.set_size(data.len() as u64);
                h.set_cksum();
                b.append_data(&mut h, name, data.as_slice()).unwrap();
            }
            E::Dir(name) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_cksum();
                b.append_data(&mut h, name, io::empty()).unwrap();
            }
            E::Symlink(name, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, name, target).unwrap();
            }
            E::Hardlink(name, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                b.append_link(&mut h, name, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn sha_file(path: &Path) -> (String, u64) {
    let data = std::fs::read(path).unwrap();
    (format!("sha256:{}", hex_of(&data)), data.len() as u64)
}

fn gunzip_file(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    MultiGzDecoder::new(File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// A legacy (Engine ≤ 24) save stream: three layers, the third reusing the first
/// through a symlink that comes before its target (the engine sorts entries by name).
fn legacy_stream(config_diff_ids: Option<Vec<String>>) -> (Vec<u8>, String) {
    let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
    let l2 = layer_tar(&[("b.txt", b"hello b\n")]);
    let ids = [
        format!("sha256:{}", hex_of(&l1)),
        format!("sha256:{}", hex_of(&l2)),
        format!("sha256:{}", hex_of(&l1)),
    ];
    let config = config_json(&config_diff_ids.unwrap_or_else(|| ids.to_vec()));
    let cfg_hex = hex_of(&config);
    let (d1, d2, d3) = ("c".repeat(64), "d".repeat(64), "a".repeat(64));
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{cfg_hex}.json"),
        "RepoTags": null,
        "Layers": [format!("{d1}/layer.tar"), format!("{d2}/layer.tar"), format!("{d3}/layer.tar")],
    }]))
    .unwrap();
    let stream = archive(
        [
            E::File(&format!("{cfg_hex}.json"), config.clone()).owned(),
            E::Dir(&format!("{d3}/")).owned(),
            E::File(&format!("{d3}/VERSION"), b"1.0".to_vec()).owned(),
            E::File(&format!("{d3}/json"), b"{}".to_vec()).owned(),
            E::Symlink(&format!("{d3}/layer.tar"), &format!("../{d1}/layer.tar")).owned(),
            E::Dir(&format!("{d1}/")).owned(),
            E::File(&format!("{d1}/VERSION"), b"1.0".to_vec()).owned(),
            E::File(&format!("{d1}/json"), b"{}".to_vec()).owned(),
            E::File(&format!("{d1}/layer.tar"), l1.clone()).owned(),
            E::Dir(&format!("{d2}/")).owned(),
            E::File(&format!("{d2}/layer.tar"), l2.clone()).owned(),
            E::File("manifest.json", manifest).owned(),
        ]
        .iter()
        .map(Owned::as_e)
        .collect(),
    );
    (stream, format!("sha256:{cfg_hex}"))
}

/// Owned form of `E`, so entries can be built from `format!` temporaries.
enum Owned {
    File(String, Vec<u8>),
    Dir(String),
    Symlink(String, String),
    Hardlink(String, String),
}

impl Owned {
    fn as_e(&self) -> E<'_> {
        match self {
            Owned::File(n, d) => E::File(n, d.clone()),
            Owned::Dir(n) => E::Dir(n),
            Owned::Symlink(n, t) => E::Symlink(n, t),
            Owned::Hardlink(n, t) => E::Hardlink(n, t),
        }
    }
}

impl E<'_> {
    fn owned(self) -> Owned {
        match self {
            E::File(n, d) => Owned::File(n.into(), d),
            E::Dir(n) => Owned::Dir(n.into()),
            E::Symlink(n, t) => Owned::Symlink(n.into(), t.into()),
            E::Hardlink(n, t) => Owned::Hardlink(n.into(), t.into()),
        }
    }
}

fn parse(stream: &[u8]) -> (Result<SaveContents>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let r = read_save_stream(stream, dir.path(), "test/image", None);
    (r, dir)
}

fn message(r: Result<SaveContents>) -> String {
    match r {
        Err(ImageExportError { image, source }) => {
            assert_eq!(image, "test/image");
            let message = source.to_string();
            assert!(!message.contains('\n'), "one line: {message}");
            message
        }
        Ok(c) => panic!("expected an error, got {c:?}"),
    }
}

#[test]
fn legacy_layout_with_manifest_last_and_symlinked_layer() {
    let (stream, config_digest) = legacy_stream(None);
    let (r, _dir) = parse(&stream);
    let c = r.unwrap();
    assert_eq!(c.config_digest, config_digest);
    assert_eq!(c.stream_bytes, stream.len() as u64);
    assert_eq!(c.layers.len(), 3);
    let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
    let l2 = layer_tar(&[("b.txt", b"hello b\n")]);
    for (layer, tar) in c.layers.iter().zip([&l1, &l2, &l1]) {
        assert_eq!(layer.diff_id, format!("sha256:{}", hex_of(tar)));
        assert_eq!(layer.media_type, LAYER_MEDIA_TYPE);
        let (digest, size) = sha_file(&layer.path);
        assert_eq!(layer.digest, digest);
        assert_eq!(layer.size, size);
        assert_eq!(&gunzip_file(&layer.path), tar);
    }
    // The reused layer is spooled once.
    assert_eq!(c.layers[0].path, c.layers[2].path);
}

#[test]
fn legacy_layout_with_hardlinked_layer() {
    let l1 = layer_tar(&[("a.txt", b"x")]);
    let id = format!("sha256:{}", hex_of(&l1));
    let config = config_json(&[id.clone(), id]);
    let cfg_hex = hex_of(&config);
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{cfg_hex}.json"),
        "Layers": ["one/layer.tar", "two/layer.tar"],
    }]))
    .unwrap();
    let stream = archive(vec![
        E::File("one/layer.tar", l1),
        E::Hardlink("two/layer.tar", "one/layer.tar"),
        E::File(&format!("{cfg_hex}.json"), config),
        E::File("manifest.json", manifest),
    ]);
    let (r, _dir) = parse(&stream);
    let c = r.unwrap();
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[0].digest, c.layers[1].digest);
}

/// An OCI-layout (Engine 25+) stream: one uncompressed and one gzipped layer, blobs
/// in an arbitrary order, with or without the legacy manifest.json.
fn oci_stream(with_legacy_manifest: bool) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let l1 = layer_tar(&[("etc/one", b"one\n")]);
    let l2_tar = layer_tar(&[("etc/two", &[7u8; 5000])]);
    let l2 = gzip(&l2_tar);
    let config = config_json(&[
        format!("sha256:{}", hex_of(&l1)),
        format!("sha256:{}", hex_of(&l2_tar)),
    ]);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{}", hex_of(&config)), "size": config.len()},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar",
             "digest": format!("sha256:{}", hex_of(&l1)), "size": l1.len()},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
             "digest": format!("sha256:{}", hex_of(&l2)), "size": l2.len()},
        ],
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{}", hex_of(&manifest)), "size": manifest.len()}],
    }))
    .unwrap();
    let blob = |d: &[u8]| format!("blobs/sha256/{}", hex_of(d));
    let mut entries = vec![
        Owned::Dir("blobs/".into()),
        Owned::Dir("blobs/sha256/".into()),
        Owned::File(blob(&l2), l2.clone()),
        Owned::File(blob(&manifest), manifest.clone()),
        Owned::File(blob(&config), config.clone()),
        Owned::File(blob(&l1), l1.clone()),
        Owned::File("index.json".into(), index),
        Owned::File(
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
    ];
    if with_legacy_manifest {
        entries.push(Owned::File(
            "manifest.json".into(),
            serde_json::to_vec(&serde_json::json!([{
                "Config": blob(&config),
                "RepoTags": ["x:latest"],
                "Layers": [blob(&l1), blob(&l2)],
            }]))
            .unwrap(),
        ));
    }
    let stream = archive(entries.iter().map(Owned::as_e).collect());
    (stream, l1, l2, config)
}

#[test]
fn oci_layout_with_uncompressed_and_gzipped_layers() {
    for legacy_manifest in [true, false] {
        let (stream, l1, l2, config) = oci_stream(legacy_manifest);
        let (r, _dir) = parse(&stream);
        let c = r.unwrap();
        assert_eq!(c.config, config);
        assert_eq!(c.config_digest, format!("sha256:{}", hex_of(&config)));
        assert_eq!(c.layers.len(), 2);
        // Uncompressed: gzipped by us.
        assert_eq!(c.layers[0].diff_id, format!("sha256:{}", hex_of(&l1)));
        assert_eq!(gunzip_file(&c.layers[0].path), l1);
        // Already gzipped: kept byte for byte.
        assert_eq!(c.layers[1].digest, format!("sha256:{}", hex_of(&l2)));
        assert_eq!(std::fs::read(&c.layers[1].path).unwrap(), l2);
        for layer in &c.layers {
            assert_eq!(
                (layer.digest.to_string(), layer.size),
                sha_file(&layer.path)
            );
        }
    }
}

#[test]
fn small_layer_that_looks_like_json_is_still_a_layer() {
    let l1 = layer_tar(&[("{weird}", b"x")]);
    let config = config_json(&[format!("sha256:{}", hex_of(&l1))]);
    let blob = |d: &[u8]| format!("blobs/sha256/{}", hex_of(d));
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": blob(&config), "Layers": [blob(&l1)],
    }]))
    .unwrap();
    let stream = archive(vec![
        E::File(&blob(&l1), l1.clone()),
        E::File(&blob(&config), config),
        E::File("manifest.json", manifest),
    ]);
    let (r, _dir) = parse(&stream);
    let c = r.unwrap();
    assert_eq!(gunzip_file(&c.layers[0].path), l1);
}

#[test]
fn diff_id_mismatch_is_an_error() {
    let wrong = format!("sha256:{}", "0".repeat(64));
    let l1 = layer_tar(&[("a.txt", b"hello a\n")]);
    let ids = vec![
        format!("sha256:{}", hex_of(&l1)),
        wrong.clone(),
        format!("sha256:{}", hex_of(&l1)),
    ];
    let (stream, _) = legacy_stream(Some(ids));
    let m = message(parse(&stream).0);
    assert!(m.contains("diff_id") && m.contains(&wrong), "{m}");

    let (stream, _) = legacy_stream(Some(vec![format!("sha256:{}", hex_of(&l1))]));
    let m = message(parse(&stream).0);
    assert!(m.contains("rootfs.diff_ids lists 1 layers"), "{m}");
}

#[test]
fn truncated_streams_are_errors() {
    for stream in [
        legacy_stream(None).0,
        oci_stream(true).0,
        oci_stream(false).0,
    ] {
        // Every cut point but the very end (the tar's trailing zero blocks are
        // part of what proves the stream is complete).
        for cut in (0..stream.len() - 1).step_by(37) {
            let m = message(parse(&stream[..cut]).0);
            assert!(!m.is_empty());
        }
        for missing in [1024, 512, 1] {
            let m = message(parse(&stream[..stream.len() - missing]).0);
            assert!(m.contains("end-of-archive"), "{missing}: {m}");
        }
    }
}

#[test]
fn garbage_is_an_error() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let garbage: Vec<u8> = (0..100_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for input in [&garbage[..], &garbage[..100], b"", &[0u8; 4096][..]] {
        message(parse(input).0);
    }
}

#[test]
fn missing_manifest_and_missing_layer_are_errors() {
    let l1 = layer_tar(&[("a.txt", b"x")]);
    let stream = archive(vec![E::File("abc/layer.tar", l1.clone())]);
    let m = message(parse(&stream).0);
    assert!(m.contains("no manifest.json"), "{m}");

    let config = config_json(&[format!("sha256:{}", hex_of(&l1))]);
    let cfg_hex = hex_of(&config);
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{cfg_hex}.json"), "Layers": ["gone/layer.tar"],
    }]))
    .unwrap();
    let stream = archive(vec![
        E::File("abc/layer.tar", l1),
        E::File(&format!("{cfg_hex}.json"), config),
        E::File("manifest.json", manifest),
    ]);
    let m = message(parse(&stream).0);
    assert!(m.contains("gone/layer.tar") && m.contains("absent"), "{m}");
}

#[test]
fn corrupt_gzip_blob_is_an_error() {
    let (stream, _, l2, _) = oci_stream(true);
    let mut stream = stream;
    // Flip a byte in the middle of the gzipped blob's data.
    let pos = stream
        .windows(l2.len())
        .position(|w| w == l2.as_slice())
        .unwrap();
    stream[pos + l2.len() / 2] ^= 0xff;
    message(parse(&stream).0);
}

#[test]
fn save_stream_names_give_digests() {
    assert_eq!(
        name_digest(&format!("{}.json", "ab".repeat(32))),
        format!("sha256:{}", "ab".repeat(32)).parse().ok()
    );
}

#[test]
fn layout_blob_paths_come_only_from_digests() {
    let hex = "ab".repeat(32);
    assert_eq!(
        blob_path(&format!("sha256:{hex}")),
        Some(format!("blobs/sha256/{hex}"))
    );
    // Nothing that could leave blobs/ or name another file.
    for bad in ["sha256:../../manifest.json", "sha256:", "../x:y", "md5:abc"] {
        assert_eq!(blob_path(bad), None, "{bad}");
    }
}

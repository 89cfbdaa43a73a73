use super::*;
use std::io::Write;

const STATUS: &[u8] = b"Package: libc6\nStatus: install ok installed\nArchitecture: arm64\nVersion: 2.36-9\n\nPackage: bash\nStatus: install ok installed\nArchitecture: arm64\nVersion: 5.2.15-2\n";
const INSTALLED: &[u8] = b"P:musl\nV:1.2.4-r2\nA:aarch64\nL:MIT\n";
const OS_RELEASE: &[u8] = b"ID=debian\nVERSION_ID=\"12\"\n";

/// A layer tar of `(path, mode, contents)`; a `None` contents is a directory.
fn layer(entries: &[(&str, u32, Option<&[u8]>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, mode, contents) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(*mode);
        match contents {
            Some(bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, path, *bytes).unwrap();
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, path, &[][..]).unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(bytes).unwrap();
    z.finish().unwrap()
}

fn read(layers: Vec<Vec<u8>>) -> Result<Catalog, LayersError> {
    catalog(
        layers
            .into_iter()
            .map(|l| Box::new(io::Cursor::new(l)) as Box<dyn Read + Send>)
            .collect(),
    )
}

fn names(catalog: &Catalog) -> Vec<String> {
    catalog
        .packages
        .iter()
        .map(|p| format!("{}:{}", p.ecosystem.purl_type(), p.name))
        .collect()
}

fn base() -> Vec<u8> {
    gzip(&layer(&[
        ("etc/", 0o755, None),
        ("etc/os-release", 0o644, Some(OS_RELEASE)),
        ("var/lib/dpkg/status", 0o644, Some(STATUS)),
        (
            "var/lib/dpkg/status.d/tzdata",
            0o644,
            Some(b"Package: tzdata\nVersion: 2024a\nArchitecture: all\n"),
        ),
        (
            "var/lib/dpkg/status.d/tzdata.md5sums",
            0o644,
            Some(b"abc  usr/share/zoneinfo/UTC\n"),
        ),
        ("lib/apk/db/installed", 0o644, Some(INSTALLED)),
        ("bin/sh", 0o755, Some(b"#!/bin/busybox\n")),
    ]))
}

#[test]
fn every_database_of_a_layer_is_read() {
    let found = read(vec![base()]).unwrap();
    assert_eq!(
        names(&found),
        ["deb:bash", "deb:libc6", "deb:tzdata", "apk:musl"]
    );
    assert_eq!(found.distro.qualifier().as_deref(), Some("debian-12"));
    let tzdata = found.packages.iter().find(|p| p.name == "tzdata").unwrap();
    assert_eq!(tzdata.source, "/var/lib/dpkg/status.d/tzdata");
}

#[test]
fn whiteouts_and_opaque_directories_hide_lower_databases() {
    let upper = layer(&[
        ("lib/apk/db/.wh.installed", 0o644, Some(b"")),
        ("var/lib/dpkg/status.d/", 0o755, None),
        ("var/lib/dpkg/status.d/.wh..wh..opq", 0o644, Some(b"")),
        (
            "var/lib/dpkg/status.d/zlib",
            0o644,
            Some(b"Package: zlib1g\nVersion: 1:1.2.13\nArchitecture: arm64\n"),
        ),
    ]);
    let found = read(vec![base(), upper]).unwrap();
    assert_eq!(names(&found), ["deb:bash", "deb:libc6", "deb:zlib1g"]);
    // A whole directory whited out, and a database replaced by something else.
    let upper = layer(&[
        ("var/lib/.wh.dpkg", 0o644, Some(b"")),
        ("lib/apk/db/installed", 0o644, Some(b"P:busybox\nV:1.36\n")),
    ]);
    let found = read(vec![base(), upper]).unwrap();
    assert_eq!(names(&found), ["apk:busybox"]);
    // A database re-added above its whiteout's layer is there again.
    let deleted = layer(&[("var/lib/dpkg/.wh.status", 0o644, Some(b""))]);
    let readded = layer(&[("var/lib/dpkg/status", 0o644, Some(STATUS))]);
    let found = read(vec![base(), deleted, readded]).unwrap();
    assert!(names(&found).contains(&"deb:libc6".to_string()));
}

#[test]
fn binaries_with_embedded_packages_are_read_wherever_they_are() {
    let go = binary::tests::elf(&[(
        ".go.buildinfo",
        golang::tests::section("go1.22.2", golang::tests::MODINFO),
    )]);
    let rust = binary::tests::elf(&[(".dep-v0", binary::tests::dep_v0(binary::tests::AUDITABLE))]);
    let top = layer(&[
        ("usr/local/bin/tool", 0o755, Some(&go)),
        ("usr/bin/rg", 0o755, Some(&rust)),
        // Not executable: not looked at.
        ("usr/share/doc/rg", 0o644, Some(&rust)),
    ]);
    let found = read(vec![top]).unwrap();
    let sources: std::collections::BTreeSet<&str> =
        found.packages.iter().map(|p| p.source.as_str()).collect();
    assert_eq!(
        sources.into_iter().collect::<Vec<_>>(),
        ["/usr/bin/rg", "/usr/local/bin/tool"]
    );
    assert_eq!(found.packages.len(), 7);
}

/// An rpm sqlite database's bytes, made as rpm makes its `Packages` table, of `blobs`.
fn rpmdb(schema: &str, blobs: &[Vec<u8>]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rpmdb.sqlite");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch(schema).unwrap();
    for blob in blobs {
        db.execute("INSERT INTO Packages (blob) VALUES (?1)", [blob])
            .unwrap();
    }
    drop(db);
    std::fs::read(path).unwrap()
}

const RPM_SCHEMA: &str =
    "CREATE TABLE 'Packages' (hnum INTEGER PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL);";

#[test]
fn an_rpm_sqlite_database_is_read_and_bad_headers_are_told() {
    let header = rpm::tests::header;
    let db = rpmdb(
        RPM_SCHEMA,
        &[
            header(
                "bash",
                "5.2.26",
                "3.fc40",
                Some(1),
                "x86_64",
                "GPL-3.0-or-later",
            ),
            b"\0\0\0\x01 not a header".to_vec(),
            header("tzdata", "2024a", "5.fc40", None, "noarch", "Public Domain"),
            // Past the cap: skipped without being loaded (its zeros compress well).
            vec![0; 17 << 20],
        ],
    );
    let top = gzip(&layer(&[
        ("etc/os-release", 0o644, Some(b"ID=fedora\nVERSION_ID=40\n")),
        ("usr/lib/sysimage/rpm/rpmdb.sqlite", 0o644, Some(&db)),
    ]));
    let found = read(vec![top]).unwrap();
    let got: Vec<_> = found
        .packages
        .iter()
        .map(|p| (p.name.as_str(), p.version.as_str(), p.arch.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("bash", "1:5.2.26-3.fc40", Some("x86_64")),
            ("tzdata", "2024a-5.fc40", Some("noarch")),
        ]
    );
    assert_eq!(
        found.packages[0].source,
        "/usr/lib/sysimage/rpm/rpmdb.sqlite"
    );
    assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
    assert!(
        found.warnings[0].contains(
            "2 header(s) not read: header 2 claims 1 index entries and 544108404 data bytes, \
             which is not its 17 bytes, header 4 is 17825792 bytes, more than the 16 MiB read"
        ),
        "{:?}",
        found.warnings
    );
    assert_eq!(
        spdx::purl(&found.packages[0], &found),
        "pkg:rpm/fedora/bash@5.2.26-3.fc40?arch=x86_64&distro=fedora-40&epoch=1"
    );
}

#[test]
fn what_is_no_rpm_sqlite_database_is_listed_as_not_read() {
    let view = rpmdb(
        "CREATE TABLE t (hnum INTEGER, blob BLOB); CREATE VIEW Packages AS SELECT * FROM t;",
        &[],
    );
    for (path, bytes, says) in [
        ("var/lib/rpm/Packages", &b"\0\0"[..], "Berkeley DB"),
        (
            "usr/lib/sysimage/rpm/Packages.db",
            b"\0\0",
            "ndb database (SUSE's), which is not read",
        ),
        (
            "var/lib/rpm/rpmdb.sqlite",
            b"SQLite format 3\0 and then garbage",
            "cannot be read",
        ),
        ("var/lib/rpm/rpmdb.sqlite", &view, "has no Packages table"),
    ] {
        let found = read(vec![layer(&[(path, 0o644, Some(bytes))])]).unwrap();
        assert!(found.packages.is_empty());
        assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
        assert!(
            found.warnings[0].contains(says) && found.warnings[0].starts_with(&format!("/{path}")),
            "{:?}",
            found.warnings
        );
    }
}

#[test]
fn a_name_past_path_max_is_refused_and_garbage_is_unreadable() {
    let long = format!("{}/status", "d".repeat(5000));
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    builder.append_data(&mut header, &long, &b"x"[..]).unwrap();
    let outcome = read(vec![base(), builder.into_inner().unwrap()]);
    assert!(
        matches!(
            outcome,
            Err(LayersError::Refused {
                layer: 2,
                limit: LayerLimit::Name { .. }
            })
        ),
        "{outcome:?}"
    );
    let mut garbage = gzip(&layer(&[("var/lib/dpkg/status", 0o644, Some(STATUS))]));
    garbage.truncate(garbage.len() / 2);
    let outcome = read(vec![garbage]);
    assert!(
        matches!(outcome, Err(LayersError::Unreadable { layer: 1, .. })),
        "{outcome:?}"
    );
    // Noise, gzip'd or not, never panics.
    let mut x: u32 = 11;
    for round in 0..50 {
        let mut bytes = layer(&[("var/lib/dpkg/status", 0o644, Some(STATUS))]);
        for _ in 0..(1 + round % 5) {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let at = (x >> 8) as usize % bytes.len();
            bytes[at] = (x >> 16) as u8;
        }
        let _ = read(vec![bytes.clone()]);
        let _ = read(vec![gzip(&bytes)]);
    }
}

#[test]
fn a_zstd_layer_is_unreadable() {
    let outcome = read(vec![vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0]]);
    assert!(
        matches!(outcome, Err(LayersError::Unreadable { .. })),
        "{outcome:?}"
    );
}

#[test]
fn files_larger_than_the_header_limit_are_read_whole() {
    // Contents are no tar headers: a 3 MiB binary and a 2 MiB database pass.
    let big = binary::tests::elf(&[
        (".text", vec![0x90; 3 << 20]),
        (".dep-v0", binary::tests::dep_v0(binary::tests::AUDITABLE)),
    ]);
    let mut status = STATUS.to_vec();
    status.resize(2 << 20, b'\n');
    let top = gzip(&layer(&[
        ("usr/bin/rg", 0o755, Some(&big)),
        ("var/lib/dpkg/status", 0o644, Some(&status)),
    ]));
    let found = read(vec![top]).unwrap();
    assert_eq!(found.packages.len(), 4, "{:?}", found.packages);
}

/// A layer tar holding one hard link `path` → `target`.
fn hard_link(path: &str, target: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Link);
    header.set_size(0);
    builder.append_link(&mut header, path, target).unwrap();
    builder.into_inner().unwrap()
}

#[test]
fn a_later_file_hides_what_was_kept_at_its_path_and_below_it_and_links_hold_their_target() {
    let go = binary::tests::elf(&[(
        ".go.buildinfo",
        golang::tests::section("go1.22.2", golang::tests::MODINFO),
    )]);
    let tools = layer(&[
        ("usr/local/bin/tool", 0o755, Some(&go)),
        ("opt/tools/tool", 0o755, Some(&go)),
    ]);
    let sources = |found: &Catalog| {
        let sources: std::collections::BTreeSet<String> =
            found.packages.iter().map(|p| p.source.clone()).collect();
        sources.into_iter().collect::<Vec<_>>()
    };
    // A script over the binary, and a file where its directory was.
    let over = layer(&[
        ("usr/local/bin/tool", 0o755, Some(b"#!/bin/sh\n")),
        ("opt/tools", 0o644, Some(b"a file now")),
    ]);
    assert!(read(vec![tools.clone(), over]).unwrap().packages.is_empty());
    // A hard link to a binary of a lower layer holds its packages, even once the binary
    // is deleted; one to a path its own layer replaced holds what replaced it.
    let linked = hard_link("usr/bin/tool", "usr/local/bin/tool");
    let deleted = layer(&[
        ("usr/local/bin/.wh.tool", 0o644, Some(b"")),
        ("opt/.wh.tools", 0o644, Some(b"")),
    ]);
    let found = read(vec![tools.clone(), linked, deleted]).unwrap();
    assert_eq!(sources(&found), ["/usr/local/bin/tool"]);
    assert!(!found.packages.is_empty());
    let mut replaced = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(4);
    replaced
        .append_data(&mut header, "usr/local/bin/tool", &b"text"[..])
        .unwrap();
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Link);
    link.set_size(0);
    replaced
        .append_link(&mut link, "usr/bin/tool", "usr/local/bin/tool")
        .unwrap();
    let replaced = replaced.into_inner().unwrap();
    assert_eq!(
        sources(&read(vec![tools, replaced]).unwrap()),
        ["/opt/tools/tool"]
    );
}

/// Layers read one by one and laid in order catalog an image as reading them in one go
/// does, whatever a layer shared with another image holds.
#[test]
fn layers_read_one_by_one_and_laid_in_order_catalog_as_read_together() {
    let upper = layer(&[
        ("var/lib/dpkg/.wh.status", 0o644, Some(b"")),
        ("lib/apk/db/installed", 0o644, Some(b"P:busybox\nV:1.36\n")),
    ]);
    let layers = vec![base(), upper];
    let one_by_one: Vec<std::sync::Arc<LayerFacts>> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let reader = Box::new(io::Cursor::new(l.clone())) as Box<dyn Read + Send>;
            std::sync::Arc::new(read_layer(i + 1, reader).unwrap())
        })
        .collect();
    assert_eq!(lay_layers(&one_by_one), read(layers).unwrap());
    let broken =
        Box::new(io::Cursor::new(gzip(b"not a tar")[..10].to_vec())) as Box<dyn Read + Send>;
    assert!(matches!(
        read_layer(3, broken),
        Err(LayersError::Unreadable { layer: 3, .. })
    ));
}

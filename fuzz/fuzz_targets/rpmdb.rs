//! The SBOM's RPM reader: `polyarch::sbom::catalog` on a one-layer image whose
//! `/var/lib/rpm/rpmdb.sqlite` is the input (spooled to a file and opened by SQLite, its
//! `Packages` headers parsed by hand), beside an os-release. A small file is within every
//! layer limit, so the catalog is made; whatever it reads is an rpm package of that file,
//! and anything it could not read is one warning naming the file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use polyarch::sbom::{catalog, Ecosystem};
use std::io::{Cursor, Read};

fn layer(db: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("etc/os-release", &b"ID=fedora\nVERSION_ID=40\n"[..]),
        ("var/lib/rpm/rpmdb.sqlite", db),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }
    b.into_inner().unwrap()
}

fuzz_target!(|data: &[u8]| {
    let layers: Vec<Box<dyn Read + Send>> = vec![Box::new(Cursor::new(layer(data)))];
    let found = catalog(layers).expect("a one-file layer is within the limits");
    for package in &found.packages {
        assert_eq!(package.ecosystem, Ecosystem::Rpm, "{package:?}");
        assert_eq!(package.source, "/var/lib/rpm/rpmdb.sqlite");
    }
    assert!(found.warnings.len() <= 1, "{:?}", found.warnings);
    for warning in &found.warnings {
        assert!(
            warning.starts_with("/var/lib/rpm/rpmdb.sqlite"),
            "{warning}"
        );
    }
});

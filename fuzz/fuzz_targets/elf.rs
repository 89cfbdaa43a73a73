//! The ELF reader behind `verify --deep`: `elf::elf_machine` (ELF header, program headers,
//! PT_INTERP), `elf::machine_name`, `ElfIdent::describe` and `elf::expected_machine`, then
//! `entrypoint::inspect` on a one-layer image whose entrypoint `/app` is the input (`/bin/sh`,
//! `/usr/bin/env` and `/lib/ld.so` are symlinks to it, so `#!` and PT_INTERP chains loop
//! back), under the platform the ELF claims (or linux/amd64), linux/riscv64 and windows/amd64.
#![no_main]
use libfuzzer_sys::fuzz_target;
use polyarch::base::elf::{self, Linkage};
use polyarch::verify::entrypoint::{self, Finding};
use polyarch::Platform;
use std::io::{Cursor, Read};

const ARCHS: &[(&str, Option<&str>)] = &[
    ("amd64", None),
    ("386", None),
    ("arm64", None),
    ("arm", Some("v7")),
    ("ppc64le", None),
    ("ppc64", None),
    ("s390x", None),
    ("riscv64", None),
    ("mips64le", None),
    ("mips64", None),
    ("mipsle", None),
    ("mips", None),
    ("loong64", None),
];

fn layer(data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["bin", "usr", "usr/bin", "lib"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, dir, &[][..]).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o755);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, "app", data).unwrap();
    for link in ["bin/sh", "usr/bin/env", "lib/ld.so"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, link, "/app").unwrap();
    }
    b.into_inner().unwrap()
}

fuzz_target!(|data: &[u8]| {
    // Any e_machine value gets a name.
    if let Some(m) = data.get(..2) {
        let (human, constant) = elf::machine_name(u16::from_le_bytes([m[0], m[1]]));
        assert!(!human.is_empty() && !constant.is_empty());
    }

    let ident = elf::elf_machine(data);
    if let Some(id) = &ident {
        assert!(data.len() >= 20 && data.starts_with(b"\x7fELF"));
        // class, byte order, e_type and e_machine come from the first 20 bytes alone.
        let short = elf::elf_machine(&data[..20]).expect("20-byte prefix of an ELF");
        assert_eq!(
            (short.class, short.endian, short.machine, short.elf_type),
            (id.class, id.endian, id.machine, id.elf_type)
        );
        assert_eq!(short.linkage, None);
        if let Some(Linkage::Dynamic {
            interpreter: Some(i),
        }) = &id.linkage
        {
            assert!(!i.is_empty() && !i.contains('\0'));
        }
        let (_, constant) = elf::machine_name(id.machine);
        assert!(id.describe().contains(&constant));
    }

    let own = ident.as_ref().and_then(|id| {
        ARCHS
            .iter()
            .map(|(a, v)| Platform::new("linux", a, *v))
            .find(|p| elf::expected_machine(p) == Some((id.machine, id.class, id.endian)))
    });
    let platforms = [
        own.unwrap_or_else(|| Platform::new("linux", "amd64", None)),
        Platform::new("linux", "riscv64", None),
        Platform::new("windows", "amd64", None),
    ];
    let config = br#"{"config":{"Entrypoint":["/app"],"Env":["PATH=/usr/bin:/bin"]}}"#;
    let tar = layer(data);
    for platform in &platforms {
        let layers: Vec<Box<dyn Read + Send>> = vec![Box::new(Cursor::new(tar.clone()))];
        // One small file is within every layer limit: a refusal would be a bug.
        let report = entrypoint::inspect(config, layers, platform)
            .expect("a one-file layer is within the limits");
        assert_eq!(report.executable.as_deref(), Some("/app"), "{report:?}");
        let Some(id) = &ident else { continue };
        // The entrypoint's own header is judged before anything else.
        match elf::expected_machine(platform) {
            None => assert_eq!(report.finding, Finding::Unreadable, "{report:?}"),
            Some(want) if want != (id.machine, id.class, id.endian) => {
                assert!(
                    matches!(report.finding, Finding::BinaryMismatch { .. }),
                    "{report:?}"
                )
            }
            Some(_) => {
                if id.linkage == Some(Linkage::Static) && data.len() <= 4096 {
                    assert_eq!(report.finding, Finding::Match, "{report:?}");
                }
            }
        }
    }
});

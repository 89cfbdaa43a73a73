use super::*;
use crate::builder::export::ChannelReader;
use std::io::Cursor;

fn p(s: &str) -> Platform {
    s.parse().unwrap()
}

/// Bytes written in one byte order, as an ELF file's header declares it.
struct Writer {
    little: bool,
    bytes: Vec<u8>,
}

impl Writer {
    /// The identification bytes of an ELF file of `class` (1: 32-bit, 2: 64-bit).
    fn elf(class: u8, little: bool) -> Writer {
        let mut bytes = vec![
            0x7f,
            b'E',
            b'L',
            b'F',
            class,
            if little { 1 } else { 2 },
            1,
            0,
        ];
        bytes.resize(16, 0);
        Writer { little, bytes }
    }

    /// Appends `v` in the file's byte order, given both orders.
    fn put<const N: usize>(&mut self, le: [u8; N], be: [u8; N]) {
        self.bytes.extend(if self.little { le } else { be });
    }

    fn u16(&mut self, v: u16) {
        self.put(v.to_le_bytes(), v.to_be_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.put(v.to_le_bytes(), v.to_be_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.put(v.to_le_bytes(), v.to_be_bytes());
    }
}

/// A 64-byte ELF64 header plus program headers (PT_LOAD, and PT_INTERP when given).
fn elf64(machine: u16, little: bool, interp: Option<&str>) -> Vec<u8> {
    let phnum: u16 = if interp.is_some() { 2 } else { 1 };
    let mut w = Writer::elf(2, little);
    w.u16(2); // e_type EXEC
    w.u16(machine);
    w.u32(1);
    w.u64(0x400000); // e_entry
    w.u64(64); // e_phoff
    w.u64(0); // e_shoff
    w.u32(0); // e_flags
    w.u16(64); // e_ehsize
    w.u16(56); // e_phentsize
    w.u16(phnum);
    w.u16(64);
    w.u16(0);
    w.u16(0);
    assert_eq!(w.bytes.len(), 64);
    let interp_off = 64 + 56 * u64::from(phnum);
    if let Some(i) = interp {
        w.u32(PT_INTERP);
        w.u32(4);
        w.u64(interp_off);
        w.u64(0);
        w.u64(0);
        w.u64(i.len() as u64 + 1);
        w.u64(i.len() as u64 + 1);
        w.u64(1);
    }
    w.u32(1); // PT_LOAD
    w.u32(5);
    w.bytes.extend([0u8; 48]);
    if let Some(i) = interp {
        w.bytes.extend(i.as_bytes());
        w.bytes.push(0);
    }
    w.bytes.extend([0xcc; 32]);
    w.bytes
}

/// A 52-byte ELF32 header plus one PT_LOAD.
fn elf32(machine: u16, little: bool) -> Vec<u8> {
    let mut w = Writer::elf(1, little);
    w.u16(2);
    w.u16(machine);
    w.u32(1);
    w.u32(0x8000); // e_entry
    w.u32(52); // e_phoff
    w.u32(0);
    w.u32(0);
    w.u16(52);
    w.u16(32);
    w.u16(1);
    w.u16(40);
    w.u16(0);
    w.u16(0);
    assert_eq!(w.bytes.len(), 52);
    w.u32(1);
    w.bytes.extend([0u8; 28]);
    w.bytes
}

enum E<'a> {
    File(&'a str, u32, &'a [u8]),
    Dir(&'a str),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
}

/// Builds a tar with raw names (so `..` and leading `/` can be written).
fn tar_bytes(entries: &[E]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, link, kind, mode, data): (&str, Option<&str>, tar::EntryType, u32, &[u8]) =
            match e {
                E::File(n, m, d) => (n, None, tar::EntryType::Regular, *m, d),
                E::Dir(n) => (n, None, tar::EntryType::Directory, 0o755, &[]),
                E::Sym(n, t) => (n, Some(t), tar::EntryType::Symlink, 0o777, &[]),
                E::Hard(n, t) => (n, Some(t), tar::EntryType::Link, 0o755, &[]),
            };
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_cksum();
        builder.append(&h, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn layer(entries: &[E]) -> Box<dyn Read + Send> {
    Box::new(Cursor::new(tar_bytes(entries)))
}

fn config(entrypoint: &[&str], cmd: &[&str]) -> Vec<u8> {
    serde_json::json!({
        "architecture": "arm64", "os": "linux",
        "config": { "Entrypoint": entrypoint, "Cmd": cmd,
                     "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] }
    })
    .to_string()
    .into_bytes()
}

fn run(cfg: &[u8], layers: Vec<Box<dyn Read + Send>>, platform: &str) -> DeepReport {
    inspect(cfg, layers, &p(platform)).expect("within the limits")
}

#[test]
fn x86_binary_under_arm64_is_a_mismatch_naming_both() {
    let bin = elf64(EM_X86_64, true, None);
    let r = run(
        &config(&["/bin/busybox"], &[]),
        vec![layer(&[
            E::Dir("bin/"),
            E::File("bin/busybox", 0o755, &bin),
        ])],
        "linux/arm64",
    );
    assert_eq!(
        r.finding,
        Finding::BinaryMismatch {
            found: "x86-64 (EM_X86_64, 64-bit LSB)".into()
        }
    );
    assert_eq!(
        r.detail,
        "/bin/busybox is x86-64 but the entry is linux/arm64 (expects AArch64)"
    );
    assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
}

#[test]
fn matching_arm64_static_binary() {
    let bin = elf64(EM_AARCH64, true, None);
    let r = run(
        &config(&["/app"], &["--serve"]),
        vec![layer(&[E::File("./app", 0o755, &bin)])],
        "linux/arm64/v8",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert!(r.detail.contains("static"), "{}", r.detail);
}

#[test]
fn path_lookup_and_symlink_chains() {
    let bin = elf64(EM_AARCH64, true, None);
    let l = layer(&[
        E::Dir("bin/"),
        E::File("bin/busybox", 0o755, &bin),
        E::Sym("bin/sh", "busybox"),
        E::Dir("usr/"),
        E::Dir("usr/bin/"),
        E::Sym("usr/bin/sh", "/bin/sh"),
        E::Sym("usr/bin/ash", "../../../../bin/sh"),
    ]);
    // Cmd only, no slash: PATH is /usr/local/bin:/usr/bin:/bin, so /usr/bin/sh is found.
    let r = run(&config(&[], &["sh", "-c", "echo"]), vec![l], "linux/arm64");
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
    assert!(r.detail.starts_with("sh -> /bin/busybox"), "{}", r.detail);

    let l = layer(&[
        E::File("bin/busybox", 0o755, &bin),
        E::Sym("bin/sh", "busybox"),
        E::Sym("usr/bin/ash", "../../../../bin/sh"),
    ]);
    let r = run(&config(&["/usr/bin/ash"], &[]), vec![l], "linux/arm64");
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(r.executable.as_deref(), Some("/bin/busybox"));
}

#[test]
fn default_path_and_working_dir() {
    let bin = elf64(EM_X86_64, true, None);
    let cfg = serde_json::json!({"config": {"Cmd": ["tool"], "WorkingDir": "/srv"}}).to_string();
    let r = run(
        cfg.as_bytes(),
        vec![layer(&[E::File("usr/sbin/tool", 0o755, &bin)])],
        "linux/amd64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    let cfg = serde_json::json!({"config": {"Cmd": ["./run"], "WorkingDir": "/srv"}}).to_string();
    let r = run(
        cfg.as_bytes(),
        vec![layer(&[E::File("srv/run", 0o755, &bin)])],
        "linux/amd64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(r.executable.as_deref(), Some("/srv/run"));
}

#[test]
fn whiteout_in_later_layer_removes_the_binary() {
    let bin = elf64(EM_AARCH64, true, None);
    let r = run(
        &config(&["/bin/app"], &[]),
        vec![
            layer(&[E::Dir("bin/"), E::File("bin/app", 0o755, &bin)]),
            layer(&[E::File("bin/.wh.app", 0o644, b"")]),
        ],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
    assert!(r.detail.contains("/bin/app"), "{}", r.detail);
}

#[test]
fn opaque_dir_hides_lower_contents_but_not_its_own_layer() {
    let arm = elf64(EM_AARCH64, true, None);
    let x86 = elf64(EM_X86_64, true, None);
    let layers = || {
        vec![
            layer(&[
                E::File("opt/app/old", 0o755, &arm),
                E::File("opt/app/run", 0o755, &x86),
            ]),
            layer(&[
                E::Dir("opt/app/"),
                E::File("opt/app/.wh..wh..opq", 0o644, b""),
                E::File("opt/app/run", 0o755, &arm),
            ]),
        ]
    };
    let r = run(&config(&["/opt/app/run"], &[]), layers(), "linux/arm64");
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    let r = run(&config(&["/opt/app/old"], &[]), layers(), "linux/arm64");
    assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
}

#[test]
fn scripts_and_their_interpreters() {
    let bin = elf64(EM_AARCH64, true, None);
    let script: &[u8] = b"#!/bin/sh -e\necho hi\n";
    let r = run(
        &config(&["/entry.sh"], &[]),
        vec![layer(&[
            E::File("entry.sh", 0o755, script),
            E::File("bin/busybox", 0o755, &bin),
            E::Sym("bin/sh", "busybox"),
        ])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(r.executable.as_deref(), Some("/entry.sh"));
    assert!(r.detail.contains("#!/bin/sh"), "{}", r.detail);

    let r = run(
        &config(&["/entry.sh"], &[]),
        vec![layer(&[E::File("entry.sh", 0o755, script)])],
        "linux/arm64",
    );
    assert_eq!(
        r.finding,
        Finding::InterpreterMissing {
            interpreter: "/bin/sh".into()
        }
    );

    // A script whose interpreter is for the wrong machine.
    let x86 = elf64(EM_X86_64, true, None);
    let r = run(
        &config(&["/entry.sh"], &[]),
        vec![layer(&[
            E::File("entry.sh", 0o755, script),
            E::File("bin/sh", 0o755, &x86),
        ])],
        "linux/arm64",
    );
    assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");

    // #!/usr/bin/env python3, python3 missing.
    let r = run(
        &config(&["/entry.py"], &[]),
        vec![layer(&[
            E::File("entry.py", 0o755, b"#!/usr/bin/env python3\n"),
            E::File("usr/bin/env", 0o755, &bin),
        ])],
        "linux/arm64",
    );
    assert_eq!(
        r.finding,
        Finding::InterpreterMissing {
            interpreter: "python3".into()
        },
        "{}",
        r.detail
    );
}

#[test]
fn dotdot_entries_are_ignored() {
    let bin = elf64(EM_AARCH64, true, None);
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[
            E::File("../app", 0o755, &bin),
            E::File("x/../../app", 0o755, &bin),
            E::File("/../app", 0o755, &bin),
        ])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
    // A symlink pointing out of the root is clamped to the root.
    let r = run(
        &config(&["/bin/app"], &[]),
        vec![layer(&[
            E::File("/app", 0o755, &bin),
            E::Sym("bin/app", "../../../../app"),
        ])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(r.executable.as_deref(), Some("/app"));
}

#[test]
fn symlink_loop_is_a_clean_result() {
    let r = run(
        &config(&["/bin/a"], &[]),
        vec![layer(&[E::Sym("bin/a", "b"), E::Sym("bin/b", "/bin/a")])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::MissingEntrypoint);
    assert!(r.detail.contains("symbolic links"), "{}", r.detail);
    let r = run(
        &config(&[], &["a"]),
        vec![layer(&[E::Sym("bin/a", "a")])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::MissingEntrypoint);
}

#[test]
fn hardlinks_share_content_even_after_the_target_is_deleted() {
    let bin = elf64(EM_X86_64, true, None);
    let r = run(
        &config(&["/usr/bin/app"], &[]),
        vec![
            layer(&[
                E::File("bin/app", 0o755, &bin),
                E::Hard("usr/bin/app", "bin/app"),
            ]),
            layer(&[E::File("bin/.wh.app", 0, b"")]),
        ],
        "linux/arm64",
    );
    assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
}

#[test]
fn garbage_never_panics() {
    let inputs: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 10_000],
        b"not a tar at all".to_vec(),
        vec![0x1f, 0x8b, 0, 1, 2, 3],
        vec![0x28, 0xb5, 0x2f, 0xfd, 0],
        {
            let mut t = tar_bytes(&[E::File("bin/app", 0o755, &[1; 3000])]);
            t.truncate(1200);
            t
        },
    ];
    for input in inputs {
        let r = inspect(
            &config(&["/bin/app"], &[]),
            vec![Box::new(Cursor::new(input))],
            &p("linux/arm64"),
        )
        .expect("garbage is no limit");
        assert!(
            matches!(r.finding, Finding::Unreadable | Finding::MissingEntrypoint),
            "{r:?}"
        );
    }
    // Garbage config, and configs without a command.
    assert_eq!(
        run(b"{{{", vec![], "linux/arm64").finding,
        Finding::Unreadable
    );
    assert_eq!(
        run(b"{}", vec![], "linux/arm64").finding,
        Finding::NoEntrypoint
    );
    assert_eq!(
        run(
            br#"{"config":{"Entrypoint":null,"Cmd":[]}}"#,
            vec![],
            "linux/arm64"
        )
        .finding,
        Finding::NoEntrypoint
    );
    // Truncated and hostile ELF headers.
    let full = elf64(EM_AARCH64, true, Some("/lib/ld.so"));
    for n in 0..full.len() {
        let _ = elf_machine(&full[..n]);
    }
    let mut hostile = full.clone();
    hostile[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(elf_machine(&hostile).unwrap().linkage, None);
    let r = run(
        &config(&["/x"], &[]),
        vec![layer(&[E::File("x", 0o755, b"\x7fELF\x02")])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::Unreadable, "{}", r.detail);
}

#[test]
fn gzip_layers_are_detected() {
    use std::io::Write;
    let bin = elf64(EM_AARCH64, true, None);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_bytes(&[E::File("app", 0o755, &bin)]))
        .unwrap();
    let r = run(
        &config(&["/app"], &[]),
        vec![Box::new(Cursor::new(gz.finish().unwrap()))],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
}

#[test]
fn elf32_big_endian_s390_versus_s390x() {
    let id = elf_machine(&elf32(EM_S390, false)).unwrap();
    assert_eq!(
        (id.class, id.endian, id.machine),
        (ElfClass::Elf32, Endian::Big, EM_S390)
    );
    assert_eq!(id.linkage, Some(Linkage::Static));
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File("app", 0o755, &elf32(EM_S390, false))])],
        "linux/s390x",
    );
    assert_eq!(
        r.finding,
        Finding::BinaryMismatch {
            found: "IBM S/390 (EM_S390, 32-bit MSB)".into()
        }
    );
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File(
            "app",
            0o755,
            &elf64(EM_S390, false, None),
        )])],
        "linux/s390x",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    // ppc64le vs big-endian ppc64.
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File(
            "app",
            0o755,
            &elf64(EM_PPC64, false, None),
        )])],
        "linux/ppc64le",
    );
    assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
    // arm/v7 expects ELF32 EM_ARM.
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File("app", 0o755, &elf32(EM_ARM, true))])],
        "linux/arm/v7",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
}

#[test]
fn static_versus_dynamic() {
    let id = elf_machine(&elf64(EM_X86_64, true, Some("/lib64/ld-linux-x86-64.so.2"))).unwrap();
    assert_eq!(
        id.linkage,
        Some(Linkage::Dynamic {
            interpreter: Some("/lib64/ld-linux-x86-64.so.2".into())
        })
    );
    assert_eq!(
        elf_machine(&elf64(EM_X86_64, true, None)).unwrap().linkage,
        Some(Linkage::Static)
    );
    // Program headers beyond the prefix: linkage unknown.
    assert_eq!(
        elf_machine(&elf64(EM_X86_64, true, None)[..64])
            .unwrap()
            .linkage,
        None
    );

    let app = elf64(EM_AARCH64, true, Some("/lib/ld-linux-aarch64.so.1"));
    let loader = elf64(EM_AARCH64, true, None);
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[
            E::File("app", 0o755, &app),
            E::File("lib/ld-linux-aarch64.so.1", 0o755, &loader),
        ])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert!(r.detail.contains("dynamic"), "{}", r.detail);
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File("app", 0o755, &app)])],
        "linux/arm64",
    );
    assert_eq!(
        r.finding,
        Finding::InterpreterMissing {
            interpreter: "/lib/ld-linux-aarch64.so.1".into()
        }
    );
    assert!(r.detail.contains("missing from the image"), "{}", r.detail);
}

#[test]
fn not_elf_and_unknown_platforms() {
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File("app", 0o755, b"MZ\x90\x00")])],
        "linux/arm64",
    );
    assert_eq!(r.finding, Finding::NotElf);
    let r = run(
        &config(&["/app"], &[]),
        vec![layer(&[E::File(
            "app",
            0o755,
            &elf64(EM_X86_64, true, None),
        )])],
        "windows/amd64",
    );
    assert_eq!(r.finding, Finding::Unreadable, "{}", r.detail);
    assert_eq!(
        expected_machine(&p("linux/riscv64")),
        Some((EM_RISCV, ElfClass::Elf64, Endian::Little))
    );
}

/// The remote path: small chunks through bounded channels, layers with trailing
/// padding after the tar end marker (as real tars have), fed strictly in order.
#[test]
fn channel_streaming_does_not_deadlock_on_trailing_padding() {
    use std::io::Write;
    let x86 = elf64(EM_X86_64, true, None);
    let arm = elf64(EM_AARCH64, true, None);
    let mut first = tar_bytes(&[E::File("bin/app", 0o755, &x86)]);
    first.extend(vec![0u8; 20 * 1024]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut second = tar_bytes(&[E::File("bin/app", 0o755, &arm)]);
    second.extend(vec![0u8; 20 * 1024]);
    gz.write_all(&second).unwrap();
    let blobs = [first, gz.finish().unwrap()];
    let mut senders = Vec::new();
    let mut readers: Vec<Box<dyn Read + Send>> = Vec::new();
    for _ in &blobs {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        senders.push(tx);
        readers.push(Box::new(ChannelReader::new(rx)));
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = inspect(&config(&["/bin/app"], &[]), readers, &p("linux/arm64")).unwrap();
        let _ = done_tx.send(r);
    });
    for (blob, tx) in blobs.iter().zip(senders) {
        for chunk in blob.chunks(512) {
            tx.blocking_send(Ok(bytes::Bytes::copy_from_slice(chunk)))
                .expect("the inspector reads every layer to its end");
        }
    }
    let r = done_rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("no deadlock");
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
}

#[test]
fn retention_cap_is_reported_only_when_it_matters() {
    let mut bin = elf64(EM_AARCH64, true, None);
    bin.resize(5000, 0);
    let layers = || {
        vec![layer(&[
            E::File("a", 0o755, &bin),
            E::File("b", 0o755, &bin),
        ])]
    };
    let limits = Limits {
        retained: 4096 + 100,
        ..LIMITS
    };
    let r = within(&["/a"], layers(), limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    let r = within(&["/b"], layers(), limits).unwrap();
    assert_eq!(r.finding, Finding::Unreadable);
    assert!(r.detail.contains("4196 bytes"), "{}", r.detail);
    assert_eq!(text::size(LIMITS.retained), "32 MiB");
}

fn within(
    entrypoint: &[&str],
    layers: Vec<Box<dyn Read + Send>>,
    limits: Limits,
) -> Result<DeepReport, LayerRefused> {
    inspect_within(&config(entrypoint, &[]), layers, &p("linux/arm64"), limits)
}

/// A tar written by the tar crate's builder: long names and link targets become GNU
/// long name (`L`) and long link (`K`) entries.
fn gnu_tar(add: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    add(&mut builder);
    builder.into_inner().unwrap()
}

fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o755);
    h.set_size(data.len() as u64);
    builder.append_data(&mut h, path, data).unwrap();
}

fn link(builder: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(0);
    builder.append_link(&mut h, path, target).unwrap();
}

/// A reader that counts what is read of it: the layer is not read much past a limit.
struct Counted {
    inner: Cursor<Vec<u8>>,
    read: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

fn counted(
    bytes: Vec<u8>,
) -> (
    Box<dyn Read + Send>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let read = std::sync::Arc::default();
    let reader = Counted {
        inner: Cursor::new(bytes),
        read: std::sync::Arc::clone(&read),
    };
    (Box::new(reader), read)
}

fn refused(layer: usize, limit: LayerLimit) -> Result<DeepReport, LayerRefused> {
    Err(LayerRefused { layer, limit })
}

#[test]
fn names_up_to_path_max_are_read_and_longer_ones_refused() {
    let bin = elf64(EM_AARCH64, true, None);
    // "/" + name is the path the config names: the name is MAX_NAME bytes, then one more.
    for len in [MAX_NAME, MAX_NAME + 1] {
        let name = format!("{}/app", "d".repeat(len - 4));
        let tar = gnu_tar(|b| file(b, &name, &bin));
        let r = within(
            &[&format!("/{name}")],
            vec![Box::new(Cursor::new(tar))],
            LIMITS,
        );
        if len == MAX_NAME {
            assert_eq!(r.unwrap().finding, Finding::Match);
        } else {
            assert_eq!(r, refused(1, LayerLimit::Name { limit: MAX_NAME }));
        }
    }
    let error = refused(2, LayerLimit::Name { limit: MAX_NAME }).unwrap_err();
    assert_eq!(
        error.to_string(),
        "layer 2 has an entry name longer than 4096 bytes (PATH_MAX); --deep reads no further"
    );
}

#[test]
fn long_link_targets_are_refused_past_path_max() {
    let target = format!("/{}", "t".repeat(MAX_NAME));
    for kind in [tar::EntryType::Symlink, tar::EntryType::Link] {
        let tar = gnu_tar(|b| link(b, kind, "app", &target));
        assert_eq!(
            within(&["/app"], vec![Box::new(Cursor::new(tar))], LIMITS),
            refused(1, LayerLimit::LinkTarget { limit: MAX_NAME })
        );
    }
    // Up to the limit, a symlink is followed as before.
    let tar = gnu_tar(|b| link(b, tar::EntryType::Symlink, "app", &target[..MAX_NAME]));
    let r = within(&["/app"], vec![Box::new(Cursor::new(tar))], LIMITS).unwrap();
    assert_eq!(r.finding, Finding::MissingEntrypoint, "{}", r.detail);
}

#[test]
fn pax_paths_past_path_max_and_headers_past_their_limit_are_refused() {
    let bin = elf64(EM_AARCH64, true, None);
    let pax = |records: &[(&str, &[u8])]| {
        gnu_tar(|b| {
            b.append_pax_extensions(records.iter().copied()).unwrap();
            file(b, "app", &bin);
        })
    };
    let long = vec![b'p'; MAX_NAME + 1];
    assert_eq!(
        within(
            &["/app"],
            vec![Box::new(Cursor::new(pax(&[("path", &long)])))],
            LIMITS
        ),
        refused(1, LayerLimit::Name { limit: MAX_NAME })
    );
    // A PAX header past the limit is not read whole: what is read stops near the limit.
    let limits = Limits {
        entry_headers: 64 << 10,
        ..LIMITS
    };
    let xattr = vec![b'x'; 1 << 20];
    let (layer, read) = counted(pax(&[("SCHILY.xattr.user.big", &xattr)]));
    assert_eq!(
        within(&["/app"], vec![layer], limits),
        refused(1, LayerLimit::EntryHeaders { limit: 64 << 10 })
    );
    assert!(read.load(std::sync::atomic::Ordering::Relaxed) < 256 << 10);
    // Under it, the entry is read as before.
    let small = pax(&[("SCHILY.xattr.user.small", &xattr[..1000])]);
    let r = within(&["/app"], vec![Box::new(Cursor::new(small))], limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
}

#[test]
fn a_gnu_long_name_past_the_header_limit_is_not_read_whole() {
    let name = "n".repeat(3 << 20);
    let (layer, read) = counted(gnu_tar(|b| file(b, &name, b"")));
    assert_eq!(
        within(&["/app"], vec![layer], LIMITS),
        refused(1, LayerLimit::EntryHeaders { limit: 1 << 20 })
    );
    assert!(read.load(std::sync::atomic::Ordering::Relaxed) < 2 << 20);
}

#[test]
fn file_data_skipped_is_no_header() {
    let bin = elf64(EM_AARCH64, true, None);
    let big = vec![7u8; 1 << 20];
    let tar = gnu_tar(|b| {
        for name in ["a", "b", "c"] {
            file(b, name, &big);
        }
        file(b, "app", &bin);
    });
    let limits = Limits {
        entry_headers: 8 << 10,
        ..LIMITS
    };
    let r = within(&["/app"], vec![Box::new(Cursor::new(tar))], limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
}

#[test]
fn paths_and_their_bytes_past_the_index_budget_are_refused() {
    let bin = elf64(EM_AARCH64, true, None);
    let many = |n: usize| {
        gnu_tar(|b| {
            for i in 0..n {
                file(b, &format!("f{i:03}"), b"");
            }
            file(b, "app", &bin);
        })
    };
    let limits = Limits {
        paths: 101,
        ..LIMITS
    };
    let r = within(&["/app"], vec![Box::new(Cursor::new(many(100)))], limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    assert_eq!(
        within(&["/app"], vec![Box::new(Cursor::new(many(101)))], limits),
        refused(1, LayerLimit::Paths { limit: 101 })
    );
    // The budget is the whole index's: a second layer adds to the first's paths; what it
    // replaces or removes is counted once.
    let second = gnu_tar(|b| file(b, "f000", b""));
    let layers: Vec<Box<dyn Read + Send>> = vec![
        Box::new(Cursor::new(many(100))),
        Box::new(Cursor::new(second)),
    ];
    assert!(within(&["/app"], layers, limits).is_ok());
    let layers: Vec<Box<dyn Read + Send>> = vec![
        Box::new(Cursor::new(many(100))),
        Box::new(Cursor::new(many(0))),
        Box::new(Cursor::new(gnu_tar(|b| file(b, "new", b"")))),
    ];
    assert_eq!(
        within(&["/app"], layers, limits),
        refused(3, LayerLimit::Paths { limit: 101 })
    );
    // Names and symlink targets: 100 × 4 bytes, "app" and its target.
    let limits = Limits {
        name_bytes: 100 * 4 + 3,
        ..LIMITS
    };
    let r = within(&["/app"], vec![Box::new(Cursor::new(many(100)))], limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    let with_link = gnu_tar(|b| link(b, tar::EntryType::Symlink, "f000", "x"));
    let layers: Vec<Box<dyn Read + Send>> = vec![
        Box::new(Cursor::new(many(100))),
        Box::new(Cursor::new(with_link)),
    ];
    assert_eq!(
        within(&["/app"], layers, limits),
        refused(2, LayerLimit::NameBytes { limit: 403 })
    );
}

#[test]
fn hard_links_count_against_the_retention_cap() {
    let bin = elf64(EM_AARCH64, true, None);
    let tar = gnu_tar(|b| {
        file(b, "app", &bin);
        for i in 0..4 {
            link(b, tar::EntryType::Link, &format!("l{i}"), "app");
        }
    });
    let limits = Limits {
        retained: bin.len() * 3,
        ..LIMITS
    };
    let layers = || -> Vec<Box<dyn Read + Send>> { vec![Box::new(Cursor::new(tar.clone()))] };
    let r = within(&["/l1"], layers(), limits).unwrap();
    assert_eq!(r.finding, Finding::Match, "{}", r.detail);
    let r = within(&["/l2"], layers(), limits).unwrap();
    assert_eq!(r.finding, Finding::Unreadable, "{}", r.detail);
}

#[test]
fn real_busybox_fixtures_when_present() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/busybox");
    for (arch, machine) in [("amd64", EM_X86_64), ("arm64", EM_AARCH64)] {
        let path = dir.join(arch).join("busybox");
        let Ok(file) = std::fs::File::open(&path) else {
            eprintln!("skipping: {} is absent", path.display());
            continue;
        };
        let mut head = Vec::new();
        file.take(4096).read_to_end(&mut head).unwrap();
        let id = elf_machine(&head).unwrap();
        assert_eq!(id.machine, machine);
        assert_eq!(id.linkage, Some(Linkage::Static), "Debian's busybox-static");
        let data = std::fs::read(&path).unwrap();
        let other = if arch == "amd64" {
            "linux/arm64"
        } else {
            "linux/amd64"
        };
        let r = run(
            &config(&["/bin/busybox"], &[]),
            vec![layer(&[E::File("bin/busybox", 0o755, &data)])],
            other,
        );
        assert!(matches!(r.finding, Finding::BinaryMismatch { .. }), "{r:?}");
    }
}

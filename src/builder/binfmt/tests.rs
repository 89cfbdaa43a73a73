use super::programs::installer_exit_meaning;
use super::*;

fn p(s: &str) -> Platform {
    s.parse().unwrap()
}

const ALL: &[&str] = &[
    "linux/amd64",
    "linux/arm64",
    "linux/arm/v7",
    "linux/arm/v6",
    "linux/386",
    "linux/ppc64le",
    "linux/s390x",
    "linux/riscv64",
];

#[test]
fn installer_is_an_x86_64_executable() {
    let line = AARCH64.register_line(&AARCH64.interpreter());
    assert_eq!(
        line,
        format!(
            ":qemu-aarch64:M::{}:{}:/usr/bin/qemu-aarch64-static:POCF",
            AARCH64.magic, AARCH64.mask
        )
    );
    let elf = installer_elf(&[line.clone(), ARM.register_line(&ARM.interpreter())]);
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 62);
    let text = String::from_utf8_lossy(&elf);
    assert!(text.contains(&line));
    assert!(text.contains("/proc/sys/fs/binfmt_misc/register"));
    assert!(installer_exit_meaning(129).contains("EPERM"));
}

#[test]
fn probe_headers() {
    for (plat, class, data, machine, flags) in [
        ("linux/amd64", 2u8, 1u8, 62u16, 0u32),
        ("linux/386", 1, 1, 3, 0),
        ("linux/arm64", 2, 1, 183, 0),
        ("linux/arm/v7", 1, 1, 40, 0x0500_0000),
        ("linux/arm/v6", 1, 1, 40, 0x0500_0000),
        ("linux/ppc64le", 2, 1, 21, 2),
        ("linux/s390x", 2, 2, 22, 0),
        ("linux/riscv64", 2, 1, 243, 0),
    ] {
        let elf = probe_elf(&p(plat)).unwrap();
        assert!(elf.len() < 512, "{plat}: {} bytes", elf.len());
        assert_eq!(&elf[..4], b"\x7fELF", "{plat}");
        assert_eq!(elf[4], class, "{plat} class");
        assert_eq!(elf[5], data, "{plat} endianness");
        let be = data == 2;
        let u16at = |o: usize| {
            let b = [elf[o], elf[o + 1]];
            if be {
                u16::from_be_bytes(b)
            } else {
                u16::from_le_bytes(b)
            }
        };
        let u32at = |o: usize| {
            let b = [elf[o], elf[o + 1], elf[o + 2], elf[o + 3]];
            if be {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        assert_eq!(u16at(16), 2, "{plat} ET_EXEC");
        assert_eq!(u16at(18), machine, "{plat} e_machine");
        let flags_off = if class == 2 { 48 } else { 36 };
        assert_eq!(u32at(flags_off), flags, "{plat} e_flags");
        // Matches the binfmt_misc magic/mask it would be registered with.
        let info = arch_info(&p(plat)).unwrap();
        let magic = unescape(info.magic);
        let mask = unescape(info.mask);
        for i in 0..magic.len() {
            assert_eq!(elf[i] & mask[i], magic[i] & mask[i], "{plat} byte {i}");
        }
    }
    assert!(probe_elf(&p("linux/mips64le")).is_none());
    assert!(probe_elf(&p("windows/amd64")).is_none());
}

fn unescape(s: &str) -> Vec<u8> {
    s.split(r"\x")
        .filter(|h| !h.is_empty())
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect()
}

/// Runs each probe under the host's `qemu-*-static` directly: proves the machine code.
#[test]
fn probes_exit_42_under_qemu() {
    let dir = tempfile::tempdir().unwrap();
    for plat in ALL {
        let plat = p(plat);
        let info = arch_info(&plat).unwrap();
        let qemu = format!("/usr/bin/qemu-{}-static", info.qemu);
        if !std::path::Path::new(&qemu).exists() {
            eprintln!("skipping {plat}: no {qemu}");
            continue;
        }
        let file = dir.path().join(format!("probe-{}", info.qemu));
        std::fs::write(&file, probe_elf(&plat).unwrap()).unwrap();
        // qemu-user refuses files without execute permission.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut args = vec![];
        if plat.variant.as_deref() == Some("v6") {
            args = vec!["-cpu", "arm1176"];
        }
        let status = std::process::Command::new(&qemu)
            .args(&args)
            .arg(&file)
            .status()
            .unwrap();
        assert_eq!(
            status.code(),
            Some(PROBE_EXIT as i32),
            "{plat} under {qemu}"
        );
    }
}

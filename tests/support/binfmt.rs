//! The host's binfmt_misc, saved and restored: tests that register emulators take
//! [`BinfmtGuard`], which holds a file lock (one such test at a time on the machine) and
//! puts back exactly the entries it found on drop, also when the test panics.

use polyarch::builder::binfmt::BINFMT_MISC;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

const LOCK: &str = "/tmp/polyarch-binfmt-tests.lock";

pub fn mounted() -> bool {
    fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(BINFMT_MISC))
}

pub fn mount() {
    let st = Command::new("mount")
        .args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_MISC])
        .status()
        .expect("mount");
    assert!(st.success(), "cannot mount binfmt_misc");
}

/// name → content of each entry (without `register` and `status`).
pub fn entries() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(BINFMT_MISC).expect("read binfmt_misc") {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if name == "register" || name == "status" {
            continue;
        }
        if let Ok(content) = fs::read_to_string(e.path()) {
            out.insert(name, content);
        }
    }
    out
}

pub fn unregister(name: &str) {
    let path = Path::new(BINFMT_MISC).join(name);
    if let Err(e) = fs::write(&path, "-1") {
        eprintln!("binfmt guard: cannot unregister {name}: {e}");
    }
}

pub fn hex_to_escaped(hex: &str) -> String {
    hex.as_bytes()
        .chunks(2)
        .map(|c| format!("\\x{}", std::str::from_utf8(c).unwrap()))
        .collect()
}

/// The fields of an entry's content, as binfmt_misc lists them.
struct Entry<'c> {
    interpreter: &'c str,
    flags: &'c str,
    offset: &'c str,
    magic: String,
    mask: String,
    extension: Option<&'c str>,
}

impl<'c> Entry<'c> {
    fn read(content: &'c str) -> Entry<'c> {
        let mut entry = Entry {
            interpreter: "",
            flags: "",
            offset: "0",
            magic: String::new(),
            mask: String::new(),
            extension: None,
        };
        for line in content.lines() {
            if let Some(v) = line.strip_prefix("interpreter ") {
                entry.interpreter = v;
            } else if let Some(v) = line.strip_prefix("flags:") {
                entry.flags = v.trim();
            } else if let Some(v) = line.strip_prefix("offset ") {
                entry.offset = v;
            } else if let Some(v) = line.strip_prefix("magic ") {
                entry.magic = hex_to_escaped(v);
            } else if let Some(v) = line.strip_prefix("mask ") {
                entry.mask = hex_to_escaped(v);
            } else if let Some(v) = line.strip_prefix("extension .") {
                entry.extension = Some(v);
            }
        }
        entry
    }
}

/// Rebuilds the `register` line from an entry's content.
pub fn register_line(name: &str, content: &str) -> Option<String> {
    let Entry {
        interpreter,
        flags,
        offset,
        magic,
        mask,
        extension,
    } = Entry::read(content);
    match extension {
        Some(ext) => Some(format!(":{name}:E::{ext}::{interpreter}:{flags}")),
        None if !magic.is_empty() => Some(format!(
            ":{name}:M:{offset}:{magic}:{mask}:{interpreter}:{flags}"
        )),
        None => None,
    }
}

pub struct BinfmtGuard {
    _lock: fs::File,
    was_mounted: bool,
    saved: BTreeMap<String, String>,
}

impl BinfmtGuard {
    pub fn save() -> Self {
        let lock = fs::File::create(LOCK).expect("lock file");
        lock.lock().expect("lock");
        let was_mounted = mounted();
        if !was_mounted {
            mount();
        }
        let saved = entries();
        eprintln!(
            "binfmt guard: mounted={was_mounted}, entries={:?}",
            saved.keys().collect::<Vec<_>>()
        );
        BinfmtGuard {
            _lock: lock,
            was_mounted,
            saved,
        }
    }

    pub fn restore(&self) {
        if !mounted() {
            mount();
        }
        let now = entries();
        for (name, content) in &now {
            if self.saved.get(name) != Some(content) || pinned_here_again(content) {
                unregister(name);
            }
        }
        let now = entries();
        for (name, content) in &self.saved {
            if now.contains_key(name) {
                continue;
            }
            match register_line(name, content) {
                Some(line) => {
                    if let Err(e) = fs::write(Path::new(BINFMT_MISC).join("register"), &line) {
                        eprintln!("binfmt guard: cannot re-register {name} ({line}): {e}");
                    } else if content.starts_with("disabled") {
                        let _ = fs::write(Path::new(BINFMT_MISC).join(name), "0");
                    }
                }
                None => eprintln!("binfmt guard: cannot rebuild {name}: {content}"),
            }
        }
        let after = entries();
        if after.keys().ne(self.saved.keys()) {
            eprintln!(
                "binfmt guard: restored set differs: {:?} vs saved {:?}",
                after.keys().collect::<Vec<_>>(),
                self.saved.keys().collect::<Vec<_>>()
            );
        }
        if !self.was_mounted {
            let _ = Command::new("umount").arg(BINFMT_MISC).status();
        }
    }
}

/// Whether an entry is put back from this host even though its text is as saved: one with
/// flag F pins the interpreter file it was registered with, and a run during the test may
/// have registered it again from inside polyarch's installer container, the same text
/// pinning a file in that image's layers. Removing the image (as tests/binfmt.rs does)
/// then breaks it: on Docker 20.10's fuse-overlayfs every later exec fails with "no
/// such file or directory". Only when the interpreter is on this host to pin instead.
fn pinned_here_again(content: &str) -> bool {
    let entry = Entry::read(content);
    entry.flags.contains('F') && Path::new(entry.interpreter).exists()
}

impl Drop for BinfmtGuard {
    fn drop(&mut self) {
        self.restore();
        eprintln!("binfmt guard: restored; mounted={}", mounted());
    }
}

/// Registers Debian's static qemu-aarch64 with the `F` flag (the kernel opens it now, so
/// it runs inside any container), in place of any entry of that name (one left by
/// another tool may point at an interpreter that is gone). Call with a guard held.
pub fn register_qemu_aarch64(_guard: &BinfmtGuard) {
    if entries().contains_key("qemu-aarch64") {
        unregister("qemu-aarch64");
    }
    let line = ":qemu-aarch64:M::\\x7f\\x45\\x4c\\x46\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:/usr/bin/qemu-aarch64-static:F";
    fs::write(Path::new(BINFMT_MISC).join("register"), line).expect("register qemu-aarch64");
}

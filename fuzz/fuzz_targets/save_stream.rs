//! The `docker save` stream reader (both layouts: legacy manifest.json and OCI index),
//! fed arbitrary bytes. Layers are spooled into a fresh temp dir per input.
//! The first byte picks the platform filter (none / linux/amd64 / linux/arm64).
#![no_main]
use libfuzzer_sys::fuzz_target;
use polyarch::Platform;

fuzz_target!(|data: &[u8]| {
    let (platform, stream) = match data.split_first() {
        Some((b, rest)) => (
            match b % 3 {
                0 => None,
                1 => Some(Platform::new("linux", "amd64", None)),
                _ => Some(Platform::new("linux", "arm64", None)),
            },
            rest,
        ),
        None => (None, data),
    };
    let spool = tempfile::Builder::new()
        .prefix("polyarch-fuzz-")
        .tempdir_in(std::env::var_os("FUZZ_SPOOL").unwrap_or_else(|| std::env::temp_dir().into()))
        .expect("spool dir");
    let _ = polyarch::builder::export::read_save_stream(
        stream,
        spool.path(),
        "fuzz",
        platform.as_ref(),
    );
});

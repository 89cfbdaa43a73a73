//! Registry responses: manifest/index bytes and image config bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = polyarch::base::oci::parse_manifest(data);
    if let Ok(p) = polyarch::base::oci::ConfigPlatform::from_config(data) {
        let _ = p.normalized();
    }
});

//! Dockerfiles and image references: the parsers that decide whether a build needs
//! emulation, what it reads (the warm-rerun inputs key) and where an image lives.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: HashMap<String, String> = [
        ("TARGETPLATFORM", "linux/arm64/v8"),
        ("TARGETARCH", "arm64"),
        ("BUILDPLATFORM", "linux/amd64"),
        ("VERSION", "1.2"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let _ = polyarch::base::dockerfile::needs_emulation(text, Some("build"));
    let _ = polyarch::base::dockerfile::external_images(text, &args);
    for line in text.lines().take(8) {
        if let Ok(reference) = polyarch::registry::parse_reference(line) {
            // What parses must print back to something that parses the same.
            let again = polyarch::registry::parse_reference(&reference.whole())
                .expect("a parsed reference prints as a valid one");
            assert_eq!(again.whole(), reference.whole());
        }
    }
});

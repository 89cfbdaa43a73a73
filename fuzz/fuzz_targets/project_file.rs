//! `Project::parse` on arbitrary UTF-8 must return Ok or Err, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|text: &str| {
    let options = polyarch::project::LoadOptions::default();
    let _ = polyarch::project::Project::parse(Path::new("polyarch.yaml"), text, &options);
});

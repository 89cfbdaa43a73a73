//! Deploy manifests (helm/kustomize output) and node lists / pool files.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|text: &str| {
    let _ = polyarch::k8s::parse_workloads(Path::new("deploy.yaml"), text);
    let _ = polyarch::k8s::parse_nodes(Path::new("nodes.json"), text);
});

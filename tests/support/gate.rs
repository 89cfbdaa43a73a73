//! What a deploy repository gives `polyarch gate`: Kubernetes manifests and the node
//! pools of its cluster.

use super::polyarch;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A Deployment `shop/{name}` of one container, `name`, running `image`. `pull_policy`:
/// its `imagePullPolicy`, none for Kubernetes' default (for a tag, gate warns of it);
/// `pod_spec`: more pod spec lines, indented six spaces (a nodeSelector, say).
pub fn deployment(name: &str, image: &str, pull_policy: Option<&str>, pod_spec: &str) -> String {
    let pull_policy = pull_policy
        .map(|policy| format!("        imagePullPolicy: {policy}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  template:\n    spec:\n{pod_spec}      containers:\n      - name: {name}\n        image: {image}\n{pull_policy}"
    )
}

/// A deploy checkout: `deploy.yaml`, the manifests, and `pools.yaml`, the node pools.
pub struct Deploy {
    pub manifests: PathBuf,
    pub pools: PathBuf,
}

impl Deploy {
    /// Writes `manifests` and one linux pool per (name, architecture, node count) in `dir`.
    pub fn write(dir: &Path, manifests: &str, pools: &[(&str, &str, u32)]) -> Deploy {
        let deploy = Deploy {
            manifests: dir.join("deploy.yaml"),
            pools: dir.join("pools.yaml"),
        };
        std::fs::write(&deploy.manifests, manifests).unwrap();
        let pools: String = pools
            .iter()
            .map(|(name, arch, count)| {
                format!("- {{name: {name}, labels: {{kubernetes.io/os: linux, kubernetes.io/arch: {arch}}}, count: {count}}}\n")
            })
            .collect();
        std::fs::write(&deploy.pools, format!("pools:\n{pools}")).unwrap();
        deploy
    }

    /// `polyarch gate --manifests deploy.yaml --nodes pools.yaml`, for more flags.
    pub fn gate(&self) -> Command {
        let mut command = polyarch();
        command
            .args(["gate", "--manifests"])
            .arg(&self.manifests)
            .arg("--nodes")
            .arg(&self.pools);
        command
    }
}

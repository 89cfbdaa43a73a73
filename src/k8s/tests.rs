use super::*;
use std::convert::Infallible;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/k8s")
        .join(name)
}

fn p(s: &str) -> Platform {
    s.parse().unwrap()
}

fn load_workloads(paths: &[PathBuf]) -> Result<Vec<Workload>> {
    let files = load_manifests(paths)?;
    Ok(files.into_iter().flat_map(|f| f.workloads).collect())
}

fn workloads(yaml: &str) -> Vec<Workload> {
    parse_workloads(Path::new("test.yaml"), yaml).unwrap()
}

fn one(pod_spec: &str) -> Workload {
    let indented: String = pod_spec.lines().map(|l| format!("      {l}\n")).collect();
    let yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\n\
             spec:\n  template:\n    spec:\n{indented}"
    );
    let mut w = workloads(&yaml);
    assert_eq!(w.len(), 1);
    w.remove(0)
}

const CONTAINERS: &str = "containers:\n- name: app\n  image: example/app:1\n";

fn pools(yaml: &str) -> Vec<NodePool> {
    parse_nodes(Path::new("pools.yaml"), yaml).unwrap()
}

fn two_pools() -> Vec<NodePool> {
    pools(
        "pools:\n\
             - {name: amd, labels: {kubernetes.io/arch: amd64}}\n\
             - {name: arm, labels: {kubernetes.io/arch: arm64}}\n",
    )
}

fn tainted_arm() -> Vec<NodePool> {
    pools(
        "pools:\n\
             - {name: amd, labels: {kubernetes.io/arch: amd64}}\n\
             - name: arm\n  labels: {kubernetes.io/arch: arm64}\n  \
               taints: [{key: dedicated, value: arm, effect: NoSchedule}]\n",
    )
}

fn names(pools: Vec<&NodePool>) -> Vec<&str> {
    pools.into_iter().map(|p| p.name.as_str()).collect()
}

fn amd64_only(_: &str) -> Result<ProvidedPlatforms, Infallible> {
    Ok(ProvidedPlatforms {
        digest: Some(format!("sha256:{}", "a".repeat(64)).parse().unwrap()),
        platforms: vec![p("linux/amd64"), p("unknown/unknown")],
    })
}

fn gate(w: &Workload, pools: &[NodePool]) -> GateRecord {
    evaluate(std::slice::from_ref(w), pools, &amd64_only)
}

/// Every image provides these platforms, and no digest.
fn providing(platforms: &[&str]) -> impl Fn(&str) -> Result<ProvidedPlatforms, Infallible> {
    let platforms: Vec<Platform> = platforms.iter().map(|s| p(s)).collect();
    move |_: &str| {
        Ok(ProvidedPlatforms {
            digest: None,
            platforms: platforms.clone(),
        })
    }
}

/// The node-affinity snippet the gate offers a container.
fn snippet(c: &ContainerGate) -> String {
    c.fixes.as_ref().unwrap().node_affinity.clone().unwrap()
}

/// Asserts each pool's name, platform and node count.
fn assert_pools(pools: &[NodePool], want: &[(&str, &str, u64)]) {
    let got: Vec<(&str, String, u64)> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.platform.to_string(), p.count))
        .collect();
    let want: Vec<(&str, String, u64)> = want
        .iter()
        .map(|&(name, platform, count)| (name, platform.to_string(), count))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn no_affinity_over_both_archs_with_amd64_image_is_a_gap_naming_the_arm_pool() {
    let w = one(CONTAINERS);
    let rec = gate(&w, &two_pools());
    assert!(!rec.covered);
    let c = &rec.workloads[0].containers[0];
    assert_eq!(c.pools, ["amd", "arm"]);
    assert_eq!(c.needed, ["linux/amd64", "linux/arm64"]);
    assert_eq!(c.provided, ["linux/amd64", "unknown/unknown"]);
    assert_eq!(c.missing, ["linux/arm64"]);
    assert_eq!(c.missing_pools, ["arm"]);
    assert_eq!(
        c.digest,
        Some(format!("sha256:{}", "a".repeat(64)).parse().unwrap())
    );
    let fixes = c.fixes.as_ref().unwrap();
    assert_eq!(
        fixes.polyarch_platforms,
        "platforms: [linux/amd64, linux/arm64]"
    );
    assert_eq!(fixes.node_affinity_path, "spec.template.spec");
    assert_eq!(
            fixes.node_affinity.as_deref().unwrap(),
            "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
             nodeSelectorTerms:\n      - matchExpressions:\n        - key: kubernetes.io/arch\n          \
             operator: In\n          values: [amd64]\n"
        );
}

#[test]
fn snippet_reads_back_and_makes_the_workload_covered() {
    let w = one(CONTAINERS);
    let rec = gate(&w, &two_pools());
    let snippet = snippet(&rec.workloads[0].containers[0]);
    let fixed = one(&format!("{CONTAINERS}{snippet}"));
    let rec = gate(&fixed, &two_pools());
    assert!(rec.covered, "{rec:?}");
}

#[test]
fn arch_node_selector_passes() {
    for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
        let w = one(&format!("nodeSelector: {{{key}: amd64}}\n{CONTAINERS}"));
        assert_eq!(names(schedulable_pools(&w, &two_pools())), ["amd"]);
        let rec = gate(&w, &two_pools());
        assert!(rec.covered, "{rec:?}");
        assert!(rec.workloads[0].containers[0].fixes.is_none());
    }
}

#[test]
fn tainted_arm_pool_without_toleration_passes() {
    let w = one(CONTAINERS);
    assert_eq!(names(schedulable_pools(&w, &tainted_arm())), ["amd"]);
    assert!(gate(&w, &tainted_arm()).covered);
}

#[test]
fn matching_toleration_makes_a_gap() {
    for tol in [
        "{key: dedicated, operator: Equal, value: arm, effect: NoSchedule}",
        "{key: dedicated, value: arm}",
        "{key: dedicated, operator: Exists}",
        "{operator: Exists}",
    ] {
        let w = one(&format!("tolerations: [{tol}]\n{CONTAINERS}"));
        let rec = gate(&w, &tainted_arm());
        assert!(!rec.covered, "{tol}");
        assert_eq!(rec.workloads[0].containers[0].missing_pools, ["arm"]);
    }
    for tol in [
        "{key: dedicated, value: x86}",
        "{key: dedicated, operator: Exists, effect: NoExecute}",
        "{key: other, operator: Exists}",
    ] {
        let w = one(&format!("tolerations: [{tol}]\n{CONTAINERS}"));
        assert!(gate(&w, &tainted_arm()).covered, "{tol}");
    }
}

#[test]
fn prefer_no_schedule_and_condition_taints_are_ignored() {
    let pools = pools(
        "pools:\n\
             - name: arm\n  labels: {kubernetes.io/arch: arm64}\n  taints:\n  \
             - {key: soft, effect: PreferNoSchedule}\n  \
             - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}\n",
    );
    let w = one(CONTAINERS);
    assert_eq!(names(schedulable_pools(&w, &pools)), ["arm"]);
}

#[test]
fn cordoned_and_condition_tainted_nodes_stay_reachable() {
    // A cordon or a not-ready node is lifted without a deploy: its arch still counts.
    let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "kind: List\nitems:\n\
             - metadata: {name: a, labels: {kubernetes.io/arch: arm64}}\n  spec:\n    \
               unschedulable: true\n    taints:\n    \
               - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}\n    \
               - {key: node.kubernetes.io/not-ready, effect: NoExecute}\n    \
               - {key: node.cloudprovider.kubernetes.io/uninitialized, value: \"true\", effect: NoSchedule}\n",
        )
        .unwrap();
    assert_eq!(names(schedulable_pools(&one(CONTAINERS), &pools)), ["a"]);
}

#[test]
fn containers_keep_their_place_and_pull_policy() {
    let ws = workloads(
            "kind: ConfigMap\n---\nkind: List\nitems:\n- kind: Pod\n  metadata: {name: p}\n  spec:\n    \
             initContainers: [{name: i, image: a}]\n    containers:\n    - {name: c0, image: b}\n    \
             - {name: c1, image: c, imagePullPolicy: Always}\n",
        );
    let w = &ws[0];
    assert_eq!((w.document, w.item), (2, Some(0)));
    let got: Vec<(&str, bool, usize, Option<&str>)> = w
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.init, c.index, c.pull_policy.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("c0", false, 0, None),
            ("c1", false, 1, Some("Always")),
            ("i", true, 0, None)
        ]
    );
    let err = parse_workloads(
            Path::new("test.yaml"),
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i, imagePullPolicy: Sometimes}]}\n",
        )
        .unwrap_err();
    assert!(matches!(err, K8sError::Usage(_)));
    assert!(
            err.to_string().starts_with(
                "test.yaml#1: spec.containers[0].imagePullPolicy: `Sometimes` is not one of Always, IfNotPresent, Never"
            ),
            "{err}"
        );
}

#[test]
fn no_execute_taint_needs_toleration() {
    let pools = pools(
        "pools:\n- name: arm\n  labels: {kubernetes.io/arch: arm64}\n  \
             taints: [{key: k, value: v, effect: NoExecute}]\n",
    );
    assert!(schedulable_pools(&one(CONTAINERS), &pools).is_empty());
    let w = one(&format!(
            "tolerations: [{{key: k, value: v, effect: NoExecute, tolerationSeconds: 30}}]\n{CONTAINERS}"
        ));
    assert_eq!(names(schedulable_pools(&w, &pools)), ["arm"]);
}

fn affinity(exprs: &str) -> String {
    format!(
        "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
             nodeSelectorTerms:\n{exprs}{CONTAINERS}"
    )
}

#[test]
fn not_in_arm64_affinity_passes() {
    let w = one(&affinity(
            "      - matchExpressions:\n        - {key: kubernetes.io/arch, operator: NotIn, values: [arm64]}\n",
        ));
    assert_eq!(names(schedulable_pools(&w, &two_pools())), ["amd"]);
    assert!(gate(&w, &two_pools()).covered);
}

#[test]
fn gt_lt_numeric() {
    let pools = pools(
        "pools:\n\
             - {name: small, labels: {kubernetes.io/arch: amd64, cpu: \"4\"}}\n\
             - {name: big, labels: {kubernetes.io/arch: arm64, cpu: \"64\"}}\n\
             - {name: odd, labels: {kubernetes.io/arch: arm64, cpu: lots}}\n",
    );
    // Numeric, not lexicographic: "64" > "8" and "64" > "10".
    for (operator, value, want) in [
        ("Gt", "8", "big"),
        ("Lt", "8", "small"),
        ("Lt", "10", "small"),
    ] {
        let w = one(&affinity(&format!(
            "      - matchExpressions: [{{key: cpu, operator: {operator}, values: [\"{value}\"]}}]\n"
        )));
        assert_eq!(
            names(schedulable_pools(&w, &pools)),
            [want],
            "{operator} {value}"
        );
    }
}

#[test]
fn several_terms_or_and_expressions_and() {
    let pools = pools(
        "pools:\n\
             - {name: a, labels: {kubernetes.io/arch: amd64, zone: x}}\n\
             - {name: b, labels: {kubernetes.io/arch: arm64, zone: y}}\n\
             - {name: c, labels: {kubernetes.io/arch: arm64, zone: x, gpu: \"true\"}}\n",
    );
    let or = one(&affinity(
        "      - matchExpressions: [{key: zone, operator: In, values: [y]}]\n\
             \x20     - matchExpressions: [{key: gpu, operator: Exists}]\n",
    ));
    assert_eq!(names(schedulable_pools(&or, &pools)), ["b", "c"]);
    let and = one(&affinity(
        "      - matchExpressions:\n        - {key: zone, operator: In, values: [x]}\n        \
             - {key: gpu, operator: DoesNotExist}\n",
    ));
    assert_eq!(names(schedulable_pools(&and, &pools)), ["a"]);
    // An empty term matches nothing; an empty term list matches nothing.
    let empty = one(&affinity("      - {}\n"));
    assert!(schedulable_pools(&empty, &pools).is_empty());
    let rec = gate(&empty, &pools);
    assert!(rec.covered);
    assert_eq!(rec.warnings.len(), 1);
    assert!(
        rec.warnings[0].contains("no node pool matches"),
        "{:?}",
        rec.warnings
    );
}

#[test]
fn snippet_merges_into_existing_terms() {
    let pools = pools(
        "pools:\n\
             - {name: a, labels: {kubernetes.io/arch: amd64, zone: x}}\n\
             - {name: b, labels: {kubernetes.io/arch: arm64, zone: x}}\n\
             - {name: c, labels: {kubernetes.io/arch: amd64, zone: \"1\"}}\n",
    );
    let w = one(&affinity(
        "      - matchExpressions: [{key: zone, operator: In, values: [x, \"1\"]}]\n",
    ));
    let rec = gate(&w, &pools);
    let snippet = snippet(&rec.workloads[0].containers[0]);
    assert!(
        snippet.contains("- key: zone\n          operator: In\n          values: [x, \"1\"]\n"),
        "{snippet}"
    );
    let fixed = one(&format!("{CONTAINERS}{snippet}"));
    assert_eq!(names(schedulable_pools(&fixed, &pools)), ["a", "c"]);
    assert!(gate(&fixed, &pools).covered);
}

#[test]
fn pod_snippet_uses_archs_every_image_has_and_none_when_nothing_remains() {
    let w = one("containers:\n- {name: a, image: amd}\n- {name: b, image: arm}\n");
    let (amd, arm) = (providing(&["linux/amd64"]), providing(&["linux/arm64/v8"]));
    let provided = |image: &str| {
        if image == "amd" {
            amd(image)
        } else {
            arm(image)
        }
    };
    let rec = evaluate(&[w], &two_pools(), &provided);
    let cs = &rec.workloads[0].containers;
    assert_eq!(cs[0].missing, ["linux/arm64"]);
    assert_eq!(cs[1].missing, ["linux/amd64"]);
    assert_eq!(cs[1].provided, ["linux/arm64"]);
    assert!(cs[0].fixes.as_ref().unwrap().node_affinity.is_none());
}

#[test]
fn arm64_v8_image_covers_arm64_pool() {
    let w = one(CONTAINERS);
    let provided = providing(&["linux/amd64", "linux/arm64/v8"]);
    assert!(evaluate(&[w], &two_pools(), &provided).covered);
}

#[test]
fn provided_is_called_once_per_image_and_errors_are_recorded_per_container() {
    let w = one("containers:\n- {name: a, image: same}\n- {name: b, image: same}\n");
    let calls = std::cell::Cell::new(0);
    let provided = |_: &str| {
        calls.set(calls.get() + 1);
        amd64_only("")
    };
    evaluate(std::slice::from_ref(&w), &two_pools(), &provided);
    assert_eq!(calls.get(), 1);

    // One unreadable image: its containers carry the error; the other is still judged.
    let w = one("containers:\n- {name: a, image: gone}\n- {name: b, image: there}\n");
    #[derive(Debug, thiserror::Error)]
    #[error("registry r.io: manifest unknown")]
    struct ManifestUnknown;
    let some_fail = |image: &str| match image {
        "gone" => Err(ManifestUnknown),
        _ => Ok(amd64_only(image).unwrap()),
    };
    let rec = evaluate(&[w], &two_pools(), &some_fail);
    assert!(!rec.covered);
    let (gone, there) = (
        &rec.workloads[0].containers[0],
        &rec.workloads[0].containers[1],
    );
    assert!(!gone.covered && gone.missing.is_empty() && gone.fixes.is_none());
    assert!(gone.error.as_deref().unwrap().contains("manifest unknown"));
    assert_eq!(there.missing, ["linux/arm64"]);
    assert!(there.error.is_none());
    // The unreadable image restricts nothing: the snippet keeps amd64 for `there`.
    let snippet = there.fixes.as_ref().unwrap().node_affinity.as_deref();
    assert!(snippet.unwrap().contains("values: [amd64]"));
}

#[test]
fn kubectl_nodes_fixture() {
    let pools = load_nodes(&fixture("nodes.json")).unwrap();
    assert_pools(
        &pools,
        &[
            ("arm-batch", "linux/arm64", 1),
            ("arm-pool", "linux/arm64", 1),
            ("default-pool", "linux/amd64", 2),
        ],
    );
    let default = &pools[2];
    // Common labels only: hostname and zone differ between the two nodes.
    assert_eq!(
        default.labels.get("cloud.google.com/gke-nodepool").unwrap(),
        "default-pool"
    );
    assert!(!default.labels.contains_key("kubernetes.io/hostname"));
    assert_eq!(default.nodes.len(), 2);
    assert_eq!(
        default.nodes[0].runtime.as_deref(),
        Some("containerd://1.7.13")
    );
    assert_eq!(pools[0].taints.len(), 2);

    let w = one(CONTAINERS);
    assert_eq!(
        names(schedulable_pools(&w, &pools)),
        ["arm-pool", "default-pool"]
    );
    let rec = gate(&w, &pools);
    assert_eq!(rec.workloads[0].containers[0].missing_pools, ["arm-pool"]);

    // Per-node labels still select: one zone-c node only.
    let zoned = one(&format!(
        "nodeSelector: {{topology.kubernetes.io/zone: europe-west1-c}}\n{CONTAINERS}"
    ));
    assert_eq!(names(schedulable_pools(&zoned, &pools)), ["default-pool"]);
    // matchFields on node names.
    let by_name = one(&affinity(
            "      - matchFields: [{key: metadata.name, operator: In, values: [gke-demo-arm-pool-5a6b7c8d-k2m4]}]\n",
        ));
    assert_eq!(names(schedulable_pools(&by_name, &pools)), ["arm-pool"]);
    assert!(gate(&by_name, &pools).warnings.is_empty());
}

#[test]
fn deploy_fixture_with_kubectl_nodes() {
    let ws = load_workloads(&[fixture("deploy.yaml")]).unwrap();
    let summary: Vec<(&str, String, &str)> = ws
        .iter()
        .map(|w| {
            (
                w.kind.as_str(),
                w.qualified_name(),
                w.source.rsplit('/').next().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("Deployment", "shop/web".to_string(), "deploy.yaml#1"),
            (
                "CronJob",
                "shop/nightly-report".to_string(),
                "deploy.yaml#4"
            ),
        ]
    );
    let web = &ws[0];
    let cs: Vec<(&str, &str, bool)> = web
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.image.as_str(), c.init))
        .collect();
    assert_eq!(
        cs,
        [
            ("web", "ghcr.io/example/shop-web:1.4.2", false),
            ("metrics", "docker.io/prom/statsd-exporter:v0.26.0", false),
            ("migrate", "ghcr.io/example/shop-migrate:1.4.2", true),
        ]
    );
    let cron = &ws[1];
    assert_eq!(cron.pod_spec_path, "spec.jobTemplate.spec.template.spec");
    assert_eq!(cron.tolerations.len(), 1);

    let pools = load_nodes(&fixture("nodes.json")).unwrap();
    let provided = |image: &str| -> Result<ProvidedPlatforms, Infallible> {
        if image.contains("statsd") {
            amd64_only(image)
        } else {
            Ok(ProvidedPlatforms {
                digest: Some(format!("sha256:{}", "b".repeat(64)).parse().unwrap()),
                platforms: vec![p("linux/amd64"), p("linux/arm64")],
            })
        }
    };
    let rec = evaluate(&ws, &pools, &provided);
    assert!(!rec.covered);
    let gaps: Vec<(&str, &str)> = rec
        .workloads
        .iter()
        .flat_map(|w| w.containers.iter().map(move |c| (w.name.as_str(), c)))
        .filter(|(_, c)| !c.covered)
        .map(|(w, c)| (w, c.container.as_str()))
        .collect();
    assert_eq!(gaps, [("web", "metrics")]);
    // The CronJob tolerates the tainted arm pool and selects arm64.
    assert_eq!(
        rec.workloads[1].containers[0].pools,
        ["arm-batch", "arm-pool"]
    );

    let json = serde_json::to_string_pretty(&rec).unwrap();
    assert!(json.contains("\"schema\": \"polyarch/gate/v1\""));
    assert!(json.contains("\"missing_pools\""));
    let back: GateRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back, rec);
}

#[test]
fn pool_file_fixture_adds_beta_aliases_and_normalises() {
    let pools = load_nodes(&fixture("pools.yaml")).unwrap();
    assert_pools(
        &pools,
        &[
            ("general", "linux/amd64", 3),
            ("graviton", "linux/arm64", 2),
            ("graviton-spot", "linux/arm64", 0),
        ],
    );
    for pool in &pools {
        for key in [ARCH_LABEL, BETA_ARCH_LABEL] {
            assert_eq!(
                pool.labels[key], pool.platform.architecture,
                "{}",
                pool.name
            );
        }
        for key in [OS_LABEL, BETA_OS_LABEL] {
            assert_eq!(pool.labels[key], "linux");
        }
    }
    let w = one(&format!(
        "nodeSelector: {{beta.kubernetes.io/arch: arm64}}\n{CONTAINERS}"
    ));
    assert_eq!(names(schedulable_pools(&w, &pools)), ["graviton"]);
    // matchFields cannot be checked against a pool file: counted as reachable, warned.
    let by_name = one(&affinity(
        "      - matchFields: [{key: metadata.name, operator: In, values: [ip-10-0-0-1]}]\n",
    ));
    let rec = gate(&by_name, &pools);
    assert_eq!(
        rec.workloads[0].containers[0].pools,
        ["general", "graviton"]
    );
    assert!(
        rec.warnings.iter().any(|w| w.contains("by name")),
        "{:?}",
        rec.warnings
    );
}

#[test]
fn pool_file_json_and_platform_shorthand() {
    let pools = parse_nodes(
            Path::new("pools.json"),
            r#"{"pools": [{"name": "win", "platform": "windows/amd64"}, {"name": "pi", "labels": {"kubernetes.io/arch": "arm"}}]}"#,
        )
        .unwrap();
    assert_eq!(pools[0].name, "pi");
    assert_eq!(pools[0].platform.os_arch(), "linux/arm");
    assert_eq!(pools[1].platform.os_arch(), "windows/amd64");
    assert_eq!(pools[1].labels[OS_LABEL], "windows");
}

#[test]
fn multi_os_snippet_has_one_term_per_os() {
    let pools = pools(
        "pools:\n- {name: lin, platform: linux/amd64}\n- {name: win, platform: windows/amd64}\n\
             - {name: arm, platform: linux/arm64}\n",
    );
    let w = one(CONTAINERS);
    let provided = providing(&["linux/amd64", "windows/amd64"]);
    let rec = evaluate(std::slice::from_ref(&w), &pools, &provided);
    let c = &rec.workloads[0].containers[0];
    assert_eq!(c.missing_pools, ["arm"]);
    let snippet = snippet(c);
    let fixed = one(&format!("{CONTAINERS}{snippet}"));
    assert_eq!(names(schedulable_pools(&fixed, &pools)), ["lin", "win"]);
}

#[test]
fn nodes_without_arch_are_refused_with_the_fix() {
    let err = parse_nodes(
        Path::new("pools.yaml"),
        "pools:\n- {name: mystery, labels: {a: b}}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("pools.yaml#1")
            && err.contains("`mystery`")
            && err.contains("kubernetes.io/arch: arm64"),
        "{err}"
    );
    assert!(!err.contains('\n'));
    let err = parse_nodes(
            Path::new("nodes.json"),
            r#"{"kind":"List","items":[{"kind":"Node","metadata":{"name":"n1","labels":{"cloud.google.com/gke-nodepool":"p"}}}]}"#,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node `n1` (pool `p`)") && err.contains("kubectl label node n1"),
        "{err}"
    );
}

#[test]
fn node_info_fallback_and_unlabelled_nodes_are_their_own_pool() {
    let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "apiVersion: v1\nkind: NodeList\nitems:\n\
             - metadata: {name: n1}\n  status: {nodeInfo: {operatingSystem: linux, architecture: arm64}}\n\
             - metadata: {name: n2, labels: {beta.kubernetes.io/arch: amd64}}\n",
        )
        .unwrap();
    let summary: Vec<(&str, String)> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.platform.os_arch()))
        .collect();
    assert_eq!(
        summary,
        [("n1", "linux/arm64".into()), ("n2", "linux/amd64".into())]
    );
}

#[test]
fn mixed_arch_pool_is_split() {
    let pools = parse_nodes(
            Path::new("nodes.yaml"),
            "kind: List\nitems:\n\
             - metadata: {name: a, labels: {karpenter.sh/nodepool: default, kubernetes.io/arch: amd64}}\n\
             - metadata: {name: b, labels: {karpenter.sh/nodepool: default, kubernetes.io/arch: arm64}}\n",
        )
        .unwrap();
    let n: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(n, ["default[linux/amd64]", "default[linux/arm64]"]);
}

#[test]
fn bad_node_inputs_are_errors() {
    for (file, text, want) in [
        (
            "n.yaml",
            "kind: Deployment\n",
            "expected `kubectl get nodes",
        ),
        ("n.yaml", "", "no nodes or pools"),
        (
            "n.yaml",
            "pools:\n- {name: a, platform: linux/amd64}\n- {name: a, platform: linux/amd64}\n",
            "defined twice",
        ),
        ("n.yaml", "pools:\n- {name: a, lables: {}}\n", "unknown key"),
        (
            "n.yaml",
            "pools:\n- {name: a, platform: linux/amd64, count: -1}\n",
            "count",
        ),
        (
            "n.yaml",
            "pools:\n- {name: a, platform: linux/amd64, taints: [{key: k, effect: Sometimes}]}\n",
            "Sometimes",
        ),
        (
            "n.yaml",
            "pools:\n- {name: a, platform: linux/arm64, labels: {kubernetes.io/arch: amd64}}\n",
            "disagrees",
        ),
        (
            "n.yaml",
            "kind: List\nitems:\n- kind: Pod\n  metadata: {name: x}\n",
            "not a Node",
        ),
        (
            "n.json",
            "{\"kind\": \"List\", \"items\": [",
            "not valid JSON",
        ),
    ] {
        let err = parse_nodes(Path::new(file), text).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(err.starts_with(file), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn lists_typed_lists_and_kinds() {
    let ws = workloads(
            "apiVersion: v1\nkind: List\nitems:\n\
             - {kind: Pod, metadata: {name: p}, spec: {containers: [{name: c, image: i}]}}\n\
             - {kind: Service, metadata: {name: s}}\n\
             ---\n\
             apiVersion: apps/v1\nkind: DeploymentList\nitems:\n\
             - {metadata: {name: d}, spec: {template: {spec: {containers: [{name: c, image: i}]}}}}\n\
             ---\n\
             kind: StatefulSet\nmetadata: {name: ss}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: DaemonSet\nmetadata: {name: ds}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: Job\nmetadata: {generateName: job-}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: ReplicaSet\nmetadata: {name: rs}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             kind: ReplicationController\nmetadata: {name: rc}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n\
             ---\n\
             ---\n\
             # only a comment\n",
        );
    let got: Vec<(String, String, String)> = ws
        .iter()
        .map(|w| (w.kind.clone(), w.name.clone(), w.source.clone()))
        .collect();
    let want = [
        ("Pod", "p", "test.yaml#1/items/0"),
        ("Deployment", "d", "test.yaml#2/items/0"),
        ("StatefulSet", "ss", "test.yaml#3"),
        ("DaemonSet", "ds", "test.yaml#4"),
        ("Job", "job-*", "test.yaml#5"),
        ("ReplicaSet", "rs", "test.yaml#6"),
        ("ReplicationController", "rc", "test.yaml#7"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(got, want);
    assert!(ws.iter().all(|w| w.namespace.is_none()));
}

#[test]
fn json_manifests_and_unknown_fields() {
    let ws = parse_workloads(
            Path::new("pod.json"),
            "\u{feff}{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"x-unknown\":[1,{\"a\":null}]},\
             \"spec\":{\"nodeSelector\":{\"kubernetes.io/arch\":\"arm64\"},\"containers\":[{\"name\":\"c\",\"image\":\"i\",\"weird\":{}}]}}\n\
             {\"kind\":\"ConfigMap\"}",
        )
        .unwrap();
    assert_eq!(ws.len(), 1);
    assert_eq!(ws[0].node_selector[ARCH_LABEL], "arm64");
}

#[test]
fn directories_are_walked_sorted() {
    let dir = tempfile::tempdir().unwrap();
    let pod = |n: &str| {
        format!(
            "kind: Pod\nmetadata: {{name: {n}}}\nspec: {{containers: [{{name: c, image: i}}]}}\n"
        )
    };
    std::fs::create_dir_all(dir.path().join("b/nested")).unwrap();
    std::fs::create_dir_all(dir.path().join(".git")).unwrap();
    std::fs::write(dir.path().join("b/nested/z.yml"), pod("z")).unwrap();
    std::fs::write(dir.path().join("a.yaml"), pod("a")).unwrap();
    std::fs::write(dir.path().join("c.json"), r#"{"kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#).unwrap();
    std::fs::write(dir.path().join("README.md"), "not yaml: [").unwrap();
    std::fs::write(dir.path().join(".git/x.yaml"), "garbage: [").unwrap();
    let ws = load_workloads(&[dir.path().to_path_buf()]).unwrap();
    let n: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(n, ["a", "z", "c"]);
    // `gate --pin` writes each file under the same path relative to its directory.
    let files = load_manifests(&[dir.path().to_path_buf(), dir.path().join("a.yaml")]).unwrap();
    let relative: Vec<&Path> = files.iter().map(|f| f.relative.as_path()).collect();
    assert_eq!(
        relative,
        [
            Path::new("a.yaml"),
            Path::new("b/nested/z.yml"),
            Path::new("c.json"),
            Path::new("a.yaml")
        ]
    );

    let empty = tempfile::tempdir().unwrap();
    let err = load_workloads(&[empty.path().to_path_buf()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no *.yaml"), "{err}");
    // A path named on the command line that does not exist is a usage error (exit 2).
    let missing = load_workloads(&[dir.path().join("nope.yaml")]).unwrap_err();
    assert!(
        matches!(&missing, K8sError::Usage(m) if m.contains("nope.yaml")),
        "{missing}"
    );
}

#[test]
fn malformed_workloads_name_file_document_and_field() {
    let deploy = |spec: &str| {
        format!(
            "---\nkind: ConfigMap\n---\nkind: Deployment\nmetadata: {{name: w}}\nspec: {spec}\n"
        )
    };
    for (text, want) in [
            (deploy("{}"), "test.yaml#2: spec.template: missing"),
            (deploy("{template: []}"), "test.yaml#2: spec.template: must be a mapping, found a list"),
            (deploy("{template: {spec: {containers: {name: c}}}}"), "spec.template.spec.containers: must be a list"),
            (deploy("{template: {spec: {containers: []}}}"), "at least one container"),
            (deploy("{template: {spec: {containers: [{name: c}]}}}"), "spec.template.spec.containers[0].image: missing for container `c`"),
            (deploy("{template: {spec: {containers: [{image: i}]}}}"), "containers[0].name: missing"),
            (deploy("{template: {spec: {containers: [c]}}}"), "containers[0]: must be a mapping, found a string"),
            (deploy("{template: {spec: {nodeSelector: [a], containers: [{name: c, image: i}]}}}"), "nodeSelector: must be a mapping"),
            (deploy("{template: {spec: {nodeSelector: {a: [1]}, containers: [{name: c, image: i}]}}}"), "nodeSelector.a: must be a string"),
            (deploy("{template: {spec: {tolerations: [{value: x}], containers: [{name: c, image: i}]}}}"), "operator: Exists"),
            (deploy("{template: {spec: {tolerations: [{key: k, operator: Maybe}], containers: [{name: c, image: i}]}}}"), "`Maybe` is not Equal or Exists"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Like, values: [b]}]}]}}}, containers: [{name: c, image: i}]}}}"), "nodeSelectorTerms[0].matchExpressions[0].operator: `Like`"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Gt, values: [x]}]}]}}}, containers: [{name: c, image: i}]}}}"), "exactly one integer"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: In}]}]}}}, containers: [{name: c, image: i}]}}}"), "at least one value"),
            (deploy("{template: {spec: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: spec.x, operator: In, values: [a]}]}]}}}, containers: [{name: c, image: i}]}}}"), "only `metadata.name`"),
            ("kind: Pod\nspec: {containers: [{name: c, image: i}]}\n".to_string(), "metadata.name: missing"),
            ("just a string\n".to_string(), "test.yaml#1: is a string, not a Kubernetes object"),
            ("- a\n- b\n".to_string(), "is a list"),
            ("replicas: 3\nimage: nginx\n".to_string(), "has no `kind`"),
            ("kind: [Deployment]\n".to_string(), "kind: must be a string"),
        ] {
            let err = parse_workloads(Path::new("test.yaml"), &text).unwrap_err();
            assert!(matches!(err, K8sError::Usage(_)));
            let err = err.to_string();
            assert!(err.contains(want), "{text:?}\n  got: {err}\n want: {want}");
            assert!(err.starts_with("test.yaml#"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
}

#[test]
fn garbage_and_truncated_documents_never_panic() {
    let full = std::fs::read_to_string(fixture("deploy.yaml")).unwrap();
    let nodes = std::fs::read_to_string(fixture("nodes.json")).unwrap();
    let pools_yaml = std::fs::read_to_string(fixture("pools.yaml")).unwrap();
    // Every truncation of the fixtures parses or fails with a one-line message.
    for text in [&full, &pools_yaml] {
        for cut in (0..text.len()).filter(|i| text.is_char_boundary(*i)) {
            let part = &text[..cut];
            if let Err(e) = parse_workloads(Path::new("t.yaml"), part) {
                assert!(!e.to_string().contains('\n'), "{e}");
            }
            if let Err(e) = parse_nodes(Path::new("t.yaml"), part) {
                assert!(!e.to_string().contains('\n'), "{e}");
            }
        }
    }
    for cut in (0..nodes.len()).step_by(7) {
        let part = &nodes[..cut];
        let _ = parse_nodes(Path::new("t.json"), part);
        let _ = parse_workloads(Path::new("t.json"), part);
        let _ = parse_nodes(Path::new("t.yaml"), part);
    }
    for garbage in [
            "\0\0\0",
            "{{ .Values.image }}",
            "image: {{ .Values.image }}\n",
            "kind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n    image: x\n  bad",
            "kind: Deployment\nspec: {template: {spec: {containers: [{name: c, image: i}",
            ":\n:\n- - -\n",
            "---\n...\n---\n%YAML 1.1\n",
            "a: &a [*a]\n",
            "a: !!binary AAAA\n",
            "kind: !custom Deployment\nmetadata: {name: x}\nspec: !t {template: {spec: {containers: [{name: c, image: i}]}}}\n",
            "\t- tab\n",
            "kind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: 1, image: 2}], nodeSelector: {1: 2, ? [a] : b}}}}\n",
            &"[".repeat(10_000),
            &format!("kind: Pod\nmetadata: {{name: x}}\nspec: {}", "{a: ".repeat(5_000)),
            "<<: {kind: Pod}\nmetadata: {name: m}\nspec: {containers: [{name: c, image: i}]}\n",
            "<<: 3\n",
        ] {
            for file in ["g.yaml", "g.json"] {
                if let Err(e) = parse_workloads(Path::new(file), garbage) {
                    assert!(e.to_string().starts_with(file), "{e}");
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
                if let Err(e) = parse_nodes(Path::new(file), garbage) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
        }
    // Merge keys are applied; tags are looked through.
    let ws = workloads(
        "<<: {kind: Pod}\nmetadata: {name: m}\nspec: {containers: [{name: c, image: i}]}\n",
    );
    assert_eq!(ws[0].kind, "Pod");
    let ws = workloads("kind: !custom Deployment\nmetadata: {name: x}\nspec: !t {template: {spec: {containers: [{name: c, image: i}]}}}\n");
    assert_eq!(ws[0].name, "x");
}

#[test]
fn syntax_errors_name_the_document() {
    let err = parse_workloads(
        Path::new("deploy.yaml"),
        "kind: ConfigMap\n---\nkind: Pod\nmetadata: {name: [unclosed\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("deploy.yaml#2: not valid YAML"), "{err}");
    assert!(err.contains("helm template"), "{err}");
}

#[test]
fn node_name_pins_and_skips_no_schedule() {
    let pools = load_nodes(&fixture("nodes.json")).unwrap();
    let w = one(&format!(
        "nodeName: gke-demo-arm-batch-1e2f3a4b-q9r8\n{CONTAINERS}"
    ));
    assert_eq!(names(schedulable_pools(&w, &pools)), ["arm-batch"]);
}

#[test]
fn yaml_scalars_quote_what_would_not_read_back() {
    assert_eq!(yaml_scalar("amd64"), "amd64");
    assert_eq!(yaml_scalar("kubernetes.io/arch"), "kubernetes.io/arch");
    for s in [
        "true", "1", "null", "yes", "", "a b", "-x", "~", "1e3", "0x1f",
    ] {
        let q = yaml_scalar(s);
        let back: String = serde_norway::from_str(&q).unwrap();
        assert_eq!(back, s, "{q}");
    }
}

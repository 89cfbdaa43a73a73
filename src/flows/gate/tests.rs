use super::pin::*;
use super::*;
use crate::base::platform::Platform;

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn entry(claims: &str, config: &str, d: char) -> PlatformCoverage {
    let platform: Platform = claims.parse().unwrap();
    let config: Platform = config.parse().unwrap();
    let ok = platform == config;
    PlatformCoverage {
        detail: (!ok).then(|| {
            format!(
                "entry {} says {platform} but its config says {config}",
                digest(d)
            )
        }),
        platform,
        digest: Some(digest(d).parse().unwrap()),
        config_platform: Some(config),
        size: Some(500),
        annotations: Default::default(),
        status: if ok {
            PlatformStatus::Ok
        } else {
            PlatformStatus::ConfigMismatch
        },
        deep: None,
        build: None,
        attached: Vec::new(),
        test: None,
        sbom: None,
        signed: None,
    }
}

fn contents(entries: Vec<PlatformCoverage>, attestations: &[char]) -> Result<Contents> {
    Ok(Contents {
        digest: digest('f').parse().unwrap(),
        media_type: "application/vnd.oci.image.index.v1+json".into(),
        size: 0,
        annotations: Default::default(),
        entries,
        attestations: attestations.iter().map(|c| digest(*c)).collect(),
        warnings: Vec::new(),
        signed: None,
        attached: Default::default(),
    })
}

fn both() -> Result<Contents> {
    contents(
        vec![
            entry("linux/amd64", "linux/amd64", 'a'),
            entry("linux/arm64", "linux/arm64", 'b'),
        ],
        &[],
    )
}

fn file(name: &str, text: &str) -> ManifestFile {
    let path = PathBuf::from(name);
    ManifestFile {
        workloads: k8s::parse_workloads(&path, text).unwrap(),
        relative: path.clone(),
        path,
        text: text.to_string(),
    }
}

fn deployment(pod_spec: &str) -> ManifestFile {
    let indented: String = pod_spec.lines().map(|l| format!("      {l}\n")).collect();
    file(
        "deploy.yaml",
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\n\
                 spec:\n  template:\n    spec:\n{indented}"
        ),
    )
}

/// Two kubectl nodes, one per arch, each reporting its runtime; the arm one is cordoned
/// (and so tainted by the node controller).
fn nodes() -> Vec<NodePool> {
    k8s::parse_nodes(
        Path::new("nodes.yaml"),
        "kind: List\nitems:\n\
             - metadata: {name: x1, labels: {kubernetes.io/arch: amd64, agentpool: general}}\n  \
               status: {nodeInfo: {containerRuntimeVersion: \"containerd://1.6.20\"}}\n\
             - metadata: {name: a1, labels: {kubernetes.io/arch: arm64, agentpool: graviton}}\n  \
               spec:\n    unschedulable: true\n    \
               taints: [{key: node.kubernetes.io/unschedulable, effect: NoSchedule}]\n  \
               status: {nodeInfo: {containerRuntimeVersion: \"containerd://1.4.13\"}}\n",
    )
    .unwrap()
}

fn read(images: Vec<(&str, Result<Contents>)>) -> BTreeMap<String, Result<Contents>> {
    images
        .into_iter()
        .map(|(i, c)| (i.to_string(), c))
        .collect()
}

const WEB: &str = "containers:\n- {name: web, image: r.io/web:v1}\n";

#[test]
fn an_entry_whose_config_is_another_platform_is_a_gap_for_the_pools_pulling_it() {
    // Both entries name the amd64 manifest, as a lying index does.
    let lying = contents(
        vec![
            entry("linux/amd64", "linux/amd64", 'a'),
            entry("linux/arm64", "linux/amd64", 'a'),
        ],
        &[],
    );
    let images = read(vec![("r.io/web:v1", lying)]);
    let report = judge(
        &[deployment(WEB)],
        &nodes(),
        &images,
        &GateOptions::default(),
    );
    assert_eq!(report.exit_code(), exit::GAP);
    let c = &report.record.workloads[0].containers[0];
    // The cordoned arm64 node still counts: a cordon is lifted without a deploy.
    assert_eq!(c.pools, ["general", "graviton"]);
    assert_eq!(c.provided, ["linux/amd64"]);
    assert_eq!(c.missing_pools, ["graviton"]);
    let gaps: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Gap)
        .collect();
    assert_eq!(gaps.len(), 1);
    assert_eq!(gaps[0].kind, FindingKind::EntryMismatch);
    assert_eq!(gaps[0].pools, ["graviton"]);
    assert_eq!(gaps[0].platform.as_deref(), Some("linux/arm64"));
    assert_eq!(gaps[0].entry, Some(digest('a').parse().unwrap()));
    assert_eq!(gaps[0].status, Some(PlatformStatus::ConfigMismatch));
    assert!(
        gaps[0].message.contains("its config says linux/amd64"),
        "{}",
        gaps[0].message
    );
    // The fix offered keeps the pod on the arch that works.
    let fixes = c.fixes.as_ref().unwrap();
    let affinity = fixes.node_affinity.as_deref().unwrap();
    assert!(affinity.contains("values: [amd64]"), "{affinity}");
    assert!(!report.record.covered);

    // A workload kept on amd64 never pulls the lying entry.
    let amd = deployment(&format!(
        "nodeSelector: {{kubernetes.io/arch: amd64}}\n{WEB}"
    ));
    let report = judge(&[amd], &nodes(), &images, &GateOptions::default());
    assert_eq!(report.exit_code(), exit::COVERED);
    assert!(report
        .findings
        .iter()
        .all(|f| f.kind != FindingKind::EntryMismatch));
    // The record still shows the entry as it is.
    assert_eq!(
        report.images[0].entries[1].status,
        PlatformStatus::ConfigMismatch
    );
}

#[test]
fn attestation_entries_warn_with_the_runtimes_and_strict_refuses() {
    let attested = || {
        contents(
            vec![
                entry("linux/amd64", "linux/amd64", 'a'),
                entry("linux/arm64", "linux/arm64", 'b'),
            ],
            &['c', 'd'],
        )
    };
    let images = read(vec![("r.io/web:v1", attested())]);
    let report = judge(
        &[deployment(WEB)],
        &nodes(),
        &images,
        &GateOptions::default(),
    );
    assert_eq!(report.exit_code(), exit::COVERED);
    let warning = report
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Attestation)
        .unwrap();
    assert_eq!(warning.severity, Severity::Warning);
    assert_eq!(
        warning.runtimes,
        ["containerd://1.4.13", "containerd://1.6.20"]
    );
    assert_eq!(warning.attestations, [digest('c'), digest('d')]);
    assert!(
        warning.message.contains("unknown media type")
            && warning
                .message
                .contains("run containerd://1.4.13, containerd://1.6.20")
            && warning.message.contains("--provenance=false"),
        "{}",
        warning.message
    );
    assert_eq!(warning.severity, Severity::Warning);
    assert_eq!(warning.workload, "Deployment shop/web");
    assert!(report.record.covered);

    // Only the nodes the pod can reach are named.
    let amd = deployment(&format!(
        "nodeSelector: {{kubernetes.io/arch: amd64}}\n{WEB}"
    ));
    let report = judge(&[amd], &nodes(), &images, &GateOptions::default());
    let warning = &report.findings[0];
    assert_eq!(warning.runtimes, ["containerd://1.6.20"]);

    let report = judge(&[deployment(WEB)], &nodes(), &images, &strict());
    assert_eq!(report.exit_code(), exit::GAP);
    assert!(!report.record.covered);
    assert_eq!(report.findings[0].severity, Severity::Gap);
    assert!(
        report.findings[0].message.contains("refused (--strict)"),
        "{}",
        report.findings[0].message
    );

    // A pool file says nothing about runtimes.
    let pools = k8s::parse_nodes(
        Path::new("pools.yaml"),
        "pools:\n- {name: general, platform: linux/amd64}\n",
    )
    .unwrap();
    let report = judge(&[deployment(WEB)], &pools, &images, &GateOptions::default());
    assert!(report.findings[0].runtimes.is_empty());
    assert!(report.findings[0]
        .message
        .contains("runtimes are not known"));
}

#[test]
fn an_unreadable_image_is_reported_against_its_workload_and_the_rest_is_judged() {
    let two = file(
            "apps.yaml",
            "kind: Deployment\nmetadata: {name: a}\nspec: {template: {spec: {containers: [{name: a, image: r.io/gone:v1}]}}}\n\
             ---\n\
             kind: Deployment\nmetadata: {name: b}\nspec: {template: {spec: {containers: [{name: b, image: r.io/amd:v1}]}}}\n",
        );
    let images = read(vec![
        (
            "r.io/gone:v1",
            Err(Error::Registry {
                registry: "r.io".into(),
                source: crate::registry::RegistryError::Refused {
                    what: "read manifest".into(),
                    reference: "r.io/gone:v1".into(),
                    detail: "manifest unknown".into(),
                    source: None,
                }
                .into(),
            }),
        ),
        (
            "r.io/amd:v1",
            contents(vec![entry("linux/amd64", "linux/amd64", 'a')], &[]),
        ),
    ]);
    let report = judge(&[two], &nodes(), &images, &GateOptions::default());
    assert_eq!(report.exit_code(), exit::FAILURE);
    let unreadable: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Unreadable)
        .collect();
    assert_eq!(unreadable.len(), 1);
    assert_eq!(unreadable[0].source, "apps.yaml#1");
    assert_eq!(unreadable[0].workload, "Deployment a");
    assert!(unreadable[0].message.contains("manifest unknown"));
    let gone = report.images.iter().find(|i| i.image == "r.io/gone:v1");
    assert!(gone
        .unwrap()
        .error
        .as_deref()
        .unwrap()
        .contains("manifest unknown"));
    // The other workload was still judged: amd64 only, an arm64 pool reachable.
    let b = &report.record.workloads[1].containers[0];
    assert_eq!(b.missing_pools, ["graviton"]);
    let failure = report
        .findings
        .iter()
        .find(|f| f.severity == Severity::Failure)
        .unwrap();
    assert_eq!(
        (failure.workload.as_str(), failure.source.as_str()),
        ("Deployment a", "apps.yaml#1")
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["schema"], "polyarch/gate/v1");
    assert!(json["workloads"][0]["containers"][0]["error"].is_string());
}

#[test]
fn pull_policy_defaults_follow_kubernetes() {
    use PolicySource::{Default, Written};
    for (image, written, want) in [
        ("nginx", None, ("Always", Default)),
        ("nginx:latest", None, ("Always", Default)),
        ("nginx:1.25", None, ("IfNotPresent", Default)),
        ("127.0.0.1:5000/x", None, ("Always", Default)),
        ("127.0.0.1:5000/x:v1", None, ("IfNotPresent", Default)),
        (
            "127.0.0.1:5000/x@sha256:abc",
            None,
            ("IfNotPresent", Default),
        ),
        ("r.io/x:latest@sha256:abc", None, ("Always", Default)),
        ("r.io/x:v1", Some("Always"), ("Always", Written)),
        (
            "r.io/x:latest",
            Some("IfNotPresent"),
            ("IfNotPresent", Written),
        ),
    ] {
        let (policy, source) = effective_pull_policy(image, written);
        assert_eq!((policy.as_str(), source), want, "{image} {written:?}");
    }
}

#[test]
fn mutable_tags_pulled_if_not_present_warn_per_container() {
    let f = deployment(
            "containers:\n\
             - {name: default, image: r.io/web:v1}\n\
             - {name: written, image: r.io/web:latest, imagePullPolicy: IfNotPresent}\n\
             - {name: always, image: r.io/web:v1, imagePullPolicy: Always}\n\
             - {name: latest, image: r.io/web:latest}\n\
             - {name: pinned, image: \"r.io/web:v1@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\"}\n\
             initContainers:\n\
             - {name: init, image: r.io/web:v1}\n",
        );
    let images = read(vec![
        ("r.io/web:v1", both()),
        ("r.io/web:latest", both()),
        (
            "r.io/web:v1@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            both(),
        ),
    ]);
    let report = judge(&[f], &nodes(), &images, &GateOptions::default());
    assert_eq!(report.exit_code(), exit::COVERED);
    let warned: Vec<(&str, Option<PolicySource>)> = report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::PullPolicy)
        .map(|f| (f.container.as_str(), f.pull_policy_source))
        .collect();
    assert_eq!(
        warned,
        [
            ("default", Some(PolicySource::Default)),
            ("written", Some(PolicySource::Written)),
            ("init", Some(PolicySource::Default)),
        ]
    );
    let message = &report.findings[0].message;
    assert!(
            message.starts_with("Deployment shop/web container `default` (deploy.yaml#1): image r.io/web:v1 is a mutable tag")
                && message.contains(&format!("r.io/web:v1@{}", digest('f')))
                && message.contains("imagePullPolicy: Always"),
            "{message}"
        );
}

const PINNABLE: &str = "\
# Source: chart/templates/web.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # the storefront
spec:
  template:
    spec:
      initContainers:
        - name: migrate
          image: \"r.io/migrate:v1\"  # runs first
      containers:
        - image: r.io/web:v1 # pinned by the gate
          name: web
          imagePullPolicy: IfNotPresent
        - {name: side, image: 'r.io/web:v1', args: [--image, r.io/web:v1]}
---
# a config map that mentions the image: not a container, left alone
kind: ConfigMap
metadata: {name: c}
data:
  values.yaml: |
    image: r.io/web:v1
---
kind: List
items:
- kind: Pod
  metadata: {name: p}
  spec:
    containers:
    - name: p
      image: r.io/web:v1
";

#[test]
fn pin_replaces_only_container_image_values_and_keeps_the_text() {
    let f = file("deploy.yaml", PINNABLE);
    let (d1, d2): (Digest, Digest) = (digest('1').parse().unwrap(), digest('2').parse().unwrap());
    let digests = BTreeMap::from([("r.io/web:v1", &d1), ("r.io/migrate:v1", &d2)]);
    let (text, pinned, reserialised) = pin_file(&f, &digests).unwrap();
    assert_eq!((pinned, reserialised), (4, false));
    let web = format!("r.io/web:v1@{d1}");
    let want = PINNABLE
        .replace(
            "image: \"r.io/migrate:v1\"",
            &format!("image: \"r.io/migrate:v1@{d2}\""),
        )
        .replace("- image: r.io/web:v1 #", &format!("- image: {web} #"))
        .replace("image: 'r.io/web:v1',", &format!("image: '{web}',"))
        .replace(
            "      image: r.io/web:v1\n",
            &format!("      image: {web}\n"),
        );
    assert_eq!(text, want);
    // Comments, the args mentioning the image and the config map are as written.
    assert!(text.contains("# pinned by the gate") && text.contains("[--image, r.io/web:v1]"));
    assert!(text.contains("values.yaml: |\n    image: r.io/web:v1\n"));
    let back = k8s::parse_workloads(Path::new("deploy.yaml"), &text).unwrap();
    let images: Vec<&str> = back
        .iter()
        .flat_map(|w| &w.containers)
        .map(|c| c.image.as_str())
        .collect();
    let migrate = format!("r.io/migrate:v1@{d2}");
    assert_eq!(
        images,
        [web.as_str(), web.as_str(), migrate.as_str(), web.as_str()]
    );
}

#[test]
fn pin_re_serialises_what_it_cannot_replace_in_place_and_handles_json() {
    // The value comes from an anchor elsewhere: no `image: r.io/x:v1` to replace.
    let aliased = file(
            "a.yaml",
            "x: &img r.io/x:v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: *img\n",
        );
    let d: Digest = digest('3').parse().unwrap();
    let digests = BTreeMap::from([("r.io/x:v1", &d)]);
    let (text, pinned, reserialised) = pin_file(&aliased, &digests).unwrap();
    assert_eq!((pinned, reserialised), (1, true));
    let back = k8s::parse_workloads(Path::new("a.yaml"), &text).unwrap();
    assert_eq!(back[0].containers[0].image, format!("r.io/x:v1@{d}"));

    let json = file(
            "p.json",
            "{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"r.io/x:v1\"}]}}\n",
        );
    let (text, pinned, reserialised) = pin_file(&json, &digests).unwrap();
    assert_eq!((pinned, reserialised), (1, false));
    assert_eq!(
        text,
        json.text.replace("r.io/x:v1", &format!("r.io/x:v1@{d}"))
    );

    // Nothing readable to pin: the file as read.
    let (text, pinned, _) = pin_file(&json, &BTreeMap::new()).unwrap();
    assert_eq!((text.as_str(), pinned), (json.text.as_str(), 0));
}

#[test]
fn image_values_are_found_in_every_spelling_and_nothing_else() {
    let pins = BTreeMap::from([("i:1", "i:1@d".to_string())]);
    for (text, want) in [
        ("image: i:1\n", "image: i:1@d\n"),
        ("  - image:   i:1   # c\n", "  - image:   i:1@d   # c\n"),
        ("- {name: c, image: i:1}\n", "- {name: c, image: i:1@d}\n"),
        ("{\"image\":\"i:1\"}", "{\"image\":\"i:1@d\"}"),
        ("'image': 'i:1'\r\n", "'image': 'i:1@d'\r\n"),
        ("imagePullPolicy: i:1\n", "imagePullPolicy: i:1\n"),
        ("baseimage: i:1\n", "baseimage: i:1\n"),
        ("image: i:10\n", "image: i:10\n"),
        ("image: \"i:1\\n\"\n", "image: \"i:1\\n\"\n"),
        ("env: [image: i:1]\n", "env: [image: i:1]\n"),
        ("image:i:1\n", "image:i:1\n"),
    ] {
        assert_eq!(replace_image_values(text, &pins), want, "{text:?}");
    }
}

#[test]
fn document_spans_are_numbered_as_the_parser_numbers_documents() {
    let fixture = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/k8s/deploy.yaml"),
    )
    .unwrap();
    for text in [
        fixture.as_str(),
        "a: 1\n---\nb: 2\n",
        "# c\n---\na: 1\n---\n---\nc: 3\n",
        "%YAML 1.1\n---\na: 1\n",
        "a: 1\n--- \nb: 2\n---\n",
        "--- {a: 1}\n--- [b]\n",
    ] {
        let docs = k8s::documents(Path::new("t.yaml"), text).unwrap();
        let spans = yaml_document_spans(text);
        for (index, value) in docs {
            let span = &text[spans[index - 1].clone()];
            let alone = k8s::documents(Path::new("t.yaml"), span).unwrap();
            assert_eq!(alone, [(1, value)], "{text:?} #{index}");
        }
    }
}

#[test]
fn pin_dir_must_be_new_or_empty_and_names_must_not_collide() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        file("a/deploy.yaml", WEB_POD),
        file("a/other.yaml", WEB_POD),
    ];
    check_pin_dir(&dir.path().join("new"), &files).unwrap();
    check_pin_dir(dir.path(), &files).unwrap();
    std::fs::write(dir.path().join("stale.yaml"), "").unwrap();
    let err = check_pin_dir(dir.path(), &files).unwrap_err();
    assert!(matches!(err, Error::Usage(_)));
    assert!(err.to_string().contains("not empty"), "{err}");
    let mut twins = [
        file("a/deploy.yaml", WEB_POD),
        file("b/deploy.yaml", WEB_POD),
    ];
    for f in &mut twins {
        f.relative = PathBuf::from("deploy.yaml");
    }
    let err = check_pin_dir(&dir.path().join("new"), &twins).unwrap_err();
    assert!(
        err.to_string()
            .contains("a/deploy.yaml and b/deploy.yaml would both be written as deploy.yaml"),
        "{err}"
    );
}

const WEB_POD: &str =
    "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: r.io/web:v1}]}\n";

#[test]
fn a_malformed_image_reference_is_a_usage_error_naming_its_field() {
    let f = deployment("containers:\n- {name: a, image: r.io/ok:v1}\ninitContainers:\n- {name: b, image: \"R.io/Bad:v1\"}\n");
    let err = image_references(&[f]).unwrap_err();
    assert_eq!(err.exit_code(), exit::USAGE);
    let err = err.to_string();
    assert!(
        err.starts_with("deploy.yaml#1: spec.template.spec.initContainers[0].image: `R.io/Bad:v1`"),
        "{err}"
    );
}

#[test]
fn an_image_whose_index_or_entry_is_not_signed_by_a_key_given_is_refused() {
    use crate::verify::coverage_record::Signed;
    let by = |key: &str| Signed {
        verified: true,
        key: Some(key.into()),
        gap: None,
    };
    let gap = Signed {
        verified: false,
        key: None,
        gap: Some("has a signature (sha256:…) that is signed by none of the keys given".into()),
    };
    let signed_by = |arm64: Signed| {
        let mut contents = both().unwrap();
        contents.signed = Some(by("fp"));
        contents.entries[0].signed = Some(by("fp"));
        contents.entries[1].signed = Some(arm64);
        contents
    };
    let report = judge(
        &[deployment(WEB)],
        &nodes(),
        &read(vec![("r.io/web:v1", Ok(signed_by(by("fp"))))]),
        &GateOptions::default(),
    );
    assert_eq!(report.exit_code(), exit::COVERED, "{:?}", report.findings);

    let signed = signed_by(gap);
    let report = judge(
        &[deployment(WEB)],
        &nodes(),
        &read(vec![("r.io/web:v1", Ok(signed))]),
        &GateOptions::default(),
    );
    assert_eq!(report.exit_code(), exit::GAP);
    assert!(!report.record.workloads[0].containers[0].covered);
    let unsigned: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Unsigned)
        .collect();
    assert_eq!(unsigned.len(), 1, "{:?}", report.findings);
    assert_eq!(unsigned[0].severity, Severity::Gap);
    assert_eq!(
        unsigned[0].entry.as_ref().map(|d| d.as_str()),
        Some(digest('b').as_str())
    );
    assert!(
        unsigned[0].message.contains("r.io/web:v1: linux/arm64")
            && unsigned[0]
                .message
                .contains("signed by none of the keys given"),
        "{}",
        unsigned[0].message
    );
}

#[test]
fn with_require_sbom_an_entry_without_an_sbom_refuses_the_image() {
    use crate::base::attachment::{Attached, SPDX_DOCUMENT};
    let sbom = Attached {
        artifact_type: Some(crate::base::attachment::IN_TOTO.into()),
        digest: digest('s').to_string(),
        predicate_type: Some(SPDX_DOCUMENT.into()),
    };
    let mut contents = both().unwrap();
    contents.entries[0].attached = vec![sbom];
    let images = read(vec![("r.io/web:v1", Ok(contents))]);
    let report = judge(
        &[deployment(WEB)],
        &nodes(),
        &images,
        &GateOptions::default(),
    );
    assert_eq!(report.exit_code(), exit::COVERED, "{:?}", report.findings);

    let required = GateOptions {
        require_sbom: true,
        ..Default::default()
    };
    let report = judge(&[deployment(WEB)], &nodes(), &images, &required);
    assert_eq!(report.exit_code(), exit::GAP);
    assert!(!report.record.workloads[0].containers[0].covered);
    let missing: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Gap)
        .collect();
    let [missing] = missing.as_slice() else {
        panic!("{:?}", report.findings);
    };
    assert_eq!(missing.kind, FindingKind::SbomMissing);
    assert_eq!(
        missing.entry.as_ref().map(|d| d.as_str()),
        Some(digest('b').as_str())
    );
    assert!(
        missing.message.contains("linux/arm64") && missing.message.contains("no SBOM attached"),
        "{}",
        missing.message
    );
}

fn strict() -> GateOptions {
    GateOptions {
        strict: true,
        ..Default::default()
    }
}

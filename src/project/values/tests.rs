use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "VERSION" => Some("v1.4.3".into()),
        "EMPTY" => Some(String::new()),
        "REGISTRY" => Some("ghcr.io/acme".into()),
        _ => None,
    }
}

fn expand(text: &str) -> std::result::Result<(String, Vec<Source>), String> {
    let mut used = Vec::new();
    interpolate(text, &env, &mut used).map(|out| (out, used))
}

fn ok(text: &str) -> String {
    expand(text).unwrap().0
}

#[test]
fn interpolates_as_compose_does() {
    assert_eq!(ok("${VERSION}"), "v1.4.3");
    assert_eq!(ok("$VERSION-rc"), "v1.4.3-rc");
    assert_eq!(ok("${REGISTRY}/api"), "ghcr.io/acme/api");
    assert_eq!(ok("a$$b $${VERSION}"), "a$b ${VERSION}");
    assert_eq!(ok("no variables"), "no variables");
    // `:-` takes the default when unset or empty, `-` only when unset.
    assert_eq!(ok("${UNSET:-1.0}"), "1.0");
    assert_eq!(ok("${EMPTY:-1.0}"), "1.0");
    assert_eq!(ok("${EMPTY-1.0}"), "");
    assert_eq!(ok("${UNSET-1.0}"), "1.0");
    assert_eq!(ok("${VERSION:-1.0}"), "v1.4.3");
    // Defaults may hold references and `}` only closes the outermost one.
    assert_eq!(ok("${UNSET:-${VERSION}}"), "v1.4.3");
    assert_eq!(ok("${UNSET:-${ALSO_UNSET:-x}}y"), "xy");
    assert_eq!(ok("${EMPTY}"), "", "set but empty is a value");
    assert_eq!(ok("${VERSION:?needed}"), "v1.4.3");
    assert_eq!(ok("${EMPTY?needed}"), "");
    // Non-ASCII text around references is kept.
    assert_eq!(ok("ü${VERSION}€"), "üv1.4.3€");
}

#[test]
fn records_which_variable_gave_the_value() {
    let (_, used) = expand("${REGISTRY}/${UNSET:-api}:$VERSION").unwrap();
    assert_eq!(
        used,
        vec![
            Source::Env("REGISTRY".into()),
            Source::Default("UNSET".into()),
            Source::Env("VERSION".into()),
        ]
    );
}

#[test]
fn refuses_unset_variables_and_bad_syntax_with_the_fix() {
    let err = |text: &str| expand(text).unwrap_err();
    let m = err("${UNSET}");
    assert!(
        m.contains("variable UNSET is not set") && m.contains("${UNSET:-default}"),
        "{m}"
    );
    assert!(err("$UNSET").contains("variable UNSET is not set"));
    let m = err("${UNSET:?the release version, e.g. v1.2.3}");
    assert!(
        m.contains("UNSET is not set: the release version, e.g. v1.2.3;"),
        "{m}"
    );
    let m = err("${EMPTY:?give it}");
    assert!(m.contains("EMPTY is empty: give it"), "{m}");
    assert!(err("${UNSET?}").contains("UNSET is not set;"));
    for bad in ["${", "${VERSION", "a${UNSET:-${X}"] {
        assert!(
            err(bad).contains("without a closing"),
            "{bad}: {}",
            err(bad)
        );
    }
    for bad in ["price $5", "$", "a $ b", "$-x"] {
        assert!(
            err(bad).contains("`$$` for a literal"),
            "{bad}: {}",
            err(bad)
        );
    }
    for bad in [
        "${}",
        "${1X}",
        "${VERSION:+x}",
        "${VERSION/a/b}",
        "${VERSION:}",
    ] {
        assert!(
            err(bad).contains("`${NAME:-default}`"),
            "{bad}: {}",
            err(bad)
        );
    }
}

#[test]
fn glob_matches_bake_patterns() {
    assert!(glob("*", "api"));
    assert!(glob("api", "api") && !glob("api", "api2"));
    assert!(glob("api-*", "api-arm") && !glob("api-*", "web-arm"));
    assert!(glob("*-arm", "api-arm") && glob("a*i*", "api"));
    assert!(!glob("", "api"));
}

#[test]
fn overrides_parse_and_resolve_their_field() {
    let resolved = |text: &str| {
        let o: Override = text.parse().unwrap();
        o.resolve()
            .map(|r| (r.pattern.to_string(), r.name, r.key.map(str::to_string)))
    };
    assert_eq!(
        resolved("api.tags=v1,latest"),
        Ok(("api".into(), "tags", None))
    );
    assert_eq!(
        resolved("*.platform=linux/arm64"),
        Ok(("*".into(), "platforms", None))
    );
    assert_eq!(
        resolved("api.args.VERSION=1.2"),
        Ok(("api".into(), "build_args", Some("VERSION".into())))
    );
    // Dots in image names and label keys.
    assert_eq!(
        resolved("web.v2.labels.org.opencontainers.image.version=1"),
        Ok((
            "web.v2".into(),
            "labels",
            Some("org.opencontainers.image.version".into())
        ))
    );
    let m = resolved("api.tagz=v1").unwrap_err();
    assert!(
        m.contains("did you mean tags?") && m.contains("use one of"),
        "{m}"
    );
    assert!(resolved("api.build_args=x")
        .unwrap_err()
        .contains("api.build_args.NAME=VALUE"));
    assert!(resolved("api.tags.x=v1")
        .unwrap_err()
        .contains("has no keys"));
    for bad in ["api.tags", "api=v1", "=v1", ""] {
        let m = bad.parse::<Override>().unwrap_err();
        assert!(m.contains("IMAGE.FIELD=VALUE"), "{bad}: {m}");
    }
}

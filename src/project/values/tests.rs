use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "VERSION" => Some("v1.4.3".into()),
        "EMPTY" => Some(String::new()),
        "REGISTRY" => Some("ghcr.io/acme".into()),
        _ => None,
    }
}

fn expand(text: &str) -> std::result::Result<(String, Vec<Source>), Unexpanded> {
    let mut used = Vec::new();
    interpolate(text, &env, &mut used).map(|out| (out, used))
}

fn ok(text: &str) -> String {
    expand(text).unwrap().0
}

#[test]
fn interpolates_as_compose_does() {
    for (text, want) in [
        ("${VERSION}", "v1.4.3"),
        ("$VERSION-rc", "v1.4.3-rc"),
        ("${REGISTRY}/api", "ghcr.io/acme/api"),
        ("a$$b $${VERSION}", "a$b ${VERSION}"),
        ("no variables", "no variables"),
        // `:-` takes the default when unset or empty, `-` only when unset.
        ("${UNSET:-1.0}", "1.0"),
        ("${EMPTY:-1.0}", "1.0"),
        ("${EMPTY-1.0}", ""),
        ("${UNSET-1.0}", "1.0"),
        ("${VERSION:-1.0}", "v1.4.3"),
        // Defaults may hold references and `}` only closes the outermost one.
        ("${UNSET:-${VERSION}}", "v1.4.3"),
        ("${UNSET:-${ALSO_UNSET:-x}}y", "xy"),
        // Set but empty is a value.
        ("${EMPTY}", ""),
        ("${VERSION:?needed}", "v1.4.3"),
        ("${EMPTY?needed}", ""),
        // Non-ASCII text around references is kept.
        ("ü${VERSION}€", "üv1.4.3€"),
    ] {
        assert_eq!(ok(text), want, "{text}");
    }
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
    #[rustfmt::skip]
    let cases: &[(&str, &[&str])] = &[
        ("${UNSET}", &["variable UNSET is not set", "${UNSET:-default}"]),
        ("$UNSET", &["variable UNSET is not set"]),
        ("${UNSET:?the release version, e.g. v1.2.3}",
            &["UNSET is not set: the release version, e.g. v1.2.3;"]),
        ("${EMPTY:?give it}", &["EMPTY is empty: give it"]),
        ("${UNSET?}", &["UNSET is not set;"]),
    ];
    for (bad, needles) in cases {
        let m = expand(bad).unwrap_err().to_string();
        for needle in *needles {
            assert!(m.contains(needle), "{bad}: lacks {needle:?}: {m}");
        }
    }
    #[rustfmt::skip]
    let syntax: &[(&str, &[&str])] = &[
        ("without a closing", &["${", "${VERSION", "a${UNSET:-${X}"]),
        ("`$$` for a literal", &["price $5", "$", "a $ b", "$-x"]),
        ("`${NAME:-default}`", &["${}", "${1X}", "${VERSION:+x}", "${VERSION/a/b}", "${VERSION:}"]),
    ];
    for (needle, bads) in syntax {
        for bad in *bads {
            let m = expand(bad).unwrap_err().to_string();
            assert!(m.contains(needle), "{bad}: lacks {needle:?}: {m}");
        }
    }
}

/// `${A:-${A:-…}}` nested as deep as the limit allows, around `x`.
fn defaults_nested(depth: usize) -> String {
    "${UNSET:-".repeat(depth) + "x" + &"}".repeat(depth)
}

#[test]
fn nesting_is_expanded_up_to_the_limit_and_refused_beyond_it() {
    assert_eq!(ok(&defaults_nested(MAX_INTERPOLATION_DEPTH)), "x");
    assert_eq!(
        expand(&defaults_nested(MAX_INTERPOLATION_DEPTH + 1)),
        Err(Unexpanded::TooDeep)
    );
    // The depth a stack could not take ends the same way, and at once.
    let start = std::time::Instant::now();
    assert_eq!(expand(&defaults_nested(20_000)), Err(Unexpanded::TooDeep));
    let message = "${UNSET:?".repeat(40) + &"}".repeat(40);
    assert_eq!(expand(&message), Err(Unexpanded::TooDeep));
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
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
    for (text, pattern, field, key) in [
        ("api.tags=v1,latest", "api", "tags", None),
        ("*.platform=linux/arm64", "*", "platforms", None),
        ("api.args.VERSION=1.2", "api", "build_args", Some("VERSION")),
        // Dots in image names and label keys.
        (
            "web.v2.labels.org.opencontainers.image.version=1",
            "web.v2",
            "labels",
            Some("org.opencontainers.image.version"),
        ),
    ] {
        let want = (pattern.to_string(), field, key.map(str::to_string));
        assert_eq!(resolved(text), Ok(want), "{text}");
    }
    for (text, needles) in [
        ("api.tagz=v1", &["did you mean tags?", "use one of"][..]),
        ("api.build_args=x", &["api.build_args.NAME=VALUE"]),
        ("api.tags.x=v1", &["has no keys"]),
    ] {
        let m = resolved(text).unwrap_err();
        for needle in needles {
            assert!(m.contains(needle), "{text}: lacks {needle:?}: {m}");
        }
    }
    for bad in ["api.tags", "api=v1", "=v1", ""] {
        let m = bad.parse::<Override>().unwrap_err();
        assert!(m.contains("IMAGE.FIELD=VALUE"), "{bad}: {m}");
    }
}

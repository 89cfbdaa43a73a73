//! `docker polyarch …`: the same binary installed as `docker-polyarch` in a cli-plugins
//! directory is a Docker CLI plugin. The Docker CLI first asks it for its metadata
//! (`docker-polyarch docker-cli-plugin-metadata`), then runs it with its own command line
//! unchanged: `docker-polyarch [GLOBAL OPTIONS] polyarch [ARGS]` (docker/cli
//! `cli-plugins/manager`). The plugin must read the global options itself; they become
//! the environment the Docker CLI's own engine selection reads (`DOCKER_HOST`,
//! `DOCKER_CONTEXT`, `DOCKER_CONFIG`, `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`), which the
//! library's endpoint and credential look-ups already follow.

use std::ffi::OsString;
use std::path::Path;

/// The plugin's name: `docker polyarch`, binary `docker-polyarch`.
pub const NAME: &str = "polyarch";
const BINARY: &str = "docker-polyarch";
const METADATA: &str = "docker-cli-plugin-metadata";
/// Where the Docker CLI passes the address of a socket it closes when the user
/// interrupts it (docker/cli `cli-plugins/socket`).
const CLI_SOCKET: &str = "DOCKER_CLI_PLUGIN_SOCKET";

/// Environment variables to set (`None`: to remove), in order.
pub type EnvChanges = Vec<(&'static str, Option<String>)>;

/// What the process was asked to do, read from how it was called.
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Called as `polyarch`: the arguments as given.
    Standalone(Vec<OsString>),
    /// The Docker CLI asks for the plugin's metadata.
    Metadata,
    /// `docker [GLOBAL OPTIONS] polyarch ARGS`: `polyarch ARGS`, and the environment
    /// changes the global options stand for (`None` removes a variable).
    Plugin {
        args: Vec<OsString>,
        env: EnvChanges,
    },
}

/// Reads the command line: standalone unless the binary is `docker-polyarch`.
pub fn invocation(args: Vec<OsString>) -> Result<Invocation, String> {
    let called = args
        .first()
        .and_then(|a| Path::new(a).file_stem())
        .and_then(|s| s.to_str());
    if called != Some(BINARY) {
        return Ok(Invocation::Standalone(args));
    }
    let rest: Vec<String> = args[1..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if rest.first().map(String::as_str) == Some(METADATA) {
        return Ok(Invocation::Metadata);
    }
    let (env, after) = global_options(&rest)?;
    // The arguments after the plugin word, as given (not through the lossy copy).
    let mut polyarch = vec![OsString::from(NAME)];
    polyarch.extend(args.into_iter().skip(1 + after));
    Ok(Invocation::Plugin {
        args: polyarch,
        env,
    })
}

/// The Docker CLI's global options before the `polyarch` word, as environment changes,
/// and the index of the first argument after that word.
fn global_options(rest: &[String]) -> Result<(EnvChanges, usize), String> {
    let mut env = Vec::new();
    let (mut host, mut context, mut verify, mut tls_unchecked) = (None, None, false, false);
    let mut certs: [Option<String>; 3] = Default::default();
    let mut i = 0;
    while i < rest.len() {
        let arg = rest[i].as_str();
        if arg == NAME {
            if host.is_some() && context.is_some() {
                return Err("docker polyarch: conflicting options: either specify --host or --context, not both".into());
            }
            if let Some(host) = host {
                env.push(("DOCKER_HOST", Some(host)));
                env.push(("DOCKER_CONTEXT", None));
            }
            if let Some(context) = context {
                // As in the Docker CLI, a context named on the command line wins over
                // DOCKER_HOST in the environment.
                env.push(("DOCKER_CONTEXT", Some(context)));
                env.push(("DOCKER_HOST", None));
            }
            if tls_unchecked && !verify {
                return Err("docker polyarch: --tls without --tlsverify (TLS without checking the engine's certificate) is not supported; use --tlsverify".into());
            }
            if verify {
                env.push(("DOCKER_TLS_VERIFY", Some("1".into())));
            }
            if let Some(dir) = cert_dir(&certs)? {
                env.push(("DOCKER_CERT_PATH", Some(dir)));
            }
            return Ok((env, i + 1));
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg, None),
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            rest.get(i)
                .cloned()
                .ok_or_else(|| format!("docker polyarch: {flag} needs a value"))
        };
        match flag {
            "--config" => env.push(("DOCKER_CONFIG", Some(value()?))),
            "-c" | "--context" => context = Some(value()?),
            "-H" | "--host" => {
                if host.replace(value()?).is_some() {
                    return Err("docker polyarch: -H/--host was given twice; polyarch talks to one engine".into());
                }
            }
            "-l" | "--log-level" => drop(value()?),
            "-D" | "--debug" => {}
            "--tlsverify" => verify = inline.as_deref() != Some("false"),
            // The engine look-up reads TLS from DOCKER_TLS_VERIFY only: with checks.
            "--tls" if !verify => tls_unchecked = true,
            "--tls" => {}
            "--tlscacert" => certs[0] = Some(value()?),
            "--tlscert" => certs[1] = Some(value()?),
            "--tlskey" => certs[2] = Some(value()?),
            other => {
                return Err(format!(
                    "docker polyarch: unknown global option `{other}`; polyarch reads the Docker CLI's --config, --context, --host, --tlsverify, --tlscacert, --tlscert and --tlskey"
                ))
            }
        }
        i += 1;
    }
    Err(format!(
        "{BINARY} is the Docker CLI plugin of polyarch: run it as `docker {NAME} …` (or run `polyarch` itself)"
    ))
}

/// `--tlscacert/--tlscert/--tlskey` as a `DOCKER_CERT_PATH`: polyarch reads `ca.pem`,
/// `cert.pem` and `key.pem` from one directory, as `DOCKER_CERT_PATH` names it.
fn cert_dir(certs: &[Option<String>; 3]) -> Result<Option<String>, String> {
    if certs.iter().all(Option::is_none) {
        return Ok(None);
    }
    let names = ["ca.pem", "cert.pem", "key.pem"];
    let mut dir: Option<&Path> = None;
    for (given, name) in certs.iter().zip(names) {
        let Some(given) = given else {
            return Err(format!("docker polyarch: give --tlscacert, --tlscert and --tlskey together (polyarch reads {name} from their directory)"));
        };
        let path = Path::new(given);
        let parent = path.parent().unwrap_or(Path::new("."));
        if path.file_name().and_then(|n| n.to_str()) != Some(name)
            || dir.is_some_and(|d| d != parent)
        {
            return Err(format!(
                "docker polyarch: TLS files must be ca.pem, cert.pem and key.pem in one directory (as DOCKER_CERT_PATH names it); got {given}"
            ));
        }
        dir = Some(parent);
    }
    Ok(dir.map(|d| d.display().to_string()))
}

/// What `docker-cli-plugin-metadata` answers: the JSON object the Docker CLI lists in
/// `docker --help` and `docker info`.
pub fn metadata() -> String {
    let url = [env!("CARGO_PKG_REPOSITORY"), env!("CARGO_PKG_HOMEPAGE")]
        .into_iter()
        .find(|u| !u.is_empty());
    let mut meta = serde_json::json!({
        "SchemaVersion": "0.1.0",
        "Vendor": "polyarch",
        "Version": env!("CARGO_PKG_VERSION"),
        "ShortDescription": "Build multi-arch images and prove they cover every platform",
    });
    if let Some(url) = url {
        meta["URL"] = url.into();
    }
    meta.to_string()
}

/// The Docker CLI closes its plugin socket when the user interrupts it while its output
/// is not a terminal (a terminal sends the signal to the plugin itself): the same as a
/// first SIGINT. Nothing happens when the variable is unset (an older CLI, or standalone).
pub fn on_cli_interrupt(interrupt: impl FnOnce() + Send + 'static) {
    let Some(address) = std::env::var_os(CLI_SOCKET) else {
        return;
    };
    std::thread::spawn(move || {
        use std::io::Read;
        let Ok(mut socket) = connect(&address) else {
            return;
        };
        let mut byte = [0u8; 1];
        while let Ok(n) = socket.read(&mut byte) {
            if n == 0 {
                interrupt();
                return;
            }
        }
    });
}

/// Go's `@name` is a Linux abstract socket; elsewhere the address is a path.
fn connect(address: &std::ffi::OsStr) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::unix::net::UnixStream;
    #[cfg(target_os = "linux")]
    if let Some(name) = address.to_str().and_then(|a| a.strip_prefix('@')) {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        return UnixStream::connect_addr(&addr);
    }
    UnixStream::connect(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(args: &[&str]) -> Result<Invocation, String> {
        invocation(args.iter().map(OsString::from).collect())
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn as_polyarch_the_arguments_are_untouched() {
        assert_eq!(
            call(&["/usr/bin/polyarch", "docker-cli-plugin-metadata"]).unwrap(),
            Invocation::Standalone(os(&["/usr/bin/polyarch", "docker-cli-plugin-metadata"]))
        );
    }

    #[test]
    fn the_docker_cli_gets_metadata_naming_the_schema_and_version() {
        assert_eq!(
            call(&["/x/cli-plugins/docker-polyarch", METADATA]).unwrap(),
            Invocation::Metadata
        );
        let meta: serde_json::Value = serde_json::from_str(&metadata()).unwrap();
        assert_eq!(meta["SchemaVersion"], "0.1.0");
        assert_eq!(meta["Version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn global_options_before_the_plugin_word_select_the_engine() {
        let got = call(&[
            "docker-polyarch",
            "--config=/c",
            "-H",
            "tcp://10.0.0.1:2376",
            "--tlsverify",
            "-D",
            "polyarch",
            "build",
            "-H",
        ])
        .unwrap();
        assert_eq!(
            got,
            Invocation::Plugin {
                args: os(&["polyarch", "build", "-H"]),
                env: vec![
                    ("DOCKER_CONFIG", Some("/c".into())),
                    ("DOCKER_HOST", Some("tcp://10.0.0.1:2376".into())),
                    ("DOCKER_CONTEXT", None),
                    ("DOCKER_TLS_VERIFY", Some("1".into())),
                ],
            }
        );
    }

    #[test]
    fn a_context_flag_wins_over_docker_host_and_conflicts_with_a_host_flag() {
        let Invocation::Plugin { env, .. } =
            call(&["docker-polyarch", "--context", "arm", "polyarch", "version"]).unwrap()
        else {
            panic!("a plugin call")
        };
        assert_eq!(
            env,
            vec![
                ("DOCKER_CONTEXT", Some("arm".into())),
                ("DOCKER_HOST", None)
            ]
        );
        let both = call(&["docker-polyarch", "-c", "a", "-H", "unix:///s", "polyarch"]);
        assert!(both
            .unwrap_err()
            .contains("either specify --host or --context"));
    }

    #[test]
    fn tls_files_become_a_cert_path_only_as_docker_names_them() {
        let ok = call(&[
            "docker-polyarch",
            "--tlscacert=/t/ca.pem",
            "--tlscert=/t/cert.pem",
            "--tlskey=/t/key.pem",
            "polyarch",
        ])
        .unwrap();
        assert!(
            matches!(ok, Invocation::Plugin { ref env, .. } if env.contains(&("DOCKER_CERT_PATH", Some("/t".into()))))
        );
        let odd = call(&["docker-polyarch", "--tlscacert", "/t/my-ca.crt", "polyarch"]);
        assert!(odd.is_err());
        let unchecked = call(&["docker-polyarch", "--tls", "polyarch", "version"]);
        assert!(unchecked.unwrap_err().contains("--tlsverify"));
        let checked = call(&["docker-polyarch", "--tls", "--tlsverify", "polyarch"]);
        assert!(checked.is_ok());
    }

    #[test]
    fn without_the_plugin_word_or_with_an_unknown_option_the_error_says_how_to_call_it() {
        assert!(call(&["docker-polyarch", "build"])
            .unwrap_err()
            .contains("docker polyarch"));
        assert!(call(&["docker-polyarch", "--bogus", "polyarch"])
            .unwrap_err()
            .contains("--bogus"));
    }
}

//! `/etc/os-release` (or `/usr/lib/os-release`): the distribution the purls name.

/// A distribution, as os-release names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Distro {
    /// `ID`, e.g. `debian`, `ubuntu`, `alpine`.
    pub id: Option<String>,
    /// `VERSION_ID`, e.g. `12`, `3.19.1`.
    pub version_id: Option<String>,
}

impl Distro {
    /// The purl `distro` qualifier: `debian-12`.
    pub fn qualifier(&self) -> Option<String> {
        Some(format!(
            "{}-{}",
            self.id.as_ref()?,
            self.version_id.as_ref()?
        ))
    }
}

pub(super) fn parse(text: &[u8]) -> Distro {
    let text = String::from_utf8_lossy(text);
    let mut distro = Distro::default();
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once('=') else {
            continue;
        };
        let value = unquote(value.trim());
        // purl segments are lower case and plain; anything else names no distro.
        let plain = !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !plain {
            continue;
        }
        match key.trim() {
            "ID" => distro.id = Some(value.to_ascii_lowercase()),
            "VERSION_ID" => distro.version_id = Some(value.to_string()),
            _ => {}
        }
    }
    distro
}

fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_and_version_id_unquoted() {
        let text = b"PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nID=debian\n";
        let distro = parse(text);
        assert_eq!(distro.qualifier().as_deref(), Some("debian-12"));
        let alpine = parse(b"NAME=\"Alpine Linux\"\nID='alpine'\nVERSION_ID=3.19.1\n");
        assert_eq!(alpine.qualifier().as_deref(), Some("alpine-3.19.1"));
    }

    #[test]
    fn garbage_names_no_distro() {
        for input in [
            &b""[..],
            b"\xff=\xff",
            b"ID=\nVERSION_ID=",
            b"ID=a b&c\n",
            b"===",
        ] {
            assert_eq!(parse(input).qualifier(), None, "{input:?}");
        }
    }
}

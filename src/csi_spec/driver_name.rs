//! The CSI rule for driver names, checked before a name becomes part of a path or a label.

/// The longest driver name the CSI spec allows.
pub const MAX_LEN: usize = 63;

/// A driver name the CSI naming rules refuse, and which rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("driver name {name:?} {problem} (CSI naming rules)")]
pub struct InvalidDriverName {
    pub name: String,
    pub problem: &'static str,
}

/// Checks a driver name against the CSI spec: at most 63 characters, alphanumerics, `-` and `.`,
/// beginning and ending with an alphanumeric (domain-name style). Anything else could, among
/// other harm, put a registration socket outside its directory (`../x`).
pub fn validate(name: &str) -> Result<(), InvalidDriverName> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_LEN {
        Some("is longer than 63 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        Some("may contain only letters, digits, '-' and '.'")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        Some("must begin and end with a letter or digit")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(InvalidDriverName {
            name: name.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::validate;

    #[test]
    fn csi_driver_names_are_checked_against_the_spec() {
        for good in [
            "hostpath.csi.k8s.io",
            "a",
            "x-1.example.io",
            &"a".repeat(63),
        ] {
            assert_eq!(validate(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "../evil",
            "a/b",
            "-lead",
            "trail.",
            "sp ace",
            "ünï",
            &"a".repeat(64),
        ] {
            assert!(validate(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            validate("../evil")
                .unwrap_err()
                .to_string()
                .contains("\"../evil\"")
        );
    }
}

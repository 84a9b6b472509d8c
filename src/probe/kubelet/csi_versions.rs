//! The kubelet's CSI version validation, with its exact error texts: `validateVersions` of the
//! CSI plugin registration handler (`pkg/volume/csi/csi_plugin.go`) on top of apimachinery's
//! `version.ParseGeneric` and `version.HighestSupportedVersion`.

use std::cmp::Ordering;
use std::fmt;

use crate::gocompat::{list, quote, quoted_list};

/// Every error of the CSI plugin handler starts with the in-tree plugin's name.
const CSI_PREFIX: &str = "kubernetes.io/csi: ";

/// A "generic" version: two or more dot-separated numbers; anything after them is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    components: Vec<u64>,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.components.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Go's `\s` in a regular expression.
fn is_go_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\u{c}' | '\r' | ' ')
}

impl Version {
    /// `ParseGeneric`: `^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)*$`, at least two components, no
    /// leading zero in the first.
    pub fn parse_generic(text: &str) -> Result<Version, String> {
        let unparsable = || format!("could not parse {} as version", quote(text));
        let rest = text.trim_start_matches(is_go_space);
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        // Greedy digits and dot-digits; a dot not followed by a digit ends the numbers.
        let bytes = rest.as_bytes();
        let mut end = 0;
        loop {
            let start = end;
            let mut at = end;
            if start > 0 {
                if bytes.get(at) != Some(&b'.') {
                    break;
                }
                at += 1;
            }
            let digits = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits == 0 {
                break;
            }
            end = at + digits;
        }
        // Go's `.` does not match a newline and `$` is the end of the text.
        if end == 0 || rest[end..].contains('\n') {
            return Err(unparsable());
        }
        let components: Vec<&str> = rest[..end].split('.').collect();
        if components.len() < 2 {
            return Err(format!("illegal version string {}", quote(text)));
        }
        let mut parsed = Vec::with_capacity(components.len());
        for (i, component) in components.iter().enumerate() {
            if i == 0 && component.starts_with('0') && *component != "0" {
                return Err(format!(
                    "illegal zero-prefixed version component {} in {}",
                    quote(component),
                    quote(text)
                ));
            }
            let number = component.parse::<u64>().map_err(|_| {
                format!(
                    "illegal non-numeric version component {} in {}: strconv.ParseUint: parsing {}: value out of range",
                    quote(component),
                    quote(text),
                    quote(component)
                )
            })?;
            parsed.push(number);
        }
        Ok(Version { components: parsed })
    }

    pub fn major(&self) -> u64 {
        self.components[0]
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Component by component; missing trailing components count as zero ("1.0" == "1.0.0").
impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.components.len().max(other.components.len());
        (0..len)
            .map(|i| {
                let a = self.components.get(i).copied().unwrap_or(0);
                let b = other.components.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

/// `HighestSupportedVersion`: the highest version with major ≤ 1, which must be 1.x.
pub fn highest_supported(versions: &[String]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err("empty array for supported versions".into());
    }
    let mut highest: Option<Version> = None;
    let mut last_error: Option<String> = None;
    // Last to first, as upstream does: the parse error reported is the first one in the list.
    for text in versions.iter().rev() {
        let version = match Version::parse_generic(text) {
            Ok(version) => version,
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        // CSI 2.x need not be compatible with 1.x, so such versions are skipped.
        if version.major() > 1 {
            continue;
        }
        if highest.as_ref().is_none_or(|h| *h < version) {
            highest = Some(version);
        }
    }
    let Some(highest) = highest else {
        return Err(format!(
            "could not find a highest supported version from versions ({}) reported: {}",
            list(versions),
            last_error.as_deref().unwrap_or("<nil>")
        ));
    };
    if highest.major() != 1 {
        return Err(format!(
            "highest supported version reported is {highest}, must be v1.x"
        ));
    }
    Ok(highest)
}

/// `validateVersions`: non-empty list, a supported 1.x version, and no driver of that name
/// already registered at an equal or higher version. `caller` is `ValidatePlugin` or
/// `RegisterPlugin`, which upstream puts in the text.
pub fn validate_versions(
    caller: &str,
    driver: &str,
    versions: &[String],
    registered: Option<&Version>,
) -> Result<Version, String> {
    let failed = format!(
        "{CSI_PREFIX}{caller} for CSI driver {} failed.",
        quote(driver)
    );
    if versions.is_empty() {
        return Err(format!(
            "{failed} Plugin returned an empty list for supported versions"
        ));
    }
    let highest = highest_supported(versions).map_err(|e| {
        format!(
            "{failed} None of the versions specified {} are supported. err={e}",
            quoted_list(versions)
        )
    })?;
    if let Some(existing) = registered.filter(|existing| **existing >= highest) {
        return Err(format!(
            "{failed} Another driver with the same name is already registered with a higher supported version: {}",
            quote(&existing.to_string())
        ));
    }
    Ok(highest)
}

/// `ValidatePlugin`: the same checks, wrapped with the driver and its endpoint.
pub fn validate_plugin(
    driver: &str,
    endpoint: &str,
    versions: &[String],
    registered: Option<&Version>,
) -> Result<Version, String> {
    validate_versions("ValidatePlugin", driver, versions, registered).map_err(|e| {
        format!("validation failed for CSI Driver {driver} at endpoint {endpoint}: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn versions_parse_as_apimachinery_parse_generic_does() {
        let table: &[(&str, Result<&str, &str>)] = &[
            ("1.0.0", Ok("1.0.0")),
            ("v1.2", Ok("1.2")),
            ("  v1.5.0-rc1", Ok("1.5.0")),
            ("1.2.x", Ok("1.2")),
            ("0.3.0", Ok("0.3.0")),
            ("1.0 ", Ok("1.0")),
            ("1", Err(r#"illegal version string "1""#)),
            ("v1", Err(r#"illegal version string "v1""#)),
            ("1.", Err(r#"illegal version string "1.""#)),
            ("", Err(r#"could not parse "" as version"#)),
            ("V1.0", Err(r#"could not parse "V1.0" as version"#)),
            ("one", Err(r#"could not parse "one" as version"#)),
            ("1.0\n", Err(r#"could not parse "1.0\n" as version"#)),
            (
                "01.0",
                Err(r#"illegal zero-prefixed version component "01" in "01.0""#),
            ),
            ("1.01", Ok("1.1")),
            (
                "99999999999999999999.0",
                Err(
                    r#"illegal non-numeric version component "99999999999999999999" in "99999999999999999999.0": strconv.ParseUint: parsing "99999999999999999999": value out of range"#,
                ),
            ),
        ];
        for (input, expected) in table {
            let got = Version::parse_generic(input).map(|v| v.to_string());
            assert_eq!(
                got.as_deref().map_err(String::as_str),
                *expected,
                "{input:?}"
            );
        }
    }

    #[test]
    fn versions_compare_with_missing_components_as_zero() {
        let v = |s: &str| Version::parse_generic(s).unwrap();
        assert_eq!(v("1.0"), v("1.0"));
        assert_eq!(v("1.0").cmp(&v("1.0.0")), Ordering::Equal);
        assert!(v("1.0") < v("1.0.1"));
        assert!(v("1.10") > v("1.9.9"));
        assert!(v("0.9") < v("1.0"));
    }

    #[test]
    fn the_highest_supported_version_follows_the_kubelets_rules() {
        let table: &[(&[&str], Result<&str, &str>)] = &[
            (&["1.0.0"], Ok("1.0.0")),
            (&["0.3.0", "1.0.0", "1.2.0"], Ok("1.2.0")),
            (&["1.2.0", "1.0.0"], Ok("1.2.0")),
            (&["1.0.0", "2.0.0"], Ok("1.0.0")),
            (&["1", "1.1"], Ok("1.1")),
            (
                &["0.3.0", "0.2.0"],
                Err("highest supported version reported is 0.3.0, must be v1.x"),
            ),
            (
                &["2.0.0", "3.1"],
                Err(
                    "could not find a highest supported version from versions ([2.0.0 3.1]) reported: <nil>",
                ),
            ),
            (
                &["1", "x", "2.0"],
                Err(
                    r#"could not find a highest supported version from versions ([1 x 2.0]) reported: illegal version string "1""#,
                ),
            ),
            (&[], Err("empty array for supported versions")),
        ];
        for (input, expected) in table {
            let got = highest_supported(&strings(input)).map(|v| v.to_string());
            assert_eq!(
                got.as_deref().map_err(String::as_str),
                *expected,
                "{input:?}"
            );
        }
    }

    #[test]
    fn validation_failures_carry_the_kubelets_exact_texts() {
        let registered = Version::parse_generic("1.2.0").unwrap();
        let table: &[(&[&str], Option<&Version>, &str)] = &[
            (
                &[],
                None,
                r#"validation failed for CSI Driver d.csi at endpoint /p/csi.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. Plugin returned an empty list for supported versions"#,
            ),
            (
                &["1"],
                None,
                r#"validation failed for CSI Driver d.csi at endpoint /p/csi.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. None of the versions specified ["1"] are supported. err=could not find a highest supported version from versions ([1]) reported: illegal version string "1""#,
            ),
            (
                &["0.3.0"],
                None,
                r#"validation failed for CSI Driver d.csi at endpoint /p/csi.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. None of the versions specified ["0.3.0"] are supported. err=highest supported version reported is 0.3.0, must be v1.x"#,
            ),
            (
                &["1.2"],
                Some(&registered),
                r#"validation failed for CSI Driver d.csi at endpoint /p/csi.sock: kubernetes.io/csi: ValidatePlugin for CSI driver "d.csi" failed. Another driver with the same name is already registered with a higher supported version: "1.2.0""#,
            ),
        ];
        for (versions, existing, expected) in table {
            let got = validate_plugin("d.csi", "/p/csi.sock", &strings(versions), *existing);
            assert_eq!(got.unwrap_err(), *expected, "{versions:?}");
        }
    }

    #[test]
    fn a_driver_with_a_higher_version_replaces_a_registered_one() {
        let registered = Version::parse_generic("1.0.0").unwrap();
        let got = validate_plugin("d", "/e", &strings(&["1.1.0"]), Some(&registered));
        assert_eq!(got.unwrap().to_string(), "1.1.0");
    }

    #[test]
    fn the_register_step_names_itself_in_the_text() {
        let got = validate_versions("RegisterPlugin", "d", &[], None).unwrap_err();
        assert_eq!(
            got,
            r#"kubernetes.io/csi: RegisterPlugin for CSI driver "d" failed. Plugin returned an empty list for supported versions"#
        );
    }
}

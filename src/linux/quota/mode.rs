//! `--quota=auto|on|off` and what it decides for a filesystem, as a pure function: the
//! probe of the filesystem is passed in, so the decision is tested without one.

use std::fmt;
use std::str::FromStr;

use super::fs::Support;
use super::quota_error::QuotaError;

/// The `--quota` flag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Enforce where the filesystem can, otherwise account as without quotas.
    #[default]
    Auto,
    /// Enforce, or refuse to start.
    On,
    /// Never touch quotas.
    Off,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("--quota must be auto, on or off, not {other:?}")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// What node-server does about quotas on its state directory's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every filesystem volume gets a project ID and a hard limit.
    Enforce,
    /// Sizes are accounted, not enforced; `reason` (one line) says why, at start-up and in
    /// every volume's stats condition.
    AccountOnly { reason: String },
    /// Do not start (exit 1); `reason` is the one line to print.
    Refuse { reason: String },
}

impl Decision {
    /// The one-line reason, unless quotas are enforced.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Enforce => None,
            Self::AccountOnly { reason } | Self::Refuse { reason } => Some(reason),
        }
    }
}

/// Decides for `mode`, calling `probe` (the filesystem's [`Support`]) only when the mode
/// needs it: `off` never touches quotas, not even to look.
pub fn decide(mode: Mode, probe: impl FnOnce() -> Result<Support, QuotaError>) -> Decision {
    let account = |why: String| Decision::AccountOnly {
        reason: one_line(format!("{why}; volume sizes are accounted, not enforced")),
    };
    let refuse = |why: String| Decision::Refuse {
        reason: one_line(format!("--quota=on: {why}")),
    };
    if mode == Mode::Off {
        return Decision::AccountOnly {
            reason: "quotas are off (--quota=off); volume sizes are accounted, not enforced".into(),
        };
    }
    match (mode, probe()) {
        (_, Ok(Support::Enforcing)) => Decision::Enforce,
        (Mode::On, Ok(Support::AccountingOnly { why } | Support::Unsupported { why })) => {
            refuse(why)
        }
        (Mode::On, Err(e)) => refuse(format!("cannot read the project quota state: {e}")),
        (_, Ok(Support::AccountingOnly { why } | Support::Unsupported { why })) => account(why),
        (_, Err(e)) => account(format!("cannot read the project quota state: {e}")),
    }
}

/// Reasons are printed as one line; a kernel message could carry a newline.
fn one_line(text: String) -> String {
    if text.contains('\n') {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsupported() -> Result<Support, QuotaError> {
        Ok(Support::Unsupported {
            why: "/state: project quota accounting is off (XFS: mount with -o prjquota)".into(),
        })
    }

    fn accounting_only() -> Result<Support, QuotaError> {
        Ok(Support::AccountingOnly {
            why: "/state: project quotas are accounted but not enforced".into(),
        })
    }

    fn probe_error() -> Result<Support, QuotaError> {
        Err(QuotaError::Quotactl {
            op: super::super::quota_error::QuotaOp::GetState,
            id: 0,
            path: "/state".into(),
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        })
    }

    #[test]
    fn the_flag_parses_its_three_values_and_names_a_bad_one() {
        assert_eq!("auto".parse(), Ok(Mode::Auto));
        assert_eq!("on".parse(), Ok(Mode::On));
        assert_eq!("off".parse(), Ok(Mode::Off));
        assert_eq!(
            "yes".parse::<Mode>(),
            Err("--quota must be auto, on or off, not \"yes\"".into())
        );
        assert_eq!(Mode::default(), Mode::Auto);
    }

    #[test]
    fn off_never_probes_the_filesystem() {
        let d = decide(Mode::Off, || panic!("--quota=off must not probe"));
        assert!(matches!(d, Decision::AccountOnly { .. }));
        assert!(d.reason().unwrap().contains("--quota=off"));
    }

    #[test]
    fn auto_and_on_enforce_where_the_filesystem_enforces() {
        assert_eq!(
            decide(Mode::Auto, || Ok(Support::Enforcing)),
            Decision::Enforce
        );
        assert_eq!(
            decide(Mode::On, || Ok(Support::Enforcing)),
            Decision::Enforce
        );
        assert_eq!(Decision::Enforce.reason(), None);
    }

    #[test]
    fn auto_keeps_accounting_and_says_why_where_it_cannot_enforce() {
        for probe in [unsupported, accounting_only, probe_error] {
            let d = decide(Mode::Auto, probe);
            let Decision::AccountOnly { reason } = &d else {
                panic!("{d:?}")
            };
            assert!(reason.contains("/state: "), "{reason}");
            assert!(
                reason.ends_with("volume sizes are accounted, not enforced"),
                "{reason}"
            );
        }
    }

    #[test]
    fn on_refuses_with_one_line_naming_the_flag_and_the_cause() {
        let d = decide(Mode::On, unsupported);
        assert_eq!(
            d,
            Decision::Refuse {
                reason: "--quota=on: /state: project quota accounting is off (XFS: mount with -o prjquota)".into()
            }
        );
        let d = decide(Mode::On, accounting_only);
        assert!(matches!(d, Decision::Refuse { .. }));
        let d = decide(Mode::On, probe_error);
        assert!(
            d.reason()
                .unwrap()
                .starts_with("--quota=on: cannot read the project quota state: ")
        );
    }

    #[test]
    fn a_reason_with_a_newline_becomes_one_line() {
        let d = decide(Mode::On, || Ok(Support::Unsupported { why: "a\nb".into() }));
        assert_eq!(d.reason(), Some("--quota=on: a b"));
    }
}

//! One finding: how bad, which check, what was seen, what it means and the most likely fix, in
//! an operator's words. Check names are stable (scripts match on them); texts may improve.

use serde_json::{Value, json};

/// How much a finding matters. Only `Error` makes the doctor exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// A step of the chain that works.
    Ok,
    /// Worth knowing, not wrong (a DRA plugin socket, a root chosen by a fallback).
    Info,
    /// Suspicious or suboptimal; registration can still work.
    Warning,
    /// Registration, or volumes of this driver, will fail.
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Error => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    /// Stable identifier of the check, e.g. `registration.stale`.
    pub check: &'static str,
    /// What was seen.
    pub saw: String,
    /// What it means for registration (empty for `ok`).
    pub means: String,
    /// The most likely fix (empty when there is nothing to do).
    pub fix: String,
}

impl Finding {
    pub fn ok(check: &'static str, saw: impl Into<String>) -> Self {
        Self::new(Severity::Ok, check, saw, "", "")
    }

    pub fn info(check: &'static str, saw: impl Into<String>, means: impl Into<String>) -> Self {
        Self::new(Severity::Info, check, saw, means, "")
    }

    pub fn warning(
        check: &'static str,
        saw: impl Into<String>,
        means: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(Severity::Warning, check, saw, means, fix)
    }

    pub fn error(
        check: &'static str,
        saw: impl Into<String>,
        means: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(Severity::Error, check, saw, means, fix)
    }

    fn new(
        severity: Severity,
        check: &'static str,
        saw: impl Into<String>,
        means: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            severity,
            check,
            saw: saw.into(),
            means: means.into(),
            fix: fix.into(),
        }
    }

    /// One line: `error    <saw> — <means>. Fix: <fix>.`
    pub fn line(&self) -> String {
        let mut line = format!("{:<8} {}", self.severity.as_str(), self.saw);
        if !self.means.is_empty() {
            line.push_str(" — ");
            line.push_str(&self.means);
        }
        if !self.fix.is_empty() {
            line.push_str(". Fix: ");
            line.push_str(&self.fix);
        }
        line
    }

    pub fn to_json(&self) -> Value {
        json!({
            "severity": self.severity.as_str(),
            "check": self.check,
            "saw": self.saw,
            "means": self.means,
            "fix": self.fix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_carries_the_severity_what_was_seen_what_it_means_and_the_fix() {
        let finding = Finding::error("x.y", "nobody listens", "the kubelet fails", "restart it");
        assert_eq!(
            finding.line(),
            "error    nobody listens — the kubelet fails. Fix: restart it"
        );
        assert_eq!(Finding::ok("x.y", "fine").line(), "ok       fine");
    }

    #[test]
    fn severities_order_from_ok_to_error() {
        assert!(Severity::Ok < Severity::Info && Severity::Warning < Severity::Error);
    }
}

//! The doctor's report: node-wide findings, then one group per plugin, then a summary line; or
//! one JSON document with stable field names (documented in docs/troubleshooting.md).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::chain::Plugin;
use super::finding::{Finding, Severity};
use super::root::Decision;
use crate::probe::kubelet::Output;

#[derive(Debug, Clone)]
pub struct Report {
    pub root: Decision,
    pub host_root: Option<PathBuf>,
    pub node_name: String,
    /// Where the API comparisons came from (`kubeconfig <path>`, `in-cluster`), if made.
    pub api: Option<String>,
    /// Findings about the node as a whole: the root, the registry, driver sockets without a
    /// registrar, the API objects.
    pub node: Vec<Finding>,
    pub plugins: Vec<Plugin>,
    pub elapsed: Duration,
}

fn count(findings: &[Finding], severity: Severity) -> usize {
    findings.iter().filter(|f| f.severity == severity).count()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

impl Report {
    fn all(&self) -> impl Iterator<Item = &Finding> {
        self.node
            .iter()
            .chain(self.plugins.iter().flat_map(|p| p.findings.iter()))
    }

    pub fn count(&self, severity: Severity) -> usize {
        self.all().filter(|f| f.severity == severity).count()
    }

    /// Healthy: no finding of severity error (warnings do not count).
    pub fn healthy(&self) -> bool {
        self.count(Severity::Error) == 0
    }

    /// Every finding of one check, for tests and scripts.
    pub fn findings(&self, check: &str) -> Vec<&Finding> {
        self.all().filter(|f| f.check == check).collect()
    }

    fn summary(&self) -> String {
        let errors = self.count(Severity::Error);
        let verdict = if errors == 0 {
            "no problem found"
        } else {
            "registration is broken, see the errors above"
        };
        format!(
            "summary: {}, {}, {} in {} ms: {verdict}",
            plural(self.plugins.len(), "plugin"),
            plural(errors, "error"),
            plural(self.count(Severity::Warning), "warning"),
            self.elapsed.as_millis()
        )
    }

    pub fn render(&self, output: Output) -> String {
        match output {
            Output::Json => self.to_json().to_string(),
            Output::Text => self.to_text(),
        }
    }

    fn to_text(&self) -> String {
        let mut out = String::from("node");
        out.push_str(&format!(" {}", self.node_name));
        if let Some(api) = &self.api {
            out.push_str(&format!(" (API objects read with {api})"));
        }
        out.push('\n');
        for finding in &self.node {
            out.push_str(&format!("  {}\n", finding.line()));
        }
        for plugin in &self.plugins {
            out.push_str(&format!("plugin {}", plugin.socket.display()));
            if let Some(driver) = plugin.driver.as_deref().filter(|d| !d.is_empty()) {
                out.push_str(&format!(" (driver {driver})"));
            }
            out.push('\n');
            for finding in &plugin.findings {
                out.push_str(&format!("  {}\n", finding.line()));
            }
        }
        out.push_str(&self.summary());
        out
    }

    pub fn to_json(&self) -> Value {
        let findings = |list: &[Finding]| list.iter().map(Finding::to_json).collect::<Vec<_>>();
        let plugins: Vec<Value> = self
            .plugins
            .iter()
            .map(|p| {
                json!({
                    "socket": p.socket,
                    "driver": p.driver,
                    "endpoint": p.endpoint,
                    "healthy": count(&p.findings, Severity::Error) == 0,
                    "findings": findings(&p.findings),
                })
            })
            .collect();
        json!({
            "kubeletRoot": {
                "path": self.root.path,
                "source": self.root.source.as_str(),
                "reason": self.root.reason,
            },
            "hostRoot": self.host_root,
            "nodeName": self.node_name,
            "api": self.api,
            "findings": findings(&self.node),
            "plugins": plugins,
            "summary": {
                "plugins": self.plugins.len(),
                "errors": self.count(Severity::Error),
                "warnings": self.count(Severity::Warning),
                "healthy": self.healthy(),
                "elapsedMs": self.elapsed.as_millis() as u64,
            },
        })
    }
}

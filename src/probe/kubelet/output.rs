//! What the emulator tells its user: one event per registration, failure or deregistration
//! as it happens, and the one report of `--once`; as text or as JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::csinode::NODE_ID_ANNOTATION;
use crate::cli::values::{FlagValue, Refusal};
use crate::flow::Arrow;

/// How events and reports are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

impl FlagValue for Output {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(Refusal::new("expected text or json")),
        }
    }
}

crate::cli::values::flag_value!(Output);

/// What the kubelet would have written to the API server, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// The `csi.volume.kubernetes.io/nodeid` annotation; `None` when no driver is left.
    pub annotation: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub csi_node: Value,
}

/// A plugin the kubelet registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub driver: String,
    /// The driver's endpoint as the plugin gave it (a host path).
    pub endpoint: String,
    pub node_id: String,
}

/// A registration that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The driver name, once GetInfo has told it.
    pub driver: Option<String>,
    /// The kubelet's text: what it sent with `NotifyRegistrationStatus(false)`, or, when it
    /// could not send anything, the error it logs.
    pub reason: String,
}

/// Whether the kubelet tries a failed registration again on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Yes, once the back-off has passed.
    After(Duration),
    /// No: the plugin already counts as registered (a failure after validation), or its socket
    /// is gone. Only a re-created socket starts a new attempt.
    Never,
}

/// One thing that happened, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Registered {
        socket: PathBuf,
        registration: Registration,
        node: NodeView,
        /// The calls of this attempt, timed (JSON's `calls`).
        calls: Vec<Arrow>,
    },
    Failed {
        socket: PathBuf,
        failure: Failure,
        retry: Retry,
        calls: Vec<Arrow>,
    },
    Deregistered {
        socket: PathBuf,
        driver: String,
        node: NodeView,
    },
}

fn node_json(node: &NodeView) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(value) = &node.annotation {
        annotations.insert(NODE_ID_ANNOTATION.into(), value.clone().into());
    }
    json!({ "name": node.name, "annotations": annotations, "labels": node.labels })
}

/// The Node's annotation and labels and the CSINode, for people: compact in event lines,
/// pretty-printed in the `--once` report.
fn node_text(node: &NodeView, indent: &str, pretty: bool) -> String {
    let annotation = node.annotation.as_deref().unwrap_or("(none)");
    let labels: Vec<String> = node
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let labels = if labels.is_empty() {
        "(none)".to_owned()
    } else {
        labels.join(",")
    };
    let csi_node = if pretty {
        format!(
            "\n{}",
            serde_json::to_string_pretty(&node.csi_node).unwrap_or_default()
        )
    } else {
        format!(" {}", node.csi_node)
    };
    format!(
        "{indent}Node {} annotation {NODE_ID_ANNOTATION}: {annotation}\n\
         {indent}Node labels: {labels}\n{indent}CSINode:{csi_node}",
        node.name
    )
}

impl Event {
    /// One line of JSON, or a few lines of text.
    pub fn render(&self, output: Output) -> String {
        match output {
            Output::Json => self.to_json().to_string(),
            Output::Text => self.to_text(),
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Event::Registered {
                socket,
                registration: r,
                node,
                calls,
            } => json!({
                "event": "registered",
                "socket": socket,
                "driver": r.driver,
                "endpoint": r.endpoint,
                "nodeID": r.node_id,
                "node": node_json(node),
                "csiNode": node.csi_node,
                "calls": calls,
            }),
            Event::Failed {
                socket,
                failure,
                retry,
                calls,
            } => json!({
                "calls": calls,
                "event": "failed",
                "socket": socket,
                "driver": failure.driver,
                "reason": failure.reason,
                "retryAfterSeconds": match retry {
                    Retry::After(wait) => json!(wait.as_secs_f64()),
                    Retry::Never => Value::Null,
                },
            }),
            Event::Deregistered {
                socket,
                driver,
                node,
            } => json!({
                "event": "deregistered",
                "socket": socket,
                "driver": driver,
                "node": node_json(node),
                "csiNode": node.csi_node,
            }),
        }
    }

    fn to_text(&self) -> String {
        match self {
            Event::Registered {
                socket,
                registration: r,
                node,
                ..
            } => format!(
                "registered {} from {} (endpoint {}, node ID {})\n{}",
                r.driver,
                socket.display(),
                r.endpoint,
                r.node_id,
                node_text(node, "  ", false)
            ),
            Event::Failed {
                socket,
                failure,
                retry,
                ..
            } => {
                let then = match retry {
                    Retry::After(wait) => format!("the kubelet retries in {wait:?} or later"),
                    Retry::Never => {
                        "the kubelet does not retry until the socket is re-created".to_owned()
                    }
                };
                format!("failed {}: {}\n  {then}", socket.display(), failure.reason)
            }
            Event::Deregistered {
                socket,
                driver,
                node,
            } => format!(
                "deregistered {driver} ({} removed)\n{}",
                socket.display(),
                node_text(node, "  ", false)
            ),
        }
    }
}

/// The result of `--once`: every socket found, in walk order, and the final writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub registry: PathBuf,
    pub plugins: Vec<(PathBuf, Result<Registration, Failure>)>,
    pub node: NodeView,
}

impl Report {
    /// `None` when every plugin registered; else the one-line reason for exit code 1.
    pub fn problem(&self) -> Option<String> {
        let failed = self.plugins.iter().filter(|(_, r)| r.is_err()).count();
        if self.plugins.is_empty() {
            Some(format!(
                "no plugin sockets found in {}",
                self.registry.display()
            ))
        } else if failed > 0 {
            Some(format!(
                "{failed} of {} plugins failed to register",
                self.plugins.len()
            ))
        } else {
            None
        }
    }

    pub fn render(&self, output: Output) -> String {
        match output {
            Output::Json => {
                let plugins: Vec<Value> = self
                    .plugins
                    .iter()
                    .map(|(socket, result)| match result {
                        Ok(r) => json!({
                            "socket": socket, "registered": true, "driver": r.driver,
                            "endpoint": r.endpoint, "nodeID": r.node_id,
                        }),
                        Err(f) => json!({
                            "socket": socket, "registered": false, "driver": f.driver,
                            "reason": f.reason,
                        }),
                    })
                    .collect();
                let report = json!({
                    "registry": self.registry,
                    "plugins": plugins,
                    "node": node_json(&self.node),
                    "csiNode": self.node.csi_node,
                });
                serde_json::to_string_pretty(&report).unwrap_or_default()
            }
            Output::Text => self.to_text(),
        }
    }

    fn to_text(&self) -> String {
        let mut lines = vec![format!("plugins registry {}", self.registry.display())];
        for (socket, result) in &self.plugins {
            lines.push(match result {
                Ok(r) => format!(
                    "  registered  {} from {} (node ID {})",
                    r.driver,
                    socket.display(),
                    r.node_id
                ),
                Err(f) => format!("  failed      {}: {}", socket.display(), f.reason),
            });
        }
        let registered = self.plugins.iter().filter(|(_, r)| r.is_ok()).count();
        lines.push(format!(
            "{registered} of {} plugins registered",
            self.plugins.len()
        ));
        lines.push(node_text(&self.node, "", true));
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> NodeView {
        NodeView {
            name: "n1".into(),
            annotation: None,
            labels: BTreeMap::new(),
            csi_node: json!({"kind": "CSINode"}),
        }
    }

    #[test]
    fn output_formats_parse_and_unknown_ones_are_named() {
        assert_eq!(Output::parse("json"), Ok(Output::Json));
        assert_eq!(Output::parse("text"), Ok(Output::Text));
        assert_eq!(
            Output::parse("yaml").unwrap_err().why(),
            "expected text or json"
        );
    }

    #[test]
    fn a_report_is_a_success_only_when_plugins_exist_and_all_registered() {
        let ok = Ok(Registration {
            driver: "d".into(),
            endpoint: "/e".into(),
            node_id: "n".into(),
        });
        let bad = Err(Failure {
            driver: None,
            reason: "r".into(),
        });
        let report = |plugins| Report {
            registry: "/reg".into(),
            plugins,
            node: view(),
        };
        let table = [
            (vec![], Some("no plugin sockets found in /reg")),
            (vec![("/reg/a".into(), ok.clone())], None),
            (
                vec![("/reg/a".into(), ok), ("/reg/b".into(), bad)],
                Some("1 of 2 plugins failed to register"),
            ),
        ];
        for (plugins, expected) in table {
            assert_eq!(report(plugins).problem().as_deref(), expected);
        }
    }

    #[test]
    fn a_failure_event_says_whether_the_kubelet_retries() {
        let failed = |retry| Event::Failed {
            calls: Vec::new(),
            socket: "/reg/a".into(),
            failure: Failure {
                driver: Some("d".into()),
                reason: "why".into(),
            },
            retry,
        };
        let json = failed(Retry::After(Duration::from_millis(500))).to_json();
        assert_eq!(json["retryAfterSeconds"], json!(0.5));
        assert_eq!(json["reason"], json!("why"));
        assert_eq!(
            failed(Retry::Never).to_json()["retryAfterSeconds"],
            Value::Null
        );
        let text = failed(Retry::Never).render(Output::Text);
        assert!(text.starts_with("failed /reg/a: why\n"), "{text}");
        assert!(text.contains("does not retry"), "{text}");
    }
}

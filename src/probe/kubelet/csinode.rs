//! What the kubelet writes to the API server for registered CSI drivers (its `nodeinfomanager`):
//! the Node annotation `csi.volume.kubernetes.io/nodeid`, topology labels on the Node, and the
//! node's `CSINode` object. Kept in memory and rendered as JSON that `kubectl` accepts.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

use crate::gocompat::quote;

/// The Node annotation holding a JSON map of driver name → node ID.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// One entry of `CSINode.spec.drivers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    pub name: String,
    pub node_id: String,
    /// Sorted, as upstream's `sets.List` returns them.
    pub topology_keys: Vec<String>,
    /// `allocatable.count`; only for a positive `max_volumes_per_node`.
    pub allocatable: Option<i32>,
}

/// The parts of the Node and the CSINode that CSI registration touches.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    node_ids: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    drivers: Vec<Driver>,
}

impl NodeState {
    /// `InstallCSIDriver`: annotation, topology labels, then the CSINode entry.
    pub fn install(
        &mut self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &HashMap<String, String>,
    ) -> Result<(), String> {
        if node_id.is_empty() {
            return Err("error adding CSI driver node info: driverNodeID must not be empty".into());
        }
        // Upstream checks every segment before changing the Node, so a collision changes
        // nothing; its update is retried 4 times, hence the "timed out" wrapper. Sorted here
        // so that the reported collision does not depend on map order.
        let sorted: BTreeMap<&String, &String> = topology.iter().collect();
        for (key, value) in &sorted {
            if let Some(current) = self.labels.get(*key).filter(|c| c != value) {
                return Err(format!(
                    "error updating Node object with CSI driver node info: error updating node: \
                     timed out waiting for the condition; caused by: detected topology value \
                     collision: driver reported {}:{} but existing label is {}:{}",
                    quote(key),
                    quote(value),
                    quote(key),
                    quote(current)
                ));
            }
        }
        self.node_ids.insert(driver.to_owned(), node_id.to_owned());
        for (key, value) in sorted {
            self.labels.insert(key.clone(), value.clone());
        }
        let allocatable = match max_volumes {
            n if n > 0 => Some(i32::try_from(n).unwrap_or(i32::MAX)),
            0 => None,
            n => {
                log::warn!(
                    "Invalid attach limit value {n} cannot be added to CSINode object for {}",
                    quote(driver)
                );
                None
            }
        };
        let entry = Driver {
            name: driver.to_owned(),
            node_id: node_id.to_owned(),
            topology_keys: topology
                .keys()
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            allocatable,
        };
        // An unchanged entry keeps its place; a changed one is dropped and appended.
        if !self.drivers.contains(&entry) {
            self.drivers.retain(|d| d.name != driver);
            self.drivers.push(entry);
        }
        Ok(())
    }

    /// `UninstallCSIDriver`: the CSINode entry and the annotation key go; labels stay.
    pub fn uninstall(&mut self, driver: &str) {
        self.drivers.retain(|d| d.name != driver);
        self.node_ids.remove(driver);
    }

    pub fn drivers(&self) -> &[Driver] {
        &self.drivers
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The annotation value as Go's `json.Marshal` writes the map: keys sorted, and `<`, `>`,
    /// `&`, U+2028 and U+2029 escaped. `None` once no driver is left (upstream deletes the key).
    pub fn annotation(&self) -> Option<String> {
        if self.node_ids.is_empty() {
            return None;
        }
        let plain = serde_json::to_string(&self.node_ids).unwrap_or_default();
        let mut escaped = String::with_capacity(plain.len());
        for c in plain.chars() {
            match c {
                '<' => escaped.push_str("\\u003c"),
                '>' => escaped.push_str("\\u003e"),
                '&' => escaped.push_str("\\u0026"),
                '\u{2028}' => escaped.push_str("\\u2028"),
                '\u{2029}' => escaped.push_str("\\u2029"),
                c => escaped.push(c),
            }
        }
        Some(escaped)
    }

    /// The `CSINode` object. Upstream also sets an owner reference to the Node (which needs the
    /// Node's UID, unknown here) and a CSI-migration annotation unrelated to the plugin; both
    /// are left out so that the object applies as it is.
    pub fn csi_node(&self, node_name: &str) -> Value {
        let drivers: Vec<Value> = self
            .drivers
            .iter()
            .map(|d| {
                let mut entry = json!({
                    "name": d.name,
                    "nodeID": d.node_id,
                    "topologyKeys": d.topology_keys,
                });
                if let Some(count) = d.allocatable {
                    entry["allocatable"] = json!({ "count": count });
                }
                entry
            })
            .collect();
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": { "name": node_name },
            "spec": { "drivers": drivers },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_installed_driver_appears_in_the_csinode_annotation_and_labels() {
        let mut node = NodeState::default();
        let zone = topology(&[("topology.x/zone", "a"), ("topology.x/rack", "r1")]);
        node.install("x.csi", "n1", 12, &zone).unwrap();
        assert_eq!(
            node.csi_node("node-1"),
            json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": "node-1"},
                "spec": {"drivers": [{
                    "name": "x.csi",
                    "nodeID": "n1",
                    "topologyKeys": ["topology.x/rack", "topology.x/zone"],
                    "allocatable": {"count": 12},
                }]},
            })
        );
        assert_eq!(node.annotation().as_deref(), Some(r#"{"x.csi":"n1"}"#));
        assert_eq!(
            node.labels().get("topology.x/zone").map(String::as_str),
            Some("a")
        );
    }

    #[test]
    fn allocatable_is_written_only_for_a_positive_limit_and_capped_at_int32() {
        let table = [
            (0, None),
            (-3, None),
            (7, Some(7)),
            (1 << 40, Some(i32::MAX)),
        ];
        for (max, expected) in table {
            let mut node = NodeState::default();
            node.install("d", "n", max, &HashMap::new()).unwrap();
            assert_eq!(node.drivers()[0].allocatable, expected, "{max}");
            let rendered = node.csi_node("n");
            assert_eq!(
                rendered["spec"]["drivers"][0].get("allocatable").is_some(),
                expected.is_some()
            );
        }
    }

    #[test]
    fn the_annotation_merges_drivers_sorted_and_escapes_as_go_does() {
        let mut node = NodeState::default();
        node.install("z.csi", "n<1>", 0, &HashMap::new()).unwrap();
        node.install("a.csi", "n&2", 0, &HashMap::new()).unwrap();
        assert_eq!(
            node.annotation().as_deref(),
            Some(r#"{"a.csi":"n\u00262","z.csi":"n\u003c1\u003e"}"#)
        );
        node.uninstall("a.csi");
        node.uninstall("z.csi");
        assert_eq!(node.annotation(), None);
    }

    #[test]
    fn an_empty_node_id_is_refused_with_the_kubelets_text() {
        let mut node = NodeState::default();
        let err = node.install("d", "", 0, &HashMap::new()).unwrap_err();
        assert_eq!(
            err,
            "error adding CSI driver node info: driverNodeID must not be empty"
        );
        assert!(node.drivers().is_empty() && node.annotation().is_none());
    }

    #[test]
    fn a_topology_collision_changes_nothing_and_names_both_values() {
        let mut node = NodeState::default();
        node.install("a", "n", 0, &topology(&[("zone", "1")]))
            .unwrap();
        let err = node
            .install("b", "n", 0, &topology(&[("zone", "2")]))
            .unwrap_err();
        assert_eq!(
            err,
            "error updating Node object with CSI driver node info: error updating node: timed \
             out waiting for the condition; caused by: detected topology value collision: \
             driver reported \"zone\":\"2\" but existing label is \"zone\":\"1\""
        );
        assert_eq!(node.drivers().len(), 1);
        assert_eq!(node.annotation().as_deref(), Some(r#"{"a":"n"}"#));
    }

    #[test]
    fn uninstalling_drops_the_entry_and_annotation_key_but_keeps_labels() {
        let mut node = NodeState::default();
        node.install("a", "n1", 0, &topology(&[("zone", "1")]))
            .unwrap();
        node.install("b", "n2", 0, &HashMap::new()).unwrap();
        node.uninstall("a");
        let names: Vec<&str> = node.drivers().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b"]);
        assert_eq!(node.annotation().as_deref(), Some(r#"{"b":"n2"}"#));
        assert_eq!(node.labels().get("zone").map(String::as_str), Some("1"));
    }

    #[test]
    fn a_changed_entry_moves_to_the_end_and_an_unchanged_one_stays() {
        let mut node = NodeState::default();
        node.install("a", "n1", 0, &HashMap::new()).unwrap();
        node.install("b", "n2", 0, &HashMap::new()).unwrap();
        node.install("a", "n1", 0, &HashMap::new()).unwrap();
        let order =
            |n: &NodeState| -> Vec<String> { n.drivers().iter().map(|d| d.name.clone()).collect() };
        assert_eq!(order(&node), ["a", "b"]);
        node.install("a", "n9", 0, &HashMap::new()).unwrap();
        assert_eq!(order(&node), ["b", "a"]);
    }
}

//! `components/snapshot-metadata`, changed-block backups: the external-snapshot-metadata
//! sidecar beside node-server, announced by a SnapshotMetadataService named after the driver at
//! the address of a Service that never leaves the client's node, with the CA given to the render
//! script; node-server advertises the capability the sidecar requires only with the component.
//! (The sidecar's flags and rights against its pinned release: `upstream_sidecars.rs`.)

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::manifests::{
    EVERY_COMPONENT, IMAGE, check_command_lines, container, documents_in, kind, manifest_dir,
    manifests_in, our_daemonset, pod_spec, rendered, strings, test_ca, validate_strictly,
};

const ADVERTISE: &str = "--advertise-snapshot-metadata";
const SIDECAR: &str = "csi-snapshot-metadata";

/// The one document of `kind` named `name`.
fn object<'a>(docs: &'a [(PathBuf, Value)], of: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d) == of && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{of} {name}");
    found[0]
}

/// node-server's command line as the kubelet runs it: `command` then `args`.
fn node_server_line(daemonset: &Value) -> Vec<String> {
    let c = container(daemonset, "node-server");
    let mut line = strings(&c["command"]);
    line.extend(strings(&c["args"]));
    line
}

/// The value of `--flag=value` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

fn base64_of(file: &std::path::Path) -> String {
    let output = Command::new("base64")
        .arg("-w0")
        .arg(file)
        .output()
        .expect("base64 (coreutils)");
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn the_sidecar_is_announced_under_the_driver_name_at_a_service_that_keeps_clients_on_their_node() {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    let daemonset = our_daemonset(&docs);
    let (_, driver) = docs.iter().find(|(_, d)| kind(d) == "CSIDriver").unwrap();
    let driver = driver["metadata"]["name"].as_str().unwrap();

    // Named after the driver: the sidecar and every client look it up by that name.
    let service_object = object(&docs, "SnapshotMetadataService", driver);
    let spec = &service_object["spec"];
    let (host, port) = spec["address"].as_str().unwrap().rsplit_once(':').unwrap();
    let (name, namespace) = host.split_once('.').expect("<service>.<namespace>");
    let service = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            kind(d) == "Service"
                && d["metadata"]["name"] == name
                && d["metadata"]["namespace"] == namespace
        })
        .unwrap_or_else(|| panic!("no Service {host}"));
    assert!(!spec["audience"].as_str().unwrap().is_empty());

    // Node-local: a client reaches its own node's sidecar, whose node-server holds that
    // node's snapshots, or none.
    assert_eq!(service["spec"]["internalTrafficPolicy"], "Local");
    assert!(
        service["spec"]["clusterIP"].is_null(),
        "a ClusterIP Service"
    );
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &labels[key], value,
            "the Service selects the node plugin's pods"
        );
    }
    let ports = service["spec"]["ports"].as_array().unwrap();
    let service_port = ports
        .iter()
        .find(|p| p["port"].as_i64() == Some(port.parse().unwrap()))
        .unwrap_or_else(|| panic!("no port {port} in {ports:?}"));

    // The Service's port is the sidecar's TLS gRPC port.
    let sidecar = container(daemonset, SIDECAR);
    let args = strings(&sidecar["args"]);
    let grpc: i64 = flag(&args, "port").expect("--port").parse().unwrap();
    let declared = sidecar["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == service_port["targetPort"])
        .expect("the Service's targetPort is a named port of the sidecar");
    assert_eq!(declared["containerPort"], grpc);

    // Its certificate and key from the Secret the docs tell how to make.
    let mount = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "snapshot-metadata-tls")
        .expect("the TLS Secret's mount");
    assert_eq!(mount["readOnly"], true);
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(
        flag(&args, "tls-cert"),
        Some(format!("{dir}/tls.crt").as_str())
    );
    assert_eq!(
        flag(&args, "tls-key"),
        Some(format!("{dir}/tls.key").as_str())
    );
    let volume = pod_spec(daemonset).unwrap()["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "snapshot-metadata-tls")
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"],
        "csi-nodekit-snapshot-metadata-tls"
    );
    // Without the Secret only the sidecar fails; node-server still serves the node's volumes.
    assert_eq!(volume["secret"]["optional"], true);
    // The driver socket, which node-server serves.
    let socket = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "socket-dir")
        .expect("the socket directory");
    let csi = flag(&args, "csi-address").unwrap();
    assert_eq!(
        csi,
        format!("{}/csi.sock", socket["mountPath"].as_str().unwrap())
    );
    // Ready once it found node-server with the capability: /health on --http-endpoint.
    let http: i64 = flag(&args, "http-endpoint")
        .and_then(|e| e.strip_prefix(':'))
        .expect("--http-endpoint=:<port>")
        .parse()
        .unwrap();
    let probe = &sidecar["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/health");
    let named = sidecar["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == probe["port"])
        .expect("the probe's port is declared");
    assert_eq!(named["containerPort"], http);
    assert_eq!(sidecar["securityContext"]["runAsNonRoot"], true);

    // The capability the sidecar waits for, on node-server's command line (which
    // check_command_lines runs through the binary).
    assert!(node_server_line(daemonset).contains(&ADVERTISE.to_owned()));
    check_command_lines(&docs, IMAGE);
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn the_snapshot_metadata_service_carries_the_ca_given_to_the_script_and_ships_only_a_placeholder() {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    let rendered_ca =
        object(&docs, "SnapshotMetadataService", "nodekit.csi.local")["spec"]["caCert"]
            .as_str()
            .unwrap()
            .to_owned();
    assert_eq!(rendered_ca, base64_of(&test_ca()));

    // Another CA, another caCert: nothing of the first is kept.
    let other = tempfile::tempdir().unwrap();
    let pem = other.path().join("other-ca.pem");
    let text = std::fs::read_to_string(test_ca()).unwrap();
    std::fs::write(&pem, text.replace("MII", "MIJ")).unwrap();
    let ca_flag = format!("--snapshot-metadata-ca={}", pem.display());
    let out = rendered(&["--with=snapshots,snapshot-metadata", &ca_flag]);
    let docs = documents_in(out.path());
    let spec = &object(&docs, "SnapshotMetadataService", "nodekit.csi.local")["spec"];
    assert_eq!(spec["caCert"].as_str().unwrap(), base64_of(&pem));

    // The component itself holds a stand-in that verifies nothing and says what to do.
    let shipped = manifest_dir().join("components/snapshot-metadata");
    let shipped_docs = documents_in(&shipped);
    let placeholder = object(
        &shipped_docs,
        "SnapshotMetadataService",
        "nodekit.csi.local",
    )["spec"]["caCert"]
        .as_str()
        .unwrap();
    let decoded = Command::new("sh")
        .args(["-c", "printf %s \"$1\" | base64 -d", "-", placeholder])
        .output()
        .unwrap();
    let decoded = String::from_utf8(decoded.stdout).unwrap();
    assert!(!decoded.contains("BEGIN CERTIFICATE"), "{decoded}");
    assert!(decoded.contains("--snapshot-metadata-ca"), "{decoded}");
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn without_the_component_node_server_advertises_nothing_new_and_no_sidecar_or_announcement_ships() {
    for with in ["--with=snapshots,metrics", "--with=selinux,snapshots"] {
        let out = rendered(&[with]);
        let docs = documents_in(out.path());
        let daemonset = our_daemonset(&docs);
        assert!(
            !node_server_line(daemonset).contains(&ADVERTISE.to_owned()),
            "{with}"
        );
        let names: Vec<&str> = pod_spec(daemonset).unwrap()["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert!(!names.contains(&SIDECAR), "{with}: {names:?}");
        assert!(
            !docs
                .iter()
                .any(|(_, d)| kind(d) == "SnapshotMetadataService"),
            "{with}"
        );
    }
    // And with it beside the SELinux choice: valid, and every command line accepted.
    let out = rendered(&["--with=selinux,snapshots,snapshot-metadata"]);
    validate_strictly(&manifests_in(out.path()));
    let docs = documents_in(out.path());
    assert!(node_server_line(our_daemonset(&docs)).contains(&ADVERTISE.to_owned()));
    check_command_lines(&docs, IMAGE);
}

//! Prometheus metrics shared by the sidecar modes: `csi_sidecar_operations_seconds` for every
//! call to the driver (the same name, labels and buckets as the upstream sidecars, so existing
//! dashboards keep working), `process_start_time_seconds`, and whatever a mode registers.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Metric;
use prometheus_client::registry::Registry;

/// The upstream sidecars' buckets for `csi_sidecar_operations_seconds`.
const BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    driver_name: String,
    method_name: String,
    grpc_status_code: String,
}

type HistogramMaker = fn() -> Histogram;

/// A registry with the metrics every sidecar mode exposes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    operations: Family<OperationLabels, Histogram, HistogramMaker>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let operations: Family<OperationLabels, Histogram, HistogramMaker> =
            Family::new_with_constructor(|| Histogram::new(BUCKETS));
        registry.register(
            "csi_sidecar_operations_seconds",
            "Time taken by CSI operations",
            operations.clone(),
        );
        let start: Gauge<f64, AtomicU64> = Gauge::default();
        start.set(process_start_time());
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            start,
        );
        Self {
            registry,
            operations,
        }
    }

    /// Adds a mode's own metric (before the registry is shared).
    pub fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.registry.register(name, help, metric);
    }

    /// Records one call to the driver. `method` is the full gRPC path, as upstream labels it.
    pub fn observe(&self, driver: &str, method: &str, code: tonic::Code, elapsed: Duration) {
        let labels = OperationLabels {
            driver_name: driver.to_owned(),
            method_name: method.to_owned(),
            grpc_status_code: crate::gocompat::code_name(code).to_owned(),
        };
        self.operations
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// The registry in the OpenMetrics text format (which Prometheus scrapes natively).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            log::warn!("encode metrics: {e}");
        }
        text
    }
}

/// When this process started, from the kernel's record (boot time + start ticks), so the value
/// does not depend on when metrics were first set up.
fn process_start_time() -> f64 {
    let from_proc = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Field 22 (starttime), counted after the ")" that ends the command name.
        let after_name = stat.rsplit_once(')')?.1;
        let ticks: f64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
        let boot: f64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()?? as f64;
        Some(boot + ticks / hz)
    };
    from_proc().unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_exposed_with_upstream_names_labels_and_buckets() {
        let metrics = Metrics::new();
        metrics.observe(
            "x.csi.io",
            "/csi.v1.Identity/Probe",
            tonic::Code::Ok,
            Duration::from_millis(30),
        );
        metrics.observe(
            "x.csi.io",
            "/csi.v1.Identity/Probe",
            tonic::Code::DeadlineExceeded,
            Duration::from_secs(3),
        );
        let text = metrics.encode();
        let labels = r#"driver_name="x.csi.io",method_name="/csi.v1.Identity/Probe""#;
        let line = |le: &str, code: &str, n: u32| {
            format!(
                "csi_sidecar_operations_seconds_bucket{{le=\"{le}\",{labels},grpc_status_code=\"{code}\"}} {n}\n"
            )
        };
        for expected in [
            line("0.1", "OK", 1),
            line("2.5", "DeadlineExceeded", 0),
            line("5.0", "DeadlineExceeded", 1),
        ] {
            assert!(text.contains(&expected), "missing {expected} in {text}");
        }
        for le in BUCKETS {
            assert!(
                text.contains(&format!("le=\"{le:?}\"")),
                "bucket {le} missing"
            );
        }
        assert!(text.contains("process_start_time_seconds "), "{text}");
    }

    #[test]
    fn the_process_start_time_is_in_the_recent_past() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = process_start_time();
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "start {start}, now {now}"
        );
    }
}

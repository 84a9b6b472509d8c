//! `--http-endpoint`: node-server's `/metrics`, the process metrics every mode shares and
//! what the quota checks found — escapes from volumes' project quotas, charged back — read
//! from the driver's totals at each scrape.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;

use crate::http::Reply;
use crate::metrics::Metrics;
use crate::node_server::state::escapes::Totals;

/// The quota checks' counters, as registered.
#[derive(Debug, Default)]
struct QuotaCounters {
    episodes: Counter,
    inodes: Counter,
    bytes: Counter,
    walks: Counter,
    walked: Counter,
}

impl QuotaCounters {
    fn register(metrics: &mut Metrics) -> Self {
        let counters = Self::default();
        let named = [
            (
                "csi_nodekit_quota_escape_episodes",
                "Episodes of a volume's files found outside its project quota",
                &counters.episodes,
            ),
            (
                "csi_nodekit_quota_escaped_inodes",
                "Inodes found in another project, or directories without PROJINHERIT, and set back",
                &counters.inodes,
            ),
            (
                "csi_nodekit_quota_escaped_bytes",
                "Bytes found outside their volume's project and charged back to it",
                &counters.bytes,
            ),
            (
                "csi_nodekit_quota_check_walks",
                "Walks of a volume's whole tree by the quota check",
                &counters.walks,
            ),
            (
                "csi_nodekit_quota_check_inodes",
                "Inodes the quota check's walks looked at",
                &counters.walked,
            ),
        ];
        for (name, help, counter) in named {
            metrics.register(name, help, counter.clone());
        }
        counters
    }

    /// Brings the counters up to `totals` (which only grow).
    fn update(&self, totals: Totals) {
        for (counter, total) in [
            (&self.episodes, totals.episodes),
            (&self.inodes, totals.inodes),
            (&self.bytes, totals.bytes),
            (&self.walks, totals.walks),
            (&self.walked, totals.walked),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}

/// Answers `/metrics` from `totals()` at each scrape.
pub struct Handler<T> {
    metrics: Metrics,
    counters: QuotaCounters,
    totals: T,
}

impl<T: Fn() -> Totals + Send + Sync + 'static> Handler<T> {
    pub fn new(totals: T) -> Arc<Mutex<Self>> {
        let mut metrics = Metrics::new();
        let counters = QuotaCounters::register(&mut metrics);
        Arc::new(Mutex::new(Self {
            metrics,
            counters,
            totals,
        }))
    }
}

/// One request's answer.
pub fn answer<T: Fn() -> Totals>(handler: &Mutex<Handler<T>>, path: &str) -> Reply {
    if path != "/metrics" {
        return Reply::not_found();
    }
    // One scrape at a time brings the counters up to date; a panic cannot tear a counter.
    let handler = crate::mutex::lock(handler);
    handler.counters.update((handler.totals)());
    Reply {
        status: 200,
        content_type: crate::metrics::CONTENT_TYPE,
        body: handler.metrics.encode(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_show_the_totals_at_each_scrape_as_counters() {
        let now = Arc::new(Mutex::new(Totals::default()));
        let read = Arc::clone(&now);
        let handler = Handler::new(move || *read.lock().unwrap());
        let first = answer(&handler, "/metrics").body;
        assert!(
            first.contains("csi_nodekit_quota_escaped_bytes_total 0"),
            "{first}"
        );
        *now.lock().unwrap() = Totals {
            episodes: 1,
            inodes: 3,
            bytes: 1 << 20,
            walks: 4,
            walked: 40,
        };
        let second = answer(&handler, "/metrics").body;
        for line in [
            "# TYPE csi_nodekit_quota_escape_episodes counter",
            "csi_nodekit_quota_escape_episodes_total 1",
            "csi_nodekit_quota_escaped_inodes_total 3",
            "csi_nodekit_quota_escaped_bytes_total 1048576",
            "csi_nodekit_quota_check_walks_total 4",
            "csi_nodekit_quota_check_inodes_total 40",
        ] {
            assert!(second.contains(line), "{line} in\n{second}");
        }
        assert_eq!(answer(&handler, "/healthz").status, 404);
    }
}

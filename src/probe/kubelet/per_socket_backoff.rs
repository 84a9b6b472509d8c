//! The kubelet's per-socket exponential back-off (`goroutinemap/exponentialbackoff`): after a
//! failed operation no other operation on the same socket path may start for 500 ms, doubling
//! with each further failure up to 2 m 2 s. Only a successful operation clears it, so it
//! outlives the socket: a plugin that re-creates its socket after failures waits it out.

use std::time::{Duration, Instant};

use crate::backoff::Doubling;

pub const INITIAL: Duration = Duration::from_millis(500);
pub const MAX: Duration = Duration::from_secs(122);

/// The back-off state of one socket path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// How long after the last failure retries stay refused; zero before the first failure.
    pub wait: Duration,
    delays: Doubling,
    last_failure: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            wait: Duration::ZERO,
            delays: Doubling::new(INITIAL, MAX),
            last_failure: None,
        }
    }
}

impl Backoff {
    /// Records a failure at `now`: the first waits 500 ms, each next one twice as long.
    pub fn record_failure(&mut self, now: Instant) {
        self.wait = self.delays.next_delay();
        self.last_failure = Some(now);
    }

    /// Upstream refuses while `time.Since(lastErrorTime) <= durationBeforeRetry`.
    pub fn allows_retry(&self, now: Instant) -> bool {
        match self.last_failure {
            None => true,
            Some(at) => now.saturating_duration_since(at) > self.wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_half_a_second_to_two_minutes_two_seconds() {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        let mut waits = Vec::new();
        for _ in 0..10 {
            backoff.record_failure(start);
            waits.push(backoff.wait.as_millis());
        }
        assert_eq!(
            waits,
            [
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 122_000, 122_000
            ]
        );
    }

    #[test]
    fn a_retry_is_refused_until_the_wait_has_fully_passed() {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        assert!(backoff.allows_retry(start));
        backoff.record_failure(start);
        let table = [(0, false), (499, false), (500, false), (501, true)];
        for (after_ms, allowed) in table {
            let now = start + Duration::from_millis(after_ms);
            assert_eq!(backoff.allows_retry(now), allowed, "{after_ms} ms");
        }
    }
}

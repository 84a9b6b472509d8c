//! The one exponential back-off: a delay that doubles after every failure up to a cap, and
//! starts over after a success. The socket layer's dialling, the registrar's retries and the
//! kubelet emulator's per-socket back-off all use it.

use std::time::Duration;

/// Delays `first`, `2 × first`, `4 × first`, … capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubling {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Doubling {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The delay to wait now; the one after it is twice as long (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    /// After a success: the next delay is the first one again.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_start_over_after_a_reset() {
        let mut backoff = Doubling::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
    }
}

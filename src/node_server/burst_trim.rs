//! Freed heap handed back to the kernel once a burst of calls is over. glibc keeps the pages
//! of freed blocks for the next allocation and returns by itself only what sits at the top of
//! its heap: after the publish benchmark node-server held 0.88 MB of anonymous memory where it
//! started with 0.41; trimmed once the burst was over, 0.71 (`docs/figures.md`).

use super::in_flight::{InFlight, QUIET};

/// Waits for bursts of calls and trims the heap once each is over: when a call has ended and
/// then no call has begun or run for [`QUIET`]. Under steady load it wakes once a quiet moment
/// (a timer, not at every call); idle, not at all.
pub fn trim_after_bursts(calls: InFlight) -> impl Future<Output = ()> + Send {
    after_bursts(calls, trim)
}

/// [`trim_after_bursts`] with what to do at the end of each burst given. The calls counted from
/// here are those begun once this is called, not once the future is first polled.
fn after_bursts(
    calls: InFlight,
    mut burst_over: impl FnMut() + Send,
) -> impl Future<Output = ()> + Send {
    let mut seen = calls.begun();
    async move {
        loop {
            // A call begun since the last trim (even one that ended before this waits) is a
            // burst to wait out; with none, sleep until one ends.
            if calls.begun() == seen {
                calls.one_ends().await;
            }
            loop {
                seen = calls.begun();
                tokio::time::sleep(QUIET).await;
                if calls.running() == 0 && calls.begun() == seen {
                    break;
                }
            }
            burst_over();
        }
    }
}

/// Gives glibc's free pages back; logged at `--v=5` with whether any went. On the async worker,
/// not the blocking pool: a trim of a 1 MB heap with 2,000 holes took 11 µs (78 at worst, a
/// static C program under the image's malloc settings), less than a hand-off costs.
fn trim() {
    let released = crate::malloc_trim::give_back_freed_memory();
    log::trace!("heap trimmed after a burst of calls: memory returned: {released}");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// `after_bursts` on its own task, counting the ends of bursts it saw.
    fn counted(calls: &InFlight) -> Arc<AtomicUsize> {
        let seen = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&seen);
        let watcher = after_bursts(calls.clone(), move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        tokio::spawn(watcher);
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_server_is_never_trimmed() {
        let calls = InFlight::default();
        let trims = counted(&calls);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_trimmed_once_after_it_has_been_quiet_a_moment() {
        let calls = InFlight::default();
        let trims = counted(&calls);
        tokio::task::yield_now().await;
        for _ in 0..50 {
            let call = calls.begin();
            tokio::time::sleep(QUIET / 10).await;
            drop(call);
            assert_eq!(trims.load(Ordering::SeqCst), 0, "trimmed during the burst");
        }
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            trims.load(Ordering::SeqCst),
            1,
            "trimmed again with no call since"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_ended_before_the_watcher_first_waited_is_still_trimmed_after() {
        let calls = InFlight::default();
        let trims = counted(&calls);
        // The watcher task has not run yet: this call's end notifies nobody.
        drop(calls.begin());
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_still_running_after_the_others_ended_holds_the_trim_back() {
        let calls = InFlight::default();
        let trims = counted(&calls);
        tokio::task::yield_now().await;
        let long = calls.begin();
        drop(calls.begin());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0);
        drop(long);
        tokio::time::sleep(QUIET * 3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
    }
}

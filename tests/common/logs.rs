//! Logs of in-process servers, kept per test and shown only for a test that fails.
//!
//! libtest runs each test on a thread named after it, and a test on a current-thread runtime
//! runs its in-process servers on that same thread, so the thread's name says which test a
//! record belongs to: parallel tests never mix. Records from other threads (multi-thread
//! runtimes, blocking pools) are dropped, as every record was before this logger existed.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};

struct TestLogger;

fn buffers() -> MutexGuard<'static, HashMap<String, Vec<String>>> {
    static BUFFERS: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    let buffers = BUFFERS.get_or_init(Mutex::default);
    buffers
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The test the calling thread runs, if it is a test's thread.
fn current_test() -> Option<String> {
    let thread = std::thread::current();
    let name = thread.name()?;
    (name != "main" && !name.starts_with("tokio-")).then(|| name.to_owned())
}

impl log::Log for TestLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Debug && metadata.target().starts_with("csi_nodekit")
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if let Some(test) = current_test() {
            let line = format!("{} {}] {}", record.level(), record.target(), record.args());
            buffers().entry(test).or_default().push(line);
        }
    }

    fn flush(&self) {}
}

/// Starts keeping the calling test's in-process logs.
pub fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if log::set_logger(&TestLogger).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    });
}

/// How many of the calling test's in-process log lines so far contain `needle`: the gate for
/// "the server has reacted" when a test has nothing else to observe.
pub fn count(needle: &str) -> usize {
    let Some(test) = current_test() else { return 0 };
    buffers().get(&test).map_or(0, |lines| {
        lines.iter().filter(|l| l.contains(needle)).count()
    })
}

/// Forgets the calling test's logs, printing them first if the test is failing (the output of
/// a failing test is what libtest shows).
pub fn finish() {
    let Some(test) = current_test() else { return };
    let lines = buffers().remove(&test).unwrap_or_default();
    if std::thread::panicking() && !lines.is_empty() {
        eprintln!("---- logs of in-process servers ----");
        for line in lines {
            eprintln!("{line}");
        }
        eprintln!("---- end of logs ----");
    }
}

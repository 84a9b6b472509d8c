//! The one way this crate locks a [`Mutex`]: a panic while it was held does not make its data
//! unusable, because every critical section here leaves the data consistent before anything
//! that can panic (no section is left half-done by an early return or a `?`).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data even if a thread panicked while holding it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_poisoned_by_a_panic_is_still_locked_with_its_data() {
        let mutex = std::sync::Arc::new(Mutex::new(7));
        let held = std::sync::Arc::clone(&mutex);
        let panicked = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(mutex.is_poisoned());
        assert_eq!(*lock(&mutex), 7);
    }
}

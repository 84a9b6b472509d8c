//! Claims on volumes: an operation in progress on a volume ID (or on a name being created)
//! holds the key's claim, and a second one asking for it meanwhile is refused at once
//! (ABORTED, the CSI rule; the CO retries). Operations on different keys never wait for each
//! other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The keys whose operations are in progress.
#[derive(Debug, Default)]
pub struct Claims {
    busy: Mutex<HashSet<String>>,
}

/// An operation in progress on one key; dropping it ends it.
#[derive(Debug)]
pub struct Claim {
    claims: Arc<Claims>,
    key: String,
}

/// The key's claim is held by an operation still running.
#[derive(Debug, thiserror::Error)]
#[error("an operation on {key} is already in progress")]
pub struct Busy {
    pub key: String,
}

impl Claims {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Starts an operation on `key`, or refuses at once if one is running.
    pub fn claim(self: &Arc<Self>, key: &str) -> Result<Claim, Busy> {
        if !crate::mutex::lock(&self.busy).insert(key.to_owned()) {
            return Err(Busy {
                key: key.to_owned(),
            });
        }
        Ok(Claim {
            claims: Arc::clone(self),
            key: key.to_owned(),
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        crate::mutex::lock(&self.claims.busy).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_on_a_busy_volume_is_aborted_until_the_first_ends() {
        let claims = Claims::new();
        let first = claims.claim("v1").unwrap();
        assert!(matches!(claims.claim("v1"), Err(Busy { key }) if key == "v1"));
        let _other = claims.claim("v2").expect("other volumes are not blocked");
        drop(first);
        claims.claim("v1").expect("released on drop");
    }
}

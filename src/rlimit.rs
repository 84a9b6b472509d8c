//! Process limits set at start-up, for every mode.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft limit on open files to the hard limit, as Go does at start-up since 1.19
/// (so the upstream sidecars have it): a flood of connections must not run a server out of
/// descriptors at the traditional soft limit of 1024. Returns the soft limit now in force.
pub fn raise_open_files() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(e) => {
            log::debug!("cannot raise the open-files limit from {soft} to {hard}: {e}");
            soft
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(raise_open_files(), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
    }
}

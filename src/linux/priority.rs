//! The calling thread's I/O and CPU priority lowered, for work nobody waits for (removing what
//! interrupted copies left): the idle I/O class (`ioprio_set`, which nix does not wrap), so the
//! disk serves everyone else first, and nice 19. Both are per thread on Linux.

use nix::libc;

/// `IOPRIO_CLASS_IDLE` shifted into place (`include/uapi/linux/ioprio.h`).
const IOPRIO_IDLE: libc::c_int = 3 << 13;
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// Lowers the calling thread to the idle I/O class and nice 19.
pub fn lower_this_thread() -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: ioprio_set takes three integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, IOPRIO_IDLE) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: setpriority takes integers only; on Linux a thread ID names that thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_lowered_is_in_the_idle_io_class_at_nice_19_and_others_are_not() {
        let tid = std::thread::spawn(|| {
            lower_this_thread().expect("lower");
            let tid = nix::unistd::gettid().as_raw();
            // SAFETY: integers only.
            let class = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
            let nice = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
            // Field 19 of stat is nice; the command name (field 2) may hold spaces.
            let after_name = &nice[nice.rfind(')').unwrap() + 2..];
            let nice: i64 = after_name.split(' ').nth(16).unwrap().parse().unwrap();
            (class, nice)
        })
        .join()
        .unwrap();
        assert_eq!(tid, (i64::from(IOPRIO_IDLE), 19));
        let here = nix::unistd::gettid().as_raw();
        // SAFETY: integers only.
        let class = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, here) };
        assert_ne!(
            class,
            i64::from(IOPRIO_IDLE),
            "only the calling thread is lowered"
        );
    }
}

//! The calling thread's I/O and CPU priority lowered for background work (`ioprio_set(2)` in
//! the idle class, `setpriority(2)` to nice 19): the disk and the CPUs serve it only when
//! nothing else wants them. Both act on one thread (a Linux thread is a task), so the rest of
//! the process keeps its priority.

use std::io;

const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
/// The idle class: served only when no other task has I/O pending.
pub const IOPRIO_CLASS_IDLE: libc::c_int = 3;

/// Puts the calling thread in the idle I/O class and at the lowest CPU priority.
pub fn idle_for_this_thread() -> io::Result<()> {
    set_this_thread(IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT, 19)
}

/// The best-effort I/O class, the default.
pub const IOPRIO_CLASS_BE: libc::c_int = 2;

/// Puts the calling thread back at the default I/O and CPU priority (best-effort class, nice
/// 0): for work that must not wait behind a busy node, done between idle stretches.
pub fn normal_for_this_thread() -> io::Result<()> {
    set_this_thread(IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT | 4, 0)
}

fn set_this_thread(ioprio: libc::c_int, nice: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscalls on integers; `who` 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, ioprio) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on this thread's ID.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's I/O scheduling class.
pub fn io_class_of_this_thread() -> io::Result<libc::c_int> {
    // SAFETY: a plain syscall on integers; `who` 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((rc as libc::c_int) >> IOPRIO_CLASS_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calling_thread_goes_idle() {
        let before = io_class_of_this_thread().expect("ioprio_get");
        let inside = std::thread::spawn(|| {
            idle_for_this_thread().expect("ioprio_set");
            io_class_of_this_thread().expect("ioprio_get")
        })
        .join()
        .expect("thread");
        assert_eq!(inside, IOPRIO_CLASS_IDLE);
        assert_eq!(io_class_of_this_thread().unwrap(), before);
    }
}

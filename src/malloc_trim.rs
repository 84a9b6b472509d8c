//! `malloc_trim(3)`: the process's freed heap given back to the kernel, for the servers that
//! give memory back after a burst of work.

/// Returns the free pages of malloc's heaps to the kernel, wherever they lie among live blocks
/// (glibc returns by itself only what is at the top of a heap; other C libraries return it by
/// themselves). Whether any memory went back.
pub fn give_back_freed_memory() -> bool {
    trim()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim takes malloc's own locks and touches only its free lists.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

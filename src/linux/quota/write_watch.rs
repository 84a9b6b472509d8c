//! Every file written on a filesystem, as it is written: a fanotify watch of the whole
//! filesystem (`FAN_MARK_FILESYSTEM`) for `FAN_MODIFY`, each written inode reported by its file
//! handle (`FAN_REPORT_FID`: no descriptor is opened per event, none of a writer's files handed
//! over). Moving a file out of its volume's project notifies nothing (`FS_IOC_FSSETXATTR` sends
//! no event), but writing to it does: the quota check looks at each written file of a volume
//! then, not only at its next pass. Events for one inode merge while they wait in the queue,
//! so a batch holds each written inode about once, however often it was written.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// The watch of one filesystem.
pub struct WriteWatch {
    fan: OwnedFd,
    /// A directory on the filesystem, which file handles are opened against.
    mount: OwnedFd,
    buf: Vec<u8>,
}

/// The size of the buffer events are read into.
const BUFFER: usize = 64 * 1024;

impl WriteWatch {
    /// Watches writes on the filesystem holding `dir` (needs CAP_SYS_ADMIN; Linux 5.1+).
    pub fn new(dir: &Path) -> io::Result<Self> {
        let flags =
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_FID;
        let event_flags = libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC;
        // SAFETY: plain flags; the result is checked before it is owned.
        let fan = unsafe { libc::fanotify_init(flags, event_flags as libc::c_uint) };
        if fan < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned to us, owned by nothing else.
        let fan = unsafe { OwnedFd::from_raw_fd(fan) };
        // Not O_PATH: open_by_handle_at takes no such descriptor (EBADF).
        let flags = nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_CLOEXEC;
        let mount = nix::fcntl::open(dir, flags, nix::sys::stat::Mode::empty())?;
        let mark = libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM;
        // SAFETY: live descriptors; a null path marks what `mount` is on.
        let marked = unsafe {
            libc::fanotify_mark(
                fan.as_raw_fd(),
                mark,
                libc::FAN_MODIFY,
                mount.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if marked < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fan,
            mount,
            buf: vec![0; BUFFER],
        })
    }

    /// Hands `each` every inode written since the last call, opened `O_PATH` (those gone
    /// meanwhile are not); whether the kernel's queue overflowed meanwhile (writes were
    /// missed; the passes still find them). It does not wait: its caller paces it, and the
    /// longer the pause, the more of a busy file's writes merge into one event.
    pub fn written(&mut self, each: &mut dyn FnMut(BorrowedFd<'_>)) -> io::Result<bool> {
        let mut overflowed = false;
        loop {
            let read = match nix::unistd::read(self.fan.as_fd(), &mut self.buf) {
                Ok(read) => read,
                Err(nix::errno::Errno::EAGAIN) => return Ok(overflowed),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            let buf = &self.buf[..read];
            let head = size_of::<libc::fanotify_event_metadata>();
            let mut at = 0;
            while at + head <= buf.len() {
                // SAFETY: `head` bytes are within the buffer; read unaligned into a copy.
                let event: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let (len, info) = (event.event_len as usize, usize::from(event.metadata_len));
                if event.vers != libc::FANOTIFY_METADATA_VERSION || len < info || at + len > read {
                    return Err(io::Error::other("fanotify: an unknown event format"));
                }
                overflowed |= event.mask & libc::FAN_Q_OVERFLOW != 0;
                if let Some(inode) = open_fid(self.mount.as_fd(), &buf[at + info..at + len]) {
                    each(inode.as_fd());
                }
                at += len;
            }
        }
    }
}

/// The inode an event's FID record names, opened `O_PATH`; none if it has no such record or
/// the inode is gone.
fn open_fid(mount: BorrowedFd<'_>, info: &[u8]) -> Option<OwnedFd> {
    // struct fanotify_event_info_header, then the filesystem ID (8 bytes), then a
    // struct file_handle: handle_bytes (u32), handle_type (i32), the handle.
    const FID_HANDLE: usize = 4 + 8;
    let header = info.get(..4)?;
    if header[0] != libc::FAN_EVENT_INFO_TYPE_FID {
        return None;
    }
    let handle = info.get(FID_HANDLE..)?;
    let bytes = u32::from_ne_bytes(handle.get(..4)?.try_into().ok()?) as usize;
    let whole = handle.get(..8 + bytes)?;
    // Copied to words: the kernel reads a struct file_handle, aligned. MAX_HANDLE_SZ is 128.
    let mut aligned = [0u32; 2 + 128 / 4];
    if whole.len() > size_of_val(&aligned) {
        return None;
    }
    // SAFETY: `aligned` holds at least `whole.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(whole.as_ptr(), aligned.as_mut_ptr().cast(), whole.len())
    };
    let flags = libc::O_PATH | libc::O_CLOEXEC;
    // SAFETY: a live directory descriptor and a whole file_handle record.
    let fd =
        unsafe { libc::open_by_handle_at(mount.as_raw_fd(), aligned.as_mut_ptr().cast(), flags) };
    // SAFETY: a descriptor just returned to us, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

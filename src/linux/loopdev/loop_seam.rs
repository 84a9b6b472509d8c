//! [`LoopDevices`]: the loop-device calls node-server's block volumes make, behind a trait as
//! [`Mounter`](crate::linux::mount::Mounter) is for mounts. [`KernelLoops`] is the real thing
//! (the ioctls of this module); `fake::RecordingLoops` (in unit tests) keeps devices in memory and records the
//! calls, so that the staging, publishing and unstaging logic above it is unit-tested without
//! root or `/dev/loop-control`. The real calls are tested on real loop devices.

use std::path::Path;

use super::loop_error::LoopError;
use super::{AttachOptions, Found, LoopDevice, Status};

/// The loop devices of one node.
pub trait LoopDevices: Send + Sync + std::fmt::Debug {
    /// The devices backed by the file at `file`: ours and others'.
    fn find(&self, file: &Path) -> Result<Found, LoopError>;
    /// A device of ours for `file` matching `options`, attached if there is none; whether it
    /// was attached now.
    fn find_or_attach(
        &self,
        file: &Path,
        options: AttachOptions,
    ) -> Result<(Status, bool), LoopError>;
    /// Detaches a device of ours for `file`; [`LoopError::Busy`] while it is held open.
    fn detach(&self, device: LoopDevice, file: &Path) -> Result<(), LoopError>;
    /// Makes the device see its file's new size; returns the size.
    fn refresh_capacity(&self, device: LoopDevice, file: &Path) -> Result<u64, LoopError>;
    /// Switches direct I/O; `false` when the backing file cannot do it.
    fn set_direct_io(&self, device: LoopDevice, file: &Path, on: bool) -> Result<bool, LoopError>;
    /// Flushes what the device acknowledged to its file.
    fn flush(&self, device: LoopDevice) -> Result<(), LoopError>;
    /// The loop device with block device number `dev` (`major:minor`, as a mount shows its
    /// filesystem's), if it is one and bound.
    fn with_number(&self, dev: (u32, u32)) -> Result<Option<Status>, LoopError>;
}

/// The kernel's loop devices.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelLoops;

impl LoopDevices for KernelLoops {
    fn find(&self, file: &Path) -> Result<Found, LoopError> {
        super::find(file)
    }
    fn find_or_attach(
        &self,
        file: &Path,
        options: AttachOptions,
    ) -> Result<(Status, bool), LoopError> {
        super::find_or_attach(file, options)
    }
    fn detach(&self, device: LoopDevice, file: &Path) -> Result<(), LoopError> {
        super::detach(device, file)
    }
    fn refresh_capacity(&self, device: LoopDevice, file: &Path) -> Result<u64, LoopError> {
        super::refresh_capacity(device, file)
    }
    fn set_direct_io(&self, device: LoopDevice, file: &Path, on: bool) -> Result<bool, LoopError> {
        super::set_direct_io(device, file, on)
    }
    fn flush(&self, device: LoopDevice) -> Result<(), LoopError> {
        super::flush(device)
    }
    fn with_number(&self, dev: (u32, u32)) -> Result<Option<Status>, LoopError> {
        match super::device_node::with_number(dev) {
            Some(device) => super::status(device),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
pub mod fake {
    //! Loop devices in memory: each attached device is ours for the file it was attached to
    //! (matched by the file's identity, as the kernel's are), numbered from 0; devices can be
    //! made busy (held open by a pod) to see what the logic does then.

    use std::sync::Mutex;

    use super::*;
    use crate::linux::loopdev::{Identity, TAG};

    #[derive(Debug, Default)]
    pub struct RecordingLoops {
        pub attached: Mutex<Vec<Status>>,
        pub calls: Mutex<Vec<String>>,
        /// Devices a detach finds held open.
        pub busy: Mutex<Vec<LoopDevice>>,
    }

    impl RecordingLoops {
        pub fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }

        fn record(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }
    }

    impl LoopDevices for RecordingLoops {
        fn find(&self, file: &Path) -> Result<Found, LoopError> {
            let identity = Identity::of(file)?;
            let attached = self.attached.lock().unwrap();
            Ok(Found {
                ours: (attached.iter())
                    .filter(|s| s.backing == identity)
                    .cloned()
                    .collect(),
                foreign: Vec::new(),
            })
        }

        fn find_or_attach(
            &self,
            file: &Path,
            options: AttachOptions,
        ) -> Result<(Status, bool), LoopError> {
            let found = self.find(file)?;
            if let Some(status) = found.ours.iter().find(|s| s.read_only == options.read_only) {
                return Ok((status.clone(), false));
            }
            let mut attached = self.attached.lock().unwrap();
            let next = (attached.iter().map(|s| s.device.0 + 1)).max().unwrap_or(0);
            let status = Status {
                device: LoopDevice(next),
                backing: Identity::of(file)?,
                offset: 0,
                size_limit: 0,
                read_only: options.read_only,
                autoclear: false,
                direct_io: options.direct_io,
                partscan: false,
                file_name: format!("{TAG}{}", file.display()),
            };
            attached.push(status.clone());
            drop(attached);
            self.record(format!("attach {} {}", status.device, file.display()));
            Ok((status, true))
        }

        fn detach(&self, device: LoopDevice, file: &Path) -> Result<(), LoopError> {
            self.record(format!("detach {device} {}", file.display()));
            if self.busy.lock().unwrap().contains(&device) {
                return Err(LoopError::Busy {
                    device: device.path(),
                    reason: "open in the fake",
                });
            }
            self.attached.lock().unwrap().retain(|s| s.device != device);
            Ok(())
        }

        fn refresh_capacity(&self, device: LoopDevice, file: &Path) -> Result<u64, LoopError> {
            self.record(format!("refresh {device}"));
            let meta =
                std::fs::metadata(file).map_err(crate::path_io::PathIoError::at("stat", file))?;
            Ok(meta.len())
        }

        fn set_direct_io(
            &self,
            device: LoopDevice,
            _file: &Path,
            on: bool,
        ) -> Result<bool, LoopError> {
            self.record(format!("direct-io {device} {on}"));
            let mut attached = self.attached.lock().unwrap();
            for status in attached.iter_mut().filter(|s| s.device == device) {
                status.direct_io = on;
            }
            Ok(true)
        }

        fn flush(&self, device: LoopDevice) -> Result<(), LoopError> {
            self.record(format!("flush {device}"));
            Ok(())
        }

        fn with_number(&self, dev: (u32, u32)) -> Result<Option<Status>, LoopError> {
            let attached = self.attached.lock().unwrap();
            Ok((attached.iter()).find(|s| (7, s.device.0) == dev).cloned())
        }
    }
}

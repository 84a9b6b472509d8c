//! The per-mount flags a bind mount can carry, spelled once in [`FLAGS`]: each flag's option
//! name (as requests and mountinfo write it), its `mount(2)` and `statvfs(2)` bits, and its
//! field in [`MountOptions`]. Parsing a request, the remount's flags, the flags a remount
//! keeps, the names [`mountpoint`](super::mountpoint) reads off a mount, the mount fake and
//! the refusal's message all read this one table.

use nix::mount::MsFlags;
use nix::sys::statvfs::FsFlags;

/// One per-mount flag.
pub struct Flag {
    /// The option name that sets it (`ro`, `nosuid`).
    pub name: &'static str,
    pub ms: MsFlags,
    pub st: FsFlags,
    /// Its `mount_setattr(2)` bit (`MOUNT_ATTR_*`).
    pub attr: u64,
    field: fn(&mut MountOptions) -> &mut bool,
}

impl Flag {
    fn is_in(&self, options: MountOptions) -> bool {
        let mut options = options;
        *(self.field)(&mut options)
    }
}

/// Every flag a bind mount takes, read-only first.
pub const FLAGS: [Flag; 6] = [
    Flag {
        name: "ro",
        ms: MsFlags::MS_RDONLY,
        st: FsFlags::ST_RDONLY,
        attr: libc::MOUNT_ATTR_RDONLY,
        field: |o| &mut o.readonly,
    },
    Flag {
        name: "nosuid",
        ms: MsFlags::MS_NOSUID,
        st: FsFlags::ST_NOSUID,
        attr: libc::MOUNT_ATTR_NOSUID,
        field: |o| &mut o.nosuid,
    },
    Flag {
        name: "nodev",
        ms: MsFlags::MS_NODEV,
        st: FsFlags::ST_NODEV,
        attr: libc::MOUNT_ATTR_NODEV,
        field: |o| &mut o.nodev,
    },
    Flag {
        name: "noexec",
        ms: MsFlags::MS_NOEXEC,
        st: FsFlags::ST_NOEXEC,
        attr: libc::MOUNT_ATTR_NOEXEC,
        field: |o| &mut o.noexec,
    },
    Flag {
        name: "noatime",
        ms: MsFlags::MS_NOATIME,
        st: FsFlags::ST_NOATIME,
        attr: libc::MOUNT_ATTR_NOATIME,
        field: |o| &mut o.noatime,
    },
    Flag {
        name: "nodiratime",
        ms: MsFlags::MS_NODIRATIME,
        st: FsFlags::ST_NODIRATIME,
        attr: libc::MOUNT_ATTR_NODIRATIME,
        field: |o| &mut o.nodiratime,
    },
];

/// How mountinfo names a mount without `ro`.
pub const READ_WRITE: &str = "rw";

/// Names a request may give that change nothing on a fresh bind mount: the opposite of each
/// flag's name is its default (`rw` aside: it conflicts with `ro`).
const DEFAULTS: [&str; 8] = [
    "defaults", "bind", "suid", "dev", "exec", "atime", "diratime", "relatime",
];

/// Every option name [`FLAGS`] gives a mount, as mountinfo would list them: `ro`, `rw`, then
/// the others.
pub fn option_names() -> impl Iterator<Item = &'static str> {
    let (read_only, others) = FLAGS.split_at(1);
    (read_only.iter().map(|f| f.name))
        .chain([READ_WRITE])
        .chain(others.iter().map(|f| f.name))
}

/// The option names of a mount with `statvfs` flags `st`: `ro` or `rw`, then every other flag
/// set, in the table's order.
pub fn names_of(st: FsFlags) -> Vec<&'static str> {
    // Sized once: this runs for every mount a publish or unpublish asks about.
    let mut names = Vec::with_capacity(FLAGS.len());
    if !st.contains(FsFlags::ST_RDONLY) {
        names.push(READ_WRITE);
    }
    names.extend(FLAGS.iter().filter(|f| st.contains(f.st)).map(|f| f.name));
    names
}

/// The per-mount flags of a mount with `statvfs` flags `st` that a remount must repeat to
/// keep them: every flag but read-only (which the remount sets), and `relatime`, which no
/// request asks for.
pub fn kept_flags(st: FsFlags) -> MsFlags {
    let mut kept = MsFlags::empty();
    for flag in &FLAGS[1..] {
        if st.contains(flag.st) {
            kept |= flag.ms;
        }
    }
    if st.contains(FsFlags::ST_RELATIME) {
        kept |= MsFlags::MS_RELATIME;
    }
    kept
}

/// Mount flags from a request that a bind mount cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error(
        "mount flag {0:?} is not supported: volumes are bind mounts, which take only {names}",
        names = go_list(option_names())
    )]
    Unsupported(String),
    #[error("mount flags ask for both ro and rw")]
    Conflicting,
    #[error("mount flag {0:?} is not an SELinux context: context=\"user:role:type:level\"")]
    BadContext(String),
    #[error("mount flags give two SELinux contexts, {0:?} and {1:?}")]
    TwoContexts(String, String),
}

/// The SELinux context a filesystem is mounted with (`context="system_u:object_r:…:s0:c1,c2"`,
/// the one mount flag the kubelet adds when the CSIDriver says `seLinuxMount: true`): every
/// file of that filesystem then has this label, so the runtime need not relabel them. A bind
/// mount shows its filesystem's label, so only a volume with a filesystem of its own (an image
/// volume) can take one; the node calls decide that, this type only parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelinuxContext(String);

impl SelinuxContext {
    const PREFIX: &'static str = "context=";

    /// Takes the `context=` flag out of `flags` (quoted, as the kubelet writes it since the
    /// level holds commas, or bare): the context, if any, and the other flags.
    pub fn take(flags: &[String]) -> Result<(Option<Self>, Vec<String>), OptionsError> {
        let (mut context, mut rest) = (None::<Self>, Vec::new());
        for flag in flags {
            let Some(value) = flag.strip_prefix(Self::PREFIX) else {
                rest.push(flag.clone());
                continue;
            };
            let label = match value.strip_prefix('"') {
                Some(quoted) => quoted.strip_suffix('"'),
                None => Some(value),
            };
            let well_formed = |l: &&str| {
                l.split(':').count() >= 3
                    && !l
                        .chars()
                        .any(|c| c == '"' || c.is_whitespace() || c.is_control())
            };
            let Some(label) = label.filter(well_formed) else {
                return Err(OptionsError::BadContext(flag.clone()));
            };
            match &context {
                Some(Self(first)) if first != label => {
                    return Err(OptionsError::TwoContexts(first.clone(), label.to_owned()));
                }
                _ => context = Some(Self(label.to_owned())),
            }
        }
        Ok((context, rest))
    }

    /// The label, unquoted: the value `fsconfig` takes for the `context` key.
    pub fn label(&self) -> &str {
        &self.0
    }
}

/// `a, b and c`.
fn go_list(names: impl Iterator<Item = &'static str>) -> String {
    let names: Vec<&str> = names.collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A mount whose per-mount flags can be asked by option name. [`mountpoint`] names a mount's
/// flags from [`FLAGS`], so this module cannot name its `Top` back; it asks through this.
///
/// [`mountpoint`]: super::mountpoint
pub trait ByOptionName {
    fn has_option(&self, option: &str) -> bool;
}

/// Per-mount flags a CSI request may ask for. Only flags that a bind mount can carry are
/// accepted: filesystem options (`discard`, `size=`) would be silently meaningless on a bind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub noatime: bool,
    pub nodiratime: bool,
}

impl MountOptions {
    /// Parses a capability's `mount_flags`; `readonly` comes from the request.
    pub fn parse(flags: &[String], readonly: bool) -> Result<Self, OptionsError> {
        let mut options = Self {
            readonly,
            ..Self::default()
        };
        let mut rw = false;
        for flag in flags {
            if let Some(known) = FLAGS.iter().find(|f| f.name == flag) {
                *(known.field)(&mut options) = true;
            } else if flag == READ_WRITE {
                rw = true;
            } else if !DEFAULTS.contains(&flag.as_str()) {
                return Err(OptionsError::Unsupported(flag.clone()));
            }
        }
        if rw && options.readonly {
            return Err(OptionsError::Conflicting);
        }
        Ok(options)
    }

    /// A plain bind mount already has every default; anything else needs a remount.
    pub fn needs_remount(&self) -> bool {
        *self != Self::default()
    }

    /// Whether an existing mount carries exactly the read-only state and at least the flags
    /// asked for: the CSI notion of a "compatible" repeated publish.
    pub fn satisfied_by(&self, mounted: &impl ByOptionName) -> bool {
        let (read_only, others) = FLAGS.split_at(1);
        (read_only
            .iter()
            .all(|f| mounted.has_option(f.name) == f.is_in(*self)))
            && others
                .iter()
                .all(|f| !f.is_in(*self) || mounted.has_option(f.name))
    }

    /// The `mount(2)` flags of these options.
    pub fn ms_flags(&self) -> MsFlags {
        (FLAGS.iter())
            .filter(|f| f.is_in(*self))
            .fold(MsFlags::empty(), |flags, f| flags | f.ms)
    }

    /// The `mount_setattr(2)` bits these options set, and those they clear: `noatime` is one
    /// value of the access-time field, which must be cleared to be set.
    pub fn mount_attr(&self) -> (u64, u64) {
        let set = (FLAGS.iter())
            .filter(|f| f.is_in(*self))
            .fold(0, |attrs, f| attrs | f.attr);
        let clear = match self.noatime {
            true => libc::MOUNT_ATTR__ATIME,
            false => 0,
        };
        (set, clear)
    }

    /// The option names a mount with these options has, as [`names_of`] reads them.
    pub fn names(&self) -> Vec<&'static str> {
        names_of(
            (FLAGS.iter())
                .filter(|f| f.is_in(*self))
                .fold(FsFlags::empty(), |st, f| st | f.st),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::mountpoint::{Shown, Top};

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bind_compatible_flags_are_accepted_and_others_refused_by_name() {
        let options =
            MountOptions::parse(&flags(&["nosuid", "noexec", "relatime"]), false).unwrap();
        assert!(options.nosuid && options.noexec && !options.readonly);
        assert!(
            MountOptions::parse(&flags(&["ro"]), false)
                .unwrap()
                .readonly
        );
        let err = MountOptions::parse(&flags(&["discard"]), false).unwrap_err();
        assert!(err.to_string().contains("\"discard\""), "{err}");
        assert!(MountOptions::parse(&flags(&["ro", "rw"]), false).is_err());
        assert!(MountOptions::parse(&flags(&["rw"]), true).is_err());
    }

    #[test]
    fn the_refusal_lists_every_flag_a_bind_mount_takes() {
        let err = MountOptions::parse(&flags(&["discard"]), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mount flag \"discard\" is not supported: volumes are bind mounts, which take only \
             ro, rw, nosuid, nodev, noexec, noatime and nodiratime"
        );
    }

    /// What the kubelet would send if the CSIDriver said `seLinuxMount: true`: a bind mount
    /// shares its filesystem's label, so it cannot take one of its own.
    #[test]
    fn an_selinux_context_mount_flag_is_refused_since_a_bind_mount_has_its_filesystems_label() {
        let context = "context=\"system_u:object_r:container_file_t:s0:c12,c34\"";
        let err = MountOptions::parse(&flags(&[context]), false).unwrap_err();
        assert!(
            matches!(&err, OptionsError::Unsupported(f) if f == context),
            "{err}"
        );
    }

    #[test]
    fn the_kubelets_quoted_selinux_context_is_taken_out_and_the_other_flags_kept() {
        let label = "system_u:object_r:container_file_t:s0:c12,c34";
        let given = flags(&["noatime", &format!("context=\"{label}\""), "nodev"]);
        let (context, rest) = SelinuxContext::take(&given).unwrap();
        assert_eq!(context.unwrap().label(), label);
        assert_eq!(rest, flags(&["noatime", "nodev"]));
        let bare = SelinuxContext::take(&flags(&["context=system_u:object_r:t:s0"])).unwrap();
        assert_eq!(bare.0.unwrap().label(), "system_u:object_r:t:s0");
    }

    #[test]
    fn a_malformed_or_second_different_selinux_context_is_refused() {
        for bad in [
            "context=",
            "context=\"a:b:c",
            "context=nolabel",
            "context=\"a:b:c d\"",
        ] {
            let err = SelinuxContext::take(&flags(&[bad])).unwrap_err();
            assert!(
                matches!(&err, OptionsError::BadContext(f) if f == bad),
                "{bad}: {err}"
            );
        }
        let two = flags(&["context=a:b:c", "context=\"a:b:d\""]);
        let err = SelinuxContext::take(&two).unwrap_err();
        assert!(matches!(err, OptionsError::TwoContexts(..)), "{err}");
        let same = flags(&["context=a:b:c", "context=\"a:b:c\""]);
        assert!(SelinuxContext::take(&same).unwrap().0.is_some());
    }

    #[test]
    fn only_non_default_options_need_a_remount() {
        assert!(
            !MountOptions::parse(&flags(&["defaults", "rw"]), false)
                .unwrap()
                .needs_remount()
        );
        assert!(MountOptions::parse(&[], true).unwrap().needs_remount());
    }

    #[test]
    fn an_existing_mount_satisfies_a_request_only_with_the_same_read_only_state() {
        let entry = |options: &[&'static str]| Top {
            mnt_id: 1,
            shows: Shown { dev: 1, ino: 2 },
            block_rdev: None,
            options: options.to_vec(),
        };
        let ro = MountOptions::parse(&[], true).unwrap();
        let rw = MountOptions::default();
        assert!(ro.satisfied_by(&entry(&["ro", "relatime"])));
        assert!(!ro.satisfied_by(&entry(&["rw"])));
        assert!(!rw.satisfied_by(&entry(&["ro"])));
        let nosuid = MountOptions::parse(&flags(&["nosuid"]), false).unwrap();
        assert!(nosuid.satisfied_by(&entry(&["rw", "nosuid", "nodev"])));
        assert!(!nosuid.satisfied_by(&entry(&["rw"])));
    }

    #[test]
    fn every_flag_parsed_is_set_named_and_kept_as_the_kernel_spells_it() {
        let all = flags(&["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]);
        let options = MountOptions::parse(&all, false).unwrap();
        assert_eq!(
            options.names(),
            ["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]
        );
        let expected = MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC
            | MsFlags::MS_NOATIME
            | MsFlags::MS_NODIRATIME;
        assert_eq!(options.ms_flags(), expected);
        assert_eq!(MountOptions::default().names(), ["rw"]);
        let st = FsFlags::ST_RDONLY | FsFlags::ST_NODEV | FsFlags::ST_RELATIME;
        assert_eq!(kept_flags(st), MsFlags::MS_NODEV | MsFlags::MS_RELATIME);
    }
}

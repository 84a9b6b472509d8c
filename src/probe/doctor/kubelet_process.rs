//! The kubelets `/proc` shows (the doctor shares the host's PID namespace): their programs
//! (`kubelet`, MicroK8s' `kubelite`, `k3s`), the `--root-dir` each runs with, read from its
//! command line, its k3s flags or MicroK8s' args file, and its credentials for the doctor's
//! permission checks.

use std::path::{Path, PathBuf};

use super::Host;

/// The kubelet's default `--root-dir`.
pub const DEFAULT_ROOT: &str = "/var/lib/kubelet";

/// MicroK8s' kubelite reads the kubelet's flags from this file unless told otherwise.
const MICROK8S_ARGS: &str = "/var/snap/microk8s/current/args/kubelet";

/// A kubelet as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletProcess {
    pub pid: u32,
    /// `kubelet`, `kubelite` (MicroK8s) or `k3s`.
    pub program: String,
    /// The root it runs with (its `--root-dir`, or the default).
    pub root: PathBuf,
    /// Whether `root` came from a flag rather than the default.
    pub explicit: bool,
    /// Filesystem UID and groups, for the permission checks of a kubelet that is not root.
    pub uid: Option<u32>,
    pub groups: Vec<u32>,
}

impl KubeletProcess {
    pub(super) fn describe(&self) -> String {
        if self.explicit {
            format!("--root-dir of {} (pid {})", self.program, self.pid)
        } else {
            format!(
                "{} (pid {}) runs without --root-dir, so with the default",
                self.program, self.pid
            )
        }
    }
}

/// `--root-dir=X`, `--root-dir X` or `-root-dir …` (Go flag spellings); the last one wins.
fn root_dir_flag(args: &[String]) -> Option<String> {
    let mut found = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let flag = arg.trim_start_matches('-');
        if !arg.starts_with('-') {
            continue;
        }
        if let Some(value) = flag.strip_prefix("root-dir=") {
            found = Some(value.to_owned());
        } else if flag == "root-dir" {
            found = args.next().cloned();
        }
    }
    found
}

/// k3s passes kubelet flags as `--kubelet-arg=root-dir=X` (or `--kubelet-arg root-dir=X`).
fn k3s_root_dir(args: &[String]) -> Option<String> {
    let mut values = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if let Some(value) = arg.strip_prefix("--kubelet-arg=") {
            values.push(value.to_owned());
        } else if arg == "--kubelet-arg" {
            values.extend(args.next().cloned());
        }
    }
    let flags: Vec<String> = values
        .into_iter()
        .map(|v| format!("--{}", v.trim_start_matches('-')))
        .collect();
    root_dir_flag(&flags)
}

/// `${NAME}` and `$NAME` replaced from the process environment (MicroK8s' args files use
/// `${SNAP_COMMON}`).
fn expand(text: &str, environ: &[(String, String)]) -> String {
    environ.iter().fold(text.to_owned(), |text, (name, value)| {
        text.replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}/"), &format!("{value}/"))
    })
}

fn nul_separated(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect()
}

/// The filesystem UID (4th field of `Uid:`) and the supplementary groups plus the filesystem
/// GID, from `/proc/<pid>/status`.
fn credentials(status: &str) -> (Option<u32>, Vec<u32>) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|n| n.parse::<u32>().ok())
                    .collect::<Vec<u32>>()
            })
            .unwrap_or_default()
    };
    let uid = field("Uid:").get(3).copied();
    let mut groups = field("Groups:");
    groups.extend(field("Gid:").get(3).copied());
    (uid, groups)
}

/// Reads one process; `None` unless it is a kubelet.
fn kubelet_at(proc_dir: &Path, pid: u32, host: &Host) -> Option<KubeletProcess> {
    let args = nul_separated(&std::fs::read(proc_dir.join("cmdline")).ok()?);
    let program = Path::new(args.first()?).file_name()?.to_str()?.to_owned();
    let rest = &args[1..];
    let root_dir = match program.as_str() {
        "kubelet" => root_dir_flag(rest),
        "k3s" if rest.iter().any(|a| a == "server" || a == "agent") => k3s_root_dir(rest),
        "kubelite" => {
            let file = rest
                .iter()
                .find_map(|a| a.strip_prefix("--kubelet-args-file="))
                .unwrap_or(MICROK8S_ARGS);
            let text = std::fs::read_to_string(host.path(Path::new(file))).unwrap_or_default();
            let environ =
                nul_separated(&std::fs::read(proc_dir.join("environ")).unwrap_or_default())
                    .into_iter()
                    .filter_map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    })
                    .collect::<Vec<_>>();
            let flags: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
            root_dir_flag(&flags).map(|dir| expand(&dir, &environ))
        }
        _ => return None,
    };
    let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
    let (uid, groups) = credentials(&status);
    Some(KubeletProcess {
        pid,
        program,
        explicit: root_dir.is_some(),
        root: PathBuf::from(root_dir.unwrap_or_else(|| DEFAULT_ROOT.to_owned())),
        uid,
        groups,
    })
}

/// Every kubelet in `proc_root`, by PID.
pub fn find_kubelets(proc_root: &Path, host: &Host) -> Vec<KubeletProcess> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut found: Vec<KubeletProcess> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            kubelet_at(&entry.path(), pid, host)
        })
        .collect();
    found.sort_by_key(|k| k.pid);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_root_dir_flag_is_read_in_every_go_spelling_and_the_last_one_wins() {
        let table: &[(&[&str], Option<&str>)] = &[
            (&["--root-dir=/a"], Some("/a")),
            (&["--root-dir", "/b"], Some("/b")),
            (&["-root-dir=/c", "--v=2"], Some("/c")),
            (&["--root-dir=/a", "--root-dir=/d"], Some("/d")),
            (&["--config=/etc/k.yaml"], None),
            (&["root-dir=/x"], None),
        ];
        for (args, expected) in table {
            assert_eq!(
                root_dir_flag(&strings(args)).as_deref(),
                *expected,
                "{args:?}"
            );
        }
    }

    #[test]
    fn k3s_kubelet_args_give_the_root_dir() {
        let args = strings(&[
            "server",
            "--kubelet-arg=root-dir=/k3s/kubelet",
            "--kubelet-arg",
            "v=2",
        ]);
        assert_eq!(k3s_root_dir(&args).as_deref(), Some("/k3s/kubelet"));
        let args = strings(&["agent", "--kubelet-arg", "--root-dir=/k"]);
        assert_eq!(k3s_root_dir(&args).as_deref(), Some("/k"));
        assert_eq!(k3s_root_dir(&strings(&["server"])), None);
    }

    #[test]
    fn microk8s_variables_are_expanded_from_the_process_environment() {
        let environ = vec![(
            "SNAP_COMMON".to_owned(),
            "/var/snap/microk8s/common".to_owned(),
        )];
        assert_eq!(
            expand("${SNAP_COMMON}/var/lib/kubelet", &environ),
            "/var/snap/microk8s/common/var/lib/kubelet"
        );
        assert_eq!(
            expand("$SNAP_COMMON/x", &environ),
            "/var/snap/microk8s/common/x"
        );
    }

    #[test]
    fn credentials_are_the_filesystem_uid_and_every_group() {
        let status =
            "Name:\tkubelet\nUid:\t1000\t1000\t1000\t1001\nGid:\t50\t50\t50\t51\nGroups:\t4 24\n";
        assert_eq!(credentials(status), (Some(1001), vec![4, 24, 51]));
        assert_eq!(credentials(""), (None, vec![]));
    }
}

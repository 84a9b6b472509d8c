//! Which directory is the kubelet's root: `--kubelet-root`, else the `--root-dir` of a running
//! kubelet found in `/proc` (visible when the doctor shares the host's PID namespace), else the
//! first known location that has a `plugins_registry`. Distributions move it: MicroK8s and k0s
//! keep it elsewhere, and a DaemonSet written for `/var/lib/kubelet` then registers nowhere.

use std::path::{Path, PathBuf};

use super::Host;
use super::finding::Finding;

/// The kubelet's default `--root-dir`.
pub const DEFAULT_ROOT: &str = "/var/lib/kubelet";

/// Where distributions keep the kubelet root, in the order they are tried.
pub const KNOWN_ROOTS: &[(&str, &str)] = &[
    (DEFAULT_ROOT, "the kubelet's default"),
    ("/var/snap/microk8s/common/var/lib/kubelet", "MicroK8s"),
    ("/var/lib/k0s/kubelet", "k0s"),
];

/// MicroK8s' kubelite reads the kubelet's flags from this file unless told otherwise.
const MICROK8S_ARGS: &str = "/var/snap/microk8s/current/args/kubelet";

/// How the root was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Flag,
    Process { pid: u32 },
    Known,
    NotFound,
}

impl Source {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Flag => "flag",
            Self::Process { .. } => "process",
            Self::Known => "known-location",
            Self::NotFound => "not-found",
        }
    }
}

/// The root the doctor uses, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Host path; `None` when no root was found.
    pub path: Option<PathBuf>,
    pub source: Source,
    pub reason: String,
}

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
    fn describe(&self) -> String {
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

/// Every kubelet running, each with its root: only one should, and the doctor checks the
/// root of the first (the lowest PID) unless `--kubelet-root` says otherwise.
fn several_kubelets(
    first: &KubeletProcess,
    kubelets: &[KubeletProcess],
    given: Option<&Path>,
) -> Finding {
    let listed: Vec<String> = kubelets
        .iter()
        .map(|k| format!("{} (pid {}, root {})", k.program, k.pid, k.root.display()))
        .collect();
    let mut means = String::from("only one kubelet should run on a node");
    let checked = given.unwrap_or(&first.root);
    means.push_str(&format!("; the doctor checks {}", checked.display()));
    let others: Vec<String> = kubelets
        .iter()
        .filter(|k| k.root != checked)
        .map(|k| k.root.display().to_string())
        .collect();
    let fix = match others.first() {
        Some(other) => {
            means.push_str(&format!(", not {}", others.join(", ")));
            format!(
                "stop the kubelet that should not run; to check the other root, run the doctor \
                 again with --kubelet-root={other}"
            )
        }
        None => "stop the kubelet that should not run".to_owned(),
    };
    Finding::warning(
        "root.several-kubelets",
        format!(
            "{} kubelet processes run: {}",
            kubelets.len(),
            listed.join("; ")
        ),
        means,
        fix,
    )
}

/// A `--kubelet-root` given as a known root under a prefix (`/host/var/lib/kubelet`) while no
/// `--host-root` is: the prefix and the known root it ends with.
pub fn host_prefix(given: &Path, host: &Host) -> Option<(PathBuf, &'static str)> {
    let is_known = KNOWN_ROOTS
        .iter()
        .any(|(known, _)| given == Path::new(known));
    if host.root.is_some() || is_known {
        return None;
    }
    // The longest known root it ends with: MicroK8s' ends with the default's.
    let matches = KNOWN_ROOTS.iter().filter_map(|(known, _)| {
        let relative = Path::new(known).strip_prefix("/").ok()?;
        let given_names: Vec<_> = given.components().collect();
        let known_names: Vec<_> = relative.components().collect();
        let cut = given_names.len().checked_sub(known_names.len())?;
        let prefix: PathBuf = given_names[..cut].iter().collect();
        let real_prefix = prefix != Path::new("/") && prefix.as_os_str().len() > 1;
        (real_prefix && given_names[cut..] == known_names[..]).then_some((prefix, *known))
    });
    matches.max_by_key(|(_, known)| known.len())
}

/// Chooses the root; the findings say which and why.
pub fn decide(
    given: Option<&Path>,
    kubelets: &[KubeletProcess],
    host: &Host,
) -> (Decision, Vec<Finding>) {
    let mut findings = Vec::new();
    let running = kubelets.first();
    if let [first, ..] = kubelets
        && kubelets.len() > 1
    {
        findings.push(several_kubelets(first, kubelets, given));
    }
    if let Some(path) = given
        && let Some((prefix, known)) = host_prefix(path, host)
    {
        findings.push(Finding::warning(
            "root.prefixed",
            format!(
                "--kubelet-root {} is the host's {known} seen under {}",
                path.display(),
                prefix.display()
            ),
            format!(
                "plugins announce host paths ({known}/plugins/…), which the doctor then looks \
                 up outside {}: a working driver would look broken",
                prefix.display()
            ),
            format!(
                "run the doctor with --host-root={} --kubelet-root={known} instead",
                prefix.display()
            ),
        ));
    }
    let decision = if let Some(path) = given {
        if let Some(kubelet) = running.filter(|k| k.root != path) {
            findings.push(Finding::warning(
                "root.mismatch",
                format!(
                    "--kubelet-root is {}, but the running kubelet uses {} ({})",
                    path.display(),
                    kubelet.root.display(),
                    kubelet.describe()
                ),
                "the kubelet watches only its own root's plugins_registry",
                format!("check with --kubelet-root={}", kubelet.root.display()),
            ));
        }
        Decision {
            path: Some(path.to_owned()),
            source: Source::Flag,
            reason: "given with --kubelet-root".into(),
        }
    } else if let Some(kubelet) = running {
        Decision {
            path: Some(kubelet.root.clone()),
            source: Source::Process { pid: kubelet.pid },
            reason: kubelet.describe(),
        }
    } else {
        let existing = KNOWN_ROOTS.iter().find(|(root, _)| {
            host.path(&Path::new(root).join("plugins_registry"))
                .is_dir()
        });
        match existing {
            Some((root, distribution)) => Decision {
                path: Some(PathBuf::from(root)),
                source: Source::Known,
                reason: format!(
                    "no kubelet process is visible (the doctor needs the host's PID namespace, \
                     hostPID, to see it); {root} has a plugins_registry ({distribution})"
                ),
            },
            None => Decision {
                path: None,
                source: Source::NotFound,
                reason: "no kubelet process is visible and no known location has a \
                         plugins_registry"
                    .into(),
            },
        }
    };
    match &decision.path {
        Some(path) => findings.insert(
            0,
            Finding::info(
                "root.chosen",
                format!("kubelet root {}", path.display()),
                decision.reason.clone(),
            ),
        ),
        None => {
            let known: Vec<&str> = KNOWN_ROOTS.iter().map(|(root, _)| *root).collect();
            findings.insert(
                0,
                Finding::error(
                    "root.not-found",
                    format!("no kubelet root found (tried {})", known.join(", ")),
                    decision.reason.clone(),
                    "pass --kubelet-root with the kubelet's --root-dir, and run the doctor with \
                     the host's PID namespace and filesystem (see the doctor pod manifest)",
                ),
            )
        }
    }
    (decision, findings)
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
    fn a_known_root_under_a_prefix_is_told_apart_from_the_known_root_itself() {
        let own = Host::default();
        let prefixed = |p: &str| host_prefix(Path::new(p), &own);
        assert_eq!(
            prefixed("/host/var/snap/microk8s/common/var/lib/kubelet"),
            Some((
                PathBuf::from("/host"),
                "/var/snap/microk8s/common/var/lib/kubelet"
            ))
        );
        assert_eq!(
            prefixed("/mnt/node/var/lib/kubelet"),
            Some((PathBuf::from("/mnt/node"), DEFAULT_ROOT))
        );
        assert_eq!(prefixed("/var/lib/kubelet"), None);
        assert_eq!(prefixed("/var/snap/microk8s/common/var/lib/kubelet"), None);
        assert_eq!(prefixed("/data/kubelet"), None);
        let under = Host {
            root: Some(PathBuf::from("/host")),
        };
        assert_eq!(
            host_prefix(Path::new("/host/var/lib/kubelet"), &under),
            None
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

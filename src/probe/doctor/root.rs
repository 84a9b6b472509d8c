//! Which directory is the kubelet's root: `--kubelet-root`, else the `--root-dir` of a running
//! kubelet found in `/proc` (visible when the doctor shares the host's PID namespace), else the
//! first known location that has a `plugins_registry`. Distributions move it: MicroK8s and k0s
//! keep it elsewhere, and a DaemonSet written for `/var/lib/kubelet` then registers nowhere.

use std::path::{Path, PathBuf};

use super::Host;
use super::finding::Finding;
use super::kubelet_process::{DEFAULT_ROOT, KubeletProcess};

/// Where distributions keep the kubelet root, in the order they are tried.
pub const KNOWN_ROOTS: &[(&str, &str)] = &[
    (DEFAULT_ROOT, "the kubelet's default"),
    ("/var/snap/microk8s/common/var/lib/kubelet", "MicroK8s"),
    ("/var/lib/k0s/kubelet", "k0s"),
];

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
}

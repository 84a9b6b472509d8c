//! Inside the VM: one boot of the power-cut case. It mounts the state disk (the filesystem
//! replays its log), starts the real node-server on it, and checks that every acknowledged
//! volume and snapshot is listed, holds what it held, has its project and limit, and that
//! nothing else is left; the one call a cut may have caught half-way is retried and must
//! succeed whole. Then, unless this is the last boot, it works — creates, fills, snapshots,
//! restores, clones and deletes — until it cuts the power with sysrq-b, at a random moment
//! or part-way through the kind of call this boot aims at.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::{self, QuotaFs};
use csi_nodekit::proto::csi::controller_client::ControllerClient;
use tonic::transport::Channel;

use super::journal::{Journal, Model};
use super::{Aim, VOLUME_BYTES};
use crate::booted::quota_vm::served::{Served, runtime};
use crate::common::csi_node::{Csi, create_request, delete_request};
use crate::common::csi_snapshots::{
    checksums, delete_snapshot_request, from_snapshot, from_volume, snapshot_request,
};

/// How many cycles of work a boot may do before the cut is overdue.
const MAX_CYCLES: usize = 12;
/// At most this many volumes and snapshots stay, so each boot's check costs the same.
const KEEP_VOLUMES: usize = 4;
const KEEP_SNAPSHOTS: usize = 2;

/// The hash of a tree as [`checksums`] sees it.
pub fn tree_hash(sums: &BTreeMap<PathBuf, u64>) -> u64 {
    let mut hasher = DefaultHasher::new();
    for (path, sum) in sums {
        hasher.write(path.as_os_str().as_encoded_bytes());
        hasher.write_u64(*sum);
    }
    hasher.finish()
}

pub fn hash_of(dir: &Path) -> u64 {
    tree_hash(&checksums(dir))
}

/// A call to node-server, as the journal writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Create,
    Fill,
    Snapshot,
    Restore,
    Clone,
    DeleteVolume,
    DeleteSnapshot,
}

impl Kind {
    fn of(word: &str) -> Self {
        match word {
            "create" => Self::Create,
            "fill" => Self::Fill,
            "snapshot" => Self::Snapshot,
            "restore" => Self::Restore,
            "clone" => Self::Clone,
            "delete-volume" => Self::DeleteVolume,
            "delete-snapshot" => Self::DeleteSnapshot,
            other => panic!("unknown call {other}"),
        }
    }
}

/// Sends the call the journal's words name; the ID it answered ("" for a delete).
async fn send(words: &[String], mut c: ControllerClient<Channel>) -> Result<String, tonic::Status> {
    let bytes = VOLUME_BYTES as i64;
    let w = |i: usize| words[i].as_str();
    let volume = |reply: csi_nodekit::proto::csi::CreateVolumeResponse| {
        reply.volume.expect("a volume").volume_id
    };
    Ok(match Kind::of(w(0)) {
        Kind::Create => volume(
            c.create_volume(create_request(w(1), bytes))
                .await?
                .into_inner(),
        ),
        Kind::Restore => volume(
            c.create_volume(from_snapshot(w(1), bytes, w(2)))
                .await?
                .into_inner(),
        ),
        Kind::Clone => volume(
            c.create_volume(from_volume(w(1), bytes, w(2)))
                .await?
                .into_inner(),
        ),
        Kind::Snapshot => {
            let reply = c.create_snapshot(snapshot_request(w(1), w(2))).await?;
            let snapshot = reply.into_inner().snapshot.expect("a snapshot");
            assert!(snapshot.ready_to_use, "{snapshot:?}");
            snapshot.snapshot_id
        }
        Kind::DeleteVolume => {
            c.delete_volume(delete_request(w(1))).await?;
            String::new()
        }
        Kind::DeleteSnapshot => {
            c.delete_snapshot(delete_snapshot_request(w(1))).await?;
            String::new()
        }
        Kind::Fill => unreachable!("a fill is not a call"),
    })
}

/// A small xorshift generator, seeded from the clock and printed, for a rerun's reading.
pub struct Rng(u64);

impl Rng {
    pub fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Self(nanos | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Cuts the power: no sync, no unmount, the VM is gone (QEMU runs with -no-reboot).
fn cut_now(what: &str) -> ! {
    println!("quota-vm: figure {what}");
    let _ = std::io::stdout().flush();
    std::fs::write("/proc/sysrq-trigger", "b").expect("sysrq-b");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One boot's view: the state, node-server, the journal and what it says.
pub struct Boot {
    pub label: String,
    pub served: Served,
    pub mnt: PathBuf,
    pub journal: Journal,
    pub model: Model,
    pub rng: Rng,
    pub aim: Option<Aim>,
    /// How long each kind of call took last, to cut part-way through the next.
    durations: std::collections::HashMap<Kind, Duration>,
}

impl Boot {
    pub fn new(
        label: String,
        mnt: PathBuf,
        served: Served,
        journal: Journal,
        model: Model,
    ) -> Self {
        Self {
            label,
            served,
            mnt,
            journal,
            model,
            rng: Rng::from_clock(),
            aim: None,
            durations: Default::default(),
        }
    }

    /// Checks everything the journal says was acknowledged; the figure line's text.
    pub fn check(&mut self) -> String {
        runtime().block_on(self.check_served())
    }

    async fn check_served(&mut self) -> String {
        let mut csi = self.served.client().await;
        let volumes_before = ids(csi.list().await.into_iter().map(|v| v.volume_id));
        let snapshots_before = ids(csi.snapshots().await.into_iter().map(|s| s.snapshot_id));
        let pending = self.model.pending.take();
        let mut pending_id = None;
        if let Some(words) = &pending {
            let answer = match Kind::of(&words[0]) {
                Kind::Fill => "unknown".to_owned(),
                _ => send(words, csi.controller.clone())
                    .await
                    .unwrap_or_else(|e| panic!("the call a cut caught, {words:?}, retried: {e}")),
            };
            pending_id = Some(if answer.is_empty() {
                words[1].clone()
            } else {
                answer.clone()
            });
            let line = format!("{} {answer}", words.join(" "));
            self.journal.write(&format!("acked {line}"));
            let acked: Vec<String> = line.split(' ').map(str::to_owned).collect();
            self.model.apply(&acked);
        }
        let listed = csi.list().await;
        let volumes = ids(listed.iter().map(|v| v.volume_id.clone()));
        let snapshots_listed = csi.snapshots().await;
        let snapshots = ids(snapshots_listed.iter().map(|s| s.snapshot_id.clone()));
        assert_eq!(
            volumes,
            ids(self.model.volumes.keys().cloned()),
            "volumes listed"
        );
        assert_eq!(
            snapshots,
            ids(self.model.snapshots.keys().cloned()),
            "snapshots listed"
        );
        for (before, after, what) in [
            (&volumes_before, &volumes, "volumes"),
            (&snapshots_before, &snapshots, "snapshots"),
        ] {
            let changed: Vec<_> = before.symmetric_difference(after).collect();
            assert!(
                changed.iter().all(|id| Some(*id) == pending_id.as_ref()),
                "{what} before the cut call's retry {before:?}, after {after:?}, pending {pending:?}"
            );
        }
        let q = QuotaFs::open(&self.mnt).expect("open quota fs");
        for volume in &listed {
            assert_eq!(volume.capacity_bytes, VOLUME_BYTES as i64, "{volume:?}");
            let dir = self.served.volume_dir(&volume.volume_id);
            let known = &self.model.volumes[&volume.volume_id];
            if let Some(content) = known.content {
                assert_eq!(hash_of(&dir), content, "content of volume {}", known.name);
            }
            let project = self
                .served
                .recorded_project(&volume.volume_id)
                .expect("project");
            assert_eq!(
                quota::project_of(&dir).unwrap().id,
                project,
                "project of {}",
                known.name
            );
            let limits = q.usage(project).unwrap().limits;
            assert_eq!(limits.bytes, VOLUME_BYTES, "limit of {}", known.name);
        }
        for snapshot in &snapshots_listed {
            let known = &self.model.snapshots[&snapshot.snapshot_id];
            assert!(snapshot.ready_to_use, "{snapshot:?}");
            assert_eq!(snapshot.source_volume_id, known.source, "{snapshot:?}");
            if let Some(content) = known.content {
                let dir = self
                    .served
                    .state
                    .join("snapshots")
                    .join(&snapshot.snapshot_id);
                assert_eq!(hash_of(&dir), content, "content of snapshot {}", known.name);
            }
        }
        self.no_half_state(&volumes, &snapshots).await;
        format!(
            "{} volumes and {} snapshots as acknowledged; the cut call {}",
            volumes.len(),
            snapshots.len(),
            match (&pending, &pending_id) {
                (Some(words), _) if words[0] == "fill" => {
                    "a pod's fill (not a call: its volume's content is unknown since)".to_owned()
                }
                (Some(words), Some(id)) => format!(
                    "`{}`'s object was {}there before its retry",
                    words[0],
                    if volumes_before.contains(id) || snapshots_before.contains(id) {
                        ""
                    } else {
                        "not "
                    }
                ),
                _ => "none (the cut came between calls)".to_owned(),
            }
        )
    }

    /// Once start-up's leftovers are removed, the state holds exactly the listed objects.
    async fn no_half_state(&self, volumes: &BTreeSet<String>, snapshots: &BTreeSet<String>) {
        let state = &self.served.state;
        let names = |dir: &str, suffix: &str| -> BTreeSet<String> {
            std::fs::read_dir(state.join(dir))
                .map(|entries| {
                    entries
                        .filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .filter_map(|n| n.strip_suffix(suffix).map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        // A deletion the cut interrupted keeps its record until its set-aside data is gone.
        let settled = crate::common::wait_until(Duration::from_secs(90), || {
            let orphans_gone = ["volumes", "snapshots"]
                .iter()
                .all(|dir| !names(dir, "").iter().any(|n| n.starts_with(".orphan-")));
            orphans_gone && &names("meta", ".json") == volumes
        })
        .await;
        assert!(
            settled,
            "leftovers or records not removed:\n{}",
            self.served.logs()
        );
        assert_eq!(&names("volumes", ""), volumes, "volume directories");
        assert_eq!(&names("meta", ".json"), volumes, "volume records");
        assert_eq!(&names("snapshots", ""), snapshots, "snapshot directories");
        assert_eq!(
            &names("snapshot-meta", ".json"),
            snapshots,
            "snapshot records"
        );
    }

    /// Works until the power is cut; never returns.
    pub fn work_until_cut(&mut self, round: usize) -> ! {
        runtime().block_on(self.work(round));
        panic!("{MAX_CYCLES} cycles of work and no cut");
    }

    async fn work(&mut self, round: usize) {
        let csi = self.served.client().await;
        if self.aim == Some(Aim::Random) {
            let after = Duration::from_secs_f64(2.0 + 8.0 * self.rng.unit());
            let label = self.label.clone();
            std::thread::spawn(move || {
                std::thread::sleep(after);
                cut_now(&format!(
                    "{label}: cut at random, {} ms into the work",
                    after.as_millis()
                ))
            });
        }
        for cycle in 0..MAX_CYCLES {
            // The oldest go first, so what a boot leaves (and the next boot checks) stays
            // about the same however early the cut comes.
            while self.model.snapshots.len() > KEEP_SNAPSHOTS {
                let oldest = Model::oldest(&self.model.snapshots, |s| s.seq).unwrap();
                self.call(&csi, &["delete-snapshot", &oldest]).await;
            }
            while self.model.volumes.len() > KEEP_VOLUMES {
                let oldest = Model::oldest(&self.model.volumes, |v| v.seq).unwrap();
                self.call(&csi, &["delete-volume", &oldest]).await;
            }
            let name = |prefix: &str| format!("{prefix}{round}-{cycle}");
            let v = self
                .call(&csi, &["create", &name("v"), &VOLUME_BYTES.to_string()])
                .await;
            self.fill(&v);
            let s = self.call(&csi, &["snapshot", &name("s"), &v]).await;
            self.call(&csi, &["restore", &name("r"), &s]).await;
            self.call(&csi, &["clone", &name("c"), &v]).await;
        }
    }

    /// One call, journalled; cut part-way through when this boot aims at its kind and has
    /// seen one before (to know how long it takes).
    async fn call(&mut self, csi: &Csi, words: &[&str]) -> String {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let kind = Kind::of(&words[0]);
        self.journal.write(&format!("begin {}", words.join(" ")));
        let started = Instant::now();
        let task = tokio::spawn({
            let words = words.clone();
            let controller = csi.controller.clone();
            async move { send(&words, controller).await }
        });
        let aimed = self.aim.and_then(Aim::kind) == Some(kind);
        if let (true, Some(took)) = (aimed, self.durations.get(&kind).copied()) {
            // Within the first 70 % of the last one's time: one call of a kind can be quicker.
            let at = took.mul_f64(0.7 * self.rng.unit());
            tokio::time::sleep(at).await;
            let answered = if task.is_finished() {
                ", after its answer"
            } else {
                ""
            };
            cut_now(&format!(
                "{}: cut {} ms into `{}` (the last took {} ms){answered}",
                self.label,
                at.as_millis(),
                words[0],
                took.as_millis()
            ));
        }
        let answer = task
            .await
            .expect("call task")
            .unwrap_or_else(|e| panic!("{words:?}: {e}"));
        self.durations.insert(kind, started.elapsed());
        self.journal
            .write(&format!("acked {} {answer}", words.join(" ")));
        self.model.apply(
            &format!("{} {answer}", words.join(" "))
                .split(' ')
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        );
        answer
    }

    /// Writes a pod's files into a volume and syncs them: a small tree and a larger file.
    fn fill(&mut self, id: &str) {
        self.journal.write(&format!("begin fill {id}"));
        let dir = self.served.volume_dir(id);
        for i in 0..120u64 {
            let sub = dir.join(format!("d{}", i % 6));
            std::fs::create_dir_all(&sub).expect("mkdir");
            let len = 1024 + (self.rng.next() % (48 << 10));
            let bytes: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
            std::fs::write(sub.join(format!("f{i}")), bytes).expect("write");
        }
        let big: Vec<u8> = (0..(2u64 << 20) / 8)
            .flat_map(|_| self.rng.next().to_le_bytes())
            .collect();
        std::fs::write(dir.join("big"), big).expect("write big");
        std::os::unix::fs::symlink("d0/f0", dir.join("link")).expect("symlink");
        let root = std::fs::File::open(&dir).expect("open volume");
        nix::unistd::syncfs(root).expect("syncfs");
        let hash = hash_of(&dir);
        self.journal.write(&format!("acked fill {id} {hash}"));
        self.model
            .apply(&["fill".into(), id.into(), hash.to_string()]);
    }
}

fn ids(ids: impl Iterator<Item = String>) -> BTreeSet<String> {
    ids.collect()
}

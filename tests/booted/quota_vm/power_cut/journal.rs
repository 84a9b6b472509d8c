//! Inside the VM: what the power-cut case was told, kept on a disk of its own. Every call is
//! written (and fsynced) as `begin …` before it is sent and `acked …` once it was answered, so
//! after a cut the next boot knows what was acknowledged and which one call may have been cut
//! half-way. The journal's filesystem is not the state directory's, so its fsyncs never
//! flush node-server's own unflushed work.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A volume as the answers left it.
#[derive(Debug, Clone)]
pub struct Volume {
    pub name: String,
    /// The hash of its tree, or `None` when a cut came while it was filled (what was not
    /// synced then is a pod's unsynced data, which a power cut may take).
    pub content: Option<u64>,
    /// Order of acknowledgement, oldest first.
    pub seq: usize,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub name: String,
    pub source: String,
    pub content: Option<u64>,
    pub seq: usize,
}

/// Everything acknowledged so far, and the call that was sent but not answered.
#[derive(Debug, Default)]
pub struct Model {
    pub volumes: BTreeMap<String, Volume>,
    pub snapshots: BTreeMap<String, Snapshot>,
    /// The words of the last `begin` line with no `acked` after it.
    pub pending: Option<Vec<String>>,
    seq: usize,
}

/// The hash of an empty volume's tree.
pub fn empty_tree_hash() -> u64 {
    let empty = tempfile::tempdir().expect("an empty directory");
    super::inside::hash_of(empty.path())
}

impl Model {
    pub fn replay(text: &str) -> Self {
        let mut model = Self::default();
        for line in text.lines() {
            let words: Vec<String> = line.split(' ').map(str::to_owned).collect();
            match words.first().map(String::as_str) {
                Some("begin") => model.pending = Some(words[1..].to_vec()),
                Some("acked") => {
                    model.apply(&words[1..]);
                    model.pending = None;
                }
                _ => {}
            }
        }
        model
    }

    /// Applies an acknowledged call: `<op> <args…> <answer>`.
    pub fn apply(&mut self, words: &[String]) {
        let w = |i: usize| words[i].clone();
        self.seq += 1;
        let seq = self.seq;
        match words[0].as_str() {
            "create" => self.add_volume(w(3), w(1), Some(empty_tree_hash()), seq),
            "fill" => {
                let content = words[2].parse().ok();
                if let Some(volume) = self.volumes.get_mut(&words[1]) {
                    volume.content = content;
                }
            }
            "snapshot" => {
                let content = self.volumes.get(&words[2]).and_then(|v| v.content);
                let snapshot = Snapshot {
                    name: w(1),
                    source: w(2),
                    content,
                    seq,
                };
                self.snapshots.insert(w(3), snapshot);
            }
            "restore" => {
                let content = self.snapshots.get(&words[2]).and_then(|s| s.content);
                self.add_volume(w(3), w(1), content, seq);
            }
            "clone" => {
                let content = self.volumes.get(&words[2]).and_then(|v| v.content);
                self.add_volume(w(3), w(1), content, seq);
            }
            "delete-volume" => {
                self.volumes.remove(&words[1]);
            }
            "delete-snapshot" => {
                self.snapshots.remove(&words[1]);
            }
            other => panic!("unknown journal op {other}"),
        }
    }

    fn add_volume(&mut self, id: String, name: String, content: Option<u64>, seq: usize) {
        self.volumes.insert(id, Volume { name, content, seq });
    }

    /// The oldest volume whose content is known, for a source.
    pub fn oldest<T>(items: &BTreeMap<String, T>, seq: impl Fn(&T) -> usize) -> Option<String> {
        items
            .iter()
            .min_by_key(|(_, v)| seq(v))
            .map(|(id, _)| id.clone())
    }
}

/// The journal file, appended to and fsynced line by line.
pub struct Journal(std::fs::File);

impl Journal {
    pub fn open(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self(file)
    }

    pub fn write(&mut self, line: &str) {
        writeln!(self.0, "{line}").expect("journal write");
        self.0.sync_data().expect("journal fsync");
    }
}

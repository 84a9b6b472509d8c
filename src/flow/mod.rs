//! The registration flow of one run, as it was observed, drawn as a sequence diagram
//! (`--flow=FILE` of `demo`, `probe kubelet` and `probe doctor`): lifelines for the driver,
//! the registrar, the kubelet (or the doctor) and the API objects, one [`Arrow`] per call or
//! socket event, with the step number of the README's seven-step table, its key result, its
//! duration, and whether it failed or was skipped.
//!
//! - [`Stamp`] — when a call started and how long it took, read from the monotonic clock by
//!   the process that made the call. `CLOCK_MONOTONIC` is one clock for the whole machine, so
//!   the demo can put the kubelet's arrows and its own in one order.
//! - [`Recorder`] — arrows shared by the tasks of one process; off unless `--flow` was given.
//! - [`svg`], [`mermaid`] — the two renderers; [`FlowFile`] picks one by the file's extension.

pub mod mermaid;
pub mod svg;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Who is on the diagram, in the order of its lifelines from left to right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Party {
    /// The CSI driver (our node-server, or whatever serves `csi.sock`).
    Driver,
    Registrar,
    Kubelet,
    /// `probe doctor`, walking the kubelet's steps read-only.
    Doctor,
    /// The Node and CSINode objects.
    Api,
}

impl Party {
    pub fn title(self) -> &'static str {
        match self {
            Self::Driver => "CSI driver (node-server)",
            Self::Registrar => "registrar",
            Self::Kubelet => "kubelet",
            Self::Doctor => "doctor",
            Self::Api => "API server (Node, CSINode)",
        }
    }

    /// A short identifier (Mermaid's participant names).
    pub fn id(self) -> &'static str {
        match self {
            Self::Driver => "D",
            Self::Registrar => "R",
            Self::Kubelet => "K",
            Self::Doctor => "X",
            Self::Api => "A",
        }
    }
}

/// How a step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    /// The step failed; the arrow's result is the finding's or the error's text.
    Failed,
    /// Not done (read-only, not reached, not observable); the result says why.
    Skipped,
}

/// One call or socket event. `from == to` is an event on one lifeline (a socket created).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Arrow {
    /// The step of the README's table, 1–7.
    pub step: u8,
    pub from: Party,
    pub to: Party,
    /// `GetInfo`, `NodeGetInfo`, `creates csi.sock`.
    pub call: String,
    /// The key result: driver name, endpoint, node ID, topology, the notify's error.
    pub result: String,
    pub outcome: Outcome,
    /// When it started, in nanoseconds of `CLOCK_MONOTONIC` (0: not timed).
    pub at_ns: u64,
    /// How long it took, as measured by the process that made it; `None`: not timed.
    pub took_us: Option<u64>,
    /// Which plugin (registration socket) it belongs to, when a run has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Arrow {
    /// An untimed arrow (the doctor's findings, steps another process made).
    pub fn untimed(
        step: u8,
        from: Party,
        to: Party,
        call: &str,
        result: impl Into<String>,
    ) -> Self {
        Self {
            step,
            from,
            to,
            call: call.to_owned(),
            result: result.into(),
            outcome: Outcome::Ok,
            at_ns: 0,
            took_us: None,
            group: None,
        }
    }

    /// The arrow with the timing its caller measured; `None` leaves it untimed.
    pub fn timed(mut self, timing: Option<Timing>) -> Self {
        if let Some(Timing { at_ns, took_us }) = timing {
            self.at_ns = at_ns;
            self.took_us = Some(took_us);
        }
        self
    }

    pub fn with(mut self, outcome: Outcome) -> Self {
        self.outcome = outcome;
        self
    }

    pub fn in_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The duration for people: `1.2 ms`, `35 µs`, `2.01 s`.
    pub fn took_text(&self) -> Option<String> {
        let us = self.took_us?;
        Some(match us {
            0..1_000 => format!("{us} µs"),
            1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
            _ => format!("{:.2} s", us as f64 / 1e6),
        })
    }

    /// `4. GetInfo (1.2 ms)`: the arrow's first line.
    pub fn heading(&self) -> String {
        match self.took_text() {
            Some(took) => format!("{}. {} ({took})", self.step, self.call),
            None => format!("{}. {}", self.step, self.call),
        }
    }
}

/// The system-wide monotonic clock, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        // CLOCK_MONOTONIC exists on every Linux; an arrow without a stamp still sorts.
        Err(_) => 0,
    }
}

/// A call's start (`CLOCK_MONOTONIC`, ns) and duration (µs), as its caller measured them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub at_ns: u64,
    pub took_us: u64,
}

/// The start of a call, for the arrow it becomes.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    at_ns: u64,
    started: Instant,
}

impl Stamp {
    pub fn now() -> Self {
        Self {
            at_ns: monotonic_ns(),
            started: Instant::now(),
        }
    }

    /// The arrow of the call that started at this stamp and ends now.
    pub fn arrow(
        self,
        step: u8,
        from: Party,
        to: Party,
        call: &str,
        result: impl Into<String>,
        outcome: Outcome,
    ) -> Arrow {
        Arrow::untimed(step, from, to, call, result)
            .with(outcome)
            .timed(Some(self.timing()))
    }

    /// When the call started and how long it took, to draw later (the doctor times its calls
    /// while it walks and draws once it has its findings).
    pub fn timing(self) -> Timing {
        Timing {
            at_ns: self.at_ns,
            took_us: self.took().as_micros().min(u64::MAX as u128) as u64,
        }
    }

    pub fn took(self) -> Duration {
        self.started.elapsed()
    }
}

/// The arrows of one process, shared by its tasks; [`Recorder::off`] records nothing.
#[derive(Debug, Clone, Default)]
pub struct Recorder(Option<Arc<Mutex<Vec<Arrow>>>>);

impl Recorder {
    pub fn on() -> Self {
        Self(Some(Arc::default()))
    }

    pub fn off() -> Self {
        Self(None)
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    pub fn record(&self, arrow: Arrow) {
        if let Some(arrows) = &self.0 {
            crate::mutex::lock(arrows).push(arrow);
        }
    }

    pub fn extend(&self, more: impl IntoIterator<Item = Arrow>) {
        if let Some(arrows) = &self.0 {
            crate::mutex::lock(arrows).extend(more);
        }
    }

    pub fn arrows(&self) -> Vec<Arrow> {
        match &self.0 {
            Some(arrows) => crate::mutex::lock(arrows).clone(),
            None => Vec::new(),
        }
    }
}

/// A diagram: a title and the arrows in the order they are drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub title: String,
    pub arrows: Vec<Arrow>,
}

impl Flow {
    /// The arrows in the order observed (stable: untimed arrows keep their places among
    /// equals, and a group's arrows stay together in the order of first appearance).
    pub fn new(title: impl Into<String>, mut arrows: Vec<Arrow>) -> Self {
        let mut groups: Vec<Option<String>> = Vec::new();
        for arrow in &arrows {
            if !groups.contains(&arrow.group) {
                groups.push(arrow.group.clone());
            }
        }
        arrows.sort_by_key(|a| (groups.iter().position(|g| *g == a.group), a.at_ns));
        Self {
            title: title.into(),
            arrows,
        }
    }

    /// The lifelines the arrows use, left to right.
    pub fn lifelines(&self) -> Vec<Party> {
        let mut parties: Vec<Party> = self.arrows.iter().flat_map(|a| [a.from, a.to]).collect();
        parties.sort();
        parties.dedup();
        parties
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Svg => svg::render(self),
            Format::Mermaid => mermaid::render(self),
        }
    }
}

/// What `--flow` writes, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    /// `.mmd` or `.md` (a Markdown file gets the diagram in a fenced block).
    Mermaid,
}

/// `--flow=FILE`: a file that can be written, ending in `.svg`, `.mmd` or `.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowFile {
    pub path: PathBuf,
    pub format: Format,
}

/// The flow could not be written.
#[derive(Debug, thiserror::Error)]
#[error("write the flow to {}: {source}", path.display())]
pub struct WriteError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl FlowFile {
    /// The format of `path`, or why it has none.
    pub fn format_of(path: &Path) -> Result<Format, &'static str> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("svg") => Ok(Format::Svg),
            Some("mmd" | "md") => Ok(Format::Mermaid),
            _ => Err("expected a file ending in .svg, .mmd or .md"),
        }
    }

    pub fn write(&self, flow: &Flow) -> Result<(), WriteError> {
        let mut text = flow.render(self.format);
        if self.path.extension().is_some_and(|e| e == "md") {
            text = format!("# {}\n\n```mermaid\n{text}```\n", flow.title);
        }
        std::fs::write(&self.path, text).map_err(|source| WriteError {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests;

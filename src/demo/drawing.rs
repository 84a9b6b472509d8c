//! `demo --flow`: the demo's own observations (the sockets appearing, timed from the demo's
//! side) and the kubelet's calls (timed by `probe kubelet`, carried in its JSON events) in one
//! diagram. Both are stamped on `CLOCK_MONOTONIC`, one clock for the machine, so they sort
//! into the order they happened.

use crate::BoxError;
use crate::flow::{Arrow, Flow, FlowFile, Outcome, Party, Recorder, Stamp};

pub struct Drawing {
    file: Option<FlowFile>,
    arrows: Recorder,
}

impl Drawing {
    pub fn new(file: Option<FlowFile>) -> Self {
        let arrows = match file {
            Some(_) => Recorder::on(),
            None => Recorder::off(),
        };
        Self { file, arrows }
    }

    /// A socket seen appearing, `stamp` being when its process was started; returns the
    /// arrow's place on the clock.
    pub fn socket_appeared(
        &self,
        stamp: Stamp,
        step: u8,
        party: Party,
        socket: &str,
        path: &str,
    ) -> u64 {
        let result = format!("{path}, seen by the demo after starting the process");
        let arrow = stamp.arrow(
            step,
            party,
            party,
            &format!("creates {socket}"),
            result,
            Outcome::Ok,
        );
        let at_ns = arrow.at_ns;
        self.arrows.record(arrow);
        at_ns
    }

    /// GetPluginInfo happens inside the registrar, before its socket appears: drawn with the
    /// name it returned (GetInfo gives it back later) and no duration, since nobody here timed
    /// it; placed just after `after_ns`.
    pub fn get_plugin_info(&self, after_ns: u64, driver: &str) {
        let mut arrow = Arrow::untimed(
            3,
            Party::Registrar,
            Party::Driver,
            "GetPluginInfo",
            format!("{driver} (the registrar's own call, not timed by the demo)"),
        );
        arrow.at_ns = after_ns + 1;
        self.arrows.record(arrow);
    }

    /// The calls of one of `probe kubelet`'s JSON events (`calls`), every attempt's.
    pub fn kubelet_event(&self, event: &serde_json::Value) {
        if !self.arrows.is_on() {
            return;
        }
        let calls: Vec<Arrow> = serde_json::from_value(event["calls"].clone()).unwrap_or_default();
        // One plugin: no per-plugin heading.
        self.arrows
            .extend(calls.into_iter().map(|a| Arrow { group: None, ..a }));
    }

    /// Writes the picture, and says where.
    pub fn write(&self) -> Result<(), BoxError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let flow = Flow::new("csi-nodekit demo: registration", self.arrows.arrows());
        file.write(&flow)?;
        println!("   the flow, drawn: {}", file.path.display());
        Ok(())
    }
}

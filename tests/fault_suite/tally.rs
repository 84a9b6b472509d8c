//! Counting a case's tries.

use std::fmt::Display;

/// The tries of one fault case: how many were made, how many the system survived, and how
/// many lost something. Every failed or lossy try is described, for the failure message.
pub struct Tally {
    case: &'static str,
    tried: u32,
    survived: u32,
    lost: u32,
    failures: Vec<String>,
    note: String,
}

/// What became of one try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Survived,
    /// Not survived, nothing lost: a wrong answer, a process that did not come back.
    Failed,
    /// Something that should have been kept is gone or changed.
    Lost,
}

impl Tally {
    pub fn new(case: &'static str) -> Self {
        Self {
            case,
            tried: 0,
            survived: 0,
            lost: 0,
            failures: Vec::new(),
            note: String::new(),
        }
    }

    /// Records one try; `what` describes it when it did not survive.
    pub fn record(&mut self, outcome: Outcome, what: impl Display) {
        self.tried += 1;
        match outcome {
            Outcome::Survived => self.survived += 1,
            Outcome::Failed => self.failures.push(format!("failed: {what}")),
            Outcome::Lost => {
                self.lost += 1;
                self.failures.push(format!("LOST: {what}"));
            }
        }
    }

    /// Records a try that survived when `survived` holds.
    pub fn check(&mut self, survived: bool, what: impl Display) {
        let outcome = if survived {
            Outcome::Survived
        } else {
            Outcome::Failed
        };
        self.record(outcome, what);
    }

    /// What the tries did, printed after the counts (so a reader sees the case bit).
    pub fn note(&mut self, note: impl Display) {
        self.note = format!(" ({note})");
    }

    /// Prints the case's line and fails the test unless every try survived with nothing lost.
    pub fn finish(self) {
        println!(
            "fault {}: tried {}, survived {}, lost {}{}",
            self.case, self.tried, self.survived, self.lost, self.note
        );
        assert!(self.tried > 0, "{}: nothing was tried", self.case);
        assert!(
            self.survived == self.tried && self.lost == 0,
            "{}: {} of {} tries did not survive, {} lost:\n{}",
            self.case,
            self.tried - self.survived,
            self.tried,
            self.lost,
            self.failures.join("\n")
        );
    }
}

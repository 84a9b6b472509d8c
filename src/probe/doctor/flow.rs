//! `probe doctor --flow`: the doctor's findings per plugin, drawn as the steps of the flow
//! they belong to (by their check names): what it found failing is red with the finding's
//! text, a step it did not reach or does not take (it never calls NotifyRegistrationStatus)
//! is drawn skipped. The doctor does not time single calls; its arrows carry no durations.

use super::Report;
use super::chain::Plugin;
use super::finding::{Finding, Severity};
use crate::flow::{Arrow, Flow, Outcome, Party};

/// The steps the doctor walks for one plugin, in its order, with the checks of each.
const WALK: &[(u8, Party, &str, &[&str])] = &[
    (
        2,
        Party::Registrar,
        "connect to the registration socket",
        &[
            "registration.stale",
            "registration.dial",
            "registration.permissions",
        ],
    ),
    (4, Party::Registrar, "GetInfo", &["registration."]),
    (
        1,
        Party::Driver,
        "connect to the driver's endpoint",
        &["endpoint."],
    ),
    (
        3,
        Party::Driver,
        "GetPluginInfo",
        &["driver.plugin-info", "driver.name-mismatch"],
    ),
    (
        5,
        Party::Driver,
        "NodeGetInfo",
        &[
            "driver.node-info",
            "driver.node-id",
            "driver.max-volumes",
            "driver.topology",
            "driver.timeout",
        ],
    ),
];

pub fn draw(report: &Report) -> Flow {
    let title = format!(
        "probe doctor: {} (diagnosed in {} ms)",
        report
            .root
            .path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "no kubelet root".into()),
        report.elapsed.as_millis()
    );
    let mut arrows = Vec::new();
    if report.plugins.is_empty() {
        let errors: Vec<&Finding> = report
            .node
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .collect();
        let arrow = Arrow::untimed(
            2,
            Party::Doctor,
            Party::Registrar,
            "find registration sockets",
            texts(&errors),
        );
        arrows.push(match errors.is_empty() {
            true => Arrow {
                result: "no registration socket found".into(),
                ..arrow
            }
            .with(Outcome::Skipped),
            false => arrow.with(Outcome::Failed),
        });
    }
    for plugin in &report.plugins {
        arrows.extend(plugin_arrows(report, plugin));
    }
    Flow::new(title, arrows)
}

fn plugin_arrows(report: &Report, plugin: &Plugin) -> Vec<Arrow> {
    let group = plugin.socket.display().to_string();
    let mut arrows = Vec::new();
    let mut claimed: Vec<&Finding> = Vec::new();
    let mut failed = false;
    for (step, to, call, checks) in WALK {
        let mine: Vec<&Finding> = plugin
            .findings
            .iter()
            .filter(|f| !claimed.contains(f) && checks.iter().any(|c| f.check.starts_with(c)))
            .collect();
        claimed.extend(&mine);
        let timing = plugin
            .timings
            .iter()
            .find(|(s, _)| s == step)
            .map(|(_, t)| *t);
        let arrow = Arrow::untimed(*step, Party::Doctor, *to, call, texts(&mine)).timed(timing);
        let skipped = |why: &str| {
            Arrow {
                result: why.to_owned(),
                ..arrow.clone()
            }
            .with(Outcome::Skipped)
        };
        arrows.push(if mine.iter().any(|f| f.severity == Severity::Error) {
            failed = true;
            arrow.with(Outcome::Failed)
        } else if failed {
            skipped("not reached: an earlier step failed")
        } else if plugin.other_type && *step != 2 && *step != 4 {
            skipped("not a CSI plugin")
        } else if mine.is_empty() && *step == 2 {
            Arrow {
                result: "a registrar listens".into(),
                ..arrow
            }
        } else if mine.is_empty() {
            skipped("not checked")
        } else {
            arrow
        });
    }
    arrows.push(api_arrow(report, plugin, failed));
    arrows.push(
        Arrow::untimed(
            7,
            Party::Doctor,
            Party::Registrar,
            "NotifyRegistrationStatus",
            "the doctor is read-only: it never notifies",
        )
        .with(Outcome::Skipped),
    );
    // The drawing orders by the clock: a step with no call of its own (not reached, the API,
    // the notify) keeps its place after the call before it.
    let mut last = 0;
    for arrow in &mut arrows {
        match arrow.at_ns {
            0 => arrow.at_ns = last,
            at => last = at,
        }
    }
    arrows
        .into_iter()
        .map(|a| a.in_group(group.clone()))
        .collect()
}

/// Step 6: the API comparisons that name this plugin's driver.
fn api_arrow(report: &Report, plugin: &Plugin, failed: bool) -> Arrow {
    let arrow = Arrow::untimed(6, Party::Doctor, Party::Api, "compare Node and CSINode", "");
    let Some(driver) = plugin.driver.as_deref().filter(|_| report.api.is_some()) else {
        let why = match report.api {
            None => "no API access: not compared",
            Some(_) => "no driver name to compare",
        };
        return Arrow {
            result: why.into(),
            ..arrow
        }
        .with(Outcome::Skipped);
    };
    let mine: Vec<&Finding> = report
        .node
        .iter()
        .filter(|f| f.check.starts_with("api.") && f.saw.contains(driver))
        .collect();
    let outcome = match mine.iter().any(|f| f.severity == Severity::Error) {
        true => Outcome::Failed,
        false if failed && mine.is_empty() => Outcome::Skipped,
        false => Outcome::Ok,
    };
    let result = match mine.is_empty() {
        true => "no difference found for this driver".to_owned(),
        false => texts(&mine),
    };
    Arrow { result, ..arrow }.with(outcome)
}

/// The findings as one text, errors first: what was seen and what it means.
fn texts(findings: &[&Finding]) -> String {
    let mut sorted = findings.to_vec();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let parts: Vec<String> = sorted
        .iter()
        .map(|f| match f.means.is_empty() {
            true => format!("{}: {}", f.severity.as_str(), f.saw),
            false => format!("{}: {} — {}", f.severity.as_str(), f.saw, f.means),
        })
        .collect();
    parts.join("; ")
}

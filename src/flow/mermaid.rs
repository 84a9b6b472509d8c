//! A [`Flow`] as Mermaid `sequenceDiagram` text, which GitHub and most documentation tools
//! draw: a participant per lifeline, a message per arrow (`->>` a call, `-x` a failed one
//! inside a red `rect`, `--)` a skipped one), a `Note` heading each plugin's arrows.

use std::fmt::Write;

use super::{Arrow, Flow, Outcome};

/// Red behind a failed step.
const FAILED_FILL: &str = "rgb(255, 221, 221)";

pub fn render(flow: &Flow) -> String {
    let mut out = String::from("sequenceDiagram\n");
    let _ = writeln!(out, "    title {}", clean(&flow.title));
    let lifelines = flow.lifelines();
    for party in &lifelines {
        let _ = writeln!(out, "    participant {} as {}", party.id(), party.title());
    }
    let (first, last) = match (lifelines.first(), lifelines.last()) {
        (Some(first), Some(last)) => (first.id(), last.id()),
        _ => return out,
    };
    let mut group = None;
    for arrow in &flow.arrows {
        if arrow.group.is_some() && arrow.group != group {
            group = arrow.group.clone();
            let name = clean(group.as_deref().unwrap_or_default());
            let _ = writeln!(out, "    Note over {first},{last}: plugin {name}");
        }
        message(&mut out, arrow);
    }
    out
}

fn message(out: &mut String, arrow: &Arrow) {
    let (from, to) = (arrow.from.id(), arrow.to.id());
    let mut label = arrow.heading();
    match arrow.outcome {
        Outcome::Ok => {}
        Outcome::Failed => label.push_str(" FAILED"),
        Outcome::Skipped => label.push_str(" skipped"),
    }
    if !arrow.result.is_empty() {
        label.push_str(": ");
        label.push_str(&arrow.result);
    }
    let label = clean(&label);
    match arrow.outcome {
        Outcome::Ok => {
            let _ = writeln!(out, "    {from}->>{to}: {label}");
        }
        Outcome::Failed => {
            let _ = writeln!(out, "    rect {FAILED_FILL}");
            let _ = writeln!(out, "    {from}-x{to}: {label}");
            let _ = writeln!(out, "    end");
        }
        Outcome::Skipped => {
            let _ = writeln!(out, "    {from}--){to}: {label}");
        }
    }
}

/// A message on one line that Mermaid takes as plain text: `;` ends a statement in older
/// Mermaid, `#…;` is an entity, `<…>` is HTML, `%%` starts a comment.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\r' | '\t' => ' ',
            ';' => ',',
            '#' => '№',
            '<' => '‹',
            '>' => '›',
            '%' => '٪',
            c => c,
        })
        .collect()
}

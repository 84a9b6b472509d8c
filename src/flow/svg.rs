//! A [`Flow`] as a self-contained SVG: no scripts, no fonts or files from outside (the generic
//! `sans-serif` family), a white background, and a declared width and height at which every
//! label is readable. A lifeline per party, an arrow per call with its step number in a circle
//! on the left, a failed step red with its text, a skipped one grey and dashed; each arrow's
//! whole text is also its `<title>` (the tooltip); long results are wrapped, never cut, and an
//! arrow to a process names the socket the call went to.

use std::fmt::Write;

use super::{Arrow, Flow, Outcome, Party};

const LANE: usize = 250;
const LEFT: usize = 56;
const RIGHT: usize = 24;
const TOP: usize = 78;
const LINE: usize = 15;
/// A character of the 11 px label font, generously (no font metrics without a font).
const CHAR_PX: f64 = 6.3;
const RED: &str = "#c62828";
const GREY: &str = "#757575";
const INK: &str = "#1f2933";

pub fn render(flow: &Flow) -> String {
    let lifelines = flow.lifelines();
    let width = LEFT + lifelines.len().max(1) * LANE + RIGHT;
    let lane_x = |party: Party| {
        let index = lifelines.iter().position(|p| *p == party).unwrap_or(0);
        LEFT + index * LANE + LANE / 2
    };
    let mut body = String::new();
    let mut y = TOP;
    let mut group = None;
    for arrow in &flow.arrows {
        if arrow.group.is_some() && arrow.group != group {
            group = arrow.group.clone();
            let name = group.as_deref().unwrap_or_default();
            let _ = write!(
                body,
                r##"<rect x="4" y="{}" width="{}" height="22" fill="#eef2f7"/><text x="10" y="{}" font-size="12" font-weight="bold" fill="{INK}">plugin {}</text>"##,
                y + 4,
                width - 8,
                y + 19,
                escape(name)
            );
            y += 30;
        }
        y = row(&mut body, arrow, y, &lane_x);
    }
    let height = y + 16;
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">
<title>{}</title>
<defs>{}{}{}</defs>
<rect width="{width}" height="{height}" fill="#ffffff"/>
<text x="{LEFT}" y="22" font-size="14" font-weight="bold" fill="{INK}">{}</text>
"##,
        escape(&flow.title),
        marker("ok", INK),
        marker("failed", RED),
        marker("skipped", GREY),
        escape(&flow.title)
    );
    for party in &lifelines {
        let x = lane_x(*party);
        let _ = writeln!(
            out,
            r##"<g class="lifeline" id="lifeline-{}"><rect x="{}" y="34" width="{}" height="28" rx="4" fill="#e3ecfa" stroke="#4a6fa5"/><text x="{x}" y="53" font-size="12" font-weight="bold" text-anchor="middle" fill="{INK}">{}</text><line x1="{x}" y1="62" x2="{x}" y2="{}" stroke="#9aa5b1" stroke-dasharray="4 4"/></g>"##,
            party.id(),
            x - (LANE - 30) / 2,
            LANE - 30,
            escape(party.title()),
            height - 8
        );
    }
    out.push_str(&body);
    out.push_str("</svg>\n");
    out
}

fn marker(id: &str, colour: &str) -> String {
    format!(
        r##"<marker id="head-{id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>"##
    )
}

/// Draws one arrow from `y` down; returns where the next row starts.
fn row(out: &mut String, arrow: &Arrow, y: usize, lane_x: &dyn Fn(Party) -> usize) -> usize {
    let (x1, x2) = (lane_x(arrow.from), lane_x(arrow.to));
    let own = x1 == x2;
    let (colour, dash, head) = match arrow.outcome {
        Outcome::Ok => (INK, "", "ok"),
        Outcome::Failed => (RED, "", "failed"),
        Outcome::Skipped => (GREY, r#" stroke-dasharray="6 4""#, "skipped"),
    };
    let span = if own { LANE - 40 } else { x1.abs_diff(x2) - 16 };
    let fit = ((span as f64) / CHAR_PX) as usize;
    let mut heading = arrow.heading();
    match arrow.outcome {
        Outcome::Ok => {}
        Outcome::Failed => heading.push_str(" — failed"),
        Outcome::Skipped => heading.push_str(" — skipped"),
    }
    let lines = wrap(&arrow.result, fit.max(10));
    let line_y = y + 20 + LINE * lines.len() + 6;
    let socket = (!own).then(|| socket(arrow.to)).flatten();
    let next = line_y + 14 + if socket.is_some() { 12 } else { 0 };
    let whole = format!("{heading}: {}", arrow.result);
    let _ = write!(
        out,
        r#"<g class="arrow" data-step="{}" data-outcome="{head}"><title>{}</title>"#,
        arrow.step,
        escape(&whole)
    );
    if arrow.outcome == Outcome::Failed {
        let _ = write!(
            out,
            r##"<rect x="4" y="{}" width="{}" height="{}" fill="#fdecea"/>"##,
            y + 2,
            x1.max(x2) + LANE / 2 - 4,
            next - y - 4
        );
    }
    let _ = write!(
        out,
        r##"<circle cx="28" cy="{line_y}" r="12" fill="{colour}"/><text x="28" y="{}" font-size="12" font-weight="bold" text-anchor="middle" fill="#ffffff">{}</text>"##,
        line_y + 4,
        arrow.step
    );
    let (text_x, anchor) = if own {
        (x1 + 10, "start")
    } else {
        ((x1 + x2) / 2, "middle")
    };
    let _ = write!(
        out,
        r#"<text x="{text_x}" y="{}" font-size="12" font-weight="bold" text-anchor="{anchor}" fill="{colour}">{}</text>"#,
        y + 16,
        escape(&heading)
    );
    for (i, line) in lines.iter().enumerate() {
        let _ = write!(
            out,
            r#"<text x="{text_x}" y="{}" font-size="11" text-anchor="{anchor}" fill="{colour}">{}</text>"#,
            y + 16 + LINE * (i + 1),
            escape(line)
        );
    }
    if own {
        let _ = write!(
            out,
            r#"<path d="M{x1},{} h28 v10 h-26" fill="none" stroke="{colour}" stroke-width="1.5"{dash} marker-end="url(#head-{head})"/>"#,
            line_y - 6
        );
    } else {
        let _ = write!(
            out,
            r#"<line x1="{x1}" y1="{line_y}" x2="{x2}" y2="{line_y}" stroke="{colour}" stroke-width="1.5"{dash} marker-end="url(#head-{head})"/>"#
        );
    }
    if let Some(socket) = socket {
        // Under the line, at its head: the socket the call went to.
        let (x, anchor) = if x2 > x1 {
            (x2 - 8, "end")
        } else {
            (x2 + 8, "start")
        };
        let _ = write!(
            out,
            r#"<text x="{x}" y="{}" font-size="10" font-style="italic" text-anchor="{anchor}" fill="{GREY}">{}</text>"#,
            line_y + 13,
            escape(socket)
        );
    }
    out.push_str("</g>\n");
    next
}

/// The socket a call to `party` goes to, where it is one of the flow's Unix sockets.
fn socket(party: Party) -> Option<&'static str> {
    match party {
        Party::Driver => Some("on csi.sock"),
        Party::Registrar => Some("on <driver>-reg.sock"),
        Party::Kubelet | Party::Doctor | Party::Api => None,
    }
}

/// Words in lines of at most `fit` characters, every word shown (GitHub shows no tooltips, so
/// nothing may be cut to one). A word longer than a line is broken.
fn wrap(text: &str, fit: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let used = current.chars().count();
            let room = if used == 0 {
                fit
            } else {
                fit.saturating_sub(used + 1)
            };
            if word.len() <= room {
                if used > 0 {
                    current.push(' ');
                }
                current.extend(word);
                break;
            }
            if used == 0 {
                current.extend(word.drain(..fit));
            }
            lines.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// Text as XML character data or an attribute value.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 does not allow at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_words_and_long_texts_wrap_within_the_lines_given() {
        assert_eq!(wrap("a bb ccc", 4), ["a bb", "ccc"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(
            wrap("one two three four", 5),
            ["one", "two", "three", "four"]
        );
        assert!(wrap("", 5).is_empty());
    }

    #[test]
    fn markup_and_control_characters_are_escaped() {
        assert_eq!(
            escape("<a & 'b'>\u{1}"),
            "&lt;a &amp; &apos;b&apos;&gt;\u{fffd}"
        );
    }
}

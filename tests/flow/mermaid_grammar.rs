//! The Mermaid text of real runs against the part of Mermaid's `sequenceDiagram` grammar it
//! uses, checked by a small parser of our own: a header, `title`, `participant <id> as
//! <alias>`, messages `<id><arrow><id>: <text>` between declared participants, `Note over`,
//! and `rect … end` blocks that balance. Anything else is a syntax error here, as it would be
//! (or would draw wrongly) in Mermaid.

use std::collections::HashSet;

/// Mermaid's message arrows, longest first so that `-->>` is not read as `->`.
const ARROWS: &[&str] = &["-->>", "->>", "--x", "-x", "--)", "-)", "-->", "->"];

#[derive(Debug, PartialEq)]
enum Statement {
    Title,
    Participant(String),
    Message {
        from: String,
        arrow: String,
        to: String,
        text: String,
    },
    Note,
    Rect,
    End,
}

fn statement(line: &str) -> Result<Statement, String> {
    let id = |s: &str| {
        let ok = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        ok.then(|| s.to_owned())
            .ok_or(format!("not a participant id: {s:?}"))
    };
    if let Some(rest) = line.strip_prefix("title ") {
        return (!rest.trim().is_empty())
            .then_some(Statement::Title)
            .ok_or("empty title".into());
    }
    if let Some(rest) = line.strip_prefix("participant ") {
        let (name, alias) = rest.split_once(" as ").ok_or("participant without alias")?;
        if alias.trim().is_empty() {
            return Err("empty alias".into());
        }
        return Ok(Statement::Participant(id(name)?));
    }
    if let Some(rest) = line.strip_prefix("Note over ") {
        let (who, text) = rest.split_once(": ").ok_or("note without text")?;
        for one in who.split(',') {
            id(one)?;
        }
        return (!text.is_empty())
            .then_some(Statement::Note)
            .ok_or("empty note".into());
    }
    if let Some(rest) = line.strip_prefix("rect ") {
        let colour = rest
            .strip_prefix("rgb(")
            .and_then(|r| r.strip_suffix(')'))
            .ok_or("rect needs rgb(…)")?;
        let parts: Vec<_> = colour.split(',').map(|p| p.trim().parse::<u8>()).collect();
        return (parts.len() == 3 && parts.iter().all(Result::is_ok))
            .then_some(Statement::Rect)
            .ok_or(format!("bad colour {colour:?}"));
    }
    if line == "end" {
        return Ok(Statement::End);
    }
    let (head, text) = line
        .split_once(": ")
        .ok_or(format!("not a statement: {line:?}"))?;
    let start = head.find('-').ok_or(format!("no arrow in {head:?}"))?;
    let (from, rest) = head.split_at(start);
    let arrow = ARROWS
        .iter()
        .find(|a| rest.starts_with(**a))
        .ok_or(format!("unknown arrow in {head:?}"))?;
    let to = &rest[arrow.len()..];
    if text.contains(';') || text.contains('#') || text.contains('<') {
        return Err(format!("text Mermaid would not take as plain: {text:?}"));
    }
    Ok(Statement::Message {
        from: id(from)?,
        arrow: (*arrow).to_owned(),
        to: id(to)?,
        text: text.to_owned(),
    })
}

/// The diagram's statements, or the first syntax error and its line.
fn parse(text: &str) -> Result<Vec<Statement>, String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("%%"));
    if lines.next() != Some("sequenceDiagram") {
        return Err("does not start with sequenceDiagram".into());
    }
    let (mut declared, mut depth, mut statements) = (HashSet::new(), 0usize, Vec::new());
    for line in lines {
        let statement = statement(line).map_err(|e| format!("{e} (line {line:?})"))?;
        match &statement {
            Statement::Participant(id) => {
                if !declared.insert(id.clone()) {
                    return Err(format!("{id} declared twice"));
                }
            }
            Statement::Message { from, to, .. } => {
                for id in [from, to] {
                    if !declared.contains(id) {
                        return Err(format!("{id} is not declared (line {line:?})"));
                    }
                }
            }
            Statement::Rect => depth += 1,
            Statement::End => depth = depth.checked_sub(1).ok_or("end without a block")?,
            Statement::Title | Statement::Note => {}
        }
        statements.push(statement);
    }
    match depth {
        0 => Ok(statements),
        _ => Err("a block is not closed".into()),
    }
}

fn messages(statements: &[Statement]) -> Vec<(&str, &str, &str, &str)> {
    statements
        .iter()
        .filter_map(|s| match s {
            Statement::Message {
                from,
                arrow,
                to,
                text,
            } => Some((from.as_str(), arrow.as_str(), to.as_str(), text.as_str())),
            _ => None,
        })
        .collect()
}

#[test]
fn the_checker_refuses_what_mermaid_refuses() {
    assert!(parse("sequenceDiagram\n    participant A as a\n    A->>A: x").is_ok());
    for bad in [
        "graph TD\n",
        "sequenceDiagram\n    A->>B: undeclared",
        "sequenceDiagram\n    participant A as a\n    A=>A: x",
        "sequenceDiagram\n    participant A as a\n    rect rgb(1, 2, 3)\n    A->>A: x",
        "sequenceDiagram\n    participant A as a\n    A->>A: a; b",
        "sequenceDiagram\n    participant A as a\n    end",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_mermaid_text_is_a_sequence_diagram_with_the_refusal_crossed_in_red() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.mmd");
    let out = super::kubelet_once(dir.path(), &file, true).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = std::fs::read_to_string(&file).unwrap();
    let statements = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let messages = messages(&statements);
    let calls: Vec<(&str, &str, &str)> = messages.iter().map(|(f, a, t, _)| (*f, *a, *t)).collect();
    // Each plugin: its socket appearing, GetInfo; a.csi then NodeGetInfo, the API writes and
    // the notify, b.csi the refusal (walk order: a before b).
    assert_eq!(
        calls,
        [
            ("R", "->>", "R"),
            ("K", "->>", "R"),
            ("K", "->>", "D"),
            ("K", "->>", "A"),
            ("K", "->>", "R"),
            ("R", "->>", "R"),
            ("K", "->>", "R"),
            ("K", "-x", "R"),
        ],
        "{text}"
    );
    assert!(
        messages[7]
            .3
            .starts_with("7. NotifyRegistrationStatus(false) ("),
        "{}",
        messages[7].3
    );
    assert!(
        messages[7]
            .3
            .contains("FAILED: RegisterPlugin error -- plugin validation failed"),
        "{}",
        messages[7].3
    );
    assert!(
        text.contains("    rect rgb(255, 221, 221)\n    K-xR: "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_markdown_flow_file_holds_the_diagram_in_a_mermaid_block() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.md");
    let out = super::kubelet_once(dir.path(), &file, false).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = std::fs::read_to_string(&file).unwrap();
    let block = text
        .split_once("```mermaid\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .unwrap_or_else(|| panic!("no mermaid block: {text}"));
    let statements = parse(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    assert_eq!(messages(&statements).len(), 5, "{block}");
}

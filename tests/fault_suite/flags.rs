//! Bad flag values, as manifests written years ago (or by hand) carry them: each is refused
//! before anything starts: exit 2, one line naming the flag, nothing on stdout.

use super::tally::Tally;
use crate::cli::flags::{bad_flag_values, refused_naming, run_as};

#[test]
fn every_bad_flag_value_is_refused_naming_the_flag() {
    let mut tally = Tally::new("bad flag values of the registrar, livenessprobe and node-server");
    for (name, args, flag) in bad_flag_values() {
        let out = run_as(name, args);
        let what = format_args!(
            "{name} {args:?}: {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        tally.check(refused_naming(&out, flag), what);
    }
    tally.finish();
}

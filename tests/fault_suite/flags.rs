//! Bad flag values, as manifests written years ago (or by hand) carry them: each is refused
//! before anything starts: exit 2, one line naming the flag, nothing on stdout.

use super::tally::Tally;
use crate::cli::flags::{BadFlag, bad_flag_values, refused_naming, run_as, unusable_flag_values};

#[test]
fn every_bad_flag_value_is_refused_naming_the_flag() {
    tally_refusals(
        "bad flag values of the registrar, livenessprobe and node-server",
        bad_flag_values(),
    );
}

#[test]
fn every_flag_that_would_start_but_cannot_work_is_refused_naming_the_flag() {
    tally_refusals(
        "flags that would start but cannot work (relative or long socket paths, --capacity=0, special socket modes, …)",
        unusable_flag_values(),
    );
}

fn tally_refusals(case: &'static str, flags: Vec<BadFlag>) {
    let mut tally = Tally::new(case);
    for (name, args, flag) in flags {
        let out = run_as(name, args);
        let what = format_args!(
            "{name} {args:?}: {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        tally.check(refused_naming(&out, flag), what);
    }
    tally.finish();
}

//! A CPU profile on the replay: profile_shares.c, recorded in a QEMU guest
//! and replayed with `--profile`, gives each function the share of samples
//! `trapline run --profile` gives it on the host, within 3 points, and two
//! replays of one recording give the same samples.
//!
//! Needs what tests/vm.rs needs (`.ci/run` installs it).

mod common;

use common::vm::*;
use common::*;
use serde_json::Value;

fn shares(report: &Value) -> Vec<(String, f64)> {
    let samples = as_u64(report, "samples").max(1) as f64;
    ["spin_a", "spin_b", "spin_c", "inner_c", "burn", "main"]
        .iter()
        .map(|name| {
            let f = as_array(report, "functions")
                .iter()
                .find(|f| f["function"] == *name)
                .unwrap_or_else(|| panic!("no {name} in {}", pretty(report)));
            (
                name.to_string(),
                as_u64(f, "total") as f64 * 100.0 / samples,
            )
        })
        .collect()
}

#[test]
fn a_replayed_profile_has_the_hosts_shares_and_replays_alike() {
    let dir = TestDir::new("vm_profile");
    let program = compile_c(&dir, "profile_shares.c");
    let host = run(&dir, &["--profile"], &program, &[]);
    assert_eq!(host.code(), 0, "{}", host.describe());
    let recorded = record(&dir, "rec", &[], &program);
    assert_eq!(recorded.code(), 0, "{}", recorded.describe());
    assert_eq!(recorded.stdout, "shares done\n");
    let replayed = vm(
        &dir,
        &["replay", "rec", "--profile", "-o", "a.trace", "--verify"],
    );
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());
    assert!(
        replayed.stderr.contains("both replays identical"),
        "{}",
        replayed.stderr
    );
    let again = vm(&dir, &["replay", "rec", "--profile", "-o", "b.trace"]);
    assert_eq!(again.code(), 0, "{}", again.describe());
    let a = std::fs::read(dir.path().join("a.trace")).unwrap();
    let b = std::fs::read(dir.path().join("b.trace")).unwrap();
    assert!(a == b, "two replays wrote different traces");

    let host = analysis_json("profile", &dir.trace());
    let guest = analysis_json("profile", &dir.path().join("a.trace"));
    assert_eq!(as_u64(&guest, "rate_hz"), 999);
    // 1 s of the guest's CPU at 999 Hz of its clock.
    let samples = as_u64(&guest, "samples");
    assert!((950..=1050).contains(&samples), "{}", pretty(&guest));
    for ((name, want), (_, got)) in shares(&host).into_iter().zip(shares(&guest)) {
        assert!(
            (got - want).abs() <= 3.0,
            "{name}: {got:.1}% in the guest, {want:.1}% on the host\n{}",
            pretty(&guest["functions"])
        );
    }
}

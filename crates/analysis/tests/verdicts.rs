//! `leaks` on synthesized traces with reachability scans: grouping by kind,
//! leaders' indirect bytes, scans split over chunks in any order, incomplete
//! scans ignored, `--snapshot`, `--history` and suppressions.

mod common;

use common::*;
use std::io::Cursor;
use trapline_analysis::leaks::{analyze_with, render_text, LeaksOptions};
use trapline_analysis::report::BytesBlocks;
use trapline_analysis::suppressions;
use trapline_trace::{AllocFn, Event, ScanStats, ScanTrigger, Verdict};

fn scan_begin(time: u64, scan: u32, trigger: ScanTrigger) -> Event {
    Event::ScanBegin {
        time,
        scan,
        trigger,
    }
}

fn judged(scan: u32, addr: u64, size: u64, stack: u32, verdict: Verdict, indirect: u64) -> Event {
    Event::ScanBlock {
        scan,
        addr,
        size,
        func: AllocFn::Malloc,
        stack,
        verdict,
        indirect_bytes: indirect,
    }
}

fn scan_end(scan: u32, blocks: u64, bytes: u64) -> Event {
    Event::ScanEnd {
        scan,
        stats: ScanStats {
            pause_ns: 2_500_000,
            threads: 3,
            threads_not_suspended: 0,
            root_bytes: 65536,
            blocks,
            bytes,
            mappings_not_excluded: 0,
        },
    }
}

/// Two periodic scans and an exit scan; the exit scan's blocks are split over
/// two chunks written before its begin; a fourth scan never ended.
fn scanned_trace() -> Vec<u8> {
    build(&[
        (0, vec![process(), module()]),
        (
            1,
            vec![
                malloc(10, 0x1000, 100, 1),
                malloc(11, 0x2000, 200, 2),
                malloc(12, 0x3000, 32, 3),
                malloc(13, 0x3100, 32, 3),
                stack(1, &[0x401100]),
                stack(2, &[0x401200]),
                stack(3, &[0x401300]),
            ],
        ),
        (
            0,
            vec![
                scan_begin(20, 1, ScanTrigger::Periodic),
                judged(1, 0x1000, 100, 1, Verdict::DefinitelyLost, 0),
                judged(1, 0x2000, 200, 2, Verdict::StillReachable, 0),
                scan_end(1, 2, 300),
                scan_begin(30, 2, ScanTrigger::Periodic),
                judged(2, 0x1000, 100, 1, Verdict::DefinitelyLost, 0),
                judged(2, 0x2000, 200, 2, Verdict::PossiblyLost, 0),
                judged(2, 0x3000, 32, 3, Verdict::StillReachable, 0),
                judged(2, 0x3100, 32, 3, Verdict::StillReachable, 0),
                scan_end(2, 4, 364),
            ],
        ),
        (
            0,
            vec![
                judged(3, 0x3000, 32, 3, Verdict::DefinitelyLost, 32),
                judged(3, 0x3100, 32, 3, Verdict::IndirectlyLost, 0),
            ],
        ),
        (
            0,
            vec![
                judged(3, 0x1000, 100, 1, Verdict::DefinitelyLost, 0),
                judged(3, 0x2000, 200, 2, Verdict::DefinitelyLost, 0),
            ],
        ),
        (
            0,
            vec![
                snapshot_begin(40),
                scan_begin(40, 3, ScanTrigger::Exit),
                scan_end(3, 4, 364),
                Event::SnapshotEnd {
                    blocks: 4,
                    bytes: 364,
                },
                scan_begin(45, 4, ScanTrigger::Periodic),
                judged(4, 0x1000, 100, 1, Verdict::StillReachable, 0),
                end(50, 0, 0),
            ],
        ),
    ])
}

fn report(options: &LeaksOptions) -> trapline_analysis::LeaksReport {
    analyze_with(&mut Cursor::new(scanned_trace()), options).expect("a readable trace")
}

fn bb(bytes: u64, blocks: u64) -> Option<BytesBlocks> {
    Some(BytesBlocks { bytes, blocks })
}

#[test]
fn the_last_complete_scan_is_the_default() {
    let r = report(&LeaksOptions::default());
    let scan = r.scan.as_ref().expect("a scan");
    assert_eq!(
        (scan.snapshot, scan.snapshots, scan.trigger),
        (3, 3, "exit")
    );
    assert_eq!(scan.pause_ms, 2.5);
    assert_eq!(r.summary.source, "reachability_scan");
    assert_eq!(r.summary.definitely_lost, bb(332, 3));
    assert_eq!(r.summary.indirectly_lost, bb(32, 1));
    assert_eq!(r.summary.possibly_lost, bb(0, 0));
    assert_eq!(r.summary.still_reachable, bb(0, 0));
    // definite and possible only; the leader carries its clique.
    let got: Vec<_> = r
        .records
        .iter()
        .map(|x| {
            (
                x.kind,
                x.bytes,
                x.blocks,
                x.direct_bytes,
                x.indirect_bytes,
                x.stack_id,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("definitely_lost", 200, 1, Some(200), Some(0), 2),
            ("definitely_lost", 100, 1, Some(100), Some(0), 1),
            ("definitely_lost", 64, 1, Some(32), Some(32), 3),
        ]
    );
    let text = render_text(&r);
    assert!(text.contains("64 (32 direct, 32 indirect) bytes in 1 blocks are definitely lost in loss record 3 of 3"), "{text}");
    assert!(
        text.contains("   indirectly lost: 32 bytes in 1 blocks"),
        "{text}"
    );
    assert!(text.contains("Reachability scan 3 of 3 (exit"), "{text}");
}

#[test]
fn an_earlier_snapshot_and_other_kinds() {
    let r = report(&LeaksOptions {
        snapshot: Some(2),
        kinds: vec![Verdict::PossiblyLost, Verdict::StillReachable],
        ..LeaksOptions::default()
    });
    assert_eq!(r.scan.as_ref().unwrap().trigger, "periodic");
    assert_eq!(r.summary.definitely_lost, bb(100, 1));
    assert_eq!(r.summary.possibly_lost, bb(200, 1));
    assert_eq!(r.summary.still_reachable, bb(64, 2));
    let got: Vec<_> = r
        .records
        .iter()
        .map(|x| (x.kind, x.bytes, x.blocks))
        .collect();
    assert_eq!(got, [("possibly_lost", 200, 1), ("still_reachable", 64, 2)]);
    assert!(r.records.iter().all(|x| x.direct_bytes.is_none()));

    let missing = report(&LeaksOptions {
        snapshot: Some(4),
        ..LeaksOptions::default()
    });
    assert_eq!(
        missing.problem.as_deref(),
        Some("snapshot 4 was asked for, but the trace holds 3 reachability scans")
    );
}

#[test]
fn history_names_the_blocks_lost_in_every_scan() {
    let r = report(&LeaksOptions {
        history: true,
        ..LeaksOptions::default()
    });
    let h = r.history.as_ref().expect("history");
    let sites: Vec<_> = h
        .iter()
        .map(|s| {
            (
                s.stack_id,
                s.lost_in_every_snapshot.bytes,
                s.lost_in_every_snapshot.blocks,
            )
        })
        .collect();
    // 0x1000 was lost in all three scans; 0x2000 was reachable first; the
    // stack-3 blocks were reachable in scan 2.
    assert_eq!(sites, [(1, 100, 1), (2, 0, 0), (3, 0, 0)]);
    let points: Vec<_> = h[1]
        .snapshots
        .iter()
        .map(|p| {
            (
                p.snapshot,
                p.still_reachable.bytes,
                p.possibly_lost.bytes,
                p.definitely_lost.bytes,
            )
        })
        .collect();
    assert_eq!(points, [(1, 200, 0, 0), (2, 0, 200, 0), (3, 0, 0, 200)]);
}

#[test]
fn a_suppression_hides_one_record_and_is_reported() {
    let supp = suppressions::parse(
        "{\n  site two\n  Memcheck:Leak\n  match-leak-kinds: definite\n  fun:malloc\n}\n",
        "t.supp",
    )
    .unwrap();
    // Frames are unnamed here (no module file): the Valgrind form matches
    // on the allocation function, which hides every definite record...
    let r = report(&LeaksOptions {
        suppressions: supp,
        ..LeaksOptions::default()
    });
    assert!(r.records.is_empty());
    assert_eq!(r.summary.suppressed, bb(332, 3));
    assert_eq!(r.summary.definitely_lost, bb(0, 0));
    assert_eq!(r.summary.indirectly_lost, bb(32, 1));
    assert_eq!(r.suppressions.len(), 1);
    assert_eq!(
        (
            r.suppressions[0].name.as_str(),
            r.suppressions[0].source.as_str(),
            r.suppressions[0].records
        ),
        ("site two", "t.supp:1", 3)
    );
    // ...while a LeakSanitizer pattern needs a name and hides nothing.
    let r = report(&LeaksOptions {
        suppressions: suppressions::parse("leak:main\n", "l.supp").unwrap(),
        ..LeaksOptions::default()
    });
    assert_eq!(r.records.len(), 3);
    assert!(r.suppressions.is_empty());
}

//! End-to-end: an analysis leaves TRACE.idx beside a real program's trace,
//! and every analysis gives the same bytes, text and JSON, whether it reads
//! the trace whole or leaves out what the index says it does not need.

mod common;

use common::*;
use std::process::Command;

#[test]
fn analyses_print_the_same_with_and_without_the_index() {
    let dir = TestDir::new("index_file_same");
    let prog = compile_c(&dir, "lock_misuse.c");
    let recorded = run(&dir, &["--profile"], &prog, &["errors"]);
    assert_eq!(recorded.code(), 0, "{}", recorded.describe());
    let trace = dir.trace();
    let idx = dir.path().join("t.trace.idx");
    assert!(!idx.exists(), "recording writes no index");

    let analyse = |args: &[&str]| {
        let mut cmd = Command::new(trapline());
        cmd.args(args).arg(&trace);
        let f = output_of(cmd, "trapline analysis");
        assert!(!f.stderr.contains("panicked"), "{}", f.describe());
        (f.code(), f.stdout, f.stderr)
    };
    for command in ["locks", "deadlocks", "profile", "leaks", "stats"] {
        for format in ["text", "json"] {
            let args = [command, "--format", format];
            std::fs::remove_file(&idx).ok();
            let whole = analyse(&args);
            assert_eq!(whole.0, 0, "{args:?}: {whole:?}");
            assert!(idx.exists(), "{args:?} leaves {}", idx.display());
            // Twice from the index: the second read of a command that
            // learned marks uses them, the third the same file again.
            for round in 0..2 {
                let indexed = analyse(&args);
                assert_eq!(indexed, whole, "{args:?}, read {round} from the index");
            }
        }
    }

    // Garbage in place of the index: ignored, and written again.
    std::fs::write(&idx, b"TLINDEX2 not an index").unwrap();
    let whole = analyse(&["locks", "--format", "json"]);
    assert_eq!(whole.0, 0, "{whole:?}");
    assert!(std::fs::read(&idx).unwrap().len() > 30, "rewritten");
    assert_eq!(analyse(&["locks", "--format", "json"]), whole);
}

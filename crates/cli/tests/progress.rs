//! Progress on a terminal: an analysis draws a bar on stderr when stderr
//! is a terminal and the work outlasts the delay, and writes nothing of the
//! kind otherwise. The terminal is a pseudo-terminal from script(1)
//! (util-linux); the delay is set to 0 so that a small trace shows it.

mod common;

use common::*;
use std::process::Command;

#[test]
fn a_bar_on_a_terminal_and_nothing_elsewhere() {
    let dir = TestDir::new("progress");
    let prog = compile_c(&dir, "leaks.c");
    assert_eq!(run(&dir, &[], &prog, &[]).code(), 0);
    let typescript = dir.path().join("typescript");
    let command = format!(
        "{} leaks {} > /dev/null",
        trapline().display(),
        dir.trace().display()
    );
    let out = Command::new("script")
        .args(["-qec", &command])
        .arg(&typescript)
        .env("TRAPLINE_PROGRESS_AFTER_MS", "0")
        .output()
        .expect("script(1)");
    assert!(out.status.success(), "{out:?}");
    let seen = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned();
    assert!(seen.contains("trapline leaks: pass 1 ["), "{seen}");
    assert!(seen.contains(" chunks, "), "{seen}");

    let mut cmd = Command::new(trapline());
    cmd.arg("leaks")
        .arg(dir.trace())
        .env("TRAPLINE_PROGRESS_AFTER_MS", "0");
    let piped = output_of(cmd, "trapline leaks");
    assert_eq!(piped.code(), 0);
    assert_eq!(
        piped.stderr, "",
        "no progress when stderr is not a terminal"
    );
}

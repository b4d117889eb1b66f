//! Whole-system record and replay (`trapline vm`): a program recorded in a
//! QEMU guest and replayed with trapline's plugin must give the report
//! `trapline run` gives on the host (same blocks, sizes, functions, lines
//! and errors), the guest kernel's allocations when asked, the same trace
//! from every replay, and clear errors for bad input.
//!
//! Needs qemu-system-x86 (9.2 or later), a kernel image in /boot with its
//! headers, and busybox-static: `.ci/run` installs them.

mod common;

use common::vm::*;
use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The host's report (`trapline run --no-scan`: a replay has no
/// reachability scan) and the replay's, of one program.
fn host_and_guest(name: &str, source: &str) -> (TestDir, Value, Value, PathBuf) {
    let dir = TestDir::new(name);
    let cxx = source.ends_with(".cpp");
    let program = compile(
        &dir,
        if cxx { "g++" } else { "gcc" },
        source,
        "program",
        &["-g", "-O0", "-Wall", "-pthread"],
    );
    let host = run(&dir, &["--no-scan"], &program, &[]);
    assert_eq!(host.code(), 0, "{}", host.describe());
    let host_trace = dir.path().join("t.trace");
    let recorded = record(&dir, "rec", &[], &program);
    assert_eq!(recorded.code(), host.code(), "{}", recorded.describe());
    assert_eq!(
        recorded.stdout, host.stdout,
        "the guest's output is the program's"
    );
    let guest_trace = dir.path().join("guest.trace");
    let replayed = vm(&dir, &["replay", "rec", "-o", "guest.trace"]);
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());
    (dir, leaks(&host_trace), leaks(&guest_trace), guest_trace)
}

/// leaks.c in a guest: its seven leak sites, 1,032 bytes in 9 blocks,
/// with the host's functions and lines, and the host's call counts.
#[test]
fn a_replayed_guest_has_the_hosts_leaks() {
    let (_dir, host, guest, _) = host_and_guest("vm_leaks", "leaks.c");
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    let want = views(&host, "records", "leaks.c", &keys);
    assert_eq!(want.len(), 7, "{}", pretty(&host));
    assert_eq!(views(&guest, "records", "leaks.c", &keys), want);
    assert_eq!(guest["summary"], host["summary"]);
    assert_eq!(guest["summary"]["unfreed_at_exit"]["bytes"], 1032);
    assert_eq!(guest["summary"]["unfreed_at_exit"]["blocks"], 9);
    assert_eq!(guest["summary"]["total_heap_usage"]["allocs"], 62);
    assert_eq!(guest["errors"].as_array().map(Vec::len), Some(0));
}

/// errors.cpp in a guest: the four mismatched releases, each with its
/// stack and its block's allocation, as on the host.
#[test]
fn a_replayed_guest_has_the_hosts_errors() {
    let (_dir, host, guest, _) = host_and_guest("vm_errors", "errors.cpp");
    let want = views(&host, "errors", "errors.cpp", &ERROR_KEYS);
    assert_eq!(want.len(), 4, "{}", pretty(&host["errors"]));
    assert_eq!(views(&guest, "errors", "errors.cpp", &ERROR_KEYS), want);
}

/// A thread's end releases its glibc cache and the blocks the program
/// freed into it with glibc's own free, which the plugin sees (it traps
/// free's entry, not the program's calls): no double free, the one leak.
#[test]
fn a_threads_cached_blocks_are_no_double_frees() {
    let (_dir, host, guest, _) = host_and_guest("vm_thread_cache", "vm_thread_cache.c");
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    let want = views(&host, "records", "vm_thread_cache.c", &keys);
    assert_eq!(want.len(), 1, "{}", pretty(&host));
    assert_eq!(views(&guest, "records", "vm_thread_cache.c", &keys), want);
    assert_eq!(
        guest["errors"].as_array().map(Vec::len),
        Some(0),
        "{}",
        pretty(&guest["errors"])
    );
    // The program's 10 frees; glibc's own releases at the thread's end
    // are counted untracked, not as frees.
    assert_eq!(guest["summary"]["total_heap_usage"]["frees"], 10);
}

/// Replays of one recording are the same: `--verify` replays twice and
/// compares the plugin's events, and a third replay writes the same trace
/// bytes.
#[test]
fn replays_of_one_recording_give_identical_traces() {
    let dir = TestDir::new("vm_identical");
    let program = compile_c(&dir, "leaks.c");
    let recorded = record(&dir, "rec", &[], &program);
    assert_eq!(recorded.code(), 0, "{}", recorded.describe());
    let verified = vm(&dir, &["replay", "rec", "-o", "a.trace", "--verify"]);
    assert_eq!(verified.code(), 0, "{}", verified.describe());
    assert!(
        verified.stderr.contains("both replays identical"),
        "{}",
        verified.stderr
    );
    let again = vm(&dir, &["replay", "rec", "-o", "b.trace"]);
    assert_eq!(again.code(), 0, "{}", again.describe());
    let a = std::fs::read(dir.path().join("a.trace")).unwrap();
    let b = std::fs::read(dir.path().join("b.trace")).unwrap();
    assert!(a == b, "two replays wrote different traces");
}

/// A kernel module built here against the guest kernel's headers leaks
/// 3 kmalloc blocks of 200 bytes on each write to its file; the program
/// writes 4 times. The replay with --kernel-allocs reports exactly those
/// 12 blocks, at kmalloc, with the module's function in their stack.
#[test]
fn a_kernel_modules_leaks_are_reported_with_its_function() {
    let dir = TestDir::new("vm_kernel");
    let kernel = guest_kernel();
    let src = fixtures_dir().join("vm_kleak");
    for f in ["kleak.c", "Kbuild"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut make = Command::new("make");
    make.arg("-C")
        .arg(&kernel.headers)
        .arg(format!("M={}", dir.path().display()))
        .arg("modules");
    let built = output_of(make, "make the kleak module");
    assert_eq!(built.code(), 0, "{}", built.describe());
    let writer = compile_c(&dir, "vm_kleak_writer.c");
    let module = dir.path().join("kleak.ko");
    let recorded = record(
        &dir,
        "rec",
        &[
            "--kernel-allocs",
            "--kernel-module",
            module.to_str().unwrap(),
        ],
        &writer,
    );
    assert_eq!(recorded.code(), 0, "{}", recorded.describe());
    let replayed = vm(&dir, &["replay", "rec", "-o", "k.trace"]);
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());
    let report = leaks(&dir.path().join("k.trace"));
    let records = report["records"].as_array().expect("records");
    let in_module: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["stack"].as_array().into_iter().flatten().any(|f| {
                f["function"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kleak_write+"))
            })
        })
        .collect();
    assert_eq!(in_module.len(), 1, "{}", pretty(&report["records"]));
    let site = in_module[0];
    assert_eq!(site["bytes"], 2400, "{}", pretty(site));
    assert_eq!(site["blocks"], 12, "{}", pretty(site));
    assert_eq!(site["allocated_by"], "kmalloc", "{}", pretty(site));
    let first = site["stack"][0]["function"].as_str().unwrap_or("");
    assert!(first.starts_with("kleak_write+0x"), "{}", pretty(site));
    // The program's own heap: nothing.
    assert!(
        records.iter().all(|r| r["allocated_by"] != "malloc"),
        "{}",
        pretty(&report["records"])
    );
}

/// Bad input: an existing recording directory, a static program, no QEMU,
/// an old QEMU, a damaged or incomplete recording, a guest that panics.
/// Each gets its status and a clear message, and no QEMU is left running.
/// A program that never exits is stopped at --timeout (exit 124) with its
/// recording kept, which replays.
#[test]
fn bad_input_gets_clear_errors() {
    let dir = TestDir::new("vm_bad_input");
    let clean = compile_c(&dir, "clean.c");

    std::fs::create_dir(dir.path().join("full")).unwrap();
    std::fs::write(dir.path().join("full/x"), "kept").unwrap();
    let exists = record(&dir, "full", &[], &clean);
    assert_eq!(exists.code(), 2, "{}", exists.describe());
    assert!(exists.stderr.contains("exists"), "{}", exists.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("full/x")).unwrap(),
        "kept"
    );

    let static_program = compile_c_with(&dir, "clean.c", "clean_static", &["-static"]);
    let refused = record(&dir, "static", &[], &static_program);
    assert_eq!(refused.code(), 125, "{}", refused.describe());
    assert!(
        refused.stderr.contains("not a dynamically linked"),
        "{}",
        refused.stderr
    );

    let mut no_qemu = Command::new(trapline());
    no_qemu
        .args(["vm", "record", "-o", "nq", "--"])
        .arg(&clean)
        .current_dir(dir.path())
        .env("TRAPLINE_QEMU", dir.path().join("no-such-qemu"));
    let no_qemu = output_of(no_qemu, "vm record without QEMU");
    assert_eq!(no_qemu.code(), 125, "{}", no_qemu.describe());
    assert!(no_qemu.stderr.contains("not a file"), "{}", no_qemu.stderr);

    let old = dir.path().join("old-qemu");
    std::fs::write(&old, "#!/bin/sh\necho 'QEMU emulator version 8.2.2'\n").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut old_qemu = Command::new(trapline());
    old_qemu
        .args(["vm", "record", "-o", "oq", "--"])
        .arg(&clean)
        .current_dir(dir.path())
        .env("TRAPLINE_QEMU", &old);
    let old_qemu = output_of(old_qemu, "vm record with an old QEMU");
    assert_eq!(old_qemu.code(), 125, "{}", old_qemu.describe());
    assert!(
        old_qemu.stderr.contains("9.2 or later"),
        "{}",
        old_qemu.stderr
    );

    // A good recording, then damaged copies of it.
    let good = record(&dir, "rec", &[], &clean);
    assert_eq!(good.code(), 0, "{}", good.describe());
    // An output that is not a trace is kept.
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let kept = vm(&dir, &["replay", "rec", "-o", "notes.txt"]);
    assert_eq!(kept.code(), 2, "{}", kept.describe());
    assert!(
        kept.stderr.contains("not a trapline trace"),
        "{}",
        kept.stderr
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "mine"
    );

    // A QEMU built without plugin support refuses `-plugin`.
    let no_plugins = dir.path().join("qemu-without-plugins");
    std::fs::write(
        &no_plugins,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'QEMU emulator version 10.0.2'; exit 0; fi\n\
         echo 'qemu-system-x86_64: -plugin: plugin interface not enabled in this build' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&no_plugins, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut without = Command::new(trapline());
    without
        .args(["vm", "replay", "rec", "-o", "np.trace"])
        .current_dir(dir.path())
        .env("TRAPLINE_VM_PLUGIN", plugin())
        .env("TRAPLINE_QEMU", &no_plugins);
    let without = output_of(without, "vm replay with a QEMU without plugins");
    assert_eq!(without.code(), 125, "{}", without.describe());
    assert!(
        without.stderr.contains("could not load trapline's plugin")
            && without.stderr.contains("plugin interface not enabled"),
        "{}",
        without.stderr
    );
    assert!(!dir.path().join("np.trace").exists());
    let log = dir.path().join("rec/replay.bin");
    let mut bytes = std::fs::read(&log).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();
    let damaged = vm(&dir, &["replay", "rec", "-o", "d.trace"]);
    assert_eq!(damaged.code(), 1, "{}", damaged.describe());
    assert!(damaged.stderr.contains("damaged"), "{}", damaged.stderr);
    std::fs::remove_file(dir.path().join("rec/manifest.json")).unwrap();
    let incomplete = vm(&dir, &["replay", "rec", "-o", "d.trace"]);
    assert_eq!(incomplete.code(), 1, "{}", incomplete.describe());
    assert!(
        incomplete.stderr.contains("not a complete recording"),
        "{}",
        incomplete.stderr
    );
    let missing = vm(&dir, &["replay", "no-such-recording", "-o", "d.trace"]);
    assert_eq!(missing.code(), 1, "{}", missing.describe());
    assert!(
        missing
            .stderr
            .contains("no-such-recording: does not exist: a recording is the directory"),
        "{}",
        missing.stderr
    );

    // A program that never exits is stopped by the guest at --timeout, in
    // guest time, and its recording is complete.
    let forever = compile_c(&dir, "vm_forever.c");
    let stopped = record(&dir, "forever", &["--timeout", "20"], &forever);
    assert_eq!(stopped.code(), 124, "{}", stopped.describe());
    assert!(
        stopped
            .stderr
            .contains("stopped by --timeout after 20 s of guest time (SIGTERM)"),
        "{}",
        stopped.stderr
    );
    assert!(
        !qemu_running_in(dir.path()),
        "QEMU left running after --timeout"
    );
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("forever/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["exit_status"], 128 + 15, "{}", pretty(&manifest));
    let replayed = vm(&dir, &["replay", "forever", "-o", "forever.trace"]);
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());
    let text = leaks_text(&dir.path().join("forever.trace"), &[]);
    assert!(
        text.contains("Exit: killed by signal 15 (SIGTERM)"),
        "{text}"
    );

    let panics = compile_c(&dir, "vm_panic.c");
    let panicked = record(&dir, "panic", &[], &panics);
    assert_eq!(panicked.code(), 125, "{}", panicked.describe());
    assert!(
        panicked.stderr.contains("the guest kernel panicked"),
        "{}",
        panicked.stderr
    );
}

/// Whether a QEMU process has a file under `dir` on its command line.
fn qemu_running_in(dir: &Path) -> bool {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline);
            text.contains("qemu-system") && text.contains(&needle)
        })
}

/// The command starts in the host's directory, with the file its relative
/// argument names and a `--file` directory tree (a nested file, a link in
/// it) carried in; its stdout and stderr are not a terminal and stay apart,
/// byte for byte, and its exit status is its own. Files that would not fit
/// in the guest's memory, and a missing --file, are refused before a boot.
#[test]
fn a_guest_has_the_hosts_directory_files_and_no_terminal() {
    let dir = TestDir::new("vm_files");
    let program = compile_c(&dir, "vm_files.c");
    let program = program.to_str().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/in.txt"), "relative\n").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("a/b/nested.txt"), "nested\n").unwrap();
    std::os::unix::fs::symlink("a/b/nested.txt", tree.join("link")).unwrap();
    let nested = tree.join("a/b/nested.txt");
    let nested = nested.to_str().unwrap();
    let kernel = guest_kernel().image.to_string_lossy().into_owned();
    let tree_arg = tree.to_str().unwrap();
    let args = [
        "record",
        "-o",
        "rec",
        "--kernel",
        &kernel,
        "--file",
        tree_arg,
        "--",
        program,
        "data/in.txt",
        nested,
        "tree/link",
    ];
    let recorded = vm(&dir, &args);
    assert_eq!(recorded.code(), 3, "{}", recorded.describe());
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(
        recorded.stdout,
        format!(
            "cwd {}\nisatty(1)=0 isatty(2)=0\ndata/in.txt: relative\n{nested}: nested\ntree/link: nested\nend",
            cwd.display()
        )
    );
    assert!(
        recorded
            .stderr
            .starts_with("to stderr\n==trapline== recorded rec"),
        "{}",
        recorded.stderr
    );
    let replayed = vm(&dir, &["replay", "rec", "-o", "files.trace"]);
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());

    let missing = vm(
        &dir,
        &[
            "record",
            "-o",
            "missing",
            "--file",
            "no-such-dir",
            "--",
            program,
        ],
    );
    assert_eq!(missing.code(), 2, "{}", missing.describe());
    assert!(
        missing.stderr.contains("--file ") && missing.stderr.contains("no-such-dir: No such file"),
        "{}",
        missing.stderr
    );
    let small = vm(
        &dir,
        &["record", "-o", "small", "--memory", "64", "--", program],
    );
    assert_eq!(small.code(), 2, "{}", small.describe());
    assert!(
        small
            .stderr
            .contains("--memory 64 is too little, give --memory 192 or more"),
        "{}",
        small.stderr
    );
    assert!(!dir.path().join("missing").exists() && !dir.path().join("small").exists());
}

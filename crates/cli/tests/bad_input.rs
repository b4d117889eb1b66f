//! End-to-end: bad commands, paths, programs and traces give clear errors,
//! never a panic.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn trapline_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(trapline());
    cmd.args(args).env("TRAPLINE_AGENT", agent());
    cmd
}

fn no_panic(finished: &Finished) {
    assert!(
        !finished.stderr.contains("panicked"),
        "panic\n{}",
        finished.describe()
    );
}

#[test]
fn run_nonexistent_command() {
    let dir = TestDir::new("run_nonexistent");
    let mut cmd = trapline_cmd(&["run", "-o"]);
    cmd.arg(dir.trace())
        .args(["--", "/nonexistent/cmd", "arg"])
        .current_dir(dir.path());
    let finished = output_of(cmd, "trapline run -- /nonexistent/cmd");
    no_panic(&finished);
    assert_ne!(finished.code(), 0, "{}", finished.describe());
    assert!(
        finished.stderr.contains("/nonexistent/cmd"),
        "stderr must name the command\n{}",
        finished.describe()
    );
    assert!(
        !dir.trace().exists(),
        "nothing ran, so no trace should be left"
    );
    assert_eq!(dir.other_traces().len(), 0);
}

/// A directory, and an executable file that is neither a program nor a
/// script with a #! line (a shell would run it as a script; execve, as
/// `env` and `trapline run` use it, refuses it): each is named, with what
/// to do about the second, and nothing is traced.
#[test]
fn run_a_directory_or_a_file_without_shebang() {
    let dir = TestDir::new("run_not_a_program");
    let script = dir.path().join("no_shebang.sh");
    std::fs::write(&script, "echo hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let target = dir.path().display().to_string();
    let script = script.display().to_string();
    for (program, code, message) in [
        (
            target.as_str(),
            126,
            "is a directory, not a program".to_string(),
        ),
        (
            script.as_str(),
            125,
            format!("to run it as a shell script: trapline run -- sh {script}"),
        ),
    ] {
        let mut cmd = trapline_cmd(&["run", "-o"]);
        cmd.arg(dir.trace())
            .args(["--", program])
            .current_dir(dir.path());
        let finished = output_of(cmd, "trapline run");
        no_panic(&finished);
        assert_eq!(finished.code(), code, "{}", finished.describe());
        assert!(
            finished.stderr.contains(program) && finished.stderr.contains(&message),
            "stderr must name {program} and say: {message}\n{}",
            finished.describe()
        );
        assert!(!dir.trace().exists(), "nothing ran, so no trace");
    }
}

#[test]
fn run_output_in_missing_directory() {
    let dir = TestDir::new("run_bad_output");
    let mut cmd = trapline_cmd(&["run", "-o", "/nonexistent-dir/x.trace", "--", "/bin/true"]);
    cmd.current_dir(dir.path());
    let finished = output_of(cmd, "trapline run -o /nonexistent-dir/x.trace");
    no_panic(&finished);
    assert_ne!(finished.code(), 0, "{}", finished.describe());
    assert!(
        finished.stderr.contains("/nonexistent-dir/x.trace"),
        "stderr must name the output path\n{}",
        finished.describe()
    );
}

/// Outputs that are no place for a trace are refused before the command
/// runs, each with its reason (status 125): a FIFO made trapline wait for a
/// reader for ever; /dev/null took the trace, and the children's
/// `null.<pid>` files went into /dev; a /proc file opened, failed every
/// write, and the run lost every event.
#[test]
fn run_output_that_cannot_hold_a_trace_is_refused() {
    let dir = TestDir::new("run_output_kinds");
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let fifo = fifo.display().to_string();
    let nowhere = dir.path().join("no/such/dir");
    let in_nowhere = nowhere.join("t.trace").display().to_string();
    let no_dir = format!("the directory {} does not exist", nowhere.display());
    for (output, reason) in [
        (fifo.as_str(), "it is a FIFO, not a regular file"),
        ("/dev/null", "it is a device, not a regular file"),
        ("/", "it is a directory"),
        (in_nowhere.as_str(), no_dir.as_str()),
    ] {
        let mut cmd = trapline_cmd(&["run", "-o", output, "--", "/bin/true"]);
        cmd.current_dir(dir.path());
        let finished = output_of(cmd, &format!("trapline run -o {output}"));
        no_panic(&finished);
        assert_eq!(finished.code(), 125, "{}", finished.describe());
        let expected = format!("trapline run: cannot write the trace {output}: ");
        assert!(
            finished.stderr.starts_with(&expected) && finished.stderr.contains(reason),
            "{}",
            finished.describe()
        );
    }
    // A /proc file is no trace; forced, it cannot be written.
    for (flags, reason) in [
        (&[][..], "exists and is not a trapline trace"),
        (&["--force"][..], "(os error"),
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-o", "/proc/version", "--", "/bin/true"]);
        let mut cmd = trapline_cmd(&args);
        cmd.current_dir(dir.path());
        let finished = output_of(cmd, "trapline run -o /proc/version");
        no_panic(&finished);
        assert_eq!(finished.code(), 125, "{}", finished.describe());
        assert!(finished.stderr.contains(reason), "{}", finished.describe());
    }
}

/// `trapline run -o input.pl -- perl input.pl` truncated the script before
/// perl read it; `-o notes.txt` overwrote any file; `-o link` wrote through
/// a symbolic link to whatever it named. Now: an output the command names
/// is refused always; a file that is not a trace, and a link, are refused
/// unless `--force` (which replaces the file, or the link itself, never
/// its target). What was there is unchanged, byte for byte.
#[test]
fn run_never_overwrites_what_is_not_a_trace() {
    let dir = TestDir::new("run_output_clobber");
    let run_with = |args: &[&str]| {
        let mut cmd = trapline_cmd(args);
        cmd.current_dir(dir.path());
        let finished = output_of(cmd, &format!("trapline {}", args.join(" ")));
        no_panic(&finished);
        finished
    };
    let script = dir.path().join("input.sh");
    let text = "echo script ran\n";
    std::fs::write(&script, text).unwrap();
    for flags in [&[][..], &["--force"][..]] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["-o", "input.sh", "--", "/bin/sh", "input.sh"]);
        let finished = run_with(&args);
        assert_eq!(finished.code(), 125, "{}", finished.describe());
        assert!(
            finished
                .stderr
                .contains("would overwrite input.sh, which the command names"),
            "{}",
            finished.describe()
        );
        assert_eq!(std::fs::read_to_string(&script).unwrap(), text);
    }

    // A file the command would create is named too: the trace it wrote
    // would be corrupt (as a path, and as a `KEY=PATH` value).
    for command in [
        &["/bin/cp", "input.sh", "copy.out"][..],
        &["/bin/dd", "if=input.sh", "of=copy.out"][..],
    ] {
        let mut args = vec!["run", "-o", "copy.out", "--"];
        args.extend_from_slice(command);
        let finished = run_with(&args);
        assert_eq!(finished.code(), 125, "{}", finished.describe());
        let named = command.last().unwrap();
        assert!(
            finished
                .stderr
                .contains(&format!("would overwrite {named}, which the command names")),
            "{}",
            finished.describe()
        );
        assert!(!dir.path().join("copy.out").exists());
    }

    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "keep me\n").unwrap();
    let finished = run_with(&["run", "-o", "notes.txt", "--", "/bin/true"]);
    assert_eq!(finished.code(), 125, "{}", finished.describe());
    assert!(
        finished.stderr.contains("notes.txt exists and is not a trapline trace: refusing to overwrite it (--force replaces it)"),
        "{}",
        finished.describe()
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");

    let link = dir.path().join("link.trace");
    std::os::unix::fs::symlink(&notes, &link).unwrap();
    let finished = run_with(&["run", "-o", "link.trace", "--", "/bin/true"]);
    assert_eq!(finished.code(), 125, "{}", finished.describe());
    assert!(
        finished.stderr.contains("link.trace is a symbolic link"),
        "{}",
        finished.describe()
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");

    let finished = run_with(&[
        "run",
        "-q",
        "--force",
        "-o",
        "link.trace",
        "--",
        "/bin/true",
    ]);
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(std::fs::read(&link).unwrap().starts_with(b"TRAPLINE"));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");

    let finished = run_with(&["run", "-q", "--force", "-o", "notes.txt", "--", "/bin/true"]);
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert!(std::fs::read(&notes).unwrap().starts_with(b"TRAPLINE"));
}

/// Reusing an output name deleted the earlier run's child traces without a
/// word. They are moved aside now, with the top trace, to PATH.old and
/// PATH.old.<pid> (an older .old family is replaced, as `perf record` keeps
/// one perf.data.old), and the run says so.
#[test]
fn run_moves_the_previous_runs_traces_aside() {
    let dir = TestDir::new("run_output_reuse");
    let run_tree = |quiet: bool| {
        let mut args = vec!["run"];
        if quiet {
            args.push("-q");
        }
        args.extend_from_slice(&[
            "-o",
            "t.trace",
            "--",
            "/bin/sh",
            "-c",
            "/bin/true; /bin/true",
        ]);
        let mut cmd = trapline_cmd(&args);
        cmd.current_dir(dir.path());
        let finished = output_of(cmd, "trapline run a tree");
        no_panic(&finished);
        assert_eq!(finished.code(), 0, "{}", finished.describe());
        finished
    };
    let family = |name: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n == name
                    || n.strip_prefix(name).is_some_and(|r| {
                        r.starts_with('.') && r[1..].chars().all(|c| c.is_ascii_digit() || c == '.')
                    })
            })
            .collect();
        v.sort();
        v
    };
    run_tree(true);
    let first = family("t.trace");
    assert_eq!(first.len(), 3, "{first:?}");
    let first_bytes: Vec<Vec<u8>> = first
        .iter()
        .map(|n| std::fs::read(dir.path().join(n)).unwrap())
        .collect();
    let second = run_tree(false);
    let old = family("t.trace.old");
    let expected_old: Vec<String> = first
        .iter()
        .map(|n| n.replacen("t.trace", "t.trace.old", 1))
        .collect();
    assert_eq!(old, expected_old);
    for (name, bytes) in old.iter().zip(&first_bytes) {
        assert_eq!(
            &std::fs::read(dir.path().join(name)).unwrap(),
            bytes,
            "{name}"
        );
    }
    assert!(
        second
            .stderr
            .contains("trapline run: the previous run's traces moved aside: "),
        "{}",
        second.describe()
    );
    assert!(!second.stderr.contains("deleted"), "{}", second.describe());
    for name in &old {
        assert!(
            second.stderr.contains(name.as_str()),
            "{name}: {}",
            second.describe()
        );
    }
    assert_eq!(family("t.trace").len(), 3);
    // A third run keeps one generation, as perf keeps one perf.data.old,
    // and says what it deleted.
    let third = run_tree(false);
    assert!(
        third
            .stderr
            .contains("; the 3 older traces kept there were deleted"),
        "{}",
        third.describe()
    );
}

/// A program that another C library's loader starts (musl's,
/// `/lib/ld-musl-x86_64.so.1`; here a program that merely names it, so the
/// test needs no musl): that loader cannot load the glibc agent, and the
/// program did not even start ("Error relocating libtrapline_agent.so"),
/// exit 127. Now trapline refuses it and says why.
#[test]
fn run_program_of_another_c_library_is_refused() {
    assert_refused(
        "musl_loader",
        &["-Wl,--dynamic-linker=/lib/ld-musl-x86_64.so.1"],
        "is started by the dynamic loader /lib/ld-musl-x86_64.so.1, not the GNU C library's",
    );
}

/// A script runs in its interpreter, which is what the agent is loaded
/// into: a script whose interpreter is statically linked ran untraced (and
/// one of musl's never started). Such a script is refused, with the reason
/// and the interpreter named.
#[test]
fn run_script_whose_interpreter_cannot_take_the_agent_is_refused() {
    let dir = TestDir::new("static_interpreter");
    let interpreter = compile_c_with(&dir, "static_hello.c", "static_interp", &["-static"]);
    let script = dir.path().join("script");
    std::fs::write(&script, format!("#!{}\n", interpreter.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    refused(&dir, &script, "is statically linked");
    refused(
        &dir,
        &script,
        &format!(
            "{} is a script that {} runs",
            script.display(),
            interpreter.display()
        ),
    );
}

/// A program built with AddressSanitizer (gcc links its runtime as a
/// shared library) refuses to start unless that runtime comes first: with
/// the agent preloaded it printed ASan's complaint, exited 1, and trapline
/// said the agent was not loaded. Now trapline refuses it up front and says
/// why.
#[test]
fn run_sanitizer_built_binary_is_refused() {
    assert_refused(
        "asan_hello",
        &["-fsanitize=address"],
        "is built with AddressSanitizer (it loads libasan.so.",
    );
}

/// A 32-bit program: ld.so printed "wrong ELF class: ELFCLASS64 ...
/// ignored" and ran it untraced, and trapline only said afterwards that no
/// trace was written. Now it is refused before it runs, with the reason.
#[test]
fn run_32_bit_binary_is_refused() {
    assert_refused(
        "hello_i386",
        &["-m32"],
        "is a 32-bit x86 (i386) program, and trapline's agent is a 64-bit x86-64 library",
    );
}

/// An executable for another machine (here aarch64, whose ELF header is
/// written by hand: no cross compiler is needed to refuse it, since only
/// the headers are read).
#[test]
fn run_foreign_architecture_binary_is_refused() {
    let dir = TestDir::new("foreign_arch");
    let prog = dir.path().join("hello_aarch64");
    std::fs::write(&prog, elf64_with_interp(183 /* EM_AARCH64 */)).unwrap();
    let mut perms = std::fs::metadata(&prog).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&prog, perms).unwrap();
    refused(
        &dir,
        &prog,
        "is a 64-bit ARM (aarch64) program, and trapline's agent is a 64-bit x86-64 library",
    );
}

/// A minimal little-endian ELF64 executable for machine `machine`: the file
/// header and one PT_INTERP program header naming /lib/ld-linux-aarch64.so.1.
fn elf64_with_interp(machine: u16) -> Vec<u8> {
    let interp = b"/lib/ld-linux-aarch64.so.1\0";
    let (ehsize, phsize) = (64u64, 56u64);
    let mut f = Vec::new();
    f.extend_from_slice(b"\x7fELF");
    f.extend_from_slice(&[2, 1, 1, 0]); // ELFCLASS64, little-endian, version 1, SysV
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f.extend_from_slice(&machine.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    f.extend_from_slice(&0x400000u64.to_le_bytes()); // e_entry
    f.extend_from_slice(&ehsize.to_le_bytes()); // e_phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
    f.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    f.extend_from_slice(&(ehsize as u16).to_le_bytes());
    f.extend_from_slice(&(phsize as u16).to_le_bytes());
    f.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    f.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    assert_eq!(f.len() as u64, ehsize);
    let at = ehsize + phsize;
    f.extend_from_slice(&3u32.to_le_bytes()); // PT_INTERP
    f.extend_from_slice(&4u32.to_le_bytes()); // PF_R
    f.extend_from_slice(&at.to_le_bytes()); // p_offset
    f.extend_from_slice(&(0x400000 + at).to_le_bytes()); // p_vaddr
    f.extend_from_slice(&(0x400000 + at).to_le_bytes()); // p_paddr
    f.extend_from_slice(&(interp.len() as u64).to_le_bytes()); // p_filesz
    f.extend_from_slice(&(interp.len() as u64).to_le_bytes()); // p_memsz
    f.extend_from_slice(&1u64.to_le_bytes()); // p_align
    f.extend_from_slice(interp);
    f
}

/// static_hello.c built with `flags` as `name`: `trapline run` refuses it
/// before it runs (exit status 125), with `message` on stderr.
fn assert_refused(name: &str, flags: &[&str], message: &str) {
    let dir = TestDir::new(name);
    let prog = compile_c_with(&dir, "static_hello.c", name, flags);
    refused(&dir, &prog, message);
}

/// `trapline run PROG` exits 125 with `message` on stderr, without running it.
fn refused(dir: &TestDir, prog: &Path, message: &str) {
    let finished = output_of(
        run_command(dir, &[], prog, &[]),
        &format!("trapline run {}", prog.display()),
    );
    no_panic(&finished);
    assert_eq!(finished.code(), 125, "{}", finished.describe());
    assert!(
        finished.stderr.contains(message),
        "stderr must say \"{message}\"\n{}",
        finished.describe()
    );
    assert!(
        !finished.stdout.contains("static ran"),
        "the program must not be run untraced\n{}",
        finished.describe()
    );
}

fn analyses_fail_cleanly(path: &Path, what: &str) {
    for subcommand in ["leaks", "stats"] {
        let finished = analysis(subcommand, path);
        assert_eq!(
            finished.code(),
            1,
            "trapline {subcommand} on {what}\n{}",
            finished.describe()
        );
        assert!(
            !finished.stderr.trim().is_empty(),
            "trapline {subcommand} on {what}: no message"
        );
    }
}

#[test]
fn analyses_reject_a_file_that_is_not_a_trace() {
    let dir = TestDir::new("not_a_trace");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "this is not a trace\n".repeat(20)).unwrap();
    analyses_fail_cleanly(&text, "a text file");
    let empty = dir.path().join("empty.trace");
    std::fs::write(&empty, b"").unwrap();
    analyses_fail_cleanly(&empty, "an empty file");
    let missing = dir.path().join("missing.trace");
    analyses_fail_cleanly(&missing, "a missing file");
    let finished = analysis("leaks", &missing);
    assert!(
        finished.stderr.contains("missing.trace"),
        "the message must name the file\n{}",
        finished.describe()
    );
}

/// The end of the first chunk (header 16 bytes, chunk header 44 bytes, whose
/// bytes 16..20 hold the stored payload length).
fn first_chunk_end(bytes: &[u8]) -> usize {
    let header = 16;
    assert!(
        bytes.len() >= header + 44
            && &bytes[..8] == b"TRAPLINE"
            && &bytes[header..header + 4] == b"TLCK"
    );
    let stored = u32::from_le_bytes(bytes[header + 16..header + 20].try_into().unwrap()) as usize;
    header + 44 + stored
}

/// Truncated copies of a real trace: never a panic; once at least one whole
/// chunk is there, a report of what was read that says the trace is not
/// complete and where it stopped.
#[test]
fn truncated_traces_are_reported_incomplete() {
    let dir = TestDir::new("truncated");
    let prog = compile_c(&dir, "clean.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let bytes = std::fs::read(dir.trace()).unwrap();
    let len = bytes.len();
    let first = first_chunk_end(&bytes);
    assert!(first < len, "the trace has more than one chunk");

    let mut cuts = vec![
        8,
        16,
        30,
        16 + 44,
        first - 1,
        first,
        first + 1,
        first + 50,
        len / 2,
        len * 3 / 4,
        len - 1,
    ];
    cuts.retain(|&c| c < len);
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        let path = dir.path().join(format!("cut{cut}.trace"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        for subcommand in ["leaks", "stats"] {
            let finished = analysis(subcommand, &path);
            let code = finished.code();
            assert!(
                code == 0 || code == 1,
                "{subcommand} on {cut} of {len} bytes\n{}",
                finished.describe()
            );
            if code == 1 {
                assert!(
                    !finished.stderr.trim().is_empty(),
                    "{subcommand} on {cut} bytes: no message"
                );
            }
            if subcommand != "leaks" {
                continue;
            }
            if cut >= first {
                assert_eq!(
                    code,
                    0,
                    "leaks on {cut} of {len} bytes (first chunk whole)\n{}",
                    finished.describe()
                );
            }
            if code == 0 {
                let report: Value = serde_json::from_str(&finished.stdout).unwrap_or_else(|e| {
                    panic!(
                        "leaks on {cut} bytes: not JSON ({e})\n{}",
                        finished.describe()
                    )
                });
                let trace = field(&report, "trace");
                assert_eq!(
                    field(trace, "complete"),
                    &Value::Bool(false),
                    "cut at {cut} of {len}: {}",
                    pretty(trace)
                );
                // Cut inside a chunk: reading must say where it stopped.
                // (Cut on a chunk boundary, it may just have run out of chunks.)
                let stopped = field(trace, "stopped");
                if cut == first + 1 || cut == len - 1 {
                    assert!(
                        !stopped.is_null(),
                        "cut at {cut} of {len}: trace.stopped is null"
                    );
                }
                if !stopped.is_null() {
                    let offset = as_u64(stopped, "offset");
                    assert!(offset <= cut as u64, "cut at {cut}: stopped at {offset}");
                    assert!(!as_str(stopped, "reason").is_empty(), "{}", pretty(stopped));
                }
                if cut <= len / 2 {
                    // The end record is written last, so it is not in the first half.
                    assert_eq!(
                        process_exit(&report),
                        &Value::Null,
                        "cut at {cut}: the end was not read"
                    );
                }
            }
        }
    }
}

/// many_pairs.c under a file size limit (prlimit --fsize) of 96 KiB, less
/// than its trace needs (about 220 KiB): as on a full disk, the agent's writes fail part way.
/// The program runs as natively (the writer thread blocks SIGXFSZ, which
/// would have killed it), the agent says once on stderr why the trace stops
/// growing, and a failed write is cut back off: the file is whole chunks,
/// readable to its end (the old agent left a torn chunk there, and readers
/// stopped at it), and the events that did not fit are counted as lost.
#[test]
fn a_trace_that_cannot_grow_stays_readable_and_counts_what_it_lost() {
    let dir = TestDir::new("many_pairs");
    let prog = compile_c(&dir, "many_pairs.c");
    let limit: u64 = 96 << 10;
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--fsize={limit}"))
        .arg(trapline())
        .arg("run")
        .arg("-o")
        .arg(dir.trace())
        .arg("--")
        .arg(&prog)
        .current_dir(dir.path())
        .env("TRAPLINE_AGENT", agent());
    let run = output_of(cmd, "prlimit trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "pairs done\n");
    let reason = "trapline agent: cannot write the trace (file too large, errno 27)";
    assert_eq!(run.stderr.matches(reason).count(), 1, "{}", run.describe());
    let report = leaks(&dir.trace());
    let trace = field(&report, "trace");
    assert_eq!(trace["stopped"], json!(null), "{}", pretty(trace));
    assert!(as_u64(trace, "file_bytes") <= limit);
    assert!(as_u64(trace, "events") > 10_000, "{}", pretty(trace));
    // The end record fits when the last chunks are small; either way the
    // report must not claim that nothing was lost.
    match report["events_lost"].as_u64() {
        Some(lost) => assert!(lost > 0, "{}", pretty(&report)),
        None => assert_eq!(trace["has_end"], json!(false)),
    }
}

/// raw_exit.c ends with the exit_group instruction itself: the agent never
/// runs at the end, and the trace has no end record. `trapline run` returns
/// the program's status and says why the trace is unfinished, without
/// claiming the program was killed.
#[test]
fn an_exit_past_the_agent_is_explained() {
    let dir = TestDir::new("raw_exit");
    let prog = compile_c(&dir, "raw_exit.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 7, "{}", run.describe());
    assert_eq!(run.stdout, "exiting\n");
    assert!(
        run.stderr.contains(
            "==trapline== the program exited, yet its trace has no end record: its exit went past the agent"
        ),
        "{}",
        run.describe()
    );
    assert!(!run.stderr.contains("died of signal"), "{}", run.describe());
}

/// raw_exit.c with "libc": `syscall(SYS_exit_group, 7)` through glibc's
/// function, which the agent now defines: the trace is finished there, as
/// by `_exit`. It used to end without its end record.
#[test]
fn exit_group_through_syscall_finishes_the_trace() {
    let dir = TestDir::new("raw_exit_libc");
    let prog = compile_c(&dir, "raw_exit.c");
    let run = run(&dir, &[], &prog, &["libc"]);
    assert_eq!(run.code(), 7, "{}", run.describe());
    assert_eq!(run.stdout, "exiting\nclose: -1 EBADF; mmap at 4096: same\n");
    assert!(!run.stderr.contains("no end record"), "{}", run.describe());
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(report["process"]["exit"], json!({ "code": 7 }));
    // The 64-byte block, beside stdout's buffer (no freeres after _exit).
    let src = "raw_exit.c";
    let line = marker_line(src, "RAW-EXIT-BLOCK");
    let block: Vec<_> = as_array(&report, "records")
        .iter()
        .filter(|r| r["bytes"] == 64)
        .collect();
    assert_eq!(block.len(), 1, "{}", pretty(&report));
    assert_eq!(block[0]["blocks"], 1);
    assert_frame(
        &stack_of(block[0], "stack")[0],
        "main",
        src,
        line,
        "64-byte block",
    );
}

/// own_dlsym.c defines dlsym itself and forwards with its own return
/// address. The agent now looks its real functions up through the C
/// library's dlsym (found with dlvsym): it used to get its own hooks back
/// and hang in its constructor.
#[test]
fn a_program_with_its_own_dlsym_is_traced() {
    let dir = TestDir::new("own_dlsym");
    let prog = compile_c(&dir, "own_dlsym.c");
    // Bounded: the old agent never returned.
    let run = run(&dir, &["--timeout", "60"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "own dlsym 1\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "own_dlsym.c";
    let (bytes, blocks) = records_all_from(
        &report,
        &[("main", src, marker_line(src, "OWN-DLSYM-LEAK"))],
    );
    assert_eq!((bytes, blocks), (33, 1), "{}", pretty(&report));
}

/// prefixed_allocator.c: the program allocates through an allocator linked
/// in under names of its own (`je_malloc`), which the agent never sees and
/// which does not define malloc (so the agent's shadowed-allocator check
/// stays silent). `trapline run` finds the entry point in the executable's
/// symbol table and warns, before the run and again in its summary; the
/// reports read the executable named in the trace and warn too (JSON
/// `trace.private_allocator`).
#[test]
fn an_allocator_under_names_of_its_own_is_named() {
    let dir = TestDir::new("prefixed_allocator");
    let prog = compile_c(&dir, "prefixed_allocator.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "prefixed: 3 blocks\n");
    let warning = format!(
        "==trapline== warning: {} has an allocator of its own (jemalloc, found as je_malloc)",
        prog.display()
    );
    assert_eq!(
        run.stderr.matches(&warning).count(),
        2,
        "{}",
        run.describe()
    );
    let exe = prog.canonicalize().expect("the program's path");
    let expected = json!({
        "executable": exe.display().to_string(),
        "allocator": "jemalloc",
        "symbol": "je_malloc",
    });
    let report = leaks(&dir.trace());
    assert_eq!(field(&report, "trace")["private_allocator"], expected);
    assert_eq!(
        field(&stats(&dir.trace()), "trace")["private_allocator"],
        expected
    );
    let warning = format!(
        "WARNING: {} has an allocator of its own (jemalloc, found as je_malloc)",
        exe.display()
    );
    assert!(leaks_text(&dir.trace(), &[]).contains(&warning));
    // A clean program's reports carry no such warning.
    let clean = TestDir::new("prefixed_allocator_clean");
    let prog = compile_c(&clean, "clean.c");
    let run = common::run(&clean, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(
        field(&leaks(&clean.trace()), "trace")["private_allocator"],
        json!(null)
    );
}

/// A command line of 150 KB: the process record keeps the first 64 KiB and
/// says what it left out. The record did not fit in a buffer, and the trace
/// had no process record at all ("Command: (unknown)"), with 0 events lost.
#[test]
fn a_very_long_command_line_is_cut_in_the_process_record() {
    let dir = TestDir::new("long_cmdline");
    let arg = "x".repeat(50_000);
    let run = run(&dir, &[], Path::new("/bin/true"), &[&arg, &arg, &arg]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(report["events_lost"], json!(0));
    let command = process_command(&report);
    assert_eq!(
        command.len(),
        4,
        "{:?}",
        command.iter().map(String::len).collect::<Vec<_>>()
    );
    assert_eq!(command[0], "/bin/true");
    assert_eq!(command[1], arg);
    assert_eq!(command[2], "x".repeat(65_536 - 9 - 50_000));
    assert_eq!(
        command[3],
        format!(
            "[trapline: {} more bytes of the command line, in 2 argument(s), not recorded]",
            100_000 - (65_536 - 9 - 50_000)
        )
    );
}

/// The offsets of the chunk headers of a trace, found by their marker and
/// checked by the chunk's stored length, which must lead to the next one.
fn chunk_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 16;
    while at + 44 <= bytes.len() && &bytes[at..at + 4] == b"TLCK" {
        out.push(at);
        let stored = u32::from_le_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
        at += 44 + stored;
    }
    assert_eq!(at, bytes.len(), "the chunks cover the file");
    out
}

/// A trace damaged in its middle, by a flipped byte in a chunk's payload
/// (a checksum error) or a destroyed chunk marker: it was reported as a
/// process that "did not finish (killed by SIGKILL ...)" although it
/// exited 0, and every chunk after the damage was dropped. The damaged
/// chunk is now reported by offset, reading resumes at the next good
/// chunk, and the rest (here the end record: exit 0) is analysed.
#[test]
fn a_damaged_chunk_is_skipped_and_the_rest_analysed() {
    let dir = TestDir::new("damaged_middle");
    let prog = compile_c(&dir, "many_pairs.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let bytes = std::fs::read(dir.trace()).unwrap();
    let chunks = chunk_offsets(&bytes);
    assert!(chunks.len() >= 4, "{} chunks", chunks.len());
    let victim = chunks[chunks.len() / 2];
    for (name, at, reason) in [
        ("payload", victim + 44 + 5, "checksum"),
        ("marker", victim, "bad chunk marker"),
    ] {
        let mut damaged = bytes.clone();
        if name == "marker" {
            damaged[at..at + 4].copy_from_slice(b"XXXX");
        } else {
            damaged[at] ^= 0x55;
        }
        let path = dir.path().join(format!("{name}.trace"));
        std::fs::write(&path, &damaged).unwrap();
        let report = leaks_with(&path, &[]);
        let trace = field(&report, "trace");
        assert_eq!(
            process_exit(&report),
            &json!({"code": 0}),
            "{name}: {}",
            pretty(trace)
        );
        assert_eq!(trace["complete"], json!(false), "{name}");
        assert_eq!(trace["stopped"], Value::Null, "{name}: {}", pretty(trace));
        let spans = as_array(trace, "damaged_chunks");
        assert_eq!(spans.len(), 1, "{name}: {}", pretty(trace));
        assert_eq!(spans[0]["offset"], json!(victim), "{name}");
        assert!(
            as_str(&spans[0], "reason").contains(reason),
            "{name}: {}",
            pretty(trace)
        );
        let text = leaks_text(&path, &[]);
        assert!(
            text.contains(&format!(
                "WARNING: damaged chunk at byte {}",
                thousands(victim as u64)
            )),
            "{name}: {text}"
        );
        assert!(!text.contains("did not finish"), "{name}: {text}");
    }
}

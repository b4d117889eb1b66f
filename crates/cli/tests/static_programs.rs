//! Statically linked programs, recorded from outside (crates/tracer): the
//! same fixture built dynamically (recorded by the agent) and with
//! `gcc -static` (glibc) or `musl-gcc -static` must give the same blocks, sizes, functions, program
//! frames and errors. The static build's C library allocates at its start
//! (what the dynamic loader does before any agent) and keeps stdio buffers
//! (the agent runs freeres): those blocks have no frame in the fixture and
//! are left out of the comparison, as are blocks still reachable that the
//! program did not allocate itself (a thread's DTV, whose size depends on
//! the modules loaded).

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// Records `source` built dynamically (the agent) and statically (from
/// outside): with glibc, and for C with musl too, each printing `stdout`
/// (None: the same every way). The dynamic build's leaks report, and each
/// static build's with its name.
fn builds(name: &str, source: &str, stdout: Option<&str>) -> (Value, Vec<(String, Value)>) {
    let dir = TestDir::new(name);
    let cxx = source.ends_with(".cpp");
    let flags = ["-g", "-O0", "-Wall", "-pthread"];
    let static_flags = [&flags[..], &["-static"]].concat();
    let mut programs = vec![
        (
            "dynamic",
            compile(
                &dir,
                if cxx { "g++" } else { "gcc" },
                source,
                "dynamic",
                &flags,
            ),
        ),
        (
            "static glibc",
            compile(
                &dir,
                if cxx { "g++" } else { "gcc" },
                source,
                "static",
                &static_flags,
            ),
        ),
    ];
    if !cxx {
        programs.push((
            "static musl",
            compile(&dir, "musl-gcc", source, "static_musl", &static_flags),
        ));
    }
    let mut printed: Vec<String> = Vec::new();
    let mut reports = Vec::new();
    for (label, prog) in programs {
        let trace = dir
            .path()
            .join(format!("{}.trace", label.replace(' ', "_")));
        let mut cmd = std::process::Command::new(trapline());
        cmd.args(["run", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&prog)
            .current_dir(dir.path())
            .env("TRAPLINE_AGENT", agent());
        let finished = output_of(cmd, &format!("trapline run of the {label} build"));
        assert_eq!(finished.code(), 0, "{label}: {}", finished.describe());
        match (stdout, printed.first()) {
            (Some(want), _) => assert_eq!(finished.stdout, want, "{label}"),
            (None, Some(first)) => assert_eq!(&finished.stdout, first, "{label}"),
            (None, None) => {}
        }
        printed.push(finished.stdout.clone());
        assert_no_events_lost_in_summary(&finished);
        reports.push((label.to_string(), leaks(&trace)));
    }
    let (_, dynamic) = reports.remove(0);
    (dynamic, reports)
}

/// leaks.c: seven leak sites of six allocation functions (realloc,
/// calloc, malloc in a loop, posix_memalign, aligned_alloc, strdup's
/// malloc), 9 blocks and 1,032 bytes, with their stacks through main.
#[test]
fn a_static_program_has_the_leaks_of_its_dynamic_build() {
    let (dynamic, statics) = builds("static_leaks", "leaks.c", Some(""));
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    let want = views(&dynamic, "records", "leaks.c", &keys);
    assert_eq!(want.len(), 7, "{want:#?}");
    for (label, fixed) in &statics {
        assert_eq!(views(fixed, "records", "leaks.c", &keys), want, "{label}");
        assert_same_losses(&dynamic, fixed);
    }
    let line = |marker: &str| marker_line("leaks.c", marker);
    assert!(
        want.contains(&format!(
            "kind=\"definitely_lost\" bytes=100 blocks=1 allocated_by=\"malloc\" \
             stack=leak_one:{} < middle:{} < main:{}",
            line("LEAK-ONE"),
            line("CALL-LEAK-ONE"),
            line("MAIN-MIDDLE")
        )),
        "{want:#?}"
    );
}

/// The lost kinds of the leak summary are the same both ways (the static
/// build's C library's own blocks are all still reachable).
fn assert_same_losses(dynamic: &Value, fixed: &Value) {
    for kind in ["definitely_lost", "indirectly_lost", "possibly_lost"] {
        assert_eq!(
            fixed["summary"][kind], dynamic["summary"][kind],
            "{kind}: {}",
            fixed["summary"]
        );
    }
}

/// The reachability fixtures, judged by the same scan from outside:
/// chains (definite, indirect, possible, reachable), blocks kept only on
/// other threads' stacks and in a register while they block in read(2),
/// in thread-local storage (the main thread's lives in the break area of
/// a static program), and in memory the program mapped itself.
#[test]
fn a_static_program_has_the_verdicts_of_its_dynamic_build() {
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    for source in [
        "reach_chains.c",
        "reach_threads.c",
        "reach_tls.c",
        "reach_mmap.c",
    ] {
        let name = format!("static_{}", source.trim_end_matches(".c"));
        let (dynamic, statics) = builds(&name, source, None);
        let want = views(&dynamic, "records", source, &keys);
        assert!(!want.is_empty(), "{source}: {dynamic}");
        for (label, fixed) in &statics {
            assert_eq!(
                views(fixed, "records", source, &keys),
                want,
                "{source}, {label}"
            );
            assert_same_losses(&dynamic, fixed);
        }
    }
}

/// errors.c: a double free (with both frees' and the allocation's
/// stacks), invalid frees of a stack address and of an interior pointer,
/// and an invalid realloc, none passed on: the program survives.
#[test]
fn a_static_program_has_the_errors_of_its_dynamic_build() {
    let (dynamic, statics) = builds("static_errors", "errors.c", Some("survived\n"));
    let want = views(&dynamic, "errors", "errors.c", &ERROR_KEYS);
    assert_eq!(want.len(), 4, "{want:#?}");
    for (label, fixed) in &statics {
        assert_eq!(
            views(fixed, "errors", "errors.c", &ERROR_KEYS),
            want,
            "{label}"
        );
    }
}

/// C++: leaks through `operator new` and `new[]` (the static C++ library's
/// operators are trapped, and the `malloc` they call is nested in them),
/// releases of the wrong family, and sized and aligned deletes that do not
/// match their blocks.
#[test]
fn a_static_cxx_program_has_the_reports_of_its_dynamic_build() {
    let (dynamic, statics) = builds("static_cpp_leak", "cpp_leak.cpp", None);
    let fixed = &statics[0].1;
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    let want = views(&dynamic, "records", "cpp_leak.cpp", &keys);
    assert!(
        want.iter().any(|r| r.contains("operator new[]")),
        "{want:#?}"
    );
    assert_eq!(views(fixed, "records", "cpp_leak.cpp", &keys), want);
    assert_same_losses(&dynamic, fixed);
    for (name, source) in [
        ("static_cpp_errors", "errors.cpp"),
        ("static_delete_mismatch", "delete_mismatch.cpp"),
    ] {
        let (dynamic, statics) = builds(name, source, Some("survived\n"));
        let want = views(&dynamic, "errors", source, &ERROR_KEYS);
        assert_eq!(want.len(), 4, "{want:#?}");
        assert_eq!(
            views(&statics[0].1, "errors", source, &ERROR_KEYS),
            want,
            "{source}"
        );
    }
}

/// A forked child's events stay out of the parent's trace (its first stop
/// may come before the fork event names it), a thread's leak is the same
/// both ways, glibc's release of a thread's tcache at its end (allocated
/// without `malloc`) is no error, and a vforked child runs its exec.
#[test]
fn a_static_program_keeps_its_children_apart() {
    let (dynamic, statics) = builds(
        "static_children",
        "static_children.c",
        Some("child ok\nparent ok 0\n"),
    );
    let keys = ["kind", "bytes", "blocks", "allocated_by"];
    let want = views(&dynamic, "records", "static_children.c", &keys);
    assert!(want.iter().any(|r| r.contains("bytes=33")), "{want:#?}");
    for (label, fixed) in &statics {
        assert_eq!(
            views(fixed, "records", "static_children.c", &keys),
            want,
            "{label}"
        );
        assert_eq!(fixed["errors"], serde_json::json!([]), "{label}");
        assert_same_losses(&dynamic, fixed);
    }
    // The child's block is in neither parent's trace.
    assert!(want.iter().all(|r| !r.contains("bytes=20 ")), "{want:#?}");
}

/// What the outside recorder cannot do yet is refused before the program
/// runs, and a static program without symbols is refused with the reason.
#[test]
fn a_static_program_refuses_what_its_recorder_lacks() {
    let dir = TestDir::new("static_refusals");
    let prog = compile_c_with(&dir, "static_hello.c", "static_hello", &["-static"]);
    let finished = output_of(
        run_command(&dir, &["--profile=99"], &prog, &[]),
        "trapline run --profile",
    );
    assert_eq!(finished.code(), 2, "{}", finished.describe());
    assert!(
        finished.stderr.contains(
            "is statically linked and recorded from outside, which does not support --profile yet"
        ),
        "{}",
        finished.describe()
    );
    assert!(!finished.stdout.contains("static ran"));
    let finished = output_of(
        run_command(&dir, &["--no-release-stacks"], &prog, &[]),
        "trapline run --no-release-stacks",
    );
    assert_eq!(finished.code(), 2, "{}", finished.describe());
    // --no-scan is followed: the exit snapshot is left unjudged.
    let finished = output_of(
        run_command(&dir, &["--no-scan"], &prog, &[]),
        "trapline run --no-scan",
    );
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert_eq!(finished.stdout, "static ran\n");
    assert_eq!(leaks(&dir.trace())["summary"]["source"], "exit_snapshot");
    std::fs::remove_file(dir.trace()).unwrap();
    let stripped = dir.path().join("stripped");
    std::fs::copy(&prog, &stripped).unwrap();
    let strip = std::process::Command::new("strip")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(strip.success());
    let finished = output_of(
        run_command(&dir, &[], &stripped, &[]),
        "trapline run stripped",
    );
    assert_eq!(finished.code(), 125, "{}", finished.describe());
    assert!(
        finished
            .stderr
            .contains("without a malloc of its own that trapline can find"),
        "{}",
        finished.describe()
    );
    assert!(
        !Path::new(&dir.trace()).exists() || std::fs::metadata(dir.trace()).unwrap().len() == 0
    );
}

//! `trapline leaks` and `trapline stats` on synthesized trace files: output
//! formats and exit statuses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use trapline_trace::{
    AllocFn, EndCounters, Event, ExitKind, ProcessInfo, SnapshotKind, TraceBuilder,
};

fn trace(with_end: bool) -> Vec<u8> {
    let mut b = TraceBuilder::new();
    b.chunk(
        0,
        &[Event::Process(ProcessInfo {
            pid: 77,
            ppid: 1,
            start_unix_ns: 0,
            exe: "/bin/prog".into(),
            argv: vec!["prog".into(), "x".into()],
        })],
    );
    b.chunk(
        1,
        &[
            Event::Alloc {
                time: 10,
                addr: 0x1000,
                size: 1024,
                align: 16,
                func: AllocFn::Malloc,
                stack: 1,
            },
            Event::Alloc {
                time: 20,
                addr: 0x2000,
                size: 24,
                align: 16,
                func: AllocFn::New,
                stack: 0,
            },
            Event::StackDef {
                id: 1,
                frames: vec![0x1234],
            },
        ],
    );
    if with_end {
        b.chunk(
            0,
            &[
                Event::SnapshotBegin {
                    time: 30,
                    kind: SnapshotKind::Exit,
                },
                Event::LiveBlock {
                    addr: 0x1000,
                    size: 1024,
                    func: AllocFn::Malloc,
                    stack: 1,
                },
                Event::SnapshotEnd {
                    blocks: 1,
                    bytes: 1024,
                },
                Event::End {
                    time: 31,
                    exit: ExitKind::Code(3),
                    counters: EndCounters::default(),
                },
            ],
        );
    }
    b.into_bytes()
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trapline-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn trapline(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapline"))
        .args(args)
        .arg(path)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn leaks_text_and_json() {
    let path = write("ok.trace", &trace(true));
    let o = trapline(&["leaks"], &path);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(
        t.contains("==77==     in use at exit: 1,024 bytes in 1 blocks"),
        "{t}"
    );
    assert!(t.contains("==77== events lost: 0"), "{t}");

    let o = trapline(&["leaks", "--format", "json"], &path);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["process"]["exit"]["code"], 3);
    assert_eq!(v["records"][0]["stack"][0]["address"], "0x1234");
    assert_eq!(v["trace"]["complete"], true);
}

#[test]
fn stats_text_and_json() {
    let path = write("stats.trace", &trace(true));
    let o = trapline(&["stats"], &path);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("peak heap: 1,048 bytes in 2 blocks"),
        "{}",
        stdout(&o)
    );
    let o = trapline(&["stats", "--format", "json"], &path);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["peak_heap"]["bytes"], 1048);
    assert_eq!(v["peak_heap"]["time_ns"], 20);
}

#[test]
fn truncated_trace_still_reports_with_a_warning() {
    let full = trace(true);
    let path = write("cut.trace", &full[..full.len() - 3]);
    let o = trapline(&["leaks"], &path);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(
        t.contains("in use at end of trace: 1,048 bytes in 2 blocks"),
        "{t}"
    );
    assert!(
        t.lines()
            .last()
            .unwrap()
            .contains("WARNING: reading stopped at byte"),
        "{t}"
    );
    let o = trapline(&["leaks", "--format", "json"], &path);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["trace"]["complete"], false);
    assert!(v["trace"]["stopped"]["offset"].is_u64());
}

#[test]
fn unusable_files_exit_1_naming_the_file() {
    let not = write("not.trace", b"definitely not a trace file");
    let mut newer = trace(true);
    newer[8..10].copy_from_slice(&(trapline_trace::FORMAT_VERSION + 1).to_le_bytes());
    let newer = write("newer.trace", &newer);
    let empty = write("empty.trace", &trace(false)[..16]);
    let missing = std::env::temp_dir().join("trapline-no-such-file.trace");
    let zero = write("zero.trace", b"");
    let dir = std::env::temp_dir();
    for (path, needle) in [
        (&not, "not a trapline trace"),
        (&newer, "newer than this trapline understands"),
        (&empty, "no readable events"),
        (&missing, "cannot open"),
        (&zero, "is empty (0 bytes), not a trace"),
        (&dir, "is a directory, not a trace"),
    ] {
        for cmd in ["leaks", "stats"] {
            let o = trapline(&[cmd], path);
            assert_eq!(o.status.code(), Some(1), "{cmd} {}", path.display());
            let e = stderr(&o);
            assert!(e.contains(&path.display().to_string()), "{e}");
            assert!(e.contains(needle), "{e}");
            assert!(o.stdout.is_empty());
        }
    }
}

#[test]
fn bad_usage_exits_2() {
    let o = Command::new(env!("CARGO_BIN_EXE_trapline"))
        .args(["leaks", "--format", "xml", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

//! `TRACE.idx`: a second read of a trace leaves out the chunks its passes
//! do not need and gives the very report of the first; an index that does
//! not match the trace is ignored.

mod common;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use common::*;
use trapline_analysis::deadlocks::DeadlocksAnalysis;
use trapline_analysis::index::{MergedEvent, ReadStatus, TraceIndex};
use trapline_analysis::index_file::{self, ChunkSummary, TraceFile};
use trapline_analysis::locks::LocksAnalysis;
use trapline_analysis::pass::{self, Pass};
use trapline_trace::{Event, LockEvent, LockKind, LockMode, LockOp, TraceError};

/// A heap block holding a mutex (at `LOCK`), allocated, freed and used
/// afterwards, the three on different threads' chunks.
const BLOCK: u64 = 0x5000;
const LOCK: u64 = 0x5010;
/// A mutex in static memory, taken at a stack another chunk defines.
const STATIC_LOCK: u64 = 0xa000;
/// The stack of the free that released the lock's memory, and of the
/// acquisition whose definition sits in a chunk of heap events only.
const FREE_STACK: u32 = 3;
const DEFINED_ELSEWHERE: u32 = 4;

/// The chunks every read of the lock replay needs, and the one it does
/// not: its heap events touch no lock and define no stack it reports.
const SKIPPED: u32 = 2;

fn acquire(time: u64, addr: u64, stack: u32) -> Event {
    Event::Lock(LockEvent::Acquire {
        time,
        addr,
        kind: LockKind::Mutex,
        mode: LockMode::Exclusive,
        op: LockOp::Blocking,
        wait_ns: None,
        stack,
    })
}

fn chunks() -> Vec<(u32, Vec<Event>)> {
    vec![
        // 0: the agent's first records.
        (0, vec![process(), module()]),
        // 1: the block around the lock is allocated.
        (
            10,
            vec![
                stack(1, &[0x401010, 0x401020]),
                malloc(10, BLOCK, 64, 1),
                malloc(11, 0x7000, 16, 1),
            ],
        ),
        // 2: heap events that change nothing the lock replay knows.
        (
            11,
            vec![
                stack(2, &[0x401030]),
                malloc(12, 0x9000, 32, 2),
                free(13, 0x9000, 2),
                malloc(14, 0x9100, 32, 2),
            ],
        ),
        // 3: the lock is used: its address becomes known.
        (10, vec![acquire(20, LOCK, 1), unlock(21, LOCK)]),
        // 4: the block is freed, lock and all.
        (
            12,
            vec![
                stack(FREE_STACK, &[0x401040, 0x401050]),
                free(30, BLOCK, FREE_STACK),
            ],
        ),
        // 5: the freed lock is used again.
        (10, vec![acquire(40, LOCK, 1), unlock(41, LOCK)]),
        // 6: a stack a later lock event names, among heap events.
        (
            13,
            vec![
                stack(DEFINED_ELSEWHERE, &[0x401060]),
                malloc(42, 0x9200, 8, DEFINED_ELSEWHERE),
            ],
        ),
        // 7: that lock event, held to the end.
        (14, vec![acquire(50, STATIC_LOCK, DEFINED_ELSEWHERE)]),
        // 8: a thread waits in pthread_join ...
        (
            15,
            vec![Event::Lock(LockEvent::JoinWait {
                time: 60,
                joined: 99,
                stack: 1,
            })],
        ),
        // 9: ... and its next call, an allocation, ends the wait.
        (15, vec![malloc(70, 0x9300, 8, 1)]),
        // 10: the end.
        (0, vec![end(80, 0, 0)]),
    ]
}

/// A pass that only notes which chunks it saw and needs none of them.
#[derive(Default)]
struct ChunksSeen(BTreeSet<u32>);

impl Pass for ChunksSeen {
    type Report = BTreeSet<u32>;
    fn observe(&mut self, event: &MergedEvent) {
        self.0.insert(event.chunk);
    }
    fn finish(self, _: &TraceIndex, _: ReadStatus) -> Result<BTreeSet<u32>, TraceError> {
        Ok(self.0)
    }
    fn needs(&self, _: ChunkSummary) -> bool {
        false
    }
}

type Reports = (
    trapline_analysis::LocksReport,
    trapline_analysis::DeadlocksReport,
);

fn read(path: &Path) -> (Reports, BTreeSet<u32>) {
    let file = BufReader::new(File::open(path).expect("open the trace"));
    let mut input = TraceFile::new(file, path);
    let ((locks, deadlocks), seen) = pass::run(&mut input, |_| {
        (
            (LocksAnalysis::new(None), DeadlocksAnalysis::default()),
            ChunksSeen::default(),
        )
    })
    .expect("read the trace");
    ((locks, deadlocks), seen)
}

fn trace_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trapline-index-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.trace");
    std::fs::write(&path, build(&chunks())).unwrap();
    path
}

#[test]
fn second_read_leaves_out_what_locks_do_not_need() {
    let path = trace_file("skip");
    let all: BTreeSet<u32> = (0..chunks().len() as u32).collect();

    let (first, seen) = read(&path);
    assert_eq!(seen, all, "a read without an index reads every chunk");
    let idx = index_file::path_for(&path);
    assert!(idx.exists(), "the first read leaves {}", idx.display());

    // The report the test is about: the misuse needs the free's stack and
    // the held lock's stack, both defined in heap chunks.
    let (locks, deadlocks) = &first;
    let misuse: Vec<(&str, Vec<u64>)> = locks
        .errors
        .iter()
        .map(|e| {
            (
                e.kind,
                e.held_stack.iter().map(|f| f.address).collect::<Vec<u64>>(),
            )
        })
        .collect();
    assert!(
        misuse.contains(&("use_after_free", vec![0x401040, 0x401050])),
        "{misuse:?}"
    );
    assert_eq!(deadlocks.errors, locks.errors);

    let (second, seen) = read(&path);
    let expected: BTreeSet<u32> = all.iter().copied().filter(|&c| c != SKIPPED).collect();
    assert_eq!(
        seen, expected,
        "the second read leaves out chunk {SKIPPED} only"
    );
    assert_eq!(second, first, "the same reports from the index");
    let index_bytes = std::fs::read(&idx).unwrap();

    // The third read uses the index as the second did: it is not rewritten.
    let (third, seen) = read(&path);
    assert_eq!((&third, &seen), (&first, &expected));
    assert_eq!(std::fs::read(&idx).unwrap(), index_bytes);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn an_index_that_does_not_match_is_ignored_and_written_again() {
    let path = trace_file("damaged");
    let all: BTreeSet<u32> = (0..chunks().len() as u32).collect();
    let (first, _) = read(&path);
    let idx = index_file::path_for(&path);
    let good = std::fs::read(&idx).unwrap();

    // One flipped bit anywhere: the checksum refuses the file.
    for at in [0, 9, 30, good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&idx, &bad).unwrap();
        let (again, seen) = read(&path);
        assert_eq!(seen, all, "byte {at} damaged: every chunk read");
        assert_eq!(again, first);
        assert_eq!(std::fs::read(&idx).unwrap(), good, "rewritten");
    }
    // Cut short, or another trace's index.
    std::fs::write(&idx, &good[..good.len() - 3]).unwrap();
    assert_eq!(read(&path), (first.clone(), all.clone()));
    let other = trace_file("other");
    let mut other_chunks = chunks();
    other_chunks[2].1.push(malloc(15, 0x9400, 8, 2));
    std::fs::write(&other, build(&other_chunks)).unwrap();
    let _ = read(&other);
    std::fs::copy(index_file::path_for(&other), &idx).unwrap();
    assert_eq!(read(&path), (first, all));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    std::fs::remove_dir_all(other.parent().unwrap()).unwrap();
}

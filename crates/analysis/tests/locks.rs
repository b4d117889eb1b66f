//! `locks` and `deadlocks` on synthesized traces: exact counts, the
//! Goodlock conditions (threads, guard sets, segments, read holds), thread
//! instances of reused tids, misuse, and actual deadlocks.

mod common;

use common::*;
use trapline_analysis::{deadlocks, locks};
use trapline_trace::{Event, LockEvent, LockKind, LockMisuse, LockMode, LockOp};

const A: u64 = 0xa000;
const B: u64 = 0xb000;
const C: u64 = 0xc000;
const G: u64 = 0x6000;

fn acquire(
    time: u64,
    addr: u64,
    kind: LockKind,
    mode: LockMode,
    op: LockOp,
    wait: Option<u64>,
) -> Event {
    Event::Lock(LockEvent::Acquire {
        time,
        addr,
        kind,
        mode,
        op,
        wait_ns: wait,
        stack: (addr >> 12) as u32,
    })
}

/// A blocking, uncontended exclusive acquisition of a default mutex.
fn lock(time: u64, addr: u64) -> Event {
    acquire(
        time,
        addr,
        LockKind::Mutex,
        LockMode::Exclusive,
        LockOp::Blocking,
        None,
    )
}

/// A release by a thread that the C library did not name as the owner.
fn foreign_unlock(time: u64, addr: u64) -> Event {
    Event::Lock(LockEvent::Release {
        time,
        addr,
        kind: LockKind::Mutex,
        stack: 7,
        agent_ns: 0,
    })
}

/// lock(first), lock(second), unlock both, from `time` on.
fn nested(time: u64, first: u64, second: u64) -> Vec<Event> {
    vec![
        lock(time, first),
        lock(time + 1, second),
        unlock(time + 2, second),
        unlock(time + 3, first),
    ]
}

fn create(time: u64, id: u64) -> Event {
    Event::ThreadCreate {
        time,
        create_id: id,
        stack: 0,
    }
}

fn start(time: u64, parent: u32, id: u64) -> Event {
    Event::ThreadStart {
        time,
        parent_tid: parent,
        create_id: id,
    }
}

fn join(time: u64, tid: u32) -> Event {
    Event::Lock(LockEvent::Join {
        time,
        joined: tid,
        stack: 0,
    })
}

fn trace(chunks: Vec<(u32, Vec<Event>)>) -> Vec<u8> {
    let mut all = vec![(0, vec![process(), module()])];
    all.extend(chunks);
    all.push((0, vec![end(100_000, 0, 0)]));
    build(&all)
}

fn deadlocks_of(chunks: Vec<(u32, Vec<Event>)>) -> deadlocks::DeadlocksReport {
    deadlocks::analyze(&mut cursor(&trace(chunks))).expect("analyze")
}

fn kinds(r: &deadlocks::DeadlocksReport) -> Vec<&'static str> {
    r.cycles.iter().map(|c| c.kind).collect()
}

#[test]
fn three_threads_in_a_ring_are_one_potential_deadlock() {
    let r = deadlocks_of(vec![
        (1, nested(100, A, B)),
        (2, nested(200, B, C)),
        (3, nested(300, C, A)),
    ]);
    assert_eq!(kinds(&r), ["potential_deadlock"]);
    assert_eq!(r.cycles[0].locks, [A, B, C]);
    let threads: Vec<u32> = r.cycles[0].edges.iter().map(|e| e.thread).collect();
    assert_eq!(threads, [1, 2, 3]);
    assert_eq!(r.summary.lock_graph_edges, 3);
    let text = deadlocks::render_text(&r);
    assert!(
        text.contains("POTENTIAL DEADLOCK #1: 0xa000 -> 0xb000 -> 0xc000 -> 0xa000"),
        "{text}"
    );
}

#[test]
fn occurrences_are_the_fewest_times_an_edge_of_the_cycle_was_seen() {
    let mut one = nested(100, A, B);
    one.extend(nested(110, A, B));
    let mut two = nested(200, B, A);
    two.extend(nested(210, B, A));
    two.extend(nested(220, B, A));
    let r = deadlocks_of(vec![(1, one), (2, two)]);
    assert_eq!(kinds(&r), ["potential_deadlock"]);
    let counts: Vec<u64> = r.cycles[0].edges.iter().map(|e| e.count).collect();
    assert_eq!(counts, [2, 3]);
    assert_eq!(r.cycles[0].occurrences, 2);
}

#[test]
fn a_gate_held_for_reading_does_not_serialize_but_one_held_for_writing_does() {
    let gated = |mode: LockMode, time: u64, first: u64, second: u64| {
        let mut v = vec![acquire(
            time,
            G,
            LockKind::RwLock,
            mode,
            LockOp::Blocking,
            None,
        )];
        v.extend(nested(time + 1, first, second));
        v.push(Event::Lock(LockEvent::Release {
            time: time + 9,
            addr: G,
            kind: LockKind::RwLock,
            stack: 0,
            agent_ns: 0,
        }));
        v
    };
    let r = deadlocks_of(vec![
        (1, gated(LockMode::Shared, 100, A, B)),
        (2, gated(LockMode::Shared, 200, B, A)),
    ]);
    assert_eq!(kinds(&r), ["potential_deadlock"]);
    let r = deadlocks_of(vec![
        (1, gated(LockMode::Exclusive, 100, A, B)),
        (2, gated(LockMode::Shared, 200, B, A)),
    ]);
    assert_eq!(kinds(&r), Vec::<&str>::new());
}

#[test]
fn a_child_created_after_its_parents_edge_and_a_joined_child_happen_in_order() {
    // Parent: A->B, then creates the child, which takes B->A.
    let mut parent = nested(100, A, B);
    parent.push(create(110, 1));
    let child = [vec![start(120, 1, 1)], nested(130, B, A)].concat();
    let r = deadlocks_of(vec![(1, parent), (2, child)]);
    assert_eq!(kinds(&r), Vec::<&str>::new());

    // Child: A->B; the parent joins it, then takes B->A.
    let parent = [vec![create(100, 1), join(300, 2)], nested(310, B, A)].concat();
    let child = [
        vec![start(120, 1, 1)],
        nested(130, A, B),
        vec![Event::ThreadEnd { time: 200 }],
    ]
    .concat();
    let r = deadlocks_of(vec![(1, parent.clone()), (2, child.clone())]);
    assert_eq!(kinds(&r), Vec::<&str>::new());

    // Without the join, the parent's B->A may run beside the child's A->B.
    let unjoined: Vec<Event> = parent
        .into_iter()
        .filter(|e| !matches!(e, Event::Lock(LockEvent::Join { .. })))
        .collect();
    let r = deadlocks_of(vec![(1, unjoined), (2, child)]);
    assert_eq!(kinds(&r), ["potential_deadlock"]);
}

#[test]
fn a_reused_tid_is_another_thread() {
    // Thread 5 runs A->B and is joined; a new thread that gets tid 5 runs
    // B->A: ordered by the join, no deadlock. Seen as one thread it would be
    // a lock-order inversion.
    let main = vec![create(100, 1), join(300, 5), create(310, 2)];
    let first = [
        vec![start(110, 1, 1)],
        nested(120, A, B),
        vec![Event::ThreadEnd { time: 200 }],
    ]
    .concat();
    let second = [vec![start(320, 1, 2)], nested(330, B, A)].concat();
    let r = deadlocks_of(vec![(1, main), (5, first), (5, second)]);
    assert_eq!(kinds(&r), Vec::<&str>::new());
}

#[test]
fn a_trylock_or_timed_lock_adds_no_edge_into_its_lock() {
    for op in [LockOp::Try, LockOp::Timed] {
        let two = vec![
            lock(200, B),
            acquire(201, A, LockKind::Mutex, LockMode::Exclusive, op, None),
            unlock(202, A),
            unlock(203, B),
        ];
        let r = deadlocks_of(vec![(1, nested(100, A, B)), (2, two)]);
        assert_eq!(kinds(&r), Vec::<&str>::new());
        assert_eq!(r.summary.lock_graph_edges, 1);
    }
}

#[test]
fn one_thread_in_both_orders_is_an_inversion_and_a_recursive_relock_is_nothing() {
    let mut one = nested(100, A, B);
    one.extend(nested(110, B, A));
    let r = deadlocks_of(vec![(1, one)]);
    assert_eq!(kinds(&r), ["lock_order_inversion"]);
    assert_eq!(r.summary.potential_deadlocks, 0);

    let rec = |time, addr| {
        acquire(
            time,
            addr,
            LockKind::MutexRecursive,
            LockMode::Exclusive,
            LockOp::Blocking,
            None,
        )
    };
    let one = vec![
        rec(100, A),
        lock(101, B),
        rec(102, A),
        unlock(103, A),
        unlock(104, B),
        unlock(105, A),
    ];
    let r = deadlocks_of(vec![(1, one)]);
    assert_eq!(kinds(&r), Vec::<&str>::new());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn threads_waiting_at_the_end_of_the_trace_are_an_actual_deadlock() {
    let request = |time, addr| {
        Event::Lock(LockEvent::Request {
            time,
            addr,
            kind: LockKind::Mutex,
            mode: LockMode::Exclusive,
            stack: 9,
        })
    };
    let chunks = vec![
        (0, vec![process(), module()]),
        (1, vec![lock(100, A), request(120, B)]),
        (2, vec![lock(110, B), request(130, A)]),
        // A third thread that waited and got its lock is not stuck.
        (
            3,
            vec![
                request(90, C),
                acquire(
                    95,
                    C,
                    LockKind::Mutex,
                    LockMode::Exclusive,
                    LockOp::Blocking,
                    Some(5),
                ),
            ],
        ),
    ];
    let r = deadlocks::analyze(&mut cursor(&build(&chunks))).expect("analyze");
    assert_eq!(r.actual_deadlocks.len(), 1);
    let w = &r.actual_deadlocks[0].threads;
    assert_eq!(w.len(), 2);
    assert_eq!((w[0].thread, w[0].waits_for, w[0].held_by), (1, B, 2));
    assert_eq!((w[1].thread, w[1].waits_for, w[1].held_by), (2, A, 1));
    assert!(!r.trace.has_end);
}

#[test]
fn misuse_found_in_the_trace() {
    let destroy = Event::Lock(LockEvent::Destroy {
        time: 130,
        addr: B,
        kind: LockKind::Mutex,
        stack: 3,
    });
    let misuse = Event::Lock(LockEvent::Misuse {
        time: 150,
        addr: C,
        kind: LockKind::Mutex,
        misuse: LockMisuse::SelfDeadlock,
        errno: 35,
        stack: 4,
    });
    let r = deadlocks_of(vec![
        (
            1,
            vec![
                foreign_unlock(100, A),
                lock(120, B),
                destroy,
                unlock(140, B),
                lock(145, C),
                misuse,
            ],
        ),
        (
            2,
            vec![
                start(200, 1, 7),
                lock(210, A),
                Event::ThreadEnd { time: 220 },
            ],
        ),
    ]);
    let kinds: Vec<&str> = r.errors.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            "unlock_not_held",
            "destroy_locked",
            "self_deadlock",
            "thread_end_holding"
        ]
    );
    assert_eq!(r.errors[1].lock, B);
    assert_eq!(r.errors[3].thread, 2);
    // The self-deadlocked thread waits for itself.
    assert_eq!(r.actual_deadlocks.len(), 1);
    assert_eq!(r.actual_deadlocks[0].threads[0].held_by, 1);
}

#[test]
fn contention_profile_counts() {
    let contended = |time, wait| {
        acquire(
            time,
            A,
            LockKind::Mutex,
            LockMode::Exclusive,
            LockOp::Blocking,
            Some(wait),
        )
    };
    let failed = Event::Lock(LockEvent::Failed {
        time: 500,
        addr: A,
        kind: LockKind::Mutex,
        mode: LockMode::Exclusive,
        op: LockOp::Try,
        errno: 16,
        stack: 1,
    });
    let cond = acquire(
        320,
        A,
        LockKind::Mutex,
        LockMode::Exclusive,
        LockOp::CondWait,
        None,
    );
    let bytes = trace(vec![
        (
            1,
            vec![
                lock(100, A),
                unlock(150, A),
                lock(300, A),
                unlock(310, A),
                cond,
                unlock(330, A),
            ],
        ),
        (
            2,
            vec![
                contended(200, 40),
                unlock(260, A),
                failed,
                contended(600, 60),
                unlock(610, A),
            ],
        ),
        (2, vec![lock(700, B), unlock(701, B)]),
    ]);
    let r = locks::analyze(&mut cursor(&bytes)).expect("analyze");
    assert!(r.has_lock_events);
    assert_eq!(r.locks.len(), 2);
    let a = &r.locks[0];
    assert_eq!(a.address, A);
    assert_eq!(a.acquisitions, 4);
    assert_eq!(a.contended, 2);
    // 1 -> 2 -> 1 -> 2
    assert_eq!(a.owner_changes, 3);
    assert_eq!(a.threads, 2);
    assert_eq!(a.try_failures, 1);
    assert_eq!(a.cond_waits, 1);
    assert_eq!(
        (a.wait_ns.total, a.wait_ns.max, a.wait_ns.avg),
        (100, 60, 50)
    );
    // Holds: 50, 60, 10, 10 (from the condition wait's re-acquisition), 10.
    assert_eq!(
        (a.hold_ns.total, a.hold_ns.max, a.hold_ns.avg),
        (140, 60, 28)
    );
    assert_eq!(a.top_sites.len(), 1);
    assert_eq!(a.top_sites[0].contended, 2);
    assert_eq!(r.totals.locks, 2);
    assert_eq!(r.totals.acquisitions, 5);
    assert_eq!(r.totals.threads, 2);
    assert!(r.errors.is_empty());
}

#[test]
fn a_trace_without_lock_events_says_so() {
    let bytes = trace(vec![(1, vec![malloc(10, 0x1000, 8, 0)])]);
    let r = locks::analyze(&mut cursor(&bytes)).expect("analyze");
    assert!(!r.has_lock_events);
    assert!(locks::render_text(&r).contains("The trace holds no lock events"));
    let r = deadlocks::analyze(&mut cursor(&bytes)).expect("analyze");
    assert!(!r.has_lock_events);
}

#[test]
fn deeply_nested_locks_in_one_order_are_searched_without_blowing_up() {
    // Two threads each hold 60 locks at once, taken in the same order:
    // 1,770 ordered pairs and about 2^60 paths, but no cycle: a search that
    // followed every path would never end.
    let locks: Vec<u64> = (1..=60).map(|i| 0x10_0000 + i * 0x40).collect();
    let nest = |base: u64| {
        let mut v: Vec<Event> = locks
            .iter()
            .enumerate()
            .map(|(i, &l)| lock(base + i as u64, l))
            .collect();
        v.extend(
            locks
                .iter()
                .rev()
                .enumerate()
                .map(|(i, &l)| unlock(base + 100 + i as u64, l)),
        );
        v
    };
    let r = deadlocks_of(vec![(1, nest(100)), (2, nest(1000))]);
    assert_eq!(kinds(&r), Vec::<&str>::new());
    assert_eq!(r.summary.lock_graph_edges, 60 * 59 / 2);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn an_owners_release_of_a_lock_taken_before_the_trace_is_no_error() {
    // A fork child unlocks, in its pthread_atfork handler, what the parent
    // locked before the fork: the agent saw the child named as the owner.
    let r = deadlocks_of(vec![(
        1,
        vec![unlock(100, A), lock(110, A), unlock(120, A)],
    )]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let r = deadlocks_of(vec![(1, vec![foreign_unlock(100, A)])]);
    let kinds: Vec<&str> = r.errors.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["unlock_not_held"]);
}

/// The agent's own time inside a hold, which its release states, is left
/// out of the hold: totals, maximum and average are the program's alone,
/// and the time left out is reported.
#[test]
fn agent_time_inside_holds_is_left_out() {
    let release = |time, agent_ns| {
        Event::Lock(LockEvent::Release {
            time,
            addr: A,
            kind: LockKind::Mutex,
            stack: 0,
            agent_ns,
        })
    };
    let bytes = trace(vec![(
        1,
        vec![
            lock(1_000, A),
            release(3_001_000, 2_000_000),
            lock(4_000_000, A),
            release(4_000_500, 0),
            // Recursive: only the outermost release ends the hold.
            lock(5_000_000, A),
            lock(5_000_100, A),
            release(5_000_200, 999),
            release(6_000_000, 500_000),
        ],
    )]);
    let r = locks::analyze(&mut cursor(&bytes)).expect("analyze");
    let a = &r.locks[0];
    // Holds: 3 ms with 2 ms of the agent's, 500 ns, 1 ms with 0.5 ms.
    assert_eq!(a.agent_ns_in_holds, 2_500_000);
    assert_eq!(
        (a.hold_ns.total, a.hold_ns.max, a.hold_ns.avg),
        (1_500_500, 1_000_000, 500_166)
    );
}

/// A child that took A and ended; its parent then takes A and joins it.
fn join_holding(gate: bool) -> Vec<(u32, Vec<Event>)> {
    let mut parent = vec![create(100, 1), lock(300, A), join(310, 2), unlock(320, A)];
    if gate {
        parent.insert(0, lock(90, G));
        parent.push(unlock(330, G));
    }
    let child = vec![
        start(110, 1, 1),
        lock(120, A),
        unlock(130, A),
        Event::ThreadEnd { time: 200 },
    ];
    vec![(1, parent), (2, child)]
}

#[test]
fn holding_a_lock_while_joining_a_thread_that_took_it_is_a_potential_deadlock() {
    // Also when the parent holds a gate from before the create until the
    // join: the child is kept apart from other holders of G, not from
    // its parent's own join.
    for gate in [false, true] {
        let r = deadlocks_of(join_holding(gate));
        assert_eq!(kinds(&r), ["potential_deadlock"], "gate {gate}");
        let c = &r.cycles[0];
        assert_eq!(c.locks, [A, 0]);
        let steps: Vec<_> = c
            .edges
            .iter()
            .map(|e| {
                (
                    e.thread,
                    e.held_kind,
                    e.requested_kind,
                    e.requested_mode,
                    e.joined,
                )
            })
            .collect();
        assert_eq!(
            steps,
            [
                (1, "mutex", "thread", "join", 2),
                (2, "thread", "mutex", "exclusive", 0),
            ]
        );
        assert_eq!(r.summary.lock_graph_edges, u64::from(gate));
        let text = deadlocks::render_text(&r);
        assert!(
            text.contains("POTENTIAL DEADLOCK #1: 0xa000 -> thread 2 -> 0xa000"),
            "{text}"
        );
    }
    // Joined before the parent takes A: ordered, nothing.
    let parent = vec![create(100, 1), join(300, 2), lock(310, A), unlock(320, A)];
    let child = join_holding(false).remove(1).1;
    let r = deadlocks_of(vec![(1, parent), (2, child)]);
    assert_eq!(kinds(&r), Vec::<&str>::new());
}

#[test]
fn siblings_created_and_joined_under_one_hold_are_not_kept_apart_by_it() {
    let parent = vec![
        lock(90, G),
        create(100, 1),
        create(101, 2),
        join(300, 2),
        join(301, 3),
        unlock(310, G),
    ];
    let first = [vec![start(110, 1, 1)], nested(120, A, B)].concat();
    let second = [vec![start(111, 1, 2)], nested(130, B, A)].concat();
    let end = |t| vec![Event::ThreadEnd { time: t }];
    let r = deadlocks_of(vec![
        (1, parent),
        (2, [first, end(200)].concat()),
        (3, [second, end(201)].concat()),
    ]);
    assert_eq!(kinds(&r), ["potential_deadlock"]);
    assert_eq!(r.cycles[0].locks, [A, B]);
}

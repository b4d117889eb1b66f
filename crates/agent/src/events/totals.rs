//! The agent's own totals for the end-of-run summary (`Event::RunTotals`).
//!
//! When the program ends, `trapline run` prints its allocation calls,
//! releases, errors and peak heap. Computed from the trace, that means
//! decoding and replaying every event: about 3 s after gcc's cc1 (30 M
//! events), 8% of the whole run. The agent sees the same events as it writes
//! them, so it keeps the same counts and writes them just before `End`.
//!
//! They must equal what the replay computes, so they are kept only while one
//! thread, the first to record a heap event, records all of them: the
//! replay then sees them in that thread's program order, which is the order
//! the counts follow. A heap event from any other thread, a fork child (its
//! table holds blocks its trace never allocated), a new trace file after a
//! failed exec, a block the table cannot hold exactly, a lost event or an
//! end by a fatal signal (which may interrupt an update) make them inexact:
//! then nothing is written and the summary replays the trace as before.
//!
//! Only the owning thread writes the counters, with relaxed loads and stores
//! (no read-modify-write on the hot path), before it emits the event they
//! count; the finishing thread reads them after every buffer was collected.

use crate::events::thread::ThreadState;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use trapline_trace::{AllocFn, ErrorKind, RunTotals};

use crate::events::thread::{ROLE_OTHER, ROLE_OWNER};

/// Thread id of the thread that recorded the first heap event (0: none yet).
static OWNER: AtomicU32 = AtomicU32::new(0);
static INEXACT: AtomicBool = AtomicBool::new(false);

/// The counters, in one cache line: the owner touches most of them per event.
#[repr(align(64))]
struct Counters {
    allocation_calls: AtomicU64,
    release_calls: AtomicU64,
    errors: AtomicU64,
    failed_allocations: AtomicU64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    peak_time: AtomicU64,
}

static C: Counters = Counters {
    allocation_calls: AtomicU64::new(0),
    release_calls: AtomicU64::new(0),
    errors: AtomicU64::new(0),
    failed_allocations: AtomicU64::new(0),
    live_bytes: AtomicU64::new(0),
    peak_bytes: AtomicU64::new(0),
    peak_time: AtomicU64::new(0),
};

/// Whether `ts` keeps the totals (claims them on its first heap event).
#[inline]
fn owns(ts: &mut ThreadState) -> bool {
    match ts.heap_role {
        ROLE_OWNER => true,
        ROLE_OTHER => false,
        _ => claim(ts),
    }
}

#[cold]
fn claim(ts: &mut ThreadState) -> bool {
    let owner = match OWNER.compare_exchange(0, ts.tid, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => ts.tid,
        Err(other) => other,
    };
    if owner == ts.tid {
        ts.heap_role = ROLE_OWNER;
        true
    } else {
        INEXACT.store(true, Ordering::Release);
        ts.heap_role = ROLE_OTHER;
        false
    }
}

/// A single-writer increment.
#[inline(always)]
fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

#[inline(always)]
fn sub(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_sub(n),
        Ordering::Relaxed,
    );
}

/// The replay's live set gains a block of `size` at time `time`; `replaced`
/// is the size of a stale entry the table held for the same address. A size
/// the table clamps would later leave with its clamped value.
#[inline(always)]
fn gain(size: u64, replaced: Option<u64>, time: u64) {
    if !crate::tracking::live::exact_size(size) {
        make_inexact();
    }
    let live = C
        .live_bytes
        .load(Ordering::Relaxed)
        .wrapping_add(size)
        .wrapping_sub(replaced.unwrap_or(0));
    C.live_bytes.store(live, Ordering::Relaxed);
    if live > C.peak_bytes.load(Ordering::Relaxed) {
        C.peak_bytes.store(live, Ordering::Relaxed);
        C.peak_time.store(time, Ordering::Relaxed);
    }
}

#[inline(always)]
fn lose(size: u64) {
    sub(&C.live_bytes, size);
}

/// An `Alloc` event at `time` (`replaced`: see `gain`).
#[inline]
pub fn alloc(ts: &mut ThreadState, size: u64, replaced: Option<u64>, time: u64) {
    if owns(ts) {
        add(&C.allocation_calls, 1);
        gain(size, replaced, time);
    }
}

/// A `Free` event; `size` of the block it released from the table.
#[inline]
pub fn free(ts: &mut ThreadState, size: u64) {
    if owns(ts) {
        add(&C.release_calls, 1);
        lose(size);
    }
}

/// A `Realloc` event at `time`: `old` is the size of the block it took out
/// of the table (None if the old address was null or untracked); `new` the
/// size and stale-entry size of the block it put in (None when it freed).
#[inline]
pub fn realloc(ts: &mut ThreadState, old: Option<u64>, new: Option<(u64, Option<u64>)>, time: u64) {
    if owns(ts) {
        add(&C.allocation_calls, 1);
        if let Some(size) = old {
            lose(size);
        }
        if let Some((size, replaced)) = new {
            gain(size, replaced, time);
        }
    }
}

/// An `Error` event for a call of `func`. A mismatch (family, size,
/// alignment) also has its `Free` event (counted there); other erroneous
/// calls appear only here.
#[inline]
pub fn error(ts: &mut ThreadState, func: AllocFn, kind: ErrorKind) {
    if owns(ts) {
        add(&C.errors, 1);
        if !kind.performed() {
            add(
                if func.is_release() {
                    &C.release_calls
                } else {
                    &C.allocation_calls
                },
                1,
            );
        }
    }
}

/// An `AllocFailed` event.
#[inline]
pub fn failed(ts: &mut ThreadState) {
    if owns(ts) {
        add(&C.failed_allocations, 1);
    }
}

/// The totals no longer equal what a replay of this trace file computes.
pub fn make_inexact() {
    INEXACT.store(true, Ordering::Release);
}

/// The totals, if they are exact (read after every buffer was collected,
/// with `events_lost` the end record's count).
pub fn exact(events_lost: u64) -> Option<RunTotals> {
    if INEXACT.load(Ordering::Acquire) || events_lost != 0 {
        return None;
    }
    Some(RunTotals {
        allocation_calls: C.allocation_calls.load(Ordering::Relaxed),
        release_calls: C.release_calls.load(Ordering::Relaxed),
        errors: C.errors.load(Ordering::Relaxed),
        failed_allocations: C.failed_allocations.load(Ordering::Relaxed),
        peak_bytes: C.peak_bytes.load(Ordering::Relaxed),
        peak_time: C.peak_time.load(Ordering::Relaxed),
    })
}

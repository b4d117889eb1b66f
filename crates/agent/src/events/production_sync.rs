//! Production mode's lock recording: what a service can leave on.
//!
//! An uncontended acquisition (the lock looked free and the real call took
//! it) and its release write no event: the thread pushes the lock on its stack of
//! held locks (`held.rs`) and pops it. Three things are recorded, each as
//! the full recording records it, so that `locks` and `deadlocks` read a
//! production trace as any other:
//! - a blocking acquisition made while holding locks, the first time the
//!   thread makes it at this pair of sites (held site, acquired site;
//!   remembered in the thread's pair cache): the holds it is made under,
//!   then the acquisition itself with its stack. That is a lock-order edge.
//! - a contended acquisition: the holds it is made under, the request with
//!   its stack, and the acquisition with its wait. A thread that never gets
//!   the lock leaves the request pending, so a hung run's deadlock shows at
//!   the end of its trace with every lock its threads wait for and hold.
//! - the holds a thread creates another under (guards of its locks);
//! - the release of every hold so recorded (stamped while still held).
//!
//! A hold recorded late is stamped when it is recorded, not when it began:
//! within the hold, so every recorded hold is still a hold in the lock's
//! order, and the lock state the analyses rebuild stays consistent. The
//! held sites' stacks are their caller only (the acquiring call's return
//! address): their frames were gone when the pair was found.

use crate::events::held::Hold;
use crate::events::record::{self, Entry};
use crate::events::sync::{self, CallSite};
use crate::events::thread::{self, ThreadState};
use core::sync::atomic::Ordering;
use trapline_trace::{LockKind, LockMode, LockOp};

// The hot paths use `thread::current_without_allocating` (a lock hook may
// run inside an allocator). The agent's own threads take no pthread lock
// through the hooks, and if one did, its holds would only be tracked:
// `record::enter` records nothing for them. Holds are still tracked after
// recording stopped, and nothing records them either.

fn generation() -> u32 {
    crate::events::buffers::GEN.load(Ordering::Relaxed)
}

/// The kind of the held lock at `addr` (a mutex's type is read now).
fn kind_of(addr: u64, hold: Hold) -> LockKind {
    hold.kind().unwrap_or_else(|| sync::mutex_kind(addr))
}

/// The thread took the lock at `addr` without waiting.
#[inline(always)]
pub fn acquired(addr: u64, hold: Hold, site: CallSite) {
    let ts = thread::current_without_allocating();
    if !ts.held.is_empty()
        && hold.op() == LockOp::Blocking
        && !ts.held.pairs_known(site.ret, generation())
    {
        return new_pairs(addr, hold, site);
    }
    ts.held.push(addr, site.ret, hold);
}

/// A nested acquisition at a pair of sites this thread has not recorded.
#[cold]
#[inline(never)]
fn new_pairs(addr: u64, hold: Hold, site: CallSite) {
    let Entry::Record(ts) = record::enter_without_allocating() else {
        // Inside the agent, or recording stopped: tracked only.
        thread::current_without_allocating()
            .held
            .push(addr, site.ret, hold);
        return;
    };
    record_holds(ts);
    record_acquisition(ts, addr, hold, None, site);
    record::leave(ts);
}

/// Records the acquisition of the lock at `addr` now (it is held) with its
/// stack, and tracks it as recorded.
fn record_acquisition(
    ts: &mut ThreadState,
    addr: u64,
    hold: Hold,
    wait_ns: Option<u64>,
    site: CallSite,
) {
    let (stack, slot) = sync::site_stack(ts, addr, site);
    emit_acquire(ts, addr, slot, hold, wait_ns, stack);
    if hold.op() == LockOp::Blocking {
        ts.held.note_pairs(site.ret, generation());
    }
    if !ts.held.push(addr, site.ret, hold.with_recorded(true)) {
        // Not tracked, so its release would be missed: end it here.
        record_release(ts, addr, hold);
    }
}

/// Records the acquisitions of the locks this thread holds that the trace
/// does not have yet, at their callers.
fn record_holds(ts: &mut ThreadState) {
    for i in 0..ts.held.len() {
        let (addr, ret, hold) = ts.held.get(i);
        if hold.recorded() {
            continue;
        }
        let stack = record::caller_stack(ts, ret);
        emit_acquire(ts, addr, sync::slot_of(addr), hold, None, stack);
        ts.held.set_recorded(i, true);
    }
}

/// Writes the acquisition of the held lock at `addr` (its slot in the
/// per-lock clock: `slot`), stamped now.
fn emit_acquire(
    ts: &mut ThreadState,
    addr: u64,
    slot: u32,
    hold: Hold,
    wait_ns: Option<u64>,
    stack: u32,
) {
    let mode = hold.mode();
    let (kind, op) = (kind_of(addr, hold), hold.op());
    let t = sync::stamp(ts, slot, mode == LockMode::Exclusive);
    ts.emit(Some(t), |e, c| {
        e.lock_acquire(c, t, addr, kind, mode, op, wait_ns, stack)
    });
}

fn record_release(ts: &mut ThreadState, addr: u64, hold: Hold) {
    let kind = kind_of(addr, hold);
    let t = sync::stamp(ts, sync::slot_of(addr), hold.mode() == LockMode::Exclusive);
    ts.emit(Some(t), |e, c| e.lock_release(c, t, addr, kind, 0, 0));
}

/// The thread is about to release the lock at `addr` (it still holds it).
#[inline(always)]
pub fn releasing(addr: u64) {
    if let Some(hold) = thread::current_without_allocating().held.pop(addr) {
        if hold.recorded() {
            released_recorded(addr, hold);
        }
    }
}

#[cold]
#[inline(never)]
fn released_recorded(addr: u64, hold: Hold) {
    // Recorded even from inside the agent (whose own code takes no
    // pthread lock): the trace has its acquisition.
    record_release(thread::current_without_allocating(), addr, hold);
}

/// A condition wait is about to release the mutex at `addr`; it holds it
/// again when the wait returns (untracked by the trace until recorded anew).
pub fn cond_waiting(addr: u64) {
    let ts = thread::current_without_allocating();
    let Some(i) = ts.held.position(addr) else {
        return;
    };
    let (_, _, hold) = ts.held.get(i);
    if hold.recorded() {
        ts.held.set_recorded(i, false);
        released_recorded(addr, hold);
    }
}

/// The thread creates another: the locks it holds are recorded, since the
/// new thread runs under them until they are released (a gate lock held
/// through create and join orders the child's locks).
pub fn creating_thread() {
    if thread::current_without_allocating().held.is_empty() {
        return;
    }
    if let Entry::Record(ts) = record::enter_without_allocating() {
        record_holds(ts);
        record::leave(ts);
    }
}

/// The lock is busy and the thread is about to wait for it: its holds and
/// the request are recorded.
#[cold]
#[inline(never)]
pub fn requesting(addr: u64, kind: LockKind, mode: LockMode, site: CallSite) {
    let Entry::Record(ts) = record::enter_without_allocating() else {
        return;
    };
    record_holds(ts);
    sync::request_in(ts, addr, kind, mode, site);
    record::leave(ts);
}

/// The thread got the lock after waiting `wait_ns` for it.
#[cold]
#[inline(never)]
pub fn acquired_after_wait(addr: u64, hold: Hold, wait_ns: u64, site: CallSite) {
    match record::enter_without_allocating() {
        Entry::Record(ts) => {
            record_acquisition(ts, addr, hold, Some(wait_ns), site);
            record::leave(ts);
        }
        Entry::Nested(ts) => {
            ts.held.push(addr, site.ret, hold);
        }
        Entry::Off => {}
    }
}

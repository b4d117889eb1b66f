//! What the lock hooks record: time stamps ordered per lock, call-site stack
//! ids from a per-thread cache, compact events, and the misuse found at the
//! time of the call.
//!
//! The budget is a few tens of nanoseconds per lock+unlock pair, so the
//! uncontended path never unwinds: a lock event's stack id comes from a
//! direct-mapped per-thread cache keyed by (lock, return address, stack
//! pointer); only a miss captures the stack (through the validated unwind
//! cache, like an allocation). The clock is the shared tick, made strictly
//! increasing per lock by a table of per-lock last times written while the
//! lock is held (see `stamp`), so that every lock's history merges across
//! threads in its true order. Requests, failures and misuse are stamped in
//! the same order (`stamp_side`), so that a lock's init and destroy sort
//! on the right side of every call the C library saw between them.

use crate::events::record::{self, Entry};
use crate::events::thread::{Site, ThreadState};
use crate::platform::arch::StartRegs;
use crate::platform::clock;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use trapline_trace::{Event, LockEvent, LockKind, LockMisuse, LockMode, LockOp};

// ---------------------------------------------------------------------------
// Per-lock clock.

const LOCK_SLOTS: usize = 1 << 16;
const MAX_PROBES: usize = 32;

struct LockSlot {
    addr: AtomicU64,
    last_time: AtomicU64,
    /// The exclusive holder's `agent_ns_in_holds` when it acquired the
    /// lock, and its tid (a release by another thread has no mark).
    agent_mark: AtomicU64,
    mark_tid: AtomicU32,
    /// The latest time stamped beside the holds (`stamp_side`). Only ever
    /// raised (`fetch_max`): the holders' plain stores to `last_time`
    /// cannot lower it. Init and destroy stamp after it.
    side_time: AtomicU64,
}

/// Open-addressed by lock address; entries are never removed (a destroyed
/// lock's slot serves whatever lives at that address next). Slot 0 is the
/// shared fallback when a probe sequence is full.
static LOCKS: [LockSlot; LOCK_SLOTS] = [const {
    LockSlot {
        addr: AtomicU64::new(0),
        last_time: AtomicU64::new(0),
        agent_mark: AtomicU64::new(0),
        mark_tid: AtomicU32::new(0),
        side_time: AtomicU64::new(0),
    }
}; LOCK_SLOTS];

#[inline]
pub(crate) fn slot_of(addr: u64) -> u32 {
    let mut i = ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize;
    for _ in 0..MAX_PROBES {
        i = (i % (LOCK_SLOTS - 1)) + 1;
        let s = &LOCKS[i];
        let a = s.addr.load(Ordering::Relaxed);
        if a == addr {
            return i as u32;
        }
        if a == 0 {
            match s
                .addr
                .compare_exchange(0, addr, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return i as u32,
                Err(now) if now == addr => return i as u32,
                Err(_) => {}
            }
        }
        i += 1;
    }
    0
}

/// The time of an event on lock `addr`, strictly after every earlier event
/// on it and not before this thread's previous event.
///
/// `exclusive`: the caller holds the lock exclusively, so no other thread
/// stamps it concurrently and a plain load and store suffice; the lock's own
/// acquire/release ordering carries the value to its next holder. Shared
/// holders (rwlock readers) and the fallback slot use a compare-and-swap.
#[inline(always)]
pub(crate) fn stamp(ts: &mut ThreadState, slot: u32, exclusive: bool) -> u64 {
    let base = clock::tick().max(ts.last_time);
    let t = if exclusive && slot != 0 {
        let slot = &LOCKS[slot as usize];
        let t = base.max(slot.last_time.load(Ordering::Relaxed) + 1);
        slot.last_time.store(t, Ordering::Relaxed);
        t
    } else {
        let slot = &LOCKS[slot as usize];
        let mut last = slot.last_time.load(Ordering::Relaxed);
        loop {
            let t = base.max(last + 1);
            match slot.last_time.compare_exchange_weak(
                last,
                t,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break t,
                Err(now) => last = now,
            }
        }
    };
    ts.last_time = t;
    t
}

/// The time of an event beside the holds of the lock in `slot` (a request,
/// a failed attempt, misuse): after every event stamped on the lock before
/// (its last init or destroy in particular: the call saw the lock as that
/// left it), and before its next init or destroy (`stamp_lifetime`), which
/// the program orders after this call by whatever means it has, atomics
/// included. It does not write `last_time`: a holder may be stamping it
/// with a plain store at this moment and would lower it again.
pub(crate) fn stamp_side(ts: &mut ThreadState, slot: u32) -> u64 {
    let s = &LOCKS[slot as usize];
    let t = clock::tick()
        .max(ts.last_time)
        .max(s.last_time.load(Ordering::Relaxed) + 1);
    s.side_time.fetch_max(t, Ordering::Relaxed);
    ts.last_time = t;
    t
}

/// The time of an init or destroy of the lock in `slot`: strictly after
/// every event on it the program ordered before, holds and side events
/// alike. Stamped after the real init returned (the lock exists from then
/// on) and before the real destroy (it ceases to exist then), so that no
/// call another thread makes on the live lock sorts outside its lifetime.
fn stamp_lifetime(ts: &mut ThreadState, slot: u32) -> u64 {
    let side = LOCKS[slot as usize].side_time.load(Ordering::Relaxed);
    ts.last_time = ts.last_time.max(side + 1);
    stamp(ts, slot, false)
}

// ---------------------------------------------------------------------------
// Call-site stacks (each thread's cache: thread::SiteCache).

use crate::events::thread::{SiteCache, SiteSlot, SITE_SLOTS};

/// Where a hook was called from: the caller's return address and stack
/// pointer at the call, handed over in registers by the hook's trampoline.
#[derive(Clone, Copy)]
pub struct CallSite {
    pub ret: u64,
    pub sp: u64,
}

/// The stack id of a lock operation at `site`, and the lock's slot in
/// `LOCKS`: cached per (lock, return address, stack pointer), captured and
/// looked up on a miss.
#[inline(always)]
pub(crate) fn site_stack(ts: &mut ThreadState, lock: u64, site: CallSite) -> (u32, u32) {
    let gen = crate::events::buffers::GEN.load(Ordering::Relaxed);
    let h = (lock ^ site.ret.rotate_left(21) ^ site.sp.rotate_left(43))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let i = (h >> 56) as usize % SITE_SLOTS;
    if let Some(c) = ts.lock_sites.as_ref() {
        let s = &c.slots[i];
        if s.lock == lock && s.ret == site.ret && s.sp == site.sp && s.gen == gen {
            ts.entered_stack = s.id;
            return (s.id, s.lock_slot);
        }
    }
    site_stack_miss(ts, lock, site, i, gen)
}

/// Captures the stack from here: the agent's own frames (this function, the
/// hook) are cut by the capture, what remains starts at the program's call.
#[cold]
#[inline(never)]
fn site_stack_miss(
    ts: &mut ThreadState,
    lock: u64,
    site: CallSite,
    i: usize,
    gen: u32,
) -> (u32, u32) {
    let id = record::capture_stack(ts, crate::platform::arch::start_regs(), Site::Alloc);
    let lock_slot = slot_of(lock);
    let cache = ts.lock_sites.get_or_insert_with(SiteCache::new);
    cache.slots[i] = SiteSlot {
        lock,
        ret: site.ret,
        sp: site.sp,
        id,
        gen,
        lock_slot,
    };
    (id, lock_slot)
}

// ---------------------------------------------------------------------------
// Events.

/// Runs `f` with this thread's state if it records; hooks pass through otherwise.
#[inline(always)]
fn recording(f: impl FnOnce(&mut ThreadState)) {
    if !crate::config::locks_recorded() {
        return;
    }
    if let Entry::Record(ts) = record::enter_without_allocating() {
        f(ts);
        record::leave(ts);
    }
}

/// The tid of the thread that is forking (set in the prepare handler).
static FORKING_TID: AtomicU32 = AtomicU32::new(0);
/// In a fork child: the tid its thread had in the parent. glibc's mutexes
/// locked before the fork (typically by pthread_atfork handlers) still name
/// that tid as their owner.
static OWNER_BEFORE_FORK: AtomicU32 = AtomicU32::new(0);

extern "C" fn fork_prepare() {
    FORKING_TID.store(current_tid(), Ordering::Relaxed);
}

extern "C" fn fork_child() {
    OWNER_BEFORE_FORK.store(FORKING_TID.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Registers the fork handlers that let a child recognize its own locks.
pub fn register_fork_handlers() {
    // SAFETY: registering plain functions.
    unsafe { libc::pthread_atfork(Some(fork_prepare), None, Some(fork_child)) };
}

/// Whether glibc's owner field names this thread (or, in a fork child, the
/// thread it was in the parent).
#[inline(always)]
fn owned_by(ts: &ThreadState, owner: u32) -> bool {
    owner == ts.tid || (owner != 0 && owner == OWNER_BEFORE_FORK.load(Ordering::Relaxed))
}

/// The type of the mutex at `addr`, from glibc's kind word.
#[inline]
pub fn mutex_kind(addr: u64) -> LockKind {
    let m = addr as *const u8;
    // SAFETY: `m` is a mutex the C library just operated on; the kind word
    // lies inside it and is only written by pthread_mutex_init.
    let k = unsafe {
        core::ptr::read_volatile(
            m.add(crate::platform::arch::MUTEX_KIND_OFFSET)
                .cast::<i32>(),
        )
    };
    LockKind::of_glibc_mutex(k)
}

/// This thread's kernel tid, as the agent cached it (no system call).
pub fn current_tid() -> u32 {
    crate::events::thread::current_without_allocating().tid
}

/// The lock is now held by this thread.
#[inline(always)]
pub fn acquired(
    addr: u64,
    kind: LockKind,
    mode: LockMode,
    op: LockOp,
    wait_ns: Option<u64>,
    site: CallSite,
) {
    recording(|ts| {
        let (stack, slot) = site_stack(ts, addr, site);
        let exclusive = mode == LockMode::Exclusive;
        let t = stamp(ts, slot, exclusive);
        start_hold(ts, slot, exclusive);
        ts.emit(Some(t), |e, c| {
            e.lock_acquire(c, t, addr, kind, mode, op, wait_ns, stack)
        });
    });
}

/// The thread is about to release the lock (stamped while still holding it).
/// `exclusive` is false for an rwlock, whose unlock may release a read hold.
/// `owner`: the holder the lock itself names (mutexes); when that is this
/// thread the release needs no stack (only an unlock by a non-holder, an
/// error, is reported with one), which keeps the common path short.
#[inline(always)]
pub fn releasing(addr: u64, kind: LockKind, exclusive: bool, owner: Option<u32>, site: CallSite) {
    recording(|ts| {
        let (stack, slot) = match owner {
            Some(o) if owned_by(ts, o) => (0, slot_of(addr)),
            _ => site_stack(ts, addr, site),
        };
        let t = stamp(ts, slot, exclusive);
        let agent_ns = end_hold(ts, slot, exclusive);
        ts.emit(Some(t), |e, c| {
            e.lock_release(c, t, addr, kind, stack, agent_ns)
        });
    });
}

// ---------------------------------------------------------------------------
// Agent time inside holds.
//
// A program that allocates while holding a lock (sqlite3 under its
// allocator's mutex) holds it through the agent's allocation hook too. The
// hooks a thread enters while it holds a lock add their time, on the event
// clock's tick, to the thread's `agent_ns_in_holds` (`record::enter` and
// `leave`); an exclusive hold marks that sum in the lock's slot when it
// starts, and its release writes the difference, which `trapline locks`
// leaves out of the hold.

/// A hold of the lock in `slot` starts now (its acquisition was stamped).
#[inline(always)]
fn start_hold(ts: &mut ThreadState, slot: u32, exclusive: bool) {
    if ts.hook_tick != crate::events::thread::NOT_TIMING {
        // The hook so far belongs to the holds already under way.
        record::fold_hook_time(ts);
    } else {
        ts.hook_tick = clock::tick();
    }
    ts.locks_held += 1;
    if exclusive && slot != 0 {
        let s = &LOCKS[slot as usize];
        s.agent_mark.store(ts.agent_ns_in_holds, Ordering::Relaxed);
        s.mark_tid.store(ts.tid, Ordering::Relaxed);
    }
}

/// The hold of the lock in `slot` ends now: the agent's time inside it
/// (0 for read holds and holds this thread did not mark).
#[inline(always)]
fn end_hold(ts: &mut ThreadState, slot: u32, exclusive: bool) -> u64 {
    if ts.hook_tick == crate::events::thread::NOT_TIMING {
        // A release with no hold recorded (acquired before the trace).
        return 0;
    }
    record::fold_hook_time(ts);
    ts.locks_held = ts.locks_held.saturating_sub(1);
    if ts.locks_held == 0 {
        ts.hook_tick = crate::events::thread::NOT_TIMING;
    }
    if !exclusive || slot == 0 {
        return 0;
    }
    let s = &LOCKS[slot as usize];
    if s.mark_tid.load(Ordering::Relaxed) != ts.tid {
        return 0;
    }
    ts.agent_ns_in_holds
        .saturating_sub(s.agent_mark.load(Ordering::Relaxed))
}

/// Records `make(time, stack)` with the cached stack of `site` and a time
/// in the lock's order (`stamp_side`).
fn at_site(addr: u64, site: CallSite, make: impl FnOnce(u64, u32) -> LockEvent) {
    recording(|ts| at_site_in(ts, addr, site, make));
}

/// `at_site` for a caller that already holds the thread's state.
fn at_site_in(
    ts: &mut ThreadState,
    addr: u64,
    site: CallSite,
    make: impl FnOnce(u64, u32) -> LockEvent,
) {
    let (stack, slot) = site_stack(ts, addr, site);
    let time = stamp_side(ts, slot);
    emit_event(ts, make(time, stack));
}

/// Records `make(time, stack)` with a full capture from `regs` (rare events)
/// and the time `time_of` gives.
fn captured(
    regs: StartRegs,
    time_of: impl FnOnce(&mut ThreadState) -> u64,
    make: impl FnOnce(u64, u32) -> LockEvent,
) {
    recording(|ts| {
        let stack = record::capture_stack(ts, regs, Site::Alloc);
        let time = time_of(ts);
        let ev = make(time, stack);
        let flush = matches!(
            ev,
            LockEvent::Misuse {
                misuse: LockMisuse::SelfDeadlock,
                ..
            }
        );
        emit_event(ts, ev);
        if flush {
            ts.flush();
        }
    });
}

/// The lock is busy and the thread is about to wait for it.
pub fn requesting(addr: u64, kind: LockKind, mode: LockMode, site: CallSite) {
    recording(|ts| request_in(ts, addr, kind, mode, site));
}

/// `requesting` for a caller that already holds the thread's state.
pub(crate) fn request_in(
    ts: &mut ThreadState,
    addr: u64,
    kind: LockKind,
    mode: LockMode,
    site: CallSite,
) {
    at_site_in(ts, addr, site, |time, stack| LockEvent::Request {
        time,
        addr,
        kind,
        mode,
        stack,
    });
}

/// An attempt that did not acquire the lock.
pub fn failed(addr: u64, kind: LockKind, mode: LockMode, op: LockOp, errno: i32, site: CallSite) {
    at_site(addr, site, |time, stack| LockEvent::Failed {
        time,
        addr,
        kind,
        mode,
        op,
        errno,
        stack,
    });
}

/// Misuse seen at the call, stamped in the lock's order. A self-deadlock is
/// about to block forever: the thread's events are handed to the writer
/// first (`captured`), so the trace holds them even if the program is then
/// killed with SIGKILL.
pub fn misuse(addr: u64, kind: LockKind, misuse: LockMisuse, errno: i32, regs: StartRegs) {
    let in_lock_order = |ts: &mut ThreadState| stamp_side(ts, slot_of(addr));
    captured(regs, in_lock_order, |time, stack| LockEvent::Misuse {
        time,
        addr,
        kind,
        misuse,
        errno,
        stack,
    });
}

/// pthread_*_init and pthread_*_destroy, stamped in the lock's order
/// (`stamp_lifetime`).
pub fn lifetime(addr: u64, kind: LockKind, init: bool, regs: StartRegs) {
    let in_lock_order = |ts: &mut ThreadState| stamp_lifetime(ts, slot_of(addr));
    captured(regs, in_lock_order, |time, stack| {
        if init {
            LockEvent::Init {
                time,
                addr,
                kind,
                stack,
            }
        } else {
            LockEvent::Destroy {
                time,
                addr,
                kind,
                stack,
            }
        }
    });
}

/// pthread_join returned for thread `joined` (tid, 0 if unknown). Its time
/// is precise, like the joined thread's ThreadEnd, so it sorts after it.
pub fn joined(joined: u32, regs: StartRegs) {
    captured(regs, ThreadState::next_precise_time, |time, stack| {
        LockEvent::Join {
            time,
            joined,
            stack,
        }
    });
}

/// pthread_join of thread `joined` (0 if not yet started) begins: the
/// thread may wait for it (a deadlock through join shows at the end of a
/// hung trace).
pub fn join_waiting(joined: u32, regs: StartRegs) {
    captured(regs, ThreadState::next_precise_time, |time, stack| {
        LockEvent::JoinWait {
            time,
            joined,
            stack,
        }
    });
}

/// pthread_detach of thread `detached`.
pub fn detached(detached: u32) {
    recording(|ts| {
        let time = ts.next_time();
        emit_event(ts, LockEvent::Detach { time, detached });
    });
}

/// The thread calls pthread_exit.
pub fn exiting(regs: StartRegs) {
    captured(regs, ThreadState::next_time, |time, stack| {
        LockEvent::Exit { time, stack }
    });
}

pub(crate) fn emit_event(ts: &mut ThreadState, ev: LockEvent) {
    let time = ev.time();
    let ev = Event::Lock(ev);
    ts.emit(Some(time), |e, c| e.event(c, &ev));
}

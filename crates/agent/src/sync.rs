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
//! threads in its true order.

use crate::arch::StartRegs;
use crate::record::{self, Entry};
use crate::thread::{Site, ThreadState};
use crate::{clock, writer};
use core::sync::atomic::{AtomicU64, Ordering};
use trapline_trace::{Event, LockEvent, LockKind, LockMisuse, LockMode, LockOp};

// ---------------------------------------------------------------------------
// Per-lock clock.

const LOCK_SLOTS: usize = 1 << 16;
const MAX_PROBES: usize = 32;

struct LockSlot {
    addr: AtomicU64,
    last_time: AtomicU64,
}

/// Open-addressed by lock address; entries are never removed (a destroyed
/// lock's slot serves whatever lives at that address next). Slot 0 is the
/// shared fallback when a probe sequence is full.
static LOCKS: [LockSlot; LOCK_SLOTS] = [const {
    LockSlot {
        addr: AtomicU64::new(0),
        last_time: AtomicU64::new(0),
    }
}; LOCK_SLOTS];

#[inline]
fn slot_of(addr: u64) -> &'static LockSlot {
    let mut i = ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize;
    for _ in 0..MAX_PROBES {
        i = (i % (LOCK_SLOTS - 1)) + 1;
        let s = &LOCKS[i];
        let a = s.addr.load(Ordering::Relaxed);
        if a == addr {
            return s;
        }
        if a == 0 {
            match s
                .addr
                .compare_exchange(0, addr, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return s,
                Err(now) if now == addr => return s,
                Err(_) => {}
            }
        }
        i += 1;
    }
    &LOCKS[0]
}

/// The time of an event on lock `addr`, strictly after every earlier event
/// on it and not before this thread's previous event.
///
/// `exclusive`: the caller holds the lock exclusively, so no other thread
/// stamps it concurrently and a plain load and store suffice; the lock's own
/// acquire/release ordering carries the value to its next holder. Shared
/// holders (rwlock readers) and the fallback slot use a compare-and-swap.
#[inline]
fn stamp(ts: &mut ThreadState, addr: u64, exclusive: bool) -> u64 {
    let slot = slot_of(addr);
    let base = clock::tick().max(ts.last_time);
    let t = if exclusive && !core::ptr::eq(slot, &LOCKS[0]) {
        let t = base.max(slot.last_time.load(Ordering::Relaxed) + 1);
        slot.last_time.store(t, Ordering::Relaxed);
        t
    } else {
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

/// A time on this thread only (events that order nothing across threads).
fn thread_time(ts: &mut ThreadState) -> u64 {
    let t = clock::tick().max(ts.last_time);
    ts.last_time = t;
    t
}

// ---------------------------------------------------------------------------
// Call-site stacks.

const SITE_SLOTS: usize = 256;

#[derive(Clone, Copy, Default)]
struct SiteSlot {
    lock: u64,
    ret: u64,
    sp: u64,
    id: u32,
    /// Trace generation whose file holds the stack's definition.
    gen: u32,
}

/// One thread's cache of lock call sites.
pub struct SiteCache {
    slots: [SiteSlot; SITE_SLOTS],
}

impl SiteCache {
    pub fn new() -> Box<SiteCache> {
        Box::new(SiteCache {
            slots: [SiteSlot::default(); SITE_SLOTS],
        })
    }
}

/// Where a hook was called from: the caller's return address (read by the
/// hook's trampoline) and the hook's registers (for a capture).
#[derive(Clone, Copy)]
pub struct CallSite {
    pub ret: u64,
    pub regs: StartRegs,
}

/// The stack id of a lock operation at `site`: cached per (lock, return
/// address, stack pointer), captured on a miss.
#[inline]
fn site_stack(ts: &mut ThreadState, lock: u64, site: CallSite) -> u32 {
    let gen = writer::GEN.load(Ordering::Relaxed);
    let sp = site.regs.sp;
    let h =
        (lock ^ site.ret.rotate_left(21) ^ sp.rotate_left(43)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let i = (h >> 56) as usize % SITE_SLOTS;
    if let Some(c) = ts.lock_sites.as_ref() {
        let s = &c.slots[i];
        if s.lock == lock && s.ret == site.ret && s.sp == sp && s.gen == gen {
            return s.id;
        }
    }
    site_stack_miss(ts, lock, site, i, gen)
}

#[cold]
fn site_stack_miss(ts: &mut ThreadState, lock: u64, site: CallSite, i: usize, gen: u32) -> u32 {
    let id = capture(ts, site.regs);
    let cache = ts.lock_sites.get_or_insert_with(SiteCache::new);
    cache.slots[i] = SiteSlot {
        lock,
        ret: site.ret,
        sp: site.regs.sp,
        id,
        gen,
    };
    id
}

/// A full stack capture, its definition written to the trace.
fn capture(ts: &mut ThreadState, regs: StartRegs) -> u32 {
    let cap = ts.capture(regs, Site::Alloc);
    record::ensure_stack(ts, cap.id, cap.new);
    cap.id
}

// ---------------------------------------------------------------------------
// Events.

/// Runs `f` with this thread's state if it records; hooks pass through otherwise.
#[inline]
fn recording(f: impl FnOnce(&mut ThreadState)) {
    if let Entry::Record(ts) = record::enter() {
        f(ts);
        record::leave(ts);
    }
}

/// The lock is now held by this thread.
#[inline]
pub fn acquired(
    addr: u64,
    kind: LockKind,
    mode: LockMode,
    op: LockOp,
    wait_ns: Option<u64>,
    site: CallSite,
) {
    recording(|ts| {
        let stack = site_stack(ts, addr, site);
        let t = stamp(ts, addr, mode == LockMode::Exclusive);
        ts.emit(Some(t), |e, c| {
            e.lock_acquire(c, t, addr, kind, mode, op, wait_ns, stack)
        });
    });
}

/// The thread is about to release the lock (stamped while still holding it).
/// `exclusive` is false for an rwlock, whose unlock may release a read hold.
#[inline]
pub fn releasing(addr: u64, kind: LockKind, exclusive: bool, site: CallSite) {
    recording(|ts| {
        let stack = site_stack(ts, addr, site);
        let t = stamp(ts, addr, exclusive);
        ts.emit(Some(t), |e, c| e.lock_release(c, t, addr, kind, stack));
    });
}

/// The lock is busy and the thread is about to wait for it.
pub fn requesting(addr: u64, kind: LockKind, mode: LockMode, site: CallSite) {
    recording(|ts| {
        let stack = site_stack(ts, addr, site);
        let time = thread_time(ts);
        emit_event(
            ts,
            LockEvent::Request {
                time,
                addr,
                kind,
                mode,
                stack,
            },
        );
    });
}

/// An attempt that did not acquire the lock.
pub fn failed(addr: u64, kind: LockKind, mode: LockMode, op: LockOp, errno: i32, site: CallSite) {
    recording(|ts| {
        let stack = site_stack(ts, addr, site);
        let time = thread_time(ts);
        emit_event(
            ts,
            LockEvent::Failed {
                time,
                addr,
                kind,
                mode,
                op,
                errno,
                stack,
            },
        );
    });
}

/// Misuse seen at the call. A self-deadlock is about to block forever: the
/// thread's events are handed to the writer first, so the trace holds them
/// even if the program is then killed with SIGKILL.
pub fn misuse(addr: u64, kind: LockKind, misuse: LockMisuse, errno: i32, regs: StartRegs) {
    recording(|ts| {
        let stack = capture(ts, regs);
        let time = thread_time(ts);
        emit_event(
            ts,
            LockEvent::Misuse {
                time,
                addr,
                kind,
                misuse,
                errno,
                stack,
            },
        );
        if misuse == LockMisuse::SelfDeadlock {
            ts.flush();
        }
    });
}

/// pthread_*_init and pthread_*_destroy.
pub fn lifetime(addr: u64, kind: LockKind, init: bool, regs: StartRegs) {
    recording(|ts| {
        let stack = capture(ts, regs);
        let time = stamp(ts, addr, false);
        let ev = if init {
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
        };
        emit_event(ts, ev);
    });
}

/// pthread_join returned for thread `joined` (tid, 0 if unknown).
pub fn joined(joined: u32, regs: StartRegs) {
    recording(|ts| {
        let stack = capture(ts, regs);
        // Precise, like the joined thread's ThreadEnd, so it sorts after it.
        let time = clock::precise_now().max(ts.last_time);
        ts.last_time = time;
        emit_event(
            ts,
            LockEvent::Join {
                time,
                joined,
                stack,
            },
        );
    });
}

/// pthread_detach of thread `detached`.
pub fn detached(detached: u32) {
    recording(|ts| {
        let time = thread_time(ts);
        emit_event(ts, LockEvent::Detach { time, detached });
    });
}

/// The thread calls pthread_exit.
pub fn exiting(regs: StartRegs) {
    recording(|ts| {
        let stack = capture(ts, regs);
        let time = thread_time(ts);
        emit_event(ts, LockEvent::Exit { time, stack });
    });
}

fn emit_event(ts: &mut ThreadState, ev: LockEvent) {
    let time = ev.time();
    let ev = Event::Lock(ev);
    ts.emit(Some(time), |e, c| e.event(c, &ev));
}

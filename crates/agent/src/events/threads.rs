//! Thread lifecycle events: which thread created which (`ThreadCreate` in the
//! creator before pthread_create, `ThreadStart` first in the child) and when
//! each ended (`ThreadEnd`). Analyses derive happens-before from them (a
//! child's events follow everything its creator did before creating it), and
//! per-thread subsystems hook their setup and teardown here.

use crate::events::record::{self, Entry};
use crate::events::thread::{Site, ThreadState};
use crate::platform::arch::StartRegs;
use crate::platform::lock::RawLock;
use crate::platform::sys;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU64, Ordering};
use std::collections::HashMap;
use trapline_trace::Event;

/// Numbers pthread_create calls; 0 means "not recorded".
static NEXT_CREATE_ID: AtomicU64 = AtomicU64::new(1);

/// pthread_t -> kernel tid of the threads started through the agent's wrapper.
/// A pthread_t is reused after join; the newest thread overwrites the entry.
struct TidMap {
    lock: RawLock,
    map: UnsafeCell<Option<HashMap<libc::pthread_t, u32>>>,
}
// SAFETY: `map` is only accessed with `lock` held.
unsafe impl Sync for TidMap {}
static TIDS: TidMap = TidMap {
    lock: RawLock::new(),
    map: UnsafeCell::new(None),
};

/// In the creating thread, just before the real pthread_create: records
/// `ThreadCreate` with the caller's stack and returns its id for the child.
pub fn on_create(regs: StartRegs) -> u64 {
    let create_id = NEXT_CREATE_ID.fetch_add(1, Ordering::Relaxed);
    if let Entry::Record(ts) = record::enter() {
        let stack = record::capture_stack(ts, regs, Site::Alloc);
        let t = ts.next_precise_time();
        let ev = Event::ThreadCreate {
            time: t,
            create_id,
            stack,
        };
        ts.emit(Some(t), |e, c| e.event(c, &ev));
        record::leave(ts);
    }
    create_id
}

/// In the new thread, before its start routine; `started` runs once the
/// thread's state exists, before its `ThreadStart` is recorded.
pub fn on_thread_begin(
    parent_tid: u32,
    create_id: u64,
    provision: crate::events::thread::Provision,
    started: impl FnOnce(),
) {
    let tid = sys::gettid();
    {
        let _g = TIDS.lock.guard();
        // SAFETY: guarded by the lock.
        let map = unsafe { &mut *TIDS.map.get() };
        // The agent's heap backs this map, never the program's.
        map.get_or_insert_with(HashMap::new)
            // SAFETY: pthread_self has no preconditions.
            .insert(unsafe { libc::pthread_self() }, tid);
    }
    let ts = crate::events::thread::begin(provision);
    ts.counted_running = true;
    started();
    if let Entry::Record(ts) = record::enter() {
        let t = ts.next_precise_time();
        let ev = Event::ThreadStart {
            time: t,
            parent_tid,
            create_id,
        };
        ts.emit(Some(t), |e, c| e.event(c, &ev));
        record::leave(ts);
    }
}

/// From the thread's pthread-key destructor (every exit path), before its
/// buffer is queued. The guard is already held by the caller.
pub fn on_thread_end(ts: &mut ThreadState) {
    let t = ts.next_precise_time();
    ts.emit(Some(t), |e, c| e.event(c, &Event::ThreadEnd { time: t }));
}

/// The kernel tid of a thread started through pthread_create while traced.
pub fn tid_of(thread: libc::pthread_t) -> Option<u32> {
    let _g = TIDS.lock.guard();
    // SAFETY: guarded by the lock.
    let map = unsafe { &*TIDS.map.get() };
    map.as_ref()?.get(&thread).copied()
}

/// The kernel tid of a thread that has not ended or been joined, from the
/// C library: `pthread_getcpuclockid` encodes it in the thread's CPU clock
/// id (`~tid << 3 | 6`, Linux's per-thread scheduler clock), read from the
/// descriptor the C library filled before pthread_create returned. For a
/// thread joined before it has run its first instruction (and registered).
pub fn kernel_tid(thread: libc::pthread_t) -> Option<u32> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` is the caller's live thread handle; `clock` is ours.
    if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 || clock & 7 != 6 {
        return None;
    }
    u32::try_from(!(clock >> 3)).ok().filter(|&t| t != 0)
}

/// Fork child: the lock was taken by `lock` in the parent.
pub fn reset_in_child() {
    TIDS.lock.reset();
    // The threads other threads were starting are not in the child.
    starting_args::clear();
}

/// Fork prepare: no thread may be inside the map while the process is copied.
pub fn lock() {
    TIDS.lock.lock();
}

/// Fork parent: undo `lock`.
pub fn unlock() {
    TIDS.lock.unlock();
}

/// Arguments of threads being started, from the program's `pthread_create`
/// until the new thread calls the start routine. The agent's wrapper keeps
/// the argument in its own heap (`hooks/threads.rs`), which the scan does
/// not read, where the C library would keep it in the new thread's
/// descriptor, a root: a thread not yet started at exit had its argument
/// called definitely lost. The scan reads this table as a root instead.
pub mod starting_args {
    use core::sync::atomic::{AtomicU64, Ordering};

    /// Threads that may be starting at once; one more starts unheld (its
    /// argument may then be judged lost while it starts).
    const SLOTS: usize = 4096;
    static HELD: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
    /// Arguments held now: the scan skips the table when none is (it is
    /// 32 KiB a short-lived process would read for nothing).
    static COUNT: AtomicU64 = AtomicU64::new(0);

    /// Holds `arg` for a thread being started; the slot to give to `release`.
    pub fn hold(arg: u64, hint: u64) -> Option<usize> {
        if arg == 0 {
            return None;
        }
        COUNT.fetch_add(1, Ordering::AcqRel);
        let slot = (0..SLOTS)
            .map(|k| (hint as usize).wrapping_add(k) % SLOTS)
            .find(|&i| {
                HELD[i]
                    .compare_exchange(0, arg, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
        if slot.is_none() {
            COUNT.fetch_sub(1, Ordering::AcqRel);
        }
        slot
    }

    /// The started thread holds its argument itself now.
    pub fn release(slot: Option<usize>) {
        if let Some(i) = slot {
            HELD[i].store(0, Ordering::Release);
            COUNT.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets every argument (a fork child: only the forking thread is copied,
    /// and it was not inside pthread_create).
    pub fn clear() {
        if COUNT.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        for slot in &HELD {
            slot.store(0, Ordering::Relaxed);
        }
    }

    /// Calls `f` with every argument held.
    pub fn for_each(mut f: impl FnMut(u64)) {
        if COUNT.load(Ordering::Acquire) == 0 {
            return;
        }
        for slot in &HELD {
            let arg = slot.load(Ordering::Acquire);
            if arg != 0 {
                f(arg);
            }
        }
    }
}

//! Production mode (`trapline run --production`): what the allocation hooks
//! do when a service leaves the agent on.
//!
//! An allocation the sampler does not pick (nearly all: about one per
//! `sample_bytes` allocated is picked, as `--sample` picks them) costs only
//! thread-local work: its function's call and byte counters, the sampler's
//! countdown, and one load from the filter of sampled blocks
//! (`tracking/sampled.rs`) to see whether its address was a sampled
//! block's lately. No event, no table, no lock, no unwind. A release costs
//! its counter and the filter's load; only a release the filter cannot
//! clear looks in the live table, which holds the sampled blocks alone.
//!
//! A sampled block is recorded as in a full recording: its full stack,
//! size and time, an `Alloc` event, and a `Free` event at its release.
//! Its double and invalid releases are found while its release is among
//! the latest 256 sampled ones remembered (a release of an unsampled
//! block is the allocator's to check).
//!
//! The calls are counted per thread (`call_counts.rs`).

use crate::events::record::{self, Entry};
use crate::events::thread::{self, Site, ThreadState};
use crate::platform::arch::StartRegs;
use crate::platform::clock;
use crate::tracking::live::{self, Block, Freed};
use crate::tracking::sampled;
use trapline_trace::{AllocFn, Event};

/// The state of a program thread whose calls production mode sees: None
/// for the agent's own threads and once recording stopped.
#[inline(always)]
fn program_thread() -> Option<&'static mut ThreadState> {
    if crate::phase::recording_stopped() {
        return None;
    }
    let ts = thread::current();
    (!ts.agent_thread).then_some(ts)
}

/// Whether the thread is outside the agent: a call from inside it (the
/// agent's own C library calls, which a full recording does not count
/// either, or a signal handler's) is neither counted nor sampled.
#[inline(always)]
fn outside_agent(ts: &ThreadState) -> bool {
    ts.guard == 0
}

/// A program thread outside the agent, in production mode while it
/// records: the state of the thread whose call a fast path may pass on,
/// in two loads and no call.
#[inline(always)]
fn fast_path_thread() -> Option<&'static mut ThreadState> {
    if !crate::config::production() || crate::phase::recording_stopped() {
        return None;
    }
    thread::current_if_set_up().filter(|ts| !ts.agent_thread && outside_agent(ts))
}

/// Before the call: an allocation of `size` bytes by `func` that the
/// sampler does not pick is counted here and needs nothing after the call
/// but `forget_if_released_lately` (true). False: the call goes the way of
/// `alloc`.
#[inline(always)]
pub fn passes_unsampled(func: AllocFn, size: u64) -> bool {
    let Some(ts) = fast_path_thread() else {
        return false;
    };
    if !ts.sampler.passes(size) {
        return false;
    }
    ts.call_counts.count(func, size);
    true
}

/// Before the call: a release by `func` of `addr` that the filter proves
/// unsampled is counted here and passed on by the hook (true). False: the
/// call goes the way of `free` (NULL too: a full recording does not count
/// it).
#[inline(always)]
pub fn release_passes(func: AllocFn, addr: u64) -> bool {
    if addr == 0 || sampled::may_be_sampled(addr) {
        return false;
    }
    let Some(ts) = fast_path_thread() else {
        return false;
    };
    ts.call_counts.count(func, 0);
    true
}

/// An allocation by `func` that returned `addr` (not NULL) for `size`
/// bytes.
#[inline(always)]
pub fn alloc(func: AllocFn, addr: u64, size: u64, align: u64, regs: StartRegs) {
    let Some(ts) = program_thread() else {
        return;
    };
    if sampled::may_be_freed(addr) {
        forget_release(addr);
    }
    if !outside_agent(ts) {
        return;
    }
    ts.call_counts.count(func, size);
    if ts.sampler.takes_stack(size, crate::config::sample_bytes()) {
        sampled_alloc(func, addr, size, align, regs);
    }
}

/// An allocation `passes_unsampled` passed failed: it is taken back, so
/// that the call goes the way of a failed one (`record::alloc`).
#[cold]
#[inline(never)]
pub fn unpass(func: AllocFn, size: u64) {
    if let Some(ts) = thread::current_if_set_up() {
        ts.call_counts.uncount(func, size);
        ts.sampler.unpass(size);
    }
}

/// After an unsampled allocation at `addr`: if that was a sampled block's
/// address released lately, the release is forgotten (so the new block's
/// release is not taken for a second one).
#[inline(always)]
pub fn forget_if_released_lately(addr: u64) {
    if addr != 0 && sampled::may_be_freed(addr) {
        forget_release(addr);
    }
}

/// The address of a sampled block released lately was allocated again.
#[cold]
#[inline(never)]
fn forget_release(addr: u64) {
    live::shard_of(addr).locked().forget_sampled_free(addr);
}

#[cold]
#[inline(never)]
fn sampled_alloc(func: AllocFn, addr: u64, size: u64, align: u64, regs: StartRegs) {
    let Entry::Record(ts) = record::enter() else {
        return;
    };
    let stack = record::capture_stack_then(ts, regs, Site::Alloc, || live::prefetch(addr));
    if live::storable(addr) {
        insert_sampled(ts, addr, size, func, align, stack);
        let t = ts.last_time;
        ts.emit(Some(t), |e, c| {
            e.alloc(c, t, addr, size, align, func, stack)
        });
    }
    record::leave(ts);
}

/// Enters a sampled block in the table and the filter, stamping the
/// thread's time.
fn insert_sampled(
    ts: &mut ThreadState,
    addr: u64,
    size: u64,
    func: AllocFn,
    align: u64,
    stack: u32,
) {
    let mut shard = live::shard_of(addr).locked();
    let t = shard.stamp(clock::tick(), ts.last_time);
    shard.insert(addr, Block::allocated(size, func, stack, align));
    sampled::live_added(addr);
    drop(shard);
    ts.last_time = t;
}

/// Production mode starts with the blocks the C library handed out before
/// the agent read its options (recorded as a full recording records them,
/// without a stack: the unwinder was not ready): their releases are looked
/// for as a sampled block's are, so that none is left listed once freed.
pub fn adopt_earlier_blocks() {
    for shard in live::shards() {
        shard.locked().for_each(|addr, _| sampled::live_added(addr));
    }
}

/// A release of `addr` by `func`; returns whether to pass it on.
#[inline(always)]
pub fn free(func: AllocFn, addr: u64, stated: record::Stated, regs: StartRegs) -> bool {
    let Some(ts) = program_thread() else {
        return true;
    };
    if outside_agent(ts) {
        ts.call_counts.count(func, 0);
    }
    // A nested release of a sampled block is deferred there.
    if !sampled::may_be_sampled(addr) {
        return true;
    }
    record::free_stating_recorded(func, addr as *mut u8, stated, regs)
}

/// jemalloc's `xallocx` in production mode: counted, and passed on (a
/// sampled block resized in place keeps the size it was recorded with).
pub fn resize_in_place(func: AllocFn, size: usize, real: impl FnOnce() -> usize) -> usize {
    if let Some(ts) = program_thread().filter(|ts| outside_agent(ts)) {
        ts.call_counts.count(func, size as u64);
    }
    real()
}

/// realloc and its kin in production mode: `real` resizes.
#[inline(always)]
pub fn realloc(
    func: AllocFn,
    old: *mut u8,
    size: usize,
    regs: StartRegs,
    real: impl FnOnce(*mut u8) -> *mut u8,
) -> *mut u8 {
    let Some(ts) = program_thread() else {
        return real(old);
    };
    let outside = outside_agent(ts);
    if outside {
        ts.call_counts.count(func, size as u64);
    }
    let old_addr = old as u64;
    let old_may_be_sampled = old_addr != 0 && sampled::may_be_sampled(old_addr);
    let take = outside
        && ts
            .sampler
            .takes_stack(size as u64, crate::config::sample_bytes());
    if !old_may_be_sampled && !take {
        let p = real(old);
        if !p.is_null() && sampled::may_be_freed(p as u64) {
            forget_release(p as u64);
        }
        return p;
    }
    sampled_realloc(func, old, size, regs, take, real)
}

#[cold]
#[inline(never)]
fn sampled_realloc(
    func: AllocFn,
    old: *mut u8,
    size: usize,
    regs: StartRegs,
    take: bool,
    real: impl FnOnce(*mut u8) -> *mut u8,
) -> *mut u8 {
    let old_addr = old as u64;
    let ts = match record::enter() {
        Entry::Record(ts) => ts,
        // A nested call: the table may be locked by this very thread.
        Entry::Nested(ts) => return record::realloc_nested(ts, old, size, real),
        Entry::Off => return real(old),
    };
    let stack = if take {
        record::capture_stack(ts, regs, Site::Alloc)
    } else {
        0
    };
    let mut old_block = None;
    if old_addr != 0 {
        let mut shard = live::shard_of(old_addr).locked();
        old_block = shard.remove(old_addr);
        match old_block {
            Some(b) => {
                shard.remember_free(Freed {
                    addr: old_addr,
                    size: b.size,
                    func: b.func as u8,
                    alloc_stack: b.stack,
                    free_stack: 0,
                });
                shard.sampled_released(old_addr);
                ts.last_time = shard.stamp(clock::tick(), ts.last_time);
            }
            None if shard.sampled_freed(old_addr) => {
                let stack = record::capture_stack(ts, regs, Site::Free);
                let pass = record::report_invalid_realloc(ts, shard, func, old_addr, stack);
                record::leave(ts);
                return if pass {
                    real(old)
                } else {
                    core::ptr::null_mut()
                };
            }
            None => {}
        }
    }
    let p = real(old);
    let new_addr = p as u64;
    if p.is_null() && size != 0 {
        // Failed: the old block is untouched, and still sampled.
        if let Some(b) = old_block {
            let mut shard = live::shard_of(old_addr).locked();
            shard.forget_sampled_free(old_addr);
            shard.insert(old_addr, b);
            sampled::live_added(old_addr);
        }
        record::leave(ts);
        return p;
    }
    if new_addr != 0 && sampled::may_be_freed(new_addr) {
        forget_release(new_addr);
    }
    let new_sampled = take && new_addr != 0 && live::storable(new_addr);
    if new_sampled {
        insert_sampled(ts, new_addr, size as u64, func, 0, stack);
    }
    let t = ts.last_time;
    match (old_block.is_some(), new_sampled) {
        // From the trace's point of view: a block resized, a block
        // released, or a new block (an unsampled one resized).
        (true, true) | (false, true) => ts.emit(Some(t), |e, c| {
            e.event(
                c,
                &Event::Realloc {
                    time: t,
                    old_addr: if old_block.is_some() { old_addr } else { 0 },
                    new_addr,
                    size: size as u64,
                    func,
                    stack,
                },
            )
        }),
        (true, false) => ts.emit(Some(t), |e, c| e.free(c, t, old_addr, func, 0)),
        (false, false) => {}
    }
    record::leave(ts);
    p
}

//! Production mode's filter of sampled blocks: tells a release of a block
//! the agent did not sample (nearly all of them) from one it did, with one
//! byte load from an 8 KiB map that stays in cache whatever the heap's size.
//!
//! Each address hashes to one of 32,768 slots. A slot has two counts, kept
//! apart from the map and touched only off the hot path: the sampled blocks
//! live at addresses of that slot, and those released lately (kept in
//! their shard's ring of sampled releases,
//! `live::Locked::remember_sampled_free`, so that a second release of one
//! is a double free). The map holds two bits per slot, each set while its
//! count is not 0. A release whose slot has neither bit set is certainly of
//! no sampled block and goes straight to the allocator; any other is looked
//! up in the live table (a false positive costs only that lookup). An
//! allocation whose slot has the released bit drops its address from the
//! ring: the address is live again, and a release of it is no double free.
//!
//! A slot's counts and bits change together under one of 64 striped locks,
//! so a bit is never clear while its count is not 0 (two threads changing
//! one slot for addresses of different shards would race otherwise). A
//! count that is not taken back (a release while nested in the agent) only
//! sends later calls of its slot down the slow path.
//!
//! Why a map of bits: the first filter, 16-bit counts read on the hot path
//! (64 KiB), missed the L1 cache on about a third of perl's calls
//! (cachegrind); the map is an eighth of that. Why a filter at all: a tag in
//! a block's spare trailing bytes needs spare bytes, which glibc's 24-byte
//! blocks lack, and a set of the sampled addresses is what the live table
//! already is.

use crate::platform::lock::SpinLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, Ordering};

const SLOT_BITS: u32 = 15;
const SLOTS: usize = 1 << SLOT_BITS;
const LIVE: u8 = 1;
const FREED: u8 = 2;
const STRIPES: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU8 = AtomicU8::new(0);
/// Two bits per slot, four slots per byte: 8 KiB.
static MAP: [AtomicU8; SLOTS / 4] = [ZERO; SLOTS / 4];

/// Per slot: (live count, released count), under the slot's stripe lock.
struct Counts(UnsafeCell<[(u16, u16); SLOTS]>);
// SAFETY: a slot's counts are only touched with its stripe's lock held.
unsafe impl Sync for Counts {}
static COUNTS: Counts = Counts(UnsafeCell::new([(0, 0); SLOTS]));
#[allow(clippy::declare_interior_mutable_const)]
const UNLOCKED: SpinLock = SpinLock::new();
static STRIPE_LOCKS: [SpinLock; STRIPES] = [UNLOCKED; STRIPES];

#[inline(always)]
fn slot(addr: u64) -> usize {
    // Multiply-shift: every address bit reaches the slot number.
    (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOT_BITS)) as usize
}

/// The slot's two bits.
#[inline(always)]
fn bits(addr: u64) -> u8 {
    let s = slot(addr);
    (MAP[s / 4].load(Ordering::Relaxed) >> ((s % 4) * 2)) & (LIVE | FREED)
}

/// Whether a release of `addr` may be of a sampled block (live, or
/// released lately): false is certain.
#[inline(always)]
pub fn may_be_sampled(addr: u64) -> bool {
    bits(addr) != 0
}

/// Whether an allocation returning `addr` may reuse the address of a
/// sampled block released lately (which it must then forget).
#[inline(always)]
pub fn may_be_freed(addr: u64) -> bool {
    bits(addr) & FREED != 0
}

/// Changes a count of `addr`'s slot by `delta` (saturating, never below
/// 0) and its bit with it.
fn change(addr: u64, released: bool, delta: i32) {
    let s = slot(addr);
    let lock = &STRIPE_LOCKS[s % STRIPES];
    lock.lock();
    // SAFETY: slot `s` is only touched with stripe `s % STRIPES` locked.
    let counts = unsafe { &mut (*COUNTS.0.get())[s] };
    let count = if released {
        &mut counts.1
    } else {
        &mut counts.0
    };
    if *count != u16::MAX {
        *count = (i32::from(*count) + delta).clamp(0, i32::from(u16::MAX)) as u16;
    }
    let bit = if released { FREED } else { LIVE } << ((s % 4) * 2);
    if *count != 0 {
        MAP[s / 4].fetch_or(bit, Ordering::Relaxed);
    } else {
        MAP[s / 4].fetch_and(!bit, Ordering::Relaxed);
    }
    lock.unlock();
}

/// A sampled block is live at `addr` (before the program has the block).
pub fn live_added(addr: u64) {
    change(addr, false, 1);
}

/// The sampled block at `addr` was released.
pub fn live_removed(addr: u64) {
    change(addr, false, -1);
}

/// The shard's ring of sampled releases took `addr` in.
pub fn freed_added(addr: u64) {
    change(addr, true, 1);
}

/// The shard's ring of sampled releases let `addr` go.
pub fn freed_removed(addr: u64) {
    change(addr, true, -1);
}

/// Fork child: a stripe lock held by a thread that is gone is free again.
pub fn reset_locks_in_child() {
    for l in &STRIPE_LOCKS {
        l.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bits follow their counts: a release is never taken for one of no
    /// sampled block while a sampled block is live at its address.
    #[test]
    fn bits_follow_their_counts() {
        let a = 0x7f00_0000_1230u64;
        assert!(!may_be_sampled(a));
        live_added(a);
        assert!(may_be_sampled(a) && !may_be_freed(a));
        live_removed(a);
        freed_added(a);
        assert!(may_be_sampled(a) && may_be_freed(a));
        freed_removed(a);
        assert!(!may_be_sampled(a));
        for _ in 0..3 {
            live_added(a);
        }
        for _ in 0..2 {
            live_removed(a);
        }
        assert!(may_be_sampled(a), "one block is still live");
        live_removed(a);
        live_removed(a);
        assert!(!may_be_sampled(a), "a count never goes below 0");
        live_added(a);
        assert!(may_be_sampled(a));
    }
}

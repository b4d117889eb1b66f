//! Production mode's filter of sampled blocks: tells a release of a block
//! the agent did not sample (nearly all of them) from one it did, with one
//! load from a 64 KiB table that stays in cache whatever the heap's size.
//!
//! Each address hashes to one 16-bit counter: the low byte counts the
//! sampled blocks live at addresses of that slot, the high byte those
//! released lately (kept in their shard's ring of sampled releases,
//! `live::Locked::remember_sampled_free`, so that a second release of one
//! is a double free). A release whose counter is 0 is certainly of no
//! sampled block and goes straight to the allocator; any other is looked
//! up in the live table (a false positive costs only that lookup). An
//! allocation whose counter has a released count drops its address from
//! the ring: the address is live again, and a release of it is no double
//! free.
//!
//! Counters are changed under the shard lock of their address (so a slot's
//! changes for one address are ordered) with atomic adds, since addresses
//! of different shards share slots. A count never goes below what its
//! blocks need: a count at 255 stays there (it costs speed, never a missed
//! release), and a count that is not taken back (a release while nested in
//! the agent) only sends later releases of its slot down the slow path.
//!
//! Why a filter: a tag in a block's spare trailing bytes needs spare
//! bytes, which glibc's 24-byte blocks lack; and a set of the sampled
//! addresses is what the live table already is: the filter keeps the
//! releases of unsampled blocks out of it.

use core::sync::atomic::{AtomicU16, Ordering};

/// Counters of the filter: 64 KiB.
const SLOTS: usize = 1 << 15;
const LIVE_ONE: u16 = 1;
const FREED_ONE: u16 = 1 << 8;
const FREED: u16 = 0xff00;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU16 = AtomicU16::new(0);
static FILTER: [AtomicU16; SLOTS] = [ZERO; SLOTS];

#[inline(always)]
fn slot(addr: u64) -> &'static AtomicU16 {
    // Multiply-shift: every address bit reaches the slot number.
    &FILTER[(addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 15)) as usize]
}

/// Whether a release of `addr` may be of a sampled block (live, or
/// released lately): false is certain.
#[inline(always)]
pub fn may_be_sampled(addr: u64) -> bool {
    slot(addr).load(Ordering::Relaxed) != 0
}

/// Whether an allocation returning `addr` may reuse the address of a
/// sampled block released lately (which it must then forget).
#[inline(always)]
pub fn may_be_freed(addr: u64) -> bool {
    slot(addr).load(Ordering::Relaxed) & FREED != 0
}

/// Adds `one` to `addr`'s counter, unless its byte is saturated.
fn add(addr: u64, one: u16) {
    let _ = slot(addr).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        ((v / one) & 0xff != 0xff).then_some(v + one)
    });
}

/// Takes `one` off `addr`'s counter, unless its byte is saturated or 0.
fn sub(addr: u64, one: u16) {
    let _ = slot(addr).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        let n = (v / one) & 0xff;
        (n != 0xff && n != 0).then(|| v - one)
    });
}

/// A sampled block is live at `addr` (under its shard's lock, before the
/// program has the block).
pub fn live_added(addr: u64) {
    add(addr, LIVE_ONE);
}

/// The sampled block at `addr` was released (under its shard's lock).
pub fn live_removed(addr: u64) {
    sub(addr, LIVE_ONE);
}

/// The shard's ring of sampled releases took `addr` in.
pub fn freed_added(addr: u64) {
    add(addr, FREED_ONE);
}

/// The shard's ring of sampled releases let `addr` go.
pub fn freed_removed(addr: u64) {
    sub(addr, FREED_ONE);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts go up and down with their blocks, and a saturated count
    /// stays: a release is never taken for one of no sampled block while
    /// a sampled block is live at its address.
    #[test]
    fn counts_follow_their_blocks_and_saturate_safely() {
        let a = 0x7f00_0000_1230u64;
        assert!(!may_be_sampled(a));
        live_added(a);
        assert!(may_be_sampled(a) && !may_be_freed(a));
        live_removed(a);
        freed_added(a);
        assert!(may_be_sampled(a) && may_be_freed(a));
        freed_removed(a);
        assert!(!may_be_sampled(a));
        for _ in 0..300 {
            live_added(a);
        }
        for _ in 0..300 {
            live_removed(a);
        }
        assert!(may_be_sampled(a), "a saturated count must stay");
        assert!(!may_be_freed(a));
    }
}

//! Replaying allocations and releases: which blocks are live, and how much
//! the heap was used. Fed with the events of all threads in time order (see
//! [`crate::index`]); its memory is one entry per live block.
//!
//! The live blocks are kept in [`AddrTable`], open-addressing tables of
//! `(address, value)` pairs with no per-entry overhead: 16 bytes per slot when
//! only sizes are needed (`stats`), 24 when the allocation function and stack
//! are kept too (`leaks`, which needs them for a trace without exit snapshot).
//! A table grows by half when it is 80% full, so a live block costs 1.25 to
//! 1.9 slots (20 to 30 bytes for `stats`, 30 to 45 for `leaks`); the map is
//! split into 128 tables so that growing one briefly doubles only its own
//! share.

use trapline_trace::{AllocFn, Event};

use crate::report::HeapUsage;

/// What the replay keeps per live block.
pub(crate) trait LiveValue: Copy + Default {
    /// The value of a block allocated with these arguments.
    fn new(size: u64, func: AllocFn, stack: u32) -> Self;
    /// The block's size in bytes.
    fn size(&self) -> u64;
    /// The block's allocation stack (0 when not kept).
    fn stack(&self) -> u32 {
        0
    }
}

/// Only the size: all that the run's summary needs.
impl LiveValue for u64 {
    fn new(size: u64, _: AllocFn, _: u32) -> Self {
        size
    }

    fn size(&self) -> u64 {
        *self
    }
}

/// A live block with its allocation function and stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub size: u64,
    pub stack: u32,
    pub func: AllocFn,
}

impl Default for Block {
    fn default() -> Self {
        Block::new(0, AllocFn::Malloc, 0)
    }
}

impl LiveValue for Block {
    fn new(size: u64, func: AllocFn, stack: u32) -> Self {
        Block { size, stack, func }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn stack(&self) -> u32 {
        self.stack
    }
}

/// A map from address to value, split into [`SHARDS`] open-addressing
/// tables by the top bits of the address's hash. The split bounds what growth
/// costs: a table that grows holds its old and its new slots at once, and
/// that is one shard's worth, not the whole map's (which would be 2.5 times
/// its size for a moment, with millions of live blocks).
pub(crate) struct AddrTable<V> {
    shards: Vec<Shard<V>>,
    /// Entries in all shards and `zero`.
    len: usize,
    /// The value at address 0, the empty-slot marker of the shards (only a
    /// damaged or synthetic trace can hold it).
    zero: Option<V>,
}

/// Number of shards of an [`AddrTable`].
const SHARDS: usize = 128;

/// Hashes an address: the multiplication moves every bit into the high bits.
fn hash(addr: u64) -> u64 {
    (addr ^ (addr >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<V: Copy + Default> Default for AddrTable<V> {
    fn default() -> Self {
        AddrTable {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: 0,
            zero: None,
        }
    }
}

impl<V: Copy + Default> AddrTable<V> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    fn shard(&mut self, addr: u64) -> &mut Shard<V> {
        // The top 7 bits pick the shard; the home slot uses the bits below.
        &mut self.shards[(hash(addr) >> 57) as usize]
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&mut self, addr: u64, value: V) -> Option<V> {
        let old = match addr {
            0 => self.zero.replace(value),
            _ => self.shard(addr).insert(addr, value),
        };
        self.len += usize::from(old.is_none());
        old
    }

    /// Removes and returns the value of `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<V> {
        let old = match addr {
            0 => self.zero.take(),
            _ => self.shard(addr).remove(addr),
        };
        self.len -= usize::from(old.is_some());
        old
    }

    /// Every entry, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.shards
            .iter()
            .flat_map(|s| s.slots.iter())
            .filter(|(addr, _)| *addr != 0)
            .map(|(_, v)| v)
            .chain(self.zero.iter())
    }
}

/// One open-addressing table of nonzero addresses: linear probing,
/// backward-shift deletion (no tombstones, so lookups do not degrade with
/// churn), any capacity (the home slot is a multiply-shift of the hash).
struct Shard<V> {
    slots: Vec<(u64, V)>,
    len: usize,
}

/// Slots of a table's first allocation.
const MIN_SLOTS: usize = 64;

impl<V: Copy + Default> Default for Shard<V> {
    fn default() -> Self {
        Shard {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<V: Copy + Default> Shard<V> {
    /// The home slot of `addr` in a table of `cap` slots: the hash's bits
    /// below the shard bits, reduced to the range by a multiplication (the
    /// high bits of the product), so aligned addresses spread evenly.
    fn home(addr: u64, cap: usize) -> usize {
        let h = hash(addr) << 7;
        ((u128::from(h) * cap as u128) >> 64) as usize
    }

    fn insert(&mut self, addr: u64, value: V) -> Option<V> {
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.grow();
        }
        let cap = self.slots.len();
        let mut i = Self::home(addr, cap);
        loop {
            let slot = &mut self.slots[i];
            if slot.0 == addr {
                return Some(std::mem::replace(&mut slot.1, value));
            }
            if slot.0 == 0 {
                *slot = (addr, value);
                self.len += 1;
                return None;
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    fn remove(&mut self, addr: u64) -> Option<V> {
        let cap = self.slots.len();
        if cap == 0 {
            return None;
        }
        let mut i = Self::home(addr, cap);
        loop {
            let key = self.slots[i].0;
            if key == addr {
                break;
            }
            if key == 0 {
                return None;
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
        let removed = self.slots[i].1;
        self.len -= 1;
        // Backward shift: move later entries of the run into the hole when
        // their home slot allows it, so that no lookup stops early.
        let mut hole = i;
        let mut j = i;
        loop {
            j += 1;
            if j == cap {
                j = 0;
            }
            let key = self.slots[j].0;
            if key == 0 {
                break;
            }
            let home = Self::home(key, cap);
            // The entry may move to the hole when the hole lies between its
            // home slot and where it is now (cyclically).
            let back = |from: usize| if j >= from { j - from } else { j + cap - from };
            if back(home) >= back(hole) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].0 = 0;
        Some(removed)
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() + self.slots.len() / 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![(0, V::default()); cap]);
        for (addr, value) in old {
            if addr != 0 {
                self.place(addr, value);
            }
        }
    }

    /// Puts an entry known to be absent into a table with room.
    fn place(&mut self, addr: u64, value: V) {
        let cap = self.slots.len();
        let mut i = Self::home(addr, cap);
        while self.slots[i].0 != 0 {
            i += 1;
            if i == cap {
                i = 0;
            }
        }
        self.slots[i] = (addr, value);
    }
}

/// The heap as the recorded events built it.
pub(crate) struct HeapReplay<V> {
    /// Live blocks by address.
    pub live: AddrTable<V>,
    /// Sum of the live blocks' sizes.
    pub live_bytes: u64,
    /// Blocks allocated and released, bytes requested.
    pub usage: HeapUsage,
}

impl<V: Copy + Default> Default for HeapReplay<V> {
    fn default() -> Self {
        HeapReplay {
            live: AddrTable::default(),
            live_bytes: 0,
            usage: HeapUsage::default(),
        }
    }
}

impl<V: LiveValue> HeapReplay<V> {
    /// Applies one event (all but Alloc, Free and Realloc are ignored).
    ///
    /// A realloc with `old_addr` 0 only allocates; one with `new_addr` 0 and
    /// size 0 (realloc(p, 0)) only releases; one with `new_addr` 0 and a size
    /// failed and leaves the old block alone; any other releases the old block
    /// and allocates the new one (possibly at the same address).
    #[inline]
    pub fn apply(&mut self, ev: &Event) {
        self.apply_observed(ev, |_, _| {});
    }

    /// As `apply`, calling `changed(block, true)` for each block allocated
    /// and `changed(block, false)` for each live block released.
    #[inline]
    pub fn apply_observed(&mut self, ev: &Event, mut changed: impl FnMut(&V, bool)) {
        match *ev {
            Event::Alloc {
                addr,
                size,
                func,
                stack,
                ..
            } => self.allocate(addr, V::new(size, func, stack), &mut changed),
            Event::Free { addr, .. } => self.release(addr, &mut changed),
            Event::Realloc {
                old_addr,
                new_addr,
                size,
                func,
                stack,
                ..
            } => {
                if new_addr == 0 && size != 0 {
                    return;
                }
                if old_addr != 0 {
                    self.release(old_addr, &mut changed);
                }
                if new_addr != 0 {
                    self.allocate(new_addr, V::new(size, func, stack), &mut changed);
                }
            }
            _ => {}
        }
    }

    fn allocate(&mut self, addr: u64, block: V, changed: &mut impl FnMut(&V, bool)) {
        self.usage.allocs += 1;
        self.usage.bytes_allocated += block.size();
        // An address still live means its release was not recorded.
        if let Some(old) = self.live.insert(addr, block) {
            self.live_bytes -= old.size();
            changed(&old, false);
        }
        self.live_bytes += block.size();
        changed(&block, true);
    }

    fn release(&mut self, addr: u64, changed: &mut impl FnMut(&V, bool)) {
        self.usage.frees += 1;
        if let Some(old) = self.live.remove(addr) {
            self.live_bytes -= old.size();
            changed(&old, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A small deterministic generator (xorshift).
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn table_agrees_with_a_hash_map_under_churn() {
        let mut table: AddrTable<u64> = AddrTable::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut s = 0x1234_5678_9abc_def1;
        for round in 0..200_000u64 {
            // Few distinct addresses (some 0), so that runs collide and wrap.
            let addr = (next(&mut s) % 3000) * 16;
            if next(&mut s) % 3 == 1 {
                assert_eq!(table.remove(addr), model.remove(&addr), "round {round}");
            } else {
                assert_eq!(
                    table.insert(addr, round),
                    model.insert(addr, round),
                    "round {round}"
                );
            }
            assert_eq!(table.len(), model.len());
        }
        for (&addr, &v) in &model {
            assert_eq!(table.remove(addr), Some(v));
        }
        assert_eq!(table.len(), 0);
        assert_eq!(table.values().count(), 0);
    }

    #[test]
    fn values_lists_every_entry() {
        let mut table: AddrTable<u64> = AddrTable::default();
        for a in 0..1000u64 {
            table.insert(a * 16, a);
        }
        let mut v: Vec<u64> = table.values().copied().collect();
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}

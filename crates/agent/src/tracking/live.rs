//! The live table: every block the program holds, with its size, allocation
//! function and stack, plus a ring of recently freed blocks per shard so a
//! double free can name the first free.
//!
//! 64 shards, each an open-addressing table (linear probing, backward-shift
//! deletion, no tombstones) under its own lock. An entry is 24 bytes: the
//! address shifted right by 3 (allocators align blocks to 8 bytes at least:
//! glibc to 16, jemalloc, tcmalloc and mimalloc their 8-byte ones to 8)
//! with the high bits of the stack id on top, and size / function / low
//! stack bits, and the block's birth to the millisecond (a watcher's ages).
//! Tables grow by half when 80% full (any size: slots are picked by
//! multiply-shift, not by a mask), so the load stays between 53% and 80%
//! and a live block costs 30 to 45 bytes of table.

use crate::platform::lock::SpinLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicUsize, Ordering};
use trapline_trace::AllocFn;

pub const SHARDS: usize = 64;
/// Entries of a shard's ring of recent releases at first; it doubles, up
/// to `FREED_RING_MAX`, while `FREED_GROWTH` (entries for all shards
/// together) lasts. Shards hold whole 64 KiB chunks, so a program whose
/// heap is a few chunks releases into a few shards only: with fixed rings
/// of 512 its double frees more than a few thousand releases apart were
/// taken for invalid frees (with rings by address hash, 32,768 apart). The
/// growth budget lets two or three busy shards reach 32,768 entries (2 MiB
/// more in all, at most).
const FREED_RING: usize = 512;
const FREED_RING_MAX: usize = 32768;
static FREED_GROWTH: AtomicUsize = AtomicUsize::new(65536);

const SIZE_BITS: u32 = 38;
/// Sizes from this up are kept as this (a block of 256 GiB or more).
pub const MAX_SIZE: u64 = (1 << SIZE_BITS) - 1;
const FUNC_BITS: u32 = 6;
const STACK_LO_BITS: u32 = 64 - SIZE_BITS - FUNC_BITS; // 20
/// Addresses are kept divided by 8, the least alignment of a block.
const ALIGN_SHIFT: u32 = 3;
const ADDR_BITS: u32 = 48 - ALIGN_SHIFT;

/// What the agent knows about a live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    pub func: AllocFn,
    pub stack: u32,
    /// The alignment a C++ aligned `new` asked for, which its aligned
    /// `delete` must give again (0: none; a power of two). Not in the
    /// scan's copies of the table (`Packed`).
    pub align: u64,
}

impl Block {
    /// The block an allocation by `func` made: only C++'s aligned forms
    /// are held to the alignment they asked for.
    pub fn allocated(size: u64, func: AllocFn, stack: u32, align: u64) -> Block {
        Block {
            size,
            func,
            stack,
            align: if func.cxx_aligned() { align } else { 0 },
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Entry {
    key: u64, // 0 = empty
    meta: u64,
    /// When the block was recorded, in units of `BORN_SHIFT` (the age a
    /// watcher asks for; it wraps after 52 days).
    born: u32,
    /// log2 of `Block::align`, plus one (0: none): in the entry's padding.
    align_log: u8,
}

/// Birth times are kept in units of 2^20 ns (1.05 ms).
pub const BORN_SHIFT: u32 = 20;

fn pack(addr: u64, b: Block) -> Entry {
    let size = b.size.min((1 << SIZE_BITS) - 1);
    let stack = u64::from(b.stack);
    let stack_lo = stack & ((1 << STACK_LO_BITS) - 1);
    let stack_hi = stack >> STACK_LO_BITS;
    Entry {
        key: key_of(addr) | (stack_hi << ADDR_BITS),
        meta: size | (u64::from(b.func as u8) << SIZE_BITS) | (stack_lo << (SIZE_BITS + FUNC_BITS)),
        born: 0,
        align_log: if b.align.is_power_of_two() {
            b.align.trailing_zeros() as u8 + 1
        } else {
            0
        },
    }
}

fn unpack(e: Entry) -> (u64, Block) {
    let (addr, mut block) = unpack_parts(e.key, e.meta);
    if e.align_log != 0 {
        block.align = 1 << (e.align_log - 1);
    }
    (addr, block)
}

fn unpack_parts(key: u64, meta: u64) -> (u64, Block) {
    let e = Entry {
        key,
        meta,
        ..Entry::default()
    };
    let addr = addr_of(e);
    let stack_hi = e.key >> ADDR_BITS;
    let size = e.meta & ((1 << SIZE_BITS) - 1);
    let func = AllocFn::from_u8(((e.meta >> SIZE_BITS) & ((1 << FUNC_BITS) - 1)) as u8)
        .unwrap_or(AllocFn::Malloc);
    let stack_lo = e.meta >> (SIZE_BITS + FUNC_BITS);
    (
        addr,
        Block {
            size,
            func,
            stack: ((stack_hi << STACK_LO_BITS) | stack_lo) as u32,
            align: 0,
        },
    )
}

/// The key bits of an address (the table holds exact addresses: an
/// interior pointer never matches its block).
#[inline(always)]
fn key_of(addr: u64) -> u64 {
    addr >> ALIGN_SHIFT
}

/// The address an entry holds.
#[inline(always)]
fn addr_of(e: Entry) -> u64 {
    (e.key & ((1 << ADDR_BITS) - 1)) << ALIGN_SHIFT
}

#[inline]
fn hash(addr: u64) -> u64 {
    key_of(addr).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The home slot of an address in a table of `n` slots.
#[inline]
fn home(addr: u64, n: usize) -> usize {
    ((u128::from(hash(addr).rotate_left(32)) * n as u128) >> 64) as usize
}

#[inline]
fn next(i: usize, n: usize) -> usize {
    if i + 1 == n {
        0
    } else {
        i + 1
    }
}

/// Whether a block size is kept exactly (larger ones are clamped).
#[inline]
pub fn exact_size(size: u64) -> bool {
    size < 1 << SIZE_BITS
}

/// Whether an address can be kept in the table (8-byte aligned, below 2^48:
/// the blocks of glibc, jemalloc, tcmalloc and mimalloc always can).
#[inline]
pub fn storable(addr: u64) -> bool {
    addr != 0 && addr & ((1 << ALIGN_SHIFT) - 1) == 0 && addr >> 48 == 0
}

/// The shard an address belongs to.
#[inline]
pub fn shard_of(addr: u64) -> &'static Shard {
    &TABLE[(((addr >> SHARD_CHUNK_SHIFT) ^ (addr >> SHARD_REGION_SHIFT)) & (SHARDS as u64 - 1))
        as usize]
}

/// A shard holds whole 64 KiB chunks of the address space, not addresses
/// scattered by a hash: a thread allocates from its own arena (glibc gives
/// threads heaps of their own, 64 MiB-aligned), so threads then mostly use
/// shards of their own and each shard's lines stay in one core's cache.
/// When every call of every thread touched a random one of the 64 shards,
/// the lines moved between cores on nearly every call: 20 M malloc+free
/// pairs took 1.2-1.6 s in 2 or 4 threads on two cores, now 0.8-1.0 s (one
/// thread: 1.5 s either way). Consecutive chunks go round the shards; the
/// bits from 64 MiB up are folded in so that heaps at the same offsets of
/// their regions start on different shards.
const SHARD_CHUNK_SHIFT: u32 = 16;
const SHARD_REGION_SHIFT: u32 = 26;

/// Starts loading the table slot where `addr` is or would go, without the
/// lock, for a hook that has other work (the stack capture) to do before it
/// takes the lock: the slot is a cache miss on most calls of a large
/// program. The published location may be stale (the table just grew):
/// a prefetch of it is harmless.
#[inline(always)]
pub fn prefetch(addr: u64) {
    let shard = shard_of(addr);
    let n = shard.slots_len.load(Ordering::Relaxed);
    if n != 0 {
        let at = shard.slots_at.load(Ordering::Relaxed);
        crate::platform::arch::prefetch((at + home(addr, n) * size_of::<Entry>()) as *const u8);
    }
}

/// `prefetch`, and the freed-ring entry a release of `addr` will write.
#[inline(always)]
pub fn prefetch_release(addr: u64) {
    prefetch(addr);
    let at = shard_of(addr).freed_at.load(Ordering::Relaxed);
    if at != 0 {
        crate::platform::arch::prefetch(at as *const u8);
    }
}

/// A recently freed block.
#[derive(Clone, Copy, Default)]
pub struct Freed {
    pub addr: u64,
    pub size: u64,
    pub func: u8,
    pub alloc_stack: u32,
    pub free_stack: u32,
}

struct ShardData {
    slots: Vec<Entry>,
    len: usize,
    /// The `len` at which the next insert grows the table (80% of the
    /// slots; 0 before the first, which makes the table).
    grow_at: usize,
    /// Strictly increasing event time of this shard (see `clock`).
    last_time: u64,
    freed: Vec<Freed>,
    freed_next: usize,
    bytes: u64,
    /// Production mode: the addresses of this shard's latest releases of
    /// sampled blocks (0: none), counted in the filter (`sampled.rs`).
    sampled_freed: [u64; SAMPLED_FREED],
    sampled_next: usize,
}

/// Sampled releases each shard remembers in production mode: 256 in all,
/// so that few of the filter's slots are set for released blocks.
const SAMPLED_FREED: usize = 4;

/// One lock and one table, in lines of their own: the lock and the
/// published locations share the first.
#[repr(align(64))]
pub struct Shard {
    lock: SpinLock,
    /// Where the slots are and how many, published under the lock whenever
    /// they move, so that `prefetch` can find an address's slot without it.
    slots_at: AtomicUsize,
    slots_len: AtomicUsize,
    /// The freed-ring entry the next release of this shard will write (0: none yet).
    freed_at: AtomicUsize,
    data: UnsafeCell<ShardData>,
}

// SAFETY: `data` is only touched while `lock` is held (see `Shard::locked`).
unsafe impl Sync for Shard {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SHARD: Shard = Shard {
    lock: SpinLock::new(),
    slots_at: AtomicUsize::new(0),
    slots_len: AtomicUsize::new(0),
    freed_at: AtomicUsize::new(0),
    data: UnsafeCell::new(ShardData {
        slots: Vec::new(),
        len: 0,
        grow_at: 0,
        last_time: 0,
        freed: Vec::new(),
        freed_next: 0,
        bytes: 0,
        sampled_freed: [0; SAMPLED_FREED],
        sampled_next: 0,
    }),
};

static TABLE: [Shard; SHARDS] = [EMPTY_SHARD; SHARDS];

/// Makes a shard's ring of recent releases, or doubles it when it is about
/// to wrap for the first time at its size (its entries are then in order,
/// oldest first, so growing keeps them). Cold: a shard grows at most six
/// times.
#[cold]
#[inline(never)]
fn grow_freed_ring(ring: &mut Vec<Freed>) {
    let len = ring.len();
    if len == 0 {
        *ring = vec![Freed::default(); FREED_RING];
        return;
    }
    if len < FREED_RING_MAX
        && FREED_GROWTH
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(len)
            })
            .is_ok()
    {
        ring.resize(len * 2, Freed::default());
    }
}

/// A locked shard.
pub struct Locked<'a> {
    shard: &'a Shard,
}

impl Shard {
    pub fn locked(&self) -> Locked<'_> {
        self.lock.lock();
        Locked { shard: self }
    }

    /// Locks with a bounded wait (the holder may be the interrupted thread itself).
    pub fn try_locked(&self, spins: u32) -> Option<Locked<'_>> {
        if spins == u32::MAX {
            return Some(self.locked());
        }
        self.lock
            .try_lock_for(spins)
            .then_some(Locked { shard: self })
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.shard.lock.unlock();
    }
}

impl Locked<'_> {
    fn data(&mut self) -> &mut ShardData {
        // SAFETY: we hold the shard lock for the lifetime of `self`.
        unsafe { &mut *self.shard.data.get() }
    }

    /// A time for an event on this shard: not before the tick, strictly after
    /// this shard's previous event and not before the thread's previous event.
    #[inline]
    pub fn stamp(&mut self, tick: u64, thread_last: u64) -> u64 {
        let d = self.data();
        let t = tick.max(d.last_time + 1).max(thread_last);
        d.last_time = t;
        t
    }

    /// Makes the table, or grows it, and publishes where it now is.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self) {
        let d = self.data();
        if d.slots.is_empty() {
            d.slots = vec![Entry::default(); 256];
        } else {
            grow(d);
        }
        d.grow_at = d.slots.len() * 4 / 5;
        let (at, len) = (d.slots.as_ptr() as usize, d.slots.len());
        self.shard.slots_at.store(at, Ordering::Relaxed);
        self.shard.slots_len.store(len, Ordering::Relaxed);
    }

    /// Records a new live block, replacing a stale entry for the same
    /// address (whose size it returns), born at this shard's latest stamp
    /// (callers stamp first). Inlined into the hooks, with the
    /// rare growth out of line: a call's prologue and epilogue were a fifth
    /// of its instructions.
    #[inline(always)]
    pub fn insert(&mut self, addr: u64, block: Block) -> Option<u64> {
        if self.data().len >= self.data().grow_at {
            self.make_room();
        }
        let d = self.data();
        let n = d.slots.len();
        let mut i = home(addr, n);
        let want = key_of(addr);
        let mut replaced = None;
        loop {
            let e = d.slots[i];
            if e.key == 0 {
                d.len += 1;
                break;
            }
            if e.key & ((1 << ADDR_BITS) - 1) == want {
                let old = unpack(e).1.size;
                d.bytes -= old;
                replaced = Some(old);
                break;
            }
            i = next(i, n);
        }
        let mut e = pack(addr, block);
        e.born = (d.last_time >> BORN_SHIFT) as u32;
        d.slots[i] = e;
        d.bytes += block.size;
        replaced
    }

    /// What is known about a live block, leaving it in the table.
    pub fn get(&mut self, addr: u64) -> Option<Block> {
        let d = self.data();
        find(d, addr).map(|i| unpack(d.slots[i]).1)
    }

    /// Removes a block and returns what was known about it.
    #[inline(always)]
    pub fn remove(&mut self, addr: u64) -> Option<Block> {
        let d = self.data();
        let i = find(d, addr)?;
        let (_, block) = unpack(d.slots[i]);
        d.bytes -= block.size;
        d.len -= 1;
        // Backward-shift deletion keeps every probe chain unbroken.
        let n = d.slots.len();
        let dist = |from: usize, to: usize| if to >= from { to - from } else { to + n - from };
        let mut hole = i;
        let mut j = next(i, n);
        loop {
            let e = d.slots[j];
            if e.key == 0 {
                break;
            }
            let h = home(addr_of(e), n);
            // Move e into the hole unless its home lies in (hole, j].
            if dist(h, j) >= dist(hole, j) {
                d.slots[hole] = e;
                hole = j;
            }
            j = next(j, n);
        }
        d.slots[hole] = Entry::default();
        Some(block)
    }

    /// Remembers a free, so that a second free of the same address can be
    /// reported with the first free's stack.
    #[inline(always)]
    pub fn remember_free(&mut self, f: Freed) {
        let d = self.data();
        let n = d.freed_next;
        if n == d.freed.len() {
            grow_freed_ring(&mut d.freed);
        }
        let len = d.freed.len();
        if let Some(slot) = d.freed.get_mut(n & (len - 1)) {
            // Field by field: a struct built just before and copied whole
            // is reloaded with wide loads that stall on the narrow stores.
            slot.addr = f.addr;
            slot.size = f.size;
            slot.func = f.func;
            slot.alloc_stack = f.alloc_stack;
            slot.free_stack = f.free_stack;
        }
        d.freed_next = n + 1;
        let next_at = d.freed.as_ptr() as usize + ((n + 1) & (len - 1)) * size_of::<Freed>();
        self.shard.freed_at.store(next_at, Ordering::Relaxed);
    }

    /// Production mode: remembers a release of the sampled block at
    /// `addr`, forgetting the oldest one remembered.
    pub fn remember_sampled_free(&mut self, addr: u64) {
        let d = self.data();
        let at = d.sampled_next % SAMPLED_FREED;
        let evicted = core::mem::replace(&mut d.sampled_freed[at], addr);
        d.sampled_next = d.sampled_next.wrapping_add(1);
        if evicted != 0 {
            crate::tracking::sampled::freed_removed(evicted);
        }
        crate::tracking::sampled::freed_added(addr);
    }

    /// Production mode: `addr` was allocated again, so its sampled
    /// releases remembered are no longer the latest word on it.
    pub fn forget_sampled_free(&mut self, addr: u64) {
        for slot in self.data().sampled_freed.iter_mut() {
            if *slot == addr {
                *slot = 0;
                crate::tracking::sampled::freed_removed(addr);
            }
        }
    }

    /// Production mode: the table gave up the sampled block at `addr` (its
    /// release): the filter and the ring of sampled releases follow.
    pub fn sampled_released(&mut self, addr: u64) {
        crate::tracking::sampled::live_removed(addr);
        self.remember_sampled_free(addr);
    }

    /// Production mode: whether a release of the sampled block at `addr`
    /// is remembered.
    pub fn sampled_freed(&mut self, addr: u64) -> bool {
        self.data().sampled_freed.contains(&addr)
    }

    /// The most recent free of `addr` still remembered.
    pub fn recently_freed(&mut self, addr: u64) -> Option<Freed> {
        let d = self.data();
        let len = d.freed.len();
        let count = d.freed_next.min(len);
        (0..count)
            .map(|k| d.freed[(d.freed_next - 1 - k) & (len.max(1) - 1)])
            .find(|f| f.addr == addr)
    }

    /// Appends every live block of this shard, as stored, to `out` (the
    /// reachability scan copies the table without unpacking it).
    pub fn copy_packed(&mut self, out: &mut Vec<Packed>) {
        out.extend(
            self.data()
                .slots
                .iter()
                .filter(|e| e.key != 0)
                .map(|e| Packed {
                    key: e.key,
                    meta: e.meta,
                }),
        );
    }

    /// Number of live blocks of this shard.
    pub fn len(&mut self) -> usize {
        self.data().len
    }

    /// Calls `f` for every live block of this shard.
    pub fn for_each(&mut self, mut f: impl FnMut(u64, Block)) {
        for e in &self.data().slots {
            if e.key != 0 {
                let (a, b) = unpack(*e);
                f(a, b);
            }
        }
    }

    /// Calls `f` for every live block of this shard with its birth time
    /// (trace nanoseconds, to 1 ms).
    pub fn for_each_born(&mut self, mut f: impl FnMut(u64, Block, u64)) {
        for e in &self.data().slots {
            if e.key != 0 {
                let (a, b) = unpack(*e);
                f(a, b, u64::from(e.born) << BORN_SHIFT);
            }
        }
    }
}

/// A live block as the table stores it, less its birth (16 bytes): the
/// reachability scan sorts millions of these, so it keeps them packed.
#[derive(Clone, Copy)]
pub struct Packed {
    key: u64,
    meta: u64,
}

impl Packed {
    /// A placeholder (scratch space of a sort).
    pub const EMPTY: Packed = Packed { key: 0, meta: 0 };

    /// The block's address.
    #[inline]
    pub fn addr(&self) -> u64 {
        unpack_parts(self.key, 0).0
    }

    /// The block's requested size.
    #[inline]
    pub fn size(&self) -> u64 {
        self.meta & ((1 << SIZE_BITS) - 1)
    }

    /// Everything known about the block.
    pub fn block(&self) -> Block {
        unpack_parts(self.key, self.meta).1
    }
}

#[inline(always)]
fn find(d: &ShardData, addr: u64) -> Option<usize> {
    if d.slots.is_empty() || !storable(addr) {
        return None;
    }
    let n = d.slots.len();
    let mut i = home(addr, n);
    let want = key_of(addr);
    loop {
        let e = d.slots[i];
        if e.key == 0 {
            return None;
        }
        if e.key & ((1 << ADDR_BITS) - 1) == want {
            return Some(i);
        }
        i = next(i, n);
    }
}

fn grow(d: &mut ShardData) {
    let bigger = vec![Entry::default(); d.slots.len() + d.slots.len() / 2];
    let old = core::mem::replace(&mut d.slots, bigger);
    let n = d.slots.len();
    for e in old.into_iter().filter(|e| e.key != 0) {
        let mut i = home(addr_of(e), n);
        while d.slots[i].key != 0 {
            i = next(i, n);
        }
        d.slots[i] = e;
    }
}

/// Locks every shard (fork prepare, final snapshot).
pub fn lock_all() {
    for s in &TABLE {
        s.lock.lock();
    }
}

/// Unlocks every shard locked by [`lock_all`].
pub fn unlock_all() {
    for s in &TABLE {
        s.lock.unlock();
    }
}

/// Frees every shard lock in the child after fork.
pub fn reset_locks() {
    for s in &TABLE {
        s.lock.reset();
    }
    // Taken only under a shard lock, so free at a fork; reset all the same.
    crate::tracking::sampled::reset_locks_in_child();
}

/// Every shard, for the snapshot.
pub fn shards() -> &'static [Shard; SHARDS] {
    &TABLE
}

#[cfg(test)]
mod tests {
    use super::{shard_of, Block};
    use trapline_trace::AllocFn;

    fn block(size: u64) -> Block {
        Block {
            size,
            func: AllocFn::Malloc,
            stack: size as u32,
            align: 0,
        }
    }

    /// 20,000 blocks in one address range (the table grows many times),
    /// every other one removed (backward-shift deletion must keep every
    /// probe chain whole), one re-recorded over a stale entry: every lookup
    /// answers as recorded.
    #[test]
    fn blocks_are_found_after_growth_and_removals() {
        let base = 0x5a00_0000_0000u64;
        let addr = |i: u64| base + i * 48;
        for i in 0..20_000 {
            assert_eq!(
                shard_of(addr(i)).locked().insert(addr(i), block(i + 1)),
                None
            );
        }
        for i in (0..20_000).step_by(2) {
            assert_eq!(
                shard_of(addr(i)).locked().remove(addr(i)),
                Some(block(i + 1))
            );
        }
        for i in 0..20_000 {
            let want = (i % 2 == 1).then(|| block(i + 1));
            assert_eq!(shard_of(addr(i)).locked().get(addr(i)), want, "block {i}");
        }
        let stale = addr(1);
        assert_eq!(shard_of(stale).locked().insert(stale, block(99)), Some(2));
        assert_eq!(shard_of(stale).locked().get(stale), Some(block(99)));
        for i in (1..20_000).step_by(2) {
            assert!(shard_of(addr(i)).locked().remove(addr(i)).is_some());
        }
    }
}

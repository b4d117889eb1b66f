//! Memory the program's allocator library mapped for itself.
//!
//! The exit scan treats every writable mapping as a root except malloc's own
//! memory (scan/roots.rs). For glibc that memory is known (the `[heap]`, the
//! arena heaps); an allocator library (jemalloc, tcmalloc, mimalloc) keeps
//! its metadata in anonymous mappings of its own, where jemalloc writes the
//! address of every slab and large block it hands out. Read as roots, those
//! made every block reachable: under jemalloc no leak was ever "definitely
//! lost". So the agent notes the anonymous mappings that the allocator's
//! own code makes (`hooks/maps.rs` sees the return address of every `mmap`
//! call) and the scan leaves them out of the roots; the blocks inside them
//! are still read when marking reaches them.
//!
//! A fixed table, lock-free (an `mmap` may come from any thread, a fork may
//! interrupt it, and the hooks must not allocate): each slot is free, being
//! written, or holds a range. Only mappings from the allocator's code are
//! kept once its extent is known; before that (its initializer may map
//! memory before the agent resolved the allocator) every anonymous mapping
//! is kept with its caller and sorted out at the scan.

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

const SLOTS: usize = 4096;
const FREE: u32 = 0;
const BUSY: u32 = 1;
const LIVE: u32 = 2;

struct Slot {
    state: AtomicU32,
    start: AtomicU64,
    end: AtomicU64,
    caller: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        state: AtomicU32::new(FREE),
        start: AtomicU64::new(0),
        end: AtomicU64::new(0),
        caller: AtomicU64::new(0),
    }
}; SLOTS];
/// Slots ever used: searches stop here.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Mappings not kept because the table was full: their memory stays a
/// root, and leaks it names may be called reachable (read in a debugger).
static OVERFLOW: AtomicU64 = AtomicU64::new(0);

/// The allocator library's extent `[lo, hi)`, once known (`set_allocator`);
/// `hi == 0` with `KNOWN` set: the allocator is the C library's.
static ALLOCATOR_LO: AtomicU64 = AtomicU64::new(0);
static ALLOCATOR_HI: AtomicU64 = AtomicU64::new(0);
static KNOWN: AtomicU32 = AtomicU32::new(0);

/// Where the allocator library's code lies (`None`: the C library's malloc,
/// whose memory the scan knows without this table).
pub fn set_allocator(extent: Option<(u64, u64)>) {
    let (lo, hi) = extent.unwrap_or((0, 0));
    ALLOCATOR_LO.store(lo, Ordering::Relaxed);
    ALLOCATOR_HI.store(hi, Ordering::Relaxed);
    KNOWN.store(1, Ordering::Release);
}

/// The allocator library's extent, when the program's allocator is one
/// (not the C library's malloc).
pub fn allocator_extent() -> Option<(u64, u64)> {
    let hi = ALLOCATOR_HI.load(Ordering::Relaxed);
    (hi != 0).then(|| (ALLOCATOR_LO.load(Ordering::Relaxed), hi))
}

fn in_allocator(pc: u64) -> bool {
    pc >= ALLOCATOR_LO.load(Ordering::Relaxed) && pc < ALLOCATOR_HI.load(Ordering::Relaxed)
}

/// An anonymous mapping `[start, start + len)` made by code at `caller`.
pub fn note_map(start: u64, len: u64, caller: u64) {
    if KNOWN.load(Ordering::Acquire) != 0 && !in_allocator(caller) {
        return;
    }
    put(start, start.saturating_add(len), caller);
}

fn put(start: u64, end: u64, caller: u64) {
    for (i, slot) in TABLE.iter().enumerate() {
        if slot
            .state
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            slot.start.store(start, Ordering::Relaxed);
            slot.end.store(end, Ordering::Relaxed);
            slot.caller.store(caller, Ordering::Relaxed);
            slot.state.store(LIVE, Ordering::Release);
            HIGH.fetch_max(i + 1, Ordering::AcqRel);
            return;
        }
    }
    OVERFLOW.fetch_add(1, Ordering::Relaxed);
}

/// Mappings that may be the allocator library's and were not kept (the
/// table was full): the scan read them as roots. 0 for the C library's
/// malloc, whose memory the scan knows without this table.
pub fn not_kept() -> u64 {
    if ALLOCATOR_HI.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    OVERFLOW.load(Ordering::Relaxed)
}

/// `[start, start + len)` was unmapped: kept ranges lose that part.
pub fn note_unmap(start: u64, len: u64) {
    let end = start.saturating_add(len);
    let high = HIGH.load(Ordering::Acquire);
    for slot in &TABLE[..high] {
        if slot.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let (s, e) = (
            slot.start.load(Ordering::Relaxed),
            slot.end.load(Ordering::Relaxed),
        );
        if e <= start || s >= end {
            continue;
        }
        if slot
            .state
            .compare_exchange(LIVE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let caller = slot.caller.load(Ordering::Relaxed);
        // What is left of the range: a part before the hole, after it, or both.
        let left = (s < start).then_some((s, start));
        let right = (e > end).then_some((end, e));
        match left.or(right) {
            None => slot.state.store(FREE, Ordering::Release),
            Some((a, b)) => {
                slot.start.store(a, Ordering::Relaxed);
                slot.end.store(b, Ordering::Relaxed);
                slot.state.store(LIVE, Ordering::Release);
                if let (Some(_), Some((c, d))) = (left, right) {
                    put(c, d, caller);
                }
            }
        }
    }
}

/// The kept ranges the allocator's code mapped, for the scan.
pub fn allocator_ranges(out: &mut Vec<(u64, u64)>) {
    if ALLOCATOR_HI.load(Ordering::Relaxed) == 0 {
        return;
    }
    let high = HIGH.load(Ordering::Acquire);
    for slot in &TABLE[..high] {
        if slot.state.load(Ordering::Acquire) == LIVE
            && in_allocator(slot.caller.load(Ordering::Relaxed))
        {
            out.push((
                slot.start.load(Ordering::Relaxed),
                slot.end.load(Ordering::Relaxed),
            ));
        }
    }
}

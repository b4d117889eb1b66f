//! Stack deduplication: every distinct call stack gets a 32-bit id and is
//! written to the trace once.
//!
//! Frames live in an append-only arena that is never freed, so a stack id can
//! be turned back into frames without locks (fork children and error reports
//! need that). Lookup is a hash table sharded by the frames' hash; each thread
//! also keeps a small direct-mapped cache of hash -> id in front of it.

use crate::platform::lock::RawLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// Program frames kept per stack (the default depth).
pub const MAX_FRAMES: usize = 64;

const SHARDS: usize = 16;
const DIR_PAGE: usize = 1 << 16;
const DIR_PAGES: usize = 1 << 16;

/// Where a stack's frames are, and in which trace generation it was last written.
pub struct StackRec {
    frames: *const u64,
    len: u32,
    /// Holds only an unsampled allocation's caller (`intern_caller`).
    pub caller_only: bool,
    /// Generation of the trace file that holds this stack's definition.
    pub written_gen: AtomicU32,
}

static DIR: [AtomicPtr<StackRec>; DIR_PAGES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; DIR_PAGES];
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

struct ShardData {
    /// (hash, id) pairs, open addressing; id 0 = empty.
    slots: Vec<(StackHash, u32)>,
    len: usize,
}

struct Shard {
    lock: RawLock,
    /// Where `slots` is and its index mask, readable without the lock: only
    /// to prefetch a hash's slot (a stale pair names a wrong address, which
    /// a prefetch ignores).
    slots_at: AtomicUsize,
    slots_mask: AtomicUsize,
    data: UnsafeCell<ShardData>,
}

// SAFETY: `data` is only accessed with `lock` held.
unsafe impl Sync for Shard {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Shard = Shard {
    lock: RawLock::new(),
    slots_at: AtomicUsize::new(0),
    slots_mask: AtomicUsize::new(0),
    data: UnsafeCell::new(ShardData {
        slots: Vec::new(),
        len: 0,
    }),
};
static TABLE: [Shard; SHARDS] = [EMPTY; SHARDS];

struct Arena {
    lock: RawLock,
    cur: UnsafeCell<(*mut u64, usize)>, // next free, remaining
}
// SAFETY: `cur` is only accessed with `lock` held.
unsafe impl Sync for Arena {}
static ARENA: Arena = Arena {
    lock: RawLock::new(),
    cur: UnsafeCell::new((core::ptr::null_mut(), 0)),
};

/// A stack's identity: two independent 64-bit hashes of its frames.
///
/// Stacks are told apart by this 128-bit value alone, never by comparing
/// frames: a comparison reads the frames from the arena, a cache miss per
/// lookup on programs with hundreds of thousands of stacks (gcc's cc1 has
/// 245,000). Two different stacks collide with probability about n^2/2^129
/// (1e-28 at a million stacks).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct StackHash(pub u64, pub u64);

/// The hash state of an empty frame list: `hash_step` folds frames into it,
/// outermost first, and `hash_finish` seals it with the frame count. Folding
/// outermost first lets an unwinder keep every frame's prefix state and hash
/// a stack that changed only inside by folding just the new inner frames.
pub const HASH_SEED: (u64, u64) = (0x2545_F491_4F6C_DD1D, 0x9E37_79B9_7F4A_7C15);

#[inline(always)]
pub fn hash_step(state: (u64, u64), frame: u64) -> (u64, u64) {
    let (a, b) = state;
    (
        (a.rotate_left(5) ^ frame).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95),
        (b ^ frame.rotate_left(29))
            .wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
            .rotate_left(31),
    )
}

#[inline(always)]
pub fn hash_finish(state: (u64, u64), len: usize) -> StackHash {
    let (a, b) = hash_step(state, len as u64);
    StackHash(a | 1, b)
}

/// The identity of a frame list given innermost first (as stored).
pub fn hash_frames(frames: &[u64]) -> StackHash {
    let state = frames.iter().rev().fold(HASH_SEED, |s, &f| hash_step(s, f));
    hash_finish(state, frames.len())
}

fn rec(id: u32) -> Option<&'static StackRec> {
    let page = DIR[(id as usize) / DIR_PAGE].load(Ordering::Acquire);
    if page.is_null() {
        return None;
    }
    // SAFETY: pages are allocated zeroed with DIR_PAGE records and never freed;
    // a record is published (frames set) before its id is handed out.
    let r = unsafe { &*page.add(id as usize % DIR_PAGE) };
    if r.frames.is_null() && r.len == 0 && id != 0 {
        // Not yet published (cannot happen for ids obtained from `intern`).
        return None;
    }
    Some(r)
}

/// The frames of a stack id.
pub fn frames(id: u32) -> &'static [u64] {
    match rec(id) {
        // SAFETY: the arena range was written before the id was published and is never freed.
        Some(r) if !r.frames.is_null() => unsafe {
            core::slice::from_raw_parts(r.frames, r.len as usize)
        },
        _ => &[],
    }
}

/// The record of a stack id (for its written generation).
pub fn record(id: u32) -> Option<&'static StackRec> {
    rec(id)
}

fn store_frames(frames: &[u64]) -> *const u64 {
    let _g = ARENA.lock.guard();
    // SAFETY: guarded by ARENA.lock.
    let cur = unsafe { &mut *ARENA.cur.get() };
    if cur.1 < frames.len() {
        let n = (1usize << 17).max(frames.len());
        let block = Box::leak(vec![0u64; n].into_boxed_slice());
        *cur = (block.as_mut_ptr(), n);
    }
    let p = cur.0;
    // SAFETY: `p` has room for `frames.len()` more u64s (checked above).
    unsafe {
        core::ptr::copy_nonoverlapping(frames.as_ptr(), p, frames.len());
        cur.0 = p.add(frames.len());
    }
    cur.1 -= frames.len();
    p
}

fn publish(frames: &[u64], caller_only: bool) -> Option<u32> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    if id == u32::MAX {
        return None;
    }
    let page_slot = &DIR[id as usize / DIR_PAGE];
    let mut page = page_slot.load(Ordering::Acquire);
    if page.is_null() {
        let fresh: Box<[StackRec]> = (0..DIR_PAGE)
            .map(|_| StackRec {
                frames: core::ptr::null(),
                len: 0,
                caller_only: false,
                written_gen: AtomicU32::new(0),
            })
            .collect();
        let fresh = Box::into_raw(fresh) as *mut StackRec;
        match page_slot.compare_exchange(
            core::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => page = fresh,
            Err(existing) => {
                // SAFETY: `fresh` came from Box::into_raw above and was not shared.
                drop(unsafe {
                    Box::from_raw(core::ptr::slice_from_raw_parts_mut(fresh, DIR_PAGE))
                });
                page = existing;
            }
        }
    }
    let stored = store_frames(frames);
    // SAFETY: this id's record is written only here, once, before the id is returned.
    unsafe {
        let r = page.add(id as usize % DIR_PAGE);
        (*r).frames = stored;
        (*r).len = frames.len() as u32;
        (*r).caller_only = caller_only;
    }
    Some(id)
}

impl Shard {
    fn publish_slots(&self, d: &ShardData) {
        self.slots_at
            .store(d.slots.as_ptr() as usize, Ordering::Relaxed);
        self.slots_mask.store(d.slots.len() - 1, Ordering::Relaxed);
    }
}

/// Starts loading the intern table slot of `hash`: a capture that misses its
/// id cache goes there, and the slot is usually in memory, not in a cache.
#[inline(always)]
pub fn prefetch_slot(hash: StackHash) {
    let shard = &TABLE[(hash.0 >> 60) as usize % SHARDS];
    let mask = shard.slots_mask.load(Ordering::Relaxed);
    let at = shard.slots_at.load(Ordering::Relaxed);
    if at != 0 {
        let i = hash.0 as usize & mask;
        crate::platform::arch::prefetch((at + i * size_of::<(StackHash, u32)>()) as *const u8);
    }
}

/// The id of the stack with identity `hash`, creating it from the frames
/// `frames` writes (innermost first, returning their count) if it is new; the
/// frames are only gathered then. Returns (id, newly created). `None` only if
/// ids are exhausted.
pub fn intern(
    hash: StackHash,
    frames: impl FnOnce(&mut [u64; MAX_FRAMES]) -> usize,
) -> Option<(u32, bool)> {
    intern_marked(hash, false, frames)
}

/// The length a caller-only stack's identity is sealed with: no stack of
/// real frames has it, so the caller-only stack of a return address is
/// never the full stack that holds that one frame.
const CALLER_ONLY_LEN: usize = usize::MAX;

/// The id of the stack that holds only `caller`, the return address of an
/// allocation that sampled recording did not sample (its definition is
/// marked caller-only in the trace). Returns (id, newly created).
pub fn intern_caller(caller: u64) -> Option<(u32, bool)> {
    let hash = hash_finish(hash_step(HASH_SEED, caller), CALLER_ONLY_LEN);
    intern_marked(hash, true, |buf| {
        buf[0] = caller;
        1
    })
}

fn intern_marked(
    hash: StackHash,
    caller_only: bool,
    frames: impl FnOnce(&mut [u64; MAX_FRAMES]) -> usize,
) -> Option<(u32, bool)> {
    let shard = &TABLE[(hash.0 >> 60) as usize % SHARDS];
    let _g = shard.lock.guard();
    // SAFETY: guarded by the shard lock.
    let d = unsafe { &mut *shard.data.get() };
    if d.slots.is_empty() {
        d.slots = vec![(StackHash::default(), 0); 1024];
        shard.publish_slots(d);
    } else if (d.len + 1) * 4 > d.slots.len() * 3 {
        let doubled = vec![(StackHash::default(), 0); d.slots.len() * 2];
        let old = core::mem::replace(&mut d.slots, doubled);
        let mask = d.slots.len() - 1;
        for (h, id) in old.into_iter().filter(|e| e.1 != 0) {
            let mut i = h.0 as usize & mask;
            while d.slots[i].1 != 0 {
                i = (i + 1) & mask;
            }
            d.slots[i] = (h, id);
        }
        shard.publish_slots(d);
    }
    let mask = d.slots.len() - 1;
    let mut i = hash.0 as usize & mask;
    loop {
        let (h, id) = d.slots[i];
        if id == 0 {
            break;
        }
        if h == hash {
            return Some((id, false));
        }
        i = (i + 1) & mask;
    }
    let mut buf = [0u64; MAX_FRAMES];
    let n = frames(&mut buf).min(MAX_FRAMES);
    let id = publish(&buf[..n], caller_only)?;
    d.slots[i] = (hash, id);
    d.len += 1;
    Some((id, true))
}

/// Locks every table for fork.
pub fn lock_all() {
    // Same order as `intern`: a table shard, then the arena.
    for s in &TABLE {
        s.lock.lock();
    }
    ARENA.lock.lock();
}

pub fn unlock_all() {
    for s in &TABLE {
        s.lock.unlock();
    }
    ARENA.lock.unlock();
}

pub fn reset_locks() {
    for s in &TABLE {
        s.lock.reset();
    }
    ARENA.lock.reset();
}

#[cfg(test)]
mod tests {
    use super::{frames, hash_frames, intern, MAX_FRAMES};

    /// A stack is interned once: the same identity gives the same id
    /// without gathering its frames again, another gives a new id, and the
    /// frames kept are the ones gathered (cut at MAX_FRAMES).
    #[test]
    fn a_stack_is_interned_once_and_its_frames_kept() {
        let a = [0x1000_0001u64, 0x1000_0002, 0x1000_0003];
        let (id, new) = intern(hash_frames(&a), |buf| {
            buf[..3].copy_from_slice(&a);
            3
        })
        .unwrap();
        assert!(new);
        assert_eq!(frames(id), a);
        let again = intern(hash_frames(&a), |_| panic!("gathered twice")).unwrap();
        assert_eq!(again, (id, false));
        let b = [0x2000_0001u64; MAX_FRAMES];
        let (other, new) = intern(hash_frames(&b), |buf| {
            buf.copy_from_slice(&b);
            MAX_FRAMES + 10
        })
        .unwrap();
        assert!(new && other != id);
        assert_eq!(frames(other), b);
    }
}

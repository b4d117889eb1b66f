//! The agent's own heap, apart from the program's.
//!
//! The agent's Rust allocations (thread states, unwinding caches, buffers,
//! tables) must neither go through the hooked `malloc` nor share glibc's heap
//! with the program: a block the agent takes right after the program freed
//! one can be the very same chunk, and then the program's heap layout, the
//! addresses it gets back, and what glibc sees of a double free all differ
//! from a run without the tool. So the agent allocates from memory it maps
//! itself: power-of-two size classes from 16 bytes to 4 KiB carved from
//! 1 MiB slabs, with a free list per class under one spinlock (the agent
//! allocates rarely: per thread, per new table size, per new stack arena
//! block), and larger blocks mapped and unmapped directly.

use crate::sys::SpinLock;
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const MIN_SHIFT: u32 = 4; // 16 bytes
                          // Above a page, blocks are mapped and unmapped on their own, so memory of
                          // outgrown tables goes back to the system instead of idling in a free list.
const MAX_SHIFT: u32 = 12; // 4 KiB
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
const SLAB: usize = 1 << 20;
const PAGE: usize = 4096;

struct State {
    free: [*mut u8; CLASSES],
    bump: *mut u8,
    left: usize,
}

pub struct AgentHeap {
    lock: SpinLock,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only accessed with `lock` held.
unsafe impl Sync for AgentHeap {}

impl AgentHeap {
    pub const fn new() -> Self {
        AgentHeap {
            lock: SpinLock::new(),
            state: UnsafeCell::new(State {
                free: [core::ptr::null_mut(); CLASSES],
                bump: core::ptr::null_mut(),
                left: 0,
            }),
        }
    }

    /// Fork prepare/parent/child: the heap stays consistent across fork.
    pub fn lock(&self) {
        self.lock.lock();
    }
    pub fn unlock(&self) {
        self.lock.unlock();
    }
    pub fn reset_lock(&self) {
        self.lock.reset();
    }
}

/// Whether a thread is inside the agent heap now (its lock, or the mapping
/// registry's, is held): the reachability scan must not stop the world then.
pub fn busy() -> bool {
    crate::AGENT_HEAP.lock.is_locked() || REGISTRY.lock.is_locked()
}

/// Size class of a layout, or None for a large (directly mapped) block.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
    let shift = usize::BITS - (size - 1).leading_zeros();
    (shift <= MAX_SHIFT).then(|| (shift - MIN_SHIFT) as usize)
}

/// Most agent mappings the registry keeps (slabs plus large blocks: buffers,
/// tables, stack arenas); past it a mapping is only counted.
/// A thread holds about 2.7 mappings of the agent's (neighbouring mappings
/// merge in the kernel, not here: five registry entries), so this covers
/// about 13,000 threads; the kernel's default limit of 65,530 mappings per
/// process stops a program near 14,600 threads under the agent (design.md
/// 13.1). 1 MiB of `.bss`, resident only where used.
const MAX_MAPPINGS: usize = 65536;

/// Every mapping the agent heap holds, so that the reachability scan leaves
/// the agent's own memory (its tables hold block addresses) out of its roots.
struct Registry {
    lock: SpinLock,
    ranges: UnsafeCell<[(usize, usize); MAX_MAPPINGS]>,
    len: UnsafeCell<usize>,
}

// SAFETY: `ranges` and `len` are only accessed with `lock` held.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    lock: SpinLock::new(),
    ranges: UnsafeCell::new([(0, 0); MAX_MAPPINGS]),
    len: UnsafeCell::new(0),
};

/// Mappings that did not fit in the registry (they may be scanned as roots).
pub static UNREGISTERED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

fn register(start: usize, len: usize) {
    REGISTRY.lock.lock();
    // SAFETY: guarded by the registry lock.
    unsafe {
        let n = &mut *REGISTRY.len.get();
        if *n < MAX_MAPPINGS {
            (*REGISTRY.ranges.get())[*n] = (start, start + len);
            *n += 1;
        } else {
            UNREGISTERED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        }
    }
    REGISTRY.lock.unlock();
}

fn unregister(start: usize) {
    REGISTRY.lock.lock();
    // SAFETY: guarded by the registry lock.
    unsafe {
        let n = &mut *REGISTRY.len.get();
        let ranges = &mut *REGISTRY.ranges.get();
        if let Some(i) = ranges[..*n].iter().position(|r| r.0 == start) {
            ranges[i] = ranges[*n - 1];
            *n -= 1;
        }
    }
    REGISTRY.lock.unlock();
}

/// Copies the ranges of the agent heap's mappings into `out` (which must have
/// room: the scan calls this while other threads are stopped, so it must not
/// allocate). Returns false if some did not fit.
pub fn mappings_into(out: &mut Vec<(u64, u64)>) -> bool {
    out.clear();
    REGISTRY.lock.lock();
    // SAFETY: guarded by the registry lock.
    let all = unsafe {
        let n = *REGISTRY.len.get();
        let ranges = &*REGISTRY.ranges.get();
        let room = out.capacity().min(n);
        out.extend(ranges[..room].iter().map(|&(a, b)| (a as u64, b as u64)));
        room == n
    };
    REGISTRY.lock.unlock();
    all
}

/// How many mappings the registry holds now.
pub fn mapping_count() -> usize {
    REGISTRY.lock.lock();
    // SAFETY: guarded by the registry lock.
    let n = unsafe { *REGISTRY.len.get() };
    REGISTRY.lock.unlock();
    n
}

/// Maps `len` bytes of zeroed memory for the agent (recorded in the
/// registry, so the reachability scan never reads it as a root). When the
/// process has no mapping left (the kernel's `vm.max_map_count`, reached by
/// a program with very many threads), the memory comes from the reserve.
pub fn map(len: usize) -> *mut u8 {
    let p = map_own(len);
    if p.is_null() {
        MAPPINGS_REFUSED.store(true, Ordering::Relaxed);
        reserve_take(len)
    } else {
        MAPPINGS_REFUSED.store(false, Ordering::Relaxed);
        p
    }
}

/// The last mapping the agent asked for was refused (the process is at its
/// limit of mappings, or out of address space): its memory came from the
/// reserve.
static MAPPINGS_REFUSED: AtomicBool = AtomicBool::new(false);

/// Reserve kept back from new threads, for the tables and caches of the
/// threads that run.
const RESERVE_KEPT: usize = 8 << 20;
/// What a new thread's agent state takes (two captures with their id
/// caches, a buffer, the rest), promised out of the reserve when a thread
/// is let start while mappings are refused.
const THREAD_STATE: usize = 512 << 10;
/// Reserve bytes promised to threads let start while mappings were refused
/// (never given back: an overestimate, on the safe side).
static PROMISED: AtomicUsize = AtomicUsize::new(0);

/// Whether a new thread's agent state can still be had: the process can
/// make mappings, or the reserve holds enough. Without this, a program
/// whose threads start threads without end reached the limit of mappings,
/// each new thread's state came from the reserve, and once that was gone
/// the agent's next allocation failed and aborted the program. Now its
/// `pthread_create` fails with `EAGAIN` a little before the kernel's
/// limit would have made it fail natively.
///
/// Each thread let start then is promised its share of the reserve first:
/// a program with thousands of threads starting threads at once let them
/// all through one check before any took its memory.
pub fn room_for_a_thread() -> bool {
    if !MAPPINGS_REFUSED.load(Ordering::Relaxed) {
        return true;
    }
    let start = RESERVE_START.load(Ordering::Acquire);
    if start == 0 {
        return false;
    }
    let limit = start + RESERVE_LEN - RESERVE_KEPT;
    PROMISED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |promised| {
            let used = RESERVE_NEXT.load(Ordering::Relaxed);
            (used + promised + THREAD_STATE <= limit).then_some(promised + THREAD_STATE)
        })
        .is_ok()
}

/// A mapping of its own, or null: for memory whose protection changes (a
/// guard page would split the reserve's mapping).
pub fn map_own(len: usize) -> *mut u8 {
    let p = mmap_anonymous(len, 0);
    if !p.is_null() {
        register(p as usize, len);
    }
    p
}

/// A private anonymous read-write mapping of `len` bytes, or null.
fn mmap_anonymous(len: usize, extra_flags: i32) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        core::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Unmaps a mapping made by `map` (or gives back its pages, if it came from
/// the reserve).
pub fn unmap(p: *mut u8, len: usize) {
    if KEEP_MAPPINGS.load(Ordering::Relaxed) {
        // The process is ending: the exit scan's and the flush's buffers are
        // freed a moment before the address space goes. Unmapping them, each
        // a TLB shootdown while the writer thread runs on another core, cost
        // a short-lived process about 0.1 ms. They stay registered (the scan
        // keeps them out of its roots).
        return;
    }
    if in_reserve(p) {
        // SAFETY: our own reserve pages, no longer used: dropped, not unmapped
        // (unmapping part of the reserve would need a mapping more).
        unsafe { libc::madvise(p.cast(), len, libc::MADV_DONTNEED) };
        return;
    }
    unregister(p as usize);
    // SAFETY: a mapping from `map` with this length, no longer used.
    unsafe { libc::munmap(p.cast(), len) };
}

/// Set when the process's trace is being finished for good (not for an
/// exec, after which a failed exec continues): freed mappings are kept.
pub static KEEP_MAPPINGS: AtomicBool = AtomicBool::new(false);

/// Address space set aside when the agent starts, one mapping that costs
/// nothing until used (MAP_NORESERVE): the agent's memory once the process
/// can make no more mappings. Without it the agent's next allocation failed
/// there and Rust's allocation-failure handler aborted the program, which
/// natively would only have seen `pthread_create` fail. Pages are handed out
/// once (freed ones are dropped, not reused): it is an emergency supply.
const RESERVE_LEN: usize = 64 << 20;
static RESERVE_START: AtomicUsize = AtomicUsize::new(0);
static RESERVE_NEXT: AtomicUsize = AtomicUsize::new(0);

/// Sets the reserve aside (the constructor; once per process: fork children
/// inherit it).
pub fn set_aside_reserve() {
    if RESERVE_START.load(Ordering::Acquire) != 0 {
        return;
    }
    let p = mmap_anonymous(RESERVE_LEN, libc::MAP_NORESERVE);
    if !p.is_null() {
        register(p as usize, RESERVE_LEN);
        RESERVE_NEXT.store(p as usize, Ordering::Relaxed);
        RESERVE_START.store(p as usize, Ordering::Release);
    }
}

fn in_reserve(p: *mut u8) -> bool {
    let start = RESERVE_START.load(Ordering::Acquire);
    start != 0 && (p as usize).wrapping_sub(start) < RESERVE_LEN
}

fn reserve_take(len: usize) -> *mut u8 {
    let start = RESERVE_START.load(Ordering::Acquire);
    if start == 0 {
        return core::ptr::null_mut();
    }
    let len = (len + PAGE - 1) & !(PAGE - 1);
    let taken = RESERVE_NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
        (next + len <= start + RESERVE_LEN).then_some(next + len)
    });
    match taken {
        Ok(p) => p as *mut u8,
        Err(_) => core::ptr::null_mut(),
    }
}

fn large_len(layout: Layout) -> usize {
    (layout.size() + PAGE - 1) & !(PAGE - 1)
}

// SAFETY: blocks are carved from private mappings, never overlap, are aligned
// to their power-of-two class size (slabs are page aligned and carving keeps
// the bump pointer aligned to the class), and large blocks are page aligned
// (larger alignments are refused with null).
unsafe impl GlobalAlloc for AgentHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            if layout.align() > PAGE {
                return core::ptr::null_mut();
            }
            return map(large_len(layout));
        };
        let size = 1usize << (c as u32 + MIN_SHIFT);
        self.lock.lock();
        // SAFETY: guarded by the lock.
        let st = unsafe { &mut *self.state.get() };
        let head = st.free[c];
        let p = if !head.is_null() {
            // SAFETY: a free block's first word holds the next free block.
            st.free[c] = unsafe { *(head as *mut *mut u8) };
            head
        } else {
            let pad = (size - (st.bump as usize & (size - 1))) & (size - 1);
            if st.bump.is_null() || st.left < pad + size {
                let slab = map(SLAB);
                if slab.is_null() {
                    self.lock.unlock();
                    return core::ptr::null_mut();
                }
                st.bump = slab;
                st.left = SLAB;
            }
            let pad = (size - (st.bump as usize & (size - 1))) & (size - 1);
            // SAFETY: pad + size <= left, inside the current slab.
            let p = unsafe { st.bump.add(pad) };
            st.bump = unsafe { p.add(size) };
            st.left -= pad + size;
            p
        };
        self.lock.unlock();
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            unmap(ptr, large_len(layout));
            return;
        };
        self.lock.lock();
        // SAFETY: guarded by the lock; the block is at least 16 bytes and ours.
        unsafe {
            let st = &mut *self.state.get();
            *(ptr as *mut *mut u8) = st.free[c];
            st.free[c] = ptr;
        }
        self.lock.unlock();
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as alloc; recycled small blocks must be cleared, fresh
        // mappings already are.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() && class(layout).is_some() {
                core::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }
}

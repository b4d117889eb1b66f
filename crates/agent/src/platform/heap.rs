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

use crate::platform::lock::SpinLock;
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

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
        RESERVE_GROW.lock();
    }
    pub fn unlock(&self) {
        RESERVE_GROW.unlock();
        self.lock.unlock();
    }
    pub fn reset_lock(&self) {
        self.lock.reset();
        RESERVE_GROW.reset();
        RESERVE_FREE.lock.reset();
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
/// process stops a program near 14,600 threads under the agent (agent.md,
/// "Threads and memory mappings"). 1 MiB of `.bss`, resident only where used.
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
    map_keeping(len, 0)
}

/// As `map`, but leaves the reserve's last `keep` bytes alone.
fn map_keeping(len: usize, keep: usize) -> *mut u8 {
    let p = map_own(len);
    if !p.is_null() {
        return p;
    }
    note_mapping_refused();
    reserve_take(len, keep)
}

/// Set when a mapping of the agent's was refused (the process reached
/// `vm.max_map_count`, or its address space); cleared when the process is
/// well below its limit again (`forget_mapping_limit_when_below`).
static AT_MAPPING_LIMIT: AtomicBool = AtomicBool::new(false);
/// Writer sweeps (200 ms apart) since the limit was last looked at.
static SWEEPS_SINCE_LOOK: AtomicU32 = AtomicU32::new(0);
/// Sweeps between two looks at the process's mappings while the flag is
/// set: counting them reads `/proc/self/maps` (about 10 ms at 65,530).
const SWEEPS_BETWEEN_LOOKS: u32 = 5;
/// Free slots below the kernel's limit at which the flag is cleared.
const SLOTS_BELOW_LIMIT: usize = 1024;

/// Whether the process has reached its limit of mappings: the agent then
/// makes none it can do without (a thread's side stack, its guard page).
pub fn at_mapping_limit() -> bool {
    AT_MAPPING_LIMIT.load(Ordering::Relaxed)
}

/// Notes that the process could make no more mappings (a mapping, or a
/// split of one, was refused).
pub fn note_mapping_refused() {
    AT_MAPPING_LIMIT.store(true, Ordering::Relaxed);
}

/// The writer's sweep: once a second while the limit flag is set, counts
/// the process's mappings and clears the flag when at least
/// `SLOTS_BELOW_LIMIT` are free, so that a program that came near its
/// limit once (a burst of threads) gets side stacks for its later threads
/// again. A program still near it keeps the flag: the agent makes no
/// mapping of its own there, and clearing it on a timer had the agent take
/// the slots the program's threads freed.
pub fn forget_mapping_limit_when_below() {
    if !AT_MAPPING_LIMIT.load(Ordering::Relaxed)
        || SWEEPS_SINCE_LOOK.fetch_add(1, Ordering::Relaxed) + 1 < SWEEPS_BETWEEN_LOOKS
    {
        return;
    }
    SWEEPS_SINCE_LOOK.store(0, Ordering::Relaxed);
    if let (Some(limit), Some(count)) = (max_map_count(), mapping_count_now()) {
        if count + SLOTS_BELOW_LIMIT <= limit {
            AT_MAPPING_LIMIT.store(false, Ordering::Relaxed);
        }
    }
}

/// The kernel's limit of mappings per process (`vm.max_map_count`).
fn max_map_count() -> Option<usize> {
    let mut digits = [0u8; 32];
    let mut n = 0;
    let mut value = 0usize;
    read_file(c"/proc/sys/vm/max_map_count", &mut digits, |chunk| {
        for &b in chunk {
            if b.is_ascii_digit() {
                value = value
                    .saturating_mul(10)
                    .saturating_add(usize::from(b - b'0'));
                n += 1;
            }
        }
    })?;
    (n > 0).then_some(value)
}

/// The process's mappings now: the lines of `/proc/self/maps` (up to 6 MB
/// of text at the limit, counted through a buffer on the stack).
fn mapping_count_now() -> Option<usize> {
    let mut buf = [0u8; 16384];
    let mut lines = 0;
    read_file(c"/proc/self/maps", &mut buf, |chunk| {
        lines += chunk.iter().filter(|&&b| b == b'\n').count()
    })?;
    Some(lines)
}

/// Reads a file through `buf`, handing each chunk to `f`, with the system
/// calls themselves: nothing is allocated, since this runs when the agent
/// heap may have nothing left (at the limit of mappings).
fn read_file(path: &core::ffi::CStr, buf: &mut [u8], mut f: impl FnMut(&[u8])) -> Option<()> {
    // SAFETY: a NUL-terminated path; the descriptor is ours until closed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let ok = loop {
        // SAFETY: reading into our own buffer, at most its length.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break n == 0;
        }
        f(&buf[..n as usize]);
    };
    // SAFETY: closing our own descriptor (the system call: `close` is the agent's hook).
    unsafe { libc::syscall(libc::SYS_close, fd) };
    ok.then_some(())
}

/// Reserve left to the threads that run (their tables, caches and next
/// buffers) and to the exit scan when a new thread's state would have to
/// come from it: half of it. A new thread's state takes about 420 KiB, so
/// about 300 threads can start past the limit of mappings.
fn reserve_kept() -> usize {
    RESERVE_LEN.load(Ordering::Relaxed) / 2
}

/// Zeroed memory for a new thread's agent state (its captures and first
/// buffer), taken by the thread that creates it, or null. Like the agent
/// heap's own allocation of `layout` (a `Box` of it is freed by the global
/// allocator), except that when the process can make no more mappings it
/// never takes the reserve's last `reserve_kept()` bytes: the creator then
/// makes `pthread_create` fail with `EAGAIN`, which is what the C library
/// answers when it cannot map a thread's stack, and the threads that run
/// keep what they need.
///
/// Without this, a program whose threads start threads without end (a
/// thread bomb) reached the limit of mappings, each new thread's state came
/// from the reserve, and once that was gone the agent's next allocation
/// failed and Rust's allocation-failure handler aborted the program.
pub fn alloc_for_new_thread(layout: Layout) -> *mut u8 {
    if class(layout).is_some() {
        // SAFETY: callers pass sized, non-zero layouts.
        return unsafe { crate::AGENT_HEAP.alloc_zeroed(layout) };
    }
    if layout.align() > PAGE {
        return core::ptr::null_mut();
    }
    map_keeping(large_len(layout), reserve_kept())
}

/// A mapping of its own, or null: for memory whose protection changes (a
/// guard page would split the reserve's mapping).
pub fn map_own(len: usize) -> *mut u8 {
    let p = mmap_anonymous(len, libc::PROT_READ | libc::PROT_WRITE, 0);
    if !p.is_null() {
        register(p as usize, len);
    }
    p
}

/// A private anonymous mapping of `len` bytes with protection `prot`, or null.
fn mmap_anonymous(len: usize, prot: i32, extra_flags: i32) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            prot,
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
        reserve_give_back(p, len);
        return;
    }
    unregister(p as usize);
    // SAFETY: a mapping from `map` with this length, no longer used.
    unsafe { libc::munmap(p.cast(), len) };
}

/// Set when the process's trace is being finished for good (not for an
/// exec, after which a failed exec continues): freed mappings are kept.
pub static KEEP_MAPPINGS: AtomicBool = AtomicBool::new(false);

/// Address space set aside when the agent starts: the agent's memory once
/// the process can make no more mappings. Without it the agent's next
/// allocation failed there and Rust's allocation-failure handler aborted the
/// program, which natively would only have seen `pthread_create` fail.
///
/// One mapping without access (so it is charged to no commit limit, even
/// with `vm.overcommit_memory=2`), of which a prefix is made writable as it
/// is handed out: `mprotect` of the pages just past a writable prefix of the
/// same mapping moves the boundary between two areas and needs no mapping
/// more (the first megabyte is made writable at once, so that the split
/// happens while the process can still make mappings). Freed blocks give
/// their pages back to the system and are reused, whole or split
/// (`reserve_take`).
///
/// 256 MiB of address space: at the limit of mappings the agent still
/// needs memory for the threads that run (buffers, the writer's queue), and
/// at exit for the reachability scan, whose copy of `/proc/self/maps`
/// alone is about 10 MB when the process has 65,530 mappings. 64 MiB under
/// a limit of address space (`ulimit -v`), which the reserve counts
/// against.
const RESERVE_LEN_MAX: usize = 256 << 20;
const RESERVE_LEN_LIMITED: usize = 64 << 20;
/// Made writable at a time, and at once.
const RESERVE_STEP: usize = 1 << 20;
static RESERVE_START: AtomicUsize = AtomicUsize::new(0);
static RESERVE_LEN: AtomicUsize = AtomicUsize::new(0);
static RESERVE_NEXT: AtomicUsize = AtomicUsize::new(0);
/// End of the writable prefix; grown under `RESERVE_GROW`.
static RESERVE_WRITABLE: AtomicUsize = AtomicUsize::new(0);
static RESERVE_GROW: SpinLock = SpinLock::new();

/// Sets the reserve aside (the constructor; once per process: fork children
/// inherit it).
pub fn set_aside_reserve() {
    if RESERVE_START.load(Ordering::Acquire) != 0 {
        return;
    }
    let limited =
        crate::platform::sys::soft_limit(libc::RLIMIT_AS).is_some_and(|l| l != libc::RLIM_INFINITY);
    let len = if limited {
        RESERVE_LEN_LIMITED
    } else {
        RESERVE_LEN_MAX
    };
    let p = mmap_anonymous(len, libc::PROT_NONE, libc::MAP_NORESERVE);
    if p.is_null() {
        return;
    }
    let p = p as usize;
    register(p, len);
    RESERVE_LEN.store(len, Ordering::Relaxed);
    RESERVE_NEXT.store(p, Ordering::Relaxed);
    RESERVE_WRITABLE.store(p, Ordering::Relaxed);
    RESERVE_START.store(p, Ordering::Release);
    reserve_make_writable(p + RESERVE_STEP);
}

/// Makes the reserve writable up to at least `end`; false if the kernel
/// refused (a commit limit).
fn reserve_make_writable(end: usize) -> bool {
    if RESERVE_WRITABLE.load(Ordering::Acquire) >= end {
        return true;
    }
    // Waited for: another thread's `mprotect` ends (fork handlers take this
    // lock with the heap's, so a fork child never inherits it held).
    RESERVE_GROW.lock();
    let from = RESERVE_WRITABLE.load(Ordering::Relaxed);
    let reserve_end = RESERVE_START.load(Ordering::Relaxed) + RESERVE_LEN.load(Ordering::Relaxed);
    let to = round_up(end, RESERVE_STEP).min(reserve_end);
    // SAFETY: pages of the reserve's own mapping, not yet handed out.
    let ok = from >= end
        || unsafe {
            libc::mprotect(
                from as *mut libc::c_void,
                to - from,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        } == 0;
    if ok && from < to {
        RESERVE_WRITABLE.store(to, Ordering::Release);
    }
    RESERVE_GROW.unlock();
    ok
}

/// Bytes of the reserve never handed out (its tail): what a large request
/// the kernel refuses can still get (the scan's estimate of its room under
/// `ulimit -v`, which the reserve already counts against).
pub fn reserve_unused() -> usize {
    let start = RESERVE_START.load(Ordering::Acquire);
    if start == 0 {
        return 0;
    }
    (start + RESERVE_LEN.load(Ordering::Relaxed))
        .saturating_sub(RESERVE_NEXT.load(Ordering::Relaxed))
}

/// Whether the agent's memory at `p` came from the reserve: freed, it is
/// kept for reuse; and at the limit of mappings, the pool of spare thread
/// states keeps only such memory, and frees what lies in mappings of its
/// own, whose slots the program needs (`AT_MAPPING_LIMIT`).
pub fn in_reserve(p: *const u8) -> bool {
    let start = RESERVE_START.load(Ordering::Acquire);
    start != 0 && (p as usize).wrapping_sub(start) < RESERVE_LEN.load(Ordering::Relaxed)
}

/// Reserve blocks given back (their pages dropped, so they read zero again),
/// for later requests (the smallest block that holds one, split): a program
/// at its limit of mappings whose threads come and go would otherwise drain
/// the reserve with the states of threads long gone. Neighbouring blocks
/// are not merged.
struct ReserveFree {
    lock: SpinLock,
    blocks: UnsafeCell<[(usize, usize); RESERVE_FREE_SLOTS]>,
}
const RESERVE_FREE_SLOTS: usize = 256;
// SAFETY: `blocks` is only accessed with `lock` held.
unsafe impl Sync for ReserveFree {}
static RESERVE_FREE: ReserveFree = ReserveFree {
    lock: SpinLock::new(),
    blocks: UnsafeCell::new([(0, 0); RESERVE_FREE_SLOTS]),
};
/// Bytes in `RESERVE_FREE`.
static RESERVE_FREED: AtomicUsize = AtomicUsize::new(0);
/// Bounded: a fork child may inherit the lock held; a busy table only means
/// a block is not reused (or not kept for reuse).
const RESERVE_FREE_SPINS: u32 = 1000;

/// Runs `f` on the table of given-back blocks, or returns None if it is busy.
fn with_reserve_free<R>(
    f: impl FnOnce(&mut [(usize, usize); RESERVE_FREE_SLOTS]) -> R,
) -> Option<R> {
    if !RESERVE_FREE.lock.try_lock_for(RESERVE_FREE_SPINS) {
        return None;
    }
    // SAFETY: guarded by the lock.
    let r = f(unsafe { &mut *RESERVE_FREE.blocks.get() });
    RESERVE_FREE.lock.unlock();
    Some(r)
}

/// Keeps a reserve block for reuse (its pages already dropped).
fn reserve_give_back(p: *mut u8, len: usize) {
    let len = round_up(len, PAGE);
    with_reserve_free(|blocks| {
        if let Some(slot) = blocks.iter_mut().find(|b| b.1 == 0) {
            *slot = (p as usize, len);
            RESERVE_FREED.fetch_add(len, Ordering::Relaxed);
        }
    });
}

/// `len` bytes of the reserve (a block given back of that length, or fresh
/// pages), leaving at least `keep` bytes of it to later requests; or null.
fn reserve_take(len: usize, keep: usize) -> *mut u8 {
    let start = RESERVE_START.load(Ordering::Acquire);
    if start == 0 {
        return core::ptr::null_mut();
    }
    let end = start + RESERVE_LEN.load(Ordering::Relaxed);
    let len = round_up(len, PAGE);
    let fresh_left = || end.saturating_sub(RESERVE_NEXT.load(Ordering::Relaxed));
    if RESERVE_FREED.load(Ordering::Relaxed) != 0 {
        let reused = with_reserve_free(|blocks| {
            let left = fresh_left() + RESERVE_FREED.load(Ordering::Relaxed);
            if left < len + keep {
                return None;
            }
            // The smallest block that holds `len`; the rest of it stays.
            let slot = blocks
                .iter_mut()
                .filter(|b| b.1 >= len)
                .min_by_key(|b| b.1)?;
            let p = slot.0;
            *slot = if slot.1 == len {
                (0, 0)
            } else {
                (slot.0 + len, slot.1 - len)
            };
            RESERVE_FREED.fetch_sub(len, Ordering::Relaxed);
            Some(p as *mut u8)
        });
        if let Some(Some(p)) = reused {
            return p;
        }
    }
    let taken = RESERVE_NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
        let left = end.saturating_sub(next) + RESERVE_FREED.load(Ordering::Relaxed);
        (next + len <= end && left >= len + keep).then_some(next + len)
    });
    let Ok(p) = taken else {
        return core::ptr::null_mut();
    };
    if reserve_make_writable(p + len) {
        return p as *mut u8;
    }
    // Refused (a commit limit): handed back if nothing was taken since.
    let _ = RESERVE_NEXT.compare_exchange(p + len, p, Ordering::Relaxed, Ordering::Relaxed);
    core::ptr::null_mut()
}

/// `x` rounded up to a multiple of `to`, a power of two.
fn round_up(x: usize, to: usize) -> usize {
    (x + to - 1) & !(to - 1)
}

fn large_len(layout: Layout) -> usize {
    round_up(layout.size(), PAGE)
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

/// A zeroed `T` in a box of the agent heap, or None when there is no memory
/// for it. `for_new_thread`: taken as `alloc_for_new_thread` takes it. The
/// agent's fallible allocations (a thread's state and buffers) use this
/// where `Box::new` would abort the program.
pub fn try_box_zeroed<T>(for_new_thread: bool) -> Option<Box<core::mem::MaybeUninit<T>>> {
    let layout = Layout::new::<T>();
    debug_assert!(layout.size() > 0);
    let p = if for_new_thread {
        alloc_for_new_thread(layout)
    } else {
        // SAFETY: a sized, non-zero layout.
        unsafe { crate::AGENT_HEAP.alloc_zeroed(layout) }
    };
    // SAFETY: `p` is a block of `layout` made the way the global allocator
    // (the agent heap) makes one, so the box frees it there; all-zero bytes
    // are a valid `MaybeUninit`.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p.cast::<core::mem::MaybeUninit<T>>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests count and map the process's memory: one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// This test process is far below its limit: the flag goes at the
    /// sweep that looks, the fifth, not before.
    #[test]
    fn the_mapping_limit_is_forgotten_when_the_process_is_below_it() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        note_mapping_refused();
        SWEEPS_SINCE_LOOK.store(0, Ordering::Relaxed);
        for _ in 1..SWEEPS_BETWEEN_LOOKS {
            forget_mapping_limit_when_below();
            assert!(at_mapping_limit());
        }
        forget_mapping_limit_when_below();
        assert!(!at_mapping_limit());
    }

    #[test]
    fn the_mappings_are_counted_as_the_kernel_counts_them() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // Other tests' threads may map memory (their stacks) between the
        // two reads: a few tries.
        let agrees = (0..5).any(|_| {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let counted = mapping_count_now().unwrap();
            counted > 10 && counted.abs_diff(maps.lines().count()) < 8
        });
        assert!(agrees, "the count never agreed with /proc/self/maps");
        let before = mapping_count_now().unwrap();
        // Three pages of one mapping (which may merge with a neighbour);
        // a different protection for the middle one splits it in three.
        let p = mmap_anonymous(3 * PAGE, libc::PROT_READ | libc::PROT_WRITE, 0);
        assert!(!p.is_null());
        // Other tests' threads may map memory meanwhile: a few tries.
        let split_adds_two = (0..5).any(|_| {
            let mapped = mapping_count_now().unwrap();
            let protect = |prot| {
                // SAFETY: the middle page of our own fresh mapping.
                assert_eq!(unsafe { libc::mprotect(p.add(PAGE).cast(), PAGE, prot) }, 0);
            };
            protect(libc::PROT_READ);
            let split = mapping_count_now().unwrap();
            protect(libc::PROT_READ | libc::PROT_WRITE);
            split == mapped + 2
        });
        assert!(split_adds_two);
        // SAFETY: our own mapping, unused.
        unsafe { libc::munmap(p.cast(), 3 * PAGE) };
        assert!(max_map_count().unwrap() > before);
    }

    /// The reserve hands out writable, zeroed pages; a freed block is reused
    /// (whole, or split for a smaller request) instead of dropped; and a
    /// request that would leave less than `keep` is refused.
    #[test]
    fn the_reserve_reuses_freed_blocks_and_keeps_what_it_is_told_to() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        set_aside_reserve();
        let start = RESERVE_START.load(Ordering::Acquire);
        assert_ne!(start, 0);
        let total = RESERVE_LEN.load(Ordering::Relaxed);

        // Past the first writable megabyte: made writable as handed out.
        let a = reserve_take(3 << 20, 0);
        assert!(!a.is_null());
        // SAFETY: 3 MiB of the reserve, ours.
        unsafe {
            assert_eq!(*a.add((3 << 20) - 1), 0);
            core::ptr::write_bytes(a, 7, 3 << 20);
        }
        unmap(a, 3 << 20);
        assert_eq!(RESERVE_FREED.load(Ordering::Relaxed), 3 << 20);

        // The freed block, split: its first page, then the next two.
        let b = reserve_take(PAGE, 0);
        assert_eq!(b, a);
        // SAFETY: a page of the reserve, ours; given back, it reads zero.
        assert_eq!(unsafe { *b }, 0);
        let c = reserve_take(2 * PAGE, 0);
        assert_eq!(c as usize, a as usize + PAGE);
        assert_eq!(RESERVE_FREED.load(Ordering::Relaxed), (3 << 20) - 3 * PAGE);

        // Nothing may be taken that would leave less than `keep`.
        let used = RESERVE_NEXT.load(Ordering::Relaxed) - start;
        let left = total - used + RESERVE_FREED.load(Ordering::Relaxed);
        assert!(reserve_take(PAGE, left).is_null());
        assert!(!reserve_take(PAGE, left - PAGE).is_null());
    }
}

//! Per-thread state: the re-entrancy guard, the event buffer, the unwinding
//! cache and the stack bounds.
//!
//! Found through a pthread key rather than Rust thread-locals: a key below 32
//! lives in the thread descriptor, so reading it never allocates (Rust TLS in
//! a dlopen-able library may call __tls_get_addr, which can call malloc), and
//! its destructor runs at every thread exit, including pthread_exit.

use crate::capture::unwind::{Bounds, Captured, StackCapture};
use crate::events::buffers::Buffer;
use crate::platform::arch::StartRegs;
use crate::platform::callback::Callback;
use crate::platform::lock::{RawLock, SpinLock};
use crate::platform::sys;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, Ordering};
use trapline_trace::{ChunkContext, Encoder};

const DEFERRED: usize = 32;

/// Which kind of hook captures a stack (each has its own cache).
#[derive(Clone, Copy)]
pub enum Site {
    Alloc = 0,
    Free = 1,
}

pub struct ThreadState {
    /// Depth of agent code on this thread's stack; >0 means a nested call
    /// (signal handler, or a libc function the agent called) passes through.
    pub guard: u32,
    /// Sampling periods that struck while this thread was inside a hook
    /// (the profiler's handler adds, the hook's `leave` writes them out).
    pub agent_periods: core::sync::atomic::AtomicU32,
    /// The stack of the program's call the hook serves (0: not taken).
    pub entered_stack: u32,
    pub tid: u32,
    /// Never records (the writer thread).
    pub agent_thread: bool,
    /// Counted among the program's running threads (`process_end`): started
    /// through the agent's `pthread_create`, and this is its first state.
    pub counted_running: bool,
    /// The owner is inside `emit` (set with plain stores; see `lock_buf`).
    busy: AtomicU32,
    /// A stealer wants the buffer, or holds it (the value is 1 while it does).
    steal: AtomicU32,
    buf: UnsafeCell<Option<Box<Buffer>>>,
    /// Time of this thread's latest event.
    pub last_time: u64,
    /// Separate caches for allocating and releasing hooks: a program that
    /// alternates malloc and free from one place then hits both every time.
    pub captures: [Box<StackCapture>; 2],
    /// `cache-audit`: repeats every capture with nothing remembered.
    #[cfg(feature = "cache-audit")]
    audit: Box<StackCapture>,
    /// framehop's unwind-rule caches, shared by both: their outer frames are the same.
    pub rules: crate::capture::unwind::RuleCaches,
    stack: Bounds,
    /// The thread's alternate signal stack (empty if none is enabled).
    altstack: Bounds,
    /// Where the thread last left its own stack for another one through
    /// `swapcontext` or `setcontext` (0 while it runs on it): the frames
    /// below are dead, and the scan does not read them.
    pub left_own_stack_at: u64,
    /// Frees of tracked blocks made while the guard was held (a signal handler
    /// interrupting the agent); applied when the outer hook leaves.
    pub deferred: [u64; DEFERRED],
    pub deferred_n: usize,
    /// (stack id, trace generation) pairs whose definitions this thread last ensured.
    pub ensured: [(u32, u32); 2],
    pub ensured_next: usize,
    /// CPU sampling state (`--profile`), set when the thread's timer is armed.
    pub profile: Option<Box<ThreadProfile>>,
    /// Stack ids of this thread's lock call sites (created on first lock use).
    pub lock_sites: Option<Box<SiteCache>>,
    /// Whether this thread keeps the run totals (`totals.rs`).
    pub heap_role: u8,
    /// The set-up that calls C library functions which allocate (the stack
    /// bounds, the exit destructor's key) is done, or under way.
    set_up: bool,
    /// The thread's alternate signal stack is the agent's side stack (the
    /// program set none): the program's `sigaltstack` queries see none.
    pub agent_altstack: bool,
    /// A nothrow `operator new` of this thread handed its failure to the C++
    /// runtime's own (`hooks/cxx.rs`): the function and call the inner
    /// `operator new` records for.
    pub delegated_new: Option<(trapline_trace::AllocFn, crate::platform::arch::StartRegs)>,
    /// Which allocations take a full stack (`--sample`).
    pub sampler: crate::events::sampling::Sampler,
    /// Production mode's calls and bytes per allocator function.
    pub call_counts: crate::events::call_counts::CallCounters,
    /// Production mode's locks held by this thread.
    pub held: crate::events::held::HeldLocks,
    /// Lock holds this thread recorded and has not released.
    pub locks_held: u32,
    /// The agent's time inside this thread's lock holds so far, in event
    /// clock ticks (`sync.rs`, "agent time inside holds").
    pub agent_ns_in_holds: u64,
    /// The tick when the hook under way started counting toward
    /// `agent_ns_in_holds` (`NOT_TIMING`: it does not).
    pub hook_tick: u64,
}

/// `ThreadState::hook_tick` when the hook under way is outside every hold.
pub const NOT_TIMING: u64 = u64::MAX;

static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
static KEY_LOCK: RawLock = RawLock::new();

struct Registry {
    threads: Vec<*mut ThreadState>,
}
struct RegistryCell {
    lock: RawLock,
    reg: UnsafeCell<Registry>,
}
// SAFETY: `reg` is only accessed with `lock` held.
unsafe impl Sync for RegistryCell {}
static REGISTRY: RegistryCell = RegistryCell {
    lock: RawLock::new(),
    reg: UnsafeCell::new(Registry {
        threads: Vec::new(),
    }),
};

/// The unwinding state of threads that ended, kept for the threads that
/// start next. A program that starts a thread per task otherwise paid, per
/// thread, five mappings and five unmappings (two captures with their id
/// caches, the side stack), the page faults of touching them again, and the
/// TLB shootdowns of unmapping in a multi-threaded process: thread start and
/// join took 86 instead of 36 microseconds. A reused id cache is warm, too
/// (stack ids are the process's).
struct Spare {
    captures: [Box<StackCapture>; 2],
    rules: crate::capture::unwind::RuleCaches,
}
const SPARES: usize = 8;
struct SparePool {
    lock: SpinLock,
    slots: UnsafeCell<[Option<Spare>; SPARES]>,
}
// SAFETY: `slots` is only accessed with `lock` held.
unsafe impl Sync for SparePool {}
static SPARE_POOL: SparePool = SparePool {
    lock: SpinLock::new(),
    slots: UnsafeCell::new([const { None }; SPARES]),
};

/// Bounded: never waits for another thread (a fork child inherits the lock
/// as it was, and `reset_in_child` frees it).
const SPARE_LOCK_SPINS: u32 = 1000;

/// Runs `f` on the pool's slots, or nothing if its lock is busy.
fn with_spares<R>(f: impl FnOnce(&mut [Option<Spare>; SPARES]) -> R) -> Option<R> {
    if !SPARE_POOL.lock.try_lock_for(SPARE_LOCK_SPINS) {
        return None;
    }
    // SAFETY: guarded by the pool lock.
    let r = f(unsafe { &mut *SPARE_POOL.slots.get() });
    SPARE_POOL.lock.unlock();
    Some(r)
}

fn take_spare() -> Option<Spare> {
    with_spares(|slots| slots.iter_mut().find_map(Option::take)).flatten()
}

/// Keeps `spare` for a later thread; dropped (unmapped), outside the lock,
/// if the pool is full or busy.
fn keep_spare(spare: Spare) {
    if crate::platform::heap::at_mapping_limit() {
        let id_cache = spare.captures[0].id_cache_ptr();
        if !crate::platform::heap::in_reserve(id_cache) {
            // Its mappings' slots go back to the program.
            return;
        }
    }
    let mut spare = Some(spare);
    with_spares(|slots| {
        if let Some(slot) = slots.iter_mut().find(|s| s.is_none()) {
            *slot = spare.take();
        }
    });
    drop(spare);
}

/// What a thread's agent state needs of the agent's memory (its captures,
/// rule caches and side stack, and a buffer), taken by the thread that
/// creates it before `pthread_create`: when there is none, that
/// `pthread_create` fails with `EAGAIN` (`heap::alloc_for_new_thread`),
/// instead of the new thread's first allocation failing and aborting the
/// program.
pub struct Provision {
    spare: Spare,
    buffer: Box<Buffer>,
}

impl Provision {
    /// A spare, or new parts, and a buffer; None if the agent has no memory
    /// for them.
    pub fn take() -> Option<Provision> {
        let spare = match take_spare() {
            Some(spare) => spare,
            None => Spare {
                captures: [
                    StackCapture::try_new_for_thread()?,
                    StackCapture::try_new_for_thread()?,
                ],
                rules: crate::capture::unwind::RuleCaches::new(),
            },
        };
        match crate::events::buffers::try_take_buffer(0, true) {
            Some(buffer) => Some(Provision { spare, buffer }),
            None => {
                keep_spare(spare);
                None
            }
        }
    }

    /// Gives back what was not used (the thread was not created).
    pub fn give_back(self) {
        keep_spare(self.spare);
        crate::events::buffers::submit(self.buffer, false);
    }
}

/// What a program thread's end does beyond flushing its buffer (the
/// profiler's teardown, its `ThreadEnd`, the count of running threads):
/// registered by runtime, which knows those services.
static PROGRAM_THREAD_ENDING: Callback<fn(&mut ThreadState)> = Callback::new();

/// Registers what a program thread's end runs, with the guard held and its
/// buffer still its own.
pub fn on_program_thread_ending(f: fn(&mut ThreadState)) {
    PROGRAM_THREAD_ENDING.set(f);
}

/// Threads between leaving the registry and handing over their last buffer
/// (`on_thread_exit`): their events are in no place `steal_all` looks, so
/// the exit does not hold the world stopped while one is (scan/world.rs).
static EXITING: AtomicU32 = AtomicU32::new(0);

/// How many threads are handing over their last buffer now.
pub fn exiting_threads() -> u32 {
    EXITING.load(Ordering::Acquire)
}

unsafe extern "C" fn on_thread_exit(p: *mut libc::c_void) {
    let ts = p as *mut ThreadState;
    EXITING.fetch_add(1, Ordering::AcqRel);
    // glibc cleared the key's value before calling this; a hook that runs
    // from here on (a later destructor) makes a new state.
    crate::platform::arch::set_thread_slot(core::ptr::null_mut());
    // Keep the state reachable while we flush, in case a later destructor allocates.
    {
        let _g = REGISTRY.lock.guard();
        // SAFETY: guarded by the registry lock.
        let reg = unsafe { &mut *REGISTRY.reg.get() };
        reg.threads.retain(|&t| t != ts);
    }
    // SAFETY: `ts` came from Box::into_raw in `create` and is no longer registered.
    let mut state = unsafe { Box::from_raw(ts) };
    state.guard += 1;
    if !state.agent_thread && !crate::phase::recording_stopped() {
        if let Some(ended) = PROGRAM_THREAD_ENDING.get() {
            ended(&mut state);
        }
    }
    if let Some(b) = state.take_buffer() {
        crate::events::buffers::submit(b, true);
    }
    state.call_counts.add_to(&crate::events::call_counts::ENDED);
    EXITING.fetch_sub(1, Ordering::AcqRel);
    if state.agent_altstack {
        // The side stack goes with the state (to another thread, or
        // unmapped): a signal arriving later in the thread's exit must not
        // be delivered there.
        // SAFETY: disabling this thread's alternate stack, which it is not on.
        unsafe { sys::sigaltstack(&sys::ALTSTACK_DISABLED, core::ptr::null_mut()) };
    }
    let ThreadState {
        captures,
        mut rules,
        ..
    } = *state;
    if crate::platform::heap::at_mapping_limit() {
        rules.release_side_stack();
    }
    keep_spare(Spare { captures, rules });
}

fn key() -> libc::pthread_key_t {
    let k = KEY.load(Ordering::Acquire);
    if k != u32::MAX {
        return k;
    }
    let _g = KEY_LOCK.guard();
    let k = KEY.load(Ordering::Acquire);
    if k != u32::MAX {
        return k;
    }
    let mut k: libc::pthread_key_t = 0;
    // SAFETY: creating a key with a valid destructor.
    unsafe { libc::pthread_key_create(&mut k, Some(on_thread_exit)) };
    KEY.store(k, Ordering::Release);
    k
}

/// The stack of the calling thread, whose tid is `tid`.
fn stack_bounds(tid: u32) -> Bounds {
    if tid == sys::getpid_raw() {
        if let Some(bounds) = main_stack_bounds() {
            return bounds;
        }
    }
    // SAFETY: pthread_getattr_np fills an attr we own and destroy.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) == 0 {
            let mut addr: *mut libc::c_void = core::ptr::null_mut();
            let mut size: usize = 0;
            libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            let lo = addr as u64;
            return Bounds::range(lo, lo + size as u64);
        }
    }
    Bounds::range(0, 0)
}

extern "C" {
    /// The loader's note of where the main thread's stack began (its
    /// highest frame; argv and the environment lie above it).
    static __libc_stack_end: *const c_void;
}

/// The main thread's stack as `pthread_getattr_np` works it out (up to the
/// page after `__libc_stack_end`, down by the stack's size limit or to the
/// mapping below), from /proc/self/maps read into the agent's own memory.
/// glibc reads that file with `fopen` and `getline`, whose FILE, 4 KiB
/// buffer and line came from the program's malloc heap and, freed, were
/// what the program's next allocations of those sizes got: the program's
/// heap was laid out differently from a run without the agent.
fn main_stack_bounds() -> Option<Bounds> {
    // SAFETY: a pointer-sized variable the loader sets before any code runs.
    let stack_end = unsafe { __libc_stack_end } as u64;
    let maps = crate::platform::proc_maps::read();
    let i = maps
        .iter()
        .position(|m| m.start <= stack_end && stack_end < m.end)?;
    let below = if i == 0 { 0 } else { maps[i - 1].end };
    let page = 4096;
    let hi = (stack_end & !(page - 1)) + page;
    let limit = sys::soft_limit(libc::RLIMIT_STACK)?;
    let size = limit.saturating_sub(maps[i].end - hi) & !(page - 1);
    let size = size.min(hi - below);
    Some(Bounds::range(hi - size, hi))
}

/// The calling thread's alternate signal stack, if it has one enabled.
fn current_altstack() -> Bounds {
    // SAFETY: a zeroed stack_t is valid; sigaltstack(NULL, &old) only writes `old`.
    let mut old: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { sys::sigaltstack(core::ptr::null(), &mut old) };
    altstack_of((r == 0).then_some(&old))
}

/// The range of an alternate signal stack setting (empty when disabled).
pub fn altstack_of(ss: Option<&libc::stack_t>) -> Bounds {
    match ss {
        Some(ss) if ss.ss_flags & libc::SS_DISABLE == 0 && ss.ss_size > 0 => {
            let lo = ss.ss_sp as u64;
            Bounds::range(lo, lo.saturating_add(ss.ss_size as u64))
        }
        _ => Bounds::range(0, 0),
    }
}

/// A new state for the calling thread. With `set_up`, also does the set-up
/// that calls C library functions which allocate (`finish_set_up`): only
/// where the program cannot be inside its own allocator (see `current`).
fn create(set_up: bool, provision: Option<Provision>) -> *mut ThreadState {
    let (spare, buffer) = match provision {
        Some(Provision { spare, buffer }) => (Some(spare), Some(buffer)),
        None => (take_spare(), None),
    };
    let (captures, rules) = match spare {
        Some(Spare {
            mut captures,
            rules,
        }) => {
            for c in &mut captures {
                c.invalidate();
            }
            (captures, rules)
        }
        None => (
            [StackCapture::new(), StackCapture::new()],
            crate::capture::unwind::RuleCaches::new(),
        ),
    };
    let tid = sys::gettid();
    let buffer = buffer.map(|mut b| {
        b.reset(tid, crate::events::buffers::GEN.load(Ordering::Relaxed));
        b
    });
    let ts = Box::into_raw(Box::new(ThreadState {
        guard: 1, // the set-up below may allocate through the hooks
        agent_periods: core::sync::atomic::AtomicU32::new(0),
        entered_stack: 0,
        tid,
        agent_thread: false,
        counted_running: false,
        busy: AtomicU32::new(0),
        steal: AtomicU32::new(0),
        buf: UnsafeCell::new(buffer),
        last_time: 0,
        captures,
        #[cfg(feature = "cache-audit")]
        audit: StackCapture::new(),
        rules,
        stack: Bounds::range(0, 0),
        altstack: Bounds::range(0, 0),
        left_own_stack_at: 0,
        deferred: [0; DEFERRED],
        deferred_n: 0,
        ensured: [(0, 0); 2],
        ensured_next: 0,
        profile: None,
        lock_sites: None,
        heap_role: ROLE_UNKNOWN,
        sampler: crate::events::sampling::Sampler::new(
            u64::from(tid).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ crate::platform::clock::unix_ns(),
        ),
        call_counts: crate::events::call_counts::CallCounters::new(),
        held: crate::events::held::HeldLocks::new(),
        set_up: false,
        agent_altstack: false,
        delegated_new: None,
        locks_held: 0,
        agent_ns_in_holds: 0,
        hook_tick: NOT_TIMING,
    }));
    // The slot first: every hook the set-up below causes must find this
    // state (guard 1: nested).
    crate::platform::arch::set_thread_slot(ts as *mut u8);
    {
        let _g = REGISTRY.lock.guard();
        // SAFETY: guarded by the registry lock.
        unsafe { &mut *REGISTRY.reg.get() }.threads.push(ts);
    }
    let altstack = current_altstack();
    // SAFETY: `ts` is ours and not yet shared beyond the registry (which only touches buf).
    unsafe {
        (*ts).altstack = altstack;
        if set_up {
            finish_set_up(&mut *ts);
        }
        (*ts).guard = 0;
    }
    ts
}

/// The set-up that calls C library functions which allocate: the stack
/// bounds (`pthread_getattr_np` opens /proc/self/maps for the main thread,
/// reallocates an affinity mask for others) and the key whose destructor
/// ends the thread's trace (glibc's first `pthread_setspecific` of a key at
/// 32 or above calls `calloc`).
#[cold]
#[inline(never)]
fn finish_set_up(ts: &mut ThreadState) {
    // First: the hooks these calls reach find the set-up under way.
    ts.set_up = true;
    ts.guard += 1;
    let p = ts as *mut ThreadState;
    // SAFETY: the key exists; `p` is this thread's state, freed only by the
    // key's destructor.
    unsafe { libc::pthread_setspecific(key(), p as *const libc::c_void) };
    ts.stack = stack_bounds(ts.tid);
    // A stack overflow then still ends the trace properly (side_stack.rs).
    // Handlers of the program's with SA_ONSTACK run there too, and their
    // captures continue past the signal frame onto this stack (recording.md, "Stack reads stay inside the stack").
    if ts.altstack.hi == 0 && ts.rules.side().install_as_altstack() {
        ts.agent_altstack = true;
        let (lo, hi) = ts.rules.side().altstack_range();
        ts.altstack = Bounds::range(lo, hi);
    }
    ts.guard -= 1;
}

/// This thread's state, created on first use, for a hook where the program
/// cannot be inside its own allocator: the allocation hooks (a program whose
/// executable defines `malloc` never reaches them: that `malloc` shadows the
/// agent's), thread start, the constructor. The set-up that calls
/// allocating C library functions happens here.
#[inline]
pub fn current() -> &'static mut ThreadState {
    let p = crate::platform::arch::thread_slot() as *mut ThreadState;
    let p = if p.is_null() { create(true, None) } else { p };
    // SAFETY: only this thread uses its state mutably (stealers only touch `buf` while holding `steal` with the owner outside `emit`).
    let ts = unsafe { &mut *p };
    if !ts.set_up {
        finish_set_up(ts);
    }
    ts
}

/// The thread's state if it has one, set up: two loads, and no call (a
/// hook's fast path, which then needs no frame of its own).
#[inline(always)]
pub fn current_if_set_up() -> Option<&'static mut ThreadState> {
    let p = crate::platform::arch::thread_slot() as *mut ThreadState;
    if p.is_null() {
        return None;
    }
    // SAFETY: as in `current`.
    let ts = unsafe { &mut *p };
    ts.set_up.then_some(ts)
}

/// The state of a thread the agent's `pthread_create` started, made from
/// what its creator took for it (`Provision`).
pub fn begin(provision: Provision) -> &'static mut ThreadState {
    let p = crate::platform::arch::thread_slot() as *mut ThreadState;
    if p.is_null() {
        // SAFETY: as in `current`.
        return unsafe { &mut *create(true, Some(provision)) };
    }
    // A state already (a hook ran before the wrapper: a sanitizer's or a
    // library's thread-start hook): the provision goes back to the pool.
    provision.give_back();
    current()
}

/// This thread's state, created on first use without calling C library
/// functions that allocate: for the lock hooks, which a program's own
/// allocator calls from inside itself (jemalloc's first `malloc` takes its
/// init lock, then locks another mutex: a `malloc` from the agent there
/// re-entered jemalloc's initialisation and waited for its own lock
/// forever). Until `current` finishes the set-up, the thread's stack bounds
/// are unknown (its captures read the current page) and its state is not
/// freed when it exits.
#[inline]
pub fn current_without_allocating() -> &'static mut ThreadState {
    let p = crate::platform::arch::thread_slot() as *mut ThreadState;
    let p = if p.is_null() { create(false, None) } else { p };
    // SAFETY: as in `current`.
    unsafe { &mut *p }
}

/// This thread's state if it has one (never allocates: for signal handlers).
pub fn current_if_any() -> Option<&'static mut ThreadState> {
    let p = crate::platform::arch::thread_slot() as *mut ThreadState;
    // SAFETY: as in `current`.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// Where the calling thread's own stack is live from, given a stack pointer
/// `sp` read on this thread: the stack pointer where the agent switched to
/// its side stack, when `sp` is on that (signal handlers may call this).
pub fn own_stack_sp(sp: u64) -> u64 {
    current_if_any().map_or(sp, |ts| ts.rules.side().thread_sp(sp))
}

/// Marks the calling thread as the agent's own: it never records.
pub fn mark_agent_thread() {
    let ts = current_without_allocating();
    // Without the set-up that allocates through the C library (its stack
    // bounds and the exit key): the thread never records, and glibc's
    // malloc there gave it an arena of its own (64 MiB of address space in
    // the program's process, and one of the arenas the program's threads
    // are spread over).
    ts.set_up = true;
    ts.agent_thread = true;
    ts.guard = 1;
    crate::platform::agent_threads::note_current();
}

/// The writer thread, about to end the process for a program whose threads
/// are all gone (`process_end`), becomes a program thread: the exit handlers
/// it runs are the program's.
pub fn adopt_for_program() {
    let ts = current_without_allocating();
    ts.agent_thread = false;
    ts.guard = 0;
    // Its stack bounds, for the captures of the exit handlers it runs.
    ts.set_up = false;
    current();
}

impl ThreadState {
    /// A time for an event of this thread that no shard or lock orders:
    /// the tick, never before the thread's previous event.
    #[inline]
    pub fn next_time(&mut self) -> u64 {
        let t = crate::platform::clock::tick().max(self.last_time);
        self.last_time = t;
        t
    }

    /// The same from the precise clock, for rare events whose order against
    /// other threads' precise events matters (thread lifecycle, join).
    pub fn next_precise_time(&mut self) -> u64 {
        let t = crate::platform::clock::precise_now().max(self.last_time);
        self.last_time = t;
        t
    }

    /// Stack bounds for a capture starting at stack pointer `sp`: from just
    /// below `sp` to the top of the stack it is on. On the alternate signal
    /// stack the walk may continue on the thread's own stack past a signal
    /// frame; on any other stack (a coroutine's) only the current page is
    /// known to be mapped.
    pub fn bounds_for(&self, sp: u64) -> Bounds {
        let on = |s: &Bounds| sp >= s.lo && sp < s.hi;
        let (lo, hi) = if on(&self.stack) {
            (self.stack.lo, self.stack.hi)
        } else if on(&self.altstack) {
            (self.altstack.lo, self.altstack.hi)
        } else {
            (sp, (sp | 4095) + 1)
        };
        Bounds {
            lo: sp.saturating_sub(crate::platform::arch::RED_ZONE).max(lo),
            hi,
            thread_lo: self.stack.lo,
            thread_hi: self.stack.hi,
        }
    }

    /// The thread switches to another stack from stack pointer `sp`
    /// (`hooks/context.rs`).
    pub fn leaving_stack_at(&mut self, sp: u64) {
        if self.on_own_stack(sp) {
            self.left_own_stack_at = sp;
        }
    }

    /// Where the thread's own stack is live from while the thread runs at
    /// `sp` elsewhere: where it left it, or 0 when it runs on it (then it
    /// came back, and nothing of it is left behind).
    pub fn own_stack_left_at(&mut self, sp: u64) -> u64 {
        if self.on_own_stack(sp) {
            self.left_own_stack_at = 0;
        }
        self.left_own_stack_at
    }

    fn on_own_stack(&self, sp: u64) -> bool {
        sp >= self.stack.lo && sp < self.stack.hi
    }

    /// Notes the thread's new alternate signal stack (the `sigaltstack` hook).
    pub fn set_altstack(&mut self, altstack: Bounds) {
        self.altstack = altstack;
    }

    /// Captures the call stack from a hook's registers (`before_unwinding`:
    /// see `StackCapture::capture`).
    #[inline]
    pub fn capture(
        &mut self,
        start: StartRegs,
        site: Site,
        before_unwinding: impl FnOnce(),
    ) -> Captured {
        let b = self.bounds_for(start.sp);
        let captured =
            self.captures[site as usize].capture(start, b, &mut self.rules, before_unwinding);
        #[cfg(feature = "cache-audit")]
        {
            self.audit.invalidate();
            let full = self.audit.capture(start, b, &mut self.rules, || {});
            crate::capture::unwind::audit::note(captured.id, full.id);
        }
        captured
    }

    /// The owner's half of an asymmetric Dekker handshake: announce with a
    /// plain store, then look for a stealer. A stealer announces itself and
    /// then runs `sys::process_barrier`, which orders our store before its
    /// check, so at least one side sees the other. No atomic read-modify-write
    /// on the event path. Without membarrier, both sides use atomic swaps.
    #[inline]
    fn lock_buf(&self) {
        if sys::has_membarrier() {
            loop {
                self.busy.store(1, Ordering::Relaxed);
                core::sync::atomic::compiler_fence(Ordering::SeqCst);
                if self.steal.load(Ordering::Relaxed) == 0 {
                    core::sync::atomic::fence(Ordering::Acquire);
                    return;
                }
                self.busy.store(0, Ordering::Release);
                while self.steal.load(Ordering::Acquire) != 0 {
                    core::hint::spin_loop();
                }
            }
        }
        loop {
            self.busy.swap(1, Ordering::SeqCst);
            if self.steal.load(Ordering::SeqCst) == 0 {
                return;
            }
            self.busy.store(0, Ordering::Release);
            while self.steal.load(Ordering::Acquire) != 0 {
                core::hint::spin_loop();
            }
        }
    }

    #[inline]
    fn unlock_buf(&self) {
        self.busy.store(0, Ordering::Release);
    }

    /// The stealer's half: claim, force the owner's stores visible, wait until
    /// the owner is out of `emit`. Gives up after `spins` rounds.
    fn steal_lock(&self, spins: u32) -> bool {
        if self
            .steal
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if sys::has_membarrier() {
            sys::process_barrier();
        }
        for _ in 0..spins.max(1) {
            if self.busy.load(Ordering::SeqCst) == 0 {
                core::sync::atomic::fence(Ordering::Acquire);
                return true;
            }
            core::hint::spin_loop();
        }
        self.steal.store(0, Ordering::Release);
        false
    }

    fn steal_unlock(&self) {
        self.steal.store(0, Ordering::Release);
    }

    /// Takes this thread's buffer (the owner, at thread exit).
    fn take_buffer(&self) -> Option<Box<Buffer>> {
        self.lock_buf();
        // SAFETY: we are the owner inside lock_buf/unlock_buf; no stealer holds the buffer.
        let b = unsafe { (*self.buf.get()).take() };
        self.unlock_buf();
        b
    }

    /// Hands this thread's events so far to the writer (before it blocks for good).
    pub fn flush(&mut self) {
        if let Some(b) = self.take_buffer() {
            crate::events::buffers::submit(b, false);
        }
    }

    /// Appends one event to this thread's buffer.
    #[inline]
    pub fn emit(
        &mut self,
        time: Option<u64>,
        f: impl FnOnce(&mut Encoder<'_>, &mut ChunkContext) -> Result<(), trapline_trace::event::NoRoom>,
    ) {
        self.lock_buf();
        // SAFETY: we are the owner inside lock_buf/unlock_buf; no stealer holds the buffer.
        let slot = unsafe { &mut *self.buf.get() };
        let gen = crate::events::buffers::GEN.load(Ordering::Relaxed);
        let needs_new = match slot {
            Some(b) => b.room() < crate::events::buffers::EVENT_RESERVE || b.gen != gen,
            None => true,
        };
        if needs_new {
            let old = slot.take();
            *slot = crate::events::buffers::try_take_buffer(self.tid, false);
            if let Some(old) = old {
                // Submitting may wait for the writer; release our lock so a
                // stealer is never blocked behind us.
                self.unlock_buf();
                crate::events::buffers::submit(old, true);
                self.lock_buf();
            }
        }
        // SAFETY: as above.
        let slot = unsafe { &mut *self.buf.get() };
        if slot.is_none() {
            // A stealer took the fresh buffer while we were submitting the
            // old one (the periodic sweep runs on the writer thread that the
            // submit just woke): the event still needs a place.
            *slot = crate::events::buffers::try_take_buffer(self.tid, false);
        }
        // No buffer: the agent had no memory for one (the process is at its
        // limit of mappings and the reserve is spent). The event is lost,
        // and counted, rather than the program aborted.
        let pushed = slot.as_mut().is_some_and(|b| b.push(time, f));
        if !pushed {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
        self.unlock_buf();
    }
}

/// Takes the partly filled buffers of every thread and queues them (periodic
/// flush, exit). `spins` bounds the wait for a thread that is mid-event.
pub fn steal_all(spins: u32) {
    steal_all_into(spins, |b| crate::events::buffers::submit(b, false));
}

/// The same, handing each buffer to `sink` (the signal path writes them directly).
pub fn steal_all_into(spins: u32, mut sink: impl FnMut(Box<Buffer>)) {
    if !REGISTRY.lock.try_lock_for(spins.max(1)) {
        return;
    }
    // SAFETY: guarded by the registry lock.
    let reg = unsafe { &*REGISTRY.reg.get() };
    for &ts in &reg.threads {
        // SAFETY: registered states stay alive until unregistered under this lock.
        let ts = unsafe { &*ts };
        if !ts.steal_lock(spins) {
            continue;
        }
        // SAFETY: the owner is outside `emit` and waits for us (steal_lock).
        let b = unsafe { (*ts.buf.get()).take() };
        ts.steal_unlock();
        if let Some(b) = b {
            sink(b);
        }
    }
    REGISTRY.lock.unlock();
}

/// Production mode's calls per allocator function: those of the threads
/// that ended and of those still registered (the finish reads them once
/// the program's threads are held).
pub fn call_counts() -> crate::events::call_counts::CallCounters {
    use crate::events::call_counts::{CallCounters, ENDED};
    let sum = CallCounters::new();
    ENDED.add_to(&sum);
    if REGISTRY.lock.try_lock_for(1000) {
        // SAFETY: guarded by the registry lock.
        let reg = unsafe { &*REGISTRY.reg.get() };
        for &ts in &reg.threads {
            // SAFETY: registered states stay alive until unregistered under this lock.
            unsafe { &*ts }.call_counts.add_to(&sum);
        }
        REGISTRY.lock.unlock();
    }
    sum
}

/// Takes every thread's sampling periods still pending inside a hook (the
/// process is finishing: no hook will write them), summed.
pub fn take_pending_agent_periods() -> u64 {
    if !REGISTRY.lock.try_lock_for(1000) {
        return 0;
    }
    // SAFETY: guarded by the registry lock.
    let reg = unsafe { &*REGISTRY.reg.get() };
    let pending = reg
        .threads
        .iter()
        // SAFETY: registered states stay alive until unregistered under this lock.
        .map(|&ts| u64::from(unsafe { &*ts }.agent_periods.swap(0, Ordering::Relaxed)))
        .sum();
    REGISTRY.lock.unlock();
    pending
}

/// Fork prepare: hold the registry and every buffer lock.
pub fn lock_all() {
    REGISTRY.lock.lock();
    // SAFETY: guarded by the registry lock.
    for &ts in unsafe { &(*REGISTRY.reg.get()).threads } {
        // SAFETY: registered states are alive.
        while !unsafe { &*ts }.steal_lock(u32::MAX) {
            core::hint::spin_loop();
        }
    }
}

pub fn unlock_all() {
    // SAFETY: we hold the registry lock (taken in lock_all).
    for &ts in unsafe { &(*REGISTRY.reg.get()).threads } {
        // SAFETY: registered states are alive.
        unsafe { &*ts }.steal_unlock();
    }
    REGISTRY.lock.unlock();
}

/// Fork child: only the calling thread survives; its buffer held the parent's events.
pub fn reset_in_child() {
    let me = crate::platform::arch::thread_slot() as *mut ThreadState;
    REGISTRY.lock.reset();
    KEY_LOCK.reset();
    SPARE_POOL.lock.reset();
    // Threads of the parent that were on their way out are gone.
    EXITING.store(0, Ordering::Relaxed);
    // SAFETY: single-threaded child.
    let reg = unsafe { &mut *REGISTRY.reg.get() };
    // Other threads' states are gone with their threads; their memory is leaked
    // on purpose (freeing could race nothing, but their buffers are the parent's).
    reg.threads.retain(|&t| t == me);
    if !me.is_null() {
        // SAFETY: our own state.
        let ts = unsafe { &mut *me };
        ts.busy.store(0, Ordering::Relaxed);
        ts.steal.store(0, Ordering::Relaxed);
        // SAFETY: single-threaded.
        if let Some(b) = unsafe { (*ts.buf.get()).as_mut() } {
            b.reset(ts.tid, 0);
        }
        ts.tid = sys::gettid();
        // The child's trace counts its own calls.
        ts.call_counts.clear();
        crate::events::call_counts::ENDED.clear();
        ts.held.forked();
        for c in &mut ts.captures {
            c.invalidate();
        }
        ts.last_time = 0;
    }
}

/// A thread's CPU-sampling state (profile.rs): its capture scratch and its
/// slot in the profiler's table.
pub struct ThreadProfile {
    pub capture: Box<crate::capture::unwind::StackCapture>,
    pub slot: usize,
}

pub const SITE_SLOTS: usize = 256;

#[derive(Clone, Copy, Default)]
pub struct SiteSlot {
    pub lock: u64,
    pub ret: u64,
    pub sp: u64,
    pub id: u32,
    /// Trace generation whose file holds the stack's definition.
    pub gen: u32,
    /// The lock's slot in `LOCKS`.
    pub lock_slot: u32,
}

/// One thread's cache of lock call sites (sync.rs).
pub struct SiteCache {
    pub slots: [SiteSlot; SITE_SLOTS],
}

impl SiteCache {
    /// Built in place on the heap (10 KiB: as a value it was built on the
    /// stack of the thread's first lock call).
    pub fn new() -> Box<SiteCache> {
        // SAFETY: every field of a slot is an integer; all zero is the
        // default (empty) slot.
        unsafe { Box::new_zeroed().assume_init() }
    }
}

/// `ThreadState::heap_role` values (totals.rs): whether the thread is the
/// one whose heap events the exact totals follow.
pub const ROLE_UNKNOWN: u8 = 0;
pub const ROLE_OWNER: u8 = 1;
pub const ROLE_OTHER: u8 = 2;

#[cfg(test)]
mod tests {
    use super::{current, steal_all_into};
    use crate::events::buffers;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use trapline_trace::{Decoder, Event};

    /// The test's events in a buffer: the agent's hooks are live in this
    /// binary too, so its threads' allocations are recorded beside them.
    fn test_events(b: &buffers::Buffer) -> u64 {
        let events = Decoder::new(&b.data[..b.len]).map(|e| e.expect("decodes"));
        events
            .filter(|e| matches!(e, Event::ThreadEnd { .. }))
            .count() as u64
    }

    /// Four threads record 100,000 events each while another steals their
    /// partly filled buffers as fast as it can (the writer's sweep): every
    /// event arrives once, in a stolen buffer or in one its owner queued
    /// (a full one, or its last by `flush`).
    #[test]
    fn the_stealer_takes_each_event_once_while_its_owner_records() {
        const THREADS: u64 = 4;
        const EVENTS: u64 = 100_000;
        let stop = Arc::new(AtomicBool::new(false));
        let stolen = Arc::new(AtomicU64::new(0));
        let stealer = {
            let (stop, stolen) = (stop.clone(), stolen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    steal_all_into(1000, |b| {
                        stolen.fetch_add(test_events(&b), Ordering::Relaxed);
                    });
                }
            })
        };
        let owners: Vec<_> = (0..THREADS)
            .map(|_| {
                std::thread::spawn(|| {
                    let ts = current();
                    for t in 1..=EVENTS {
                        ts.emit(Some(t), |e, c| e.event(c, &Event::ThreadEnd { time: t }));
                    }
                    ts.flush();
                })
            })
            .collect();
        owners.into_iter().for_each(|t| t.join().unwrap());
        stop.store(true, Ordering::Release);
        stealer.join().unwrap();
        let queued = buffers::with_queue(|q| {
            let events = q.full.iter().map(|b| test_events(b)).sum::<u64>();
            q.full.clear();
            q.queued_bytes = 0;
            events
        });
        assert_eq!(stolen.load(Ordering::Relaxed) + queued, THREADS * EVENTS);
    }
}

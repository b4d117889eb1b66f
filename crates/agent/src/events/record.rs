//! What the hooks do around the real allocator: look the block up in the live
//! table, detect misuse, capture the stack and append the event.

use crate::events::thread::{self, Site, ThreadState};
use crate::events::totals;
use crate::platform::arch::StartRegs;
use crate::tracking::access;
use crate::tracking::live::{self, Block, Freed};
use crate::tracking::untracked;
use crate::{capture::stacks, platform::clock};
use core::sync::atomic::{AtomicU64, Ordering};
use trapline_trace::{AllocFn, ErrorKind, Event};

/// How a hook may use the agent right now.
pub enum Entry {
    /// Recording: the thread state, guard taken.
    Record(&'static mut ThreadState),
    /// Inside the agent already (signal handler or agent-internal call).
    Nested(&'static mut ThreadState),
    /// Not recording (finished, or a thread of the agent).
    Off,
}

#[inline]
pub fn enter() -> Entry {
    if crate::phase::recording_stopped() {
        return Entry::Off;
    }
    enter_with(thread::current())
}

/// `enter` for hooks that the program's own allocator may call from inside
/// itself (locks): never calls a C library function that allocates.
#[inline]
pub fn enter_without_allocating() -> Entry {
    if crate::phase::recording_stopped() {
        return Entry::Off;
    }
    enter_with(thread::current_without_allocating())
}

#[inline(always)]
fn enter_with(ts: &'static mut ThreadState) -> Entry {
    if ts.agent_thread || cfg!(feature = "layer-forward") {
        return Entry::Off;
    }
    if ts.guard > 0 {
        return Entry::Nested(ts);
    }
    ts.guard = 1;
    ts.entered_stack = 0;
    if ts.locks_held != 0 {
        // The program holds a lock: this hook's time is not its hold's.
        ts.hook_tick = clock::tick();
    }
    // A signal handler on this thread reads the guard: the store must not
    // move past the work it protects (free on the hot path: no instruction).
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    Entry::Record(ts)
}

#[inline]
pub fn leave(ts: &mut ThreadState) {
    if ts.deferred_n > 0 {
        apply_deferred(ts);
    }
    if ts.agent_periods.load(Ordering::Relaxed) != 0 {
        write_agent_samples(ts);
    }
    if ts.hook_tick != thread::NOT_TIMING {
        fold_hook_time(ts);
        ts.hook_tick = thread::NOT_TIMING;
    }
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    ts.guard = 0;
    crate::platform::arch::clear_scratch_registers();
}

/// Adds the time since `hook_tick` to the agent's time inside holds and
/// restarts the count. On the event clock's tick, as holds are measured:
/// a hook that a tick falls into counts a tick period, one that none does
/// counts nothing, which sums, like the holds, to the true time.
#[inline]
pub fn fold_hook_time(ts: &mut ThreadState) {
    let now = clock::tick();
    ts.agent_ns_in_holds += now.saturating_sub(ts.hook_tick);
    ts.hook_tick = now;
}

/// Writes the sampling periods that struck inside the hook this thread is
/// leaving, charged to the program's call it served (its stack, taken for
/// the call's event; 0 when none was).
#[cold]
fn write_agent_samples(ts: &mut ThreadState) {
    let periods = ts.agent_periods.swap(0, Ordering::Relaxed);
    let stack = ts.entered_stack;
    let time = ts.next_time();
    ts.emit(Some(time), |e, c| {
        e.event(
            c,
            &Event::AgentSamples {
                time,
                stack,
                periods,
            },
        )
    });
}

#[cold]
fn apply_deferred(ts: &mut ThreadState) {
    while ts.deferred_n > 0 {
        ts.deferred_n -= 1;
        let addr = ts.deferred[ts.deferred_n];
        let mut shard = live::shard_of(addr).locked();
        let removed = shard.remove(addr);
        if removed.is_some() && crate::config::production() {
            shard.sampled_released(addr);
        }
        let t = shard.stamp(clock::tick(), ts.last_time);
        drop(shard);
        ts.last_time = t;
        if let Some(b) = removed {
            totals::free(ts, b.size);
            ts.emit(Some(t), |e, c| e.free(c, t, addr, AllocFn::Free, 0));
        }
        // Released only now that the table no longer holds it, so another
        // thread cannot be handed this address while it is still listed.
        // SAFETY: a block the program freed from a nested context (it was live).
        unsafe { crate::events::next_alloc::free(addr as *mut u8) };
    }
}

/// Queues a nested free of a tracked block for `apply_deferred`. Returns
/// false if the queue is full: then the block is released at once and its
/// table entry goes stale (counted as a lost event).
fn defer_free(ts: &mut ThreadState, addr: u64) -> bool {
    if ts.deferred_n < ts.deferred.len() {
        ts.deferred[ts.deferred_n] = addr;
        ts.deferred_n += 1;
        true
    } else {
        crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        false
    }
}

/// Makes sure the trace being written holds the definition of `id`.
#[inline(always)]
pub fn ensure_stack(ts: &mut ThreadState, id: u32, new: bool) {
    if id == 0 {
        return;
    }
    let gen = crate::events::buffers::GEN.load(Ordering::Relaxed);
    // Stacks this thread used last (its latest alloc and free stacks) are
    // already known to be in this trace: skip the shared record.
    if !new && (ts.ensured[0] == (id, gen) || ts.ensured[1] == (id, gen)) {
        return;
    }
    ensure_stack_shared(ts, id, gen, new);
}

#[inline(never)]
fn ensure_stack_shared(ts: &mut ThreadState, id: u32, gen: u32, new: bool) {
    ts.ensured[ts.ensured_next] = (id, gen);
    ts.ensured_next ^= 1;
    let Some(rec) = stacks::record(id) else {
        return;
    };
    if !new && rec.written_gen.load(Ordering::Relaxed) == gen {
        return;
    }
    if rec.written_gen.swap(gen, Ordering::AcqRel) != gen || new {
        let frames = stacks::frames(id);
        ts.emit(None, |e, _| define_stack(e, id, rec, frames));
    }
}

/// Captures the stack from a hook's registers (with `site`'s cache) and makes
/// sure the trace being written defines it. Returns the stack id (0: none).
#[inline(always)]
pub fn capture_stack(ts: &mut ThreadState, regs: StartRegs, site: Site) -> u32 {
    capture_stack_then(ts, regs, site, || {})
}

/// `capture_stack`, running `before_unwinding` first when the stack changed
/// (see `StackCapture::capture`).
#[inline(always)]
pub fn capture_stack_then(
    ts: &mut ThreadState,
    regs: StartRegs,
    site: Site,
    before_unwinding: impl FnOnce(),
) -> u32 {
    if cfg!(feature = "layer-no-stacks") {
        return 0;
    }
    let cap = ts.capture(regs, site, before_unwinding);
    let (id, gen) = (cap.id, crate::events::buffers::GEN.load(Ordering::Relaxed));
    ts.entered_stack = id;
    // Known to be in this trace: through the id cache, or as one of the
    // stacks this thread used last (its latest alloc and free stacks).
    if id == 0
        || (!cap.new
            && (cap.defined_in == gen || ts.ensured[0] == (id, gen) || ts.ensured[1] == (id, gen)))
    {
        return id;
    }
    ensure_stack_shared(ts, id, gen, cap.new);
    ts.captures[site as usize].note_defined(id, gen);
    id
}

/// The stack an allocation of `size` bytes records: its full stack, or,
/// under sampled recording, only its caller unless the sampler picks it
/// (`sampling.rs`). `before_unwinding` runs either way.
#[inline(always)]
fn allocation_stack(
    ts: &mut ThreadState,
    regs: StartRegs,
    size: u64,
    before_unwinding: impl FnOnce(),
) -> u32 {
    let mean = crate::config::sample_bytes();
    if mean != 0 && !ts.sampler.takes_stack(size, mean) {
        before_unwinding();
        let id = caller_stack(ts, regs.pc);
        ts.entered_stack = id;
        return id;
    }
    capture_stack_then(ts, regs, Site::Alloc, before_unwinding)
}

/// The caller-only stack of an allocation returning to `caller`, defined
/// in the trace being written (0 if ids ran out).
#[inline]
pub fn caller_stack(ts: &mut ThreadState, caller: u64) -> u32 {
    let gen = crate::events::buffers::GEN.load(Ordering::Relaxed);
    match ts.sampler.cached_caller(caller, gen) {
        Some(id) => id,
        None => caller_stack_slow(ts, caller, gen),
    }
}

#[cold]
fn caller_stack_slow(ts: &mut ThreadState, caller: u64, gen: u32) -> u32 {
    let Some((id, new)) = stacks::intern_caller(caller) else {
        return 0;
    };
    ensure_stack(ts, id, new);
    ts.sampler.cache_caller(caller, id, gen);
    id
}

/// Writes the definition of a stack id from any thread (snapshot, errors).
pub fn ensure_stack_in(buf: &mut crate::events::buffers::Buffer, id: u32) -> bool {
    if id == 0 {
        return true;
    }
    let gen = crate::events::buffers::GEN.load(Ordering::Relaxed);
    let Some(rec) = stacks::record(id) else {
        return true;
    };
    if rec.written_gen.load(Ordering::Relaxed) == gen
        || rec.written_gen.swap(gen, Ordering::AcqRel) == gen
    {
        return true;
    }
    let frames = stacks::frames(id);
    buf.push(None, |e, _| define_stack(e, id, rec, frames))
}

/// Encodes the definition of stack `id`: its frames, or its caller only.
fn define_stack(
    e: &mut trapline_trace::Encoder<'_>,
    id: u32,
    rec: &stacks::StackRec,
    frames: &[u64],
) -> Result<(), trapline_trace::event::NoRoom> {
    match frames {
        [caller] if rec.caller_only => e.caller_only_stack_def(id, *caller),
        _ => e.stack_def(id, frames),
    }
}

/// Records an allocation call that failed (`AllocFailed`): NULL for a
/// request of at least a byte, an error from `posix_memalign`, or
/// `std::bad_alloc` from `operator new`. Off the hot path.
#[cold]
pub fn failed(func: AllocFn, size: u64, align: u64, regs: StartRegs) {
    if !crate::config::memory_recorded() {
        return;
    }
    if let Entry::Record(ts) = enter() {
        let stack = capture_stack(ts, regs, Site::Alloc);
        emit_failed(ts, func, size, align, stack);
        leave(ts);
    }
}

fn emit_failed(ts: &mut ThreadState, func: AllocFn, size: u64, align: u64, stack: u32) {
    totals::failed(ts);
    let time = ts.next_time();
    let ev = Event::AllocFailed {
        time,
        func,
        size,
        align,
        stack,
    };
    ts.emit(Some(time), |e, c| e.event(c, &ev));
}

/// Records an allocation that returned `addr`.
#[inline]
pub fn alloc(func: AllocFn, addr: *mut u8, size: usize, align: usize, regs: StartRegs) {
    if !crate::config::memory_recorded() {
        return;
    }
    if addr.is_null() {
        // NULL for zero bytes is allowed; for more, the call failed.
        if size != 0 {
            failed(func, size as u64, align as u64, regs);
        }
        return;
    }
    let addr = addr as u64;
    match enter() {
        Entry::Record(ts) => {
            #[cfg(feature = "capture-timing")]
            let started = crate::platform::arch::cycles();
            // Unwinding takes a few hundred cycles: load the table slot meanwhile.
            let stack = allocation_stack(ts, regs, size as u64, || live::prefetch(addr));
            if !live::storable(addr) {
                untracked::insert(addr);
            } else {
                let mut shard = live::shard_of(addr).locked();
                let t = shard.stamp(clock::tick(), ts.last_time);
                let replaced = shard.insert(
                    addr,
                    Block::allocated(size as u64, func, stack, align as u64),
                );
                drop(shard);
                ts.last_time = t;
                totals::alloc(ts, size as u64, replaced, t);
                ts.emit(Some(t), |e, c| {
                    e.alloc(c, t, addr, size as u64, align as u64, func, stack)
                });
            }
            leave(ts);
            #[cfg(feature = "capture-timing")]
            crate::capture::unwind::timing::add(
                crate::capture::unwind::timing::ALLOC,
                crate::platform::arch::cycles().wrapping_sub(started),
            );
        }
        Entry::Nested(_) => untracked::insert(addr),
        Entry::Off => {}
    }
}

/// What a release's arguments say about its block, checked against it: the
/// size (sized `operator delete`, C23's `free_sized`) and the alignment (C++'s
/// aligned `operator delete`; 0: none given).
#[derive(Clone, Copy)]
pub struct Stated {
    pub size: Option<u64>,
    pub align: u64,
}

/// A release that does not match its live block, though the block is
/// released all the same: another family (`free` of a `new` block), another
/// size than allocated (a sized release), or C++'s aligned `delete` of a
/// block from `new` without alignment or the reverse. With what the release
/// gave, for the last two.
fn mismatch(func: AllocFn, block: live::Block, stated: Stated) -> Option<(ErrorKind, u64)> {
    if block.func.family() != func.family() {
        return Some((ErrorKind::MismatchedFree, 0));
    }
    // The table keeps sizes below 2^38: a larger block cannot be compared.
    match stated.size {
        Some(size) if size != block.size && block.size < live::MAX_SIZE => {
            return Some((ErrorKind::MismatchedSize, size))
        }
        _ => {}
    }
    let cxx = func.family() != trapline_trace::event::Family::Malloc;
    let aligned = func.cxx_aligned();
    // Both aligned: the alignments must agree (memcheck's "Mismatched
    // new/delete alignment"; a block of `new[](n, 128)` given back with 64
    // is released by the wrong rules by an allocator that over-aligns).
    let differs = aligned != block.func.cxx_aligned()
        || (aligned && block.align != 0 && stated.align != block.align);
    (cxx && differs).then_some((ErrorKind::MismatchedAlignment, stated.align))
}

/// The block was allocated by an `operator new`, or is released by an
/// `operator delete`, that the agent does not interpose (a library's own,
/// over `malloc` and `free`): what looks like a mismatch is theirs to
/// judge (private_operators.rs).
#[cold]
fn through_private_operators(alloc_stack: u32, release: StartRegs) -> bool {
    let allocated_by = crate::capture::stacks::frames(alloc_stack).first().copied();
    allocated_by.is_some_and(crate::capture::private_operators::call_from_private_operator)
        || (release.pc_is_return_address
            && crate::capture::private_operators::call_from_private_operator(release.pc))
}

/// Releases of blocks allocated before `trapline attach` (attached mode):
/// passed on, counted, never errors.
pub static EARLIER_RELEASES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// The dynamic loader's code while attached: `[start, end)`.
static LOADER_CODE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Notes where the dynamic loader's code is (attached mode). Its calls to
/// the allocator go through pointers it bound at the program's start
/// (`__rtld_malloc` and its kin), not through import slots, so an attached
/// agent never sees its allocations (a thread's DTV) but may see their
/// release: through an executable's canonical PLT entry for `free` (a
/// non-PIE python3), which attach patched.
pub fn note_loader_code(start: u64, end: u64) {
    LOADER_CODE[0].store(start, Ordering::Relaxed);
    LOADER_CODE[1].store(end, Ordering::Relaxed);
}

/// Whether the call was made from the dynamic loader's code, whose
/// allocations an attached agent never sees.
#[cold]
fn called_from_loader(regs: StartRegs) -> bool {
    let (start, end) = (
        LOADER_CODE[0].load(Ordering::Relaxed),
        LOADER_CODE[1].load(Ordering::Relaxed),
    );
    regs.pc_is_return_address && (start..end).contains(&regs.pc)
}

/// Records a release of `addr` that may state the block's size or
/// alignment; returns whether to pass it to the C library.
#[inline]
pub fn free_stating(func: AllocFn, addr: *mut u8, stated: Stated, regs: StartRegs) -> bool {
    if addr.is_null() || !crate::config::memory_recorded() {
        return true;
    }
    free_stating_recorded(func, addr, stated, regs)
}

/// `free_stating` past its checks: a release the live table may hold.
#[inline]
pub fn free_stating_recorded(
    func: AllocFn,
    addr: *mut u8,
    stated: Stated,
    regs: StartRegs,
) -> bool {
    let addr = addr as u64;
    match enter() {
        Entry::Record(ts) => {
            #[cfg(feature = "capture-timing")]
            let started = crate::platform::arch::cycles();
            let pass = free_recorded(ts, func, addr, stated, regs);
            leave(ts);
            #[cfg(feature = "capture-timing")]
            crate::capture::unwind::timing::add(
                crate::capture::unwind::timing::FREE,
                crate::platform::arch::cycles().wrapping_sub(started),
            );
            pass
        }
        // Inside the agent already: the table may be locked by this very
        // thread. An untracked block goes straight back; a tracked one is
        // released when the outer hook leaves.
        Entry::Nested(ts) => untracked::remove(addr) || !defer_free(ts, addr),
        Entry::Off => true,
    }
}

fn free_recorded(
    ts: &mut ThreadState,
    func: AllocFn,
    addr: u64,
    stated: Stated,
    regs: StartRegs,
) -> bool {
    let with_stack = crate::config::flag(&crate::config::OPTIONS.release_stacks);
    let stack = if with_stack {
        capture_stack_then(ts, regs, Site::Free, || live::prefetch_release(addr))
    } else {
        0
    };
    // An erroneous call always gets its stack (captured late without
    // release stacks: the hook's frame is still there).
    let error_stack = |ts: &mut ThreadState| {
        if with_stack {
            stack
        } else {
            capture_stack(ts, regs, Site::Free)
        }
    };
    let mut shard = live::shard_of(addr).locked();
    if let Some(block) = shard.remove(addr) {
        shard.remember_free(Freed {
            addr,
            size: block.size,
            func: block.func as u8,
            alloc_stack: block.stack,
            free_stack: stack,
        });
        if crate::config::production() {
            shard.sampled_released(addr);
        }
        let t = shard.stamp(clock::tick(), ts.last_time);
        drop(shard);
        // A watched page must be back before the allocator may hand it to
        // the kernel (no lock held: the monitor's lock comes first).
        access::before_release(addr, block.size);
        ts.last_time = t;
        totals::free(ts, block.size);
        ts.emit(Some(t), |e, c| e.free(c, t, addr, func, stack));
        if let Some((kind, given)) =
            mismatch(func, block, stated).filter(|_| !through_private_operators(block.stack, regs))
        {
            let stack = error_stack(ts);
            report(
                ts,
                Event::Error {
                    time: t,
                    kind,
                    func,
                    addr,
                    stack,
                    alloc_func: Some(block.func),
                    alloc_size: block.size,
                    alloc_stack: block.stack,
                    free_stack: 0,
                    passed_on: true,
                    given,
                },
            );
        }
        return true;
    }
    if untracked::remove(addr) {
        return true;
    }
    if crate::config::production() && !shard.sampled_freed(addr) {
        // An unsampled block whose address shares the filter's slot.
        return true;
    }
    let freed = shard.recently_freed(addr);
    if crate::config::flag(&crate::config::OPTIONS.blocks_predate)
        && (freed.is_none() || called_from_loader(regs))
    {
        // A block from before the agent saw the allocator (an attach, a
        // detour): the program's own to release. A block released lately
        // is still a double free, unless the loader releases it: the
        // allocator handed the address to the loader again unseen.
        drop(shard);
        EARLIER_RELEASES.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    let t = shard.stamp(clock::tick(), ts.last_time);
    drop(shard);
    ts.last_time = t;
    let pass = crate::config::flag(&crate::config::OPTIONS.pass_invalid);
    // A double free if this address was freed lately; else never allocated.
    let f = freed.unwrap_or_default();
    let stack = error_stack(ts);
    report(
        ts,
        Event::Error {
            time: t,
            kind: if freed.is_some() {
                ErrorKind::DoubleFree
            } else {
                ErrorKind::InvalidFree
            },
            func,
            addr,
            stack,
            alloc_func: freed.and_then(|f| AllocFn::from_u8(f.func)),
            alloc_size: f.size,
            alloc_stack: f.alloc_stack,
            free_stack: f.free_stack,
            passed_on: pass,
            given: 0,
        },
    );
    pass
}

/// Writes an allocator-misuse event, with the definitions of the stacks it names.
fn report(ts: &mut ThreadState, ev: Event) {
    if let Event::Error {
        time,
        alloc_stack,
        free_stack,
        func,
        kind,
        ..
    } = ev
    {
        totals::error(ts, func, kind);
        ensure_stack(ts, alloc_stack, false);
        ensure_stack(ts, free_stack, false);
        ts.emit(Some(time), |e, c| e.event(c, &ev));
    }
}

/// Reports a resize of `addr`, which is no block, with the lock of its
/// shard (released here); returns whether to pass the call on.
pub(crate) fn report_invalid_realloc(
    ts: &mut ThreadState,
    mut shard: live::Locked<'_>,
    func: AllocFn,
    addr: u64,
    stack: u32,
) -> bool {
    let t = shard.stamp(clock::tick(), ts.last_time);
    drop(shard);
    ts.last_time = t;
    let pass = crate::config::flag(&crate::config::OPTIONS.pass_invalid);
    report(
        ts,
        Event::Error {
            time: t,
            kind: ErrorKind::InvalidRealloc,
            func,
            addr,
            stack,
            alloc_func: None,
            alloc_size: 0,
            alloc_stack: 0,
            free_stack: 0,
            passed_on: pass,
            given: 0,
        },
    );
    pass
}

/// realloc from a nested context (a signal handler inside the agent): the
/// table cannot be touched. A tracked block is copied into a new untracked
/// one and released later through the deferred queue, so its address is not
/// reused while the table still lists it.
pub(crate) fn realloc_nested(
    ts: &mut ThreadState,
    old: *mut u8,
    size: usize,
    real: impl FnOnce(*mut u8) -> *mut u8,
) -> *mut u8 {
    let old_addr = old as u64;
    if old_addr == 0 || untracked::remove(old_addr) {
        let p = real(old);
        if p.is_null() && size != 0 && old_addr != 0 {
            untracked::insert(old_addr); // failed: the old block stays
        } else {
            untracked::insert(p as u64);
        }
        return p;
    }
    if ts.deferred_n == ts.deferred.len() {
        crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        return real(old);
    }
    if size == 0 {
        defer_free(ts, old_addr);
        return core::ptr::null_mut();
    }
    // SAFETY: glibc's allocator; `old` is a live block (tracked), so reading
    // its usable size and copying from it is valid.
    unsafe {
        let p = crate::events::next_alloc::malloc(size);
        if p.is_null() {
            return p;
        }
        let usable = crate::events::next_alloc::usable_size(old);
        core::ptr::copy_nonoverlapping(old, p, usable.min(size));
        untracked::insert(p as u64);
        defer_free(ts, old_addr);
        p
    }
}

/// realloc and reallocarray: validates the old pointer, calls `real`, records the move.
#[inline]
pub fn realloc(
    func: AllocFn,
    old: *mut u8,
    size: usize,
    regs: StartRegs,
    real: impl FnOnce(*mut u8) -> *mut u8,
) -> *mut u8 {
    if !crate::config::memory_recorded() {
        return real(old);
    }
    let old_addr = old as u64;
    let ts = match enter() {
        Entry::Record(ts) => ts,
        Entry::Nested(ts) => return realloc_nested(ts, old, size, real),
        Entry::Off => return real(old),
    };
    let stack = allocation_stack(ts, regs, size as u64, || {});
    let mut old_block = None;
    let mut earlier = false;
    if old_addr != 0 {
        let mut shard = live::shard_of(old_addr).locked();
        old_block = shard.remove(old_addr);
        if let Some(b) = old_block {
            // The old address's history ends here: stamp its shard, and
            // remember the block so freeing it again is a double free.
            shard.remember_free(Freed {
                addr: old_addr,
                size: b.size,
                func: b.func as u8,
                alloc_stack: b.stack,
                free_stack: stack,
            });
            ts.last_time = shard.stamp(clock::tick(), ts.last_time);
        }
        if old_block.is_none() && !untracked::remove(old_addr) {
            if crate::config::flag(&crate::config::OPTIONS.blocks_predate)
                && (shard.recently_freed(old_addr).is_none() || called_from_loader(regs))
            {
                // A block from before the attach: resized, it is a new
                // block from the trace's point of view.
                drop(shard);
                EARLIER_RELEASES.fetch_add(1, Ordering::Relaxed);
                earlier = true;
            } else {
                let pass = report_invalid_realloc(ts, shard, func, old_addr, stack);
                leave(ts);
                // Like memcheck: the bad call does nothing and returns NULL.
                return if pass {
                    real(old)
                } else {
                    core::ptr::null_mut()
                };
            }
        }
    }
    if let Some(b) = old_block {
        access::before_release(old_addr, b.size);
    }
    let p = real(old);
    let new_addr = p as u64;
    if p.is_null() && size != 0 {
        // Failed: the old block is untouched.
        if let Some(b) = old_block {
            live::shard_of(old_addr).locked().insert(old_addr, b);
        }
        emit_failed(ts, func, size as u64, 0, stack);
        leave(ts);
        return p;
    }
    let mut gained = None;
    let t = if p.is_null() {
        let mut shard = live::shard_of(old_addr).locked();
        let t = shard.stamp(clock::tick(), ts.last_time);
        drop(shard);
        t
    } else if live::storable(new_addr) {
        let mut shard = live::shard_of(new_addr).locked();
        let t = shard.stamp(clock::tick(), ts.last_time);
        let replaced = shard.insert(
            new_addr,
            Block {
                size: size as u64,
                func,
                stack,
                align: 0,
            },
        );
        drop(shard);
        gained = Some((size as u64, replaced));
        t
    } else {
        // The event names a block the table does not hold.
        untracked::insert(new_addr);
        totals::make_inexact();
        ts.last_time
    };
    ts.last_time = t;
    totals::realloc(ts, old_block.map(|b| b.size), gained, t);
    ts.emit(Some(t), |e, c| {
        e.event(
            c,
            &Event::Realloc {
                time: t,
                old_addr: if earlier { 0 } else { old_addr },
                new_addr,
                size: size as u64,
                func,
                stack,
            },
        )
    });
    // realloc releases its old block as free does: one from new or new[]
    // is a mismatch (memcheck's realloc_new), performed all the same.
    let unmatched = old_block
        .filter(|&b| b.func.family() != func.family() && !through_private_operators(b.stack, regs));
    if let Some(b) = unmatched {
        report(
            ts,
            Event::Error {
                time: t,
                kind: ErrorKind::MismatchedFree,
                func,
                addr: old_addr,
                stack,
                alloc_func: Some(b.func),
                alloc_size: b.size,
                alloc_stack: b.stack,
                free_stack: 0,
                passed_on: true,
                given: 0,
            },
        );
    }
    leave(ts);
    p
}

/// jemalloc's `xallocx`: validates the block, calls `real` (which returns
/// the block's real size afterwards) and, when the block took a new size
/// of at least `size` (it grew or shrank in place), records a realloc to
/// the same address with that size. A call that could not resize changes
/// nothing and is not recorded. Returns what `real` returned (0, like a
/// failed resize, for a bad pointer not passed on).
pub fn resize_in_place(
    func: AllocFn,
    ptr: *mut u8,
    size: usize,
    regs: StartRegs,
    real: impl FnOnce(*mut u8) -> usize,
) -> usize {
    if !crate::config::memory_recorded() {
        return real(ptr);
    }
    let addr = ptr as u64;
    let ts = match enter() {
        Entry::Record(ts) => ts,
        // From inside the agent the table cannot be touched: the recorded
        // size of a tracked block stays as it was.
        Entry::Nested(_) | Entry::Off => return real(ptr),
    };
    let stack = allocation_stack(ts, regs, size as u64, || {});
    let mut shard = live::shard_of(addr).locked();
    let old = shard.get(addr);
    if old.is_none() && !untracked::is_listed(addr) {
        let pass = report_invalid_realloc(ts, shard, func, addr, stack);
        leave(ts);
        return if pass { real(ptr) } else { 0 };
    }
    // The allocator is called without the shard's lock (it may allocate).
    drop(shard);
    if let Some(b) = old {
        access::before_release(addr, b.size);
    }
    let got = real(ptr);
    let Some(old) = old else {
        leave(ts); // untracked: nothing recorded about it
        return got;
    };
    if got < size || got as u64 == old.size {
        leave(ts);
        return got;
    }
    let mut shard = live::shard_of(addr).locked();
    // Gone meanwhile only if another thread released it during the call.
    if shard.remove(addr).is_none() {
        drop(shard);
        leave(ts);
        return got;
    }
    let block = Block {
        size: got as u64,
        func,
        stack,
        align: 0,
    };
    let t = shard.stamp(clock::tick(), ts.last_time);
    shard.insert(addr, block);
    drop(shard);
    ts.last_time = t;
    totals::realloc(ts, Some(old.size), Some((block.size, None)), t);
    ts.emit(Some(t), |e, c| {
        e.event(
            c,
            &Event::Realloc {
                time: t,
                old_addr: addr,
                new_addr: addr,
                size: block.size,
                func,
                stack,
            },
        )
    });
    leave(ts);
    got
}

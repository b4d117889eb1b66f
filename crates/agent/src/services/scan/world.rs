//! Stopping every other thread of the process while the scan reads memory.
//!
//! Each thread is sent `park_signal()` with tgkill. Its handler runs on the
//! thread's current stack, below the red zone of the interrupted code; it
//! publishes in the thread's slot the interrupted stack pointer and where
//! the kernel saved the thread's general registers in the signal frame, and
//! sleeps on a futex until the scan releases it. Threads created meanwhile are found by listing /proc/self/task again
//! until no new thread appears. A thread that does not park within the
//! deadline (it blocks the signal, or the program took the signal over) is
//! counted as not suspended: its stack is then scanned as it is, without its
//! registers, and the report says false leaks are possible.
//!
//! Nothing here allocates or frees once `stop` has started signalling: a
//! stopped thread may hold the agent heap's lock (the scratch lists go with
//! the `World`, freed after `resume`).

use crate::platform::sys;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Slots of the thread table (a power of two, twice the most threads handled).
const SLOTS: usize = 1 << 16;
/// Most threads one scan stops; others count as not suspended.
const MAX_THREADS: usize = SLOTS / 2;
/// How long to wait for threads to park, per round of signalling.
const PARK_DEADLINE_NS: u64 = 2_000_000_000;

const EMPTY: u32 = 0;
const SIGNALLED: u32 = 1;
const PARKED: u32 = 2;
const LEFT: u32 = 3;
const GONE: u32 = 4;
/// The signal found the thread inside the agent and it did not park: the
/// stopper signals it again (`INSIST_OUTSIDE`).
const INSIDE: u32 = 5;

/// How long an exit's stop keeps signalling a thread that is inside the
/// agent before letting it park there.
const INSIST_NS: u64 = 100_000_000;

#[repr(C)]
struct Slot {
    tid: AtomicU32,
    state: AtomicU32,
    sp: AtomicU64,
    /// Where the thread left its own stack (`ThreadState::left_own_stack_at`).
    left_sp: AtomicU64,
    /// The thread parked inside the agent (a recorded call under way).
    inside: AtomicU32,
    /// Where its general registers are (`Parked::registers`).
    registers: AtomicU64,
    /// Its thread pointer (`Parked::thread_pointer`).
    thread_pointer: AtomicU64,
}

/// The slot table, mapped once and never unmapped: a handler that runs late
/// (its signal was pending past a scan) may still look into it.
static TABLE: AtomicPtr<Slot> = AtomicPtr::new(core::ptr::null_mut());
/// A scan filled slots it could not note in its list (more threads than
/// the list held): the next one clears the whole table first.
static TABLE_DIRTY: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// While set, a thread the signal finds inside the agent does not park
/// (`INSIDE`) and is signalled again: an exit's stop wants every thread
/// parked where it holds nothing of the agent's, so that the world can
/// stay stopped through the finish (`hold`).
static INSIST_OUTSIDE: AtomicBool = AtomicBool::new(false);
/// Set once a thread crashed: each thread that parks outside the agent
/// records where it was stopped (`StoppedAtCrash`), for the crash report.
static RECORD_WHERE_PARKED: AtomicBool = AtomicBool::new(false);

/// Whether the threads parked from now on record their stacks.
pub fn record_where_parked(on: bool) {
    RECORD_WHERE_PARKED.store(on, Ordering::Release);
}

/// The signal that parks threads: one of the real-time signals, chosen near
/// the top where programs rarely look.
pub fn park_signal() -> c_int {
    libc::SIGRTMAX() - 3
}

/// A thread stopped for the scan.
#[derive(Clone, Copy)]
pub struct Parked {
    pub tid: u32,
    /// Where its stack is live from: its stack pointer when the signal
    /// came (the handler's frames, the signal frame and the red zone lie
    /// below it).
    pub sp: u64,
    /// Where it left its own stack for another, or 0: the own stack is live
    /// from there.
    pub left_sp: u64,
    /// Where the kernel saved its general registers (`arch::GENERAL_REGISTERS`
    /// words in the signal frame, read while it is parked), or 0.
    pub registers: u64,
    /// Its thread pointer: where its static TLS blocks are.
    pub thread_pointer: u64,
}

/// The stopped world.
pub struct World {
    pub parked: Vec<Parked>,
    /// Table slots to clear when the threads are released.
    used: Vec<u32>,
    /// The scratch lists, freed with the world after `resume`: freeing them
    /// in `stop` took the agent heap's lock while a parked thread could
    /// hold it (the writer, parked in its first allocation when a
    /// short-lived process's exit scan came before the writer had noted
    /// itself as the agent's: the process hung).
    _scratch: (Vec<u8>, Vec<u32>),
    /// Threads of the process seen, the scanning thread included.
    pub threads: u32,
    pub not_suspended: u32,
    /// Threads parked inside the agent: they may hold its locks or their
    /// buffer, so the world cannot be held through the finish.
    pub inside: u32,
}

fn table() -> Option<&'static [Slot]> {
    let mut p = TABLE.load(Ordering::Acquire);
    if p.is_null() {
        // Zeroed memory is a valid empty table; the agent heap's registry
        // keeps it out of the scan's roots.
        p = crate::platform::heap::map(SLOTS * core::mem::size_of::<Slot>()).cast();
        if p.is_null() {
            return None;
        }
        TABLE.store(p, Ordering::Release);
    }
    // SAFETY: the mapping holds SLOTS slots and is never unmapped.
    Some(unsafe { core::slice::from_raw_parts(p, SLOTS) })
}

fn home(tid: u32) -> usize {
    (tid.wrapping_mul(0x9E37_79B1) >> 16) as usize & (SLOTS - 1)
}

fn lookup(slots: &[Slot], tid: u32) -> Option<&Slot> {
    let mut i = home(tid);
    loop {
        let t = slots[i].tid.load(Ordering::Acquire);
        if t == tid {
            return Some(&slots[i]);
        }
        if t == 0 {
            return None;
        }
        i = (i + 1) & (SLOTS - 1);
    }
}

/// Adds `tid` (if new) and returns its slot and index.
fn insert(slots: &[Slot], tid: u32) -> Option<(&Slot, usize)> {
    let mut i = home(tid);
    loop {
        let t = slots[i].tid.load(Ordering::Acquire);
        if t == tid {
            return None;
        }
        if t == 0 {
            slots[i].sp.store(0, Ordering::Relaxed);
            slots[i].left_sp.store(0, Ordering::Relaxed);
            slots[i].inside.store(0, Ordering::Relaxed);
            slots[i].registers.store(0, Ordering::Relaxed);
            slots[i].thread_pointer.store(0, Ordering::Relaxed);
            slots[i].state.store(SIGNALLED, Ordering::Relaxed);
            slots[i].tid.store(tid, Ordering::Release);
            return Some((&slots[i], i));
        }
        i = (i + 1) & (SLOTS - 1);
    }
}

extern "C" fn on_park(_sig: c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; saved and restored around the handler.
    let saved_errno = unsafe { *libc::__errno_location() };
    // A sleep or wait this signal cut short is retried by its hook (eintr.rs).
    // SAFETY: the kernel's context for this signal.
    unsafe { crate::platform::arch::note_agent_eintr(ctx) };
    // The stack is live from where the signal found it. Interrupted on the
    // agent's side stack, the thread's own stack is live from where the
    // agent left it, and the registers are the agent's.
    // SAFETY: the kernel's context for this signal.
    let (interrupted_sp, mut registers) = unsafe { crate::platform::arch::interrupted_state(ctx) }
        .unwrap_or((crate::platform::arch::stack_pointer(), 0));
    let sp = crate::events::thread::own_stack_sp(interrupted_sp);
    if sp != interrupted_sp {
        registers = 0;
    }
    let p = TABLE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: the table is never unmapped.
        let slots = unsafe { core::slice::from_raw_parts(p, SLOTS) };
        if let Some(slot) = lookup(slots, sys::gettid()) {
            if slot.state.load(Ordering::Acquire) == SIGNALLED {
                let inside = inside_agent();
                if inside && INSIST_OUTSIDE.load(Ordering::Acquire) {
                    slot.state.store(INSIDE, Ordering::Release);
                    crate::platform::futex::futex_wake(&slot.state, 1);
                    // SAFETY: as above.
                    unsafe { *libc::__errno_location() = saved_errno };
                    return;
                }
                if !inside && registers != 0 && RECORD_WHERE_PARKED.load(Ordering::Acquire) {
                    // SAFETY: the kernel's context for this signal.
                    unsafe { record_stopped_at_crash(ctx) };
                }
                slot.inside.store(u32::from(inside), Ordering::Relaxed);
                slot.sp.store(sp, Ordering::Relaxed);
                let left =
                    crate::events::thread::current_if_any().map_or(0, |t| t.own_stack_left_at(sp));
                slot.left_sp.store(left, Ordering::Relaxed);
                slot.registers.store(registers, Ordering::Relaxed);
                slot.thread_pointer
                    .store(crate::platform::arch::thread_pointer(), Ordering::Relaxed);
                slot.state.store(PARKED, Ordering::Release);
                crate::platform::futex::futex_wake(&slot.state, 1);
                crate::platform::hold::wait_at_gate();
                slot.state.store(LEFT, Ordering::Release);
                crate::platform::futex::futex_wake(&slot.state, 1);
            }
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// Records the stack this thread was stopped in (its innermost frame the
/// interrupted instruction) in its own buffer. Only outside the agent:
/// the thread then holds neither its buffer nor the agent's locks, as a
/// sampling signal finds it.
///
/// # Safety
/// `ctx` must be the context pointer the kernel passed to this handler.
unsafe fn record_stopped_at_crash(ctx: *mut libc::c_void) {
    let Some(ts) = crate::events::thread::current_if_any() else {
        return;
    };
    if ts.agent_thread || ts.guard > 0 {
        return;
    }
    ts.guard += 1;
    // SAFETY: the caller passes the kernel's context.
    let regs = unsafe { crate::platform::arch::interrupted_regs(ctx) };
    let stack = crate::events::record::capture_stack(ts, regs, crate::events::thread::Site::Free);
    let time = ts.next_time();
    let stopped = trapline_trace::Event::StoppedAtCrash { time, stack };
    ts.emit(Some(time), |e, c| e.event(c, &stopped));
    ts.guard -= 1;
}

/// Whether the interrupted code of this thread is inside a recorded call
/// (or any other part of the agent that raised the guard), where it may
/// hold the agent's locks or its own buffer.
fn inside_agent() -> bool {
    crate::events::thread::current_if_any().is_some_and(|t| !t.agent_thread && t.guard > 0)
}

/// Installs the park handler if the signal is free (default, ignored, or
/// the agent's fatal-signal handler, which the program sees as SIG_DFL);
/// false if the program has a handler of its own there. The handler stays:
/// a signal still pending for a thread that did not park must not kill it.
fn install() -> bool {
    if INSTALLED.load(Ordering::Acquire) {
        // The program may have replaced it since.
        return crate::platform::signals::real_handler(park_signal())
            == on_park as *const () as usize;
    }
    let sig = park_signal();
    let current = crate::platform::signals::real_handler(sig);
    let free = current == libc::SIG_DFL
        || current == libc::SIG_IGN
        || crate::platform::signals::agent_owns(sig);
    if !free {
        return false;
    }
    // SAFETY: a zeroed sigaction with our handler and every signal blocked while it runs.
    let ok = unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = on_park as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut act.sa_mask);
        crate::platform::signals::real_sigaction_set(sig, &act)
    };
    INSTALLED.store(ok, Ordering::Release);
    ok
}

/// Lists the tids of the process into `out` (within its capacity) without
/// allocating; false when the listing may miss a task (`tasks::list`).
fn list_tasks(buf: &mut [u8], out: &mut Vec<u32>) -> bool {
    // Within the capacity reserved before the scan: no allocation.
    out.resize(out.capacity(), 0);
    let listing = crate::platform::tasks::list(buf, out);
    out.truncate(listing.len);
    listing.settled
}

/// Scratch for `stop`, allocated before the scan locks anything.
pub struct Scratch {
    dirents: Vec<u8>,
    tids: Vec<u32>,
    parked: Vec<Parked>,
    /// Indices of the table slots this scan fills, cleared by `resume`.
    used: Vec<u32>,
}

impl Scratch {
    pub fn new() -> Scratch {
        // getdents64 is called until the directory is read, so this bounds
        // only the entries per call; std's read_dir would be opendir, whose
        // 32 KiB buffer came from the program's malloc heap.
        let dirents = vec![0u8; 16 << 10];
        let threads = crate::platform::tasks::kernel_count().unwrap_or(0) as usize;
        let cap = (2 * threads + 256).min(MAX_THREADS);
        Scratch {
            dirents,
            tids: Vec::with_capacity(cap),
            parked: Vec::with_capacity(cap),
            used: Vec::with_capacity(cap),
        }
    }
}

impl Scratch {
    /// Most threads this scratch can list.
    pub fn capacity(&self) -> usize {
        self.parked.capacity()
    }
}

fn now_ns() -> u64 {
    crate::platform::clock::precise_now()
}

/// Sends the park signal to `tid`, whose slot is `slot`; a thread already
/// gone is marked so.
fn signal(slot: &Slot, pid: u32, tid: u32) {
    // SAFETY: tgkill on a thread of our own process.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, park_signal()) };
    if r != 0 {
        slot.state.store(GONE, Ordering::Release);
    }
}

/// Stops every thread but the caller and `skip` (the agent's own threads).
/// With `insist_outside`, a thread is parked only outside the agent while
/// it leaves it within `INSIST_NS` (see `World::inside`).
pub fn stop(scratch: Scratch, skip: &[u32], insist_outside: bool) -> World {
    let Scratch {
        mut dirents,
        mut tids,
        mut parked,
        mut used,
    } = scratch;
    let me = sys::gettid();
    let pid = sys::getpid_raw();
    // A main thread that left through pthread_exit stays listed, as a
    // zombie, until the process ends: it can neither park nor hold data.
    let leader_ended = me != pid && crate::platform::tasks::has_ended(pid);
    let mut world = World {
        parked: Vec::new(),
        used: Vec::new(),
        _scratch: (Vec::new(), Vec::new()),
        threads: 1,
        not_suspended: 0,
        inside: 0,
    };
    let usable = install();
    let Some(slots) = table() else {
        list_tasks(&mut dirents, &mut tids);
        world.threads = tids.len().max(1) as u32;
        world.not_suspended = world.threads - 1;
        return world;
    };
    // Each scan empties the slots it filled (`resume`): clearing the whole
    // table (1 MiB) here cost a short-lived process about half a millisecond
    // of page faults at its exit scan.
    if TABLE_DIRTY.swap(false, Ordering::AcqRel) {
        for s in slots {
            s.tid.store(0, Ordering::Relaxed);
            s.state.store(EMPTY, Ordering::Relaxed);
        }
    }
    crate::platform::hold::close();
    let insist = insist_outside && usable;
    INSIST_OUTSIDE.store(insist, Ordering::Release);
    let insist_until = now_ns() + INSIST_NS;
    let mut seen = 0usize;
    let mut round = 0;
    loop {
        round += 1;
        let settled = list_tasks(&mut dirents, &mut tids);
        let mut new = 0;
        for &tid in &tids {
            if tid == me
                || (tid == pid && leader_ended)
                || skip.contains(&tid)
                || seen >= MAX_THREADS
            {
                continue;
            }
            let Some((slot, index)) = insert(slots, tid) else {
                continue;
            };
            if used.len() < used.capacity() {
                used.push(index as u32);
            } else {
                TABLE_DIRTY.store(true, Ordering::Release);
            }
            seen += 1;
            new += 1;
            if usable {
                signal(slot, pid, tid);
            }
        }
        // Threads the signal found inside the agent: signal them again, a
        // little later, when they have most likely left it; past the
        // deadline they park where they are (a thread blocked inside the
        // agent, as on a full queue, does not leave it soon).
        let mut again = 0;
        if insist {
            if now_ns() >= insist_until {
                INSIST_OUTSIDE.store(false, Ordering::Release);
            }
            for &i in &used {
                let slot = &slots[i as usize];
                if slot.state.load(Ordering::Acquire) != INSIDE {
                    continue;
                }
                if again == 0 {
                    crate::platform::futex::sleep_ns(20_000);
                }
                again += 1;
                slot.state.store(SIGNALLED, Ordering::Release);
                signal(slot, pid, slot.tid.load(Ordering::Relaxed));
            }
        }
        // Done when a listing the kernel's count confirms brought no one
        // new: a listing may miss a task while others end.
        if (new == 0 && again == 0 && settled) || !usable || (round >= 64 && again == 0) {
            break;
        }
        let deadline = now_ns() + PARK_DEADLINE_NS;
        for &tid in &tids {
            let Some(slot) = lookup(slots, tid) else {
                continue;
            };
            loop {
                let st = slot.state.load(Ordering::Acquire);
                if st != SIGNALLED {
                    break;
                }
                let now = now_ns();
                if now >= deadline {
                    break;
                }
                crate::platform::futex::futex_wait(
                    &slot.state,
                    SIGNALLED,
                    Some((deadline - now).min(10_000_000)),
                );
                // A thread that exited after it was signalled never parks.
                // SAFETY: signal 0 only checks that the thread exists.
                if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) } != 0 {
                    slot.state.store(GONE, Ordering::Release);
                }
            }
        }
    }
    INSIST_OUTSIDE.store(false, Ordering::Release);
    let mut visit = |s: &Slot| {
        let tid = s.tid.load(Ordering::Acquire);
        if tid == 0 {
            return;
        }
        match s.state.load(Ordering::Acquire) {
            PARKED => {
                world.inside += s.inside.load(Ordering::Relaxed);
                if parked.len() < parked.capacity() {
                    parked.push(Parked {
                        tid,
                        sp: s.sp.load(Ordering::Relaxed),
                        left_sp: s.left_sp.load(Ordering::Relaxed),
                        registers: s.registers.load(Ordering::Relaxed),
                        thread_pointer: s.thread_pointer.load(Ordering::Relaxed),
                    });
                } else {
                    world.not_suspended += 1;
                }
            }
            GONE => {}
            _ => world.not_suspended += 1,
        }
    };
    if TABLE_DIRTY.load(Ordering::Acquire) {
        // The list is incomplete: any slot may be one of this scan's.
        slots.iter().for_each(&mut visit);
    } else {
        used.iter().for_each(|&i| visit(&slots[i as usize]));
    }
    list_tasks(&mut dirents, &mut tids);
    let ended = usize::from(leader_ended && tids.contains(&pid));
    world.threads = (tids.len() - ended).max(1) as u32;
    world.parked = parked;
    world.used = used;
    world._scratch = (dirents, tids);
    world
}

/// The trace is written and the process is ending: the held threads stay
/// parked until the exit ends them, as natively it would have ended them
/// running, or at most a second if the process goes on (what is left of
/// the exit may wait for one of them). Does not wait for them.
pub fn release_at_end() {
    // Their slots stay filled: a later stop (there is none in an ending
    // process) clears the whole table first.
    TABLE_DIRTY.store(true, Ordering::Release);
    crate::platform::hold::open_at_end();
}

/// Lets the stopped threads go, and waits until each has left its handler.
pub fn resume(world: &World) {
    crate::platform::hold::open();
    let Some(slots) = table() else { return };
    for p in &world.parked {
        if let Some(slot) = lookup(slots, p.tid) {
            while slot.state.load(Ordering::Acquire) == PARKED {
                crate::platform::futex::futex_wait(&slot.state, PARKED, Some(10_000_000));
            }
        }
    }
    // Empty the slots for the next scan. A thread that never parked and
    // takes its signal later then finds no slot and returns at once.
    if !TABLE_DIRTY.load(Ordering::Acquire) {
        for &i in &world.used {
            slots[i as usize].tid.store(0, Ordering::Relaxed);
            slots[i as usize].state.store(EMPTY, Ordering::Relaxed);
        }
    }
}

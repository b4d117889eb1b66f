//! The writer thread.
//!
//! It drains the queue of full buffers (buffers.rs): it compresses each
//! buffer into a chunk and appends it to the trace. The writer also publishes the clock tick
//! every millisecond while the program records events (and sleeps while it
//! records none, clock.rs) and, every 200 ms, takes the partly filled buffers of all
//! threads, so a long-running or SIGKILLed program leaves a trace that is at
//! most a fraction of a second behind.

use crate::events::buffers;
use crate::platform::{agent_threads, sys};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use trapline_trace::format::{encode_chunk_reusing, write_file_header};

static DONE: crate::platform::futex::Event = crate::platform::futex::Event::new();
/// The writer thread's tid: noted by the thread that starts it, and by the
/// writer itself when it runs (0 before).
static WRITER_TID: AtomicU32 = AtomicU32::new(0);
static STOP: AtomicBool = AtomicBool::new(false);
static STOPPED: AtomicBool = AtomicBool::new(false);
/// Trace file descriptor (-1 before the trace is opened).
static FD: AtomicI32 = AtomicI32::new(-1);
/// Events written to the trace file.
pub static EVENTS_WRITTEN: AtomicU64 = AtomicU64::new(0);
/// Buffers taken off the queue and not yet written. A fatal signal's flush
/// waits for them: the process dies right after it, and a buffer the writer
/// thread was compressing would vanish (the start's module map did, when
/// the program aborted within a millisecond of starting).
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
/// Held while the trace file's descriptor is written to or moved.
static FD_LOCK: crate::platform::lock::RawLock = crate::platform::lock::RawLock::new();
/// Rounds `write_one` tries the descriptor lock for before counting a
/// buffer as lost (it is only ever held for one write).
const FD_LOCK_SPINS: u32 = 50_000_000;
/// How long a fatal signal's flush waits for buffers in flight: the writer
/// thread may be stuck behind a lock the signalled thread holds.
const IN_FLIGHT_WAIT_NS: u64 = 200_000_000;

/// Output that needs no allocation and no unbounded lock, for a fatal signal
/// that may have struck while this thread held glibc's heap lock or one of
/// the agent's: one spare buffer and a compression scratch, set aside when
/// the trace is opened.
static EMERGENCY_BUF: core::sync::atomic::AtomicPtr<buffers::Buffer> =
    core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());
static EMERGENCY_SCRATCH: core::sync::atomic::AtomicPtr<Vec<u8>> =
    core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

fn reserve_emergency() {
    if EMERGENCY_BUF.load(Ordering::Acquire).is_null() {
        EMERGENCY_BUF.store(Box::into_raw(buffers::Buffer::new()), Ordering::Release);
    }
    if EMERGENCY_SCRATCH.load(Ordering::Acquire).is_null() {
        let cap = trapline_trace::format::max_chunk_len(buffers::BUFFER_SIZE);
        EMERGENCY_SCRATCH.store(
            Box::into_raw(Box::new(Vec::with_capacity(cap))),
            Ordering::Release,
        );
    }
}

/// A buffer for the signal path: from the free list if its lock is free,
/// else the emergency one. Never allocates.
pub fn take_buffer_no_alloc(tid: u32) -> Option<Box<buffers::Buffer>> {
    let b = buffers::try_with_queue(10_000, |q| q.free.pop()).flatten();
    let mut b = b.or_else(|| {
        let p = EMERGENCY_BUF.swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: a pointer from Box::into_raw in reserve_emergency, taken once.
        (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
    })?;
    b.reset(tid, buffers::GEN.load(Ordering::Relaxed));
    Some(b)
}

/// Compresses and writes one buffer from the calling thread, with the
/// emergency scratch: no allocation, no lock. For the fatal-signal path only
/// (one thread at a time: `lifecycle::finish` runs once).
pub fn write_direct(b: &buffers::Buffer) {
    let p = EMERGENCY_SCRATCH.load(Ordering::Acquire);
    if p.is_null() || b.events == 0 {
        return;
    }
    // SAFETY: the scratch is only used here, by the single finishing thread.
    let scratch = unsafe { &mut *p };
    write_one(b, scratch);
}

/// Writes whatever the queue holds from the calling thread, without waiting
/// for its lock longer than `spins` rounds; the buffers are then leaked, as
/// freeing them could need glibc's heap lock.
pub fn drain_no_alloc(spins: u32) {
    loop {
        let Some(b) = buffers::try_with_queue(spins, |q| q.full.pop_front()) else {
            return;
        };
        let Some(b) = b else { break };
        write_direct(&b);
        core::mem::forget(b);
    }
    // Buffers the writer thread is writing: the process ends after this.
    let deadline = crate::platform::clock::precise_now() + IN_FLIGHT_WAIT_NS;
    while IN_FLIGHT.load(Ordering::Acquire) != 0 && crate::platform::clock::precise_now() < deadline
    {
        // SAFETY: sched_yield has no preconditions (async-signal-safe).
        unsafe { libc::sched_yield() };
    }
}

fn write_one(b: &buffers::Buffer, scratch: &mut Vec<u8>) {
    if b.gen != buffers::GEN.load(Ordering::Relaxed) {
        return; // a parent's buffer seen by a fork child: the parent writes it
    }
    let len = encode_chunk_reusing(
        scratch,
        b.tid,
        b.events,
        b.first_time,
        b.last_time,
        &b.data[..b.len],
    );
    // The descriptor cannot move while it is written to (`move_trace_fd`).
    // Bounded: a fatal signal's flush may find this thread holding the lock.
    let written = FD_LOCK.try_lock_for(FD_LOCK_SPINS) && {
        let fd = FD.load(Ordering::Acquire);
        let ok = fd >= 0 && write_whole_chunk(fd, &scratch[..len]);
        FD_LOCK.unlock();
        ok
    };
    if written {
        EVENTS_WRITTEN.fetch_add(u64::from(b.events), Ordering::Relaxed);
    } else {
        buffers::EVENTS_LOST.fetch_add(u64::from(b.events), Ordering::Relaxed);
    }
}

/// Writes one chunk at the end of the file, or nothing: a write that fails
/// part way (the disk or the quota is full) is cut back off, so the file
/// stays a sequence of whole chunks, readable to its end, that later writes
/// can still extend. Without this, a full disk left a torn chunk, and every
/// reader stopped there. The first failure is reported on stderr once, with
/// its reason. Async-signal-safe (the fatal-signal flush writes through
/// here); called with `FD_LOCK` held.
fn write_whole_chunk(fd: i32, chunk: &[u8]) -> bool {
    // SAFETY: lseek on our own descriptor.
    let start = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    if sys::write_all(fd, chunk) {
        return true;
    }
    // SAFETY: reading errno through its thread-local location.
    let errno = unsafe { *libc::__errno_location() };
    if start >= 0 {
        // SAFETY: cutting our own file back to where this chunk began.
        unsafe {
            libc::ftruncate(fd, start);
            libc::lseek(fd, start, libc::SEEK_SET);
        }
    }
    if !WRITE_FAILED.swap(true, Ordering::AcqRel) {
        let mut digits = [0u8; 20];
        sys::warn_parts(&[
            "cannot write the trace (",
            sys::errno_name(errno),
            ", errno ",
            sys::decimal(errno.unsigned_abs() as u64, &mut digits),
            "): events from here on are lost and counted; the trace stays readable up to here",
        ]);
    }
    false
}

/// A write of the trace failed (reported once).
static WRITE_FAILED: AtomicBool = AtomicBool::new(false);

/// The trace file's descriptor (-1 when there is none).
pub fn trace_fd() -> i32 {
    FD.load(Ordering::Acquire)
}

/// Moves the trace file to another descriptor: the program is about to
/// `dup2` onto its number (hooks/fds.rs). Without a free descriptor the
/// trace stops (its later events counted as lost) rather than go into the
/// program's file.
pub fn move_trace_fd() {
    FD_LOCK.lock();
    let fd = FD.load(Ordering::Acquire);
    if fd >= 0 {
        // SAFETY: duplicating and closing our own descriptor.
        let moved = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, fd + 1) };
        FD.store(moved.max(-1), Ordering::Release);
        // SAFETY: our descriptor; the system call, not the close hook.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
    FD_LOCK.unlock();
}

/// The lowest descriptor for the trace file: high, where programs rarely
/// look (they get the same numbers as without trapline) and rarely `dup2`
/// onto; below the soft limit on open files.
pub fn high_fd_floor() -> i32 {
    let soft = sys::soft_limit(libc::RLIMIT_NOFILE).unwrap_or(1024);
    soft.saturating_sub(24).min(1000) as i32
}

/// Writes every queued buffer now, from the calling thread.
pub fn drain(scratch: &mut Vec<u8>) {
    while let Some(b) = buffers::with_queue(|q| {
        let b = q.full.pop_front();
        if let Some(b) = &b {
            q.queued_bytes -= b.data.len();
            IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        }
        b
    }) {
        write_one(&b, scratch);
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        buffers::with_queue(|q| q.free.push(b));
        // Room for one buffer: one waiting producer. Waking them all made
        // every written buffer wake every waiting thread (3,000 threads
        // ending at once took 16 s instead of 0.2).
        buffers::SPACE.notify_one();
    }
}

/// Opens the trace file and writes its header.
pub fn open(path: &std::ffi::CStr, exclusive: bool) -> Result<(), i32> {
    // Never through a symbolic link: a link put at the trace's name would
    // make the trace overwrite whatever it points to.
    let flags = libc::O_WRONLY
        | libc::O_CREAT
        | libc::O_CLOEXEC
        | libc::O_NOFOLLOW
        | if exclusive {
            libc::O_EXCL
        } else {
            libc::O_TRUNC
        };
    // SAFETY: `path` is NUL-terminated.
    let mut fd = unsafe { libc::open(path.as_ptr(), flags, 0o644) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    let floor = high_fd_floor();
    if fd < floor {
        // SAFETY: duplicating and closing our own descriptor.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) };
        if high >= 0 {
            // SAFETY: as above; the system call, not the close hook.
            unsafe { libc::syscall(libc::SYS_close, fd) };
            fd = high;
        }
    }
    let mut header = Vec::new();
    let _ = write_file_header(&mut header);
    sys::write_all(fd, &header);
    FD.store(fd, Ordering::Release);
    reserve_emergency();
    Ok(())
}

/// The writer's tick while events are recorded (clock.rs).
const TICK_EVERY_NS: u64 = 1_000_000;
/// The periodic sweep: partly filled buffers, the process-end check (recording.md, "The periodic sweep").
const SWEEP_EVERY_NS: u64 = 200_000_000;

/// The writer thread is created but has not yet noted itself as the
/// agent's: a stop of the world would park it like a program thread.
static STARTING: AtomicBool = AtomicBool::new(false);

/// Whether a writer thread is starting and not yet known as the agent's.
pub fn starting() -> bool {
    STARTING.load(Ordering::Acquire)
}

/// The writer thread's tid, known from its start (0 if unknown).
pub fn tid() -> u32 {
    WRITER_TID.load(Ordering::Acquire)
}

static PERIODIC: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

extern "C" fn writer_main(_arg: *mut libc::c_void) -> *mut libc::c_void {
    // Before anything allocates: a scan from here on leaves this thread
    // running (one that stopped it inside the agent heap had to wait for it).
    crate::platform::agent_threads::note_current();
    STARTING.store(false, Ordering::Release);
    // Then: this thread's own allocations (TLS setup) must never be recorded.
    crate::events::thread::mark_agent_thread();
    // SAFETY: naming our own thread; the name fits in 16 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"trapline-writer".as_ptr()) };
    // The thread started with `agent_threads::AGENT_BLOCKED` (`start`).
    // SAFETY: PERIODIC holds a `fn()` stored by `start`.
    let periodic: fn() =
        unsafe { core::mem::transmute::<usize, fn()>(PERIODIC.load(Ordering::Acquire)) };
    let mut scratch = Vec::new();
    let mut last_sweep = 0u64;
    let mut last_read = 0u64;
    let me = sys::gettid();
    WRITER_TID.store(me, Ordering::Release);
    loop {
        let seen = buffers::WORK.generation();
        drain(&mut scratch);
        // Tick every millisecond while events read the tick; once they have
        // not for a while, sleep until the next sweep (clock.rs).
        let state = crate::platform::clock::tick_state();
        let now = crate::platform::clock::writer_now();
        if state.read {
            last_read = now;
        }
        let asleep = !crate::services::process_end::pending()
            && (state.asleep
                || now.saturating_sub(last_read) >= crate::platform::clock::IDLE_AFTER_NS);
        crate::platform::clock::publish_tick(now, asleep);
        let sweep = now.saturating_sub(last_sweep) >= SWEEP_EVERY_NS;
        if sweep {
            last_sweep = now;
            periodic();
            drain(&mut scratch);
            SWEEPS.fetch_add(1, Ordering::Release);
        }
        if STOP.load(Ordering::Acquire) {
            drain(&mut scratch);
            break;
        }
        if crate::services::process_end::program_has_ended(me, sweep) {
            end_for_program(&mut scratch);
        }
        let timeout = if asleep {
            SWEEP_EVERY_NS.saturating_sub(now.saturating_sub(last_sweep))
        } else {
            TICK_EVERY_NS
        };
        buffers::WORK.wait(seen, Some(timeout.max(TICK_EVERY_NS)));
    }
    stopped();
    core::ptr::null_mut()
}

/// Periodic sweeps done, each counted once what it stole is written: an
/// event made before a sweep began is in the file once the count has gone
/// past that sweep (`control::COUNTERS`, for a window of the trace).
pub static SWEEPS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// The writer has left its loop: `finish` writes what is left itself.
fn stopped() {
    buffers::WRITER_RUNNING.store(false, Ordering::Release);
    STOPPED.store(true, Ordering::Release);
    DONE.notify_all();
    // Producers waiting for room queue their buffers without waiting now.
    buffers::SPACE.notify_all();
}

/// The program's threads are all gone (`process_end`): the process ends as
/// glibc would have ended it from the last one, with exit(0), called from
/// here. The writer stops being one first, so that the exit handlers (the
/// program's record their calls now, as a program thread's would be) and
/// then the agent's `finish` write the rest of the trace from this thread.
fn end_for_program(scratch: &mut Vec<u8>) -> ! {
    drain(scratch);
    stopped();
    crate::events::thread::adopt_for_program();
    // The program's exit handlers run here, with a program thread's mask.
    agent_threads::set_signal_mask(libc::SIG_SETMASK, CREATOR_MASK.load(Ordering::Relaxed));
    // SAFETY: exit(0) is what glibc calls when a process's last thread ends.
    unsafe { libc::exit(0) }
}

/// The creating thread's mask when the writer started, which the writer
/// takes back when it becomes the program's last thread (`end_for_program`).
static CREATOR_MASK: AtomicU64 = AtomicU64::new(0);

/// The periodic work of a writer whose start waits (`defer_start`; 0:
/// none waits).
static DEFERRED: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Production mode: the writer starts only when the program starts a
/// second thread or its buffers pile up (`start_deferred`). A thread of the
/// agent's would end glibc's single-thread fast paths (`SINGLE_THREAD_P`:
/// its malloc and free then lock their arena), which cost a single-threaded
/// program more than the recording. Until then buffers wait in the queue
/// and the clock is read at each event.
pub fn defer_start(periodic: fn()) {
    crate::platform::clock::set_ticker(false);
    DEFERRED.store(periodic as *const () as usize, Ordering::Release);
}

/// Starts the writer whose start waits, if one does.
pub fn start_deferred() {
    let periodic = DEFERRED.swap(0, Ordering::AcqRel);
    if periodic != 0 {
        // SAFETY: `periodic` was stored from a `fn()` by `defer_start`.
        let periodic: fn() = unsafe { core::mem::transmute::<usize, fn()>(periodic) };
        crate::platform::clock::set_ticker(true);
        start(periodic);
    }
}

/// Starts the writer thread, with the agent threads' mask from its first
/// instruction (`agent_threads::spawn`).
pub fn start(periodic: fn()) {
    crate::platform::clock::on_ticker_asleep(buffers::wake);
    STARTING.store(true, Ordering::Release);
    PERIODIC.store(periodic as *const () as usize, Ordering::Release);
    STOP.store(false, Ordering::Release);
    STOPPED.store(false, Ordering::Release);
    buffers::WRITER_RUNNING.store(true, Ordering::Release);
    // Not the scan's park signal: an exit scan can come before the writer
    // has run its first instruction and noted itself as the agent's, and
    // then parks it like any thread (the agent's own signal, thread-directed).
    let park = 1u64 << (crate::services::scan::world::park_signal() - 1);
    let (thread, creator_mask) = agent_threads::spawn(writer_main, park);
    CREATOR_MASK.store(creator_mask, Ordering::Relaxed);
    match thread {
        // Known before it runs: an exit that counts the program's threads
        // must not take it for one, nor wait for it to start (its start-up
        // touched a megabyte a short-lived process never needed).
        Some(t) => WRITER_TID.store(
            crate::events::threads::kernel_tid(t).unwrap_or(0),
            Ordering::Release,
        ),
        None => {
            STARTING.store(false, Ordering::Release);
            buffers::WRITER_RUNNING.store(false, Ordering::Release);
            sys::warn("cannot start the writer thread; the trace is written at exit");
        }
    }
}

/// Threads inside `pause` .. `resume`, and whether the writer ran when the
/// first of them stopped it (`PAUSE_LOCK` guards both).
static PAUSE_LOCK: crate::platform::lock::RawLock = crate::platform::lock::RawLock::new();
static PAUSERS: AtomicU32 = AtomicU32::new(0);
static PAUSED_RUNNING: AtomicBool = AtomicBool::new(false);

/// Stops the writer thread and waits until the kernel has let it go, for a
/// system call that needs the process to have a single thread (`unshare`
/// of a user namespace, `setns`: hooks/namespaces.rs). Every `pause` is
/// followed by a `resume`; with several threads in such calls at once, the
/// first stops the writer and the last starts a new one (two writers at
/// once would share the queue, the clock tick and the sweep). Buffers filled
/// meanwhile wait in the queue.
pub fn pause() {
    let _g = PAUSE_LOCK.guard();
    if PAUSERS.fetch_add(1, Ordering::AcqRel) > 0 {
        return;
    }
    let running = buffers::WRITER_RUNNING.load(Ordering::Acquire);
    PAUSED_RUNNING.store(running, Ordering::Release);
    if !running {
        return;
    }
    let deadline = stop_writer(5_000);
    // The thread has left its loop; it is gone once the kernel no longer
    // lists it (a detached thread is reaped as it exits). Its tid is read
    // only now: a writer that had not run yet when the program called (it
    // notes its tid first thing) has by the time it stopped.
    let tid = WRITER_TID.load(Ordering::Acquire);
    while tid != 0
        && !crate::platform::tasks::has_ended(tid)
        && crate::platform::clock::precise_now() < deadline
    {
        // SAFETY: yielding the processor has no preconditions.
        unsafe { libc::sched_yield() };
    }
    crate::platform::agent_threads::forget(tid);
}

/// How long the finish waits for the writer with the program's threads held
/// stopped before it lets them go.
const LET_GO_AFTER_NS: u64 = 2_000_000_000;

/// Asks the running writer to write what is queued and leave its loop, and
/// waits for that at most `timeout_ms`; returns the deadline.
fn stop_writer(timeout_ms: u64) -> u64 {
    STOP.store(true, Ordering::Release);
    buffers::WORK.notify_all();
    let deadline = crate::platform::clock::precise_now() + timeout_ms * 1_000_000;
    let started = crate::platform::clock::precise_now();
    while !STOPPED.load(Ordering::Acquire) && crate::platform::clock::precise_now() < deadline {
        if crate::platform::clock::precise_now() > started + LET_GO_AFTER_NS {
            // The exit's stopped threads (scan::ExitHold) may be what the
            // writer waits for.
            crate::platform::hold::let_go_if_held();
        }
        let seen = DONE.generation();
        if STOPPED.load(Ordering::Acquire) {
            break;
        }
        DONE.wait(seen, Some(5_000_000));
    }
    deadline
}

/// Ends a `pause`: the last one starts the writer again if it ran.
pub fn resume() {
    let _g = PAUSE_LOCK.guard();
    if PAUSERS.fetch_sub(1, Ordering::AcqRel) != 1 || !PAUSED_RUNNING.load(Ordering::Acquire) {
        return;
    }
    let periodic = PERIODIC.load(Ordering::Acquire);
    if periodic != 0 {
        // SAFETY: PERIODIC holds the `fn()` an earlier `start` stored.
        start(unsafe { core::mem::transmute::<usize, fn()>(periodic) });
    }
}

/// Stops the writer after it has written everything queued, waiting at most
/// `timeout_ms`; then writes whatever is left from this thread and closes the file.
pub fn finish(timeout_ms: u64) {
    if buffers::WRITER_RUNNING.load(Ordering::Acquire) {
        stop_writer(timeout_ms);
    }
    let mut scratch = Vec::new();
    drain(&mut scratch);
    let fd = FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: we own this descriptor; nobody writes after FD was cleared.
        unsafe { libc::close(fd) };
    }
}

/// After a failed exec: the old file is closed; a new one follows.
pub fn reset_for_new_file() {
    crate::events::totals::make_inexact();
    buffers::EVENTS_SUBMITTED.store(0, Ordering::Relaxed);
    EVENTS_WRITTEN.store(0, Ordering::Relaxed);
    buffers::EVENTS_LOST.store(0, Ordering::Relaxed);
    buffers::GEN.fetch_add(1, Ordering::AcqRel);
}

/// In a fork child: drop the parent's queue and file, start a new generation.
pub fn reset_in_child() {
    crate::events::totals::make_inexact();
    // A writer the parent was starting is not the child's.
    STARTING.store(false, Ordering::Relaxed);
    buffers::reset_in_child();
    // The writer thread may have been writing when the parent forked.
    FD_LOCK.reset();
    IN_FLIGHT.store(0, Ordering::Relaxed);
    let fd = FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the parent's descriptor copy; the child must not write to it.
        unsafe { libc::close(fd) };
    }
    buffers::WRITER_RUNNING.store(false, Ordering::Release);
    buffers::GEN.fetch_add(1, Ordering::AcqRel);
    buffers::EVENTS_SUBMITTED.store(0, Ordering::Relaxed);
    EVENTS_WRITTEN.store(0, Ordering::Relaxed);
    buffers::EVENTS_LOST.store(0, Ordering::Relaxed);
}

//! Ending a process whose program threads are all gone.
//!
//! When the main thread leaves through `pthread_exit`, the process lives on
//! until its last thread ends: glibc counts the threads `pthread_create`
//! started, and the thread that brings the count to zero calls `exit(0)`.
//! The agent's writer thread is one of those threads, so the count never
//! reached zero: the program's threads were all gone and the process lived
//! on as the writer alone, forever (and `trapline run` waited with it).
//!
//! So the agent counts the program's threads that its `pthread_create`
//! started and that have not ended. When that count is zero and the main
//! thread is gone, the ending thread asks the writer to look at the
//! kernel's list of the process's tasks. When no task is left but the
//! writer and the main thread's zombie, the writer calls `exit(0)` on the
//! program's behalf, as glibc would have from the last thread: the
//! program's exit handlers run, then the agent's, which finish the trace.
//! An exit is noticed at the writer's next wake (about a millisecond). A
//! thread the count does not know (started before the agent was loaded)
//! keeps the process going as it should; when it ends, or should two
//! threads end at once and the check miss the second, the writer's
//! periodic sweep (every 200 ms) looks again. Without the count, every
//! thread's end looked, and a program that started and ended threads from
//! one that outlived main paid 24 microseconds for each.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The main thread has left through `pthread_exit` (its key destructor ran).
static MAIN_GONE: AtomicBool = AtomicBool::new(false);
/// The last counted program thread is ending since the main thread left:
/// its tid (0: none).
static ENDING: AtomicU32 = AtomicU32::new(0);
/// Program threads started through the agent's `pthread_create` that have
/// not ended (the main thread is not one of them).
static RUNNING: AtomicU32 = AtomicU32::new(0);

/// From a thread started through the agent's `pthread_create`.
pub fn program_thread_started() {
    RUNNING.fetch_add(1, Ordering::AcqRel);
}

/// From a program thread's key destructor (`thread::on_thread_exit`);
/// `counted`: the thread is one `program_thread_started` counted.
pub fn program_thread_ending(tid: u32, counted: bool) {
    let running = if counted {
        let before = RUNNING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        });
        before.map_or(0, |n| n.saturating_sub(1))
    } else {
        RUNNING.load(Ordering::Acquire)
    };
    if tid == crate::platform::sys::getpid_raw() {
        MAIN_GONE.store(true, Ordering::Release);
    }
    if running == 0 && MAIN_GONE.load(Ordering::Acquire) {
        ENDING.store(tid, Ordering::Release);
        crate::events::buffers::wake();
    }
}

/// A thread is ending since the main thread left: the writer must keep
/// waking every millisecond to see it gone.
pub fn pending() -> bool {
    ENDING.load(Ordering::Acquire) != 0
}

/// From the writer's loop, on every wake (`sweep`: the periodic one): true
/// when the program has no thread left, and the process must end.
pub fn program_has_ended(writer_tid: u32, sweep: bool) -> bool {
    if !MAIN_GONE.load(Ordering::Acquire) {
        return false;
    }
    let ending = ENDING.load(Ordering::Acquire);
    if ending == 0 && !sweep {
        return false;
    }
    // A listing that missed a task would end the process under it: only a
    // settled one counts (the writer may allocate, from the agent's heap).
    let Some(tids) = crate::platform::tasks::live_threads() else {
        return false;
    };
    // The agent's other threads (the control socket's) end with the process.
    let agents = crate::platform::agent_threads::others();
    let alive = tids
        .iter()
        .copied()
        .find(|&tid| tid != writer_tid && !agents.contains(&tid));
    match alive {
        None => true,
        // Only the thread that is ending: look again at the next wake.
        Some(tid) if tid == ending => false,
        // Another thread runs on; its own end asks again.
        Some(_) => {
            let _ = ENDING.compare_exchange(ending, 0, Ordering::AcqRel, Ordering::Relaxed);
            false
        }
    }
}

/// In a fork child: its one thread, the forking one, is its main thread.
pub fn reset_in_child() {
    MAIN_GONE.store(false, Ordering::Relaxed);
    ENDING.store(0, Ordering::Relaxed);
    RUNNING.store(0, Ordering::Relaxed);
    if let Some(ts) = crate::events::thread::current_if_any() {
        ts.counted_running = false;
    }
}

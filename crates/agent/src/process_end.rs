//! Ending a process whose program threads are all gone.
//!
//! When the main thread leaves through `pthread_exit`, the process lives on
//! until its last thread ends: glibc counts the threads `pthread_create`
//! started, and the thread that brings the count to zero calls `exit(0)`.
//! The agent's writer thread is one of those threads, so the count never
//! reached zero: the program's threads were all gone and the process lived
//! on as the writer alone, forever (and `trapline run` waited with it).
//!
//! So a program thread's exit, once the main thread is gone, asks the writer
//! to look at the kernel's list of the process's tasks. When no task is left
//! but the writer and the main thread's zombie, the writer calls `exit(0)`
//! on the program's behalf, as glibc would have from the last thread: the
//! program's exit handlers run, then the agent's, which finish the trace.
//! An exit is noticed at the writer's next wake (about a millisecond);
//! should two threads end at once and the check miss the second, the
//! writer's periodic sweep (every 200 ms) looks again.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The main thread has left through `pthread_exit` (its key destructor ran).
static MAIN_GONE: AtomicBool = AtomicBool::new(false);
/// A program thread is ending since the main thread left: its tid (0: none).
static ENDING: AtomicU32 = AtomicU32::new(0);

/// From a program thread's key destructor (`thread::on_thread_exit`).
pub fn program_thread_ending(tid: u32) {
    if tid == crate::sys::getpid_raw() {
        MAIN_GONE.store(true, Ordering::Release);
    }
    if MAIN_GONE.load(Ordering::Acquire) {
        ENDING.store(tid, Ordering::Release);
        crate::writer::wake();
    }
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
    let mut dirents = [0u8; 2048];
    let mut alive = None;
    crate::tasks::each(&mut dirents, |tid| {
        if tid != writer_tid && !crate::tasks::has_ended(tid) {
            alive = Some(tid);
        }
        alive.is_none()
    });
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
}

//! The agent's own threads (the writer, samplers): the scan never stops
//! them nor reads them as roots, and they record nothing.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAX_AGENT_THREADS: usize = 8;
static TIDS: [AtomicU32; MAX_AGENT_THREADS] = [const { AtomicU32::new(0) }; MAX_AGENT_THREADS];
/// A stack pointer of each, noted when it was marked: its stack mapping.
static STACKS: [AtomicU64; MAX_AGENT_THREADS] = [const { AtomicU64::new(0) }; MAX_AGENT_THREADS];

/// Notes the calling thread as one of the agent's.
pub fn note_current() {
    let tid = crate::platform::sys::gettid();
    let sp = crate::platform::arch::stack_pointer();
    for (t, s) in TIDS.iter().zip(&STACKS) {
        if t.load(Ordering::Acquire) == tid
            || t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            s.store(sp, Ordering::Release);
            return;
        }
    }
}

/// Notes `tid` as one of the agent's before it runs (its starter knows
/// its tid; the thread notes its stack when it runs, `note_current`).
pub fn note(tid: u32) {
    if tid == 0 {
        return;
    }
    for t in &TIDS {
        if t.load(Ordering::Acquire) == tid
            || t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return;
        }
    }
}

/// Forgets an agent thread that has ended (its tid may come back as a
/// program thread's).
pub fn forget(tid: u32) {
    for (t, s) in TIDS.iter().zip(&STACKS) {
        if tid != 0 && t.load(Ordering::Acquire) == tid {
            s.store(0, Ordering::Release);
            t.store(0, Ordering::Release);
        }
    }
}

/// Fork child: only the calling thread survives.
pub fn forget_all() {
    for t in &TIDS {
        t.store(0, Ordering::Relaxed);
    }
}

/// Whether `tid` is one of the agent's threads.
pub fn contains(tid: u32) -> bool {
    tid != 0 && TIDS.iter().any(|t| t.load(Ordering::Acquire) == tid)
}

/// The agent's own threads but the caller.
pub fn others() -> Vec<u32> {
    let me = crate::platform::sys::gettid();
    TIDS.iter()
        .map(|t| t.load(Ordering::Acquire))
        .filter(|&t| t != 0 && t != me)
        .collect()
}

/// A stack pointer of each agent thread.
pub fn stack_pointers() -> impl Iterator<Item = u64> {
    STACKS
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|&sp| sp != 0)
}

//! The agent's own threads (the writer, samplers): the scan never stops
//! them nor reads them as roots, and they record nothing.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// glibc's internal signals (SIGRTMIN-2 and SIGRTMIN-1 of the kernel's
/// numbering): cancellation, and the setxid broadcast with which
/// `setuid`/`setgid`/`setgroups` make every thread of the process change
/// its ids. glibc signals each thread it created and waits for each to
/// answer, so a thread that blocks 33 hangs the caller forever (a daemon
/// dropping privileges at start). glibc's own `pthread_sigmask` never
/// blocks them; the agent's masks are set with the system call, so they
/// must leave them out themselves.
pub const GLIBC_INTERNAL_SIGNALS: [core::ffi::c_int; 2] = [32, 33];

/// The mask an agent thread runs with: every signal but the faults its own
/// code raises and glibc's internal ones. A signal sent to the process
/// must reach a program thread: the kernel gives it to any thread that does
/// not block it, and the writer took a pool worker's SIGTERM and died of it
/// without finishing the trace; in a program that blocks SIGTERM everywhere
/// to `sigwait` for it, the writer took it and the process died. SIGXFSZ is
/// blocked too: a trace that outgrows RLIMIT_FSIZE must not kill the
/// program (the write fails with EFBIG and the lost events are counted).
pub const AGENT_BLOCKED: u64 = {
    let mut mask = !0u64;
    let mut i = 0;
    while i < crate::platform::sys::FAULT_SIGNALS.len() {
        mask &= !(1 << (crate::platform::sys::FAULT_SIGNALS[i] - 1));
        i += 1;
    }
    let mut i = 0;
    while i < GLIBC_INTERNAL_SIGNALS.len() {
        mask &= !(1 << (GLIBC_INTERNAL_SIGNALS[i] - 1));
        i += 1;
    }
    mask
};

/// rt_sigprocmask on the calling thread (the system call: the
/// `pthread_sigmask` symbol is the agent's own hook). Returns the old mask.
pub fn set_signal_mask(how: libc::c_int, mask: u64) -> u64 {
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with 8-byte masks we own.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            how,
            &mask as *const u64,
            &mut old as *mut u64,
            8usize,
        )
    };
    old
}

/// Starts one of the agent's threads: a raw detached pthread running
/// `main` (nothing of Rust's thread runtime runs on it before it marks
/// itself as the agent's), not through the agent's pthread_create hook, and
/// with `AGENT_BLOCKED` but the signals in `unblocked` blocked from its
/// first instruction: it inherits the mask from the calling thread, which
/// holds it for the moment. Returns the thread and the caller's mask.
pub fn spawn(
    main: crate::platform::sys::StartRoutine,
    unblocked: u64,
) -> (Option<libc::pthread_t>, u64) {
    let old = set_signal_mask(libc::SIG_BLOCK, AGENT_BLOCKED & !unblocked);
    // glibc's pthread_create starts the thread with the creator's mask but
    // SIGCANCEL, so the creator must not hold SIGSETXID blocked either (a
    // fork child's writer is started while the fork path holds every signal).
    let internal = GLIBC_INTERNAL_SIGNALS
        .iter()
        .fold(0u64, |m, &s| m | 1 << (s - 1));
    set_signal_mask(libc::SIG_UNBLOCK, internal);
    // SAFETY: a detached thread running `main`, which takes no argument.
    let thread = unsafe {
        let mut t: libc::pthread_t = 0;
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let r = crate::platform::sys::create_untraced(&mut t, &attr, main, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        (r == 0).then_some(t)
    };
    set_signal_mask(libc::SIG_SETMASK, old);
    (thread, old)
}

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

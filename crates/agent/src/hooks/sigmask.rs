//! sigprocmask and pthread_sigmask: the agent's signals stay deliverable.
//!
//! Many threaded programs block every signal in their workers (and wait for
//! signals in one thread). Blocking the profiler's signal too would leave
//! those threads unsampled, and blocking the reachability scan's park signal
//! would leave them running during a scan (2 s lost waiting for them at
//! every exit of node, and false leaks possible), so a mask the program sets
//! never includes them, as glibc itself keeps its internal signals out of
//! programs' masks. Once the program has taken the sampling signal over
//! (profile.rs), it passes unchanged.

use core::ffi::c_int;
use core::sync::atomic::AtomicUsize;

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

static REAL_SIGPROCMASK: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_SIGMASK: AtomicUsize = AtomicUsize::new(0);

fn real(slot: &AtomicUsize, name: &core::ffi::CStr) -> MaskFn {
    let f = crate::sys::cached_next_symbol(slot, name);
    // SAFETY: the C library's function of that name, which has this signature.
    unsafe { core::mem::transmute::<usize, MaskFn>(f) }
}

/// Calls `real` with `set` minus the agent's signals when it would block them.
///
/// # Safety
/// The contract of sigprocmask.
unsafe fn without_agent_signals(
    real: MaskFn,
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    let sampling = crate::profile::protected_signal();
    let park = crate::scan::park_signal_in_use();
    // SAFETY: `set` is null or a valid sigset_t (the caller's contract).
    let blocks = |sig: c_int| sig != 0 && unsafe { libc::sigismember(set, sig) } == 1;
    if set.is_null() || how == libc::SIG_UNBLOCK || !(blocks(sampling) || blocks(park)) {
        // SAFETY: pass-through.
        return unsafe { real(how, set, old) };
    }
    // SAFETY: copying the caller's set into one we own, then passing it on.
    unsafe {
        let mut copy = *set;
        for sig in [sampling, park] {
            if sig != 0 {
                libc::sigdelset(&mut copy, sig);
            }
        }
        real(how, &copy, old)
    }
}

/// # Safety
/// sigprocmask's contract.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    unsafe { without_agent_signals(real(&REAL_SIGPROCMASK, c"sigprocmask"), how, set, old) }
}

/// # Safety
/// pthread_sigmask's contract.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    unsafe {
        without_agent_signals(
            real(&REAL_PTHREAD_SIGMASK, c"pthread_sigmask"),
            how,
            set,
            old,
        )
    }
}

/// glibc's own pthread_sigmask (the agent blocks the sampling signal around fork).
pub fn real_pthread_sigmask() -> MaskFn {
    real(&REAL_PTHREAD_SIGMASK, c"pthread_sigmask")
}

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    real(&REAL_SIGPROCMASK, c"sigprocmask");
    real(&REAL_PTHREAD_SIGMASK, c"pthread_sigmask");
}

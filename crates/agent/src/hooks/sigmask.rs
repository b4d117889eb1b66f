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

use crate::platform::signals::MaskFn;

static REAL_SIGPROCMASK: AtomicUsize = AtomicUsize::new(0);

fn real(slot: &AtomicUsize, name: &core::ffi::CStr) -> MaskFn {
    let f = crate::platform::sys::cached_next_symbol(slot, name);
    // SAFETY: the C library's function of that name, which has this signature.
    unsafe { core::mem::transmute::<usize, MaskFn>(f) }
}

/// A copy of `set` without the agent's signals, if it has any of them (a
/// mask a call would block them with, or a set of signals to wait for).
///
/// # Safety
/// `set` is null or points to a valid sigset_t.
pub unsafe fn agent_signals_removed(set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if set.is_null() {
        return None;
    }
    let signals = [
        crate::services::profile::protected_signal(),
        crate::services::scan::park_signal_in_use(),
    ];
    // SAFETY: `set` is a valid sigset_t (the caller's contract).
    let has = |sig: c_int| sig != 0 && unsafe { libc::sigismember(set, sig) } == 1;
    if !signals.iter().any(|&sig| has(sig)) {
        return None;
    }
    // SAFETY: as above; the copy is ours.
    let mut copy = unsafe { *set };
    for sig in signals.into_iter().filter(|&sig| sig != 0) {
        // SAFETY: a valid set and signal number.
        unsafe { libc::sigdelset(&mut copy, sig) };
    }
    Some(copy)
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
    // SAFETY: `set` is null or a valid sigset_t (the caller's contract).
    match unsafe { agent_signals_removed(set) }.filter(|_| how != libc::SIG_UNBLOCK) {
        // SAFETY: the caller's arguments, the set without the agent's signals.
        Some(copy) => unsafe { real(how, &copy, old) },
        // SAFETY: pass-through.
        None => unsafe { real(how, set, old) },
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
            crate::platform::signals::real_pthread_sigmask(),
            how,
            set,
            old,
        )
    }
}

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    real(&REAL_SIGPROCMASK, c"sigprocmask");
}

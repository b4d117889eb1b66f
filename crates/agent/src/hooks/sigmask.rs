//! sigprocmask and pthread_sigmask: the sampling signal stays deliverable.
//!
//! Many threaded programs block every signal in their workers (and wait for
//! signals in one thread). Blocking the profiler's signal too would leave
//! those threads unsampled, so a mask the program sets never includes it, as
//! glibc itself keeps its internal signals out of programs' masks. Once the
//! program has taken the signal over (profile.rs), masks pass unchanged.

use core::ffi::c_int;
use core::sync::atomic::{AtomicUsize, Ordering};

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

static REAL_SIGPROCMASK: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_SIGMASK: AtomicUsize = AtomicUsize::new(0);

fn real(slot: &AtomicUsize, name: &core::ffi::CStr) -> MaskFn {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        f = crate::sys::next_symbol(name);
        slot.store(f, Ordering::Release);
    }
    // SAFETY: the C library's function of that name, which has this signature.
    unsafe { core::mem::transmute::<usize, MaskFn>(f) }
}

/// Calls `real` with `set` minus the sampling signal when it would block it.
///
/// # Safety
/// The contract of sigprocmask.
unsafe fn without_sampling_signal(
    real: MaskFn,
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    let sig = crate::profile::protected_signal();
    // SAFETY: `set` is null or a valid sigset_t (the caller's contract).
    if sig == 0
        || set.is_null()
        || how == libc::SIG_UNBLOCK
        || unsafe { libc::sigismember(set, sig) } != 1
    {
        // SAFETY: pass-through.
        return unsafe { real(how, set, old) };
    }
    // SAFETY: copying the caller's set into one we own, then passing it on.
    unsafe {
        let mut copy = *set;
        libc::sigdelset(&mut copy, sig);
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
    unsafe { without_sampling_signal(real(&REAL_SIGPROCMASK, c"sigprocmask"), how, set, old) }
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
        without_sampling_signal(
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

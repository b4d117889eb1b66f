//! The agent's hold on signal dispositions, below everything that uses
//! it: the C library's real `sigaction` and `pthread_sigmask` (the
//! exported names are the agent's own hooks), which signals the agent's
//! fatal-signal handler holds while the program sees SIG_DFL, and the slot
//! that handler is registered in (by runtime, which knows how to finish
//! the trace).

use crate::platform::callback::Callback;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
pub type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
/// A three-argument (SA_SIGINFO) handler.
pub type Handler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_SIGMASK: AtomicUsize = AtomicUsize::new(0);
/// Whether the agent's fatal-signal handler is installed for a signal
/// (the program's view: SIG_DFL).
static OURS: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
/// The fatal-signal handler (`set_fatal_handler`).
static FATAL_HANDLER: Callback<Handler> = Callback::new();

/// The C library's sigaction.
pub fn real_sigaction() -> SigactionFn {
    let f = crate::platform::sys::cached_next_symbol(&REAL_SIGACTION, c"sigaction");
    // SAFETY: glibc's sigaction.
    unsafe { core::mem::transmute::<usize, SigactionFn>(f) }
}

/// The C library's pthread_sigmask.
pub fn real_pthread_sigmask() -> MaskFn {
    let f = crate::platform::sys::cached_next_symbol(&REAL_PTHREAD_SIGMASK, c"pthread_sigmask");
    // SAFETY: glibc's pthread_sigmask, which has this signature.
    unsafe { core::mem::transmute::<usize, MaskFn>(f) }
}

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    real_sigaction();
    real_pthread_sigmask();
}

/// The handler really installed for `sig` (SIG_DFL if it cannot be read).
pub fn real_handler(sig: c_int) -> usize {
    // SAFETY: querying the current disposition into a zeroed struct.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        if real_sigaction()(sig, core::ptr::null(), &mut old) == 0 {
            old.sa_sigaction
        } else {
            libc::SIG_DFL
        }
    }
}

/// Installs `act` for `sig` for real, past the program's view; true on
/// success.
///
/// # Safety
/// `act` must be a valid action whose handler is async-signal-safe.
pub unsafe fn real_sigaction_set(sig: c_int, act: &libc::sigaction) -> bool {
    // SAFETY: the caller's contract.
    unsafe { real_sigaction()(sig, act, core::ptr::null_mut()) == 0 }
}

/// Whether the agent's own fatal-signal handler holds `sig` (the program
/// sees SIG_DFL).
pub fn agent_owns(sig: c_int) -> bool {
    OURS.get(sig as usize)
        .is_some_and(|o| o.load(Ordering::Acquire))
}

/// Notes whether the agent's fatal-signal handler holds `sig`.
pub fn set_agent_owns(sig: c_int, owns: bool) {
    if let Some(o) = OURS.get(sig as usize) {
        o.store(owns, Ordering::Release);
    }
}

/// Registers the handler that finishes the trace when a signal kills the
/// program.
pub fn set_fatal_handler(handler: Handler) {
    FATAL_HANDLER.set(handler);
}

/// The fatal-signal handler, for installing it or for passing a signal on
/// to it from another of the agent's handlers.
pub fn fatal_handler() -> Option<Handler> {
    FATAL_HANDLER.get()
}

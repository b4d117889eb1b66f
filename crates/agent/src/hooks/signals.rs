//! `sigaction`, `signal` and `sigaltstack`: the program sees its own
//! dispositions, never the agent's handlers (runtime's fatal_signals.rs
//! and the profiler's sampling signal), and the unwinder knows the
//! thread's alternate stack.

use core::ffi::c_int;

/// # Safety
/// sigaction's contract.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if crate::services::profile::is_sampling_signal(sig) {
        // SAFETY: the caller's sigaction arguments, passed on.
        return unsafe { crate::services::profile::program_sigaction(sig, act, old) };
    }
    if !(1..65).contains(&sig) || !crate::runtime::fatal_signals::is_fatal(sig) {
        // SAFETY: pass-through.
        return unsafe { crate::platform::signals::real_sigaction()(sig, act, old) };
    }
    // SAFETY: the caller's sigaction arguments, passed on.
    unsafe { crate::runtime::fatal_signals::program_sigaction(sig, act, old) }
}

/// Sets or reads the thread's alternate signal stack, and keeps the
/// unwinder's copy of it (`ThreadState::bounds_for`): a stack captured in a
/// handler running there is read from that stack, then from the thread's
/// own past the signal frame.
///
/// # Safety
/// sigaltstack's contract.
#[no_mangle]
pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    // SAFETY: the caller's arguments, under sigaltstack's own contract.
    let r = unsafe { crate::platform::sys::sigaltstack(ss, old) };
    if r != 0 {
        return r;
    }
    let Some(ts) = crate::events::thread::current_if_any() else {
        return r;
    };
    if ts.agent_altstack && !old.is_null() {
        // The agent's side stack (side_stack.rs): the program set none.
        // SAFETY: the kernel just wrote `old`, so it is writable.
        unsafe { *old = crate::platform::sys::ALTSTACK_DISABLED };
    }
    if !ss.is_null() {
        // The program's own setting replaces the agent's.
        ts.agent_altstack = false;
        // SAFETY: the kernel accepted `ss`, so it was readable.
        ts.set_altstack(crate::events::thread::altstack_of(Some(unsafe { &*ss })));
    }
    r
}

/// # Safety
/// signal's contract (BSD semantics, as glibc: SA_RESTART, the signal blocked in its handler).
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: building a sigaction from zeroed memory and passing it to our sigaction.
    unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if sig > 0 && sig < 65 {
            libc::sigaddset(&mut act.sa_mask, sig);
        }
        let mut old: libc::sigaction = core::mem::zeroed();
        if sigaction(sig, &act, &mut old) != 0 {
            return libc::SIG_ERR;
        }
        old.sa_sigaction
    }
}

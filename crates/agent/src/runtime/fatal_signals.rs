//! Flushing the trace when a signal kills the program, without the program
//! being able to tell.
//!
//! For every signal whose default action terminates the process, the agent
//! installs its own handler while the program's disposition is SIG_DFL. The
//! handler (lifecycle.rs, registered in signals.rs) finishes the trace,
//! restores SIG_DFL and re-raises, so the process
//! dies exactly as it would have (same signal, same core dump). `sigaction`
//! and `signal` are interposed (hooks/signals.rs): a program that installs a
//! handler gets it installed for real, and a program that asks for the
//! current disposition sees SIG_DFL, never the agent's handler.

use crate::platform::signals::{agent_owns, real_sigaction, set_agent_owns};
use core::ffi::c_int;

/// Signals whose default action ends the process (real-time signals too, see `is_fatal`).
const FATAL: [c_int; 22] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
    libc::SIGTRAP,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGSTKFLT,
];

/// Every signal the agent watches: the list above and the real-time signals
/// glibc leaves to programs (SIGRTMIN..=SIGRTMAX; 32 and 33 are glibc's own).
fn watched() -> impl Iterator<Item = c_int> {
    FATAL.into_iter().chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
}

static LOCK: crate::platform::lock::RawLock = crate::platform::lock::RawLock::new();
/// What the program last set while the agent's handler was installed (flags and mask of its SIG_DFL).
static mut PROGRAM_VIEW: [core::mem::MaybeUninit<libc::sigaction>; 65] =
    [const { core::mem::MaybeUninit::zeroed() }; 65];

pub fn is_fatal(sig: c_int) -> bool {
    FATAL.contains(&sig) || (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&sig)
}

fn install_ours(sig: c_int) {
    // SAFETY: a zeroed sigaction with our handler is valid.
    unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        let Some(handler) = crate::platform::signals::fatal_handler() else {
            return;
        };
        act.sa_sigaction = handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if real_sigaction()(sig, &act, core::ptr::null_mut()) == 0 {
            set_agent_owns(sig, true);
        }
    }
}

/// Installs the agent's handler for every terminating signal left at SIG_DFL.
/// Sets `sig` to SIG_IGN, as the program would have inherited it natively
/// (the constructor, before `install`; agent.md, "trapline run").
pub fn ignore_inherited(sig: c_int) {
    // SAFETY: a zeroed sigaction with SIG_IGN and an empty mask is valid.
    unsafe {
        let mut ignore: libc::sigaction = core::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        real_sigaction()(sig, &ignore, core::ptr::null_mut());
    }
}

pub fn install() {
    for sig in watched() {
        if crate::services::profile::is_sampling_signal(sig) {
            continue;
        }
        // SAFETY: querying the current disposition into a zeroed struct.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if real_sigaction()(sig, core::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_DFL
            {
                (*core::ptr::addr_of_mut!(PROGRAM_VIEW))[sig as usize] =
                    core::mem::MaybeUninit::new(old);
                install_ours(sig);
            }
        }
    }
}

/// The program's `sigaction` for a fatal signal (hooks/signals.rs): while
/// the agent's handler holds `sig`, the program sees and sets its SIG_DFL
/// here; a handler of its own is installed for real and takes over.
///
/// # Safety
/// sigaction's contract.
pub unsafe fn program_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let _g = LOCK.guard();
    if agent_owns(sig) {
        // SAFETY: PROGRAM_VIEW[sig] was initialised when our handler was installed;
        // access is serialised by LOCK.
        unsafe {
            let view = &mut (*core::ptr::addr_of_mut!(PROGRAM_VIEW))[sig as usize];
            if !old.is_null() {
                *old = view.assume_init();
            }
            if !act.is_null() {
                if (*act).sa_sigaction == libc::SIG_DFL {
                    *view = core::mem::MaybeUninit::new(*act);
                } else {
                    let r = real_sigaction()(sig, act, core::ptr::null_mut());
                    if r == 0 {
                        set_agent_owns(sig, false);
                    }
                    return r;
                }
            }
        }
        return 0;
    }
    // SAFETY: pass-through; then take SIG_DFL back over if the program restored it.
    unsafe {
        let r = real_sigaction()(sig, act, old);
        if r == 0
            && !act.is_null()
            && (*act).sa_sigaction == libc::SIG_DFL
            && crate::phase::initialized()
        {
            (*core::ptr::addr_of_mut!(PROGRAM_VIEW))[sig as usize] =
                core::mem::MaybeUninit::new(*act);
            install_ours(sig);
        }
        r
    }
}

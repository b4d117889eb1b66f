//! Flushing the trace when a signal kills the program, without the program
//! being able to tell.
//!
//! For every signal whose default action terminates the process, the agent
//! installs its own handler while the program's disposition is SIG_DFL. The
//! handler finishes the trace, restores SIG_DFL and re-raises, so the process
//! dies exactly as it would have (same signal, same core dump). `sigaction`
//! and `signal` are interposed: a program that installs a handler gets it
//! installed for real, and a program that asks for the current disposition
//! sees SIG_DFL, never the agent's handler.

use crate::lifecycle;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use trapline_trace::ExitKind;

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

static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
/// Whether the agent's handler is installed for a signal (program view: SIG_DFL).
static OURS: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
static LOCK: crate::sys::RawLock = crate::sys::RawLock::new();
/// What the program last set while the agent's handler was installed (flags and mask of its SIG_DFL).
static mut PROGRAM_VIEW: [core::mem::MaybeUninit<libc::sigaction>; 65] =
    [const { core::mem::MaybeUninit::zeroed() }; 65];

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

pub(crate) fn real_sigaction() -> SigactionFn {
    let f = crate::sys::cached_next_symbol(&REAL_SIGACTION, c"sigaction");
    // SAFETY: glibc's sigaction.
    unsafe { core::mem::transmute::<usize, SigactionFn>(f) }
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

/// Whether the agent's own fatal-signal handler holds `sig` (the program sees SIG_DFL).
pub fn agent_owns(sig: c_int) -> bool {
    OURS.get(sig as usize)
        .is_some_and(|o| o.load(Ordering::Acquire))
}

/// Installs `act` for `sig` for real, past the program's view (the
/// reachability scan's park handler); true on success.
///
/// # Safety
/// `act` must be a valid action whose handler is async-signal-safe.
pub unsafe fn real_sigaction_set(sig: c_int, act: &libc::sigaction) -> bool {
    // SAFETY: the caller's contract.
    unsafe { real_sigaction()(sig, act, core::ptr::null_mut()) == 0 }
}

fn is_fatal(sig: c_int) -> bool {
    FATAL.contains(&sig) || (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&sig)
}

pub(crate) extern "C" fn on_fatal_signal(
    sig: c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SAFETY: errno is thread-local; saved and restored around our work.
    let saved_errno = unsafe { *libc::__errno_location() };
    if sent_from_outside(sig, info) && lifecycle::signal_during_finish(sig) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved_errno };
        return;
    }
    if !lifecycle::wait_out_fault_during_finish() {
        lifecycle::finish(ExitKind::Signal(sig), lifecycle::Ending::Signal);
    }
    // SAFETY: restoring the default action and re-raising; the signal is blocked
    // in this handler, so it is delivered (and kills) when the handler returns.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        real_sigaction()(sig, &dfl, core::ptr::null_mut());
        OURS[sig as usize].store(false, Ordering::Release);
        libc::raise(sig);
        *libc::__errno_location() = saved_errno;
    }
}

/// The signal came from another process or the terminal, not from a fault
/// of this thread's code nor from this process itself (`abort`, `raise`).
fn sent_from_outside(sig: c_int, info: *const libc::siginfo_t) -> bool {
    if info.is_null() {
        return false;
    }
    // SAFETY: the kernel's siginfo for this signal (SA_SIGINFO).
    let (code, pid) = unsafe { ((*info).si_code, (*info).si_pid()) };
    let fault = crate::sys::FAULT_SIGNALS.contains(&sig) && code > 0 && code != libc::SI_KERNEL;
    !fault && pid as u32 != crate::sys::getpid_raw()
}

fn install_ours(sig: c_int) {
    // SAFETY: a zeroed sigaction with our handler is valid.
    unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = on_fatal_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if real_sigaction()(sig, &act, core::ptr::null_mut()) == 0 {
            OURS[sig as usize].store(true, Ordering::Release);
        }
    }
}

/// Installs the agent's handler for every terminating signal left at SIG_DFL.
/// Sets `sig` to SIG_IGN, as the program would have inherited it natively
/// (the constructor, before `install`; section 10 of docs/design.md).
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
        if crate::profile::is_sampling_signal(sig) {
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

/// # Safety
/// sigaction's contract.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if crate::profile::is_sampling_signal(sig) {
        // SAFETY: the caller's sigaction arguments, passed on.
        return unsafe { crate::profile::program_sigaction(sig, act, old) };
    }
    if !(1..65).contains(&sig) || !is_fatal(sig) {
        // SAFETY: pass-through.
        return unsafe { real_sigaction()(sig, act, old) };
    }
    let _g = LOCK.guard();
    if OURS[sig as usize].load(Ordering::Acquire) {
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
                        OURS[sig as usize].store(false, Ordering::Release);
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
            && lifecycle::is_initialized()
        {
            (*core::ptr::addr_of_mut!(PROGRAM_VIEW))[sig as usize] =
                core::mem::MaybeUninit::new(*act);
            install_ours(sig);
        }
        r
    }
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
    let r = unsafe { crate::sys::sigaltstack(ss, old) };
    if r != 0 {
        return r;
    }
    let Some(ts) = crate::thread::current_if_any() else {
        return r;
    };
    if ts.agent_altstack && !old.is_null() {
        // The agent's side stack (side_stack.rs): the program set none.
        // SAFETY: the kernel just wrote `old`, so it is writable.
        unsafe { *old = crate::sys::ALTSTACK_DISABLED };
    }
    if !ss.is_null() {
        // The program's own setting replaces the agent's.
        ts.agent_altstack = false;
        // SAFETY: the kernel accepted `ss`, so it was readable.
        ts.set_altstack(crate::thread::altstack_of(Some(unsafe { &*ss })));
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

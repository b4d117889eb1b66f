//! `exit`: notes where the caller's live frames start before calling the real
//! `exit`, so that the reachability scan at exit scans the exiting thread's
//! stack from there (the frames below are `exit`'s own and the atexit
//! handlers', dead for the program) and its callee-saved registers. The
//! entry point is a naked trampoline in arch (`exit`).
//!
//! `__libc_start_main`: runs the program's `main` from `main_returning`, the
//! one place where a return from `main` passes through the agent (agent.md,
//! "vfork, posix_spawn and system": after a vfork child used up the exit
//! handlers, nothing else does).

use crate::platform::arch::CALLEE_SAVED;
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Looks up the real `exit` and `__libc_start_main` (from the constructor:
/// dlsym may allocate).
pub fn resolve() {
    crate::platform::sys::cached_next_symbol(&REAL_EXIT, c"exit");
    crate::platform::sys::cached_next_symbol(&REAL_START_MAIN, c"__libc_start_main");
}

/// The program's `main`, as `__libc_start_main` receives it. C-unwind: a
/// `pthread_exit` in `main` unwinds through `main_returning`.
type Main = unsafe extern "C-unwind" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMain = unsafe extern "C-unwind" fn(
    Main,
    c_int,
    *mut *mut c_char,
    *const c_void,
    *const c_void,
    *const c_void,
    *mut c_void,
) -> c_int;

static REAL_START_MAIN: AtomicUsize = AtomicUsize::new(0);
static PROGRAM_MAIN: AtomicUsize = AtomicUsize::new(0);

/// glibc's `__libc_start_main`, which the executable's `_start` calls
/// through its GOT, with `main_returning` in the place of `main`; every other
/// argument as given (since glibc 2.34 `init` and `fini` are ignored for
/// dynamic executables, by either symbol version).
///
/// # Safety
/// Called by `_start` with the arguments it gives glibc's.
#[no_mangle]
pub unsafe extern "C-unwind" fn __libc_start_main(
    main: Main,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *const c_void,
    fini: *const c_void,
    rtld_fini: *const c_void,
    stack_end: *mut c_void,
) -> c_int {
    let next = crate::platform::sys::cached_next_symbol(&REAL_START_MAIN, c"__libc_start_main");
    if next == 0 {
        // SAFETY: nothing to start the program with.
        unsafe { libc::abort() }
    }
    // SAFETY: glibc's __libc_start_main, with this signature.
    let next: StartMain = unsafe { core::mem::transmute(next) };
    PROGRAM_MAIN.store(main as usize, Ordering::Relaxed);
    // SAFETY: the caller's arguments, `main` replaced by a function of its type.
    unsafe { next(main_returning, argc, argv, init, fini, rtld_fini, stack_end) }
}

/// Calls the program's `main`; when it returns, finishes the trace if no exit
/// handler will (`finish_if_handlers_gone`), then returns its status to glibc,
/// which calls `exit` with it.
unsafe extern "C-unwind" fn main_returning(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    // SAFETY: stored by `__libc_start_main` before glibc calls this.
    let main: Main = unsafe { core::mem::transmute(PROGRAM_MAIN.load(Ordering::Relaxed)) };
    // SAFETY: the program's main with the arguments glibc gives it.
    let status = unsafe { main(argc, argv, envp) };
    crate::runtime::lifecycle::finish_if_handlers_gone(status);
    status
}

crate::platform::arch::exit_trampoline!(exit_collected);

/// Called by the `exit` trampoline with the caller's callee-saved registers
/// and its stack pointer.
pub extern "C" fn exit_collected(
    status: c_int,
    regs: *const [u64; CALLEE_SAVED],
    caller_sp: u64,
) -> ! {
    if crate::phase::owns_process() {
        crate::runtime::lifecycle::enter_exit();
        // SAFETY: `regs` points at the trampoline's spill area on this stack.
        crate::services::scan::note_exit_call(unsafe { &*regs }, caller_sp);
        crate::runtime::lifecycle::finish_if_handlers_gone(status);
    }
    let f = crate::platform::sys::cached_next_symbol(&REAL_EXIT, c"exit");
    // SAFETY: glibc's exit never returns.
    let real: extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(f) };
    real(status)
}

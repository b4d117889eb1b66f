//! `exit`: notes where the caller's live frames start before calling the real
//! `exit`, so that the reachability scan at exit scans the exiting thread's
//! stack from there (the frames below are `exit`'s own and the atexit
//! handlers', dead for the program) and its callee-saved registers. The
//! entry point is a naked trampoline in arch (`exit`).

use crate::arch::CALLEE_SAVED;
use core::ffi::c_int;
use core::sync::atomic::AtomicUsize;

static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Looks up the real `exit` (from the constructor: dlsym may allocate).
pub fn resolve() {
    crate::sys::cached_next_symbol(&REAL_EXIT, c"exit");
}

/// Called by the `exit` trampoline with the caller's callee-saved registers
/// and its stack pointer.
pub extern "C" fn exit_collected(
    status: c_int,
    regs: *const [u64; CALLEE_SAVED],
    caller_sp: u64,
) -> ! {
    if crate::lifecycle::owns_process() {
        crate::lifecycle::enter_exit();
        // SAFETY: `regs` points at the trampoline's spill area on this stack.
        crate::scan::note_exit_call(unsafe { &*regs }, caller_sp);
        crate::lifecycle::finish_if_handlers_gone(status);
    }
    let f = crate::sys::cached_next_symbol(&REAL_EXIT, c"exit");
    // SAFETY: glibc's exit never returns.
    let real: extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(f) };
    real(status)
}

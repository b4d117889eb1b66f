//! `swapcontext` and `setcontext`: note where a thread leaves its own stack.
//!
//! A thread that switches to another stack (a coroutine's) leaves its own
//! stack with live frames above the point where it switched and dead ones
//! below: the frames of the calls it made before (the agent's hooks, the
//! dynamic loader's lazy binding, which spills argument and vector registers
//! there). The scan reads a stack that a parked thread left from that point
//! up; read whole, a stale copy of a block's address in a dead frame made a
//! lost block reachable, depending on which registers the CPU's variant of
//! a C library function had left behind.
//!
//! The entry points are naked trampolines in arch (`stack_switch_trampoline`):
//! they pass the caller's stack pointer here and jump to the real function
//! with the caller's registers and return address, so the context it saves
//! is exactly the program's.

use core::sync::atomic::AtomicUsize;

crate::platform::arch::stack_switch_trampoline!(swapcontext, swapcontext_leaving);
crate::platform::arch::stack_switch_trampoline!(setcontext, setcontext_leaving);

static REAL_SWAPCONTEXT: AtomicUsize = AtomicUsize::new(0);
static REAL_SETCONTEXT: AtomicUsize = AtomicUsize::new(0);

/// Looks up the real functions (from the constructor: dlsym may allocate).
pub fn resolve() {
    crate::platform::sys::cached_next_symbol(&REAL_SWAPCONTEXT, c"swapcontext");
    crate::platform::sys::cached_next_symbol(&REAL_SETCONTEXT, c"setcontext");
}

/// Notes that the thread leaves its stack at `caller_sp` (the caller's stack
/// pointer once the call returns, where the saved context resumes) and
/// returns the real function to jump to.
fn leaving(caller_sp: u64, real: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    crate::events::thread::current().leaving_stack_at(caller_sp);
    let f = crate::platform::sys::cached_next_symbol(real, name);
    if f == 0 {
        // SAFETY: no C library function to continue with.
        unsafe { libc::abort() }
    }
    f
}

/// Called by the `swapcontext` trampoline.
pub extern "C" fn swapcontext_leaving(caller_sp: u64) -> usize {
    leaving(caller_sp, &REAL_SWAPCONTEXT, c"swapcontext")
}

/// Called by the `setcontext` trampoline. The frames above may still be
/// resumed (a context saved there by getcontext); those below never are.
pub extern "C" fn setcontext_leaving(caller_sp: u64) -> usize {
    leaving(caller_sp, &REAL_SETCONTEXT, c"setcontext")
}

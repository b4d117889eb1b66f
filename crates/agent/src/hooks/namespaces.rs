//! `unshare` and `setns`: the calls that need a process of one thread.
//!
//! A process joins a new user namespace (`unshare(CLONE_NEWUSER)`, which
//! `unshare -U`, container runtimes and sandboxes make) or enters another
//! process's namespaces (`setns`, as `nsenter` does: a user or mount
//! namespace) only while it has a single thread; the kernel answers EINVAL
//! otherwise. The agent's writer thread made every traced process one of
//! two threads, and those calls failed under trapline. So around them the
//! writer stops and is gone (its buffers wait in the queue), and a new one
//! starts once the call has returned.

use crate::platform::sys::cached_next_symbol;
use core::ffi::c_int;
use core::sync::atomic::AtomicUsize;

static REAL_UNSHARE: AtomicUsize = AtomicUsize::new(0);
static REAL_SETNS: AtomicUsize = AtomicUsize::new(0);

/// The `unshare` flags that need a single thread (CLONE_NEWUSER implies
/// CLONE_THREAD in the kernel).
const SINGLE_THREADED: c_int =
    libc::CLONE_NEWUSER | libc::CLONE_THREAD | libc::CLONE_SIGHAND | libc::CLONE_VM;

/// Runs `call` with the writer thread stopped, keeping its errno.
fn without_writer(call: impl FnOnce() -> c_int) -> c_int {
    if !crate::phase::owns_process() {
        // A vfork child shares the parent's memory: its writer is the
        // parent's, and the child is single-threaded anyway.
        return call();
    }
    crate::services::writer::pause();
    let r = call();
    // SAFETY: this thread's errno location.
    let errno = unsafe { *libc::__errno_location() };
    crate::services::writer::resume();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    r
}

/// # Safety
/// unshare's contract.
#[no_mangle]
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    let f = cached_next_symbol(&REAL_UNSHARE, c"unshare");
    // SAFETY: the C library's unshare.
    let real: unsafe extern "C" fn(c_int) -> c_int = unsafe { core::mem::transmute(f) };
    if flags & SINGLE_THREADED == 0 {
        // SAFETY: pass-through.
        return unsafe { real(flags) };
    }
    // SAFETY: pass-through, with the writer stopped.
    without_writer(|| unsafe { real(flags) })
}

/// # Safety
/// setns's contract.
#[no_mangle]
pub unsafe extern "C" fn setns(fd: c_int, nstype: c_int) -> c_int {
    let f = cached_next_symbol(&REAL_SETNS, c"setns");
    // SAFETY: the C library's setns.
    let real: unsafe extern "C" fn(c_int, c_int) -> c_int = unsafe { core::mem::transmute(f) };
    // Joining a user or mount namespace needs a single thread; with nstype
    // 0 the namespace's kind is the file's, unknown here.
    if nstype != 0 && nstype & (libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0 {
        // SAFETY: pass-through.
        return unsafe { real(fd, nstype) };
    }
    // SAFETY: pass-through, with the writer stopped.
    without_writer(|| unsafe { real(fd, nstype) })
}

//! close, close_range, closefrom, dup2 and dup3: the trace file's descriptor
//! stays the agent's.
//!
//! Programs close descriptors they never opened: OpenSSH (and most daemons)
//! call `close_range(3, ~0U, 0)` or `closefrom(3)` first thing, and a closed
//! trace descriptor meant no trace, or worse, the agent's next chunk written
//! into whatever file the program opened next under the same number. The
//! program never opened the trace file, so these hooks act as if it were not
//! there: `close` of it fails with EBADF (as it would natively), the ranges
//! are closed around it, and a `dup2`/`dup3` onto its number first moves the
//! trace file elsewhere (writer::move_trace_fd). The descriptor is also kept
//! high (writer::open), where programs rarely look. Raw system calls are not
//! seen.

use core::ffi::{c_int, c_uint};
use core::sync::atomic::AtomicUsize;

static REAL_CLOSE: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSE_RANGE: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSEFROM: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP2: AtomicUsize = AtomicUsize::new(0);
static REAL_DUP3: AtomicUsize = AtomicUsize::new(0);

use crate::platform::sys::cached_next_symbol as real;

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    real(&REAL_CLOSE, c"close");
    real(&REAL_CLOSE_RANGE, c"close_range");
    real(&REAL_CLOSEFROM, c"closefrom");
    real(&REAL_DUP2, c"dup2");
    real(&REAL_DUP3, c"dup3");
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

fn real_close(fd: c_int) -> c_int {
    match real(&REAL_CLOSE, c"close") {
        // SAFETY: the system call closes a descriptor the caller names.
        0 => unsafe { libc::syscall(libc::SYS_close, fd) as c_int },
        // SAFETY: the C library's close, with its signature.
        f => unsafe { core::mem::transmute::<usize, extern "C" fn(c_int) -> c_int>(f)(fd) },
    }
}

fn real_close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    match real(&REAL_CLOSE_RANGE, c"close_range") {
        // SAFETY: as the C library's close_range would (glibc before 2.34 has none).
        0 => unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int },
        // SAFETY: the C library's close_range, with its signature.
        f => unsafe {
            core::mem::transmute::<usize, extern "C" fn(c_uint, c_uint, c_int) -> c_int>(f)(
                first, last, flags,
            )
        },
    }
}

/// The trace file's descriptor as an unsigned number, if the agent has one.
fn trace_fd() -> Option<c_uint> {
    c_uint::try_from(crate::services::writer::trace_fd()).ok()
}

/// Whether `fd` is the trace file's descriptor.
fn is_trace_fd(fd: c_int) -> bool {
    fd >= 0 && fd == crate::services::writer::trace_fd()
}

/// Before the program's `dup2`/`dup3` onto `new`: the trace file leaves
/// that number first.
fn make_room_at(new: c_int) {
    if is_trace_fd(new) {
        crate::services::writer::move_trace_fd();
    }
}

/// # Safety
/// close's contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_trace_fd(fd) {
        set_errno(libc::EBADF);
        return -1;
    }
    real_close(fd)
}

/// # Safety
/// close_range's contract.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let Some(t) = trace_fd().filter(|&t| first <= t && t <= last) else {
        return real_close_range(first, last, flags);
    };
    // Around the trace file's descriptor.
    let mut r = 0;
    if first < t {
        r = real_close_range(first, t - 1, flags);
    }
    if r == 0 && t < last {
        r = real_close_range(t + 1, last, flags);
    }
    r
}

/// # Safety
/// closefrom's contract.
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let low_u = c_uint::try_from(low).unwrap_or(0);
    match trace_fd().filter(|&t| t >= low_u) {
        Some(_) => {
            // SAFETY: the hook above, which closes around the trace file.
            unsafe { close_range(low_u, c_uint::MAX, 0) };
        }
        None => match real(&REAL_CLOSEFROM, c"closefrom") {
            0 => {
                real_close_range(low_u, c_uint::MAX, 0);
            }
            // SAFETY: the C library's closefrom, with its signature.
            f => unsafe { core::mem::transmute::<usize, extern "C" fn(c_int)>(f)(low) },
        },
    }
}

/// # Safety
/// dup2's contract.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    make_room_at(new);
    match real(&REAL_DUP2, c"dup2") {
        // SAFETY: the system call, as dup2 makes it.
        0 => unsafe { libc::syscall(libc::SYS_dup2, old, new) as c_int },
        // SAFETY: the C library's dup2, with its signature.
        f => unsafe {
            core::mem::transmute::<usize, extern "C" fn(c_int, c_int) -> c_int>(f)(old, new)
        },
    }
}

/// # Safety
/// dup3's contract.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    make_room_at(new);
    match real(&REAL_DUP3, c"dup3") {
        // SAFETY: the system call, as dup3 makes it.
        0 => unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) as c_int },
        // SAFETY: the C library's dup3, with its signature.
        f => unsafe {
            core::mem::transmute::<usize, extern "C" fn(c_int, c_int, c_int) -> c_int>(f)(
                old, new, flags,
            )
        },
    }
}

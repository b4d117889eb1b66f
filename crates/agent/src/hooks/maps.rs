//! `mmap`, `mmap64` and `munmap`: passed on unchanged; the anonymous
//! mappings the allocator library makes for itself are noted for the exit
//! scan (allocator_maps.rs). The `mmap` stubs hand over the caller's return
//! address, which tells the allocator's calls from the program's.

use crate::platform::arch::with_return_address_on_stack;
use crate::tracking::allocator_maps;
use core::ffi::{c_int, c_void};
use core::sync::atomic::AtomicUsize;

static REAL_MMAP: AtomicUsize = AtomicUsize::new(0);
static REAL_MUNMAP: AtomicUsize = AtomicUsize::new(0);

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;

// `mmap64` is glibc's other name for the same function on 64-bit systems.
with_return_address_on_stack!(mmap => mapped);
with_return_address_on_stack!(mmap64 => mapped);
/// `mmap` with its caller's return address `ret`: passed to the next `mmap`
/// (the C library's, unless another library interposes it; the system call
/// if none can be found).
extern "C" fn mapped(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
    ret: u64,
) -> *mut c_void {
    let p = match crate::platform::sys::cached_next_symbol(&REAL_MMAP, c"mmap") {
        // SAFETY: the system call with the caller's arguments (what glibc's
        // mmap does; errno is set by syscall()).
        0 => unsafe {
            libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
        },
        f => {
            // SAFETY: the C library's mmap, with its signature.
            let f: MmapFn = unsafe { core::mem::transmute(f) };
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(addr, len, prot, flags, fd, off) }
        }
    };
    if p != libc::MAP_FAILED && flags & libc::MAP_ANONYMOUS != 0 {
        allocator_maps::note_map(p as u64, len as u64, ret);
    }
    p
}

/// # Safety
/// The C library's munmap contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let r = match crate::platform::sys::cached_next_symbol(&REAL_MUNMAP, c"munmap") {
        // SAFETY: the system call with the caller's arguments.
        0 => unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int },
        f => {
            // SAFETY: the C library's munmap, with its signature.
            let f: unsafe extern "C" fn(*mut c_void, usize) -> c_int =
                unsafe { core::mem::transmute(f) };
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(addr, len) }
        }
    };
    if r == 0 {
        allocator_maps::note_unmap(addr as u64, len as u64);
    }
    r
}

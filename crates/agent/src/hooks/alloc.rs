//! The C allocation functions.

use crate::arch::start_regs;
use crate::record;
use crate::sys::*;
use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};
use trapline_trace::AllocFn;

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: glibc's malloc, any size.
    let p = unsafe { __libc_malloc(size) };
    record::alloc(AllocFn::Malloc, p, size, 0, regs);
    p.cast()
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: glibc's calloc checks n*size for overflow itself.
    let p = unsafe { __libc_calloc(n, size) };
    record::alloc(AllocFn::Calloc, p, n.wrapping_mul(size), 0, regs);
    p.cast()
}

/// # Safety
/// `ptr` must be NULL or a block from this allocator (checked: bad pointers are reported).
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: `old` was validated against the live table by record::realloc.
    record::realloc(AllocFn::Realloc, ptr.cast(), size, regs, |old| unsafe {
        __libc_realloc(old, size)
    })
    .cast()
}

/// # Safety
/// As for realloc.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let regs = start_regs();
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: setting errno through its thread-local location.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    // SAFETY: as for realloc.
    record::realloc(
        AllocFn::ReallocArray,
        ptr.cast(),
        total,
        regs,
        |old| unsafe { __libc_realloc(old, total) },
    )
    .cast()
}

/// # Safety
/// `ptr` must be NULL or a live block (checked: bad pointers are reported, not passed on).
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    let regs = start_regs();
    if record::free(AllocFn::Free, ptr.cast(), regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { __libc_free(ptr.cast()) };
    }
}

/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    let regs = start_regs();
    if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: valid alignment checked above.
    let p = unsafe { __libc_memalign(align, size) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    record::alloc(AllocFn::PosixMemalign, p, size, align, regs);
    // SAFETY: caller passes a writable pointer.
    unsafe { *out = p.cast() };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: memalign handles any alignment (rounds up non-powers of two as glibc does).
    let p = unsafe { __libc_memalign(align, size) };
    record::alloc(AllocFn::AlignedAlloc, p, size, align, regs);
    p.cast()
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: glibc's memalign, any arguments.
    let p = unsafe { __libc_memalign(align, size) };
    record::alloc(AllocFn::Memalign, p, size, align, regs);
    p.cast()
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: glibc's valloc, any size.
    let p = unsafe { __libc_valloc(size) };
    record::alloc(AllocFn::Valloc, p, size, 4096, regs);
    p.cast()
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let regs = start_regs();
    // SAFETY: glibc's pvalloc, any size.
    let p = unsafe { __libc_pvalloc(size) };
    let rounded = (size + 4095) & !4095;
    record::alloc(AllocFn::Pvalloc, p, rounded.max(4096), 4096, regs);
    p.cast()
}

static REAL_USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// Resolves functions the agent wraps but cannot reach through `__libc_*` names.
pub fn resolve() {
    let p = crate::sys::next_symbol(c"malloc_usable_size");
    REAL_USABLE_SIZE.store(p, Ordering::Release);
}

/// # Safety
/// As for glibc's malloc_usable_size.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    let mut f = REAL_USABLE_SIZE.load(Ordering::Acquire);
    if f == 0 {
        resolve();
        f = REAL_USABLE_SIZE.load(Ordering::Acquire);
    }
    if f == 0 {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size.
    let real: unsafe extern "C" fn(*mut c_void) -> usize = unsafe { core::mem::transmute(f) };
    // SAFETY: passing the caller's pointer through unchanged.
    unsafe { real(ptr) }
}

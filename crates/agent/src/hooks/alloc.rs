//! The C allocation functions.

use crate::arch::{with_caller_regs, StartRegs};
use crate::record;
use crate::sys::*;
use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};
use trapline_trace::AllocFn;

// Each hook is a trampoline (arch::with_caller_regs) into the function
// below it, which gets the caller's frame as its last three arguments: the
// stack is captured from the program's own frame.

with_caller_regs!(malloc => malloc_hook, args: 1);
extern "C" fn malloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: glibc's malloc, any size.
    let p = unsafe { __libc_malloc(size) };
    record::alloc(AllocFn::Malloc, p, size, 0, regs);
    p.cast()
}

with_caller_regs!(calloc => calloc_hook, args: 2);
extern "C" fn calloc_hook(n: usize, size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: glibc's calloc checks n*size for overflow itself.
    let p = unsafe { __libc_calloc(n, size) };
    record::alloc(AllocFn::Calloc, p, n.wrapping_mul(size), 0, regs);
    p.cast()
}

with_caller_regs!(realloc => realloc_hook, args: 2);
/// # Safety
/// `ptr` must be NULL or a block from this allocator (checked: bad pointers are reported).
unsafe extern "C" fn realloc_hook(
    ptr: *mut c_void,
    size: usize,
    ret: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: `old` was validated against the live table by record::realloc.
    record::realloc(AllocFn::Realloc, ptr.cast(), size, regs, |old| unsafe {
        __libc_realloc(old, size)
    })
    .cast()
}

with_caller_regs!(reallocarray => reallocarray_hook, args: 3);
/// # Safety
/// As for realloc.
unsafe extern "C" fn reallocarray_hook(
    ptr: *mut c_void,
    n: usize,
    size: usize,
    ret: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
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

with_caller_regs!(free => free_hook, args: 1);
/// # Safety
/// `ptr` must be NULL or a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn free_hook(ptr: *mut c_void, ret: u64, sp: u64, bp: u64) {
    let regs = StartRegs::caller(ret, sp, bp);
    if record::free(AllocFn::Free, ptr.cast(), regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { __libc_free(ptr.cast()) };
    }
}

with_caller_regs!(posix_memalign => posix_memalign_hook, args: 3);
/// # Safety
/// `out` must be writable.
unsafe extern "C" fn posix_memalign_hook(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    ret: u64,
    sp: u64,
    bp: u64,
) -> i32 {
    let regs = StartRegs::caller(ret, sp, bp);
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

with_caller_regs!(aligned_alloc => aligned_alloc_hook, args: 2);
extern "C" fn aligned_alloc_hook(
    align: usize,
    size: usize,
    ret: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: memalign handles any alignment (rounds up non-powers of two as glibc does).
    let p = unsafe { __libc_memalign(align, size) };
    record::alloc(AllocFn::AlignedAlloc, p, size, align, regs);
    p.cast()
}

with_caller_regs!(memalign => memalign_hook, args: 2);
extern "C" fn memalign_hook(align: usize, size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: glibc's memalign, any arguments.
    let p = unsafe { __libc_memalign(align, size) };
    record::alloc(AllocFn::Memalign, p, size, align, regs);
    p.cast()
}

with_caller_regs!(valloc => valloc_hook, args: 1);
extern "C" fn valloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: glibc's valloc, any size.
    let p = unsafe { __libc_valloc(size) };
    record::alloc(AllocFn::Valloc, p, size, 4096, regs);
    p.cast()
}

with_caller_regs!(pvalloc => pvalloc_hook, args: 1);
extern "C" fn pvalloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
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

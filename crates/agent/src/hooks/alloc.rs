//! The C allocation functions.

use crate::events::next_alloc;
use crate::events::{calls, production, record};
use crate::platform::arch::{with_caller_regs, StartRegs};
use core::ffi::c_void;
use trapline_trace::AllocFn;

// Each hook is a trampoline (arch::with_caller_regs) into the function
// below it, which gets the caller's frame as its last three arguments: the
// stack is captured from the program's own frame.

with_caller_regs!(malloc => malloc_hook, args: 1);
extern "C" fn malloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    if production::passes_unsampled(AllocFn::Malloc, size as u64) {
        let p = next_alloc::malloc(size);
        if !p.is_null() {
            production::forget_if_released_lately(p as u64);
            return p.cast();
        }
        // Not kept for this: the caller's frame is found by unwinding.
        let _ = (ret, sp, bp);
        return malloc_failed(size);
    }
    malloc_recorded(size, ret, sp, bp)
}

/// A malloc the fast path passed on failed: recorded as a failed one, with
/// the stack unwound from here through the hook.
#[cold]
#[inline(never)]
fn malloc_failed(size: usize) -> *mut c_void {
    production::unpass(AllocFn::Malloc, size as u64);
    let p = core::ptr::null_mut();
    calls::alloc(
        AllocFn::Malloc,
        p,
        size,
        0,
        crate::platform::arch::start_regs(),
    );
    p.cast()
}

// The hooks' fast paths (production mode's unsampled calls) keep no frame
// of their own: what they need is decided before the real call, and the
// rest is out of line.
#[inline(never)]
extern "C" fn malloc_recorded(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    let p = next_alloc::malloc(size);
    calls::alloc(AllocFn::Malloc, p, size, 0, regs);
    p.cast()
}

with_caller_regs!(calloc => calloc_hook, args: 2);
extern "C" fn calloc_hook(n: usize, size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // The allocator checks n*size for overflow itself.
    let p = next_alloc::calloc(n, size);
    calls::alloc(AllocFn::Calloc, p, n.saturating_mul(size), 0, regs);
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
    calls::realloc(AllocFn::Realloc, ptr.cast(), size, regs, |old| unsafe {
        next_alloc::realloc(old, size)
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
        record::failed(AllocFn::ReallocArray, u64::MAX, 0, regs);
        // SAFETY: setting errno through its thread-local location.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    // SAFETY: as for realloc.
    calls::realloc(
        AllocFn::ReallocArray,
        ptr.cast(),
        total,
        regs,
        |old| unsafe { next_alloc::realloc(old, total) },
    )
    .cast()
}

with_caller_regs!(free => free_hook, args: 1);
/// # Safety
/// `ptr` must be NULL or a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn free_hook(ptr: *mut c_void, ret: u64, sp: u64, bp: u64) {
    if production::release_passes(AllocFn::Free, ptr as u64) {
        // SAFETY: a block the program holds, as far as the agent knows.
        return unsafe { next_alloc::free(ptr.cast()) };
    }
    // SAFETY: as for this function.
    unsafe { free_recorded(ptr, ret, sp, bp) }
}

/// # Safety
/// As for free_hook.
#[inline(never)]
unsafe extern "C" fn free_recorded(ptr: *mut c_void, ret: u64, sp: u64, bp: u64) {
    let regs = StartRegs::caller(ret, sp, bp);
    if calls::free(AllocFn::Free, ptr.cast(), regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { next_alloc::free(ptr.cast()) };
    }
}

// C23's sized releases (glibc 2.41): checked and recorded as `free` is.
// Without them in the C library, the agent's definitions release with `free`.

with_caller_regs!(free_sized => free_sized_hook, args: 2);
/// # Safety
/// `ptr` must be NULL or a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn free_sized_hook(ptr: *mut c_void, size: usize, ret: u64, sp: u64, bp: u64) {
    let regs = StartRegs::caller(ret, sp, bp);
    let stated = record::Stated {
        size: Some(size as u64),
        align: 0,
    };
    if calls::free_stating(AllocFn::FreeSized, ptr.cast(), stated, regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { next_alloc::free_sized(ptr.cast(), size) };
    }
}

with_caller_regs!(free_aligned_sized => free_aligned_sized_hook, args: 3);
/// # Safety
/// `ptr` must be NULL or a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn free_aligned_sized_hook(
    ptr: *mut c_void,
    align: usize,
    size: usize,
    ret: u64,
    sp: u64,
    bp: u64,
) {
    let regs = StartRegs::caller(ret, sp, bp);
    let stated = record::Stated {
        size: Some(size as u64),
        align: 0,
    };
    if calls::free_stating(AllocFn::FreeAlignedSized, ptr.cast(), stated, regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { next_alloc::free_aligned_sized(ptr.cast(), align, size) };
    }
}

// jemalloc's own interface. Programs that find jemalloc in the process
// (folly, when it is the allocator) allocate, grow and release most blocks
// with it; untrapped, their blocks were unknown to the agent, a `free` of one
// was taken for an invalid free and skipped, and every block released with
// `sdallocx` stayed listed as unfreed. Without jemalloc in the process (a
// program that looks for these through weak references finds the agent's)
// they are served by the standard functions (next_alloc.rs).

with_caller_regs!(mallocx => mallocx_hook, args: 2);
extern "C" fn mallocx_hook(size: usize, flags: i32, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    let p = next_alloc::mallocx(size, flags);
    let align = next_alloc::mallocx_align(flags);
    calls::alloc(AllocFn::Mallocx, p, size, align, regs);
    p.cast()
}

with_caller_regs!(rallocx => rallocx_hook, args: 3);
/// # Safety
/// `ptr` must be a block of the allocator (checked: bad pointers are reported).
unsafe extern "C" fn rallocx_hook(
    ptr: *mut c_void,
    size: usize,
    flags: i32,
    ret: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: `old` was validated against the live table by record::realloc.
    calls::realloc(AllocFn::Rallocx, ptr.cast(), size, regs, |old| unsafe {
        next_alloc::rallocx(old, size, flags)
    })
    .cast()
}

with_caller_regs!(xallocx => xallocx_hook, args: 4);
/// # Safety
/// `ptr` must be a block of the allocator (checked: bad pointers are reported).
unsafe extern "C" fn xallocx_hook(
    ptr: *mut c_void,
    size: usize,
    extra: usize,
    flags: i32,
    ret: u64,
    sp: u64,
    bp: u64,
) -> usize {
    let regs = StartRegs::caller(ret, sp, bp);
    // SAFETY: `old` was validated against the live table by record::resize_in_place.
    calls::resize_in_place(AllocFn::Xallocx, ptr.cast(), size, regs, |old| unsafe {
        next_alloc::xallocx(old, size, extra, flags)
    })
}

with_caller_regs!(sdallocx => sdallocx_hook, args: 3);
/// # Safety
/// `ptr` must be a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn sdallocx_hook(
    ptr: *mut c_void,
    size: usize,
    flags: i32,
    ret: u64,
    sp: u64,
    bp: u64,
) {
    let regs = StartRegs::caller(ret, sp, bp);
    if calls::free(AllocFn::Sdallocx, ptr.cast(), regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { next_alloc::sdallocx(ptr.cast(), size, flags) };
    }
}

with_caller_regs!(dallocx => dallocx_hook, args: 2);
/// # Safety
/// `ptr` must be a live block (checked: bad pointers are reported, not passed on).
unsafe extern "C" fn dallocx_hook(ptr: *mut c_void, flags: i32, ret: u64, sp: u64, bp: u64) {
    let regs = StartRegs::caller(ret, sp, bp);
    if calls::free(AllocFn::Dallocx, ptr.cast(), regs) {
        // SAFETY: the block is live (or the user asked to pass bad frees on).
        unsafe { next_alloc::dallocx(ptr.cast(), flags) };
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
    // The allocator checks the alignment (EINVAL) and reports ENOMEM.
    let (rc, p) = next_alloc::posix_memalign(align, size);
    if rc != 0 {
        record::failed(AllocFn::PosixMemalign, size as u64, align as u64, regs);
        return rc;
    }
    calls::alloc(AllocFn::PosixMemalign, p, size, align, regs);
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
    let p = next_alloc::aligned_alloc(align, size);
    calls::alloc(AllocFn::AlignedAlloc, p, size, align, regs);
    p.cast()
}

with_caller_regs!(memalign => memalign_hook, args: 2);
extern "C" fn memalign_hook(align: usize, size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    let p = next_alloc::memalign(align, size);
    calls::alloc(AllocFn::Memalign, p, size, align, regs);
    p.cast()
}

with_caller_regs!(valloc => valloc_hook, args: 1);
extern "C" fn valloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    let p = next_alloc::valloc(size);
    calls::alloc(AllocFn::Valloc, p, size, 4096, regs);
    p.cast()
}

with_caller_regs!(pvalloc => pvalloc_hook, args: 1);
extern "C" fn pvalloc_hook(size: usize, ret: u64, sp: u64, bp: u64) -> *mut c_void {
    let regs = StartRegs::caller(ret, sp, bp);
    let p = next_alloc::pvalloc(size);
    calls::alloc(
        AllocFn::Pvalloc,
        p,
        next_alloc::pvalloc_size(size),
        4096,
        regs,
    );
    p.cast()
}

/// Not recorded: passed to the allocator's own.
///
/// # Safety
/// As for the C library's malloc_usable_size.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    // SAFETY: passing the caller's pointer through unchanged.
    unsafe { next_alloc::usable_size(ptr.cast()) }
}

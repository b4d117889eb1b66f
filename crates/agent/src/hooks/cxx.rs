//! C++ `operator new` / `operator delete` in every standard variant, so the
//! allocation family of each block is known. The agent allocates through glibc
//! directly (not through libstdc++'s operator new, which would call malloc and
//! record the block twice) and reproduces the standard's failure behaviour:
//! call the new-handler and retry, or throw std::bad_alloc.

use super::replaced_operators;
use crate::events::next_alloc;
use crate::events::{calls, production, record};
use crate::platform::arch::{with_caller_regs, StartRegs};
use crate::platform::sys::*;
use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, Ordering};
use trapline_trace::AllocFn;

type NewHandler = Option<unsafe extern "C-unwind" fn()>;

/// Called when glibc is out of memory. Returns normally when a new-handler ran
/// (the caller retries); throws std::bad_alloc (through this frame, hence
/// C-unwind) or returns false for nothrow variants, after `failed` recorded
/// the call. A new-handler that throws ends the call too: `failed` runs as
/// its exception passes through this frame.
fn out_of_memory(nothrow: bool, failed: impl FnOnce()) -> bool {
    if let Some(handler) = new_handler() {
        let on_throw = RecordIfUnwinding(Some(failed));
        // SAFETY: the program's new-handler; may throw, which unwinds
        // through us (running `on_throw`'s drop on the way).
        unsafe { handler() };
        core::mem::forget(on_throw);
        return true;
    }
    failed();
    if nothrow {
        return false;
    }
    let throw = any_symbol(c"_ZSt17__throw_bad_allocv");
    if throw != 0 {
        // SAFETY: std::__throw_bad_alloc() never returns; it throws.
        let throw: unsafe extern "C-unwind" fn() -> ! = unsafe { core::mem::transmute(throw) };
        // SAFETY: as above.
        unsafe { throw() }
    }
    // SAFETY: no C++ runtime in the process to throw with: fail like an uncaught exception.
    unsafe { libc::abort() }
}

/// The program's new-handler (`std::get_new_handler()`), if it set one.
fn new_handler() -> NewHandler {
    let get = any_symbol(c"_ZSt15get_new_handlerv");
    if get == 0 {
        return None;
    }
    // SAFETY: std::get_new_handler() from the C++ runtime.
    let get: unsafe extern "C" fn() -> NewHandler = unsafe { core::mem::transmute(get) };
    // SAFETY: calling a function of the C++ runtime with no arguments.
    unsafe { get() }
}

/// Threads inside `delegate_nothrow`: while there are none, the operators
/// skip the look at their thread's `delegated_new` (one load per call).
static DELEGATING: AtomicU32 = AtomicU32::new(0);

/// A nothrow `operator new` whose allocation failed while the program has a
/// new-handler. The handler may throw, and then the nothrow operator must
/// catch the exception and return NULL, which Rust cannot do with a C++
/// exception. So the call goes to the C++ runtime's own nothrow operator,
/// which calls the throwing `operator new` (our hook: the handler loop and
/// its records run there) inside a `catch (...)`. The inner hook records
/// for the program's call (`delegated_new`): the nothrow function, and the
/// stack from the program's frame. `None`: no C++ runtime defines it.
#[cold]
fn delegate_nothrow(
    size: usize,
    align: usize,
    func: AllocFn,
    regs: StartRegs,
) -> Option<*mut c_void> {
    if !replaced_operators::runtime_has(func) {
        return None;
    }
    crate::events::thread::current().delegated_new = Some((func, regs));
    DELEGATING.fetch_add(1, Ordering::AcqRel);
    let p = replaced_operators::forward_new(func, size, align, true);
    DELEGATING.fetch_sub(1, Ordering::AcqRel);
    // Unused if the program's own `operator new` got the inner call.
    crate::events::thread::current().delegated_new = None;
    Some(p)
}

/// The function and call to record for: the program's nothrow call when
/// this is the inner call of `delegate_nothrow`.
#[cold]
fn delegated(func: AllocFn, regs: StartRegs) -> (AllocFn, StartRegs) {
    crate::events::thread::current_if_any()
        .and_then(|ts| ts.delegated_new.take())
        .unwrap_or((func, regs))
}

/// Records the failed call when dropped, which happens only while the
/// new-handler's exception unwinds through `out_of_memory` (a normal return
/// forgets it). The program's frames are still in place then (the C++
/// runtime cleans up frames innermost first), so the stack is the call's.
struct RecordIfUnwinding<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for RecordIfUnwinding<F> {
    fn drop(&mut self) {
        if let Some(failed) = self.0.take() {
            failed();
        }
    }
}

#[inline(always)]
fn new_impl(
    size: usize,
    align: usize,
    func: AllocFn,
    nothrow: bool,
    regs: crate::platform::arch::StartRegs,
) -> *mut c_void {
    if replaced_operators::forwards(func) {
        return replaced_operators::forward_new(func, size, align, nothrow);
    }
    // Production mode's unsampled call: decided before it, nothing after.
    if DELEGATING.load(Ordering::Relaxed) == 0 && production::passes_unsampled(func, size as u64) {
        let p = allocate(size, align);
        if !p.is_null() {
            production::forget_if_released_lately(p as u64);
            return p.cast();
        }
        return new_failed(size, align, func, nothrow);
    }
    new_recorded(size, align, func, nothrow, regs, false)
}

fn allocate(size: usize, align: usize) -> *mut u8 {
    if align == 0 {
        next_alloc::malloc(size)
    } else {
        next_alloc::memalign(align, size)
    }
}

/// The fast path's allocation failed: taken back, and the call goes on
/// as a recorded one whose first attempt failed, with the stack unwound
/// from here through the hook.
#[cold]
#[inline(never)]
fn new_failed(size: usize, align: usize, func: AllocFn, nothrow: bool) -> *mut c_void {
    production::unpass(func, size as u64);
    new_recorded(
        size,
        align,
        func,
        nothrow,
        crate::platform::arch::start_regs(),
        true,
    )
}

/// The operator as the C++ runtime has it: allocate, and on failure call
/// the new-handler and try again, or fail (`first_failed`: the first
/// attempt was made, and failed).
#[inline(never)]
fn new_recorded(
    size: usize,
    align: usize,
    func: AllocFn,
    nothrow: bool,
    regs: crate::platform::arch::StartRegs,
    first_failed: bool,
) -> *mut c_void {
    let (func, regs) = if DELEGATING.load(Ordering::Relaxed) == 0 {
        (func, regs)
    } else {
        delegated(func, regs)
    };
    let mut attempt_made = first_failed;
    loop {
        let p = if attempt_made {
            core::ptr::null_mut()
        } else {
            allocate(size, align)
        };
        attempt_made = false;
        if !p.is_null() {
            calls::alloc(func, p, size, align, regs);
            return p.cast();
        }
        if nothrow && new_handler().is_some() {
            if let Some(p) = delegate_nothrow(size, align, func, regs) {
                return p;
            }
        }
        let failed = || record::failed(func, size as u64, align as u64, regs);
        if !out_of_memory(nothrow, failed) {
            return core::ptr::null_mut();
        }
    }
}

/// `stated`: what the operator's arguments say about the block (size,
/// alignment), checked against it.
#[inline(always)]
fn delete_impl(
    ptr: *mut c_void,
    func: AllocFn,
    stated: record::Stated,
    regs: crate::platform::arch::StartRegs,
) {
    if replaced_operators::forwards(func) {
        let size = stated.size.map(|s| s as usize);
        replaced_operators::forward_delete(func, ptr, size, stated.align as usize);
        return;
    }
    if production::release_passes(func, ptr as u64) {
        // SAFETY: a block the program holds, as far as the agent knows.
        return unsafe { next_alloc::free(ptr.cast()) };
    }
    delete_recorded(ptr, func, stated, regs);
}

#[inline(never)]
fn delete_recorded(
    ptr: *mut c_void,
    func: AllocFn,
    stated: record::Stated,
    regs: crate::platform::arch::StartRegs,
) {
    if calls::free_stating(func, ptr.cast(), stated, regs) {
        // SAFETY: live block (or bad frees passed on by request).
        unsafe { next_alloc::free(ptr.cast()) };
    }
}

// Each operator is a trampoline (arch::with_caller_regs) into `hook` in the
// module of the same name, which gets the caller's frame as its last three
// arguments. A throwing `hook` unwinds straight into the program: the
// trampoline jumped, it left no frame.
macro_rules! new_fn {
    ($name:ident, $func:expr, nothrow = $nt:expr, aligned = false, extra = ($($arg:ident: $ty:ty),*), args: $n:tt) => {
        with_caller_regs!($name => $name::hook, args: $n);
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            pub(super) extern "C-unwind" fn hook(size: usize $(, $arg: $ty)*, ret: u64, sp: u64, bp: u64) -> *mut c_void {
                $(let _ = $arg;)*
                new_impl(size, 0, $func, $nt, StartRegs::caller(ret, sp, bp))
            }
        }
    };
    ($name:ident, $func:expr, nothrow = $nt:expr, aligned = true, extra = ($($arg:ident: $ty:ty),*), args: $n:tt) => {
        with_caller_regs!($name => $name::hook, args: $n);
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            pub(super) extern "C-unwind" fn hook(size: usize, align: usize $(, $arg: $ty)*, ret: u64, sp: u64, bp: u64) -> *mut c_void {
                $(let _ = $arg;)*
                new_impl(size, align, $func, $nt, StartRegs::caller(ret, sp, bp))
            }
        }
    };
}

macro_rules! delete_fn {
    ($name:ident, $func:expr, ($($arg:ident: $ty:ty),*), args: $n:tt, stated = ($size:expr, $align:expr)) => {
        with_caller_regs!($name => $name::hook, args: $n);
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            /// # Safety
            /// `ptr` must be NULL or from the matching operator new (checked and reported).
            pub(super) unsafe extern "C" fn hook(ptr: *mut c_void $(, $arg: $ty)*, ret: u64, sp: u64, bp: u64) {
                $(let _ = $arg;)*
                let stated = record::Stated { size: $size, align: $align };
                delete_impl(ptr, $func, stated, StartRegs::caller(ret, sp, bp))
            }
        }
    };
}

type NoThrow = *const c_void;

new_fn!(
    _Znwm,
    AllocFn::New,
    nothrow = false,
    aligned = false,
    extra = ()
, args: 1);
new_fn!(_ZnwmRKSt9nothrow_t, AllocFn::NewNothrow, nothrow = true, aligned = false, extra = (_nt: NoThrow), args: 2);
new_fn!(
    _ZnwmSt11align_val_t,
    AllocFn::NewAligned,
    nothrow = false,
    aligned = true,
    extra = ()
, args: 2);
new_fn!(_ZnwmSt11align_val_tRKSt9nothrow_t, AllocFn::NewAlignedNothrow, nothrow = true, aligned = true, extra = (_nt: NoThrow), args: 3);
new_fn!(
    _Znam,
    AllocFn::NewArray,
    nothrow = false,
    aligned = false,
    extra = ()
, args: 1);
new_fn!(_ZnamRKSt9nothrow_t, AllocFn::NewArrayNothrow, nothrow = true, aligned = false, extra = (_nt: NoThrow), args: 2);
new_fn!(
    _ZnamSt11align_val_t,
    AllocFn::NewArrayAligned,
    nothrow = false,
    aligned = true,
    extra = ()
, args: 2);
new_fn!(_ZnamSt11align_val_tRKSt9nothrow_t, AllocFn::NewArrayAlignedNothrow, nothrow = true, aligned = true, extra = (_nt: NoThrow), args: 3);

delete_fn!(_ZdlPv, AllocFn::Delete, (), args: 1, stated = (None, 0));
delete_fn!(_ZdlPvm, AllocFn::DeleteSized, (size: usize), args: 2, stated = (Some(size as u64), 0));
delete_fn!(_ZdlPvSt11align_val_t, AllocFn::DeleteAligned, (align: usize), args: 2, stated = (None, align as u64));
delete_fn!(_ZdlPvmSt11align_val_t, AllocFn::DeleteSizedAligned, (size: usize, align: usize), args: 3, stated = (Some(size as u64), align as u64));
delete_fn!(_ZdlPvRKSt9nothrow_t, AllocFn::DeleteNothrow, (_nt: NoThrow), args: 2, stated = (None, 0));
delete_fn!(_ZdlPvSt11align_val_tRKSt9nothrow_t, AllocFn::DeleteAlignedNothrow, (align: usize, _nt: NoThrow), args: 3, stated = (None, align as u64));
delete_fn!(_ZdaPv, AllocFn::DeleteArray, (), args: 1, stated = (None, 0));
delete_fn!(_ZdaPvm, AllocFn::DeleteArraySized, (size: usize), args: 2, stated = (Some(size as u64), 0));
delete_fn!(_ZdaPvSt11align_val_t, AllocFn::DeleteArrayAligned, (align: usize), args: 2, stated = (None, align as u64));
delete_fn!(_ZdaPvmSt11align_val_t, AllocFn::DeleteArraySizedAligned, (size: usize, align: usize), args: 3, stated = (Some(size as u64), align as u64));
delete_fn!(_ZdaPvRKSt9nothrow_t, AllocFn::DeleteArrayNothrow, (_nt: NoThrow), args: 2, stated = (None, 0));
delete_fn!(_ZdaPvSt11align_val_tRKSt9nothrow_t, AllocFn::DeleteArrayAlignedNothrow, (align: usize, _nt: NoThrow), args: 3, stated = (None, align as u64));

//! Operators a program replaced: the other forms follow them.
//!
//! C++ lets a program replace any of the global `operator new` and `operator
//! delete` forms, and the C++ runtime's default of each of the others calls
//! another (`new[]` calls `new`, the nothrow forms call the throwing ones
//! inside a `catch`, sized and array `delete` call plain `delete`, ...). A
//! program that replaces `new` and `delete` with an arena of its own gets
//! every `new[]` and sized `delete` through them too. The agent defines all
//! the forms, and its own went straight to the C library: the arena's
//! `delete` was never called for a sized `delete`, whose block the agent
//! then called an invalid free and kept.
//!
//! So before an agent operator does anything, it looks (one load) whether
//! the operator its default would call, directly or down the chain, is
//! defined by someone found before the agent (the executable); if so it
//! hands the call to the C++ runtime's own form (`dlsym(RTLD_NEXT)`), which
//! calls the next form through the lookup: the program's replacement, or
//! another agent operator that forwards in turn. The blocks are then
//! recorded where the program's operators call `malloc` and `free`, as for
//! a program whose operators the agent never sees.

use crate::platform::sys::{any_symbol, next_symbol};
use core::ffi::{c_void, CStr};
use core::sync::atomic::{AtomicU32, Ordering};
use trapline_trace::AllocFn;

/// Every form (in `index_of`'s order): its mangled name, and the form its
/// default calls (an index in this table).
const FORMS: [(&CStr, Option<usize>); 20] = [
    (c"_Znwm", None),
    (c"_ZnwmRKSt9nothrow_t", Some(0)),
    (c"_ZnwmSt11align_val_t", None),
    (c"_ZnwmSt11align_val_tRKSt9nothrow_t", Some(2)),
    (c"_Znam", Some(0)),
    (c"_ZnamRKSt9nothrow_t", Some(4)),
    (c"_ZnamSt11align_val_t", Some(2)),
    (c"_ZnamSt11align_val_tRKSt9nothrow_t", Some(6)),
    (c"_ZdlPv", None),
    (c"_ZdlPvm", Some(8)),
    (c"_ZdlPvSt11align_val_t", None),
    (c"_ZdlPvmSt11align_val_t", Some(10)),
    (c"_ZdlPvRKSt9nothrow_t", Some(8)),
    (c"_ZdlPvSt11align_val_tRKSt9nothrow_t", Some(10)),
    (c"_ZdaPv", Some(8)),
    (c"_ZdaPvm", Some(14)),
    (c"_ZdaPvSt11align_val_t", Some(10)),
    (c"_ZdaPvmSt11align_val_t", Some(16)),
    (c"_ZdaPvRKSt9nothrow_t", Some(14)),
    (c"_ZdaPvSt11align_val_tRKSt9nothrow_t", Some(16)),
];

/// Bit i: form i forwards. `KNOWN` once worked out (on the first operator
/// call: only C++ programs pay for the lookups).
static FORWARDS: AtomicU32 = AtomicU32::new(0);
const KNOWN: u32 = 1 << 31;

/// `func`'s row of `FORMS` (a match, so that it folds where `func` is a
/// constant).
#[inline(always)]
const fn index_of(func: AllocFn) -> usize {
    match func {
        AllocFn::NewNothrow => 1,
        AllocFn::NewAligned => 2,
        AllocFn::NewAlignedNothrow => 3,
        AllocFn::NewArray => 4,
        AllocFn::NewArrayNothrow => 5,
        AllocFn::NewArrayAligned => 6,
        AllocFn::NewArrayAlignedNothrow => 7,
        AllocFn::Delete => 8,
        AllocFn::DeleteSized => 9,
        AllocFn::DeleteAligned => 10,
        AllocFn::DeleteSizedAligned => 11,
        AllocFn::DeleteNothrow => 12,
        AllocFn::DeleteAlignedNothrow => 13,
        AllocFn::DeleteArray => 14,
        AllocFn::DeleteArraySized => 15,
        AllocFn::DeleteArrayAligned => 16,
        AllocFn::DeleteArraySizedAligned => 17,
        AllocFn::DeleteArrayNothrow => 18,
        AllocFn::DeleteArrayAlignedNothrow => 19,
        _ => 0,
    }
}

/// Whether the agent's operator `func` must hand its call on (`forward_new`,
/// `forward_delete`). Inlined into the operators: for a form whose default
/// calls no other it is `false` at compile time, else one load.
#[inline(always)]
pub fn forwards(func: AllocFn) -> bool {
    let i = index_of(func);
    if FORMS[i].1.is_none() {
        return false;
    }
    let mut bits = FORWARDS.load(Ordering::Relaxed);
    if bits & KNOWN == 0 {
        bits = work_out();
    }
    bits & (1 << i) != 0
}

#[cold]
fn work_out() -> u32 {
    // A lookup that fails makes dlsym allocate its message: as the agent's
    // nested calls, not the program's.
    let ts = crate::events::thread::current_without_allocating();
    ts.guard += 1;
    let own = crate::events::next_alloc::module_of(work_out as *const () as usize).map(|m| m.0);
    let mut replaced = 0u32;
    for (i, form) in FORMS.iter().enumerate() {
        let found = any_symbol(form.0);
        if found != 0 && crate::events::next_alloc::module_of(found).map(|m| m.0) != own {
            replaced |= 1 << i;
        }
    }
    ts.guard -= 1;
    let mut bits = KNOWN;
    for (i, form) in FORMS.iter().enumerate() {
        let mut next = form.1;
        while let Some(n) = next {
            // Only where the C++ runtime has the form to hand the call to.
            if replaced & (1 << n) != 0 && next_symbol(form.0) != 0 {
                bits |= 1 << i;
                break;
            }
            next = FORMS[n].1;
        }
    }
    FORWARDS.store(bits, Ordering::Relaxed);
    bits
}

/// The C++ runtime's own form of `func`.
fn runtime_form(func: AllocFn) -> usize {
    next_symbol(FORMS[index_of(func)].0)
}

/// Whether the C++ runtime defines its own form of `func` (for `forward_new`).
pub fn runtime_has(func: AllocFn) -> bool {
    runtime_form(func) != 0
}

/// `std::nothrow` is an empty tag: any address stands for it.
static NOTHROW: u8 = 0;

/// The arguments after the first, in the form's order: the alignment if it
/// has one, then the nothrow tag if it has one (deletes: the size first).
fn rest(size: Option<usize>, align: usize, nothrow: bool) -> [usize; 3] {
    let mut args = [0; 3];
    let mut n = 0;
    for (has, value) in [
        (size.is_some(), size.unwrap_or(0)),
        (align != 0, align),
        (nothrow, &NOTHROW as *const u8 as usize),
    ] {
        if has {
            args[n] = value;
            n += 1;
        }
    }
    args
}

/// Calls the C++ runtime's `func` (an `operator new` form) for `size`; it may
/// throw (hence C-unwind) when its chain ends in a throwing replacement.
/// Also how a nothrow form hands a failure to the runtime (`hooks/cxx.rs`).
#[cold]
pub fn forward_new(func: AllocFn, size: usize, align: usize, nothrow: bool) -> *mut c_void {
    let real = runtime_form(func);
    if real == 0 {
        // `work_out` checked that the runtime has the form.
        return core::ptr::null_mut();
    }
    let [a, b, _] = rest(None, align, nothrow);
    // SAFETY: one of the runtime's `operator new` forms; extra integer
    // arguments in registers are ignored by a callee that takes fewer.
    let real: unsafe extern "C-unwind" fn(usize, usize, usize) -> *mut c_void =
        unsafe { core::mem::transmute(real) };
    // SAFETY: as above.
    unsafe { real(size, a, b) }
}

/// Calls the C++ runtime's `func` (an `operator delete` form) for `ptr`.
#[cold]
pub fn forward_delete(func: AllocFn, ptr: *mut c_void, size: Option<usize>, align: usize) {
    let real = runtime_form(func);
    if real == 0 {
        return;
    }
    let nothrow = matches!(
        func,
        AllocFn::DeleteNothrow
            | AllocFn::DeleteAlignedNothrow
            | AllocFn::DeleteArrayNothrow
            | AllocFn::DeleteArrayAlignedNothrow
    );
    let [a, b, c] = rest(size, align, nothrow);
    // SAFETY: one of the runtime's `operator delete` forms (noexcept), with
    // its arguments in order; extra register arguments are ignored.
    let real: unsafe extern "C" fn(*mut c_void, usize, usize, usize) =
        unsafe { core::mem::transmute(real) };
    // SAFETY: as above; `ptr` is the program's, passed on unchanged.
    unsafe { real(ptr, a, b, c) }
}

//! The allocator entry points a recorder outside the program traps, by
//! symbol.

use trapline_trace::AllocFn;

/// How a trapped function is stopped at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trap {
    /// An allocating function: at its call (to know it is not nested in
    /// another) and at its return (its result).
    Allocation(AllocFn),
    /// `free`: at its call, before the block can be reused.
    Release(AllocFn),
    /// A C++ `operator delete`: at its call, as `free`, and at its return
    /// (the `free` it calls is nested in it).
    Delete(AllocFn),
    /// `exit`: at its call, while the process is whole (the exit scan).
    Exit,
}

/// The functions trapped, by symbol, in order of preference where two
/// names are one function (glibc's `aligned_alloc` is its `memalign`: the
/// standard name is reported).
pub const TRAPPED: &[(&str, Trap)] = &[
    ("malloc", Trap::Allocation(AllocFn::Malloc)),
    ("calloc", Trap::Allocation(AllocFn::Calloc)),
    ("realloc", Trap::Allocation(AllocFn::Realloc)),
    ("reallocarray", Trap::Allocation(AllocFn::ReallocArray)),
    ("posix_memalign", Trap::Allocation(AllocFn::PosixMemalign)),
    ("aligned_alloc", Trap::Allocation(AllocFn::AlignedAlloc)),
    ("memalign", Trap::Allocation(AllocFn::Memalign)),
    ("valloc", Trap::Allocation(AllocFn::Valloc)),
    ("pvalloc", Trap::Allocation(AllocFn::Pvalloc)),
    ("free", Trap::Release(AllocFn::Free)),
    ("_Znwm", Trap::Allocation(AllocFn::New)),
    ("_ZnwmRKSt9nothrow_t", Trap::Allocation(AllocFn::NewNothrow)),
    (
        "_ZnwmSt11align_val_t",
        Trap::Allocation(AllocFn::NewAligned),
    ),
    (
        "_ZnwmSt11align_val_tRKSt9nothrow_t",
        Trap::Allocation(AllocFn::NewAlignedNothrow),
    ),
    ("_Znam", Trap::Allocation(AllocFn::NewArray)),
    (
        "_ZnamRKSt9nothrow_t",
        Trap::Allocation(AllocFn::NewArrayNothrow),
    ),
    (
        "_ZnamSt11align_val_t",
        Trap::Allocation(AllocFn::NewArrayAligned),
    ),
    (
        "_ZnamSt11align_val_tRKSt9nothrow_t",
        Trap::Allocation(AllocFn::NewArrayAlignedNothrow),
    ),
    ("_ZdlPv", Trap::Delete(AllocFn::Delete)),
    ("_ZdlPvm", Trap::Delete(AllocFn::DeleteSized)),
    (
        "_ZdlPvSt11align_val_t",
        Trap::Delete(AllocFn::DeleteAligned),
    ),
    (
        "_ZdlPvmSt11align_val_t",
        Trap::Delete(AllocFn::DeleteSizedAligned),
    ),
    ("_ZdlPvRKSt9nothrow_t", Trap::Delete(AllocFn::DeleteNothrow)),
    (
        "_ZdlPvSt11align_val_tRKSt9nothrow_t",
        Trap::Delete(AllocFn::DeleteAlignedNothrow),
    ),
    ("_ZdaPv", Trap::Delete(AllocFn::DeleteArray)),
    ("_ZdaPvm", Trap::Delete(AllocFn::DeleteArraySized)),
    (
        "_ZdaPvSt11align_val_t",
        Trap::Delete(AllocFn::DeleteArrayAligned),
    ),
    (
        "_ZdaPvmSt11align_val_t",
        Trap::Delete(AllocFn::DeleteArraySizedAligned),
    ),
    (
        "_ZdaPvRKSt9nothrow_t",
        Trap::Delete(AllocFn::DeleteArrayNothrow),
    ),
    (
        "_ZdaPvSt11align_val_tRKSt9nothrow_t",
        Trap::Delete(AllocFn::DeleteArrayAlignedNothrow),
    ),
    ("exit", Trap::Exit),
];

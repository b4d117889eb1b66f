//! The allocation hooks' way into the recorders: a full or sampled
//! recording (`record.rs`), or production mode (`production.rs`, which
//! implies memory is recorded: `config.rs`).

use crate::events::{production, record};
use crate::platform::arch::StartRegs;
use trapline_trace::AllocFn;

/// An allocation by `func` that returned `addr` for `size` bytes.
#[inline(always)]
pub fn alloc(func: AllocFn, addr: *mut u8, size: usize, align: usize, regs: StartRegs) {
    if crate::config::production() && !addr.is_null() {
        production::alloc(func, addr as u64, size as u64, align as u64, regs);
    } else {
        record::alloc(func, addr, size, align, regs);
    }
}

/// A release of `addr`; returns whether to pass it to the allocator.
#[inline(always)]
pub fn free(func: AllocFn, addr: *mut u8, regs: StartRegs) -> bool {
    free_stating(
        func,
        addr,
        record::Stated {
            size: None,
            align: 0,
        },
        regs,
    )
}

/// `free` for a release that states the block's size or alignment.
#[inline(always)]
pub fn free_stating(func: AllocFn, addr: *mut u8, stated: record::Stated, regs: StartRegs) -> bool {
    if crate::config::production() && !addr.is_null() {
        production::free(func, addr as u64, stated, regs)
    } else {
        record::free_stating(func, addr, stated, regs)
    }
}

/// realloc and its kin: `real` resizes.
#[inline(always)]
pub fn realloc(
    func: AllocFn,
    old: *mut u8,
    size: usize,
    regs: StartRegs,
    real: impl FnOnce(*mut u8) -> *mut u8,
) -> *mut u8 {
    if crate::config::production() {
        production::realloc(func, old, size, regs, real)
    } else {
        record::realloc(func, old, size, regs, real)
    }
}

/// jemalloc's `xallocx`: `real` resizes in place.
#[inline(always)]
pub fn resize_in_place(
    func: AllocFn,
    ptr: *mut u8,
    size: usize,
    regs: StartRegs,
    real: impl FnOnce(*mut u8) -> usize,
) -> usize {
    if crate::config::production() {
        production::resize_in_place(func, size, || real(ptr))
    } else {
        record::resize_in_place(func, ptr, size, regs, real)
    }
}

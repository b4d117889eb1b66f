//! The scan's buffers (huge pages, fallible) and the live table's packed
//! blocks as the shared index sees them (`trapline_reach::blocks`, which
//! sorts them and turns a word into the block it points into).

use crate::tracking::live::Packed;
pub use trapline_reach::BlockIndex;

/// Asks for transparent huge pages behind a large buffer of the scan (its
/// capacity, allocated but not yet touched): ten million blocks make
/// buffers of 80 to 160 MB, whose 4 KiB page faults and TLB misses (the
/// radix sort scatters across them) would otherwise dominate the pause.
pub fn want_huge_pages<T>(v: &Vec<T>) {
    const HUGE: usize = 2 << 20;
    let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
    let end = (v.as_ptr() as usize + v.capacity() * core::mem::size_of::<T>()) & !(HUGE - 1);
    if end > start {
        // SAFETY: advice on memory this vector owns; it changes no content.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// Room for `n` elements, or `None` when the agent heap cannot have it: the
/// scan's large buffers are taken fallibly, so that memory refused after
/// the scan checked its room (another thread grew meanwhile) skips the scan
/// instead of aborting the program in Rust's allocation-failure handler.
pub fn try_with_capacity<T>(n: usize) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    want_huge_pages(&v);
    Some(v)
}

/// `n` copies of `value`, in memory backed by huge pages where possible.
pub fn try_huge_vec<T: Copy>(n: usize, value: T) -> Option<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    v.resize(n, value);
    Some(v)
}

/// `n` zeroed elements from fresh zeroed memory, untouched until written
/// (as `vec![0; n]`, but fallible).
pub fn try_zeroed_vec<T: Copy + Default>(n: usize) -> Option<Vec<T>> {
    if n == 0 || core::mem::size_of::<T>() == 0 {
        return Some(vec![T::default(); n]);
    }
    let layout = core::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: a non-zero-sized layout; the global allocator's zeroed
    // memory, handed to a Vec with that same layout (capacity n).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return None;
        }
        let v = Vec::from_raw_parts(p, n, n);
        want_huge_pages(&v);
        Some(v)
    }
}

/// The agent's buffers: its own heap, huge pages where possible.
pub struct HugeBuffers;

impl trapline_reach::Buffers for HugeBuffers {
    fn with_capacity<T>(&self, n: usize) -> Option<Vec<T>> {
        try_with_capacity(n)
    }
    fn filled<T: Copy>(&self, n: usize, value: T) -> Option<Vec<T>> {
        try_huge_vec(n, value)
    }
    fn zeroed<T: Copy + Default>(&self, n: usize) -> Option<Vec<T>> {
        try_zeroed_vec(n)
    }
}

impl trapline_reach::Span for Packed {
    const EMPTY: Packed = Packed::EMPTY;
    fn addr(&self) -> u64 {
        Packed::addr(self)
    }
    fn size(&self) -> u64 {
        Packed::size(self)
    }
}

//! A function a higher layer registers and a lower one calls: the way the
//! agent's layers reach up without importing what is above them (runtime
//! registers each at start).

use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Function pointer types a [`Callback`] may hold.
///
/// # Safety
/// Implemented only for function pointers: plain, `usize`-sized, never 0.
pub unsafe trait FnPointer: Copy {}
// SAFETY: function pointers.
unsafe impl FnPointer for fn() {}
unsafe impl FnPointer for fn() -> Result<usize, String> {}
// SAFETY: function pointers.
unsafe impl<T> FnPointer for fn(&mut T) {}
// SAFETY: function pointers.
unsafe impl<A, B, C> FnPointer for extern "C" fn(A, B, C) {}

/// One registered function, or none yet.
pub struct Callback<F: FnPointer> {
    slot: AtomicUsize,
    _f: PhantomData<F>,
}

impl<F: FnPointer> Callback<F> {
    pub const fn new() -> Self {
        Callback {
            slot: AtomicUsize::new(0),
            _f: PhantomData,
        }
    }

    /// Registers `f` (the last registration stands).
    pub fn set(&self, f: F) {
        const { assert!(size_of::<F>() == size_of::<usize>()) };
        // SAFETY: `F` is a usize-sized function pointer (`FnPointer`).
        let v = unsafe { core::mem::transmute_copy::<F, usize>(&f) };
        self.slot.store(v, Ordering::Release);
    }

    /// The registered function, if any.
    #[inline]
    pub fn get(&self) -> Option<F> {
        match self.slot.load(Ordering::Acquire) {
            0 => None,
            // SAFETY: only `set` stores here, an `F`.
            v => Some(unsafe { core::mem::transmute_copy::<usize, F>(&v) }),
        }
    }
}

impl<F: FnPointer> Default for Callback<F> {
    fn default() -> Self {
        Self::new()
    }
}

//! A second stack for each thread, for the agent's rare deep work.
//!
//! The agent runs on the program's stacks: a thread created with a 16 KiB
//! stack, a signal handler on a small alternate stack. Its common path
//! (a hook, a capture, an event) needs about 3 KiB of it. Some rare work
//! needs far more, mostly for values that live on the stack so that nothing
//! allocates: evaluating CFI on a rule-table miss (gimli's rows of register
//! rules), framehop's unwinding of a frame outside the table (its CFI
//! evaluation keeps rows of 192 rules) and the creation of its rule cache
//! (25 KiB built before it is boxed), and the end of the process (the
//! reachability scan, the last flush: about 60 KiB). That work runs here:
//! 256 KiB mapped for each thread when its state is created (pages never
//! touched cost nothing), with a guard page below. The mapping is the agent
//! heap's, so the reachability scan never reads its stale frames as roots.
//!
//! `run` switches only from the program's stack: when it is called again
//! while the side stack is in use (a fatal signal's handler interrupting that
//! work ends the trace from there), it runs on the stack it is on.
//!
//! A thread without an alternate signal stack of its own gets the side stack
//! as one (`install_as_altstack`), so that the agent's fatal-signal handler
//! can finish the trace after a stack overflow.

use crate::platform::arch;
use core::cell::Cell;
use core::sync::atomic::{compiler_fence, Ordering};

const SIZE: usize = 256 << 10;
const GUARD: usize = 4096;

pub struct SideStack {
    /// Lowest address of the mapping (its guard page); null if none.
    base: *mut u8,
    in_use: Cell<bool>,
    /// The caller's stack pointer while `run` is on the side stack (read by
    /// this thread's signal handlers: where its own stack's live part starts).
    outer_sp: Cell<u64>,
}

impl SideStack {
    /// Maps a side stack (without one, `run` runs in place).
    pub fn new() -> SideStack {
        // Two mappings (the stack and its guard page) the program would
        // need once it is at its limit: none then.
        let mut base = if crate::platform::heap::at_mapping_limit() {
            core::ptr::null_mut()
        } else {
            crate::platform::heap::map_own(SIZE + GUARD)
        };
        // SAFETY: the first page of our own fresh mapping.
        if !base.is_null() && unsafe { libc::mprotect(base.cast(), GUARD, libc::PROT_NONE) } != 0 {
            // No guard page (the split needs a mapping more, and the process
            // has none left): no side stack rather than one without a guard.
            crate::platform::heap::unmap(base, SIZE + GUARD);
            base = core::ptr::null_mut();
        }
        if base.is_null() {
            crate::platform::heap::note_mapping_refused();
        }
        SideStack {
            base,
            in_use: Cell::new(false),
            outer_sp: Cell::new(0),
        }
    }

    /// Whether there is a side stack (none when its mapping was refused).
    pub fn exists(&self) -> bool {
        !self.base.is_null()
    }

    /// Whether `sp` lies in the side stack's mapping.
    fn contains(&self, sp: u64) -> bool {
        let base = self.base as u64;
        !self.base.is_null() && sp >= base && sp < base + (SIZE + GUARD) as u64
    }

    /// Makes the side stack the thread's alternate signal stack, for a
    /// thread that has none: the agent's fatal-signal handler then runs even
    /// when the thread's own stack overflowed (the kernel cannot push a
    /// signal frame on a full stack). `run` called from a handler there runs
    /// in place. The program's `sigaltstack` calls still see none
    /// (hooks/signals.rs). Returns whether it was installed.
    pub fn install_as_altstack(&self) -> bool {
        if self.base.is_null() {
            return false;
        }
        let ss = libc::stack_t {
            // SAFETY: inside our mapping, above its guard page.
            ss_sp: unsafe { self.base.add(GUARD) }.cast(),
            ss_flags: 0,
            ss_size: SIZE,
        };
        // SAFETY: a valid stack_t describing memory we own for the thread's life.
        unsafe { crate::platform::sys::sigaltstack(&ss, core::ptr::null_mut()) == 0 }
    }

    /// The range the alternate signal stack covers once installed.
    pub fn altstack_range(&self) -> (u64, u64) {
        let lo = self.base as u64 + GUARD as u64;
        (lo, lo + SIZE as u64)
    }

    /// Runs `f` on the side stack (in place if there is none, or if this
    /// thread is on it already: in use, or a signal handler's stack).
    #[inline]
    pub fn run<F: FnOnce() -> R, R>(&self, f: F) -> R {
        let sp = arch::stack_pointer();
        if self.base.is_null() || self.in_use.get() || self.contains(sp) {
            return f();
        }
        self.outer_sp.set(sp);
        self.in_use.set(true);
        // A signal handler on this thread sees `in_use` before the switch.
        compiler_fence(Ordering::SeqCst);
        let mut state = Running::<F, R> {
            f: Some(f),
            result: None,
        };
        // SAFETY: the side stack is ours and not in use (in_use was false and
        // only this thread and its handlers use it); its top is 16-aligned
        // (the mapping is page-aligned); `enter` gets the state it expects.
        unsafe {
            arch::call_on_stack(
                (&mut state as *mut Running<F, R>).cast(),
                enter::<F, R>,
                self.base.add(SIZE + GUARD),
            )
        };
        compiler_fence(Ordering::SeqCst);
        self.in_use.set(false);
        self.outer_sp.set(0);
        match state.result {
            Some(r) => r,
            None => unreachable!("side stack call returned without a result"),
        }
    }

    /// Where this thread's own stack is live from, given the stack pointer
    /// `sp` a signal handler found: the caller's stack pointer when `sp` is
    /// on the side stack.
    pub fn thread_sp(&self, sp: u64) -> u64 {
        let outer = self.outer_sp.get();
        if outer != 0 && self.contains(sp) {
            outer
        } else {
            sp
        }
    }
}

impl Drop for SideStack {
    fn drop(&mut self) {
        if !self.base.is_null() {
            crate::platform::heap::unmap(self.base, SIZE + GUARD);
        }
    }
}

struct Running<F, R> {
    f: Option<F>,
    result: Option<R>,
}

/// The first function on the side stack: runs the closure of `run`.
unsafe extern "C" fn enter<F: FnOnce() -> R, R>(state: *mut u8) {
    // SAFETY: `run` passes its `Running`, alive until `call_on_stack` returns.
    let state = unsafe { &mut *state.cast::<Running<F, R>>() };
    if let Some(f) = state.f.take() {
        state.result = Some(f());
    }
}

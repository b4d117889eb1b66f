//! The agent's locks: a futex lock that can be held across fork and a
//! spinlock for very short critical sections. Both let the exit's held
//! threads go before they wait (`hold`): the holder may be one of them.

use core::sync::atomic::{AtomicU32, Ordering};

/// Takes a 0/1 lock word within about `spins` rounds, yielding the CPU now and then.
fn try_acquire(state: &AtomicU32, spins: u32) -> bool {
    for i in 0..spins {
        if state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
        if i % 64 == 63 {
            // The holder may be a thread the exit keeps stopped.
            crate::platform::hold::let_go_if_held();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            core::hint::spin_loop();
        }
    }
    false
}

/// A small lock: spin briefly, then sleep on a futex. Unlike `std::sync::Mutex`
/// it can be locked in a `pthread_atfork` prepare handler and released in the
/// parent and child handlers, which keeps every agent table consistent across fork.
pub struct RawLock {
    state: AtomicU32, // 0 free, 1 locked, 2 locked with sleepers
}

impl RawLock {
    pub const fn new() -> Self {
        RawLock {
            state: AtomicU32::new(0),
        }
    }

    #[inline]
    pub fn lock(&self) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
    }

    #[cold]
    fn lock_slow(&self) {
        for _ in 0..100 {
            core::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == 0
                && self
                    .state
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
        // The holder may be a thread the exit keeps stopped.
        crate::platform::hold::let_go_if_held();
        while self.state.swap(2, Ordering::Acquire) != 0 {
            crate::platform::futex::futex_wait(&self.state, 2, None);
        }
    }

    /// Tries for about `spins` rounds; used on paths (fatal signals) where the
    /// holder may be the interrupted thread itself.
    pub fn try_lock_for(&self, spins: u32) -> bool {
        try_acquire(&self.state, spins)
    }

    #[inline]
    pub fn unlock(&self) {
        if self.state.swap(0, Ordering::Release) == 2 {
            crate::platform::futex::futex_wake(&self.state, 1);
        }
    }

    /// Forces the lock free; only for the single-threaded child after fork.
    pub fn reset(&self) {
        self.state.store(0, Ordering::Relaxed);
    }

    pub fn guard(&self) -> LockGuard<'_> {
        self.lock();
        LockGuard(self)
    }
}

pub struct LockGuard<'a>(&'a RawLock);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

/// A spinlock for very short critical sections (the live table's shards):
/// one atomic compare-exchange to lock, a plain release store to unlock.
/// Waiters spin briefly, then yield the CPU.
pub struct SpinLock {
    state: AtomicU32,
}

impl SpinLock {
    pub const fn new() -> Self {
        SpinLock {
            state: AtomicU32::new(0),
        }
    }

    #[inline]
    pub fn lock(&self) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            if self.state.load(Ordering::Relaxed) == 0
                && self
                    .state
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            spins += 1;
            if spins < 64 {
                core::hint::spin_loop();
            } else {
                // The holder may be a thread the exit keeps stopped.
                crate::platform::hold::let_go_if_held();
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    pub fn try_lock_for(&self, spins: u32) -> bool {
        try_acquire(&self.state, spins)
    }

    #[inline]
    pub fn unlock(&self) {
        self.state.store(0, Ordering::Release);
    }

    pub fn reset(&self) {
        self.state.store(0, Ordering::Relaxed);
    }

    /// Whether some thread holds the lock now.
    pub fn is_locked(&self) -> bool {
        self.state.load(Ordering::Acquire) != 0
    }
}

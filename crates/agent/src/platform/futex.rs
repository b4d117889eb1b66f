//! Futex waits and wakes, and an event word built on them.

use core::sync::atomic::{AtomicU32, Ordering};

pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts;
    let tsp = match timeout_ns {
        Some(ns) => {
            ts = libc::timespec {
                tv_sec: (ns / 1_000_000_000) as i64,
                tv_nsec: (ns % 1_000_000_000) as i64,
            };
            &ts as *const libc::timespec
        }
        None => core::ptr::null(),
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which lives as long as the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        );
    }
}

pub fn futex_wake(word: &AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            count,
        );
    }
}

/// Sleeps about `ns` nanoseconds (less if a signal interrupts).
pub fn sleep_ns(ns: u64) {
    let word = AtomicU32::new(0);
    futex_wait(&word, 0, Some(ns));
}

/// A futex word used as an event: waiters sleep until the value changes.
pub struct Event {
    word: AtomicU32,
}

impl Event {
    pub const fn new() -> Self {
        Event {
            word: AtomicU32::new(0),
        }
    }
    /// The current generation, to pass to [`Event::wait`].
    pub fn generation(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }
    /// Sleeps while the generation is still `seen`, at most `timeout_ns`.
    pub fn wait(&self, seen: u32, timeout_ns: Option<u64>) {
        futex_wait(&self.word, seen, timeout_ns);
    }
    pub fn notify_all(&self) {
        self.word.fetch_add(1, Ordering::Release);
        futex_wake(&self.word, i32::MAX);
    }
    /// Wakes one waiter (each waiter rechecks its condition; one that
    /// arrives later sees the new generation and does not sleep).
    pub fn notify_one(&self) {
        self.word.fetch_add(1, Ordering::Release);
        futex_wake(&self.word, 1);
    }
}

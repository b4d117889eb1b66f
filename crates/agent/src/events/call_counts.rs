//! Production mode's exact counts of calls per allocator function, and of
//! the bytes they asked for (`Event::CallCounts`).
//!
//! The counters are per thread, each with one writer (relaxed loads and
//! stores, no read-modify-write on the hot path); a thread's end adds them
//! to the process's (`ENDED`), and the finish sums those with the counts
//! of the threads still running (`thread::call_counts`). A fork child
//! starts from zero: its trace counts its own calls.

use core::sync::atomic::{AtomicU64, Ordering};
use trapline_trace::{AllocFn, Event};

/// Allocator functions counted (`AllocFn` values are below this).
pub const FUNCS: usize = 64;

/// One thread's calls and requested bytes per allocator function.
pub struct CallCounters {
    calls: [AtomicU64; FUNCS],
    bytes: [AtomicU64; FUNCS],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

impl CallCounters {
    pub const fn new() -> Self {
        CallCounters {
            calls: [ZERO; FUNCS],
            bytes: [ZERO; FUNCS],
        }
    }

    /// Counts a call of `func` asking for `bytes` (the owning thread only).
    #[inline(always)]
    pub fn count(&self, func: AllocFn, bytes: u64) {
        let i = func as usize % FUNCS;
        let bump =
            |c: &AtomicU64, n: u64| c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        bump(&self.calls[i], 1);
        bump(&self.bytes[i], bytes);
    }

    /// Takes back a call `count` counted (one that failed: a failed call
    /// is recorded as such, not counted).
    pub fn uncount(&self, func: AllocFn, bytes: u64) {
        let i = func as usize % FUNCS;
        let drop = |c: &AtomicU64, n: u64| {
            c.store(c.load(Ordering::Relaxed).wrapping_sub(n), Ordering::Relaxed)
        };
        drop(&self.calls[i], 1);
        drop(&self.bytes[i], bytes);
    }

    /// Adds these counts to `into` (which other threads may add to).
    pub fn add_to(&self, into: &CallCounters) {
        for i in 0..FUNCS {
            into.calls[i].fetch_add(self.calls[i].load(Ordering::Relaxed), Ordering::Relaxed);
            into.bytes[i].fetch_add(self.bytes[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Sets every count to 0 (a fork child, single-threaded).
    pub fn clear(&self) {
        for c in self.calls.iter().chain(&self.bytes) {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Every function's (calls, bytes), for the functions called.
    pub fn each(&self, mut f: impl FnMut(AllocFn, u64, u64)) {
        for i in 0..FUNCS {
            let calls = self.calls[i].load(Ordering::Relaxed);
            if calls != 0 {
                if let Some(func) = AllocFn::from_u8(i as u8) {
                    f(func, calls, self.bytes[i].load(Ordering::Relaxed));
                }
            }
        }
    }
}

impl Default for CallCounters {
    fn default() -> Self {
        Self::new()
    }
}

/// The counts of the threads that ended.
pub static ENDED: CallCounters = CallCounters::new();

/// Writes `counts` as `CallCounts` events at `time`, through `push`.
pub fn write(counts: &CallCounters, time: u64, mut push: impl FnMut(&Event)) {
    counts.each(|func, calls, bytes| {
        push(&Event::CallCounts {
            time,
            func,
            calls,
            bytes,
        })
    });
}

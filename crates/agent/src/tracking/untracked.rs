//! Blocks allocated while the calling thread was already inside the agent: a
//! signal handler that interrupted a hook, or a C library function the agent
//! itself called (fopen, pthread_getattr_np). Such calls pass straight to
//! glibc; their addresses are remembered here, lock-free and async-signal-safe,
//! so that freeing them later is neither reported as an invalid free nor lost.

use core::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 4096;
const PROBES: usize = 64;

static SET: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Calls made inside the agent (reported in every trace's end record).
pub static CALLS: AtomicU64 = AtomicU64::new(0);
/// Untracked blocks that did not fit in the set (their free will be reported
/// as invalid; counted so the report can say so).
pub static OVERFLOW: AtomicU64 = AtomicU64::new(0);

fn home(addr: u64) -> usize {
    ((addr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % SLOTS
}

/// Remembers an untracked block.
pub fn insert(addr: u64) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    if addr == 0 {
        return;
    }
    let h = home(addr);
    for k in 0..PROBES {
        let slot = &SET[(h + k) % SLOTS];
        if slot
            .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
    OVERFLOW.fetch_add(1, Ordering::Relaxed);
}

/// Whether `addr` is an untracked block (it stays one).
pub fn is_listed(addr: u64) -> bool {
    let h = home(addr);
    addr != 0 && (0..PROBES).any(|k| SET[(h + k) % SLOTS].load(Ordering::Acquire) == addr)
}

/// Forgets an untracked block; true if it was one.
pub fn remove(addr: u64) -> bool {
    if addr == 0 {
        return false;
    }
    let h = home(addr);
    for k in 0..PROBES {
        let slot = &SET[(h + k) % SLOTS];
        if slot.load(Ordering::Acquire) == addr
            && slot
                .compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return true;
        }
    }
    false
}

//! The agent's clock.
//!
//! Reading a precise clock costs 17 ns (rdtsc) to 43 ns (clock_gettime) on the
//! machines we measured, more than the whole budget of an allocation event.
//! Instead the writer thread publishes the monotonic time every millisecond
//! into one shared word, and events read that word (about 1 ns). Event times
//! are then made strictly increasing per live-table shard and per thread (see
//! `live::Shard::stamp`), which keeps every address's history in true order
//! while staying within a millisecond of the real clock.

use core::sync::atomic::{AtomicU64, Ordering};

/// Monotonic nanoseconds at trace time 0.
static START_MONO_NS: AtomicU64 = AtomicU64::new(0);
/// Latest published trace time.
static TICK_NS: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds on clock `id`, or None if the kernel refuses it (a thread CPU
/// clock of a thread that is gone).
pub fn read_ns(id: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    let r = unsafe { libc::clock_gettime(id, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

pub fn monotonic_ns() -> u64 {
    read_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// Starts trace time at 0 now (process start, and again in a fork child).
pub fn reset() {
    START_MONO_NS.store(monotonic_ns(), Ordering::Relaxed);
    TICK_NS.store(0, Ordering::Relaxed);
}

/// The precise trace time; also publishes it as the current tick.
pub fn precise_now() -> u64 {
    let t = monotonic_ns().saturating_sub(START_MONO_NS.load(Ordering::Relaxed));
    TICK_NS.fetch_max(t, Ordering::Relaxed);
    t
}

/// The trace time at the last tick (cheap; at most about a millisecond old).
#[inline]
pub fn tick() -> u64 {
    TICK_NS.load(Ordering::Relaxed)
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn unix_ns() -> u64 {
    read_ns(libc::CLOCK_REALTIME).unwrap_or(0)
}

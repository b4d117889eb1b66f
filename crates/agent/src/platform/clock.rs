//! The agent's clock.
//!
//! Reading a precise clock costs 17 ns (rdtsc) to 43 ns (clock_gettime) on the
//! machines we measured, more than the whole budget of an allocation event.
//! Instead the writer thread publishes the monotonic time every millisecond
//! into one shared word, and events read that word (about 1 ns). Event times
//! are then made strictly increasing per live-table shard and per thread (see
//! `live::Shard::stamp`), which keeps every address's history in true order
//! while staying within a millisecond of the real clock.
//!
//! A millisecond tick costs an idle program a wake-up of the writer per
//! millisecond (2.4% of a core). So the word's two low bits say whether
//! anyone needs it: the first reader after a tick sets `READ`; a writer that
//! finds its ticks unread for `IDLE_AFTER_NS` marks the word `ASLEEP` and
//! sleeps until its next periodic sweep. A reader that finds `ASLEEP` reads
//! the precise clock itself, publishes it and wakes the writer, which ticks
//! again. Nanoseconds lose their two low bits, which no analysis sees.

use crate::platform::callback::Callback;
use core::sync::atomic::{AtomicU64, Ordering};

/// What ends the ticker's sleep (`on_ticker_asleep`): the writer's wake.
static WAKE_TICKER: Callback<fn()> = Callback::new();

/// The ticker (the writer) registers how a reader that finds it asleep
/// wakes it.
pub fn on_ticker_asleep(wake: fn()) {
    WAKE_TICKER.set(wake);
}

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

/// In `TICK_NS`: some event has read the tick since it was published.
const READ: u64 = 1;
/// In `TICK_NS`: the writer has stopped ticking; the word may be old.
const ASLEEP: u64 = 2;
/// No writer thread ticks (production mode before the program's second
/// thread): every read takes the clock.
const NO_TICKER: u64 = 4;
const FLAGS: u64 = READ | ASLEEP | NO_TICKER;
/// The writer stops ticking once its ticks have gone unread this long.
pub const IDLE_AFTER_NS: u64 = 4_000_000;

fn trace_now() -> u64 {
    monotonic_ns().saturating_sub(START_MONO_NS.load(Ordering::Relaxed))
}

/// Raises the tick to `t`, keeping its flags.
fn publish_at_least(t: u64) {
    let t = t & !FLAGS;
    let _ = TICK_NS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
        (cur & !FLAGS < t).then_some(t | (cur & FLAGS))
    });
}

/// The precise trace time, to the tick's resolution (its low bits hold
/// flags); also raises the current tick to it, so every event stamped
/// after this returns carries this time or a later one (a window of the
/// trace begins at a control answer's time).
/// Whether a writer thread publishes the tick: without one (`false`),
/// every `tick` reads the clock.
pub fn set_ticker(running: bool) {
    if running {
        TICK_NS.fetch_and(!NO_TICKER, Ordering::Relaxed);
    } else {
        TICK_NS.fetch_or(NO_TICKER, Ordering::Relaxed);
    }
}

pub fn precise_now() -> u64 {
    let t = trace_now() & !FLAGS;
    publish_at_least(t);
    t
}

/// The trace time at the last tick (cheap; at most about a millisecond old).
#[inline]
pub fn tick() -> u64 {
    let word = TICK_NS.load(Ordering::Relaxed);
    if word & FLAGS != READ {
        return tick_slow(word);
    }
    word & !FLAGS
}

/// The first read after a tick, or a read while the writer sleeps.
#[cold]
#[inline(never)]
fn tick_slow(word: u64) -> u64 {
    if word & NO_TICKER != 0 {
        return trace_now() & !FLAGS;
    }
    if word & ASLEEP == 0 {
        TICK_NS.fetch_or(READ, Ordering::Relaxed);
        return word & !FLAGS;
    }
    let t = trace_now() & !FLAGS;
    // One reader ends the sleep; the others take the tick it published.
    let ended = TICK_NS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
        (cur & ASLEEP != 0).then_some(t.max(cur & !FLAGS) | READ)
    });
    match ended {
        Ok(before) => {
            // This reader ended the sleep: the writer ticks again.
            if let Some(wake) = WAKE_TICKER.get() {
                wake();
            }
            t.max(before & !FLAGS)
        }
        Err(now) => now & !FLAGS,
    }
}

/// What the tick word says, for the writer.
pub struct TickState {
    /// Some event read the tick since the writer published it.
    pub read: bool,
    /// The writer marked the word and no reader has woken it since.
    pub asleep: bool,
}

pub fn tick_state() -> TickState {
    let word = TICK_NS.load(Ordering::Relaxed);
    TickState {
        read: word & READ != 0,
        asleep: word & ASLEEP != 0,
    }
}

/// The precise trace time, not published (the writer publishes it with
/// `publish_tick` once it has decided whether to sleep).
pub fn writer_now() -> u64 {
    trace_now() & !FLAGS
}

/// From the writer: the tick is `now`, unread; `asleep`: the writer stops
/// ticking until a reader wakes it.
pub fn publish_tick(now: u64, asleep: bool) {
    let flag = if asleep { ASLEEP } else { 0 };
    let _ = TICK_NS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
        Some((now & !FLAGS).max(cur & !FLAGS) | flag)
    });
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn unix_ns() -> u64 {
    read_ns(libc::CLOCK_REALTIME).unwrap_or(0)
}

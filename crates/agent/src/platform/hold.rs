//! The gate parked threads wait at, and the word that says the world is
//! held stopped through the finish of the trace.
//!
//! Here, below everything, because a lock's slow path must look at it:
//! while the exit keeps the program's threads stopped (scan::ExitHold),
//! one of them may hold the lock an agent thread waits for, so every wait
//! for one of the agent's locks lets the held threads go first.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// While `CLOSED`, parked threads wait; `OPEN` releases them; `LINGER`
/// releases them after `LINGER_NS` (`open_at_end`).
static GATE: AtomicU32 = AtomicU32::new(OPEN);
const CLOSED: u32 = 0;
const OPEN: u32 = 1;
const LINGER: u32 = 2;
/// How long threads held through the finish stay parked once the trace is
/// written: the exit ends them well before that, unless it waits for one
/// of them (a stdio lock it held when it stopped).
const LINGER_NS: u64 = 1_000_000_000;
/// The world is held stopped through the finish of the trace.
static HELD: AtomicBool = AtomicBool::new(false);

/// Threads that park from now on wait at the gate.
pub fn close() {
    GATE.store(CLOSED, Ordering::Release);
}

/// Keeps the parked threads parked past the scan, through the finish.
pub fn hold() {
    HELD.store(true, Ordering::Release);
}

/// Whether the world is held stopped now (`hold`).
#[inline]
pub fn held() -> bool {
    HELD.load(Ordering::Relaxed)
}

/// Lets the held threads run again, without waiting: a thread that waits
/// for one of the agent's locks calls this, since the holder may be
/// stopped.
#[inline]
pub fn let_go_if_held() {
    if held() {
        let_go_held();
    }
}

#[cold]
fn let_go_held() {
    if HELD.swap(false, Ordering::AcqRel) {
        GATE.store(OPEN, Ordering::Release);
        crate::platform::futex::futex_wake(&GATE, i32::MAX);
    }
}

/// Lets every parked thread go now.
pub fn open() {
    HELD.store(false, Ordering::Release);
    GATE.store(OPEN, Ordering::Release);
    crate::platform::futex::futex_wake(&GATE, i32::MAX);
}

/// The trace is written and the process is ending: the held threads stay
/// parked until the exit ends them, as natively it would have ended them
/// running, or at most `LINGER_NS` if the process goes on (what is left of
/// the exit may wait for one of them). Does not wait for them.
pub fn open_at_end() {
    HELD.store(false, Ordering::Release);
    GATE.store(LINGER, Ordering::Release);
    crate::platform::futex::futex_wake(&GATE, i32::MAX);
}

/// In the park handler: waits until the gate opens.
pub fn wait_at_gate() {
    let mut until = 0;
    loop {
        match GATE.load(Ordering::Acquire) {
            OPEN => return,
            CLOSED => crate::platform::futex::futex_wait(&GATE, CLOSED, None),
            _ => {
                let now = crate::platform::clock::precise_now();
                if until == 0 {
                    until = now + LINGER_NS;
                }
                if now >= until {
                    return;
                }
                crate::platform::futex::futex_wait(&GATE, LINGER, Some(until - now));
            }
        }
    }
}

//! How far the current pass over a trace is, for a progress display (the
//! CLI draws one on a terminal): the chunks the merge has opened of the
//! trace's chunks, and how many passes have started. Analyses run one pass
//! at a time; a display only reads these.

use std::sync::atomic::{AtomicU64, Ordering};

static PASSES: AtomicU64 = AtomicU64::new(0);
static DONE: AtomicU64 = AtomicU64::new(0);
static TOTAL: AtomicU64 = AtomicU64::new(0);

/// A pass over `chunks` chunks starts.
pub(crate) fn pass_started(chunks: usize) {
    DONE.store(0, Ordering::Relaxed);
    TOTAL.store(chunks as u64, Ordering::Relaxed);
    PASSES.fetch_add(1, Ordering::Relaxed);
}

/// The pass opened one more chunk.
pub(crate) fn chunk_opened() {
    DONE.fetch_add(1, Ordering::Relaxed);
}

/// (passes started, chunks opened in the current one, its chunks).
pub fn now() -> (u64, u64, u64) {
    (
        PASSES.load(Ordering::Relaxed),
        DONE.load(Ordering::Relaxed),
        TOTAL.load(Ordering::Relaxed),
    )
}

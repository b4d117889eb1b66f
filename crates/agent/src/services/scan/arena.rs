//! glibc's main arena, found once (`trapline_reach::arena`) and
//! remembered: it never moves.

use super::mark::SafeReader;
use core::sync::atomic::{AtomicU64, Ordering};
use trapline_reach::arena;

/// The main arena's address once found.
static FOUND: AtomicU64 = AtomicU64::new(0);

/// The extent of glibc's `main_arena`, if the C library's writable data
/// (its segments, listed by `segments` only while the arena is not found
/// yet) holds one.
pub fn main_arena(
    segments: impl FnOnce() -> Vec<(u64, u64)>,
    reader: &mut SafeReader,
) -> Option<(u64, u64)> {
    let known = FOUND.load(Ordering::Relaxed);
    if known != 0 {
        return Some(arena::extent(known));
    }
    let m = arena::find_main_arena(segments(), &mut |lo, hi, f| reader.for_each_word(lo, hi, f))?;
    FOUND.store(m, Ordering::Relaxed);
    Some(arena::extent(m))
}

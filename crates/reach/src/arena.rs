//! glibc's main arena: the allocator's own bookkeeping in the C library's
//! data, which must never be a root.
//!
//! `main_arena` (a `struct malloc_state`, static in libc's .data) holds
//! pointers to chunk headers: `top`, `last_remainder`, the fast bins and the
//! bins. A chunk header that follows a block in use lies inside that block
//! when its size mod 16 is 1 to 8 (the next chunk's `prev_size` word is the
//! block's last 8 bytes), so `top` made a leaked block just before the top
//! chunk "possibly lost" (an interior pointer from a root) where memcheck,
//! which replaces the allocator, says definitely lost.
//!
//! The structure has no exported symbol. It is found by its shape: an empty
//! bin is a pair of words that both point 16 bytes below the pair (the bin's
//! fake chunk), and the arenas form a ring through their `next` field that
//! comes back to the main arena. The layout is glibc's from 2.27 on (the
//! version that added `have_fastchunks`); where nothing matches (another C
//! library, another layout), nothing is excluded and the scan reads libc's
//! data as before.

/// `offsetof(struct malloc_state, bins)`.
const BINS: u64 = 112;
/// Number of bins pairs (`NBINS - 1`).
const BIN_PAIRS: u64 = 127;
/// `offsetof(struct malloc_state, next)`.
const NEXT: u64 = 2160;
/// `sizeof(struct malloc_state)`.
const SIZE: u64 = 2200;
/// Arenas a ring may have before the search gives up on it (glibc makes at
/// most 8 per core).
const MAX_ARENAS: usize = 4096;

/// The address of glibc's `main_arena`, if the C library's writable data
/// (`segments`) holds one. `read(lo, hi, f)` calls `f` with each readable
/// word of `[lo, hi)` and returns the bytes read.
pub fn find_main_arena(
    segments: Vec<(u64, u64)>,
    read: &mut impl FnMut(u64, u64, &mut dyn FnMut(u64)) -> u64,
) -> Option<u64> {
    for (lo, hi) in segments {
        // Read whole (tens of KiB), then searched in place: a read per word
        // cost a short-lived process's exit scan about 2 ms.
        let (lo, seg_hi) = ((lo + 7) & !7, hi & !7);
        if seg_hi <= lo {
            continue;
        }
        let mut data = Vec::with_capacity(((seg_hi - lo) / 8) as usize);
        // A page that could not be read would shift every word after it.
        if read(lo, seg_hi, &mut |w| data.push(w)) != seg_hi - lo {
            continue;
        }
        let local = |a: u64| -> Option<u64> {
            (a >= lo && a + 8 <= seg_hi).then(|| data[((a - lo) / 8) as usize])
        };
        // Words outside the segment (other arenas, in their heaps) are read
        // one at a time: a ring has a few.
        let mut word = |a: u64| {
            local(a).or_else(|| {
                let mut w = None;
                read(a, a + 8, &mut |x| w = Some(x));
                w
            })
        };
        let mut q = lo;
        while q + 16 <= seg_hi {
            if is_empty_bin(&mut word, q) {
                // The pair is bin k + 1 for some k: the arena starts below it.
                for k in 0..BIN_PAIRS {
                    let Some(m) = q.checked_sub(BINS + 16 * k).filter(|&m| m >= lo) else {
                        break;
                    };
                    if m + SIZE <= seg_hi && is_main_arena(&mut word, m) {
                        return Some(m);
                    }
                }
                return None;
            }
            q += 8;
        }
    }
    None
}

/// The extent of the arena found at `m`.
pub fn extent(m: u64) -> (u64, u64) {
    (m, m + SIZE)
}

/// Whether the two words at `q` both point 16 bytes below `q`.
fn is_empty_bin(word: &mut impl FnMut(u64) -> Option<u64>, q: u64) -> bool {
    let fake = q - 16;
    word(q) == Some(fake) && word(q + 8) == Some(fake)
}

/// Whether a `malloc_state` at `m` is the main arena: its `next` ring comes
/// back to it, and every bin is empty (pointing at itself) or points out of
/// the arena (to free chunks).
fn is_main_arena(word: &mut impl FnMut(u64) -> Option<u64>, m: u64) -> bool {
    let mut empty = 0;
    for k in 0..BIN_PAIRS {
        let q = m + BINS + 16 * k;
        if is_empty_bin(word, q) {
            empty += 1;
            continue;
        }
        let (Some(fd), Some(bk)) = (word(q), word(q + 8)) else {
            return false;
        };
        let inside = |p: u64| p >= m && p < m + SIZE;
        if fd == 0 || bk == 0 || inside(fd) || inside(bk) {
            return false;
        }
    }
    if empty == 0 {
        return false;
    }
    let mut next = m;
    for _ in 0..MAX_ARENAS {
        match word(next + NEXT) {
            Some(n) if n == m => return true,
            Some(n) if n != 0 => next = n,
            _ => return false,
        }
    }
    false
}

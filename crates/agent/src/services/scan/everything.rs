//! Production mode's scan (docs/analyses.md, "Reachability scan"): the
//! live table holds only the sampled blocks, so the program's pointers may
//! lie anywhere, in the blocks the agent never saw as much as in its data.
//! Every readable, writable mapping is read (`roots::plan`, `everything`):
//! the full scan's roots, and malloc's memory, the allocator library's
//! mappings and the mmapped chunks, less the agent's own memory, glibc's
//! `main_arena` and the sampled blocks, which marking reads as it reaches
//! them. A sampled block no word of all that points into is lost: nothing
//! the program can still read holds its address. One that only blocks the
//! agent does not know point to is called referenced, though they may be
//! lost too.

use super::mark::SafeReader;
use crate::tracking::live::Packed;
use trapline_reach::jemalloc;
use trapline_reach::{BlockIndex, Sieve};

/// What a root range is read against: the sampled blocks, the sieve of
/// their pages (checked here, in the loop, before the marker's call) and
/// the allocator library's mappings (sorted).
pub struct Against<'a> {
    pub index: &'a BlockIndex<Packed>,
    pub sieve: &'a Sieve,
    pub allocator: &'a [(u64, u64)],
}

/// Calls `word` with every word of root range `[lo, hi)` (only its pages
/// that hold data when `sparse`); in the allocator library's mappings
/// jemalloc's records of the sampled blocks' extents are left out
/// (`trapline_reach::jemalloc`). Returns the bytes read.
pub fn read_root(
    reader: &mut SafeReader,
    (lo, hi): (u64, u64),
    sparse: bool,
    against: &Against<'_>,
    word: &mut impl FnMut(u64),
) -> u64 {
    let Against {
        index,
        sieve,
        allocator,
    } = *against;
    let mut bytes = 0;
    let mut read = |reader: &mut SafeReader, a: u64, b: u64, records: bool| {
        let mut piece = |reader: &mut SafeReader, a, b| {
            if !records {
                return reader.for_each_chunk(a, b, |_, words| {
                    for &w in words.iter().filter(|&&w| sieve.may_point(w)) {
                        word(w);
                    }
                });
            }
            let started_at = |w| match index.find(w) {
                Some((i, true)) => Some(index.blocks[i].size()),
                _ => None,
            };
            reader.for_each_chunk(a, b, |at, words| {
                let sieved = |w| sieve.may_point(w);
                jemalloc::for_each_pointer(at, words, sieved, started_at, &mut *word);
            })
        };
        if sparse {
            reader.populated(a, b, |reader, x, y| bytes += piece(reader, x, y));
        } else {
            bytes += piece(reader, a, b);
        }
    };
    let mut cur = lo;
    let first = allocator.partition_point(|r| r.1 <= lo);
    for &(a, b) in &allocator[first..] {
        if a >= hi {
            break;
        }
        if a > cur {
            read(reader, cur, a, false);
        }
        let end = b.min(hi);
        read(reader, a.max(cur), end, true);
        cur = end;
    }
    if cur < hi {
        read(reader, cur, hi, false);
    }
    bytes
}

//! Where the roots are: which memory the scan reads for pointers.
//!
//! Every readable and writable mapping is a root (memcheck's rule: a pointer
//! kept in a mapping the program made keeps its block alive), except:
//! - malloc's own memory: `[heap]`, glibc's arena heaps (found at 64 MiB
//!   aligned addresses by their `heap_info` header, whose first word points
//!   to their arena and third word gives their size), and the extent of
//!   every live block outside them (mmapped chunks). Only those extents are
//!   cut out: the kernel merges adjacent anonymous mappings into one line of
//!   /proc/self/maps, so a chunk may share a line with memory the program
//!   mapped itself (Python's object arenas do). Blocks are read only when
//!   marking reaches them, and free chunks never are;
//! - the agent's own memory: its module's segments, its heap's mappings, the
//!   stacks of its threads (the park table is in its heap);
//! - kernel and device mappings (`[vvar]`, `[vdso]`, `/dev/*`).
//!
//! Production mode knows only the sampled blocks: its plan (`everything`)
//! reads malloc's memory too, less the sampled blocks' extents.
//!
//! A mapping holding the stack pointer of a stopped thread is read from that
//! stack pointer up, as LeakSanitizer does (the thread's static TLS and
//! descriptor lie above its stack), and its general registers are read from the
//! signal frame that stopped it. Everything below the stack pointer is dead:
//! the red zone, where the frames of the calls the thread made last (the
//! agent's hooks among them) left copies of addresses, and the signal frame
//! with the vector registers, which memcheck and LeakSanitizer do not read
//! either: they hold mostly what the C library's string functions copied last,
//! in registers that depend on the CPU (the AVX-512 variants use ymm16 to
//! ymm31, which no call clears), so reading them made a lost block's verdict
//! depend on the CPU model. The scanning thread's own stack is read from where
//! its live frames start: the caller of `exit`, or the entry stack of the
//! process when `main` returned. A thread's own stack that it left through
//! `swapcontext` or `setcontext` is read from where it left it
//! (`hooks/context.rs`). Any other stack on which no stopped thread is (an
//! alternate signal stack not in use, a coroutine stack switched away from, a
//! thread that could not be stopped) is read whole.

use crate::maps::{containing, Mapping, Special};

/// glibc's arena heaps are aligned to their maximum size.
const ARENA_HEAP_ALIGN: u64 = 64 << 20;

/// Inputs of the root plan.
pub struct Plan<'a> {
    pub maps: &'a [Mapping],
    /// Sorted, possibly overlapping ranges never read.
    pub excluded: &'a [(u64, u64)],
    /// Stack pointers of stopped threads and of the scanning thread, and
    /// where threads left their own stacks for another.
    pub stack_starts: &'a [u64],
    /// The extent (chunk header included) of the first live block starting
    /// in `[lo, hi)`.
    pub next_block: &'a dyn Fn(u64, u64) -> Option<(u64, u64)>,
    /// Reads one word, if readable.
    pub read_word: &'a mut dyn FnMut(u64) -> Option<u64>,
    /// Production mode: the known blocks are only some of the live ones
    /// (the sampled), so malloc's memory is read too (`[heap]`, arena
    /// heaps, mmapped chunks), less the known blocks' extents, which
    /// marking reads when it reaches them.
    pub everything: bool,
}

/// The extent of a glibc arena heap starting at `at` (64 MiB aligned), if
/// `at` holds one: `heap_info.ar_ptr` points into an aligned anonymous
/// mapping and `heap_info.size` is at most the alignment.
fn arena_heap_at(
    maps: &[Mapping],
    at: u64,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
) -> Option<(u64, u64)> {
    let ar_ptr = read_word(at).filter(|&p| p != 0)?;
    let size = read_word(at + 16).filter(|&s| s > 0 && s <= ARENA_HEAP_ALIGN)?;
    let base = ar_ptr & !(ARENA_HEAP_ALIGN - 1);
    let i = containing(maps, base)?;
    (!maps[i].file).then_some((at, at + size))
}

/// The next piece of malloc memory at or after `cur` in `[cur, hi)`: an
/// arena heap or a block's extent, whichever starts first.
fn next_malloc_piece(
    p: &mut Plan<'_>,
    cur: u64,
    hi: u64,
    arena: &mut Option<(u64, u64)>,
    arena_cursor: &mut u64,
) -> Option<(u64, u64)> {
    if arena.is_none_or(|(a, _)| a < cur) {
        *arena = None;
        let mut at = (*arena_cursor).max(cur).next_multiple_of(ARENA_HEAP_ALIGN);
        while at < hi {
            if let Some(h) = arena_heap_at(p.maps, at, p.read_word) {
                *arena = Some(h);
                break;
            }
            at += ARENA_HEAP_ALIGN;
        }
        *arena_cursor = at;
    }
    let block = (p.next_block)(cur, hi);
    match (*arena, block) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Appends the root ranges to `out` within its capacity (no allocation):
/// false when a range did not fit (then a block may be pointed to from
/// memory not read).
pub fn plan(mut p: Plan<'_>, out: &mut Vec<(u64, u64)>) -> bool {
    out.clear();
    let mut fit = true;
    for m in p.maps {
        if !m.readable
            || !m.writable
            || m.kind == Special::Kernel
            || (m.kind == Special::Heap && !p.everything)
        {
            continue;
        }
        let lo = read_from(m, p.stack_starts);
        if !p.everything && (m.file || m.kind == Special::Stack) {
            fit &= push_minus(out, lo, m.end, p.excluded);
            continue;
        }
        let (mut arena, mut arena_cursor) = (None, 0);
        let mut cur = lo;
        while cur < m.end {
            let piece = match p.everything {
                true => (p.next_block)(cur, m.end),
                false => next_malloc_piece(&mut p, cur, m.end, &mut arena, &mut arena_cursor),
            };
            match piece {
                Some((a, b)) => {
                    fit &= push_minus(out, cur, a.max(cur), p.excluded);
                    cur = cur.max(b);
                }
                None => {
                    fit &= push_minus(out, cur, m.end, p.excluded);
                    break;
                }
            }
        }
    }
    fit
}

/// Where mapping `m` is read from: the lowest stack pointer of a stopped
/// thread inside it (its live frames are above), else its start.
fn read_from(m: &Mapping, stack_starts: &[u64]) -> u64 {
    stack_starts
        .iter()
        .copied()
        .filter(|&sp| sp >= m.start && sp < m.end)
        .min()
        .map_or(m.start, |sp| sp & !7)
}

/// Pushes `[lo, hi)` minus the excluded ranges; false when `out` had no
/// room for a piece.
fn push_minus(out: &mut Vec<(u64, u64)>, mut lo: u64, hi: u64, excluded: &[(u64, u64)]) -> bool {
    let mut fit = true;
    let mut push = |out: &mut Vec<(u64, u64)>, r| {
        if out.len() < out.capacity() {
            out.push(r);
        } else {
            fit = false;
        }
    };
    if lo >= hi {
        return true;
    }
    let first = excluded.partition_point(|e| e.1 <= lo);
    for &(a, b) in &excluded[first..] {
        if a >= hi {
            break;
        }
        if a > lo {
            push(out, (lo, a.min(hi)));
        }
        lo = lo.max(b);
        if lo >= hi {
            return fit;
        }
    }
    if lo < hi {
        push(out, (lo, hi));
    }
    fit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, kind: Special) -> Mapping {
        Mapping {
            start,
            end,
            readable: true,
            writable: true,
            executable: false,
            file: false,
            kind,
        }
    }

    /// Production mode's plan reads malloc's `[heap]` and a stack from its
    /// thread's pointer up, and leaves out the excluded ranges, the known
    /// blocks' extents and the kernel's mappings.
    #[test]
    fn everything_is_read_but_the_known_blocks_and_the_excluded() {
        let maps = [
            mapping(0x1000, 0x9000, Special::Heap),
            mapping(0x10000, 0x20000, Special::None),
            mapping(0x30000, 0x31000, Special::Kernel),
            mapping(0x40000, 0x48000, Special::Stack),
        ];
        let blocks = [(0x2000u64, 0x3000u64), (0x12000, 0x12100)];
        let next_block = |lo: u64, hi: u64| {
            blocks
                .iter()
                .copied()
                .find(|&(a, _)| a >= lo && a < hi)
                .map(|(a, b)| (a - 16, b))
        };
        let mut out = Vec::with_capacity(16);
        let fit = plan(
            Plan {
                maps: &maps,
                excluded: &[(0x18000, 0x19000)],
                stack_starts: &[0x44008],
                next_block: &next_block,
                read_word: &mut |_| None,
                everything: true,
            },
            &mut out,
        );
        assert!(fit);
        assert_eq!(
            out,
            [
                (0x1000, 0x1ff0),
                (0x3000, 0x9000),
                (0x10000, 0x11ff0),
                (0x12100, 0x18000),
                (0x19000, 0x20000),
                (0x44008, 0x48000),
            ]
        );
        // Without room for every range, the plan says so.
        let mut out = Vec::with_capacity(2);
        let whole = Plan {
            maps: &maps,
            excluded: &[],
            stack_starts: &[],
            next_block: &next_block,
            read_word: &mut |_| None,
            everything: true,
        };
        assert!(!plan(whole, &mut out));
    }
}

//! Where the roots are: which memory the scan reads for pointers.
//!
//! Every readable and writable mapping is a root (memcheck's rule: a pointer
//! kept in a mapping the program made keeps its block alive), except:
//! - malloc's own memory: `[heap]`, and anonymous mappings that hold a live
//!   block (mmapped chunks, arenas) or that look like a glibc arena heap
//!   (64 MiB aligned, its first word pointing into such a heap); blocks are
//!   read only when marking reaches them, and free chunks never are;
//! - the agent's own memory: its module's segments, its heap's mappings, the
//!   stacks of its threads, the park table;
//! - kernel and device mappings (`[vvar]`, `[vdso]`, `/dev/*`).
//!
//! A mapping holding the stack pointer of a stopped thread is read from that
//! stack pointer up (the park handler's frame sits just below the signal
//! frame with the thread's registers, vector registers included; the
//! thread's static TLS and descriptor lie above its stack). Everything below
//! is dead. The scanning thread's own stack is read from where its live
//! frames start: the caller of `exit`, or the entry stack of the process when
//! `main` returned. A stack on which no stopped thread is (an alternate
//! signal stack not in use, a swapcontext stack, a thread that could not be
//! stopped) is read whole.

use super::maps::{containing, Mapping, Special};

/// glibc's arena heaps are aligned to their maximum size.
const ARENA_HEAP_ALIGN: u64 = 64 << 20;

/// Inputs of the root plan.
pub struct Plan<'a> {
    pub maps: &'a [Mapping],
    /// Sorted, possibly overlapping ranges never read.
    pub excluded: &'a [(u64, u64)],
    /// Stack pointers: (address) of stopped threads and of the scanning thread.
    pub stack_starts: &'a [u64],
    /// Whether a mapping holds malloc's blocks.
    pub holds_blocks: &'a dyn Fn(u64, u64) -> bool,
    /// Reads one word, if readable.
    pub read_word: &'a mut dyn FnMut(u64) -> Option<u64>,
}

fn is_arena_heap(
    maps: &[Mapping],
    m: &Mapping,
    read_word: &mut dyn FnMut(u64) -> Option<u64>,
) -> bool {
    if m.file || !m.start.is_multiple_of(ARENA_HEAP_ALIGN) {
        return false;
    }
    // heap_info.ar_ptr: the arena's state, inside this heap or its arena's first heap.
    let Some(ar_ptr) = read_word(m.start) else {
        return false;
    };
    let base = ar_ptr & !(ARENA_HEAP_ALIGN - 1);
    containing(maps, base).is_some_and(|i| maps[i].start == base && !maps[i].file) && ar_ptr != 0
}

/// Appends the root ranges to `out` (within its capacity: no allocation).
pub fn plan(p: Plan<'_>, out: &mut Vec<(u64, u64)>) {
    out.clear();
    for m in p.maps {
        if !m.readable || !m.writable || m.kind == Special::Kernel || m.kind == Special::Heap {
            continue;
        }
        if !m.file
            && m.kind != Special::Stack
            && ((p.holds_blocks)(m.start, m.end) || is_arena_heap(p.maps, m, p.read_word))
        {
            continue;
        }
        let mut lo = m.start;
        if let Some(sp) = p
            .stack_starts
            .iter()
            .copied()
            .filter(|&sp| sp >= m.start && sp < m.end)
            .min()
        {
            lo = sp & !7;
        }
        push_minus(out, lo, m.end, p.excluded);
    }
}

/// Pushes `[lo, hi)` minus the excluded ranges.
fn push_minus(out: &mut Vec<(u64, u64)>, mut lo: u64, hi: u64, excluded: &[(u64, u64)]) {
    let first = excluded.partition_point(|e| e.1 <= lo);
    for &(a, b) in &excluded[first..] {
        if a >= hi {
            break;
        }
        if a > lo && out.len() < out.capacity() {
            out.push((lo, a.min(hi)));
        }
        lo = lo.max(b);
        if lo >= hi {
            return;
        }
    }
    if lo < hi && out.len() < out.capacity() {
        out.push((lo, hi));
    }
}

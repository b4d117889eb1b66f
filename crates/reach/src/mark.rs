//! Marking and classification, with memcheck's semantics.
//!
//! States: unreached, possible (reached, but an interior pointer or a
//! possibly-lost block lies on every chain), reachable (a chain of start
//! pointers from a root), indirect (unreached, pointed to by an unreached
//! block). A block is pushed on the mark stack each time its state rises, and
//! its contents are scanned with the state it has when popped: a reachable
//! block passes "reachable" through start pointers and "possible" through
//! interior ones; a possible block passes only "possible". After the roots,
//! the unreached blocks are taken in address order: each still unreached
//! one leads a clique; every unreached block it reaches (through any pointer)
//! becomes indirect and its size (plus what it led before, if it was an
//! earlier leader) goes to the leader's indirect bytes. The leaders left are
//! definitely lost.
//!
//! memcheck's interior-pointer heuristics (its default, `all`) make some
//! interior pointers count as start pointers: to the characters of an old
//! std::string (`length, capacity, refcount, chars`), to the second word of
//! a block whose first word is the length of the rest (length64) or a
//! plausible element count (new[] of objects with a destructor), and to an
//! aligned word inside a block that holds a vtable pointer when the block's
//! first word is one too (multiple inheritance). A vtable pointer here is a
//! word pointing into read-only, non-executable file-backed memory.

use crate::blocks::{BlockIndex, Buffers, Sieve, Span};
use trapline_trace::Verdict;

const UNREACHED: u8 = 0;
// The state array starts as zeroed memory (`Marker::new`).
const _: () = assert!(UNREACHED == 0);
const POSSIBLE: u8 = 1;
const REACHABLE: u8 = 2;
const INDIRECT: u8 = 3;

/// The memory of live blocks, as marking reads it.
pub trait Memory {
    /// Calls `f` with each aligned word of `[lo, hi)`, part of a live
    /// block; `readable` says the range lies inside readable mappings
    /// (else some of it may not be, and what cannot be read is skipped).
    fn block_words(&self, lo: u64, hi: u64, readable: bool, f: impl FnMut(u64));
    /// The aligned word at `a`, inside a live block in readable memory.
    fn block_word(&self, a: u64) -> u64;
}

/// Marking state of one scan.
pub struct Marker<'a, B: Span, M: Memory> {
    index: &'a BlockIndex<B>,
    mem: &'a M,
    state: Vec<u8>,
    stack: Vec<u32>,
    /// Indirect bytes of each clique leader.
    pub indirect: Vec<u64>,
    /// Readable memory, sorted and merged: block contents outside it are
    /// read through the safe reader.
    readable: &'a [(u64, u64)],
    last_readable: usize,
    /// Read-only, non-executable file-backed memory (where vtables live).
    rodata: &'a [(u64, u64)],
    /// A sieve of the blocks' pages, checked before the index (`sieve`).
    sieve: Option<&'a Sieve>,
}

impl<'a, B: Span, M: Memory> Marker<'a, B, M> {
    /// Allocates everything marking needs (called before threads stop);
    /// `None` when the memory is refused.
    pub fn new(
        index: &'a BlockIndex<B>,
        readable: &'a [(u64, u64)],
        rodata: &'a [(u64, u64)],
        mem: &'a M,
        buffers: &impl Buffers,
    ) -> Option<Marker<'a, B, M>> {
        let n = index.len();
        // Zeroed memory from fresh mappings, touched as marking goes: on
        // huge pages, so that scattered writes (cliques' indirect bytes) do
        // not fault in a 4 KiB page each. UNREACHED is 0.
        let state = buffers.zeroed::<u8>(n)?;
        let indirect = buffers.zeroed::<u64>(n)?;
        Some(Marker {
            index,
            state,
            // Each block is pushed at most twice while marking from the roots
            // (unreached -> possible -> reachable) and once per clique pass,
            // so the stack never grows while threads are stopped.
            stack: buffers.with_capacity(2 * n + 1)?,
            indirect,
            mem,
            readable,
            last_readable: 0,
            rodata,
            sieve: None,
        })
    }

    /// Checks every word against `sieve` before the index: for a few
    /// blocks among much memory (production mode's scan), where most
    /// words are pointers elsewhere.
    pub fn sieve(&mut self, sieve: &'a Sieve) {
        self.sieve = Some(sieve);
    }

    #[inline]
    fn push(&mut self, i: usize) {
        debug_assert!(self.stack.len() < self.stack.capacity());
        self.stack.push(i as u32);
    }

    /// A word found in a root, or in a block whose state is `definite` or not.
    #[inline]
    pub fn word(&mut self, w: u64, prior_definite: bool) {
        if self.sieve.is_some_and(|s| !s.may_point(w)) {
            return;
        }
        let Some((i, at_start)) = self.index.find(w) else {
            return;
        };
        let s = self.state[i];
        // The heuristics matter only where a start pointer would make a difference.
        let start_like = at_start || (prior_definite && s != REACHABLE && self.heuristic(i, w));
        if start_like && prior_definite && s != REACHABLE {
            self.state[i] = REACHABLE;
            self.push(i);
        } else if s == UNREACHED {
            self.state[i] = POSSIBLE;
            self.push(i);
        }
    }

    /// Whether memcheck's heuristics take interior pointer `w` into block `i`
    /// for a start pointer (see the module comment).
    fn heuristic(&mut self, i: usize, w: u64) -> bool {
        const WORD: u64 = 8;
        let b = self.index.blocks[i];
        let (start, size) = (b.addr(), b.size());
        if size < WORD || !self.is_readable(start, start + size) {
            return false;
        }
        let mem = self.mem;
        let word_at = |a: u64| -> Option<u64> {
            (a.is_multiple_of(WORD) && a >= start && a + WORD <= start + size)
                .then(|| mem.block_word(a))
        };
        let first = word_at(start).unwrap_or(0);
        if w == start + 3 * WORD {
            if let Some(capacity) = word_at(start + WORD) {
                if 3 * WORD + capacity.wrapping_add(1) == size && first <= capacity {
                    return true; // std::string
                }
            }
        }
        if w == start + WORD
            && first > 0
            && (size - WORD == first || (size - WORD).is_multiple_of(first))
        {
            return true; // length64, new[]
        }
        let is_vtable = |v: u64| {
            v.is_multiple_of(WORD) && v >= 4096 && {
                let k = self.rodata.partition_point(|r| r.0 <= v);
                k > 0 && v < self.rodata[k - 1].1
            }
        };
        word_at(w).is_some_and(|inner| is_vtable(inner) && is_vtable(first)) // multiple inheritance
    }

    /// Marks a block as reachable from a root (the loader's own allocations).
    pub fn root_block(&mut self, i: usize) {
        if self.state[i] != REACHABLE {
            self.state[i] = REACHABLE;
            self.push(i);
        }
    }

    fn is_readable(&mut self, lo: u64, hi: u64) -> bool {
        if let Some(&(a, b)) = self.readable.get(self.last_readable) {
            if lo >= a && hi <= b {
                return true;
            }
        }
        let k = self.readable.partition_point(|r| r.0 <= lo);
        match k.checked_sub(1) {
            Some(j) if hi <= self.readable[j].1 => {
                self.last_readable = j;
                true
            }
            _ => false,
        }
    }

    /// Calls `f` on every aligned word inside block `i`.
    fn block_words(&mut self, i: usize, mut f: impl FnMut(&mut Self, u64)) {
        let b = self.index.blocks[i];
        let (lo, hi) = (b.addr(), b.addr() + (b.size() & !7));
        if hi <= lo {
            return;
        }
        let readable = self.is_readable(lo, hi);
        let mem = self.mem;
        mem.block_words(lo, hi, readable, |w| f(self, w));
    }

    /// Follows everything pushed so far.
    pub fn propagate(&mut self) {
        while let Some(i) = self.stack.pop() {
            let definite = self.state[i as usize] == REACHABLE;
            self.block_words(i as usize, |m, w| m.word(w, definite));
        }
    }

    /// Groups the unreached blocks into cliques (see the module comment).
    pub fn cliques(&mut self) {
        for leader in 0..self.state.len() {
            if self.state[leader] != UNREACHED {
                continue;
            }
            self.push(leader);
            while let Some(j) = self.stack.pop() {
                self.block_words(j as usize, |m, w| {
                    if let Some((k, _)) = m.index.find(w) {
                        if m.state[k] == UNREACHED && k != leader {
                            m.push(k);
                            m.indirect[leader] += m.index.blocks[k].size() + m.indirect[k];
                            m.indirect[k] = 0;
                            m.state[k] = INDIRECT;
                        }
                    }
                });
            }
        }
    }

    /// The verdict on block `i` (after `cliques`).
    pub fn verdict(&self, i: usize) -> Verdict {
        match self.state[i] {
            REACHABLE => Verdict::StillReachable,
            POSSIBLE => Verdict::PossiblyLost,
            INDIRECT => Verdict::IndirectlyLost,
            _ => Verdict::DefinitelyLost,
        }
    }
}

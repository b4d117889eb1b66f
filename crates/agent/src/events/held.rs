//! The locks a thread holds, as production mode keeps them: a short stack
//! per thread, pushed and popped without an event, and a direct-mapped
//! cache of the lock-order pairs (held site, acquired site) the thread has
//! already recorded. See `production_sync.rs` for what is recorded when.

use trapline_trace::{LockKind, LockMode, LockOp};

/// Locks tracked per thread; deeper nesting is not tracked (counted in
/// `untracked`).
pub const HELD_MAX: usize = 8;
/// Lock-order pairs remembered per thread (a pair evicted by another is
/// recorded again when it recurs).
const PAIR_SLOTS: usize = 64;

/// What a hold is, in one byte: the lock's kind (3 bits; `MUTEX`: a
/// mutex whose type is read when the hold is recorded, which the hot path
/// spares), its mode (1), how it was asked for (2), and whether the trace
/// has its acquisition (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold(u8);

/// The kind field's value for a mutex of a type not yet read.
const MUTEX: u8 = 7;
const SHARED: u8 = 1 << 3;
const OP_SHIFT: u8 = 4;
const RECORDED: u8 = 1 << 7;

impl Hold {
    /// A hold of a mutex (of any type), exclusive.
    #[inline(always)]
    pub const fn mutex(op: LockOp) -> Hold {
        Hold(MUTEX | (op as u8) << OP_SHIFT)
    }

    #[inline(always)]
    pub const fn of(kind: LockKind, mode: LockMode, op: LockOp) -> Hold {
        let shared = if matches!(mode, LockMode::Shared) {
            SHARED
        } else {
            0
        };
        Hold(kind as u8 | shared | (op as u8) << OP_SHIFT)
    }

    /// The lock's kind, or None for a mutex of a type not yet read.
    pub fn kind(self) -> Option<LockKind> {
        Some(match self.0 & 7 {
            0 => LockKind::Mutex,
            1 => LockKind::MutexRecursive,
            2 => LockKind::MutexErrorCheck,
            3 => LockKind::MutexAdaptive,
            4 => LockKind::RwLock,
            5 => LockKind::Spin,
            6 => LockKind::Unknown,
            _ => return None,
        })
    }

    pub fn mode(self) -> LockMode {
        match self.0 & SHARED {
            0 => LockMode::Exclusive,
            _ => LockMode::Shared,
        }
    }

    pub fn op(self) -> LockOp {
        match (self.0 >> OP_SHIFT) & 3 {
            0 => LockOp::Blocking,
            1 => LockOp::Try,
            2 => LockOp::Timed,
            _ => LockOp::CondWait,
        }
    }

    #[inline(always)]
    pub fn recorded(self) -> bool {
        self.0 & RECORDED != 0
    }

    pub fn with_recorded(self, recorded: bool) -> Hold {
        match recorded {
            true => Hold(self.0 | RECORDED),
            false => Hold(self.0 & !RECORDED),
        }
    }
}

/// The locks this thread holds, innermost last, in parallel arrays (the
/// hot path touches the address and site of one entry).
pub struct HeldLocks {
    addrs: [u64; HELD_MAX],
    /// The return address of the call that acquired each: its site.
    rets: [u64; HELD_MAX],
    holds: [Hold; HELD_MAX],
    len: usize,
    pairs: [u64; PAIR_SLOTS],
    /// Acquisitions not tracked because `HELD_MAX` locks were held.
    pub untracked: u64,
}

impl HeldLocks {
    pub const fn new() -> Self {
        HeldLocks {
            addrs: [0; HELD_MAX],
            rets: [0; HELD_MAX],
            holds: [Hold(0); HELD_MAX],
            len: 0,
            pairs: [0; PAIR_SLOTS],
            untracked: 0,
        }
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The i-th lock held (outermost first): address, site, hold.
    pub fn get(&self, i: usize) -> (u64, u64, Hold) {
        (self.addrs[i], self.rets[i], self.holds[i])
    }

    pub fn set_recorded(&mut self, i: usize, recorded: bool) {
        self.holds[i] = self.holds[i].with_recorded(recorded);
    }

    /// Adds a lock now held; false if the stack is full (it is then not
    /// tracked, nor is its release).
    #[inline(always)]
    pub fn push(&mut self, addr: u64, ret: u64, hold: Hold) -> bool {
        let n = self.len;
        if n == HELD_MAX {
            self.untracked += 1;
            return false;
        }
        self.addrs[n] = addr;
        self.rets[n] = ret;
        self.holds[n] = hold;
        self.len = n + 1;
        true
    }

    /// Removes the latest hold of `addr` (locks are mostly released in
    /// the reverse order), returning it; None if it is not tracked.
    #[inline(always)]
    pub fn pop(&mut self, addr: u64) -> Option<Hold> {
        let n = self.len;
        if n != 0 && self.addrs[n - 1] == addr {
            self.len = n - 1;
            return Some(self.holds[n - 1]);
        }
        self.pop_inner(addr)
    }

    #[cold]
    fn pop_inner(&mut self, addr: u64) -> Option<Hold> {
        let i = self.position(addr)?;
        let hold = self.holds[i];
        let n = self.len;
        self.addrs.copy_within(i + 1..n, i);
        self.rets.copy_within(i + 1..n, i);
        self.holds.copy_within(i + 1..n, i);
        self.len = n - 1;
        Some(hold)
    }

    /// The index of the latest hold of `addr`, if tracked.
    pub fn position(&self, addr: u64) -> Option<usize> {
        self.addrs[..self.len].iter().rposition(|&a| a == addr)
    }

    /// Whether every pair (held site, `ret`) is already recorded in trace
    /// generation `gen`.
    #[inline(always)]
    pub fn pairs_known(&self, ret: u64, gen: u32) -> bool {
        self.rets[..self.len].iter().all(|&held| {
            let key = pair_key(held, ret, gen);
            self.pairs[slot(key)] == key
        })
    }

    /// Remembers every pair (held site, `ret`) as recorded.
    pub fn note_pairs(&mut self, ret: u64, gen: u32) {
        for i in 0..self.len {
            let key = pair_key(self.rets[i], ret, gen);
            self.pairs[slot(key)] = key;
        }
    }

    /// After a fork, in the child: the holds carry over, as the locks do,
    /// but what was recorded of them and the pairs are in the parent's trace.
    pub fn forked(&mut self) {
        self.pairs = [0; PAIR_SLOTS];
        for h in &mut self.holds[..self.len] {
            *h = h.with_recorded(false);
        }
    }
}

impl Default for HeldLocks {
    fn default() -> Self {
        Self::new()
    }
}

/// The identity of a pair of sites in one trace generation (never 0, the
/// empty slot).
#[inline(always)]
fn pair_key(held: u64, acquired: u64, gen: u32) -> u64 {
    (held.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ acquired.rotate_left(32) ^ u64::from(gen))
        .wrapping_mul(0xD6E8_FEB8_6659_FD93)
        | 1
}

#[inline(always)]
fn slot(key: u64) -> usize {
    (key >> 58) as usize % PAIR_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_pop_in_any_order_and_pairs_are_remembered_per_generation() {
        let mut h = HeldLocks::new();
        let m = Hold::mutex(LockOp::Blocking);
        assert!(h.push(0x10, 0x400, m));
        assert!(h.push(0x20, 0x500, m.with_recorded(true)));
        assert!(!h.pairs_known(0x600, 1));
        h.note_pairs(0x600, 1);
        assert!(h.pairs_known(0x600, 1));
        assert!(!h.pairs_known(0x600, 2));
        assert_eq!(h.pop(0x10), Some(m));
        assert_eq!(h.len(), 1);
        assert_eq!(h.pop(0x10), None);
        assert!(h.pop(0x20).is_some_and(Hold::recorded));
        assert!(h.is_empty());
        for i in 0..HELD_MAX as u64 {
            assert!(h.push(i + 1, 0x400, m));
        }
        assert!(!h.push(0x99, 0x400, m));
        assert_eq!(h.untracked, 1);
    }

    #[test]
    fn a_hold_keeps_its_kind_mode_and_op() {
        let h = Hold::of(LockKind::RwLock, LockMode::Shared, LockOp::Timed);
        assert_eq!(h.kind(), Some(LockKind::RwLock));
        assert_eq!(h.mode(), LockMode::Shared);
        assert_eq!(h.op(), LockOp::Timed);
        assert!(!h.recorded());
        let m = Hold::mutex(LockOp::CondWait).with_recorded(true);
        assert_eq!(
            (m.kind(), m.mode(), m.op()),
            (None, LockMode::Exclusive, LockOp::CondWait)
        );
        assert!(m.recorded());
    }
}

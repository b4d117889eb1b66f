//! Who holds which pthread lock, as the replay's trapped calls tell it.
//!
//! The agent asks the C library (a trylock before each blocking
//! acquisition) whether a lock is busy; the replay cannot call into the
//! guest, but it sees every acquisition and release the program makes
//! through the pthread functions, in the order the guest ran them, so it
//! keeps the holders itself and answers the same question from them.

use std::collections::HashMap;

use trapline_trace::{LockKind, LockMode};

/// The holders of one lock.
#[derive(Default)]
struct Holders {
    /// The exclusive holder and how many times it holds the lock (a
    /// recursive mutex).
    writer: Option<(u32, u32)>,
    /// Shared holders (an rwlock's readers) and their counts.
    readers: HashMap<u32, u32>,
}

/// What an acquisition found at its call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AtCall {
    /// The lock could be taken at once: a trylock would have succeeded.
    Free,
    /// Another holder has it (or, for a timed lock, this thread): the
    /// thread waits, a contended acquisition.
    Busy,
    /// A blocking lock of a non-recursive mutex this thread holds.
    Relock,
}

#[derive(Default)]
pub struct Locks {
    kinds: HashMap<u64, LockKind>,
    held: HashMap<u64, Holders>,
}

impl Locks {
    /// Learns a mutex's kind from its kind word.
    pub fn learn_mutex(&mut self, addr: u64, kind_word: u64) -> LockKind {
        let kind = LockKind::of_glibc_mutex(kind_word as u32 as i32);
        self.kinds.insert(addr, kind);
        kind
    }

    /// The kind last learnt for a mutex (a condition wait's, whose mutex
    /// is not the peeked argument).
    pub fn mutex_kind(&self, addr: u64) -> LockKind {
        self.kinds.get(&addr).copied().unwrap_or(LockKind::Mutex)
    }

    /// What a blocking or timed acquisition by `tid` finds.
    pub fn at_call(
        &self,
        tid: u32,
        addr: u64,
        kind: LockKind,
        mode: LockMode,
        blocking: bool,
    ) -> AtCall {
        let Some(h) = self.held.get(&addr) else {
            return AtCall::Free;
        };
        match (mode, h.writer) {
            (_, Some((owner, _))) if owner == tid && kind.is_recursive() => AtCall::Free,
            (_, Some((owner, _)))
                if owner == tid
                    && blocking
                    && kind != LockKind::RwLock
                    && kind != LockKind::Spin =>
            {
                AtCall::Relock
            }
            (_, Some(_)) => AtCall::Busy,
            (LockMode::Exclusive, None) if !h.readers.is_empty() => AtCall::Busy,
            _ => AtCall::Free,
        }
    }

    /// Whether any thread holds the lock.
    pub fn held(&self, addr: u64) -> bool {
        self.held.contains_key(&addr)
    }

    /// Whether `tid` holds the lock exclusively.
    pub fn held_by(&self, tid: u32, addr: u64) -> bool {
        self.held
            .get(&addr)
            .and_then(|h| h.writer)
            .is_some_and(|(owner, _)| owner == tid)
    }

    pub fn acquired(&mut self, tid: u32, addr: u64, mode: LockMode) {
        let h = self.held.entry(addr).or_default();
        match mode {
            LockMode::Exclusive => match &mut h.writer {
                Some((owner, n)) if *owner == tid => *n += 1,
                w => *w = Some((tid, 1)),
            },
            LockMode::Shared => *h.readers.entry(tid).or_default() += 1,
        }
    }

    /// `tid` releases the lock: its exclusive hold if it has one, else one
    /// of its shared holds, else (an unlock by another thread) the
    /// exclusive holder's.
    pub fn released(&mut self, tid: u32, addr: u64) {
        let Some(h) = self.held.get_mut(&addr) else {
            return;
        };
        if let Some((owner, n)) = &mut h.writer {
            if *owner == tid || !h.readers.contains_key(&tid) {
                *n -= 1;
                if *n == 0 {
                    h.writer = None;
                }
            }
        } else if let Some(n) = h.readers.get_mut(&tid) {
            *n -= 1;
            if *n == 0 {
                h.readers.remove(&tid);
            }
        }
        if h.writer.is_none() && h.readers.is_empty() {
            self.held.remove(&addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_held_by_another_thread_is_busy_and_by_this_one_a_relock() {
        let mut l = Locks::default();
        let m = 0x1000;
        assert_eq!(l.learn_mutex(m, 0), LockKind::Mutex);
        l.acquired(1, m, LockMode::Exclusive);
        assert_eq!(
            l.at_call(2, m, LockKind::Mutex, LockMode::Exclusive, true),
            AtCall::Busy
        );
        assert_eq!(
            l.at_call(1, m, LockKind::Mutex, LockMode::Exclusive, true),
            AtCall::Relock
        );
        // A timed lock of a held mutex waits for its deadline.
        assert_eq!(
            l.at_call(1, m, LockKind::Mutex, LockMode::Exclusive, false),
            AtCall::Busy
        );
        l.released(1, m);
        assert_eq!(
            l.at_call(2, m, LockKind::Mutex, LockMode::Exclusive, true),
            AtCall::Free
        );
    }

    #[test]
    fn a_recursive_mutex_is_free_to_its_holder_until_its_last_release() {
        let mut l = Locks::default();
        let m = 0x2000;
        assert_eq!(l.learn_mutex(m, 1), LockKind::MutexRecursive);
        let k = LockKind::MutexRecursive;
        l.acquired(1, m, LockMode::Exclusive);
        assert_eq!(l.at_call(1, m, k, LockMode::Exclusive, true), AtCall::Free);
        l.acquired(1, m, LockMode::Exclusive);
        l.released(1, m);
        assert_eq!(l.at_call(2, m, k, LockMode::Exclusive, true), AtCall::Busy);
        l.released(1, m);
        assert_eq!(l.at_call(2, m, k, LockMode::Exclusive, true), AtCall::Free);
    }

    #[test]
    fn readers_share_an_rwlock_and_keep_a_writer_waiting() {
        let mut l = Locks::default();
        let r = 0x3000;
        let k = LockKind::RwLock;
        l.acquired(1, r, LockMode::Shared);
        assert_eq!(l.at_call(2, r, k, LockMode::Shared, true), AtCall::Free);
        l.acquired(2, r, LockMode::Shared);
        assert_eq!(l.at_call(3, r, k, LockMode::Exclusive, true), AtCall::Busy);
        l.released(1, r);
        l.released(2, r);
        assert_eq!(l.at_call(3, r, k, LockMode::Exclusive, true), AtCall::Free);
        l.acquired(3, r, LockMode::Exclusive);
        assert_eq!(l.at_call(1, r, k, LockMode::Shared, true), AtCall::Busy);
        assert!(l.held_by(3, r));
    }

    #[test]
    fn an_unknown_kind_word_is_no_mutex() {
        let mut l = Locks::default();
        assert_eq!(l.learn_mutex(8, 0x7fff_0000), LockKind::Unknown);
        // Only the low 32 bits are the kind word.
        assert_eq!(
            l.learn_mutex(8, 0xdead_0000_0000_0002),
            LockKind::MutexErrorCheck
        );
    }
}

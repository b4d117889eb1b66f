//! Replay of lock ownership, shared by `locks` and `deadlocks`: which thread
//! holds which lock in which mode, which thread waits for which lock, and the
//! misuse that the replay itself reveals (unlocking a lock the thread does not
//! hold, destroying a held lock, a thread ending while holding locks) next to
//! the misuse the agent saw (self-deadlock, calls the C library refused).
//!
//! A lock is identified by its address and a generation that a destroy
//! advances, so a heap mutex freed and another one created at the same
//! address are two locks.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use trapline_trace::{Event, LockEvent, LockKind, LockMisuse, LockMode, LockOp};

use crate::event_class::classes;
use crate::index::MergedEvent;
use crate::index_file::{self, marks, HeapStep, IndexFile, Learned, StackUse};
use crate::replay::AddrTable;
use crate::report::{serialize_hex, FrameReport, StackSymbolizer};

/// A lock: its address and how many times that address was destroyed before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockId {
    pub addr: u64,
    pub gen: u32,
}

/// A lock one thread holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub lock: LockId,
    pub kind: LockKind,
    pub mode: LockMode,
    /// Stack of the acquisition.
    pub stack: u32,
    /// Time of the acquisition.
    pub time: u64,
    /// Nested acquisitions of a recursive mutex or repeated read locks.
    pub depth: u32,
    pub op: LockOp,
    /// A misuse of this hold was reported already (destroyed while held, a
    /// self-deadlock): its thread's or the process's end reports no more.
    pub reported: bool,
}

/// A blocking request not (yet) followed by its acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub lock: LockId,
    pub kind: LockKind,
    pub mode: LockMode,
    pub stack: u32,
    pub time: u64,
}

/// A pthread_join not (yet) returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingJoin {
    /// The thread joined (tid; 0 if it had not started when joined).
    pub joined: u32,
    pub stack: u32,
    pub time: u64,
}

#[derive(Default)]
struct ThreadLocks {
    held: Vec<Held>,
    pending: Option<Pending>,
    joining: Option<PendingJoin>,
    /// Addresses this thread used as a destroyed, freed or unknown lock
    /// (reported) and has not unlocked since: that unlock is part of the use.
    invalid_uses: Vec<u64>,
    /// The address of this thread's last release, and whether a report
    /// covers it already (unlock_not_held, or the unlock of an invalid use):
    /// the C library's refusal of that unlock that follows adds nothing.
    last_release: Option<(u64, bool)>,
}

/// Linux's EDEADLK and EINVAL, as the C library returns them.
const EDEADLK: i32 = 35;
const EINVAL: i32 = 22;

/// What an applied lock event did.
pub enum Applied {
    /// The thread now holds the lock. `nested`: it held it already (a
    /// recursive mutex or another read hold), so nothing new is ordered.
    Acquired { held: Held, nested: bool },
    /// The thread gave the lock up; `held` is the acquisition it ends (None
    /// when the thread did not hold it: an error was recorded).
    Released { lock: LockId, held: Option<Held> },
    /// Anything else.
    Other,
}

/// Misuse of locks, one occurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Misuse {
    pub kind: MisuseKind,
    pub tid: u32,
    pub lock: LockId,
    pub lock_kind: LockKind,
    /// Where the misuse happened (0 when unknown: a thread's end).
    pub stack: u32,
    /// Where the lock involved was taken, destroyed or freed (see
    /// `MisuseKind::context`; 0 when not applicable).
    pub held_stack: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MisuseKind {
    UnlockNotHeld,
    SelfDeadlock,
    Refused,
    DestroyLocked,
    ThreadEndHolding,
    MainEndHolding,
    UseAfterDestroy,
    UseAfterFree,
    UnknownLock,
}

impl MisuseKind {
    pub fn name(self) -> &'static str {
        match self {
            MisuseKind::UnlockNotHeld => "unlock_not_held",
            MisuseKind::SelfDeadlock => "self_deadlock",
            MisuseKind::Refused => "refused_by_libc",
            MisuseKind::DestroyLocked => "destroy_locked",
            MisuseKind::ThreadEndHolding => "thread_end_holding",
            MisuseKind::MainEndHolding => "main_end_holding",
            MisuseKind::UseAfterDestroy => "use_after_destroy",
            MisuseKind::UseAfterFree => "use_after_free",
            MisuseKind::UnknownLock => "unknown_lock",
        }
    }

    /// What `held_stack` shows: `taken` (where the lock involved was
    /// acquired), `destroyed` or `freed`.
    pub fn context(self) -> &'static str {
        match self {
            MisuseKind::UseAfterDestroy => "destroyed",
            MisuseKind::UseAfterFree => "freed",
            _ => "taken",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            MisuseKind::UnlockNotHeld => "unlock of a lock the thread does not hold",
            MisuseKind::SelfDeadlock => {
                "re-lock of a non-recursive mutex the thread holds (self-deadlock: the thread blocks forever)"
            }
            MisuseKind::Refused => {
                "re-lock of a held error-checking mutex or rwlock, refused by the C library (EDEADLK)"
            }
            MisuseKind::DestroyLocked => "destroy of a locked lock",
            MisuseKind::ThreadEndHolding => "a thread ended while holding a lock",
            MisuseKind::MainEndHolding => {
                "the process ended (return from main, exit, or a signal) while its main thread held a lock"
            }
            MisuseKind::UseAfterDestroy => {
                "use of a lock after pthread_*_destroy (without a new init)"
            }
            MisuseKind::UseAfterFree => {
                "use of a lock whose memory was freed (and not allocated again)"
            }
            MisuseKind::UnknownLock => {
                "use of memory that holds no known lock (its type word is none of the C library's: never initialised, or overwritten)"
            }
        }
    }
}

/// The maps a pass touches per event: aHash, not SipHash, whose hashing
/// was a fifth of a `deadlocks` pass on memcached's trace.
type FastHashMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// The replayed state of every lock and thread.
#[derive(Default)]
pub struct LockState {
    gens: FastHashMap<u64, u32>,
    /// The main thread (the process's pid), which has no `ThreadEnd`.
    main_tid: u32,
    /// The trace's `End` was seen (the `Process` record may come after it
    /// in the merge: the process's end is judged once both are known).
    ended: bool,
    /// Every lock address seen, for the blocks freed around them.
    lock_addrs: BTreeSet<u64>,
    /// Live heap blocks: address -> size, to find the locks a free frees,
    /// in the heap replay's compact table: a block costs 20 to 30 bytes and
    /// growing never doubles the whole map, which a service's millions of
    /// live blocks need in a reader with a memory limit. Empty when
    /// replaying from an index: its release steps carry the sizes.
    blocks: AddrTable<u64>,
    /// The place of the event being applied (`at`): chunk << 32 | seq.
    place: u64,
    /// The heap events to apply, by place, with the parts of each
    /// ([`heap_parts`]) and the size of the block each releases, when an
    /// earlier read learned them; None: every heap event is applied, and
    /// those that mattered are noted in `steps`.
    replaying: Option<FastHashMap<u64, (u8, u64)>>,
    /// The heap events that changed what the replay knows, by place, with
    /// their parts and the size of the block each releases.
    steps: FastHashMap<u64, (u8, u64)>,
    /// The stacks a lock report may name, for the index file's marks.
    stack_use: StackUse,
    /// Lock address -> where it was destroyed and what kind it was (until
    /// an init).
    destroyed: FastHashMap<u64, (u32, LockKind)>,
    /// Lock address -> where its memory was freed (until allocated again).
    freed: FastHashMap<u64, u32>,
    threads: FastHashMap<u32, ThreadLocks>,
    /// Misuse in order of occurrence, identical ones merged: (misuse, count).
    misuse: Vec<(Misuse, u64)>,
    misuse_index: FastHashMap<Misuse, usize>,
    /// Whether any lock event was seen.
    pub saw_lock_events: bool,
}

/// The effects of a heap event on the replay, one bit each: what an index
/// file keeps of the heap events that had any.
pub mod heap_parts {
    /// The release of a block around a known lock (or of its old block, for
    /// a `realloc`); the step keeps the block's size.
    pub const RELEASE: u8 = 1 << 0;
    /// The allocation of a block around a lock address already seen (or of
    /// the new block, for a `realloc`).
    pub const ALLOC: u8 = 1 << 1;
    /// A call of a thread waiting in pthread_join: the wait is over.
    pub const ENDS_JOIN: u8 = 1 << 2;
    pub const ALL: u8 = RELEASE | ALLOC | ENDS_JOIN;
}

/// The event classes a lock replay reads whatever an index file says.
pub const LOCK_CLASSES: u16 = classes::META | classes::THREAD | classes::LOCK;

impl LockState {
    /// Notes where the next event applied comes from, and what it tells of
    /// stacks: call before [`LockState::apply`] with every event a pass sees.
    pub fn at(&mut self, m: &MergedEvent) {
        self.place = u64::from(m.chunk) << 32 | u64::from(m.seq);
        if self.replaying.is_none() {
            self.stack_use.define(m.chunk, &m.event);
            if crate::event_class::class_of(&m.event) & LOCK_CLASSES != 0 {
                self.stack_use.uses(&m.event);
            }
        }
    }

    /// Whether a read needs a chunk so summarised, given what
    /// [`LockState::learned`] wrote of it.
    pub fn needs(chunk: index_file::ChunkSummary) -> bool {
        chunk.holds(LOCK_CLASSES) || chunk.marked(marks::LOCKS)
    }

    /// Applies only the heap events an earlier read found to matter, if
    /// `file` knows them.
    pub fn use_index(&mut self, file: &IndexFile) {
        if file.known() & marks::LOCK_HEAP != 0 {
            self.replaying = Some(
                file.lock_heap
                    .iter()
                    .map(|s| {
                        let place = u64::from(s.chunk) << 32 | u64::from(s.seq);
                        (place, (s.parts, s.released))
                    })
                    .collect(),
            );
        }
    }

    /// What this replay of every event learned for the index file: the
    /// heap events that mattered, and the chunks defining the stacks it
    /// may report. Nothing when it replayed from an index.
    pub fn learned(&self) -> Learned {
        if self.replaying.is_some() {
            return Learned::default();
        }
        let lock_heap: Vec<HeapStep> = {
            let mut v: Vec<HeapStep> = self
                .steps
                .iter()
                .map(|(&place, &(parts, released))| HeapStep {
                    chunk: (place >> 32) as u32,
                    seq: place as u32,
                    parts,
                    released,
                })
                .collect();
            v.sort_unstable();
            v
        };
        let mut chunk_marks = self.stack_use.marks(marks::LOCK_STACKS);
        chunk_marks.extend(lock_heap.iter().map(|s| (s.chunk, marks::LOCK_HEAP)));
        chunk_marks.sort_unstable();
        chunk_marks.dedup();
        Learned {
            known: marks::LOCKS,
            marks: chunk_marks,
            lock_heap,
        }
    }

    pub fn lock_id(&self, addr: u64) -> LockId {
        LockId {
            addr,
            gen: self.gens.get(&addr).copied().unwrap_or(0),
        }
    }

    /// The locks `tid` holds, in acquisition order.
    pub fn held(&self, tid: u32) -> &[Held] {
        self.threads.get(&tid).map_or(&[], |t| &t.held)
    }

    fn note(&mut self, m: Misuse) {
        match self.misuse_index.get(&m) {
            Some(&i) => self.misuse[i].1 += 1,
            None => {
                self.misuse_index.insert(m, self.misuse.len());
                self.misuse.push((m, 1));
            }
        }
    }

    /// Every thread's hold of `lock`: (tid, hold).
    pub fn holders(&self, lock: LockId) -> Vec<(u32, Held)> {
        let mut v: Vec<(u32, Held)> = self
            .threads
            .iter()
            .flat_map(|(&tid, t)| {
                t.held
                    .iter()
                    .filter(|h| h.lock == lock)
                    .map(move |h| (tid, *h))
            })
            .collect();
        v.sort_by_key(|(tid, _)| *tid);
        v
    }

    /// Threads waiting for a lock at this point (the end of the trace): (tid, request).
    pub fn pending(&self) -> Vec<(u32, Pending)> {
        let mut v: Vec<(u32, Pending)> = self
            .threads
            .iter()
            .filter_map(|(&tid, t)| t.pending.map(|p| (tid, p)))
            .collect();
        v.sort_by_key(|(tid, _)| *tid);
        v
    }

    /// Threads waiting in pthread_join at this point (the end of the
    /// trace): (tid, join).
    pub fn pending_joins(&self) -> Vec<(u32, PendingJoin)> {
        let mut v: Vec<(u32, PendingJoin)> = self
            .threads
            .iter()
            .filter_map(|(&tid, t)| t.joining.map(|j| (tid, j)))
            .collect();
        v.sort_by_key(|(tid, _)| *tid);
        v
    }

    /// Applies one event of thread `tid`.
    pub fn apply(&mut self, tid: u32, ev: &Event) -> Applied {
        // A thread waiting in pthread_join does nothing until the join
        // returns: any later call of its own ends the wait (a failed join
        // records none). What the end of the trace records on whichever
        // thread finishes it (a signal's handler may run on the joiner) does
        // not.
        let heap = matches!(
            ev,
            Event::Alloc { .. }
                | Event::Free { .. }
                | Event::Realloc { .. }
                | Event::AllocFailed { .. }
                | Event::Error { .. }
        );
        // From an index, only the heap events that mattered, and only their
        // parts that did: the others change nothing here.
        let (parts, released) = match &self.replaying {
            Some(steps) if heap => match steps.get(&self.place) {
                Some(&(parts, size)) => (parts, Some(size)),
                None => return Applied::Other,
            },
            _ => (heap_parts::ALL, None),
        };
        let own_call = match ev {
            Event::Lock(l) => !matches!(l, LockEvent::JoinWait { .. }),
            Event::ThreadCreate { .. } => true,
            _ => heap,
        };
        if own_call {
            let ended = self
                .threads
                .get_mut(&tid)
                .is_some_and(|t| t.joining.take().is_some());
            if ended && heap {
                self.learn(heap_parts::ENDS_JOIN);
            }
        }
        let l = match ev {
            Event::Lock(l) => l,
            Event::ThreadEnd { .. } => {
                self.thread_end(tid);
                return Applied::Other;
            }
            Event::ThreadStart { .. } => {
                // A reused tid starts with nothing held.
                self.threads.remove(&tid);
                return Applied::Other;
            }
            Event::Process(p) => {
                self.main_tid = p.pid;
                if self.ended {
                    self.process_end();
                }
                return Applied::Other;
            }
            Event::End { .. } => {
                self.ended = true;
                if self.main_tid != 0 {
                    self.process_end();
                }
                return Applied::Other;
            }
            Event::Alloc { addr, size, .. } => {
                if parts & heap_parts::ALLOC != 0 {
                    self.allocated(*addr, *size);
                }
                return Applied::Other;
            }
            Event::Free { addr, stack, .. } => {
                if parts & heap_parts::RELEASE != 0 {
                    self.released_block(*addr, *stack, released);
                }
                return Applied::Other;
            }
            Event::Realloc {
                old_addr,
                new_addr,
                size,
                stack,
                ..
            } => {
                if *old_addr != 0 && parts & heap_parts::RELEASE != 0 {
                    self.released_block(*old_addr, *stack, released);
                }
                if *new_addr != 0 && parts & heap_parts::ALLOC != 0 {
                    self.allocated(*new_addr, *size);
                }
                return Applied::Other;
            }
            _ => return Applied::Other,
        };
        if let Some(addr) = l.addr() {
            self.check_use(tid, l, addr);
        }
        self.saw_lock_events = true;
        match *l {
            LockEvent::Acquire {
                time,
                addr,
                kind,
                mode,
                op,
                stack,
                ..
            } => {
                let lock = self.lock_id(addr);
                let t = self.threads.entry(tid).or_default();
                if t.pending.is_some_and(|p| p.lock == lock) {
                    t.pending = None;
                }
                if let Some(h) = t.held.iter_mut().find(|h| h.lock == lock && h.mode == mode) {
                    h.depth += 1;
                    return Applied::Acquired {
                        held: *h,
                        nested: true,
                    };
                }
                let held = Held {
                    lock,
                    kind,
                    mode,
                    stack,
                    time,
                    depth: 1,
                    op,
                    reported: false,
                };
                t.held.push(held);
                Applied::Acquired {
                    held,
                    nested: false,
                }
            }
            LockEvent::Release {
                addr, kind, stack, ..
            } => {
                let lock = self.lock_id(addr);
                let t = self.threads.entry(tid).or_default();
                // An rwlock unlock releases the write hold if any, else one read hold.
                let pos = t
                    .held
                    .iter()
                    .rposition(|h| h.lock == lock && h.mode == LockMode::Exclusive)
                    .or_else(|| t.held.iter().rposition(|h| h.lock == lock));
                t.last_release = Some((addr, false));
                match pos {
                    Some(i) => {
                        let h = &mut t.held[i];
                        h.depth -= 1;
                        let held = *h;
                        if held.depth == 0 {
                            t.held.remove(i);
                        }
                        Applied::Released {
                            lock,
                            held: Some(held),
                        }
                    }
                    // The agent records a mutex release without a stack
                    // only when glibc names this thread as the owner: the
                    // lock was taken before the trace began (a fork child
                    // unlocking what its parent locked in a
                    // pthread_atfork handler), not misused.
                    None if stack == 0 && kind != LockKind::RwLock && kind != LockKind::Spin => {
                        Applied::Released { lock, held: None }
                    }
                    // A destroyed, freed or unknown lock: the unlock that
                    // follows this thread's use of it is part of that use,
                    // reported once. Any other is judged by the C library:
                    // its refusal (EINVAL) comes next (`refused_unlock`).
                    None if kind == LockKind::Unknown
                        || self.destroyed.contains_key(&addr)
                        || self.freed.contains_key(&addr) =>
                    {
                        if let Some(i) = t.invalid_uses.iter().position(|&a| a == addr) {
                            t.invalid_uses.swap_remove(i);
                            t.last_release = Some((addr, true));
                        }
                        Applied::Released { lock, held: None }
                    }
                    None => {
                        t.last_release = Some((addr, true));
                        self.note(Misuse {
                            kind: MisuseKind::UnlockNotHeld,
                            tid,
                            lock,
                            lock_kind: kind,
                            stack,
                            held_stack: 0,
                        });
                        Applied::Released { lock, held: None }
                    }
                }
            }
            LockEvent::Request {
                time,
                addr,
                kind,
                mode,
                stack,
            } => {
                let lock = self.lock_id(addr);
                self.threads.entry(tid).or_default().pending = Some(Pending {
                    lock,
                    kind,
                    mode,
                    stack,
                    time,
                });
                Applied::Other
            }
            LockEvent::Failed { addr, .. } => {
                let lock = self.lock_id(addr);
                let t = self.threads.entry(tid).or_default();
                if t.pending.is_some_and(|p| p.lock == lock) {
                    t.pending = None;
                }
                Applied::Other
            }
            LockEvent::Misuse {
                addr,
                kind,
                misuse: LockMisuse::Refused,
                errno,
                stack,
                ..
            } if errno != EDEADLK => {
                self.refused_unlock(tid, addr, kind, errno, stack);
                Applied::Other
            }
            LockEvent::Misuse {
                addr,
                kind,
                misuse,
                stack,
                ..
            } => {
                let lock = self.lock_id(addr);
                let held_stack = self
                    .held(tid)
                    .iter()
                    .find(|h| h.lock == lock)
                    .map_or(0, |h| h.stack);
                let kind_of = match misuse {
                    LockMisuse::SelfDeadlock => MisuseKind::SelfDeadlock,
                    LockMisuse::Refused => MisuseKind::Refused,
                };
                self.note(Misuse {
                    kind: kind_of,
                    tid,
                    lock,
                    lock_kind: kind,
                    stack,
                    held_stack,
                });
                // One report per misuse: the hold's end says no more.
                self.mark_reported(lock);
                if misuse == LockMisuse::SelfDeadlock {
                    // The thread now waits for itself.
                    self.threads.entry(tid).or_default().pending = Some(Pending {
                        lock,
                        kind,
                        mode: LockMode::Exclusive,
                        stack,
                        time: l.time(),
                    });
                }
                Applied::Other
            }
            LockEvent::Destroy {
                addr, kind, stack, ..
            } => {
                let lock = self.lock_id(addr);
                let holders = self.holders(lock);
                for (_, h) in &holders {
                    self.note(Misuse {
                        kind: MisuseKind::DestroyLocked,
                        tid,
                        lock,
                        lock_kind: kind,
                        stack,
                        held_stack: h.stack,
                    });
                }
                self.mark_reported(lock);
                // glibc refuses to destroy a held lock (EBUSY): it lives on.
                if holders.is_empty() {
                    *self.gens.entry(addr).or_default() += 1;
                    self.destroyed.insert(addr, (stack, kind));
                }
                Applied::Other
            }
            LockEvent::Init { addr, .. } => {
                self.destroyed.remove(&addr);
                self.freed.remove(&addr);
                for t in self.threads.values_mut() {
                    t.invalid_uses.retain(|&a| a != addr);
                }
                Applied::Other
            }
            LockEvent::Exit { .. } => Applied::Other,
            LockEvent::JoinWait {
                time,
                joined,
                stack,
            } => {
                self.threads.entry(tid).or_default().joining = Some(PendingJoin {
                    joined,
                    stack,
                    time,
                });
                Applied::Other
            }
            LockEvent::Join { .. } | LockEvent::Detach { .. } => Applied::Other,
        }
    }

    /// The C library refused `tid`'s unlock of `addr` with `errno` (the
    /// agent records the refusal after the unlock's release): EINVAL for a
    /// mutex it does not recognise (destroyed, or never initialised: glibc
    /// accepts zeroed memory as a default mutex), EPERM for an
    /// error-checking or recursive one the thread does not own. Reported as
    /// what the replay knows of the address, unless a report covers the
    /// unlock already.
    fn refused_unlock(&mut self, tid: u32, addr: u64, kind: LockKind, errno: i32, stack: u32) {
        let t = self.threads.entry(tid).or_default();
        let covered = t.last_release.take() == Some((addr, true));
        if covered {
            return;
        }
        let found = if errno == EINVAL {
            self.invalid(addr, kind, true)
        } else {
            Some((MisuseKind::UnlockNotHeld, 0, kind))
        };
        if let Some(found) = found {
            self.note_at(tid, addr, stack, found);
        }
    }

    /// What using `addr` as a lock of `kind` misuses, if anything, as
    /// (misuse, the stack it names, the lock's kind): a destroyed lock, a
    /// freed one, or memory that is none (`not_a_lock`: its type word says
    /// so, or the C library refused it).
    fn invalid(
        &self,
        addr: u64,
        kind: LockKind,
        not_a_lock: bool,
    ) -> Option<(MisuseKind, u32, LockKind)> {
        if let Some(&(at, was)) = self.destroyed.get(&addr) {
            Some((MisuseKind::UseAfterDestroy, at, was))
        } else if let Some(&at) = self.freed.get(&addr) {
            Some((MisuseKind::UseAfterFree, at, kind))
        } else {
            not_a_lock.then_some((MisuseKind::UnknownLock, 0, kind))
        }
    }

    /// Notes misuse `found` (as `invalid` gives it) by `tid` of `addr` at `stack`.
    fn note_at(&mut self, tid: u32, addr: u64, stack: u32, found: (MisuseKind, u32, LockKind)) {
        let (kind, held_stack, lock_kind) = found;
        let lock = self.lock_id(addr);
        self.note(Misuse {
            kind,
            tid,
            lock,
            lock_kind,
            stack,
            held_stack,
        });
    }

    fn thread_end(&mut self, tid: u32) {
        let Some(t) = self.threads.remove(&tid) else {
            return;
        };
        for h in t.held.iter().filter(|h| !h.reported) {
            self.note(Misuse {
                kind: MisuseKind::ThreadEndHolding,
                tid,
                lock: h.lock,
                lock_kind: h.kind,
                stack: 0,
                held_stack: h.stack,
            });
        }
    }

    /// The process ended: a lock its main thread still holds is reported
    /// (other threads are ended by the exit wherever they are).
    fn process_end(&mut self) {
        let tid = self.main_tid;
        let held: Vec<Held> = self.held(tid).to_vec();
        for h in held.iter().filter(|h| !h.reported) {
            self.note(Misuse {
                kind: MisuseKind::MainEndHolding,
                tid,
                lock: h.lock,
                lock_kind: h.kind,
                stack: 0,
                held_stack: h.stack,
            });
        }
        self.mark_reported_all(tid);
    }

    /// Marks every hold of `lock` as reported.
    fn mark_reported(&mut self, lock: LockId) {
        for t in self.threads.values_mut() {
            for h in t.held.iter_mut().filter(|h| h.lock == lock) {
                h.reported = true;
            }
        }
    }

    fn mark_reported_all(&mut self, tid: u32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            for h in &mut t.held {
                h.reported = true;
            }
        }
    }

    /// A lock event on `addr`: notes a use of a destroyed, freed or unknown
    /// lock (each site once, counted).
    fn check_use(&mut self, tid: u32, l: &LockEvent, addr: u64) {
        self.lock_addrs.insert(addr);
        // The attempt to take it is the misuse; its unlock is part of it.
        let (kind, stack) = match *l {
            LockEvent::Acquire { kind, stack, .. }
            | LockEvent::Request { kind, stack, .. }
            | LockEvent::Failed { kind, stack, .. } => (kind, stack),
            _ => return,
        };
        // glibc's destroy writes an invalid type word: a destroyed mutex
        // is reported as destroyed, not as unknown.
        if let Some(found) = self.invalid(addr, kind, kind == LockKind::Unknown) {
            let t = self.threads.entry(tid).or_default();
            if !t.invalid_uses.contains(&addr) {
                t.invalid_uses.push(addr);
            }
            self.note_at(tid, addr, stack, found);
        }
    }

    /// Notes that the event being applied mattered, by `part`, when the
    /// replay applies every event.
    fn learn(&mut self, part: u8) {
        self.learn_release(part, 0);
    }

    /// [`LockState::learn`], for a release of a block of `size` bytes.
    fn learn_release(&mut self, part: u8, size: u64) {
        if self.replaying.is_none() {
            let step = self.steps.entry(self.place).or_default();
            step.0 |= part;
            step.1 = step.1.max(size);
        }
    }

    fn allocated(&mut self, addr: u64, size: u64) {
        if self.replaying.is_none() {
            self.blocks.insert(addr, size);
        }
        let mut around_lock = false;
        for a in self.lock_addrs.range(addr..addr.saturating_add(size)) {
            self.freed.remove(a);
            around_lock = true;
        }
        if around_lock {
            self.learn(heap_parts::ALLOC);
        }
    }

    /// The release of the block at `addr`: of `replayed_size` bytes when
    /// replaying from an index, else of the size it was allocated with.
    fn released_block(&mut self, addr: u64, stack: u32, replayed_size: Option<u64>) {
        let Some(size) = replayed_size.or_else(|| self.blocks.remove(addr)) else {
            return;
        };
        let mut around_lock = false;
        for &a in self.lock_addrs.range(addr..addr.saturating_add(size)) {
            self.freed.insert(a, stack);
            around_lock = true;
        }
        if around_lock {
            // The step keeps the size, so a later read need not replay
            // the block's allocation.
            self.learn_release(heap_parts::RELEASE, size);
            if self.replaying.is_none() {
                self.stack_use.use_id(stack);
            }
        }
    }

    /// The misuse found, symbolized, in order of first occurrence.
    pub(crate) fn errors(
        &self,
        stacks: &HashMap<u32, Vec<u64>>,
        sym: &mut StackSymbolizer,
    ) -> Vec<LockError> {
        self.misuse
            .iter()
            .map(|(m, count)| LockError {
                kind: m.kind.name(),
                description: m.kind.describe(),
                thread: m.tid,
                lock: m.lock.addr,
                lock_kind: m.lock_kind.name(),
                count: *count,
                stack: sym.stack(stacks, m.stack),
                held_stack: sym.stack(stacks, m.held_stack),
                context: m.kind.context(),
            })
            .collect()
    }
}

/// One kind of lock misuse at one place (JSON `errors[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockError {
    /// `unlock_not_held`, `self_deadlock`, `refused_by_libc`,
    /// `destroy_locked`, `thread_end_holding`, `main_end_holding`,
    /// `use_after_destroy`, `use_after_free` or `unknown_lock`.
    pub kind: &'static str,
    /// One sentence.
    pub description: &'static str,
    /// Thread (tid) that misused the lock (first occurrence).
    pub thread: u32,
    /// Address of the lock.
    #[serde(serialize_with = "serialize_hex")]
    pub lock: u64,
    /// Kind of the lock (`mutex`, `recursive_mutex`, `errorcheck_mutex`,
    /// `adaptive_mutex`, `rwlock`, `spinlock`, `unknown`).
    pub lock_kind: &'static str,
    /// Times seen.
    pub count: u64,
    /// Where it happened (empty for a thread's end).
    pub stack: Vec<FrameReport>,
    /// Where the lock involved was taken, destroyed or freed (`context`;
    /// empty when not applicable).
    pub held_stack: Vec<FrameReport>,
    /// What `held_stack` shows: `taken`, `destroyed` or `freed`.
    pub context: &'static str,
}

/// How a lock's mode is named in reports: rwlocks have `read` and `write`
/// holds, every other lock is `exclusive`.
pub fn mode_name(kind: LockKind, mode: LockMode) -> &'static str {
    match (kind, mode) {
        (LockKind::RwLock, m) => m.name(),
        _ => "exclusive",
    }
}

/// Text lines for the errors section of a report.
pub fn errors_text(out: &mut String, p: &str, errors: &[LockError]) {
    use std::fmt::Write as _;
    if errors.is_empty() {
        return;
    }
    writeln!(out, "{p}ERRORS ({}):", errors.len()).unwrap();
    for e in errors {
        writeln!(
            out,
            "{p}  {}: {} ({} {:#x}, thread {}, {} time{})",
            e.kind,
            e.description,
            e.lock_kind,
            e.lock,
            e.thread,
            e.count,
            if e.count == 1 { "" } else { "s" }
        )
        .unwrap();
        stack_text(out, p, "    ", &e.stack);
        if !e.held_stack.is_empty() {
            let what = match e.context {
                "destroyed" => "the lock was destroyed at:",
                "freed" => "its memory was freed at:",
                _ => "the lock was taken at:",
            };
            writeln!(out, "{p}    {what}").unwrap();
            stack_text(out, p, "      ", &e.held_stack);
        }
    }
    writeln!(out, "{p}").unwrap();
}

/// Text lines of a stack in memcheck's style (`at`, then `by`), indented; at
/// most 12 frames.
pub fn stack_text(out: &mut String, p: &str, indent: &str, frames: &[FrameReport]) {
    use std::fmt::Write as _;
    for (i, f) in frames.iter().take(12).enumerate() {
        let word = if i == 0 { "at" } else { "by" };
        writeln!(out, "{p}{indent}{word} {}", crate::report::frame_text(f)).unwrap();
    }
    if frames.len() > 12 {
        writeln!(out, "{p}{indent}... {} more frames", frames.len() - 12).unwrap();
    }
    if frames.is_empty() {
        writeln!(out, "{p}{indent}(no stack recorded)").unwrap();
    }
}

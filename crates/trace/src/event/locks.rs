//! Lock and thread-synchronisation events (tags 64-95): what the agent
//! records around pthread mutexes, rwlocks, spinlocks, condition waits and
//! joins, and their encoding.
//!
//! An uncontended acquisition is the hot case: tag, time delta, address
//! delta, one flags byte and a stack id, usually 5 to 8 bytes. A contended
//! one adds its wait in nanoseconds.

use super::{tag, ChunkContext, DecodeError, Decoder, Encoder, Event, NoRoom};
use crate::varint::zigzag;

/// What kind of lock an event is about.
///
/// The numeric values are part of the trace format: append, never reorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockKind {
    /// A default (`PTHREAD_MUTEX_NORMAL`/`TIMED_NP`) mutex: re-locking it deadlocks.
    Mutex = 0,
    MutexRecursive = 1,
    MutexErrorCheck = 2,
    MutexAdaptive = 3,
    RwLock = 4,
    Spin = 5,
    /// A mutex whose type word is none of the C library's (memory never
    /// initialised as a mutex, or overwritten; format version 10).
    Unknown = 6,
}

impl LockKind {
    pub const ALL: [LockKind; 7] = [
        LockKind::Mutex,
        LockKind::MutexRecursive,
        LockKind::MutexErrorCheck,
        LockKind::MutexAdaptive,
        LockKind::RwLock,
        LockKind::Spin,
        LockKind::Unknown,
    ];

    pub fn from_u8(v: u8) -> Option<LockKind> {
        LockKind::ALL.get(usize::from(v)).copied()
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::MutexRecursive => "recursive_mutex",
            LockKind::MutexErrorCheck => "errorcheck_mutex",
            LockKind::MutexAdaptive => "adaptive_mutex",
            LockKind::RwLock => "rwlock",
            LockKind::Spin => "spinlock",
            LockKind::Unknown => "unknown",
        }
    }

    /// Whether the same thread may hold it more than once.
    pub fn is_recursive(self) -> bool {
        self == LockKind::MutexRecursive
    }

    /// The type of a glibc mutex from its kind word (`__kind`): the bits
    /// glibc defines are the type (0-3), robust (16), priority inherit
    /// (32) and protect (64), process-shared (128) and elision (256, 512);
    /// any other bit means the memory is not a mutex glibc made.
    #[inline]
    pub fn of_glibc_mutex(kind_word: i32) -> LockKind {
        if kind_word & !0x3f3 != 0 {
            return LockKind::Unknown;
        }
        match kind_word & 3 {
            0 => LockKind::Mutex,
            1 => LockKind::MutexRecursive,
            2 => LockKind::MutexErrorCheck,
            _ => LockKind::MutexAdaptive,
        }
    }
}

/// Exclusive (mutex, spinlock, rwlock write) or shared (rwlock read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockMode {
    Exclusive = 0,
    Shared = 1,
}

impl LockMode {
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Exclusive => "write",
            LockMode::Shared => "read",
        }
    }
}

/// How an acquisition was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockOp {
    /// lock, rdlock, wrlock, spin_lock: waits as long as it takes.
    Blocking = 0,
    /// trylock: never waits.
    Try = 1,
    /// timedlock, clocklock: gives up at a deadline.
    Timed = 2,
    /// The re-acquisition of a condition variable's mutex on wakeup.
    CondWait = 3,
}

impl LockOp {
    fn from_bits(v: u8) -> LockOp {
        match v & 3 {
            0 => LockOp::Blocking,
            1 => LockOp::Try,
            2 => LockOp::Timed,
            _ => LockOp::CondWait,
        }
    }
}

/// Misuse the agent sees at the time of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockMisuse {
    /// A thread locked a non-recursive mutex it already holds: it blocks
    /// forever (the agent flushed the trace first).
    SelfDeadlock = 1,
    /// The C library refused a call (its errno in the event): relocking a
    /// held error-checking mutex (EDEADLK), or a mutex unlock: one it does
    /// not recognise (EINVAL: destroyed or never initialised) or an
    /// error-checking or recursive one the thread does not own (EPERM).
    Refused = 2,
}

impl LockMisuse {
    pub(super) fn from_u8(v: u8) -> Option<LockMisuse> {
        match v {
            1 => Some(LockMisuse::SelfDeadlock),
            2 => Some(LockMisuse::Refused),
            _ => None,
        }
    }
}

/// A lock or thread-synchronisation event. The thread is the chunk's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockEvent {
    /// pthread_*_init.
    Init {
        time: u64,
        addr: u64,
        kind: LockKind,
        stack: u32,
    },
    /// pthread_*_destroy.
    Destroy {
        time: u64,
        addr: u64,
        kind: LockKind,
        stack: u32,
    },
    /// The lock is now held by this thread. `wait_ns` is Some for a
    /// contended acquisition (the lock was busy when asked for).
    Acquire {
        time: u64,
        addr: u64,
        kind: LockKind,
        mode: LockMode,
        op: LockOp,
        wait_ns: Option<u64>,
        stack: u32,
    },
    /// The thread released the lock (the mode of an rwlock unlock is implied).
    /// For a mutex, `stack` is 0 when the C library named this thread as its
    /// owner (the common case, recorded without a stack), so a release the
    /// trace never saw acquired is then one from before the trace began.
    Release {
        time: u64,
        addr: u64,
        kind: LockKind,
        stack: u32,
        /// Of the hold this release ends, the time the agent spent in its
        /// own hooks (a `malloc` the program made while holding the lock),
        /// estimated with the event clock's tick the way the hold itself
        /// is: `trapline locks` leaves it out of the hold (format version
        /// 12; 0 before, and for rwlocks).
        agent_ns: u64,
    },
    /// The lock was busy: the thread starts waiting. Followed by its
    /// `Acquire` or `Failed`; a request without either at the end of the
    /// trace is a thread that never got the lock.
    Request {
        time: u64,
        addr: u64,
        kind: LockKind,
        mode: LockMode,
        stack: u32,
    },
    /// An attempt that did not acquire: `errno` is EBUSY for a busy trylock,
    /// ETIMEDOUT for a timed lock that gave up, or the error returned.
    Failed {
        time: u64,
        addr: u64,
        kind: LockKind,
        mode: LockMode,
        op: LockOp,
        errno: i32,
        stack: u32,
    },
    /// Misuse detected at the time of the call.
    Misuse {
        time: u64,
        addr: u64,
        kind: LockKind,
        misuse: LockMisuse,
        errno: i32,
        stack: u32,
    },
    /// pthread_join returned: the thread `joined` (a tid, 0 if unknown) has ended.
    Join { time: u64, joined: u32, stack: u32 },
    /// pthread_join was called on thread `joined` (a tid, 0 if it had not
    /// started yet): the thread waits for it until its `Join` (or `Failed`
    /// join: none), and one still waiting at the end of the trace is part of
    /// the wait-for graph.
    JoinWait { time: u64, joined: u32, stack: u32 },
    /// pthread_detach of thread `detached` (tid, 0 if unknown).
    Detach { time: u64, detached: u32 },
    /// The thread called pthread_exit.
    Exit { time: u64, stack: u32 },
}

/// Appends `v` (< 2^14) as a one- or two-byte varint at bit `bits` of `acc`.
#[inline(always)]
fn push_varint14(acc: &mut u128, bits: &mut u32, v: u64) {
    if v < 0x80 {
        *acc |= u128::from(v) << *bits;
        *bits += 8;
    } else {
        let two = (v & 0x7f) | 0x80 | (v >> 7) << 8;
        *acc |= u128::from(two) << *bits;
        *bits += 16;
    }
}

/// Flags byte: kind (bits 0-2), mode (bit 3), op (bits 4-5), contended (bit 6).
pub(super) fn flags(kind: LockKind, mode: LockMode, op: LockOp, contended: bool) -> u8 {
    kind as u8 | (mode as u8) << 3 | (op as u8) << 4 | u8::from(contended) << 6
}

impl LockEvent {
    pub fn time(&self) -> u64 {
        match self {
            LockEvent::Init { time, .. }
            | LockEvent::Destroy { time, .. }
            | LockEvent::Acquire { time, .. }
            | LockEvent::Release { time, .. }
            | LockEvent::Request { time, .. }
            | LockEvent::Failed { time, .. }
            | LockEvent::Misuse { time, .. }
            | LockEvent::Join { time, .. }
            | LockEvent::JoinWait { time, .. }
            | LockEvent::Detach { time, .. }
            | LockEvent::Exit { time, .. } => *time,
        }
    }

    /// The lock's address, for the events about one lock.
    pub fn addr(&self) -> Option<u64> {
        match self {
            LockEvent::Init { addr, .. }
            | LockEvent::Destroy { addr, .. }
            | LockEvent::Acquire { addr, .. }
            | LockEvent::Release { addr, .. }
            | LockEvent::Request { addr, .. }
            | LockEvent::Failed { addr, .. }
            | LockEvent::Misuse { addr, .. } => Some(*addr),
            _ => None,
        }
    }
}

impl Encoder<'_> {
    /// Encodes an acquisition without building an [`Event`](super::Event):
    /// the agent's hot path for locks. Written by hand beside the table's
    /// rows for `Acquire` and `Release`, which would cost the lock hooks an
    /// event built and dispatched and a bounds check per field;
    /// `tests/golden.rs` holds them to the same bytes.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn lock_acquire(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        addr: u64,
        kind: LockKind,
        mode: LockMode,
        op: LockOp,
        wait_ns: Option<u64>,
        stack: u32,
    ) -> Result<(), NoRoom> {
        let flags = flags(kind, mode, op, wait_ns.is_some());
        if wait_ns.is_none() && self.packed(ctx, tag::LOCK_ACQUIRE, time, addr, flags, stack) {
            return Ok(());
        }
        self.byte(tag::LOCK_ACQUIRE)?;
        self.time(ctx, time)?;
        self.addr(ctx, addr)?;
        self.byte(flags)?;
        self.u64(u64::from(stack))?;
        if let Some(w) = wait_ns {
            self.u64(w)?;
        }
        Ok(())
    }

    /// Encodes a release without building an [`Event`](super::Event) (see
    /// [`Encoder::lock_acquire`]).
    #[inline]
    pub fn lock_release(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        addr: u64,
        kind: LockKind,
        stack: u32,
        agent_ns: u64,
    ) -> Result<(), NoRoom> {
        if agent_ns != 0 {
            return self.lock_release_with_agent_time(ctx, time, addr, kind, stack, agent_ns);
        }
        if self.packed(ctx, tag::LOCK_RELEASE, time, addr, kind as u8, stack) {
            return Ok(());
        }
        self.byte(tag::LOCK_RELEASE)?;
        self.time(ctx, time)?;
        self.addr(ctx, addr)?;
        self.byte(kind as u8)?;
        self.u64(u64::from(stack))
    }

    /// A release whose hold held agent time: the table's encoding, out of
    /// line (about one hold in a thousand crosses a tick inside a hook).
    #[cold]
    #[inline(never)]
    fn lock_release_with_agent_time(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        addr: u64,
        kind: LockKind,
        stack: u32,
        agent_ns: u64,
    ) -> Result<(), NoRoom> {
        let ev = Event::Lock(LockEvent::Release {
            time,
            addr,
            kind,
            stack,
            agent_ns,
        });
        self.event(ctx, &ev)
    }

    /// The common shape of an acquisition or release (tag, time, address,
    /// one byte, stack), built in a register and written with one 16-byte
    /// store when every varint is under 3 bytes and 16 bytes are free: a
    /// lock hook then makes one store for its event instead of one per byte.
    /// Returns false (nothing written) otherwise. The bytes past the event
    /// are scratch: the next event overwrites them, the chunk ends at `len`.
    #[inline(always)]
    fn packed(
        &mut self,
        ctx: &mut ChunkContext,
        tag: u8,
        time: u64,
        addr: u64,
        byte: u8,
        stack: u32,
    ) -> bool {
        const LIMIT: u64 = 1 << 14;
        let dt = time.saturating_sub(ctx.prev_time);
        let da = zigzag(addr.wrapping_sub(ctx.prev_addr) as i64);
        let stack = u64::from(stack);
        if dt >= LIMIT || da >= LIMIT || stack >= LIMIT || self.out.len() - self.pos < 16 {
            return false;
        }
        let mut acc = u128::from(tag);
        let mut bits = 8;
        for v in [dt, da] {
            push_varint14(&mut acc, &mut bits, v);
        }
        acc |= u128::from(byte) << bits;
        bits += 8;
        push_varint14(&mut acc, &mut bits, stack);
        self.out[self.pos..self.pos + 16].copy_from_slice(&acc.to_le_bytes());
        self.pos += bits as usize / 8;
        ctx.prev_time = ctx.prev_time.max(time);
        ctx.prev_addr = addr;
        true
    }
}

impl Decoder<'_> {
    /// (kind, mode, op, contended) from a flags byte.
    pub(super) fn lock_flags(&mut self) -> Result<(LockKind, LockMode, LockOp, bool), DecodeError> {
        let f = self.byte()?;
        if f & 0x80 != 0 {
            return Err(DecodeError::Invalid("lock flags"));
        }
        let kind = LockKind::from_u8(f & 7).ok_or(DecodeError::Invalid("lock kind"))?;
        let mode = if f & 8 != 0 {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        Ok((kind, mode, LockOp::from_bits(f >> 4), f & 0x40 != 0))
    }
}

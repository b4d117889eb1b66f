//! Event buffers and the queue that hands them to the writer.
//!
//! Program threads fill buffers of their own (no lock shared between threads
//! on the event path); a full buffer goes onto a queue that the writer thread
//! (writer.rs) drains. Buffers cycle back through a free list. Past a memory
//! cap producers wait for the writer rather than drop events.

use crate::platform::lock::RawLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::collections::VecDeque;
use trapline_trace::{ChunkContext, Encoder, Event};

/// Capacity of one event buffer (one chunk before compression).
pub const BUFFER_SIZE: usize = 128 << 10;
/// Room that must be free before any single event is encoded.
pub const EVENT_RESERVE: usize = 12 << 10;
/// Queued buffers past which producers wait for the writer.
const QUEUE_CAP_BYTES: usize = 128 << 20;

/// Events of one thread (or of the agent itself, tid 0) awaiting the writer.
pub struct Buffer {
    pub data: Box<[u8]>,
    pub len: usize,
    pub events: u32,
    pub first_time: u64,
    pub last_time: u64,
    pub tid: u32,
    pub ctx: ChunkContext,
    /// Trace file generation this buffer belongs to (a fork child starts a new one).
    pub gen: u32,
}

impl Buffer {
    pub fn new() -> Box<Buffer> {
        Box::new(Buffer::empty(vec![0u8; BUFFER_SIZE].into_boxed_slice()))
    }

    /// As `new`, or None when the agent has no memory for it
    /// (`heap::try_box_zeroed`).
    fn try_new(for_new_thread: bool) -> Option<Box<Buffer>> {
        let data = crate::platform::heap::try_box_zeroed::<[u8; BUFFER_SIZE]>(for_new_thread)?;
        let b = crate::platform::heap::try_box_zeroed::<Buffer>(false)?;
        // SAFETY: zeroed bytes are a valid byte array.
        let data: Box<[u8]> = unsafe { data.assume_init() };
        Some(Box::write(b, Buffer::empty(data)))
    }

    /// A buffer holding no event, over `data`.
    fn empty(data: Box<[u8]>) -> Buffer {
        Buffer {
            data,
            len: 0,
            events: 0,
            first_time: 0,
            last_time: 0,
            tid: 0,
            ctx: ChunkContext::default(),
            gen: 0,
        }
    }

    pub fn reset(&mut self, tid: u32, gen: u32) {
        self.len = 0;
        self.events = 0;
        self.first_time = 0;
        self.last_time = 0;
        self.tid = tid;
        self.ctx = ChunkContext::default();
        self.gen = gen;
    }

    pub fn room(&self) -> usize {
        self.data.len() - self.len
    }

    /// Encodes one event with `f`; returns false if it did not fit.
    pub fn push(
        &mut self,
        time: Option<u64>,
        f: impl FnOnce(&mut Encoder<'_>, &mut ChunkContext) -> Result<(), trapline_trace::event::NoRoom>,
    ) -> bool {
        // Encode against the buffer's own context and restore it on failure:
        // copying it out and back costs a store-forwarding stall per event.
        let saved = self.ctx;
        let mut enc = Encoder::new(&mut self.data[self.len..]);
        if f(&mut enc, &mut self.ctx).is_err() {
            self.ctx = saved;
            return false;
        }
        self.len += enc.len();
        self.events += 1;
        if let Some(t) = time {
            if self.first_time == 0 {
                self.first_time = t;
            }
            self.last_time = self.last_time.max(t);
        }
        true
    }

    pub fn push_event(&mut self, ev: &Event, time: Option<u64>) -> bool {
        self.push(time, |e, c| e.event(c, ev))
    }
}

// Buffers are boxed so that moving one between a thread and the queues
// moves a pointer, not 128 KiB of state.
#[allow(clippy::vec_box)]
pub struct Queue {
    pub full: VecDeque<Box<Buffer>>,
    pub free: Vec<Box<Buffer>>,
    pub queued_bytes: usize,
}

struct Shared {
    lock: RawLock,
    q: UnsafeCell<Queue>,
}
// SAFETY: `q` is only accessed with `lock` held.
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared {
    lock: RawLock::new(),
    q: UnsafeCell::new(Queue {
        full: VecDeque::new(),
        free: Vec::new(),
        queued_bytes: 0,
    }),
};
/// Wakes the writer (new work) and producers (space freed).
pub static WORK: crate::platform::futex::Event = crate::platform::futex::Event::new();
pub static SPACE: crate::platform::futex::Event = crate::platform::futex::Event::new();
/// The writer thread runs: a producer past the cap waits for it.
pub static WRITER_RUNNING: AtomicBool = AtomicBool::new(false);
/// Current trace generation.
pub static GEN: AtomicU32 = AtomicU32::new(1);
/// Events handed to the writer.
pub static EVENTS_SUBMITTED: AtomicU64 = AtomicU64::new(0);
/// Events that could not be written (I/O errors); reported in the end record.
pub static EVENTS_LOST: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the queue, under its lock.
pub fn with_queue<R>(f: impl FnOnce(&mut Queue) -> R) -> R {
    let _g = SHARED.lock.guard();
    // SAFETY: guarded by SHARED.lock.
    f(unsafe { &mut *SHARED.q.get() })
}

/// A fresh buffer for thread `tid`.
pub fn take_buffer(tid: u32) -> Box<Buffer> {
    let mut b = with_queue(|q| q.free.pop()).unwrap_or_else(Buffer::new);
    b.reset(tid, GEN.load(Ordering::Relaxed));
    b
}

/// As `take_buffer`, or None when there is no buffer to reuse and no memory
/// for a new one; `for_new_thread`: a new one is taken as
/// `heap::alloc_for_new_thread` takes memory. For program threads, whose
/// event is then counted as lost instead of the allocation failure
/// aborting the program.
pub fn try_take_buffer(tid: u32, for_new_thread: bool) -> Option<Box<Buffer>> {
    let mut b = with_queue(|q| q.free.pop()).or_else(|| Buffer::try_new(for_new_thread))?;
    b.reset(tid, GEN.load(Ordering::Relaxed));
    Some(b)
}

/// What starts a writer that waits (production mode), when buffers pile up.
static WRITER_NEEDED: crate::platform::callback::Callback<fn()> =
    crate::platform::callback::Callback::new();

/// Registers what starts a writer that waits (`writer::start_deferred`).
pub fn on_writer_needed(f: fn()) {
    WRITER_NEEDED.set(f);
}

/// Queued bytes without a writer from which one is started.
const PILED_UP_BYTES: usize = 1 << 20;

/// Queues a filled buffer for writing. With `wait`, blocks while the queue is
/// over its memory cap (the writer is behind); never blocks before the writer
/// runs, and starts a writer that waits once buffers pile up.
pub fn submit(b: Box<Buffer>, wait: bool) {
    // Once per buffer, a system call's worth: a child of a raw fork system
    // call has no writer, and its descriptor is the parent's file.
    if crate::phase::in_unreset_child() {
        crate::phase::abandon_unreset_child();
        return;
    }
    if b.events == 0 {
        with_queue(|q| q.free.push(b));
        return;
    }
    let size = b.data.len();
    EVENTS_SUBMITTED.fetch_add(u64::from(b.events), Ordering::Relaxed);
    let mut slot = Some(b);
    let mut queued = 0;
    loop {
        let seen = SPACE.generation();
        with_queue(|q| {
            if !wait
                || !WRITER_RUNNING.load(Ordering::Acquire)
                || q.queued_bytes + size <= QUEUE_CAP_BYTES
            {
                q.queued_bytes += size;
                q.full.extend(slot.take());
                queued = q.queued_bytes;
            }
        });
        if slot.is_none() {
            break;
        }
        WORK.notify_all();
        // Woken when a buffer was written, or when the writer stops; the
        // timeout is only a backstop.
        SPACE.wait(seen, Some(100_000_000));
    }
    WORK.notify_all();
    if queued > PILED_UP_BYTES && !WRITER_RUNNING.load(Ordering::Acquire) {
        if let Some(start) = WRITER_NEEDED.get() {
            start();
        }
    }
}

/// Queues a buffer of the agent's own records ahead of everything else.
pub fn submit_first(b: Box<Buffer>) {
    EVENTS_SUBMITTED.fetch_add(u64::from(b.events), Ordering::Relaxed);
    with_queue(|q| {
        q.queued_bytes += b.data.len();
        q.full.push_front(b)
    });
    WORK.notify_all();
}

/// As `with_queue`, but gives up (None) when the lock cannot be had within
/// `spins` rounds: for the fatal-signal path.
pub fn try_with_queue<R>(spins: u32, f: impl FnOnce(&mut Queue) -> R) -> Option<R> {
    if !SHARED.lock.try_lock_for(spins) {
        return None;
    }
    // SAFETY: guarded by SHARED.lock (taken just above).
    let r = f(unsafe { &mut *SHARED.q.get() });
    SHARED.lock.unlock();
    Some(r)
}

/// Wakes the writer (it also wakes by itself every millisecond while the
/// program records events, and for the periodic sweep).
pub fn wake() {
    WORK.notify_all();
}

/// Locks the queue for fork.
pub fn lock() {
    SHARED.lock.lock();
}

pub fn unlock() {
    SHARED.lock.unlock();
}

/// In a fork child: the parent's queued buffers are not the child's to
/// write.
pub fn reset_in_child() {
    SHARED.lock.reset();
    // SAFETY: the child is single-threaded here.
    let q = unsafe { &mut *SHARED.q.get() };
    while let Some(b) = q.full.pop_front() {
        q.free.push(b);
    }
    q.queued_bytes = 0;
    WRITER_RUNNING.store(false, Ordering::Release);
}

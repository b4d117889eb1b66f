//! A synthetic service's trace, written through the real encoder at any
//! size, with the answers it must give kept beside it.
//!
//! Worker threads each serve requests: every request allocates a block
//! whose size, address and call stack are drawn at random (so that the
//! chunks hardly compress, and a given file size holds as few events as a
//! trace can), frees the block it allocated `live_per_thread` requests
//! before, and takes one lock that all workers share. Each worker's
//! requests sit in their own time slots, one slot after another across the
//! workers, so that holds of the shared lock never overlap; every 16th
//! request of a worker waits for the lock through the previous slot's
//! hold. Early on, two workers take two more locks in opposite orders,
//! holding nothing else: one potential deadlock. At the end, an exit snapshot lists the blocks still
//! live. What a trace must hold at once is then bounded whatever its
//! length (a few thousand live blocks, 4,096 stacks, four locks), which is
//! what tests of the analyses' memory need.

use std::io::{self, Write};

use crate::event::{AllocFn, EndCounters, Event, ExitKind, ProcessInfo, SnapshotKind};
use crate::{ChunkWriter, LockEvent, LockKind, LockMode, LockOp};

/// The service's shape.
#[derive(Clone, Copy, Debug)]
pub struct Service {
    /// Worker threads (their tids follow the process's pid).
    pub threads: u32,
    /// Blocks each worker keeps live: it frees the block it allocated this
    /// many requests earlier.
    pub live_per_thread: usize,
    /// Stop once the file has at least this many bytes.
    pub bytes: u64,
}

/// The process id written in the trace; the workers are `PID + 1..`.
pub const PID: u32 = 4000;
/// The lock every request takes.
pub const SHARED_LOCK: u64 = 0x5000_0000_1000;
/// The two locks taken in opposite orders.
pub const ORDER_LOCKS: [u64; 2] = [0x5000_0000_2000, 0x5000_0000_3000];
/// Distinct allocation stacks (ids 1..=SITES); lock stacks follow.
pub const SITES: u32 = 4096;
/// Every how many requests a worker waits for the shared lock.
pub const CONTENDED_EVERY: u64 = 16;
/// How long a contended acquisition waited (ns).
pub const WAIT_NS: u64 = 700;
/// Nanoseconds per request slot.
const SLOT_NS: u64 = 1000;
/// Requests of one worker written as one run (about 4,096 events, a chunk).
const REQUESTS_PER_RUN: u64 = 1000;

/// What the trace holds, counted while writing it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub events: u64,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    /// Blocks live at the end, and their bytes (the exit snapshot).
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// Distinct allocation stacks of those blocks.
    pub live_stacks: u64,
    /// Acquisitions of the shared lock, and how many waited.
    pub acquisitions: u64,
    pub contended: u64,
    /// Sum of the waits (ns).
    pub wait_ns: u64,
    /// The last event's time (ns).
    pub end_time: u64,
}

/// splitmix64: a fixed sequence, so that every run writes the same bytes.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The `n`th block's address: a bijection of `n` on 40 bits, so that no two
/// blocks of a trace share one, spread over a terabyte.
fn block_addr(n: u64) -> u64 {
    let mask = (1u64 << 40) - 1;
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4b) & mask;
    x ^= x >> 20;
    0x1000_0000_0000 + (x << 4)
}

fn stack_frames(id: u32) -> Vec<u64> {
    let base = 0x40_0000 + u64::from(id) * 0x40;
    vec![base, base + 0x1_0000, base + 0x2_0000]
}

struct Worker {
    tid: u32,
    /// The live blocks: (address, size, stack), a ring.
    ring: Vec<(u64, u64, u32)>,
}

/// The encoder, counting what it is given.
struct Counted<W: Write> {
    out: ChunkWriter<W>,
    written: Written,
}

impl<W: Write> Counted<W> {
    fn push(&mut self, tid: u32, ev: Event) -> io::Result<()> {
        self.written.events += 1;
        self.out.push(tid, &ev)
    }

    fn lock(&mut self, tid: u32, ev: LockEvent) -> io::Result<()> {
        self.push(tid, Event::Lock(ev))
    }
}

fn acquire(time: u64, addr: u64, wait_ns: Option<u64>, stack: u32) -> LockEvent {
    LockEvent::Acquire {
        time,
        addr,
        kind: LockKind::Mutex,
        mode: LockMode::Exclusive,
        op: LockOp::Blocking,
        wait_ns,
        stack,
    }
}

fn release(time: u64, addr: u64) -> LockEvent {
    LockEvent::Release {
        time,
        addr,
        kind: LockKind::Mutex,
        stack: 0,
        agent_ns: 0,
    }
}

/// Writes the trace to `out` and says what it holds.
pub fn write<W: Write>(service: &Service, out: W) -> io::Result<Written> {
    let mut w = Counted {
        out: ChunkWriter::new(out)?,
        written: Written::default(),
    };
    w.push(
        0,
        Event::Process(ProcessInfo {
            pid: PID,
            ppid: 1,
            start_unix_ns: 0,
            exe: "/usr/sbin/synthetic-service".into(),
            argv: vec!["synthetic-service".into()],
        }),
    )?;
    for id in 1..=SITES + 6 {
        let frames = stack_frames(id);
        w.push(PID, Event::StackDef { id, frames })?;
    }
    let lock_stack = |n: u32| SITES + 1 + n;
    let mut workers: Vec<Worker> = (0..service.threads)
        .map(|i| Worker {
            tid: PID + 1 + i,
            ring: Vec::with_capacity(service.live_per_thread),
        })
        .collect();
    for (i, worker) in workers.iter().enumerate() {
        let create_id = u64::from(worker.tid);
        let time = 1 + i as u64;
        w.push(
            PID,
            Event::ThreadCreate {
                time,
                create_id,
                stack: 0,
            },
        )?;
    }
    let mut random = Random(0x7261_7070_6c69_6e65);
    let mut blocks = 0u64;
    let threads = u64::from(service.threads);
    let mut run = 0u64;
    while w.out.bytes < service.bytes {
        for (i, worker) in workers.iter_mut().enumerate() {
            let tid = worker.tid;
            for k in 0..REQUESTS_PER_RUN {
                let request = run * REQUESTS_PER_RUN + k;
                let slot = (request * threads + i as u64 + 1) * SLOT_NS;
                if request == 0 {
                    let (parent_tid, create_id) = (PID, u64::from(tid));
                    w.push(
                        tid,
                        Event::ThreadStart {
                            time: slot - 1,
                            parent_tid,
                            create_id,
                        },
                    )?;
                }
                let r = random.next();
                let size = 1 + (r & 0xf_ffff);
                let stack = 1 + ((r >> 20) as u32 % SITES);
                let addr = block_addr(blocks);
                blocks += 1;
                let func = AllocFn::Malloc;
                w.push(
                    tid,
                    Event::Alloc {
                        time: slot,
                        addr,
                        size,
                        align: 16,
                        func,
                        stack,
                    },
                )?;
                w.written.allocations += 1;
                w.written.allocated_bytes += size;
                let at = (request % service.live_per_thread as u64) as usize;
                if worker.ring.len() < service.live_per_thread {
                    worker.ring.push((addr, size, stack));
                } else {
                    let (old, _, _) = std::mem::replace(&mut worker.ring[at], (addr, size, stack));
                    let stack = 1 + ((r >> 40) as u32 % SITES);
                    let func = AllocFn::Free;
                    w.push(
                        tid,
                        Event::Free {
                            time: slot + 100,
                            addr: old,
                            func,
                            stack,
                        },
                    )?;
                    w.written.frees += 1;
                }
                let contended = request % CONTENDED_EVERY == CONTENDED_EVERY - 1;
                let site = lock_stack((r >> 60) as u32 % 4);
                if contended {
                    // Asked for during the previous slot's hold.
                    w.lock(
                        tid,
                        LockEvent::Request {
                            time: slot - 500,
                            addr: SHARED_LOCK,
                            kind: LockKind::Mutex,
                            mode: LockMode::Exclusive,
                            stack: site,
                        },
                    )?;
                    w.written.contended += 1;
                    w.written.wait_ns += WAIT_NS;
                }
                let wait = contended.then_some(WAIT_NS);
                w.lock(tid, acquire(slot + 200, SHARED_LOCK, wait, site))?;
                w.lock(tid, release(slot + 900, SHARED_LOCK))?;
                if request == 0 && i < 2 {
                    // A then B, or B then A, holding nothing else.
                    let order = if i == 0 { [0, 1] } else { [1, 0] };
                    for (n, &l) in order.iter().enumerate() {
                        let stack = lock_stack(4 + l as u32);
                        w.lock(
                            tid,
                            acquire(slot + 910 + n as u64, ORDER_LOCKS[l], None, stack),
                        )?;
                    }
                    for (n, &l) in order.iter().rev().enumerate() {
                        w.lock(tid, release(slot + 920 + n as u64, ORDER_LOCKS[l]))?;
                    }
                }
                w.written.acquisitions += 1;
                w.written.end_time = slot + 900;
            }
        }
        run += 1;
    }
    let end = w.written.end_time + SLOT_NS;
    for (i, worker) in workers.iter().enumerate() {
        w.push(
            worker.tid,
            Event::ThreadEnd {
                time: end - 100 + i as u64,
            },
        )?;
    }
    let kind = SnapshotKind::Exit;
    w.push(PID, Event::SnapshotBegin { time: end, kind })?;
    let (mut blocks, mut bytes) = (0, 0);
    let mut stacks = std::collections::BTreeSet::new();
    for worker in &workers {
        for &(addr, size, stack) in &worker.ring {
            stacks.insert(stack);
            let func = AllocFn::Malloc;
            w.push(
                PID,
                Event::LiveBlock {
                    addr,
                    size,
                    func,
                    stack,
                },
            )?;
            blocks += 1;
            bytes += size;
        }
    }
    w.push(PID, Event::SnapshotEnd { blocks, bytes })?;
    w.written.live_blocks = blocks;
    w.written.live_bytes = bytes;
    w.written.live_stacks = stacks.len() as u64;
    let counters = EndCounters {
        events: w.written.events + 1,
        events_lost: 0,
        untracked_calls: 0,
    };
    let exit = ExitKind::Code(0);
    w.push(
        PID,
        Event::End {
            time: end + 1,
            exit,
            counters,
        },
    )?;
    w.written.end_time = end + 1;
    w.out.finish()?;
    Ok(w.written)
}

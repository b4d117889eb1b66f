//! The reachability scan: stop the world, read the roots for pointers, mark
//! the live blocks they reach, and judge every block as memcheck does
//! (definitely, indirectly or possibly lost, or still reachable).
//!
//! Order of a scan (docs/analyses.md, section "Reachability scan"):
//! 1. read /proc/self/maps and the module list (may allocate), and check
//!    that the scan's memory fits under the limits that would end or fail
//!    the program (headroom.rs; if not, the scan is `Skipped`);
//! 2. lock every shard of the live table, copy and sort it, allocate all
//!    marking state (the agent heap may be used: no thread is stopped yet);
//! 3. stop every other program thread (world.rs); from here nothing
//!    allocates, since a stopped thread may hold the agent heap's lock;
//! 4. plan the roots (roots.rs), read them, mark, group the lost blocks;
//! 5. let the threads go, unlock the shards; the pause is 2 to 5.
//!
//! The caller then writes the verdicts (emit.rs).

mod arena;
mod blocks;
mod emit;
mod everything;
mod headroom;
pub(crate) mod mark;
pub(crate) mod world;

pub use emit::{emit, emit_skipped, Sink};

use crate::platform::arch::CALLEE_SAVED;
use crate::platform::lock::RawLock;
use crate::platform::sys;
use crate::tracking::live::{self, Packed};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use trapline_trace::{AllocFn, ScanSkipReason, ScanStats, ScanTrigger, Verdict};

/// Nanoseconds the periodic scans have paused the program.
static PERIODIC_PAUSE_NS: AtomicU64 = AtomicU64::new(0);

static SCAN_LOCK: RawLock = RawLock::new();
static SCANS: AtomicU32 = AtomicU32::new(0);
static LAST_MS: AtomicU64 = AtomicU64::new(0);

/// Where the thread that called `exit` had its live frames and registers.
static EXIT_TID: AtomicU32 = AtomicU32::new(0);
static EXIT_SP: AtomicU64 = AtomicU64::new(0);
static EXIT_REGS: [AtomicU64; CALLEE_SAVED] = [const { AtomicU64::new(0) }; CALLEE_SAVED];
/// A crashed thread's general registers, saved in its signal frame
/// (`arch::GENERAL_REGISTERS` words, valid while its handler runs the
/// finish), or 0: then `EXIT_REGS` holds the exiting thread's.
static EXIT_GREGS: AtomicU64 = AtomicU64::new(0);

extern "C" {
    /// The stack pointer at the process entry point (ld.so).
    static __libc_stack_end: *mut libc::c_void;
}

/// The signal that stops threads for a scan, if scans will run (0 if not):
/// the program's masks must let it through (hooks/sigmask.rs).
pub fn park_signal_in_use() -> core::ffi::c_int {
    if crate::config::flag(&crate::config::OPTIONS.scan_at_exit)
        || crate::config::OPTIONS.scan_every_ms.load(Ordering::Relaxed) != 0
    {
        world::park_signal()
    } else {
        0
    }
}

/// Whether the exit snapshot is a scan.
pub fn at_exit_enabled() -> bool {
    crate::config::flag(&crate::config::OPTIONS.scan_at_exit)
}

/// Forgets the agent threads of the parent (fork child: only the caller
/// survives) and frees the scan lock (the writer may have held it: it is
/// released only after the shard locks that fork waits for).
pub fn reset_in_child() {
    SCAN_LOCK.reset();
    crate::platform::agent_threads::forget_all();
    EXIT_TID.store(0, Ordering::Relaxed);
    EXIT_GREGS.store(0, Ordering::Relaxed);
    world::record_where_parked(false);
}

/// Notes the live frames and registers of a thread calling `exit`.
pub fn note_exit_call(regs: &[u64; CALLEE_SAVED], caller_sp: u64) {
    if EXIT_TID
        .compare_exchange(0, sys::gettid(), Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        for (slot, &r) in EXIT_REGS.iter().zip(regs) {
            slot.store(r, Ordering::Relaxed);
        }
        EXIT_SP.store(caller_sp, Ordering::Release);
    }
}

/// Notes where a crashed thread's live frames start (the stack pointer the
/// fatal signal interrupted: the handler's frames, the signal frame and
/// the red zone lie below) and where its registers are saved, for the scan
/// its handler runs. Replaces what an `exit` call noted: a crash in an
/// exit handler leaves the handler's frames live.
pub fn note_crash(sp: u64, registers: u64) {
    EXIT_GREGS.store(registers, Ordering::Relaxed);
    EXIT_SP.store(sp, Ordering::Relaxed);
    EXIT_TID.store(sys::gettid(), Ordering::Release);
    world::record_where_parked(true);
}

/// Notes the calling hook's frame as where the exiting thread's live frames
/// start (`_exit`, `quick_exit`: their callers' frames are above it).
#[inline(always)]
pub fn note_exit_here() {
    note_exit_call(
        &crate::platform::arch::callee_saved_now(),
        crate::platform::arch::stack_pointer(),
    );
}

/// The writer's periodic hook: runs a scan every `--scan-every` seconds.
pub fn periodic_tick() {
    let every = crate::config::OPTIONS.scan_every_ms.load(Ordering::Relaxed);
    // Not once the process is finishing: a periodic scan (or its skip)
    // written after the exit scan's attempt would come after it in the
    // trace, and `leaks` takes the last scan for the exit's.
    if every == 0 || crate::phase::recording_stopped() || crate::phase::finishing() {
        return;
    }
    let now = crate::platform::clock::precise_now() / 1_000_000;
    let last = LAST_MS.load(Ordering::Relaxed);
    if now < last + every {
        return;
    }
    LAST_MS.store(now, Ordering::Relaxed);
    // Within budget: the pauses so far against the run's time. A scan of
    // 0.9 M blocks paused perl 1.4 to 3.5 s every second, 7x slower; the
    // interval stretches instead, and the trace says which scans waited.
    let elapsed = crate::platform::clock::precise_now();
    let spent = PERIODIC_PAUSE_NS.load(Ordering::Relaxed);
    let budget = crate::config::OPTIONS
        .scan_budget_ppm
        .load(Ordering::Relaxed);
    if u128::from(spent) * 1_000_000 > u128::from(elapsed) * u128::from(budget) {
        emit::to_writer(&Err(Skipped {
            time: elapsed,
            trigger: ScanTrigger::Periodic,
            why: headroom::Shortfall {
                reason: ScanSkipReason::OverBudget,
                needed: spent,
                available: elapsed,
                limit: budget,
            },
        }));
        return;
    }
    if let Some(outcome) = scan_while_running(1) {
        emit::to_writer(&outcome);
    }
}

/// A scan while the program runs, trigger periodic, its pause counted
/// against the periodic budget; none when the lock could not be had within
/// `spins` rounds (another scan) or the exit began meanwhile.
fn scan_while_running(spins: u32) -> Option<Result<Outcome, Skipped>> {
    if !SCAN_LOCK.try_lock_for(spins) {
        return None;
    }
    if crate::phase::finishing() {
        // The exit began while this waited for the lock.
        SCAN_LOCK.unlock();
        return None;
    }
    // Watched pages back first: the scan reads the heap, and a fault taken
    // while the world is stopped would wait for the monitor's lock, which
    // a stopped thread may hold.
    crate::tracking::access::pause();
    let outcome = run_locked(ScanTrigger::Periodic, &mut ExitHold::none());
    crate::tracking::access::resume();
    SCAN_LOCK.unlock();
    if let Ok(o) = &outcome {
        PERIODIC_PAUSE_NS.fetch_add(o.stats.pause_ns, Ordering::Relaxed);
    }
    Some(outcome)
}

/// What a requested scan found: its number, blocks, pause, and the
/// unreachable (definitely and indirectly lost) bytes and blocks per site.
pub type RequestedScan = (u32, u64, u64, Vec<((u32, AllocFn), (u64, u64))>);

/// A reachability scan now, asked for on the control socket: written to
/// the trace as a periodic one (`trapline leaks --snapshot N`), or why
/// none ran.
pub fn on_request() -> Result<RequestedScan, String> {
    if crate::phase::recording_stopped() || crate::phase::finishing() {
        return Err("the process is finishing its trace".to_string());
    }
    let Some(outcome) = scan_while_running(50_000_000) else {
        return Err("another scan is under way".to_string());
    };
    let answer = match &outcome {
        Ok(o) => {
            let mut lost: std::collections::HashMap<(u32, AllocFn), (u64, u64)> =
                std::collections::HashMap::new();
            o.for_each(|_, b, verdict, _| {
                if matches!(verdict, Verdict::DefinitelyLost | Verdict::IndirectlyLost) {
                    let t = lost.entry((b.stack, b.func)).or_default();
                    t.0 += b.size;
                    t.1 += 1;
                }
            });
            let mut lost: Vec<_> = lost.into_iter().collect();
            lost.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0 .0.cmp(&b.0 .0)));
            Ok((o.scan, o.stats.blocks, o.stats.pause_ns, lost))
        }
        Err(s) => Err(format!("skipped: {}", s.why.reason.name())),
    };
    emit::to_writer(&outcome);
    answer
}

/// A scan that was due and did not run (`Event::ScanSkipped`).
pub struct Skipped {
    pub time: u64,
    pub trigger: ScanTrigger,
    pub why: headroom::Shortfall,
}

/// The result of one scan, ready to be written.
pub struct Outcome {
    pub scan: u32,
    pub time: u64,
    pub trigger: ScanTrigger,
    blocks: Vec<Packed>,
    verdicts: Vec<Verdict>,
    indirect: Vec<u64>,
    pub stats: ScanStats,
}

impl Outcome {
    /// Calls `f(addr, block, verdict, indirect_bytes)` for every block, in address order.
    pub fn for_each(&self, mut f: impl FnMut(u64, live::Block, Verdict, u64)) {
        for (i, b) in self.blocks.iter().enumerate() {
            f(b.addr(), b.block(), self.verdicts[i], self.indirect[i]);
        }
    }
}

/// Runs a scan from the thread that is ending the process.
pub fn run_at_exit(hold: &mut ExitHold) -> Result<Outcome, Skipped> {
    SCAN_LOCK.lock();
    let o = run_locked(ScanTrigger::Exit, hold);
    SCAN_LOCK.unlock();
    o
}

/// Address ranges of ld.so's segments: blocks it allocates for itself (DTVs,
/// dynamic TLS, link maps) are its bookkeeping and count as roots.
fn loader_ranges() -> Vec<(u64, u64)> {
    module_segments(
        |name| trapline_contract::elf::is_glibc_loader(name.as_bytes()),
        0,
    )
}

/// Writable segments of the C library (its data and bss).
fn libc_data_ranges() -> Vec<(u64, u64)> {
    module_segments(
        |name| name.starts_with("libc.so"),
        trapline_trace::event::segment_flags::WRITE,
    )
}

/// The segments, with every bit of `flags` set, of the loaded modules whose
/// file name `wanted` accepts.
fn module_segments(wanted: impl Fn(&str) -> bool, flags: u8) -> Vec<(u64, u64)> {
    crate::capture::modules::all()
        .into_iter()
        .filter(|m| wanted(m.path.rsplit('/').next().unwrap_or("")))
        .flat_map(|m| m.segments.into_iter())
        .filter(|s| s.flags & flags == flags)
        .map(|s| (s.start, s.end))
        .collect()
}

/// Ranges of the agent's own module (code, data, bss).
fn agent_module_ranges() -> Vec<(u64, u64)> {
    let me = agent_module_ranges as *const () as u64;
    crate::capture::modules::all()
        .into_iter()
        .find(|m| m.segments.iter().any(|s| me >= s.start && me < s.end))
        .map(|m| m.segments.iter().map(|s| (s.start, s.end)).collect())
        .unwrap_or_default()
}

/// Where the allocator library's static TLS block lies below each thread's
/// thread pointer, and its size: `(tp - start, size)`. jemalloc keeps its
/// thread state there (its tcache, the keys of its radix-tree cache:
/// addresses masked to 1 GiB and 4 GiB boundaries); read as a root, a key
/// that fell inside a large block made the block "possibly lost" whenever
/// ASLR put it across such a boundary. Nothing there points to a program's
/// block, as nothing in the allocator's own mappings does. `None` for the C
/// library's malloc, for an allocator built into the executable (whose TLS
/// is the program's own), and for a TLS block that is not static (a
/// dlopen'd allocator's, allocated on first use: not at one offset in
/// every thread).
fn allocator_tls_below_thread_pointer() -> Option<(u64, u64)> {
    let (lo, _) = crate::tracking::allocator_maps::allocator_extent()?;
    let module = crate::platform::imports::modules()
        .into_iter()
        .skip(1)
        .find(|m| m.extent().contains(&(lo as usize)))?;
    let (start, end) = module.own_tls()?;
    let tp = crate::platform::arch::thread_pointer() as usize;
    // Static TLS (variant II) lies just below the thread pointer.
    const STATIC_TLS_MOST: usize = 64 << 20;
    (start < tp && tp - start <= STATIC_TLS_MOST)
        .then(|| ((tp - start) as u64, (end - start) as u64))
}

/// For each block, whether its allocation's innermost frame is in ld.so
/// (one lookup per distinct stack).
fn loader_blocks(blocks: &[Packed], loader: &[(u64, u64)]) -> Vec<u32> {
    let mut out = Vec::new();
    if loader.is_empty() {
        return out;
    }
    let mut cache: Vec<u8> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let id = b.block().stack as usize;
        if id == 0 {
            continue;
        }
        if id >= cache.len() {
            cache.resize(id + 1, 0);
        }
        if cache[id] == 0 {
            let first = crate::capture::stacks::frames(id as u32).first().copied();
            let inside = first.is_some_and(|pc| loader.iter().any(|&(a, b)| pc >= a && pc < b));
            cache[id] = if inside { 2 } else { 1 };
        }
        if cache[id] == 2 {
            out.push(i as u32);
        }
    }
    out
}

/// Times the world is let go and stopped again when a stopped thread was
/// inside the agent heap (after that the scan goes on: a thread that holds
/// the heap's lock across a hundred stops is not one the scan stopped).
const HEAP_BUSY_RETRIES: u32 = 100;

/// Live blocks now, one shard lock at a time (the scan's memory estimate).
fn live_blocks() -> u64 {
    live::shards().iter().map(|s| s.locked().len() as u64).sum()
}

/// Stops the world (world.rs) with no thread inside the agent heap.
fn stop_outside_heap(scratch: world::Scratch, agent_tids: &[u32], insist: bool) -> world::World {
    let mut world = world::stop(scratch, agent_tids, insist);
    for _ in 0..HEAP_BUSY_RETRIES {
        if !crate::platform::heap::busy() {
            break;
        }
        world::resume(&world);
        drop(world);
        crate::platform::futex::sleep_ns(1_000_000);
        world = world::stop(world::Scratch::new(), agent_tids, insist);
    }
    world
}

/// How many of the program's threads other than the calling one are alive
/// (the agent's own threads and ended ones not counted); none when the
/// kernel's listing did not settle.
pub fn other_program_threads() -> Option<u32> {
    // A writer thread that has not run yet is not among the agent's noted
    // threads, but its starter noted its tid. One whose tid is unknown
    // counts as the program's: the safe side.
    let me = sys::gettid();
    let writer = crate::services::writer::tid();
    let agents = crate::platform::agent_threads::others();
    let tids = crate::platform::tasks::live_threads()?;
    let others = tids
        .iter()
        .filter(|&&tid| tid != me && tid != writer && !agents.contains(&tid));
    Some(others.count() as u32)
}

/// The program's other threads, kept stopped from the exit scan to the end
/// of the trace, as natively the exit would have ended them by then: what
/// they would do meanwhile (print, fault, allocate) does not happen. Held
/// only when every thread parked outside the agent and none is handing
/// over its last buffer, so the finish needs nothing a stopped thread
/// holds; a wait for one of the agent's locks lets them go all the same
/// (hold::let_go_if_held).
pub struct ExitHold {
    world: Option<world::World>,
}

impl ExitHold {
    /// No thread stopped (no scan at exit, or the stop did not qualify).
    pub fn none() -> ExitHold {
        ExitHold { world: None }
    }

    /// Stops the other threads for the exit, and holds them if it may.
    pub fn stop() -> ExitHold {
        // A writer thread that has not yet noted itself as the agent's would
        // be stopped and held like the program's threads, and the finish
        // would wait for it (a short-lived process, 1 exit in about 40).
        // Waiting until it has run cost every such process about 30 us
        // (fork+exec of /bin/true, 3% slower): no hold then, as before.
        if crate::services::writer::starting() {
            return ExitHold::none();
        }
        // After a periodic scan that is under way: one stopper at a time.
        // None starts after this (the process is finishing).
        SCAN_LOCK.lock();
        let w = stop_outside_heap(
            world::Scratch::new(),
            &crate::platform::agent_threads::others(),
            true,
        );
        SCAN_LOCK.unlock();
        if w.inside == 0
            && !crate::platform::heap::busy()
            && crate::events::thread::exiting_threads() == 0
        {
            crate::platform::hold::hold();
            ExitHold { world: Some(w) }
        } else {
            world::resume(&w);
            ExitHold::none()
        }
    }

    /// Lets the held threads go and waits until they left their handlers.
    fn resume(&mut self) {
        if let Some(w) = self.world.take() {
            world::resume(&w);
        }
    }

    /// The trace is written: the held threads stay parked while the exit
    /// ends the process (world::release_at_end).
    pub fn release_at_end(&mut self) {
        if self.world.take().is_some() {
            world::release_at_end();
        }
    }
}

/// A scan of an empty table: nothing to judge, so no roots to read. A
/// process that frees everything (`/bin/true`, a clean C program) spent
/// about 0.3 ms of its exit reading roots and marking for nothing: a
/// third of what the agent added to a fork+exec of /bin/true.
fn empty_scan(trigger: ScanTrigger, hold: &ExitHold) -> Option<Outcome> {
    let start = crate::platform::clock::precise_now();
    // Under every shard lock, so that no block arrives while it is decided.
    let mut guards: Vec<_> = live::shards().iter().map(|s| s.locked()).collect();
    if guards.iter_mut().any(|g| g.len() != 0) {
        return None;
    }
    let threads = hold.world.as_ref().map_or_else(
        || crate::platform::tasks::kernel_count().unwrap_or(1),
        |w| w.threads,
    );
    let scan = SCANS.fetch_add(1, Ordering::AcqRel) + 1;
    let time = crate::platform::clock::precise_now();
    drop(guards);
    Some(Outcome {
        scan,
        time,
        trigger,
        blocks: Vec::new(),
        verdicts: Vec::new(),
        indirect: Vec::new(),
        stats: ScanStats {
            pause_ns: crate::platform::clock::precise_now().saturating_sub(start),
            threads: threads.max(1),
            threads_not_suspended: 0,
            root_bytes: 0,
            blocks: 0,
            bytes: 0,
            mappings_not_excluded: 0,
        },
    })
}

fn run_locked(trigger: ScanTrigger, hold: &mut ExitHold) -> Result<Outcome, Skipped> {
    if let Some(empty) = empty_scan(trigger, hold) {
        return Ok(empty);
    }
    let skipped = |why| Skipped {
        time: crate::platform::clock::precise_now(),
        trigger,
        why,
    };
    let Some(mut reader) = mark::SafeReader::new() else {
        let why = headroom::Shortfall::without_limit(ScanSkipReason::MemoryUnreadable, 0);
        return Err(skipped(why));
    };
    // 1. Facts that allocate.
    let maps = crate::platform::proc_maps::read();
    // The scan's memory, checked against the limits that would kill or
    // fail the program before it is taken (headroom.rs).
    let mapped = maps.iter().map(|m| m.end - m.start).sum();
    if crate::config::flag(&crate::config::OPTIONS.scan_check_room) {
        if let Err(why) = headroom::check(headroom::needed(live_blocks(), maps.len()), mapped) {
            return Err(skipped(why));
        }
    }
    let scan = SCANS.fetch_add(1, Ordering::AcqRel) + 1;
    let time = crate::platform::clock::precise_now();
    let me = sys::gettid();
    let loader = loader_ranges();
    let mut excluded = agent_module_ranges();
    // Production mode knows only the sampled blocks: every word may be a
    // pointer of the program's, the heap's included (everything.rs).
    let production = crate::config::production();
    // The allocator library's own mappings (its metadata names every block
    // it handed out): malloc's memory, like glibc's arena heaps. Read in
    // production mode, where the blocks the agent does not know lie.
    let mut allocator_maps = Vec::new();
    crate::tracking::allocator_maps::allocator_ranges(if production {
        &mut allocator_maps
    } else {
        &mut excluded
    });
    trapline_reach::maps::merge(&mut allocator_maps);
    // glibc's bookkeeping in its own data (arena.rs).
    excluded.extend(arena::main_arena(libc_data_ranges, &mut reader));
    let allocator_tls = allocator_tls_below_thread_pointer();
    let agent_tids = crate::platform::agent_threads::others();
    for sp in crate::platform::agent_threads::stack_pointers() {
        if let Some(i) = crate::platform::proc_maps::containing(&maps, sp) {
            excluded.push((maps[i].start, maps[i].end));
        }
    }
    let mut readable: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.readable && m.kind != crate::platform::proc_maps::Special::Kernel)
        .map(|m| (m.start, m.end))
        .collect();
    trapline_reach::maps::merge(&mut readable);
    let mut rodata: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.readable && !m.writable && !m.executable && m.file)
        .map(|m| (m.start, m.end))
        .collect();
    trapline_reach::maps::merge(&mut rodata);
    // The stop's scratch (a held world is stopped already), and room for
    // the stacks of the threads the scan will see stopped.
    let scratch = hold.world.is_none().then(world::Scratch::new);
    let max_threads = match (&scratch, &hold.world) {
        (Some(s), _) => s.capacity(),
        (None, Some(w)) => w.parked.len(),
        (None, None) => 0,
    };

    // 2. The live table, frozen.
    let pause_start = crate::platform::clock::precise_now();
    let mut guards = Vec::with_capacity(live::SHARDS);
    let mut count = 0;
    for shard in live::shards() {
        let mut g = shard.locked();
        count += g.len();
        guards.push(g);
    }
    // Memory refused here, after the check above (the program grew in
    // between), skips the scan as the check would have.
    let refused = || {
        let needed = headroom::needed(count as u64, maps.len());
        let why = headroom::Shortfall::without_limit(ScanSkipReason::AllocationFailed, needed);
        Err(skipped(why))
    };
    let Some(mut copy) = blocks::try_with_capacity(count) else {
        return refused();
    };
    for g in &mut guards {
        g.copy_packed(&mut copy);
    }
    let copied = crate::platform::clock::precise_now();
    let Some(index) = blocks::BlockIndex::new(copy, &blocks::HugeBuffers) else {
        return refused();
    };
    let sorted = crate::platform::clock::precise_now();
    let loader_roots = loader_blocks(&index.blocks, &loader);
    let mem = mark::LiveMemory {
        reader: core::cell::RefCell::new(reader),
    };
    let Some(mut marker) =
        trapline_reach::Marker::new(&index, &readable, &rodata, &mem, &blocks::HugeBuffers)
    else {
        return refused();
    };
    // Production mode reads the whole heap against a few blocks.
    let sieve = match production.then(|| trapline_reach::Sieve::new(&index, &blocks::HugeBuffers)) {
        Some(None) => return refused(),
        Some(sieve) => sieve,
        None => None,
    };
    if let Some(sieve) = &sieve {
        marker.sieve(sieve);
    }
    let against = sieve.as_ref().map(|sieve| everything::Against {
        index: &index,
        sieve,
        allocator: &allocator_maps,
    });
    let mut agent_maps = Vec::with_capacity(crate::platform::heap::mapping_count() + 256);
    excluded.reserve(agent_maps.capacity() + max_threads + 8);
    // A range may be cut by each excluded range and (production mode)
    // each block.
    let mut root_ranges =
        Vec::with_capacity(2 * maps.len() + excluded.capacity() + index.len() + max_threads + 16);
    let exit_sp = EXIT_SP.load(Ordering::Acquire);
    let exit_tid = EXIT_TID.load(Ordering::Acquire);
    // Each thread's stack pointer, and where it left its own stack if it did.
    let mut stack_starts = Vec::with_capacity(2 * (max_threads + 1));

    // 3. Stop the world, with nobody inside the agent heap: a thread
    // stopped while it holds the heap's lock (or its mapping registry's)
    // would make the scan's first free (or `mappings_into`) wait for ever.
    // A short-lived process hung that way when its exit scan stopped the
    // writer thread in its first allocation. Then the threads are let go
    // and stopped again a millisecond later.
    let prepared = crate::platform::clock::precise_now();
    // An exit's world may be held stopped already (`ExitHold`), unless a
    // thread that waited for a lock meanwhile let it go.
    if !crate::platform::hold::held() {
        hold.resume();
    }
    let own_stop = hold.world.is_none();
    let mut stopped_here = None;
    let world = match &hold.world {
        Some(w) => w,
        None => {
            let scratch = scratch.unwrap_or_else(world::Scratch::new);
            // Room for what the stop may list, taken before anyone stops.
            stack_starts.reserve(2 * (scratch.capacity() + 1));
            root_ranges.reserve(scratch.capacity());
            stopped_here.insert(stop_outside_heap(scratch, &agent_tids, false))
        }
    };
    let stopped = crate::platform::clock::precise_now();

    // 4. Roots and marking. No allocation from here to `resume`.
    crate::platform::heap::mappings_into(&mut agent_maps);
    excluded.extend_from_slice(&agent_maps);
    if let Some((below, size)) = allocator_tls {
        let own = crate::platform::arch::thread_pointer();
        let pointers = world.parked.iter().map(|p| p.thread_pointer).chain([own]);
        for tp in pointers.filter(|&tp| tp > below) {
            if excluded.len() < excluded.capacity() {
                excluded.push((tp - below, tp - below + size));
            }
        }
    }
    trapline_reach::maps::merge(&mut excluded);
    stack_starts.extend(world.parked.iter().map(|p| p.sp));
    let mut root_bytes = 0u64;
    if trigger == ScanTrigger::Exit {
        let own_sp = if exit_tid == me && exit_sp != 0 {
            exit_sp
        } else if me == sys::getpid_raw() {
            // main returned: only the process entry frame and above are live.
            // SAFETY: ld.so's variable, set before any code of the program ran.
            unsafe { __libc_stack_end as u64 }
        } else {
            crate::events::thread::own_stack_sp(crate::platform::arch::stack_pointer())
        };
        stack_starts.push(own_sp);
        let crashed_registers = EXIT_GREGS.load(Ordering::Relaxed);
        if exit_tid == me && crashed_registers != 0 {
            let n = crate::platform::arch::GENERAL_REGISTERS;
            root_bytes += mem.reader.borrow_mut().for_each_word(
                crashed_registers,
                crashed_registers + 8 * n,
                |w| marker.word(w, true),
            );
        } else if exit_tid == me {
            for r in &EXIT_REGS {
                marker.word(r.load(Ordering::Relaxed), true);
            }
            root_bytes += (8 * CALLEE_SAVED) as u64;
        }
    }
    // Parked threads' general registers, read from their signal frames
    // (which lie below their stacks' live parts).
    for p in world.parked.iter().filter(|p| p.registers != 0) {
        let n = crate::platform::arch::GENERAL_REGISTERS;
        root_bytes +=
            mem.reader
                .borrow_mut()
                .for_each_word(p.registers, p.registers + 8 * n, |w| marker.word(w, true));
    }
    // Stacks that threads left for another (hooks/context.rs) are live from
    // where they were left; no thread runs on them.
    let running = stack_starts.len();
    let own_left = (trigger == ScanTrigger::Exit).then(|| {
        let sp = crate::events::thread::own_stack_sp(crate::platform::arch::stack_pointer());
        crate::events::thread::current_if_any().map_or(0, |t| t.own_stack_left_at(sp))
    });
    stack_starts.extend(
        world
            .parked
            .iter()
            .map(|p| p.left_sp)
            .chain(own_left)
            .filter(|&sp| sp != 0),
    );
    // glibc's chunk header is malloc's, never a root; production mode cuts
    // out the blocks alone (blocks.rs, `first_extent_in`).
    let header = if production { 0 } else { 16 };
    let next_block = |lo, hi| index.first_extent_in(lo, hi, header);
    let mut read_word = |a: u64| {
        let mut reader = mem.reader.borrow_mut();
        // The arena probes look at every 64 MiB of anonymous memory.
        if !reader.may_hold_data(a) {
            return Some(0);
        }
        let mut w = None;
        reader.for_each_word(a, a + 8, |x| w = Some(x));
        w
    };
    // A range left out for want of room (never seen: the room is counted
    // above) could hide a pointer: production mode then judges no block
    // lost; the full scan goes on, as it always did.
    let planned_whole = trapline_reach::roots::plan(
        trapline_reach::roots::Plan {
            maps: &maps,
            excluded: &excluded,
            stack_starts: &stack_starts,
            next_block: &next_block,
            read_word: &mut read_word,
            everything: production,
        },
        &mut root_ranges,
    ) || !production;
    // A thread stopped on a stack that is a heap block (a coroutine's
    // malloc'd stack, an alternate signal stack from malloc): its live part,
    // from the stack pointer up, with the signal frame, is a root too.
    for &sp in &stack_starts[..running] {
        if let Some((i, _)) = index.find(sp) {
            let b = index.blocks[i];
            if root_ranges.len() < root_ranges.capacity() {
                root_ranges.push((sp & !7, b.addr() + b.size()));
            }
        }
    }
    for &(lo, hi) in &root_ranges {
        // Large anonymous roots only where their pages hold data (a sparse
        // reservation); file mappings whole (their pages may be in the file).
        let anonymous = hi - lo >= mark::SPARSE_FROM
            && crate::platform::proc_maps::containing(&maps, lo).is_some_and(|i| !maps[i].file);
        if let Some(against) = &against {
            root_bytes += everything::read_root(
                &mut mem.reader.borrow_mut(),
                (lo, hi),
                anonymous,
                against,
                &mut |w| marker.word(w, true),
            );
        } else {
            let mut reader = mem.reader.borrow_mut();
            if anonymous {
                reader.populated(lo, hi, |reader, a, b| {
                    root_bytes += reader.for_each_word(a, b, |w| marker.word(w, true));
                });
            } else {
                root_bytes += reader.for_each_word(lo, hi, |w| marker.word(w, true));
            }
        }
        marker.propagate();
    }
    // Arguments the agent holds for threads being started (threads.rs).
    crate::events::threads::starting_args::for_each(|arg| marker.word(arg, true));
    for &i in &loader_roots {
        marker.root_block(i as usize);
    }
    marker.propagate();
    let marked = crate::platform::clock::precise_now();
    marker.cliques();

    // 5. Let go (a held world only once the trace is finished).
    if own_stop {
        world::resume(world);
    }
    drop(guards);
    let resumed = crate::platform::clock::precise_now();
    let pause_ns = resumed.saturating_sub(pause_start);
    if crate::config::flag(&crate::config::OPTIONS.scan_times) {
        let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6;
        sys::warn(&format!(
            "scan {scan}: lock+copy {:.1} ms, sort+index {:.1} ms, arrays {:.1} ms, stop {:.1} ms, roots+mark {:.1} ms, cliques+resume {:.1} ms",
            ms(pause_start, copied),
            ms(copied, sorted),
            ms(sorted, prepared),
            ms(prepared, stopped),
            ms(stopped, marked),
            ms(marked, resumed)
        ));
    }

    let verdicts: Vec<Verdict> = (0..index.len())
        .map(|i| match marker.verdict(i) {
            // Production mode: some word points into the block, from memory
            // the program may still reach or not (everything.rs). The
            // trace's still reachable means referenced there.
            Verdict::PossiblyLost if production => Verdict::StillReachable,
            // Memory went unread: no block is judged lost.
            _ if !planned_whole => Verdict::StillReachable,
            v => v,
        })
        .collect();
    if !planned_whole {
        sys::warn("reachability scan: too many ranges to read: no block judged lost");
    }
    let mut indirect = core::mem::take(&mut marker.indirect);
    if !planned_whole {
        indirect.fill(0);
    }
    drop(marker);
    let bytes = index.blocks.iter().map(Packed::size).sum();
    let stats = ScanStats {
        pause_ns,
        threads: world.threads,
        threads_not_suspended: world.not_suspended,
        root_bytes,
        blocks: index.len() as u64,
        bytes,
        mappings_not_excluded: crate::tracking::allocator_maps::not_kept()
            + crate::platform::heap::UNREGISTERED.load(Ordering::Relaxed),
    };
    if world.not_suspended > 0 {
        sys::warn(&format!(
            "reachability scan: {} threads not suspended: false leaks possible",
            world.not_suspended
        ));
    }
    if stats.mappings_not_excluded > 0 {
        sys::warn(&format!(
            "reachability scan: {} mappings of the allocator or the agent read as roots (their tables were full): missed leaks possible",
            stats.mappings_not_excluded
        ));
    }
    Ok(Outcome {
        scan,
        time,
        trigger,
        blocks: index.blocks,
        verdicts,
        indirect,
        stats,
    })
}

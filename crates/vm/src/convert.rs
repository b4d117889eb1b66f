//! The plugin's raw log, turned into the trace the agent writes: calls
//! nested in another trapped call on the same stack are the allocator's
//! own business and dropped, allocations are judged at their return and
//! releases at their call (before the block can be reused), user stacks
//! are unwound with framehop over the copied stack bytes, and the guest
//! instruction count is the trace's clock.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use trapline_outside::checks::{error_event, mismatch, size_and_align};
use trapline_outside::heap::{Block, Freed, Heap};
use trapline_outside::traps::Trap;
use trapline_trace::event::segment_flags;
use trapline_trace::{
    AllocFn, ChunkWriter, EndCounters, ErrorKind, Event, ExitKind, LockEvent, LockKind, LockMisuse,
    LockMode, LockOp, ModuleInfo, ProcessInfo, Segment, SnapshotKind,
};

use crate::locks::{AtCall, Locks};
use crate::plan::{self, KernelCall, Layout, LockClass, Meaning, SizeFrom, SyncCall};
use crate::raw::{self, Enter, Record, Stack};
use crate::recording::Manifest;
use crate::VmError;

/// As many frames as the agent keeps.
const MAX_FRAMES: usize = 64;
/// x86-64 kernel stacks: 16 KiB, aligned to their size.
const KERNEL_STACK: u64 = 16 << 10;
/// `ZERO_SIZE_PTR`: what kmalloc(0) returns; no block.
const ZERO_SIZE_PTR: u64 = 16;
/// The errors of pthread functions the conversion tells apart (Linux
/// x86-64 values).
const EPERM: i32 = 1;
const EINVAL: i32 = 22;
const EDEADLK: i32 = 35;
const EOWNERDEAD: i32 = 130;

pub struct Input<'a> {
    pub raw: &'a [u8],
    pub layout: &'a Layout,
    pub plan: &'a plan::Plan,
    pub manifest: &'a Manifest,
    pub kernel_map: Option<&'a Path>,
    /// The guest kernel's code symbols (`/proc/kallsyms` lines).
    pub kernel_symbols: Option<&'a str>,
    pub output: &'a Path,
    /// The CPU sampling rate asked for, when the plan samples.
    pub profile_hz: Option<u32>,
}

/// The guest kernel's functions, by start address.
#[derive(Default)]
struct KernelFunctions {
    starts: Vec<(u64, String)>,
}

impl KernelFunctions {
    fn new(text: &str) -> KernelFunctions {
        let mut starts: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (a, kind, name) = (w.next()?, w.next()?, w.next()?);
                if !matches!(kind, "t" | "T") {
                    return None;
                }
                Some((u64::from_str_radix(a, 16).ok()?, name.to_string()))
            })
            .collect();
        starts.sort();
        KernelFunctions { starts }
    }

    fn containing(&self, addr: u64) -> Option<&(u64, String)> {
        let i = self.starts.partition_point(|(s, _)| *s <= addr);
        self.starts.get(i.checked_sub(1)?)
    }

    /// The frames of a kernel stack from the return addresses found on
    /// it: the first is the trapped call's own; a later one is kept when
    /// its call (if direct) went to the function holding the frame inside
    /// it, which drops most stale words a scan finds.
    fn frames(&self, found: &[(u64, u64)]) -> Vec<u64> {
        let mut frames = Vec::new();
        let mut expected = None;
        for &(ra, target) in found {
            let indirect = target == 0
                || self
                    .containing(target)
                    .is_some_and(|(_, n)| n.starts_with("__x86_indirect_"));
            // An indirect call cannot be checked: a stale copy of a frame
            // already seen is dropped at least.
            let fits = frames.is_empty()
                || (indirect && !frames.contains(&ra))
                || expected == Some(target);
            if !fits {
                continue;
            }
            frames.push(ra);
            expected = self.containing(ra - 1).map(|(s, _)| *s);
            if frames.len() == MAX_FRAMES {
                break;
            }
        }
        frames
    }
}

/// What the conversion counted.
#[derive(Default, Debug)]
pub struct Converted {
    pub allocations: u64,
    pub releases: u64,
    pub errors: u64,
    pub kernel_allocations: u64,
    pub kernel_releases: u64,
    /// Calls made inside another trapped call: the allocator's own.
    pub nested: u64,
    /// Calls of other processes (a forked child's): not this trace's.
    pub other_processes: u64,
    /// Releases of blocks allocated before the trace began (the kernel's)
    /// or by the allocator itself (glibc's thread cache).
    pub untracked: u64,
    /// Calls whose return was never seen (a longjmp, a thread killed).
    pub abandoned: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub guest_instructions: u64,
    pub events: u64,
    /// CPU samples of the traced process.
    pub samples: u64,
    /// CPU samples of kernel threads on the process's page tables.
    pub samples_elsewhere: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Context {
    /// A user thread: its address space and thread pointer.
    User(u64, u64),
    /// A kernel stack.
    Kernel(u64),
}

struct Active {
    enter: Enter,
    nested: bool,
    stack: u32,
    /// For a lock acquisition: what it found at its call.
    at_call: AtCall,
}

/// A `pthread_create` awaiting its new thread's first event or its return.
struct Creating {
    call: u64,
    space: u64,
    parent: u32,
}

struct Converter<'a> {
    input: &'a Input<'a>,
    out: ChunkWriter<File>,
    heap: Heap,
    active: HashMap<Context, Vec<Active>>,
    call_context: HashMap<u64, Context>,
    traced_space: Option<u64>,
    /// The traced process's address space is gone.
    ended: bool,
    threads: HashMap<u64, u32>,
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
    symbolizer: trapline_symbols::Symbolizer,
    kernel: KernelFunctions,
    last_time: u64,
    /// Guest nanoseconds per instruction, as a shift (`-icount shift=N`).
    ns_shift: u32,
    locks: Locks,
    creating: Vec<Creating>,
    threads_seen: u32,
    /// The first CPU sample was written, after its `ProfileStart`.
    profiling: bool,
    counts: Converted,
}

/// The word at `addr` of stack bytes copied from `copied_at`.
fn word_at(bytes: &[u8], copied_at: u64, addr: u64) -> Option<u64> {
    let off = usize::try_from(addr.checked_sub(copied_at)?).ok()?;
    let b = bytes.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The return address of a user call: the word at `rsp` at its entry.
fn return_address(e: &Enter) -> Option<u64> {
    let Stack::Raw(bytes) = &e.stack else {
        return None;
    };
    bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn space_of(cr3: u64) -> u64 {
    cr3 & 0x000f_ffff_ffff_e000
}

fn write_error(e: std::io::Error) -> VmError {
    VmError::usage(format!("cannot write the trace: {e}"))
}

/// The `-icount` shift of a recording's clock: each guest instruction
/// takes 2^shift ns of guest time (0 for `shift=auto`, whose rate
/// varies: the trace's time is then the instruction count).
fn icount_shift(clock: &str) -> u32 {
    clock
        .split(',')
        .find_map(|p| p.strip_prefix("shift="))
        .and_then(|n| n.parse().ok())
        .filter(|&n| n < 16)
        .unwrap_or(0)
}

/// Guest instructions between two CPU samples at `hz` samples per
/// second of the guest's clock.
pub fn instructions_per_sample(hz: u32, clock: &str) -> u64 {
    (1_000_000_000 / (u64::from(hz.max(1)) << icount_shift(clock))).max(1)
}

pub fn convert(input: &Input) -> Result<Converted, VmError> {
    let file = File::create(input.output)
        .map_err(|e| VmError::usage(format!("{}: {e}", input.output.display())))?;
    let out = ChunkWriter::new(file).map_err(write_error)?;
    let mut unwinder = UnwinderX86_64::new();
    for (i, m) in input.layout.modules.iter().enumerate() {
        let sections = plan::unwind_sections(m);
        let Some((eh_at, eh)) = sections.eh_frame else {
            continue;
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: sections.text.map(|(a, b)| a..b),
            eh_frame_svma: Some(eh_at..eh_at + eh.len() as u64),
            eh_frame: Some(eh),
            eh_frame_hdr_svma: sections
                .eh_frame_hdr
                .as_ref()
                .map(|(at, h)| *at..*at + h.len() as u64),
            eh_frame_hdr: sections.eh_frame_hdr.map(|(_, h)| h),
            ..Default::default()
        };
        let (start, end) = m.span();
        unwinder.add_module(Module::new(format!("module{i}"), start..end, m.bias, info));
    }
    let mut c = Converter {
        input,
        out,
        heap: Heap::default(),
        active: HashMap::new(),
        call_context: HashMap::new(),
        traced_space: None,
        ended: false,
        threads: HashMap::new(),
        unwinder,
        cache: CacheX86_64::new(),
        symbolizer: trapline_symbols::Symbolizer::new(),
        kernel: input
            .kernel_symbols
            .map(KernelFunctions::new)
            .unwrap_or_default(),
        last_time: 0,
        ns_shift: icount_shift(&input.manifest.icount),
        locks: Locks::default(),
        creating: Vec::new(),
        threads_seen: 0,
        profiling: false,
        counts: Converted::default(),
    };
    c.header()?;
    let mut end_icount = 0;
    for record in raw::Reader::new(input.raw)? {
        match record? {
            Record::Enter(e) => c.enter(e)?,
            Record::Return {
                call,
                icount,
                rax,
                through,
            } => c.returned(call, icount, rax, through)?,
            Record::Sample(sample) => c.sample(sample)?,
            Record::End {
                icount, abandoned, ..
            } => {
                end_icount = icount;
                c.counts.abandoned = abandoned;
            }
        }
    }
    c.finish(end_icount)
}

impl Converter<'_> {
    fn main_tid(&self) -> u32 {
        self.input.manifest.pid
    }

    fn header(&mut self) -> Result<(), VmError> {
        let m = self.input.manifest;
        let mut events = vec![Event::Process(ProcessInfo {
            pid: m.pid,
            ppid: 1,
            start_unix_ns: 0,
            exe: m.program.display().to_string(),
            argv: m.argv.clone(),
        })];
        for (i, module) in self.input.layout.modules.iter().enumerate() {
            let info = ModuleInfo {
                id: i as u32 + 1,
                path: module.path.display().to_string(),
                build_id: module.build_id.clone(),
                bias: module.bias,
                segments: module.segments.clone(),
            };
            self.symbolizer.add_module(&info);
            events.push(Event::ModuleLoad(info));
        }
        if let Some(map) = self.input.kernel_map {
            let path = std::fs::canonicalize(map).unwrap_or(map.to_path_buf());
            events.push(Event::ModuleLoad(ModuleInfo {
                id: self.input.layout.modules.len() as u32 + 1,
                path: path.display().to_string(),
                build_id: Vec::new(),
                bias: 0,
                segments: vec![Segment {
                    start: 0xffff_8000_0000_0000,
                    end: u64::MAX,
                    flags: segment_flags::READ | segment_flags::EXEC,
                }],
            }));
        }
        for ev in &events {
            self.out.push(0, ev).map_err(write_error)?;
        }
        Ok(())
    }

    /// Trace time: the guest clock (the instruction count times the
    /// `-icount` rate), strictly increasing.
    fn time(&mut self, icount: u64) -> u64 {
        let t = (icount << self.ns_shift).max(self.last_time + 1);
        self.last_time = t;
        t
    }

    fn emit(&mut self, tid: u32, ev: &Event) -> Result<(), VmError> {
        self.out.push(tid, ev).map_err(write_error)
    }

    /// A thread number of the trace: the main thread has the process id,
    /// the others follow in order of first appearance.
    fn new_tid(&mut self) -> u32 {
        let tid = self.main_tid() + self.threads_seen;
        self.threads_seen += 1;
        tid
    }

    /// The trace's thread of a user thread pointer. A new
    /// thread's first event is its `ThreadStart`, linked to the
    /// `pthread_create` under way in its process.
    fn thread(&mut self, fs_base: u64, icount: u64) -> Result<u32, VmError> {
        if let Some(&tid) = self.threads.get(&fs_base) {
            return Ok(tid);
        }
        let tid = self.new_tid();
        self.threads.insert(fs_base, tid);
        let space = self.traced_space.unwrap_or(0);
        if let Some(i) = self.creating.iter().rposition(|c| c.space == space) {
            let c = self.creating.remove(i);
            let time = self.time(icount);
            self.emit(
                tid,
                &Event::ThreadStart {
                    time,
                    parent_tid: c.parent,
                    create_id: c.call,
                },
            )?;
        }
        Ok(tid)
    }

    fn context_of(e: &Enter) -> Context {
        if e.rsp >> 63 == 1 {
            Context::Kernel(e.rsp / KERNEL_STACK)
        } else {
            Context::User(space_of(e.cr3), e.fs_base)
        }
    }

    fn enter(&mut self, e: Enter) -> Result<(), VmError> {
        let ctx = Self::context_of(&e);
        if let Context::User(space, _) = ctx {
            let traced = *self.traced_space.get_or_insert(space);
            if traced != space {
                self.counts.other_processes += 1;
                return Ok(());
            }
        }
        let meaning = self.input.plan.traps.get(e.trap as usize).map(|t| t.1);
        let Some(meaning) = meaning else {
            return Err(VmError::damaged(format!(
                "the raw log names trap {}, which the plan lacks",
                e.trap
            )));
        };
        match meaning {
            Meaning::Start => return Ok(()),
            Meaning::End => {
                if self.traced_space == Some(space_of(e.cr3)) {
                    self.ended = true;
                }
                return Ok(());
            }
            _ => {}
        }
        let calls = self.active.entry(ctx).or_default();
        let mut nested = !calls.is_empty();
        let sync = matches!(meaning, Meaning::Sync(c) if c != SyncCall::ThreadEnds);
        if !nested && sync && self.called_by_c_library(&e) {
            // The C library's own locking (the loader's lock, taken in
            // `dl_iterate_phdr`): the agent, at the import slots, never
            // sees it.
            nested = true;
        } else if !nested && self.called_by_loader(&e) {
            // Not the program's: the agent never sees these either.
            self.counts.untracked += 1;
            nested = true;
        }
        let call = e.call;
        let tid = self.tid_of(&e)?;
        let mut stack = 0;
        let mut at_call = AtCall::Free;
        if nested {
            self.counts.nested += 1;
        } else {
            stack = self.stack(tid, &e)?;
            match meaning {
                Meaning::User(Trap::Release(func) | Trap::Delete(func)) => {
                    self.user_release(tid, func, &e, stack)?
                }
                Meaning::Kernel(KernelCall::Release(func, arg)) => {
                    self.kernel_release(tid, func, e.args[arg], e.icount, stack)?
                }
                Meaning::Kernel(KernelCall::ReleaseBulk) => {
                    if let Stack::Words(blocks) = &e.stack {
                        for &addr in blocks {
                            // A cache's free with no cache given is kfree's.
                            let func = if e.args[0] == 0 {
                                AllocFn::Kfree
                            } else {
                                AllocFn::KmemCacheFree
                            };
                            self.kernel_release(tid, func, addr, e.icount, 0)?;
                        }
                    }
                }
                Meaning::Sync(sync) => at_call = self.sync_call(tid, sync, &e, stack)?,
                _ => {}
            }
        }
        self.call_context.insert(call, ctx);
        self.active.entry(ctx).or_default().push(Active {
            enter: e,
            nested,
            stack,
            at_call,
        });
        Ok(())
    }

    fn tid_of(&mut self, e: &Enter) -> Result<u32, VmError> {
        if self.traced_space == Some(space_of(e.cr3)) {
            self.thread(e.fs_base, e.icount)
        } else {
            Ok(self.main_tid())
        }
    }

    fn returned(&mut self, call: u64, icount: u64, rax: u64, through: u64) -> Result<(), VmError> {
        let Some(ctx) = self.call_context.remove(&call) else {
            return Ok(());
        };
        let calls = self.active.entry(ctx).or_default();
        let Some(i) = calls.iter().position(|a| a.enter.call == call) else {
            return Ok(());
        };
        // Calls entered after this one on its stack never returned.
        for gone in calls.drain(i + 1..) {
            self.call_context.remove(&gone.enter.call);
        }
        let active = calls.remove(i);
        if active.nested {
            return Ok(());
        }
        let meaning = self.input.plan.traps[active.enter.trap as usize].1;
        let tid = self.tid_of(&active.enter)?;
        match meaning {
            Meaning::Sync(sync) => self.sync_return(tid, sync, &active, icount, rax, through),
            Meaning::User(Trap::Allocation(func)) => {
                self.user_allocation(tid, func, &active, icount, rax, through)
            }
            Meaning::Kernel(KernelCall::Allocate(func, size_from)) => {
                let size = match size_from {
                    SizeFrom::Arg(n) => active.enter.args[n],
                    SizeFrom::Peeked => active.enter.peeked & 0xffff_ffff,
                };
                self.kernel_allocation(tid, func, 0, size, rax, icount, active.stack)
            }
            Meaning::Kernel(KernelCall::Reallocate) => {
                let (old, size) = (active.enter.args[0], active.enter.args[1]);
                self.kernel_allocation(tid, AllocFn::Krealloc, old, size, rax, icount, active.stack)
            }
            _ => Ok(()),
        }
    }

    /// The stack of a call at its entry: unwound from the copied stack,
    /// or the return addresses found on a kernel stack.
    fn stack(&mut self, tid: u32, e: &Enter) -> Result<u32, VmError> {
        let frames = match &e.stack {
            Stack::None | Stack::Words(_) => return Ok(0),
            Stack::Scanned(found) => self.kernel.frames(found),
            Stack::Raw(bytes) => self.unwind(e.rsp, e.rbp, bytes),
        };
        if frames.is_empty() {
            return Ok(0);
        }
        let (id, new) = self.heap.intern(frames);
        if let Some(frames) = new {
            self.emit(tid, &Event::StackDef { id, frames })?;
        }
        Ok(id)
    }

    /// The stack of a trapped call, from its return address at `rsp`.
    fn unwind(&mut self, rsp: u64, rbp: u64, bytes: &[u8]) -> Vec<u64> {
        let Some(ra) = word_at(bytes, rsp, rsp) else {
            return Vec::new();
        };
        let regs = UnwindRegsX86_64::new(ra, rsp + 8, rbp);
        self.unwind_from(FrameAddress::from_return_address(ra), regs, bytes, rsp)
    }

    /// Frames from `first` (kept) outwards, reading the stack copied from
    /// `copied_at`.
    fn unwind_from(
        &mut self,
        first: Option<FrameAddress>,
        mut regs: UnwindRegsX86_64,
        bytes: &[u8],
        copied_at: u64,
    ) -> Vec<u64> {
        let Some(mut address) = first else {
            return Vec::new();
        };
        let mut frames = vec![address.address()];
        let mut read = |addr: u64| word_at(bytes, copied_at, addr).ok_or(());
        while frames.len() < MAX_FRAMES {
            match self
                .unwinder
                .unwind_frame(address, &mut regs, &mut self.cache, &mut read)
            {
                Ok(Some(next)) if next != 0 => {
                    frames.push(next);
                    match FrameAddress::from_return_address(next) {
                        Some(a) => address = a,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        frames
    }

    /// A CPU sample of the traced process: the interrupted instruction,
    /// then (in the kernel) the user instruction the kernel entered
    /// from, then the user stack's return addresses.
    fn sample(&mut self, s: raw::Sample) -> Result<(), VmError> {
        if self.ended || self.traced_space != Some(space_of(s.cr3)) {
            return Ok(());
        }
        if s.fs_base == 0 && s.rip >> 63 == 1 {
            // A kernel thread (or the idle task) running on the traced
            // process's page tables, which it borrowed: not the process.
            self.counts.samples_elsewhere += 1;
            return Ok(());
        }
        let tid = self.thread(s.fs_base, s.icount)?;
        let time = self.time(s.icount);
        if !self.profiling {
            self.profiling = true;
            let hz = self.input.profile_hz.unwrap_or(0);
            self.emit(
                tid,
                &Event::ProfileStart {
                    time,
                    hz,
                    signal: 0,
                },
            )?;
        }
        let mut frames = Vec::new();
        if s.rip >> 63 == 1 {
            frames.push(s.rip);
        }
        if s.user_rip != 0 {
            let regs = UnwindRegsX86_64::new(s.user_rip, s.user_rsp, s.user_rbp);
            let first = if frames.is_empty() {
                Some(FrameAddress::from_instruction_pointer(s.user_rip))
            } else {
                // Where a system call or a fault returns to.
                FrameAddress::from_return_address(s.user_rip)
            };
            frames.extend(self.unwind_from(first, regs, &s.stack, s.user_rsp));
        }
        frames.truncate(MAX_FRAMES);
        let stack = if frames.is_empty() {
            0
        } else {
            let (id, new) = self.heap.intern(frames);
            if let Some(frames) = new {
                self.emit(tid, &Event::StackDef { id, frames })?;
            }
            id
        };
        self.counts.samples += 1;
        self.emit(
            tid,
            &Event::Sample {
                time,
                stack,
                periods: 1,
            },
        )
    }

    /// A mutex's kind from the word peeked at its call; the others' from
    /// the function.
    fn lock_kind(&mut self, class: LockClass, addr: u64, peeked: u64) -> LockKind {
        match class {
            LockClass::Mutex => self.locks.learn_mutex(addr, peeked),
            LockClass::RwLock => LockKind::RwLock,
            LockClass::Spin => LockKind::Spin,
        }
    }

    /// A pthread call at its entry, as the agent's hook records it before
    /// calling the C library: a contended acquisition's request, a relock,
    /// a release, a destroy, a thread's creation, a join's wait, an exit.
    fn sync_call(
        &mut self,
        tid: u32,
        call: SyncCall,
        e: &Enter,
        stack: u32,
    ) -> Result<AtCall, VmError> {
        let addr = e.args[0];
        let time = self.time(e.icount);
        let ev = match call {
            SyncCall::Acquire(class, mode, op) => {
                let kind = self.lock_kind(class, addr, e.peeked);
                if op == LockOp::Try || kind == LockKind::Unknown {
                    // The call itself says (a trylock; a mutex glibc refuses).
                    return Ok(AtCall::Free);
                }
                let at = self
                    .locks
                    .at_call(tid, addr, kind, mode, op == LockOp::Blocking);
                match at {
                    AtCall::Busy => self.lock_event(
                        tid,
                        LockEvent::Request {
                            time,
                            addr,
                            kind,
                            mode,
                            stack,
                        },
                    )?,
                    // An error-checking mutex refuses at once (recorded
                    // at the return); any other never returns.
                    AtCall::Relock if kind != LockKind::MutexErrorCheck => self.lock_event(
                        tid,
                        LockEvent::Misuse {
                            time,
                            addr,
                            kind,
                            misuse: LockMisuse::SelfDeadlock,
                            errno: EDEADLK,
                            stack,
                        },
                    )?,
                    _ => {}
                }
                return Ok(at);
            }
            SyncCall::Release(LockClass::Spin) if !self.locks.held(addr) => {
                // glibc's pthread_spin_init is pthread_spin_unlock's code,
                // at one address: a release of a spinlock nobody holds is
                // its init, which the agent does not record either.
                return Ok(AtCall::Free);
            }
            SyncCall::Release(class) => {
                let kind = self.lock_kind(class, addr, e.peeked);
                // An unlock by the holder glibc names needs no stack.
                let owned = class == LockClass::Mutex && self.locks.held_by(tid, addr);
                self.locks.released(tid, addr);
                LockEvent::Release {
                    time,
                    addr,
                    kind,
                    stack: if owned { 0 } else { stack },
                    agent_ns: 0,
                }
            }
            SyncCall::Destroy(class) => LockEvent::Destroy {
                time,
                addr,
                kind: self.lock_kind(class, addr, e.peeked),
                stack,
            },
            SyncCall::CondWait => {
                let mutex = e.args[1];
                let owned = self.locks.held_by(tid, mutex);
                self.locks.released(tid, mutex);
                LockEvent::Release {
                    time,
                    addr: mutex,
                    kind: self.locks.mutex_kind(mutex),
                    stack: if owned { 0 } else { stack },
                    agent_ns: 0,
                }
            }
            SyncCall::Create => {
                self.creating.push(Creating {
                    call: e.call,
                    space: space_of(e.cr3),
                    parent: tid,
                });
                let create = Event::ThreadCreate {
                    time,
                    create_id: e.call,
                    stack,
                };
                self.emit(tid, &create)?;
                return Ok(AtCall::Free);
            }
            SyncCall::Join => LockEvent::JoinWait {
                time,
                joined: self.threads.get(&addr).copied().unwrap_or(0),
                stack,
            },
            SyncCall::Exit => LockEvent::Exit { time, stack },
            SyncCall::ThreadEnds if tid != self.main_tid() => {
                return self
                    .emit(tid, &Event::ThreadEnd { time })
                    .map(|_| AtCall::Free);
            }
            SyncCall::ThreadEnds => return Ok(AtCall::Free),
            SyncCall::Init(_) | SyncCall::Detach => return Ok(AtCall::Free),
        };
        self.lock_event(tid, ev)?;
        Ok(AtCall::Free)
    }

    /// A pthread call at its return: the acquisition or failure, a
    /// refusal, an init, a condition wait's mutex held again, a new
    /// thread, a join.
    fn sync_return(
        &mut self,
        tid: u32,
        call: SyncCall,
        active: &Active,
        icount: u64,
        rax: u64,
        through: u64,
    ) -> Result<(), VmError> {
        let e = &active.enter;
        let (addr, stack) = (e.args[0], active.stack);
        let r = rax as u32 as i32;
        let acquired = r == 0 || r == EOWNERDEAD;
        let time = self.time(icount);
        let ev = match call {
            SyncCall::Acquire(class, mode, op) => {
                let kind = match class {
                    LockClass::Mutex => self.locks.mutex_kind(addr),
                    LockClass::RwLock => LockKind::RwLock,
                    LockClass::Spin => LockKind::Spin,
                };
                if acquired {
                    self.locks.acquired(tid, addr, mode);
                    let wait_ns = (active.at_call == AtCall::Busy)
                        .then(|| (icount.saturating_sub(e.icount)) << self.ns_shift);
                    LockEvent::Acquire {
                        time,
                        addr,
                        kind,
                        mode,
                        op,
                        wait_ns,
                        stack,
                    }
                } else {
                    let refused = LockEvent::Misuse {
                        time,
                        addr,
                        kind,
                        misuse: LockMisuse::Refused,
                        errno: r,
                        stack,
                    };
                    if active.at_call == AtCall::Relock {
                        refused
                    } else {
                        if r == EDEADLK {
                            self.lock_event(tid, refused)?;
                        }
                        LockEvent::Failed {
                            time,
                            addr,
                            kind,
                            mode,
                            op,
                            errno: r,
                            stack,
                        }
                    }
                }
            }
            SyncCall::Release(LockClass::Mutex) if r != 0 => LockEvent::Misuse {
                time,
                addr,
                kind: self.locks.mutex_kind(addr),
                misuse: LockMisuse::Refused,
                errno: r,
                stack,
            },
            SyncCall::Init(class) if r == 0 => LockEvent::Init {
                time,
                addr,
                kind: self.lock_kind(class, addr, through),
                stack,
            },
            // Every outcome but a refused call holds the mutex again.
            SyncCall::CondWait if r != EINVAL && r != EPERM => {
                let mutex = e.args[1];
                self.locks.acquired(tid, mutex, LockMode::Exclusive);
                LockEvent::Acquire {
                    time,
                    addr: mutex,
                    kind: self.locks.mutex_kind(mutex),
                    mode: LockMode::Exclusive,
                    op: LockOp::CondWait,
                    wait_ns: None,
                    stack,
                }
            }
            SyncCall::Create => {
                let Some(i) = self.creating.iter().position(|c| c.call == e.call) else {
                    // The new thread has run already: its first event
                    // was its start.
                    return Ok(());
                };
                let c = self.creating.remove(i);
                if r != 0 {
                    return Ok(());
                }
                // A new thread, even where its pthread_t is a detached
                // thread's that ended (glibc reuses cached stacks).
                let child = self.new_tid();
                self.threads.insert(through, child);
                let start = Event::ThreadStart {
                    time,
                    parent_tid: c.parent,
                    create_id: c.call,
                };
                return self.emit(child, &start);
            }
            SyncCall::Join if r == 0 => LockEvent::Join {
                time,
                // Joined, its pthread_t may serve a new thread.
                joined: self.threads.remove(&addr).unwrap_or(0),
                stack,
            },
            SyncCall::Detach if r == 0 => LockEvent::Detach {
                time,
                detached: self.threads.get(&addr).copied().unwrap_or(0),
            },
            _ => return Ok(()),
        };
        self.lock_event(tid, ev)
    }

    fn lock_event(&mut self, tid: u32, ev: LockEvent) -> Result<(), VmError> {
        self.emit(tid, &Event::Lock(ev))
    }

    fn user_allocation(
        &mut self,
        tid: u32,
        func: AllocFn,
        active: &Active,
        icount: u64,
        rax: u64,
        through: u64,
    ) -> Result<(), VmError> {
        let [arg0, arg1, arg2, ..] = active.enter.args;
        let (size, align) = size_and_align(func, [arg0, arg1, arg2]);
        let addr = match func {
            AllocFn::PosixMemalign if rax as i32 == 0 => through,
            AllocFn::PosixMemalign => 0,
            _ => rax,
        };
        let stack = active.stack;
        let time = self.time(icount);
        let resize = matches!(func, AllocFn::Realloc | AllocFn::ReallocArray);
        if addr == 0 && size > 0 {
            return self.emit(
                tid,
                &Event::AllocFailed {
                    time,
                    func,
                    size,
                    align,
                    stack,
                },
            );
        }
        let old = if resize { arg0 } else { 0 };
        if old != 0 && self.heap.released(old, stack).is_none() {
            // A realloc of no live block: glibc has already judged it (and
            // aborts on a bad one); report it as the agent does.
            let freed = self.heap.freed_lately(old);
            self.report(
                tid,
                time,
                ErrorKind::InvalidRealloc,
                func,
                old,
                stack,
                freed,
                true,
                0,
            )?;
            return Ok(());
        }
        self.counts.allocations += 1;
        if addr != 0 {
            self.heap.allocated(addr, Block { size, func, stack });
        } else if old == 0 {
            return Ok(());
        }
        let ev = if resize {
            Event::Realloc {
                time,
                old_addr: old,
                new_addr: addr,
                size: if addr == 0 { 0 } else { size },
                func,
                stack,
            }
        } else {
            Event::Alloc {
                time,
                addr,
                size,
                align,
                func,
                stack,
            }
        };
        self.emit(tid, &ev)
    }

    fn user_release(
        &mut self,
        tid: u32,
        func: AllocFn,
        e: &Enter,
        stack: u32,
    ) -> Result<(), VmError> {
        let addr = e.args[0];
        if addr == 0 {
            return Ok(());
        }
        let time = self.time(e.icount);
        if let Some(block) = self.heap.released(addr, stack) {
            self.counts.releases += 1;
            self.emit(
                tid,
                &Event::Free {
                    time,
                    addr,
                    func,
                    stack,
                },
            )?;
            if let Some((kind, given)) = mismatch(func, block, e.args[1], e.args[2]) {
                let known = Freed {
                    block,
                    free_stack: 0,
                };
                self.report(tid, time, kind, func, addr, stack, Some(known), true, given)?;
            }
            return Ok(());
        }
        if self.by_allocator_teardown(e) {
            // glibc's thread cache at its thread's end: the cache itself
            // (allocated without malloc) and the blocks the program freed
            // into it, released again by glibc's own free.
            self.counts.untracked += 1;
            return Ok(());
        }
        let freed = self.heap.freed_lately(addr);
        let kind = match freed {
            Some(_) => ErrorKind::DoubleFree,
            None => ErrorKind::InvalidFree,
        };
        // The guest's C library got the call (and judged it itself).
        self.report(tid, time, kind, func, addr, stack, freed, true, 0)
    }

    /// Whether a user call was made by the dynamic loader itself (a
    /// thread's TLS, its DTV).
    fn called_by_loader(&self, e: &Enter) -> bool {
        let (Some((start, end)), Some(ra)) = (self.input.layout.loader, return_address(e)) else {
            return false;
        };
        (start..end).contains(&ra)
    }

    /// Whether a user call was made from inside the library that defines
    /// the function (or by the loader).
    fn called_by_c_library(&self, e: &Enter) -> bool {
        let Some(ra) = return_address(e) else {
            return false;
        };
        let home = self
            .input
            .layout
            .modules
            .iter()
            .map(plan::Loaded::span)
            .find(|(a, b)| (*a..*b).contains(&e.rip));
        home.is_some_and(|(a, b)| (a..b).contains(&ra)) || self.called_by_loader(e)
    }

    /// Whether a release was called by the C library's own teardown.
    fn by_allocator_teardown(&mut self, e: &Enter) -> bool {
        let Some(ra) = return_address(e) else {
            return false;
        };
        self.symbolizer.symbolize(ra).iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|n| n.starts_with("tcache_") || n.contains("freeres"))
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        tid: u32,
        time: u64,
        kind: ErrorKind,
        func: AllocFn,
        addr: u64,
        stack: u32,
        known: Option<Freed>,
        passed_on: bool,
        given: u64,
    ) -> Result<(), VmError> {
        self.counts.errors += 1;
        let ev = error_event(time, kind, func, addr, stack, known, passed_on, given);
        self.emit(tid, &ev)
    }

    #[allow(clippy::too_many_arguments)]
    fn kernel_allocation(
        &mut self,
        tid: u32,
        func: AllocFn,
        old: u64,
        size: u64,
        addr: u64,
        icount: u64,
        stack: u32,
    ) -> Result<(), VmError> {
        let block = |a: u64| a > ZERO_SIZE_PTR && a >> 63 == 1;
        if !block(addr) && !block(old) {
            return Ok(());
        }
        let time = self.time(icount);
        let old_known = block(old) && self.heap.released(old, stack).is_some();
        if block(addr) {
            self.heap.allocated(addr, Block { size, func, stack });
        }
        self.counts.kernel_allocations += 1;
        let ev = if old_known {
            Event::Realloc {
                time,
                old_addr: old,
                new_addr: if block(addr) { addr } else { 0 },
                size: if block(addr) { size } else { 0 },
                func,
                stack,
            }
        } else if block(addr) {
            Event::Alloc {
                time,
                addr,
                size,
                align: 0,
                func,
                stack,
            }
        } else {
            return Ok(());
        };
        self.emit(tid, &ev)
    }

    fn kernel_release(
        &mut self,
        tid: u32,
        func: AllocFn,
        addr: u64,
        icount: u64,
        stack: u32,
    ) -> Result<(), VmError> {
        if addr <= ZERO_SIZE_PTR {
            return Ok(());
        }
        if self.heap.released(addr, stack).is_none() {
            // Allocated before the traced process started, or by another.
            self.counts.untracked += 1;
            return Ok(());
        }
        self.counts.kernel_releases += 1;
        let time = self.time(icount);
        self.emit(
            tid,
            &Event::Free {
                time,
                addr,
                func,
                stack,
            },
        )
    }

    fn finish(mut self, end_icount: u64) -> Result<Converted, VmError> {
        let tid = self.main_tid();
        // After the last event: where QEMU noticed the power-off differs
        // between replays.
        let time = self.time(0);
        self.emit(
            tid,
            &Event::SnapshotBegin {
                time,
                kind: SnapshotKind::Exit,
            },
        )?;
        let (events, blocks, bytes) = self.heap.live_snapshot();
        for ev in &events {
            self.emit(tid, ev)?;
        }
        let status = self.input.manifest.exit_status;
        let exit = if status > 128 {
            ExitKind::Signal(status - 128)
        } else {
            ExitKind::Code(status)
        };
        let counters = EndCounters {
            events: self.out.written + 1,
            events_lost: 0,
            untracked_calls: self.counts.untracked,
        };
        let time = self.time(0);
        self.emit(
            tid,
            &Event::End {
                time,
                exit,
                counters,
            },
        )?;
        self.counts.live_blocks = blocks;
        self.counts.live_bytes = bytes;
        self.counts.guest_instructions = end_icount;
        self.counts.events = self.out.written;
        self.out.finish().map_err(write_error)?;
        Ok(self.counts)
    }
}

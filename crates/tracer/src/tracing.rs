//! The recording loop: every stop of every thread of the program, in the
//! order the kernel reports them, becomes the agent's events.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::sys::ptrace::{self, Event as PtraceEvent};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use trapline_trace::{
    AllocFn, ChunkWriter, EndCounters, ErrorKind, Event, ExitKind, ModuleInfo, ProcessInfo,
    Segment, SnapshotKind,
};

use crate::elf::{self, Entry, Program, Trap};
use crate::remote::Memory;
use crate::scan;
use crate::stubs::{self, Stop, Stubs};
use crate::unwind::StackUnwinder;
use trapline_outside::checks::{error_event, mismatch, size_and_align};
use trapline_outside::heap::{Block, Freed, Heap};

/// What to record.
pub struct Request {
    /// trapline's own executable, run again to start the program traced.
    pub self_exe: PathBuf,
    pub program: PathBuf,
    /// The program's arguments, `argv[0]` first.
    pub argv: Vec<OsString>,
    /// The trace, created and empty.
    pub output: File,
    /// Pass invalid releases on to the C library (`--pass-invalid-frees`).
    pub pass_invalid: bool,
    /// Judge the live blocks at exit (`--no-scan` clears it: the snapshot
    /// lists them unjudged).
    pub scan: bool,
}

/// How the program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

pub struct Outcome {
    pub pid: u32,
    pub ended: Ended,
    /// Trapped functions that could not be detoured, and why.
    pub refused: Vec<(String, String)>,
}

/// Records the program until it ends. `started` is called with its pid
/// once it runs (to forward signals, arm a timeout).
pub fn record(req: Request, started: impl FnOnce(u32)) -> Result<Outcome, String> {
    let data = std::fs::read(&req.program)
        .map_err(|e| format!("cannot read {}: {e}", req.program.display()))?;
    let program = elf::read(&data).map_err(|e| format!("{}: {e}", req.program.display()))?;
    drop(data);
    if !program.entries.iter().any(|e| e.name == "malloc") {
        return Err(format!(
            "{} is statically linked without a malloc of its own that trapline can find (a stripped symbol table?), so it cannot be traced",
            req.program.display()
        ));
    }
    let pid = crate::launch::spawn(&req.self_exe, &req.program, &req.argv)?;
    let mut recorder = match Recorder::start(pid, &req, program) {
        Ok(r) => r,
        Err(e) => {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            return Err(e);
        }
    };
    started(pid.as_raw() as u32);
    let ended = recorder.run()?;
    Ok(Outcome {
        pid: pid.as_raw() as u32,
        ended,
        refused: recorder.refused,
    })
}

/// Where a trapped call returns to: the return address, and the caller's
/// stack and frame pointers as they are after the return.
#[derive(Clone, Copy)]
struct Caller {
    ra: u64,
    sp: u64,
    bp: u64,
}

impl Caller {
    /// At a stop on a function's first instruction (`ra` read at rsp).
    fn at_call(ra: u64, regs: &nix::libc::user_regs_struct) -> Caller {
        Caller {
            ra,
            sp: regs.rsp + 8,
            bp: regs.rbp,
        }
    }
}

#[derive(Default)]
struct ThreadState {
    /// Trapped allocating calls this thread is inside.
    depth: u32,
}

struct Recorder {
    pid: Pid,
    mem: Memory,
    program: Program,
    stubs: Stubs,
    layout: scan::Layout,
    unwinder: StackUnwinder,
    heap: Heap,
    /// The trace, until its `End` is written.
    out: Option<ChunkWriter<File>>,
    threads: HashMap<Pid, ThreadState>,
    /// Threads created but not yet seen at their first stop.
    new_threads: HashSet<Pid>,
    /// Threads or children seen at their first stop before the event that
    /// tells which they are: held stopped until it comes.
    unannounced: HashSet<Pid>,
    /// Stack pointers of threads at their end: their stacks are no roots
    /// unless a live thread runs on one again.
    ended_stacks: Vec<u64>,
    /// Releases the C library made of blocks it allocated itself, inside
    /// its allocator (a thread's tcache at its exit): passed on, counted.
    untracked_calls: u64,
    /// Forked children, to be restored and let go at their first stop.
    forked: HashSet<Pid>,
    /// vfork children: they share the program's memory, stubs included,
    /// until they execute or exit; their stops are passed over.
    vforked: HashSet<Pid>,
    /// Stops taken while stopping every thread, handled after.
    deferred: VecDeque<WaitStatus>,
    /// Threads interrupted by the recorder, not yet seen stopping for it.
    interrupt_due: HashSet<Pid>,
    started: Instant,
    last_time: u64,
    create_ids: u64,
    snapshot_taken: bool,
    pass_invalid: bool,
    scan: bool,
    refused: Vec<(String, String)>,
}

impl Recorder {
    fn start(pid: Pid, req: &Request, program: Program) -> Result<Recorder, String> {
        let mem = Memory::open(pid)?;
        let exe_path = std::fs::canonicalize(&req.program).unwrap_or(req.program.clone());
        let (start, end) = exe_extent(pid, &exe_path)?;
        let lowest = program.segments.iter().map(|s| s.vaddr).min().unwrap_or(0) & !0xfff;
        let bias = if program.relocatable {
            start - lowest
        } else {
            0
        };
        let (stubs, refused) = stubs::install(pid, &mem, &program.entries, bias, start, end)?;
        if refused
            .iter()
            .any(|(name, _)| name == "malloc" || name == "free")
        {
            let (name, why) = refused
                .iter()
                .find(|(n, _)| n == "malloc" || n == "free")
                .expect("just found");
            return Err(format!(
                "{}'s {name} cannot be patched ({why}), so it cannot be traced",
                req.program.display()
            ));
        }
        let unwinder = StackUnwinder::new(&program, bias, start, end);
        let layout = scan::Layout {
            data: program
                .segments
                .iter()
                .filter(|s| s.flags & trapline_trace::event::segment_flags::WRITE != 0)
                .map(|s| (s.vaddr + bias, s.vaddr + bias + s.memsz))
                .collect(),
            excluded: vec![(stubs.page, stubs.page + stubs::PAGE)],
            tls_size: program.tls_size,
            relro: program.relro.map(|(a, b)| (a + bias, b + bias)),
            allocator_teardown: elf::rebased(&program.allocator_teardown, bias),
            loader_code: elf::rebased(&program.loader_code, bias),
        };
        let mut out = ChunkWriter::new(req.output.try_clone().map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write the trace: {e}"))?;
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let header = [
            Event::Process(ProcessInfo {
                pid: pid.as_raw() as u32,
                ppid: std::process::id(),
                start_unix_ns,
                exe: exe_path.display().to_string(),
                argv: req
                    .argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
            }),
            Event::ModuleLoad(ModuleInfo {
                id: 1,
                path: exe_path.display().to_string(),
                build_id: program.build_id.clone(),
                bias,
                segments: program
                    .segments
                    .iter()
                    .map(|s| Segment {
                        start: s.vaddr + bias,
                        end: s.vaddr + bias + s.memsz,
                        flags: s.flags,
                    })
                    .collect(),
            }),
        ];
        for ev in &header {
            out.push(0, ev).map_err(write_error)?;
        }
        let mut threads = HashMap::new();
        threads.insert(pid, ThreadState::default());
        Ok(Recorder {
            pid,
            mem,
            program,
            stubs,
            layout,
            unwinder,
            heap: Heap::default(),
            out: Some(out),
            threads,
            new_threads: HashSet::new(),
            unannounced: HashSet::new(),
            ended_stacks: Vec::new(),
            untracked_calls: 0,
            forked: HashSet::new(),
            vforked: HashSet::new(),
            deferred: VecDeque::new(),
            interrupt_due: HashSet::new(),
            started: Instant::now(),
            last_time: 0,
            create_ids: 0,
            snapshot_taken: false,
            pass_invalid: req.pass_invalid,
            scan: req.scan,
            refused,
        })
    }

    /// Trace time: nanoseconds since the start, strictly increasing.
    fn now(&mut self) -> u64 {
        let t = (self.started.elapsed().as_nanos() as u64).max(self.last_time + 1);
        self.last_time = t;
        t
    }

    fn emit(&mut self, tid: Pid, ev: &Event) -> Result<(), String> {
        match self.out.as_mut() {
            Some(out) => out.push(tid.as_raw() as u32, ev).map_err(write_error),
            None => Ok(()),
        }
    }

    /// The id of the stack of a call from `caller`; its definition is
    /// written first when new.
    fn stack(&mut self, tid: Pid, caller: Caller) -> Result<u32, String> {
        let frames = self
            .unwinder
            .stack(&self.mem, caller.ra, caller.sp, caller.bp);
        let (id, new) = self.heap.intern(frames);
        if let Some(frames) = new {
            self.emit(tid, &Event::StackDef { id, frames })?;
        }
        Ok(id)
    }

    fn run(&mut self) -> Result<Ended, String> {
        ptrace::cont(self.pid, None).map_err(|e| format!("cannot start the program: {e}"))?;
        loop {
            let status = match self.deferred.pop_front() {
                Some(s) => s,
                None => match waitpid(None, Some(WaitPidFlag::__WALL)) {
                    Ok(s) => s,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(format!("waiting for the program failed: {e}")),
                },
            };
            if let Some(ended) = self.handle(status)? {
                return Ok(ended);
            }
        }
    }

    /// Handles one stop or exit; the program's end once its main thread
    /// is gone.
    fn handle(&mut self, status: WaitStatus) -> Result<Option<Ended>, String> {
        match status {
            WaitStatus::Exited(tid, code) => self.gone(tid, Ended::Code(code)),
            WaitStatus::Signaled(tid, sig, _) => self.gone(tid, Ended::Signal(sig as i32)),
            WaitStatus::Stopped(tid, sig) => {
                self.stopped(tid, sig)?;
                Ok(None)
            }
            WaitStatus::PtraceEvent(tid, _, event) => {
                self.event(tid, event)?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    fn gone(&mut self, tid: Pid, ended: Ended) -> Result<Option<Ended>, String> {
        if self.vforked.remove(&tid) || self.forked.remove(&tid) {
            return Ok(None);
        }
        if tid != self.pid {
            if self.threads.remove(&tid).is_some() {
                let time = self.now();
                self.emit(tid, &Event::ThreadEnd { time })?;
            }
            return Ok(None);
        }
        let time = self.now();
        let exit = match ended {
            Ended::Code(c) => ExitKind::Code(c),
            Ended::Signal(s) => ExitKind::Signal(s),
        };
        let counters = EndCounters {
            events: self.out.as_ref().map_or(0, |o| o.written) + 1,
            events_lost: 0,
            untracked_calls: 0,
        };
        self.emit(
            tid,
            &Event::End {
                time,
                exit,
                counters,
            },
        )?;
        if let Some(out) = self.out.take() {
            out.finish().map_err(write_error)?;
        }
        Ok(Some(ended))
    }

    fn stopped(&mut self, tid: Pid, sig: Signal) -> Result<(), String> {
        if sig == Signal::SIGTRAP {
            let regs = ptrace::getregs(tid).map_err(|e| format!("cannot read registers: {e}"))?;
            if let Some(stop) = self.stubs.stop_at(regs.rip, &self.program.entries) {
                if self.vforked.contains(&tid) {
                    return resume(tid, None);
                }
                return self.trapped(tid, stop, regs);
            }
        }
        // The program's own signal: delivered as it would be.
        resume(tid, Some(sig))
    }

    fn event(&mut self, tid: Pid, event: i32) -> Result<(), String> {
        if event == PTRACE_EVENT_STOP {
            // A new thread's or child's first stop, an interrupt of the
            // recorder's seen late, or a group stop (job control), which
            // the program is let out of.
            if self.forked.contains(&tid) {
                return self.let_fork_go(tid);
            }
            if self.new_threads.remove(&tid) {
                self.threads.entry(tid).or_default();
            } else if !self.threads.contains_key(&tid) && !self.vforked.contains(&tid) {
                // A first stop that came before its creator's event: a
                // thread or a child, told apart when that event comes.
                self.unannounced.insert(tid);
                return Ok(());
            }
            self.interrupt_due.remove(&tid);
            return resume(tid, None);
        }
        let msg = || ptrace::getevent(tid).map(|m| Pid::from_raw(m as i32));
        if event == PtraceEvent::PTRACE_EVENT_CLONE as i32 && !self.vforked.contains(&tid) {
            if let Ok(child) = msg() {
                self.create_ids += 1;
                let create_id = self.create_ids;
                let time = self.now();
                self.emit(
                    tid,
                    &Event::ThreadCreate {
                        time,
                        create_id,
                        stack: 0,
                    },
                )?;
                let time = self.now();
                self.emit(
                    child,
                    &Event::ThreadStart {
                        time,
                        parent_tid: tid.as_raw() as u32,
                        create_id,
                    },
                )?;
                if self.unannounced.remove(&child) {
                    self.threads.entry(child).or_default();
                    resume(child, None)?;
                } else if !self.threads.contains_key(&child) {
                    self.new_threads.insert(child);
                }
            }
        } else if event == PtraceEvent::PTRACE_EVENT_FORK as i32 {
            if let Ok(child) = msg() {
                self.forked.insert(child);
                if self.unannounced.remove(&child) {
                    self.let_fork_go(child)?;
                }
            }
        } else if event == PtraceEvent::PTRACE_EVENT_VFORK as i32 {
            if let Ok(child) = msg() {
                self.vforked.insert(child);
                if self.unannounced.remove(&child) {
                    resume(child, None)?;
                }
            }
        } else if event == PtraceEvent::PTRACE_EVENT_EXEC as i32 {
            if self.vforked.remove(&tid) {
                let _ = ptrace::detach(tid, None);
                return Ok(());
            }
        } else if event == PtraceEvent::PTRACE_EVENT_EXIT as i32 && tid != self.pid {
            // A thread ends: its stack (kept in glibc's cache) holds only
            // dead pointers from now on.
            if let Ok(regs) = ptrace::getregs(tid) {
                self.ended_stacks.push(regs.rsp);
            }
        } else if event == PtraceEvent::PTRACE_EVENT_EXIT as i32
            && tid == self.pid
            && !self.snapshot_taken
        {
            // Ended without exit(): _exit or a fatal signal. Its memory is
            // still there.
            self.snapshot(tid, false)?;
        }
        resume(tid, None)
    }

    /// A forked child at its first stop: its copy of the program gets its
    /// entries back, and it runs on untraced.
    fn let_fork_go(&mut self, child: Pid) -> Result<(), String> {
        self.forked.remove(&child);
        if let Ok(mem) = Memory::open(child) {
            for (addr, original) in &self.stubs.patched {
                let _ = mem.write(*addr, original);
            }
        }
        let _ = ptrace::detach(child, None);
        Ok(())
    }

    fn trapped(
        &mut self,
        tid: Pid,
        stop: Stop,
        mut regs: nix::libc::user_regs_struct,
    ) -> Result<(), String> {
        let entry: Entry = match stop {
            Stop::Call(i) | Stop::Return(i) => self.program.entries[i].clone(),
        };
        let depth = &mut self.threads.entry(tid).or_default().depth;
        match (stop, entry.trap) {
            (Stop::Call(_), Trap::Allocation(func)) => {
                let outermost = *depth == 0;
                *depth += 1;
                let old = regs.rdi;
                if outermost
                    && matches!(func, AllocFn::Realloc | AllocFn::ReallocArray)
                    && old != 0
                    && !self.heap.live.contains_key(&old)
                {
                    let ra = self.word(regs.rsp)?;
                    if !self.invalid_realloc(tid, func, old, Caller::at_call(ra, &regs))? {
                        // Like memcheck: the bad call does nothing and
                        // returns NULL, never reaching the C library.
                        self.threads.entry(tid).or_default().depth -= 1;
                        regs.rip = ra;
                        regs.rsp += 8;
                        regs.rax = 0;
                        ptrace::setregs(tid, regs)
                            .map_err(|e| format!("cannot set registers: {e}"))?;
                    }
                }
                resume(tid, None)
            }
            (Stop::Return(_), Trap::Allocation(func)) => {
                *depth = depth.saturating_sub(1);
                if *depth > 0 {
                    return resume(tid, None);
                }
                self.allocation_returned(tid, func, &regs)?;
                resume(tid, None)
            }
            (Stop::Call(_), Trap::Release(func) | Trap::Delete(func)) => {
                let wraps = matches!(entry.trap, Trap::Delete(_));
                if *depth > 0 || regs.rdi == 0 {
                    *depth += u32::from(wraps);
                    return resume(tid, None);
                }
                let ra = self.word(regs.rsp)?;
                let pass = self.release(tid, func, &regs, Caller::at_call(ra, &regs))?;
                if !pass {
                    // Returned from at once: the C library never sees it.
                    regs.rip = ra;
                    regs.rsp += 8;
                    ptrace::setregs(tid, regs).map_err(|e| format!("cannot set registers: {e}"))?;
                } else if wraps {
                    self.threads.entry(tid).or_default().depth += 1;
                }
                resume(tid, None)
            }
            (Stop::Return(_), Trap::Delete(_)) => {
                *depth = depth.saturating_sub(1);
                resume(tid, None)
            }
            (Stop::Call(_), Trap::Exit) => {
                if !self.snapshot_taken {
                    self.snapshot(tid, true)?;
                }
                resume(tid, None)
            }
            _ => resume(tid, None),
        }
    }

    fn word(&self, addr: u64) -> Result<u64, String> {
        self.mem
            .word(addr)
            .ok_or_else(|| format!("cannot read the program's stack at {addr:#x}"))
    }

    /// An allocating call returned: the saved arguments are at rsp, the
    /// return address above them.
    fn allocation_returned(
        &mut self,
        tid: Pid,
        func: AllocFn,
        regs: &nix::libc::user_regs_struct,
    ) -> Result<(), String> {
        let (arg2, arg1, arg0) = (
            self.word(regs.rsp)?,
            self.word(regs.rsp + 8)?,
            self.word(regs.rsp + 16)?,
        );
        let ra = self.word(regs.rsp + 24)?;
        let result = regs.rax;
        let (size, align) = size_and_align(func, [arg0, arg1, arg2]);
        let addr = if func == AllocFn::PosixMemalign {
            if result as i32 == 0 {
                self.word(arg0)?
            } else {
                0
            }
        } else {
            result
        };
        let caller = Caller {
            ra,
            sp: regs.rsp + 32,
            bp: regs.rbp,
        };
        let stack = self.stack(tid, caller)?;
        let time = self.now();
        let resize = matches!(func, AllocFn::Realloc | AllocFn::ReallocArray);
        if addr == 0 && size > 0 {
            // Failed: a realloc's block stays as it was.
            let ev = Event::AllocFailed {
                time,
                func,
                size,
                align,
                stack,
            };
            return self.emit(tid, &ev);
        }
        let old = if resize { arg0 } else { 0 };
        if old != 0 {
            self.heap.released(old, stack);
        }
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

    /// A release at its call (`regs`: its arguments); whether to let it
    /// go on.
    fn release(
        &mut self,
        tid: Pid,
        func: AllocFn,
        regs: &nix::libc::user_regs_struct,
        caller: Caller,
    ) -> Result<bool, String> {
        let addr = regs.rdi;
        let stack = self.stack(tid, caller)?;
        let time = self.now();
        if let Some(block) = self.heap.released(addr, stack) {
            self.emit(
                tid,
                &Event::Free {
                    time,
                    addr,
                    func,
                    stack,
                },
            )?;
            if let Some((kind, given)) = mismatch(func, block, regs.rsi, regs.rdx) {
                // Released all the same, as the agent does.
                let known = Freed {
                    block,
                    free_stack: 0,
                };
                self.report(tid, time, kind, func, addr, stack, Some(known), true, given)?;
            }
            return Ok(true);
        }
        if self.in_allocator(caller.ra) {
            // The allocator's own teardown (glibc's tcache at a thread's
            // end): the cache, allocated without its entry point, and the
            // blocks the program freed into it, released again.
            self.untracked_calls += 1;
            return Ok(true);
        }
        let freed = self.heap.freed_lately(addr);
        let kind = match freed {
            Some(_) => ErrorKind::DoubleFree,
            None => ErrorKind::InvalidFree,
        };
        let pass = self.pass_invalid;
        self.report(tid, time, kind, func, addr, stack, freed, pass, 0)?;
        Ok(pass)
    }

    /// Writes an `Error` event; `known`: the block's allocation (and its
    /// release, when freed before). A refused call is passed on only with
    /// `--pass-invalid-frees`.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        tid: Pid,
        time: u64,
        kind: ErrorKind,
        func: AllocFn,
        addr: u64,
        stack: u32,
        known: Option<Freed>,
        passed_on: bool,
        given: u64,
    ) -> Result<(), String> {
        let ev = error_event(time, kind, func, addr, stack, known, passed_on, given);
        self.emit(tid, &ev)
    }

    /// Whether a call returning to `ra` was made by the allocator's own
    /// teardown code (`elf::Program::allocator_teardown`).
    fn in_allocator(&self, ra: u64) -> bool {
        elf::range_of(&self.layout.allocator_teardown, ra.wrapping_sub(1)).is_some()
    }

    /// A realloc of `old`, which is no live block; whether to let it go on.
    fn invalid_realloc(
        &mut self,
        tid: Pid,
        func: AllocFn,
        old: u64,
        caller: Caller,
    ) -> Result<bool, String> {
        let stack = self.stack(tid, caller)?;
        let time = self.now();
        let freed = self.heap.freed_lately(old);
        let pass = self.pass_invalid;
        self.report(
            tid,
            time,
            ErrorKind::InvalidRealloc,
            func,
            old,
            stack,
            freed,
            pass,
            0,
        )?;
        Ok(pass)
    }

    /// The exit snapshot: every live block, judged with the program's
    /// threads stopped. `at_exit_call`: `tid` is stopped at `exit`'s first
    /// instruction (else at its own end).
    fn snapshot(&mut self, tid: Pid, at_exit_call: bool) -> Result<(), String> {
        self.snapshot_taken = true;
        let time = self.now();
        self.emit(
            tid,
            &Event::SnapshotBegin {
                time,
                kind: SnapshotKind::Exit,
            },
        )?;
        if !self.scan {
            let (events, _, _) = self.heap.live_snapshot();
            for ev in &events {
                self.emit(tid, ev)?;
            }
            return Ok(());
        }
        // Every thread stopped, so that the snapshot is of one moment.
        let stopped = self.stop_others(tid)?;
        let threads = self.stopped_threads(&stopped, at_exit_call);
        let judged = crate::scan::judge(
            self.pid.as_raw() as u32,
            &self.mem,
            &self.heap,
            &threads,
            &self.ended_stacks,
            &self.layout,
            time,
        );
        self.resume_others(&stopped)?;
        let (events, blocks, bytes) = judged?;
        for ev in &events {
            self.emit(tid, ev)?;
        }
        self.emit(tid, &Event::SnapshotEnd { blocks, bytes })
    }

    /// The stopped threads' registers and live stacks, the first's as at
    /// a call of `exit` when `at_exit_call`: its live frames start at the
    /// caller's, and only its callee-saved registers are still the caller's.
    fn stopped_threads(&self, tids: &[Pid], at_exit_call: bool) -> Vec<scan::StoppedThread> {
        /// Below a stopped thread's stack pointer, a leaf function may keep
        /// data (the x86-64 red zone).
        const RED_ZONE: u64 = 128;
        tids.iter()
            .enumerate()
            .filter_map(|(k, &t)| {
                let r = ptrace::getregs(t).ok()?;
                let callee_saved = vec![r.rbx, r.rbp, r.r12, r.r13, r.r14, r.r15];
                Some(if k == 0 && at_exit_call {
                    scan::StoppedThread {
                        sp: r.rsp + 8,
                        registers: callee_saved,
                        fs_base: r.fs_base,
                    }
                } else {
                    let mut registers = callee_saved;
                    registers.extend([r.rax, r.rcx, r.rdx, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11]);
                    scan::StoppedThread {
                        sp: r.rsp.saturating_sub(RED_ZONE),
                        registers,
                        fs_base: r.fs_base,
                    }
                })
            })
            .collect()
    }

    /// Stops every other thread of the program (each stop that comes
    /// before the recorder's interrupt is kept for later); the threads
    /// stopped, `tid` first.
    fn stop_others(&mut self, tid: Pid) -> Result<Vec<Pid>, String> {
        let mut stopped = vec![tid];
        let others: Vec<Pid> = self.threads.keys().copied().filter(|&t| t != tid).collect();
        for t in others {
            if self.deferred.iter().any(|s| s.pid() == Some(t)) {
                stopped.push(t);
                continue;
            }
            if ptrace::interrupt(t).is_err() {
                continue;
            }
            loop {
                match waitpid(t, Some(WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::PtraceEvent(_, _, PTRACE_EVENT_STOP)) => {
                        stopped.push(t);
                        break;
                    }
                    Ok(s @ (WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..))) => {
                        self.deferred.push_back(s);
                        self.interrupt_due.insert(t);
                        stopped.push(t);
                        break;
                    }
                    Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => {
                        self.deferred.push_back(s);
                        break;
                    }
                    Ok(_) | Err(Errno::EINTR) => continue,
                    Err(_) => break,
                }
            }
        }
        Ok(stopped)
    }

    /// Resumes the threads `stop_others` interrupted.
    fn resume_others(&mut self, stopped: &[Pid]) -> Result<(), String> {
        for &t in &stopped[1..] {
            let held = self.deferred.iter().any(|s| s.pid() == Some(t));
            if !held {
                let _ = ptrace::cont(t, None);
            }
        }
        Ok(())
    }
}

/// `PTRACE_EVENT_STOP`: a seized thread's interrupt, first or group stop.
const PTRACE_EVENT_STOP: i32 = 128;

fn resume(tid: Pid, sig: Option<Signal>) -> Result<(), String> {
    match ptrace::cont(tid, sig) {
        // The thread was killed meanwhile (another thread's exit_group).
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(format!("cannot resume thread {tid}: {e}")),
    }
}

fn write_error(e: std::io::Error) -> String {
    format!("cannot write the trace: {e}")
}

/// Where the program is mapped: the lowest and highest addresses of the
/// mappings of its file.
fn exe_extent(pid: Pid, exe: &Path) -> Result<(u64, u64), String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read the program's mappings: {e}"))?;
    let mut extent: Option<(u64, u64)> = None;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let Some(range) = fields.next() else { continue };
        let path = fields.nth(4).unwrap_or("");
        if Path::new(path) != exe {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        extent = Some(extent.map_or((a, b), |(lo, hi)| (lo.min(a), hi.max(b))));
    }
    extent.ok_or_else(|| format!("{} is not mapped in the started process", exe.display()))
}

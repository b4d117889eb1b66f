//! Report types shared by the analyses: the JSON schema's common parts, and
//! the helpers that collect trace-wide facts and render text.
//!
//! Every type here is part of the stable JSON schema documented in
//! `docs/json-schema.md`: fields may be added, never renamed or removed.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Serialize, Serializer};
use trapline_symbols::{Frame, Symbolizer};
use trapline_trace::{EndCounters, Event, ExitKind, ModuleInfo, ProcessInfo};

use crate::index::Stopped;

/// Serializes an address as a `0x`-prefixed hexadecimal string.
pub fn serialize_hex<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{value:#x}"))
}

/// The traced process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessReport {
    /// Process id (null if the trace lost its first record).
    pub pid: Option<u32>,
    /// Parent process id.
    pub ppid: Option<u32>,
    /// Path of the executable.
    pub executable: Option<String>,
    /// The command line (argv).
    pub command: Vec<String>,
    /// Wall-clock time of the trace's time 0, nanoseconds since the Unix epoch.
    pub start_unix_ns: Option<u64>,
    /// How the process ended; null when the trace has no end record.
    pub exit: Option<ExitReport>,
    /// The fatal signal a thread's own code raised (a fault, `abort`), with
    /// where it struck; null when the process did not crash, and in the
    /// reports of other commands (`leaks` reads it).
    pub crash: Option<CrashReport>,
}

/// A crash: the fatal signal one thread's own code raised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CrashReport {
    /// The thread that crashed.
    pub tid: u32,
    /// The signal's number and name (`SIGSEGV`).
    pub signal: u32,
    pub signal_name: String,
    /// Its `si_code`, and what it means for this signal ("address not
    /// mapped"; null for codes without a meaning here).
    pub code: i32,
    pub cause: Option<String>,
    /// The faulting address (`si_addr`) of SIGSEGV, SIGBUS, SIGILL and
    /// SIGFPE; null for the others.
    pub address: Option<String>,
    /// Where the signal struck, innermost first (the first frame is the
    /// faulting instruction itself).
    pub stack: Vec<FrameReport>,
    /// The process's other threads, where the crash's exit scan stopped
    /// them, by thread id (threads stopped inside trapline's agent, and
    /// its own, are not listed).
    pub other_threads: Vec<StoppedThreadReport>,
}

/// A thread stopped when another crashed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoppedThreadReport {
    pub tid: u32,
    /// Where it was stopped, innermost first (the first frame is the
    /// instruction it was about to run).
    pub stack: Vec<FrameReport>,
}

/// The name of signal `n` (`SIGSEGV`), or `signal N`.
pub fn signal_name(n: u32) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("signal {n}"),
    };
    name.to_owned()
}

/// What `si_code` `code` says of fault signal `signal` (siginfo.h).
fn fault_cause(signal: u32, code: i32) -> Option<&'static str> {
    Some(match (signal, code) {
        (11, 1) => "address not mapped",
        (11, 2) => "access not permitted by the mapping",
        (11, 4) => "protection key denied the access",
        (7, 1) => "misaligned address",
        (7, 2) => "no such physical address",
        (7, 3) => "hardware error",
        (4, 1) => "illegal opcode",
        (4, 2) => "illegal operand",
        (4, 4) => "illegal addressing mode",
        (4, 5) => "illegal trap",
        (4, 6) => "privileged opcode",
        (8, 1) => "integer divide by zero",
        (8, 2) => "integer overflow",
        (8, 3) => "floating-point divide by zero",
        (_, 0) => "sent by the program itself (kill or raise)",
        (_, -6) => "sent by the program itself (tgkill: abort, raise)",
        (_, 128) => "raised by the kernel (a general-protection fault: a non-canonical address)",
        _ => return None,
    })
}

impl From<&ProcessInfo> for ProcessReport {
    /// The process record's facts; `exit` comes from the end record.
    fn from(p: &ProcessInfo) -> Self {
        ProcessReport {
            pid: Some(p.pid),
            ppid: Some(p.ppid),
            executable: Some(p.exe.clone()),
            command: p.argv.clone(),
            start_unix_ns: Some(p.start_unix_ns),
            exit: None,
            crash: None,
        }
    }
}

/// How the process ended: exactly one field is present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExitReport {
    /// Exit status (exit, return from main, _exit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Killed by this signal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The process image was replaced by execve.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub exec: bool,
    /// trapline detached from the process, which went on running.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
}

impl From<ExitKind> for ExitReport {
    fn from(e: ExitKind) -> Self {
        match e {
            ExitKind::Code(c) => ExitReport {
                code: Some(c),
                ..Default::default()
            },
            ExitKind::Signal(s) => ExitReport {
                signal: Some(s),
                ..Default::default()
            },
            ExitKind::Exec => ExitReport {
                exec: true,
                ..Default::default()
            },
            ExitKind::Detach => ExitReport {
                detached: true,
                ..Default::default()
            },
        }
    }
}

impl ExitReport {
    /// "exit code 0", "killed by signal 9", "exec".
    pub fn describe(&self) -> String {
        if let Some(c) = self.code {
            format!("exit code {c}")
        } else if let Some(s) = self.signal {
            match u32::try_from(s).map(signal_name) {
                Ok(name) if !name.starts_with("signal") => format!("killed by signal {s} ({name})"),
                _ => format!("killed by signal {s}"),
            }
        } else if self.detached {
            "detached (the process went on)".to_string()
        } else {
            "replaced itself with execve".to_string()
        }
    }
}

/// Whether the whole trace could be read, and whether the process finished.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceStatus {
    /// True when the trace was read to its end without error and ends with
    /// the process's end record.
    pub complete: bool,
    /// The trace holds the end record (the process finished or exec'd while
    /// the agent was in control). False: killed by SIGKILL, crashed before the
    /// agent could flush, or still running.
    pub has_end: bool,
    /// The trace holds a complete snapshot of the blocks live at exit.
    pub has_exit_snapshot: bool,
    /// Where and why reading stopped early; null when the file was read to its end.
    pub stopped: Option<Stopped>,
    /// Damaged chunks that were skipped (their events are missing), each
    /// by offset with the reason; the rest of the trace was analysed.
    pub damaged_chunks: Vec<Stopped>,
    /// Size of the trace file in bytes.
    pub file_bytes: u64,
    /// Chunks read.
    pub chunks: u64,
    /// Events read.
    pub events: u64,
    /// The module whose `malloc` the program reached instead of the agent's
    /// (an allocator of its own in the executable, such as jemalloc or
    /// mimalloc in a Rust program): its allocations are not in the trace.
    pub allocator_shadowed_by: Option<String>,
    /// The shared library whose allocator the program's calls were passed on
    /// to, when it is not the C library's (jemalloc or tcmalloc, linked or
    /// preloaded): blocks it allocated or released through functions of its
    /// own other than jemalloc's (tcmalloc's `tc_free`, mimalloc's
    /// `mi_free`) were not seen. Null normally.
    pub allocator_library: Option<String>,
    /// An allocator linked into the executable under names of its own
    /// (found in the executable's symbol table when the report is made, if
    /// the file is still the traced build): the blocks it serves never
    /// reach malloc, so they are not in the trace. Null normally.
    pub private_allocator: Option<PrivateAllocatorReport>,
    /// The trace began when `trapline attach` attached to the running
    /// process: null for a process `trapline run` started.
    pub attached: Option<AttachedReport>,
}

/// See `TraceStatus::attached`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AttachedReport {
    /// When the agent attached, nanoseconds of the trace's clock.
    pub at_ns: u64,
    /// Releases of blocks allocated before the attach (unknown to the
    /// trace, passed on, never counted as invalid frees); null when the
    /// trace has no end.
    pub earlier_releases: Option<u64>,
}

/// See `TraceStatus::private_allocator`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrivateAllocatorReport {
    /// The executable's path.
    pub executable: String,
    /// "jemalloc", "mimalloc" or "tcmalloc".
    pub allocator: String,
    /// The entry point that gave it away (`_rjem_malloc`, `je_malloc`, ...).
    pub symbol: String,
}

/// One source-level frame of a symbolized stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrameReport {
    /// The recorded return address, `0x`-prefixed hexadecimal.
    #[serde(serialize_with = "serialize_hex")]
    pub address: u64,
    /// Demangled function name, null if unknown.
    pub function: Option<String>,
    /// Source file, null if unknown.
    pub file: Option<String>,
    /// Source line, null if unknown.
    pub line: Option<u32>,
    /// True when this frame was inlined into the next one (same address).
    pub inlined: bool,
    /// Path of the module holding the address, null if none.
    pub module: Option<String>,
    /// True when the frame is in a function whose code only passes an
    /// allocation on to the allocator: a recognised allocation wrapper,
    /// which names no site of its own.
    pub allocation_wrapper: bool,
}

impl From<Frame> for FrameReport {
    fn from(f: Frame) -> Self {
        FrameReport {
            address: f.address,
            function: f.function,
            file: f.file,
            line: f.line,
            inlined: f.inlined,
            module: f.module,
            allocation_wrapper: f.allocation_wrapper,
        }
    }
}

/// A number of bytes in a number of blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BytesBlocks {
    /// Bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
}

/// Heap usage over the whole recorded run, like memcheck's "total heap usage".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeapUsage {
    /// Blocks allocated (a realloc that returns a block counts as one).
    pub allocs: u64,
    /// Blocks released (a realloc that releases its old block counts as one).
    pub frees: u64,
    /// Bytes requested by all allocations, realloc's new sizes included.
    pub bytes_allocated: u64,
}

/// Trace-wide facts every analysis collects on its pass.
#[derive(Default)]
pub(crate) struct Facts {
    pub process: Option<ProcessInfo>,
    pub modules: Vec<ModuleInfo>,
    pub stacks: HashMap<u32, Vec<u64>>,
    pub end: Option<(u64, ExitKind, EndCounters)>,
    pub last_time: u64,
    pub events: u64,
    saw_snapshot_begin: bool,
    /// The totals of the exit snapshot's `SnapshotEnd`, once read.
    snapshot_end: Option<BytesBlocks>,
    /// The recording kept no stacks for releases (`--no-release-stacks`).
    pub no_release_stacks: bool,
    /// The trace was recorded without allocations (`--record` without
    /// `mem`), or without locks.
    pub memory_off: bool,
    pub locks_off: bool,
    /// See `TraceStatus::allocator_shadowed_by`.
    pub allocator_shadowed_by: Option<String>,
    /// See `TraceStatus::allocator_library`.
    pub allocator_library: Option<String>,
    /// How the allocations' stacks were sampled (`--sample`; None: all full).
    pub sampling: Option<crate::sampling::Sampling>,
    /// The stacks that hold only an unsampled allocation's caller.
    pub caller_only: std::collections::HashSet<u32>,
    /// Production mode (`--production`): the sampled allocations seen,
    /// and every function's calls and bytes (the latest `CallCounts`).
    pub production: Option<ProductionFacts>,
    /// See `TraceStatus::attached`.
    pub attached: Option<AttachedReport>,
    /// The `Crash` record and its thread.
    crash: Option<(u32, Event)>,
    /// The stack of each thread stopped at the crash (`StoppedAtCrash`).
    stopped_at_crash: std::collections::BTreeMap<u32, u32>,
}

impl Facts {
    /// Takes note of one merged event (`observe`, and what needs its thread).
    pub fn observe_merged(&mut self, m: &crate::index::MergedEvent) {
        if matches!(m.event, Event::Crash { .. }) && self.crash.is_none() {
            self.crash = Some((m.tid, m.event.clone()));
        }
        if let Event::StoppedAtCrash { stack, .. } = m.event {
            self.stopped_at_crash.insert(m.tid, stack);
        }
        self.observe(m.time, &m.event);
    }

    /// The process section with its crash, its stack symbolized.
    pub fn process_report_with_crash(&self, sym: &mut StackSymbolizer) -> ProcessReport {
        let mut r = self.process_report();
        if let Some((
            tid,
            Event::Crash {
                signal,
                code,
                addr,
                stack,
                ..
            },
        )) = &self.crash
        {
            let faults = [4, 7, 8, 11].contains(signal) && *code > 0;
            r.crash = Some(CrashReport {
                tid: *tid,
                signal: *signal,
                signal_name: signal_name(*signal),
                code: *code,
                cause: fault_cause(*signal, *code).map(str::to_owned),
                address: faults.then(|| format!("{addr:#x}")),
                stack: sym.sample_stack(&self.stacks, *stack),
                other_threads: self
                    .stopped_at_crash
                    .iter()
                    .filter(|&(&t, _)| t != *tid)
                    .map(|(&tid, &stack)| StoppedThreadReport {
                        tid,
                        stack: sym.sample_stack(&self.stacks, stack),
                    })
                    .collect(),
            });
        }
        r
    }

    /// Takes note of a chunk the read left out, which `start` would have
    /// begun (see `MergedEvents::chunk_start`): what its events would have
    /// added to the counts. A chunk is left out only when it holds none of
    /// the events the rest of the facts come from.
    pub fn skipped_chunk(&mut self, chunk: &crate::index::ChunkEntry, start: u64) {
        self.events += u64::from(chunk.header.events);
        self.last_time = self.last_time.max(chunk.header.last_time.max(start));
    }

    /// Takes note of one event.
    pub fn observe(&mut self, time: u64, ev: &Event) {
        self.events += 1;
        self.last_time = self.last_time.max(time);
        match ev {
            Event::Process(p) if self.process.is_none() => self.process = Some(p.clone()),
            // The agent lists the loaded modules again at the end: keep one of
            // each. A `ModuleUnload` removes nothing: stacks are symbolized
            // after the pass, and those recorded before the unload still
            // need the module (see `symbolizer`).
            Event::ModuleLoad(m) if !self.modules.iter().any(|k| k.id == m.id) => {
                self.modules.push(m.clone())
            }
            Event::StackDef { id, frames } => {
                self.stacks.entry(*id).or_insert_with(|| frames.clone());
            }
            Event::CallerOnlyStack { id } => {
                self.caller_only.insert(*id);
            }
            Event::Recording {
                no_release_stacks,
                allocator_shadowed_by,
                allocator_library,
                memory_recorded,
                locks_recorded,
                sample_bytes,
                production,
            } => {
                if *production {
                    self.production.get_or_insert_with(ProductionFacts::default);
                }
                if *sample_bytes != 0 {
                    self.sampling = Some(crate::sampling::Sampling {
                        mean_bytes: *sample_bytes,
                    });
                }
                self.no_release_stacks |= *no_release_stacks;
                self.memory_off |= !*memory_recorded;
                self.locks_off |= !*locks_recorded;
                if allocator_shadowed_by.is_some() {
                    self.allocator_shadowed_by = allocator_shadowed_by.clone();
                }
                if allocator_library.is_some() {
                    self.allocator_library = allocator_library.clone();
                }
            }
            Event::End {
                time,
                exit,
                counters,
            } => self.end = Some((*time, *exit, counters.clone())),
            Event::SnapshotBegin { .. } => self.saw_snapshot_begin = true,
            Event::CallCounts {
                func, calls, bytes, ..
            } => {
                let p = self.production.get_or_insert_with(ProductionFacts::default);
                p.calls.insert(*func, (*calls, *bytes));
            }
            Event::Alloc { .. } | Event::Realloc { new_addr: 1.., .. } => {
                if let Some(p) = &mut self.production {
                    p.sampled_allocations += 1;
                }
            }
            Event::Attach { time } => {
                self.attached.get_or_insert(AttachedReport {
                    at_ns: *time,
                    earlier_releases: None,
                });
            }
            Event::AttachTotals { earlier_releases } => {
                if let Some(a) = &mut self.attached {
                    a.earlier_releases = Some(*earlier_releases);
                }
            }
            Event::SnapshotEnd { blocks, bytes } => {
                self.snapshot_end = Some(BytesBlocks {
                    bytes: *bytes,
                    blocks: *blocks,
                })
            }
            _ => {}
        }
    }

    /// A whole exit snapshot was read (a trace holds at most one, written by
    /// the agent's own thread; its parts are checked independently of their
    /// order, which chunks without timed events leave open).
    pub fn has_exit_snapshot(&self) -> bool {
        self.saw_snapshot_begin && self.snapshot_end.is_some()
    }

    /// The totals the agent wrote at the end of its exit snapshot; None
    /// without a whole snapshot.
    pub fn exit_snapshot_totals(&self) -> Option<BytesBlocks> {
        self.snapshot_end.filter(|_| self.saw_snapshot_begin)
    }

    /// The process section of a report.
    pub fn process_report(&self) -> ProcessReport {
        let mut r = self
            .process
            .as_ref()
            .map(ProcessReport::from)
            .unwrap_or_default();
        r.exit = self.end.as_ref().map(|(_, e, _)| ExitReport::from(*e));
        r
    }

    /// The `trace` section of a report, once the pass is over.
    pub fn trace_status(
        &self,
        index: &crate::index::TraceIndex,
        read: crate::index::ReadStatus,
    ) -> TraceStatus {
        let has_end = self.end.is_some();
        TraceStatus {
            complete: has_end && read.stopped.is_none() && read.damaged.is_empty(),
            has_end,
            has_exit_snapshot: self.has_exit_snapshot(),
            stopped: read.stopped,
            damaged_chunks: read.damaged,
            file_bytes: index.file_len,
            chunks: index.chunks.len() as u64,
            events: self.events,
            allocator_shadowed_by: self.allocator_shadowed_by.clone(),
            allocator_library: self.allocator_library.clone(),
            private_allocator: self.private_allocator(),
            attached: self.attached,
        }
    }

    /// The executable's allocator under names of its own, read from its
    /// file (checked against the traced build id when the trace lists it).
    fn private_allocator(&self) -> Option<PrivateAllocatorReport> {
        let exe = &self.process.as_ref()?.exe;
        let build_id = self
            .modules
            .iter()
            .find(|m| m.path == *exe)
            .map_or(&[][..], |m| &m.build_id[..]);
        let found = trapline_symbols::private_allocator_of(Path::new(exe), build_id)?;
        Some(PrivateAllocatorReport {
            executable: exe.clone(),
            allocator: found.allocator.to_string(),
            symbol: found.symbol,
        })
    }

    /// Lost events; None without an end record. Those the end record
    /// counts, plus those it counts as written that this pass did not read
    /// (chunks that never reached the file, or that could not be read).
    pub fn events_lost(&self) -> Option<u64> {
        self.end
            .as_ref()
            .map(|(_, _, c)| events_lost(c, self.events))
    }

    /// How the blocks of `stack` were sampled, when the trace is sampled and
    /// `stack` is a full stack (its sampled blocks stand for all of the
    /// stack's); None otherwise (every block counts as itself, or, for a
    /// caller-only stack, is one the sample does not stand for).
    pub fn sampled_full_stack(&self, stack: u32) -> Option<crate::sampling::Sampling> {
        self.sampling
            .filter(|_| stack != 0 && !self.caller_only.contains(&stack))
    }

    /// The `sampling` section of a report.
    pub fn sampling_report(&self) -> Option<crate::sampling::SamplingReport> {
        self.sampling.map(|s| crate::sampling::SamplingReport {
            mean_bytes: s.mean_bytes,
            production: self.production.as_ref().map(ProductionFacts::report),
        })
    }

    /// A memory report's warnings: allocations not recorded, then what the
    /// symbolizer met (only known once it symbolized the report's stacks).
    pub fn memory_warnings(&self, symbolizer: &StackSymbolizer) -> Vec<String> {
        self.memory_off
            .then(|| memory_not_recorded(self.attached.is_some()))
            .into_iter()
            .chain(symbolizer.warnings())
            .collect()
    }

    /// A symbolizer knowing every module the trace ever loaded, unloaded
    /// ones included.
    ///
    /// Where a library was unloaded and another mapped at its addresses, the
    /// one loaded last names those addresses, for every stack: the trace
    /// cannot tell which stacks were recorded before the change (module
    /// records have no time of their own, and the agent gives equal frame
    /// lists one stack id whatever module they were in), and the symbolizer
    /// warns about each such overlap it meets. The agent numbers modules in
    /// load order, so they are registered by id: the latest registered wins
    /// in the symbolizer.
    pub fn symbolizer(&self) -> StackSymbolizer {
        let mut symbolizer = Symbolizer::new();
        symbolizer.set_known_wrappers(is_allocation_wrapper);
        let mut modules: Vec<&ModuleInfo> = self.modules.iter().collect();
        modules.sort_by_key(|m| m.id);
        for m in modules {
            symbolizer.add_module(m);
        }
        StackSymbolizer {
            symbolizer,
            cache: HashMap::new(),
            lookups: true,
        }
    }
}

/// The events an end record's counters say were lost, plus those they count
/// as written beyond the `read` events found in the trace.
pub fn events_lost(counters: &EndCounters, read: u64) -> u64 {
    counters.events_lost + counters.events.saturating_sub(read)
}

/// Symbolizes stacks by id, caching addresses.
pub(crate) struct StackSymbolizer {
    symbolizer: Symbolizer,
    cache: HashMap<u64, Vec<FrameReport>>,
    /// False: no module is read, frames are addresses.
    lookups: bool,
}

impl StackSymbolizer {
    /// A symbolizer that reads no module: frames carry their addresses
    /// only, for passes that count and print nothing (`findings`).
    pub fn addresses_only() -> StackSymbolizer {
        StackSymbolizer {
            symbolizer: Symbolizer::new(),
            cache: HashMap::new(),
            lookups: false,
        }
    }

    /// The symbolizer's warnings (module files missing, unreadable or of
    /// another build, ...). Files are read lazily: ask after symbolizing.
    pub fn warnings(&self) -> Vec<String> {
        self.symbolizer.warnings()
    }

    /// The frames of a CPU sample's stack `id`: its first address is the
    /// interrupted instruction itself, the others return addresses.
    pub fn sample_stack(&mut self, stacks: &HashMap<u32, Vec<u64>>, id: u32) -> Vec<FrameReport> {
        let Some((&pc, callers)) = stacks.get(&id).and_then(|a| a.split_first()) else {
            return Vec::new();
        };
        let mut out: Vec<FrameReport> = self
            .symbolizer
            .symbolize_pc(pc)
            .into_iter()
            .map(FrameReport::from)
            .collect();
        self.extend_with_callers(&mut out, callers);
        out
    }

    /// The frames of return address `a`; of instruction address `a` when
    /// `interrupted` (the frame outside a signal frame).
    fn frames_of(&mut self, a: u64, interrupted: bool) -> &[FrameReport] {
        let symbolizer = &mut self.symbolizer;
        let lookups = self.lookups;
        // Addresses are below 2^63: the top bit keeps the two lookups apart.
        let key = if interrupted { a | 1 << 63 } else { a };
        self.cache.entry(key).or_insert_with(|| {
            let frames = if !lookups {
                vec![Frame::unknown(a)]
            } else if interrupted {
                symbolizer.symbolize_pc(a)
            } else {
                symbolizer.symbolize(a)
            };
            frames.into_iter().map(FrameReport::from).collect()
        })
    }

    /// Appends the frames of `addresses` (return addresses, innermost
    /// first), each one past a signal frame looked up as the interrupted
    /// instruction it is.
    fn extend_with_callers(&mut self, out: &mut Vec<FrameReport>, addresses: &[u64]) {
        for &a in addresses {
            let interrupted = out
                .last()
                .and_then(|f| f.function.as_deref())
                .is_some_and(trapline_symbols::is_signal_trampoline);
            out.extend(self.frames_of(a, interrupted).iter().cloned());
        }
    }

    /// The frames of stack `id` (empty for 0 or an id the trace never defined).
    pub fn stack(&mut self, stacks: &HashMap<u32, Vec<u64>>, id: u32) -> Vec<FrameReport> {
        let Some(addrs) = stacks.get(&id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        self.extend_with_callers(&mut out, addrs);
        out
    }
}

pub use crate::numbers::thousands;

/// Renders one frame the way memcheck does: `0x4005F4: main (prog.c:12)`.
pub fn frame_text(f: &FrameReport) -> String {
    let mut s = format!("{:#X}: ", f.address).replacen("0X", "0x", 1);
    s.push_str(f.function.as_deref().unwrap_or("???"));
    match (&f.file, f.line) {
        (Some(file), line) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            match line {
                Some(l) => write!(s, " ({base}:{l})").unwrap(),
                None => write!(s, " ({base})").unwrap(),
            }
        }
        (None, _) => {
            if let Some(m) = &f.module {
                write!(s, " (in {m})").unwrap();
            }
        }
    }
    if f.inlined {
        s.push_str(" [inlined]");
    }
    s
}

/// A frame in a few words, for one-line site names: `function
/// (file:line)`, the function alone without a line, else its address and
/// module.
pub fn frame_place(f: &FrameReport) -> String {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_owned();
    match (&f.function, &f.file, f.line) {
        (Some(func), Some(file), Some(line)) => format!("{func} ({}:{line})", base(file)),
        (Some(func), _, _) => func.clone(),
        (None, _, _) => match &f.module {
            Some(m) => format!("{:#x} ({})", f.address, base(m)),
            None => format!("{:#x}", f.address),
        },
    }
}

/// A stack in one line: its first two frames with a function (the
/// allocating call's caller and its caller: one function often allocates
/// for several), joined by `sep`, else its first frame; None when empty.
pub fn stack_place(stack: &[FrameReport], sep: &str) -> Option<String> {
    let named: Vec<String> = stack[wrapper_frames(stack)..]
        .iter()
        .filter(|f| f.function.is_some())
        .take(2)
        .map(frame_place)
        .collect();
    if named.is_empty() {
        stack.first().map(frame_place)
    } else {
        Some(named.join(sep))
    }
}

/// Functions that only pass an allocation on to the allocator, which name
/// no site of their own: the common ones of real programs (redis's
/// `zmalloc` family, nginx's `ngx_alloc` and pools, glib's `g_malloc`,
/// GNU's `xmalloc`, CPython's `PyMem_` layer, OpenSSL's `CRYPTO_malloc`,
/// SQLite's `sqlite3Malloc`), with a trailing `*` for a prefix.
const KNOWN_WRAPPERS: &[&str] = &[
    "zmalloc*",
    "ztrymalloc*",
    "zcalloc*",
    "ztrycalloc*",
    "zrealloc*",
    "ztryrealloc*",
    "zstrdup",
    "ngx_alloc",
    "ngx_calloc",
    "ngx_memalign",
    "ngx_palloc*",
    "ngx_pnalloc",
    "ngx_pcalloc",
    "ngx_pmemalign",
    "g_malloc*",
    "g_realloc*",
    "g_try_malloc*",
    "g_try_realloc*",
    "g_slice_alloc*",
    "xmalloc",
    "xcalloc",
    "xrealloc",
    "xzalloc",
    "xstrdup",
    "PyMem_*",
    "_PyMem_*",
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "CRYPTO_malloc",
    "CRYPTO_zalloc",
    "CRYPTO_realloc",
    "sqlite3Malloc*",
    "sqlite3MemMalloc",
    "sqlite3DbMalloc*",
];

/// Wrappers named on the command line (`--alloc-fn`), beside the known ones.
static USER_WRAPPERS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Adds the allocation wrappers the user named (`--alloc-fn NAME`, a
/// trailing `*` for a prefix), for every report of this process.
pub fn set_allocation_wrappers(names: Vec<String>) {
    let _ = USER_WRAPPERS.set(names);
}

/// Whether `function` is an allocation wrapper (known, or named by the user).
pub fn is_allocation_wrapper(function: &str) -> bool {
    let matches = |pattern: &str| match pattern.strip_suffix('*') {
        Some(prefix) => function.starts_with(prefix),
        None => function == pattern,
    };
    KNOWN_WRAPPERS.iter().any(|p| matches(p))
        || USER_WRAPPERS
            .get()
            .is_some_and(|names| names.iter().any(|p| matches(p)))
}

/// How many innermost frames of `stack` are allocation wrappers, when a
/// frame outside them follows (a stack of wrappers only names itself).
pub fn wrapper_frames(stack: &[FrameReport]) -> usize {
    let n = stack
        .iter()
        .take_while(|f| {
            f.allocation_wrapper || f.function.as_deref().is_some_and(is_allocation_wrapper)
        })
        .count();
    if n < stack.len() {
        n
    } else {
        0
    }
}

/// Seconds from nanoseconds.
pub fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Line prefix of text reports: `==PID== `, like memcheck.
pub fn prefix(process: &ProcessReport) -> String {
    match process.pid {
        Some(pid) => format!("=={pid}== "),
        None => "==?== ".to_string(),
    }
}

/// The command line for text reports.
pub fn command_text(process: &ProcessReport) -> String {
    if !process.command.is_empty() {
        let words: Vec<String> = process.command.iter().map(|a| shell_quoted(a)).collect();
        words.join(" ")
    } else if let Some(exe) = &process.executable {
        exe.clone()
    } else {
        "(unknown: the trace has no process record)".to_string()
    }
}

/// `arg` as a POSIX shell reads it back: as it is when it holds only
/// characters no shell treats specially, else in single quotes (an empty
/// argument as `''`, which a plain join would lose).
fn shell_quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%^".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The last lines of text reports: lost events, then warnings about an
/// incomplete trace (where and why reading stopped).
pub fn footer_text(out: &mut String, p: &str, events_lost: Option<u64>, status: &TraceStatus) {
    match events_lost {
        Some(n) => writeln!(out, "{p}events lost: {}", thousands(n)).unwrap(),
        None => writeln!(out, "{p}events lost: unknown (the trace has no end record)").unwrap(),
    }
    for w in status_warnings(status) {
        writeln!(out, "{p}{w}").unwrap();
    }
}

/// Warning lines of the analysis itself (symbolization problems), at the
/// end of text reports, just before the footer (whose warnings about an
/// incomplete trace stay last).
pub fn warnings_text(out: &mut String, p: &str, warnings: &[String]) {
    for w in warnings {
        writeln!(out, "{p}warning: {w}").unwrap();
    }
}

/// The command whose `--record` chose the recorders of a trace: `attach`
/// for an attached one.
pub fn recording_command(attached: bool) -> &'static str {
    if attached {
        "trapline attach --record"
    } else {
        "trapline run --record"
    }
}

/// The warning of a trace recorded without the allocation recorder.
pub fn memory_not_recorded(attached: bool) -> String {
    format!(
        "allocations were not recorded ({} without mem): nothing here is about the heap",
        recording_command(attached)
    )
}

/// Why a lock report has nothing to show, if it has not: the run did not
/// record locks, or the program took none.
pub fn no_lock_events(
    locks_recorded: bool,
    has_lock_events: bool,
    attached: bool,
) -> Option<String> {
    if !locks_recorded {
        Some(format!(
            "Locks were not recorded ({} without locks).",
            recording_command(attached)
        ))
    } else if !has_lock_events {
        Some("The trace holds no lock events: the program took no pthread mutex, rwlock or spinlock while recorded.".to_owned())
    } else {
        None
    }
}

/// The warning for a program whose own allocator the agent's hooks never saw.
pub fn shadowed_allocator_warning(module: &str) -> String {
    format!(
        "WARNING: the program has an allocator of its own: its calls of malloc reach the one \
         in {module}, not trapline's, so its allocations are not in the trace (a Rust program \
         built with jemalloc or mimalloc: build it with the system allocator to trace it)."
    )
}

/// The note about an allocator library the calls were passed on to.
pub fn allocator_library_note(library: &str) -> String {
    format!(
        "NOTE: the program's allocator is {library}: trapline passed its calls on to it. \
         Besides the standard functions it traps jemalloc's own (mallocx, rallocx, xallocx, \
         sdallocx, dallocx), but not other libraries' (tcmalloc's tc_malloc and tc_free, \
         mimalloc's mi_malloc and mi_free, ...): blocks those allocate are not in the trace, \
         and blocks they release stay listed as unfreed."
    )
}

/// Warning lines about an incomplete trace, for text reports.
pub fn status_warnings(status: &TraceStatus) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(module) = &status.allocator_shadowed_by {
        lines.push(shadowed_allocator_warning(module));
    }
    if let Some(library) = &status.allocator_library {
        lines.push(allocator_library_note(library));
    }
    if let Some(p) = &status.private_allocator {
        lines.push(format!(
            "WARNING: {} has an allocator of its own ({}, found as {}): the blocks it serves do \
             not go through malloc, so they are not in the trace; build it with the system \
             allocator to trace them.",
            p.executable, p.allocator, p.symbol
        ));
    }
    if let Some(a) = &status.attached {
        let mut note = String::from(
            "NOTE: the trace began when trapline attached to the running process: blocks \
             allocated before are unknown to it",
        );
        if let Some(n) = a.earlier_releases {
            let _ = write!(
                note,
                "; {} releases of such blocks were passed on, not counted as errors",
                thousands(n)
            );
        }
        note.push('.');
        lines.push(note);
    }
    if !status.has_end {
        lines.push(
            "WARNING: the process did not finish: the trace has no end record (killed by SIGKILL, \
             crashed before the agent could flush, or still running). Results cover what was recorded."
                .to_string(),
        );
    }
    for d in &status.damaged_chunks {
        lines.push(format!(
            "WARNING: damaged chunk at byte {} of {} skipped: {}. Its events are missing; the rest of the trace is reported.",
            thousands(d.offset),
            thousands(status.file_bytes),
            d.reason
        ));
    }
    if let Some(s) = &status.stopped {
        lines.push(format!(
            "WARNING: reading stopped at byte {} of {}: {}. Everything before it is reported.",
            thousands(s.offset),
            thousands(status.file_bytes),
            s.reason
        ));
    }
    lines
}

/// The stacks `ids` of a trace, symbolized: for a reader of a trace that
/// is still being written (`trapline watch`), which needs only the stack
/// definitions and modules recorded so far.
pub fn symbolized_stacks<R: std::io::Read + std::io::Seek>(
    input: &mut R,
    ids: &[u32],
) -> Result<HashMap<u32, Vec<FrameReport>>, trapline_trace::TraceError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let index = crate::index::TraceIndex::build(input)?;
    let mut facts = Facts::default();
    let wanted: std::collections::HashSet<u32> = ids.iter().copied().collect();
    for m in crate::index::MergedEvents::new(input, &index) {
        match &m.event {
            Event::StackDef { id, .. } if wanted.contains(id) => facts.observe(m.time, &m.event),
            Event::ModuleLoad(_) => facts.observe(m.time, &m.event),
            _ => {}
        }
    }
    let mut symbolizer = facts.symbolizer();
    Ok(ids
        .iter()
        .map(|&id| (id, symbolizer.stack(&facts.stacks, id)))
        .collect())
}

/// What a production-mode trace says of the calls it did not record.
#[derive(Clone, Debug, Default)]
pub struct ProductionFacts {
    /// Allocations recorded (the sampled ones).
    pub sampled_allocations: u64,
    /// Per allocator function: (calls, bytes asked for), every call.
    pub calls: std::collections::BTreeMap<trapline_trace::AllocFn, (u64, u64)>,
}

impl ProductionFacts {
    /// The report's `sampling.production`.
    pub fn report(&self) -> crate::sampling::ProductionReport {
        let allocating = || self.calls.iter().filter(|(f, _)| !f.is_release());
        crate::sampling::ProductionReport {
            allocation_calls: allocating().map(|(_, (calls, _))| calls).sum(),
            release_calls: self
                .calls
                .iter()
                .filter(|(f, _)| f.is_release())
                .map(|(_, (calls, _))| calls)
                .sum(),
            bytes_allocated: allocating().map(|(_, (_, bytes))| bytes).sum(),
            sampled_allocations: self.sampled_allocations,
            calls: self
                .calls
                .iter()
                .map(|(f, &(calls, bytes))| crate::sampling::CallCount {
                    func: f.name(),
                    calls,
                    bytes,
                })
                .collect(),
        }
    }
}

//! The event model: everything the agent records, and its binary encoding.
//!
//! Every event is one tag byte followed by LEB128 fields. Timed events store
//! the nanoseconds since the previous timed event of the same chunk (the first
//! one of a chunk stores its absolute time), so a busy thread pays one or two
//! bytes for its clock. Addresses of allocations are stored as deltas from the
//! previous address in the chunk, zig-zag encoded, because consecutive blocks
//! tend to sit close together.

use crate::scan::{ScanSkipReason, ScanStats, ScanTrigger, Verdict};
use crate::varint::{get_u64, put_u64, unzigzag, zigzag, MAX_VARINT_LEN};

mod locks;
pub use locks::{LockEvent, LockKind, LockMisuse, LockMode, LockOp};

/// The allocation or deallocation function that the program called.
///
/// The numeric values are part of the trace format: append, never reorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum AllocFn {
    Malloc = 1,
    Calloc,
    Realloc,
    ReallocArray,
    PosixMemalign,
    AlignedAlloc,
    Memalign,
    Valloc,
    Pvalloc,
    Free,
    New,
    NewNothrow,
    NewAligned,
    NewAlignedNothrow,
    NewArray,
    NewArrayNothrow,
    NewArrayAligned,
    NewArrayAlignedNothrow,
    Delete,
    DeleteSized,
    DeleteAligned,
    DeleteSizedAligned,
    DeleteNothrow,
    DeleteAlignedNothrow,
    DeleteArray,
    DeleteArraySized,
    DeleteArrayAligned,
    DeleteArraySizedAligned,
    DeleteArrayNothrow,
    DeleteArrayAlignedNothrow,
    // Format version 6: jemalloc's own interface.
    Mallocx,
    Rallocx,
    Xallocx,
    Sdallocx,
    Dallocx,
    // Also format version 6: C23's sized releases (glibc 2.41).
    FreeSized,
    FreeAlignedSized,
}

/// Which allocator interface a block belongs to; freeing through another
/// family is a mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// malloc, calloc, realloc, memalign and friends, released by free.
    Malloc,
    /// Scalar `operator new`, released by `operator delete`.
    New,
    /// Array `operator new[]`, released by `operator delete[]`.
    NewArray,
}

impl Family {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Malloc => "malloc",
            Family::New => "new",
            Family::NewArray => "new[]",
        }
    }
}

impl AllocFn {
    /// Every function, in format order.
    pub const ALL: [AllocFn; 37] = [
        AllocFn::Malloc,
        AllocFn::Calloc,
        AllocFn::Realloc,
        AllocFn::ReallocArray,
        AllocFn::PosixMemalign,
        AllocFn::AlignedAlloc,
        AllocFn::Memalign,
        AllocFn::Valloc,
        AllocFn::Pvalloc,
        AllocFn::Free,
        AllocFn::New,
        AllocFn::NewNothrow,
        AllocFn::NewAligned,
        AllocFn::NewAlignedNothrow,
        AllocFn::NewArray,
        AllocFn::NewArrayNothrow,
        AllocFn::NewArrayAligned,
        AllocFn::NewArrayAlignedNothrow,
        AllocFn::Delete,
        AllocFn::DeleteSized,
        AllocFn::DeleteAligned,
        AllocFn::DeleteSizedAligned,
        AllocFn::DeleteNothrow,
        AllocFn::DeleteAlignedNothrow,
        AllocFn::DeleteArray,
        AllocFn::DeleteArraySized,
        AllocFn::DeleteArrayAligned,
        AllocFn::DeleteArraySizedAligned,
        AllocFn::DeleteArrayNothrow,
        AllocFn::DeleteArrayAlignedNothrow,
        AllocFn::Mallocx,
        AllocFn::Rallocx,
        AllocFn::Xallocx,
        AllocFn::Sdallocx,
        AllocFn::Dallocx,
        AllocFn::FreeSized,
        AllocFn::FreeAlignedSized,
    ];

    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<AllocFn> {
        AllocFn::ALL
            .get(usize::from(value).checked_sub(1)?)
            .copied()
    }

    /// The C or C++ spelling used in reports.
    pub fn name(self) -> &'static str {
        match self {
            AllocFn::Malloc => "malloc",
            AllocFn::Calloc => "calloc",
            AllocFn::Realloc => "realloc",
            AllocFn::ReallocArray => "reallocarray",
            AllocFn::PosixMemalign => "posix_memalign",
            AllocFn::AlignedAlloc => "aligned_alloc",
            AllocFn::Memalign => "memalign",
            AllocFn::Valloc => "valloc",
            AllocFn::Pvalloc => "pvalloc",
            AllocFn::Free => "free",
            AllocFn::New => "operator new(unsigned long)",
            AllocFn::NewNothrow => "operator new(unsigned long, std::nothrow_t const&)",
            AllocFn::NewAligned => "operator new(unsigned long, std::align_val_t)",
            AllocFn::NewAlignedNothrow => {
                "operator new(unsigned long, std::align_val_t, std::nothrow_t const&)"
            }
            AllocFn::NewArray => "operator new[](unsigned long)",
            AllocFn::NewArrayNothrow => "operator new[](unsigned long, std::nothrow_t const&)",
            AllocFn::NewArrayAligned => "operator new[](unsigned long, std::align_val_t)",
            AllocFn::NewArrayAlignedNothrow => {
                "operator new[](unsigned long, std::align_val_t, std::nothrow_t const&)"
            }
            AllocFn::Delete => "operator delete(void*)",
            AllocFn::DeleteSized => "operator delete(void*, unsigned long)",
            AllocFn::DeleteAligned => "operator delete(void*, std::align_val_t)",
            AllocFn::DeleteSizedAligned => {
                "operator delete(void*, unsigned long, std::align_val_t)"
            }
            AllocFn::DeleteNothrow => "operator delete(void*, std::nothrow_t const&)",
            AllocFn::DeleteAlignedNothrow => {
                "operator delete(void*, std::align_val_t, std::nothrow_t const&)"
            }
            AllocFn::DeleteArray => "operator delete[](void*)",
            AllocFn::DeleteArraySized => "operator delete[](void*, unsigned long)",
            AllocFn::DeleteArrayAligned => "operator delete[](void*, std::align_val_t)",
            AllocFn::DeleteArraySizedAligned => {
                "operator delete[](void*, unsigned long, std::align_val_t)"
            }
            AllocFn::DeleteArrayNothrow => "operator delete[](void*, std::nothrow_t const&)",
            AllocFn::DeleteArrayAlignedNothrow => {
                "operator delete[](void*, std::align_val_t, std::nothrow_t const&)"
            }
            AllocFn::Mallocx => "mallocx",
            AllocFn::Rallocx => "rallocx",
            AllocFn::Xallocx => "xallocx",
            AllocFn::Sdallocx => "sdallocx",
            AllocFn::Dallocx => "dallocx",
            AllocFn::FreeSized => "free_sized",
            AllocFn::FreeAlignedSized => "free_aligned_sized",
        }
    }

    /// Whether this is one of C++'s operators with an alignment argument
    /// (`std::align_val_t`): an over-aligned object's `new` or `delete`.
    pub fn cxx_aligned(self) -> bool {
        use AllocFn::*;
        matches!(
            self,
            NewAligned
                | NewAlignedNothrow
                | NewArrayAligned
                | NewArrayAlignedNothrow
                | DeleteAligned
                | DeleteSizedAligned
                | DeleteAlignedNothrow
                | DeleteArrayAligned
                | DeleteArraySizedAligned
                | DeleteArrayAlignedNothrow
        )
    }

    /// The family this function allocates into or releases from.
    pub fn family(self) -> Family {
        use AllocFn::*;
        match self {
            New | NewNothrow | NewAligned | NewAlignedNothrow | Delete | DeleteSized
            | DeleteAligned | DeleteSizedAligned | DeleteNothrow | DeleteAlignedNothrow => {
                Family::New
            }
            NewArray
            | NewArrayNothrow
            | NewArrayAligned
            | NewArrayAlignedNothrow
            | DeleteArray
            | DeleteArraySized
            | DeleteArrayAligned
            | DeleteArraySizedAligned
            | DeleteArrayNothrow
            | DeleteArrayAlignedNothrow => Family::NewArray,
            _ => Family::Malloc,
        }
    }

    /// True for the functions that release memory.
    pub fn is_release(self) -> bool {
        use AllocFn::*;
        matches!(
            self,
            Free | Sdallocx
                | Dallocx
                | FreeSized
                | FreeAlignedSized
                | Delete
                | DeleteSized
                | DeleteAligned
                | DeleteSizedAligned
                | DeleteNothrow
                | DeleteAlignedNothrow
                | DeleteArray
                | DeleteArraySized
                | DeleteArrayAligned
                | DeleteArraySizedAligned
                | DeleteArrayNothrow
                | DeleteArrayAlignedNothrow
        )
    }
}

/// Misuse of the allocator detected while the program ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ErrorKind {
    /// A block was released twice.
    DoubleFree = 1,
    /// A pointer that was never returned by an allocation function was released.
    InvalidFree = 2,
    /// A block was released through another family than the one that allocated it.
    MismatchedFree = 3,
    /// realloc was given a pointer that is not a live block.
    InvalidRealloc = 4,
    /// A sized release (`operator delete(p, size)`, C23's `free_sized`) gave
    /// another size than the block was allocated with: in C++, deleting
    /// through a pointer to a base class without a virtual destructor
    /// (AddressSanitizer's new-delete-type-mismatch). The block is released.
    MismatchedSize = 5,
    /// A block from an aligned `operator new` released by an `operator delete`
    /// without alignment, or the reverse. The block is released.
    MismatchedAlignment = 6,
}

impl ErrorKind {
    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<ErrorKind> {
        Some(match value {
            1 => ErrorKind::DoubleFree,
            2 => ErrorKind::InvalidFree,
            3 => ErrorKind::MismatchedFree,
            4 => ErrorKind::InvalidRealloc,
            5 => ErrorKind::MismatchedSize,
            6 => ErrorKind::MismatchedAlignment,
            _ => return None,
        })
    }

    /// The name used in JSON reports.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::DoubleFree => "double_free",
            ErrorKind::InvalidFree => "invalid_free",
            ErrorKind::MismatchedFree => "mismatched_free",
            ErrorKind::InvalidRealloc => "invalid_realloc",
            ErrorKind::MismatchedSize => "mismatched_size",
            ErrorKind::MismatchedAlignment => "mismatched_alignment",
        }
    }

    /// Whether the erroneous call was performed all the same (the block was
    /// released, and a `Free` event records it): a mismatch, not a release
    /// of something that is not a live block.
    pub fn performed(self) -> bool {
        matches!(
            self,
            ErrorKind::MismatchedFree | ErrorKind::MismatchedSize | ErrorKind::MismatchedAlignment
        )
    }

    /// Whether the event carries what the release gave (`given`).
    fn has_given(self) -> bool {
        matches!(
            self,
            ErrorKind::MismatchedSize | ErrorKind::MismatchedAlignment
        )
    }
}

/// How a process image ended, as far as its agent saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// exit(), return from main or _exit with this status.
    Code(i32),
    /// Killed by this signal after the agent flushed the trace.
    Signal(i32),
    /// Replaced itself with execve; the new image writes its own trace.
    Exec,
}

/// Why a snapshot of the live blocks was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SnapshotKind {
    /// At the end of the process, after atexit handlers and libc's freeres.
    Exit = 1,
}

/// Why CPU sampling stopped before the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProfileStopReason {
    /// The program installed a handler for the sampling signal: it is
    /// handed over and sampling stops.
    SignalTaken = 1,
}

/// Permission bits of a mapped segment of a module.
pub mod segment_flags {
    pub const READ: u8 = 4;
    pub const WRITE: u8 = 2;
    pub const EXEC: u8 = 1;
}

/// One mapped segment (ELF `PT_LOAD`) of a module, in process addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    /// Bits from [`segment_flags`].
    pub flags: u8,
}

/// A loaded executable or shared library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Trace-wide module number.
    pub id: u32,
    /// Path as the dynamic loader reported it ("" for the main program is replaced by its path).
    pub path: String,
    /// GNU build id (may be empty).
    pub build_id: Vec<u8>,
    /// Load bias: process address = file virtual address + bias.
    pub bias: u64,
    pub segments: Vec<Segment>,
}

/// Facts about the traced process, first event of every trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    /// Wall-clock time of time 0 of this trace, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub exe: String,
    pub argv: Vec<String>,
}

/// Counters the agent keeps for the whole process, written at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndCounters {
    /// Events written to the trace.
    pub events: u64,
    /// Events that could not be recorded (must be 0); every report shows it.
    pub events_lost: u64,
    /// Allocator calls made while the same thread was already inside the agent:
    /// C library functions the agent itself calls (a dozen per process is
    /// normal) and signal handlers interrupting a hook. Passed through
    /// unrecorded, but their blocks are still known to the agent, so freeing
    /// them later is no false error.
    pub untracked_calls: u64,
}

/// What the agent counted itself for the end-of-run summary. Written just
/// before `End`, and only when it equals what a replay of the trace's events
/// computes (a single thread recorded every heap event, in one trace file,
/// with nothing lost), so `trapline run` can print its summary from the end
/// of the file instead of replaying it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunTotals {
    /// Calls of allocating functions (Alloc and Realloc events, and allocating
    /// calls that were errors).
    pub allocation_calls: u64,
    /// Calls of releasing functions (Free events, and releases that were
    /// errors other than a mismatched free, which has its Free event).
    pub release_calls: u64,
    /// Error events.
    pub errors: u64,
    /// `AllocFailed` events (0 in traces before format version 7, whose
    /// totals have tag 50 instead of 52).
    pub failed_allocations: u64,
    /// Live bytes at the highest heap occupancy, and the time of the event
    /// that first reached it.
    pub peak_bytes: u64,
    pub peak_time: u64,
}

/// One trace event. The owned form, as the reader yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// First event of the trace.
    Process(ProcessInfo),
    ModuleLoad(ModuleInfo),
    ModuleUnload {
        id: u32,
    },
    /// A thread's name (as set by pthread_setname_np or from /proc).
    ThreadName {
        tid: u32,
        name: String,
    },
    /// A distinct call stack, innermost frame first. Written once, before or
    /// after the first event that refers to its id (ids start at 1; 0 = none).
    StackDef {
        id: u32,
        frames: Vec<u64>,
    },
    /// The thread is about to call pthread_create: everything it did before
    /// happens-before the new thread. `create_id` is unique in the process and
    /// names the child's [`Event::ThreadStart`].
    ThreadCreate {
        time: u64,
        create_id: u64,
        stack: u32,
    },
    /// First event of a thread created by pthread_create, before its start
    /// routine runs. The main thread has none.
    ThreadStart {
        time: u64,
        parent_tid: u32,
        create_id: u64,
    },
    /// The thread ended (returned from its start routine, called pthread_exit
    /// or was cancelled).
    ThreadEnd {
        time: u64,
    },
    Alloc {
        time: u64,
        addr: u64,
        size: u64,
        align: u64,
        func: AllocFn,
        stack: u32,
    },
    Free {
        time: u64,
        addr: u64,
        func: AllocFn,
        stack: u32,
    },
    /// realloc/reallocarray that moved or resized a block. `old_addr` 0 is a
    /// realloc(NULL, n); `size` 0 with `new_addr` 0 is a realloc(p, 0) that freed.
    Realloc {
        time: u64,
        old_addr: u64,
        new_addr: u64,
        size: u64,
        func: AllocFn,
        stack: u32,
    },
    /// An allocation call that failed: it returned NULL for a request of at
    /// least one byte (`realloc` then leaves its block as it was), or
    /// `posix_memalign` returned an error, or C++'s `operator new` threw
    /// `std::bad_alloc`, or its new-handler threw (format version 7).
    AllocFailed {
        time: u64,
        func: AllocFn,
        /// The bytes asked for (`calloc`: the product, saturated).
        size: u64,
        /// The alignment asked for (0: none).
        align: u64,
        stack: u32,
    },
    /// Misuse detected at the time of the call. Stacks are 0 when unknown.
    Error {
        time: u64,
        kind: ErrorKind,
        func: AllocFn,
        addr: u64,
        stack: u32,
        /// For mismatched and double frees: how the block was allocated.
        alloc_func: Option<AllocFn>,
        alloc_size: u64,
        alloc_stack: u32,
        free_stack: u32,
        /// Whether the call was passed on to the C library anyway.
        passed_on: bool,
        /// What the release gave that does not match (encoded for
        /// `MismatchedSize`, the size; `MismatchedAlignment`, the alignment,
        /// 0 for none): 0 for other kinds.
        given: u64,
    },
    SnapshotBegin {
        time: u64,
        kind: SnapshotKind,
    },
    /// A block live when the snapshot was taken.
    LiveBlock {
        addr: u64,
        size: u64,
        func: AllocFn,
        stack: u32,
    },
    SnapshotEnd {
        blocks: u64,
        bytes: u64,
    },
    /// A reachability scan starts; its verdicts follow (see [`crate::scan`]).
    ScanBegin {
        time: u64,
        /// Number of the scan in this trace, from 1.
        scan: u32,
        trigger: ScanTrigger,
    },
    /// A block live during scan `scan`, with the scan's verdict. A definitely
    /// lost block heads a structure: `indirect_bytes` is the size of the blocks
    /// lost through it (0 for other verdicts).
    ScanBlock {
        scan: u32,
        addr: u64,
        size: u64,
        func: AllocFn,
        stack: u32,
        verdict: Verdict,
        indirect_bytes: u64,
    },
    /// End of scan `scan`.
    ScanEnd {
        scan: u32,
        stats: ScanStats,
    },
    /// A scan that was due did not run (format version 8): its memory would
    /// have passed a limit that ends or fails the program (`reason`). A
    /// skipped exit scan leaves the exit snapshot unjudged. `needed` is the
    /// agent's estimate of the scan's memory, `available` what the limit
    /// left, `limit` the limit itself (all bytes; 0 for `MemoryUnreadable`).
    ScanSkipped {
        time: u64,
        trigger: ScanTrigger,
        reason: ScanSkipReason,
        needed: u64,
        available: u64,
        limit: u64,
    },
    /// The process forked; the child writes its own trace.
    Fork {
        time: u64,
        child_pid: u32,
    },
    /// CPU sampling is on in this process (`trapline run --profile`): every
    /// thread is sampled each `1/hz` s of its own CPU time, with real-time
    /// signal `signal`. Written once, before the first sample.
    ProfileStart {
        time: u64,
        hz: u32,
        signal: u32,
    },
    /// A CPU sample of the chunk's thread. Frame 0 of `stack` is the
    /// interrupted instruction itself (not a return address: symbolize it as
    /// is); the other frames are return addresses. `periods` is how many
    /// sampling periods it stands for (1 + the timer's overruns: the kernel
    /// checks CPU-time timers at its scheduler tick).
    Sample {
        time: u64,
        stack: u32,
        periods: u32,
    },
    /// Sampling periods of the chunk's thread with no sample: the signal
    /// struck while the thread was inside trapline's agent (its time is the
    /// tool's, not the program's), or no stack could be taken.
    SamplesSkipped {
        time: u64,
        periods: u64,
    },
    /// Sampling periods of the chunk's thread that no signal came for: the
    /// kernel checks CPU-time timers only at ticks that find the thread
    /// running, and on a busy machine a thread can run between ticks. Found
    /// at the thread's end by comparing its CPU clock with the periods signalled.
    SamplesMissed {
        time: u64,
        periods: u64,
    },
    /// Sampling stopped before the process ended, for `reason`.
    ProfileStop {
        time: u64,
        reason: ProfileStopReason,
    },
    /// Last event of a process image.
    End {
        time: u64,
        exit: ExitKind,
        counters: EndCounters,
    },
    /// The agent's own totals for the summary (just before `End`, when exact).
    RunTotals(RunTotals),
    /// How the recording was configured, where it changes what the trace
    /// holds (after `Process`, only when something is not the default).
    Recording {
        /// Releases carry no call stack (`--no-release-stacks`): their stack
        /// ids are 0, and a double free's first-free stack is unknown.
        no_release_stacks: bool,
        /// The module whose `malloc` the program's calls reach instead of
        /// the agent's (an allocator defined in the executable, as jemalloc
        /// or mimalloc in a Rust program, or in a library preloaded before
        /// the agent): those allocations bypass trapline and are not in the
        /// trace (format version 4).
        allocator_shadowed_by: Option<String>,
        /// The shared library whose allocator the agent passes the
        /// program's calls on to, when it is not the C library's (jemalloc
        /// or tcmalloc, linked or preloaded): blocks allocated or released
        /// through that library's own functions (`mallocx`, `tc_free`) are
        /// not seen (format version 5).
        allocator_library: Option<String>,
    },
    /// A lock or thread-synchronisation event (tags 64-95).
    Lock(LockEvent),
}

impl Event {
    /// The event's time, for the events that carry one.
    pub fn time(&self) -> Option<u64> {
        match self {
            Event::Alloc { time, .. }
            | Event::ThreadCreate { time, .. }
            | Event::ThreadStart { time, .. }
            | Event::ThreadEnd { time }
            | Event::Free { time, .. }
            | Event::Realloc { time, .. }
            | Event::AllocFailed { time, .. }
            | Event::Error { time, .. }
            | Event::SnapshotBegin { time, .. }
            | Event::ScanBegin { time, .. }
            | Event::ScanSkipped { time, .. }
            | Event::Fork { time, .. }
            | Event::End { time, .. }
            | Event::ProfileStart { time, .. }
            | Event::Sample { time, .. }
            | Event::SamplesSkipped { time, .. }
            | Event::SamplesMissed { time, .. }
            | Event::ProfileStop { time, .. } => Some(*time),
            Event::Lock(l) => Some(l.time()),
            _ => None,
        }
    }
}

/// Bit of `Recording`'s flag word saying a module name follows: the
/// program's allocator shadows the agent's (format version 4).
const RECORDING_SHADOWED_BIT: u32 = 1;
/// Bit saying the allocator library's path follows (after the shadowing
/// module's, if both; format version 5).
const RECORDING_LIBRARY_BIT: u32 = 2;

/// Event tags (format values).
pub(crate) mod tag {
    pub const PROCESS: u8 = 1;
    pub const MODULE_LOAD: u8 = 2;
    pub const MODULE_UNLOAD: u8 = 3;
    pub const THREAD_NAME: u8 = 4;
    pub const STACK_DEF: u8 = 5;
    pub const THREAD_CREATE: u8 = 6;
    pub const THREAD_START: u8 = 7;
    pub const THREAD_END: u8 = 8;
    pub const ALLOC: u8 = 16;
    pub const FREE: u8 = 17;
    pub const REALLOC: u8 = 18;
    pub const ERROR: u8 = 19;
    pub const ALLOC_FAILED: u8 = 20;
    pub const SNAPSHOT_BEGIN: u8 = 32;
    pub const LIVE_BLOCK: u8 = 33;
    pub const SNAPSHOT_END: u8 = 34;
    pub const SCAN_BEGIN: u8 = 35;
    pub const SCAN_BLOCK: u8 = 36;
    pub const SCAN_END: u8 = 37;
    /// Format version 8.
    pub const SCAN_SKIPPED: u8 = 38;
    /// `ScanEnd` with `mappings_not_excluded` (format version 9; written
    /// only when it is not 0).
    pub const SCAN_END_WITH_MAPPINGS: u8 = 39;
    pub const FORK: u8 = 48;
    pub const END: u8 = 49;
    pub const RUN_TOTALS: u8 = 50;
    pub const RECORDING: u8 = 51;
    /// `RunTotals` with the failed allocation calls (format version 7).
    pub const RUN_TOTALS_WITH_FAILED: u8 = 52;
    // 96..=111: the CPU profiler.
    pub const PROFILE_START: u8 = 96;
    pub const SAMPLE: u8 = 97;
    pub const SAMPLES_SKIPPED: u8 = 98;
    pub const PROFILE_STOP: u8 = 99;
    pub const SAMPLES_MISSED: u8 = 100;
}

/// Longest frames list a stack may have in a trace; longer input is corrupt.
pub const MAX_STACK_FRAMES: usize = 1024;
/// Longest string the decoder accepts.
pub const MAX_STRING_LEN: usize = 1 << 20;
/// Most command-line arguments the decoder accepts.
pub const MAX_ARGS: usize = 1 << 16;

/// Space that guarantees an allocation-path event fits (Alloc, Free, Realloc, Error).
pub const MAX_HOT_EVENT_LEN: usize = 1 + 12 * MAX_VARINT_LEN;

/// Per-chunk state shared by the encoder and decoder: the previous time and
/// address, which timed events and addresses are delta-coded against.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkContext {
    pub prev_time: u64,
    pub prev_addr: u64,
}

impl ChunkContext {
    /// The encoded time field of an event at `t`. Clocks are monotonic per
    /// thread, but a chunk written by the agent's own thread can mix
    /// sources; a backwards step is stored as 0 (clamped).
    #[inline(always)]
    fn time_field(&self, t: u64) -> u64 {
        t.saturating_sub(self.prev_time)
    }

    #[inline(always)]
    fn note_time(&mut self, t: u64) {
        self.prev_time = self.prev_time.max(t);
    }

    /// The encoded address field of `a`: the zig-zagged delta.
    #[inline(always)]
    fn addr_field(&self, a: u64) -> u64 {
        zigzag(a.wrapping_sub(self.prev_addr) as i64)
    }
}

/// Writes events into a fixed byte slice without allocating. Used by the agent
/// on the allocation path and by tests and tools through [`encode_to_vec`].
pub struct Encoder<'a> {
    out: &'a mut [u8],
    pos: usize,
}

/// The output slice had no room for the event; nothing was committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

impl<'a> Encoder<'a> {
    pub fn new(out: &'a mut [u8]) -> Self {
        Encoder { out, pos: 0 }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) -> Result<(), NoRoom> {
        *self.out.get_mut(self.pos).ok_or(NoRoom)? = b;
        self.pos += 1;
        Ok(())
    }

    #[inline(always)]
    fn u64(&mut self, v: u64) -> Result<(), NoRoom> {
        if self.out.len() - self.pos >= MAX_VARINT_LEN {
            self.pos += put_u64(&mut self.out[self.pos..], v);
            Ok(())
        } else {
            let mut tmp = [0u8; MAX_VARINT_LEN];
            let n = put_u64(&mut tmp, v);
            let dst = self.out.get_mut(self.pos..self.pos + n).ok_or(NoRoom)?;
            dst.copy_from_slice(&tmp[..n]);
            self.pos += n;
            Ok(())
        }
    }

    fn bytes(&mut self, b: &[u8]) -> Result<(), NoRoom> {
        self.u64(b.len() as u64)?;
        let dst = self
            .out
            .get_mut(self.pos..self.pos + b.len())
            .ok_or(NoRoom)?;
        dst.copy_from_slice(b);
        self.pos += b.len();
        Ok(())
    }

    #[inline(always)]
    fn time(&mut self, ctx: &mut ChunkContext, t: u64) -> Result<(), NoRoom> {
        self.u64(ctx.time_field(t))?;
        ctx.note_time(t);
        Ok(())
    }

    #[inline(always)]
    fn addr(&mut self, ctx: &mut ChunkContext, a: u64) -> Result<(), NoRoom> {
        self.u64(ctx.addr_field(a))?;
        ctx.prev_addr = a;
        Ok(())
    }

    /// The room `alloc` and `free` reserve for their one-check path: the tag,
    /// the allocation function and up to `varints` varints.
    const fn hot_room(varints: usize) -> usize {
        2 + varints * MAX_VARINT_LEN
    }

    /// Writes a hot event's tag, time and address at the start of `buf`
    /// (which has room for them) and moves `ctx` past them; returns the
    /// bytes written.
    #[inline(always)]
    fn put_head(buf: &mut [u8], ctx: &mut ChunkContext, tag: u8, time: u64, addr: u64) -> usize {
        buf[0] = tag;
        let mut n = 1;
        n += put_u64(&mut buf[n..], ctx.time_field(time));
        n += put_u64(&mut buf[n..], ctx.addr_field(addr));
        ctx.note_time(time);
        ctx.prev_addr = addr;
        n
    }

    /// Encodes an allocation without building an [`Event`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn alloc(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        addr: u64,
        size: u64,
        align: u64,
        func: AllocFn,
        stack: u32,
    ) -> Result<(), NoRoom> {
        // With room for the longest encoding, one bounds check for the event
        // instead of one per field.
        if let Some(buf) = self.out.get_mut(self.pos..self.pos + Self::hot_room(5)) {
            let mut n = Self::put_head(buf, ctx, tag::ALLOC, time, addr);
            n += put_u64(&mut buf[n..], size);
            n += put_u64(&mut buf[n..], align);
            buf[n] = func as u8;
            n += 1;
            n += put_u64(&mut buf[n..], u64::from(stack));
            self.pos += n;
            return Ok(());
        }
        self.near_end(|e| {
            e.byte(tag::ALLOC)?;
            e.time(ctx, time)?;
            e.addr(ctx, addr)?;
            e.u64(size)?;
            e.u64(align)?;
            e.byte(func as u8)?;
            e.u64(u64::from(stack))
        })
    }

    /// A hot event's encoding when the output may not hold its longest
    /// form: field by field, out of line, so that the fast path stays small
    /// enough to inline into the agent's hooks.
    #[cold]
    #[inline(never)]
    fn near_end(
        &mut self,
        fields: impl FnOnce(&mut Self) -> Result<(), NoRoom>,
    ) -> Result<(), NoRoom> {
        fields(self)
    }

    /// Encodes a release without building an [`Event`].
    #[inline(always)]
    pub fn free(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        addr: u64,
        func: AllocFn,
        stack: u32,
    ) -> Result<(), NoRoom> {
        if let Some(buf) = self.out.get_mut(self.pos..self.pos + Self::hot_room(3)) {
            let mut n = Self::put_head(buf, ctx, tag::FREE, time, addr);
            buf[n] = func as u8;
            n += 1;
            n += put_u64(&mut buf[n..], u64::from(stack));
            self.pos += n;
            return Ok(());
        }
        self.near_end(|e| {
            e.byte(tag::FREE)?;
            e.time(ctx, time)?;
            e.addr(ctx, addr)?;
            e.byte(func as u8)?;
            e.u64(u64::from(stack))
        })
    }

    /// Encodes a CPU sample without building an [`Event`].
    #[inline]
    pub fn sample(
        &mut self,
        ctx: &mut ChunkContext,
        time: u64,
        stack: u32,
        periods: u32,
    ) -> Result<(), NoRoom> {
        self.byte(tag::SAMPLE)?;
        self.time(ctx, time)?;
        self.u64(u64::from(stack))?;
        self.u64(u64::from(periods))
    }

    /// Encodes a stack definition from a borrowed frame list.
    pub fn stack_def(&mut self, id: u32, frames: &[u64]) -> Result<(), NoRoom> {
        self.byte(tag::STACK_DEF)?;
        self.u64(u64::from(id))?;
        self.u64(frames.len() as u64)?;
        let mut prev = 0u64;
        for &f in frames {
            self.u64(zigzag(f.wrapping_sub(prev) as i64))?;
            prev = f;
        }
        Ok(())
    }

    /// Encodes any event.
    pub fn event(&mut self, ctx: &mut ChunkContext, ev: &Event) -> Result<(), NoRoom> {
        match ev {
            Event::Process(p) => {
                self.byte(tag::PROCESS)?;
                self.u64(u64::from(p.pid))?;
                self.u64(u64::from(p.ppid))?;
                self.u64(p.start_unix_ns)?;
                self.bytes(p.exe.as_bytes())?;
                self.u64(p.argv.len() as u64)?;
                for a in &p.argv {
                    self.bytes(a.as_bytes())?;
                }
                Ok(())
            }
            Event::ModuleLoad(m) => {
                self.byte(tag::MODULE_LOAD)?;
                self.u64(u64::from(m.id))?;
                self.bytes(m.path.as_bytes())?;
                self.bytes(&m.build_id)?;
                self.u64(m.bias)?;
                self.u64(m.segments.len() as u64)?;
                for s in &m.segments {
                    self.u64(s.start)?;
                    self.u64(s.end.wrapping_sub(s.start))?;
                    self.byte(s.flags)?;
                }
                Ok(())
            }
            Event::ModuleUnload { id } => {
                self.byte(tag::MODULE_UNLOAD)?;
                self.u64(u64::from(*id))
            }
            Event::ThreadName { tid, name } => {
                self.byte(tag::THREAD_NAME)?;
                self.u64(u64::from(*tid))?;
                self.bytes(name.as_bytes())
            }
            Event::StackDef { id, frames } => self.stack_def(*id, frames),
            Event::ThreadCreate {
                time,
                create_id,
                stack,
            } => {
                self.byte(tag::THREAD_CREATE)?;
                self.time(ctx, *time)?;
                self.u64(*create_id)?;
                self.u64(u64::from(*stack))
            }
            Event::ThreadStart {
                time,
                parent_tid,
                create_id,
            } => {
                self.byte(tag::THREAD_START)?;
                self.time(ctx, *time)?;
                self.u64(u64::from(*parent_tid))?;
                self.u64(*create_id)
            }
            Event::ThreadEnd { time } => {
                self.byte(tag::THREAD_END)?;
                self.time(ctx, *time)
            }
            Event::Alloc {
                time,
                addr,
                size,
                align,
                func,
                stack,
            } => self.alloc(ctx, *time, *addr, *size, *align, *func, *stack),
            Event::Free {
                time,
                addr,
                func,
                stack,
            } => self.free(ctx, *time, *addr, *func, *stack),
            Event::AllocFailed {
                time,
                func,
                size,
                align,
                stack,
            } => {
                self.byte(tag::ALLOC_FAILED)?;
                self.time(ctx, *time)?;
                self.byte(*func as u8)?;
                self.u64(*size)?;
                self.u64(*align)?;
                self.u64(u64::from(*stack))
            }
            Event::Realloc {
                time,
                old_addr,
                new_addr,
                size,
                func,
                stack,
            } => {
                self.byte(tag::REALLOC)?;
                self.time(ctx, *time)?;
                self.addr(ctx, *old_addr)?;
                self.addr(ctx, *new_addr)?;
                self.u64(*size)?;
                self.byte(*func as u8)?;
                self.u64(u64::from(*stack))
            }
            Event::Error {
                time,
                kind,
                func,
                addr,
                stack,
                alloc_func,
                alloc_size,
                alloc_stack,
                free_stack,
                passed_on,
                given,
            } => {
                self.byte(tag::ERROR)?;
                self.time(ctx, *time)?;
                self.byte(*kind as u8)?;
                self.byte(*func as u8)?;
                self.u64(*addr)?;
                self.u64(u64::from(*stack))?;
                self.byte(alloc_func.map_or(0, |f| f as u8))?;
                self.u64(*alloc_size)?;
                self.u64(u64::from(*alloc_stack))?;
                self.u64(u64::from(*free_stack))?;
                self.byte(u8::from(*passed_on))?;
                if kind.has_given() {
                    self.u64(*given)?;
                }
                Ok(())
            }
            Event::SnapshotBegin { time, kind } => {
                self.byte(tag::SNAPSHOT_BEGIN)?;
                self.time(ctx, *time)?;
                self.byte(*kind as u8)
            }
            Event::LiveBlock {
                addr,
                size,
                func,
                stack,
            } => {
                self.byte(tag::LIVE_BLOCK)?;
                self.addr(ctx, *addr)?;
                self.u64(*size)?;
                self.byte(*func as u8)?;
                self.u64(u64::from(*stack))
            }
            Event::SnapshotEnd { blocks, bytes } => {
                self.byte(tag::SNAPSHOT_END)?;
                self.u64(*blocks)?;
                self.u64(*bytes)
            }
            Event::Recording {
                no_release_stacks,
                allocator_shadowed_by,
                allocator_library,
            } => {
                self.byte(tag::RECORDING)?;
                // A flag word, so later options need no new tag.
                let flags = u64::from(*no_release_stacks)
                    | u64::from(allocator_shadowed_by.is_some()) << RECORDING_SHADOWED_BIT
                    | u64::from(allocator_library.is_some()) << RECORDING_LIBRARY_BIT;
                self.u64(flags)?;
                for module in [allocator_shadowed_by, allocator_library]
                    .into_iter()
                    .flatten()
                {
                    self.bytes(module.as_bytes())?;
                }
                Ok(())
            }
            Event::RunTotals(t) => {
                self.byte(tag::RUN_TOTALS_WITH_FAILED)?;
                self.u64(t.allocation_calls)?;
                self.u64(t.release_calls)?;
                self.u64(t.errors)?;
                self.u64(t.peak_bytes)?;
                self.u64(t.peak_time)?;
                self.u64(t.failed_allocations)
            }
            Event::ScanBegin {
                time,
                scan,
                trigger,
            } => {
                self.byte(tag::SCAN_BEGIN)?;
                self.time(ctx, *time)?;
                self.u64(u64::from(*scan))?;
                self.byte(*trigger as u8)
            }
            Event::ScanBlock {
                scan,
                addr,
                size,
                func,
                stack,
                verdict,
                indirect_bytes,
            } => {
                self.byte(tag::SCAN_BLOCK)?;
                self.u64(u64::from(*scan))?;
                self.addr(ctx, *addr)?;
                self.u64(*size)?;
                self.byte(*func as u8)?;
                self.u64(u64::from(*stack))?;
                self.byte(*verdict as u8)?;
                self.u64(*indirect_bytes)
            }
            Event::ScanEnd { scan, stats } => {
                let with_mappings = stats.mappings_not_excluded != 0;
                self.byte(if with_mappings {
                    tag::SCAN_END_WITH_MAPPINGS
                } else {
                    tag::SCAN_END
                })?;
                self.u64(u64::from(*scan))?;
                self.u64(stats.pause_ns)?;
                self.u64(u64::from(stats.threads))?;
                self.u64(u64::from(stats.threads_not_suspended))?;
                self.u64(stats.root_bytes)?;
                self.u64(stats.blocks)?;
                self.u64(stats.bytes)?;
                if with_mappings {
                    self.u64(stats.mappings_not_excluded)?;
                }
                Ok(())
            }
            Event::ScanSkipped {
                time,
                trigger,
                reason,
                needed,
                available,
                limit,
            } => {
                self.byte(tag::SCAN_SKIPPED)?;
                self.time(ctx, *time)?;
                self.byte(*trigger as u8)?;
                self.byte(*reason as u8)?;
                self.u64(*needed)?;
                self.u64(*available)?;
                self.u64(*limit)
            }
            Event::Fork { time, child_pid } => {
                self.byte(tag::FORK)?;
                self.time(ctx, *time)?;
                self.u64(u64::from(*child_pid))
            }
            Event::ProfileStart { time, hz, signal } => {
                self.byte(tag::PROFILE_START)?;
                self.time(ctx, *time)?;
                self.u64(u64::from(*hz))?;
                self.u64(u64::from(*signal))
            }
            Event::Sample {
                time,
                stack,
                periods,
            } => self.sample(ctx, *time, *stack, *periods),
            Event::SamplesSkipped { time, periods } => {
                self.byte(tag::SAMPLES_SKIPPED)?;
                self.time(ctx, *time)?;
                self.u64(*periods)
            }
            Event::SamplesMissed { time, periods } => {
                self.byte(tag::SAMPLES_MISSED)?;
                self.time(ctx, *time)?;
                self.u64(*periods)
            }
            Event::ProfileStop { time, reason } => {
                self.byte(tag::PROFILE_STOP)?;
                self.time(ctx, *time)?;
                self.byte(*reason as u8)
            }
            Event::End {
                time,
                exit,
                counters,
            } => {
                self.byte(tag::END)?;
                self.time(ctx, *time)?;
                match exit {
                    ExitKind::Code(c) => {
                        self.byte(0)?;
                        self.u64(zigzag(i64::from(*c)))?;
                    }
                    ExitKind::Signal(s) => {
                        self.byte(1)?;
                        self.u64(zigzag(i64::from(*s)))?;
                    }
                    ExitKind::Exec => self.byte(2)?,
                }
                self.u64(counters.events)?;
                self.u64(counters.events_lost)?;
                self.u64(counters.untracked_calls)
            }
            Event::Lock(l) => self.lock_event(ctx, l),
        }
    }
}

/// Encodes one event onto the end of a vector.
pub fn encode_to_vec(out: &mut Vec<u8>, ctx: &mut ChunkContext, ev: &Event) {
    let mut room = 256;
    loop {
        let start = out.len();
        out.resize(start + room, 0);
        let mut saved = *ctx;
        let mut enc = Encoder::new(&mut out[start..]);
        match enc.event(&mut saved, ev) {
            Ok(()) => {
                let n = enc.len();
                out.truncate(start + n);
                *ctx = saved;
                return;
            }
            Err(NoRoom) => {
                out.truncate(start);
                room *= 4;
            }
        }
    }
}

/// Why an event could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("event ends early")]
    Truncated,
    #[error("unknown event tag {0}")]
    UnknownTag(u8),
    #[error("invalid value for {0}")]
    Invalid(&'static str),
    #[error("{what} too long ({len})")]
    TooLong { what: &'static str, len: u64 },
}

/// Reads events out of one decompressed chunk payload.
pub struct Decoder<'a> {
    input: &'a [u8],
    pos: usize,
    ctx: ChunkContext,
    failed: bool,
}

impl<'a> Decoder<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Decoder {
            input,
            pos: 0,
            ctx: ChunkContext::default(),
            failed: false,
        }
    }

    /// Byte offset of the next event inside the payload. After the iterator
    /// yielded an error: the offset of the event that could not be decoded.
    pub fn position(&self) -> usize {
        self.pos
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        get_u64(self.input, &mut self.pos).ok_or(DecodeError::Truncated)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        u32::try_from(self.u64()?).map_err(|_| DecodeError::Invalid(what))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        i32::try_from(unzigzag(self.u64()?)).map_err(|_| DecodeError::Invalid(what))
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.input.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u64()?;
        if len > MAX_STRING_LEN as u64 {
            return Err(DecodeError::TooLong { what, len });
        }
        let end = self
            .pos
            .checked_add(len as usize)
            .ok_or(DecodeError::Truncated)?;
        let s = self
            .input
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(self.bytes(what)?).into_owned())
    }

    fn time(&mut self) -> Result<u64, DecodeError> {
        let t = self
            .ctx
            .prev_time
            .checked_add(self.u64()?)
            .ok_or(DecodeError::Invalid("time"))?;
        self.ctx.prev_time = t;
        Ok(t)
    }

    fn addr(&mut self) -> Result<u64, DecodeError> {
        let a = self
            .ctx
            .prev_addr
            .wrapping_add(unzigzag(self.u64()?) as u64);
        self.ctx.prev_addr = a;
        Ok(a)
    }

    fn func(&mut self) -> Result<AllocFn, DecodeError> {
        AllocFn::from_u8(self.byte()?).ok_or(DecodeError::Invalid("allocation function"))
    }

    fn decode_one(&mut self) -> Result<Event, DecodeError> {
        let t = self.byte()?;
        Ok(match t {
            tag::PROCESS => {
                let pid = self.u32("pid")?;
                let ppid = self.u32("ppid")?;
                let start_unix_ns = self.u64()?;
                let exe = self.string("executable path")?;
                let n = self.u64()?;
                if n > MAX_ARGS as u64 {
                    return Err(DecodeError::TooLong {
                        what: "argument list",
                        len: n,
                    });
                }
                let mut argv = Vec::with_capacity(n.min(64) as usize);
                for _ in 0..n {
                    argv.push(self.string("argument")?);
                }
                Event::Process(ProcessInfo {
                    pid,
                    ppid,
                    start_unix_ns,
                    exe,
                    argv,
                })
            }
            tag::MODULE_LOAD => {
                let id = self.u32("module id")?;
                let path = self.string("module path")?;
                let build_id = self.bytes("build id")?.to_vec();
                let bias = self.u64()?;
                let n = self.u64()?;
                if n > 256 {
                    return Err(DecodeError::TooLong {
                        what: "segment list",
                        len: n,
                    });
                }
                let mut segments = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let start = self.u64()?;
                    let len = self.u64()?;
                    let flags = self.byte()?;
                    let end = start
                        .checked_add(len)
                        .ok_or(DecodeError::Invalid("segment"))?;
                    segments.push(Segment { start, end, flags });
                }
                Event::ModuleLoad(ModuleInfo {
                    id,
                    path,
                    build_id,
                    bias,
                    segments,
                })
            }
            tag::MODULE_UNLOAD => Event::ModuleUnload {
                id: self.u32("module id")?,
            },
            tag::THREAD_NAME => {
                let tid = self.u32("thread id")?;
                let name = self.string("thread name")?;
                Event::ThreadName { tid, name }
            }
            tag::STACK_DEF => {
                let id = self.u32("stack id")?;
                let n = self.u64()?;
                if n > MAX_STACK_FRAMES as u64 {
                    return Err(DecodeError::TooLong {
                        what: "stack",
                        len: n,
                    });
                }
                let mut frames = Vec::with_capacity(n as usize);
                let mut prev = 0u64;
                for _ in 0..n {
                    prev = prev.wrapping_add(unzigzag(self.u64()?) as u64);
                    frames.push(prev);
                }
                Event::StackDef { id, frames }
            }
            tag::THREAD_CREATE => {
                let time = self.time()?;
                let create_id = self.u64()?;
                let stack = self.u32("stack id")?;
                Event::ThreadCreate {
                    time,
                    create_id,
                    stack,
                }
            }
            tag::THREAD_START => {
                let time = self.time()?;
                let parent_tid = self.u32("thread id")?;
                let create_id = self.u64()?;
                Event::ThreadStart {
                    time,
                    parent_tid,
                    create_id,
                }
            }
            tag::THREAD_END => Event::ThreadEnd { time: self.time()? },
            tag::ALLOC => {
                let time = self.time()?;
                let addr = self.addr()?;
                let size = self.u64()?;
                let align = self.u64()?;
                let func = self.func()?;
                let stack = self.u32("stack id")?;
                Event::Alloc {
                    time,
                    addr,
                    size,
                    align,
                    func,
                    stack,
                }
            }
            tag::FREE => {
                let time = self.time()?;
                let addr = self.addr()?;
                let func = self.func()?;
                let stack = self.u32("stack id")?;
                Event::Free {
                    time,
                    addr,
                    func,
                    stack,
                }
            }
            tag::ALLOC_FAILED => {
                let time = self.time()?;
                let func = self.func()?;
                let size = self.u64()?;
                let align = self.u64()?;
                let stack = self.u32("stack id")?;
                Event::AllocFailed {
                    time,
                    func,
                    size,
                    align,
                    stack,
                }
            }
            tag::REALLOC => {
                let time = self.time()?;
                let old_addr = self.addr()?;
                let new_addr = self.addr()?;
                let size = self.u64()?;
                let func = self.func()?;
                let stack = self.u32("stack id")?;
                Event::Realloc {
                    time,
                    old_addr,
                    new_addr,
                    size,
                    func,
                    stack,
                }
            }
            tag::ERROR => {
                let time = self.time()?;
                let kind =
                    ErrorKind::from_u8(self.byte()?).ok_or(DecodeError::Invalid("error kind"))?;
                let func = self.func()?;
                let addr = self.u64()?;
                let stack = self.u32("stack id")?;
                let alloc_func = match self.byte()? {
                    0 => None,
                    v => Some(
                        AllocFn::from_u8(v).ok_or(DecodeError::Invalid("allocation function"))?,
                    ),
                };
                let alloc_size = self.u64()?;
                let alloc_stack = self.u32("stack id")?;
                let free_stack = self.u32("stack id")?;
                let passed_on = match self.byte()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("passed_on flag")),
                };
                let given = if kind.has_given() { self.u64()? } else { 0 };
                Event::Error {
                    time,
                    kind,
                    func,
                    addr,
                    stack,
                    alloc_func,
                    alloc_size,
                    alloc_stack,
                    free_stack,
                    passed_on,
                    given,
                }
            }
            tag::SNAPSHOT_BEGIN => {
                let time = self.time()?;
                let kind = match self.byte()? {
                    1 => SnapshotKind::Exit,
                    _ => return Err(DecodeError::Invalid("snapshot kind")),
                };
                Event::SnapshotBegin { time, kind }
            }
            tag::LIVE_BLOCK => {
                let addr = self.addr()?;
                let size = self.u64()?;
                let func = self.func()?;
                let stack = self.u32("stack id")?;
                Event::LiveBlock {
                    addr,
                    size,
                    func,
                    stack,
                }
            }
            tag::SNAPSHOT_END => Event::SnapshotEnd {
                blocks: self.u64()?,
                bytes: self.u64()?,
            },
            tag::RECORDING => {
                let flags = self.u64()?;
                if flags >> (RECORDING_LIBRARY_BIT + 1) != 0 {
                    return Err(DecodeError::Invalid("recording flags"));
                }
                let allocator_shadowed_by = if flags >> RECORDING_SHADOWED_BIT & 1 != 0 {
                    Some(self.string("shadowing module")?)
                } else {
                    None
                };
                let allocator_library = if flags >> RECORDING_LIBRARY_BIT & 1 != 0 {
                    Some(self.string("allocator library")?)
                } else {
                    None
                };
                Event::Recording {
                    no_release_stacks: flags & 1 != 0,
                    allocator_shadowed_by,
                    allocator_library,
                }
            }
            tag::RUN_TOTALS | tag::RUN_TOTALS_WITH_FAILED => Event::RunTotals(RunTotals {
                allocation_calls: self.u64()?,
                release_calls: self.u64()?,
                errors: self.u64()?,
                peak_bytes: self.u64()?,
                peak_time: self.u64()?,
                failed_allocations: if t == tag::RUN_TOTALS_WITH_FAILED {
                    self.u64()?
                } else {
                    0
                },
            }),
            tag::SCAN_BEGIN => {
                let time = self.time()?;
                let scan = self.u32("scan number")?;
                let trigger = ScanTrigger::from_u8(self.byte()?)
                    .ok_or(DecodeError::Invalid("scan trigger"))?;
                Event::ScanBegin {
                    time,
                    scan,
                    trigger,
                }
            }
            tag::SCAN_BLOCK => {
                let scan = self.u32("scan number")?;
                let addr = self.addr()?;
                let size = self.u64()?;
                let func = self.func()?;
                let stack = self.u32("stack id")?;
                let verdict =
                    Verdict::from_u8(self.byte()?).ok_or(DecodeError::Invalid("verdict"))?;
                Event::ScanBlock {
                    scan,
                    addr,
                    size,
                    func,
                    stack,
                    verdict,
                    indirect_bytes: self.u64()?,
                }
            }
            tag::SCAN_END | tag::SCAN_END_WITH_MAPPINGS => {
                let scan = self.u32("scan number")?;
                let stats = ScanStats {
                    pause_ns: self.u64()?,
                    threads: self.u32("thread count")?,
                    threads_not_suspended: self.u32("thread count")?,
                    root_bytes: self.u64()?,
                    blocks: self.u64()?,
                    bytes: self.u64()?,
                    mappings_not_excluded: if t == tag::SCAN_END_WITH_MAPPINGS {
                        self.u64()?
                    } else {
                        0
                    },
                };
                Event::ScanEnd { scan, stats }
            }
            tag::SCAN_SKIPPED => {
                let time = self.time()?;
                let trigger = ScanTrigger::from_u8(self.byte()?)
                    .ok_or(DecodeError::Invalid("scan trigger"))?;
                let reason = ScanSkipReason::from_u8(self.byte()?)
                    .ok_or(DecodeError::Invalid("scan skip reason"))?;
                Event::ScanSkipped {
                    time,
                    trigger,
                    reason,
                    needed: self.u64()?,
                    available: self.u64()?,
                    limit: self.u64()?,
                }
            }
            tag::FORK => {
                let time = self.time()?;
                Event::Fork {
                    time,
                    child_pid: self.u32("pid")?,
                }
            }
            tag::END => {
                let time = self.time()?;
                let exit = match self.byte()? {
                    0 => ExitKind::Code(self.i32("exit code")?),
                    1 => ExitKind::Signal(self.i32("signal")?),
                    2 => ExitKind::Exec,
                    _ => return Err(DecodeError::Invalid("exit kind")),
                };
                let counters = EndCounters {
                    events: self.u64()?,
                    events_lost: self.u64()?,
                    untracked_calls: self.u64()?,
                };
                Event::End {
                    time,
                    exit,
                    counters,
                }
            }
            tag::PROFILE_START => {
                let time = self.time()?;
                let hz = self.u32("sampling rate")?;
                let signal = self.u32("signal")?;
                Event::ProfileStart { time, hz, signal }
            }
            tag::SAMPLE => {
                let time = self.time()?;
                let stack = self.u32("stack id")?;
                let periods = self.u32("sample periods")?;
                Event::Sample {
                    time,
                    stack,
                    periods,
                }
            }
            tag::SAMPLES_SKIPPED => {
                let time = self.time()?;
                Event::SamplesSkipped {
                    time,
                    periods: self.u64()?,
                }
            }
            tag::SAMPLES_MISSED => {
                let time = self.time()?;
                Event::SamplesMissed {
                    time,
                    periods: self.u64()?,
                }
            }
            tag::PROFILE_STOP => {
                let time = self.time()?;
                let reason = match self.byte()? {
                    1 => ProfileStopReason::SignalTaken,
                    _ => return Err(DecodeError::Invalid("profile stop reason")),
                };
                Event::ProfileStop { time, reason }
            }
            locks::tag::FIRST..=locks::tag::LAST => return self.decode_lock(t),
            other => return Err(DecodeError::UnknownTag(other)),
        })
    }
}

impl Iterator for Decoder<'_> {
    type Item = Result<Event, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.input.len() {
            return None;
        }
        let start = self.pos;
        let r = self.decode_one();
        if r.is_err() {
            // A chunk is checksummed as a whole; past a bad event nothing in it
            // can be trusted. Keep the position of the bad event for reports.
            self.failed = true;
            self.pos = start;
        }
        Some(r)
    }
}

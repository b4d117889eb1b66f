//! The event model: everything the agent records, and its binary encoding.
//!
//! Every event is one tag byte followed by LEB128 fields. Timed events store
//! the nanoseconds since the previous timed event of the same chunk (the first
//! one of a chunk stores its absolute time), so a busy thread pays one or two
//! bytes for its clock. Addresses of allocations are stored as deltas from the
//! previous address in the chunk, zig-zag encoded, because consecutive blocks
//! tend to sit close together.
//!
//! Each event's layout is a row of the table in `event/codec.rs`, which
//! makes both the encoder and the decoder; only the agent's hottest events
//! have hand-written encoders too.

use crate::scan::{ScanSkipReason, ScanStats, ScanTrigger, Verdict};
use crate::varint::{get_u64, put_u64, unzigzag, zigzag, MAX_VARINT_LEN};

mod codec;
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
    // Format version 14: a Linux guest kernel's allocators, recorded by
    // `trapline vm replay`.
    /// `kmalloc` and its variants (`__kmalloc*`, `kmalloc_large*`).
    Kmalloc,
    /// `kmem_cache_alloc` and its variants.
    KmemCacheAlloc,
    /// `kvmalloc`: kmalloc, or vmalloc when that fails.
    Kvmalloc,
    Krealloc,
    /// `vmalloc` and its variants (`vzalloc`, `__vmalloc*`).
    Vmalloc,
    Kfree,
    KmemCacheFree,
    Kvfree,
    Vfree,
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
    /// A guest kernel's allocators (kmalloc, slab caches, vmalloc).
    Kernel,
}

impl Family {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Malloc => "malloc",
            Family::New => "new",
            Family::NewArray => "new[]",
            Family::Kernel => "kernel",
        }
    }
}

impl AllocFn {
    /// Every function, in format order.
    pub const ALL: [AllocFn; 46] = [
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
        AllocFn::Kmalloc,
        AllocFn::KmemCacheAlloc,
        AllocFn::Kvmalloc,
        AllocFn::Krealloc,
        AllocFn::Vmalloc,
        AllocFn::Kfree,
        AllocFn::KmemCacheFree,
        AllocFn::Kvfree,
        AllocFn::Vfree,
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
            AllocFn::Kmalloc => "kmalloc",
            AllocFn::KmemCacheAlloc => "kmem_cache_alloc",
            AllocFn::Kvmalloc => "kvmalloc",
            AllocFn::Krealloc => "krealloc",
            AllocFn::Vmalloc => "vmalloc",
            AllocFn::Kfree => "kfree",
            AllocFn::KmemCacheFree => "kmem_cache_free",
            AllocFn::Kvfree => "kvfree",
            AllocFn::Vfree => "vfree",
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
            Kmalloc | KmemCacheAlloc | Kvmalloc | Krealloc | Vmalloc | Kfree | KmemCacheFree
            | Kvfree | Vfree => Family::Kernel,
            _ => Family::Malloc,
        }
    }

    /// True for the functions that release memory.
    pub fn is_release(self) -> bool {
        use AllocFn::*;
        matches!(
            self,
            Free | Sdallocx
                | Kfree
                | KmemCacheFree
                | Kvfree
                | Vfree
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
    /// The agent was detached (`trapline detach`); the process went on
    /// (format version 13).
    Detach,
}

/// Why a snapshot of the live blocks was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SnapshotKind {
    /// At the end of the process, after atexit handlers and libc's freeres.
    Exit = 1,
}

impl SnapshotKind {
    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<SnapshotKind> {
        match value {
            1 => Some(SnapshotKind::Exit),
            _ => None,
        }
    }
}

/// Why CPU sampling stopped before the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProfileStopReason {
    /// The program installed a handler for the sampling signal: it is
    /// handed over and sampling stops.
    SignalTaken = 1,
}

impl ProfileStopReason {
    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<ProfileStopReason> {
        match value {
            1 => Some(ProfileStopReason::SignalTaken),
            _ => None,
        }
    }
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
    /// The stack `id`, defined by the [`Event::StackDef`] just before, holds
    /// only the allocation call's caller: sampled recording took it for an
    /// allocation it did not sample (format version 12).
    CallerOnlyStack {
        id: u32,
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
    /// Sampling periods that struck while the chunk's thread was inside
    /// trapline's agent, serving the program's call with stack `stack`
    /// (return addresses, as an allocation's; 0: a call whose stack was not
    /// taken): the agent's time, charged to the call that entered it
    /// (format version 11).
    AgentSamples {
        time: u64,
        stack: u32,
        periods: u32,
    },
    /// Sampling periods of the chunk's thread with no sample: the signal
    /// struck in the agent's own code outside a call of the program's (a
    /// hook's entry, an agent thread), or no stack could be taken.
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
        /// Allocations and releases were recorded (`--record` without
        /// `mem` clears it: the trace has none; format version 11).
        memory_recorded: bool,
        /// Locks, condition waits and joins were recorded (`--record`
        /// without `locks` clears it; format version 11).
        locks_recorded: bool,
        /// Sampled recording (`--sample`): the mean bytes allocated between
        /// two allocations whose full stack was taken, drawn as a Poisson
        /// process over bytes, so a block of `size` bytes was sampled with
        /// probability `1 - exp(-size / sample_bytes)`. The stacks of the
        /// others hold only their caller ([`Event::CallerOnlyStack`]). 0:
        /// every allocation's full stack (format version 12).
        sample_bytes: u64,
        /// Production mode (`--production`; format version 17): only the
        /// sampled allocations are in the trace, each with its full stack,
        /// with their releases; the others are counted per function
        /// ([`Event::CallCounts`]) and nothing else. `sample_bytes` is the
        /// sampling's mean.
        production: bool,
    },
    /// The control socket the agent serves (`trapline run --control`),
    /// after `Recording` (format version 11).
    ControlSocket {
        path: String,
    },
    /// The agent was attached to a process already running (`trapline
    /// attach`), at `time`: the blocks allocated before are unknown to the
    /// trace (format version 13).
    Attach {
        time: u64,
    },
    /// Written at the end of an attached trace: releases (`free`,
    /// `delete`, or a `realloc` that moved or freed) of blocks allocated
    /// before the attach, passed on to the allocator and not recorded
    /// (format version 13).
    AttachTotals {
        earlier_releases: u64,
    },
    /// A watcher's verdict on an allocation site while the program ran
    /// (`trapline watch`; format version 11). The latest one of a site
    /// stands.
    SiteVerdict {
        time: u64,
        stack: u32,
        func: AllocFn,
        /// `site_verdict::GROWING` and `site_verdict::STALE` bits.
        kinds: u64,
        /// The growth's Theil-Sen slope (0 when not growing).
        growth_bytes_per_second: u64,
        /// Blocks of the site whose pages were watched, and how many of
        /// them no access reached.
        watched_blocks: u64,
        untouched_blocks: u64,
        /// The untouched blocks went untouched at least this long.
        untouched_ns: u64,
        /// Trace time of the latest access seen to a watched block of the
        /// site (0: none).
        last_access_ns: u64,
    },
    /// The chunk's thread died of a fatal signal raised by its own code (a
    /// fault, `abort`), at `time`: the signal, its `si_code`, the faulting
    /// address (`si_addr`; 0 for signals without one) and the stack where
    /// the signal struck, its innermost frame the interrupted instruction
    /// (format version 15).
    Crash {
        time: u64,
        signal: u32,
        code: i32,
        addr: u64,
        stack: u32,
    },
    /// Another thread crashed (`Crash`) and the chunk's thread was stopped
    /// for the exit's scan at `time`, where `stack` shows: its innermost
    /// frame the interrupted instruction (format version 16).
    StoppedAtCrash {
        time: u64,
        stack: u32,
    },
    /// The calls of one allocator function the process made up to `time`,
    /// every one counted whether recorded or not, and the bytes they asked
    /// for (production mode; format version 17). The latest one of a
    /// function stands.
    CallCounts {
        time: u64,
        func: AllocFn,
        calls: u64,
        bytes: u64,
    },
    /// A lock or thread-synchronisation event (tags 64-95).
    Lock(LockEvent),
}

/// The bits of `Event::SiteVerdict`'s `kinds`.
/// Sampled recording (`Recording::sample_bytes`): the probability that a
/// block of `size` bytes took its full stack, sample points falling on the
/// bytes a thread allocates as a Poisson process of mean `mean_bytes`. A
/// zero-byte block counts as one byte, as the agent counts it.
pub fn sample_probability(size: u64, mean_bytes: u64) -> f64 {
    -(-(size.max(1) as f64) / mean_bytes as f64).exp_m1()
}

pub mod site_verdict {
    pub const GROWING: u64 = 1;
    pub const STALE: u64 = 2;
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
            | Event::AgentSamples { time, .. }
            | Event::SamplesSkipped { time, .. }
            | Event::SamplesMissed { time, .. }
            | Event::SiteVerdict { time, .. }
            | Event::Attach { time }
            | Event::Crash { time, .. }
            | Event::StoppedAtCrash { time, .. }
            | Event::CallCounts { time, .. }
            | Event::ProfileStop { time, .. } => Some(*time),
            Event::Lock(l) => Some(l.time()),
            _ => None,
        }
    }
}

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
    pub const CALLER_ONLY_STACK: u8 = 9;
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
    /// Format version 11.
    pub const SITE_VERDICT: u8 = 40;
    pub const FORK: u8 = 48;
    pub const END: u8 = 49;
    pub const RUN_TOTALS: u8 = 50;
    pub const RECORDING: u8 = 51;
    /// `RunTotals` with the failed allocation calls (format version 7).
    pub const RUN_TOTALS_WITH_FAILED: u8 = 52;
    /// Format version 11.
    pub const CONTROL_SOCKET: u8 = 53;
    /// Format version 13.
    pub const ATTACH: u8 = 54;
    /// Format version 13.
    pub const ATTACH_TOTALS: u8 = 55;
    /// Format version 15.
    pub const CRASH: u8 = 56;
    /// Format version 16.
    pub const STOPPED_AT_CRASH: u8 = 57;
    /// Format version 17.
    pub const CALL_COUNTS: u8 = 58;
    // 64..=95: locks and thread synchronisation.
    pub const LOCK_INIT: u8 = 64;
    pub const LOCK_DESTROY: u8 = 65;
    pub const LOCK_ACQUIRE: u8 = 66;
    pub const LOCK_RELEASE: u8 = 67;
    /// A release that also says how long the agent worked inside the hold
    /// (format version 12).
    pub const LOCK_RELEASE_WITH_AGENT_TIME: u8 = 75;
    pub const LOCK_REQUEST: u8 = 68;
    pub const LOCK_FAILED: u8 = 69;
    pub const LOCK_MISUSE: u8 = 70;
    pub const JOIN: u8 = 71;
    pub const DETACH: u8 = 72;
    /// pthread_exit.
    pub const THREAD_EXIT: u8 = 73;
    pub const JOIN_WAIT: u8 = 74;
    // 96..=111: the CPU profiler.
    pub const PROFILE_START: u8 = 96;
    pub const SAMPLE: u8 = 97;
    pub const SAMPLES_SKIPPED: u8 = 98;
    pub const PROFILE_STOP: u8 = 99;
    pub const SAMPLES_MISSED: u8 = 100;
    /// Format version 11.
    pub const AGENT_SAMPLES: u8 = 101;
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

    /// Encodes an allocation without building an [`Event`]: the agent's
    /// hot path. Its common case is written by hand beside the table's
    /// `Alloc` row because the table writes field by field, a bounds check
    /// each; `tests/golden.rs` holds the two to the same bytes.
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
            let ev = Event::Alloc {
                time,
                addr,
                size,
                align,
                func,
                stack,
            };
            e.event(ctx, &ev)
        })
    }

    /// A hot event's encoding when the output may not hold its longest
    /// form: the table's, out of line, so that the fast path stays small
    /// enough to inline into the agent's hooks.
    #[cold]
    #[inline(never)]
    fn near_end(
        &mut self,
        fields: impl FnOnce(&mut Self) -> Result<(), NoRoom>,
    ) -> Result<(), NoRoom> {
        fields(self)
    }

    /// Encodes a release without building an [`Event`]; by hand for the
    /// reason [`Encoder::alloc`] is.
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
            let ev = Event::Free {
                time,
                addr,
                func,
                stack,
            };
            e.event(ctx, &ev)
        })
    }

    /// Encodes a CPU sample without building an [`Event`]: by hand beside
    /// the table's `Sample` row because the agent's signal handler calls
    /// it, and through the table's dispatch it took twice as long (6.7
    /// against 3.3 ns).
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

    /// Encodes a stack definition from a borrowed frame list, as the table's
    /// `StackDef` row does: the agent defines stacks from its own frame
    /// buffer, and an [`Event::StackDef`] would need a `Vec`, an allocation
    /// inside the allocator's hooks.
    pub fn stack_def(&mut self, id: u32, frames: &[u64]) -> Result<(), NoRoom> {
        self.byte(tag::STACK_DEF)?;
        self.u64(u64::from(id))?;
        codec::Frames::put_slice(self, frames)
    }

    /// Encodes a caller-only stack's definition: its `StackDef` of one frame
    /// and the [`Event::CallerOnlyStack`] that marks it, both or neither.
    pub fn caller_only_stack_def(&mut self, id: u32, caller: u64) -> Result<(), NoRoom> {
        let at = self.pos;
        let done = self.stack_def(id, &[caller]).and_then(|()| {
            self.byte(tag::CALLER_ONLY_STACK)?;
            self.u64(u64::from(id))
        });
        if done.is_err() {
            self.pos = at;
        }
        done
    }

    /// Encodes any event.
    pub fn event(&mut self, ctx: &mut ChunkContext, ev: &Event) -> Result<(), NoRoom> {
        codec::put_event(self, ctx, ev)
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

    fn decode_one(&mut self) -> Result<Event, DecodeError> {
        codec::get_event(self)
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

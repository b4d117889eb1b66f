//! Types of the reachability-scan events (tags 35-38): when a scan ran, the
//! verdict on each live block, what the scan cost, and why a scan did not run.

/// Why a reachability scan ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ScanTrigger {
    /// At the end of the process, after atexit handlers and libc's freeres.
    Exit = 1,
    /// Every `--scan-every SECS` seconds while the program runs.
    Periodic = 2,
}

impl ScanTrigger {
    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<ScanTrigger> {
        Some(match value {
            1 => ScanTrigger::Exit,
            2 => ScanTrigger::Periodic,
            _ => return None,
        })
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ScanTrigger::Exit => "exit",
            ScanTrigger::Periodic => "periodic",
        }
    }
}

/// What the scan concluded about one live block (memcheck's four kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Verdict {
    /// Not reached, and the head of an unreachable structure.
    DefinitelyLost = 1,
    /// Not reached, but pointed to by a lost block.
    IndirectlyLost = 2,
    /// Reached, but only through an interior pointer somewhere on every chain.
    PossiblyLost = 3,
    /// Reached from a root by a chain of start pointers.
    StillReachable = 4,
}

impl Verdict {
    /// Every verdict, in format order.
    pub const ALL: [Verdict; 4] = [
        Verdict::DefinitelyLost,
        Verdict::IndirectlyLost,
        Verdict::PossiblyLost,
        Verdict::StillReachable,
    ];

    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<Verdict> {
        Verdict::ALL
            .get(usize::from(value).wrapping_sub(1))
            .copied()
    }

    /// The name used in reports (`kind` of a loss record).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::DefinitelyLost => "definitely_lost",
            Verdict::IndirectlyLost => "indirectly_lost",
            Verdict::PossiblyLost => "possibly_lost",
            Verdict::StillReachable => "still_reachable",
        }
    }
}

/// What one scan saw and cost, written at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// How long the program's threads were stopped (and the live table locked).
    pub pause_ns: u64,
    /// Threads of the process when the scan ran, the scanning thread included.
    pub threads: u32,
    /// Threads that could not be stopped (their stacks and registers were not
    /// scanned: false leaks are possible).
    pub threads_not_suspended: u32,
    /// Bytes of root memory scanned (stacks, registers, static data, TLS, mappings).
    pub root_bytes: u64,
    /// Live blocks judged.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Mappings of the allocator library's metadata or of the agent's own
    /// memory that the scan could not leave out of its roots (their tables
    /// were full): the blocks they point to counted as reachable, so leaks
    /// may have been missed (format version 9; 0 before).
    pub mappings_not_excluded: u64,
}

/// Why a reachability scan did not run (`ScanSkipped`, format version 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ScanSkipReason {
    /// The scan's memory would have passed the memory limit of the
    /// process's control group: the kernel's OOM killer would have ended
    /// the program.
    CgroupMemory = 1,
    /// It would have passed the system's commit limit
    /// (`vm.overcommit_memory=2`): the agent's allocation would have failed.
    CommitLimit = 2,
    /// It would have passed the process's limit of address space (`ulimit -v`).
    AddressSpaceLimit = 3,
    /// It would have passed the process's limit of data (`ulimit -d`).
    DataLimit = 4,
    /// It would have taken more than the memory the system has available
    /// (`MemAvailable` and free swap): the OOM killer would have chosen.
    SystemMemory = 5,
    /// The process's memory could not be read without the risk of a fault
    /// (a seccomp filter, and `/proc/thread-self/mem` could not be opened).
    MemoryUnreadable = 6,
    /// The agent heap was refused the scan's memory although the limits
    /// left room for it when checked (the program grew in between).
    AllocationFailed = 7,
    /// Periodic scans had paused the program for more than their budget of
    /// its wall time (`--scan-budget`): the scan was deferred (format
    /// version 10). `needed` is the pause time spent so far (ns),
    /// `available` the wall time since the start (ns), `limit` the budget in
    /// parts per million.
    OverBudget = 8,
}

impl ScanSkipReason {
    /// Every reason, in format order.
    pub const ALL: [ScanSkipReason; 8] = [
        ScanSkipReason::CgroupMemory,
        ScanSkipReason::CommitLimit,
        ScanSkipReason::AddressSpaceLimit,
        ScanSkipReason::DataLimit,
        ScanSkipReason::SystemMemory,
        ScanSkipReason::MemoryUnreadable,
        ScanSkipReason::AllocationFailed,
        ScanSkipReason::OverBudget,
    ];

    /// Decodes the format value.
    pub fn from_u8(value: u8) -> Option<ScanSkipReason> {
        ScanSkipReason::ALL
            .get(usize::from(value).wrapping_sub(1))
            .copied()
    }

    /// The name used in JSON reports.
    pub fn name(self) -> &'static str {
        match self {
            ScanSkipReason::CgroupMemory => "cgroup_memory_limit",
            ScanSkipReason::CommitLimit => "commit_limit",
            ScanSkipReason::AddressSpaceLimit => "address_space_limit",
            ScanSkipReason::DataLimit => "data_limit",
            ScanSkipReason::SystemMemory => "system_memory",
            ScanSkipReason::MemoryUnreadable => "memory_unreadable",
            ScanSkipReason::AllocationFailed => "allocation_failed",
            ScanSkipReason::OverBudget => "over_budget",
        }
    }

    /// What passing the limit would have done, for text reports.
    pub fn consequence_text(self) -> &'static str {
        match self {
            ScanSkipReason::CgroupMemory | ScanSkipReason::SystemMemory => {
                "the kernel's OOM killer could have ended the program"
            }
            ScanSkipReason::CommitLimit
            | ScanSkipReason::AddressSpaceLimit
            | ScanSkipReason::DataLimit => {
                "the scan's allocation could have failed and ended the program"
            }
            ScanSkipReason::MemoryUnreadable => "reading it could have crashed the program",
            ScanSkipReason::AllocationFailed => "the scan gave way rather than fail the program",
            ScanSkipReason::OverBudget => "the program ran on undisturbed",
        }
    }

    /// What the limit is, for text reports ("the memory limit of its cgroup").
    pub fn limit_text(self) -> &'static str {
        match self {
            ScanSkipReason::CgroupMemory => "the memory limit of the process's cgroup",
            ScanSkipReason::CommitLimit => "the system's commit limit (vm.overcommit_memory=2)",
            ScanSkipReason::AddressSpaceLimit => "the process's address-space limit (ulimit -v)",
            ScanSkipReason::DataLimit => "the process's data limit (ulimit -d)",
            ScanSkipReason::SystemMemory => "the memory the system had available",
            ScanSkipReason::MemoryUnreadable => {
                "a seccomp filter (the process's memory could not be read safely)"
            }
            ScanSkipReason::AllocationFailed => {
                "the agent was refused the memory (the program grew after the room check, \
                 or TRAPLINE_SCAN_CHECK=0 turned the check off)"
            }
            ScanSkipReason::OverBudget => {
                "the periodic scans' budget of the run's time (--scan-budget)"
            }
        }
    }
}

//! Types of the reachability-scan events (tags 35-37): when a scan ran, the
//! verdict on each live block, and what the scan cost.

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
}

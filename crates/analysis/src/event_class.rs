//! The classes of events a trace's chunks hold: what a pass skips a chunk
//! by, when the index file (`index_file`) says which classes each holds.

use trapline_trace::Event;

/// The classes of events a chunk can hold, one bit each. Passes skip a
/// chunk by its classes: a class is as fine as some pass needs it to be.
pub mod classes {
    /// Process, modules, thread names, recording settings, the end, forks,
    /// crashes, the bounds of snapshots and scans, sampling's start and
    /// stop: rare events every analysis reads.
    pub const META: u16 = 1 << 0;
    /// Stack definitions.
    pub const STACK: u16 = 1 << 1;
    /// Thread creation, start and end.
    pub const THREAD: u16 = 1 << 2;
    /// Allocations, releases, failed allocations and allocation errors.
    pub const HEAP: u16 = 1 << 3;
    /// The live blocks of a snapshot.
    pub const LIVE_BLOCK: u16 = 1 << 4;
    /// A scan's verdicts and a watcher's site verdicts.
    pub const VERDICT: u16 = 1 << 5;
    /// CPU samples and the periods without one.
    pub const SAMPLE: u16 = 1 << 6;
    /// Lock and thread-synchronisation events.
    pub const LOCK: u16 = 1 << 7;
}

/// The class of one event.
pub fn class_of(event: &Event) -> u16 {
    use classes::*;
    match event {
        Event::StackDef { .. } | Event::CallerOnlyStack { .. } => STACK,
        Event::ThreadCreate { .. } | Event::ThreadStart { .. } | Event::ThreadEnd { .. } => THREAD,
        Event::Alloc { .. }
        | Event::Free { .. }
        | Event::Realloc { .. }
        | Event::AllocFailed { .. }
        | Event::Error { .. } => HEAP,
        Event::LiveBlock { .. } => LIVE_BLOCK,
        Event::ScanBlock { .. } | Event::SiteVerdict { .. } => VERDICT,
        Event::Sample { .. }
        | Event::AgentSamples { .. }
        | Event::SamplesSkipped { .. }
        | Event::SamplesMissed { .. } => SAMPLE,
        Event::Lock(_) => LOCK,
        _ => META,
    }
}

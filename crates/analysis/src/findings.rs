//! What a trace's analyses found, counted one way for every place that says
//! it: `trapline run`'s summary, `report`'s cards, the exit statuses of
//! `--error-exitcode`. They used to count on their own, and `run` said
//! "errors found: 0" of a trace whose `deadlocks` showed a self-deadlock.

use serde::Serialize;
use trapline_trace::TraceError;

use crate::deadlocks::{DeadlocksAnalysis, DeadlocksReport};
use crate::index::TraceIndex;
use crate::index_file::TraceInput;
use crate::leaks::{LeaksAnalysis, LeaksOptions, LeaksReport};
use crate::report::{thousands, BytesBlocks};

/// The counts. Errors are calls the program made wrongly; leaks and
/// deadlocks are judged over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Allocation errors (double, invalid and mismatched frees...), every
    /// occurrence.
    pub allocation_errors: u64,
    /// The exit scan's verdicts, suppressed blocks left out: null without
    /// a scan (the process did not reach exit, or ran with `--no-scan`).
    pub definitely_lost: Option<BytesBlocks>,
    pub indirectly_lost: Option<BytesBlocks>,
    pub possibly_lost: Option<BytesBlocks>,
    /// Null when locks were not recorded.
    pub locks: Option<LockFindings>,
}

/// What `trapline deadlocks` counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LockFindings {
    /// Lock misuse records (a self-deadlock is one, and an actual deadlock too).
    pub misuse: u64,
    /// Sets of threads stuck waiting for each other when the trace ended.
    pub actual_deadlocks: u64,
    /// Lock-order cycles between threads that can deadlock in another run.
    pub potential_deadlocks: u64,
    /// Cycles of one thread's lock orders: a lower severity, not an error.
    pub lock_order_inversions: u64,
}

impl LockFindings {
    /// The counts of a deadlocks report; None when locks were not recorded.
    pub fn of(d: &DeadlocksReport) -> Option<Self> {
        d.locks_recorded.then_some(LockFindings {
            misuse: d.summary.errors,
            actual_deadlocks: d.summary.actual_deadlocks,
            potential_deadlocks: d.summary.potential_deadlocks,
            lock_order_inversions: d.summary.lock_order_inversions,
        })
    }

    /// The `--error-exitcode` rule for locks: misuse, or a potential or
    /// actual deadlock (not one thread's lock-order inversion).
    pub fn fail(&self) -> bool {
        self.misuse + self.actual_deadlocks + self.potential_deadlocks > 0
    }
}

impl Findings {
    /// The counts of a leaks report and, when locks were recorded, of a
    /// deadlocks report of the same trace.
    pub fn of(leaks: &LeaksReport, deadlocks: Option<&DeadlocksReport>) -> Self {
        let s = &leaks.summary;
        Findings {
            allocation_errors: s.errors,
            definitely_lost: s.definitely_lost,
            indirectly_lost: s.indirectly_lost,
            possibly_lost: s.possibly_lost,
            locks: deadlocks.and_then(LockFindings::of),
        }
    }

    /// Errors found: allocation errors, lock misuse and deadlocks (actual
    /// and potential). Leaks are counted apart, as memcheck's LEAK SUMMARY.
    pub fn errors(&self) -> u64 {
        self.allocation_errors
            + self
                .locks
                .map_or(0, |l| l.misuse + l.actual_deadlocks + l.potential_deadlocks)
    }

    /// memcheck's `--error-exitcode` rule for leaks: an allocation error, or
    /// a definitely or possibly lost block.
    pub fn leaks_fail(&self) -> bool {
        let blocks = |b: Option<BytesBlocks>| b.map_or(0, |b| b.blocks);
        self.allocation_errors > 0
            || blocks(self.definitely_lost) > 0
            || blocks(self.possibly_lost) > 0
    }

    /// The rule for locks (see [`LockFindings::fail`]).
    pub fn locks_fail(&self) -> bool {
        self.locks.is_some_and(|l| l.fail())
    }

    /// `trapline run --error-exitcode`: either rule.
    pub fn fail(&self) -> bool {
        self.leaks_fail() || self.locks_fail()
    }

    /// Adds another process's counts (a run's other traces).
    pub fn add(&mut self, other: &Findings) {
        self.allocation_errors += other.allocation_errors;
        self.definitely_lost = sum(self.definitely_lost, other.definitely_lost, |a, b| a.add(b));
        self.indirectly_lost = sum(self.indirectly_lost, other.indirectly_lost, |a, b| a.add(b));
        self.possibly_lost = sum(self.possibly_lost, other.possibly_lost, |a, b| a.add(b));
        self.locks = sum(self.locks, other.locks, |a, b| LockFindings {
            misuse: a.misuse + b.misuse,
            actual_deadlocks: a.actual_deadlocks + b.actual_deadlocks,
            potential_deadlocks: a.potential_deadlocks + b.potential_deadlocks,
            lock_order_inversions: a.lock_order_inversions + b.lock_order_inversions,
        });
    }

    /// "errors found: 2 (1 allocation error, 1 lock misuse)".
    pub fn errors_text(&self) -> String {
        let total = thousands(self.errors());
        match self.error_kinds_text() {
            Some(kinds) => format!("errors found: {total} ({kinds})"),
            None => format!("errors found: {total}"),
        }
    }

    /// "1 allocation error, 1 lock misuse"; None when there is no error.
    pub fn error_kinds_text(&self) -> Option<String> {
        let mut parts = Vec::new();
        let mut part = |n: u64, one: &str, many: &str| {
            if n > 0 {
                parts.push(format!(
                    "{} {}",
                    thousands(n),
                    if n == 1 { one } else { many }
                ));
            }
        };
        part(
            self.allocation_errors,
            "allocation error",
            "allocation errors",
        );
        if let Some(l) = self.locks {
            part(l.misuse, "lock misuse", "lock misuses");
            part(l.actual_deadlocks, "actual deadlock", "actual deadlocks");
            part(
                l.potential_deadlocks,
                "potential deadlock",
                "potential deadlocks",
            );
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// "definitely lost: 1,000 bytes in 1 block, indirectly lost: ...", or
    /// None without a scan.
    pub fn leaks_text(&self) -> Option<String> {
        let kinds = [
            ("definitely lost", self.definitely_lost?),
            ("indirectly lost", self.indirectly_lost?),
            ("possibly lost", self.possibly_lost?),
        ];
        let parts: Vec<String> = kinds
            .iter()
            .map(|(name, b)| {
                let s = if b.blocks == 1 { "" } else { "s" };
                format!(
                    "{name}: {} bytes in {} block{s}",
                    thousands(b.bytes),
                    thousands(b.blocks)
                )
            })
            .collect();
        Some(parts.join(", "))
    }
}

/// Two counts that may be missing: missing only when both are.
fn sum<T: Default>(a: Option<T>, b: Option<T>, add: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(add(a.unwrap_or_default(), b.unwrap_or_default())),
    }
}

trait AddBytesBlocks {
    fn add(self, other: Self) -> Self;
}

impl AddBytesBlocks for BytesBlocks {
    fn add(self, b: BytesBlocks) -> BytesBlocks {
        BytesBlocks {
            bytes: self.bytes + b.bytes,
            blocks: self.blocks + b.blocks,
        }
    }
}

/// The leaks and deadlocks reports of a trace, from one read of it, with
/// `trapline leaks`' default options.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<(LeaksReport, DeadlocksReport), TraceError> {
    crate::pass::run(input, pass)
}

/// The leaks and deadlocks reports, with `trapline leaks`' default options,
/// as a pass of a shared read.
pub fn pass(index: &TraceIndex) -> impl crate::pass::Pass<Report = (LeaksReport, DeadlocksReport)> {
    (
        LeaksAnalysis::new(index, LeaksOptions::default()),
        DeadlocksAnalysis::default(),
    )
}

/// The findings of a trace, from one read of it. Nothing is symbolized:
/// only counts are kept.
pub fn of_trace<R: TraceInput>(input: &mut R) -> Result<Findings, TraceError> {
    let options = LeaksOptions {
        symbolize: false,
        ..LeaksOptions::default()
    };
    let (leaks, deadlocks) = crate::pass::run(input, |index| {
        (
            LeaksAnalysis::new(index, options),
            DeadlocksAnalysis::counting(),
        )
    })?;
    Ok(Findings::of(&leaks, Some(&deadlocks)))
}

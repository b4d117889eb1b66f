//! Reachability verdicts: the agent's scans (`ScanBegin`, `ScanBlock`,
//! `ScanEnd`), grouped into loss records per kind and allocation site, and
//! the history of each site across scans.
//!
//! The agent decides each block's kind (it needs the block contents); the
//! analysis only groups, filters and suppresses. Blocks carry their scan's
//! number, so chunks of several scans may come in any order.

use crate::sampling::{EstimateSum, Sampling};
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use trapline_trace::{AllocFn, Event, ScanSkipReason, ScanStats, ScanTrigger, Verdict};

use crate::report::{seconds, BytesBlocks, FrameReport};

/// Totals of one group of blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Totals {
    pub bytes: u64,
    pub blocks: u64,
    pub indirect_bytes: u64,
    /// In a sampled trace: what the group's blocks stand for, were they
    /// sampled (meaningful only for a group of a full stack).
    pub estimate: EstimateSum,
}

impl Totals {
    /// Adds a block of `size` bytes.
    pub fn add(&mut self, size: u64, sampling: Option<Sampling>) {
        self.bytes += size;
        self.blocks += 1;
        if let Some(s) = sampling {
            self.estimate.add(s, size);
        }
    }
}

/// A loss record's key: kind, stack id, allocation function.
pub(crate) type GroupKey = (Verdict, u32, AllocFn);

#[derive(Default)]
struct ScanFacts {
    begin: Option<(u64, ScanTrigger)>,
    stats: Option<ScanStats>,
    groups: HashMap<GroupKey, Totals>,
}

/// What `--history` follows of one block across scans. The observation of
/// its latest scan is kept apart: that scan may turn out incomplete (a trace
/// cut while a scan was being written), and then does not count.
#[derive(Clone, Copy)]
struct BlockHistory {
    stack: u32,
    func: AllocFn,
    size: u64,
    /// Scans before `last` that saw the block, and those that judged it lost.
    seen_before: u32,
    lost_before: u32,
    /// The latest scan before `last` that saw it (0: none).
    prev: u32,
    last: u32,
    lost_at_last: bool,
}

impl BlockHistory {
    fn new(stack: u32, func: AllocFn, size: u64) -> Self {
        BlockHistory {
            stack,
            func,
            size,
            seen_before: 0,
            lost_before: 0,
            prev: 0,
            last: 0,
            lost_at_last: false,
        }
    }

    fn observe(&mut self, scan: u32, lost: bool) {
        if scan > self.last {
            if self.last != 0 {
                self.seen_before += 1;
                self.lost_before += u32::from(self.lost_at_last);
                self.prev = self.last;
            }
            self.last = scan;
            self.lost_at_last = lost;
        } else {
            self.seen_before += 1;
            self.lost_before += u32::from(lost);
            self.prev = self.prev.max(scan);
        }
    }

    /// Whether the block was in scan `last_complete` and lost in every
    /// complete scan that saw it.
    fn lost_throughout(&self, last_complete: u32) -> bool {
        if self.last == last_complete {
            self.lost_at_last && self.lost_before == self.seen_before
        } else {
            self.last > last_complete
                && self.prev == last_complete
                && self.seen_before > 0
                && self.lost_before == self.seen_before
        }
    }
}

/// Collects the scans of a trace.
#[derive(Default)]
pub(crate) struct ScanCollector {
    scans: BTreeMap<u32, ScanFacts>,
    blocks: Option<HashMap<u64, BlockHistory>>,
    skipped: Vec<SkippedScan>,
    sampling: Option<Sampling>,
}

impl ScanCollector {
    /// A collector; `history` also follows every block across scans.
    pub fn new(history: bool) -> Self {
        ScanCollector {
            scans: BTreeMap::new(),
            blocks: history.then(HashMap::new),
            skipped: Vec::new(),
            sampling: None,
        }
    }

    pub fn observe(&mut self, ev: &Event) {
        if let Some(s) = SkippedScan::from_event(ev) {
            self.skipped.push(s);
        }
        match ev {
            Event::Recording { sample_bytes, .. } if *sample_bytes != 0 => {
                self.sampling = Some(Sampling {
                    mean_bytes: *sample_bytes,
                })
            }
            Event::ScanBegin {
                time,
                scan,
                trigger,
            } => self.scans.entry(*scan).or_default().begin = Some((*time, *trigger)),
            Event::ScanEnd { scan, stats } => {
                self.scans.entry(*scan).or_default().stats = Some(*stats)
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
                let t = self
                    .scans
                    .entry(*scan)
                    .or_default()
                    .groups
                    .entry((*verdict, *stack, *func))
                    .or_default();
                t.add(*size, self.sampling);
                t.indirect_bytes += indirect_bytes;
                if let Some(blocks) = &mut self.blocks {
                    let lost = matches!(verdict, Verdict::DefinitelyLost | Verdict::IndirectlyLost);
                    let fresh = BlockHistory::new(*stack, *func, *size);
                    let h = blocks.entry(*addr).or_insert(fresh);
                    if (h.stack, h.func, h.size) != (*stack, *func, *size) {
                        // Another block at the same address: start over.
                        *h = fresh;
                    }
                    h.observe(*scan, lost);
                }
            }
            _ => {}
        }
    }

    /// The scans that were due and did not run, in time order.
    pub fn take_skipped(&mut self) -> Vec<SkippedScan> {
        let mut v = std::mem::take(&mut self.skipped);
        v.sort_by_key(|s| s.time_ns);
        v
    }

    /// Numbers of the scans read whole (begin and end), in order.
    pub fn complete(&self) -> Vec<u32> {
        self.scans
            .iter()
            .filter(|(_, s)| s.begin.is_some() && s.stats.is_some())
            .map(|(&n, _)| n)
            .collect()
    }

    /// The groups of scan `n`.
    pub fn take_groups(&mut self, n: u32) -> HashMap<GroupKey, Totals> {
        self.scans
            .get_mut(&n)
            .map(|s| std::mem::take(&mut s.groups))
            .unwrap_or_default()
    }

    /// The report section of scan `n` (`index` is its 1-based position).
    pub fn scan_report(&self, n: u32, index: u32, count: u32) -> Option<ScanReport> {
        let s = self.scans.get(&n)?;
        let (time, trigger) = s.begin?;
        let st = s.stats?;
        Some(ScanReport {
            snapshot: index,
            snapshots: count,
            trigger: trigger.name(),
            time_seconds: seconds(time),
            pause_ms: st.pause_ns as f64 / 1e6,
            threads: st.threads,
            threads_not_suspended: st.threads_not_suspended,
            root_bytes: st.root_bytes,
            blocks: st.blocks,
            bytes: st.bytes,
            mappings_not_excluded: st.mappings_not_excluded,
            production: false,
        })
    }

    /// Per allocation site, what each complete scan judged; and the blocks
    /// lost in every scan since they first appeared, if still there in the last.
    pub fn history(&self) -> Vec<SiteHistory> {
        let complete = self.complete();
        let mut sites: BTreeMap<(u32, AllocFn), SiteHistory> = BTreeMap::new();
        for (pos, n) in complete.iter().enumerate() {
            for (&(verdict, stack, func), t) in &self.scans[n].groups {
                let site = sites.entry((stack, func)).or_insert_with(|| SiteHistory {
                    allocated_by: func.name(),
                    stack_id: stack,
                    stack: Vec::new(),
                    snapshots: complete
                        .iter()
                        .enumerate()
                        .map(|(i, _)| HistoryPoint {
                            snapshot: i as u32 + 1,
                            ..HistoryPoint::default()
                        })
                        .collect(),
                    lost_in_every_snapshot: BytesBlocks::default(),
                });
                let bb = BytesBlocks {
                    bytes: t.bytes,
                    blocks: t.blocks,
                };
                let p = &mut site.snapshots[pos];
                match verdict {
                    Verdict::DefinitelyLost => p.definitely_lost = bb,
                    Verdict::IndirectlyLost => p.indirectly_lost = bb,
                    Verdict::PossiblyLost => p.possibly_lost = bb,
                    Verdict::StillReachable => p.still_reachable = bb,
                }
            }
        }
        let last = complete.last().copied().unwrap_or(0);
        for b in self.blocks.iter().flat_map(|m| m.values()) {
            if b.lost_throughout(last) {
                if let Some(site) = sites.get_mut(&(b.stack, b.func)) {
                    site.lost_in_every_snapshot.bytes += b.size;
                    site.lost_in_every_snapshot.blocks += 1;
                }
            }
        }
        let mut out: Vec<SiteHistory> = sites
            .into_values()
            .filter(|s| {
                s.snapshots.iter().any(|p| {
                    p.definitely_lost.blocks + p.indirectly_lost.blocks + p.possibly_lost.blocks > 0
                })
            })
            .collect();
        out.sort_by(|a, b| {
            b.lost_in_every_snapshot
                .bytes
                .cmp(&a.lost_in_every_snapshot.bytes)
                .then(b.last_lost_bytes().cmp(&a.last_lost_bytes()))
                .then(a.stack_id.cmp(&b.stack_id))
        });
        out
    }
}

/// The `scan` section of the leaks report: the scan the records come from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScanReport {
    /// Position of this scan among the trace's scans, from 1 (`--snapshot N`).
    pub snapshot: u32,
    /// Number of scans the trace holds.
    pub snapshots: u32,
    /// `"exit"` or `"periodic"`.
    pub trigger: &'static str,
    /// When it started, seconds since the start of the process.
    pub time_seconds: f64,
    /// How long the program was stopped, in milliseconds.
    pub pause_ms: f64,
    /// Threads of the process, the scanning one included.
    pub threads: u32,
    /// Threads that could not be stopped: their stacks were read as they
    /// were and their registers not at all, so false leaks are possible.
    pub threads_not_suspended: u32,
    /// Bytes of roots read (stacks, registers, data segments, TLS, mappings).
    pub root_bytes: u64,
    /// Live blocks judged.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Mappings of the allocator library's metadata or of the agent that
    /// were read as roots because their tables were full: blocks they point
    /// to counted as reachable, so leaks may have been missed.
    pub mappings_not_excluded: u64,
    /// A production-mode scan (absent when false): of the sampled blocks
    /// only, read against all of the process's memory, the heap included;
    /// `still_reachable` means referenced (docs/analyses.md).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub production: bool,
}

/// A reachability scan that was due and did not run (`ScanSkipped`): its
/// memory would have passed a limit that ends or fails the program.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SkippedScan {
    /// `"exit"` or `"periodic"`.
    pub trigger: &'static str,
    /// When it was due, nanoseconds since the start of the process.
    pub time_ns: u64,
    /// `"cgroup_memory_limit"`, `"commit_limit"`, `"address_space_limit"`,
    /// `"data_limit"`, `"system_memory"`, `"memory_unreadable"`,
    /// `"allocation_failed"` or `"over_budget"`.
    pub reason: &'static str,
    /// What the scan would have needed (the agent's estimate, with margin).
    pub needed_bytes: u64,
    /// What the limit left when the scan was due.
    pub available_bytes: u64,
    /// The limit (0 for `memory_unreadable`).
    pub limit_bytes: u64,
    /// The same in a sentence, for text reports.
    #[serde(skip)]
    pub text: String,
}

impl SkippedScan {
    /// The report of a `ScanSkipped` event.
    pub fn from_event(ev: &Event) -> Option<SkippedScan> {
        let Event::ScanSkipped {
            time,
            trigger,
            reason,
            needed,
            available,
            limit,
        } = *ev
        else {
            return None;
        };
        let when = match trigger {
            ScanTrigger::Exit => "at exit".to_string(),
            ScanTrigger::Periodic => format!("at {:.3} s", seconds(time)),
        };
        let mib = |b: u64| format!("{:.0} MiB", b as f64 / (1 << 20) as f64);
        let what = match reason {
            ScanSkipReason::MemoryUnreadable => format!("blocked by {}", reason.limit_text()),
            ScanSkipReason::AllocationFailed => {
                format!(
                    "it needed about {} and {}",
                    mib(needed),
                    reason.limit_text()
                )
            }
            ScanSkipReason::OverBudget => format!(
                "deferred: the periodic scans had paused the program {:.3} s of its {:.3} s, more than {} ({}%)",
                seconds(needed),
                seconds(available),
                reason.limit_text(),
                limit as f64 / 10_000.0
            ),
            _ => format!(
                "it would have needed about {}, and {}, {}, left {}",
                mib(needed),
                reason.limit_text(),
                mib(limit),
                mib(available)
            ),
        };
        let text = format!(
            "no reachability scan {when}: {what}; {}",
            reason.consequence_text()
        );
        Some(SkippedScan {
            trigger: trigger.name(),
            time_ns: time,
            reason: reason.name(),
            needed_bytes: needed,
            available_bytes: available,
            limit_bytes: limit,
            text,
        })
    }
}

/// One snapshot of a site's history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HistoryPoint {
    /// Position of the scan, from 1.
    pub snapshot: u32,
    pub definitely_lost: BytesBlocks,
    pub indirectly_lost: BytesBlocks,
    pub possibly_lost: BytesBlocks,
    pub still_reachable: BytesBlocks,
}

/// How one allocation site's blocks were judged across scans (`--history`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteHistory {
    /// The allocation function.
    pub allocated_by: &'static str,
    /// The trace's stack id.
    pub stack_id: u32,
    /// The allocation stack.
    pub stack: Vec<FrameReport>,
    /// One entry per scan, in order.
    pub snapshots: Vec<HistoryPoint>,
    /// Blocks still live at the last scan that were lost (definitely or
    /// indirectly) in every scan since they were allocated: the strongest
    /// suspects.
    pub lost_in_every_snapshot: BytesBlocks,
}

impl SiteHistory {
    fn last_lost_bytes(&self) -> u64 {
        self.snapshots
            .last()
            .map_or(0, |p| p.definitely_lost.bytes + p.indirectly_lost.bytes)
    }
}

//! Allocation sites (stacks) ranked four ways, as heaptrack shows them: the
//! most allocation calls, the most temporary allocations, the largest share
//! of the peak heap, and the most bytes allocated.
//!
//! A streaming accumulator fed by the stats pass with every heap change:
//!
//! - a **temporary** allocation is released by the thread that made it
//!   before that thread allocates anything else (heaptrack's definition);
//! - a site's **peak contribution** is its live bytes at the moment of the
//!   heap's peak. The peak moves forward many times while a heap grows, so
//!   sites are snapshotted lazily: each new peak starts an epoch, and a
//!   site saves its live bytes the first time it changes in an epoch. At
//!   the end, a site that changed since the last peak holds its value then;
//!   one that did not still has it.

use std::collections::HashMap;

use serde::Serialize;
use trapline_trace::Event;

use crate::replay::{HeapReplay, LiveValue};
use crate::report::FrameReport;

/// Sites listed per view.
pub const LISTED: usize = 10;

#[derive(Default, Clone, Copy)]
struct Site {
    calls: u64,
    bytes_allocated: u64,
    temporary: u64,
    live: u64,
    /// Live bytes at the start of epoch `stamp`.
    at_peak: u64,
    stamp: u32,
}

/// The per-site accumulator (aHash: its maps are touched per allocation).
#[derive(Default)]
pub(crate) struct SiteTotals {
    sites: HashMap<u32, Site, ahash::RandomState>,
    /// Each thread's latest allocation (address, stack), while it may
    /// still be temporary.
    latest: HashMap<u32, (u64, u32), ahash::RandomState>,
    epoch: u32,
    /// The most live bytes so far.
    peak: u64,
}

impl SiteTotals {
    /// Applies event `ev` of thread `tid` to the heap replay `heap`, and
    /// takes note of its calls, of the blocks it changed and of a new peak.
    pub fn replay<V: LiveValue>(&mut self, heap: &mut HeapReplay<V>, tid: u32, ev: &Event) {
        heap.apply_observed(ev, |b, allocated| {
            self.live_changed(b.stack(), b.size(), allocated)
        });
        self.observe_call(tid, ev);
        if heap.live_bytes > self.peak {
            self.peak = heap.live_bytes;
            self.new_peak();
        }
    }

    /// Takes note of the calls of event `ev` of thread `tid`: allocations
    /// (and reallocs that returned a block) and releases.
    fn observe_call(&mut self, tid: u32, ev: &Event) {
        match *ev {
            Event::Alloc {
                addr, size, stack, ..
            } => self.allocation_call(tid, addr, stack, size),
            Event::Realloc {
                new_addr,
                size,
                stack,
                ..
            } if new_addr != 0 => self.allocation_call(tid, new_addr, stack, size),
            Event::Free { addr, .. } => self.release_call(tid, addr),
            _ => {}
        }
    }

    /// Thread `tid` allocated `size` bytes at `addr` from `stack` (an
    /// allocation call, or a realloc that returned a block).
    fn allocation_call(&mut self, tid: u32, addr: u64, stack: u32, size: u64) {
        let s = self.sites.entry(stack).or_default();
        s.calls += 1;
        s.bytes_allocated += size;
        self.latest.insert(tid, (addr, stack));
    }

    /// Thread `tid` released `addr`.
    fn release_call(&mut self, tid: u32, addr: u64) {
        if let Some(&(latest, stack)) = self.latest.get(&tid) {
            if latest == addr {
                self.latest.remove(&tid);
                self.sites.entry(stack).or_default().temporary += 1;
            }
        }
    }

    /// A live block of `stack` appeared or went (`allocated`).
    fn live_changed(&mut self, stack: u32, size: u64, allocated: bool) {
        let epoch = self.epoch;
        let s = self.sites.entry(stack).or_default();
        if s.stamp != epoch {
            s.at_peak = s.live;
            s.stamp = epoch;
        }
        if allocated {
            s.live += size;
        } else {
            s.live = s.live.saturating_sub(size);
        }
    }

    /// The heap just reached a new peak: what is live now is the peak.
    fn new_peak(&mut self) {
        self.epoch += 1;
    }

    /// Every site, stacks to be filled in.
    pub fn all(&self) -> Vec<SiteView> {
        self.sites
            .iter()
            .map(|(&stack_id, s)| self.view(stack_id, s))
            .collect()
    }

    fn view(&self, stack_id: u32, s: &Site) -> SiteView {
        SiteView {
            stack_id,
            stack: Vec::new(),
            calls: s.calls,
            bytes_allocated: s.bytes_allocated,
            temporary: s.temporary,
            peak_bytes: if s.stamp == self.epoch {
                s.at_peak
            } else {
                s.live
            },
            live_at_end_bytes: s.live,
        }
    }

    /// The four views, each of at most `listed` sites; stacks to be filled
    /// in by the caller (`stack_ids` lists the ids they need).
    pub fn views_top(&self, listed: usize) -> SiteViews {
        let all = self.all();
        let top = |key: fn(&SiteView) -> u64| {
            let mut v: Vec<SiteView> = all.iter().filter(|s| key(s) > 0).cloned().collect();
            v.sort_by(|a, b| key(b).cmp(&key(a)).then(a.stack_id.cmp(&b.stack_id)));
            v.truncate(listed);
            v
        };
        SiteViews {
            most_calls: top(|s| s.calls),
            most_temporary: top(|s| s.temporary),
            peak_contribution: top(|s| s.peak_bytes),
            most_allocated: top(|s| s.bytes_allocated),
        }
    }
}

/// Allocation sites ranked four ways.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SiteViews {
    /// The most allocation calls.
    pub most_calls: Vec<SiteView>,
    /// The most temporary allocations (released by their thread before it
    /// allocated anything else).
    pub most_temporary: Vec<SiteView>,
    /// The most live bytes at the heap's peak.
    pub peak_contribution: Vec<SiteView>,
    /// The most bytes allocated over the run.
    pub most_allocated: Vec<SiteView>,
}

impl SiteViews {
    /// Every stack id the views name.
    pub fn stack_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.all().map(|s| s.stack_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn all(&self) -> impl Iterator<Item = &SiteView> {
        self.most_calls
            .iter()
            .chain(&self.most_temporary)
            .chain(&self.peak_contribution)
            .chain(&self.most_allocated)
    }

    /// Fills in each site's stack.
    pub fn name(&mut self, stacks: &HashMap<u32, Vec<FrameReport>>) {
        for list in [
            &mut self.most_calls,
            &mut self.most_temporary,
            &mut self.peak_contribution,
            &mut self.most_allocated,
        ] {
            for s in list.iter_mut() {
                s.stack = stacks.get(&s.stack_id).cloned().unwrap_or_default();
            }
        }
    }
}

/// One allocation site (stack) and its totals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteView {
    /// The trace's stack id (0: no stack recorded).
    pub stack_id: u32,
    /// The allocation stack, innermost first.
    pub stack: Vec<FrameReport>,
    /// Allocation calls (a realloc that returned a block counts).
    pub calls: u64,
    /// Bytes those calls asked for.
    pub bytes_allocated: u64,
    /// Temporary allocations.
    pub temporary: u64,
    /// Live bytes at the heap's peak.
    pub peak_bytes: u64,
    /// Live bytes at the end of the recorded events.
    pub live_at_end_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak contribution is each site's live bytes at the last peak,
    /// whether it changed after the peak or not.
    #[test]
    fn peak_contributions_are_taken_at_the_peak() {
        let mut t = SiteTotals::default();
        let mut live = 0u64;
        let mut peak = 0u64;
        let mut change = |t: &mut SiteTotals, stack, size, allocated| {
            t.live_changed(stack, size, allocated);
            live = if allocated { live + size } else { live - size };
            if live > peak {
                peak = live;
                t.new_peak();
            }
        };
        change(&mut t, 1, 100, true);
        change(&mut t, 2, 50, true);
        change(&mut t, 3, 30, true); // peak: 1 -> 100, 2 -> 50, 3 -> 30
        change(&mut t, 2, 50, false);
        change(&mut t, 1, 40, true); // 140, below the 180 peak
        change(&mut t, 3, 30, false);
        let views = t.views_top(LISTED);
        let peak_of = |id| {
            views
                .peak_contribution
                .iter()
                .find(|s| s.stack_id == id)
                .map(|s| s.peak_bytes)
        };
        assert_eq!(
            (peak_of(1), peak_of(2), peak_of(3)),
            (Some(100), Some(50), Some(30))
        );
        assert_eq!(views.peak_contribution[0].live_at_end_bytes, 140);
    }
}

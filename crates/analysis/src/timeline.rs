//! The heap over time, for the HTML report: total live bytes, and the live
//! bytes of chosen allocation sites, at evenly spaced times of the run,
//! with the times of the reachability scans and the watchers' verdicts.
//!
//! One streaming pass beside the heap replay; the sites are chosen before
//! (by `stats`' peak contribution), so the pass keeps one running sum per
//! chosen site and nothing per other site.

use std::collections::HashMap;
use std::io::{Read, Seek};

use serde::Serialize;
use trapline_trace::{Event, TraceError};

use crate::index::{MergedEvents, TraceIndex};
use crate::replay::{Block, HeapReplay};

/// Points per series of the HTML report's plot.
pub const POINTS: usize = 240;

/// The heap over time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// The trace's time of its first event, from which `seconds` count.
    pub start_ns: u64,
    /// Seconds since the start of the trace of each point.
    pub seconds: Vec<f64>,
    /// Total live bytes at each point (the most reached since the point
    /// before, so a short peak is not missed between two points).
    pub live_bytes: Vec<u64>,
    /// Per chosen site (in the order asked), its live bytes at each point.
    pub sites: Vec<Vec<u64>>,
    /// Reachability scans: (seconds, "exit" or "periodic").
    pub scans: Vec<(f64, &'static str)>,
    /// Watchers' verdicts: (seconds, stack id, "growing" and/or "stale").
    pub verdicts: Vec<(f64, u32, String)>,
}

/// Samples the heap at [`POINTS`] times; `sites` are the stack ids followed.
pub fn analyze<R: Read + Seek>(input: &mut R, sites: &[u32]) -> Result<Timeline, TraceError> {
    analyze_points(input, sites, POINTS)
}

/// Samples the heap at `points` (at least 2) evenly spaced times.
pub fn analyze_points<R: Read + Seek>(
    input: &mut R,
    sites: &[u32],
    points: usize,
) -> Result<Timeline, TraceError> {
    analyze_window(input, sites, points, 0, None)
}

/// Samples the heap at `points` (at least 2) evenly spaced times from
/// `from_ns` to `to_ns` (nanoseconds since the trace's start; its end
/// when None). The first point is the heap at `from_ns`; scans and
/// verdicts outside the window are left out.
pub fn analyze_window<R: Read + Seek>(
    input: &mut R,
    sites: &[u32],
    points: usize,
    from_ns: u64,
    to_ns: Option<u64>,
) -> Result<Timeline, TraceError> {
    let points = points.max(2);
    let index = TraceIndex::build(input)?;
    let (start, end) = index.time_span();
    let first = start.saturating_add(from_ns);
    let last = to_ns.map_or(end, |to| start.saturating_add(to));
    let span = last.saturating_sub(first).max(1);
    let at = |i: usize| first + span * i as u64 / (points as u64 - 1);
    let inside = |time: u64| time >= first && time <= last;
    let followed: HashMap<u32, usize> = sites.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let mut live = vec![0u64; sites.len()];
    let mut t = Timeline {
        start_ns: start,
        sites: vec![Vec::with_capacity(points); sites.len()],
        ..Timeline::default()
    };
    let mut heap: HeapReplay<Block> = HeapReplay::default();
    let mut high = 0u64;
    let seconds = |time: u64| time.saturating_sub(start) as f64 / 1e9;
    let point = |t: &mut Timeline, live: &[u64], high: u64, i: usize| {
        t.seconds.push(seconds(at(i)));
        t.live_bytes.push(high);
        for (series, &v) in t.sites.iter_mut().zip(live) {
            series.push(v);
        }
    };
    for m in MergedEvents::new(input, &index) {
        if m.time != 0 {
            if m.time > last {
                break;
            }
            while t.seconds.len() < points - 1 && m.time > at(t.seconds.len()) {
                let i = t.seconds.len();
                point(&mut t, &live, high, i);
                high = heap.live_bytes;
            }
        }
        heap.apply_observed(&m.event, |b, allocated| {
            if let Some(&i) = followed.get(&b.stack) {
                live[i] = if allocated {
                    live[i] + b.size
                } else {
                    live[i].saturating_sub(b.size)
                };
            }
        });
        high = if m.time != 0 && m.time < first {
            heap.live_bytes
        } else {
            high.max(heap.live_bytes)
        };
        match &m.event {
            Event::ScanBegin { time, trigger, .. } if inside(*time) => {
                t.scans.push((seconds(*time), trigger.name()));
            }
            Event::SiteVerdict {
                time, stack, kinds, ..
            } if inside(*time) => {
                use trapline_trace::event::site_verdict::{GROWING, STALE};
                let names: Vec<&str> = [(GROWING, "growing"), (STALE, "stale")]
                    .into_iter()
                    .filter(|(bit, _)| kinds & bit != 0)
                    .map(|(_, n)| n)
                    .collect();
                t.verdicts.push((seconds(*time), *stack, names.join(", ")));
            }
            _ => {}
        }
    }
    while t.seconds.len() < points {
        let i = t.seconds.len();
        point(&mut t, &live, high, i);
        high = heap.live_bytes;
    }
    Ok(t)
}

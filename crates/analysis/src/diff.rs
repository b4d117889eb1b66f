//! `trapline diff A B`: two runs compared per allocation site.
//!
//! Stack ids and addresses differ between runs (another process, address
//! space layout randomization), so a site is identified by its symbolized
//! frames: function, file and line, or the module for a frame without a
//! function. Each trace gets one streaming pass (the heap replay and the
//! site accumulator of `sites.rs`); the sites of both are then matched by
//! that identity and ranked by how much their live bytes at the end
//! changed, then their bytes allocated.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Seek};

use serde::Serialize;
use trapline_trace::TraceError;

use crate::index::{MergedEvents, TraceIndex};
use crate::replay::{Block, HeapReplay};
use crate::report::{
    command_text, footer_text, prefix, thousands, Facts, FrameReport, ProcessReport, TraceStatus,
};
use crate::sites::{SiteTotals, SiteView};

/// Sites the text lists.
pub const TEXT_SITES: usize = 20;

/// The `trapline diff` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffReport {
    /// The first run (A, the baseline) and the second (B).
    pub a: RunSide,
    pub b: RunSide,
    /// Sites whose totals differ, most changed live bytes first, then
    /// most changed bytes allocated.
    pub sites: Vec<SiteDiff>,
    /// Sites whose totals are the same in both.
    pub sites_unchanged: u64,
}

/// One of the two runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSide {
    pub process: ProcessReport,
    /// Allocation calls, bytes allocated, and live bytes at the end.
    pub calls: u64,
    pub bytes_allocated: u64,
    pub live_at_end_bytes: u64,
    pub trace: TraceStatus,
    pub warnings: Vec<String>,
    #[serde(skip)]
    events_lost: Option<u64>,
}

/// A site's totals in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteTotalsOf {
    pub calls: u64,
    pub bytes_allocated: u64,
    pub temporary: u64,
    pub peak_bytes: u64,
    pub live_at_end_bytes: u64,
}

/// A site in both runs, or in one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteDiff {
    /// The stack, innermost first (from B when the site is in B).
    pub stack: Vec<FrameReport>,
    /// Null when the run has no allocation there.
    pub a: Option<SiteTotalsOf>,
    pub b: Option<SiteTotalsOf>,
    /// B minus A.
    pub delta_calls: i64,
    pub delta_bytes_allocated: i64,
    pub delta_live_at_end_bytes: i64,
}

/// A frame as runs share it.
type FrameKey = (Option<String>, Option<String>, Option<u32>);

fn key(stack: &[FrameReport]) -> Vec<FrameKey> {
    stack
        .iter()
        .map(|f| match &f.function {
            Some(function) => (Some(function.clone()), f.file.clone(), f.line),
            None => (None, f.module.clone(), None),
        })
        .collect()
}

/// One run's sites, by identity, and its side of the report.
fn one_run<R: Read + Seek>(
    input: &mut R,
) -> Result<(RunSide, HashMap<Vec<FrameKey>, SiteView>), TraceError> {
    let index = TraceIndex::build(input)?;
    let mut facts = Facts::default();
    let mut heap: HeapReplay<Block> = HeapReplay::default();
    let mut sites = SiteTotals::default();
    let mut merged = MergedEvents::new(input, &index);
    for m in merged.by_ref() {
        facts.observe(m.time, &m.event);
        sites.replay(&mut heap, m.tid, &m.event);
    }
    let stopped = merged.read_status();
    drop(merged);
    let mut symbolizer = facts.symbolizer();
    let mut by_key: HashMap<Vec<FrameKey>, SiteView> = HashMap::new();
    for mut s in sites.all() {
        s.stack = symbolizer.stack(&facts.stacks, s.stack_id);
        // Stacks that differ only in addresses are one site.
        let e = by_key.entry(key(&s.stack)).or_insert_with(|| SiteView {
            calls: 0,
            bytes_allocated: 0,
            temporary: 0,
            peak_bytes: 0,
            live_at_end_bytes: 0,
            ..s.clone()
        });
        e.calls += s.calls;
        e.bytes_allocated += s.bytes_allocated;
        e.temporary += s.temporary;
        e.peak_bytes += s.peak_bytes;
        e.live_at_end_bytes += s.live_at_end_bytes;
    }
    let side = RunSide {
        process: facts.process_report(),
        calls: by_key.values().map(|s| s.calls).sum(),
        bytes_allocated: heap.usage.bytes_allocated,
        live_at_end_bytes: heap.live_bytes,
        trace: facts.trace_status(&index, stopped),
        warnings: symbolizer.warnings(),
        events_lost: facts.events_lost(),
    };
    Ok((side, by_key))
}

fn totals_of(s: &SiteView) -> SiteTotalsOf {
    SiteTotalsOf {
        calls: s.calls,
        bytes_allocated: s.bytes_allocated,
        temporary: s.temporary,
        peak_bytes: s.peak_bytes,
        live_at_end_bytes: s.live_at_end_bytes,
    }
}

fn delta(b: u64, a: u64) -> i64 {
    (i128::from(b) - i128::from(a)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Compares two traces.
pub fn analyze<R: Read + Seek>(a: &mut R, b: &mut R) -> Result<DiffReport, TraceError> {
    let (side_a, mut sites_a) = one_run(a)?;
    let (side_b, sites_b) = one_run(b)?;
    let mut sites = Vec::new();
    let mut unchanged = 0;
    for (k, sb) in sites_b {
        let sa = sites_a.remove(&k);
        let ta = sa.as_ref().map(totals_of);
        let tb = totals_of(&sb);
        if ta == Some(tb) {
            unchanged += 1;
            continue;
        }
        let base = ta.unwrap_or_default();
        sites.push(SiteDiff {
            stack: sb.stack,
            a: ta,
            b: Some(tb),
            delta_calls: delta(tb.calls, base.calls),
            delta_bytes_allocated: delta(tb.bytes_allocated, base.bytes_allocated),
            delta_live_at_end_bytes: delta(tb.live_at_end_bytes, base.live_at_end_bytes),
        });
    }
    for (_, sa) in sites_a {
        let ta = totals_of(&sa);
        sites.push(SiteDiff {
            stack: sa.stack,
            a: Some(ta),
            b: None,
            delta_calls: delta(0, ta.calls),
            delta_bytes_allocated: delta(0, ta.bytes_allocated),
            delta_live_at_end_bytes: delta(0, ta.live_at_end_bytes),
        });
    }
    sites.sort_by(|x, y| {
        y.delta_live_at_end_bytes
            .unsigned_abs()
            .cmp(&x.delta_live_at_end_bytes.unsigned_abs())
            .then(
                y.delta_bytes_allocated
                    .unsigned_abs()
                    .cmp(&x.delta_bytes_allocated.unsigned_abs()),
            )
            .then(
                y.delta_calls
                    .unsigned_abs()
                    .cmp(&x.delta_calls.unsigned_abs()),
            )
            .then_with(|| key(&x.stack).cmp(&key(&y.stack)))
    });
    Ok(DiffReport {
        a: side_a,
        b: side_b,
        sites,
        sites_unchanged: unchanged,
    })
}

fn signed(n: i64) -> String {
    if n < 0 {
        format!("-{}", thousands(n.unsigned_abs()))
    } else {
        format!("+{}", thousands(n as u64))
    }
}

/// The report as text: both runs' totals, then the most changed sites.
pub fn render_text(r: &DiffReport) -> String {
    let p = prefix(&r.b.process);
    let mut out = String::new();
    writeln!(
        out,
        "{p}trapline diff: allocation sites of two runs (B - A)"
    )
    .unwrap();
    for (name, side) in [("A", &r.a), ("B", &r.b)] {
        writeln!(
            out,
            "{p}{name}: {} (pid {}): {} allocation calls, {} bytes allocated, {} bytes live at the end",
            command_text(&side.process),
            side.process.pid.map_or("?".into(), |p| p.to_string()),
            thousands(side.calls),
            thousands(side.bytes_allocated),
            thousands(side.live_at_end_bytes)
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();
    if r.sites.is_empty() {
        writeln!(
            out,
            "{p}No allocation site changed ({} sites the same).",
            thousands(r.sites_unchanged)
        )
        .unwrap();
    }
    for s in r.sites.iter().take(TEXT_SITES) {
        let state = match (s.a, s.b) {
            (None, _) => " (only in B)",
            (_, None) => " (only in A)",
            _ => "",
        };
        writeln!(
            out,
            "{p}{} bytes live at the end, {} bytes allocated, {} calls{state}",
            signed(s.delta_live_at_end_bytes),
            signed(s.delta_bytes_allocated),
            signed(s.delta_calls)
        )
        .unwrap();
        for f in s.stack.iter().take(4) {
            writeln!(out, "{p}   {}", crate::report::frame_place(f)).unwrap();
        }
        writeln!(out, "{p}").unwrap();
    }
    if r.sites.len() > TEXT_SITES {
        writeln!(
            out,
            "{p}... and {} more changed sites (--format json lists every one)",
            thousands((r.sites.len() - TEXT_SITES) as u64)
        )
        .unwrap();
    }
    for (name, side) in [("A", &r.a), ("B", &r.b)] {
        let p = format!("{p}{name}: ");
        for w in &side.warnings {
            writeln!(out, "{p}warning: {w}").unwrap();
        }
        footer_text(&mut out, &p, side.events_lost, &side.trace);
    }
    out
}

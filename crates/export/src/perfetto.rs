//! Chrome's trace event JSON, which Perfetto's UI, Chrome DevTools'
//! performance panel and chrome://tracing open: one track per thread with
//! its lock waits and holds (complete events), the heap's live bytes as a
//! counter track, and the reachability scans and growth or staleness
//! verdicts as instants.
//!
//! The spans stream from [`thread_timeline`] straight into the file, its
//! [`SpanFilter`] choosing the time window, the lock and the shortest wait
//! kept; the heap counter comes from [`timeline`] at [`HEAP_POINTS`]
//! evenly spaced times of the window, each the most live bytes since the
//! point before, written only where the value changes. Times are
//! microseconds since the trace's start, as the format has them. What the
//! filter and the merging of holds left out is counted in the file's
//! `otherData.trapline.left_out`.

use std::io::{self, Read, Seek, Write};

use serde_json::{json, Value};
use trapline_analysis::report::command_text;
use trapline_analysis::thread_timeline::{
    self, LockSelector, Span, SpanFilter, SpanKind, ThreadTimeline,
};
use trapline_analysis::timeline;
use trapline_trace::TraceError;

/// Points of the heap counter over the whole run.
pub const HEAP_POINTS: usize = 4096;

/// Why a file could not be written.
#[derive(Debug)]
pub enum Error {
    Trace(TraceError),
    Io(io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Trace(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "cannot write: {e}"),
        }
    }
}

impl From<TraceError> for Error {
    fn from(e: TraceError) -> Self {
        Error::Trace(e)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Writes the timeline of the trace in `input` to `out`, what `filter`
/// keeps of it; returns what the spans' pass learnt (for its warnings and
/// counts).
pub fn write<R: Read + Seek, W: Write>(
    input: &mut R,
    filter: &SpanFilter,
    out: W,
) -> Result<ThreadTimeline, Error> {
    let heap = timeline::analyze_window(input, &[], HEAP_POINTS, filter.from_ns, filter.to_ns)?;
    let verdict_stacks: Vec<u32> = heap.verdicts.iter().map(|v| v.1).collect();

    let mut events = EventWriter::new(out)?;
    let found = thread_timeline::analyze(input, &verdict_stacks, filter, |span| {
        events.push(&span_event(span))
    })?;
    let pid = found.process.pid.unwrap_or(0);

    let process_name = match command_text(&found.process) {
        c if c.is_empty() => format!("process {pid}"),
        c => c,
    };
    events.push(&metadata(pid, pid, "process_name", process_name));
    for (i, (tid, name)) in found.threads.iter().enumerate() {
        let name = match name {
            Some(n) => n.clone(),
            None if *tid == pid => "main".to_owned(),
            None => format!("thread {tid}"),
        };
        events.push(&metadata(pid, *tid, "thread_name", name));
        events.push(&json!({
            "ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
            "args": {"sort_index": i},
        }));
    }

    let mut last = None;
    for (&seconds, &bytes) in heap.seconds.iter().zip(&heap.live_bytes) {
        if last == Some(bytes) {
            continue;
        }
        last = Some(bytes);
        events.push(&json!({
            "ph": "C", "cat": "heap", "name": "heap", "pid": pid, "tid": pid,
            "ts": micros_of_seconds(seconds),
            "args": {"live bytes": bytes},
        }));
    }
    for &(seconds, trigger) in &heap.scans {
        events.push(&json!({
            "ph": "i", "s": "p", "cat": "scan", "name": format!("scan ({trigger})"),
            "pid": pid, "tid": pid, "ts": micros_of_seconds(seconds),
        }));
    }
    for (seconds, stack, kinds) in &heap.verdicts {
        events.push(&json!({
            "ph": "i", "s": "p", "cat": "verdict", "name": kinds,
            "pid": pid, "tid": pid, "ts": micros_of_seconds(*seconds),
            "args": {"site": found.places.get(stack)},
        }));
    }
    let [waits, holds, waiting_at_end, held_at_end, merged] = found.spans;
    events.finish(json!({
        "trapline": {
            "contended_locks": found.contended_locks,
            "waits": waits,
            "holds": holds,
            "merged_hold_spans": merged,
            "waiting_at_end": waiting_at_end,
            "held_at_end": held_at_end,
            "filter": {
                "from_ns": filter.from_ns,
                "to_ns": filter.to_ns,
                "lock": filter.lock.as_ref().map(|l| match l {
                    LockSelector::Address(a) => format!("{a:#x}"),
                    LockSelector::Site(s) => s.clone(),
                }),
                "min_wait_ns": filter.min_wait_ns,
            },
            "left_out": found.left_out,
            "trace_complete": found.trace.complete,
        }
    }))?;
    Ok(found)
}

/// A span as a complete event on its thread's track. Its name says the
/// lock, its kind and mode, so the arguments carry only the site (and a
/// merged span's counts).
fn span_event(span: &Span) -> Value {
    let mode = match span.mode {
        "exclusive" => String::new(),
        m => format!(" {m}"),
    };
    let name = format!(
        "{} {}{} {:#x}",
        span.kind.name(),
        span.lock_kind,
        mode,
        span.lock
    );
    let args = match span.kind {
        SpanKind::Holds => json!({"site": span.site, "holds": span.holds, "held_ns": span.held_ns}),
        _ => json!({"site": span.site}),
    };
    json!({
        "ph": "X",
        "cat": "lock",
        "name": name,
        "pid": span.pid,
        "tid": span.tid,
        "ts": micros(span.start_ns),
        "dur": micros(span.duration_ns),
        "args": args,
    })
}

/// Nanoseconds as the format's microseconds (printed to the nanosecond).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The timeline's seconds as microseconds, rounded to its nanoseconds.
fn micros_of_seconds(seconds: f64) -> f64 {
    micros((seconds * 1e9).round() as u64)
}

fn metadata(pid: u32, tid: u32, what: &str, name: String) -> Value {
    json!({"ph": "M", "pid": pid, "tid": tid, "name": what, "args": {"name": name}})
}

/// The file's one JSON object, written an event at a time. The first write
/// error is kept and every later write skipped.
struct EventWriter<W: Write> {
    out: W,
    first: bool,
    error: Option<io::Error>,
}

impl<W: Write> EventWriter<W> {
    fn new(mut out: W) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        Ok(EventWriter {
            out,
            first: true,
            error: None,
        })
    }

    fn push(&mut self, event: &Value) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b",\n" };
        self.first = false;
        let written = self
            .out
            .write_all(sep)
            .and_then(|()| serde_json::to_writer(&mut self.out, event).map_err(io::Error::from));
        if let Err(e) = written {
            self.error = Some(e);
        }
    }

    /// Closes the event list and adds the trace's metadata.
    fn finish(mut self, other: Value) -> io::Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.out
            .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
        serde_json::to_writer(&mut self.out, &other)?;
        self.out.write_all(b"}\n")?;
        self.out.flush()
    }
}

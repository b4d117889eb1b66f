//! Writing a scan's verdicts: `ScanBegin`, one `ScanBlock` per live block
//! (with its stack's definition when this trace file lacks it), `ScanEnd`;
//! or `ScanSkipped` for a scan that did not run.

use super::{Outcome, Skipped};
use crate::events::buffers::Buffer;
use crate::events::record::ensure_stack_in;
use core::sync::atomic::Ordering;
use trapline_trace::Event;

/// Where the events go: the final records at exit, or the writer's queue.
pub trait Sink {
    /// The buffer the next event goes into, with room made for it.
    fn buffer(&mut self) -> Option<&mut Buffer>;
    /// Appends one event (counting it as lost if it cannot be written).
    fn push(&mut self, ev: &Event, time: Option<u64>);
}

/// Writes the outcome of a scan.
pub fn emit(o: &Outcome, sink: &mut dyn Sink) {
    sink.push(
        &Event::ScanBegin {
            time: o.time,
            scan: o.scan,
            trigger: o.trigger,
        },
        Some(o.time),
    );
    o.for_each(|addr, block, verdict, indirect_bytes| {
        if let Some(b) = sink.buffer() {
            ensure_stack_in(b, block.stack);
        }
        sink.push(
            &Event::ScanBlock {
                scan: o.scan,
                addr,
                size: block.size,
                func: block.func,
                stack: block.stack,
                verdict,
                indirect_bytes,
            },
            None,
        );
    });
    sink.push(
        &Event::ScanEnd {
            scan: o.scan,
            stats: o.stats,
        },
        None,
    );
}

/// Writes why a scan did not run.
pub fn emit_skipped(s: &Skipped, sink: &mut dyn Sink) {
    sink.push(
        &Event::ScanSkipped {
            time: s.time,
            trigger: s.trigger,
            reason: s.why.reason,
            needed: s.why.needed,
            available: s.why.available,
            limit: s.why.limit,
        },
        Some(s.time),
    );
}

/// Agent buffers queued to the writer without waiting (the periodic scan
/// runs on the writer thread itself).
struct Queued {
    buf: Box<Buffer>,
}

impl Sink for Queued {
    fn buffer(&mut self) -> Option<&mut Buffer> {
        if self.buf.room() < crate::events::buffers::EVENT_RESERVE {
            let full = core::mem::replace(&mut self.buf, crate::events::buffers::take_buffer(0));
            crate::events::buffers::submit(full, false);
        }
        Some(&mut self.buf)
    }

    fn push(&mut self, ev: &Event, time: Option<u64>) {
        let pushed = self.buffer().is_some_and(|b| b.push_event(ev, time));
        if !pushed {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes a periodic scan's outcome, or why it did not run, through the
/// writer's queue.
pub fn to_writer(o: &Result<Outcome, Skipped>) {
    let mut q = Queued {
        buf: crate::events::buffers::take_buffer(0),
    };
    match o {
        Ok(o) => emit(o, &mut q),
        Err(s) => emit_skipped(s, &mut q),
    }
    crate::events::buffers::submit(q.buf, false);
}

//! One read of a trace for several analyses.
//!
//! Each analysis is a [`Pass`]: it sees the trace's events once, in global
//! time order, then builds its report. A tuple of passes is a pass, so
//! `trapline report`, `trapline run`'s summary and any set of analyses asked
//! together decode the trace once ([`run`]) instead of once per analysis.

use std::io::{Read, Seek};

use trapline_trace::TraceError;

use crate::index::{MergedEvent, MergedEvents, ReadStatus, TraceIndex};

/// An analysis as a streaming consumer of a trace's events.
pub trait Pass {
    /// What the analysis builds at the end.
    type Report;
    /// One event, in global time order (see [`MergedEvents`]).
    fn observe(&mut self, event: &MergedEvent);
    /// The report, once every readable event was observed: `read` says
    /// what could not be read.
    fn finish(self, index: &TraceIndex, read: ReadStatus) -> Result<Self::Report, TraceError>;
}

/// Builds the index of `input`, makes the passes from it, feeds them every
/// event of one read and returns their reports.
pub fn run<R: Read + Seek, P: Pass>(
    input: &mut R,
    make: impl FnOnce(&TraceIndex) -> P,
) -> Result<P::Report, TraceError> {
    let index = TraceIndex::build(input)?;
    let mut pass = make(&index);
    let mut merged = MergedEvents::new(input, &index);
    for m in merged.by_ref() {
        pass.observe(&m);
    }
    let read = merged.read_status();
    drop(merged);
    pass.finish(&index, read)
}

/// Passes side by side: each sees every event, in the order listed.
macro_rules! tuple_pass {
    ($($name:ident),+) => {
        impl<$($name: Pass),+> Pass for ($($name,)+) {
            type Report = ($($name::Report,)+);
            fn observe(&mut self, event: &MergedEvent) {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $($name.observe(event);)+
            }
            fn finish(
                self,
                index: &TraceIndex,
                read: ReadStatus,
            ) -> Result<Self::Report, TraceError> {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                Ok(($($name.finish(index, read.clone())?,)+))
            }
        }
    };
}

tuple_pass!(A, B);
tuple_pass!(A, B, C);
tuple_pass!(A, B, C, D);
tuple_pass!(A, B, C, D, E);
tuple_pass!(A, B, C, D, E, F);

/// A pass that may be left out (a report's analysis that was not asked for,
/// or that the trace has nothing for).
impl<P: Pass> Pass for Option<P> {
    type Report = Option<P::Report>;
    fn observe(&mut self, event: &MergedEvent) {
        if let Some(p) = self {
            p.observe(event);
        }
    }
    fn finish(self, index: &TraceIndex, read: ReadStatus) -> Result<Self::Report, TraceError> {
        self.map(|p| p.finish(index, read)).transpose()
    }
}

/// Events handed to the second thread of [`run_split`] at a time.
const BATCH: usize = 4096;
/// Batches in flight to it at most: the memory between the two sides is
/// bounded, and the merge waits for a slow second side.
const BATCHES_AHEAD: usize = 4;

/// One read for two passes, each on a thread of its own: `A` on this
/// thread, beside the merge, and `B` on another, which gets the merged
/// events in batches (the same events, in the same order). Each pass's
/// work is bound to one core, so two sets of analyses asked together take
/// about as long as the slower one, and the trace is decoded once.
pub fn run_split<R, A, B>(
    input: &mut R,
    make: impl FnOnce(&TraceIndex) -> (A, B),
) -> Result<(A::Report, B::Report), TraceError>
where
    R: Read + Seek,
    A: Pass,
    B: Pass + Send,
{
    let index = TraceIndex::build(input)?;
    let (mut a, b) = make(&index);
    let (read, b) = std::thread::scope(|scope| {
        let (batches, received) = std::sync::mpsc::sync_channel::<Vec<MergedEvent>>(BATCHES_AHEAD);
        let second = scope.spawn(move || {
            let mut b = b;
            for batch in received {
                for m in &batch {
                    b.observe(m);
                }
            }
            b
        });
        let mut merged = MergedEvents::new(input, &index);
        let mut batch = Vec::with_capacity(BATCH);
        for m in merged.by_ref() {
            a.observe(&m);
            batch.push(m);
            if batch.len() == BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if batches.send(full).is_err() {
                    break; // the second side panicked: its join says so
                }
            }
        }
        if !batch.is_empty() {
            let _ = batches.send(batch);
        }
        drop(batches);
        let read = merged.read_status();
        (read, second.join().expect("the second pass's thread"))
    });
    Ok((a.finish(&index, read.clone())?, b.finish(&index, read)?))
}

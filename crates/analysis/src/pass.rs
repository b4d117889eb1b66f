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

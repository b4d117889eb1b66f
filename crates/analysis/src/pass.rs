//! One read of a trace for several analyses.
//!
//! Each analysis is a [`Pass`]: it sees the trace's events once, in global
//! time order, then builds its report. A tuple of passes is a pass, so
//! `trapline report`, `trapline run`'s summary and any set of analyses asked
//! together decode the trace once ([`run`]) instead of once per analysis.
//!
//! A read of a trace file leaves its index file beside it
//! ([`crate::index_file`]); a later read uses it to leave out the chunks
//! none of its passes needs ([`Pass::needs`]).

use trapline_trace::TraceError;

use crate::index::{ChunkEntry, MergedEvent, MergedEvents, ReadStatus, TraceIndex};
use crate::index_file::{self, ChunkSummary, IndexFile, Learned, TraceInput};

/// An analysis as a streaming consumer of a trace's events.
pub trait Pass {
    /// What the analysis builds at the end.
    type Report;
    /// One event, in global time order (see [`MergedEvents`]).
    fn observe(&mut self, event: &MergedEvent);
    /// The report, once every readable event was observed: `read` says
    /// what could not be read.
    fn finish(self, index: &TraceIndex, read: ReadStatus) -> Result<Self::Report, TraceError>;
    /// Whether the pass must see the events of a chunk the index file
    /// describes so. A pass that leaves chunks out must give the report it
    /// would give had it read them.
    fn needs(&self, _chunk: ChunkSummary) -> bool {
        true
    }
    /// A chunk no pass needs was left out: `start` is the time its events
    /// would have had before their first timed one (what the pass's counts
    /// of events and its last time take from it).
    fn skipped(&mut self, _chunk: &ChunkEntry, _start: u64) {}
    /// The index file this read uses, before any event: what it learned
    /// earlier (a lock replay's heap events).
    fn use_index(&mut self, _file: &IndexFile) {}
    /// What this read taught about the chunks, once it saw every event
    /// (the marks of [`Pass::needs`]).
    fn learned(&self) -> Learned {
        Learned::default()
    }
}

/// The chunks a read over `index` leaves out, and the index file it used.
struct Plan {
    skip: Vec<bool>,
    file: Option<IndexFile>,
}

impl Plan {
    /// `needs`: whether some pass needs a chunk so summarised.
    fn new<R: TraceInput>(
        input: &R,
        index: &TraceIndex,
        needs: impl Fn(ChunkSummary) -> bool,
    ) -> Plan {
        let file = input
            .index_path()
            .and_then(|path| index_file::load(path, index));
        let skip = match &file {
            Some(f) => f.chunks.iter().map(|&c| !needs(c)).collect(),
            None => vec![false; index.chunks.len()],
        };
        Plan { skip, file }
    }

    /// Tells the pass of the index and of the chunks left out, before it
    /// sees any event: a skipped chunk only adds counts.
    fn prepare<P: Pass>(
        &self,
        index: &TraceIndex,
        merged: &MergedEvents<'_, impl TraceInput>,
        pass: &mut P,
    ) {
        if let Some(f) = &self.file {
            pass.use_index(f);
        }
        for (i, _) in self.skip.iter().enumerate().filter(|(_, &s)| s) {
            pass.skipped(&index.chunks[i], merged.chunk_start(i));
        }
    }

    /// Writes the index file when this read learned something it lacks:
    /// every chunk was read whole, and there was no index file or the
    /// passes learned marks it did not know. What the old file knew stays.
    fn store(
        &self,
        path: Option<&std::path::Path>,
        index: &TraceIndex,
        classes: Option<Vec<u16>>,
        learned: Learned,
    ) {
        let (Some(path), Some(classes)) = (path, classes) else {
            return;
        };
        if self.skip.iter().any(|&s| s) {
            return;
        }
        let old_known = self.file.as_ref().map_or(0, IndexFile::known);
        let new_known = learned.known & !old_known;
        if self.file.is_some() && new_known == 0 {
            return;
        }
        let mut marks = vec![0u8; classes.len()];
        if let Some(f) = &self.file {
            for (m, c) in marks.iter_mut().zip(&f.chunks) {
                *m = c.marks & old_known;
            }
        }
        for &(chunk, m) in &learned.marks {
            if let Some(slot) = marks.get_mut(chunk as usize) {
                *slot |= m & new_known;
            }
        }
        let known = old_known | new_known;
        let keep_old_steps = old_known & index_file::marks::LOCK_HEAP != 0;
        let lock_heap = match &self.file {
            Some(f) if keep_old_steps => f.lock_heap.clone(),
            _ if new_known & index_file::marks::LOCK_HEAP != 0 => learned.lock_heap,
            _ => Vec::new(),
        };
        let file = IndexFile {
            chunks: classes
                .iter()
                .zip(marks)
                .map(|(&classes, marks)| ChunkSummary {
                    classes,
                    marks,
                    known,
                })
                .collect(),
            lock_heap,
        };
        index_file::store(path, index, &file);
    }
}

/// Builds the index of `input`, makes the passes from it, feeds them every
/// event of one read and returns their reports.
pub fn run<R: TraceInput, P: Pass>(
    input: &mut R,
    make: impl FnOnce(&TraceIndex) -> P,
) -> Result<P::Report, TraceError> {
    let index = TraceIndex::build(input)?;
    let mut pass = make(&index);
    let plan = Plan::new(input, &index, |c| pass.needs(c));
    let path = input.index_path().map(std::path::Path::to_path_buf);
    let mut merged = MergedEvents::selected(input, &index, |i| !plan.skip[i]);
    plan.prepare(&index, &merged, &mut pass);
    for m in merged.by_ref() {
        pass.observe(&m);
    }
    let read = merged.read_status();
    plan.store(
        path.as_deref(),
        &index,
        merged.chunk_classes(),
        pass.learned(),
    );
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
            fn needs(&self, chunk: ChunkSummary) -> bool {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                false $(|| $name.needs(chunk))+
            }
            fn skipped(&mut self, chunk: &ChunkEntry, start: u64) {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $($name.skipped(chunk, start);)+
            }
            fn use_index(&mut self, file: &IndexFile) {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $($name.use_index(file);)+
            }
            fn learned(&self) -> Learned {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                let mut all = Learned::default();
                $(all.merge($name.learned());)+
                all
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
    fn needs(&self, chunk: ChunkSummary) -> bool {
        self.as_ref().is_some_and(|p| p.needs(chunk))
    }
    fn skipped(&mut self, chunk: &ChunkEntry, start: u64) {
        if let Some(p) = self {
            p.skipped(chunk, start);
        }
    }
    fn use_index(&mut self, file: &IndexFile) {
        if let Some(p) = self {
            p.use_index(file);
        }
    }
    fn learned(&self) -> Learned {
        self.as_ref().map(P::learned).unwrap_or_default()
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
    R: TraceInput,
    A: Pass,
    B: Pass + Send,
{
    let index = TraceIndex::build(input)?;
    let (mut a, mut b) = make(&index);
    let plan = Plan::new(input, &index, |c| a.needs(c) || b.needs(c));
    let path = input.index_path().map(std::path::Path::to_path_buf);
    let mut merged = MergedEvents::selected(input, &index, |i| !plan.skip[i]);
    plan.prepare(&index, &merged, &mut a);
    plan.prepare(&index, &merged, &mut b);
    let b = std::thread::scope(|scope| {
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
        second.join().expect("the second pass's thread")
    });
    let read = merged.read_status();
    let mut learned = a.learned();
    learned.merge(b.learned());
    plan.store(path.as_deref(), &index, merged.chunk_classes(), learned);
    drop(merged);
    Ok((a.finish(&index, read.clone())?, b.finish(&index, read)?))
}

//! Analyses of trapline traces.
//!
//! Each analysis is a streaming consumer of a trace that produces a plain data
//! report: [`leaks`] (blocks still allocated at exit, allocation errors) and
//! [`stats`] (calls, bytes, peak heap, trace cost). Reports serialize to the
//! stable JSON schema documented in `docs/json-schema.md` and render as text
//! with each module's `render_text`. [`index`] reads a trace's chunks in
//! global time order with bounded memory; [`report`] holds the types and text
//! helpers shared by the reports.

#![forbid(unsafe_code)]

pub mod deadlocks;
pub mod diff;
pub mod event_class;
pub mod findings;
pub mod growth;
pub mod heap_profile;
pub mod index;
pub mod index_file;
pub mod leaks;
pub mod locks;
pub mod lockstate;
pub mod numbers;
pub mod pass;
pub mod profile;
pub mod progress;
mod replay;
pub mod report;
pub mod sampling;
pub mod sites;
pub mod staleness;
pub mod stats;
pub mod suppressions;
pub mod thread_timeline;
pub mod timeline;
mod verdicts;
pub mod window;

pub use deadlocks::DeadlocksReport;
pub use index::{MergedEvent, MergedEvents, Stopped, TraceIndex};
pub use leaks::LeaksReport;
pub use locks::LocksReport;
pub use profile::ProfileReport;
pub use stats::StatsReport;

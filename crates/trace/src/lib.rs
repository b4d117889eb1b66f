//! trapline's trace format.
//!
//! A trace is written by the agent inside the traced process and read by every
//! analysis. See `docs/trace-format.md` for the layout; [`format`] holds the file and
//! chunk framing, [`event`] the event model and its encoding.

#![forbid(unsafe_code)]

pub mod crc32;
pub mod event;
pub mod format;
pub mod scan;
pub mod synthetic;
pub mod varint;

mod builder;
mod chunk_writer;

pub use builder::TraceBuilder;
pub use chunk_writer::ChunkWriter;
pub use event::ProfileStopReason;
pub use event::{
    AllocFn, ChunkContext, DecodeError, Decoder, Encoder, EndCounters, ErrorKind, Event, ExitKind,
    Family, LockEvent, LockKind, LockMisuse, LockMode, LockOp, ModuleInfo, ProcessInfo, RunTotals,
    Segment, SnapshotKind,
};
pub use format::{Chunk, ChunkHeader, TraceError, TraceReader, FORMAT_VERSION};
pub use scan::{ScanSkipReason, ScanStats, ScanTrigger, Verdict};

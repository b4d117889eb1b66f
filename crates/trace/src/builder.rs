//! Builds traces in memory, for tests and tools that synthesize traces.

use crate::event::{encode_to_vec, ChunkContext, Event};
use crate::format::{encode_chunk, write_file_header};

/// Accumulates events into chunks and produces trace bytes.
#[derive(Default)]
pub struct TraceBuilder {
    out: Vec<u8>,
    scratch: Vec<u8>,
}

impl TraceBuilder {
    pub fn new() -> Self {
        let mut out = Vec::new();
        write_file_header(&mut out).expect("writing to a Vec cannot fail");
        TraceBuilder {
            out,
            scratch: Vec::new(),
        }
    }

    /// Appends one chunk holding `events`, as thread `tid` would have written it.
    pub fn chunk(&mut self, tid: u32, events: &[Event]) -> &mut Self {
        let mut raw = Vec::new();
        let mut ctx = ChunkContext::default();
        let (mut first, mut last) = (0, 0);
        for ev in events {
            if let Some(t) = ev.time() {
                if first == 0 {
                    first = t;
                }
                last = t;
            }
            encode_to_vec(&mut raw, &mut ctx, ev);
        }
        encode_chunk(
            &mut self.scratch,
            tid,
            events.len() as u32,
            first,
            last,
            &raw,
        );
        self.out.extend_from_slice(&self.scratch);
        self
    }

    /// The trace so far.
    pub fn bytes(&self) -> &[u8] {
        &self.out
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

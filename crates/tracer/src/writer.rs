//! Writes events as the agent's writer does: chunks, each of one thread's
//! events. The recorder sees every event in one order, so a chunk ends
//! where the next event is another thread's, and the file's order is the
//! order of the calls.

use std::fs::File;
use std::io::{BufWriter, Write};

use trapline_trace::format::{encode_chunk, write_file_header};
use trapline_trace::{event::encode_to_vec, ChunkContext, Event};

/// Events per chunk at most.
const CHUNK_EVENTS: u32 = 4096;

pub struct TraceWriter {
    out: BufWriter<File>,
    tid: u32,
    raw: Vec<u8>,
    ctx: ChunkContext,
    events: u32,
    first: u64,
    last: u64,
    scratch: Vec<u8>,
    /// Events written in all.
    pub written: u64,
}

impl TraceWriter {
    pub fn new(file: File) -> std::io::Result<TraceWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write_file_header(&mut out)?;
        Ok(TraceWriter {
            out,
            tid: 0,
            raw: Vec::new(),
            ctx: ChunkContext::default(),
            events: 0,
            first: 0,
            last: 0,
            scratch: Vec::new(),
            written: 0,
        })
    }

    /// Appends `ev` as thread `tid`'s (0: the process's, as the agent
    /// writes its first events).
    pub fn push(&mut self, tid: u32, ev: &Event) -> std::io::Result<()> {
        if tid != self.tid || self.events >= CHUNK_EVENTS {
            self.flush_chunk()?;
            self.tid = tid;
        }
        if let Some(t) = ev.time() {
            if self.first == 0 {
                self.first = t;
            }
            self.last = t;
        }
        encode_to_vec(&mut self.raw, &mut self.ctx, ev);
        self.events += 1;
        self.written += 1;
        Ok(())
    }

    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if self.events > 0 {
            encode_chunk(
                &mut self.scratch,
                self.tid,
                self.events,
                self.first,
                self.last,
                &self.raw,
            );
            self.out.write_all(&self.scratch)?;
        }
        self.raw.clear();
        self.ctx = ChunkContext::default();
        self.events = 0;
        self.first = 0;
        self.last = 0;
        Ok(())
    }

    /// Writes what is pending and syncs nothing more than a flush.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.flush_chunk()?;
        self.out.flush()
    }
}

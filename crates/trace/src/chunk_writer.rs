//! Writes a trace from events in one order (a recorder outside the
//! process, a window cut from a trace): chunks, each of one thread's
//! events, a chunk ending where the next event is another thread's, so
//! the file's order is the order given.

use std::io::{BufWriter, Write};

use crate::event::{encode_to_vec, ChunkContext, Event};
use crate::format::{encode_chunk, write_file_header, FILE_HEADER_LEN};

/// Events per chunk at most.
const CHUNK_EVENTS: u32 = 4096;

pub struct ChunkWriter<W: Write> {
    out: BufWriter<W>,
    tid: u32,
    raw: Vec<u8>,
    ctx: ChunkContext,
    events: u32,
    first: u64,
    last: u64,
    scratch: Vec<u8>,
    /// Events written in all.
    pub written: u64,
    /// Bytes of the file so far (header and chunks written; pending events
    /// not counted).
    pub bytes: u64,
}

impl<W: Write> ChunkWriter<W> {
    /// Writes the file header to `out`.
    pub fn new(out: W) -> std::io::Result<ChunkWriter<W>> {
        let mut out = BufWriter::with_capacity(1 << 20, out);
        write_file_header(&mut out)?;
        Ok(ChunkWriter {
            out,
            tid: 0,
            raw: Vec::new(),
            ctx: ChunkContext::default(),
            events: 0,
            first: 0,
            last: 0,
            scratch: Vec::new(),
            written: 0,
            bytes: FILE_HEADER_LEN as u64,
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
            self.bytes += self.scratch.len() as u64;
        }
        self.raw.clear();
        self.ctx = ChunkContext::default();
        self.events = 0;
        self.first = 0;
        self.last = 0;
        Ok(())
    }

    /// Writes what is pending.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.flush_chunk()?;
        self.out.flush()
    }
}

//! Reading a trace in global time order, with bounded memory.
//!
//! Each thread of the traced process buffers its events and appends the buffer
//! to the trace as one chunk when it is full, so chunks of different threads
//! are not in time order in the file (a quiet thread may flush events from the
//! first second of the run at the very end). Events inside one chunk are in
//! time order, and every chunk header carries the time of its first and last
//! timed event. Analyses that replay the heap (live bytes, peak heap, the
//! blocks live at the end of a trace without an exit snapshot) need the events
//! of all threads in one global time order. This module provides it in two
//! passes over a seekable input:
//!
//! 1. [`TraceIndex::build`] reads only the 44-byte chunk headers, seeking over
//!    the payloads, and records each chunk's offset, thread and time range. At
//!    a header that is damaged, or whose payload runs past the end of the
//!    file, it searches the rest of the file for the next chunk whose marker,
//!    header and checksum are right, notes the damaged span
//!    ([`TraceIndex::damaged`]) and goes on from there; it stops where no such
//!    chunk follows (a trace torn by SIGKILL).
//! 2. [`MergedEvents`] is a k-way merge: chunks are opened in order of their
//!    first time; a chunk is opened (read, checksummed, decompressed and
//!    decoded) only when the merge reaches its first time, and dropped as soon
//!    as its last event is consumed. Only the chunks whose time ranges overlap
//!    the current time are in memory: roughly one per thread that was active at
//!    that moment, whatever the size of the trace.
//!
//! Events without a time of their own (stack definitions, module loads, live
//! blocks of a snapshot) take the time of the timed event before them in their
//! chunk (the chunk's first time if none), so they keep their place relative to
//! their chunk. A chunk without any timed event (say, the middle of a large
//! exit snapshot) takes the last time of the previous chunk of the same thread:
//! a thread's chunks are in time order in the file. Ties are broken by file
//! order, then by position in the chunk, which makes the order deterministic.
//!
//! A chunk that turns out to be corrupt in the second pass (checksum, payload
//! that does not decompress) is skipped, and one whose events stop decoding
//! keeps the events before the bad one: the rest of the trace is analysed, and
//! [`MergedEvents::read_status`] lists each damaged chunk by offset, with
//! where and why reading stopped for good, if it did.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::mpsc;

use trapline_trace::format::CHUNK_HEADER_LEN;
use trapline_trace::{ChunkHeader, Event, TraceError, TraceReader};

/// Where and why reading a trace stopped before its end.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Stopped {
    /// Byte offset in the file of the chunk that could not be used.
    pub offset: u64,
    /// The reader's explanation (it names the offset too).
    pub reason: String,
}

impl Stopped {
    /// Describes a reading error; `fallback_offset` is used when the error has none.
    pub fn from_error(err: &TraceError, fallback_offset: u64) -> Self {
        Stopped {
            offset: err.offset().unwrap_or(fallback_offset),
            reason: err.to_string(),
        }
    }
}

/// One chunk found by the index pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// File offset of the chunk header.
    pub offset: u64,
    /// The chunk's header (thread, sizes, event count, time range).
    pub header: ChunkHeader,
    /// The checksum the header gives for the chunk.
    pub crc: u32,
}

/// The chunks of a trace, found by reading chunk headers only.
#[derive(Clone, Debug)]
pub struct TraceIndex {
    /// The raw file header, needed to read single chunks later.
    file_header: Vec<u8>,
    /// Every usable chunk, in file order.
    pub chunks: Vec<ChunkEntry>,
    /// Size of the file in bytes.
    pub file_len: u64,
    /// Set when the chunk list ends before the end of the file.
    pub stopped: Option<Stopped>,
    /// Damaged spans skipped to the next good chunk, in file order.
    pub damaged: Vec<Stopped>,
}

/// What went wrong while reading a trace: the damaged chunks skipped and
/// where reading stopped for good, if it did.
#[derive(Clone, Debug, Default)]
pub struct ReadStatus {
    pub stopped: Option<Stopped>,
    pub damaged: Vec<Stopped>,
}

fn io_error(offset: u64) -> impl FnOnce(io::Error) -> TraceError {
    move |source| TraceError::Io { offset, source }
}

impl TraceIndex {
    /// The first and last event times of the timed chunks (0, 0 without).
    pub fn time_span(&self) -> (u64, u64) {
        let timed = self.chunks.iter().filter(|c| c.header.last_time != 0);
        let start = timed
            .clone()
            .map(|c| c.header.first_time)
            .min()
            .unwrap_or(0);
        let end = timed.map(|c| c.header.last_time).max().unwrap_or(0);
        (start, end)
    }

    /// Checks the file header and lists the chunks.
    ///
    /// Fails only when the input is not a readable trace at all (not a trace,
    /// newer format version, file header missing, I/O error at the start); a
    /// damaged or truncated chunk ends the list and is described in
    /// [`TraceIndex::stopped`].
    pub fn build<R: Read + Seek>(input: &mut R) -> Result<TraceIndex, TraceError> {
        input.seek(SeekFrom::Start(0)).map_err(io_error(0))?;
        let header_len = TraceReader::new(&mut *input)?.offset();
        input.seek(SeekFrom::Start(0)).map_err(io_error(0))?;
        let mut file_header = vec![0u8; header_len as usize];
        input.read_exact(&mut file_header).map_err(io_error(0))?;
        let file_len = input.seek(SeekFrom::End(0)).map_err(io_error(header_len))?;

        let mut chunks = Vec::new();
        let mut stopped = None;
        let mut damaged = Vec::new();
        let mut offset = header_len;
        while offset < file_len {
            match Self::chunk_at(input, offset, file_len) {
                Ok((header, crc)) => {
                    chunks.push(ChunkEntry {
                        offset,
                        header,
                        crc,
                    });
                    offset += CHUNK_HEADER_LEN as u64 + u64::from(header.stored_len);
                }
                Err(e) => match Self::next_good_chunk(input, &file_header, offset + 1, file_len) {
                    Some(next) => {
                        let mut d = Stopped::from_error(&e, offset);
                        d.reason = format!(
                            "{}; skipped {} bytes to the next good chunk",
                            d.reason,
                            crate::numbers::thousands(next - offset)
                        );
                        damaged.push(d);
                        offset = next;
                    }
                    None => {
                        stopped = Some(Stopped::from_error(&e, offset));
                        break;
                    }
                },
            }
        }
        Ok(TraceIndex {
            file_header,
            chunks,
            file_len,
            stopped,
            damaged,
        })
    }

    /// The offset of the first chunk at or after `from` whose marker, header
    /// and checksum are right (a marker inside a payload fails the checksum).
    fn next_good_chunk<R: Read + Seek>(
        input: &mut R,
        file_header: &[u8],
        from: u64,
        file_len: u64,
    ) -> Option<u64> {
        const WINDOW: usize = 1 << 20;
        let magic = trapline_trace::format::CHUNK_MAGIC;
        let mut at = from;
        while at < file_len {
            input.seek(SeekFrom::Start(at)).ok()?;
            let mut window = Vec::with_capacity(WINDOW);
            (&mut *input)
                .take(WINDOW as u64)
                .read_to_end(&mut window)
                .ok()?;
            if window.len() < magic.len() {
                return None;
            }
            for i in 0..=window.len() - magic.len() {
                if &window[i..i + magic.len()] != magic {
                    continue;
                }
                let candidate = at + i as u64;
                let Ok((header, crc)) = Self::chunk_at(input, candidate, file_len) else {
                    continue;
                };
                let entry = ChunkEntry {
                    offset: candidate,
                    header,
                    crc,
                };
                let len = CHUNK_HEADER_LEN as u64 + u64::from(header.stored_len);
                let mut raw = Vec::new();
                if input.seek(SeekFrom::Start(candidate)).is_ok()
                    && (&mut *input).take(len).read_to_end(&mut raw).is_ok()
                    && unpack_chunk(file_header, entry.offset, &raw).is_ok()
                {
                    return Some(candidate);
                }
            }
            // The next window overlaps this one by the marker's length less one.
            at += (window.len() - (magic.len() - 1)) as u64;
        }
        None
    }

    fn chunk_at<R: Read + Seek>(
        input: &mut R,
        offset: u64,
        file_len: u64,
    ) -> Result<(ChunkHeader, u32), TraceError> {
        if file_len - offset < CHUNK_HEADER_LEN as u64 {
            return Err(TraceError::Truncated {
                offset,
                what: "chunk header",
            });
        }
        input
            .seek(SeekFrom::Start(offset))
            .map_err(io_error(offset))?;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        input.read_exact(&mut h).map_err(io_error(offset))?;
        let header = ChunkHeader::parse(&h, offset)?;
        let end = offset + CHUNK_HEADER_LEN as u64 + u64::from(header.stored_len);
        if end > file_len {
            return Err(TraceError::Truncated {
                offset,
                what: "chunk payload",
            });
        }
        let crc = u32::from_le_bytes([h[40], h[41], h[42], h[43]]);
        Ok((header, crc))
    }

    /// Reads, checks and decompresses one chunk of the index.
    pub fn read_chunk<R: Read + Seek>(
        &self,
        input: &mut R,
        entry: &ChunkEntry,
    ) -> Result<trapline_trace::Chunk, TraceError> {
        let raw = self.read_raw(input, entry)?;
        unpack_chunk(&self.file_header, entry.offset, &raw)
    }

    /// The bytes of one chunk as stored in the file: header and payload.
    fn read_raw<R: Read + Seek>(
        &self,
        input: &mut R,
        entry: &ChunkEntry,
    ) -> Result<Vec<u8>, TraceError> {
        let offset = entry.offset;
        input
            .seek(SeekFrom::Start(offset))
            .map_err(io_error(offset))?;
        let len = CHUNK_HEADER_LEN as u64 + u64::from(entry.header.stored_len);
        let mut raw = Vec::with_capacity(len as usize);
        (&mut *input)
            .take(len)
            .read_to_end(&mut raw)
            .map_err(io_error(offset))?;
        Ok(raw)
    }

    /// Number of distinct threads that wrote chunks (the agent's own records,
    /// thread id 0, are not a thread).
    pub fn threads(&self) -> usize {
        let mut tids: Vec<u32> = self
            .chunks
            .iter()
            .map(|c| c.header.tid)
            .filter(|&t| t != 0)
            .collect();
        tids.sort_unstable();
        tids.dedup();
        tids.len()
    }
}

/// Checks and decompresses the stored bytes of the chunk at `offset`.
fn unpack_chunk(
    file_header: &[u8],
    offset: u64,
    raw: &[u8],
) -> Result<trapline_trace::Chunk, TraceError> {
    // The reader wants a file header first: give it the real one, followed
    // by just this chunk.
    let framed = io::Cursor::new(file_header).chain(raw);
    let relocate = |e: TraceError| match e {
        TraceError::Truncated { what, .. } => TraceError::Truncated { offset, what },
        TraceError::Corrupt { what, .. } => TraceError::Corrupt { offset, what },
        TraceError::Io { source, .. } => TraceError::Io { offset, source },
        other => other,
    };
    let mut reader = TraceReader::new(framed).map_err(relocate)?;
    match reader.next_chunk().map_err(relocate)? {
        Some(mut chunk) => {
            chunk.offset = offset;
            Ok(chunk)
        }
        None => Err(TraceError::Truncated {
            offset,
            what: "chunk header",
        }),
    }
}

/// The events of one chunk, decoded, and the classes they belong to
/// (`event_class::classes`). `Err`: the chunk could not be used at all. `Ok`
/// with an error: the events before the first one that failed to decode,
/// and that failure.
type Decoded = Result<(Vec<Event>, u16, Option<TraceError>), TraceError>;

/// Decompresses and decodes one chunk from its stored bytes.
fn decode_chunk(file_header: &[u8], offset: u64, raw: &[u8], events_hint: u32) -> Decoded {
    let chunk = unpack_chunk(file_header, offset, raw)?;
    let mut events = Vec::with_capacity(events_hint.min(1 << 20) as usize);
    let mut classes = 0;
    for (n, ev) in chunk.events().enumerate() {
        match ev {
            Ok(ev) => {
                classes |= crate::event_class::class_of(&ev);
                events.push(ev);
            }
            Err(e) => {
                let err = TraceError::Corrupt {
                    offset,
                    what: format!("event {n} of the chunk does not decode: {e}"),
                };
                return Ok((events, classes, Some(err)));
            }
        }
    }
    Ok((events, classes, None))
}

/// How many chunks the merge hands to each decoding thread ahead of need.
const DECODE_AHEAD_PER_THREAD: usize = 3;

/// The decoding threads: one per core (or what `TRAPLINE_DECODE_THREADS`
/// asks, for measuring), decompressing and decoding chunks while the merge
/// and the analysis work on the previous ones. Chunk `k` in opening order
/// goes to thread `k % n`, and results are taken back in the same order, so
/// the merge sees them as one thread would give them.
struct DecodePool {
    workers: Vec<DecodeWorker>,
    /// Chunk numbers sent and not yet received, in order, with the worker
    /// each went to.
    pending: VecDeque<(usize, usize)>,
    /// The worker the next chunk goes to.
    turn: usize,
}

struct DecodeWorker {
    jobs: Option<mpsc::Sender<(u64, Vec<u8>, u32)>>,
    results: mpsc::Receiver<Decoded>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Decoding threads to start: `TRAPLINE_DECODE_THREADS`, or one per core.
fn decode_threads() -> usize {
    std::env::var("TRAPLINE_DECODE_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl DecodePool {
    fn start(file_header: Vec<u8>) -> Option<DecodePool> {
        let mut workers = Vec::new();
        for n in 0..decode_threads() {
            let (jobs, job_rx) = mpsc::channel::<(u64, Vec<u8>, u32)>();
            let (result_tx, results) = mpsc::channel();
            let file_header = file_header.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("trapline-decode-{n}"))
                .spawn(move || {
                    for (offset, raw, hint) in job_rx {
                        let decoded = decode_chunk(&file_header, offset, &raw, hint);
                        if result_tx.send(decoded).is_err() {
                            return;
                        }
                    }
                });
            match spawned {
                Ok(handle) => workers.push(DecodeWorker {
                    jobs: Some(jobs),
                    results,
                    handle: Some(handle),
                }),
                Err(_) => break,
            }
        }
        if workers.is_empty() {
            return None;
        }
        Some(DecodePool {
            workers,
            pending: VecDeque::new(),
            turn: 0,
        })
    }

    fn ahead(&self) -> usize {
        DECODE_AHEAD_PER_THREAD * self.workers.len()
    }

    /// Sends a chunk to the next worker; false when it is gone.
    fn send(&mut self, chunk: usize, job: (u64, Vec<u8>, u32)) -> bool {
        let w = self.turn;
        let sent = self.workers[w].jobs.as_ref().map(|j| j.send(job));
        if !matches!(sent, Some(Ok(()))) {
            return false;
        }
        self.turn = (w + 1) % self.workers.len();
        self.pending.push_back((chunk, w));
        true
    }

    /// The result of the oldest chunk sent: (chunk, result), None when its
    /// worker is gone.
    fn receive(&mut self) -> Option<(usize, Decoded)> {
        let (chunk, w) = self.pending.pop_front()?;
        let result = self.workers[w].results.recv().ok()?;
        Some((chunk, result))
    }
}

impl Drop for DecodeWorker {
    fn drop(&mut self) {
        // Closing the job channel ends the thread once its job is done.
        self.jobs = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// An event together with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedEvent {
    /// Thread whose chunk held the event (0: the agent's own records).
    pub tid: u32,
    /// The chunk's number in the trace's index (file order).
    pub chunk: u32,
    /// The event's place in its chunk (0 for the first): with `chunk`, it
    /// names the event across reads of the trace.
    pub seq: u32,
    /// The event's time, or for an event without one the time of the timed
    /// event before it in its chunk.
    pub time: u64,
    /// The event.
    pub event: Event,
}

/// The time of an event, if it has one.
pub fn event_time(ev: &Event) -> Option<u64> {
    ev.time()
}

struct OpenChunk {
    tid: u32,
    chunk: u32,
    offset: u64,
    /// The events not yet taken; the first is the chunk's head.
    events: std::vec::IntoIter<Event>,
    /// The chunk's number of events.
    total: u32,
    /// The effective time of the head event.
    clock: u64,
}

impl OpenChunk {
    /// The effective time of the head event, None when the chunk is used up.
    /// The head stays in place: taking it is the only move of an event.
    fn head_time(&mut self) -> Option<u64> {
        let ev = self.events.as_slice().first()?;
        if let Some(t) = event_time(ev) {
            self.clock = t;
        }
        Some(self.clock)
    }
}

/// Iterates every event of an indexed trace in global time order (see the
/// module documentation).
pub struct MergedEvents<'a, R: Read + Seek> {
    input: &'a mut R,
    index: &'a TraceIndex,
    /// Chunk numbers sorted by start time, then file order.
    order: Vec<usize>,
    /// Per chunk: the time it starts at (see the module documentation).
    start: Vec<u64>,
    next: usize,
    /// The open chunks, in slots reused as chunks close: their number is
    /// about the number of threads, not of chunks (a slot per chunk of a
    /// 10 GB trace was 16 MB).
    open: Vec<Option<OpenChunk>>,
    free_slots: Vec<usize>,
    /// The open chunks' head keys (time, chunk number, slot), but the
    /// current's. The slot never decides: a chunk has one key.
    heap: BinaryHeap<Reverse<(u64, usize, usize)>>,
    /// The chunk events are taken from while its head comes before every
    /// other open chunk's: (head time, chunk number, slot). Keeping it out of the
    /// heap saves a sift per event, as a chunk's events run long between
    /// the others' (ties go to the lower chunk number).
    current: Option<(u64, usize, usize)>,
    /// Chunks at or after this offset are not used (a chunk could not be
    /// read at all: an I/O error).
    limit: u64,
    stopped: Option<Stopped>,
    /// Damaged chunks skipped (the index pass's, then the merge's).
    damaged: Vec<Stopped>,
    open_count: usize,
    most_open: usize,
    /// Position in `order` of the next chunk to send to the decoding threads.
    submitted: usize,
    /// None when no thread could be started: chunks are then decoded here.
    decoder: Option<DecodePool>,
    /// Per chunk: the classes of its events, once it decoded whole.
    classes: Vec<Option<u16>>,
}

impl<'a, R: Read + Seek> MergedEvents<'a, R> {
    /// Starts the merge over the chunks of `index`.
    pub fn new(input: &'a mut R, index: &'a TraceIndex) -> Self {
        Self::selected(input, index, |_| true)
    }

    /// Starts the merge over the chunks of `index` that `read` chooses, by
    /// their number: the others are left out as if the trace had not them,
    /// and the events of the rest keep their times and order.
    pub fn selected(input: &'a mut R, index: &'a TraceIndex, read: impl Fn(usize) -> bool) -> Self {
        let mut last_of_thread: HashMap<u32, u64> = HashMap::new();
        let start: Vec<u64> = index
            .chunks
            .iter()
            .map(|c| {
                let h = &c.header;
                let last = last_of_thread.entry(h.tid).or_insert(0);
                if h.first_time == 0 && h.last_time == 0 {
                    *last // no timed event: continues the thread's previous chunk
                } else {
                    *last = (*last).max(h.last_time);
                    h.first_time
                }
            })
            .collect();
        let mut order: Vec<usize> = (0..index.chunks.len()).filter(|&i| read(i)).collect();
        order.sort_by_key(|&i| (start[i], i));
        crate::progress::pass_started(order.len());
        MergedEvents {
            classes: vec![None; index.chunks.len()],
            input,
            index,
            order,
            start,
            next: 0,
            open: Vec::new(),
            free_slots: Vec::new(),
            open_count: 0,
            heap: BinaryHeap::new(),
            current: None,
            limit: u64::MAX,
            stopped: index.stopped.clone(),
            damaged: index.damaged.clone(),
            most_open: 0,
            submitted: 0,
            decoder: DecodePool::start(index.file_header.clone()),
        }
    }

    /// The damaged chunks skipped, in file order, and where and why the trace
    /// stopped being usable (the index pass's finding, or a chunk that could
    /// not be read at all). Complete only once the iteration has ended.
    pub fn read_status(&self) -> ReadStatus {
        let mut damaged = self.damaged.clone();
        damaged.sort_by_key(|d| d.offset);
        ReadStatus {
            stopped: self.stopped.clone(),
            damaged,
        }
    }

    /// The time chunk `i`'s events start at (see the module documentation):
    /// an event without a time before the chunk's first timed one has it.
    pub fn chunk_start(&self, i: usize) -> u64 {
        self.start[i]
    }

    /// Per chunk, the classes of its events (`event_class::classes`), when
    /// the merge read every chunk whole; None otherwise. Complete only once
    /// the iteration has ended.
    pub fn chunk_classes(&self) -> Option<Vec<u16>> {
        self.classes.iter().copied().collect()
    }

    /// The largest number of chunks that were open at once.
    pub fn most_open(&self) -> usize {
        self.most_open
    }

    fn stop(&mut self, at: Stopped, limit: u64) {
        self.limit = self.limit.min(limit);
        if !matches!(&self.stopped, Some(s) if s.offset <= at.offset) {
            self.stopped = Some(at);
        }
    }

    /// Sends the next chunks in opening order to the decoding threads, up to
    /// [`DECODE_AHEAD_PER_THREAD`] each ahead. Sending stops at a chunk that
    /// cannot be read: opening it reads it here again, and reports why.
    fn submit_ahead(&mut self) {
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        while decoder.pending.len() < decoder.ahead() {
            let Some(&i) = self.order.get(self.submitted) else {
                return;
            };
            self.submitted += 1;
            let entry = self.index.chunks[i];
            if entry.offset >= self.limit {
                continue;
            }
            let Ok(raw) = self.index.read_raw(self.input, &entry) else {
                self.submitted -= 1;
                return;
            };
            let job = (entry.offset, raw, entry.header.events);
            if !decoder.send(i, job) {
                // A thread is gone: decode here from now on.
                self.decoder = None;
                return;
            }
        }
    }

    /// The decoded events of chunk `i`, the next chunk to open.
    fn decoded(&mut self, i: usize) -> Decoded {
        self.submit_ahead();
        if let Some(decoder) = self.decoder.as_mut() {
            // Results come back in the order sent; chunks skipped since
            // (past a corrupt one) are dropped on the way.
            while let Some((sent, result)) = decoder.receive() {
                if sent == i {
                    return result;
                }
            }
            self.decoder = None;
        }
        let entry = self.index.chunks[i];
        let raw = self.index.read_raw(self.input, &entry)?;
        decode_chunk(
            &self.index.file_header,
            entry.offset,
            &raw,
            entry.header.events,
        )
    }

    fn open_chunk(&mut self, i: usize) {
        crate::progress::chunk_opened();
        let entry = self.index.chunks[i];
        let events = match self.decoded(i) {
            Ok((events, classes, None)) => {
                self.classes[i] = Some(classes);
                events
            }
            Ok((events, _, Some(err))) => {
                // The chunk's checksum was right: keep what decoded before
                // the bad event; the other chunks go on.
                self.damaged.push(Stopped::from_error(&err, entry.offset));
                events
            }
            Err(TraceError::Io { offset, source }) => {
                let e = TraceError::Io { offset, source };
                self.stop(Stopped::from_error(&e, entry.offset), entry.offset);
                return;
            }
            Err(e) => {
                // Checksum or compression: this chunk is lost, not the rest.
                self.damaged.push(Stopped::from_error(&e, entry.offset));
                return;
            }
        };
        let mut oc = OpenChunk {
            tid: entry.header.tid,
            chunk: i as u32,
            offset: entry.offset,
            total: events.len() as u32,
            events: events.into_iter(),
            clock: self.start[i],
        };
        if let Some(t) = oc.head_time() {
            let slot = match self.free_slots.pop() {
                Some(slot) => slot,
                None => {
                    self.open.push(None);
                    self.open.len() - 1
                }
            };
            self.heap.push(Reverse((t, i, slot)));
            self.open[slot] = Some(oc);
            self.open_count += 1;
            self.most_open = self.most_open.max(self.open_count);
        }
    }
}

impl<R: Read + Seek> Iterator for MergedEvents<'_, R> {
    type Item = MergedEvent;

    fn next(&mut self) -> Option<MergedEvent> {
        loop {
            // Open every chunk whose first event comes before the earliest
            // event among the open ones, in the merge's order: by time, then
            // by chunk number. Chunks starting at the same time as the
            // earliest event but later in the file wait until the open ones
            // have moved past it: the chunks of a large exit snapshot, which
            // all start at the snapshot's time, are then decoded one at a
            // time instead of all at once.
            while let Some(&i) = self.order.get(self.next) {
                if self.index.chunks[i].offset >= self.limit {
                    self.next += 1;
                    continue;
                }
                let in_heap = self.heap.peek().map(|&Reverse((t, c, _))| (t, c));
                let current = self.current.map(|(t, c, _)| (t, c));
                let earliest = current.into_iter().chain(in_heap).min();
                if !matches!(earliest, Some(key) if (self.start[i], i) > key) {
                    self.next += 1;
                    self.open_chunk(i);
                } else {
                    break;
                }
            }
            // The earliest head: the current chunk's unless the heap's top
            // comes first, which then takes the current's place (one sift).
            let (_, i, slot) = match (self.current, self.heap.peek_mut()) {
                (Some(c), Some(mut top)) if top.0 < c => std::mem::replace(&mut *top, Reverse(c)).0,
                (Some(c), _) => c,
                (None, Some(top)) => PeekMut::pop(top).0,
                (None, None) => return None,
            };
            let oc = self.open[slot]
                .as_mut()
                .expect("every head key has an open chunk");
            if oc.offset >= self.limit {
                // Past a corrupt chunk: dropped.
                self.current = None;
                self.open[slot] = None;
                self.free_slots.push(slot);
                self.open_count -= 1;
                continue;
            }
            let time = oc.clock;
            let seq = oc.total - oc.events.len() as u32;
            let event = oc.events.next().expect("an open chunk has a head event");
            let (tid, chunk) = (oc.tid, oc.chunk);
            match oc.head_time() {
                Some(t) => self.current = Some((t, i, slot)),
                None => {
                    self.current = None;
                    self.open[slot] = None;
                    self.free_slots.push(slot);
                    self.open_count -= 1;
                }
            }
            return Some(MergedEvent {
                tid,
                chunk,
                seq,
                time,
                event,
            });
        }
    }
}

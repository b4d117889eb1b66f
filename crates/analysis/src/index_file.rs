//! `TRACE.idx`: what one read of a trace learned about its chunks, kept
//! beside it so that the next analysis reads only the chunks it needs.
//!
//! A full read of an undamaged trace writes, per chunk, its offset, its
//! checksum and the classes of events it holds ([`crate::event_class`]). A pass that
//! can leave chunks out also writes what it learned ([`Learned`]): marks on
//! the chunks it needs beyond their classes ([`marks`]: those defining the
//! stacks it reports, those whose heap events the lock replay applies) and
//! the heap events themselves. The next read checks the file against the
//! trace (its length, every chunk's offset and checksum, the index's own
//! checksum) and uses it only if all agree; any difference, and the index is
//! ignored and written again. The trace itself is never changed, and an
//! index that cannot be written costs nothing but speed.
//!
//! ```text
//! file  := "TLINDEX2" known:u32 trace_len:u64 chunks:u64 chunk* steps:u64 step* crc32:u32
//! chunk := offset:u64 crc:u32 classes:u16 marks:u8                  (15 bytes)
//! step  := chunk:u32 seq:u32 parts:u8 released:u64                  (17 bytes)
//! ```
//!
//! `known` holds the [`marks`] some pass learned: a mark not known is taken
//! as set on every chunk.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use trapline_trace::crc32::Crc32;
use trapline_trace::Event;

use crate::index::TraceIndex;

/// What a pass learned a chunk holds for it beyond its classes, one bit
/// each.
pub mod marks {
    /// Heap events the lock replay applies (see `LockState`).
    pub const LOCK_HEAP: u8 = 1 << 0;
    /// The definition of a stack `locks` or `deadlocks` may report.
    pub const LOCK_STACKS: u8 = 1 << 1;
    /// The definition of a stack a CPU sample (or a crash) names.
    pub const SAMPLE_STACKS: u8 = 1 << 2;
    /// The marks of the lock replay.
    pub const LOCKS: u8 = LOCK_HEAP | LOCK_STACKS;
}

/// What the index file says about one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSummary {
    /// The [`crate::event_class::classes`] of the chunk's events, or-ed.
    pub classes: u16,
    /// The [`marks`] the chunk has, of those `known`.
    pub marks: u8,
    /// The [`marks`] some pass learned for the whole trace.
    pub known: u8,
}

impl ChunkSummary {
    /// Whether the chunk holds an event of one of `classes`.
    pub fn holds(self, classes: u16) -> bool {
        self.classes & classes != 0
    }

    /// Whether the chunk may have one of `marks`: true for a mark no pass
    /// learned yet.
    pub fn marked(self, marks: u8) -> bool {
        (self.marks | !self.known) & marks != 0
    }
}

/// A heap event a lock replay applies, named by its place in the trace:
/// `parts` says which of its effects (`LockState`'s `heap_parts`), and
/// `released` the size of the block it releases (0 if none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeapStep {
    pub chunk: u32,
    pub seq: u32,
    pub parts: u8,
    pub released: u64,
}

/// What a pass's read of every chunk learned, for later reads to leave
/// chunks out: the marks it sets ([`Learned::known`]), the chunks that
/// have them, and the heap events of the lock replay.
#[derive(Clone, Debug, Default)]
pub struct Learned {
    pub known: u8,
    /// (chunk, marks) pairs; a chunk may be named more than once.
    pub marks: Vec<(u32, u8)>,
    /// Sorted by place, one per event (when `known` has `LOCK_HEAP`).
    pub lock_heap: Vec<HeapStep>,
}

impl Learned {
    /// Adds what another pass learned.
    pub fn merge(&mut self, other: Learned) {
        self.known |= other.known;
        self.marks.extend(other.marks);
        self.lock_heap.extend(other.lock_heap);
        self.lock_heap.sort_unstable();
        self.lock_heap.dedup_by(|b, a| {
            let same = (a.chunk, a.seq) == (b.chunk, b.seq);
            if same {
                a.parts |= b.parts;
                a.released = a.released.max(b.released);
            }
            same
        });
    }
}

/// An index file's contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexFile {
    /// One per chunk of the trace, in file order.
    pub chunks: Vec<ChunkSummary>,
    /// See [`Learned::lock_heap`].
    pub lock_heap: Vec<HeapStep>,
}

impl IndexFile {
    /// The marks the file knows.
    pub fn known(&self) -> u8 {
        self.chunks.first().map_or(0, |c| c.known)
    }
}

/// The stacks a pass may report, and the chunks defining them: what its
/// [`marks`] of stacks are made of.
#[derive(Default)]
pub struct StackUse {
    /// Stack id -> the chunk of its first definition (the one a reader keeps).
    defined_in: std::collections::HashMap<u32, u32, ahash::RandomState>,
    /// One bit per stack id used, for ids below [`DENSE_IDS`] (the agent
    /// numbers stacks from 1 up); others in `used_sparse`.
    used: Vec<u64>,
    used_sparse: std::collections::HashSet<u32, ahash::RandomState>,
}

/// Stack ids kept in [`StackUse`]'s bit set: 2 MiB of bits at most.
const DENSE_IDS: u32 = 1 << 24;

impl StackUse {
    /// Notes where `event`, of chunk `chunk`, defines a stack.
    pub fn define(&mut self, chunk: u32, event: &Event) {
        if let Event::StackDef { id, .. } | Event::CallerOnlyStack { id } = event {
            self.defined_in.entry(*id).or_insert(chunk);
        }
    }

    /// Notes that the stacks `event` names may be reported.
    pub fn uses(&mut self, event: &Event) {
        stacks_of(event, |id| self.use_id(id));
    }

    /// Notes that stack `id` may be reported.
    pub fn use_id(&mut self, id: u32) {
        if id >= DENSE_IDS {
            self.used_sparse.insert(id);
            return;
        }
        let word = (id >> 6) as usize;
        if word >= self.used.len() {
            self.used.resize((word + 1).next_power_of_two(), 0);
        }
        self.used[word] |= 1 << (id & 63);
    }

    /// The chunks defining a stack used, each with `mark`.
    pub fn marks(&self, mark: u8) -> Vec<(u32, u8)> {
        let dense = self.used.iter().enumerate().flat_map(|(w, &bits)| {
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (w as u32) << 6 | b)
        });
        let mut chunks: Vec<(u32, u8)> = dense
            .chain(self.used_sparse.iter().copied())
            .filter_map(|id| self.defined_in.get(&id).map(|&c| (c, mark)))
            .collect();
        chunks.sort_unstable();
        chunks.dedup();
        chunks
    }
}

/// Calls `f` with every stack id `event` names.
pub fn stacks_of(event: &Event, mut f: impl FnMut(u32)) {
    use trapline_trace::LockEvent as L;
    match event {
        Event::ThreadCreate { stack, .. }
        | Event::Alloc { stack, .. }
        | Event::Free { stack, .. }
        | Event::Realloc { stack, .. }
        | Event::AllocFailed { stack, .. }
        | Event::LiveBlock { stack, .. }
        | Event::ScanBlock { stack, .. }
        | Event::Sample { stack, .. }
        | Event::AgentSamples { stack, .. }
        | Event::SiteVerdict { stack, .. }
        | Event::Crash { stack, .. }
        | Event::StoppedAtCrash { stack, .. } => f(*stack),
        Event::Error {
            stack,
            alloc_stack,
            free_stack,
            ..
        } => {
            f(*stack);
            f(*alloc_stack);
            f(*free_stack);
        }
        Event::Lock(l) => match l {
            L::Init { stack, .. }
            | L::Destroy { stack, .. }
            | L::Acquire { stack, .. }
            | L::Release { stack, .. }
            | L::Request { stack, .. }
            | L::Failed { stack, .. }
            | L::Misuse { stack, .. }
            | L::Join { stack, .. }
            | L::JoinWait { stack, .. }
            | L::Exit { stack, .. } => f(*stack),
            L::Detach { .. } => {}
        },
        _ => {}
    }
}

const MAGIC: &[u8; 8] = b"TLINDEX2";
const HEAD_LEN: usize = 8 + 4 + 8 + 8;
const CHUNK_LEN: usize = 8 + 4 + 2 + 1;
const STEP_LEN: usize = 4 + 4 + 1 + 8;

/// The index file of the trace at `trace`: `TRACE.idx`.
pub fn path_for(trace: &Path) -> PathBuf {
    let mut name = trace.as_os_str().to_owned();
    name.push(".idx");
    PathBuf::from(name)
}

/// A trace input that knows where its index file is, or that it has none
/// (a trace in memory).
pub trait TraceInput: Read + Seek {
    /// The path of the trace's index file; None: no index is read or written.
    fn index_path(&self) -> Option<&Path> {
        None
    }
}

impl<T: AsRef<[u8]>> TraceInput for std::io::Cursor<T> {}
impl TraceInput for std::fs::File {}
impl<R: Read + Seek> TraceInput for std::io::BufReader<R> {}
impl<R: TraceInput + ?Sized> TraceInput for &mut R {
    fn index_path(&self) -> Option<&Path> {
        (**self).index_path()
    }
}

/// A trace file with its index file beside it.
pub struct TraceFile<R> {
    reader: R,
    index_path: PathBuf,
}

impl<R> TraceFile<R> {
    /// `reader` reads the trace at `trace`.
    pub fn new(reader: R, trace: &Path) -> Self {
        TraceFile {
            reader,
            index_path: path_for(trace),
        }
    }
}

impl<R: Read> Read for TraceFile<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buf)
    }
}

impl<R: Seek> Seek for TraceFile<R> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.reader.seek(pos)
    }
}

impl<R: Read + Seek> TraceInput for TraceFile<R> {
    fn index_path(&self) -> Option<&Path> {
        Some(&self.index_path)
    }
}

/// The index file at `path`, if it matches `index`'s trace exactly; None
/// otherwise (missing, damaged, stale).
pub fn load(path: &Path, index: &TraceIndex) -> Option<IndexFile> {
    if !usable(index) {
        return None;
    }
    let mut file = std::fs::File::open(path).ok()?;
    // An index is about 15 bytes per 64 KiB chunk: one larger than the
    // trace is not this trace's.
    let most = (HEAD_LEN + CHUNK_LEN * index.chunks.len() + 12) as u64 + index.file_len;
    let mut bytes = Vec::new();
    (&mut file).take(most).read_to_end(&mut bytes).ok()?;
    let chunks_end = HEAD_LEN + CHUNK_LEN * index.chunks.len();
    if bytes.len() < chunks_end + 8 + 4 || &bytes[..8] != MAGIC {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let mut check = Crc32::new();
    check.update(body);
    if check.finalize().to_le_bytes() != crc {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
    let known = u32_at(8);
    let (trace_len, chunks) = (u64_at(12), u64_at(20));
    if known > u32::from(u8::MAX)
        || trace_len != index.file_len
        || chunks != index.chunks.len() as u64
    {
        return None;
    }
    let known = known as u8;
    let summaries = body[HEAD_LEN..chunks_end]
        .chunks_exact(CHUNK_LEN)
        .zip(&index.chunks)
        .map(|(c, entry)| {
            let offset = u64::from_le_bytes(c[0..8].try_into().ok()?);
            let crc = u32::from_le_bytes(c[8..12].try_into().ok()?);
            (offset == entry.offset && crc == entry.crc).then_some(ChunkSummary {
                classes: u16::from_le_bytes([c[12], c[13]]),
                marks: c[14] & known,
                known,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let steps = u64_at(chunks_end);
    let steps_bytes = &body[chunks_end + 8..];
    if steps.checked_mul(STEP_LEN as u64) != Some(steps_bytes.len() as u64) {
        return None;
    }
    let lock_heap: Vec<HeapStep> = steps_bytes
        .chunks_exact(STEP_LEN)
        .map(|s| HeapStep {
            chunk: u32::from_le_bytes(s[0..4].try_into().unwrap()),
            seq: u32::from_le_bytes(s[4..8].try_into().unwrap()),
            parts: s[8],
            released: u64::from_le_bytes(s[9..17].try_into().unwrap()),
        })
        .collect();
    let in_order = lock_heap
        .windows(2)
        .all(|w| (w[0].chunk, w[0].seq) < (w[1].chunk, w[1].seq));
    if !in_order
        || lock_heap
            .iter()
            .any(|s| s.chunk as usize >= summaries.len())
    {
        return None;
    }
    Some(IndexFile {
        chunks: summaries,
        lock_heap,
    })
}

/// Whether an index of `index`'s trace may be read or written: not for a
/// trace with damage (the next read must find it again, and say so).
fn usable(index: &TraceIndex) -> bool {
    index.stopped.is_none() && index.damaged.is_empty()
}

/// Writes `file` as the index file at `path` for `index`'s trace, through
/// a temporary file renamed into place, so a reader never sees half of one.
/// Failing to write it is not an error of the analysis: the next read is
/// only slower.
pub fn store(path: &Path, index: &TraceIndex, file: &IndexFile) {
    if !usable(index) || file.chunks.len() != index.chunks.len() {
        return;
    }
    let known = file.known();
    let mut bytes = Vec::with_capacity(
        HEAD_LEN + CHUNK_LEN * file.chunks.len() + 12 + STEP_LEN * file.lock_heap.len(),
    );
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&u32::from(known).to_le_bytes());
    bytes.extend_from_slice(&index.file_len.to_le_bytes());
    bytes.extend_from_slice(&(file.chunks.len() as u64).to_le_bytes());
    for (entry, s) in index.chunks.iter().zip(&file.chunks) {
        bytes.extend_from_slice(&entry.offset.to_le_bytes());
        bytes.extend_from_slice(&entry.crc.to_le_bytes());
        bytes.extend_from_slice(&s.classes.to_le_bytes());
        bytes.push(s.marks & known);
    }
    bytes.extend_from_slice(&(file.lock_heap.len() as u64).to_le_bytes());
    for step in &file.lock_heap {
        bytes.extend_from_slice(&step.chunk.to_le_bytes());
        bytes.extend_from_slice(&step.seq.to_le_bytes());
        bytes.push(step.parts);
        bytes.extend_from_slice(&step.released.to_le_bytes());
    }
    let mut crc = Crc32::new();
    crc.update(&bytes);
    bytes.extend_from_slice(&crc.finalize().to_le_bytes());
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut f| f.write_all(&bytes));
    if written.is_err() || std::fs::rename(&temporary, path).is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}

//! The trace file: a header, then self-describing compressed chunks.
//!
//! ```text
//! file   := header chunk*
//! header := "TRAPLINE" version:u16 flags:u16 header_len:u32          (16 bytes, little endian)
//! chunk  := "TLCK" codec:u8 flags:u8 reserved:u16 tid:u32 raw_len:u32 stored_len:u32
//!           events:u32 first_time:u64 last_time:u64 crc32:u32 payload  (44-byte header)
//! ```
//! A chunk holds the events one thread buffered (tid 0: the agent's own
//! records), LZ4 block-compressed. The CRC covers the first 40 header bytes and
//! the stored payload, so a torn or corrupted chunk is detected and reading stops
//! there with everything before it intact. Chunks are appended whole, so a
//! process killed with SIGKILL leaves a trace readable up to its last chunk.

use std::io::{self, Read, Write};

/// First eight bytes of every trace.
pub const MAGIC: &[u8; 8] = b"TRAPLINE";
/// Format version this crate writes (2 added the reachability-scan events,
/// tags 35-37; 3 added `RunTotals` and `Recording`, tags 50-51; 4 added
/// `Recording`'s shadowed-allocator flag and module name; 5 its
/// allocator-library flag and path; 6 jemalloc's `mallocx`, `rallocx`,
/// `xallocx`, `sdallocx` and `dallocx`, and C23's `free_sized` and
/// `free_aligned_sized`, as allocation functions 31-37; 7 the error kinds
/// `MismatchedSize` and `MismatchedAlignment`, whose `Error` event ends with
/// what the release gave, and `AllocFailed`, tag 20; 8 `ScanSkipped`, tag
/// 38; 9 `ScanEnd` with the mappings the scan could not leave out of its
/// roots, tag 39; 10 the lock event `JoinWait`, tag 74, and the lock kind
/// `Unknown`, 6; 11 `SiteVerdict`, tag 40, `ControlSocket`, tag 53,
/// `AgentSamples`, tag 101, and `Recording`'s recorder bits; 12 sampled
/// recording; 13 `Attach`, tag 54, `AttachTotals`, tag 55, and the exit
/// kind `Detach`; 14 the guest kernel's allocator functions, `Kmalloc` to
/// `Vfree`, 38 to 46; 15 `Crash`, tag 56; 16 `StoppedAtCrash`, tag 57; 17
/// production mode: `Recording`'s production bit and `CallCounts`, tag 58;
/// older files are read unchanged).
pub const FORMAT_VERSION: u16 = 17;
/// Size of the file header.
pub const FILE_HEADER_LEN: usize = 16;
/// Marker at the start of every chunk.
pub const CHUNK_MAGIC: &[u8; 4] = b"TLCK";
/// Size of a chunk header.
pub const CHUNK_HEADER_LEN: usize = 44;
/// Largest decompressed chunk a reader accepts (writers stay far below).
pub const MAX_CHUNK_RAW: u32 = 16 << 20;

/// How a chunk payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    Raw = 0,
    Lz4 = 1,
}

/// Metadata of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub codec: Codec,
    /// Thread whose buffer this was; 0 for the agent's own records.
    pub tid: u32,
    pub raw_len: u32,
    pub stored_len: u32,
    pub events: u32,
    /// Time of the first and last timed event in the chunk (0 if none).
    pub first_time: u64,
    pub last_time: u64,
}

impl ChunkHeader {
    /// Parses the fields of a chunk header found at file offset `offset`. The
    /// checksum (bytes 40..44) is checked by the reader together with the payload.
    pub fn parse(h: &[u8; CHUNK_HEADER_LEN], offset: u64) -> Result<ChunkHeader, TraceError> {
        if &h[0..4] != CHUNK_MAGIC {
            return Err(TraceError::Corrupt {
                offset,
                what: "bad chunk marker".into(),
            });
        }
        let codec = match h[4] {
            0 => Codec::Raw,
            1 => Codec::Lz4,
            c => {
                return Err(TraceError::Corrupt {
                    offset,
                    what: format!("unknown codec {c}"),
                })
            }
        };
        Ok(ChunkHeader {
            codec,
            tid: le_u32(&h[8..12]),
            raw_len: le_u32(&h[12..16]),
            stored_len: le_u32(&h[16..20]),
            events: le_u32(&h[20..24]),
            first_time: le_u64(&h[24..32]),
            last_time: le_u64(&h[32..40]),
        })
    }

    fn to_bytes(self, crc: u32) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..4].copy_from_slice(CHUNK_MAGIC);
        b[4] = self.codec as u8;
        b[8..12].copy_from_slice(&self.tid.to_le_bytes());
        b[12..16].copy_from_slice(&self.raw_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.stored_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.events.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_time.to_le_bytes());
        b[32..40].copy_from_slice(&self.last_time.to_le_bytes());
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Writes the file header.
pub fn write_file_header<W: Write>(w: &mut W) -> io::Result<()> {
    let mut b = [0u8; FILE_HEADER_LEN];
    b[0..8].copy_from_slice(MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(FILE_HEADER_LEN as u32).to_le_bytes());
    w.write_all(&b)
}

/// The most bytes [`encode_chunk`] can produce for `raw_len` bytes of events
/// (a writer can size its scratch once and never grow it).
pub fn max_chunk_len(raw_len: usize) -> usize {
    CHUNK_HEADER_LEN + lz4_flex::block::get_maximum_output_size(raw_len)
}

/// Compresses `raw` into a complete chunk (header and payload) in `out`,
/// replacing its contents. `out` keeps its capacity between calls, so a writer
/// that reuses it allocates only while it grows.
pub fn encode_chunk(
    out: &mut Vec<u8>,
    tid: u32,
    events: u32,
    first_time: u64,
    last_time: u64,
    raw: &[u8],
) {
    let n = encode_chunk_reusing(out, tid, events, first_time, last_time, raw);
    out.truncate(n);
}

/// As [`encode_chunk`], but the chunk is `out[..n]` for the `n` returned and
/// `out` keeps its length: the next call writes over the same bytes instead
/// of zero-filling a worst-case-sized buffer for every chunk (128 KiB a
/// chunk for the agent's writer, which shares memory bandwidth with the
/// traced program).
pub fn encode_chunk_reusing(
    out: &mut Vec<u8>,
    tid: u32,
    events: u32,
    first_time: u64,
    last_time: u64,
    raw: &[u8],
) -> usize {
    let needed = max_chunk_len(raw.len());
    if out.len() < needed {
        out.resize(needed, 0);
    }
    let (codec, stored_len) =
        match lz4_flex::block::compress_into(raw, &mut out[CHUNK_HEADER_LEN..needed]) {
            Ok(n) if n < raw.len() => (Codec::Lz4, n),
            _ => {
                out[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + raw.len()].copy_from_slice(raw);
                (Codec::Raw, raw.len())
            }
        };
    let len = CHUNK_HEADER_LEN + stored_len;
    let header = ChunkHeader {
        codec,
        tid,
        raw_len: raw.len() as u32,
        stored_len: stored_len as u32,
        events,
        first_time,
        last_time,
    };
    // Not crc32fast here: the agent writes chunks, and crc32fast's CPU
    // feature detection costs every process image a few `cpuid` traps.
    let mut hasher = crate::crc32::Crc32::new();
    hasher.update(&header.to_bytes(0)[..40]);
    hasher.update(&out[CHUNK_HEADER_LEN..len]);
    let crc = hasher.finalize();
    out[..CHUNK_HEADER_LEN].copy_from_slice(&header.to_bytes(crc));
    len
}

/// Why reading a trace stopped before its end, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("not a trapline trace (bad magic)")]
    NotATrace,
    #[error("trace format version {found} is newer than this trapline understands (version {supported}); upgrade trapline")]
    NewerVersion { found: u16, supported: u16 },
    #[error("trace is truncated at byte {offset}: {what}")]
    Truncated { offset: u64, what: &'static str },
    #[error("trace is corrupt at byte {offset}: {what}")]
    Corrupt { offset: u64, what: String },
    #[error("reading the trace failed at byte {offset}: {source}")]
    Io { offset: u64, source: io::Error },
}

impl TraceError {
    /// Byte offset in the file where reading stopped, if the error has one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            TraceError::Truncated { offset, .. }
            | TraceError::Corrupt { offset, .. }
            | TraceError::Io { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

/// One decompressed chunk.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub header: ChunkHeader,
    /// File offset of the chunk header.
    pub offset: u64,
    pub payload: Vec<u8>,
}

impl Chunk {
    /// Iterates the events of this chunk.
    pub fn events(&self) -> crate::event::Decoder<'_> {
        crate::event::Decoder::new(&self.payload)
    }
}

/// Streams chunks out of a trace, one at a time, in file order.
pub struct TraceReader<R: Read> {
    input: R,
    offset: u64,
    version: u16,
    stored: Vec<u8>,
    failed: bool,
}

/// Reads as many bytes as are available up to `buf.len()`; returns how many.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut h = [0u8; FILE_HEADER_LEN];
        let n =
            read_full(&mut input, &mut h).map_err(|source| TraceError::Io { offset: 0, source })?;
        // A short file that does not even start like a trace is not a truncated one.
        let seen = n.min(MAGIC.len());
        if h[..seen] != MAGIC[..seen] {
            return Err(TraceError::NotATrace);
        }
        if n < FILE_HEADER_LEN {
            return Err(TraceError::Truncated {
                offset: n as u64,
                what: "file header",
            });
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version > FORMAT_VERSION {
            return Err(TraceError::NewerVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if version == 0 {
            return Err(TraceError::Corrupt {
                offset: 8,
                what: "format version 0".into(),
            });
        }
        let header_len = le_u32(&h[12..16]) as u64;
        // Every version this reader accepts has a 16-byte header; anything else
        // is a damaged length field, and skipping by it would misplace every chunk.
        if header_len != FILE_HEADER_LEN as u64 {
            return Err(TraceError::Corrupt {
                offset: 12,
                what: format!("header length {header_len}"),
            });
        }
        Ok(TraceReader {
            input,
            offset: header_len,
            version,
            stored: Vec::new(),
            failed: false,
        })
    }

    /// The format version of the file.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Bytes consumed so far: the offset of the next chunk.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads the next chunk. `Ok(None)` at a clean end of file. After an error,
    /// every later call returns `Ok(None)`: nothing past a bad chunk is trusted.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk>, TraceError> {
        if self.failed {
            return Ok(None);
        }
        let r = self.read_chunk();
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn read_chunk(&mut self) -> Result<Option<Chunk>, TraceError> {
        let start = self.offset;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        let n = read_full(&mut self.input, &mut h).map_err(|source| TraceError::Io {
            offset: start,
            source,
        })?;
        if n == 0 {
            return Ok(None);
        }
        if n < CHUNK_HEADER_LEN {
            return Err(TraceError::Truncated {
                offset: start,
                what: "chunk header",
            });
        }
        let header = ChunkHeader::parse(&h, start)?;
        let crc = le_u32(&h[40..44]);
        if header.raw_len > MAX_CHUNK_RAW
            || header.stored_len as usize
                > lz4_flex::block::get_maximum_output_size(header.raw_len as usize)
            || (header.codec == Codec::Raw && header.stored_len != header.raw_len)
        {
            return Err(TraceError::Corrupt {
                offset: start,
                what: format!(
                    "impossible chunk sizes (raw {}, stored {})",
                    header.raw_len, header.stored_len
                ),
            });
        }
        // Read through `take` so the buffer grows with the bytes actually there:
        // a damaged length in a short file must not cost a 16 MiB allocation.
        self.stored.clear();
        let want = u64::from(header.stored_len);
        let got = (&mut self.input)
            .take(want)
            .read_to_end(&mut self.stored)
            .map_err(|source| TraceError::Io {
                offset: start,
                source,
            })?;
        if (got as u64) < want {
            return Err(TraceError::Truncated {
                offset: start,
                what: "chunk payload",
            });
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&h[..40]);
        hasher.update(&self.stored);
        if hasher.finalize() != crc {
            return Err(TraceError::Corrupt {
                offset: start,
                what: "chunk checksum mismatch".into(),
            });
        }
        let payload = match header.codec {
            Codec::Raw => std::mem::take(&mut self.stored),
            Codec::Lz4 => {
                let mut out = vec![0u8; header.raw_len as usize];
                match lz4_flex::block::decompress_into(&self.stored, &mut out) {
                    Ok(n) if n == out.len() => out,
                    _ => {
                        return Err(TraceError::Corrupt {
                            offset: start,
                            what: "chunk does not decompress".into(),
                        })
                    }
                }
            }
        };
        self.offset = start + CHUNK_HEADER_LEN as u64 + u64::from(header.stored_len);
        Ok(Some(Chunk {
            header,
            offset: start,
            payload,
        }))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Chunk, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_chunk().transpose()
    }
}

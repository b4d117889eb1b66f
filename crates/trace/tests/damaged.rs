//! Truncated, corrupted, foreign and newer traces: the reader returns what it
//! could read, says where and why it stopped, and never panics.

mod common;

use common::*;
use std::io::{self, Read};
use trapline_trace::format::{encode_chunk, CHUNK_HEADER_LEN, FILE_HEADER_LEN};
use trapline_trace::{ChunkContext, DecodeError, TraceError, TraceReader, FORMAT_VERSION};

/// (start, end) byte ranges of each chunk of a valid trace.
fn chunk_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let out = read_all(bytes);
    assert!(out.error.is_none() && out.open_error.is_none());
    out.chunks
        .iter()
        .map(|c| {
            let start = c.offset as usize;
            (
                start,
                start + CHUNK_HEADER_LEN + c.header.stored_len as usize,
            )
        })
        .collect()
}

fn assert_same_chunks(got: &[trapline_trace::Chunk], want: &[trapline_trace::Chunk]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.header, w.header);
        assert_eq!(g.offset, w.offset);
        assert_eq!(g.payload, w.payload);
    }
}

#[test]
fn truncation_at_every_offset() {
    let bytes = build(&sample_chunks());
    let full = read_all(&bytes);
    let spans = chunk_spans(&bytes);
    assert!(spans.len() >= 5);
    for cut in 0..=bytes.len() {
        let out = read_all(&bytes[..cut]);
        if cut < FILE_HEADER_LEN {
            match out.open_error {
                Some(TraceError::Truncated { offset, .. }) => assert_eq!(offset, cut as u64),
                ref other => panic!("cut {cut}: {other:?}"),
            }
            continue;
        }
        assert!(out.open_error.is_none(), "cut {cut}: {:?}", out.open_error);
        let complete = spans.iter().take_while(|&&(_, end)| end <= cut).count();
        assert_same_chunks(&out.chunks, &full.chunks[..complete]);
        for (i, (events, err)) in out.events.iter().enumerate() {
            assert_eq!(events, &full.events[i].0);
            assert!(err.is_none());
        }
        let at_boundary = cut == FILE_HEADER_LEN || spans.iter().any(|&(_, end)| end == cut);
        if at_boundary {
            assert!(
                out.error.is_none(),
                "cut {cut} at a chunk boundary: {:?}",
                out.error
            );
        } else {
            match out.error {
                Some(TraceError::Truncated { offset, .. }) => {
                    assert_eq!(offset, spans[complete].0 as u64, "cut {cut}")
                }
                ref other => panic!("cut {cut}: expected Truncated, got {other:?}"),
            }
        }
    }
}

#[test]
fn single_byte_corruption_anywhere() {
    let bytes = build(&sample_chunks());
    let full = read_all(&bytes);
    let spans = chunk_spans(&bytes);
    let mut damaged = bytes.clone();
    for pos in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff, 0x5a] {
            damaged[pos] ^= mask;
            let out = read_all(&damaged);
            damaged[pos] ^= mask;
            if pos < FILE_HEADER_LEN {
                match (pos, &out.open_error) {
                    (0..=7, Some(TraceError::NotATrace)) => {}
                    (8..=9, Some(TraceError::NewerVersion { found, supported })) => {
                        assert!(*found > FORMAT_VERSION);
                        assert_eq!(*supported, FORMAT_VERSION);
                    }
                    (8..=9, Some(TraceError::Corrupt { offset: 8, .. })) => {}
                    // A flip that lands on an older version this reader
                    // also accepts (3 -> 2): the chunks read the same.
                    (8..=9, None) => {
                        let v = u16::from_le_bytes([
                            damaged[8] ^ (mask * u8::from(pos == 8)),
                            damaged[9] ^ (mask * u8::from(pos == 9)),
                        ]);
                        assert!(
                            (1..FORMAT_VERSION).contains(&v),
                            "flip {mask:#x} at {pos}: version {v} accepted"
                        );
                        assert_same_chunks(&out.chunks, &full.chunks);
                    }
                    (12..=15, Some(TraceError::Corrupt { offset: 12, .. })) => {}
                    // Header flags are not interpreted yet.
                    (10..=11, None) => {
                        assert_same_chunks(&out.chunks, &full.chunks);
                        assert!(out.error.is_none());
                    }
                    (_, other) => panic!("flip {mask:#x} at {pos}: {other:?}"),
                }
                continue;
            }
            assert!(out.open_error.is_none());
            let k = spans
                .iter()
                .position(|&(s, e)| (s..e).contains(&pos))
                .unwrap();
            // Everything before the damaged chunk is intact, and reading stops
            // at the start of the damaged chunk (the checksum covers it all).
            assert_same_chunks(&out.chunks, &full.chunks[..k]);
            let err = out
                .error
                .unwrap_or_else(|| panic!("flip {mask:#x} at {pos} not detected"));
            assert!(
                matches!(
                    err,
                    TraceError::Corrupt { .. } | TraceError::Truncated { .. }
                ),
                "{err:?}"
            );
            assert_eq!(
                err.offset(),
                Some(spans[k].0 as u64),
                "flip {mask:#x} at {pos}: {err}"
            );
        }
    }
}

#[test]
fn multi_byte_corruption_sample() {
    let bytes = build(&sample_chunks());
    let full = read_all(&bytes);
    let spans = chunk_spans(&bytes);
    let mut rng = Rng::new(0xC0_11AB5E);
    for _ in 0..3_000 {
        let mut damaged = bytes.clone();
        let first = FILE_HEADER_LEN + rng.below(bytes.len() - FILE_HEADER_LEN);
        let n = 1 + rng.below(16);
        for i in 0..n {
            if let Some(b) = damaged.get_mut(first + i * (1 + rng.below(64))) {
                *b = rng.byte();
            }
        }
        // A random byte may equal the one it replaces: the damage starts at
        // the first byte that really differs.
        let Some(first) = (first..bytes.len()).find(|&i| damaged[i] != bytes[i]) else {
            continue;
        };
        let out = read_all(&damaged);
        assert!(out.open_error.is_none());
        let k = spans
            .iter()
            .position(|&(s, e)| (s..e).contains(&first))
            .unwrap();
        assert!(out.chunks.len() >= k, "a chunk before the damage was lost");
        assert_same_chunks(&out.chunks[..k], &full.chunks[..k]);
        let err = out.error.expect("damage not detected");
        assert!(
            err.offset().unwrap() <= first as u64,
            "{err} but damage starts at {first}"
        );
    }
}

/// A chunk whose checksum is right but whose events are not: the reader hands
/// it out, and the event iterator says which event is bad.
#[test]
fn bad_events_inside_a_valid_chunk() {
    let good = hot_events(10);
    let mut raw = Vec::new();
    let mut ctx = ChunkContext::default();
    for ev in &good[..5] {
        trapline_trace::event::encode_to_vec(&mut raw, &mut ctx, ev);
    }
    let bad_at = raw.len();
    let cases: [(&[u8], DecodeError); 10] = [
        (&[0x7f], DecodeError::UnknownTag(0x7f)),
        (&[0], DecodeError::UnknownTag(0)),
        (&[16, 1], DecodeError::Truncated),
        (
            &[16, 0, 0, 0, 0, 99, 0],
            DecodeError::Invalid("allocation function"),
        ),
        (
            &[5, 1, 0xff, 0xff, 0x03],
            DecodeError::TooLong {
                what: "stack",
                len: 0xffff,
            },
        ),
        (&[49, 0, 7], DecodeError::Invalid("exit kind")),
        // ScanBegin with trigger 3; ScanBlock with verdict 5 or cut short;
        // ScanEnd with a thread count past u32.
        (&[35, 0, 1, 3], DecodeError::Invalid("scan trigger")),
        (&[36, 1, 0, 16, 1, 0, 5, 0], DecodeError::Invalid("verdict")),
        (&[36, 1, 0, 16, 1, 0], DecodeError::Truncated),
        (
            &[37, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x7f],
            DecodeError::Invalid("thread count"),
        ),
    ];
    for (tail, want) in cases {
        let mut payload = raw.clone();
        payload.extend_from_slice(tail);
        let mut bytes = build(&[(1, good.clone())]);
        let mut chunk = Vec::new();
        encode_chunk(&mut chunk, 2, 6, 0, 0, &payload);
        bytes.extend_from_slice(&chunk);
        bytes.extend_from_slice(&build(&[(3, good.clone())])[FILE_HEADER_LEN..]);

        let out = read_all(&bytes);
        assert!(out.error.is_none());
        assert_eq!(out.chunks.len(), 3);
        assert_eq!(out.events[0], (good.clone(), None));
        assert_eq!(out.events[1].0, good[..5].to_vec());
        assert_eq!(out.events[1].1, Some((bad_at, want)));
        assert_eq!(out.events[2], (good.clone(), None));
    }
}

#[test]
fn newer_version_is_a_clear_error() {
    for version in [FORMAT_VERSION + 1, FORMAT_VERSION + 7, u16::MAX] {
        let mut bytes = build(&sample_chunks());
        bytes[8..10].copy_from_slice(&version.to_le_bytes());
        let err = TraceReader::new(&bytes[..])
            .err()
            .expect("newer version accepted");
        match err {
            TraceError::NewerVersion { found, supported } => {
                assert_eq!(found, version);
                assert_eq!(supported, FORMAT_VERSION);
            }
            ref other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("upgrade"), "{msg}");
        assert!(msg.contains(&version.to_string()), "{msg}");
        assert_eq!(err.offset(), None);
        // Even a bare header of a newer version says so, not "truncated".
        assert!(matches!(
            TraceReader::new(&bytes[..FILE_HEADER_LEN]),
            Err(TraceError::NewerVersion { .. })
        ));
    }
}

#[test]
fn version_zero_is_corrupt() {
    let mut bytes = build(&[]);
    bytes[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert!(matches!(
        TraceReader::new(&bytes[..]),
        Err(TraceError::Corrupt { offset: 8, .. })
    ));
}

#[test]
fn foreign_files_are_not_traces() {
    let inputs: [&[u8]; 7] = [
        b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\0\0",
        b"hello, world\n",
        b"x",
        b"TRAPLINX\x01\0\0\0\x10\0\0\0",
        b"trapline\x01\0\0\0\x10\0\0\0",
        b"TLCK",
        &[0u8; 64],
    ];
    for input in inputs {
        match TraceReader::new(input) {
            Err(TraceError::NotATrace) => {}
            Err(e) => panic!("{input:?}: {e:?}"),
            Ok(_) => panic!("{input:?} accepted"),
        }
    }
    assert_eq!(
        TraceError::NotATrace.to_string(),
        "not a trapline trace (bad magic)"
    );
}

#[test]
fn empty_and_header_only_files() {
    match TraceReader::new(&[][..]) {
        Err(e @ TraceError::Truncated { offset: 0, .. }) => {
            assert!(e.to_string().contains("byte 0"))
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("empty file accepted"),
    }
    // A prefix of the magic is a truncated trace, not a foreign file.
    assert!(matches!(
        TraceReader::new(&b"TRAP"[..]),
        Err(TraceError::Truncated { offset: 4, .. })
    ));
    // Header alone: a trace with no chunks (an agent killed before its first flush).
    let bytes = build(&[]);
    assert_eq!(bytes.len(), FILE_HEADER_LEN);
    let mut r = TraceReader::new(&bytes[..]).unwrap();
    assert!(r.next_chunk().unwrap().is_none());
}

#[test]
fn bad_header_length_is_corrupt() {
    for len in [0u32, 15, 17, 4096, u32::MAX] {
        let mut bytes = build(&sample_chunks());
        bytes[12..16].copy_from_slice(&len.to_le_bytes());
        assert!(
            matches!(
                TraceReader::new(&bytes[..]),
                Err(TraceError::Corrupt { offset: 12, .. })
            ),
            "header length {len}"
        );
    }
}

#[test]
fn lying_chunk_sizes_are_rejected_without_reading_on() {
    let start = FILE_HEADER_LEN as u64;
    // (codec, raw_len, stored_len): impossible combinations.
    for (codec, raw, stored) in [
        (1u8, u32::MAX, 10),
        (1, 16 << 20 | 1, 10),
        (1, 10, u32::MAX),
        (0, 10, 11),
        (1, 0, 1 << 20),
    ] {
        match read_all(&with_chunk_sizes(codec, raw, stored)).error {
            Some(TraceError::Corrupt { offset, .. }) => assert_eq!(offset, start),
            other => panic!("raw {raw} stored {stored}: {other:?}"),
        }
    }
    // A plausible but too large stored length in a short file: truncated.
    let out = read_all(&with_chunk_sizes(1, 16 << 20, 15 << 20));
    assert!(matches!(out.error, Some(TraceError::Truncated { offset, .. }) if offset == start));
    // An unknown codec.
    let out = read_all(&with_chunk_sizes(2, 10, 10));
    assert!(
        matches!(out.error, Some(TraceError::Corrupt { ref what, .. }) if what.contains("codec"))
    );
}

/// Hands out its input a few bytes at a time, with interruptions, then
/// optionally fails.
struct Dribble<'a> {
    data: &'a [u8],
    step: usize,
    calls: usize,
    fail_at: Option<usize>,
}

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.calls.is_multiple_of(3) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "signal"));
        }
        if self.fail_at.is_some_and(|f| self.data.len() <= f) {
            return Err(io::Error::other("disk on fire"));
        }
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn short_reads_and_interruptions_do_not_matter() {
    let bytes = build(&sample_chunks());
    let full = read_all(&bytes);
    for step in [1, 3, 44, 1000] {
        let r = TraceReader::new(Dribble {
            data: &bytes,
            step,
            calls: 0,
            fail_at: None,
        })
        .unwrap();
        let chunks: Vec<_> = r.map(Result::unwrap).collect();
        assert_same_chunks(&chunks, &full.chunks);
    }
}

#[test]
fn io_errors_say_where() {
    let bytes = build(&sample_chunks());
    let spans = chunk_spans(&bytes);
    // Fail once only this many bytes are left: inside the third chunk.
    let remaining = bytes.len() - (spans[2].0 + 10);
    let mut r = TraceReader::new(Dribble {
        data: &bytes,
        step: 7,
        calls: 0,
        fail_at: Some(remaining),
    })
    .unwrap();
    assert!(r.next_chunk().unwrap().is_some());
    assert!(r.next_chunk().unwrap().is_some());
    match r.next_chunk() {
        Err(e @ TraceError::Io { .. }) => {
            assert_eq!(e.offset(), Some(spans[2].0 as u64));
            assert!(e.to_string().contains("disk on fire"));
        }
        other => panic!("{other:?}"),
    }
    assert!(r.next_chunk().unwrap().is_none());
}

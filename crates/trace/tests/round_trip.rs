//! Every event variant survives TraceBuilder -> TraceReader -> Chunk::events().

mod common;

use common::*;
use trapline_trace::event::{encode_to_vec, MAX_STACK_FRAMES};
use trapline_trace::format::{CHUNK_HEADER_LEN, FILE_HEADER_LEN};
use trapline_trace::{
    AllocFn, ChunkContext, DecodeError, Decoder, Event, TraceReader, Verdict, FORMAT_VERSION,
};

fn assert_round_trip(chunks: &[(u32, Vec<Event>)]) {
    let bytes = build(chunks);
    let out = read_all(&bytes);
    assert!(out.open_error.is_none(), "{:?}", out.open_error);
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.chunks.len(), chunks.len());
    let mut offset = FILE_HEADER_LEN as u64;
    for (i, ((tid, events), chunk)) in chunks.iter().zip(&out.chunks).enumerate() {
        let (decoded, err) = &out.events[i];
        assert_eq!(err, &None, "chunk {i}");
        assert_eq!(decoded, events, "chunk {i}");
        assert_eq!(chunk.header.tid, *tid);
        assert_eq!(chunk.header.events as usize, events.len());
        assert_eq!(chunk.header.raw_len as usize, chunk.payload.len());
        assert_eq!(chunk.offset, offset);
        offset += (CHUNK_HEADER_LEN + chunk.header.stored_len as usize) as u64;
    }
    assert_eq!(offset, bytes.len() as u64);
}

#[test]
fn every_variant_round_trips_in_one_trace() {
    assert_round_trip(&sample_chunks());
}

#[test]
fn sample_trace_uses_both_codecs() {
    use trapline_trace::format::Codec;
    let out = read_all(&build(&sample_chunks()));
    let codecs: Vec<Codec> = out.chunks.iter().map(|c| c.header.codec).collect();
    assert!(codecs.contains(&Codec::Raw), "{codecs:?}");
    assert!(codecs.contains(&Codec::Lz4), "{codecs:?}");
}

#[test]
fn each_event_round_trips_alone() {
    let all: Vec<Event> = sample_chunks().into_iter().flat_map(|(_, e)| e).collect();
    for ev in all {
        // As the only event of a chunk (absolute time, address delta from 0)...
        assert_round_trip(&[(1, vec![ev.clone()])]);
        // ...and straight through the encoder and decoder.
        let mut buf = Vec::new();
        encode_to_vec(&mut buf, &mut ChunkContext::default(), &ev);
        let got: Vec<_> = Decoder::new(&buf).collect();
        assert_eq!(got, vec![Ok(ev)]);
    }
}

#[test]
fn every_alloc_fn_and_error_kind_round_trips() {
    let mut events = Vec::new();
    for (i, &func) in AllocFn::ALL.iter().enumerate() {
        assert_eq!(AllocFn::from_u8(func as u8), Some(func));
        events.push(Event::LiveBlock {
            addr: i as u64,
            size: 1,
            func,
            stack: 1,
        });
        for verdict in Verdict::ALL {
            assert_eq!(Verdict::from_u8(verdict as u8), Some(verdict));
            events.push(Event::ScanBlock {
                scan: 1,
                addr: i as u64 * 16,
                size: 1,
                func,
                stack: 1,
                verdict,
                indirect_bytes: i as u64,
            });
        }
        for &kind in &ERROR_KINDS {
            events.push(Event::Error {
                time: i as u64,
                kind,
                func,
                addr: 0,
                stack: 0,
                alloc_func: Some(func),
                alloc_size: 0,
                alloc_stack: 0,
                free_stack: 0,
                passed_on: true,
                given: 0,
            });
        }
    }
    assert_eq!(AllocFn::from_u8(0), None);
    assert_eq!(AllocFn::from_u8(AllocFn::ALL.len() as u8 + 1), None);
    assert_round_trip(&[(3, events)]);
}

#[test]
fn many_chunks_and_an_empty_trace() {
    assert_round_trip(&[]);
    let chunks: Vec<(u32, Vec<Event>)> = (0..50)
        .map(|i| (i, hot_events(u64::from(i) * 1_000_000)))
        .collect();
    assert_round_trip(&chunks);
}

#[test]
fn stack_limit_is_enforced_on_decode_only_past_the_limit() {
    let frames: Vec<u64> = (0..MAX_STACK_FRAMES as u64).map(|i| u64::MAX - i).collect();
    assert_round_trip(&[(
        1,
        vec![Event::StackDef {
            id: 5,
            frames: frames.clone(),
        }],
    )]);

    let mut too_long = frames;
    too_long.push(0);
    let mut buf = Vec::new();
    encode_to_vec(
        &mut buf,
        &mut ChunkContext::default(),
        &Event::StackDef {
            id: 5,
            frames: too_long,
        },
    );
    let got: Vec<_> = Decoder::new(&buf).collect();
    assert_eq!(
        got,
        vec![Err(DecodeError::TooLong {
            what: "stack",
            len: MAX_STACK_FRAMES as u64 + 1
        })]
    );
}

#[test]
fn reader_reports_version_and_offsets() {
    let bytes = build(&sample_chunks());
    let mut r = TraceReader::new(&bytes[..]).unwrap();
    assert_eq!(r.version(), FORMAT_VERSION);
    assert_eq!(r.offset(), FILE_HEADER_LEN as u64);
    while let Some(c) = r.next_chunk().unwrap() {
        assert_eq!(
            r.offset(),
            c.offset + (CHUNK_HEADER_LEN as u64) + u64::from(c.header.stored_len)
        );
    }
    assert_eq!(r.offset(), bytes.len() as u64);
    assert!(r.next_chunk().unwrap().is_none());
}

/// The hot events' encoders have two paths: one bounds check when the output
/// holds the longest encoding, field by field near its end. At every output
/// length, an event either does not fit (NoRoom) or is encoded to the same
/// bytes as with room to spare, and decodes back to itself; field values
/// cover one- to ten-byte varints.
#[test]
fn hot_events_encode_alike_near_the_end_of_the_output() {
    let values = [
        0u64,
        1,
        127,
        128,
        16_383,
        16_384,
        1 << 21,
        1 << 35,
        u64::MAX,
    ];
    let mut events = Vec::new();
    for (i, &v) in values.iter().enumerate() {
        let w = values[(i + 3) % values.len()];
        events.push(Event::Alloc {
            time: v,
            addr: w,
            size: v,
            align: w,
            func: AllocFn::AlignedAlloc,
            stack: v as u32,
        });
        events.push(Event::Free {
            time: w,
            addr: v,
            func: AllocFn::DeleteArray,
            stack: w as u32,
        });
    }
    for ev in &events {
        let mut whole = Vec::new();
        encode_to_vec(&mut whole, &mut ChunkContext::default(), ev);
        for len in 0..whole.len() + 40 {
            let mut out = vec![0u8; len];
            let mut ctx = ChunkContext::default();
            let mut enc = trapline_trace::event::Encoder::new(&mut out);
            match enc.event(&mut ctx, ev) {
                Ok(()) => {
                    let n = enc.len();
                    assert_eq!(&out[..n], &whole[..], "{ev:?} into {len} bytes");
                    let decoded: Vec<_> = Decoder::new(&out[..n]).collect();
                    assert_eq!(decoded, vec![Ok(ev.clone())], "{ev:?}");
                }
                Err(_) => assert!(len < whole.len(), "{ev:?} did not fit {len} bytes"),
            }
        }
    }
}

/// `RunTotals` as agents before format version 7 wrote it (tag 50, five
/// varints) still decodes, with no failed allocations; version 7 writes tag
/// 52 with the count after them.
#[test]
fn run_totals_of_older_agents_decode() {
    let old = [50u8, 7, 6, 1, 100, 9];
    let decoded: Vec<Event> = Decoder::new(&old)
        .collect::<Result<_, _>>()
        .expect("decodes");
    assert_eq!(
        decoded,
        [Event::RunTotals(trapline_trace::RunTotals {
            allocation_calls: 7,
            release_calls: 6,
            errors: 1,
            failed_allocations: 0,
            peak_bytes: 100,
            peak_time: 9,
        })]
    );
    let mut new = Vec::new();
    encode_to_vec(&mut new, &mut ChunkContext::default(), &decoded[0]);
    assert_eq!(new[0], 52);
    assert_eq!(&new[1..6], &old[1..]);
    assert_eq!(new[6], 0);
}

/// A skipped scan's trigger and reason are checked like every other enum.
#[test]
fn scan_skipped_with_unknown_values_is_invalid() {
    let mut raw = Vec::new();
    encode_to_vec(
        &mut raw,
        &mut ChunkContext::default(),
        &Event::ScanSkipped {
            time: 5,
            trigger: trapline_trace::ScanTrigger::Exit,
            reason: trapline_trace::ScanSkipReason::CommitLimit,
            needed: 1,
            available: 2,
            limit: 3,
        },
    );
    // Tag, time (one byte), trigger, reason, then the three sizes.
    assert_eq!(raw, [38, 5, 1, 2, 1, 2, 3]);
    for (at, value, what) in [
        (2, 0, "scan trigger"),
        (2, 3, "scan trigger"),
        (3, 0, "scan skip reason"),
        (3, 9, "scan skip reason"),
    ] {
        let mut bad = raw.clone();
        bad[at] = value;
        let r: Vec<_> = Decoder::new(&bad).collect();
        assert_eq!(
            r,
            vec![Err(DecodeError::Invalid(what))],
            "byte {at} = {value}"
        );
    }
}

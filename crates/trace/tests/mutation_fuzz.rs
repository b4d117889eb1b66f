//! A deterministic mutation fuzzer that runs with the normal test suite: valid
//! traces are damaged in many ways (bit flips, insertions, deletions,
//! truncations, splices, lying length fields, with and without repaired
//! checksums) and random event payloads go straight to the decoder. Nothing
//! may panic, loop forever, or lose data that precedes the damage.

mod common;

use common::*;
use trapline_trace::format::{encode_chunk, CHUNK_HEADER_LEN, CHUNK_MAGIC, FILE_HEADER_LEN};
use trapline_trace::{ChunkContext, Decoder, Event, TraceError, FORMAT_VERSION};

const ITERATIONS: usize = 20_000;

fn bases() -> Vec<Vec<u8>> {
    let mut v = vec![build(&sample_chunks())];
    v.push(build(&[(1, agent_events())]));
    v.push(build(&[(2, hot_events(5)), (3, end_events(1 << 40))]));
    for ev in hot_events(1)
        .into_iter()
        .step_by(7)
        .chain(agent_events())
        .chain(end_events(9))
    {
        v.push(build(&[(4, vec![ev.clone()]), (5, vec![ev])]));
    }
    v
}

/// Chunk spans of a valid trace.
fn spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    read_all(bytes)
        .chunks
        .iter()
        .map(|c| {
            (
                c.offset as usize,
                c.offset as usize + CHUNK_HEADER_LEN + c.header.stored_len as usize,
            )
        })
        .collect()
}

const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    16 << 20,
    (16 << 20) + 1,
    u32::MAX as u64,
    1 << 32,
    u64::MAX,
    44,
];

/// Applies one random mutation; returns the first byte offset it touched
/// and whether the mutation may have introduced a well-formed chunk.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>]) -> (usize, bool) {
    let len = data.len();
    let pos = rng.below(len + 1);
    match rng.below(9) {
        0 if len > 0 => {
            let p = pos.min(len - 1);
            data[p] ^= 1 << rng.below(8);
            (p, false)
        }
        1 if len > 0 => {
            let p = pos.min(len - 1);
            data[p] = rng.byte();
            (p, false)
        }
        2 => {
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
            data.splice(pos..pos, bytes);
            (pos, false)
        }
        3 => {
            let n = rng.below(64).min(len - pos);
            data.drain(pos..pos + n);
            (pos, false)
        }
        4 => {
            data.truncate(pos);
            (pos, false)
        }
        5 => {
            // Splice in a range of another trace (often whole chunks).
            let d = &donors[rng.below(donors.len())];
            let a = rng.below(d.len());
            let b = a + rng.below(d.len() - a + 1);
            data.splice(pos..pos, d[a..b].iter().copied());
            (pos, true)
        }
        6 => {
            // Replace the tail with another trace's tail.
            let d = &donors[rng.below(donors.len())];
            let a = rng.below(d.len());
            data.truncate(pos);
            data.extend_from_slice(&d[a..]);
            (pos, true)
        }
        7 if len >= 4 => {
            // A lying little-endian u32, e.g. a chunk length.
            let p = pos.min(len - 4);
            let v = INTERESTING[rng.below(INTERESTING.len())] as u32;
            let v = if rng.chance(2) {
                v
            } else {
                v.wrapping_add(rng.below(3) as u32).wrapping_sub(1)
            };
            data[p..p + 4].copy_from_slice(&v.to_le_bytes());
            (p, false)
        }
        _ => {
            // Duplicate a range of itself.
            let a = rng.below(len + 1);
            let b = a + rng.below(len - a + 1).min(256);
            let copy = data[a..b].to_vec();
            data.splice(pos..pos, copy);
            (pos, true)
        }
    }
}

/// Recomputes the checksum of every chunk whose header is still walkable, so
/// the damage reaches decompression and the event decoder.
fn repair_checksums(data: &mut [u8]) {
    let mut at = FILE_HEADER_LEN;
    while at + CHUNK_HEADER_LEN <= data.len() && &data[at..at + 4] == CHUNK_MAGIC {
        let stored = u32::from_le_bytes(data[at + 16..at + 20].try_into().unwrap()) as usize;
        let end = match (at + CHUNK_HEADER_LEN).checked_add(stored) {
            Some(e) if e <= data.len() => e,
            _ => return,
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&data[at..at + 40]);
        h.update(&data[at + CHUNK_HEADER_LEN..end]);
        let crc = h.finalize();
        data[at + 40..at + 44].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

#[test]
fn mutated_traces() {
    let bases = bases();
    let originals: Vec<_> = bases.iter().map(|b| (read_all(b), spans(b))).collect();
    let mut rng = Rng::new(0x7A4C_E11E);
    let mut stats = [0usize; 4];
    for i in 0..ITERATIONS {
        let which = rng.below(bases.len());
        let mut data = bases[which].clone();
        let mut may_add_chunks = false;
        for _ in 0..1 + rng.below(3) {
            let (_, adds) = mutate(&mut rng, &mut data, &bases);
            may_add_chunks |= adds;
        }
        let repaired = rng.chance(3);
        if repaired {
            repair_checksums(&mut data);
        }
        // The first byte that actually differs: a mutation may rewrite a byte
        // with its own value, or insert what was already there. The file
        // header's flags are not interpreted: damage there is no damage.
        let orig_bytes = &bases[which];
        if data.len() >= 12 {
            data[10..12].copy_from_slice(&orig_bytes[10..12]);
        }
        // Neither is a version changed into another one this reader reads
        // the same way (every version from 1 up decodes with one decoder).
        if data.len() >= 10 {
            let version = u16::from_le_bytes([data[8], data[9]]);
            if (1..=FORMAT_VERSION).contains(&version) {
                data[8..10].copy_from_slice(&orig_bytes[8..10]);
            }
        }
        let first = if data == *orig_bytes {
            usize::MAX
        } else {
            data.iter()
                .zip(orig_bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(data.len().min(orig_bytes.len()))
        };
        let out = read_all(&data);
        let (orig, orig_spans) = &originals[which];
        stats[0] += usize::from(out.open_error.is_none() && out.error.is_none());
        stats[1] += usize::from(out.open_error.is_some());
        stats[2] += usize::from(out.error.is_some());
        stats[3] += usize::from(out.events.iter().any(|(_, e)| e.is_some()));
        if out.open_error.is_some() {
            assert!(
                first < FILE_HEADER_LEN || data.len() < FILE_HEADER_LEN,
                "iteration {i}"
            );
            continue;
        }
        // Chunks that end before the first damaged byte come back intact.
        let intact = orig_spans.iter().take_while(|&&(_, e)| e <= first).count();
        assert!(
            out.chunks.len() >= intact,
            "iteration {i}: lost an undamaged chunk"
        );
        for (g, w) in out.chunks.iter().zip(&orig.chunks).take(intact) {
            assert_eq!(
                (g.offset, &g.header, &g.payload),
                (w.offset, &w.header, &w.payload),
                "iteration {i}"
            );
        }
        if !repaired && !may_add_chunks {
            if let Some(off) = out.error.as_ref().and_then(TraceError::offset) {
                assert!(
                    off <= first as u64,
                    "iteration {i}: error at {off}, damage at {first}"
                );
            }
        }
    }
    // The mix must exercise every outcome.
    assert!(stats.iter().all(|&n| n > 100), "{stats:?}");
}

/// Payload-level damage inside chunks with valid checksums: every event that
/// ends before the damage decodes as before.
#[test]
fn mutated_payloads_behind_valid_checksums() {
    let chunks = sample_chunks();
    // (payload, (end offset, event) for each event)
    type Payload = (Vec<u8>, Vec<(usize, Event)>);
    let payloads: Vec<Payload> = chunks
        .iter()
        .map(|(_, events)| {
            let mut raw = Vec::new();
            let mut ctx = ChunkContext::default();
            let mut ends = Vec::new();
            for ev in events {
                trapline_trace::event::encode_to_vec(&mut raw, &mut ctx, ev);
                ends.push((raw.len(), ev.clone()));
            }
            (raw, ends)
        })
        .filter(|(raw, _)| !raw.is_empty())
        .collect();
    let mut rng = Rng::new(0xDEC0DE);
    let mut errors = 0;
    for i in 0..ITERATIONS / 4 {
        let (raw, ends) = &payloads[rng.below(payloads.len())];
        let mut payload = raw.clone();
        let mut first = usize::MAX;
        for _ in 0..1 + rng.below(3) {
            let (p, _) = mutate(&mut rng, &mut payload, std::slice::from_ref(raw));
            first = first.min(p);
        }
        let mut bytes = build(&[]);
        let mut chunk = Vec::new();
        encode_chunk(&mut chunk, 1, 0, 0, 0, &payload);
        bytes.extend_from_slice(&chunk);
        let out = read_all(&bytes);
        assert!(out.error.is_none(), "iteration {i}: {:?}", out.error);
        assert_eq!(out.chunks[0].payload, payload);
        let (events, err) = &out.events[0];
        let before: Vec<&Event> = ends
            .iter()
            .filter(|(e, _)| *e <= first)
            .map(|(_, ev)| ev)
            .collect();
        assert!(events.len() >= before.len(), "iteration {i}");
        assert!(
            events.iter().zip(&before).all(|(a, b)| a == *b),
            "iteration {i}"
        );
        if let Some((at, _)) = err {
            errors += 1;
            // The reported event position is a real event boundary at or after the intact prefix.
            assert!(
                *at >= ends
                    .iter()
                    .filter(|(e, _)| *e <= first)
                    .map(|(e, _)| *e)
                    .max()
                    .unwrap_or(0)
            );
        }
    }
    assert!(errors > 100, "{errors}");
}

/// Random payloads, biased towards valid tags and small varints, straight
/// into the decoder.
#[test]
fn random_payloads() {
    const TAGS: [u8; 14] = [1, 2, 3, 4, 5, 16, 17, 18, 19, 32, 33, 34, 48, 49];
    let mut rng = Rng::new(42);
    let mut decoded = 0usize;
    for _ in 0..ITERATIONS {
        let len = rng.below(128);
        let mut p = Vec::with_capacity(len);
        while p.len() < len {
            match rng.below(6) {
                0 => p.push(TAGS[rng.below(TAGS.len())]),
                1 => p.extend_from_slice(&[0xff; 9][..rng.below(10)]),
                2 => {
                    let v = INTERESTING[rng.below(INTERESTING.len())];
                    let mut buf = [0u8; 10];
                    let n = trapline_trace::varint::put_u64(&mut buf, v);
                    p.extend_from_slice(&buf[..n]);
                }
                3 => p.push(rng.below(4) as u8),
                _ => p.push(rng.byte()),
            }
        }
        let (events, _) = decode_payload(&p);
        decoded += events.len();
        // The iterator API on its own terms too.
        let _ = Decoder::new(&p).count();
    }
    assert!(decoded > 1_000, "{decoded}");
}

//! Damaged length fields must not make the reader or decoder allocate by
//! what they claim: memory follows the bytes actually present. Alone in its
//! test binary so the process's peak RSS measures only this test.

mod common;

use common::*;
use trapline_trace::format::encode_chunk;
use trapline_trace::varint::put_u64;
use trapline_trace::{DecodeError, Decoder};

/// Peak resident set size of this process, in KiB (Linux only).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn varint(v: u64) -> Vec<u8> {
    let mut b = [0u8; 10];
    let n = put_u64(&mut b, v);
    b[..n].to_vec()
}

#[test]
fn lying_lengths_cost_no_memory() {
    // Chunks whose headers claim the largest sizes a reader accepts, in files
    // that end a few bytes later.
    let mut inputs = vec![
        with_chunk_sizes(1, 16 << 20, 16 << 20),
        with_chunk_sizes(1, 16 << 20, (16 << 20) + 65_000),
        with_chunk_sizes(1, 1 << 20, 1 << 20),
    ];
    // Decoder counts at and past their limits, with nothing behind them.
    let huge = [
        u64::MAX,
        u64::MAX / 2,
        u32::MAX as u64,
        1 << 20,
        (1 << 20) + 1,
        1 << 16,
        256,
        1024,
    ];
    let mut payloads = Vec::new();
    for &n in &huge {
        let n = varint(n);
        payloads.push([&[1u8, 1, 1, 0, 0][..], &n].concat()); // argv count
        payloads.push([&[1u8, 1, 1, 0][..], &n].concat()); // exe length
        payloads.push([&[2u8, 1, 0, 0, 0][..], &n].concat()); // segment count
        payloads.push([&[2u8, 1][..], &n].concat()); // path length
        payloads.push([&[5u8, 1][..], &n].concat()); // frame count
        payloads.push([&[4u8, 1][..], &n].concat()); // thread name length
    }
    // Wrapped in valid chunks too, so the reader hands them to the decoder.
    for p in &payloads {
        let mut b = build(&[]);
        let mut chunk = Vec::new();
        encode_chunk(&mut chunk, 1, 1, 0, 0, p);
        b.extend_from_slice(&chunk);
        inputs.push(b);
    }

    let before = peak_rss_kib();
    for _ in 0..20 {
        for input in &inputs {
            let out = read_all(input);
            assert!(out.error.is_some() || out.events.iter().all(|(_, e)| e.is_some()));
        }
        for p in &payloads {
            let got: Vec<_> = Decoder::new(p).collect();
            assert_eq!(got.len(), 1);
            assert!(
                matches!(
                    got[0],
                    Err(DecodeError::TooLong { .. } | DecodeError::Truncated)
                ),
                "{got:?}"
            );
        }
    }
    if let (Some(before), Some(after)) = (before, peak_rss_kib()) {
        // A single allocation by a claimed length would be 16 MiB.
        assert!(
            after - before < 8 * 1024,
            "peak RSS grew by {} KiB",
            after - before
        );
    }
}

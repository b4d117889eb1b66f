//! Writes the seed corpus of the cargo-fuzz targets in `fuzz/` (valid traces
//! and chunk payloads). Run on demand:
//! `cargo test -p trapline-trace --test fuzz_seeds -- --ignored`

mod common;

use common::*;
use std::path::Path;
use trapline_trace::ChunkContext;

#[test]
#[ignore = "writes files into fuzz/seeds; run on demand"]
fn write_fuzz_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let traces = root.join("trace_reader");
    let payloads = root.join("event_decoder");
    std::fs::create_dir_all(&traces).unwrap();
    std::fs::create_dir_all(&payloads).unwrap();
    let chunks = sample_chunks();
    std::fs::write(traces.join("sample"), build(&chunks)).unwrap();
    for (i, chunk) in chunks.iter().enumerate() {
        std::fs::write(
            traces.join(format!("chunk{i}")),
            build(std::slice::from_ref(chunk)),
        )
        .unwrap();
        let mut raw = Vec::new();
        let mut ctx = ChunkContext::default();
        for ev in &chunk.1 {
            trapline_trace::event::encode_to_vec(&mut raw, &mut ctx, ev);
        }
        std::fs::write(payloads.join(format!("chunk{i}")), raw).unwrap();
    }
    std::fs::write(traces.join("empty"), build(&[])).unwrap();
    let locks = lock_events(1_000);
    std::fs::write(traces.join("locks"), build(&[(3, locks.clone())])).unwrap();
    let mut raw = Vec::new();
    let mut ctx = ChunkContext::default();
    for ev in &locks {
        trapline_trace::event::encode_to_vec(&mut raw, &mut ctx, ev);
    }
    std::fs::write(payloads.join("locks"), raw).unwrap();
}

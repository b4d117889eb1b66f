//! Arbitrary bytes as a decompressed chunk payload. The chunk checksum keeps a
//! fuzzer that mutates whole files away from the event decoder, so this
//! target feeds it directly, and also wraps the bytes in a valid chunk (LZ4
//! compressed when they compress) to run the reader's decompression path.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trapline_trace::format::encode_chunk;
use trapline_trace::{Decoder, TraceBuilder, TraceReader};

fn decode_all(payload: &[u8]) -> usize {
    let mut dec = Decoder::new(payload);
    let mut n = 0;
    for ev in dec.by_ref() {
        n += 1;
        if ev.is_err() {
            break;
        }
    }
    assert!(dec.position() <= payload.len());
    n
}

fuzz_target!(|data: &[u8]| {
    let direct = decode_all(data);

    let mut bytes = TraceBuilder::new().into_bytes();
    let mut chunk = Vec::new();
    encode_chunk(&mut chunk, 1, 0, 0, 0, data);
    bytes.extend_from_slice(&chunk);
    let mut reader = TraceReader::new(&bytes[..]).expect("valid header");
    let chunk = reader.next_chunk().expect("valid chunk").expect("one chunk");
    assert_eq!(chunk.payload, data);
    assert_eq!(decode_all(&chunk.payload), direct);
    assert!(reader.next_chunk().expect("clean end").is_none());
});

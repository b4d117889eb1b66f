//! Arbitrary bytes as a whole trace file: read every chunk and decode every
//! event, as an analysis would. Must never panic or allocate without bound.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trapline_trace::{TraceError, TraceReader};

fuzz_target!(|data: &[u8]| {
    let mut reader = match TraceReader::new(data) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let mut end = reader.offset();
    loop {
        match reader.next_chunk() {
            Ok(Some(chunk)) => {
                assert_eq!(chunk.offset, end);
                assert_eq!(chunk.payload.len(), chunk.header.raw_len as usize);
                end = reader.offset();
                assert!(end <= data.len() as u64);
                let mut events = chunk.events();
                for ev in events.by_ref() {
                    if let Err(e) = ev {
                        let _ = e.to_string();
                        break;
                    }
                }
                assert!(events.position() <= chunk.payload.len());
            }
            Ok(None) => {
                assert_eq!(end, data.len() as u64);
                break;
            }
            Err(e) => {
                // Reading stops where the first unreadable chunk starts.
                if !matches!(e, TraceError::NotATrace | TraceError::NewerVersion { .. }) {
                    assert_eq!(e.offset(), Some(end));
                }
                let _ = e.to_string();
                assert!(matches!(reader.next_chunk(), Ok(None)));
                break;
            }
        }
    }
});

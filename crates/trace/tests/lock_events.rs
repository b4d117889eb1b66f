//! Lock events: every variant round-trips, and invalid field values are
//! decode errors, never panics or wrong events.

mod common;

use common::*;
use trapline_trace::event::encode_to_vec;
use trapline_trace::{
    ChunkContext, DecodeError, Decoder, Event, LockEvent, LockKind, LockMode, LockOp,
};

fn encode(ev: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    encode_to_vec(&mut out, &mut ChunkContext::default(), ev);
    out
}

#[test]
fn every_lock_event_round_trips() {
    let events = lock_events(1_000);
    let mut raw = Vec::new();
    let mut ctx = ChunkContext::default();
    for ev in &events {
        encode_to_vec(&mut raw, &mut ctx, ev);
    }
    let decoded: Vec<Event> = Decoder::new(&raw).map(|r| r.expect("decodes")).collect();
    assert_eq!(decoded, events);
}

#[test]
fn an_uncontended_acquisition_is_a_few_bytes() {
    let ev = Event::Lock(LockEvent::Acquire {
        time: 5,
        addr: 0x10,
        kind: LockKind::Mutex,
        mode: LockMode::Exclusive,
        op: LockOp::Blocking,
        wait_ns: None,
        stack: 3,
    });
    // tag, time, address, flags, stack
    assert_eq!(encode(&ev).len(), 5);
}

#[test]
fn invalid_values_are_errors() {
    let acquire = encode(&Event::Lock(LockEvent::Acquire {
        time: 5,
        addr: 0x10,
        kind: LockKind::Spin,
        mode: LockMode::Shared,
        op: LockOp::Timed,
        wait_ns: None,
        stack: 3,
    }));
    let flags_at = 3;
    for (flags, what) in [(0x80u8, "lock flags"), (0x07, "lock kind")] {
        let mut bad = acquire.clone();
        bad[flags_at] = flags;
        let r: Vec<_> = Decoder::new(&bad).collect();
        assert_eq!(r, vec![Err(DecodeError::Invalid(what))], "flags {flags:#x}");
    }
    // A contended flag with the wait missing: truncated.
    let mut bad = acquire.clone();
    bad[flags_at] |= 0x40;
    let r: Vec<_> = Decoder::new(&bad).collect();
    assert_eq!(r, vec![Err(DecodeError::Truncated)]);
    // Unassigned tags of the lock range.
    for tag in [76u8, 95] {
        let r: Vec<_> = Decoder::new(&[tag, 0, 0]).collect();
        assert_eq!(r, vec![Err(DecodeError::UnknownTag(tag))]);
    }
}

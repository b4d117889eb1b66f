//! Times the encoder paths the agent uses, and the decoder, without a
//! benchmark framework: build it at two commits and run the binaries in
//! turn to compare a codec change (release mode; see the printed names).
//!
//! `cargo run --release -p trapline-trace --example encode_timing [EVENTS [CASE]]`

use std::hint::black_box;
use std::time::Instant;

use trapline_trace::event::encode_to_vec;
use trapline_trace::{AllocFn, ChunkContext, Decoder, Encoder, Event, LockKind, LockMode, LockOp};

/// The agent's chunk buffer size order of magnitude: encoding wraps around it.
const BUF: usize = 1 << 20;

/// Inputs that vary like a program's: nearby addresses, small sizes, a
/// clock that advances a few hundred nanoseconds an event.
struct Inputs {
    addrs: Vec<u64>,
    sizes: Vec<u64>,
}

impl Inputs {
    fn new() -> Inputs {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let addrs = (0..4096)
            .map(|_| 0x5555_0000_0000 + (next() % (1 << 24)) * 16)
            .collect();
        let sizes = (0..4096).map(|_| 8 + next() % 256).collect();
        Inputs { addrs, sizes }
    }
}

/// Runs `encode` for `n` events the way the agent's writer does (a fresh
/// encoder on the rest of the buffer for each event); returns ns per event.
fn time_encoder(
    n: usize,
    mut encode: impl FnMut(&mut Encoder<'_>, &mut ChunkContext, usize) -> bool,
) -> f64 {
    let mut buf = vec![0u8; BUF];
    let mut len = 0;
    let mut ctx = ChunkContext::default();
    let start = Instant::now();
    for i in 0..n {
        if BUF - len < 256 {
            black_box(&buf[..len]);
            len = 0;
            ctx = ChunkContext::default();
        }
        let mut enc = Encoder::new(&mut buf[len..]);
        if encode(&mut enc, &mut ctx, i) {
            len += enc.len();
        }
    }
    black_box(&buf[..len]);
    start.elapsed().as_nanos() as f64 / n as f64
}

/// Times `n` decoded events, ns per event.
fn time_decoder(n: usize, raw: &[u8], per_pass: usize) -> f64 {
    let rounds = n.div_ceil(per_pass);
    let start = Instant::now();
    for _ in 0..rounds {
        for ev in Decoder::new(black_box(raw)) {
            black_box(ev.expect("decodes"));
        }
    }
    start.elapsed().as_nanos() as f64 / (rounds * per_pass) as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map_or(10_000_000, |a| a.parse().expect("EVENTS is a number"));
    let only = args.next();
    let inp = Inputs::new();
    let t = |i: usize| 1_000_000 + i as u64 * 300;

    // Alternating allocations and releases, as tools and tests write them.
    let events: Vec<Event> = (0..4096)
        .map(|i| {
            let a = inp.addrs[(i / 2) & 4095];
            if i % 2 == 0 {
                Event::Alloc {
                    time: t(i),
                    addr: a,
                    size: inp.sizes[i],
                    align: 0,
                    func: AllocFn::Malloc,
                    stack: 7,
                }
            } else {
                Event::Free {
                    time: t(i),
                    addr: a,
                    func: AllocFn::Free,
                    stack: 9,
                }
            }
        })
        .collect();
    let mut raw = Vec::new();
    let mut ctx = ChunkContext::default();
    for ev in &events {
        encode_to_vec(&mut raw, &mut ctx, ev);
    }

    let cases: [(&str, &dyn Fn() -> f64); 6] = [
        // The agent's hooks.
        ("alloc_free", &|| {
            time_encoder(n, |e, c, i| {
                let a = inp.addrs[(i / 2) & 4095];
                let r = if i % 2 == 0 {
                    e.alloc(c, t(i), a, inp.sizes[i & 4095], 0, AllocFn::Malloc, 7)
                } else {
                    e.free(c, t(i), a, AllocFn::Free, 9)
                };
                r.is_ok()
            })
        }),
        ("sample", &|| {
            time_encoder(n, |e, c, i| {
                e.sample(c, t(i) * 3000, (i & 1023) as u32, 1).is_ok()
            })
        }),
        ("lock", &|| {
            time_encoder(n, |e, c, i| {
                let a = inp.addrs[(i / 2) & 63];
                let r = if i % 2 == 0 {
                    let wait = (i % 16 == 0).then_some(5_000);
                    let (kind, mode, op) = (LockKind::Mutex, LockMode::Exclusive, LockOp::Blocking);
                    e.lock_acquire(c, t(i), a, kind, mode, op, wait, 11)
                } else {
                    e.lock_release(c, t(i), a, LockKind::Mutex, 0, 0)
                };
                r.is_ok()
            })
        }),
        // The agent writes a realloc through `Encoder::event`.
        ("event_realloc", &|| {
            time_encoder(n, |e, c, i| {
                let ev = Event::Realloc {
                    time: t(i),
                    old_addr: inp.addrs[i & 4095],
                    new_addr: inp.addrs[(i + 1) & 4095],
                    size: inp.sizes[i & 4095],
                    func: AllocFn::Realloc,
                    stack: 13,
                };
                e.event(c, &ev).is_ok()
            })
        }),
        ("event_alloc_free", &|| {
            time_encoder(n, |e, c, i| e.event(c, &events[i & 4095]).is_ok())
        }),
        // The analyses read every event of a trace.
        ("decode_alloc_free", &|| time_decoder(n, &raw, events.len())),
    ];
    print!("ns/event:");
    for (name, run) in cases {
        if only.as_deref().is_none_or(|o| o == name) {
            print!(" {name} {:.3}", run());
        }
    }
    println!();
}

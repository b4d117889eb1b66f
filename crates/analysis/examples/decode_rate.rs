//! Decode throughput of a trace, per thread count: every chunk read,
//! checked, decompressed and decoded into events (what the merge's
//! decoding threads do), with 1 to N threads, each taking every N-th chunk.
//! Prints one JSON line per thread count. Used by bench/decode.sh.
//!
//!   cargo run --release -p trapline-analysis --example decode_rate -- TRACE [ROUNDS]

use std::fs::File;
use std::io::BufReader;
use std::time::Instant;

use trapline_analysis::index::TraceIndex;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: decode_rate TRACE [ROUNDS]");
    let rounds: usize = args.next().map_or(3, |r| r.parse().expect("ROUNDS"));
    let index =
        TraceIndex::build(&mut BufReader::new(File::open(&path).expect("open"))).expect("index");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for round in 0..rounds {
        for threads in 1..=cores {
            let started = Instant::now();
            let events: u64 = std::thread::scope(|s| {
                let workers: Vec<_> = (0..threads)
                    .map(|k| {
                        let (index, path) = (&index, &path);
                        s.spawn(move || {
                            let mut input = BufReader::new(File::open(path).expect("open"));
                            let mut n = 0u64;
                            for entry in index.chunks.iter().skip(k).step_by(threads) {
                                let chunk = index.read_chunk(&mut input, entry).expect("chunk");
                                let decoded: Vec<_> =
                                    chunk.events().collect::<Result<_, _>>().expect("events");
                                n += decoded.len() as u64;
                            }
                            n
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().expect("worker")).sum()
            });
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "{{\"round\": {round}, \"threads\": {threads}, \"events\": {events}, \"seconds\": {seconds:.4}, \"events_per_s\": {:.0}}}",
                events as f64 / seconds
            );
        }
    }
}

//! Writes a synthetic service's trace (see `trapline_trace::synthetic`):
//! `synthetic_trace OUT [BYTES] [THREADS]`, and prints what it holds.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(out) = args.get(1) else {
        eprintln!("usage: synthetic_trace OUT [BYTES] [THREADS]");
        std::process::exit(2);
    };
    let number = |i: usize, default: u64| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let service = trapline_trace::synthetic::Service {
        threads: number(3, 4) as u32,
        live_per_thread: 1024,
        bytes: number(2, 1 << 30),
    };
    let file = std::fs::File::create(out).expect("creating the output");
    let written = trapline_trace::synthetic::write(&service, file).expect("writing the trace");
    println!("{written:?}");
}

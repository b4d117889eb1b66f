//! Prints every chunk and event of a trace (a debugging aid).
//! `cargo run -p trapline-trace --example tracedump -- TRACE`

fn main() {
    let path = std::env::args().nth(1).expect("usage: tracedump TRACE");
    let file = std::io::BufReader::new(std::fs::File::open(&path).expect("open trace"));
    let reader = match trapline_trace::TraceReader::new(file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    for chunk in reader {
        match chunk {
            Ok(c) => {
                println!(
                    "# chunk @{} tid {} events {} t {}..{}",
                    c.offset,
                    c.header.tid,
                    c.header.events,
                    c.header.first_time,
                    c.header.last_time
                );
                for ev in c.events() {
                    println!("{ev:?}");
                }
            }
            Err(e) => {
                println!("# stopped: {e}");
                break;
            }
        }
    }
}

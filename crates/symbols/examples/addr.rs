//! Symbolizes file addresses of one ELF file: `addr FILE ADDR...` (hex).
use object::{Object, ObjectSegment};
use trapline_symbols::Symbolizer;
use trapline_trace::{ModuleInfo, Segment};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let info = ModuleInfo {
        id: 1,
        path: args[1].clone(),
        build_id: file.build_id().ok().flatten().unwrap_or_default().to_vec(),
        bias: 0,
        segments: file
            .segments()
            .map(|s| Segment {
                start: s.address(),
                end: s.address() + s.size(),
                flags: 0,
            })
            .collect(),
    };
    let mut symbolizer = Symbolizer::new();
    symbolizer.add_module(&info);
    for a in &args[2..] {
        let address = u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap();
        let t = std::time::Instant::now();
        for f in symbolizer.symbolize(address) {
            println!("{f:?}");
        }
        eprintln!("{:?}", t.elapsed());
    }
    for w in symbolizer.warnings() {
        eprintln!("warning: {w}");
    }
}

//! pprof's profile format (github.com/google/pprof, proto/profile.proto):
//! a gzipped protocol buffer that `go tool pprof`, Pyroscope and Grafana
//! read. The messages are declared here with prost's derive, field numbers
//! as in profile.proto, instead of generated from the .proto file (which
//! would need protoc at build time).
//!
//! Stacks become locations, one per distinct address; the frames inlined at
//! an address become that location's lines, innermost first, the function
//! they were inlined into last, as the format says.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;
use trapline_analysis::heap_profile::HeapProfile;
use trapline_analysis::profile::ProfileReport;
use trapline_analysis::report::{FrameReport, ProcessReport};

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(uint64, tag = "3")]
    address: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// Builds a profile: interns strings, functions, mappings and locations.
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    mappings: HashMap<String, u64>,
    /// Locations by address; a location at address 0 (the agent's
    /// pseudo-frame) by its function.
    locations: HashMap<(u64, String), u64>,
}

impl Builder {
    /// A profile of `process`: its executable is the first mapping, which
    /// `go tool pprof` names as the profile's "File" (it was whichever
    /// module the first stack met, often libc.so.6).
    fn new(process: &ProcessReport) -> Builder {
        let mut b = Builder {
            profile: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
        };
        b.string("");
        b.mapping(process.executable.as_deref());
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, frame: &FrameReport) -> u64 {
        let name = frame
            .function
            .clone()
            .unwrap_or_else(|| format!("{:#x}", frame.address));
        let file = frame.file.clone().unwrap_or_default();
        if let Some(&id) = self.functions.get(&(name.clone(), file.clone())) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (n, f) = (self.string(&name), self.string(&file));
        self.profile.function.push(Function {
            id,
            name: n,
            system_name: n,
            filename: f,
        });
        self.functions.insert((name, file), id);
        id
    }

    fn mapping(&mut self, module: Option<&str>) -> u64 {
        let Some(module) = module else {
            return 0;
        };
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(module);
        self.profile.mapping.push(Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mappings.insert(module.to_owned(), id);
        id
    }

    /// The location ids of a stack, innermost first: one per address, the
    /// frames inlined there its lines.
    fn locations(&mut self, frames: &[FrameReport]) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut at = 0;
        while at < frames.len() {
            // Frames inlined at one address, then the frame they are in.
            let mut end = at;
            while end + 1 < frames.len() && frames[end].inlined {
                end += 1;
            }
            let group = &frames[at..=end];
            at = end + 1;
            let last = &group[group.len() - 1];
            let key = (
                last.address,
                if last.address == 0 {
                    last.function.clone().unwrap_or_default()
                } else {
                    String::new()
                },
            );
            if let Some(&id) = self.locations.get(&key) {
                ids.push(id);
                continue;
            }
            let line = group
                .iter()
                .map(|f| Line {
                    function_id: self.function(f),
                    line: f.line.map_or(0, i64::from),
                })
                .collect();
            let id = self.profile.location.len() as u64 + 1;
            let mapping_id = self.mapping(last.module.as_deref());
            self.profile.location.push(Location {
                id,
                mapping_id,
                address: last.address,
                line,
            });
            self.locations.insert(key, id);
            ids.push(id);
        }
        ids
    }

    fn sample(&mut self, frames: &[FrameReport], value: Vec<i64>, labels: Vec<Label>) {
        let location_id = self.locations(frames);
        self.profile.sample.push(Sample {
            location_id,
            value,
            label: labels,
        });
    }

    fn comment(&mut self, text: &str) {
        let i = self.string(text);
        self.profile.comment.push(i);
    }

    /// The profile, encoded and gzipped.
    fn finish(self, out: &mut impl Write) -> std::io::Result<()> {
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&self.profile.encode_to_vec())?;
        gz.finish()?;
        Ok(())
    }
}

fn program(p: &ProcessReport) -> String {
    let name = p.executable.as_deref().unwrap_or("an unknown program");
    match p.pid {
        Some(pid) => format!("{name} (pid {pid})"),
        None => name.to_owned(),
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Writes a heap profile: `alloc_objects`, `alloc_space` (everything
/// allocated over the run), `inuse_objects` and `inuse_space` (live at the
/// end), `inuse_space` shown first, as Go's heap profiles are.
pub fn write_heap(p: &HeapProfile, out: &mut impl Write) -> std::io::Result<()> {
    let mut b = Builder::new(&p.process);
    b.profile.sample_type = vec![
        b.value_type("alloc_objects", "count"),
        b.value_type("alloc_space", "bytes"),
        b.value_type("inuse_objects", "count"),
        b.value_type("inuse_space", "bytes"),
    ];
    b.profile.default_sample_type = b.string("inuse_space");
    b.profile.period_type = Some(b.value_type("space", "bytes"));
    b.profile.time_nanos = clamp(p.process.start_unix_ns.unwrap_or(0));
    b.profile.duration_nanos = clamp(p.duration_ns);
    b.comment(&format!("trapline heap profile of {}", program(&p.process)));
    match p.live_at_seconds {
        Some(at) => b.comment(&format!("inuse values from the heap replay at {at} s")),
        None => b.comment(&format!(
            "inuse values from the {}",
            p.live_source.replace('_', " ")
        )),
    }
    if let Some(s) = &p.sampling {
        b.profile.period = clamp(s.mean_bytes);
        b.comment(&s.export_note());
    }
    let at = p.live_at_seconds.is_some();
    for site in &p.sites {
        b.sample(
            &site.frames,
            vec![
                clamp(site.allocations),
                clamp(site.allocated_bytes),
                clamp(if at {
                    site.live_at_blocks
                } else {
                    site.live_blocks
                }),
                clamp(if at {
                    site.live_at_bytes
                } else {
                    site.live_bytes
                }),
            ],
            Vec::new(),
        );
    }
    b.finish(out)
}

/// Writes a CPU profile: `samples` and `cpu` nanoseconds per stack, each
/// sample labelled with its thread.
pub fn write_cpu(p: &ProfileReport, out: &mut impl Write) -> std::io::Result<()> {
    let mut b = Builder::new(&p.process);
    b.profile.sample_type = vec![
        b.value_type("samples", "count"),
        b.value_type("cpu", "nanoseconds"),
    ];
    b.profile.period_type = Some(b.value_type("cpu", "nanoseconds"));
    let period = 1_000_000_000 / i64::from(p.rate_hz.max(1));
    b.profile.period = period;
    b.profile.time_nanos = clamp(p.process.start_unix_ns.unwrap_or(0));
    b.comment(&format!("trapline CPU profile of {}", program(&p.process)));
    let thread = b.string("thread");
    for s in &p.stacks {
        let label = Label {
            key: thread,
            str: 0,
            num: i64::from(s.tid),
        };
        b.sample(
            &s.frames,
            vec![clamp(s.samples), clamp(s.samples).saturating_mul(period)],
            vec![label],
        );
    }
    b.finish(out)
}

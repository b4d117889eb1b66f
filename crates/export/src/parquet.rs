//! Parquet tables of a trace, for DuckDB, DataFusion, Spark and the rest:
//! `events.parquet` (one row per allocation, release, error, lock event and
//! CPU sample, in time order) and `stacks.parquet` (one row per frame of
//! every stack those rows name, symbolized). Written by arrow-rs in
//! batches, so a trace of any length needs the memory of one batch and of
//! the stack ids seen.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, StringBuilder, UInt32Builder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use trapline_analysis::index::{MergedEvents, TraceIndex};
use trapline_trace::{Event, LockEvent};

/// Rows per batch.
const BATCH: usize = 65_536;

fn events_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("time_ns", DataType::UInt64, false),
        Field::new("thread", DataType::UInt32, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("address", DataType::UInt64, true),
        Field::new("size", DataType::UInt64, true),
        Field::new("stack_id", DataType::UInt32, true),
        Field::new("function", DataType::Utf8, true),
        Field::new("old_address", DataType::UInt64, true),
    ]))
}

fn stacks_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("stack_id", DataType::UInt32, false),
        Field::new("frame_index", DataType::UInt32, false),
        Field::new("address", DataType::UInt64, false),
        Field::new("function", DataType::Utf8, true),
        Field::new("file", DataType::Utf8, true),
        Field::new("line", DataType::UInt32, true),
        Field::new("inlined", DataType::Boolean, false),
        Field::new("module", DataType::Utf8, true),
    ]))
}

/// One row of the events table.
struct Row<'a> {
    kind: &'a str,
    address: Option<u64>,
    size: Option<u64>,
    stack: Option<u32>,
    function: Option<&'a str>,
    old_address: Option<u64>,
}

#[derive(Default)]
struct EventRows {
    time: UInt64Builder,
    thread: UInt32Builder,
    kind: StringBuilder,
    address: UInt64Builder,
    size: UInt64Builder,
    stack: UInt32Builder,
    function: StringBuilder,
    old_address: UInt64Builder,
    len: usize,
}

impl EventRows {
    fn push(&mut self, time: u64, thread: u32, r: Row<'_>) {
        self.time.append_value(time);
        self.thread.append_value(thread);
        self.kind.append_value(r.kind);
        self.address.append_option(r.address);
        self.size.append_option(r.size);
        self.stack.append_option(r.stack.filter(|&s| s != 0));
        self.function.append_option(r.function);
        self.old_address.append_option(r.old_address);
        self.len += 1;
    }

    fn batch(&mut self) -> Result<RecordBatch, String> {
        self.len = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.time.finish()),
            Arc::new(self.thread.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.address.finish()),
            Arc::new(self.size.finish()),
            Arc::new(self.stack.finish()),
            Arc::new(self.function.finish()),
            Arc::new(self.old_address.finish()),
        ];
        RecordBatch::try_new(events_schema(), columns).map_err(|e| e.to_string())
    }
}

/// The row of an event, if it is one of the table's.
fn row(ev: &Event) -> Option<Row<'_>> {
    let r = |kind, address, size, stack, function| Row {
        kind,
        address,
        size,
        stack,
        function,
        old_address: None,
    };
    Some(match *ev {
        Event::Alloc {
            addr,
            size,
            func,
            stack,
            ..
        } => r(
            "alloc",
            Some(addr),
            Some(size),
            Some(stack),
            Some(func.name()),
        ),
        Event::Free {
            addr, func, stack, ..
        } => r("free", Some(addr), None, Some(stack), Some(func.name())),
        Event::Realloc {
            old_addr,
            new_addr,
            size,
            func,
            stack,
            ..
        } => Row {
            old_address: Some(old_addr),
            ..r(
                "realloc",
                Some(new_addr),
                Some(size),
                Some(stack),
                Some(func.name()),
            )
        },
        Event::Error {
            kind,
            func,
            addr,
            stack,
            ..
        } => r(
            kind.name(),
            Some(addr),
            None,
            Some(stack),
            Some(func.name()),
        ),
        Event::AllocFailed {
            func, size, stack, ..
        } => r(
            "alloc_failed",
            None,
            Some(size),
            Some(stack),
            Some(func.name()),
        ),
        Event::Sample { stack, .. } => r("cpu_sample", None, None, Some(stack), None),
        Event::Lock(LockEvent::Acquire { addr, stack, .. }) => {
            r("lock_acquire", Some(addr), None, Some(stack), None)
        }
        Event::Lock(LockEvent::Release { addr, stack, .. }) => {
            r("lock_release", Some(addr), None, Some(stack), None)
        }
        Event::Lock(LockEvent::Request { addr, stack, .. }) => {
            r("lock_wait", Some(addr), None, Some(stack), None)
        }
        _ => return None,
    })
}

fn create(dir: &Path, name: &str) -> Result<File, String> {
    let path = dir.join(name);
    File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

fn writer(file: File, schema: Arc<Schema>) -> Result<ArrowWriter<File>, String> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| e.to_string())
}

/// Writes `events.parquet` and `stacks.parquet` of the trace into `dir`.
pub fn write<R: Read + Seek>(input: &mut R, dir: &Path) -> Result<(u64, u64), String> {
    let index = TraceIndex::build(input).map_err(|e| e.to_string())?;
    let mut events = writer(create(dir, "events.parquet")?, events_schema())?;
    let mut rows = EventRows::default();
    let mut stacks_used: HashSet<u32> = HashSet::new();
    let mut written = 0u64;
    for m in MergedEvents::new(input, &index) {
        let Some(r) = row(&m.event) else { continue };
        if let Some(s) = r.stack.filter(|&s| s != 0) {
            stacks_used.insert(s);
        }
        rows.push(m.time, m.tid, r);
        written += 1;
        if rows.len == BATCH {
            events.write(&rows.batch()?).map_err(|e| e.to_string())?;
        }
    }
    if rows.len > 0 {
        events.write(&rows.batch()?).map_err(|e| e.to_string())?;
    }
    events.close().map_err(|e| e.to_string())?;

    let mut ids: Vec<u32> = stacks_used.into_iter().collect();
    ids.sort_unstable();
    input.rewind().map_err(|e| e.to_string())?;
    let named =
        trapline_analysis::report::symbolized_stacks(input, &ids).map_err(|e| e.to_string())?;
    let mut stacks = writer(create(dir, "stacks.parquet")?, stacks_schema())?;
    let (mut id_col, mut index_col) = (UInt32Builder::new(), UInt32Builder::new());
    let (mut addr, mut func, mut file) = (
        UInt64Builder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    let (mut line, mut inlined, mut module) = (
        UInt32Builder::new(),
        BooleanBuilder::new(),
        StringBuilder::new(),
    );
    let mut frames = 0u64;
    for id in &ids {
        for (i, f) in named.get(id).into_iter().flatten().enumerate() {
            id_col.append_value(*id);
            index_col.append_value(i as u32);
            addr.append_value(f.address);
            func.append_option(f.function.as_deref());
            file.append_option(f.file.as_deref());
            line.append_option(f.line);
            inlined.append_value(f.inlined);
            module.append_option(f.module.as_deref());
            frames += 1;
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(id_col.finish()),
        Arc::new(index_col.finish()),
        Arc::new(addr.finish()),
        Arc::new(func.finish()),
        Arc::new(file.finish()),
        Arc::new(line.finish()),
        Arc::new(inlined.finish()),
        Arc::new(module.finish()),
    ];
    let batch = RecordBatch::try_new(stacks_schema(), columns).map_err(|e| e.to_string())?;
    stacks.write(&batch).map_err(|e| e.to_string())?;
    stacks.close().map_err(|e| e.to_string())?;
    Ok((written, frames))
}

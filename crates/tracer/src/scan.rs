//! The exit scan of a stopped program, read from outside: the agent's
//! reachability decision (`trapline_reach`) over the program's memory read
//! through `/proc/PID/mem`, with the stopped threads' registers and stacks
//! as the agent's world stop gives them.

use std::time::Instant;

use trapline_reach::maps::{merge, Mapping, Special};
use trapline_reach::{roots, BlockIndex, Marker, PlainBuffers, Span};
use trapline_trace::{Event, ScanStats, ScanTrigger};

use crate::remote::Memory;
use trapline_outside::heap::{Block, Heap};

/// A stopped thread as the scan needs it: where its live stack starts, its
/// registers (roots) and its TLS base.
pub struct StoppedThread {
    pub sp: u64,
    pub registers: Vec<u64>,
    pub fs_base: u64,
}

/// The program's own facts the scan needs.
pub struct Layout {
    /// The program's writable segments (its data and bss, where glibc's
    /// `main_arena` is in a static link).
    pub data: Vec<(u64, u64)>,
    /// Memory never read: the recorder's stub page.
    pub excluded: Vec<(u64, u64)>,
    /// Bytes of the initial thread's static TLS, below its thread pointer.
    pub tls_size: u64,
    /// The program's RELRO data: read-only once started, so not in the
    /// plan's writable mappings, but written with pointers to blocks at
    /// the start (a static C library's link map and search paths).
    pub relro: Option<(u64, u64)>,
    /// The allocator's teardown functions (`elf::Program::allocator_teardown`).
    pub allocator_teardown: Vec<(u64, u64)>,
    /// The C library's loader functions (`elf::Program::loader_code`),
    /// sorted: their blocks are roots.
    pub loader_code: Vec<(u64, u64)>,
}

#[derive(Clone, Copy)]
struct Live {
    addr: u64,
    block: Block,
}

impl Span for Live {
    const EMPTY: Live = Live {
        addr: 0,
        block: Block {
            size: 0,
            func: trapline_trace::AllocFn::Malloc,
            stack: 0,
        },
    };
    fn addr(&self) -> u64 {
        self.addr
    }
    fn size(&self) -> u64 {
        self.block.size
    }
}

/// Block contents, read from the stopped process.
struct Remote<'a> {
    mem: &'a Memory,
}

/// Bytes read at a time.
const READ_CHUNK: u64 = 1 << 16;

impl Remote<'_> {
    /// Calls `f` with each aligned word of `[lo, hi)` that can be read
    /// (where a large read fails, page by page; a page that cannot be read
    /// is skipped); the bytes read.
    fn words(&self, lo: u64, hi: u64, mut f: impl FnMut(u64)) -> u64 {
        const PAGE: u64 = 4096;
        let (mut at, hi) = ((lo + 7) & !7, hi & !7);
        let mut read = 0;
        let mut buf = Vec::new();
        let mut paging_until = 0;
        while at < hi {
            let limit = if at < paging_until { PAGE } else { READ_CHUNK };
            let len = (limit - at % limit).min(hi - at);
            buf.resize(len as usize, 0);
            if self.mem.read(at, &mut buf) {
                for w in buf.chunks_exact(8) {
                    f(u64::from_le_bytes(w.try_into().expect("8 bytes")));
                }
                read += len;
                at += len;
            } else if limit > PAGE {
                paging_until = at + len;
            } else {
                at += len;
            }
        }
        read
    }
}

impl trapline_reach::Memory for Remote<'_> {
    fn block_words(&self, lo: u64, hi: u64, _readable: bool, f: impl FnMut(u64)) {
        self.words(lo, hi, f);
    }
    fn block_word(&self, a: u64) -> u64 {
        self.mem.word(a).unwrap_or(0)
    }
}

/// Judges every live block; the scan's events (`ScanBegin`, a `ScanBlock`
/// per block in address order, `ScanEnd`) and the blocks' count and bytes.
pub fn judge(
    pid: u32,
    mem: &Memory,
    heap: &Heap,
    threads: &[StoppedThread],
    ended_stacks: &[u64],
    layout: &Layout,
    time: u64,
) -> Result<(Vec<Event>, u64, u64), String> {
    let started = Instant::now();
    let maps: Vec<Mapping> = std::fs::read(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read the program's mappings: {e}"))?
        .split(|&b| b == b'\n')
        .filter_map(trapline_reach::maps::parse)
        .collect();
    let live: Vec<Live> = heap
        .live
        .iter()
        .map(|(&addr, &block)| Live { addr, block })
        .collect();
    let index = BlockIndex::new(live, &PlainBuffers).ok_or("no memory for the scan")?;
    let remote = Remote { mem };
    let mut readable = ranges(&maps, |m| m.readable && m.kind != Special::Kernel);
    merge(&mut readable);
    let mut rodata = ranges(&maps, |m| {
        m.readable && !m.writable && !m.executable && m.file
    });
    merge(&mut rodata);
    let mut excluded = layout.excluded.clone();
    // The stacks of ended threads (glibc caches them), where no live
    // thread runs: what is left there, their TLS included, is dead, as it
    // is to the agent, which never sees an ended thread's stack again.
    for &sp in ended_stacks {
        let Some(i) = trapline_reach::maps::containing(&maps, sp) else {
            continue;
        };
        let m = &maps[i];
        if !threads.iter().any(|t| t.sp >= m.start && t.sp < m.end) {
            excluded.push((m.start, m.end));
        }
    }
    let mut read = |lo: u64, hi: u64, f: &mut dyn FnMut(u64)| remote.words(lo, hi, f);
    if let Some(m) = trapline_reach::arena::find_main_arena(layout.data.clone(), &mut read) {
        excluded.push(trapline_reach::arena::extent(m));
    }
    merge(&mut excluded);
    let stack_starts: Vec<u64> = threads.iter().map(|t| t.sp).collect();
    let next_block = |lo, hi| index.first_block_in(lo, hi);
    let mut read_word = |a: u64| mem.word(a);
    let mut root_ranges = Vec::with_capacity(4 * maps.len() + excluded.len() + 16);
    roots::plan(
        roots::Plan {
            maps: &maps,
            excluded: &excluded,
            stack_starts: &stack_starts,
            next_block: &next_block,
            read_word: &mut read_word,
            everything: false,
        },
        &mut root_ranges,
    );
    // A static program's initial thread keeps its TLS and thread
    // descriptor in the break area, which is malloc's [heap] to the plan
    // (its TLS variables can hold the only pointer to a block).
    if let Some(main) = threads.first().filter(|t| t.fs_base != 0) {
        let in_heap = maps
            .iter()
            .any(|m| m.kind == Special::Heap && main.fs_base >= m.start && main.fs_base < m.end);
        if in_heap {
            const THREAD_DESCRIPTOR: u64 = 4096;
            root_ranges.push((
                main.fs_base.saturating_sub(layout.tls_size) & !7,
                main.fs_base + THREAD_DESCRIPTOR,
            ));
        }
    }
    root_ranges.extend(layout.relro);
    let mut marker = Marker::new(&index, &readable, &rodata, &remote, &PlainBuffers)
        .ok_or("no memory for the scan")?;
    // The loader's own blocks (DTVs, link maps) are roots, as the agent
    // counts ld.so's: a thread's DTV is pointed to 16 bytes in.
    for (i, b) in index.blocks.iter().enumerate() {
        if crate::elf::range_of(&layout.loader_code, heap.innermost(b.block.stack)).is_some() {
            marker.root_block(i);
        }
    }
    let mut root_bytes = 0;
    for t in threads {
        for &r in &t.registers {
            marker.word(r, true);
        }
        root_bytes += 8 * t.registers.len() as u64;
    }
    for &(lo, hi) in &root_ranges {
        root_bytes += remote.words(lo, hi, |w| marker.word(w, true));
        marker.propagate();
    }
    marker.propagate();
    marker.cliques();
    let scan = 1;
    let mut events = vec![Event::ScanBegin {
        time,
        scan,
        trigger: ScanTrigger::Exit,
    }];
    let mut bytes = 0;
    for (i, b) in index.blocks.iter().enumerate() {
        bytes += b.block.size;
        events.push(Event::ScanBlock {
            scan,
            addr: b.addr,
            size: b.block.size,
            func: b.block.func,
            stack: b.block.stack,
            verdict: marker.verdict(i),
            indirect_bytes: marker.indirect[i],
        });
    }
    events.push(Event::ScanEnd {
        scan,
        stats: ScanStats {
            pause_ns: started.elapsed().as_nanos() as u64,
            threads: threads.len() as u32,
            threads_not_suspended: 0,
            root_bytes,
            blocks: index.len() as u64,
            bytes,
            mappings_not_excluded: 0,
        },
    });
    Ok((events, index.len() as u64, bytes))
}

fn ranges(maps: &[Mapping], keep: impl Fn(&Mapping) -> bool) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| keep(m))
        .map(|m| (m.start, m.end))
        .collect()
}

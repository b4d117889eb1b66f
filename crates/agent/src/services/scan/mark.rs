//! Marking and classification, with memcheck's semantics.
//!
//! States: unreached, possible (reached, but an interior pointer or a
//! possibly-lost block lies on every chain), reachable (a chain of start
//! pointers from a root), indirect (unreached, pointed to by an unreached
//! block). A block is pushed on the mark stack each time its state rises, and
//! its contents are scanned with the state it has when popped: a reachable
//! block passes "reachable" through start pointers and "possible" through
//! interior ones; a possible block passes only "possible". After the roots,
//! the unreached blocks are taken in address order: each still unreached
//! one leads a clique; every unreached block it reaches (through any pointer)
//! becomes indirect and its size (plus what it led before, if it was an
//! earlier leader) goes to the leader's indirect bytes. The leaders left are
//! definitely lost.
//!
//! memcheck's interior-pointer heuristics (its default, `all`) make some
//! interior pointers count as start pointers: to the characters of an old
//! std::string (`length, capacity, refcount, chars`), to the second word of
//! a block whose first word is the length of the rest (length64) or a
//! plausible element count (new[] of objects with a destructor), and to an
//! aligned word inside a block that holds a vtable pointer when the block's
//! first word is one too (multiple inheritance). A vtable pointer here is a
//! word pointing into read-only, non-executable file-backed memory.

use super::blocks::BlockIndex;
use trapline_trace::Verdict;

const UNREACHED: u8 = 0;
// The state array starts as zeroed memory (`Marker::new`).
const _: () = assert!(UNREACHED == 0);
const POSSIBLE: u8 = 1;
const REACHABLE: u8 = 2;
const INDIRECT: u8 = 3;

/// Reads memory that may be unmapped (roots): process_vm_readv on the own
/// process fails on an unmapped or unreadable page instead of faulting.
///
/// Under a seccomp filter that system call may be forbidden (sandboxes that
/// list what a program may call seldom include it): a filter that kills on
/// it killed programs at their exit scan; one that fails it would have read
/// no roots and called every block lost. So a filtered process reads through its own
/// `/proc/thread-self/mem` with `pread`, which any filter that lets the
/// program read files allows; the kernel answers an unmapped page with an
/// error there too.
pub struct SafeReader {
    buf: Vec<u64>,
    pid: i32,
    /// `/proc/thread-self/mem`, open when the process is under a seccomp filter.
    mem: Option<std::fs::File>,
    /// Which pages of large ranges hold data (`populated`).
    pages: Pagemap,
}

/// Ranges at least this large are read only where their pages hold data.
pub const SPARSE_FROM: u64 = 4 << 20;

/// `/proc/thread-self/pagemap`: one word per page, whose bit 63 says the
/// page is in memory and bit 62 that it is in swap. A page with neither
/// was never written (anonymous memory reads as zeroes there), so it holds
/// no pointer. A program that mapped 16 GiB of address space for a sparse
/// array and touched two pages made the exit scan read all of it, 5 s
/// (a terabyte would have been minutes), and map the zero page into every
/// page table entry.
///
/// Since Linux 6.7 the `PAGEMAP_SCAN` ioctl returns the runs themselves,
/// skipping unmapped page tables whole: a terabyte of reservation took 0.8 s
/// to read word by word from the pagemap, and the ioctl also leaves out
/// pages that only map the shared zero page (read, never written).
struct Pagemap {
    file: Option<std::fs::File>,
    entries: Vec<u64>,
    /// `PAGEMAP_SCAN` worked, or was not tried yet.
    scan_supported: bool,
}

/// `struct pm_scan_arg` of linux/fs.h.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region` of linux/fs.h.
#[repr(C)]
#[derive(Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;

impl Pagemap {
    /// No pagemap (an empty vector allocates nothing).
    const fn none() -> Pagemap {
        Pagemap {
            file: None,
            entries: Vec::new(),
            scan_supported: false,
        }
    }

    fn open() -> Pagemap {
        Pagemap {
            file: std::fs::File::open("/proc/thread-self/pagemap").ok(),
            entries: vec![0u64; 8192],
            scan_supported: true,
        }
    }

    /// `populated` through `PAGEMAP_SCAN`: false (nothing called) when the
    /// kernel lacks it.
    fn scan(&mut self, lo: u64, hi: u64, f: &mut impl FnMut(u64, u64)) -> bool {
        use std::os::fd::AsRawFd;
        let Some(file) = &self.file else {
            return false;
        };
        const PAGE: u64 = 4096;
        let mut regions = [PageRegion {
            start: 0,
            end: 0,
            categories: 0,
        }; 256];
        let mut start = lo & !(PAGE - 1);
        let end = hi.div_ceil(PAGE) * PAGE;
        while start < end {
            let mut arg = PmScanArg {
                size: core::mem::size_of::<PmScanArg>() as u64,
                flags: 0,
                start,
                end,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                // In memory or in swap, and not the shared zero page.
                category_inverted: PAGE_IS_PFNZERO,
                category_mask: PAGE_IS_PFNZERO,
                category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len`
            // regions into `regions` and `walk_end` into `arg`.
            let n = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
            if n < 0 {
                if start == lo & !(PAGE - 1) {
                    self.scan_supported = false;
                    return false;
                }
                // Failed part way: the rest whole.
                f(start.max(lo), hi);
                return true;
            }
            for r in &regions[..n as usize] {
                f(r.start.max(lo), r.end.min(hi));
            }
            if arg.walk_end <= start {
                break;
            }
            start = arg.walk_end;
        }
        true
    }

    /// Whether the page of `addr` may hold data (anonymous memory).
    fn holds_data(&mut self, addr: u64) -> bool {
        let mut any = false;
        self.populated(addr, addr + 8, |_, _| any = true);
        any
    }

    /// Calls `f(a, b)` for each run of pages of `[lo, hi)` (anonymous
    /// memory) that are in memory or in swap, clipped to the range; the
    /// whole range when the pagemap cannot be read.
    fn populated(&mut self, lo: u64, hi: u64, mut f: impl FnMut(u64, u64)) {
        use std::os::unix::fs::FileExt;
        const PAGE: u64 = 4096;
        const HOLDS_DATA: u64 = 3 << 62;
        if self.file.is_none() {
            return f(lo, hi);
        }
        if self.scan_supported && self.scan(lo, hi, &mut f) {
            return;
        }
        let Some(file) = &self.file else {
            return f(lo, hi);
        };
        let (first, end) = (lo / PAGE, hi.div_ceil(PAGE));
        let mut run: Option<u64> = None;
        let mut page = first;
        while page < end {
            let n = (end - page).min(self.entries.len() as u64) as usize;
            // SAFETY: plain words viewed as their bytes, within the vector.
            let bytes = unsafe {
                core::slice::from_raw_parts_mut(self.entries.as_mut_ptr().cast::<u8>(), n * 8)
            };
            let got = file.read_at(bytes, page * 8).unwrap_or(0) / 8;
            if got == 0 {
                // Unreadable from here: the rest as it is.
                let from = run.unwrap_or(page * PAGE);
                return f(from.max(lo), hi);
            }
            for (i, &entry) in self.entries[..got].iter().enumerate() {
                let at = (page + i as u64) * PAGE;
                match (entry & HOLDS_DATA != 0, run) {
                    (true, None) => run = Some(at),
                    (false, Some(start)) => {
                        f(start.max(lo), at.min(hi));
                        run = None;
                    }
                    _ => {}
                }
            }
            page += got as u64;
        }
        if let Some(start) = run {
            f(start.max(lo), hi);
        }
    }
}

impl SafeReader {
    /// `None`: the process is under a seccomp filter and its memory file
    /// cannot be opened; no root could be read safely, so there is no scan.
    pub fn new() -> Option<SafeReader> {
        let mem = if under_seccomp_filter() {
            // The thread's: once the main thread has left through
            // pthread_exit, the process's names a zombie without memory.
            Some(std::fs::File::open("/proc/thread-self/mem").ok()?)
        } else {
            None
        };
        Some(SafeReader {
            buf: vec![0u64; 8192],
            // The calling thread's tid, not the pid: once the main thread
            // has left through pthread_exit, the pid names its zombie, which
            // has no memory to read (every read failed: no roots).
            pid: crate::platform::sys::gettid() as i32,
            mem,
            pages: Pagemap::open(),
        })
    }

    /// Whether the word at `addr` (anonymous memory) may be other than 0:
    /// reading a never-written page maps the zero page, and page tables,
    /// for nothing.
    pub fn may_hold_data(&mut self, addr: u64) -> bool {
        self.pages.holds_data(addr)
    }

    /// Calls `f(a, b)` for the parts of anonymous memory `[lo, hi)` that
    /// may hold data: all of it when small, else its pages in memory or
    /// swap (`Pagemap`).
    ///
    /// It runs while the world is stopped, so it allocates nothing: the
    /// pagemap is lent out of `self` for the walk (an empty one stands in).
    pub fn populated(&mut self, lo: u64, hi: u64, mut f: impl FnMut(&mut Self, u64, u64)) {
        if hi.saturating_sub(lo) < SPARSE_FROM {
            return f(self, lo, hi);
        }
        let mut pages = core::mem::replace(&mut self.pages, Pagemap::none());
        pages.populated(lo, hi, |a, b| f(self, a, b));
        self.pages = pages;
    }

    /// Reads up to `want` bytes at `at` into `buf`: the count, or 0 or less
    /// when the first page cannot be read.
    fn read(&mut self, at: u64, want: usize) -> isize {
        if let Some(mem) = &self.mem {
            use std::os::unix::fs::FileExt;
            // SAFETY: `buf` has room for `want` bytes, which are plain words.
            let bytes = unsafe {
                core::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), want)
            };
            return mem.read_at(bytes, at).map_or(-1, |n| n as isize);
        }
        let local = libc::iovec {
            iov_base: self.buf.as_mut_ptr().cast(),
            iov_len: want,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: want,
        };
        // SAFETY: reads our own memory into `buf`, which has room for `want` bytes.
        unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) }
    }

    /// Calls `f` with each aligned word of `[lo, hi)` that can be read;
    /// returns the number of bytes read.
    pub fn for_each_word(&mut self, lo: u64, hi: u64, mut f: impl FnMut(u64)) -> u64 {
        let mut a = (lo + 7) & !7;
        let hi = hi & !7;
        let mut read = 0;
        while a < hi {
            let want = (hi - a).min((self.buf.len() * 8) as u64) as usize;
            let n = self.read(a, want);
            if n <= 0 {
                // Skip the page that failed.
                a = (a & !4095) + 4096;
                continue;
            }
            let n = n as usize & !7;
            for &w in &self.buf[..n / 8] {
                f(w);
            }
            read += n as u64;
            a += n as u64;
        }
        read
    }
}

/// Whether a seccomp filter limits the process's system calls (`Seccomp: 2`
/// in /proc/self/status; filters are inherited and never removed).
fn under_seccomp_filter() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .is_some_and(|mode| mode.trim() != "0")
    })
}

/// Marking state of one scan.
pub struct Marker<'a> {
    index: &'a BlockIndex,
    state: Vec<u8>,
    stack: Vec<u32>,
    /// Indirect bytes of each clique leader.
    pub indirect: Vec<u64>,
    /// Readable memory, sorted and merged: block contents outside it are
    /// read through the safe reader.
    readable: &'a [(u64, u64)],
    last_readable: usize,
    /// Read-only, non-executable file-backed memory (where vtables live).
    rodata: &'a [(u64, u64)],
}

impl<'a> Marker<'a> {
    /// Allocates everything marking needs (called before threads stop);
    /// `None` when the memory is refused.
    pub fn new(
        index: &'a BlockIndex,
        readable: &'a [(u64, u64)],
        rodata: &'a [(u64, u64)],
    ) -> Option<Marker<'a>> {
        let n = index.len();
        // Zeroed memory from fresh mappings, touched as marking goes: on
        // huge pages, so that scattered writes (cliques' indirect bytes) do
        // not fault in a 4 KiB page each. UNREACHED is 0.
        let state = super::blocks::try_zeroed_vec::<u8>(n)?;
        let indirect = super::blocks::try_zeroed_vec::<u64>(n)?;
        Some(Marker {
            index,
            state,
            // Each block is pushed at most twice while marking from the roots
            // (unreached -> possible -> reachable) and once per clique pass,
            // so the stack never grows while threads are stopped.
            stack: super::blocks::try_with_capacity(2 * n + 1)?,
            indirect,
            readable,
            last_readable: 0,
            rodata,
        })
    }

    #[inline]
    fn push(&mut self, i: usize) {
        debug_assert!(self.stack.len() < self.stack.capacity());
        self.stack.push(i as u32);
    }

    /// A word found in a root, or in a block whose state is `definite` or not.
    #[inline]
    pub fn word(&mut self, w: u64, prior_definite: bool) {
        let Some((i, at_start)) = self.index.find(w) else {
            return;
        };
        let s = self.state[i];
        // The heuristics matter only where a start pointer would make a difference.
        let start_like = at_start || (prior_definite && s != REACHABLE && self.heuristic(i, w));
        if start_like && prior_definite && s != REACHABLE {
            self.state[i] = REACHABLE;
            self.push(i);
        } else if s == UNREACHED {
            self.state[i] = POSSIBLE;
            self.push(i);
        }
    }

    /// Whether memcheck's heuristics take interior pointer `w` into block `i`
    /// for a start pointer (see the module comment).
    fn heuristic(&mut self, i: usize, w: u64) -> bool {
        const WORD: u64 = 8;
        let b = self.index.blocks[i];
        let (start, size) = (b.addr(), b.size());
        if size < WORD || !self.is_readable(start, start + size) {
            return false;
        }
        // SAFETY (each read): an aligned word inside a live, readable block,
        // while every thread that could free it is stopped.
        let word_at = |a: u64| -> Option<u64> {
            (a.is_multiple_of(WORD) && a >= start && a + WORD <= start + size)
                .then(|| unsafe { *(a as *const u64) })
        };
        let first = word_at(start).unwrap_or(0);
        if w == start + 3 * WORD {
            if let Some(capacity) = word_at(start + WORD) {
                if 3 * WORD + capacity.wrapping_add(1) == size && first <= capacity {
                    return true; // std::string
                }
            }
        }
        if w == start + WORD
            && first > 0
            && (size - WORD == first || (size - WORD).is_multiple_of(first))
        {
            return true; // length64, new[]
        }
        let is_vtable = |v: u64| {
            v.is_multiple_of(WORD) && v >= 4096 && {
                let k = self.rodata.partition_point(|r| r.0 <= v);
                k > 0 && v < self.rodata[k - 1].1
            }
        };
        word_at(w).is_some_and(|inner| is_vtable(inner) && is_vtable(first)) // multiple inheritance
    }

    /// Marks a block as reachable from a root (the loader's own allocations).
    pub fn root_block(&mut self, i: usize) {
        if self.state[i] != REACHABLE {
            self.state[i] = REACHABLE;
            self.push(i);
        }
    }

    fn is_readable(&mut self, lo: u64, hi: u64) -> bool {
        if let Some(&(a, b)) = self.readable.get(self.last_readable) {
            if lo >= a && hi <= b {
                return true;
            }
        }
        let k = self.readable.partition_point(|r| r.0 <= lo);
        match k.checked_sub(1) {
            Some(j) if hi <= self.readable[j].1 => {
                self.last_readable = j;
                true
            }
            _ => false,
        }
    }

    /// Calls `f` on every aligned word inside block `i`.
    fn block_words(
        &mut self,
        i: usize,
        reader: &mut SafeReader,
        mut f: impl FnMut(&mut Self, u64),
    ) {
        let b = self.index.blocks[i];
        let (lo, hi) = (b.addr(), b.addr() + (b.size() & !7));
        if hi <= lo {
            return;
        }
        if self.is_readable(lo, hi) {
            // A large block (a mmapped chunk) may be mostly untouched.
            reader.populated(lo, hi, |_, a, b| {
                // SAFETY: part of a live block of the program, inside
                // readable mappings, while every thread that could free it
                // is stopped.
                let words =
                    unsafe { core::slice::from_raw_parts(a as *const u64, ((b - a) / 8) as usize) };
                for &w in words {
                    f(self, w);
                }
            });
        } else {
            // Rare (part of the block is not readable): copy it through the reader.
            reader.for_each_word(lo, hi, |w| f(self, w));
        }
    }

    /// Follows everything pushed so far.
    pub fn propagate(&mut self, reader: &mut SafeReader) {
        while let Some(i) = self.stack.pop() {
            let definite = self.state[i as usize] == REACHABLE;
            self.block_words(i as usize, reader, |m, w| m.word(w, definite));
        }
    }

    /// Groups the unreached blocks into cliques (see the module comment).
    pub fn cliques(&mut self, reader: &mut SafeReader) {
        for leader in 0..self.state.len() {
            if self.state[leader] != UNREACHED {
                continue;
            }
            self.push(leader);
            while let Some(j) = self.stack.pop() {
                self.block_words(j as usize, reader, |m, w| {
                    if let Some((k, _)) = m.index.find(w) {
                        if m.state[k] == UNREACHED && k != leader {
                            m.push(k);
                            m.indirect[leader] += m.index.blocks[k].size() + m.indirect[k];
                            m.indirect[k] = 0;
                            m.state[k] = INDIRECT;
                        }
                    }
                });
            }
        }
    }

    /// The verdict on block `i` (after `cliques`).
    pub fn verdict(&self, i: usize) -> Verdict {
        match self.state[i] {
            REACHABLE => Verdict::StillReachable,
            POSSIBLE => Verdict::PossiblyLost,
            INDIRECT => Verdict::IndirectlyLost,
            _ => Verdict::DefinitelyLost,
        }
    }
}

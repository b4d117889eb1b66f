//! Reading the process's own memory for the scan: the safe reader (roots,
//! which may be unmapped) and block contents in place, as the shared
//! marking (`trapline_reach::mark`) asks for them.

use core::cell::RefCell;

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
        self.for_each_chunk(lo, hi, |_, words| words.iter().for_each(|&w| f(w)))
    }

    /// As `for_each_word`, calling `f(address, words)` with each run of
    /// words read at once.
    pub fn for_each_chunk(&mut self, lo: u64, hi: u64, mut f: impl FnMut(u64, &[u64])) -> u64 {
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
            f(a, &self.buf[..n / 8]);
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

/// The live blocks' memory, read in place (the world is stopped), and the
/// safe reader for what may not be mapped.
pub struct LiveMemory {
    pub reader: RefCell<SafeReader>,
}

impl trapline_reach::Memory for LiveMemory {
    fn block_words(&self, lo: u64, hi: u64, readable: bool, mut f: impl FnMut(u64)) {
        let mut reader = self.reader.borrow_mut();
        if readable {
            // A large block (a mmapped chunk) may be mostly untouched.
            reader.populated(lo, hi, |_, a, b| {
                // SAFETY: part of a live block of the program, inside
                // readable mappings, while every thread that could free it
                // is stopped.
                let words =
                    unsafe { core::slice::from_raw_parts(a as *const u64, ((b - a) / 8) as usize) };
                for &w in words {
                    f(w);
                }
            });
        } else {
            // Rare (part of the block is not readable): copy it through the reader.
            reader.for_each_word(lo, hi, f);
        }
    }

    fn block_word(&self, a: u64) -> u64 {
        // SAFETY: an aligned word inside a live, readable block (the
        // caller's contract), while every thread that could free it is
        // stopped.
        unsafe { *(a as *const u64) }
    }
}

//! A process's mappings, as /proc/PID/maps lists them.

/// One line of /proc/self/maps.
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Backed by a file (an inode), as opposed to anonymous memory.
    pub file: bool,
    pub kind: Special,
}

/// Mappings the scan treats specially by name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Special {
    None,
    /// `[heap]`: malloc's main arena.
    Heap,
    /// `[stack]`: the main thread's stack.
    Stack,
    /// `[vvar]`, `[vdso]`, `[vsyscall]`, device files: never read.
    Kernel,
}

fn hex(s: &[u8]) -> Option<u64> {
    u64::from_str_radix(core::str::from_utf8(s).ok()?, 16).ok()
}

/// One line of /proc/PID/maps.
pub fn parse(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or(b"");
    let dash = range.iter().position(|&b| b == b'-')?;
    let kind = match path {
        b"[heap]" => Special::Heap,
        b"[stack]" => Special::Stack,
        b"[vvar]" | b"[vvar_vclock]" | b"[vdso]" | b"[vsyscall]" => Special::Kernel,
        // Device memory may have side effects when read (GPU, frame buffers).
        p if p.starts_with(b"/dev/")
            && !p.starts_with(b"/dev/zero")
            && !p.starts_with(b"/dev/shm/") =>
        {
            Special::Kernel
        }
        _ => Special::None,
    };
    Some(Mapping {
        start: hex(&range[..dash])?,
        end: hex(&range[dash + 1..])?,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        file: inode != b"0",
        kind,
    })
}

/// Index of the mapping containing `addr` (mappings are sorted by address).
pub fn containing(maps: &[Mapping], addr: u64) -> Option<usize> {
    let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
    (addr < maps[i].end).then_some(i)
}

/// Sorts ranges and merges overlapping ones, in place.
pub fn merge(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable();
    let mut w = 0;
    for r in 0..ranges.len() {
        let (a, b) = ranges[r];
        if w > 0 && a <= ranges[w - 1].1 {
            ranges[w - 1].1 = ranges[w - 1].1.max(b);
        } else {
            ranges[w] = (a, b);
            w += 1;
        }
    }
    ranges.truncate(w);
}

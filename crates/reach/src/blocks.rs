//! The live blocks of one scan, sorted by address, and the lookup that turns
//! a word into the block it points into.
//!
//! Blocks are grouped into regions of nearby blocks (a gap of more than
//! `REGION_GAP` starts a new one: arenas, mmapped chunks). Each region has a
//! table giving, per granule (a power of two from 16 bytes, chosen so that a
//! region has about one granule per block), the index of the first block
//! starting at or after it, so a lookup is: range check, binary search among
//! the few regions, two table reads, and a search among the one or two
//! blocks of the granule.

/// A live block as the index needs it.
pub trait Span: Copy {
    /// A placeholder (scratch space of a sort).
    const EMPTY: Self;
    fn addr(&self) -> u64;
    /// The block's requested size.
    fn size(&self) -> u64;
}

/// Where the scan's large buffers come from: fallibly (`None` when memory
/// is refused), so that a scan can give way instead of failing its
/// process, and, in the agent, on huge pages.
pub trait Buffers {
    /// An empty vector with room for `n` elements.
    fn with_capacity<T>(&self, n: usize) -> Option<Vec<T>>;
    /// `n` copies of `value`.
    fn filled<T: Copy>(&self, n: usize, value: T) -> Option<Vec<T>>;
    /// `n` zeroed elements, untouched until written where possible.
    fn zeroed<T: Copy + Default>(&self, n: usize) -> Option<Vec<T>>;
}

/// Buffers from the global allocator, fallibly.
pub struct PlainBuffers;

impl Buffers for PlainBuffers {
    fn with_capacity<T>(&self, n: usize) -> Option<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).ok()?;
        Some(v)
    }
    fn filled<T: Copy>(&self, n: usize, value: T) -> Option<Vec<T>> {
        let mut v = self.with_capacity(n)?;
        v.resize(n, value);
        Some(v)
    }
    fn zeroed<T: Copy + Default>(&self, n: usize) -> Option<Vec<T>> {
        self.filled(n, T::default())
    }
}

/// A gap between blocks larger than this starts a new region.
const REGION_GAP: u64 = 1 << 20;
/// Granules are at least 16 bytes and grow until a region has about one
/// granule per block (two 8-byte aligned blocks may share one: the lookup
/// searches the granule's blocks).
const MIN_GRANULE_SHIFT: u32 = 4;

struct Region {
    lo: u64,
    hi: u64,
    /// Index of the region's first block.
    first: u32,
    shift: u32,
    /// Offset of the region's granule table in `BlockIndex::granules`.
    table: usize,
}

/// The sorted live blocks and their lookup tables.
pub struct BlockIndex<B: Span> {
    pub blocks: Vec<B>,
    regions: Vec<Region>,
    granules: Vec<u32>,
    lo: u64,
    hi: u64,
}

impl<B: Span> BlockIndex<B> {
    /// Sorts `blocks` (a copy of the live table) and builds the tables;
    /// `None` when the memory for them is refused.
    pub fn new(mut blocks: Vec<B>, buffers: &impl Buffers) -> Option<BlockIndex<B>> {
        radix_sort(&mut blocks, buffers)?;
        let start = |k: usize| blocks[k].addr();
        let mut regions = Vec::new();
        // About one entry per block: reserved up front, on huge pages.
        let mut granules = buffers.with_capacity(2 * blocks.len() + 64)?;
        let mut i = 0;
        while i < blocks.len() {
            let first = i;
            let mut hi = end(&blocks[i]);
            i += 1;
            while i < blocks.len() && start(i) <= hi.saturating_add(REGION_GAP) {
                hi = hi.max(end(&blocks[i]));
                i += 1;
            }
            let lo = start(first);
            // Keep a region's table near its block count, whatever its span.
            let count = (i - first) as u64;
            let mut shift = MIN_GRANULE_SHIFT;
            while (hi - lo) >> shift > count + 16 {
                shift += 1;
            }
            let n = ((hi - lo) >> shift) as usize + 1;
            let table = granules.len();
            let mut k = first;
            for g in 0..=n {
                let base = lo + ((g as u64) << shift);
                while k < i && start(k) < base {
                    k += 1;
                }
                granules.push(k as u32);
            }
            regions.push(Region {
                lo,
                hi,
                first: first as u32,
                shift,
                table,
            });
        }
        let lo = regions.first().map_or(u64::MAX, |r| r.lo);
        let hi = regions.iter().map(|r| r.hi).max().unwrap_or(0);
        Some(BlockIndex {
            blocks,
            regions,
            granules,
            lo,
            hi,
        })
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The block `w` points into, and whether it points to its start.
    /// Memcheck's rule: a block of size n is pointed into by `start..start+n`;
    /// a block of size 0 only by its start.
    #[inline]
    pub fn find(&self, w: u64) -> Option<(usize, bool)> {
        if w < self.lo || w > self.hi {
            return None;
        }
        let r = self.regions.partition_point(|r| r.lo <= w);
        let region = &self.regions[r.checked_sub(1)?];
        if w > region.hi {
            return None;
        }
        let g = region.table + ((w - region.lo) >> region.shift) as usize;
        let (a, b) = (self.granules[g] as usize, self.granules[g + 1] as usize);
        // The last block starting at or before w: inside this granule, or
        // the one before it (which may span into the granule).
        // One array for the search and the size: a lookup misses the cache
        // once here, not twice.
        let k = a + self.blocks[a..b].partition_point(|b| b.addr() <= w);
        let i = k.checked_sub(1)?;
        if i < region.first as usize {
            return None;
        }
        let start = self.blocks[i].addr();
        let size = self.blocks[i].size();
        if w - start < size || w == start {
            Some((i, w == start))
        } else {
            None
        }
    }

    /// The extent of the first block starting in `[lo, hi)`, with glibc's
    /// chunk header (16 bytes) before it: memory that is malloc's, never a root.
    pub fn first_block_in(&self, lo: u64, hi: u64) -> Option<(u64, u64)> {
        self.first_extent_in(lo, hi, 16)
    }

    /// The first block starting in `[lo, hi)`, and the `before` bytes
    /// before it, clipped to `lo`. Production mode's scan cuts out the
    /// blocks alone: under jemalloc the 16 bytes before one are the end of
    /// the region before it, which may be a block of the program's the
    /// agent did not sample.
    pub fn first_extent_in(&self, lo: u64, hi: u64, before: u64) -> Option<(u64, u64)> {
        let k = self.blocks.partition_point(|b| b.addr() < lo);
        let start = self.blocks.get(k).map(Span::addr).filter(|&s| s < hi)?;
        Some((
            start.saturating_sub(before).max(lo),
            start + self.blocks[k].size().max(1),
        ))
    }
}

/// Which pages (4 KiB) of the address space hold part of a block, hashed
/// into a bitmap of at least 16 bits per page: a word that points into no
/// marked page points into no block, one load from a table that stays in
/// the cache. Production mode's scan reads the whole heap for pointers to a
/// few sampled blocks: most words there point elsewhere in the heap, and
/// `BlockIndex::find` (regions, granules) costs several times more.
pub struct Sieve {
    bits: Vec<u64>,
    /// 64 minus log2 of the bitmap's bits.
    shift: u32,
}

/// log2 of the bytes of a sieve's chunk: with a sampled block every 512
/// KiB of heap, 64 KiB chunks let one heap pointer in 8 through to `find`.
const SIEVE_CHUNK_SHIFT: u32 = 12;

impl Sieve {
    /// The sieve of `index`'s blocks; `None` when its memory is refused.
    pub fn new<B: Span>(index: &BlockIndex<B>, buffers: &impl Buffers) -> Option<Sieve> {
        let chunks_of = |b: &B| {
            (b.addr() >> SIEVE_CHUNK_SHIFT)
                ..=((b.addr() + b.size().max(1) - 1) >> SIEVE_CHUNK_SHIFT)
        };
        let chunks: u64 = index
            .blocks
            .iter()
            .map(|b| chunks_of(b).count() as u64)
            .sum();
        let log = (chunks.max(1) * 16)
            .next_power_of_two()
            .trailing_zeros()
            .clamp(12, 26);
        let mut sieve = Sieve {
            bits: buffers.zeroed::<u64>(1 << (log - 6))?,
            shift: 64 - log,
        };
        for b in &index.blocks {
            for chunk in chunks_of(b) {
                let bit = sieve.bit(chunk);
                sieve.bits[bit >> 6] |= 1 << (bit & 63);
            }
        }
        Some(sieve)
    }

    #[inline(always)]
    fn bit(&self, chunk: u64) -> usize {
        (chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Whether `w` may point into a block (false: it points into none).
    #[inline(always)]
    pub fn may_point(&self, w: u64) -> bool {
        let bit = self.bit(w >> SIEVE_CHUNK_SHIFT);
        self.bits[bit >> 6] & (1 << (bit & 63)) != 0
    }
}

/// Sorts blocks by address: LSD radix sort on `addr >> 3` (45 bits: blocks
/// are 8-byte aligned at least), 12 bits per pass, skipping the passes whose digit is the same in every block
/// (heap addresses share their high bits). Several times faster than a
/// comparison sort at ten million blocks, which matters: the program is
/// stopped meanwhile.
/// `None`: no memory for the scratch copy (`blocks` unchanged).
fn radix_sort<B: Span>(blocks: &mut Vec<B>, buffers: &impl Buffers) -> Option<()> {
    const BITS: u64 = 12;
    const BUCKETS: usize = 1 << BITS;
    const PASSES: usize = 4;
    let n = blocks.len();
    if n < 1 << 16 {
        blocks.sort_unstable_by_key(Span::addr);
        return Some(());
    }
    let digit =
        |p: &B, pass: usize| (((p.addr() >> 3) >> (BITS * pass as u64)) as usize) & (BUCKETS - 1);
    let mut counts = vec![[0usize; BUCKETS]; PASSES];
    for p in blocks.iter() {
        for (pass, c) in counts.iter_mut().enumerate() {
            c[digit(p, pass)] += 1;
        }
    }
    let mut other = buffers.filled(n, B::EMPTY)?;
    let (mut src, mut dst) = (blocks, &mut other);
    let mut swapped = false;
    // On the heap: the scan may run on a small stack.
    let mut next = vec![0usize; BUCKETS];
    for (pass, c) in counts.iter().enumerate() {
        if c.contains(&n) {
            continue;
        }
        let mut sum = 0;
        for (slot, &count) in next.iter_mut().zip(c) {
            *slot = sum;
            sum += count;
        }
        for p in src.iter() {
            let d = digit(p, pass);
            dst[next[d]] = *p;
            next[d] += 1;
        }
        core::mem::swap(&mut src, &mut dst);
        swapped = !swapped;
    }
    if swapped {
        // The sorted data is in `other`: hand that buffer over.
        core::mem::swap(src, dst);
    }
    Some(())
}

fn end<B: Span>(b: &B) -> u64 {
    b.addr() + b.size().max(1) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    struct B(u64, u64);

    impl Span for B {
        const EMPTY: B = B(0, 0);
        fn addr(&self) -> u64 {
            self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
    }

    /// Every word into a block passes the sieve; most others do not.
    #[test]
    fn the_sieve_lets_every_pointer_into_a_block_through() {
        let blocks: Vec<B> = (0..500u64)
            .map(|i| B(0x5555_0000_0000 + i * (512 << 10), 100 + i * 37))
            .chain([B(0x7f00_0000_1010, 4 << 20), B(0x7f10_0000_0000, 0)])
            .collect();
        let index = BlockIndex::new(blocks.clone(), &PlainBuffers).unwrap();
        let sieve = Sieve::new(&index, &PlainBuffers).unwrap();
        for b in &blocks {
            for w in [b.0, b.0 + b.1 / 2, b.0 + b.1.max(1) - 1] {
                assert!(sieve.may_point(w), "{w:#x}");
            }
        }
        let through = (0..100_000u64)
            .map(|i| 0x5555_0000_0000 + i * 4096 * 3 + 8)
            .filter(|&w| sieve.may_point(w) && index.find(w).is_none())
            .count();
        assert!(through < 10_000, "{through} of 100,000 let through");
    }
}

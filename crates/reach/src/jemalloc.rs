//! jemalloc's records of its extents, told from the program's pointers.
//!
//! A scan that reads jemalloc's own mappings (production mode's: the blocks
//! it does not know lie there too) finds jemalloc's `edata_t` of every
//! extent it handed out, whose second word, `e_addr`, is the address of a
//! large block (after the cache-oblivious offset) or of a slab's first
//! region. Read as a pointer, it made every such block referenced. A record
//! is three words, 64-byte aligned (128 in 5.3): `e_bits`, `e_addr`,
//! `e_size_esn`. Left out is only a start pointer to a known block whose
//! words around it are that block's record in jemalloc 5.3's layout:
//! active (state 0), its size class's index, its slab bit, and its
//! extent's size (a large block's usable size plus the cache-oblivious
//! page, or without it; a slab's least common multiple of the page and
//! the region size). Another layout (jemalloc 5.2, other page sizes or
//! quanta) matches nothing: its records are then read as pointers, and
//! blocks are called referenced that may not be (missed, never false).

/// jemalloc's page (x86_64).
const PAGE: u64 = 4096;
/// log2 of jemalloc's quantum and of its size classes per doubling.
const LG_QUANTUM: u32 = 4;
const LG_NGROUP: u32 = 2;
/// The largest small size class (4 KiB pages): larger blocks are extents
/// of their own.
const SMALL_MAX: u64 = 14336;

/// `e_bits` fields (jemalloc 5.3: arena 0-11, slab 12, committed 13, pai
/// 14, zeroed 15, guarded 16, state 17-19, szind 20-27).
const SLAB_BIT: u32 = 12;
const STATE_SHIFT: u32 = 17;
const SZIND_SHIFT: u32 = 20;

/// jemalloc's usable size and size-class index for a request of `size`
/// bytes (`sz_s2u` and `sz_size2index`: one tiny class of 8 bytes, then
/// four classes per doubling).
pub fn size_class(size: u64) -> (u64, u32) {
    if size <= 8 {
        return (8, 0);
    }
    let x = 63 - ((size << 1) - 1).leading_zeros();
    let lg_delta = if x < LG_NGROUP + LG_QUANTUM + 1 {
        LG_QUANTUM
    } else {
        x - LG_NGROUP - 1
    };
    let delta = 1u64 << lg_delta;
    let usable = (size + delta - 1) & !(delta - 1);
    let group = x.saturating_sub(LG_NGROUP + LG_QUANTUM) << LG_NGROUP;
    let within = (((size - 1) & !(delta - 1)) >> lg_delta) as u32 & ((1 << LG_NGROUP) - 1);
    (usable, 1 + group + within)
}

/// Whether `bits` and `size_esn`, the words before and after a start
/// pointer to a block of `block_size` bytes, make jemalloc's record of the
/// block's extent.
pub fn is_extent_record(bits: u64, size_esn: u64, block_size: u64) -> bool {
    let (usable, index) = size_class(block_size);
    let slab = usable <= SMALL_MAX;
    if (bits >> STATE_SHIFT) & 7 != 0
        || (bits >> SZIND_SHIFT) & 0xff != u64::from(index)
        || (bits >> SLAB_BIT) & 1 != u64::from(slab)
    {
        return false;
    }
    let extent = size_esn & !(PAGE - 1);
    if slab {
        let gcd = 1u64 << usable.trailing_zeros().min(PAGE.trailing_zeros());
        extent == PAGE / gcd * usable
    } else {
        extent == usable + PAGE || extent == usable
    }
}

/// Calls `out` with each word of `words` (read from address `at`) that
/// `may_point` lets through, but the `e_addr` of a record of a known
/// block's extent: `block_size(w)` is the size of the known block that
/// starts at `w`, if one does. A word whose neighbours are not both in
/// `words` is passed on.
pub fn for_each_pointer(
    at: u64,
    words: &[u64],
    may_point: impl Fn(u64) -> bool,
    block_size: impl Fn(u64) -> Option<u64>,
    mut out: impl FnMut(u64),
) {
    for (i, &w) in words.iter().enumerate() {
        if !may_point(w) {
            continue;
        }
        let record = (at + 8 * i as u64) % 64 == 8
            && i > 0
            && i + 1 < words.len()
            && block_size(w).is_some_and(|size| is_extent_record(words[i - 1], words[i + 1], size));
        if !record {
            out(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size classes and records of blocks a jemalloc 5.3.0 process
    /// showed (libjemalloc2 of Debian, LD_PRELOADed): e_bits, then
    /// e_size_esn, around each block's address.
    #[test]
    fn records_of_a_jemalloc_process_are_recognized() {
        assert_eq!(size_class(8), (8, 0));
        assert_eq!(size_class(16), (16, 1));
        assert_eq!(size_class(48), (48, 3));
        assert_eq!(size_class(80), (80, 5));
        assert_eq!(size_class(8192), (8192, 32));
        assert_eq!(size_class(20000), (20480, 37));
        assert_eq!(size_class(4 << 20), (4 << 20, 68));
        for (size, bits, size_esn) in [
            (4u64 << 20, 0x1000_0440_a000u64, 0x40_1000u64),
            (20_000, 0x250_a000, 0x6000),
            (1 << 20, 0x3c0_a000, 0x10_1000),
            (100_000, 0x2f0_a000, 0x1_d000),
            // A slab of one 8 KiB region.
            (8192, 0x200_b000, 0x2000),
        ] {
            assert!(is_extent_record(bits, size_esn, size), "{size}");
            // Another size, or a program's (pointer, length) pair.
            assert!(!is_extent_record(bits, size_esn, size * 2), "{size}");
            assert!(!is_extent_record(0, size, size), "{size}");
            assert!(!is_extent_record(bits | 1 << 18, size_esn, size), "{size}");
        }
    }

    #[test]
    fn only_the_record_word_is_left_out() {
        let block = 0x7f00_0000_0f00u64;
        let size = 4u64 << 20;
        let known = |w: u64| (w == block).then_some(size);
        let words = [
            0x1000_0440_a000,
            block,
            0x40_1000,
            0,
            0,
            0,
            0,
            0,
            // The program's pointer at an address a record may have, with
            // other words around it.
            7,
            block,
            size,
        ];
        let mut passed = Vec::new();
        for_each_pointer(0x1000, &words, |w| w != 0, known, |w| passed.push(w));
        assert_eq!(passed, [0x1000_0440_a000, 0x40_1000, 7, block, size]);
        // At the edge of what was read, a record cannot be told: passed on.
        let mut passed = Vec::new();
        for_each_pointer(0x1008, &words[1..3], |_| true, known, |w| passed.push(w));
        assert_eq!(passed, [block, 0x40_1000]);
    }
}

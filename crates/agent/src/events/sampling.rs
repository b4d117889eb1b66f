//! Sampled recording (`--sample`): which allocations take a full stack.
//!
//! Sample points fall on the bytes a thread allocates as a Poisson process
//! of mean `sample_bytes` (tcmalloc's and jemalloc's heap profilers do the
//! same): a countdown of bytes drawn from the exponential distribution, and
//! an allocation whose bytes reach the next point takes its full stack. A
//! block of `size` bytes is then sampled with probability
//! `1 - exp(-size / sample_bytes)` whatever came before it (the process is
//! memoryless), which is what makes the analysis's estimates unbiased.
//!
//! Every other allocation is still recorded, with a stack that holds only
//! its caller: one return address, kept in a small per-thread cache in
//! front of the shared stack table, so it costs neither an unwind nor a
//! lock.

/// Threads whose sampler drew its first gap, for seeded runs.
static SEEDED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Caller-only stack ids cached per thread (direct-mapped by address).
const CALLER_SLOTS: usize = 64;

#[derive(Clone, Copy, Default)]
struct CallerSlot {
    caller: u64,
    id: u32,
    /// The trace generation that holds the id's definition.
    gen: u32,
}

/// A thread's sampling state.
pub struct Sampler {
    /// Bytes left before the next sample point (drawn at first use).
    left: i64,
    drawn: bool,
    /// xorshift64* state (never 0).
    rng: u64,
    callers: [CallerSlot; CALLER_SLOTS],
}

impl Sampler {
    pub fn new(seed: u64) -> Sampler {
        Sampler {
            left: 0,
            drawn: false,
            rng: seed | 1,
            callers: [CallerSlot::default(); CALLER_SLOTS],
        }
    }

    /// Counts down an allocation of `size` bytes that stays short of the
    /// next sample point; false (nothing counted) if it would reach it.
    #[inline(always)]
    pub fn passes(&mut self, size: u64) -> bool {
        let left = self.left - (size as i64).max(1);
        if left <= 0 {
            return false;
        }
        self.left = left;
        true
    }

    /// Takes back what `passes` counted down for `size` bytes.
    pub fn unpass(&mut self, size: u64) {
        self.left += (size as i64).max(1);
    }

    /// Whether an allocation of `size` bytes takes its full stack, with
    /// `mean` bytes between sample points.
    #[inline(always)]
    pub fn takes_stack(&mut self, size: u64, mean: u64) -> bool {
        // A zero-byte block covers no byte: sampled with probability 0
        // by the rule, but counted as one byte so such blocks are seen.
        // (No block has 2^63 bytes: the cast keeps every size.)
        self.left -= (size as i64).max(1);
        if self.left > 0 {
            return false;
        }
        self.next_point(mean)
    }

    /// The allocation just counted reached `left` 0: it is sampled, and the
    /// next gap starts at its end. Except at a thread's first allocation,
    /// which only starts the process (its first block is no likelier than
    /// any other): the first point falls a gap from that block's start.
    #[cold]
    fn next_point(&mut self, mean: u64) -> bool {
        if !self.drawn {
            self.drawn = true;
            self.seed_if_asked();
            self.left += self.gap(mean);
            if self.left > 0 {
                return false;
            }
        }
        self.left = self.gap(mean);
        true
    }

    /// With a seed given (`env::SAMPLE_SEED`), the n-th thread to sample
    /// draws from the seed's n-th stream: a single-threaded program samples
    /// the same blocks in every run.
    fn seed_if_asked(&mut self) {
        let seed = crate::config::OPTIONS
            .sample_seed
            .load(core::sync::atomic::Ordering::Relaxed);
        if seed != 0 {
            let n = SEEDED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            self.rng = (seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        }
    }

    /// An exponential gap of mean `mean` bytes, at least one byte.
    fn gap(&mut self, mean: u64) -> i64 {
        // 53 random bits in (0, 1].
        let u = ((self.next_random() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let gap = -u.ln() * mean as f64;
        (gap as i64).max(1)
    }

    /// The caller-only stack id cached for `caller` in trace generation
    /// `gen`.
    #[inline(always)]
    pub fn cached_caller(&self, caller: u64, gen: u32) -> Option<u32> {
        let slot = &self.callers[(caller >> 2) as usize % CALLER_SLOTS];
        (slot.caller == caller && slot.gen == gen).then_some(slot.id)
    }

    /// Caches `id` as `caller`'s caller-only stack, defined in generation
    /// `gen` of the trace.
    pub fn cache_caller(&mut self, caller: u64, id: u32, gen: u32) {
        self.callers[(caller >> 2) as usize % CALLER_SLOTS] = CallerSlot { caller, id, gen };
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of one size are sampled at `1 - exp(-size / mean)`.
    #[test]
    fn blocks_are_sampled_at_the_poisson_rate() {
        let mean = 512 << 10;
        for (size, blocks) in [(4096u64, 400_000u64), (256 << 10, 40_000), (4 << 20, 5_000)] {
            let mut s = Sampler::new(0x1234_5678);
            let sampled = (0..blocks).filter(|_| s.takes_stack(size, mean)).count() as f64;
            let p = 1.0 - (-(size as f64) / mean as f64).exp();
            let expected = p * blocks as f64;
            let sd = (blocks as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (sampled - expected).abs() < 5.0 * sd,
                "size {size}: {sampled} sampled, {expected:.0} expected (sd {sd:.1})"
            );
        }
    }
}

//! Estimates from a sampled trace (`trapline run --sample`).
//!
//! A sampled trace holds every block, but only the blocks the agent's
//! Poisson process over bytes picked carry their full stack; a block of
//! `size` bytes was picked with probability `p = 1 - exp(-size / mean)`.
//! The blocks of one full stack are then estimated, like any sample with
//! known inclusion probabilities, by the Horvitz-Thompson estimator: each
//! sampled block stands for `1 / p` blocks and `size / p` bytes. Its
//! variance, estimated from the sample itself, is the sum of
//! `(1 - p) / p^2 * size^2`; the error reported is 1.96 standard
//! deviations (a 95% interval under the normal approximation, too narrow
//! when a stack has only a few samples).

use serde::Serialize;

/// How the agent sampled: the mean bytes between sample points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub mean_bytes: u64,
}

impl Sampling {
    /// The probability that a block of `size` bytes took its full stack
    /// (a zero-byte block counts as one byte, as the agent counts it).
    pub fn probability(&self, size: u64) -> f64 {
        trapline_trace::event::sample_probability(size, self.mean_bytes)
    }

    /// The bytes a sampled block of `size` bytes stands for.
    pub fn weight_bytes(&self, size: u64) -> u64 {
        (size.max(1) as f64 / self.probability(size)).round() as u64
    }
}

/// The running sums of one group's estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EstimateSum {
    bytes: f64,
    blocks: f64,
    bytes_variance: f64,
    sampled_blocks: u64,
}

impl EstimateSum {
    /// Adds a sampled block of `size` bytes.
    pub fn add(&mut self, sampling: Sampling, size: u64) {
        let p = sampling.probability(size);
        let s = size as f64;
        self.bytes += s / p;
        self.blocks += 1.0 / p;
        self.bytes_variance += (1.0 - p) / (p * p) * s * s;
        self.sampled_blocks += 1;
    }

    /// The estimate of the group's blocks, sampled or not.
    pub fn estimate(&self) -> Estimate {
        Estimate {
            bytes: self.bytes.round() as u64,
            bytes_error: (1.96 * self.bytes_variance.sqrt()).round() as u64,
            blocks: self.blocks.round() as u64,
            sampled_blocks: self.sampled_blocks,
        }
    }
}

/// What the blocks of one full stack come to, estimated from those of
/// them that were sampled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Estimate {
    /// Estimated bytes of every block with this stack.
    pub bytes: u64,
    /// Half the width of the 95% interval around `bytes`.
    pub bytes_error: u64,
    /// Estimated blocks with this stack.
    pub blocks: u64,
    /// Blocks actually recorded with this stack (the sample).
    pub sampled_blocks: u64,
}

impl Estimate {
    /// The estimate of two groups together (their errors add in
    /// quadrature: the groups' samples are independent).
    pub fn plus(self, other: Estimate) -> Estimate {
        let error = (self.bytes_error as f64).hypot(other.bytes_error as f64);
        Estimate {
            bytes: self.bytes + other.bytes,
            bytes_error: error.round() as u64,
            blocks: self.blocks + other.blocks,
            sampled_blocks: self.sampled_blocks + other.sampled_blocks,
        }
    }
}

/// How a sampled trace was recorded, for the reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SamplingReport {
    /// The mean bytes allocated between two blocks that took a full stack.
    pub mean_bytes: u64,
    /// Production mode (`--production`): only the sampled blocks were
    /// recorded; absent for `--sample`, which records every block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub production: Option<ProductionReport>,
}

/// What production mode counted of every call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProductionReport {
    /// Calls of allocating functions, every one.
    pub allocation_calls: u64,
    /// Calls of releasing functions, every one.
    pub release_calls: u64,
    /// Bytes the allocating calls asked for.
    pub bytes_allocated: u64,
    /// Allocations recorded, with their full stack (the sample).
    pub sampled_allocations: u64,
    /// Per allocator function called: its calls and the bytes they asked
    /// for, exact.
    pub calls: Vec<CallCount>,
}

impl SamplingReport {
    /// One line for an export (pprof comments, the HTML report's note)
    /// saying how the values were sampled.
    pub fn export_note(&self) -> String {
        match &self.production {
            Some(prod) => format!(
                "production mode: {} ({} of {} allocation calls, one per {} bytes allocated on average); values are estimates of all blocks by stack",
                prod.share(|n| n.to_string()),
                prod.sampled_allocations,
                prod.allocation_calls,
                self.mean_bytes
            ),
            None => format!(
                "sampled recording: one full stack per {} bytes allocated on average; values are estimates",
                self.mean_bytes
            ),
        }
    }
}

impl ProductionReport {
    /// About one block in this many was sampled (0: none was).
    pub fn one_in(&self) -> u64 {
        self.allocation_calls
            .checked_div(self.sampled_allocations)
            .unwrap_or(0)
    }

    /// "about 1 block in N sampled" (N written by `number`), or that none
    /// was.
    pub fn share(&self, number: impl Fn(u64) -> String) -> String {
        match self.one_in() {
            0 => "no block sampled".to_owned(),
            n => format!("about 1 block in {} sampled", number(n)),
        }
    }
}

/// One allocator function's calls (`sampling.production.calls[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallCount {
    pub func: &'static str,
    pub calls: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampling a known population many times: the estimate's mean is the
    /// truth, and the stated 95% error covers it about 95% of the time.
    #[test]
    fn estimates_are_unbiased_and_their_errors_cover() {
        let sampling = Sampling {
            mean_bytes: 512 << 10,
        };
        let sizes: Vec<u64> = (0..20_000u64).map(|i| 64 + (i * 7919) % 8192).collect();
        let truth: u64 = sizes.iter().sum();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let (trials, mut covered, mut sum) = (400, 0, 0.0);
        for _ in 0..trials {
            let mut e = EstimateSum::default();
            for &s in &sizes {
                if uniform() < sampling.probability(s) {
                    e.add(sampling, s);
                }
            }
            let est = e.estimate();
            sum += est.bytes as f64;
            covered += u32::from(est.bytes.abs_diff(truth) <= est.bytes_error);
        }
        let mean = sum / f64::from(trials);
        assert!(
            (mean / truth as f64 - 1.0).abs() < 0.02,
            "mean {mean}, truth {truth}"
        );
        assert!(
            (360..=398).contains(&covered),
            "{covered} of {trials} covered"
        );
    }
}

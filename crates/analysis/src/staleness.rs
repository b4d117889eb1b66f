//! The staleness rule: a site whose watched blocks go untouched.
//!
//! A watcher (`trapline watch`) has the agent watch pages of old blocks of
//! suspect sites and learns which were accessed. A site is stale when at
//! least [`MIN_UNTOUCHED`] of its watched blocks went untouched for the
//! whole of the staleness time, and they are at least [`MIN_SHARE`] of its
//! watched blocks whose outcome is known (touched, or untouched that long).
//! Page granularity errs one way: an access to a neighbour on the same page
//! counts as an access, so a stale verdict is never caused by a neighbour.

use serde::Serialize;

/// Least untouched blocks for a stale verdict.
pub const MIN_UNTOUCHED: u64 = 4;
/// Least share of untouched blocks among those decided.
pub const MIN_SHARE: f64 = 0.9;

/// The evidence for (or against) a site's staleness.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Staleness {
    /// Blocks of the site whose pages were watched.
    pub watched_blocks: u64,
    /// Of those, blocks no access reached for the staleness time.
    pub untouched_blocks: u64,
    /// Blocks accessed while watched.
    pub touched_blocks: u64,
    /// The untouched blocks went untouched at least this long.
    pub untouched_seconds: f64,
    /// Seconds since the latest access to a watched block of the site (at
    /// the verdict's time), or null: none seen.
    pub last_access_seconds_ago: Option<f64>,
}

impl Staleness {
    /// Whether the evidence makes the site stale.
    pub fn is_stale(&self) -> bool {
        let decided = self.untouched_blocks + self.touched_blocks;
        self.untouched_blocks >= MIN_UNTOUCHED
            && decided > 0
            && self.untouched_blocks as f64 >= MIN_SHARE * decided as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(untouched: u64, touched: u64) -> Staleness {
        Staleness {
            watched_blocks: untouched + touched,
            untouched_blocks: untouched,
            touched_blocks: touched,
            untouched_seconds: 30.0,
            last_access_seconds_ago: None,
        }
    }

    /// Enough untouched blocks, few touched: stale; a site whose watched
    /// blocks are read is not, nor one with too little evidence.
    #[test]
    fn stale_needs_enough_untouched_blocks_and_few_touched() {
        assert!(s(4, 0).is_stale());
        assert!(s(90, 10).is_stale());
        assert!(!s(89, 11).is_stale());
        assert!(!s(3, 0).is_stale());
        assert!(!s(0, 40).is_stale());
    }
}

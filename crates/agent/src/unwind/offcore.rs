//! Measuring features for the one design left for the cc1 target (design.md
//! 14, "Unwinding on the writer's core"): a changed capture that copies the
//! new part of the stack for another core to unwind, instead of unwinding
//! it. Neither feature records correct stacks; both answer what such a
//! capture would cost the program's thread.
//!
//! - `offcore-probe` (with `capture-timing`): before each changed capture's
//!   real walk, time the copy it would make (find the innermost remembered
//!   frame above sp whose reads verify, copy the bytes from sp up to it),
//!   then compare with where the walk joined: could the other core have
//!   finished the walk from the copy and the remembered reads alone? Also
//!   simulates threads that know only the frames they walked themselves
//!   (no answer comes back from the other core): per copy limit, how many
//!   captures copy, how many bytes, how many must still walk.
//! - `offcore-sim`: the thread does what the design's thread would do and
//!   nothing more: copy when the copy is at most `SIM_LIMIT` bytes (and one
//!   remembered frame more), keeping only the verified frames as its
//!   remembered stack; walk otherwise. The id returned for a copy is the previous one, so the
//!   trace's stacks are wrong; what it is for is the wall time of the
//!   whole program.
//!
//! The copies go to a 4 MiB ring of the process, as a stand-in for the
//! trace buffers they would fill (the same stream of stores into lines not
//! in the cache). The ring is written without synchronisation: these
//! features measure single-threaded programs only.
//!
//! What they found (design.md 14): a copy is nearly always enough, but it
//! costs the thread about a third of the walk it replaces, and a prototype
//! of the other side (the branch `experiment/offcore-writer`) made cc1 no
//! faster than the agent.

use super::{frames_at_or_above, Bounds, StackCapture};
use crate::arch::StartRegs;
use core::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the ring the copies go to.
const RING: usize = 4 << 20;
/// A copy is cut to this (the ring keeps this much room past its end).
const MAX_COPY: usize = 64 << 10;
/// The start registers a copy would carry with it (pc, sp, bp, and where
/// it joins the remembered stack).
const COPY_HEADER: usize = 32;

struct Ring(core::cell::UnsafeCell<[u8; RING + MAX_COPY + COPY_HEADER]>);
// SAFETY: measuring only; see the module's comment (single-threaded use).
unsafe impl Sync for Ring {}
static BUF: Ring = Ring(core::cell::UnsafeCell::new(
    [0; RING + MAX_COPY + COPY_HEADER],
));
static AT: AtomicU64 = AtomicU64::new(0);

/// Copies the `len` bytes at `start.sp` (inside the thread's stack, cut to
/// `MAX_COPY`) to the ring, after a header with the start registers and
/// the join (`c`).
#[inline(always)]
fn copy(start: StartRegs, len: usize, c: usize) {
    let len = len.min(MAX_COPY);
    let at = AT.load(Ordering::Relaxed) as usize;
    let at = if at + COPY_HEADER + len > RING { 0 } else { at };
    let header = [start.pc, start.sp, start.bp, c as u64];
    // SAFETY: `at + COPY_HEADER + len` stays inside BUF (RING plus its
    // room); the source lies between the thread's sp and a remembered
    // frame's sp above it, or the stack's end, inside the stack. Single-
    // threaded use (module comment).
    unsafe {
        let dst = BUF.0.get().cast::<u8>().add(at);
        core::ptr::copy_nonoverlapping(header.as_ptr().cast::<u8>(), dst, COPY_HEADER);
        core::ptr::copy_nonoverlapping(start.sp as *const u8, dst.add(COPY_HEADER), len);
        // Nothing reads the ring: without this the compiler drops the
        // stores, and with them the cost being measured.
        core::hint::black_box(dst);
    }
    AT.store((at + COPY_HEADER + len) as u64, Ordering::Relaxed);
}

impl StackCapture {
    /// How many of the first `n` remembered frames (outermost first) the
    /// copy would keep: frames up to the innermost one whose sp lies above
    /// `start`'s and whose reads, with every outer frame's, still verify.
    /// 0 when none does.
    #[inline(always)]
    fn copy_join(&self, n: usize, start: StartRegs, bounds: Bounds) -> usize {
        let mut c = frames_at_or_above(&self.prev_sp[1..=n], start.sp);
        while c > 0 && self.prev_sp[c] <= start.sp {
            c -= 1;
        }
        while c > 0 && !self.verify(c, bounds) {
            c -= 1;
        }
        c
    }

    /// `offcore-sim`: a copy instead of a walk, when it is short enough.
    #[cfg(feature = "offcore-sim")]
    #[inline(always)]
    pub(super) fn copy_instead(
        &mut self,
        start: StartRegs,
        bounds: Bounds,
    ) -> Option<super::Captured> {
        const SIM_LIMIT: u64 = 1024;
        let c = self.copy_join(self.prev_n, start, bounds);
        // A remembered stack cut at its outer end is walked again when it
        // gets shallower (capture_changed): the thread's business.
        if c == 0 || self.prev_id == 0 || self.prev_truncated {
            return None;
        }
        let bytes = self.prev[c - 1].sp - start.sp;
        if bytes > SIM_LIMIT {
            return None;
        }
        // One remembered frame more: where the walk leaves the copy at its
        // join, its reads above it are nearly always that frame's (the probe
        // counts the rest).
        let end = match c {
            1 => self.prev[0].sp,
            _ => self.prev[c - 2].sp,
        };
        copy(start, (end - start.sp) as usize, c);
        // The thread would know only the frames it verified.
        self.prev_n = c;
        Some(super::Captured {
            id: self.prev_id,
            new: false,
            defined_in: 0,
        })
    }

    /// `offcore-probe`: the copy this capture would make, timed; returns the
    /// remembered frame it would join at.
    #[cfg(feature = "offcore-probe")]
    #[inline(never)]
    pub(super) fn probe_copy(&self, start: StartRegs, bounds: Bounds) -> Option<usize> {
        let started = crate::arch::cycles();
        let c = self.copy_join(self.prev_n, start, bounds);
        let top = match c {
            0 => bounds.hi,
            _ => self.prev[c - 1].sp,
        };
        let len = top.saturating_sub(start.sp) as usize;
        copy(start, len, c);
        super::timing::add(
            super::timing::PROBE,
            crate::arch::cycles().wrapping_sub(started),
        );
        BYTES.fetch_add(len.min(MAX_COPY) as u64, Ordering::Relaxed);
        c.checked_sub(1)
    }

    /// `offcore-probe`, after the real walk (`matched`: the remembered frame
    /// it joined at; `k` new frames in `scratch`), before the splice.
    #[cfg(feature = "offcore-probe")]
    pub(super) fn probe_outcome(
        &mut self,
        probe: Option<usize>,
        start: StartRegs,
        bounds: Bounds,
        matched: Option<usize>,
        k: usize,
    ) {
        let outcome = match (probe, matched) {
            (Some(p), Some(m)) if p == m => Outcome::Joined,
            // The walk left the copy at the frame it joined: it needed
            // bytes above the copy. The other core has them only when each
            // such read is one the remembered (verified) frames made.
            (Some(p), Some(m)) if m < p => {
                let known = &self.prev[..=p];
                let remembered = |read: &(u64, u64)| {
                    known.iter().any(|g| {
                        g.nreads != super::UNVERIFIABLE
                            && g.reads[..usize::from(g.nreads)].contains(read)
                    })
                };
                let covered_below = |top: u64| {
                    self.scratch[..k].iter().all(|f| {
                        f.nreads != super::UNVERIFIABLE
                            && f.reads[..usize::from(f.nreads)]
                                .iter()
                                .all(|r| r.0 < top || remembered(r))
                    })
                };
                if covered_below(self.prev[p].sp) {
                    Outcome::Covered
                } else if p > 0 && covered_below(self.prev[p - 1].sp) {
                    Outcome::ShortByAFrame
                } else {
                    Outcome::Short
                }
            }
            (Some(_), None) => Outcome::Short,
            (None, _) => Outcome::Whole,
            // Joined at the first frame itself (sp unchanged).
            (Some(_), Some(_)) => Outcome::AtTop,
        };
        OUTCOMES[outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.simulate(start, bounds, matched, k);
    }

    /// Per copy limit, a thread that knows only what it walked itself.
    #[cfg(feature = "offcore-probe")]
    fn simulate(&mut self, start: StartRegs, bounds: Bounds, matched: Option<usize>, k: usize) {
        let keep = matched.map_or(0, |m| m + 1);
        for (i, &limit) in LIMITS.iter().enumerate() {
            let n = self.offcore.known[i].min(self.prev_n);
            let c = self.copy_join(n, start, bounds);
            let bytes = match c {
                0 => u64::MAX,
                _ => self.prev[c - 1].sp - start.sp,
            };
            let copies = bytes <= limit;
            let counts = &SIMULATED[i];
            if copies {
                counts[0].fetch_add(1, Ordering::Relaxed);
                counts[1].fetch_add(bytes, Ordering::Relaxed);
            } else {
                counts[2].fetch_add(1, Ordering::Relaxed);
            }
            // After a copy it knows the verified frames that stay; after a
            // walk, the whole new stack.
            self.offcore.known[i] = if copies {
                c.min(keep)
            } else if keep + k <= super::MAX_RAW {
                keep + k
            } else {
                0
            };
        }
    }
}

/// The simulated threads of `offcore-probe`: remembered frames known, per limit.
#[cfg(feature = "offcore-probe")]
#[derive(Default)]
pub struct Simulated {
    known: [usize; LIMITS.len()],
}

#[cfg(feature = "offcore-probe")]
const LIMITS: [u64; 5] = [256, 512, 1024, 2048, 8192];
/// Per limit: copies, their bytes, walks.
#[cfg(feature = "offcore-probe")]
static SIMULATED: [[AtomicU64; 3]; LIMITS.len()] =
    [const { [const { AtomicU64::new(0) }; 3] }; LIMITS.len()];
#[cfg(feature = "offcore-probe")]
static BYTES: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "offcore-probe")]
static OUTCOMES: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

#[cfg(feature = "offcore-probe")]
#[derive(Clone, Copy)]
enum Outcome {
    /// The walk joined where the copy ends.
    Joined,
    /// Further out, but every read above the copy was a remembered one.
    Covered,
    /// The copy would have been too short, by one remembered frame.
    ShortByAFrame,
    /// The copy would have been too short, by more.
    Short,
    /// Nothing remembered verified: the copy is the whole stack.
    Whole,
    /// The walk joined at its first frame.
    AtTop,
}

/// Prints the probe's counts to stderr (at exit), after `capture-timing`'s.
#[cfg(feature = "offcore-probe")]
pub fn report((copies, _, cycles_each): (u64, u64, u64)) {
    let o: [u64; 6] = core::array::from_fn(|i| OUTCOMES[i].load(Ordering::Relaxed));
    crate::sys::warn(&format!(
        "offcore-probe: {copies} copies, {cycles_each} cycles and {} bytes each; the walk joined \
         where the copy ends {}, further out from remembered reads {}, needed one frame more {}, needed more {}, \
         copied the whole stack {}, joined at its first frame {}",
        BYTES.load(Ordering::Relaxed) / copies.max(1),
        o[Outcome::Joined as usize],
        o[Outcome::Covered as usize],
        o[Outcome::ShortByAFrame as usize],
        o[Outcome::Short as usize],
        o[Outcome::Whole as usize],
        o[Outcome::AtTop as usize],
    ));
    for (limit, counts) in LIMITS.iter().zip(&SIMULATED) {
        let [copies, bytes, walks] = counts.each_ref().map(|c| c.load(Ordering::Relaxed));
        crate::sys::warn(&format!(
            "offcore-probe: knowing only what it walked, limit {limit}: {copies} copies of {} \
             bytes on average, {walks} walks",
            bytes / copies.max(1)
        ));
    }
}

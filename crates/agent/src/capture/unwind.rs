//! Call stacks from DWARF CFI (framehop), made cheap by a validated cache.
//!
//! framehop turns one frame's registers (pc, sp, bp) plus a few stack reads
//! into the caller's registers, using per-address cached unwind rules. The
//! result of unwinding a frame depends on nothing else. So each thread keeps
//! its previous stack: for every frame the registers it started from and each
//! (address, value) it read. When a new capture reaches a frame with the same
//! pc, sp and bp as a remembered one, and every remembered read of that frame
//! and all outer frames still returns the same value, the outer part of the
//! stack is exactly the remembered one and is reused without unwinding.
//! A loop calling malloc at depth 20 then costs ~40 loads and compares instead
//! of 20 rule lookups, and when nothing changed it reuses the stack id too.
//! Frames are kept outermost-first so a capture only rewrites the inner part.

use crate::capture::modules;
use crate::capture::stacks::{self, MAX_FRAMES};
use crate::platform::arch::{self, Rule, StartRegs, UnwindCache};
use crate::platform::side_stack::SideStack;
use framehop::{FrameAddress, Unwinder as _};

/// Frames kept including the agent's own (cut before the stack is stored).
const MAX_RAW: usize = MAX_FRAMES + 16;
/// Reads kept per frame: the return address, a restored bp, and any other
/// read that returned one of those values (which one restored bp is then ambiguous).
const MAX_READS: usize = 4;
/// Reads a single unwind step may make (framehop reads every popped register).
const MAX_STEP_READS: usize = 8;
const UNVERIFIABLE: u8 = u8::MAX;
const ID_CACHE: usize = 4096;
/// Entries of the flat check list (two per frame on average is plenty: a
/// stack whose list is full is verified only up to there).
const CHECKS: usize = MAX_RAW * 2;

#[derive(Clone, Copy, Default)]
struct FrameRec {
    pc: u64,
    sp: u64,
    bp: u64,
    /// Hash state of the program frames from the outermost through this one
    /// (`stacks::hash_step`), and their count: the stack's identity when this
    /// is the innermost frame, without re-reading the outer frames.
    prefix: (u64, u64),
    depth: u32,
    nreads: u8,
    reads: [(u64, u64); MAX_READS],
    /// The rule read through bp (a frame-pointer rule).
    bp_used: bool,
    /// bp came out unchanged (passed on to the caller).
    bp_passed: bool,
    /// Whether this frame's bp can change the result of unwinding it or any
    /// outer frame; only then must it match. Optimised code uses rbp as a
    /// general register, so requiring it everywhere would defeat the cache.
    bp_matters: bool,
    /// Index of the read that restored the caller's bp (NO_READ if none):
    /// it needs checking only when the caller's bp matters.
    bp_read: u8,
}

const NO_READ: u8 = u8::MAX;

/// One thread's unwinding workspace besides the shared rule table: gimli's
/// context for evaluating CFI on a table miss, and framehop's rule caches for
/// the frames the table does not hold (`Rule::Other`). One framehop cache
/// holds 509 rules, direct-mapped by address, and a miss re-parses CFI
/// (about a microsecond); several caches chosen by a hash of the pc act as
/// one larger cache with the same exact rules. A thread starts with 4 and
/// grows to 16, then 64, while more than 1% of its lookups miss (before the
/// shared table, cc1 needed 64); each cache is about 20 KiB, created on
/// first use, so a thread whose frames all fit the table has none.
/// Evaluating CFI and building a framehop cache run on the thread's side
/// stack (side_stack.rs): they need tens of KiB of stack.
pub struct RuleCaches {
    /// Working memory for evaluating CFI when the shared table misses (rules.rs).
    cfi: Option<Box<crate::capture::rules::CfiContext>>,
    /// Owned (freed on drop); a raw pointer so that work on it may borrow
    /// the thread's state mutably (`side`, `side_ptr`).
    side: *mut SideStack,
    caches: [Option<Box<UnwindCache>>; MAX_RULE_CACHES],
    /// log2 of the number of caches in use.
    bits: u32,
    /// Lookups since the miss rate was last checked.
    lookups: u32,
    /// Misses of the caches in use at the last check.
    misses_seen: u64,
}

const MAX_RULE_CACHES: usize = 64;
const RULE_CACHE_START_BITS: u32 = 2;
/// Lookups per miss-rate check.
const RULE_WINDOW: u32 = 16_384;

impl RuleCaches {
    pub fn new() -> Self {
        RuleCaches {
            cfi: None,
            side: Box::into_raw(Box::new(SideStack::new())),
            caches: [const { None }; MAX_RULE_CACHES],
            bits: RULE_CACHE_START_BITS,
            lookups: 0,
            misses_seen: 0,
        }
    }

    /// Unmaps the side stack, for caches kept for a later thread once the
    /// process is at its limit of mappings: its two mappings go back to the
    /// program, and the next thread runs without one, as every thread
    /// started at the limit does.
    pub fn release_side_stack(&mut self) {
        if self.side().exists() {
            // SAFETY: from Box::into_raw in `new`; the thread that used it
            // has left it (its alternate stack was disabled).
            drop(unsafe { Box::from_raw(self.side) });
            self.side = Box::into_raw(Box::new(SideStack::new()));
        }
    }

    /// The thread's side stack.
    pub fn side(&self) -> &SideStack {
        // SAFETY: created in `new`, freed only in `drop`.
        unsafe { &*self.side }
    }

    /// The side stack as a pointer, valid as long as these caches: for work
    /// that also borrows the thread's state mutably.
    pub fn side_ptr(&self) -> *const SideStack {
        self.side
    }

    /// Evaluates CFI for `address` on the side stack (the shared table missed).
    fn rule_for(&mut self, address: u64, gen: u32, unwinders: &modules::Unwinders) -> u32 {
        // SAFETY: as in `side`; the context is another field.
        let side = unsafe { &*self.side };
        crate::capture::rules::rule_for(address, gen, unwinders, &mut self.cfi, side)
    }

    /// framehop's cache for `pc`, and the side stack to unwind on.
    #[inline]
    fn for_pc(&mut self, pc: u64) -> (&mut UnwindCache, &SideStack) {
        self.lookups += 1;
        if self.lookups == RULE_WINDOW {
            self.check_miss_rate();
        }
        let h = (pc >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let i = (h >> (64 - self.bits)) as usize;
        // SAFETY: as in `side`.
        let side = unsafe { &*self.side };
        let cache = match self.caches[i] {
            Some(ref mut c) => c,
            None => Self::create_cache(&mut self.caches[i], side),
        };
        (cache, side)
    }

    /// Kept out of line: the cache is built on the stack before it is boxed
    /// (20 KiB), and inlined that frame was every changed capture's, whose
    /// six stack-probe stores touched six pages on every call. Built on the
    /// side stack, for threads with small stacks.
    #[cold]
    #[inline(never)]
    fn create_cache<'a>(
        slot: &'a mut Option<Box<UnwindCache>>,
        side: &SideStack,
    ) -> &'a mut UnwindCache {
        slot.insert(side.run(|| Box::new(UnwindCache::new_in())))
    }

    /// Misses so far of the caches in use.
    fn misses(&self) -> u64 {
        self.caches[..1 << self.bits]
            .iter()
            .flatten()
            .map(|c| {
                let s = c.stats();
                s.miss_empty_slot_count + s.miss_wrong_modules_count + s.miss_wrong_address_count
            })
            .sum()
    }

    #[cold]
    fn check_miss_rate(&mut self) {
        self.lookups = 0;
        let misses = self.misses();
        let recent = misses.saturating_sub(self.misses_seen);
        // Caches are only ever created in use, so growing adds none yet: the
        // count over the larger range is the same.
        self.misses_seen = misses;
        if recent * 100 > u64::from(RULE_WINDOW) && (1 << self.bits) < MAX_RULE_CACHES {
            self.bits += 2;
        }
    }
}

impl Drop for RuleCaches {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in `new`; nothing uses it after this.
        drop(unsafe { Box::from_raw(self.side) });
    }
}

/// Readable stack range for this capture.
#[derive(Clone, Copy)]
pub struct Bounds {
    pub lo: u64,
    pub hi: u64,
    /// The thread's own stack, where a capture that started on an alternate
    /// signal stack continues past the signal frame (empty if unknown).
    pub thread_lo: u64,
    pub thread_hi: u64,
}

impl Bounds {
    /// A plain range, with no thread stack to continue on.
    pub const fn range(lo: u64, hi: u64) -> Bounds {
        Bounds {
            lo,
            hi,
            thread_lo: 0,
            thread_hi: 0,
        }
    }
}

/// One thread's unwinding state.
pub struct StackCapture {
    /// Previous stack, outermost frame first.
    prev: [FrameRec; MAX_RAW],
    /// prev[i].sp at prev_sp[i + 1], dense: searched on every changed
    /// capture. prev_sp[0] is u64::MAX, above every frame, so walking out
    /// to a frame's sp needs no test for the end of the array.
    prev_sp: [u64; MAX_RAW + 1],
    prev_n: usize,
    /// The remembered stack is cut at its outer end (a walk stopped at
    /// MAX_RAW frames, or outer frames were dropped to make room).
    prev_truncated: bool,
    prev_gen: u32,
    prev_id: u32,
    scratch: [FrameRec; MAX_RAW],
    /// The reads that decide the outer stack, flattened outermost first:
    /// checking a prefix of this is the whole cost of a cache hit.
    checks: [(u64, u64); CHECKS],
    /// checks_end[i]: end of frame i's entries in `checks`; (lowest, highest)
    /// address among frames 0..=i.
    checks_end: [(u16, u64, u64); MAX_RAW],
    /// Direct-mapped StackHash -> (id, the trace generation this thread
    /// last saw it defined in, 0 if none) cache in front of the shared table.
    /// Keeping the generation in the line the lookup reads anyway spares
    /// the stack's shared record, a cold line, on most changed captures.
    id_cache: Box<[(stacks::StackHash, u32, u32); ID_CACHE]>,
    /// Where `prev_id` is in `id_cache`, when it came from there.
    prev_slot: Option<usize>,
}

/// Result of a capture.
pub struct Captured {
    /// Stack id (0 if no stack could be taken).
    pub id: u32,
    /// True when the id was just created: its definition must be written.
    pub new: bool,
    /// The trace generation this thread last saw the stack defined in, as
    /// noted by `note_defined` (0: not known).
    pub defined_in: u32,
}

impl StackCapture {
    /// Built in place on the agent's heap: the struct is about 45 KiB and its
    /// id cache 96 KiB, and a value built first and then moved into a box
    /// took 140 KiB of the calling thread's stack (the first hooked call of
    /// a thread creates two), which overflowed threads with small stacks.
    pub fn new() -> Box<Self> {
        Self::build(Box::new_zeroed(), Box::new_zeroed())
    }

    /// As `new`, for a thread about to be created (its creator calls this),
    /// or None when the agent has no memory for it
    /// (`heap::alloc_for_new_thread`).
    pub fn try_new_for_thread() -> Option<Box<Self>> {
        let capture = crate::platform::heap::try_box_zeroed::<Self>(true)?;
        let ids = crate::platform::heap::try_box_zeroed(true)?;
        Some(Self::build(capture, ids))
    }

    fn build(
        mut capture: Box<core::mem::MaybeUninit<Self>>,
        ids: Box<core::mem::MaybeUninit<[(stacks::StackHash, u32, u32); ID_CACHE]>>,
    ) -> Box<Self> {
        let p = capture.as_mut_ptr();
        // SAFETY: both boxes are zeroed. Zero is a valid value of every
        // field but two: all are integers, bools, or arrays and tuples and
        // structs of them, except `id_cache` (a box) and `prev_slot` (an Option), which
        // are written here before the value is used. The id cache's entries
        // are integers too.
        unsafe {
            core::ptr::addr_of_mut!((*p).id_cache).write(ids.assume_init());
            core::ptr::addr_of_mut!((*p).prev_slot).write(None);
            (*core::ptr::addr_of_mut!((*p).prev_sp))[0] = u64::MAX;
            capture.assume_init()
        }
    }

    /// Where the id cache lies (the capture's largest part).
    pub fn id_cache_ptr(&self) -> *const u8 {
        self.id_cache.as_ptr().cast()
    }

    /// Forgets the previous stack (after fork, or when the stack memory may be gone).
    pub fn invalidate(&mut self) {
        self.prev_n = 0;
    }

    /// Notes that the trace of generation `gen` defines stack `id`, the one
    /// this capture returned last, so that its next id-cache hit says so.
    pub fn note_defined(&mut self, id: u32, gen: u32) {
        if let Some(slot) = self.prev_slot {
            let entry = &mut self.id_cache[slot];
            if entry.1 == id {
                entry.2 = gen;
            }
        }
    }

    /// Whether every read that decided frames 0..upto (outermost first)
    /// still returns what it returned then.
    #[inline(always)]
    fn verify(&self, upto: usize, b: Bounds) -> bool {
        let (end, lo, hi) = self.checks_end[upto - 1];
        if end == u16::MAX || lo < b.lo || hi.saturating_add(8) > b.hi {
            return false;
        }
        // SAFETY: every address lies in [lo, hi], inside the thread's
        // readable stack range (checked above), and is 8-aligned.
        let differs = |&(a, v): &(u64, u64)| unsafe { core::ptr::read(a as *const u64) } ^ v;
        // Most checks pass: test a group of them with one branch, so the
        // loads overlap instead of each waiting for its compare.
        let checks = &self.checks[..usize::from(end)];
        let mut groups = checks.chunks_exact(4);
        for g in &mut groups {
            if differs(&g[0]) | differs(&g[1]) | differs(&g[2]) | differs(&g[3]) != 0 {
                return false;
            }
        }
        groups.remainder().iter().all(|c| differs(c) == 0)
    }

    /// Rebuilds `checks` for frames `from..` after the remembered stack changed.
    fn rebuild_checks(&mut self, from: usize) {
        let (mut n, mut lo, mut hi, mut broken) = match from {
            0 => (0usize, u64::MAX, 0u64, false),
            _ => {
                let (end, lo, hi) = self.checks_end[from - 1];
                (usize::from(end), lo, hi, end == u16::MAX)
            }
        };
        let mut caller_bp_matters = from > 0 && self.prev[from - 1].bp_matters;
        for i in from..self.prev_n {
            let f = &self.prev[i];
            if f.nreads == UNVERIFIABLE || n + f.nreads as usize > CHECKS {
                broken = true;
            }
            if !broken {
                for (j, &(a, v)) in f.reads[..usize::from(f.nreads)].iter().enumerate() {
                    if j as u8 == f.bp_read && !caller_bp_matters {
                        continue;
                    }
                    self.checks[n] = (a, v);
                    n += 1;
                    lo = lo.min(a);
                    hi = hi.max(a);
                }
            }
            caller_bp_matters = f.bp_matters;
            self.checks_end[i] = if broken {
                (u16::MAX, 0, 0)
            } else {
                (n as u16, lo, hi)
            };
        }
    }

    /// Captures the stack that starts at `start` (registers of a hook frame).
    /// `cache` is framehop's rule cache, shared by a thread's captures.
    /// `before_unwinding` runs only when the stack changed, before the few
    /// hundred cycles of unwinding it: the place to start loads the caller
    /// will need afterwards (an unchanged stack returns too soon for them).
    #[inline]
    pub fn capture(
        &mut self,
        start: StartRegs,
        bounds: Bounds,
        rules: &mut RuleCaches,
        before_unwinding: impl FnOnce(),
    ) -> Captured {
        let Some((unwinders, gen)) = modules::unwinder() else {
            return Captured {
                id: 0,
                new: false,
                defined_in: 0,
            };
        };
        // The commonest case, kept small and inlined: the hook frame itself is
        // the remembered innermost frame and nothing outside it changed, so
        // the whole stack, and its id, are the previous ones.
        let mut top_refuted = false;
        if gen == self.prev_gen && self.prev_n > 0 && self.prev_id != 0 {
            let (sp, bp) = arch::sp_bp(&arch::regs(start));
            let f = &self.prev[self.prev_n - 1];
            if f.sp == sp && f.pc == start.pc && (!f.bp_matters || f.bp == bp) {
                if self.verify(self.prev_n, bounds) {
                    return Captured {
                        id: self.prev_id,
                        new: false,
                        defined_in: 0,
                    };
                }
                top_refuted = true;
            }
        }
        before_unwinding();
        #[cfg(feature = "capture-timing")]
        let started = arch::cycles();
        let captured = self.capture_changed(unwinders, gen, start, bounds, rules, top_refuted);
        #[cfg(feature = "capture-timing")]
        timing::add(timing::CAPTURE, arch::cycles().wrapping_sub(started));
        captured
    }

    /// A capture whose stack differs from the previous one, at least in its
    /// innermost frame: unwind until a remembered frame is verified.
    /// `top_refuted`: `capture` already matched the first frame against the
    /// remembered innermost one and found the outer reads changed (checking
    /// again would only fail again).
    #[inline(never)]
    fn capture_changed(
        &mut self,
        unwinders: &modules::Unwinders,
        gen: u32,
        start: StartRegs,
        bounds: Bounds,
        rules: &mut RuleCaches,
        top_refuted: bool,
    ) -> Captured {
        if gen != self.prev_gen {
            self.prev_n = 0;
            self.prev_gen = gen;
        }
        let mut regs = arch::regs(start);
        let mut pc = start.pc;
        // pc is where the frame's code is (the first frame of a hook that
        // read its own registers, or one a signal interrupted), not a
        // return address after a call.
        let mut at_instruction = !start.pc_is_return_address;
        let mut k = 0;
        let mut matched: Option<usize> = None;
        let (mut read_lo, mut read_span) = readable_range(bounds.lo, bounds.hi);
        // Whether the walk already moved from an alternate signal stack to
        // the thread's own (once at most).
        let mut switched = false;
        // Remembered frames at or above the current sp (the candidates are
        // below that count). The first frame may be far from the previous
        // stack's innermost (cc1's depth swings by dozens of frames), so it
        // searches; later frames move by one or two.
        let mut cursor = frames_at_or_above(&self.prev_sp[1..=self.prev_n], start.sp);
        let mut skip_match = top_refuted;
        loop {
            let (sp, bp) = arch::sp_bp(&regs);
            // The caller's frame is usually at most two remembered frames
            // further out: two steps as selects, then a loop that seldom
            // runs (a loop of varying length mispredicted about four times
            // per capture).
            cursor -= usize::from(self.prev_sp[cursor] < sp);
            cursor -= usize::from(self.prev_sp[cursor] < sp);
            while self.prev_sp[cursor] < sp {
                cursor -= 1;
            }
            if self.prev_sp[cursor] == sp && cursor > 0 && !skip_match {
                let f = &self.prev[cursor - 1];
                if f.pc == pc && (!f.bp_matters || f.bp == bp) && self.verify(cursor, bounds) {
                    matched = Some(cursor - 1);
                    break;
                }
            }
            skip_match = false;
            if k == MAX_RAW {
                break;
            }
            let address = if at_instruction {
                FrameAddress::from_instruction_pointer(pc)
            } else {
                match FrameAddress::from_return_address(pc) {
                    Some(a) => a,
                    None => break,
                }
            };
            // The innermost frame is looked up at pc; a caller inside the
            // call instruction, before its return address.
            let lookup = address.address_for_lookup();
            let bits = rules.rule_for(lookup, gen, unwinders);
            // Nearly every frame: a common rule, all reads in bounds. What it
            // records is what the general path below records for the same
            // reads (the return address always kept; the restored bp kept
            // too, checked where the caller's bp matters or always when it
            // equals the return address).
            let readable = |a: u64| a.wrapping_sub(read_lo) <= read_span && a.is_multiple_of(8);
            let rec = &mut self.scratch[k];
            rec.pc = pc;
            rec.sp = sp;
            rec.bp = bp;
            if let Some(step) = arch::fast_step(bits, &mut regs, readable) {
                let near_bp = |a: u64| a.wrapping_sub(bp) & !8 == 0;
                let (ra_at, ra) = (step.ra_at, step.ra);
                rec.reads[0] = (ra_at, ra);
                rec.nreads = 1;
                rec.bp_read = NO_READ;
                rec.bp_passed = true;
                rec.bp_used = near_bp(ra_at);
                if let Some((at, restored)) = step.bp_read {
                    // A restored bp equal to the input one counts as passed
                    // on (the input bp must match where it matters) and its
                    // slot is checked as well: a later capture with the same
                    // input bp but another value in the slot is not a match.
                    rec.bp_used |= near_bp(at);
                    rec.bp_passed = restored == bp;
                    rec.reads[0] = (at, restored);
                    rec.reads[1] = (ra_at, ra);
                    rec.nreads = 2;
                    if restored != ra {
                        rec.bp_read = 0;
                    }
                }
                k += 1;
                at_instruction = false;
                if arch::sp_bp(&regs).0 <= sp {
                    break;
                }
                pc = ra;
                continue;
            }
            // The reads of this step, as two scalar arrays: building a record
            // in a temporary and copying it, or reading back (address, value)
            // pairs just written as scalars, stalled on store forwarding
            // (a fifth of a changed capture's time).
            let mut nstep = 0usize;
            let mut step_addr = [0u64; MAX_STEP_READS];
            let mut step_value = [0u64; MAX_STEP_READS];
            let mut read = |a: u64| -> Result<u64, ()> {
                if !readable(a) {
                    return Err(());
                }
                // SAFETY: inside the thread's readable stack range, aligned.
                let v = unsafe { core::ptr::read_volatile(a as *const u64) };
                if nstep < MAX_STEP_READS {
                    step_addr[nstep] = a;
                    step_value[nstep] = v;
                }
                nstep += 1;
                Ok(v)
            };
            let rule = Rule::decode(bits);
            let r = match rule {
                Rule::Other => {
                    // framehop may evaluate CFI (rows of 192 rules on the stack).
                    let (cache, side) = rules.for_pc(pc);
                    side.run(|| {
                        unwinders
                            .framehop
                            .unwind_frame(address, &mut regs, cache, &mut read)
                            .map_err(|_| ())
                    })
                }
                rule => rule.exec(at_instruction, &mut regs, &mut read),
            };
            // A signal frame's caller was interrupted, not calling: its pc is
            // an instruction, and its sp was read from the frame too.
            let interrupted_caller = rule == Rule::SignalFrame;
            at_instruction = interrupted_caller;
            let n = nstep.min(MAX_STEP_READS);
            let (sp_after, bp_out) = arch::sp_bp(&regs);
            rec.bp_used = step_addr[..n]
                .iter()
                .any(|&a| a == bp || a == bp.wrapping_add(8));
            rec.bp_passed = bp_out == bp;
            rec.bp_read = NO_READ;
            if nstep > MAX_STEP_READS {
                rec.nreads = UNVERIFIABLE;
            } else {
                // The result is (return address, sp, bp); sp follows from the
                // rule and the input registers, except in a signal frame,
                // where it is read too. Reads whose values became none of
                // these (other saved registers) cannot change it, so they
                // are not verified. A read equal to the output bp is kept
                // even when bp came out unchanged: it may be where bp was
                // restored from (checked where the caller's bp matters).
                let ra = match r {
                    Ok(Some(ra)) => ra,
                    _ => 0,
                };
                let sp_out = interrupted_caller.then_some(sp_after);
                let mut kept = 0;
                for (&a, &v) in step_addr[..n].iter().zip(&step_value[..n]) {
                    if v == ra || Some(v) == sp_out || v == bp_out {
                        if kept == MAX_READS {
                            kept = usize::from(UNVERIFIABLE);
                            break;
                        }
                        if v == bp_out && v != ra && rec.bp_read == NO_READ {
                            rec.bp_read = kept as u8;
                        }
                        rec.reads[kept] = (a, v);
                        kept += 1;
                    }
                }
                rec.nreads = kept as u8;
            }
            k += 1;
            // A signal frame on an alternate signal stack: the interrupted
            // code ran on the thread's own stack, readable from its stack
            // pointer up (below it may be unmapped), wherever that stack
            // lies relative to the alternate one.
            let crossed = interrupted_caller
                && !switched
                && sp_after.wrapping_sub(read_lo) > read_span
                && sp_after >= bounds.thread_lo
                && sp_after < bounds.thread_hi;
            if crossed {
                let lo = sp_after
                    .saturating_sub(arch::RED_ZONE)
                    .max(bounds.thread_lo);
                (read_lo, read_span) = readable_range(lo, bounds.thread_hi);
                switched = true;
            }
            match r {
                Ok(Some(ra)) if ra != 0 => {
                    let (nsp, _) = arch::sp_bp(&regs);
                    if nsp <= sp && !crossed {
                        break;
                    }
                    pc = ra;
                }
                _ => break,
            }
        }

        // Splice: outer frames [0..=m] from the previous stack, then the new inner frames.
        let keep = matched.map_or(0, |m| m + 1);
        let unchanged = matched.is_some() && k == 0 && keep == self.prev_n;
        if unchanged && self.prev_id != 0 {
            return Captured {
                id: self.prev_id,
                new: false,
                defined_in: 0,
            };
        }
        let mut rebuild_from = None;
        if !unchanged {
            let total = keep + k;
            let drop_outer = total.saturating_sub(MAX_RAW);
            if drop_outer > 0 {
                self.prev.copy_within(drop_outer..keep, 0);
            }
            let base = keep - drop_outer;
            self.prev_n = base + k;
            self.prev_truncated = drop_outer > 0
                || match matched {
                    Some(_) => self.prev_truncated,
                    None => k == MAX_RAW,
                };
            // Frames kept in place keep their derived data; recompute from
            // the first frame that moved or is new.
            let from = if drop_outer > 0 { 0 } else { base };
            // Outermost first: a frame's bp matters if its rule uses it, or
            // if it passes bp on to a caller for which it matters. The hash
            // prefix folds in every program frame (the agent's own, the hook
            // frames inside and the thread-start wrapper outside, are left
            // out of stacks).
            let (mut outer_matters, mut prefix, mut depth) = match from {
                0 => (false, stacks::HASH_SEED, 0),
                _ => {
                    let o = &self.prev[from - 1];
                    (o.bp_matters, o.prefix, o.depth)
                }
            };
            let (agent_lo, agent_hi) = modules::agent_code();
            // The new frames (from `base`) are copied in as this loop visits them.
            for i in from..self.prev_n {
                if i >= base {
                    self.prev[i] = self.scratch[k - 1 - (i - base)];
                }
                let f = &mut self.prev[i];
                f.bp_matters =
                    f.bp_used || (f.bp_passed && outer_matters) || f.nreads == UNVERIFIABLE;
                outer_matters = f.bp_matters;
                // Written as a select (which frames are the agent's varies
                // from capture to capture; cachegrind counted the branch
                // costlier).
                let program = !(f.pc >= agent_lo && f.pc < agent_hi);
                let stepped = stacks::hash_step(prefix, f.pc);
                prefix = if program { stepped } else { prefix };
                depth += u32::from(program);
                f.prefix = prefix;
                f.depth = depth;
                self.prev_sp[i + 1] = f.sp;
            }
            rebuild_from = Some(from);
        }

        // A stack deeper than kept whose outer part came from a remembered
        // stack cut at its outer end, but which is now shallower than the
        // frames kept (it returned from deeper frames): the frames further
        // out were never read. Walk the whole stack again (without a
        // remembered stack nothing matches, so this happens once).
        if matched.is_some()
            && self.prev_truncated
            && self
                .prev_n
                .checked_sub(1)
                .map_or(0, |i| self.prev[i].depth as usize)
                < MAX_FRAMES
        {
            self.prev_n = 0;
            return self.capture_changed(unwinders, gen, start, bounds, rules, false);
        }
        let h = match self.prev_n.checked_sub(1).map(|i| &self.prev[i]) {
            Some(top) if top.depth as usize <= MAX_FRAMES && top.depth > 0 => {
                Some(stacks::hash_finish(top.prefix, top.depth as usize))
            }
            Some(top) if top.depth > 0 => {
                // Deeper than kept: the identity of the innermost MAX_FRAMES.
                let mut frames = [0u64; MAX_FRAMES];
                let n = program_frames_of(&self.prev[..self.prev_n], &mut frames);
                Some(stacks::hash_frames(&frames[..n]))
            }
            _ => None,
        };
        let slot = h.map_or(0, |h| (h.1 as usize >> 7) % ID_CACHE);
        if let Some(h) = h {
            // The id cache line is likely cold (the program ran in between):
            // start loading it while the check list is rebuilt, and the
            // intern table's slot, where a fifth of cc1's captures go next.
            arch::prefetch(&self.id_cache[slot]);
            stacks::prefetch_slot(h);
        }
        if let Some(from) = rebuild_from {
            self.rebuild_checks(from);
        }
        let Some(h) = h else {
            self.prev_id = 0;
            return Captured {
                id: 0,
                new: false,
                defined_in: 0,
            };
        };
        let (ch, cid, defined_in) = self.id_cache[slot];
        if ch == h && cid != 0 {
            self.prev_id = cid;
            self.prev_slot = Some(slot);
            return Captured {
                id: cid,
                new: false,
                defined_in,
            };
        }
        let prev = &self.prev[..self.prev_n];
        match stacks::intern(h, |buf| program_frames_of(prev, buf)) {
            Some((id, new)) => {
                self.id_cache[slot] = (h, id, 0);
                self.prev_id = id;
                self.prev_slot = Some(slot);
                Captured {
                    id,
                    new,
                    defined_in: 0,
                }
            }
            None => {
                self.prev_id = 0;
                Captured {
                    id: 0,
                    new: false,
                    defined_in: 0,
                }
            }
        }
    }
}

/// The `capture-timing` feature: TSC cycles spent in changed captures, and
/// in whole recorded allocation and release calls (from the guard taken to
/// the event written, the C library's own work left out). The totals are
/// kept with plain loads and stores, not read-modify-write instructions,
/// which would add a locked instruction to what is timed around them (in a
/// multi-threaded program some counts are lost: a measuring aid only).
#[cfg(feature = "capture-timing")]
pub mod timing {
    use core::sync::atomic::{AtomicU64, Ordering};

    /// (count, cycles) per kind: changed captures, allocation calls, release
    /// calls.
    static TOTALS: [(AtomicU64, AtomicU64); 3] =
        [const { (AtomicU64::new(0), AtomicU64::new(0)) }; 3];
    pub const CAPTURE: usize = 0;
    pub const ALLOC: usize = 1;
    pub const FREE: usize = 2;

    #[inline(always)]
    pub fn add(kind: usize, cycles: u64) {
        let (count, total) = &TOTALS[kind];
        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        total.store(total.load(Ordering::Relaxed) + cycles, Ordering::Relaxed);
    }

    /// Prints the totals to stderr (at exit).
    pub fn report() {
        let get = |kind: usize| {
            let (count, total) = &TOTALS[kind];
            let (n, c) = (count.load(Ordering::Relaxed), total.load(Ordering::Relaxed));
            (n, c, c.checked_div(n).unwrap_or(0))
        };
        let (captures, cycles, each) = get(CAPTURE);
        let (allocs, _, alloc_each) = get(ALLOC);
        let (frees, _, free_each) = get(FREE);
        crate::platform::sys::warn(&format!(
            "capture-timing: {captures} changed captures, {cycles} TSC cycles, {each} per capture; \
             {allocs} allocation calls, {alloc_each} per call; {frees} release calls, {free_each} per call"
        ));
    }
}

/// The `cache-audit` feature: each capture is compared with a full unwind of
/// the same stack that starts with nothing remembered. Any difference means
/// the validated cache (recording.md, "The validated unwind cache") returned a stack that was not the
/// program's; the first few are printed as they happen, the counts at exit.
#[cfg(feature = "cache-audit")]
pub mod audit {
    use core::sync::atomic::{AtomicU64, Ordering};

    static CAPTURES: AtomicU64 = AtomicU64::new(0);
    static DIFFERENT: AtomicU64 = AtomicU64::new(0);

    /// Counts one compared capture: `cached` from the thread's capture,
    /// `full` from a capture with nothing remembered.
    pub fn note(cached: u32, full: u32) {
        CAPTURES.fetch_add(1, Ordering::Relaxed);
        if cached == full
            || crate::capture::stacks::frames(cached) == crate::capture::stacks::frames(full)
        {
            return;
        }
        if DIFFERENT.fetch_add(1, Ordering::Relaxed) < 4 {
            crate::platform::sys::warn(&format!(
                "cache-audit: the cached capture gave {:x?}, a full unwind {:x?}",
                crate::capture::stacks::frames(cached),
                crate::capture::stacks::frames(full)
            ));
        }
    }

    /// Prints the counts to stderr (at exit).
    pub fn report() {
        crate::platform::sys::warn(&format!(
            "cache-audit: {} captures compared, {} differed from a full unwind",
            CAPTURES.load(Ordering::Relaxed),
            DIFFERENT.load(Ordering::Relaxed)
        ));
    }
}

/// `[lo, hi)` as (start, span) for the unwinder's readability test: an
/// address `a` is readable when `a - start <= span` (8 aligned bytes inside
/// the range, one compare). A range under 8 bytes has nothing readable.
#[inline(always)]
fn readable_range(lo: u64, hi: u64) -> (u64, u64) {
    match hi.wrapping_sub(lo).checked_sub(8) {
        Some(span) if hi >= lo => (lo, span),
        _ => (u64::MAX, 0),
    }
}

/// How many of `sps` (strictly decreasing: a remembered stack's sp, outermost
/// first) are at or above `sp`, found without a data-dependent branch.
#[inline(always)]
fn frames_at_or_above(sps: &[u64], sp: u64) -> usize {
    if sps.is_empty() {
        return 0;
    }
    let mut base = 0;
    let mut size = sps.len();
    while size > 1 {
        let half = size / 2;
        base = if sps[base + half] >= sp {
            base + half
        } else {
            base
        };
        size -= half;
    }
    base + usize::from(sps[base] >= sp)
}

/// Program frames of `frames` (outermost first), innermost first into `out`:
/// without the agent's own (the hook frames inside, the thread-start wrapper
/// further out). Returns their count.
fn program_frames_of(frames: &[FrameRec], out: &mut [u64; MAX_FRAMES]) -> usize {
    let mut n = 0;
    for f in frames.iter().rev() {
        if n == MAX_FRAMES {
            break;
        }
        if !modules::is_agent_pc(f.pc) {
            out[n] = f.pc;
            n += 1;
        }
    }
    n
}

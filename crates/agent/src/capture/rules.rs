//! Unwind rules by code address, one table for the whole process.
//!
//! Unwinding a frame needs the rule of its return site (where the caller's
//! frame starts, where bp was saved). Finding it in CFI takes about a
//! microsecond, so rules are cached. framehop's caches are per thread, 16
//! bytes a rule, and a program the size of gcc's cc1 needs 64 of them (1.3 MB
//! a thread), which the program's own work evicts between two allocations:
//! every lookup went to memory. Here every rule that x86_64 CFI commonly
//! takes fits in one word with its address (arch::Rule), all threads share
//! one two-way table of 65,536 words (512 KiB, of which a program touches
//! what it uses), and a miss evaluates the CFI with gimli, translated
//! exactly as framehop translates it. Rules of other forms are cached as
//! `Other`: framehop unwinds those frames, as before.
//!
//! A word holds the address bits that did not choose its pair of slots, a
//! mark of the module generation (its count modulo 15, plus 1) and the
//! encoded rule, so a word read whole is either the right rule or a miss;
//! writers race harmlessly (the last wins).
//! Two ways instead of one cut cc1's CFI evaluations from 1.35% to 0.5% of
//! its samples (return sites 64 KiB apart no longer evict each other).
//! When modules change the table is emptied, and a rule a thread computes from
//! the old modules afterwards carries the old generation and never matches.

use crate::capture::modules::Unwinders;
use crate::platform::arch::{Rule, RULE_BITS};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use gimli::{EhFrame, EhFrameHdr, LittleEndian, UnwindContext, UnwindSection as _};

const SLOT_BITS: u32 = 16;
const SLOTS: usize = 1 << SLOT_BITS;
/// Addresses above this do not fit the tag (no user-space code lives there).
const MAX_ADDRESS: u64 = 1 << 47;
const GEN_BITS: u32 = 32 - RULE_BITS;
/// The bits of a word that must equal the lookup's: the tag and the generation mark.
const MATCH_MASK: u64 = 0xFFFF_FFFF | ((1 << GEN_BITS) - 1) << (32 + RULE_BITS);

static TABLE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Whether any rule was stored since the table was last emptied.
static USED: AtomicBool = AtomicBool::new(false);

/// gimli's working memory for evaluating one FDE, without allocating.
pub struct CfiStorage;

impl gimli::UnwindContextStorage<usize> for CfiStorage {
    /// x86_64 CFI describes at most the 17 general registers and the return address.
    type Rules = [(gimli::Register, gimli::RegisterRule<usize>); 24];
    /// DW_CFA_remember_state nesting.
    type Stack = [gimli::UnwindTableRow<usize, Self>; 4];
}

pub type CfiContext = UnwindContext<usize, CfiStorage>;

pub fn new_context() -> Box<CfiContext> {
    Box::new(UnwindContext::new_in())
}

/// The rule for unwinding a frame at `address` (the pc of the innermost
/// frame, or return address - 1 for the others), encoded (`Rule::encode`).
#[inline(always)]
pub fn rule_for(
    address: u64,
    gen: u32,
    unwinders: &Unwinders,
    context: &mut Option<Box<CfiContext>>,
    side: &crate::platform::side_stack::SideStack,
) -> u32 {
    if address >= MAX_ADDRESS {
        return Rule::Other.encode();
    }
    // Two ways: the pair is chosen by address bits 1..16, and the tag keeps
    // bit 0 and the bits above 16.
    let pair = (address as usize >> 1 & (SLOTS / 2 - 1)) * 2;
    let tag = ((address >> SLOT_BITS) << 1 | address & 1) as u32;
    // The generation's mark is never 0, so an empty word never matches and
    // a hit is one mask and compare.
    let gen_mark = gen % ((1 << GEN_BITS) - 1) + 1;
    let expect = u64::from(tag) | u64::from(gen_mark) << (32 + RULE_BITS);
    let hit = |word: u64| word & MATCH_MASK == expect;
    let first = TABLE[pair].load(Ordering::Relaxed);
    if hit(first) {
        return (first >> 32) as u32 & ((1 << RULE_BITS) - 1);
    }
    let second = TABLE[pair + 1].load(Ordering::Relaxed);
    if hit(second) {
        return (second >> 32) as u32 & ((1 << RULE_BITS) - 1);
    }
    // Switched off, the table stays empty and every frame goes to framehop.
    if !crate::config::flag(&crate::config::OPTIONS.rule_table) {
        return Rule::Other.encode();
    }
    // gimli keeps rows of register rules on the stack: tens of KiB.
    let rule = side.run(|| from_cfi(address, unwinders, context));
    USED.store(true, Ordering::Relaxed);
    // The newest rule goes first; the one it displaces moves to the second way.
    TABLE[pair + 1].store(first, Ordering::Relaxed);
    let bits = rule.encode();
    TABLE[pair].store(expect | u64::from(bits) << 32, Ordering::Relaxed);
    bits
}

#[cold]
fn from_cfi(address: u64, unwinders: &Unwinders, context: &mut Option<Box<CfiContext>>) -> Rule {
    let Some(m) = unwinders.cfi_module(address) else {
        return Rule::Other;
    };
    let Ok(hdr) = EhFrameHdr::new(&m.eh_frame_hdr, LittleEndian).parse(&m.bases, 8) else {
        return Rule::Other;
    };
    let Some(table) = hdr.table() else {
        return Rule::Other;
    };
    let mut eh_frame = EhFrame::new(&m.eh_frame, LittleEndian);
    eh_frame.set_address_size(8);
    let Ok(fde) = table.fde_for_address(&eh_frame, &m.bases, address, EhFrame::cie_from_offset)
    else {
        return Rule::Other;
    };
    if fde.is_signal_trampoline() {
        return Rule::SignalFrame;
    }
    let ctx = context.get_or_insert_with(new_context);
    match fde.unwind_info_for_address(&eh_frame, &m.bases, ctx, address) {
        Ok(row) => Rule::from_cfi(row),
        Err(_) => Rule::Other,
    }
}

/// Empties the table (the modules changed).
pub fn forget_all() {
    if USED.swap(false, Ordering::Relaxed) {
        for slot in &TABLE {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{forget_all, rule_for};
    use crate::capture::modules;
    use crate::platform::arch::Rule;
    use crate::platform::side_stack::SideStack;

    #[test]
    fn rules_survive_their_encoding_and_offsets_too_large_become_other() {
        let rules = [
            Rule::EndOfStack,
            Rule::Sp { cfa_offset: 8 },
            Rule::Sp {
                cfa_offset: 8 * ((1 << 13) - 1),
            },
            Rule::SpRestoreBp {
                cfa_offset: 32,
                bp_below_cfa: 16,
            },
            Rule::FramePointer,
            Rule::SignalFrame,
            Rule::Other,
        ];
        for r in rules {
            assert_ne!(r.encode(), 0, "{r:?}");
            assert_eq!(Rule::decode(r.encode()), r);
        }
        assert_eq!(
            Rule::decode(
                Rule::Sp {
                    cfa_offset: 8 << 13
                }
                .encode()
            ),
            Rule::Other
        );
    }

    #[inline(never)]
    extern "C" fn some_function() -> u64 {
        core::hint::black_box(7)
    }

    /// At a function's first instruction every x86-64 CFI says the return
    /// address was just pushed: CFA = sp + 8. The table answers so from the
    /// test binary's own .eh_frame, again from its cache, and again once
    /// the modules changed and the cache was emptied; an address no module
    /// covers has no rule.
    #[test]
    fn the_table_answers_from_the_programs_cfi_and_forgets_on_change() {
        modules::refresh();
        let (unwinders, gen) = modules::unwinder().expect("the test binary's modules");
        let side = SideStack::new();
        let mut context = None;
        let entry = some_function as *const () as u64;
        let want = Rule::Sp { cfa_offset: 8 }.encode();
        assert_eq!(rule_for(entry, gen, unwinders, &mut context, &side), want);
        assert_eq!(rule_for(entry, gen, unwinders, &mut context, &side), want);
        forget_all();
        assert_eq!(
            rule_for(entry, gen + 1, unwinders, &mut context, &side),
            want
        );
        assert_eq!(
            rule_for(0x10, gen, unwinders, &mut context, &side),
            Rule::Other.encode()
        );
        assert_eq!(some_function(), 7);
    }
}

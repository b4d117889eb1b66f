//! Call stacks of a stopped thread, unwound from outside with framehop over
//! the program's `.eh_frame`, reading its stack through its memory.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};

use crate::elf::{self, Program};
use crate::prologue_x86_64::{self, CallerRegs};
use crate::remote::Memory;

/// As many frames as the agent keeps.
pub const MAX_FRAMES: usize = 64;

pub struct StackUnwinder {
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
    /// Functions, and the code CFI covers, at process addresses (sorted).
    functions: Vec<(u64, u64)>,
    cfi_covers: Vec<(u64, u64)>,
}

/// The most code read to find a function's prologue.
const MAX_PROLOGUE_WALK: u64 = 1 << 16;

impl StackUnwinder {
    /// An unwinder for the program loaded at `bias`, spanning `[start, end)`.
    pub fn new(program: &Program, bias: u64, start: u64, end: u64) -> StackUnwinder {
        let mut unwinder = UnwinderX86_64::new();
        // A static link often has no .eh_frame_hdr (gcc passes
        // --eh-frame-hdr to dynamic links only): framehop then indexes
        // .eh_frame itself.
        if let Some((eh_at, eh)) = program.eh_frame.clone() {
            let hdr = program.eh_frame_hdr.clone();
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: program.text.map(|(a, b)| a..b),
                eh_frame_svma: Some(eh_at..eh_at + eh.len() as u64),
                eh_frame: Some(eh),
                eh_frame_hdr_svma: hdr.as_ref().map(|(at, h)| *at..*at + h.len() as u64),
                eh_frame_hdr: hdr.map(|(_, h)| h),
                ..Default::default()
            };
            unwinder.add_module(Module::new("program".into(), start..end, bias, info));
        }
        StackUnwinder {
            unwinder,
            cache: CacheX86_64::new(),
            functions: elf::rebased(&program.functions, bias),
            cfi_covers: elf::rebased(&program.cfi_covers, bias),
        }
    }

    /// The return addresses from `ra` (a call's return address, with the
    /// caller's `sp` and `bp` as they are after the return) outwards.
    pub fn stack(&mut self, mem: &Memory, ra: u64, sp: u64, bp: u64) -> Vec<u64> {
        let mut frames = vec![ra];
        let mut regs = UnwindRegsX86_64::new(ra, sp, bp);
        let mut read = |addr: u64| mem.word(addr).ok_or(());
        let mut at = ra;
        while frames.len() < MAX_FRAMES {
            let next = if elf::range_of(&self.cfi_covers, at - 1).is_some() {
                let Some(address) = FrameAddress::from_return_address(at) else {
                    break;
                };
                match self
                    .unwinder
                    .unwind_frame(address, &mut regs, &mut self.cache, &mut read)
                {
                    Ok(Some(next)) if next != 0 => next,
                    _ => break,
                }
            } else {
                // No CFI here (musl's C library): the function's prologue.
                let Some(caller) = self.by_prologue(mem, at, regs.sp(), regs.bp()) else {
                    break;
                };
                regs = UnwindRegsX86_64::new(caller.ra, caller.sp, caller.bp);
                caller.ra
            };
            frames.push(next);
            at = next;
        }
        frames
    }

    /// The caller of the frame that returns to `at`, from the prologue of
    /// the function holding its call site; `None` when that cannot be
    /// trusted (no symbol, code unread, a return address after no call).
    fn by_prologue(&self, mem: &Memory, at: u64, sp: u64, bp: u64) -> Option<CallerRegs> {
        let pc = at - 1;
        let (start, _) = elf::range_of(&self.functions, pc)?;
        if at - start > MAX_PROLOGUE_WALK {
            return None;
        }
        let code = mem.read_vec(start, (at - start) as usize)?;
        let mut word = |a: u64| mem.word(a);
        let caller = prologue_x86_64::unwind(&code, start, pc, sp, bp, &mut word)?;
        // A word that follows a call in the program's code, or nothing.
        elf::range_of(&self.functions, caller.ra - 1)?;
        let before = mem.read_vec(caller.ra - 7, 7)?;
        prologue_x86_64::follows_call(&before, caller.ra).then_some(caller)
    }
}

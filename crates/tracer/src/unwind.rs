//! Call stacks of a stopped thread, unwound from outside with framehop over
//! the program's `.eh_frame`, reading its stack through its memory.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};

use crate::elf::Program;
use crate::remote::Memory;

/// As many frames as the agent keeps.
pub const MAX_FRAMES: usize = 64;

pub struct StackUnwinder {
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
}

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
            let Some(address) = FrameAddress::from_return_address(at) else {
                break;
            };
            match self
                .unwinder
                .unwind_frame(address, &mut regs, &mut self.cache, &mut read)
            {
                Ok(Some(next)) if next != 0 => {
                    frames.push(next);
                    at = next;
                }
                other => {
                    if std::env::var_os("TRAPLINE_TRACER_DEBUG").is_some() {
                        eprintln!("unwind stop at {at:#x}: {other:?}");
                    }
                    break;
                }
            }
        }
        frames
    }
}

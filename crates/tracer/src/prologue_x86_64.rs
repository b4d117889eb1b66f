//! Unwinding a frame of a function without CFI (musl's C library is built
//! without unwind tables) by reading its prologue: the instructions from
//! the function's start to the call site are decoded (iced-x86) and what
//! they did to the stack pointer is added up (`push`, `pop`, `sub`/`add
//! rsp, imm`, `lea rsp, [rsp+imm]`). A function that set up `rbp` as its
//! frame pointer (`push rbp; mov rbp, rsp`) is unwound through it. The
//! walk is linear: it assumes the call site is reached by falling through
//! from the start, as it is in a prologue followed by a body. A result is
//! kept only when the return address it finds follows a call instruction.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind, Register};

/// The caller of a frame: its return address, stack and frame pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerRegs {
    pub ra: u64,
    pub sp: u64,
    pub bp: u64,
}

/// What the function's code from `start` (bytes `code`) to `pc` did to
/// the stack: the bytes below the entry stack pointer at `pc`, and where
/// `rbp` was saved (bytes below the entry stack pointer) and whether it is
/// the frame pointer. `None` when an instruction changes rsp otherwise.
fn stack_effect(code: &[u8], start: u64, pc: u64) -> Option<(u64, Option<u64>, Option<u64>)> {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut depth: i64 = 0;
    let mut rbp_saved = None;
    let mut frame_pointer = None;
    while decoder.can_decode() && decoder.ip() < pc {
        let i = decoder.decode();
        if i.is_invalid() {
            return None;
        }
        match i.mnemonic() {
            Mnemonic::Push => {
                depth += 8;
                if i.op0_kind() == OpKind::Register && i.op0_register() == Register::RBP {
                    rbp_saved.get_or_insert(depth as u64);
                }
            }
            Mnemonic::Pop => depth -= 8,
            Mnemonic::Sub | Mnemonic::Add
                if i.op0_kind() == OpKind::Register && i.op0_register() == Register::RSP =>
            {
                let imm = match i.op1_kind() {
                    OpKind::Immediate8to64
                    | OpKind::Immediate32to64
                    | OpKind::Immediate8
                    | OpKind::Immediate32 => i.immediate(1) as i64,
                    _ => return None,
                };
                depth += if i.mnemonic() == Mnemonic::Sub {
                    imm
                } else {
                    -imm
                };
            }
            Mnemonic::Lea if i.op0_register() == Register::RSP => {
                if i.memory_base() != Register::RSP || i.memory_index() != Register::None {
                    return None;
                }
                depth -= i.memory_displacement64() as i64;
            }
            Mnemonic::Mov
                if i.op0_kind() == OpKind::Register
                    && i.op0_register() == Register::RBP
                    && i.op1_kind() == OpKind::Register
                    && i.op1_register() == Register::RSP =>
            {
                frame_pointer = Some(depth as u64);
            }
            _ => {
                // Any other write of rsp (an alignment, a move from
                // another register) is not followed, unless rbp keeps
                // the frame.
                let writes_rsp = i.op0_kind() == OpKind::Register
                    && i.op0_register() == Register::RSP
                    && i.mnemonic() != Mnemonic::Cmp
                    && i.mnemonic() != Mnemonic::Test;
                if writes_rsp && frame_pointer.is_none() {
                    return None;
                }
                if matches!(i.flow_control(), FlowControl::Return) {
                    // A return before the call site: not a straight path.
                    return None;
                }
            }
        }
        if depth < 0 {
            return None;
        }
    }
    Some((depth as u64, rbp_saved, frame_pointer))
}

/// Whether the bytes before `ra` end with a call instruction.
pub fn follows_call(code_before: &[u8], ra: u64) -> bool {
    (2..=7usize).any(|len| {
        let Some(bytes) = code_before.get(code_before.len().wrapping_sub(len)..) else {
            return false;
        };
        let mut d = Decoder::with_ip(64, bytes, ra - len as u64, DecoderOptions::NONE);
        let i = d.decode();
        !i.is_invalid()
            && i.len() == len
            && matches!(
                i.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

/// The caller of the frame stopped at `pc` (a return address less one's
/// instruction: the call site) in the function at `start`, whose code up
/// to `pc` is `code`, with stack pointer `sp` and frame pointer `bp`;
/// `word` reads the stack.
pub fn unwind(
    code: &[u8],
    start: u64,
    pc: u64,
    sp: u64,
    bp: u64,
    word: &mut dyn FnMut(u64) -> Option<u64>,
) -> Option<CallerRegs> {
    let (depth, rbp_saved, frame_pointer) = stack_effect(code, start, pc)?;
    // The stack pointer at the function's entry, where its return address is.
    let entry_sp = match frame_pointer {
        Some(at) => bp.checked_add(at)?,
        None => sp.checked_add(depth)?,
    };
    let ra = word(entry_sp)?;
    let caller_bp = match rbp_saved {
        Some(at) => word(entry_sp.checked_sub(at)?)?,
        None => bp,
    };
    Some(CallerRegs {
        ra,
        sp: entry_sp + 8,
        bp: caller_bp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up_pushes_and_stack_adjustments_to_the_call_site() {
        // push r12; push rbp; mov rbp,rdi; sub rsp,8; call ...
        let code = [
            0x41, 0x54, 0x55, 0x48, 0x89, 0xfd, 0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0,
        ];
        let start = 0x1000;
        let pc = start + 10;
        let sp = 0x7000;
        let mut stack = std::collections::HashMap::new();
        stack.insert(sp + 24, 0x4242u64); // the return address
        stack.insert(sp + 24 - 16, 0x9999u64); // rbp, pushed second
        let mut word = |a: u64| stack.get(&a).copied();
        let caller = unwind(&code, start, pc, sp, 0x1, &mut word).unwrap();
        assert_eq!(
            caller,
            CallerRegs {
                ra: 0x4242,
                sp: sp + 32,
                bp: 0x9999
            }
        );
    }

    #[test]
    fn follows_a_frame_pointer_and_refuses_unknown_stack_writes() {
        // push rbp; mov rbp,rsp; and rsp,-16; sub rsp,64; call ...
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xe4, 0xf0, 0x48, 0x83, 0xec, 0x40, 0xe8, 0, 0, 0,
            0,
        ];
        let bp = 0x8000;
        let mut word = |a: u64| Some(if a == bp + 8 { 0x5151 } else { 0x7777 });
        let caller = unwind(&code, 0x1000, 0x100c, 0x1234, bp, &mut word).unwrap();
        assert_eq!(caller.ra, 0x5151);
        assert_eq!(caller.sp, bp + 16);
        assert_eq!(caller.bp, 0x7777);
        // Without the frame pointer, the alignment is not followed.
        let code = [0x48, 0x83, 0xe4, 0xf0, 0xe8, 0, 0, 0, 0];
        assert_eq!(unwind(&code, 0x1000, 0x1004, 0x1234, 0, &mut word), None);
    }

    #[test]
    fn knows_a_call_instruction_before_a_return_address() {
        let code = [0x90, 0xe8, 1, 2, 3, 4];
        assert!(follows_call(&code, 0x1006));
        assert!(!follows_call(
            &[0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90],
            0x1007
        ));
    }
}

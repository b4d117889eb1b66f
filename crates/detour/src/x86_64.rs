//! The x86-64 detour: decoding, relocation and the jumps.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, OpKind,
};

/// Bytes of `jmp rel32`.
const JMP_REL32: usize = 5;
/// Bytes of `jmp [rip+0]` and its 8-byte target.
const JMP_ABS: usize = 14;
/// The bytes to read at the entry: enough for the longest instructions.
pub const READ: usize = 32;
/// Where the trampoline may be: within this distance of the function.
pub const REACH: u64 = 1 << 31;

/// Why a function cannot be detoured.
pub type Refusal = &'static str;

/// A planned detour of the function at `func`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detour {
    /// The bytes to place at the trampoline's address: the moved
    /// instructions, the jump back, then the stub jumping to the hook.
    pub trampoline: Vec<u8>,
    /// The bytes to write at the function's entry (`moved` bytes: the jump
    /// to the stub, then `int3` padding up to the next whole instruction).
    pub entry: Vec<u8>,
    /// How many bytes of the entry the trampoline took over.
    pub moved: usize,
}

/// Plans the detour of the function whose first bytes are `code` (at least
/// [`READ`] of them, or the rest of its mapping) at address `func`, with
/// its trampoline at `page` and its calls going to `hook`.
pub fn plan(code: &[u8], func: u64, page: u64, hook: u64) -> Result<Detour, Refusal> {
    let mut decoder = Decoder::with_ip(64, code, func, DecoderOptions::NONE);
    let mut moved: Vec<Instruction> = Vec::new();
    let mut len = 0;
    while len < JMP_REL32 {
        if !decoder.can_decode() {
            return Err("its first bytes do not decode as instructions");
        }
        let i = decoder.decode();
        if i.is_invalid() {
            return Err("its first bytes do not decode as instructions");
        }
        len += i.len();
        let ends = matches!(
            i.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        );
        moved.push(i);
        if ends && len < JMP_REL32 {
            return Err("the function is shorter than the jump");
        }
    }
    let span = func..func + len as u64;
    if moved.iter().any(|i| {
        matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        ) && span.contains(&i.near_branch_target())
    }) {
        return Err("a branch among the moved instructions lands inside them");
    }
    let block = InstructionBlock::new(&moved, page);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(|_| "the moved instructions cannot be encoded at the trampoline")?;
    let mut trampoline = encoded.code_buffer;
    trampoline.extend_from_slice(&abs_jump(func + len as u64));
    let stub = page + trampoline.len() as u64;
    trampoline.extend_from_slice(&abs_jump(hook));
    let rel = stub as i64 - (func + JMP_REL32 as u64) as i64;
    let rel = i32::try_from(rel).map_err(|_| "the trampoline is out of reach of the function")?;
    let mut entry = vec![0xccu8; len];
    entry[0] = 0xe9;
    entry[1..5].copy_from_slice(&rel.to_le_bytes());
    Ok(Detour {
        trampoline,
        entry,
        moved: len,
    })
}

/// `jmp [rip+0]` followed by its target.
fn abs_jump(to: u64) -> [u8; JMP_ABS] {
    let mut b = [0u8; JMP_ABS];
    b[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    b[6..].copy_from_slice(&to.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_whole_instructions_and_relocates_rip_relative_operands() {
        // push rbp; mov rax,[rip+0x100]; ret
        let code = [0x55, 0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0xc3];
        let func = 0x40_1000;
        let page = 0x40_0000;
        let d = plan(&code, func, page, 0x7000_0000).unwrap();
        assert_eq!(d.moved, 8);
        assert_eq!(d.entry.len(), 8);
        assert_eq!(d.entry[0], 0xe9);
        assert_eq!(&d.entry[5..], &[0xcc; 3]);
        // push rbp; mov rax,[rip+disp] now reaching the same 0x401108.
        assert_eq!(d.trampoline[0], 0x55);
        let disp = i32::from_le_bytes(d.trampoline[4..8].try_into().unwrap());
        assert_eq!(page as i64 + 8 + disp as i64, 0x40_1108);
        // The jump back to the ret, then the stub to the hook.
        assert_eq!(&d.trampoline[8..14], &[0xff, 0x25, 0, 0, 0, 0]);
        assert_eq!(
            u64::from_le_bytes(d.trampoline[14..22].try_into().unwrap()),
            func + 8
        );
        assert_eq!(
            u64::from_le_bytes(d.trampoline[28..36].try_into().unwrap()),
            0x7000_0000
        );
        let rel = i32::from_le_bytes(d.entry[1..5].try_into().unwrap());
        assert_eq!(func as i64 + 5 + rel as i64, page as i64 + 22);
    }

    #[test]
    fn refuses_what_cannot_move() {
        assert_eq!(
            plan(&[0xc3, 0x90, 0x90, 0x90, 0x90], 0x1000, 0x2000, 0),
            Err("the function is shorter than the jump")
        );
        // je back to the first nop, then nops.
        assert_eq!(
            plan(&[0x90, 0x74, 0xfd, 0x90, 0x90, 0x90], 0x1000, 0x2000, 0),
            Err("a branch among the moved instructions lands inside them")
        );
        assert!(plan(
            &[0x90, 0x90, 0x90, 0x90, 0x90, 0x90],
            0x1000_0000_0000,
            0x1000,
            0
        )
        .is_err());
    }
}

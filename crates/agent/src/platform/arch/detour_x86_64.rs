//! Inline patching (a detour) for a function no import slot reaches: an
//! allocator linked into the executable, which every module's `malloc`
//! binds to ahead of the preloaded agent.
//!
//! The function's first whole instructions, at least the 5 bytes of a
//! `jmp rel32`, are decoded (iced-x86), moved into a trampoline page
//! mapped within 2 GiB of the function, re-encoded there for their new
//! address (iced-x86's block encoder rewrites rip-relative operands and
//! relative branches), and followed by an absolute jump back to the first
//! instruction not moved. The function's entry becomes a `jmp rel32` to a
//! stub in the same page, an absolute jump to the hook. Calling the
//! trampoline is calling the original function.
//!
//! Refused, with the function left as it was: bytes that do not decode, a
//! function that returns or jumps away before 5 bytes, or a branch among
//! the moved instructions whose target is inside them. The entry is
//! written with a plain store, so only while no other thread can run it
//! (the constructor, before the program's threads).

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, OpKind,
};

/// Bytes of `jmp rel32`.
const JMP_REL32: usize = 5;
/// Bytes of `jmp [rip+0]` and its 8-byte target.
const JMP_ABS: usize = 14;
/// The most bytes read at the entry: enough for the longest instructions.
const READ: usize = 32;
/// Where trampoline pages may be: within this distance of the function.
const REACH: usize = 1 << 31;

/// Why a function cannot be detoured.
pub type Refusal = &'static str;

/// Points `func`'s entry at `hook`; the trampoline that calls the
/// original function.
///
/// # Safety
/// `func` is the entry of a function in a mapped, executable module, and
/// no other thread runs its first bytes while this writes them.
pub unsafe fn install(func: usize, hook: usize) -> Result<usize, Refusal> {
    // SAFETY: the caller's function entry: READ bytes of code in its module.
    let code = unsafe { core::slice::from_raw_parts(func as *const u8, READ) };
    let mut decoder = Decoder::with_ip(64, code, func as u64, DecoderOptions::NONE);
    let mut moved: Vec<Instruction> = Vec::new();
    let mut len = 0;
    while len < JMP_REL32 {
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
    let span = func as u64..(func + len) as u64;
    if moved.iter().any(|i| {
        matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        ) && span.contains(&i.near_branch_target())
    }) {
        return Err("a branch among the moved instructions lands inside them");
    }
    let page = near_page(func).ok_or("no page within reach of the function")?;
    // The trampoline: the moved instructions, then back to the rest.
    let block = InstructionBlock::new(&moved, page as u64);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(|_| "the moved instructions cannot be encoded at the trampoline")?;
    let mut tramp = encoded.code_buffer;
    tramp.extend_from_slice(&abs_jump(func + len));
    // The stub the entry jumps to: on to the hook.
    let stub = page + tramp.len();
    tramp.extend_from_slice(&abs_jump(hook));
    let page_size = page_size();
    if tramp.len() > page_size {
        return Err("the trampoline does not fit its page");
    }
    // SAFETY: our own fresh page, writable until made executable below.
    unsafe {
        core::ptr::copy_nonoverlapping(tramp.as_ptr(), page as *mut u8, tramp.len());
        if libc::mprotect(
            page as *mut libc::c_void,
            page_size,
            libc::PROT_READ | libc::PROT_EXEC,
        ) != 0
        {
            return Err("the kernel refused to make the trampoline executable");
        }
    }
    let rel = stub as i64 - (func + JMP_REL32) as i64;
    let mut entry = [0xccu8; READ];
    entry[0] = 0xe9;
    entry[1..5].copy_from_slice(&(rel as i32).to_le_bytes());
    let first = func & !(page_size - 1);
    let last = (func + len - 1) & !(page_size - 1);
    let pages = last - first + page_size;
    // SAFETY: the function's own pages, made writable for the copy of the
    // entry and executable again; the caller's contract keeps every other
    // thread off these bytes meanwhile.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        if libc::mprotect(first as *mut libc::c_void, pages, rwx) != 0 {
            return Err("the kernel refused to make the function writable");
        }
        core::ptr::copy_nonoverlapping(entry.as_ptr(), func as *mut u8, len);
        libc::mprotect(
            first as *mut libc::c_void,
            pages,
            libc::PROT_READ | libc::PROT_EXEC,
        );
    }
    Ok(page)
}

/// `jmp [rip+0]` followed by its target.
fn abs_jump(to: usize) -> [u8; JMP_ABS] {
    let mut b = [0u8; JMP_ABS];
    b[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    b[6..].copy_from_slice(&(to as u64).to_le_bytes());
    b
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// A fresh writable page within `REACH` of `addr`: tried below it first
/// (below an executable there is usually room), then above.
fn near_page(addr: usize) -> Option<usize> {
    let size = page_size();
    let step = 1 << 20;
    let base = addr & !(step - 1);
    let candidates = (1..2000usize)
        .map(|k| base.wrapping_sub(k * step))
        .chain((1..2000usize).map(|k| base + k * step));
    for hint in candidates {
        if hint.abs_diff(addr) >= REACH - size || hint < 0x10000 {
            continue;
        }
        // SAFETY: an anonymous private mapping at a hint, which the kernel
        // may move (MAP_FIXED_NOREPLACE refuses rather than replaces).
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return Some(p as usize);
        }
    }
    None
}

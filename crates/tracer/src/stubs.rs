//! The page of stubs: each trapped function's entry jumps (through its
//! detour) to a stub that stops the thread with `int3` where the recorder
//! needs it, calls the original through the detour's trampoline, and
//! returns to the caller.
//!
//! An allocating function's stub:
//!
//! ```text
//!   int3                  ; the call: nested in another trapped call?
//!   push rdi; push rsi; push rdx    ; the arguments, for the return stop
//!   call trampoline       ; the function itself (rsp is 16-byte aligned)
//!   int3                  ; the return: rax, the saved arguments, and
//!   add rsp, 24           ;   the caller's return address at rsp+24
//!   ret
//! ```
//!
//! `operator delete`'s is the same (it calls `free`, which must be seen
//! as nested). `free`'s and `exit`'s: `int3; jmp trampoline` (stopped at
//! the call, before the block can be reused or the process ends). Continuing a
//! stopped thread with nothing changed always resumes the program's own
//! work: the recorder only reads at a stop, except to skip an invalid
//! release (as the agent does not pass one on).

use nix::unistd::Pid;

use crate::elf::{Entry, Trap};
use crate::remote::{self, Memory};

/// Bytes of a slot: the detour's trampoline, then the stub.
const SLOT: u64 = 128;
/// Where the stub starts in its slot.
const STUB_AT: u64 = 104;
/// The stub page: room for every slot.
pub const PAGE: u64 = 8192;

/// Where a thread stopped in the stubs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Call(usize),
    Return(usize),
}

pub struct Stubs {
    pub page: u64,
    /// Per trapped entry: its address in the process, and what the detour
    /// overwrote there (put back in a forked child).
    pub patched: Vec<(u64, Vec<u8>)>,
}

impl Stubs {
    /// The stop an `int3` at `pc - 1` is, if it is one of the stubs'.
    pub fn stop_at(&self, pc: u64, entries: &[Entry]) -> Option<Stop> {
        let at = pc.checked_sub(1)?.checked_sub(self.page)?;
        let i = (at / SLOT) as usize;
        let off = at % SLOT;
        let entry = entries.get(i)?;
        match (entry.trap, off.checked_sub(STUB_AT)?) {
            (_, 0) => Some(Stop::Call(i)),
            (Trap::Allocation(_) | Trap::Delete(_), 9) => Some(Stop::Return(i)),
            _ => None,
        }
    }
}

/// Maps the stub page near the program and detours every entry (at its
/// process address: `bias` added) while `tid`, the only thread, is stopped
/// at its first instruction. Entries that cannot be detoured are returned
/// with why, and left as they were.
pub fn install(
    tid: Pid,
    mem: &Memory,
    entries: &[Entry],
    bias: u64,
    lowest: u64,
    highest: u64,
) -> Result<(Stubs, Vec<(String, String)>), String> {
    if entries.len() as u64 * SLOT > PAGE {
        return Err("too many trapped functions for the stub page".into());
    }
    let page = map_near(tid, mem, lowest, highest)?;
    let mut code = vec![0xccu8; PAGE as usize];
    let mut patched = Vec::new();
    let mut refused = Vec::new();
    let mut entries_planned = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let func = e.addr + bias;
        let slot = page + i as u64 * SLOT;
        let stub = slot + STUB_AT;
        let Some(original) = mem.read_vec(func, trapline_detour::READ) else {
            refused.push((e.name.to_string(), "its code cannot be read".into()));
            continue;
        };
        let d = match trapline_detour::plan(&original, func, slot, stub) {
            Ok(d) if d.trampoline.len() as u64 <= STUB_AT => d,
            Ok(_) => {
                refused.push((e.name.to_string(), "its trampoline is too long".into()));
                continue;
            }
            Err(why) => {
                refused.push((e.name.to_string(), why.to_string()));
                continue;
            }
        };
        let at = (slot - page) as usize;
        code[at..at + d.trampoline.len()].copy_from_slice(&d.trampoline);
        let s = at + STUB_AT as usize;
        let call_to_slot = |from_end: u64| (slot as i64 - from_end as i64) as i32;
        match e.trap {
            Trap::Allocation(_) | Trap::Delete(_) => {
                code[s..s + 4].copy_from_slice(&[0xcc, 0x57, 0x56, 0x52]);
                code[s + 4] = 0xe8;
                code[s + 5..s + 9].copy_from_slice(&call_to_slot(stub + 9).to_le_bytes());
                code[s + 9..s + 15].copy_from_slice(&[0xcc, 0x48, 0x83, 0xc4, 0x18, 0xc3]);
            }
            Trap::Release(_) | Trap::Exit => {
                code[s] = 0xcc;
                code[s + 1] = 0xe9;
                code[s + 2..s + 6].copy_from_slice(&call_to_slot(stub + 6).to_le_bytes());
            }
        }
        entries_planned.push((func, d.entry, original[..d.moved].to_vec()));
    }
    mem.write(page, &code)?;
    // The entries last: every stub they reach is in place.
    for (func, entry, original) in entries_planned {
        mem.write(func, &entry)?;
        patched.push((func, original));
    }
    Ok((Stubs { page, patched }, refused))
}

/// A page within a `jmp rel32`'s reach of `[lowest, highest)`: below it
/// first (a non-PIE program's break area grows above it), then above.
fn map_near(tid: Pid, mem: &Memory, lowest: u64, highest: u64) -> Result<u64, String> {
    const MMAP: u64 = 9;
    const PROT_READ_EXEC: u64 = 0x1 | 0x4;
    const MAP_PRIVATE_ANONYMOUS_FIXED_NOREPLACE: u64 = 0x02 | 0x20 | 0x100000;
    const STEP: u64 = 1 << 20;
    let reach = trapline_detour::REACH - 2 * PAGE;
    let below = (1..1024u64)
        .filter_map(|k| (lowest & !(STEP - 1)).checked_sub(k * STEP))
        .filter(|&h| h >= 0x10000 && highest - h < reach);
    let above = (1..1024u64)
        .map(|k| ((highest + STEP - 1) & !(STEP - 1)) + (k + 64) * STEP)
        .filter(|&h| h + PAGE - lowest < reach);
    for hint in below.chain(above) {
        let r = remote::syscall(
            tid,
            mem,
            MMAP,
            [
                hint,
                PAGE,
                PROT_READ_EXEC,
                MAP_PRIVATE_ANONYMOUS_FIXED_NOREPLACE,
                u64::MAX,
                0,
            ],
        )?;
        if r as u64 == hint {
            return Ok(hint);
        }
    }
    Err("no free page within reach of the program's code".into())
}

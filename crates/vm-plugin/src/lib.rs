//! trapline's QEMU plugin: runs inside `qemu-system-x86_64` while it
//! replays a recording, traps the calls named in a plan file at their
//! guest addresses, pairs each trapped call with its return, and writes
//! what it read (registers, the stack, the result) to a raw log.
//!
//! It interprets nothing: which addresses are allocators, which process
//! is traced and what the calls mean is decided by `trapline vm replay`,
//! which writes the plan and turns the raw log into a trace. The two talk
//! only through these two files, so this crate, which links QEMU's
//! GPL-2.0-or-later plugin API, shares no code with the rest of trapline.
//!
//! Plan file, one directive a line (numbers in hex unless said):
//! - `stack N` (decimal): bytes of stack to copy at a `raw` trap;
//! - `trap ADDR ID SPACE STACK RET WHO PEEK OUT`: trap the instruction at
//!   ADDR;
//!   ID (decimal) names it in the log; SPACE is `user` or `kernel`;
//!   STACK is `raw` (copy the stack), `scan` (the return addresses found on
//!   the stack, as the kernel's own stack dump finds them), `array` (not
//!   the stack: the second argument's count of words from the array the
//!   third points to, as a bulk free passes its blocks) or `none`; RET
//!   is `ret` (also report the return) or `noret`; WHO is `any` or
//!   `process` (only in the traced process's address space: the one that
//!   first hits a `user` trap, until it hits an `end` trap) or `end` (the
//!   traced process's end: its address space is torn down, and may be
//!   reused by others); PEEK is `-` or an offset: read the word
//!   at the first argument plus it at the call (a field of a structure
//!   passed); OUT is `out` to read the word the first argument points to
//!   at the return (a result passed back through a pointer), `out+OFF` to
//!   read the word at the first argument plus OFF then (a field the call
//!   wrote), else `-`;
//! - `watch START END`: the returns (`ret`) in this code range can end a
//!   trapped call;
//! - `ktext START END`: kernel code, where `scan` looks for return
//!   addresses;
//! - `sample N` (decimal): a CPU sample of the traced process every N
//!   guest instructions (at the first block entered after N more ran).
//!
//! Raw log: the magic `TLVMRAW1`, then records, little-endian:
//! - `1` enter: trap id u32, call number u64, instruction count u64, cr3
//!   u64, fs_base u64, rip rsp rbp rdi rsi rdx rcx r8 r9 (u64 each), the
//!   peeked word u64, stack kind u8 (0 none, 1 raw bytes, 2 addresses), length u32, the bytes or
//!   addresses;
//! - `2` return: call number u64, instruction count u64, rax u64, the
//!   word read through the first argument u64;
//! - `3` end: instruction count u64, calls trapped u64, returns u64,
//!   calls whose return was never seen u64;
//! - `4` sample: instruction count u64, cr3 u64, fs_base u64, rip rsp rbp
//!   (u64 each), the user rip rsp rbp (the same in user mode; in the
//!   kernel, those its entry saved at the top of the task's stack, or 0),
//!   length u32 and the user stack's bytes from the user rsp up.
//!
//! The instruction count is the guest's, counted at each translated
//! block's entry: the same in every replay of one recording.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Mutex;

type PluginId = u64;

#[repr(C)]
pub struct QemuInfo {
    target_name: *const c_char,
    version_min: c_int,
    version_cur: c_int,
    system_emulation: bool,
    smp_vcpus: c_int,
    max_vcpus: c_int,
}

/// glib's `GArray` and `GByteArray` start alike.
#[repr(C)]
struct GArray {
    data: *mut u8,
    len: c_uint,
}

#[repr(C)]
struct RegDescriptor {
    handle: *mut c_void,
    name: *const c_char,
    feature: *const c_char,
}

/// `qemu_plugin_u64`: one u64 of each vCPU's entry in a scoreboard.
#[repr(C)]
#[derive(Clone, Copy)]
struct ScoreU64 {
    score: *mut c_void,
    offset: usize,
}

const CB_R_REGS: c_int = 1;
const COND_NE: c_int = 3;
const COND_GE: c_int = 7;
const INLINE_ADD_U64: c_int = 0;

extern "C" {
    fn qemu_plugin_register_vcpu_tb_trans_cb(
        id: PluginId,
        cb: extern "C" fn(PluginId, *mut c_void),
    );
    fn qemu_plugin_register_vcpu_init_cb(id: PluginId, cb: extern "C" fn(PluginId, c_uint));
    fn qemu_plugin_register_atexit_cb(
        id: PluginId,
        cb: extern "C" fn(PluginId, *mut c_void),
        userdata: *mut c_void,
    );
    fn qemu_plugin_tb_n_insns(tb: *const c_void) -> usize;
    fn qemu_plugin_tb_vaddr(tb: *const c_void) -> u64;
    fn qemu_plugin_tb_get_insn(tb: *const c_void, idx: usize) -> *mut c_void;
    fn qemu_plugin_insn_data(insn: *const c_void, dest: *mut c_void, len: usize) -> usize;
    fn qemu_plugin_insn_vaddr(insn: *const c_void) -> u64;
    fn qemu_plugin_register_vcpu_insn_exec_cb(
        insn: *mut c_void,
        cb: extern "C" fn(c_uint, *mut c_void),
        flags: c_int,
        userdata: *mut c_void,
    );
    fn qemu_plugin_register_vcpu_insn_exec_cond_cb(
        insn: *mut c_void,
        cb: extern "C" fn(c_uint, *mut c_void),
        flags: c_int,
        cond: c_int,
        entry: ScoreU64,
        imm: u64,
        userdata: *mut c_void,
    );
    fn qemu_plugin_register_vcpu_tb_exec_cond_cb(
        tb: *mut c_void,
        cb: extern "C" fn(c_uint, *mut c_void),
        flags: c_int,
        cond: c_int,
        entry: ScoreU64,
        imm: u64,
        userdata: *mut c_void,
    );
    fn qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(
        tb: *mut c_void,
        op: c_int,
        entry: ScoreU64,
        imm: u64,
    );
    fn qemu_plugin_scoreboard_new(element_size: usize) -> *mut c_void;
    fn qemu_plugin_scoreboard_find(score: *mut c_void, vcpu_index: c_uint) -> *mut c_void;
    fn qemu_plugin_get_registers() -> *mut GArray;
    fn qemu_plugin_read_register(handle: *mut c_void, buf: *mut GArray) -> c_int;
    fn qemu_plugin_read_memory_vaddr(addr: u64, data: *mut GArray, len: usize) -> bool;
    fn qemu_plugin_outs(string: *const c_char);
    fn g_byte_array_new() -> *mut GArray;
    fn g_array_free(array: *mut GArray, free_segment: c_int) -> *mut c_char;
}

/// The plugin API version this plugin is written against (QEMU 9.2 and
/// later: `qemu_plugin_read_memory_vaddr`).
#[no_mangle]
pub static qemu_plugin_version: c_int = 4;

#[derive(Clone, Copy, PartialEq)]
enum StackCopy {
    None,
    Raw,
    Scan,
    Array,
}

#[derive(Clone, Copy)]
struct Trap {
    id: u32,
    kernel: bool,
    stack: StackCopy,
    wants_return: bool,
    process_only: bool,
    peek: Option<u64>,
    /// Read the word at the first argument plus this at the return.
    out: Option<u64>,
    ends: bool,
}

#[derive(Default)]
struct Plan {
    stack_bytes: usize,
    traps: HashMap<u64, Trap>,
    watched: Vec<(u64, u64)>,
    kernel_text: Vec<(u64, u64)>,
    /// Instructions between two CPU samples; 0: no sampling.
    sample_every: u64,
}

/// The registers read at a trap, by their names in QEMU's x86-64 gdb
/// description.
const REGS: [&str; 12] = [
    "rip", "rsp", "rbp", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "rax", "cr3", "fs_base",
];
const RIP: usize = 0;
const RSP: usize = 1;
const RBP: usize = 2;
const RDI: usize = 3;
const RSI: usize = 4;
const RDX: usize = 5;
const RAX: usize = 9;
const CR3: usize = 10;
const FS_BASE: usize = 11;

/// A trapped call whose return is awaited.
struct Pending {
    call: u64,
    /// Where the return address was: `ret` finds rsp here again.
    rsp: u64,
    return_address: u64,
    space: u64,
    /// The thread pointer: user threads of one process share `space`.
    thread: u64,
    /// Where to read a result passed back through a pointer.
    out: Option<u64>,
}

struct State {
    out: BufWriter<File>,
    registers: Option<[*mut c_void; 12]>,
    scratch: *mut GArray,
    traced_space: Option<u64>,
    /// The traced process has ended: `process` traps fire no more.
    ended: bool,
    pending: Vec<Pending>,
    calls: u64,
    returns: u64,
    abandoned: u64,
    write_failed: bool,
}

// SAFETY: the raw pointers are QEMU's register handles and a glib array
// owned by this plugin; every use is under the STATE mutex.
unsafe impl Send for State {}

static PLAN: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Per vCPU: the instruction count (offset 0), the number of calls
/// awaiting their return (offset 8), read inline by the `ret` condition,
/// and the instructions since the last CPU sample (offset 16), read
/// inline by the sampling condition.
static SCOREBOARD: std::sync::atomic::AtomicPtr<c_void> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// At most this many calls await their return; the oldest is given up
/// (counted) beyond it.
const MAX_PENDING: usize = 4096;
/// Return addresses kept by a `scan` stack.
const MAX_SCANNED: usize = 48;
/// The most words an `array` trap copies.
const MAX_ARRAY: u64 = 4096;
/// x86-64 kernel stacks are 16 KiB and aligned to their size.
const KERNEL_STACK: u64 = 16 << 10;

fn cr3_space(cr3: u64) -> u64 {
    // Drop the PCID (bits 0-11) and bit 12, which tells the two halves of a
    // page-table pair apart under page-table isolation.
    cr3 & 0x000f_ffff_ffff_e000
}

fn score(offset: usize) -> ScoreU64 {
    ScoreU64 {
        score: SCOREBOARD.load(std::sync::atomic::Ordering::Relaxed),
        offset,
    }
}

fn score_ptr(vcpu: c_uint, offset: usize) -> *mut u64 {
    let board = SCOREBOARD.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the scoreboard was made with 24-byte entries in install and
    // lives for the plugin's lifetime; QEMU returns this vCPU's entry.
    unsafe { (qemu_plugin_scoreboard_find(board, vcpu) as *mut u8).add(offset) as *mut u64 }
}

fn outs(message: &str) {
    let text = std::ffi::CString::new(message).unwrap_or_default();
    // SAFETY: a NUL-terminated string that outlives the call.
    unsafe { qemu_plugin_outs(text.as_ptr()) }
}

fn parse_plan(text: &str) -> Result<Plan, String> {
    let hex = |s: &str| {
        u64::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("{s}: {e}"))
    };
    let mut plan = Plan {
        stack_bytes: 4096,
        ..Plan::default()
    };
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["stack", n] => plan.stack_bytes = n.parse().map_err(|e| format!("{n}: {e}"))?,
            ["trap", addr, id, space, stack, ret, who, peek, out] => {
                let trap = Trap {
                    id: id.parse().map_err(|e| format!("{id}: {e}"))?,
                    kernel: *space == "kernel",
                    stack: match *stack {
                        "raw" => StackCopy::Raw,
                        "scan" => StackCopy::Scan,
                        "array" => StackCopy::Array,
                        _ => StackCopy::None,
                    },
                    wants_return: *ret == "ret",
                    process_only: *who == "process",
                    peek: match *peek {
                        "-" => None,
                        p => Some(hex(p)?),
                    },
                    out: match *out {
                        "out" => Some(0),
                        o => match o.strip_prefix("out+") {
                            Some(off) => Some(hex(off)?),
                            None => None,
                        },
                    },
                    ends: *who == "end",
                };
                plan.traps.insert(hex(addr)?, trap);
            }
            ["watch", a, b] => plan.watched.push((hex(a)?, hex(b)?)),
            ["ktext", a, b] => plan.kernel_text.push((hex(a)?, hex(b)?)),
            ["sample", n] => plan.sample_every = n.parse().map_err(|e| format!("{n}: {e}"))?,
            _ => return Err(format!("cannot read the plan line {line:?}")),
        }
    }
    plan.watched.sort_unstable();
    plan.kernel_text.sort_unstable();
    Ok(plan)
}

fn within(ranges: &[(u64, u64)], addr: u64) -> bool {
    let i = ranges.partition_point(|r| r.0 <= addr);
    i > 0 && addr < ranges[i - 1].1
}

/// Whether the instruction is a near return (`ret`, `ret imm16`, with
/// prefixes such as `repz`).
fn is_return(bytes: &[u8]) -> bool {
    let body = bytes
        .iter()
        .position(|b| !matches!(b, 0xf2 | 0xf3 | 0x66 | 0x40..=0x4f))
        .map_or(&[][..], |i| &bytes[i..]);
    matches!(body.first(), Some(0xc3) | Some(0xc2))
}

/// Whether the bytes just before `after` end with a call instruction.
fn follows_call(before: &[u8; 8]) -> bool {
    let at = |back: usize| before[8 - back];
    at(5) == 0xe8
        || (at(2) == 0xff && at(1) & 0x38 == 0x10)
        || (at(3) == 0xff && at(2) & 0x38 == 0x10)
        || (at(6) == 0xff && at(5) & 0x38 == 0x10)
        || (at(7) == 0xff && at(6) & 0x38 == 0x10)
}

/// Data attached to an instrumented instruction.
struct Site {
    /// The trap's address, or 0 for a watched `ret`.
    trap_address: u64,
    /// Instructions from this one to the end of its block: the count is
    /// added at the block's entry.
    to_block_end: u64,
}

impl State {
    fn read_register(&mut self, handle: *mut c_void) -> u64 {
        let mut value = [0u8; 8];
        // SAFETY: `scratch` is this plugin's byte array; the handle came
        // from qemu_plugin_get_registers. Called from a callback registered
        // with QEMU_PLUGIN_CB_R_REGS, where reading registers is allowed.
        unsafe {
            (*self.scratch).len = 0;
            let n = qemu_plugin_read_register(handle, self.scratch);
            if n > 0 {
                let n = (n as usize).min(8);
                std::ptr::copy_nonoverlapping((*self.scratch).data, value.as_mut_ptr(), n);
            }
        }
        u64::from_le_bytes(value)
    }

    fn registers(&mut self) -> [u64; 12] {
        let handles = match self.registers {
            Some(h) => h,
            None => return [0; 12],
        };
        let mut values = [0u64; 12];
        for (v, h) in values.iter_mut().zip(handles) {
            *v = if h.is_null() {
                0
            } else {
                self.read_register(h)
            };
        }
        values
    }

    /// Guest memory at `addr`, or None where it is not mapped.
    fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        // SAFETY: as in read_register; QEMU fills the array with `len`
        // bytes when it returns true.
        unsafe {
            (*self.scratch).len = 0;
            if !qemu_plugin_read_memory_vaddr(addr, self.scratch, buf.len()) {
                return false;
            }
            if ((*self.scratch).len as usize) < buf.len() {
                return false;
            }
            std::ptr::copy_nonoverlapping((*self.scratch).data, buf.as_mut_ptr(), buf.len());
        }
        true
    }

    fn word(&mut self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read_memory(addr, &mut b)
            .then(|| u64::from_le_bytes(b))
    }

    /// The stack from `rsp` up, page by page until one is not mapped.
    fn raw_stack(&mut self, rsp: u64, limit: usize) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(limit);
        let mut at = rsp;
        while bytes.len() < limit {
            let page_left = (0x1000 - (at & 0xfff)) as usize;
            let n = page_left.min(limit - bytes.len());
            let mut chunk = vec![0u8; n];
            if !self.read_memory(at, &mut chunk) {
                break;
            }
            bytes.extend_from_slice(&chunk);
            at += n as u64;
        }
        bytes
    }

    /// The words on a kernel stack that point into kernel code just after
    /// a call instruction, each with the call's target when it is direct.
    fn scanned_stack(&mut self, plan: &Plan, rsp: u64, limit: usize) -> Vec<(u64, u64)> {
        let top = (rsp | (KERNEL_STACK - 1)) + 1;
        let len = ((top - rsp) as usize).min(limit);
        let bytes = self.raw_stack(rsp, len);
        let mut found = Vec::new();
        for word in bytes.chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            if !within(&plan.kernel_text, w) {
                continue;
            }
            let mut before = [0u8; 8];
            if self.read_memory(w - 8, &mut before) && follows_call(&before) {
                let target = if before[3] == 0xe8 {
                    let rel = i32::from_le_bytes(before[4..8].try_into().expect("4 bytes"));
                    w.wrapping_add(rel as i64 as u64)
                } else {
                    0
                };
                found.push((w, target));
                if found.len() == MAX_SCANNED {
                    break;
                }
            }
        }
        found
    }

    fn write(&mut self, bytes: &[u8]) {
        if !self.write_failed && self.out.write_all(bytes).is_err() {
            self.write_failed = true;
            outs("trapline plugin: cannot write the raw log\n");
        }
    }

    fn enter(&mut self, plan: &Plan, trap: Trap, icount: u64, vcpu: c_uint) {
        let regs = self.registers();
        let space = cr3_space(regs[CR3]);
        if !trap.kernel && self.traced_space.is_none() {
            self.traced_space = Some(space);
        }
        if trap.kernel && self.traced_space.is_none() {
            // Before the traced process starts, no kernel call concerns it:
            // a free then can release no block it allocated.
            return;
        }
        if (trap.process_only || trap.ends) && (self.ended || self.traced_space != Some(space)) {
            return;
        }
        if trap.ends {
            self.ended = true;
        }
        let rsp = regs[RSP];
        let return_address = if trap.wants_return {
            match self.word(rsp) {
                Some(ra) => ra,
                None => return,
            }
        } else {
            0
        };
        self.calls += 1;
        let call = self.calls;
        let mut record = Vec::with_capacity(128);
        record.push(1u8);
        record.extend_from_slice(&trap.id.to_le_bytes());
        record.extend_from_slice(&call.to_le_bytes());
        record.extend_from_slice(&icount.to_le_bytes());
        record.extend_from_slice(&regs[CR3].to_le_bytes());
        record.extend_from_slice(&regs[FS_BASE].to_le_bytes());
        for r in &regs[RIP..RAX] {
            record.extend_from_slice(&r.to_le_bytes());
        }
        let peeked = match trap.peek {
            Some(offset) => self.word(regs[RDI].wrapping_add(offset)).unwrap_or(0),
            None => 0,
        };
        record.extend_from_slice(&peeked.to_le_bytes());
        match trap.stack {
            StackCopy::None => {
                record.push(0);
                record.extend_from_slice(&0u32.to_le_bytes());
            }
            StackCopy::Raw => {
                let bytes = self.raw_stack(rsp, plan.stack_bytes);
                record.push(1);
                record.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                record.extend_from_slice(&bytes);
            }
            StackCopy::Array => {
                let count = regs[RSI].min(MAX_ARRAY) as usize;
                let mut words = vec![0u8; count * 8];
                if !self.read_memory(regs[RDX], &mut words) {
                    words.clear();
                }
                record.push(3);
                record.extend_from_slice(&(words.len() as u32).to_le_bytes());
                record.extend_from_slice(&words);
            }
            StackCopy::Scan => {
                let found = self.scanned_stack(plan, rsp, plan.stack_bytes);
                record.push(2);
                record.extend_from_slice(&((found.len() * 16) as u32).to_le_bytes());
                for (w, target) in found {
                    record.extend_from_slice(&w.to_le_bytes());
                    record.extend_from_slice(&target.to_le_bytes());
                }
            }
        }
        self.write(&record);
        if trap.wants_return {
            if self.pending.len() == MAX_PENDING {
                self.pending.remove(0);
                self.abandoned += 1;
            }
            self.pending.push(Pending {
                call,
                rsp,
                return_address,
                space,
                thread: regs[FS_BASE],
                out: trap.out.map(|off| regs[RDI].wrapping_add(off)),
            });
            // SAFETY: this vCPU's scoreboard entry, written only from its
            // own callbacks.
            unsafe { *score_ptr(vcpu, 8) = self.pending.len() as u64 }
        }
    }

    /// A CPU sample, when the vCPU runs the traced process (its user code
    /// or the kernel on its behalf).
    fn sample(&mut self, plan: &Plan, icount: u64, block: u64) {
        let regs = self.registers();
        if self.ended || self.traced_space != Some(cr3_space(regs[CR3])) {
            return;
        }
        // QEMU's rip is not kept up to date inside a block: the sample is
        // at the block's start.
        let (rip, rsp, rbp) = (block, regs[RSP], regs[RBP]);
        let user = if rip >> 63 == 0 {
            Some((rip, rsp, rbp))
        } else {
            self.user_registers_saved(rsp)
        };
        let (urip, ursp, urbp) = user.unwrap_or((0, 0, 0));
        let bytes = if user.is_some() {
            self.raw_stack(ursp, plan.stack_bytes)
        } else {
            Vec::new()
        };
        let mut record = Vec::with_capacity(80 + bytes.len());
        record.push(4u8);
        for v in [
            icount,
            regs[CR3],
            regs[FS_BASE],
            rip,
            rsp,
            rbp,
            urip,
            ursp,
            urbp,
        ] {
            record.extend_from_slice(&v.to_le_bytes());
        }
        record.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        record.extend_from_slice(&bytes);
        self.write(&record);
    }

    /// The user rip, rsp and rbp the kernel's entry saved (`struct
    /// pt_regs`, 21 words at the top of the task's 16 KiB stack), when
    /// `rsp` is on that stack and the saved code segment is user mode's.
    fn user_registers_saved(&mut self, rsp: u64) -> Option<(u64, u64, u64)> {
        const USER_CS: u64 = 0x33;
        let top = (rsp | (KERNEL_STACK - 1)).wrapping_add(1);
        let regs = top.wrapping_sub(21 * 8);
        let word = |s: &mut Self, i: u64| s.word(regs + i * 8);
        if word(self, 17)? != USER_CS {
            return None;
        }
        let (rip, sp, rbp) = (word(self, 16)?, word(self, 19)?, word(self, 4)?);
        (rip >> 47 == 0 && sp >> 47 == 0).then_some((rip, sp, rbp))
    }

    fn returning(&mut self, icount: u64, vcpu: c_uint) {
        let rsp = {
            let handles = match self.registers {
                Some(h) => h,
                None => return,
            };
            self.read_register(handles[RSP])
        };
        if !self.pending.iter().any(|p| p.rsp == rsp) {
            return;
        }
        let regs = self.registers();
        let space = cr3_space(regs[CR3]);
        let kernel = rsp >> 63 == 1;
        let same_stack = |q: &Pending| {
            if kernel {
                q.rsp >> 63 == 1 && q.rsp / KERNEL_STACK == rsp / KERNEL_STACK
            } else {
                q.rsp >> 63 == 0 && q.space == space && q.thread == regs[FS_BASE]
            }
        };
        let Some(i) = self
            .pending
            .iter()
            .rposition(|p| p.rsp == rsp && same_stack(p))
        else {
            return;
        };
        let expected = self.pending[i].return_address;
        if self.word(rsp) != Some(expected) {
            return;
        }
        // Every call that returns here: a call that jumped to another
        // (a tail call: kvfree to kfree) returns with it, at its `ret`.
        let returning: Vec<(u64, Option<u64>)> = self
            .pending
            .iter()
            .rev()
            .filter(|q| q.rsp == rsp && q.return_address == expected && same_stack(q))
            .map(|q| (q.call, q.out))
            .collect();
        // Calls deeper on this stack that never returned (a longjmp, an
        // exception) are given up.
        let before = self.pending.len();
        self.pending.retain(|q| !(q.rsp <= rsp && same_stack(q)));
        self.abandoned += (before - self.pending.len() - returning.len()) as u64;
        for (call, out) in returning {
            self.returns += 1;
            let mut record = Vec::with_capacity(33);
            record.push(2u8);
            record.extend_from_slice(&call.to_le_bytes());
            record.extend_from_slice(&icount.to_le_bytes());
            record.extend_from_slice(&regs[RAX].to_le_bytes());
            let through = out.and_then(|p| self.word(p)).unwrap_or(0);
            record.extend_from_slice(&through.to_le_bytes());
            self.write(&record);
        }
        // SAFETY: as in enter.
        unsafe { *score_ptr(vcpu, 8) = self.pending.len() as u64 }
    }
}

fn icount_at(vcpu: c_uint, site: &Site) -> u64 {
    // SAFETY: this vCPU's entry; the block's count was added at its entry.
    let counted = unsafe { *score_ptr(vcpu, 0) };
    counted.saturating_sub(site.to_block_end)
}

extern "C" fn on_trap(vcpu: c_uint, userdata: *mut c_void) {
    // SAFETY: userdata is a leaked `Site` made in on_translate.
    let site = unsafe { &*(userdata as *const Site) };
    let Some(plan) = PLAN.get() else { return };
    let Some(trap) = plan.traps.get(&site.trap_address).copied() else {
        return;
    };
    let icount = icount_at(vcpu, site);
    if let Ok(mut guard) = STATE.lock() {
        if let Some(state) = guard.as_mut() {
            state.enter(plan, trap, icount, vcpu);
        }
    }
}

extern "C" fn on_return(vcpu: c_uint, userdata: *mut c_void) {
    // SAFETY: as in on_trap.
    let site = unsafe { &*(userdata as *const Site) };
    let icount = icount_at(vcpu, site);
    if let Ok(mut guard) = STATE.lock() {
        if let Some(state) = guard.as_mut() {
            state.returning(icount, vcpu);
        }
    }
}

/// A translated block, for its sampling callback.
struct Block {
    start: u64,
    instructions: u64,
}

extern "C" fn on_sample(vcpu: c_uint, userdata: *mut c_void) {
    let Some(plan) = PLAN.get() else { return };
    // SAFETY: userdata is a leaked `Block` made in on_translate.
    let block = unsafe { &*(userdata as *const Block) };
    // SAFETY: this vCPU's entries, written only from its own callbacks;
    // the block's count was added at its entry, before this callback.
    let icount = unsafe {
        *score_ptr(vcpu, 16) -= plan.sample_every;
        (*score_ptr(vcpu, 0)).saturating_sub(block.instructions)
    };
    if let Ok(mut guard) = STATE.lock() {
        if let Some(state) = guard.as_mut() {
            state.sample(plan, icount, block.start);
        }
    }
}

extern "C" fn on_translate(_id: PluginId, tb: *mut c_void) {
    let Some(plan) = PLAN.get() else { return };
    // SAFETY: `tb` is the block QEMU is translating; its instructions are
    // valid during this callback, and registering callbacks on them is
    // what this callback is for.
    unsafe {
        let n = qemu_plugin_tb_n_insns(tb);
        qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, INLINE_ADD_U64, score(0), n as u64);
        if plan.sample_every > 0 {
            // Registered after the count: QEMU runs a block's callbacks in
            // the order they were registered.
            qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(
                tb,
                INLINE_ADD_U64,
                score(16),
                n as u64,
            );
            qemu_plugin_register_vcpu_tb_exec_cond_cb(
                tb,
                on_sample,
                CB_R_REGS,
                COND_GE,
                score(16),
                plan.sample_every,
                Box::into_raw(Box::new(Block {
                    start: qemu_plugin_tb_vaddr(tb),
                    instructions: n as u64,
                })) as *mut c_void,
            );
        }
        for i in 0..n {
            let insn = qemu_plugin_tb_get_insn(tb, i);
            let vaddr = qemu_plugin_insn_vaddr(insn);
            let to_block_end = (n - i) as u64;
            if plan.traps.contains_key(&vaddr) {
                let site = Box::into_raw(Box::new(Site {
                    trap_address: vaddr,
                    to_block_end,
                }));
                qemu_plugin_register_vcpu_insn_exec_cb(
                    insn,
                    on_trap,
                    CB_R_REGS,
                    site as *mut c_void,
                );
            }
            if within(&plan.watched, vaddr) {
                let mut bytes = [0u8; 16];
                let len =
                    qemu_plugin_insn_data(insn, bytes.as_mut_ptr() as *mut c_void, bytes.len());
                if is_return(&bytes[..len.min(16)]) {
                    let site = Box::into_raw(Box::new(Site {
                        trap_address: 0,
                        to_block_end,
                    }));
                    qemu_plugin_register_vcpu_insn_exec_cond_cb(
                        insn,
                        on_return,
                        CB_R_REGS,
                        COND_NE,
                        score(8),
                        0,
                        site as *mut c_void,
                    );
                }
            }
        }
    }
}

extern "C" fn on_vcpu_init(_id: PluginId, _vcpu: c_uint) {
    let Ok(mut guard) = STATE.lock() else { return };
    let Some(state) = guard.as_mut() else { return };
    if state.registers.is_some() {
        return;
    }
    let mut handles = [std::ptr::null_mut(); 12];
    // SAFETY: called in a vCPU's context, where QEMU lists its registers;
    // the array and its descriptors are read, then the array is freed.
    unsafe {
        let list = qemu_plugin_get_registers();
        if list.is_null() {
            return;
        }
        let descriptors =
            std::slice::from_raw_parts((*list).data as *const RegDescriptor, (*list).len as usize);
        for d in descriptors {
            let name = CStr::from_ptr(d.name).to_string_lossy();
            if let Some(i) = REGS.iter().position(|r| *r == name) {
                handles[i] = d.handle;
            }
        }
        g_array_free(list, 1);
    }
    if let Some(missing) = REGS.iter().zip(handles).find(|(_, h)| h.is_null()) {
        outs(&format!(
            "trapline plugin: this QEMU names no register {}\n",
            missing.0
        ));
    }
    state.registers = Some(handles);
}

extern "C" fn on_exit(_id: PluginId, _userdata: *mut c_void) {
    let Ok(mut guard) = STATE.lock() else { return };
    let Some(mut state) = guard.take() else {
        return;
    };
    // SAFETY: vCPU 0's entry; no vCPU runs any more.
    let icount = unsafe { *score_ptr(0, 0) };
    let abandoned = state.abandoned + state.pending.len() as u64;
    let mut record = vec![3u8];
    for v in [icount, state.calls, state.returns, abandoned] {
        record.extend_from_slice(&v.to_le_bytes());
    }
    state.write(&record);
    if state.out.flush().is_err() {
        outs("trapline plugin: cannot write the raw log\n");
    }
}

/// QEMU's entry point: `-plugin PATH,plan=PLAN,out=LOG`.
///
/// # Safety
/// Called by QEMU once, with `argc` valid C strings in `argv`.
#[no_mangle]
pub unsafe extern "C" fn qemu_plugin_install(
    id: PluginId,
    info: *const QemuInfo,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    // SAFETY: QEMU passes a valid info block and argc strings.
    let (target, system, args) = unsafe {
        let target = CStr::from_ptr((*info).target_name)
            .to_string_lossy()
            .into_owned();
        let args: Vec<String> = (0..argc as usize)
            .map(|i| CStr::from_ptr(*argv.add(i)).to_string_lossy().into_owned())
            .collect();
        (target, (*info).system_emulation, args)
    };
    if target != "x86_64" || !system {
        outs("trapline plugin: needs qemu-system-x86_64\n");
        return 1;
    }
    let arg = |key: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    let (Some(plan_path), Some(out_path)) = (arg("plan"), arg("out")) else {
        outs("trapline plugin: needs plan=PATH,out=PATH\n");
        return 1;
    };
    let plan = match std::fs::read_to_string(&plan_path)
        .map_err(|e| format!("{plan_path}: {e}"))
        .and_then(|t| parse_plan(&t))
    {
        Ok(p) => p,
        Err(e) => {
            outs(&format!("trapline plugin: {e}\n"));
            return 1;
        }
    };
    let mut out = match File::create(&out_path) {
        Ok(f) => BufWriter::with_capacity(1 << 20, f),
        Err(e) => {
            outs(&format!("trapline plugin: {out_path}: {e}\n"));
            return 1;
        }
    };
    if out.write_all(b"TLVMRAW1").is_err() {
        return 1;
    }
    let _ = PLAN.set(plan);
    // SAFETY: QEMU's allocators, called from its install callback.
    let (board, scratch) = unsafe { (qemu_plugin_scoreboard_new(24), g_byte_array_new()) };
    SCOREBOARD.store(board, std::sync::atomic::Ordering::Relaxed);
    if let Ok(mut guard) = STATE.lock() {
        *guard = Some(State {
            out,
            registers: None,
            scratch,
            traced_space: None,
            ended: false,
            pending: Vec::new(),
            calls: 0,
            returns: 0,
            abandoned: 0,
            write_failed: false,
        });
    }
    // SAFETY: registering this plugin's callbacks with its own id.
    unsafe {
        qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
        qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
        qemu_plugin_register_atexit_cb(id, on_exit, std::ptr::null_mut());
    }
    0
}

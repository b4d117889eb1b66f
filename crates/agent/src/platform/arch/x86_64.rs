//! x86_64: registers for unwinding and the framehop unwinder types.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::MustNotAllocateDuringUnwind;

pub type ArchUnwinder<D> = UnwinderX86_64<D, MustNotAllocateDuringUnwind>;
pub type UnwindCache = CacheX86_64<MustNotAllocateDuringUnwind>;
pub type UnwindRegs = UnwindRegsX86_64;

/// The registers an unwind starts from: (instruction pointer, stack pointer, frame pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartRegs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// pc is a return address (the frame is calling), not the instruction
    /// the frame is at: its rule is looked up at pc - 1.
    pub pc_is_return_address: bool,
}

impl StartRegs {
    /// The frame of a hook's caller, from a `with_caller_regs!` trampoline:
    /// the return address and the caller's sp and bp at the call.
    #[inline(always)]
    pub fn caller(return_address: u64, sp: u64, bp: u64) -> StartRegs {
        StartRegs {
            pc: return_address,
            sp,
            bp,
            pc_is_return_address: true,
        }
    }
}

/// Reads the caller's pc/sp/bp. Always inlined, so they describe the frame
/// of the function that calls it (a hook), whose CFI the unwinder then follows.
#[inline(always)]
pub fn start_regs() -> StartRegs {
    let pc: u64;
    let sp: u64;
    let bp: u64;
    // SAFETY: reads registers only; no memory access, stack or flags change.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    StartRegs {
        pc,
        sp,
        bp,
        pc_is_return_address: false,
    }
}

/// The registers of the code a signal interrupted, from the handler's
/// `ucontext_t` (the third argument of an SA_SIGINFO handler).
///
/// # Safety
/// `ucontext` must be the context pointer the kernel passed to the handler.
pub unsafe fn interrupted_regs(ucontext: *const libc::c_void) -> StartRegs {
    // SAFETY: the caller passes the kernel's ucontext_t for this signal.
    let gregs = unsafe { &(*(ucontext as *const libc::ucontext_t)).uc_mcontext.gregs };
    StartRegs {
        pc: gregs[libc::REG_RIP as usize] as u64,
        sp: gregs[libc::REG_RSP as usize] as u64,
        bp: gregs[libc::REG_RBP as usize] as u64,
        pc_is_return_address: false,
    }
}

pub fn regs(r: StartRegs) -> UnwindRegs {
    UnwindRegsX86_64::new(r.pc, r.sp, r.bp)
}

pub fn sp_bp(r: &UnwindRegs) -> (u64, u64) {
    (r.sp(), r.bp())
}

/// One frame's unwind rule in the forms x86_64 CFI takes almost everywhere,
/// small enough to share in one word per return site (rules.rs). The
/// return address is always at CFA - 8. These are the rules framehop derives
/// from DWARF on x86_64, with the same meaning; anything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The return address rule is undefined: the outermost frame.
    EndOfStack,
    /// CFA = sp + cfa_offset; bp is unchanged.
    Sp { cfa_offset: u32 },
    /// CFA = sp + cfa_offset; bp = *(CFA - bp_below_cfa).
    SpRestoreBp { cfa_offset: u32, bp_below_cfa: u32 },
    /// CFA = bp + 16; bp = *bp (a frame pointer).
    FramePointer,
    /// The kernel's signal frame (glibc's `__restore_rt`, an FDE marked as
    /// a signal trampoline): sp points at the `ucontext_t` the handler got,
    /// which holds the interrupted pc, sp and bp. The next frame's pc is an
    /// instruction pointer, not a return address.
    SignalFrame,
    /// Anything else (a CFA expression, unusual offsets, no CFI for the
    /// address): framehop unwinds the frame.
    Other,
}

/// Offsets are kept in units of 8 bytes in these many bits.
const RULE_CFA_BITS: u32 = 13;
const RULE_BP_BITS: u32 = 12;
/// Bits of an encoded rule (`Rule::encode`); never all zero.
pub const RULE_BITS: u32 = 3 + RULE_CFA_BITS + RULE_BP_BITS;

impl Rule {
    /// The rule in `RULE_BITS` bits, never 0; `Other` if the offsets do not fit.
    pub fn encode(self) -> u32 {
        let packed = |kind: u32, cfa: u32, bp: u32| {
            let (cfa, bp) = (cfa / 8, bp / 8);
            if cfa >> RULE_CFA_BITS != 0 || bp >> RULE_BP_BITS != 0 {
                return Rule::Other.encode();
            }
            kind | cfa << 3 | bp << (3 + RULE_CFA_BITS)
        };
        match self {
            Rule::EndOfStack => 1,
            Rule::Sp { cfa_offset } => packed(2, cfa_offset, 0),
            Rule::SpRestoreBp {
                cfa_offset,
                bp_below_cfa,
            } => packed(3, cfa_offset, bp_below_cfa),
            Rule::FramePointer => 4,
            Rule::Other => 5,
            Rule::SignalFrame => 6,
        }
    }

    pub fn decode(bits: u32) -> Rule {
        let (cfa_offset, bp_below_cfa) = encoded_offsets(bits);
        match bits & 7 {
            1 => Rule::EndOfStack,
            2 => Rule::Sp { cfa_offset },
            3 => Rule::SpRestoreBp {
                cfa_offset,
                bp_below_cfa,
            },
            4 => Rule::FramePointer,
            6 => Rule::SignalFrame,
            _ => Rule::Other,
        }
    }

    /// The rule of a CFI row, translated as framehop translates it (so the
    /// stacks are the same whichever of the two unwinds a frame).
    pub fn from_cfi<T: gimli::ReaderOffset, S: gimli::UnwindContextStorage<T>>(
        row: &gimli::UnwindTableRow<T, S>,
    ) -> Rule {
        use gimli::{CfaRule, RegisterRule, X86_64};
        let saved_below_cfa = |r: Option<RegisterRule<T>>| match r {
            None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => Some(None),
            Some(RegisterRule::Offset(o)) if o < 0 && o % 8 == 0 => Some(Some(o.unsigned_abs())),
            _ => None,
        };
        match row.register(X86_64::RA) {
            None | Some(RegisterRule::Undefined) => return Rule::EndOfStack,
            Some(RegisterRule::Offset(-8)) => {}
            _ => return Rule::Other,
        }
        let Some(bp) = saved_below_cfa(row.register(X86_64::RBP)) else {
            return Rule::Other;
        };
        let (register, offset) = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => (*register, *offset),
            CfaRule::Expression(_) => return Rule::Other,
        };
        let Ok(cfa_offset) = u32::try_from(offset) else {
            return Rule::Other;
        };
        let bp_below_cfa = bp.and_then(|b| u32::try_from(b).ok());
        match (register, bp_below_cfa) {
            _ if cfa_offset % 8 != 0 || bp.is_some() != bp_below_cfa.is_some() => Rule::Other,
            (X86_64::RSP, None) => Rule::Sp { cfa_offset },
            (X86_64::RSP, Some(bp_below_cfa)) => Rule::SpRestoreBp {
                cfa_offset,
                bp_below_cfa,
            },
            (X86_64::RBP, Some(16)) if cfa_offset == 16 => Rule::FramePointer,
            _ => Rule::Other,
        }
    }

    /// Unwinds one frame: `regs` become the caller's. Ok(None) at the end of
    /// the stack, Err if a read failed or the frame does not unwind. The
    /// checks are framehop's, so both unwinders end stacks alike.
    /// `first_frame`: pc is an instruction pointer (not a return address).
    #[inline(always)]
    pub fn exec(
        self,
        first_frame: bool,
        regs: &mut UnwindRegs,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<Option<u64>, ()> {
        let (sp, bp) = (regs.sp(), regs.bp());
        let (new_sp, new_bp) = match self {
            Rule::EndOfStack => return Ok(None),
            Rule::SignalFrame => return signal_frame(regs, read),
            Rule::Sp { cfa_offset } => (sp.checked_add(u64::from(cfa_offset)).ok_or(())?, bp),
            Rule::SpRestoreBp {
                cfa_offset,
                bp_below_cfa,
            } => {
                let cfa = sp.checked_add(u64::from(cfa_offset)).ok_or(())?;
                let at = cfa.wrapping_sub(u64::from(bp_below_cfa));
                let new_bp = match read(at) {
                    Ok(v) => v,
                    // An epilogue may already have popped bp (CFI need not say so).
                    Err(()) if first_frame && at < sp => bp,
                    Err(()) => return Err(()),
                };
                (cfa, new_bp)
            }
            Rule::FramePointer => {
                if bp == 0 {
                    return Ok(None);
                }
                let new_sp = bp.checked_add(16).ok_or(())?;
                if new_sp <= sp {
                    return Err(());
                }
                (new_sp, read(bp)?)
            }
            Rule::Other => return Err(()),
        };
        let ra = read(new_sp - 8)?;
        if ra == 0 {
            return Ok(None);
        }
        if new_sp == sp && ra == regs.ip() {
            return Err(());
        }
        regs.set_ip(ra);
        regs.set_sp(new_sp);
        regs.set_bp(new_bp);
        Ok(Some(ra))
    }
}

/// The (CFA offset, bp slot below the CFA) of an encoded rule, in bytes.
#[inline(always)]
fn encoded_offsets(bits: u32) -> (u32, u32) {
    (
        (bits >> 3 & ((1 << RULE_CFA_BITS) - 1)) * 8,
        (bits >> (3 + RULE_CFA_BITS) & ((1 << RULE_BP_BITS) - 1)) * 8,
    )
}

/// The outcome of `fast_step`: the caller's registers are set, and these are
/// the step's reads in the order `Rule::exec` makes them.
pub struct FastStep {
    /// Where bp was restored from, and its value (None: bp passed on).
    pub bp_read: Option<(u64, u64)>,
    /// Where the return address was, and its value (never 0).
    pub ra_at: u64,
    pub ra: u64,
}

/// Runs the three common rules (`Sp`, `SpRestoreBp`, `FramePointer`) straight
/// from their encoded bits, without matching on the kind: CFA = sp or bp plus
/// an offset, the return address at CFA - 8, bp restored from below the CFA
/// or passed on. Only the plain case is handled here, where every read is in
/// bounds and the frame is not the end of the stack: for anything else
/// (another kind, a read refused, a zero return address, a frame that does
/// not move) it returns None with `regs` untouched, and `Rule::exec` decides,
/// with the same result it would give here when it succeeds.
#[inline(always)]
pub fn fast_step(
    bits: u32,
    regs: &mut UnwindRegs,
    readable: impl Fn(u64) -> bool,
) -> Option<FastStep> {
    let kind = bits & 7;
    // 2: Sp, 3: SpRestoreBp, 4: FramePointer (see `Rule::encode`).
    if !(2..=4).contains(&kind) {
        return None;
    }
    let (pc, sp, bp) = (regs.ip(), regs.sp(), regs.bp());
    let frame_pointer = kind == 4;
    let (base, cfa_offset, bp_below_cfa) = if frame_pointer {
        (bp, 16, 16)
    } else {
        let (cfa_offset, bp_below) = encoded_offsets(bits);
        let bp_below = if kind == 3 { bp_below } else { 0 };
        (sp, u64::from(cfa_offset), u64::from(bp_below))
    };
    if frame_pointer && bp == 0 {
        return None;
    }
    let cfa = base.checked_add(cfa_offset)?;
    if frame_pointer && cfa <= sp {
        return None;
    }
    let ra_at = cfa.wrapping_sub(8);
    let bp_at = cfa.wrapping_sub(bp_below_cfa);
    if !readable(ra_at) || (bp_below_cfa != 0 && !readable(bp_at)) {
        return None;
    }
    // SAFETY: `readable` checked both addresses (aligned, inside the stack).
    let (ra, bp_read) = unsafe {
        let bp_read =
            (bp_below_cfa != 0).then(|| (bp_at, core::ptr::read_volatile(bp_at as *const u64)));
        (core::ptr::read_volatile(ra_at as *const u64), bp_read)
    };
    if ra == 0 || (cfa == sp && ra == pc) {
        return None;
    }
    regs.set_ip(ra);
    regs.set_sp(cfa);
    regs.set_bp(bp_read.map_or(bp, |(_, v)| v));
    Some(FastStep { bp_read, ra_at, ra })
}

/// Unwinds the kernel's signal frame: the interrupted registers are in the
/// `ucontext_t` at sp (the handler's return address, `__restore_rt`, was
/// just above it).
fn signal_frame(
    regs: &mut UnwindRegs,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, ()> {
    let greg = |r: i32| {
        let at = core::mem::offset_of!(libc::ucontext_t, uc_mcontext) + r as usize * 8;
        regs.sp().checked_add(at as u64).ok_or(())
    };
    let (bp_at, sp_at, ip_at) = (
        greg(libc::REG_RBP)?,
        greg(libc::REG_RSP)?,
        greg(libc::REG_RIP)?,
    );
    let ip = read(ip_at)?;
    let sp = read(sp_at)?;
    let bp = read(bp_at)?;
    if ip == 0 {
        return Ok(None);
    }
    regs.set_ip(ip);
    regs.set_sp(sp);
    regs.set_bp(bp);
    Ok(Some(ip))
}

/// The CPU's time-stamp counter (for the `capture-timing` feature).
#[cfg(feature = "capture-timing")]
#[inline(always)]
pub fn cycles() -> u64 {
    // SAFETY: rdtsc reads a counter; no memory access.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Starts loading the cache line of `p` (a hint: never faults).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    // SAFETY: prefetch is a hint; it does not fault on any address.
    unsafe { core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0) };
}

// One pointer of initial-exec TLS: the calling thread's `ThreadState`
// (thread.rs). Stable Rust has no `#[thread_local]`, and `thread_local!` in a
// shared library goes through `__tls_get_addr`, which may call `malloc`; an
// initial-exec slot sits in the static TLS block that glibc sets up with the
// thread, before any of its code runs, and is read with two loads. The
// linker marks the library `DF_STATIC_TLS`: a preloaded library's static TLS
// is always allocated, and a later dlopen of the agent fits glibc's surplus.
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    // Global for the other codegen units of the crate, hidden from the
    // program.
    ".globl trapline_thread_slot",
    ".hidden trapline_thread_slot",
    ".type trapline_thread_slot, @object",
    ".size trapline_thread_slot, 8",
    "trapline_thread_slot:",
    ".zero 8",
    ".popsection",
);

/// The value of this thread's slot (null until `set_thread_slot`).
#[inline(always)]
pub fn thread_slot() -> *mut u8 {
    let p: *mut u8;
    // SAFETY: reads this thread's own TLS word; the GOT entry holds its
    // offset from the thread pointer (`fs`), filled in by the loader.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr [rip + trapline_thread_slot@GOTTPOFF]",
            "mov {p}, qword ptr fs:[{p}]",
            p = out(reg) p,
            options(nostack, preserves_flags, readonly),
        );
    }
    p
}

/// Sets this thread's slot.
#[inline(always)]
pub fn set_thread_slot(value: *mut u8) {
    // SAFETY: writes this thread's own TLS word (see `thread_slot`).
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + trapline_thread_slot@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {v}",
            t = out(reg) _,
            v = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}

// A second initial-exec word: how many times one of the agent's own signals
// (the scan's park signal, the profiler's) made a system call of this
// thread fail with EINTR (hooks/eintr.rs retries such calls).
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl trapline_agent_eintr",
    ".hidden trapline_agent_eintr",
    ".type trapline_agent_eintr, @object",
    ".size trapline_agent_eintr, 8",
    "trapline_agent_eintr:",
    ".zero 8",
    ".popsection",
);

/// This thread's count of system calls an agent signal made fail with EINTR.
#[inline(always)]
pub fn agent_eintr_count() -> u64 {
    let v: u64;
    // SAFETY: reads this thread's own TLS word, as `thread_slot`.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr [rip + trapline_agent_eintr@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{v}]",
            v = out(reg) v,
            options(nostack, preserves_flags, readonly),
        );
    }
    v
}

/// In a handler of one of the agent's signals: counts the interruption if
/// it made the system call the thread was in fail with EINTR (the kernel
/// then put -EINTR in the saved rax; a call it restarts has its number
/// there again, with rip moved back onto the `syscall` instruction).
///
/// # Safety
/// `ucontext` must be the context pointer the kernel passed to the handler.
#[inline(always)]
pub unsafe fn note_agent_eintr(ucontext: *const libc::c_void) {
    if ucontext.is_null() {
        return;
    }
    // SAFETY: the caller passes the kernel's ucontext_t for this signal.
    let rax = unsafe { (*(ucontext as *const libc::ucontext_t)).uc_mcontext.gregs }
        [libc::REG_RAX as usize];
    if rax != -(libc::EINTR as i64) {
        return;
    }
    // SAFETY: this thread's own TLS word; the interrupted code (a hook
    // waiting in the system call) does not touch it meanwhile.
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + trapline_agent_eintr@GOTTPOFF]",
            "add qword ptr fs:[{t}], 1",
            t = out(reg) _,
            options(nostack),
        );
    }
}

/// How many general registers `interrupted_state` gives (`gregs[..16]`:
/// r8 to r15, rdi, rsi, rbp, rbx, rdx, rax, rcx and rsp).
pub const GENERAL_REGISTERS: u64 = 16;

/// The stack pointer of the code a signal interrupted, and the address of
/// its general registers in the signal frame (`GENERAL_REGISTERS` words,
/// valid while the handler runs), from the handler's `ucontext`.
///
/// # Safety
/// `ucontext` must be the context pointer the kernel passed to the handler.
pub unsafe fn interrupted_state(ucontext: *const libc::c_void) -> Option<(u64, u64)> {
    if ucontext.is_null() {
        return None;
    }
    // SAFETY: the caller passes the kernel's ucontext_t for this signal.
    let gregs = unsafe { &(*(ucontext as *const libc::ucontext_t)).uc_mcontext.gregs };
    Some((gregs[libc::REG_RSP as usize] as u64, gregs.as_ptr() as u64))
}

/// Zeroes caller-saved registers the agent's code leaves copies of program
/// addresses in (the event buffer's last address, table entries copied
/// through vector registers): a conservative scan would take such a stale
/// copy for a pointer, in a parked thread's saved registers or in a dead
/// stack region where the dynamic loader's lazy binding spilled the argument
/// and vector registers (`reach_coroutine.c`: r8 still held the previous
/// block's address there). Every vector register, and r8 to r11, which a
/// program's next call of up to four arguments does not overwrite. rdi, rsi,
/// rdx and rcx are left: clearing them too cost 2 to 3 ns per malloc+free
/// pair in the depth-20 microbenchmark (values the hook keeps past this
/// point have to live elsewhere), this set about 0.5. Called as the last
/// thing of a recorded call; zero idioms, handled at register renaming.
#[inline(always)]
pub fn clear_scratch_registers() {
    // SAFETY: writes only the registers declared as clobbered, all
    // caller-saved: no caller of a hook expects them preserved.
    unsafe {
        core::arch::asm!(
            "xor r8d, r8d", "xor r9d, r9d", "xor r10d, r10d", "xor r11d, r11d",
            "pxor xmm0, xmm0", "pxor xmm1, xmm1", "pxor xmm2, xmm2", "pxor xmm3, xmm3",
            "pxor xmm4, xmm4", "pxor xmm5, xmm5", "pxor xmm6, xmm6", "pxor xmm7, xmm7",
            "pxor xmm8, xmm8", "pxor xmm9, xmm9", "pxor xmm10, xmm10", "pxor xmm11, xmm11",
            "pxor xmm12, xmm12", "pxor xmm13, xmm13", "pxor xmm14, xmm14", "pxor xmm15, xmm15",
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            options(nomem, nostack),
        );
    }
}

/// Bytes below the stack pointer that leaf code may use (the System V red zone).
pub const RED_ZONE: u64 = 128;

/// The ELF `e_machine` of programs the agent can be loaded into (EM_X86_64).
pub const ELF_MACHINE: u16 = 62;

/// The variadic exec functions (execl, execle, execlp). Stable Rust cannot
/// define C-variadic functions, and glibc's own versions call execve
/// internally, past the agent's hook. Each trampoline spills the five
/// register-passed variadic arguments (rsi, rdx, rcx, r8, r9) into a stack
/// array and passes it, with the address of the stack-passed ones, to a
/// collector in hooks/process.rs, which rebuilds argv and calls the hooked
/// execv / execve / execvp.
macro_rules! variadic_exec_trampoline {
    ($name:ident, $collector:path) => {
        /// # Safety
        /// The C function's contract (a NULL-terminated argument list).
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                // CFI on every byte: a debugger's backtrace or a signal's
                // unwinding from inside continues into the caller.
                ".cfi_startproc",
                // On entry rsp = 8 mod 16; 56 bytes keep calls 16-aligned.
                "sub rsp, 56",
                ".cfi_adjust_cfa_offset 56",
                "mov [rsp], rsi",
                "mov [rsp + 8], rdx",
                "mov [rsp + 16], rcx",
                "mov [rsp + 24], r8",
                "mov [rsp + 32], r9",
                "mov rsi, rsp",
                // Stack-passed arguments start above the return address.
                "lea rdx, [rsp + 64]",
                "call {collector}",
                "add rsp, 56",
                ".cfi_adjust_cfa_offset -56",
                "ret",
                ".cfi_endproc",
                collector = sym $collector,
            )
        }
    };
}

pub(crate) use variadic_exec_trampoline;

/// glibc's `syscall(number, ...)`, made here so that
/// `syscall(SYS_exit_group, status)` goes to the agent's `_exit`
/// (hooks/process.rs), which finishes the trace and ends with the same
/// system call: it ended the process past the agent, without an end record. `syscall(SYS_execve, ...)` goes to the agent's `execve` (the trace
/// finished, the new image traced: it went past both). Every other number is
/// made as glibc makes it, with no lookup of
/// the real function (a lazy lookup could allocate, and the agent's own
/// system calls come through here too): arguments moved into the kernel's
/// registers (the sixth from the stack), `syscall`, and a result in
/// [-4095, -1] stored as errno with -1 returned.
///
/// `$exit` and `$execve` are the agent's `_exit` and `execve`.
macro_rules! syscall_trampoline {
    (exit: $exit:path, execve: $execve:path) => {
        /// # Safety
        /// The C function's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn syscall() {
            core::arch::naked_asm!(
                ".cfi_startproc",
                "cmp rdi, {exit_group}",
                "je 3f",
                "cmp rdi, {execve}",
                "je 4f",
                "mov rax, rdi",
                "mov rdi, rsi",
                "mov rsi, rdx",
                "mov rdx, rcx",
                "mov r10, r8",
                "mov r8, r9",
                "mov r9, [rsp + 8]",
                "syscall",
                "cmp rax, -4095",
                "jae 2f",
                "ret",
                // errno = -rax; return -1. On entry rsp = 8 mod 16: 8 bytes align the call.
                "2:",
                "neg eax",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                "mov [rsp], eax",
                "call {errno_location}",
                "mov ecx, [rsp]",
                "mov [rax], ecx",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "mov rax, -1",
                "ret",
                // execve(path, argv, envp): the agent's, whose int result (-1 with
                // errno, when it returns at all) becomes syscall()'s long.
                "4:",
                "mov rdi, rsi",
                "mov rsi, rdx",
                "mov rdx, rcx",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                "call {execve_hook}",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "movsxd rax, eax",
                "ret",
                "3:",
                "mov edi, esi",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                "call {exit}",
                "ud2",
                ".cfi_endproc",
                exit_group = const libc::SYS_exit_group,
                execve = const libc::SYS_execve,
                execve_hook = sym $execve,
                errno_location = sym libc::__errno_location,
                exit = sym $exit,
            )
        }
    };
}
pub(crate) use syscall_trampoline;

/// The stack pointer of the calling function (inlined into it).
#[inline(always)]
pub fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: reads a register only.
    unsafe {
        core::arch::asm!("mov {sp}, rsp", sp = out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// The calling thread's thread pointer (the %fs base): glibc and musl both
/// keep the thread control block's own address in its first word. Static
/// TLS blocks lie at fixed offsets below it.
#[inline(always)]
pub fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: %fs:0 is the TCB's self pointer in every thread the C library made.
    unsafe {
        core::arch::asm!("mov {tp}, fs:0", tp = out(reg) tp, options(nostack, preserves_flags, readonly));
    }
    tp
}

/// Registers a function must preserve (rbx, rbp, r12-r15): at a call into the
/// agent they may hold the caller's pointers, which the reachability scan
/// treats as roots.
pub const CALLEE_SAVED: usize = 6;

/// `exit` (hooks/exit.rs): spills the callee-saved registers, as the caller
/// left them, into a stack array and passes it with the caller's stack
/// pointer (its value once `exit` would have returned) to the collector.
///
macro_rules! exit_trampoline {
    ($collector:path) => {
        /// # Safety
        /// The C function's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn exit() {
            core::arch::naked_asm!(
                // CFI on every byte, as in the exec trampolines: a backtrace from an
                // atexit handler or a destructor continues into exit's caller.
                ".cfi_startproc",
                // On entry rsp = 8 mod 16; 56 bytes keep the call 16-aligned.
                "sub rsp, 56",
                ".cfi_adjust_cfa_offset 56",
                "mov [rsp], rbx",
                "mov [rsp + 8], rbp",
                "mov [rsp + 16], r12",
                "mov [rsp + 24], r13",
                "mov [rsp + 32], r14",
                "mov [rsp + 40], r15",
                "mov rsi, rsp",
                "lea rdx, [rsp + 64]",
                "call {collector}",
                "ud2",
                ".cfi_endproc",
                collector = sym $collector,
            )
        }
    };
}
pub(crate) use exit_trampoline;

/// `swapcontext` and `setcontext` (hooks/context.rs): passes the caller's
/// stack pointer (its value once the call returns) to `$leaving`, which
/// returns the real function, and jumps there with the caller's argument
/// registers, callee-saved registers and return address as they were: the
/// context the real function saves resumes in the program, not in the
/// agent. The other caller-saved registers, which the call may clobber and
/// the real function saves into the context, are zeroed: they would hold
/// the agent's leftovers.
macro_rules! stack_switch_trampoline {
    ($name:ident, $leaving:path) => {
        /// # Safety
        /// The C function's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                ".cfi_startproc",
                // On entry rsp = 8 mod 16; three words keep the call aligned.
                "push rdi",
                ".cfi_adjust_cfa_offset 8",
                "push rsi",
                ".cfi_adjust_cfa_offset 8",
                "sub rsp, 8",
                ".cfi_adjust_cfa_offset 8",
                "lea rdi, [rsp + 32]",
                "call {leaving}",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "pop rsi",
                ".cfi_adjust_cfa_offset -8",
                "pop rdi",
                ".cfi_adjust_cfa_offset -8",
                "mov r11, rax",
                "xor eax, eax",
                "xor ecx, ecx",
                "xor edx, edx",
                "xor r8d, r8d",
                "xor r9d, r9d",
                "xor r10d, r10d",
                "jmp r11",
                ".cfi_endproc",
                leaving = sym $leaving,
            )
        }
    };
}

pub(crate) use stack_switch_trampoline;

/// The callee-saved registers as they are now (inlined into the caller: at
/// the top of a hook they still hold, or have saved on the hook's frame, its
/// caller's values).
#[inline(always)]
pub fn callee_saved_now() -> [u64; CALLEE_SAVED] {
    let (rbx, rbp, r12, r13, r14, r15): (u64, u64, u64, u64, u64, u64);
    // SAFETY: reads registers only.
    unsafe {
        core::arch::asm!(
            "mov {0}, rbx",
            "mov {1}, rbp",
            "mov {2}, r12",
            "mov {3}, r13",
            "mov {4}, r14",
            "mov {5}, r15",
            out(reg) rbx,
            out(reg) rbp,
            out(reg) r12,
            out(reg) r13,
            out(reg) r14,
            out(reg) r15,
            options(nomem, nostack, preserves_flags)
        );
    }
    [rbx, rbp, r12, r13, r14, r15]
}

/// An exported hook `$name` that loads the return address (into `$ret`),
/// the caller's sp after the return (into `$sp`) and, if asked, the
/// caller's bp (into `$bp`), then jumps to `$target`: the stack is exactly
/// as if the program had called `$target`. Shared by the two kinds below.
macro_rules! trampoline {
    ($name:ident => $target:path, ret: $ret:literal, sp: $sp:literal $(, bp: $bp:literal)?) => {
        /// # Safety
        /// The C function's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // SAFETY: at entry [rsp] holds the return address the call just
            // pushed; only argument registers after the function's own are
            // written, which the target declares, and the jump leaves the
            // stack exactly as the caller made it (bp is read before any
            // prologue could change it). The stub's own unwind entry is the
            // one every x86_64 function starts with (CFA = rsp + 8, return
            // address at CFA - 8), true for all its instructions: a signal
            // that interrupts the stub (the CPU profiler's, a debugger's)
            // can still unwind past it.
            core::arch::naked_asm!(
                ".cfi_startproc",
                concat!("mov ", $ret, ", [rsp]"),
                concat!("lea ", $sp, ", [rsp + 8]"),
                $(concat!("mov ", $bp, ", rbp"),)?
                "jmp {target}",
                ".cfi_endproc",
                target = sym $target,
            )
        }
    };
}
pub(crate) use trampoline;

/// Defines hook `$name` as a trampoline that passes the caller's return
/// address and stack pointer (at the call) to `$target` in the two argument
/// registers after the hook's own (`$ret`, `$sp`) and jumps there. The lock
/// hooks learn their call site in registers, with no unwind and no memory
/// round trip, and the unwinder follows `$target`'s frame.
macro_rules! with_return_address {
    ($name:ident, $target:path, $ret:literal, $sp:literal) => {
        $crate::platform::arch::trampoline!($name => $target, ret: $ret, sp: $sp);
    };
}
pub(crate) use with_return_address;

/// An exported hook `$name` that runs `$setup`, pushes `$push` as the
/// seventh argument and calls `$target`: for hooks whose own arguments leave
/// no register for what the target needs to know. The pushed word re-aligns
/// the stack to 16 bytes for the call; the stub restores rsp before
/// returning the callee's rax. Not for hot paths (a call and a return more
/// than a jump).
macro_rules! calling_stub {
    ($name:ident => $target:path, setup: [$($setup:literal),*], push: $push:literal) => {
        /// # Safety
        /// The C function's contract.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // SAFETY: `$setup` writes only argument registers after the
            // hook's own; the pushed word is the callee's seventh argument
            // and is popped before the return; the CFI describes every step.
            core::arch::naked_asm!(
                ".cfi_startproc",
                $($setup,)*
                concat!("push ", $push),
                ".cfi_adjust_cfa_offset 8",
                "call {target}",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "ret",
                ".cfi_endproc",
                target = sym $target,
            )
        }
    };
}
pub(crate) use calling_stub;

/// Defines hook `$name`, a function of six arguments (every argument
/// register taken), as a stub that calls `$target` with the return address
/// as a seventh argument, on the stack; used where the caller matters and
/// the call is rare (`mmap`: is it the allocator library mapping memory?).
/// `$target` is `extern "C" fn(<6 arguments>, u64) -> <the C return type>`.
macro_rules! with_return_address_on_stack {
    ($name:ident => $target:path) => {
        $crate::platform::arch::calling_stub!($name => $target, setup: [], push: "qword ptr [rsp]");
    };
}
pub(crate) use with_return_address_on_stack;

/// Defines hook `$name` as a trampoline that jumps to `$target`, passing it
/// the caller's frame as three more arguments after the hook's own `$args`:
/// the return address, the caller's sp (after the return) and its bp. The
/// unwind starts at the program's frame: the hook's own frame, which every
/// capture used to unwind first and then leave out of the stack, is never
/// seen. `$target` is `extern "C" fn(<$args arguments>, u64, u64, u64)`.
macro_rules! with_caller_regs {
    ($name:ident => $target:path, args: 1) => {
        $crate::platform::arch::trampoline!($name => $target, ret: "rsi", sp: "rdx", bp: "rcx");
    };
    ($name:ident => $target:path, args: 2) => {
        $crate::platform::arch::trampoline!($name => $target, ret: "rdx", sp: "rcx", bp: "r8");
    };
    ($name:ident => $target:path, args: 3) => {
        $crate::platform::arch::trampoline!($name => $target, ret: "rcx", sp: "r8", bp: "r9");
    };
    // Four arguments leave two registers: bp goes on the stack as the
    // seventh argument, so the stub calls `$target` with a frame of its
    // own instead of jumping (jemalloc's xallocx; not a hot path).
    ($name:ident => $target:path, args: 4) => {
        $crate::platform::arch::calling_stub!($name => $target, setup: ["mov r8, [rsp]", "lea r9, [rsp + 8]"], push: "rbp");
    };
}
pub(crate) use with_caller_regs;

/// glibc's `pthread_mutex_t` on x86_64 (`struct __pthread_mutex_s`): the
/// owner's tid and the kind word (type in the low two bits).
pub const MUTEX_OWNER_OFFSET: usize = 8;
pub const MUTEX_KIND_OFFSET: usize = 16;

// `call_on_stack(data, f, top)`: calls `f(data)` with the stack pointer at
// `top` and returns on the caller's stack (side_stack.rs). rbp keeps the
// caller's stack pointer, and the CFI says so (CFA = rbp + 16), so that a
// debugger's backtrace from the other stack continues into the caller.
core::arch::global_asm!(
    ".pushsection .text.trapline_call_on_stack,\"ax\",@progbits",
    ".p2align 4",
    ".globl trapline_call_on_stack",
    ".hidden trapline_call_on_stack",
    ".type trapline_call_on_stack, @function",
    "trapline_call_on_stack:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_adjust_cfa_offset 8",
    ".cfi_rel_offset rbp, 0",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "mov rsp, rdx",
    "call rsi",
    "mov rsp, rbp",
    ".cfi_def_cfa_register rsp",
    "pop rbp",
    ".cfi_adjust_cfa_offset -8",
    ".cfi_restore rbp",
    "ret",
    ".cfi_endproc",
    ".size trapline_call_on_stack, . - trapline_call_on_stack",
    ".popsection",
);

extern "C" {
    #[link_name = "trapline_call_on_stack"]
    fn call_on_stack_asm(data: *mut u8, f: unsafe extern "C" fn(*mut u8), top: *mut u8);
}

/// Calls `f(data)` with the stack pointer at `top`, then returns here.
///
/// # Safety
/// `top` is the 16-byte aligned end of writable memory that nothing else
/// uses, large enough for `f`; `f` is safe to call with `data`.
#[inline(always)]
pub unsafe fn call_on_stack(data: *mut u8, f: unsafe extern "C" fn(*mut u8), top: *mut u8) {
    // SAFETY: the caller's contract; the routine preserves every
    // callee-saved register and returns normally.
    unsafe { call_on_stack_asm(data, f, top) }
}

/// The target of the direct call (`call rel32`) that returns to
/// `return_address`, if the instruction before it is one.
pub fn direct_call_target(return_address: u64) -> Option<u64> {
    let at = return_address.checked_sub(5)?;
    // The 5 bytes on one page with the return address's instruction, which
    // is mapped (code that called): nothing else is known to be readable.
    if at >> 12 != (return_address - 1) >> 12 {
        return None;
    }
    let mut code = [0u8; 5];
    // SAFETY: `at..return_address` is on the page of the call instruction
    // that returns there (checked above), mapped and readable as code is.
    unsafe { core::ptr::copy_nonoverlapping(at as *const u8, code.as_mut_ptr(), 5) };
    if code[0] != 0xe8 {
        return None;
    }
    let rel = i32::from_le_bytes([code[1], code[2], code[3], code[4]]);
    Some(return_address.wrapping_add(rel as i64 as u64))
}

//! The traced process's memory and registers: reads and writes through
//! `/proc/PID/mem` (which writes read-only code pages as a debugger does),
//! and system calls made on its behalf.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

/// `/proc/PID/mem` of the traced process.
pub struct Memory {
    file: File,
}

impl Memory {
    pub fn open(pid: Pid) -> Result<Memory, String> {
        let path = format!("/proc/{pid}/mem");
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map(|file| Memory { file })
            .map_err(|e| format!("cannot open {path}: {e}"))
    }

    /// Fills `buf` from `addr`; false when any of it cannot be read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.file.read_exact_at(buf, addr).is_ok()
    }

    pub fn read_vec(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v).then_some(v)
    }

    pub fn word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), String> {
        self.file
            .write_all_at(data, addr)
            .map_err(|e| format!("cannot write {} bytes at {addr:#x}: {e}", data.len()))
    }
}

/// Makes system call `nr` with `args` in stopped thread `tid`, by placing a
/// `syscall` instruction at its pc for one step; its registers and code
/// are put back. The result as the kernel returned it (negative: -errno).
pub fn syscall(tid: Pid, mem: &Memory, nr: u64, args: [u64; 6]) -> Result<i64, String> {
    let saved = ptrace::getregs(tid).map_err(|e| format!("cannot read registers: {e}"))?;
    let pc = saved.rip;
    let code = mem
        .read_vec(pc, 2)
        .ok_or("cannot read the code at the stopped thread's pc")?;
    mem.write(pc, &[0x0f, 0x05])?;
    let mut regs = saved;
    regs.rax = nr;
    regs.orig_rax = u64::MAX;
    regs.rdi = args[0];
    regs.rsi = args[1];
    regs.rdx = args[2];
    regs.r10 = args[3];
    regs.r8 = args[4];
    regs.r9 = args[5];
    let result = ptrace::setregs(tid, regs)
        .map_err(|e| format!("cannot set registers: {e}"))
        .and_then(|()| ptrace::step(tid, None).map_err(|e| format!("cannot step: {e}")))
        .and_then(|()| match waitpid(tid, None) {
            Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {
                ptrace::getregs(tid).map_err(|e| format!("cannot read registers: {e}"))
            }
            other => Err(format!("the system call did not return: {other:?}")),
        });
    mem.write(pc, &code)?;
    ptrace::setregs(tid, saved).map_err(|e| format!("cannot restore registers: {e}"))?;
    result.map(|r| r.rax as i64)
}

//! Calling functions inside another running process, for `trapline
//! attach`: one of its threads is stopped with ptrace (PTRACE_SEIZE and
//! PTRACE_INTERRUPT, which unlike PTRACE_ATTACH send no SIGSTOP the
//! program could see), made to call a function with a return address of 0,
//! caught at the fault that return makes, and put back as it was.
//!
//! Only a thread waiting in a system call that holds no lock of the C
//! library's (`SAFE_SYSCALLS`: reads, polls, sleeps, accepts) is used: a
//! thread stopped inside `malloc` would hold its arena's lock, and the
//! `dlopen` it is made to call would wait for it for ever. The other
//! threads keep running throughout. The interrupted system call is
//! restarted when the thread resumes: the call's registers carry
//! `orig_rax = -1` so the kernel's restart logic leaves them alone, and the
//! saved registers, put back at the end, carry the original call's.
//!
//! The registers and the calling convention are x86-64's; they are in
//! `Regs` and `call` alone.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

type Regs = libc::user_regs_struct;

/// x86-64 system calls a thread can be stopped in without holding a lock
/// of the C library's: read, poll, select, pause, nanosleep, accept,
/// recvfrom, recvmsg, wait4, rt_sigtimedwait, rt_sigsuspend,
/// clock_nanosleep, epoll_wait, pselect6, ppoll, epoll_pwait, accept4,
/// epoll_pwait2.
const SAFE_SYSCALLS: [u64; 18] = [
    0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 230, 232, 270, 271, 281, 288, 441,
];

/// Below the stack pointer: the red zone the interrupted code may use, and
/// room to spare.
const STACK_GAP: u64 = 1024;

/// A thread of another process, stopped for calls.
pub struct Stopped {
    tid: Pid,
    saved: Regs,
    mem: File,
    /// The lowest address used so far on the thread's stack.
    low: u64,
    released: bool,
}

/// Stops a thread of `pid` that waits in a safe system call: each thread
/// in turn, for up to `rounds` rounds `pause` apart.
pub fn stop_a_waiting_thread(pid: u32, rounds: u32, pause: Duration) -> Result<Stopped, String> {
    let mem = File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| format!("cannot open /proc/{pid}/mem: {e}"))?;
    let mut last = String::new();
    for _ in 0..rounds {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| format!("cannot list the threads of {pid}: {e}"))?;
        let mut tids: Vec<i32> = tasks
            .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        // The main thread first: a server's main thread usually waits.
        tids.sort_by_key(|&t| t != pid as i32);
        for tid in tids {
            match stop_if_waiting(Pid::from_raw(tid)) {
                Ok(Some(saved)) => {
                    let low = saved.rsp.saturating_sub(STACK_GAP) & !15;
                    return Ok(Stopped {
                        tid: Pid::from_raw(tid),
                        saved,
                        mem: mem.try_clone().map_err(|e| e.to_string())?,
                        low,
                        released: false,
                    });
                }
                Ok(None) => {}
                Err(e) => last = e,
            }
        }
        std::thread::sleep(pause);
    }
    Err(if last.is_empty() {
        format!(
            "no thread of {pid} was waiting in a system call where it holds no lock (reading, \
             polling, sleeping or accepting) in {rounds} tries: nothing was changed"
        )
    } else {
        last
    })
}

/// Seizes and interrupts `tid`; its registers when it waits in a safe
/// system call, else lets it go.
fn stop_if_waiting(tid: Pid) -> Result<Option<Regs>, String> {
    ptrace::seize(tid, ptrace::Options::empty()).map_err(|e| match e {
        nix::errno::Errno::EPERM => format!(
            "not allowed to trace thread {tid} ({e}): attach as its user or as root, and check \
             /proc/sys/kernel/yama/ptrace_scope"
        ),
        e => format!("cannot trace thread {tid}: {e}"),
    })?;
    let stopped = ptrace::interrupt(tid)
        .map_err(|e| e.to_string())
        .and_then(|()| wait_stop(tid).map(|_| ()))
        .and_then(|()| ptrace::getregs(tid).map_err(|e| e.to_string()));
    match stopped {
        Ok(regs) if SAFE_SYSCALLS.contains(&regs.orig_rax) => Ok(Some(regs)),
        Ok(_) => {
            let _ = ptrace::detach(tid, None);
            Ok(None)
        }
        Err(e) => {
            let _ = ptrace::detach(tid, None);
            Err(format!("cannot stop thread {tid}: {e}"))
        }
    }
}

/// Waits until `tid` stops; the signal of a signal stop, None for a
/// ptrace event stop. A thread that exits is an error.
fn wait_stop(tid: Pid) -> Result<Option<Signal>, String> {
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Stopped(_, sig)) => return Ok(Some(sig)),
            Ok(WaitStatus::PtraceEvent(..)) => return Ok(None),
            Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => {
                return Err("the process ended".into())
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
}

impl Stopped {
    /// Copies `data` onto the thread's stack, below what it uses; its address.
    pub fn push_bytes(&mut self, data: &[u8]) -> Result<u64, String> {
        let at = (self.low - data.len() as u64) & !15;
        self.mem
            .write_all_at(data, at)
            .map_err(|e| format!("cannot write into the process: {e}"))?;
        self.low = at;
        Ok(at)
    }

    /// Reads `len` bytes of the process at `addr`.
    pub fn read_bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len];
        self.mem
            .read_exact_at(&mut buf, addr)
            .map_err(|e| format!("cannot read the process: {e}"))?;
        Ok(buf)
    }

    /// Calls `func(args...)` (at most six integer arguments) on the
    /// stopped thread; its return value.
    pub fn call(&mut self, func: u64, args: &[u64]) -> Result<u64, String> {
        let mut regs = self.saved;
        let slots = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (slot, &arg) in slots.into_iter().zip(args) {
            *slot = arg;
        }
        // A return address of 0 below 16-byte alignment: the function
        // starts as if called, and its return faults at address 0.
        let sp = (self.low - 256) & !15;
        self.mem
            .write_all_at(&0u64.to_le_bytes(), sp - 8)
            .map_err(|e| format!("cannot write into the process: {e}"))?;
        regs.rsp = sp - 8;
        regs.rip = func;
        regs.rax = 0;
        // Not in a system call: no restart of the interrupted one now.
        regs.orig_rax = u64::MAX;
        ptrace::setregs(self.tid, regs).map_err(|e| e.to_string())?;
        let mut deliver: Option<Signal> = None;
        loop {
            ptrace::cont(self.tid, deliver).map_err(|e| e.to_string())?;
            deliver = None;
            match wait_stop(self.tid)? {
                Some(Signal::SIGSEGV) => {
                    let r = ptrace::getregs(self.tid).map_err(|e| e.to_string())?;
                    if r.rip == 0 {
                        return Ok(r.rax);
                    }
                    return Err(format!(
                        "the process faulted at {:#x} inside the call to {func:#x}",
                        r.rip
                    ));
                }
                // A signal for the program meanwhile: delivered, its
                // handler runs below the call's frame.
                Some(sig) => deliver = Some(sig),
                None => {}
            }
        }
    }

    /// Puts the thread's registers back and lets it go: the system call it
    /// was waiting in starts again.
    pub fn release(mut self) -> Result<(), String> {
        self.released = true;
        ptrace::setregs(self.tid, self.saved)
            .and_then(|()| ptrace::detach(self.tid, None))
            .map_err(|e| format!("cannot release thread {}: {e}", self.tid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.released {
            let _ = ptrace::setregs(self.tid, self.saved);
            let _ = ptrace::detach(self.tid, None);
        }
    }
}

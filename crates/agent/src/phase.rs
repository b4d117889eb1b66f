//! Which phase of its life the agent is in: one word, read from every
//! layer, changed only by runtime (lifecycle.rs).
//!
//! The word's low bits are flags; its high 32 bits hold the tid of the
//! thread finishing the trace. One word, so that a change (a finish
//! beginning on a thread, a failed exec starting over) is seen whole.
//! Beside it, the process the state belongs to (`owns_process`): a vfork
//! child shares the agent's memory, and a child of a raw fork system call
//! has a copy of it without the writer thread (`in_unreset_child`).

use crate::platform::callback::Callback;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The constructor has run.
const INITIALIZED: u64 = 1;
/// A thread is finishing the trace (`begin_finish`).
const FINISHING: u64 = 1 << 1;
/// The finish is for an exec: a signal it lets go is raised again should
/// the exec fail.
const FOR_EXEC: u64 = 1 << 2;
/// The finish has written the trace to its end record.
const TRACE_DONE: u64 = 1 << 3;
/// Nothing more is recorded: the trace is finished, or could not be
/// opened, or the process is a fork child that traces nothing.
const STOPPED: u64 = 1 << 4;
/// The program's exit handlers have all run (a vfork child ran them, the
/// agent's among them): the parent's own exit will run none, so its `exit`
/// hook finishes the trace before calling the real exit; a return from
/// main reaches glibc's exit without the hook, and the trace ends without
/// its end record.
const EXIT_HANDLERS_GONE: u64 = 1 << 5;
const TID_SHIFT: u32 = 32;

/// The lifecycle word's transitions, on any word (the agent's is `WORD`;
/// a unit test makes its own).
pub struct Word(AtomicU64);

static WORD: Word = Word::new();
/// pid of the process this agent state belongs to (a vfork child differs).
static PID: AtomicU32 = AtomicU32::new(0);
/// A page whose first word is nonzero in the process that set it and zero
/// in any child made without CLONE_VM (`set_fork_token`).
static FORK_TOKEN: AtomicUsize = AtomicUsize::new(0);
/// What stops the agent in a child `in_unreset_child` found (registered by
/// runtime: it resets the writer).
static ON_ABANDON: Callback<fn()> = Callback::new();

impl Word {
    pub const fn new() -> Word {
        Word(AtomicU64::new(0))
    }

    #[inline]
    fn has(&self, flag: u64) -> bool {
        self.0.load(Ordering::Acquire) & flag != 0
    }

    fn set(&self, flag: u64, on: bool) {
        if on {
            self.0.fetch_or(flag, Ordering::AcqRel);
        } else {
            self.0.fetch_and(!flag, Ordering::AcqRel);
        }
    }

    /// Marks the agent initialized; true if it already was.
    pub fn begin_init(&self) -> bool {
        self.0.fetch_or(INITIALIZED, Ordering::AcqRel) & INITIALIZED != 0
    }

    /// Marks the agent not initialized again (an attach that failed).
    pub fn undo_init(&self) {
        self.set(INITIALIZED, false);
    }

    pub fn initialized(&self) -> bool {
        self.has(INITIALIZED)
    }

    /// Nothing more is recorded (see `STOPPED`).
    #[inline]
    pub fn recording_stopped(&self) -> bool {
        self.has(STOPPED)
    }

    pub fn set_recording_stopped(&self, stopped: bool) {
        self.set(STOPPED, stopped);
    }

    /// Marks the trace as being finished by `tid`; false if a finish had
    /// already begun (on any thread).
    pub fn begin_finish(&self, tid: u32, for_exec: bool) -> bool {
        let mut began = false;
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                began = w & FINISHING == 0;
                began.then(|| {
                    let flags = w & !(FOR_EXEC | (u64::from(u32::MAX) << TID_SHIFT));
                    flags
                        | FINISHING
                        | if for_exec { FOR_EXEC } else { 0 }
                        | u64::from(tid) << TID_SHIFT
                })
            });
        began
    }

    /// Some thread is finishing the trace.
    pub fn finishing(&self) -> bool {
        self.has(FINISHING)
    }

    /// The thread finishing the trace (0: none).
    pub fn finishing_tid(&self) -> u32 {
        (self.0.load(Ordering::Acquire) >> TID_SHIFT) as u32
    }

    pub fn finishing_for_exec(&self) -> bool {
        self.has(FOR_EXEC)
    }

    pub fn trace_done(&self) -> bool {
        self.has(TRACE_DONE)
    }

    pub fn set_trace_done(&self) {
        self.set(TRACE_DONE, true);
    }

    /// A finish called off (a failed exec, a fork child's new trace): no
    /// finish under way, none done.
    pub fn finish_called_off(&self) {
        self.0.fetch_and(
            !(FINISHING | FOR_EXEC | TRACE_DONE | (u64::from(u32::MAX) << TID_SHIFT)),
            Ordering::AcqRel,
        );
    }

    pub fn exit_handlers_gone(&self) -> bool {
        self.has(EXIT_HANDLERS_GONE)
    }

    pub fn set_exit_handlers_gone(&self) {
        self.set(EXIT_HANDLERS_GONE, true);
    }
}

/// Marks the agent initialized; true if it already was.
pub fn begin_init() -> bool {
    WORD.begin_init()
}

pub fn initialized() -> bool {
    WORD.initialized()
}

/// Lets a later `begin_init` begin again (an attach that failed before it
/// changed anything of the process's).
pub fn undo_init() {
    WORD.undo_init()
}

/// Nothing more is recorded (see `STOPPED`).
#[inline]
pub fn recording_stopped() -> bool {
    WORD.recording_stopped()
}

pub fn set_recording_stopped(stopped: bool) {
    WORD.set_recording_stopped(stopped)
}

/// Marks the trace as being finished by `tid`; false if a finish had
/// already begun (on any thread).
pub fn begin_finish(tid: u32, for_exec: bool) -> bool {
    WORD.begin_finish(tid, for_exec)
}

/// Some thread is finishing the trace.
pub fn finishing() -> bool {
    WORD.finishing()
}

/// The thread finishing the trace (0: none).
pub fn finishing_tid() -> u32 {
    WORD.finishing_tid()
}

pub fn finishing_for_exec() -> bool {
    WORD.finishing_for_exec()
}

pub fn trace_done() -> bool {
    WORD.trace_done()
}

pub fn set_trace_done() {
    WORD.set_trace_done()
}

/// A finish called off (a failed exec, a fork child's new trace): no
/// finish under way, none done.
pub fn finish_called_off() {
    WORD.finish_called_off()
}

pub fn exit_handlers_gone() -> bool {
    WORD.exit_handlers_gone()
}

pub fn set_exit_handlers_gone() {
    WORD.set_exit_handlers_gone()
}

/// Notes the calling process as the one the agent's state belongs to
/// (the constructor, a fork child).
pub fn set_owner(pid: u32) {
    PID.store(pid, Ordering::Relaxed);
}

/// The process the agent's state belongs to.
pub fn owner() -> u32 {
    PID.load(Ordering::Relaxed)
}

/// The agent's state belongs to this process (not a vfork child's).
pub fn owns_process() -> bool {
    owner() == crate::platform::sys::getpid_raw()
}

/// Maps the fork token's page (MADV_WIPEONFORK) once.
pub fn set_fork_token() {
    let mut page = FORK_TOKEN.load(Ordering::Relaxed);
    if page == 0 {
        page = crate::platform::heap::map_own(4096) as usize;
        if page == 0 {
            return;
        }
        // Kernels before 4.14 refuse it: the word then survives in every
        // child, and such children are not told apart.
        // SAFETY: our own fresh page.
        unsafe { libc::madvise(page as *mut libc::c_void, 4096, libc::MADV_WIPEONFORK) };
        FORK_TOKEN.store(page, Ordering::Relaxed);
    }
    // SAFETY: our own page, mapped above or earlier and never unmapped.
    unsafe { core::ptr::write_volatile(page as *mut usize, 1) };
}

/// A child of a raw fork/clone system call (no CLONE_VM), which has a copy
/// of the agent's state but no writer thread and the parent's trace
/// descriptor; not a vfork child, which shares the page's word.
pub fn in_unreset_child() -> bool {
    if owns_process() {
        return false;
    }
    let page = FORK_TOKEN.load(Ordering::Relaxed);
    // SAFETY: the token page is never unmapped.
    page != 0 && unsafe { core::ptr::read_volatile(page as *const usize) } == 0
}

/// Registers how the agent stops in such a child.
pub fn on_abandon(f: fn()) {
    ON_ABANDON.set(f);
}

/// Stops the agent in a process `in_unreset_child` found: it records no
/// more and writes nothing.
pub fn abandon_unreset_child() {
    set_recording_stopped(true);
    if let Some(f) = ON_ABANDON.get() {
        f();
    }
}

/// In a fork child: the thread that was finishing is not in it.
pub fn clear_finishing_tid() {
    WORD.0
        .fetch_and(!(u64::from(u32::MAX) << TID_SHIFT), Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::{Word, TID_SHIFT};
    use core::sync::atomic::Ordering;

    /// The finish begins once, on one thread, whole; a failed exec calls it
    /// off; the other flags come and go on their own.
    #[test]
    fn the_lifecycle_word_moves_through_its_phases() {
        let w = Word::new();
        assert!(!w.begin_init());
        assert!(w.begin_init());
        assert!(w.initialized());
        assert!(!w.finishing() && w.finishing_tid() == 0);
        assert!(w.begin_finish(41, true));
        assert!(!w.begin_finish(42, false));
        assert!(w.finishing() && w.finishing_for_exec());
        assert_eq!(w.finishing_tid(), 41);
        w.set_trace_done();
        w.set_recording_stopped(true);
        assert!(w.trace_done() && w.recording_stopped());
        w.finish_called_off();
        assert!(!w.finishing() && !w.finishing_for_exec() && !w.trace_done());
        assert_eq!(w.finishing_tid(), 0);
        assert!(w.recording_stopped() && w.initialized());
        assert!(w.begin_finish(43, false));
        assert!(!w.finishing_for_exec());
        w.0.fetch_and(!(u64::from(u32::MAX) << TID_SHIFT), Ordering::AcqRel);
        assert!(w.finishing() && w.finishing_tid() == 0);
        w.set_recording_stopped(false);
        assert!(!w.recording_stopped());
    }
}

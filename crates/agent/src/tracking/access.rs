//! Access monitoring of chosen heap pages: the mechanism of the staleness
//! rule (a block nobody touches for a long time is a leak suspect).
//!
//! To watch a page the agent takes it away from the program and gives it
//! back at the first access, which it notes (time and thread):
//! 1. register the page with a userfaultfd (missing and write-protect
//!    faults);
//! 2. write-protect it: a thread that writes now waits for us, so no write
//!    can land between the next two steps and be lost;
//! 3. copy the page aside;
//! 4. drop it (MADV_DONTNEED): any access, a read or a write, by a program
//!    thread or by the kernel on its behalf (a read(2) into a watched
//!    buffer), now waits in a missing-page fault.
//!
//! The fault thread (services' control) reads the fault, copies the page
//! back (UFFDIO_COPY, which wakes every waiter) and unregisters it. A page
//! is given back without an access (and marked so) when a block on it is
//! released or reallocated (the allocator could hand the page to the
//! kernel, which would leave the copy aside stale, or move it with
//! mremap, which would leave an empty page behind), before a fork (the
//! kernel does not carry the registration into a child, whose page would
//! read as zeros), and before the exit's scan. An agent thread's access (a
//! periodic scan reading the heap) gives the page back marked
//! `Interrupted`, not touched.
//!
//! Limits: a page the program itself drops (madvise) or moves (mremap)
//! while it is watched, without releasing the block on it, comes back
//! with its contents of the moment it was armed; a raw clone or fork
//! system call (not glibc's fork) bypasses the fork handler. The kernel's
//! removal events would say so, but the remover then waits for the fault
//! thread, and no page can be copied back while one is pending.
//!
//! Every step runs under one lock. The fault thread, the lock's holders and
//! the arming thread never touch a watched page themselves, so a fault is
//! always served.

use crate::platform::lock::RawLock;
use crate::platform::uffd::{self, Uffd};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

pub const PAGE: u64 = 4096;
/// Pages watched at once, at most.
pub const MAX_PAGES: usize = 4096;

/// What became of a watched page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still watched: no access since it was armed.
    Armed,
    /// Accessed by the program (a thread, or the kernel for it).
    Touched,
    /// Given back unaccessed: a block on it was released or reallocated,
    /// or the process forks or ends.
    Released,
    /// An agent thread read it (a scan): given back, nothing learned.
    Interrupted,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Armed => "armed",
            Outcome::Touched => "touched",
            Outcome::Released => "released",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// One watched page and what became of it.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    pub page: u64,
    pub armed_at: u64,
    pub outcome: Outcome,
    /// When the outcome came (0 while armed).
    pub ended_at: u64,
    /// The thread that touched it (0: none).
    pub tid: u32,
    /// The byte the touching access reached first (0: not known, on a
    /// kernel without exact fault addresses): a touch of another block on
    /// the page says nothing of this one.
    pub touched_at: u64,
}

struct State {
    uffd: Option<Uffd>,
    watches: Vec<Watch>,
    /// Where each watch's page is kept while it is away (index = watch).
    aside: Vec<u64>,
    /// Aside pages not in use.
    spare: Vec<u64>,
}

struct Shared {
    lock: RawLock,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only touched with `lock` held (`with`).
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared {
    lock: RawLock::new(),
    state: UnsafeCell::new(State {
        uffd: None,
        watches: Vec::new(),
        aside: Vec::new(),
        spare: Vec::new(),
    }),
};

/// A scan is under way: nothing is armed until it ends.
static PAUSED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Pages armed now: 0 lets a release skip the lock.
static ARMED: AtomicU64 = AtomicU64::new(0);
/// The lowest and highest armed page (a release far from both skips the lock).
static LOWEST: AtomicU64 = AtomicU64::new(u64::MAX);
static HIGHEST: AtomicU64 = AtomicU64::new(0);
/// The userfaultfd the fault thread reads (-1: none yet).
static FD: AtomicI32 = AtomicI32::new(-1);
/// Its faults name the byte accessed.
static EXACT: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Counters for the control socket.
pub static FAULTS: AtomicU64 = AtomicU64::new(0);
pub static FAULT_NS: AtomicU64 = AtomicU64::new(0);
pub static ARMS: AtomicU64 = AtomicU64::new(0);
pub static ARM_NS: AtomicU64 = AtomicU64::new(0);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    SHARED.lock.lock();
    // SAFETY: the lock is held until `f` returns.
    let r = f(unsafe { &mut *SHARED.state.get() });
    SHARED.lock.unlock();
    r
}

/// Opens the userfaultfd if it is not open; its descriptor for the fault
/// thread, or why monitoring is unavailable.
pub fn open() -> Result<i32, &'static str> {
    with(|s| {
        if s.uffd.is_none() {
            // No removal, unmapping or fork events: the remover would wait
            // for the fault thread to read them (arming's own madvise
            // under the lock the fault thread needs, for one), and while
            // one is pending the kernel refuses to copy a page back
            // (EAGAIN). Releases give pages back first instead.
            let features = uffd::FEATURE_THREAD_ID;
            let exact = Uffd::open(features | uffd::FEATURE_EXACT_ADDRESS);
            EXACT.store(exact.is_ok(), Ordering::Relaxed);
            let u = match exact {
                Ok(u) => u,
                Err(_) => Uffd::open(features)?,
            };
            // Room for every watch now: giving a page back (in a release
            // hook, or before a fork) must not allocate.
            s.watches.reserve(MAX_PAGES);
            s.aside.reserve(MAX_PAGES);
            s.spare.reserve(MAX_PAGES);
            FD.store(u.0, Ordering::Release);
            s.uffd = Some(u);
        }
        Ok(FD.load(Ordering::Acquire))
    })
}

/// Why a page was not armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    AlreadyWatched,
    Full,
    /// A scan is reading the heap.
    Paused,
    /// The kernel refused (a mapping it cannot watch, or a range another
    /// userfaultfd of the program's own watches).
    Kernel(i32),
    NotOpen,
}

/// A page to keep a watched page's contents in: a spare one, or a new one
/// of the agent heap's. Its copy of a heap page holds the program's
/// pointers, and a spare one keeps them after the page went back: it must be
/// in the agent heap's registry, which the reachability scan leaves out of
/// its roots, or the copies would keep blocks the program lost reachable.
fn aside_page(spare: &mut Vec<u64>) -> Option<u64> {
    if let Some(p) = spare.pop() {
        return Some(p);
    }
    let p = crate::platform::heap::map_own(PAGE as usize);
    (!p.is_null()).then_some(p as u64)
}

/// Arms `page` (page-aligned, in a private anonymous mapping: the caller
/// checks) at trace time `now`.
pub fn arm(page: u64, now: u64) -> Result<(), Refusal> {
    let started = crate::platform::clock::monotonic_ns();
    let r = with(|s| {
        let Some(u) = s.uffd.as_ref() else {
            return Err(Refusal::NotOpen);
        };
        if PAUSED.load(Ordering::Relaxed) {
            return Err(Refusal::Paused);
        }
        if s.watches
            .iter()
            .any(|w| w.page == page && w.outcome == Outcome::Armed)
        {
            return Err(Refusal::AlreadyWatched);
        }
        if ARMED.load(Ordering::Relaxed) as usize >= MAX_PAGES {
            return Err(Refusal::Full);
        }
        let Some(aside) = aside_page(&mut s.spare) else {
            return Err(Refusal::Full);
        };
        // A page never touched is mapped now (the zero page, for a read):
        // the copy below must not fault under the lock the fault thread
        // needs.
        // SAFETY: the page is mapped and readable (the caller checked).
        unsafe { core::ptr::read_volatile(page as *const u8) };
        let result = (|| {
            u.register(page, PAGE).map_err(Refusal::Kernel)?;
            if let Err(e) = u.write_protect(page, PAGE, true) {
                let _ = u.unregister(page, PAGE);
                return Err(Refusal::Kernel(e));
            }
            // SAFETY: the page is mapped, present or not, and only writers
            // wait on it now; the aside page is ours.
            unsafe {
                core::ptr::copy_nonoverlapping(page as *const u8, aside as *mut u8, PAGE as usize);
                libc::madvise(
                    page as *mut libc::c_void,
                    PAGE as usize,
                    libc::MADV_DONTNEED,
                );
            }
            Ok(())
        })();
        if let Err(e) = result {
            s.spare.push(aside);
            return Err(e);
        }
        let watch = Watch {
            page,
            armed_at: now,
            outcome: Outcome::Armed,
            ended_at: 0,
            tid: 0,
            touched_at: 0,
        };
        s.watches.push(watch);
        s.aside.push(aside);
        ARMED.fetch_add(1, Ordering::Relaxed);
        LOWEST.fetch_min(page, Ordering::Relaxed);
        HIGHEST.fetch_max(page, Ordering::Relaxed);
        Ok(())
    });
    ARMS.fetch_add(1, Ordering::Relaxed);
    ARM_NS.fetch_add(
        crate::platform::clock::monotonic_ns().saturating_sub(started),
        Ordering::Relaxed,
    );
    r
}

/// Gives watch `i`'s page back (its contents from aside) with `outcome`.
/// Gives watch `i`'s page back with `outcome`, reached by thread `tid` at
/// byte `at` (0: none, or not known).
fn give_back(s: &mut State, i: usize, outcome: Outcome, now: u64, tid: u32, at: u64) {
    let Some(u) = s.uffd.as_ref() else { return };
    let w = &mut s.watches[i];
    if w.outcome != Outcome::Armed {
        return;
    }
    // EEXIST: the page is back already; ENOENT: its mapping is gone (the
    // program unmapped it). Any other failure leaves the page registered
    // and away, to be given back at its next fault: unregistering it
    // would leave it empty.
    match u.copy(w.page, s.aside[i], PAGE) {
        Ok(()) | Err(libc::EEXIST) | Err(libc::ENOENT) => {}
        Err(_) => return,
    }
    let _ = u.unregister(w.page, PAGE);
    w.outcome = outcome;
    // The coarse tick may lag the precise time the watch was armed at.
    w.ended_at = now.max(w.armed_at);
    w.tid = tid;
    w.touched_at = at;
    s.spare.push(s.aside[i]);
    s.aside[i] = 0;
    if ARMED.fetch_sub(1, Ordering::Relaxed) == 1 {
        LOWEST.store(u64::MAX, Ordering::Relaxed);
        HIGHEST.store(0, Ordering::Relaxed);
    }
}

/// A block at `addr` of `size` bytes is about to be released or
/// reallocated: its pages (and its allocator header's) are given back
/// first. Costs one load while nothing is watched.
#[inline]
pub fn before_release(addr: u64, size: u64) {
    if ARMED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let first = addr.saturating_sub(16) & !(PAGE - 1);
    let last = addr.saturating_add(size).saturating_add(16) & !(PAGE - 1);
    if last < LOWEST.load(Ordering::Relaxed) || first > HIGHEST.load(Ordering::Relaxed) {
        return;
    }
    release_pages(first, last);
}

#[cold]
#[inline(never)]
fn release_pages(first: u64, last: u64) {
    with(|s| give_back_pages(s, first, last, Outcome::Released));
}

/// Gives every armed page in `[first, last]` back with `outcome` (lock held).
fn give_back_pages(s: &mut State, first: u64, last: u64, outcome: Outcome) {
    if ARMED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = crate::platform::clock::tick();
    for i in 0..s.watches.len() {
        let page = s.watches[i].page;
        if page >= first && page <= last {
            give_back(s, i, outcome, now, 0, 0);
        }
    }
}

/// Gives every armed page back unaccessed, for good: the process is
/// finishing its trace (exec or exit), and arms nothing more.
pub fn give_all_back() {
    PAUSED.store(true, Ordering::Relaxed);
    with(|s| give_back_pages(s, 0, u64::MAX, Outcome::Released));
}

/// Before a scan reads the heap: every armed page back (`Interrupted`),
/// and no arming until [`resume`].
pub fn pause() {
    with(|s| {
        PAUSED.store(true, Ordering::Relaxed);
        give_back_pages(s, 0, u64::MAX, Outcome::Interrupted);
    });
}

pub fn resume() {
    PAUSED.store(false, Ordering::Relaxed);
}

pub fn before_fork() {
    SHARED.lock.lock();
    // SAFETY: the lock is held (until the parent or child handler).
    let s = unsafe { &mut *SHARED.state.get() };
    give_back_pages(s, 0, u64::MAX, Outcome::Released);
}

pub fn after_fork_parent() {
    SHARED.lock.unlock();
}

/// The child has no watched page and no fault thread: it forgets the
/// parent's watches and descriptor.
pub fn after_fork_child() {
    SHARED.lock.reset();
    // SAFETY: the child's only thread; the lock was just reset.
    let s = unsafe { &mut *SHARED.state.get() };
    s.uffd = None; // closes the inherited descriptor
    s.watches.clear();
    s.aside.clear();
    FD.store(-1, Ordering::Release);
    ARMED.store(0, Ordering::Relaxed);
}

/// Serves one message of the userfaultfd (the fault thread). `is_agent`
/// says whether a thread id is one of the agent's own.
pub fn serve(message: &uffd::Message, is_agent: impl Fn(u32) -> bool) {
    let started = crate::platform::clock::monotonic_ns();
    let now = crate::platform::clock::tick();
    // Page faults are the only messages asked for.
    if message.event != uffd::EVENT_PAGEFAULT {
        return;
    }
    {
        let page = message.arg1 & !(PAGE - 1);
        let tid = message.arg2 as u32;
        with(|s| {
            let at = s
                .watches
                .iter()
                .position(|w| w.page == page && w.outcome == Outcome::Armed);
            match at {
                Some(i) => {
                    let outcome = if is_agent(tid) {
                        Outcome::Interrupted
                    } else {
                        Outcome::Touched
                    };
                    let at = if EXACT.load(Ordering::Relaxed) {
                        message.arg1
                    } else {
                        0
                    };
                    give_back(s, i, outcome, now, tid, at);
                }
                None => {
                    // Served already (another thread's fault on the same
                    // page: woken, it retries), or a page the kernel
                    // dropped (it reads as zeros, as without us).
                    if let Some(u) = s.uffd.as_ref() {
                        if u.zero(page, PAGE).is_err() {
                            let _ = u.wake(page, PAGE);
                        }
                    }
                }
            }
        });
        FAULTS.fetch_add(1, Ordering::Relaxed);
        FAULT_NS.fetch_add(
            crate::platform::clock::monotonic_ns().saturating_sub(started),
            Ordering::Relaxed,
        );
    }
}

/// The watches, and forgets those that have ended (each ended watch is
/// reported once).
pub fn take_report() -> Vec<Watch> {
    with(|s| {
        let out = s.watches.clone();
        let mut keep = 0;
        for i in 0..s.watches.len() {
            if s.watches[i].outcome == Outcome::Armed {
                s.watches[keep] = s.watches[i];
                s.aside[keep] = s.aside[i];
                keep += 1;
            }
        }
        s.watches.truncate(keep);
        s.aside.truncate(keep);
        out
    })
}

/// Gives the pages in `[first, last]` back unaccessed, on a watcher's
/// request (`Released`).
pub fn disarm(first: u64, last: u64) {
    release_pages(first, last);
}

/// Pages armed now.
pub fn armed() -> u64 {
    ARMED.load(Ordering::Relaxed)
}

/// The descriptor the fault thread reads (-1: none).
pub fn fd() -> i32 {
    FD.load(Ordering::Acquire)
}

//! CPU sampling (`trapline run --profile[=HZ]`): every thread is sampled on
//! its own CPU time, with its call stack, into the same trace.
//!
//! Each thread creates a POSIX timer on its own CPU-time clock
//! (`CLOCK_THREAD_CPUTIME_ID`) that signals that very thread
//! (`SIGEV_THREAD_ID`) with a real-time signal chosen at start: the highest
//! one the program left at its default disposition and does not block. The
//! handler unwinds the interrupted code from the registers in its
//! `ucontext` with the thread's own unwinding cache, interns the stack and
//! appends a `Sample`. A signal that strikes while the thread is inside the
//! agent (its guard is held: its buffer, caches or a table lock may be
//! mid-use) is counted as skipped, never lost silently. The kernel checks
//! CPU-time timers at its scheduler tick, so one signal may stand for several
//! periods (the timer's overrun): samples carry that weight.
//!
//! The program never sees the signal: `sigaction` shows it its own view
//! (SIG_DFL until it sets something); if it installs a disposition of its
//! own, sampling stops with a warning and the signal is handed over.

use crate::capture::modules;
use crate::capture::unwind::StackCapture;
use crate::events::record;
use crate::events::thread;
use crate::platform::arch;
use crate::platform::sys;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use trapline_trace::{Event, ProfileStopReason};

/// Most CPU time one sample may stand for, in milliseconds: several kernel
/// ticks (4 ms at HZ 250, 10 ms at HZ 100).
const MAX_WEIGHT_MS: u32 = 20;
/// `sival_ptr` of the agent's timers: tells its signals from anyone else's.
const COOKIE: usize = 0x7472_6170_6c69_6e65;

static HZ: AtomicU32 = AtomicU32::new(0);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Samples are being taken.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The program installed its own disposition for the sampling signal.
static TAKEN: AtomicBool = AtomicBool::new(false);
static LOCK: crate::platform::lock::RawLock = crate::platform::lock::RawLock::new();
/// What the program last set for the sampling signal (its view: SIG_DFL at start).
static mut PROGRAM_VIEW: core::mem::MaybeUninit<libc::sigaction> = core::mem::MaybeUninit::zeroed();

/// Live timers: `USED | tid << 32 | kernel timer id`, 0 for a free slot.
/// Stopping deletes them from whichever thread ends the process.
const SLOTS: usize = 8192;
const USED: u64 = 1 << 63;
static TIMERS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Skipped periods per slot not yet written (the thread writes them with its
/// next sample; at exit the finishing thread writes what is left).
static SKIPPED: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Per slot: periods the timer signalled (sampled or skipped), and the
/// thread's CPU time when its timer was armed; at the thread's end the
/// difference with its CPU clock gives the periods no signal came for.
static SIGNALLED: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static ARMED_CPU_NS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// One past the highest slot ever used (bounds the scans).
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);
/// The signal mask bit to restore after fork (whether it was blocked before).
static BLOCKED_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// The sampling rate if sampling is configured for this process.
pub fn hz() -> Option<u32> {
    let hz = HZ.load(Ordering::Relaxed);
    (hz > 0).then_some(hz)
}

/// Whether `sig` is the sampling signal (its disposition is the agent's business).
pub fn is_sampling_signal(sig: c_int) -> bool {
    sig != 0 && SIGNAL.load(Ordering::Relaxed) == sig
}

/// The sampling signal while the agent owns it (0 otherwise): masks the
/// program sets leave it out (hooks/sigmask.rs).
pub fn protected_signal() -> c_int {
    if TAKEN.load(Ordering::Relaxed) {
        return 0;
    }
    SIGNAL.load(Ordering::Relaxed)
}

/// Reads the configuration, picks the signal, installs the handler and arms
/// the calling (main) thread. Runs in the constructor, before the fatal-signal
/// handlers are installed (which then leave the sampling signal alone).
pub fn init() {
    let hz = match crate::config::OPTIONS.profile_hz.load(Ordering::Relaxed) {
        0 => return,
        crate::config::PROFILE_HZ_INVALID => {
            sys::warn(
                "TRAPLINE_PROFILE is not a rate between 1 and 100000 Hz; CPU sampling is off",
            );
            return;
        }
        hz => hz,
    };
    let Some(sig) = free_signal() else {
        sys::warn("every real-time signal is in use or blocked; CPU sampling is off");
        return;
    };
    // SAFETY: installing a handler with a zeroed, then filled, sigaction.
    let installed = unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        let mut old: libc::sigaction = core::mem::zeroed();
        let r = crate::platform::signals::real_sigaction()(sig, &act, &mut old);
        (*core::ptr::addr_of_mut!(PROGRAM_VIEW)) = core::mem::MaybeUninit::new(old);
        r == 0
    };
    if !installed {
        sys::warn("cannot install the sampling signal's handler; CPU sampling is off");
        return;
    }
    HZ.store(hz, Ordering::Relaxed);
    SIGNAL.store(sig, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    write_start();
    thread_begin();
}

/// Tells the trace that sampling is on, and how (first thing in every trace).
fn write_start() {
    let ts = thread::current();
    let time = ts.next_precise_time();
    let hz = HZ.load(Ordering::Relaxed);
    let signal = SIGNAL.load(Ordering::Relaxed) as u32;
    ts.emit(Some(time), |e, c| {
        e.event(c, &Event::ProfileStart { time, hz, signal })
    });
}

/// The highest real-time signal at SIG_DFL and not blocked, other than the
/// reachability scan's park signal (installed later, when a scan runs).
fn free_signal() -> Option<c_int> {
    // SAFETY: querying dispositions and the mask into zeroed structs.
    unsafe {
        let mut mask: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut mask);
        (libc::SIGRTMIN()..=libc::SIGRTMAX()).rev().find(|&sig| {
            let mut old: libc::sigaction = core::mem::zeroed();
            sig != crate::services::scan::world::park_signal()
                && crate::platform::signals::real_sigaction()(sig, core::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_DFL
                && libc::sigismember(&mask, sig) == 0
        })
    }
}

/// Starts sampling the calling thread (main thread at start, every new thread
/// before its start routine, a fork child's thread).
pub fn thread_begin() {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let ts = thread::current();
    if ts.agent_thread || ts.profile.is_some() {
        return;
    }
    ts.guard += 1;
    let Some(timer) = create_timer(ts.tid) else {
        ts.guard -= 1;
        sys::warn("cannot create a CPU-time timer for a thread; it is not sampled");
        return;
    };
    let encoded = USED | u64::from(ts.tid) << 32 | u64::from(timer as u32);
    let Some(slot) = claim_slot(encoded) else {
        delete_timer(timer);
        ts.guard -= 1;
        sys::warn("more than 8192 threads sampled at once; a thread is not sampled");
        return;
    };
    ts.profile = Some(Box::new(thread::ThreadProfile {
        capture: StackCapture::new(),
        slot,
    }));
    SIGNALLED[slot].store(0, Ordering::Relaxed);
    ARMED_CPU_NS[slot].store(thread_cpu_ns(ts.tid).unwrap_or(0), Ordering::Relaxed);
    // Armed last: the handler finds the thread's state complete.
    if !ACTIVE.load(Ordering::Acquire) || !arm_timer(timer) {
        release_slot(slot);
    }
    ts.guard -= 1;
}

/// Stops sampling the calling thread at its end (from its pthread-key
/// destructor, state `ts`), and writes its name and the periods it skipped
/// since its last sample.
pub fn thread_end(ts: &mut thread::ThreadState) {
    let Some(slot) = ts.profile.as_ref().map(|p| p.slot) else {
        return;
    };
    ts.guard += 1;
    // Counted before the slot is released (another thread may reuse it).
    let missed = missed_periods(slot, ts.tid);
    release_slot(slot);
    let time = ts.next_time();
    // Periods inside a hook no leave wrote out (the thread ends inside
    // agent code) are skipped ones: counted, not charged.
    let pending = u64::from(ts.agent_periods.swap(0, Ordering::Relaxed));
    write_skipped(ts, time, SKIPPED[slot].swap(0, Ordering::Relaxed) + pending);
    write_missed(ts, time, missed);
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0 {
        write_name(ts, ts.tid, &name);
    }
    ts.profile = None;
    ts.guard -= 1;
}

/// Stops all sampling as the process ends (exit, exec, fatal signal), before
/// the trace is finished. Outside a fatal signal it also writes the names of
/// the threads still alive and what they skipped since their last sample.
pub fn stop(from_signal: bool) {
    if !ACTIVE.swap(false, Ordering::AcqRel) {
        return;
    }
    // Names of the first 1,024 live threads (a stack array: no allocation
    // until the timers are gone).
    let mut tids = [0u32; 1024];
    let (mut ntids, mut skipped, mut missed) = (0usize, 0u64, 0u64);
    delete_all(|slot, tid, s| {
        skipped += s;
        if let Some(tid) = tid {
            missed += missed_periods(slot, tid);
            if ntids < tids.len() {
                tids[ntids] = tid;
                ntids += 1;
            }
        }
    });
    drain_pending();
    if from_signal {
        return;
    }
    // Every thread's periods no hook will write out now: skipped ones.
    let pending = thread::take_pending_agent_periods();
    let ts = thread::current();
    ts.guard += 1;
    let time = ts.next_time();
    let pending = pending + u64::from(ts.agent_periods.swap(0, Ordering::Relaxed));
    write_skipped(ts, time, skipped + pending);
    write_missed(ts, time, missed);
    for &tid in &tids[..ntids] {
        if let Some(name) = read_comm(tid) {
            write_name(ts, tid, &name);
        }
    }
    ts.guard -= 1;
}

/// Fork, in the parent before: keep the sampling signal out of the forking
/// thread while the agent's locks are held for the fork.
pub fn fork_prepare() {
    let sig = SIGNAL.load(Ordering::Relaxed);
    if sig != 0 {
        BLOCKED_FOR_FORK.store(set_blocked(sig, true), Ordering::Relaxed);
    }
}

/// Fork, in the parent after.
pub fn fork_parent() {
    let sig = SIGNAL.load(Ordering::Relaxed);
    if sig != 0 && !BLOCKED_FOR_FORK.load(Ordering::Relaxed) {
        set_blocked(sig, false);
    }
}

/// Fork, in the child: timers are not inherited. The parent's slots are
/// forgotten; the child's one thread is sampled again if the child is traced.
pub fn fork_child(traced: bool) {
    let sig = SIGNAL.load(Ordering::Relaxed);
    if sig == 0 {
        return;
    }
    let used = SLOTS_USED.load(Ordering::Relaxed).min(SLOTS);
    for (timer, skipped) in TIMERS[..used].iter().zip(&SKIPPED[..used]) {
        timer.store(0, Ordering::Relaxed);
        skipped.store(0, Ordering::Relaxed);
    }
    SLOTS_USED.store(0, Ordering::Relaxed);
    LOCK.reset();
    let ts = thread::current();
    ts.profile = None;
    let active = ACTIVE.load(Ordering::Relaxed) && traced;
    ACTIVE.store(active, Ordering::Release);
    if active {
        write_start();
        thread_begin();
    }
    if !BLOCKED_FOR_FORK.load(Ordering::Relaxed) {
        set_blocked(sig, false);
    }
}

/// `sigaction` for the sampling signal, called by the agent's interposer.
///
/// # Safety
/// sigaction's contract.
pub unsafe fn program_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let real = crate::platform::signals::real_sigaction();
    let _g = LOCK.guard();
    if TAKEN.load(Ordering::Acquire) {
        // SAFETY: pass-through: the program owns the signal now.
        return unsafe { real(sig, act, old) };
    }
    // SAFETY: PROGRAM_VIEW was set at init; access is serialised by LOCK.
    unsafe {
        let view = &mut *core::ptr::addr_of_mut!(PROGRAM_VIEW);
        if !old.is_null() {
            *old = view.assume_init();
        }
        if act.is_null() {
            return 0;
        }
        if (*act).sa_sigaction == libc::SIG_DFL {
            *view = core::mem::MaybeUninit::new(*act);
            return 0;
        }
        let r = real(sig, act, core::ptr::null_mut());
        if r == 0 {
            TAKEN.store(true, Ordering::Release);
            hand_over();
        }
        r
    }
}

/// The program took the sampling signal: stop sampling everywhere.
fn hand_over() {
    ACTIVE.store(false, Ordering::Release);
    let mut skipped = 0;
    delete_all(|_, _, s| skipped += s);
    sys::warn("the program installed a handler for the sampling signal; CPU sampling stopped (see `trapline profile`)");
    if let record::Entry::Record(ts) = record::enter() {
        let time = ts.next_time();
        write_skipped(ts, time, skipped);
        ts.emit(Some(time), |e, c| {
            e.event(
                c,
                &Event::ProfileStop {
                    time,
                    reason: ProfileStopReason::SignalTaken,
                },
            )
        });
        record::leave(ts);
    }
}

/// The handler of the sampling signal.
extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
    // SAFETY: errno is thread-local; saved and restored around our work.
    let saved_errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel's siginfo for this signal.
    let (code, overrun, value) = unsafe { timer_fields(info) };
    if code != libc::SI_TIMER || value != COOKIE {
        // Sent by someone else while the program's disposition is its
        // default: die by it exactly as the program would.
        if let Some(fatal) = crate::platform::signals::fatal_handler() {
            fatal(sig, info, ucontext);
        }
        return;
    }
    // A sleep or wait this signal cut short is retried by its hook (eintr.rs).
    // SAFETY: the kernel's context for this signal.
    unsafe { crate::platform::arch::note_agent_eintr(ucontext) };
    if ACTIVE.load(Ordering::Relaxed) && !crate::phase::recording_stopped() {
        // A signal stands for the periods since the previous one, but only
        // those near it are fairly charged to where it lands: when the kernel
        // did not look at the thread for longer (it ran between ticks), the
        // excess is left uncounted here and reported as missed at its end.
        let due = 1 + overrun.max(0) as u32;
        let periods = due.min(MAX_WEIGHT_MS * HZ.load(Ordering::Relaxed).div_ceil(1000));
        // SAFETY: the kernel's ucontext for this signal.
        let regs = unsafe { arch::interrupted_regs(ucontext) };
        sample(regs, periods);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// si_code, si_overrun and sival_ptr of a timer's siginfo.
///
/// # Safety
/// `info` must be a siginfo the kernel passed to a handler.
unsafe fn timer_fields(info: *const libc::siginfo_t) -> (c_int, c_int, usize) {
    // The kernel's layout for timers: si_signo, si_errno, si_code, padding,
    // then si_tid, si_overrun, si_value.
    let base = info as *const u8;
    // SAFETY: siginfo_t is 128 bytes; these offsets lie inside it.
    unsafe {
        (
            (*info).si_code,
            core::ptr::read_unaligned(base.add(20) as *const c_int),
            core::ptr::read_unaligned(base.add(24) as *const usize),
        )
    }
}

/// Records one sample of the calling thread, interrupted at `regs`.
fn sample(regs: arch::StartRegs, periods: u32) {
    let Some(ts) = thread::current_if_any() else {
        return;
    };
    let Some(slot) = ts.profile.as_ref().map(|p| p.slot) else {
        return;
    };
    SIGNALLED[slot].fetch_add(u64::from(periods), Ordering::Relaxed);
    // Inside a hook: its buffer, caches or a lock may be mid-use, so the
    // hook writes these periods as it leaves, charged to the program's call
    // it serves (record::leave).
    if !ts.agent_thread && ts.guard > 0 {
        ts.agent_periods.fetch_add(periods, Ordering::Relaxed);
        return;
    }
    // The agent's own code outside a call of the program's (a hook's
    // entry), or an agent thread.
    if ts.agent_thread || modules::is_agent_pc(regs.pc) {
        SKIPPED[slot].fetch_add(u64::from(periods), Ordering::Relaxed);
        return;
    }
    ts.guard = 1;
    let bounds = ts.bounds_for(regs.sp);
    let Some(p) = ts.profile.as_deref_mut() else {
        ts.guard = 0;
        return;
    };
    let cap = p.capture.capture(regs, bounds, &mut ts.rules, || {});
    if cap.id == 0 {
        SKIPPED[slot].fetch_add(u64::from(periods), Ordering::Relaxed);
    } else {
        record::ensure_stack(ts, cap.id, cap.new);
        let time = ts.next_time();
        write_skipped(ts, time, SKIPPED[slot].swap(0, Ordering::Relaxed));
        ts.emit(Some(time), |e, c| e.sample(c, time, cap.id, periods));
    }
    ts.guard = 0;
}

fn write_skipped(ts: &mut thread::ThreadState, time: u64, periods: u64) {
    if periods > 0 {
        ts.emit(Some(time), |e, c| {
            e.event(c, &Event::SamplesSkipped { time, periods })
        });
    }
}

fn write_missed(ts: &mut thread::ThreadState, time: u64, periods: u64) {
    if periods > 0 {
        ts.emit(Some(time), |e, c| {
            e.event(c, &Event::SamplesMissed { time, periods })
        });
    }
}

/// Writes a thread's name from a NUL-terminated buffer.
fn write_name(ts: &mut thread::ThreadState, tid: u32, raw: &[u8]) {
    let len = raw
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(raw.len());
    let name = String::from_utf8_lossy(&raw[..len]).into_owned();
    ts.emit(None, |e, c| e.event(c, &Event::ThreadName { tid, name }));
}

/// A thread's name from /proc (for threads alive at exit).
fn read_comm(tid: u32) -> Option<[u8; 17]> {
    let path = std::ffi::CString::new(format!("/proc/self/task/{tid}/comm")).ok()?;
    let mut name = [0u8; 17];
    // SAFETY: open/read/close on a path we own, into a buffer we own.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, name.as_mut_ptr().cast(), 16);
        libc::close(fd);
        (n > 0).then_some(name)
    }
}

fn create_timer(tid: u32) -> Option<c_int> {
    // SAFETY: a zeroed sigevent filled for SIGEV_THREAD_ID; the kernel writes the id.
    unsafe {
        let mut sev: libc::sigevent = core::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = SIGNAL.load(Ordering::Relaxed);
        sev.sigev_value = libc::sigval {
            sival_ptr: COOKIE as *mut libc::c_void,
        };
        sev.sigev_notify_thread_id = tid as c_int;
        let mut id: c_int = -1;
        let r = libc::syscall(
            libc::SYS_timer_create,
            libc::CLOCK_THREAD_CPUTIME_ID,
            &mut sev as *mut libc::sigevent,
            &mut id as *mut c_int,
        );
        (r == 0).then_some(id)
    }
}

fn arm_timer(timer: c_int) -> bool {
    let period_ns = 1_000_000_000 / i64::from(HZ.load(Ordering::Relaxed).max(1));
    let period = libc::timespec {
        tv_sec: period_ns / 1_000_000_000,
        tv_nsec: period_ns % 1_000_000_000,
    };
    let spec = libc::itimerspec {
        it_interval: period,
        it_value: period,
    };
    // SAFETY: arming a timer this process created.
    unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            timer,
            0,
            &spec as *const libc::itimerspec,
            core::ptr::null_mut::<libc::itimerspec>(),
        ) == 0
    }
}

fn delete_timer(timer: c_int) {
    // SAFETY: deleting a timer this process created (ids are process-wide).
    unsafe { libc::syscall(libc::SYS_timer_delete, timer) };
}

fn claim_slot(encoded: u64) -> Option<usize> {
    let slot = TIMERS.iter().position(|t| {
        t.compare_exchange(0, encoded, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    SLOTS_USED.fetch_max(slot + 1, Ordering::AcqRel);
    Some(slot)
}

/// Deletes every registered timer, calling `each(slot, tid, skipped periods)`
/// per slot in use (tid None: the thread's timer was already deleted).
fn delete_all(mut each: impl FnMut(usize, Option<u32>, u64)) {
    let used = SLOTS_USED.load(Ordering::Acquire).min(SLOTS);
    for (slot, (timer, skipped)) in TIMERS[..used].iter().zip(&SKIPPED[..used]).enumerate() {
        let v = timer.swap(0, Ordering::AcqRel);
        let tid = (v & USED != 0).then(|| {
            delete_timer(v as u32 as c_int);
            (v >> 32) as u32 & 0x7fff_ffff
        });
        each(slot, tid, skipped.swap(0, Ordering::Relaxed));
    }
}

/// CPU time of thread `tid` of this process, in nanoseconds (the kernel's
/// per-thread CPU clock id: `~tid << 3 | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`).
fn thread_cpu_ns(tid: u32) -> Option<u64> {
    crate::platform::clock::read_ns((!(tid as c_int) << 3) | 6)
}

/// Periods of thread `tid` (slot `slot`) that used CPU but were never
/// signalled. The last, partial period is not counted.
fn missed_periods(slot: usize, tid: u32) -> u64 {
    let Some(now) = thread_cpu_ns(tid) else {
        return 0;
    };
    let used = now.saturating_sub(ARMED_CPU_NS[slot].load(Ordering::Relaxed));
    let due = u128::from(used) * u128::from(HZ.load(Ordering::Relaxed)) / 1_000_000_000;
    (due as u64).saturating_sub(SIGNALLED[slot].load(Ordering::Relaxed) + 1)
}

/// Deletes the slot's timer, unless `stop` got to it first.
fn release_slot(slot: usize) {
    let v = TIMERS[slot].swap(0, Ordering::AcqRel);
    if v & USED != 0 {
        delete_timer(v as u32 as c_int);
    }
}

/// Blocks or unblocks the signal for the calling thread; returns whether it
/// was blocked before.
fn set_blocked(sig: c_int, block: bool) -> bool {
    // SAFETY: changing the calling thread's mask with sets we own.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        crate::platform::signals::real_pthread_sigmask()(how, &set, &mut old);
        libc::sigismember(&old, sig) == 1
    }
}

/// Takes any sampling signal still pending for the calling thread, so that
/// none outlives the timers (an exec keeps pending signals, and the new
/// image would die of one at its default disposition).
fn drain_pending() {
    let sig = SIGNAL.load(Ordering::Relaxed);
    let was_blocked = set_blocked(sig, true);
    // SAFETY: polling with a zero timeout on a set we own.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while libc::sigtimedwait(&set, core::ptr::null_mut(), &zero) == sig {}
    }
    if !was_blocked {
        set_blocked(sig, false);
    }
}

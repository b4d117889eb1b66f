//! Sleeps and waits that one of the agent's own signals cut short are
//! retried, so that the program never sees that EINTR.
//!
//! The reachability scan stops threads with a signal (scan/world.rs) and the
//! profiler samples them with one (profile.rs). Both handlers are installed
//! with SA_RESTART, but some calls fail with EINTR after any handler,
//! whatever SA_RESTART says (signal(7)): the sleeps, the descriptor
//! multiplexers, the semaphore waits and the signal waits. Natively nothing
//! interrupts them: a `sleep(60)` that a periodic scan cut short returned
//! early, and a program that does not retry went on before its time.
//!
//! The handlers count, in a word of this thread's TLS, each time they made
//! the system call the thread was in fail with EINTR
//! (`arch::note_agent_eintr`: the kernel put -EINTR in the saved rax). A
//! hook reads the count before the call; if the call failed with EINTR and
//! the count moved, the interruption was the agent's, and the hook calls
//! again with what is left of the timeout (absolute timeouts unchanged). An
//! EINTR from the program's own signal is returned as it comes. Both can
//! meet in one call only if both signals are delivered at the same return
//! from the kernel: the program's EINTR is then retried away too (rare: the
//! two would have to arrive within microseconds).
//!
//! The calls that take a signal mask (ppoll, pselect, epoll_pwait,
//! sigsuspend) or a set of signals to wait for (sigwait, sigwaitinfo,
//! sigtimedwait) get it without the agent's signals, as sigprocmask does
//! (sigmask.rs): a thread that waits for every signal would otherwise take
//! the park signal as its own, and one that blocks every signal while it
//! waits could not be stopped.
//!
//! Sockets with a timeout and System V IPC waits are in `ipc.rs`. Calls
//! inside the C library that do not go through its exported symbols are
//! not seen, nor raw system calls.

use crate::platform::sys::cached_next_symbol as next;
use core::ffi::{c_int, c_uint};
use core::sync::atomic::AtomicUsize;
use libc::{
    clockid_t, epoll_event, fd_set, nfds_t, pollfd, sem_t, siginfo_t, sigset_t, timespec, timeval,
};

static REAL_NANOSLEEP: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOCK_NANOSLEEP: AtomicUsize = AtomicUsize::new(0);
static REAL_POLL: AtomicUsize = AtomicUsize::new(0);
static REAL_PPOLL: AtomicUsize = AtomicUsize::new(0);
static REAL_POLL_CHK: AtomicUsize = AtomicUsize::new(0);
static REAL_PPOLL_CHK: AtomicUsize = AtomicUsize::new(0);
static REAL_SELECT: AtomicUsize = AtomicUsize::new(0);
static REAL_PSELECT: AtomicUsize = AtomicUsize::new(0);
static REAL_EPOLL_WAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_EPOLL_PWAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_EPOLL_PWAIT2: AtomicUsize = AtomicUsize::new(0);
static REAL_SEM_WAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_SEM_TIMEDWAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_SEM_CLOCKWAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_PAUSE: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGSUSPEND: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGWAIT: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGWAITINFO: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGTIMEDWAIT: AtomicUsize = AtomicUsize::new(0);

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    for (slot, name) in [
        (&REAL_NANOSLEEP, c"nanosleep"),
        (&REAL_CLOCK_NANOSLEEP, c"clock_nanosleep"),
        (&REAL_POLL, c"poll"),
        (&REAL_PPOLL, c"ppoll"),
        (&REAL_POLL_CHK, c"__poll_chk"),
        (&REAL_PPOLL_CHK, c"__ppoll_chk"),
        (&REAL_SELECT, c"select"),
        (&REAL_PSELECT, c"pselect"),
        (&REAL_EPOLL_WAIT, c"epoll_wait"),
        (&REAL_EPOLL_PWAIT, c"epoll_pwait"),
        (&REAL_EPOLL_PWAIT2, c"epoll_pwait2"),
        (&REAL_SEM_WAIT, c"sem_wait"),
        (&REAL_SEM_TIMEDWAIT, c"sem_timedwait"),
        (&REAL_SEM_CLOCKWAIT, c"sem_clockwait"),
        (&REAL_PAUSE, c"pause"),
        (&REAL_SIGSUSPEND, c"sigsuspend"),
        (&REAL_SIGWAIT, c"sigwait"),
        (&REAL_SIGWAITINFO, c"sigwaitinfo"),
        (&REAL_SIGTIMEDWAIT, c"sigtimedwait"),
    ] {
        next(slot, name);
    }
}

/// The C library's function of `name` as an `F`, if it has one.
macro_rules! real {
    ($slot:expr, $name:literal, $ty:ty) => {{
        let f = next(&$slot, $name);
        // SAFETY: the C library's function of that name, which has this
        // signature.
        (f != 0).then(|| unsafe { core::mem::transmute::<usize, $ty>(f) })
    }};
}

pub mod ipc;

fn errno() -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// Whether a call that returned `error` was cut short by one of the agent's
/// signals since the count was `before`.
fn agents(error: c_int, before: u64) -> bool {
    error == libc::EINTR && crate::platform::arch::agent_eintr_count() != before
}

/// A call's end, on the monotonic clock, for calls with a relative timeout.
#[derive(Clone, Copy)]
struct Deadline(u64);

/// The monotonic clock itself: no shared state (the trace clock publishes
/// its readings), for busy pollers that call with short timeouts.
use crate::platform::clock::monotonic_ns as now_ns;

impl Deadline {
    fn after_ns(ns: u64) -> Deadline {
        Deadline(now_ns().saturating_add(ns))
    }

    fn after_ms(ms: c_int) -> Option<Deadline> {
        match ms {
            // A poll that does not wait has nothing left to wait for.
            0 => Some(Deadline(0)),
            _ => (ms > 0).then(|| Deadline::after_ns(ms as u64 * 1_000_000)),
        }
    }

    /// # Safety
    /// `ts` is null or points to a valid timespec.
    unsafe fn after_timespec(ts: *const timespec) -> Option<Deadline> {
        // SAFETY: the caller's contract.
        let t = unsafe { ts.as_ref() }?;
        let ns = (t.tv_sec.max(0) as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec.max(0) as u64);
        Some(Deadline::after_ns(ns))
    }

    fn left_ns(self) -> u64 {
        self.0.saturating_sub(now_ns())
    }

    /// What is left in milliseconds, rounded up, as poll takes it.
    fn left_ms(self) -> c_int {
        self.left_ns().div_ceil(1_000_000).min(c_int::MAX as u64) as c_int
    }

    fn left_timespec(self) -> timespec {
        let ns = self.left_ns();
        timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        }
    }
}

/// A mask or signal set without the agent's signals (sigmask.rs), or the
/// caller's own if it has none of them.
struct Mask(Option<sigset_t>, *const sigset_t);

impl Mask {
    /// # Safety
    /// `set` is null or points to a valid sigset_t.
    unsafe fn of(set: *const sigset_t) -> Mask {
        // SAFETY: the caller's contract.
        Mask(unsafe { super::sigmask::agent_signals_removed(set) }, set)
    }

    fn ptr(&self) -> *const sigset_t {
        self.0.as_ref().map_or(self.1, |s| s as *const sigset_t)
    }
}

/// One call of `call`: its result, or None when the error `error_of` reads
/// from it is EINTR from the agent's signals.
#[inline(always)]
fn unless_agents<T: Copy>(mut call: impl FnMut() -> T, error_of: impl Fn(T) -> c_int) -> Option<T> {
    let before = crate::platform::arch::agent_eintr_count();
    let r = call();
    (!agents(error_of(r), before)).then_some(r)
}

/// The error of a call that returns -1 and sets errno on failure (0 if it
/// did not fail).
fn failure<T: PartialEq + From<i8>>(r: T) -> c_int {
    if r == T::from(-1) {
        errno()
    } else {
        0
    }
}

/// Calls `call` again while the error `error_of` reads from its result is
/// EINTR from the agent's signals.
fn retried_while<T: Copy>(mut call: impl FnMut() -> T, error_of: impl Fn(T) -> c_int) -> T {
    loop {
        if let Some(r) = unless_agents(&mut call, &error_of) {
            return r;
        }
    }
}

/// Calls `call` (which returns -1 and sets errno on failure) again while it
/// fails with EINTR from the agent's signals.
fn retried<T: Copy + PartialEq + From<i8>>(call: impl FnMut() -> T) -> T {
    retried_while(call, failure)
}

/// `retried` for calls that return the error number instead.
fn retried_returning_error(call: impl FnMut() -> c_int) -> c_int {
    retried_while(call, |r| r)
}

/// `retried` for a call with a relative timeout in milliseconds (negative:
/// none), given what is left of it each time.
fn retried_ms(timeout: c_int, mut call: impl FnMut(c_int) -> c_int) -> c_int {
    let deadline = Deadline::after_ms(timeout);
    let mut timeout = timeout;
    retried(|| {
        let r = call(timeout);
        if let Some(d) = deadline {
            timeout = d.left_ms();
        }
        r
    })
}

/// `retried` for a call with a relative timeout as a timespec (null: none),
/// given the caller's first, then what is left of it.
///
/// # Safety
/// `timeout` is null or points to a valid timespec.
unsafe fn retried_timespec(
    timeout: *const timespec,
    mut call: impl FnMut(*const timespec) -> c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let deadline = unsafe { Deadline::after_timespec(timeout) };
    let mut left = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut timeout = timeout;
    retried(|| {
        let r = call(timeout);
        if let Some(d) = deadline {
            left = d.left_timespec();
            timeout = &left;
        }
        r
    })
}

type NanosleepFn = unsafe extern "C" fn(*const timespec, *mut timespec) -> c_int;

/// nanosleep through the real one, retried after the agent's interruptions
/// with what was left (which it reports in `rem`, as the kernel does).
///
/// # Safety
/// nanosleep's contract.
unsafe fn nanosleep_retried(req: *const timespec, rem: *mut timespec) -> c_int {
    let Some(f) = real!(REAL_NANOSLEEP, c"nanosleep", NanosleepFn) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_nanosleep, req, rem) as c_int };
    };
    let mut left = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let out = if rem.is_null() { &mut left } else { rem };
    let mut req = req;
    retried(|| {
        // SAFETY: the caller's arguments, then what the kernel left in `out`.
        let r = unsafe { f(req, out) };
        req = out;
        r
    })
}

/// # Safety
/// nanosleep's contract.
#[no_mangle]
pub unsafe extern "C" fn nanosleep(req: *const timespec, rem: *mut timespec) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    unsafe { nanosleep_retried(req, rem) }
}

/// # Safety
/// clock_nanosleep's contract.
#[no_mangle]
pub unsafe extern "C" fn clock_nanosleep(
    clock: clockid_t,
    flags: c_int,
    req: *const timespec,
    rem: *mut timespec,
) -> c_int {
    type F = unsafe extern "C" fn(clockid_t, c_int, *const timespec, *mut timespec) -> c_int;
    let Some(f) = real!(REAL_CLOCK_NANOSLEEP, c"clock_nanosleep", F) else {
        return libc::ENOSYS;
    };
    let absolute = flags & libc::TIMER_ABSTIME != 0;
    let mut left = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let out = if rem.is_null() { &mut left } else { rem };
    let mut req = req;
    retried_returning_error(|| {
        // SAFETY: the caller's arguments, then what the kernel left in `out`.
        let r = unsafe { f(clock, flags, req, out) };
        if !absolute {
            req = out;
        }
        r
    })
}

/// # Safety
/// usleep's contract.
#[no_mangle]
pub unsafe extern "C" fn usleep(usec: libc::useconds_t) -> c_int {
    // glibc's usleep is a nanosleep it calls from inside, past this hook.
    let req = timespec {
        tv_sec: (usec / 1_000_000) as libc::time_t,
        tv_nsec: ((usec % 1_000_000) * 1000) as libc::c_long,
    };
    // SAFETY: a valid request and no remainder.
    unsafe { nanosleep_retried(&req, core::ptr::null_mut()) }
}

/// # Safety
/// sleep's contract.
#[no_mangle]
pub unsafe extern "C" fn sleep(seconds: c_uint) -> c_uint {
    // As glibc's sleep (a nanosleep from inside): the seconds left when a
    // signal ended it, errno untouched otherwise.
    let saved = errno();
    let req = timespec {
        tv_sec: seconds as libc::time_t,
        tv_nsec: 0,
    };
    let mut left = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid request and remainder.
    if unsafe { nanosleep_retried(&req, &mut left) } != 0 {
        return left.tv_sec as c_uint;
    }
    set_errno(saved);
    0
}

/// # Safety
/// poll's contract.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    type F = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;
    let Some(f) = real!(REAL_POLL, c"poll", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_poll, fds, n, timeout) as c_int };
    };
    // SAFETY: the caller's arguments.
    retried_ms(timeout, |t| unsafe { f(fds, n, t) })
}

/// # Safety
/// ppoll's contract.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    tmo: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int;
    let Some(f) = real!(REAL_PPOLL, c"ppoll", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's pointers (ppoll's contract); the mask without the
    // agent's signals.
    unsafe {
        let mask = Mask::of(mask);
        retried_timespec(tmo, |t| f(fds, n, t, mask.ptr()))
    }
}

/// `poll` as a program built with `_FORTIFY_SOURCE` calls it (the size of
/// `fds` checked first), which does not pass through `poll`.
///
/// # Safety
/// poll's contract; `fds_len` is the size of the array at `fds`.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fds_len: libc::size_t,
) -> c_int {
    type F = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int, libc::size_t) -> c_int;
    let Some(f) = real!(REAL_POLL_CHK, c"__poll_chk", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's arguments (its checked size included).
    retried_ms(timeout, |t| unsafe { f(fds, n, t, fds_len) })
}

/// `ppoll` as a program built with `_FORTIFY_SOURCE` calls it.
///
/// # Safety
/// ppoll's contract; `fds_len` is the size of the array at `fds`.
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    tmo: *const timespec,
    mask: *const sigset_t,
    fds_len: libc::size_t,
) -> c_int {
    type F = unsafe extern "C" fn(
        *mut pollfd,
        nfds_t,
        *const timespec,
        *const sigset_t,
        libc::size_t,
    ) -> c_int;
    let Some(f) = real!(REAL_PPOLL_CHK, c"__ppoll_chk", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's pointers (ppoll's contract); the mask without the
    // agent's signals.
    unsafe {
        let mask = Mask::of(mask);
        retried_timespec(tmo, |t| f(fds, n, t, mask.ptr(), fds_len))
    }
}

/// # Safety
/// select's contract.
#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    read: *mut fd_set,
    write: *mut fd_set,
    except: *mut fd_set,
    timeout: *mut timeval,
) -> c_int {
    type F =
        unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
    let Some(f) = real!(REAL_SELECT, c"select", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's arguments. On EINTR Linux leaves the sets as they
    // were and the timeout at what is left: the same call goes on.
    retried(|| unsafe { f(n, read, write, except, timeout) })
}

/// # Safety
/// pselect's contract.
#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    read: *mut fd_set,
    write: *mut fd_set,
    except: *mut fd_set,
    timeout: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(
        c_int,
        *mut fd_set,
        *mut fd_set,
        *mut fd_set,
        *const timespec,
        *const sigset_t,
    ) -> c_int;
    let Some(f) = real!(REAL_PSELECT, c"pselect", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's pointers (pselect's contract; the sets are left
    // untouched on EINTR, as for select); the mask without the agent's signals.
    unsafe {
        let mask = Mask::of(mask);
        retried_timespec(timeout, |t| f(n, read, write, except, t, mask.ptr()))
    }
}

/// # Safety
/// epoll_wait's contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int;
    let Some(f) = real!(REAL_EPOLL_WAIT, c"epoll_wait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's arguments.
    retried_ms(timeout, |t| unsafe { f(epfd, events, max, t) })
}

/// # Safety
/// epoll_pwait's contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;
    let Some(f) = real!(REAL_EPOLL_PWAIT, c"epoll_pwait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's mask (epoll_pwait's contract).
    let mask = unsafe { Mask::of(mask) };
    // SAFETY: the caller's arguments, the mask without the agent's signals.
    retried_ms(timeout, |t| unsafe { f(epfd, events, max, t, mask.ptr()) })
}

/// # Safety
/// epoll_pwait2's contract.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(
        c_int,
        *mut epoll_event,
        c_int,
        *const timespec,
        *const sigset_t,
    ) -> c_int;
    let Some(f) = real!(REAL_EPOLL_PWAIT2, c"epoll_pwait2", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's pointers (epoll_pwait2's contract); the mask
    // without the agent's signals.
    unsafe {
        let mask = Mask::of(mask);
        retried_timespec(timeout, |t| f(epfd, events, max, t, mask.ptr()))
    }
}

/// # Safety
/// sem_wait's contract.
#[no_mangle]
pub unsafe extern "C" fn sem_wait(sem: *mut sem_t) -> c_int {
    type F = unsafe extern "C" fn(*mut sem_t) -> c_int;
    let Some(f) = real!(REAL_SEM_WAIT, c"sem_wait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's semaphore.
    retried(|| unsafe { f(sem) })
}

/// # Safety
/// sem_timedwait's contract.
#[no_mangle]
pub unsafe extern "C" fn sem_timedwait(sem: *mut sem_t, abs: *const timespec) -> c_int {
    type F = unsafe extern "C" fn(*mut sem_t, *const timespec) -> c_int;
    let Some(f) = real!(REAL_SEM_TIMEDWAIT, c"sem_timedwait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's arguments; the timeout is absolute.
    retried(|| unsafe { f(sem, abs) })
}

/// # Safety
/// sem_clockwait's contract.
#[no_mangle]
pub unsafe extern "C" fn sem_clockwait(
    sem: *mut sem_t,
    clock: clockid_t,
    abs: *const timespec,
) -> c_int {
    type F = unsafe extern "C" fn(*mut sem_t, clockid_t, *const timespec) -> c_int;
    let Some(f) = real!(REAL_SEM_CLOCKWAIT, c"sem_clockwait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's arguments; the timeout is absolute.
    retried(|| unsafe { f(sem, clock, abs) })
}

/// # Safety
/// pause's contract.
#[no_mangle]
pub unsafe extern "C" fn pause() -> c_int {
    type F = unsafe extern "C" fn() -> c_int;
    let Some(f) = real!(REAL_PAUSE, c"pause", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: no arguments.
    retried(|| unsafe { f() })
}

/// # Safety
/// sigsuspend's contract.
#[no_mangle]
pub unsafe extern "C" fn sigsuspend(mask: *const sigset_t) -> c_int {
    type F = unsafe extern "C" fn(*const sigset_t) -> c_int;
    let Some(f) = real!(REAL_SIGSUSPEND, c"sigsuspend", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's mask (sigsuspend's contract).
    let mask = unsafe { Mask::of(mask) };
    // SAFETY: the mask without the agent's signals.
    retried(|| unsafe { f(mask.ptr()) })
}

/// # Safety
/// sigwait's contract.
#[no_mangle]
pub unsafe extern "C" fn sigwait(set: *const sigset_t, sig: *mut c_int) -> c_int {
    type F = unsafe extern "C" fn(*const sigset_t, *mut c_int) -> c_int;
    let Some(f) = real!(REAL_SIGWAIT, c"sigwait", F) else {
        return libc::ENOSYS;
    };
    // SAFETY: the caller's set (sigwait's contract).
    let set = unsafe { Mask::of(set) };
    // SAFETY: the set without the agent's signals (glibc's sigwait retries
    // EINTR itself; kept for other C libraries).
    retried_returning_error(|| unsafe { f(set.ptr(), sig) })
}

/// # Safety
/// sigwaitinfo's contract.
#[no_mangle]
pub unsafe extern "C" fn sigwaitinfo(set: *const sigset_t, info: *mut siginfo_t) -> c_int {
    type F = unsafe extern "C" fn(*const sigset_t, *mut siginfo_t) -> c_int;
    let Some(f) = real!(REAL_SIGWAITINFO, c"sigwaitinfo", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's set (sigwaitinfo's contract).
    let set = unsafe { Mask::of(set) };
    // SAFETY: the set without the agent's signals.
    retried(|| unsafe { f(set.ptr(), info) })
}

/// # Safety
/// sigtimedwait's contract.
#[no_mangle]
pub unsafe extern "C" fn sigtimedwait(
    set: *const sigset_t,
    info: *mut siginfo_t,
    timeout: *const timespec,
) -> c_int {
    type F = unsafe extern "C" fn(*const sigset_t, *mut siginfo_t, *const timespec) -> c_int;
    let Some(f) = real!(REAL_SIGTIMEDWAIT, c"sigtimedwait", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: the caller's pointers (sigtimedwait's contract); the set
    // without the agent's signals.
    unsafe {
        let set = Mask::of(set);
        retried_timespec(timeout, |t| f(set.ptr(), info, t))
    }
}

//! pthread mutexes, rwlocks, spinlocks, condition waits and pthread_exit.
//!
//! Contention is measured where it happens: every blocking acquisition first
//! tries the lock; if it is free the acquisition is recorded as uncontended.
//! If it is busy the thread records a request, waits in the real function,
//! and records a contended acquisition with its wait. The hot hooks are
//! trampolines (`with_return_address`) that hand their implementation the
//! caller's return address, the key of the call-site stack cache.

use crate::events::held::Hold;
use crate::events::production_sync;
use crate::events::sync::{self, CallSite};
use crate::platform::arch::{start_regs, with_return_address, MUTEX_OWNER_OFFSET};
use crate::platform::clock::monotonic_ns;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};
use libc::{
    clockid_t, pthread_cond_t, pthread_mutex_t, pthread_mutexattr_t, pthread_rwlock_t,
    pthread_rwlockattr_t, pthread_spinlock_t, timespec, EBUSY, EDEADLK, EOWNERDEAD,
};
use trapline_trace::{LockKind, LockMisuse, LockMode, LockOp};

/// The real function behind a hook, looked up on first use. `name` ends in NUL.
#[inline]
fn resolve(slot: &AtomicUsize, name: &[u8]) -> usize {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    resolve_slow(slot, name)
}

#[cold]
fn resolve_slow(slot: &AtomicUsize, name: &[u8]) -> usize {
    let f = core::ffi::CStr::from_bytes_with_nul(name).map_or(0, crate::platform::sys::next_symbol);
    if f == 0 {
        crate::platform::sys::warn(
            "a pthread function the agent wraps is missing from the C library",
        );
        // SAFETY: abort has no preconditions; nothing sensible can follow.
        unsafe { libc::abort() };
    }
    slot.store(f, Ordering::Release);
    f
}

/// Reinterprets a resolved address as the function pointer type `F`.
#[inline(always)]
fn typed<F: Copy>(f: usize) -> F {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    // SAFETY: `F` is a function pointer type (every caller is `real!`) and
    // `f` the non-null address of the C library's function of that type.
    unsafe { core::mem::transmute_copy(&f) }
}

/// `real!(name: fn type)`: the C library's `name`, typed.
macro_rules! real {
    ($name:ident : $ty:ty) => {{
        static SLOT: AtomicUsize = AtomicUsize::new(0);
        typed::<$ty>(resolve(&SLOT, concat!(stringify!($name), "\0").as_bytes()))
    }};
}

type MutexFn = unsafe extern "C" fn(*mut pthread_mutex_t) -> c_int;
type RwFn = unsafe extern "C" fn(*mut pthread_rwlock_t) -> c_int;
type SpinFn = unsafe extern "C" fn(*mut pthread_spinlock_t) -> c_int;

/// The type of a mutex, from glibc's kind word.
#[inline]
fn mutex_kind(m: *const pthread_mutex_t) -> LockKind {
    sync::mutex_kind(m as u64)
}

/// Whether the lock's first word, which glibc's mutexes, rwlocks and
/// spinlocks all keep 0 while they are free and unwaited, is 0 now. A racy
/// read: production mode takes a free-looking lock directly, without the
/// trylock that costs more than the rest of its hook (bench/locks.sh).
#[inline(always)]
fn looks_free<T>(l: *const T) -> bool {
    // SAFETY: `l` is the caller's lock, at least 4 bytes, aligned to 4.
    unsafe { core::ptr::read_volatile(l.cast::<u32>()) == 0 }
}

/// Production mode's acquisition of a lock that looked free: the real
/// call, tracked if it took the lock. It waits unrecorded if another
/// thread took the lock in between (a race of a few instructions).
#[inline(always)]
fn take_free_looking(addr: u64, hold: Hold, site: CallSite, wait: impl FnOnce() -> c_int) -> c_int {
    let r = wait();
    if acquired_now(r) {
        production_sync::acquired(addr, hold, site);
    }
    r
}

/// The tid glibc stored as the mutex's owner (0 when free).
fn mutex_owner(m: *const pthread_mutex_t) -> u32 {
    // SAFETY: as in `mutex_kind`; the owner word is read racily, which is
    // fine for the question "is it me?" (only this thread writes its own tid).
    unsafe { core::ptr::read_volatile(m.cast::<u8>().add(MUTEX_OWNER_OFFSET).cast::<i32>()) as u32 }
}

fn acquired_now(r: c_int) -> bool {
    r == 0 || r == EOWNERDEAD
}

/// The lock was taken without waiting: recorded, or in production mode
/// tracked (`production_sync.rs`).
#[inline(always)]
fn took(addr: u64, kind: LockKind, mode: LockMode, op: LockOp, site: CallSite) {
    if crate::config::production() {
        production_sync::acquired(addr, Hold::of(kind, mode, op), site);
    } else {
        sync::acquired(addr, kind, mode, op, None, site);
    }
}

/// The thread is about to release the lock (see `sync::releasing`).
#[inline(always)]
fn releasing(addr: u64, kind: LockKind, exclusive: bool, owner: Option<u32>, site: CallSite) {
    if crate::config::production() {
        production_sync::releasing(addr);
    } else {
        sync::releasing(addr, kind, exclusive, owner, site);
    }
}

/// Records the outcome `r` of a trylock (production mode records no
/// failed attempt: a spinning program makes millions).
fn tried(addr: u64, kind: LockKind, mode: LockMode, r: c_int, site: CallSite) -> c_int {
    if acquired_now(r) {
        took(addr, kind, mode, LockOp::Try, site);
    } else if !crate::config::production() {
        sync::failed(addr, kind, mode, LockOp::Try, r, site);
    }
    r
}

/// The slow half of every blocking or timed acquisition: the lock was busy.
/// Records the request, waits in `wait`, records the outcome.
#[inline(never)]
fn contended(
    addr: u64,
    kind: LockKind,
    mode: LockMode,
    op: LockOp,
    site: CallSite,
    wait: impl FnOnce() -> c_int,
) -> c_int {
    let production = crate::config::production();
    if production {
        production_sync::requesting(addr, kind, mode, site);
    } else {
        sync::requesting(addr, kind, mode, site);
    }
    let t0 = monotonic_ns();
    let r = wait();
    let waited = monotonic_ns().saturating_sub(t0);
    if acquired_now(r) {
        if production {
            production_sync::acquired_after_wait(addr, Hold::of(kind, mode, op), waited, site);
        } else {
            sync::acquired(addr, kind, mode, op, Some(waited), site);
        }
    } else {
        if r == EDEADLK {
            sync::misuse(addr, kind, LockMisuse::Refused, r, start_regs());
        }
        sync::failed(addr, kind, mode, op, r, site);
    }
    r
}

/// Before waiting for a busy mutex: a thread relocking a non-recursive mutex
/// it holds never returns (recorded and flushed first); an error-checking
/// one is refused at once by the C library (recorded, returned).
fn relock(m: *mut pthread_mutex_t, kind: LockKind, real: impl FnOnce() -> c_int) -> Option<c_int> {
    if kind == LockKind::MutexRecursive || mutex_owner(m) != sync::current_tid() {
        return None;
    }
    if kind == LockKind::MutexErrorCheck {
        let r = real();
        sync::misuse(m as u64, kind, LockMisuse::Refused, r, start_regs());
        return Some(r);
    }
    sync::misuse(
        m as u64,
        kind,
        LockMisuse::SelfDeadlock,
        EDEADLK,
        start_regs(),
    );
    Some(real())
}

/// A blocking or timed mutex acquisition: try first, wait only if busy.
#[inline(always)]
fn mutex_acquire(
    m: *mut pthread_mutex_t,
    op: LockOp,
    site: CallSite,
    wait: impl FnOnce() -> c_int + Copy,
) -> c_int {
    if !crate::config::locks_recorded() {
        return wait();
    }
    let addr = m as u64;
    if crate::config::production() && looks_free(m) {
        return take_free_looking(addr, Hold::mutex(op), site, wait);
    }
    // SAFETY: the caller's mutex, passed through.
    let r = unsafe { real!(pthread_mutex_trylock: MutexFn)(m) };
    if acquired_now(r) {
        took(addr, mutex_kind(m), LockMode::Exclusive, op, site);
        return r;
    }
    if r != EBUSY {
        // Refused (a destroyed or never initialised mutex: EINVAL), or a
        // state trylock does not share: the call itself says, and is recorded.
        let r = wait();
        let kind = mutex_kind(m);
        if acquired_now(r) {
            took(addr, kind, LockMode::Exclusive, op, site);
        } else {
            sync::failed(addr, kind, LockMode::Exclusive, op, r, site);
        }
        return r;
    }
    let kind = mutex_kind(m);
    // A timed lock of a held mutex times out: only a blocking one never returns.
    if op == LockOp::Blocking {
        if let Some(r) = relock(m, kind, wait) {
            return r;
        }
    }
    contended(addr, kind, LockMode::Exclusive, op, site, wait)
}

/// In production mode a mutex that looks free is taken here, by the real
/// call and a push, with no frame but this one (bench/locks.sh); any
/// other goes the full path's way, out of line.
extern "C" fn mutex_lock(m: *mut pthread_mutex_t, ret: u64, sp: u64) -> c_int {
    if crate::config::production_locks() && looks_free(m) {
        let hold = Hold::mutex(LockOp::Blocking);
        // SAFETY: the caller's mutex, passed through.
        return take_free_looking(m as u64, hold, CallSite { ret, sp }, || unsafe {
            real!(pthread_mutex_lock: MutexFn)(m)
        });
    }
    full_mutex_lock(m, CallSite { ret, sp })
}

#[inline(never)]
fn full_mutex_lock(m: *mut pthread_mutex_t, site: CallSite) -> c_int {
    // SAFETY: the caller's mutex, passed through.
    mutex_acquire(m, LockOp::Blocking, site, || unsafe {
        real!(pthread_mutex_lock: MutexFn)(m)
    })
}
with_return_address!(pthread_mutex_lock, mutex_lock, "rsi", "rdx");

extern "C" fn mutex_timedlock(
    m: *mut pthread_mutex_t,
    abstime: *const timespec,
    ret: u64,
    sp: u64,
) -> c_int {
    let site = CallSite { ret, sp };
    type F = unsafe extern "C" fn(*mut pthread_mutex_t, *const timespec) -> c_int;
    // SAFETY: the caller's arguments, passed through.
    mutex_acquire(m, LockOp::Timed, site, || unsafe {
        real!(pthread_mutex_timedlock: F)(m, abstime)
    })
}
with_return_address!(pthread_mutex_timedlock, mutex_timedlock, "rdx", "rcx");

extern "C" fn mutex_clocklock(
    m: *mut pthread_mutex_t,
    clock: clockid_t,
    abstime: *const timespec,
    ret: u64,
    sp: u64,
) -> c_int {
    let site = CallSite { ret, sp };
    type F = unsafe extern "C" fn(*mut pthread_mutex_t, clockid_t, *const timespec) -> c_int;
    // SAFETY: the caller's arguments, passed through.
    mutex_acquire(m, LockOp::Timed, site, || unsafe {
        real!(pthread_mutex_clocklock: F)(m, clock, abstime)
    })
}
with_return_address!(pthread_mutex_clocklock, mutex_clocklock, "rcx", "r8");

extern "C" fn mutex_trylock(m: *mut pthread_mutex_t, ret: u64, sp: u64) -> c_int {
    let site = CallSite { ret, sp };
    // SAFETY: the caller's mutex, passed through.
    let r = unsafe { real!(pthread_mutex_trylock: MutexFn)(m) };
    tried(m as u64, mutex_kind(m), LockMode::Exclusive, r, site)
}
with_return_address!(pthread_mutex_trylock, mutex_trylock, "rsi", "rdx");

/// A mutex unlock: the release is stamped before the real unlock (the lock
/// orders it), and a refusal of the C library (EINVAL: a destroyed mutex or
/// one it never made; EPERM: an error-checking or recursive one the caller
/// does not own) is recorded after it, with the kind read before.
extern "C" fn mutex_unlock(m: *mut pthread_mutex_t, ret: u64, sp: u64) -> c_int {
    if crate::config::production_locks() {
        production_sync::releasing(m as u64);
        // SAFETY: the caller's mutex, passed through.
        let r = unsafe { real!(pthread_mutex_unlock: MutexFn)(m) };
        if r != 0 {
            refused_unlock(m, r);
        }
        return r;
    }
    full_mutex_unlock(m, CallSite { ret, sp })
}

#[cold]
#[inline(never)]
fn refused_unlock(m: *mut pthread_mutex_t, r: c_int) {
    sync::misuse(
        m as u64,
        mutex_kind(m),
        LockMisuse::Refused,
        r,
        start_regs(),
    );
}

#[inline(never)]
fn full_mutex_unlock(m: *mut pthread_mutex_t, site: CallSite) -> c_int {
    if !crate::config::locks_recorded() {
        // SAFETY: the caller's mutex, passed through.
        return unsafe { real!(pthread_mutex_unlock: MutexFn)(m) };
    }
    let kind = mutex_kind(m);
    sync::releasing(m as u64, kind, true, Some(mutex_owner(m)), site);
    // SAFETY: the caller's mutex, passed through.
    let r = unsafe { real!(pthread_mutex_unlock: MutexFn)(m) };
    if r != 0 {
        sync::misuse(m as u64, kind, LockMisuse::Refused, r, start_regs());
    }
    r
}
with_return_address!(pthread_mutex_unlock, mutex_unlock, "rsi", "rdx");

/// `pthread_*_init` and `pthread_*_destroy` of one lock type: both record
/// the call with its stack. A destroy is recorded before the real call:
/// glibc refuses to destroy a locked mutex (EBUSY), but the program meant
/// to, which is the misuse to report.
macro_rules! init_and_destroy {
    ($init:ident, $destroy:ident, $lock:ty, $attr:ty, $kind:expr) => {
        /// # Safety
        /// As the C library's function.
        #[no_mangle]
        pub unsafe extern "C" fn $init(l: *mut $lock, attr: *const $attr) -> c_int {
            let regs = start_regs();
            type F = unsafe extern "C" fn(*mut $lock, *const $attr) -> c_int;
            // SAFETY: the caller's arguments, passed through.
            let r = unsafe { real!($init: F)(l, attr) };
            // Production mode keeps no lock's lifetime (a program may
            // make a lock per object).
            if r == 0 && !crate::config::production() {
                sync::lifetime(l as u64, $kind(l), true, regs);
            }
            r
        }

        /// # Safety
        /// As the C library's function.
        #[no_mangle]
        pub unsafe extern "C" fn $destroy(l: *mut $lock) -> c_int {
            if !crate::config::production() {
                sync::lifetime(l as u64, $kind(l), false, start_regs());
            }
            type F = unsafe extern "C" fn(*mut $lock) -> c_int;
            // SAFETY: the caller's lock, passed through.
            unsafe { real!($destroy: F)(l) }
        }
    };
}
init_and_destroy!(
    pthread_mutex_init,
    pthread_mutex_destroy,
    pthread_mutex_t,
    pthread_mutexattr_t,
    mutex_kind
);

// ---------------------------------------------------------------------------
// rwlocks.

/// A blocking or timed rwlock acquisition: try first, wait only if busy.
#[inline(always)]
fn rw_acquire(
    l: *mut pthread_rwlock_t,
    mode: LockMode,
    op: LockOp,
    site: CallSite,
    wait: impl FnOnce() -> c_int,
) -> c_int {
    if !crate::config::locks_recorded() {
        return wait();
    }
    if crate::config::production() && looks_free(l) {
        let hold = Hold::of(LockKind::RwLock, mode, op);
        return take_free_looking(l as u64, hold, site, wait);
    }
    // SAFETY: the caller's rwlock, passed through.
    let r = unsafe {
        match mode {
            LockMode::Shared => real!(pthread_rwlock_tryrdlock: RwFn)(l),
            LockMode::Exclusive => real!(pthread_rwlock_trywrlock: RwFn)(l),
        }
    };
    if acquired_now(r) {
        took(l as u64, LockKind::RwLock, mode, op, site);
        return r;
    }
    if r != EBUSY {
        return wait();
    }
    contended(l as u64, LockKind::RwLock, mode, op, site, wait)
}

macro_rules! rw_blocking {
    ($hook:ident, $imp:ident, $real:ident, $mode:expr) => {
        extern "C" fn $imp(l: *mut pthread_rwlock_t, ret: u64, sp: u64) -> c_int {
            let site = CallSite { ret, sp };
            // SAFETY: the caller's rwlock, passed through.
            rw_acquire(l, $mode, LockOp::Blocking, site, || unsafe {
                real!($real: RwFn)(l)
            })
        }
        with_return_address!($hook, $imp, "rsi", "rdx");
    };
}
rw_blocking!(
    pthread_rwlock_rdlock,
    rw_rdlock,
    pthread_rwlock_rdlock,
    LockMode::Shared
);
rw_blocking!(
    pthread_rwlock_wrlock,
    rw_wrlock,
    pthread_rwlock_wrlock,
    LockMode::Exclusive
);

macro_rules! rw_timed {
    ($hook:ident, $imp:ident, $real:ident, $mode:expr) => {
        extern "C" fn $imp(l: *mut pthread_rwlock_t, abstime: *const timespec, ret: u64, sp: u64) -> c_int {
            let site = CallSite { ret, sp };
            type F = unsafe extern "C" fn(*mut pthread_rwlock_t, *const timespec) -> c_int;
            // SAFETY: the caller's arguments, passed through.
            rw_acquire(l, $mode, LockOp::Timed, site, || unsafe {
                real!($real: F)(l, abstime)
            })
        }
        with_return_address!($hook, $imp, "rdx", "rcx");
    };
}
rw_timed!(
    pthread_rwlock_timedrdlock,
    rw_timedrdlock,
    pthread_rwlock_timedrdlock,
    LockMode::Shared
);
rw_timed!(
    pthread_rwlock_timedwrlock,
    rw_timedwrlock,
    pthread_rwlock_timedwrlock,
    LockMode::Exclusive
);

macro_rules! rw_clock {
    ($hook:ident, $imp:ident, $real:ident, $mode:expr) => {
        extern "C" fn $imp(
            l: *mut pthread_rwlock_t,
            clock: clockid_t,
            abstime: *const timespec,
            ret: u64,
            sp: u64,
        ) -> c_int {
            let site = CallSite { ret, sp };
            type F =
                unsafe extern "C" fn(*mut pthread_rwlock_t, clockid_t, *const timespec) -> c_int;
            // SAFETY: the caller's arguments, passed through.
            rw_acquire(l, $mode, LockOp::Timed, site, || unsafe {
                real!($real: F)(l, clock, abstime)
            })
        }
        with_return_address!($hook, $imp, "rcx", "r8");
    };
}
rw_clock!(
    pthread_rwlock_clockrdlock,
    rw_clockrdlock,
    pthread_rwlock_clockrdlock,
    LockMode::Shared
);
rw_clock!(
    pthread_rwlock_clockwrlock,
    rw_clockwrlock,
    pthread_rwlock_clockwrlock,
    LockMode::Exclusive
);

macro_rules! rw_try {
    ($hook:ident, $imp:ident, $real:ident, $mode:expr) => {
        extern "C" fn $imp(l: *mut pthread_rwlock_t, ret: u64, sp: u64) -> c_int {
            let site = CallSite { ret, sp };
            // SAFETY: the caller's rwlock, passed through.
            let r = unsafe { real!($real: RwFn)(l) };
            tried(l as u64, LockKind::RwLock, $mode, r, site)
        }
        with_return_address!($hook, $imp, "rsi", "rdx");
    };
}
rw_try!(
    pthread_rwlock_tryrdlock,
    rw_tryrdlock,
    pthread_rwlock_tryrdlock,
    LockMode::Shared
);
rw_try!(
    pthread_rwlock_trywrlock,
    rw_trywrlock,
    pthread_rwlock_trywrlock,
    LockMode::Exclusive
);

extern "C" fn rw_unlock(l: *mut pthread_rwlock_t, ret: u64, sp: u64) -> c_int {
    let site = CallSite { ret, sp };
    releasing(l as u64, LockKind::RwLock, false, None, site);
    // SAFETY: the caller's rwlock, passed through.
    unsafe { real!(pthread_rwlock_unlock: RwFn)(l) }
}
with_return_address!(pthread_rwlock_unlock, rw_unlock, "rsi", "rdx");

init_and_destroy!(
    pthread_rwlock_init,
    pthread_rwlock_destroy,
    pthread_rwlock_t,
    pthread_rwlockattr_t,
    |_| LockKind::RwLock
);

// ---------------------------------------------------------------------------
// Spinlocks.

extern "C" fn spin_lock(l: *mut pthread_spinlock_t, ret: u64, sp: u64) -> c_int {
    if !crate::config::locks_recorded() {
        // SAFETY: the caller's spinlock, passed through.
        return unsafe { real!(pthread_spin_lock: SpinFn)(l) };
    }
    let site = CallSite { ret, sp };
    if crate::config::production() && looks_free(l) {
        let hold = Hold::of(LockKind::Spin, LockMode::Exclusive, LockOp::Blocking);
        // SAFETY: the caller's spinlock, passed through.
        let wait = || unsafe { real!(pthread_spin_lock: SpinFn)(l) };
        return take_free_looking(l as u64, hold, site, wait);
    }
    // SAFETY: the caller's spinlock, passed through.
    let r = unsafe { real!(pthread_spin_trylock: SpinFn)(l) };
    if r == 0 {
        took(
            l as u64,
            LockKind::Spin,
            LockMode::Exclusive,
            LockOp::Blocking,
            site,
        );
        return r;
    }
    // SAFETY: as above.
    contended(
        l as u64,
        LockKind::Spin,
        LockMode::Exclusive,
        LockOp::Blocking,
        site,
        || unsafe { real!(pthread_spin_lock: SpinFn)(l) },
    )
}
with_return_address!(pthread_spin_lock, spin_lock, "rsi", "rdx");

extern "C" fn spin_trylock(l: *mut pthread_spinlock_t, ret: u64, sp: u64) -> c_int {
    let site = CallSite { ret, sp };
    // SAFETY: the caller's spinlock, passed through.
    let r = unsafe { real!(pthread_spin_trylock: SpinFn)(l) };
    tried(l as u64, LockKind::Spin, LockMode::Exclusive, r, site)
}
with_return_address!(pthread_spin_trylock, spin_trylock, "rsi", "rdx");

extern "C" fn spin_unlock(l: *mut pthread_spinlock_t, ret: u64, sp: u64) -> c_int {
    let site = CallSite { ret, sp };
    releasing(l as u64, LockKind::Spin, true, None, site);
    // SAFETY: the caller's spinlock, passed through.
    unsafe { real!(pthread_spin_unlock: SpinFn)(l) }
}
with_return_address!(pthread_spin_unlock, spin_unlock, "rsi", "rdx");

// ---------------------------------------------------------------------------
// Condition variables: the wait releases the mutex and takes it back; the
// re-acquisition is recorded as such, never as contention.

fn cond_wait_around(
    m: *mut pthread_mutex_t,
    site: CallSite,
    wait: impl FnOnce() -> c_int,
) -> c_int {
    if !crate::config::locks_recorded() {
        return wait();
    }
    if crate::config::production() {
        // The mutex is held again at the return, untracked by the trace.
        production_sync::cond_waiting(m as u64);
        return wait();
    }
    let kind = mutex_kind(m);
    sync::releasing(m as u64, kind, true, Some(mutex_owner(m)), site);
    let r = wait();
    // Every outcome but a refused call (EINVAL, EPERM) holds the mutex again.
    if r != libc::EINVAL && r != libc::EPERM {
        sync::acquired(
            m as u64,
            kind,
            LockMode::Exclusive,
            LockOp::CondWait,
            None,
            site,
        );
    }
    r
}

extern "C" fn cond_wait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
    ret: u64,
    sp: u64,
) -> c_int {
    let site = CallSite { ret, sp };
    type F = unsafe extern "C" fn(*mut pthread_cond_t, *mut pthread_mutex_t) -> c_int;
    // SAFETY: the caller's arguments, passed through.
    cond_wait_around(m, site, || unsafe { real!(pthread_cond_wait: F)(c, m) })
}
with_return_address!(pthread_cond_wait, cond_wait, "rdx", "rcx");

extern "C" fn cond_timedwait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
    abstime: *const timespec,
    ret: u64,
    sp: u64,
) -> c_int {
    let site = CallSite { ret, sp };
    type F =
        unsafe extern "C" fn(*mut pthread_cond_t, *mut pthread_mutex_t, *const timespec) -> c_int;
    // SAFETY: the caller's arguments, passed through.
    cond_wait_around(m, site, || unsafe {
        real!(pthread_cond_timedwait: F)(c, m, abstime)
    })
}
with_return_address!(pthread_cond_timedwait, cond_timedwait, "rcx", "r8");

extern "C" fn cond_clockwait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
    clock: clockid_t,
    abstime: *const timespec,
    ret: u64,
    sp: u64,
) -> c_int {
    let site = CallSite { ret, sp };
    type F = unsafe extern "C" fn(
        *mut pthread_cond_t,
        *mut pthread_mutex_t,
        clockid_t,
        *const timespec,
    ) -> c_int;
    // SAFETY: the caller's arguments, passed through.
    cond_wait_around(m, site, || unsafe {
        real!(pthread_cond_clockwait: F)(c, m, clock, abstime)
    })
}
with_return_address!(pthread_cond_clockwait, cond_clockwait, "r8", "r9");

// ---------------------------------------------------------------------------
// Threads.

/// # Safety
/// As pthread_exit.
#[no_mangle]
pub unsafe extern "C" fn pthread_exit(value: *mut c_void) -> ! {
    sync::exiting(start_regs());
    type F = unsafe extern "C" fn(*mut c_void) -> !;
    // SAFETY: the caller's argument, passed through.
    unsafe { real!(pthread_exit: F)(value) }
}

/// # Safety
/// As pthread_join.
#[no_mangle]
pub unsafe extern "C" fn pthread_join(thread: libc::pthread_t, value: *mut *mut c_void) -> c_int {
    type F = unsafe extern "C" fn(libc::pthread_t, *mut *mut c_void) -> c_int;
    if !crate::config::locks_recorded() {
        // SAFETY: the caller's arguments, passed through.
        return unsafe { real!(pthread_join: F)(thread, value) };
    }
    let regs = start_regs();
    let joined = crate::events::threads::tid_of(thread)
        .or_else(|| crate::events::threads::kernel_tid(thread));
    sync::join_waiting(joined.unwrap_or(0), regs);
    // SAFETY: the caller's arguments, passed through.
    let r = unsafe { real!(pthread_join: F)(thread, value) };
    if r == 0 {
        // Looked up after the join: before it, the thread may not have
        // started (and registered its tid) yet. Until another pthread_create
        // reuses the pthread_t, it still names the joined thread.
        sync::joined(crate::events::threads::tid_of(thread).unwrap_or(0), regs);
    }
    r
}

/// # Safety
/// As pthread_detach.
#[no_mangle]
pub unsafe extern "C" fn pthread_detach(thread: libc::pthread_t) -> c_int {
    let tid = crate::events::threads::tid_of(thread).unwrap_or(0);
    type F = unsafe extern "C" fn(libc::pthread_t) -> c_int;
    // SAFETY: the caller's argument, passed through.
    let r = unsafe { real!(pthread_detach: F)(thread) };
    if r == 0 {
        sync::detached(tid);
    }
    r
}

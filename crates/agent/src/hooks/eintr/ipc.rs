//! Sockets with a timeout, and System V IPC waits: the rest of signal(7)'s
//! list of calls that fail with EINTR after any handler, SA_RESTART or not.
//!
//! A socket call blocks without a timeout unless `SO_RCVTIMEO` (receiving,
//! accepting) or `SO_SNDTIMEO` (sending) is set; `read`, `readv`, `write`
//! and `writev` on a socket are socket calls too (for other descriptors
//! the kernel restarts them, and the hook only checks a count); without one the kernel
//! restarts it after the agent's handlers (SA_RESTART), so only timed
//! sockets reach the slow path here. The socket call has no timeout
//! argument to shorten, and calling it again would start the socket's whole
//! timeout anew (under periodic scans a call would then never time out).
//! So after the agent's interruption the hook waits for the socket with
//! `poll`, until the socket's timeout counted from the interruption, and
//! calls again once it is ready; if the wait runs out, the call fails with
//! EAGAIN, as the kernel's timeout would. The call can thus last up to
//! twice its timeout (the time before the interruption, then a whole
//! timeout), never longer, however often it is interrupted.
//!
//! `connect` cannot wait with `poll` (an unconnected local socket is
//! reported ready at once), so after the agent's interruption a timed
//! connect is called again until the socket's timeout has passed from the
//! interruption, and then fails as the kernel's timeout would: EAGAIN for a
//! local socket, EINPROGRESS otherwise. Linux makes a repeated connect on a
//! TCP socket whose handshake is under way wait for that handshake (and
//! answer 0, or its error), and a local connect that was waiting for room
//! in the listener's queue had not begun; a repeated TCP connect that times
//! out answers EALREADY, which the hook turns back into the EINPROGRESS of
//! the program's one call. Each call blocks for at most the timeout, so
//! the whole lasts at most three times it.
//!
//! System V IPC: `semop`, `msgrcv` and `msgsnd` have no timeout and are
//! called again; `semtimedop` again with what is left of its timeout.

use super::{errno, failure, next, retried, retried_timespec, set_errno, unless_agents, Deadline};
use core::ffi::c_int;
use core::sync::atomic::AtomicUsize;
use libc::{msghdr, size_t, sockaddr, socklen_t, ssize_t, timespec};

static REAL_READ: AtomicUsize = AtomicUsize::new(0);
static REAL_READV: AtomicUsize = AtomicUsize::new(0);
static REAL_WRITE: AtomicUsize = AtomicUsize::new(0);
static REAL_WRITEV: AtomicUsize = AtomicUsize::new(0);
static REAL_READ_CHK: AtomicUsize = AtomicUsize::new(0);
static REAL_RECV_CHK: AtomicUsize = AtomicUsize::new(0);
static REAL_RECVFROM_CHK: AtomicUsize = AtomicUsize::new(0);
static REAL_RECV: AtomicUsize = AtomicUsize::new(0);
static REAL_RECVFROM: AtomicUsize = AtomicUsize::new(0);
static REAL_RECVMSG: AtomicUsize = AtomicUsize::new(0);
static REAL_SEND: AtomicUsize = AtomicUsize::new(0);
static REAL_SENDTO: AtomicUsize = AtomicUsize::new(0);
static REAL_SENDMSG: AtomicUsize = AtomicUsize::new(0);
static REAL_ACCEPT: AtomicUsize = AtomicUsize::new(0);
static REAL_ACCEPT4: AtomicUsize = AtomicUsize::new(0);
static REAL_CONNECT: AtomicUsize = AtomicUsize::new(0);
static REAL_SEMOP: AtomicUsize = AtomicUsize::new(0);
static REAL_SEMTIMEDOP: AtomicUsize = AtomicUsize::new(0);
static REAL_MSGRCV: AtomicUsize = AtomicUsize::new(0);
static REAL_MSGSND: AtomicUsize = AtomicUsize::new(0);

/// Resolves the real functions (from the constructor, while dlsym is safe).
pub fn resolve() {
    for (slot, name) in [
        (&REAL_READ, c"read"),
        (&REAL_READV, c"readv"),
        (&REAL_WRITE, c"write"),
        (&REAL_WRITEV, c"writev"),
        (&REAL_READ_CHK, c"__read_chk"),
        (&REAL_RECV_CHK, c"__recv_chk"),
        (&REAL_RECVFROM_CHK, c"__recvfrom_chk"),
        (&REAL_RECV, c"recv"),
        (&REAL_RECVFROM, c"recvfrom"),
        (&REAL_RECVMSG, c"recvmsg"),
        (&REAL_SEND, c"send"),
        (&REAL_SENDTO, c"sendto"),
        (&REAL_SENDMSG, c"sendmsg"),
        (&REAL_ACCEPT, c"accept"),
        (&REAL_ACCEPT4, c"accept4"),
        (&REAL_CONNECT, c"connect"),
        (&REAL_SEMOP, c"semop"),
        (&REAL_SEMTIMEDOP, c"semtimedop"),
        (&REAL_MSGRCV, c"msgrcv"),
        (&REAL_MSGSND, c"msgsnd"),
    ] {
        next(slot, name);
    }
}

/// Which way a socket call goes: the timeout it obeys, and what `poll`
/// waits for.
#[derive(Clone, Copy)]
enum Way {
    /// recv, recvfrom, recvmsg, accept, accept4: `SO_RCVTIMEO`, readable.
    In,
    /// send, sendto, sendmsg: `SO_SNDTIMEO`, writable.
    Out,
}

/// The socket's timeout for `way` in nanoseconds; None if it has none (or
/// `fd` is no socket).
fn socket_timeout(fd: c_int, way: Way) -> Option<u64> {
    let option = match way {
        Way::In => libc::SO_RCVTIMEO,
        Way::Out => libc::SO_SNDTIMEO,
    };
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = core::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: reading a socket option into a local of its size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    let ns = (tv.tv_sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(tv.tv_usec.max(0) as u64 * 1000);
    (r == 0 && ns > 0).then_some(ns)
}

/// Waits until `fd` is ready for `way` or `deadline` passes (false),
/// through the `poll` hook (which retries the agent's own interruptions).
/// An error of poll counts as ready: the call that follows reports it.
fn ready_by(fd: c_int, way: Way, deadline: Deadline) -> bool {
    let events = match way {
        Way::In => libc::POLLIN,
        Way::Out => libc::POLLOUT,
    };
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let left = deadline.left_ms();
    // SAFETY: one valid pollfd.
    left != 0 && unsafe { super::poll(&mut pfd, 1, left) } != 0
}

/// A socket call (`call` returns -1 and sets errno on failure) that the
/// agent's signals must not cut short. The common case is one call and a
/// compare.
#[inline(always)]
fn socket_call(fd: c_int, way: Way, mut call: impl FnMut() -> ssize_t) -> ssize_t {
    match unless_agents(&mut call, failure) {
        Some(r) => r,
        None => interrupted_socket_call(fd, way, &mut call),
    }
}

/// `socket_call` after the agent's interruption.
#[cold]
#[inline(never)]
fn interrupted_socket_call(fd: c_int, way: Way, call: &mut dyn FnMut() -> ssize_t) -> ssize_t {
    let Some(timeout) = socket_timeout(fd, way) else {
        // No timeout (set since the call began, or a kernel that does not
        // restart): the call again, as SA_RESTART would have.
        return retried(call);
    };
    let deadline = Deadline::after_ns(timeout);
    loop {
        if !ready_by(fd, way, deadline) {
            set_errno(libc::EAGAIN);
            return -1;
        }
        if let Some(r) = unless_agents(&mut *call, failure) {
            return r;
        }
    }
}

/// # Safety
/// read's contract.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut libc::c_void, n: size_t) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut libc::c_void, size_t) -> ssize_t;
    let Some(f) = real!(REAL_READ, c"read", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_read, fd, buf, n) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, buf, n) })
}

/// # Safety
/// readv's contract.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    let Some(f) = real!(REAL_READV, c"readv", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_readv, fd, iov, n) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, iov, n) })
}

/// # Safety
/// write's contract.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const libc::c_void, n: size_t) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *const libc::c_void, size_t) -> ssize_t;
    let Some(f) = real!(REAL_WRITE, c"write", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_write, fd, buf, n) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::Out, || unsafe { f(fd, buf, n) })
}

/// # Safety
/// writev's contract.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    let Some(f) = real!(REAL_WRITEV, c"writev", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_writev, fd, iov, n) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::Out, || unsafe { f(fd, iov, n) })
}

/// `read` as a program built with `_FORTIFY_SOURCE` calls it (the size of
/// the buffer checked first), which does not pass through `read`; likewise
/// the two below.
///
/// # Safety
/// read's contract; `buf_len` is the size of the buffer at `buf`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut libc::c_void,
    n: size_t,
    buf_len: size_t,
) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut libc::c_void, size_t, size_t) -> ssize_t;
    let Some(f) = real!(REAL_READ_CHK, c"__read_chk", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarding the caller's arguments (its checked size included).
    socket_call(fd, Way::In, || unsafe { f(fd, buf, n, buf_len) })
}

/// # Safety
/// recv's contract; `buf_len` is the size of the buffer at `buf`.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut libc::c_void,
    n: size_t,
    buf_len: size_t,
    flags: c_int,
) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut libc::c_void, size_t, size_t, c_int) -> ssize_t;
    let Some(f) = real!(REAL_RECV_CHK, c"__recv_chk", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarding the caller's arguments (its checked size included).
    socket_call(fd, Way::In, || unsafe { f(fd, buf, n, buf_len, flags) })
}

/// # Safety
/// recvfrom's contract; `buf_len` is the size of the buffer at `buf`.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut libc::c_void,
    n: size_t,
    buf_len: size_t,
    flags: c_int,
    from: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    type F = unsafe extern "C" fn(
        c_int,
        *mut libc::c_void,
        size_t,
        size_t,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> ssize_t;
    let Some(f) = real!(REAL_RECVFROM_CHK, c"__recvfrom_chk", F) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarding the caller's arguments (its checked size included).
    socket_call(fd, Way::In, || unsafe {
        f(fd, buf, n, buf_len, flags, from, len)
    })
}

/// # Safety
/// recv's contract.
#[no_mangle]
pub unsafe extern "C" fn recv(
    fd: c_int,
    buf: *mut libc::c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut libc::c_void, size_t, c_int) -> ssize_t;
    let Some(f) = real!(REAL_RECV, c"recv", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, n, flags, 0, 0) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, buf, n, flags) })
}

/// # Safety
/// recvfrom's contract.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut libc::c_void,
    n: size_t,
    flags: c_int,
    from: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    type F = unsafe extern "C" fn(
        c_int,
        *mut libc::c_void,
        size_t,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> ssize_t;
    let Some(f) = real!(REAL_RECVFROM, c"recvfrom", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe {
            libc::syscall(libc::SYS_recvfrom, fd, buf, n, flags, from, len) as ssize_t
        };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, buf, n, flags, from, len) })
}

/// # Safety
/// recvmsg's contract.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;
    let Some(f) = real!(REAL_RECVMSG, c"recvmsg", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_recvmsg, fd, msg, flags) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, msg, flags) })
}

/// # Safety
/// send's contract.
#[no_mangle]
pub unsafe extern "C" fn send(
    fd: c_int,
    buf: *const libc::c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *const libc::c_void, size_t, c_int) -> ssize_t;
    let Some(f) = real!(REAL_SEND, c"send", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_sendto, fd, buf, n, flags, 0, 0) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::Out, || unsafe { f(fd, buf, n, flags) })
}

/// # Safety
/// sendto's contract.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const libc::c_void,
    n: size_t,
    flags: c_int,
    to: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    type F = unsafe extern "C" fn(
        c_int,
        *const libc::c_void,
        size_t,
        c_int,
        *const sockaddr,
        socklen_t,
    ) -> ssize_t;
    let Some(f) = real!(REAL_SENDTO, c"sendto", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_sendto, fd, buf, n, flags, to, len) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::Out, || unsafe { f(fd, buf, n, flags, to, len) })
}

/// # Safety
/// sendmsg's contract.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t;
    let Some(f) = real!(REAL_SENDMSG, c"sendmsg", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::Out, || unsafe { f(fd, msg, flags) })
}

/// # Safety
/// accept's contract.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    let Some(f) = real!(REAL_ACCEPT, c"accept", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_accept, fd, addr, len) as c_int };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe { f(fd, addr, len) as ssize_t }) as c_int
}

/// # Safety
/// accept4's contract.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    let Some(f) = real!(REAL_ACCEPT4, c"accept4", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_accept4, fd, addr, len, flags) as c_int };
    };
    // SAFETY: forwarding the caller's arguments.
    socket_call(fd, Way::In, || unsafe {
        f(fd, addr, len, flags) as ssize_t
    }) as c_int
}

/// # Safety
/// connect's contract.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    type F = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
    let Some(f) = real!(REAL_CONNECT, c"connect", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_connect, fd, addr, len) as c_int };
    };
    // SAFETY: forwarding the caller's arguments.
    let mut call = || unsafe { f(fd, addr, len) };
    match unless_agents(&mut call, failure) {
        Some(r) => r,
        None => interrupted_connect(fd, &mut call),
    }
}

/// `connect` after the agent's interruption (see the module's comment).
#[cold]
#[inline(never)]
fn interrupted_connect(fd: c_int, call: &mut dyn FnMut() -> c_int) -> c_int {
    let Some(timeout) = socket_timeout(fd, Way::Out) else {
        return retried(call);
    };
    let deadline = Deadline::after_ns(timeout);
    let timed_out = if socket_family(fd) == Some(libc::AF_UNIX) {
        libc::EAGAIN
    } else {
        libc::EINPROGRESS
    };
    loop {
        if deadline.left_ns() == 0 {
            set_errno(timed_out);
            return -1;
        }
        match unless_agents(&mut *call, failure) {
            None => {}
            // A repeated TCP connect whose wait ran out.
            Some(-1) if errno() == libc::EALREADY => {
                set_errno(timed_out);
                return -1;
            }
            Some(r) => return r,
        }
    }
}

/// The address family of socket `fd`.
fn socket_family(fd: c_int) -> Option<c_int> {
    // SAFETY: sockaddr_storage is plain data, valid zeroed.
    let mut addr: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: writing at most `len` bytes into a local of that size.
    let r = unsafe {
        libc::getsockname(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(c_int::from(addr.ss_family))
}

/// # Safety
/// semop's contract.
#[no_mangle]
pub unsafe extern "C" fn semop(id: c_int, ops: *mut libc::sembuf, n: size_t) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut libc::sembuf, size_t) -> c_int;
    let Some(f) = real!(REAL_SEMOP, c"semop", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_semop, id, ops, n) as c_int };
    };
    // SAFETY: forwarding the caller's arguments.
    retried(|| unsafe { f(id, ops, n) })
}

/// # Safety
/// semtimedop's contract.
#[no_mangle]
pub unsafe extern "C" fn semtimedop(
    id: c_int,
    ops: *mut libc::sembuf,
    n: size_t,
    timeout: *const timespec,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut libc::sembuf, size_t, *const timespec) -> c_int;
    let Some(f) = real!(REAL_SEMTIMEDOP, c"semtimedop", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_semtimedop, id, ops, n, timeout) as c_int };
    };
    // SAFETY: forwarding the caller's arguments; the timeout is the
    // caller's, then what is left of it.
    unsafe { retried_timespec(timeout, |t| f(id, ops, n, t)) }
}

/// # Safety
/// msgrcv's contract.
#[no_mangle]
pub unsafe extern "C" fn msgrcv(
    id: c_int,
    msg: *mut libc::c_void,
    size: size_t,
    kind: libc::c_long,
    flags: c_int,
) -> ssize_t {
    type F = unsafe extern "C" fn(c_int, *mut libc::c_void, size_t, libc::c_long, c_int) -> ssize_t;
    let Some(f) = real!(REAL_MSGRCV, c"msgrcv", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_msgrcv, id, msg, size, kind, flags) as ssize_t };
    };
    // SAFETY: forwarding the caller's arguments.
    retried(|| unsafe { f(id, msg, size, kind, flags) })
}

/// # Safety
/// msgsnd's contract.
#[no_mangle]
pub unsafe extern "C" fn msgsnd(
    id: c_int,
    msg: *const libc::c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *const libc::c_void, size_t, c_int) -> c_int;
    let Some(f) = real!(REAL_MSGSND, c"msgsnd", F) else {
        // SAFETY: the system call with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_msgsnd, id, msg, size, flags) as c_int };
    };
    // SAFETY: forwarding the caller's arguments.
    retried(|| unsafe { f(id, msg, size, flags) })
}

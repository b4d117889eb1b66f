//! The control socket: the mechanism half of watching a running program.
//!
//! With `trapline run --control` (or `--watch`), the agent of the top
//! process listens on a Unix socket, `PID.sock` in a directory only its
//! owner may enter (trapline-contract's `control`), and an agent thread of
//! its own answers requests there, one line each: the live blocks summed
//! per allocation site, and the agent's counters. The policy (what to ask,
//! how often, what is growing) is `trapline watch`'s, in another process.
//!
//! The program's threads never serve a request. The thread reads the live
//! table one shard at a time, copying a shard's blocks under its lock into
//! room reserved before it took the lock (allocating under a shard lock
//! could wait for the agent heap's lock, which fork takes after the
//! shards'), and sums them with no lock held. A client that sends garbage
//! gets an error line; one that disconnects mid-request is dropped (answers
//! are sent with MSG_NOSIGNAL), and so is one that stops reading its answers
//! for 5 s. Up to 8 clients are served at once (poll); more wait in the
//! listen queue.

use crate::platform::sys;
use crate::services::writer;
use crate::tracking::live;
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::OnceLock;
use trapline_contract::control;
use trapline_trace::AllocFn;

/// The listening socket (-1: none).
static LISTEN_FD: AtomicI32 = AtomicI32::new(-1);
/// The socket's path, and the process that made it (a fork child must not
/// remove its parent's).
static SOCKET: OnceLock<(CString, u32)> = OnceLock::new();
/// Requests answered.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// The serving thread's tid (0 before it runs).
static SERVER_TID: AtomicU32 = AtomicU32::new(0);

/// Starts serving, if the options ask for it (the constructor, once the
/// trace is open). A directory that is not the user's own, or a socket
/// another live agent serves, is refused with a warning: the program runs
/// on unwatched.
pub fn start() {
    // The process `trapline run` started, not its descendants: a build's
    // thousands of short processes would each pay for a socket and a
    // thread no one asks.
    let options = &crate::config::OPTIONS;
    if !crate::config::flag(&options.control) || !crate::config::flag(&options.top) {
        return;
    }
    if let Err(why) = listen() {
        sys::warn_parts(&["control socket not served: ", &why]);
    }
}

fn errno_text() -> &'static str {
    // SAFETY: errno is this thread's.
    sys::errno_name(unsafe { *libc::__errno_location() })
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s}: a path with a NUL byte"))
}

/// Makes the directory and the socket, and starts the serving thread.
fn listen() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let xdg = std::env::var("XDG_RUNTIME_DIR").ok();
    let dir = control::socket_dir(xdg.as_deref(), uid);
    let c_dir = cstring(&dir)?;
    // SAFETY: a NUL-terminated path; an existing directory is checked below.
    unsafe { libc::mkdir(c_dir.as_ptr(), 0o700) };
    // SAFETY: lstat writes the zeroed struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::lstat(c_dir.as_ptr(), &mut st) } != 0 {
        return Err(format!("{dir}: {}", errno_text()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_uid != uid || st.st_mode & 0o077 != 0 {
        return Err(format!(
            "{dir} is not a directory of this user's that only it may enter (mode 0700)"
        ));
    }
    let pid = crate::phase::owner();
    let path = control::socket_path(&dir, pid);
    let c_path = cstring(&path)?;
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = c_path.as_bytes_with_nul();
    if bytes.len() > addr.sun_path.len() {
        return Err(format!("{path}: too long for a socket's path"));
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor we own.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(format!("socket: {}", errno_text()));
        }
        // A socket left by a process of the same pid that is gone: nothing
        // answers a connection to it.
        let probe = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let served = probe >= 0 && libc::connect(probe, (&raw const addr).cast(), len) == 0;
        if probe >= 0 {
            libc::close(probe);
        }
        if served {
            libc::close(fd);
            return Err(format!("{path} is served by another process"));
        }
        libc::unlink(c_path.as_ptr());
        if libc::bind(fd, (&raw const addr).cast(), len) != 0 {
            let e = errno_text();
            libc::close(fd);
            return Err(format!("{path}: {e}"));
        }
        libc::chmod(c_path.as_ptr(), 0o600);
        if libc::listen(fd, 8) != 0 {
            let e = errno_text();
            libc::close(fd);
            libc::unlink(c_path.as_ptr());
            return Err(format!("listen: {e}"));
        }
        // High, where programs rarely look, as the trace's descriptor.
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, writer::high_fd_floor());
        let fd = if high >= 0 {
            libc::close(fd);
            high
        } else {
            fd
        };
        LISTEN_FD.store(fd, Ordering::Release);
    }
    let _ = SOCKET.set((c_path, pid));
    if !spawn() {
        stop();
        return Err("cannot start its thread".to_string());
    }
    Ok(())
}

/// Starts the serving thread with every signal the writer blocks blocked.
fn spawn() -> bool {
    let park = 1u64 << (crate::services::scan::world::park_signal() - 1);
    let old = writer::set_signal_mask(libc::SIG_BLOCK, writer::WRITER_BLOCKED & !park);
    // SAFETY: a detached thread running `serve_main`, which takes no argument.
    let ok = unsafe {
        let mut t: libc::pthread_t = 0;
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let r = sys::create_untraced(&mut t, &attr, serve_main, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if r == 0 {
            let tid = crate::events::threads::kernel_tid(t).unwrap_or(0);
            SERVER_TID.store(tid, Ordering::Release);
            crate::platform::agent_threads::note(tid);
        }
        r == 0
    };
    writer::set_signal_mask(libc::SIG_SETMASK, old);
    ok
}

/// Stops serving: the socket file goes (the process is finishing its
/// trace, or the thread could not start). Only the process that made it
/// removes it.
pub fn stop() {
    let fd = LISTEN_FD.swap(-1, Ordering::AcqRel);
    if let Some((path, pid)) = SOCKET.get() {
        if *pid == sys::getpid_raw() && fd >= 0 {
            // SAFETY: our socket's NUL-terminated path.
            unsafe { libc::unlink(path.as_ptr()) };
        }
    }
    if fd >= 0 {
        // SAFETY: our listening descriptor; an accept waiting on it fails.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

/// A fork child serves nothing: the socket and its thread are the parent's.
pub fn reset_in_child() {
    LISTEN_FD.store(-1, Ordering::Relaxed);
    SERVER_TID.store(0, Ordering::Relaxed);
}

/// Clients served at once; more wait in the listen queue.
const MAX_CLIENTS: usize = 8;
/// A client that does not read its answers for this long is dropped: it
/// must not hold up the others.
const SEND_TIMEOUT_S: libc::time_t = 5;

/// A connected client and the part of a request line it has sent.
struct Client {
    fd: i32,
    pending: Vec<u8>,
}

extern "C" fn serve_main(_arg: *mut libc::c_void) -> *mut libc::c_void {
    crate::platform::agent_threads::note_current();
    crate::events::thread::mark_agent_thread();
    SERVER_TID.store(sys::gettid(), Ordering::Release);
    // SAFETY: naming our own thread; the name fits in 16 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"trapline-ctl".as_ptr()) };
    let mut clients: Vec<Client> = Vec::with_capacity(MAX_CLIENTS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CLIENTS + 1);
    loop {
        let listen_fd = LISTEN_FD.load(Ordering::Acquire);
        if listen_fd < 0 {
            break;
        }
        fds.clear();
        // Not listening while full: a new client waits in the queue.
        let accepting = clients.len() < MAX_CLIENTS;
        let events = if accepting { libc::POLLIN } else { 0 };
        fds.push(libc::pollfd {
            fd: listen_fd,
            events,
            revents: 0,
        });
        fds.extend(clients.iter().map(|c| libc::pollfd {
            fd: c.fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: polling descriptors of ours, `fds.len()` entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            // SAFETY: errno is this thread's.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            break;
        }
        // Clients first, from the last, so that removals keep the indices.
        for i in (0..clients.len()).rev() {
            if fds[i + 1].revents != 0 && !serve(&mut clients[i]) {
                // SAFETY: the client's descriptor, ours.
                unsafe { libc::close(clients[i].fd) };
                clients.swap_remove(i);
            }
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLNVAL | libc::POLLHUP) != 0 {
            // Closed under us (the finish, or a program that closed every
            // descriptor): nothing more to serve.
            break;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Some(fd) = accept(listen_fd) {
                clients.push(Client {
                    fd,
                    pending: Vec::new(),
                });
            }
        }
    }
    for c in clients {
        // SAFETY: the client's descriptor, ours.
        unsafe { libc::close(c.fd) };
    }
    core::ptr::null_mut()
}

/// A new client, its answers bounded in time (`SEND_TIMEOUT_S`).
fn accept(listen_fd: i32) -> Option<i32> {
    // SAFETY: accepting on our listening descriptor.
    let fd = unsafe {
        libc::accept4(
            listen_fd,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let timeout = libc::timeval {
        tv_sec: SEND_TIMEOUT_S,
        tv_usec: 0,
    };
    // SAFETY: setting an option of our socket from a value we own.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&raw const timeout).cast(),
            core::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    Some(fd)
}

/// Reads what a client sent and answers each whole request line; false
/// when the client is gone, sent too long a line, or does not read.
fn serve(client: &mut Client) -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: reading at most buf.len() bytes into buf.
    let n = unsafe { libc::read(client.fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        // SAFETY: errno is this thread's.
        return n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR;
    }
    client.pending.extend_from_slice(&buf[..n as usize]);
    while let Some(end) = client.pending.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = client.pending.drain(..=end).collect();
        let answer = answer(&line[..line.len() - 1]);
        if !send_all(client.fd, answer.as_bytes()) {
            return false;
        }
    }
    if client.pending.len() > control::MAX_REQUEST {
        let _ = send_all(client.fd, b"{\"error\":\"request too long\"}\n");
        return false;
    }
    true
}

fn send_all(conn: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: sending from a live slice; MSG_NOSIGNAL: a client gone is
        // an error, never a SIGPIPE for the program.
        let n = unsafe { libc::send(conn, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            // SAFETY: errno is this thread's.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// The answer to one request line, one line of JSON.
fn answer(request: &[u8]) -> String {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    let request = core::str::from_utf8(request).unwrap_or("").trim();
    let pid = crate::phase::owner();
    let time = crate::platform::clock::precise_now();
    let mut out = String::new();
    match request {
        control::SITES => {
            let _ = write!(out, "{{\"pid\":{pid},\"time_ns\":{time},\"trace\":");
            json_string(&mut out, crate::config::output().unwrap_or(""));
            out.push_str(",\"sites\":[");
            for (i, ((stack, func), (bytes, blocks))) in sites().into_iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(out, "{sep}[{stack},\"{}\",{bytes},{blocks}]", func.name());
            }
            out.push_str("]}\n");
        }
        control::SCAN => match crate::services::scan::on_request() {
            Ok((scan, blocks, pause_ns)) => {
                let _ = writeln!(
                    out,
                    "{{\"pid\":{pid},\"time_ns\":{time},\"scan\":{scan},\"blocks\":{blocks},\"pause_ns\":{pause_ns}}}"
                );
            }
            Err(why) => {
                out.push_str("{\"error\":");
                json_string(&mut out, &why);
                out.push_str("}\n");
            }
        },
        control::COUNTERS => {
            let events = crate::events::buffers::EVENTS_SUBMITTED.load(Ordering::Relaxed);
            let lost = crate::events::buffers::EVENTS_LOST.load(Ordering::Relaxed);
            let requests = REQUESTS.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{{\"pid\":{pid},\"time_ns\":{time},\"events\":{events},\"events_lost\":{lost},\"requests\":{requests}}}"
            );
        }
        _ => {
            out.push_str("{\"error\":");
            json_string(&mut out, &format!("unknown request {request:?}"));
            out.push_str("}\n");
        }
    }
    out
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Live bytes and blocks per allocation site (stack, function), largest
/// first.
fn sites() -> Vec<((u32, AllocFn), (u64, u64))> {
    let mut totals: HashMap<(u32, AllocFn), (u64, u64)> = HashMap::new();
    let mut blocks: Vec<live::Block> = Vec::new();
    for shard in live::shards() {
        // Room first, with no lock held; blocks added meanwhile past it are
        // left for the next request.
        let n = shard.locked().len();
        blocks.clear();
        blocks.reserve(n + n / 8 + 16);
        let room = blocks.capacity();
        shard.locked().for_each(|_, b| {
            if blocks.len() < room {
                blocks.push(b);
            }
        });
        for b in &blocks {
            let t = totals.entry((b.stack, b.func)).or_default();
            t.0 += b.size;
            t.1 += 1;
        }
    }
    let mut out: Vec<_> = totals.into_iter().collect();
    out.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0 .0.cmp(&b.0 .0)));
    out
}

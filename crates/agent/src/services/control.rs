//! The control socket: the mechanism half of watching a running program.
//!
//! With `trapline run --control` (or `--watch`), the agent of every traced
//! process image (fork children and exec'd images included) listens on a
//! Unix socket, `PID.sock` in a directory only its
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
use crate::tracking::{access, live};
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use trapline_contract::control;
use trapline_trace::AllocFn;

/// The listening socket (-1: none).
static LISTEN_FD: AtomicI32 = AtomicI32::new(-1);
/// The socket's path, and the process that made it (a fork child must not
/// remove its parent's).
static SOCKET: Mutex<Option<(CString, u32)>> = Mutex::new(None);
/// Requests answered.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// The serving thread's tid (0 before it runs).
static SERVER_TID: AtomicU32 = AtomicU32::new(0);

/// Starts serving, if the options ask for it (the constructor, once the
/// trace is open). A directory that is not the user's own, or a socket
/// another live agent serves, is refused with a warning: the program runs
/// on unwatched.
pub fn start() {
    // Every process image of a `--control` run: in a master/worker server
    // the workers, fork children, do the work, and a wrapper script's
    // exec'd program is the service.
    if !crate::config::flag(&crate::config::OPTIONS.control) {
        return;
    }
    let bound = if LISTEN_FD.load(Ordering::Acquire) >= 0 {
        Ok(())
    } else {
        bind()
    };
    if let Err(why) = bound.and_then(|()| start_serving()) {
        sys::warn_parts(&["control socket not served: ", &why]);
    }
}

/// Closes and removes a socket `bind` made (the attach failed).
pub fn unbind() {
    let fd = LISTEN_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        if let Some((path, _)) = SOCKET.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: our socket's NUL-terminated path.
            unsafe { libc::unlink(path.as_ptr()) };
        }
        // SAFETY: our listening descriptor, which no thread serves yet.
        unsafe { libc::close(fd) };
    }
}

fn errno_text() -> &'static str {
    // SAFETY: errno is this thread's.
    sys::errno_name(unsafe { *libc::__errno_location() })
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s}: a path with a NUL byte"))
}

/// Makes the directory and the listening socket; `start` then serves it.
/// An attach binds first, before it changes anything of the process's: an
/// attach without a socket could never be detached from.
pub fn bind() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let xdg = std::env::var("XDG_RUNTIME_DIR").ok();
    let dir = match crate::config::control_dir() {
        Some(dir) => own_directory(dir, uid)?,
        // An XDG_RUNTIME_DIR inherited from another user (a daemon started
        // by root that changed its user) is not ours: the default then.
        None => own_directory(&control::socket_dir(xdg.as_deref(), uid), uid)
            .or_else(|_| own_directory(&control::socket_dir(None, uid), uid))?,
    };
    control::remove_stale_sockets(&dir, gone);
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
    *SOCKET.lock().unwrap_or_else(|e| e.into_inner()) = Some((c_path, pid));
    Ok(())
}

/// Starts the serving thread on the bound socket.
fn start_serving() -> Result<(), String> {
    let path = SOCKET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|(path, _)| path.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !spawn() {
        stop();
        return Err("cannot start its thread".to_string());
    }
    // Announced in the trace, for a reader that wants to ask the process.
    queue_event(&trapline_trace::Event::ControlSocket { path }, None, 0);
    Ok(())
}

/// `dir`, made if it does not exist, if it is a directory of user `uid`'s
/// that only it may enter.
fn own_directory(dir: &str, uid: u32) -> Result<String, String> {
    let c_dir = cstring(dir)?;
    // SAFETY: a NUL-terminated path; an existing directory is checked below.
    unsafe { libc::mkdir(c_dir.as_ptr(), 0o700) };
    // SAFETY: lstat writes the zeroed struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::lstat(c_dir.as_ptr(), &mut st) } != 0 {
        return Err(format!("{dir}: {}", errno_text()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_uid != uid || st.st_mode & 0o077 != 0 {
        return Err(format!(
            "{dir} is not a directory of this user's that only it may enter (mode 0700)"
        ));
    }
    Ok(dir.to_owned())
}

/// Whether process `pid` no longer exists.
fn gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; errno is this
    // thread's.
    unsafe { libc::kill(pid as libc::pid_t, 0) != 0 && *libc::__errno_location() == libc::ESRCH }
}

/// Hands one event (with the definition of `stack`, unless 0) to the
/// writer in an agent buffer of its own; one that does not fit is counted
/// as lost.
fn queue_event(ev: &trapline_trace::Event, time: Option<u64>, stack: u32) {
    let mut buf = crate::events::buffers::take_buffer(0);
    crate::events::record::ensure_stack_in(&mut buf, stack);
    if !buf.push_event(ev, time) {
        crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
    }
    crate::events::buffers::submit(buf, false);
}

/// Starts the serving thread.
fn spawn() -> bool {
    match spawn_thread(serve_main) {
        Some(tid) => {
            SERVER_TID.store(tid, Ordering::Release);
            true
        }
        None => false,
    }
}

/// Starts an agent thread running `main`, with the agent threads' mask
/// but the scan's park signal; its tid.
fn spawn_thread(main: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void) -> Option<u32> {
    let park = 1u64 << (crate::services::scan::world::park_signal() - 1);
    let thread = crate::platform::agent_threads::spawn(main, park).0?;
    let tid = crate::events::threads::kernel_tid(thread).unwrap_or(0);
    crate::platform::agent_threads::note(tid);
    Some(tid)
}

/// Stops serving: the socket file goes (the process is finishing its
/// trace, or the thread could not start). Only the process that made it
/// removes it.
pub fn stop() {
    let fd = LISTEN_FD.swap(-1, Ordering::AcqRel);
    if let Some((path, pid)) = SOCKET.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
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
    let fd = LISTEN_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the parent's listening descriptor, which no thread of
        // this child serves; the parent's socket file stays the parent's.
        unsafe { libc::close(fd) };
    }
    if let Ok(mut socket) = SOCKET.try_lock() {
        *socket = None;
    }
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
    /// Blocks per site at this client's previous `sites`, and its time.
    previous: HashMap<(u32, AllocFn), u64>,
    previous_ns: u64,
}

extern "C" fn serve_main(_arg: *mut libc::c_void) -> *mut libc::c_void {
    crate::platform::agent_threads::note_current();
    crate::events::thread::mark_agent_thread();
    SERVER_TID.store(sys::gettid(), Ordering::Release);
    // SAFETY: naming our own thread; the name fits in 16 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"trapline-ctl".as_ptr()) };
    let mut clients: Vec<Client> = Vec::with_capacity(MAX_CLIENTS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CLIENTS + 1);
    let mut served = -1;
    loop {
        let listen_fd = LISTEN_FD.load(Ordering::Acquire);
        if listen_fd < 0 {
            break;
        }
        served = listen_fd;
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
                    previous: HashMap::new(),
                    previous_ns: 0,
                });
            }
        }
    }
    for c in clients {
        // SAFETY: the client's descriptor, ours.
        unsafe { libc::close(c.fd) };
    }
    // Stopped (`stop` took the descriptor and shut it down): it is still
    // ours to close, which matters to a process that goes on (a detach).
    // Not when the program closed it under us: the number may be reused.
    if served >= 0 && LISTEN_FD.load(Ordering::Acquire) < 0 {
        // SAFETY: our listening descriptor, which nothing else uses now.
        unsafe { libc::close(served) };
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
        let answer = answer(&line[..line.len() - 1], client);
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

/// What `detach` does (registered by runtime when the agent was
/// attached): the slots put back, or why not.
static ON_DETACH: crate::platform::callback::Callback<fn() -> Result<usize, String>> =
    crate::platform::callback::Callback::new();

/// Serves `detach` with `f` (an attached agent only).
pub fn on_detach(f: fn() -> Result<usize, String>) {
    ON_DETACH.set(f);
}

/// `detach`: runs the detach (which ends the trace and stops serving),
/// then answers.
fn detach_answer(out: &mut String) -> Result<(), String> {
    let Some(detach) = ON_DETACH.get() else {
        return Err("this process was not attached to (trapline run started it)".into());
    };
    let slots = detach()?;
    let _ = writeln!(out, "{{\"detached\":true,\"slots\":{slots}}}");
    Ok(())
}

/// The answer to one request line, one line of JSON.
fn answer(request: &[u8], client: &mut Client) -> String {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    let request = core::str::from_utf8(request).unwrap_or("").trim();
    let mut words = request.split_ascii_whitespace();
    let verb = words.next().unwrap_or("");
    let args: Vec<&str> = words.collect();
    let pid = crate::phase::owner();
    let time = crate::platform::clock::precise_now();
    let mut out = String::new();
    let result = match verb {
        control::SITES if args.is_empty() => {
            sites_answer(&mut out, client, pid, time);
            Ok(())
        }
        control::SCAN if args.is_empty() => scan_answer(&mut out, pid, time),
        control::COUNTERS if args.is_empty() => {
            counters_answer(&mut out, pid, time);
            Ok(())
        }
        control::BLOCKS => blocks_answer(&mut out, &args, time),
        control::ARM => arm_answer(&mut out, &args, time),
        control::DISARM => disarm_answer(&mut out, &args),
        control::WATCHES if args.is_empty() => {
            watches_answer(&mut out);
            Ok(())
        }
        control::VERDICT => verdict_answer(&mut out, &args, time),
        control::DETACH if args.is_empty() => detach_answer(&mut out),
        _ => Err(format!("unknown request {request:?}")),
    };
    if let Err(why) = result {
        out.clear();
        out.push_str("{\"error\":");
        json_string(&mut out, &why);
        out.push_str("}\n");
    }
    out
}

fn number(args: &[&str], i: usize, what: &str) -> Result<u64, String> {
    let word = args.get(i).ok_or_else(|| format!("{what} missing"))?;
    let parsed = match word.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => word.parse(),
    };
    parsed.map_err(|_| format!("{what}: `{word}` is not a number"))
}

fn function(args: &[&str], i: usize) -> Result<AllocFn, String> {
    let word = args.get(i).copied().unwrap_or("");
    AllocFn::ALL
        .iter()
        .copied()
        .find(|f| f.name() == word)
        .ok_or_else(|| format!("`{word}` is no allocation function"))
}

fn sites_answer(out: &mut String, client: &mut Client, pid: u32, time: u64) {
    let since = client.previous_ns;
    let _ = write!(
        out,
        "{{\"pid\":{pid},\"time_ns\":{time},\"since_ns\":{since},\"trace\":"
    );
    json_string(out, crate::config::trace_path().unwrap_or(""));
    out.push_str(",\"sites\":[");
    let sites = sites(time, since);
    for (i, s) in sites.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let before = client.previous.get(&s.site).copied().unwrap_or(0);
        let gone = (before + s.new_blocks).saturating_sub(s.blocks);
        let _ = write!(
            out,
            "{sep}{{\"stack\":{},\"fn\":\"{}\",\"bytes\":{},\"blocks\":{},\"ages\":{:?},\"new_blocks\":{},\"new_bytes\":{},\"gone_blocks\":{gone}",
            s.site.0,
            s.site.1.name(),
            s.bytes,
            s.blocks,
            s.ages,
            s.new_blocks,
            s.new_bytes
        );
        match s.sampled {
            Sampled::No => {}
            Sampled::CallerOnly => out.push_str(",\"caller_only\":true"),
            Sampled::FullStack(estimate, variance) => {
                let _ = write!(
                    out,
                    ",\"estimated_bytes\":{},\"estimate_variance\":{}",
                    estimate.round() as u64,
                    variance.round() as u64
                );
            }
        }
        out.push('}');
    }
    out.push_str("]}\n");
    client.previous = sites.iter().map(|s| (s.site, s.blocks)).collect();
    client.previous_ns = time;
}

fn scan_answer(out: &mut String, pid: u32, time: u64) -> Result<(), String> {
    let (scan, blocks, pause_ns, lost) = crate::services::scan::on_request()?;
    let _ = write!(
        out,
        "{{\"pid\":{pid},\"time_ns\":{time},\"scan\":{scan},\"blocks\":{blocks},\"pause_ns\":{pause_ns},\"lost\":["
    );
    for (i, ((stack, func), (bytes, n))) in lost.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}[{stack},\"{}\",{bytes},{n}]", func.name());
    }
    out.push_str("]}\n");
    Ok(())
}

fn counters_answer(out: &mut String, pid: u32, time: u64) {
    let events = crate::events::buffers::EVENTS_SUBMITTED.load(Ordering::Relaxed);
    let lost = crate::events::buffers::EVENTS_LOST.load(Ordering::Relaxed);
    let requests = REQUESTS.load(Ordering::Relaxed);
    let _ = write!(
        out,
        "{{\"pid\":{pid},\"time_ns\":{time},\"events\":{events},\"events_lost\":{lost},\"requests\":{requests},\"access_monitor\":"
    );
    json_string(out, &monitor_state());
    let _ = write!(
        out,
        ",\"faults\":{},\"fault_ns\":{},\"arms\":{},\"arm_ns\":{},\"armed_pages\":{},\"sweeps\":{},\"trace\":",
        access::FAULTS.load(Ordering::Relaxed),
        access::FAULT_NS.load(Ordering::Relaxed),
        access::ARMS.load(Ordering::Relaxed),
        access::ARM_NS.load(Ordering::Relaxed),
        access::armed(),
        crate::services::writer::SWEEPS.load(Ordering::Acquire)
    );
    json_string(out, crate::config::trace_path().unwrap_or(""));
    out.push_str("}\n");
}

/// Why access monitoring could not start (None: not asked yet).
static MONITOR_REFUSED: OnceLock<&'static str> = OnceLock::new();

fn monitor_state() -> String {
    if access::fd() >= 0 {
        "userfaultfd".to_string()
    } else if let Some(why) = MONITOR_REFUSED.get() {
        format!("unavailable: {why}")
    } else {
        "off".to_string()
    }
}

/// Every live block: (address, size, birth, site), by address.
fn all_blocks() -> Vec<(u64, u64, u64, (u32, AllocFn))> {
    let mut out = Vec::new();
    for shard in live::shards() {
        copy_shard(shard, &mut out, |addr, b, born| {
            Some((addr, b.size, born, (b.stack, b.func)))
        });
    }
    out.sort_unstable_by_key(|b| b.0);
    out
}

/// Appends what `keep` makes of each live block of `shard` (address,
/// block, birth) to `out`. The room is reserved first, with no lock held
/// (allocating under a shard lock could wait for the agent heap's lock,
/// which fork takes after the shards'): the shard's length bounds what
/// `keep` can keep, and blocks added meanwhile past it are left for the
/// next request.
fn copy_shard<T>(
    shard: &live::Shard,
    out: &mut Vec<T>,
    mut keep: impl FnMut(u64, live::Block, u64) -> Option<T>,
) {
    let n = shard.locked().len();
    out.reserve(n + n / 8 + 16);
    let room = out.capacity();
    shard.locked().for_each_born(|addr, b, born| {
        if out.len() < room {
            out.extend(keep(addr, b, born));
        }
    });
}

fn blocks_answer(out: &mut String, args: &[&str], time: u64) -> Result<(), String> {
    let stack = number(args, 0, "stack")? as u32;
    let func = function(args, 1)?;
    let n = number(args, 2, "count")?.min(access::MAX_PAGES as u64) as usize;
    let min_age = number(args, 3, "age")?.saturating_mul(1_000_000);
    let mut found: Vec<(u64, u64, u64)> = Vec::new();
    for shard in live::shards() {
        copy_shard(shard, &mut found, |addr, b, born| {
            (b.stack == stack && b.func == func && time.saturating_sub(born) >= min_age)
                .then_some((addr, b.size, born))
        });
    }
    // Spread over their ages: the oldest are often of a start-up phase
    // whose pages other sites share.
    found.sort_unstable_by_key(|b| (b.2, b.0));
    if found.len() > n {
        let len = found.len();
        found = (0..n).map(|k| found[k * len / n]).collect();
    }
    out.push_str("{\"blocks\":[");
    for (i, (addr, size, born)) in found.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}[{addr},{size},{}]",
            time.saturating_sub(*born) / 1_000_000
        );
    }
    out.push_str("]}\n");
    Ok(())
}

/// The pages of a block that are watched: all of a small one's, else
/// `PAGES_PER_BLOCK` spread from its first to its last.
fn pages_of(addr: u64, size: u64) -> Vec<u64> {
    let first = addr & !(access::PAGE - 1);
    let last = (addr + size.max(1) - 1) & !(access::PAGE - 1);
    let count = (last - first) / access::PAGE + 1;
    if count <= control::PAGES_PER_BLOCK {
        return (0..count).map(|k| first + k * access::PAGE).collect();
    }
    let mut pages: Vec<u64> = (0..control::PAGES_PER_BLOCK)
        .map(|k| first + (k * (count - 1) / (control::PAGES_PER_BLOCK - 1)) * access::PAGE)
        .collect();
    pages.dedup();
    pages
}

/// Starts access monitoring if it has not started: the userfaultfd and
/// the thread that serves its faults.
fn start_monitor() -> Result<(), String> {
    if access::fd() >= 0 {
        return Ok(());
    }
    if let Some(why) = MONITOR_REFUSED.get() {
        return Err(format!("access monitoring unavailable: {why}"));
    }
    match access::open() {
        Ok(_) => {
            if spawn_thread(fault_main).is_none() {
                return Err("cannot start the fault thread".to_string());
            }
            Ok(())
        }
        Err(why) => {
            let _ = MONITOR_REFUSED.set(why);
            Err(format!("access monitoring unavailable: {why}"))
        }
    }
}

fn arm_answer(out: &mut String, args: &[&str], time: u64) -> Result<(), String> {
    let hot_age = number(args, 0, "hot age")?.saturating_mul(1_000_000);
    let wanted: Vec<u64> = (1..args.len())
        .map(|i| number(args, i, "address"))
        .collect::<Result<_, _>>()?;
    start_monitor()?;
    let blocks = all_blocks();
    let maps = crate::platform::proc_maps::read();
    // The sites the request names: a page is watched only if every block
    // on it is of one of them (another site's block there, a cache entry
    // read all the time, would make the page's first access its access).
    let named: std::collections::HashSet<(u32, AllocFn)> = wanted
        .iter()
        .filter_map(|a| blocks.binary_search_by_key(a, |b| b.0).ok())
        .map(|i| blocks[i].3)
        .collect();
    let mut armed: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut refused: Vec<(u64, &str)> = Vec::new();
    for &addr in &wanted {
        let Ok(at) = blocks.binary_search_by_key(&addr, |b| b.0) else {
            refused.push((addr, "not a live block"));
            continue;
        };
        let size = blocks[at].1;
        let mut pages = Vec::new();
        let mut why = "no page could be watched";
        for page in pages_of(addr, size) {
            let end = page + access::PAGE;
            let anonymous = crate::platform::proc_maps::containing(&maps, page).is_some_and(|i| {
                let m = &maps[i];
                !m.file
                    && m.readable
                    && m.writable
                    && m.end >= end
                    && m.kind != crate::platform::proc_maps::Special::Stack
            });
            if !anonymous {
                why = "not in private anonymous memory";
                continue;
            }
            // The live blocks overlapping the page: none may be young, or
            // of a site the request does not name.
            let from = blocks.partition_point(|b| b.0 + b.1.max(1) <= page);
            let on_page = || blocks[from..].iter().take_while(|b| b.0 < end);
            if on_page().any(|b| time.saturating_sub(b.2) < hot_age) {
                why = "shares a page with a younger block";
                continue;
            }
            if on_page().any(|b| !named.contains(&b.3)) {
                why = "shares a page with another site's block";
                continue;
            }
            match access::arm(page, time) {
                Ok(()) => pages.push(page),
                Err(access::Refusal::AlreadyWatched) => {
                    why = "page already watched";
                }
                Err(access::Refusal::Full) => {
                    why = "as many pages watched as allowed";
                }
                Err(access::Refusal::Kernel(_)) => why = "the kernel refused the page",
                Err(access::Refusal::NotOpen) => why = "access monitoring not started",
                Err(access::Refusal::Paused) => why = "a scan is under way",
            }
        }
        if !pages.is_empty() {
            armed.push((addr, pages));
        } else {
            refused.push((addr, why));
        }
    }
    out.push_str("{\"armed\":[");
    for (i, (addr, pages)) in armed.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}[{addr},{pages:?}]");
    }
    out.push_str("],\"refused\":[");
    for (i, (addr, why)) in refused.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}[{addr},\"{why}\"]");
    }
    out.push_str("]}\n");
    Ok(())
}

fn disarm_answer(out: &mut String, args: &[&str]) -> Result<(), String> {
    let before = access::armed();
    if args == ["all"] {
        access::disarm(0, u64::MAX);
    } else {
        for i in 0..args.len() {
            let addr = number(args, i, "address")?;
            let size = live::shard_of(addr)
                .locked()
                .get(addr)
                .map_or(1, |b| b.size);
            access::disarm(
                addr & !(access::PAGE - 1),
                (addr + size.max(1) - 1) & !(access::PAGE - 1),
            );
        }
    }
    let _ = writeln!(
        out,
        "{{\"disarmed\":{}}}",
        before.saturating_sub(access::armed())
    );
    Ok(())
}

fn watches_answer(out: &mut String) {
    let watches = access::take_report();
    let _ = write!(out, "{{\"armed_pages\":{},\"watches\":[", access::armed());
    for (i, w) in watches.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}[{},\"{}\",{},{},{},{}]",
            w.page,
            w.outcome.name(),
            w.armed_at,
            w.ended_at,
            w.tid,
            w.touched_at
        );
    }
    out.push_str("]}\n");
}

fn verdict_answer(out: &mut String, args: &[&str], time: u64) -> Result<(), String> {
    let stack = number(args, 0, "stack")? as u32;
    let func = function(args, 1)?;
    let mut n = [0u64; 6];
    let names = [
        "kinds",
        "growth",
        "watched",
        "untouched",
        "untouched ms",
        "last access",
    ];
    for (k, v) in n.iter_mut().enumerate() {
        *v = number(args, k + 2, names[k])?;
    }
    let ev = trapline_trace::Event::SiteVerdict {
        time,
        stack,
        func,
        kinds: n[0],
        growth_bytes_per_second: n[1],
        watched_blocks: n[2],
        untouched_blocks: n[3],
        untouched_ns: n[4].saturating_mul(1_000_000),
        last_access_ns: n[5],
    };
    queue_event(&ev, Some(time), stack);
    out.push_str("{\"written\":true}\n");
    Ok(())
}

/// The fault thread: serves the faults of watched pages until the
/// userfaultfd goes (a fork child has neither).
extern "C" fn fault_main(_arg: *mut libc::c_void) -> *mut libc::c_void {
    crate::platform::agent_threads::note_current();
    crate::events::thread::mark_agent_thread();
    // SAFETY: naming our own thread; the name fits in 16 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"trapline-fault".as_ptr()) };
    let fd = access::fd();
    let uffd = core::mem::ManuallyDrop::new(crate::platform::uffd::Uffd(fd));
    while access::fd() == fd {
        if let Some(m) = uffd.next_message(1000) {
            access::serve(&m, crate::platform::agent_threads::contains);
        }
    }
    core::ptr::null_mut()
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

/// What a site's blocks are under sampled recording.
#[derive(Clone, Copy)]
enum Sampled {
    /// Not sampling: every block has its full stack.
    No,
    /// The stack holds only the caller of blocks that took no full stack.
    CallerOnly,
    /// A full stack: the bytes its sampled blocks stand for (each block of
    /// `size` bytes weighs `w = size / p`, `p` its chance to be sampled),
    /// and the estimate's sampling variance (unbiased: the sum of
    /// `w * (w - size)`), with which a watcher tells growth from noise.
    FullStack(f64, f64),
}

/// One allocation site's live blocks.
struct SiteNow {
    site: (u32, AllocFn),
    sampled: Sampled,
    bytes: u64,
    blocks: u64,
    ages: [u64; control::AGE_BUCKETS_S.len() + 1],
    /// Blocks (and bytes) born after `since`.
    new_blocks: u64,
    new_bytes: u64,
}

/// Live bytes and blocks per allocation site (stack, function), largest
/// first, with their ages at `now` and what was born after `since`.
fn sites(now: u64, since: u64) -> Vec<SiteNow> {
    let mut totals: HashMap<(u32, AllocFn), SiteNow> = HashMap::new();
    let mut blocks: Vec<(live::Block, u64)> = Vec::new();
    let mean = crate::config::sample_bytes();
    for shard in live::shards() {
        blocks.clear();
        copy_shard(shard, &mut blocks, |_, b, born| Some((b, born)));
        for (b, born) in &blocks {
            let t = totals.entry((b.stack, b.func)).or_insert_with(|| SiteNow {
                site: (b.stack, b.func),
                sampled: match crate::capture::stacks::record(b.stack) {
                    _ if mean == 0 => Sampled::No,
                    Some(r) if r.caller_only => Sampled::CallerOnly,
                    _ => Sampled::FullStack(0.0, 0.0),
                },
                bytes: 0,
                blocks: 0,
                ages: Default::default(),
                new_blocks: 0,
                new_bytes: 0,
            });
            t.bytes += b.size;
            t.blocks += 1;
            if let Sampled::FullStack(estimate, variance) = &mut t.sampled {
                let size = b.size.max(1) as f64;
                let weight = size / trapline_trace::event::sample_probability(b.size, mean);
                *estimate += weight;
                *variance += weight * (weight - size);
            }
            let age_s = now.saturating_sub(*born) / 1_000_000_000;
            let bucket = control::AGE_BUCKETS_S.partition_point(|&limit| age_s >= limit);
            t.ages[bucket] += 1;
            if since != 0 && *born > since {
                t.new_blocks += 1;
                t.new_bytes += b.size;
            }
        }
    }
    let mut out: Vec<SiteNow> = totals.into_values().collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.0.cmp(&b.site.0)));
    out
}

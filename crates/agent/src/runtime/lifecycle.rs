//! Start, end and re-birth of a trace: the constructor, the final snapshot at
//! every exit path, fork children and exec.

use crate::config::{self, OPTIONS};
use crate::events::buffers::Buffer;
use crate::events::record::ensure_stack_in;
use crate::events::thread;
use crate::phase::{self, owns_process};
use crate::platform::lock::RawLock;
use crate::platform::sys;
use crate::services::writer;
use crate::{
    capture::modules, capture::stacks, platform::clock, tracking::live, tracking::untracked,
};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::ffi::CString;
use trapline_trace::{EndCounters, Event, ExitKind, ProcessInfo, SnapshotKind};

use trapline_contract::env;
static INIT_LOCK: RawLock = RawLock::new();
/// Notified when `TRACE_DONE` is set or a finish is called off (a failed
/// exec): the threads in `wait_for_trace_done` sleep on it.
static FINISH_CHANGED: crate::platform::futex::Event = crate::platform::futex::Event::new();
/// The first thread to call `exit` (0: none): the others wait (`enter_exit`).
static EXITING_TID: AtomicU32 = AtomicU32::new(0);
/// Most a thread's `_exit` waits for another thread's finish to complete.
const OTHER_FINISH_WAIT_NS: u64 = 60_000_000_000;

/// A terminating signal that arrived while the trace was being finished for
/// an exec: raised again should the exec fail.
static SIGNAL_DURING_EXEC: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(0);
static START_UNIX_NS: AtomicU64 = AtomicU64::new(0);

/// The agent library's own path (for re-adding LD_PRELOAD on exec).
static AGENT_PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// The module of the executable's own allocator, for every trace header of
/// this image (`header_buffer`).
static SHADOWING_ALLOCATOR: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Path of the agent library itself (for re-adding LD_PRELOAD on exec).
fn own_path() -> String {
    sys::loader_path(sys::own_module().dli_fname)
}

/// Most bytes of the command line the process record keeps: the record
/// must fit in one buffer (128 KiB) with the module map's first entries.
/// A command line of 150 KB (3 arguments of 50 KB) left the trace without
/// its process record, and nothing said so.
const CMDLINE_KEPT_BYTES: usize = 64 << 10;

/// The command line, read once per image: before the program runs, its
/// arguments are as it was started with; a fork child keeps them, although
/// the program may have rewritten them since (nginx's workers retitle
/// themselves "nginx: worker process", padded with NULs).
fn command_line() -> Vec<String> {
    static ARGV: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ARGV.get_or_init(|| {
        let Ok(bytes) = std::fs::read("/proc/self/cmdline") else {
            return Vec::new();
        };
        let args = split_cmdline(&bytes, config::flag(&OPTIONS.attached));
        kept_arguments(&args, CMDLINE_KEPT_BYTES)
    })
    .clone()
}

/// The arguments in /proc/PID/cmdline, each ended by a NUL: an empty one
/// (`--save ''`) is a NUL alone. Attached, the program may have retitled
/// itself: trailing empty ones are then taken for the padding of its title.
fn split_cmdline(bytes: &[u8], maybe_retitled: bool) -> Vec<&[u8]> {
    let Some(body) = bytes.strip_suffix(&[0]) else {
        // Retitled without a NUL at the end: one argument.
        return if bytes.is_empty() {
            Vec::new()
        } else {
            vec![bytes]
        };
    };
    let mut args: Vec<&[u8]> = body.split(|&b| b == 0).collect();
    if maybe_retitled {
        while args.len() > 1 && args.last().is_some_and(|a| a.is_empty()) {
            args.pop();
        }
    }
    args
}

/// The arguments, as many as fit in `cap` bytes (the last one cut), then
/// one more that says what was left out.
fn kept_arguments(args: &[&[u8]], cap: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = 0usize;
    for (i, arg) in args.iter().enumerate() {
        if used + arg.len() <= cap {
            used += arg.len();
            out.push(String::from_utf8_lossy(arg).into_owned());
            continue;
        }
        let room = cap - used;
        if room > 0 {
            out.push(String::from_utf8_lossy(&arg[..room]).into_owned());
        }
        let left: usize = args[i..].iter().map(|a| a.len()).sum::<usize>() - room;
        out.push(format!(
            "[trapline: {left} more bytes of the command line, in {} argument(s), not recorded]",
            args.len() - i
        ));
        break;
    }
    out
}

/// Everything a trace starts with: the process and its modules.
fn header_buffer() -> Box<Buffer> {
    let mut b = crate::events::buffers::take_buffer(0);
    let exe = modules::exe_path();
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() } as u32;
    let ev = Event::Process(ProcessInfo {
        pid: phase::owner(),
        ppid,
        start_unix_ns: START_UNIX_NS.load(Ordering::Relaxed),
        exe: exe.clone(),
        argv: command_line(),
    });
    if !b.push_event(&ev, None) {
        crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
    }
    let no_release_stacks = !config::flag(&OPTIONS.release_stacks);
    // The same for every trace of this image, a fork child's included;
    // dladdr's search through a module's symbols costs tens of microseconds,
    // so it is done once (`next_alloc` keeps the library it found).
    // Attached, the program's calls reach the agent through the import
    // slots it patched, whatever the global lookup finds first.
    let allocator_shadowed_by =
        if config::flag(&OPTIONS.attached) || crate::runtime::inline_alloc::detoured() {
            None
        } else {
            SHADOWING_ALLOCATOR
                .get_or_init(|| shadowing_allocator(&exe))
                .clone()
        };
    let allocator_library = crate::events::next_alloc::library();
    let memory_recorded = config::memory_recorded();
    let locks_recorded = config::locks_recorded();
    let sample_bytes = config::sample_bytes();
    let production = config::production();
    if no_release_stacks
        || allocator_shadowed_by.is_some()
        || allocator_library.is_some()
        || !memory_recorded
        || !locks_recorded
        || sample_bytes != 0
    {
        let recording = Event::Recording {
            no_release_stacks,
            allocator_shadowed_by,
            allocator_library,
            memory_recorded,
            locks_recorded,
            sample_bytes,
            production,
        };
        if !b.push_event(&recording, None) {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
    if config::flag(&OPTIONS.attached) {
        let time = clock::precise_now();
        if !b.push_event(&Event::Attach { time }, Some(time)) {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
    for m in modules::all() {
        b = push_or_flush(b, &Event::ModuleLoad(m), None);
    }
    b
}

/// The module whose `malloc` (or `free`) the program's calls reach when it
/// is not the agent's: the executable's own allocator (jemalloc or mimalloc
/// linked into a Rust program) comes first in symbol lookup, before any
/// preloaded library, so the agent's hooks never see its allocations.
fn shadowing_allocator(exe: &str) -> Option<String> {
    for name in [c"malloc", c"free"] {
        let f = sys::any_symbol(name) as *mut libc::c_void;
        if f.is_null() || modules::is_agent_pc(f as u64) {
            continue;
        }
        // A non-PIE executable that takes the address of malloc (node,
        // gcc's cc1plus) exports it as an undefined symbol whose value is a
        // stub in its PLT, which jumps to the agent: dlsym returns the stub.
        // Only a symbol defined in a section is an allocator of its own.
        let Some((info, _)) =
            sys::loader_symbol(f as u64).filter(|(_, sym)| sym.st_shndx != sys::SHN_UNDEF)
        else {
            continue;
        };
        let path = sys::loader_path(info.dli_fname);
        // The main program's name is empty, or what it was started as.
        let same_file = match (std::fs::canonicalize(&path), std::fs::canonicalize(exe)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        return Some(if path.is_empty() || same_file {
            exe.to_string()
        } else {
            path
        });
    }
    None
}

fn push_or_flush(mut b: Box<Buffer>, ev: &Event, time: Option<u64>) -> Box<Buffer> {
    if b.room() < crate::events::buffers::EVENT_RESERVE {
        crate::events::buffers::submit(b, false);
        b = crate::events::buffers::take_buffer(0);
    }
    if !b.push_event(ev, time) {
        crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
    }
    b
}

/// Opens the trace file for this process image: `output` for the top process,
/// `output.<pid>` (then `.1`, `.2`, ... if taken) for every other one.
fn open_trace(top: bool) -> bool {
    match open_trace_file(top) {
        Ok(()) => true,
        Err(why) => {
            sys::warn(&why);
            false
        }
    }
}

/// Opens this image's trace file: the path given for the top process, else
/// the first free name of the tree's naming.
fn open_trace_file(top: bool) -> Result<(), String> {
    let Some(output) = config::output() else {
        return Err("no trace path".into());
    };
    let pid = phase::owner();
    let cannot = |name: &str, e: i32| {
        format!(
            "cannot write trace {}: {}",
            name,
            std::io::Error::from_raw_os_error(e)
        )
    };
    if top {
        let path = CString::new(output).unwrap_or_default();
        writer::open(&path, false).map_err(|e| cannot(output, e))?;
        config::set_trace_path(output.to_owned());
        return Ok(());
    }
    for n in 0..1000 {
        let name = trapline_contract::trace_names::image_trace(output, pid, n);
        let path = CString::new(name.clone()).unwrap_or_default();
        match writer::open(&path, true) {
            Ok(()) => {
                config::set_trace_path(name);
                return Ok(());
            }
            Err(libc::EEXIST) => continue,
            Err(e) => return Err(cannot(&name, e)),
        }
    }
    Err(format!("cannot write trace {output}: no free name"))
}

fn periodic() {
    thread::steal_all(1000);
    crate::services::scan::periodic_tick();
    crate::platform::heap::forget_mapping_limit_when_below();
}

/// The fatal-signal handler (fatal_signals.rs installs it).
extern "C" fn on_fatal_signal(
    sig: core::ffi::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // SAFETY: errno is thread-local; saved and restored around our work.
    let saved_errno = unsafe { *libc::__errno_location() };
    if sent_from_outside(sig, info) && signal_during_finish(sig) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved_errno };
        return;
    }
    let ending = if record_crash(sig, info, ctx) {
        Ending::Crash
    } else {
        Ending::Signal
    };
    if !wait_out_fault_during_finish() {
        finish(ExitKind::Signal(sig), ending);
    }
    // SAFETY: restoring the default action and re-raising; the signal is blocked
    // in this handler, so it is delivered (and kills) when the handler returns.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        crate::platform::signals::real_sigaction()(sig, &dfl, core::ptr::null_mut());
        crate::platform::signals::set_agent_owns(sig, false);
        libc::raise(sig);
        *libc::__errno_location() = saved_errno;
    }
}

/// A crash of program code: a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL with
/// a fault's `si_code`) or `abort`, struck outside the agent. Records the
/// `Crash` with the stack where it struck and notes the thread's live
/// frames and registers for the exit scan; false when the thread was
/// inside the agent (its buffer, caches or a lock may be mid-use: the
/// trace ends as from any fatal signal, without a crash record or scan).
fn record_crash(
    sig: core::ffi::c_int,
    info: *const libc::siginfo_t,
    ctx: *mut libc::c_void,
) -> bool {
    if info.is_null() || ctx.is_null() || !phase::initialized() || phase::recording_stopped() {
        return false;
    }
    // SAFETY: the kernel's siginfo for this signal (SA_SIGINFO).
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    let fault = sys::FAULT_SIGNALS.contains(&sig) && code > 0 && code != libc::SI_KERNEL;
    if !(fault || sig == libc::SIGABRT) || !owns_process() {
        return false;
    }
    let Some(ts) = thread::current_if_any() else {
        return false;
    };
    if ts.agent_thread || ts.guard > 0 {
        return false;
    }
    ts.guard += 1;
    // SAFETY: the kernel's context for this signal.
    let regs = unsafe { crate::platform::arch::interrupted_regs(ctx) };
    let stack = crate::events::record::capture_stack(ts, regs, thread::Site::Free);
    let time = ts.next_time();
    let crash = Event::Crash {
        time,
        signal: sig as u32,
        code,
        addr: if fault { addr } else { 0 },
        stack,
    };
    ts.emit(Some(time), |e, c| e.event(c, &crash));
    ts.guard -= 1;
    // SAFETY: as above.
    if let Some((sp, registers)) = unsafe { crate::platform::arch::interrupted_state(ctx) } {
        crate::services::scan::note_crash(sp, registers);
    }
    true
}

/// The signal came from another process or the terminal, not from a fault
/// of this thread's code nor from this process itself (`abort`, `raise`).
fn sent_from_outside(sig: core::ffi::c_int, info: *const libc::siginfo_t) -> bool {
    if info.is_null() {
        return false;
    }
    // SAFETY: the kernel's siginfo for this signal (SA_SIGINFO).
    let (code, pid) = unsafe { ((*info).si_code, (*info).si_pid()) };
    let fault =
        crate::platform::sys::FAULT_SIGNALS.contains(&sig) && code > 0 && code != libc::SI_KERNEL;
    !fault && pid as u32 != crate::platform::sys::getpid_raw()
}

/// A program thread's end (thread.rs calls it from the thread's key
/// destructor): its sampling stops, its `ThreadEnd` is recorded, and the
/// process ends if it was the last (process_end.rs).
fn program_thread_ending(ts: &mut thread::ThreadState) {
    crate::services::profile::thread_end(ts);
    crate::events::threads::on_thread_end(ts);
    crate::services::process_end::program_thread_ending(ts.tid, ts.counted_running);
}

/// The library constructor: configuration, trace file, writer thread;
/// `resolve_hooks` looks up the real functions the hooks forward to (the
/// crate root passes it: the hooks are above everything else); `own_hooks`
/// lists the hooks by name, for an allocator in the executable to detour.
pub fn init(resolve_hooks: fn(), own_hooks: fn() -> Vec<(&'static core::ffi::CStr, usize)>) {
    let _g = INIT_LOCK.guard();
    if phase::begin_init() {
        return;
    }
    crate::platform::heap::set_aside_reserve();
    // First, before anything here can call malloc: an allocator in the
    // executable that initialises itself meanwhile maps its memory through
    // the hooks, which then know those mappings for the allocator's.
    let (_, refused) = crate::runtime::inline_alloc::detour_executable_allocator(own_hooks);
    let ts = begin_process_state();
    config::read_from_environment(phase::owner());
    if config::production() {
        crate::events::production::adopt_earlier_blocks();
    }
    let top = config::flag(&OPTIONS.top);
    let follow = config::flag(&OPTIONS.follow);
    remove_from_environment(env::ROLE.as_bytes());
    if let Some(parent) = std::env::var(env::DIE_WITH)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        sys::die_with_parent(parent);
    }
    remove_from_environment(env::DIE_WITH.as_bytes());
    if config::flag(&OPTIONS.ignore_sigpipe) {
        // Before the fatal-signal handlers go in (they are installed only
        // where the disposition is SIG_DFL), and before the program runs.
        crate::runtime::fatal_signals::ignore_inherited(libc::SIGPIPE);
    }
    remove_from_environment(env::IGNORE_SIGPIPE.as_bytes());
    if !follow {
        remove_self_from_preload();
    }
    let _ = AGENT_PATH.set(own_path());
    resolve_real_functions(resolve_hooks);
    for (name, why) in refused {
        sys::warn(&format!(
            "the executable's own {} is not trapped: {why}",
            name.to_string_lossy()
        ));
    }
    crate::events::sync::register_fork_handlers();
    crate::services::profile::init();
    crate::platform::signals::set_fatal_handler(on_fatal_signal);
    crate::runtime::fatal_signals::install();
    follow_modules_and_threads();
    // Lookups that failed (functions an older glibc lacks) must leave no
    // message for the program's first dlerror().
    // SAFETY: dlerror only reads and frees this thread's error state.
    unsafe { libc::dlerror() };
    if open_trace(top) {
        start_trace();
    } else {
        phase::set_recording_stopped(true);
    }
    ts.guard -= 1;
}

/// What the constructor and an attach both do first: the process's agent
/// state, its clock and its owner; the calling thread's state, its guard
/// raised (the caller lowers it).
fn begin_process_state() -> &'static mut thread::ThreadState {
    // Single-threaded there: a fork system call copies only the calling thread.
    phase::on_abandon(writer::reset_in_child);
    crate::prepare_unwinder();
    sys::note_stderr();
    phase::set_fork_token();
    let ts = thread::current();
    ts.guard += 1;
    sys::membarrier_register();
    clock::reset();
    START_UNIX_NS.store(clock::unix_ns(), Ordering::Relaxed);
    phase::set_owner(sys::getpid_raw());
    ts
}

/// The real functions the agent and its hooks call.
fn resolve_real_functions(resolve_hooks: fn()) {
    crate::events::next_alloc::resolve();
    crate::platform::signals::resolve();
    resolve_hooks();
}

/// Module changes forget the unwind rules; a program thread's end is
/// recorded; the modules loaded now are listed.
fn follow_modules_and_threads() {
    modules::on_change(crate::capture::rules::forget_all);
    thread::on_program_thread_ending(program_thread_ending);
    modules::refresh();
}

/// With the trace file open: its header, the fork and exit handlers, the
/// writer thread and the control socket.
fn start_trace() {
    crate::events::buffers::submit_first(header_buffer());
    // SAFETY: registering plain functions.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        on_exit(at_exit, core::ptr::null_mut());
    }
    start_writer();
    crate::services::control::start();
}

/// Starts the writer thread, or in production mode makes it start with the
/// program's second thread or when buffers pile up (`writer::defer_start`).
fn start_writer() {
    if config::production() {
        writer::defer_start(periodic);
        crate::events::buffers::on_writer_needed(writer::start_deferred);
    } else {
        writer::start(periodic);
    }
}

/// Whether the dynamic loader preloaded this library (`LD_PRELOAD` names
/// it): the constructor starts recording only then. Loaded otherwise, by
/// `trapline attach` or by a program's own dlopen, it stays idle until
/// `init_attached`.
pub fn loaded_by_preload() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|v| env::names_agent(v.to_string_lossy().as_bytes()))
}

/// Starts recording in a process already running (`trapline attach` loaded
/// the library and calls its entry point): the options come as `NAME=value`
/// lines. Unlike the constructor, nothing of the program's is changed: no
/// environment edits, no signal handler (no CPU sampling, no reachability
/// scan); the caller then points the program's import slots at the hooks.
pub fn init_attached(options: &str, resolve_hooks: fn()) -> Result<(), String> {
    let _g = INIT_LOCK.guard();
    if phase::begin_init() {
        return Err(if loaded_by_preload() {
            "it holds trapline's agent already, started by `trapline run` without \
             --control (its trace records it all; with --control, attach cuts a window of it)"
                .into()
        } else {
            "this process was attached to and detached already: a process is attached to \
             once (the agent stays in it, idle)"
                .into()
        });
    }
    crate::platform::heap::set_aside_reserve();
    let ts = begin_process_state();
    config::read_from_lines(options, phase::owner());
    let o = &OPTIONS;
    for (flag, on) in [
        (&o.attached, true),
        (&o.blocks_predate, true),
        (&o.top, true),
        (&o.follow, false),
        (&o.control, true),
        // A scan stops threads with a signal of the agent's, whose handler
        // attaching does not install; freeres is for a process's end.
        (&o.scan_at_exit, false),
        (&o.freeres, false),
    ] {
        flag.store(on, Ordering::Relaxed);
    }
    o.scan_every_ms.store(0, Ordering::Relaxed);
    o.profile_hz.store(0, Ordering::Relaxed);
    let _ = AGENT_PATH.set(own_path());
    sys::look_up_globally();
    resolve_real_functions(resolve_hooks);
    // SAFETY: dlerror only reads and frees this thread's error state.
    unsafe { libc::dlerror() };
    // What can fail comes before anything of the process's changes (fork
    // handlers, hooks): a failed attach leaves the agent idle, and a later
    // one starts again from the top.
    let ready = crate::services::control::bind()
        .map_err(|why| format!("cannot serve the control socket that detach needs: {why}"))
        .and_then(|()| open_trace_file(true));
    if let Err(why) = ready {
        crate::services::control::unbind();
        phase::set_recording_stopped(true);
        ts.guard -= 1;
        phase::undo_init();
        return Err(why);
    }
    phase::set_recording_stopped(false);
    crate::events::sync::register_fork_handlers();
    follow_modules_and_threads();
    start_trace();
    ts.guard -= 1;
    Ok(())
}

/// Ends an attached trace (`trapline detach`, once the import slots are
/// back): the live blocks, the totals and the end record are written and
/// the file closed; from then on every hook passes its call straight on.
pub fn finish_detached() {
    finish(ExitKind::Detach, Ending::Immediate);
}

extern "C" {
    fn on_exit(f: extern "C" fn(i32, *mut libc::c_void), arg: *mut libc::c_void) -> i32;
}

fn remove_self_from_preload() {
    let Some(v) = std::env::var_os("LD_PRELOAD").map(|v| v.to_string_lossy().into_owned()) else {
        return;
    };
    let rest: Vec<&str> = v
        .split([' ', ':'])
        .filter(|s| !s.is_empty() && !env::names_agent(s.as_bytes()))
        .collect();
    if rest.is_empty() {
        remove_from_environment(b"LD_PRELOAD");
    } else if let Ok(c) = CString::new(format!("LD_PRELOAD={}", rest.join(":"))) {
        // SAFETY: before main; the entry points at the new string, leaked
        // (an environment string lives as long as the process).
        unsafe { edit_environment(b"LD_PRELOAD", Some(c.into_raw())) };
    }
}

extern "C" {
    static mut environ: *mut *mut core::ffi::c_char;
}

/// Removes `NAME=...` from the process environment.
fn remove_from_environment(name: &[u8]) {
    // SAFETY: before main, with no other thread reading the environment.
    unsafe { edit_environment(name, None) }
}

/// Replaces the `NAME=...` entries of the process environment with
/// `replacement`, or removes them, in the array itself. Not with unsetenv
/// or setenv: the first definition of those may be the program's own, and
/// bash's, before its main, changed nothing. Then bash, which builds its
/// children's environments from main's `envp`, passed `TRAPLINE_ROLE=top`
/// to every command it ran, and each of them wrote over the top process's
/// trace.
///
/// # Safety
/// No other thread reads or changes the environment meanwhile.
unsafe fn edit_environment(name: &[u8], replacement: Option<*mut core::ffi::c_char>) {
    // SAFETY: `environ` is null or a NULL-terminated array of C strings,
    // which we own alone here (the caller's contract); removing shifts the
    // later entries down, NULL included.
    unsafe {
        let env = environ;
        if env.is_null() {
            return;
        }
        let mut read = 0;
        let mut write = 0;
        loop {
            let e = *env.add(read);
            if e.is_null() {
                *env.add(write) = e;
                return;
            }
            let bytes = core::ffi::CStr::from_ptr(e).to_bytes();
            let matches =
                bytes.len() > name.len() && bytes.starts_with(name) && bytes[name.len()] == b'=';
            match (matches, replacement) {
                (false, _) => {
                    *env.add(write) = e;
                    write += 1;
                }
                (true, Some(r)) => {
                    *env.add(write) = r;
                    write += 1;
                }
                (true, None) => {}
            }
            read += 1;
        }
    }
}

extern "C" fn at_exit(status: i32, _arg: *mut libc::c_void) {
    if !owns_process() && !phase::in_unreset_child() {
        // A vfork child that called exit() (POSIX leaves that undefined;
        // code that handles a failed exec does it). It shares the parent's
        // memory: glibc has just taken this handler off the parent's list,
        // and closes the list for good once the child's exit has run it.
        phase::set_exit_handlers_gone();
        return;
    }
    finish(ExitKind::Code(status), Ending::Exit);
}

/// From the `exit` hook: finishes the trace now if no exit handler will.
pub fn finish_if_handlers_gone(status: i32) {
    if phase::exit_handlers_gone() && owns_process() {
        finish(ExitKind::Code(status), Ending::Exit);
    }
}

extern "C" {
    fn __libc_freeres();
}

/// How the process is ending, which decides what finishing may do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// exit() or return from main: after every atexit handler; runs freeres.
    Exit,
    /// exec, or _exit: no freeres (stdio must not be flushed), may allocate.
    Immediate,
    /// A fatal signal: it may have struck while this thread held glibc's heap
    /// lock or an agent lock, so nothing may allocate or wait without bound.
    Signal,
    /// A crash outside the agent (`record_crash`): this thread holds no
    /// agent lock, so the exit scan judges the heap as the crash left it
    /// (the others are stopped for it). glibc's heap lock may be held (the
    /// agent's code never takes it), and the loader's: no freeres, no
    /// rescan of the modules.
    Crash,
}

impl Ending {
    /// Ending by a fatal signal, crash or not.
    fn by_signal(self) -> bool {
        matches!(self, Ending::Signal | Ending::Crash)
    }
}

/// Where the final records go: the writer's queue, or (signal) straight to
/// the file with the emergency buffer and scratch.
struct FinalOutput {
    buf: Option<Box<Buffer>>,
    ending: Ending,
    written_directly: u64,
}

impl FinalOutput {
    fn new(ending: Ending) -> Self {
        let buf = if ending == Ending::Signal {
            writer::take_buffer_no_alloc(0)
        } else {
            Some(crate::events::buffers::take_buffer(0))
        };
        FinalOutput {
            buf,
            ending,
            written_directly: 0,
        }
    }

    /// Makes room for one more event, writing out a full buffer.
    fn room(&mut self) -> Option<&mut Buffer> {
        let b = self.buf.as_mut()?;
        if b.room() < crate::events::buffers::EVENT_RESERVE {
            if self.ending == Ending::Signal {
                writer::write_direct(b);
                self.written_directly += u64::from(b.events);
                b.reset(0, crate::events::buffers::GEN.load(Ordering::Relaxed));
            } else {
                let full = core::mem::replace(b, crate::events::buffers::take_buffer(0));
                crate::events::buffers::submit(full, false);
            }
        }
        self.buf.as_deref_mut()
    }

    fn push(&mut self, ev: &Event, time: Option<u64>) {
        let pushed = self.room().is_some_and(|b| b.push_event(ev, time));
        if !pushed {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn events_pending(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| u64::from(b.events))
    }

    fn close(mut self) {
        let Some(b) = self.buf.take() else { return };
        if self.ending == Ending::Signal {
            writer::write_direct(&b);
            core::mem::forget(b); // freeing could need glibc's heap lock
        } else {
            crate::events::buffers::submit(b, false);
        }
    }
}

impl crate::services::scan::Sink for FinalOutput {
    fn buffer(&mut self) -> Option<&mut Buffer> {
        self.room()
    }

    fn push(&mut self, ev: &Event, time: Option<u64>) {
        FinalOutput::push(self, ev, time);
    }
}

/// Ends the trace: libc's freeres (normal exits), the live-block snapshot,
/// every thread's buffer, the end record; then waits for the writer.
pub fn finish(exit: ExitKind, ending: Ending) {
    if !phase::initialized() {
        return;
    }
    if phase::recording_stopped() {
        // Finished, or another thread is past its snapshot and still
        // writing the end of the trace.
        if !ending.by_signal() && owns_process() {
            wait_for_other_finish();
        }
        return;
    }
    if !owns_process() {
        if phase::in_unreset_child() {
            phase::abandon_unreset_child();
        }
        // Otherwise a vfork child (or a clone sharing our memory) that dies
        // of a signal: the trace and every bit of the agent's state are its
        // parent's, which goes on after it.
        return;
    }
    if !phase::begin_finish(sys::gettid(), exit == ExitKind::Exec) {
        if ending.by_signal() && faulted_in_own_finish() {
            // The finish itself faulted or aborted before the trace was
            // written: the C library's freeres on a heap the program
            // corrupted ("unaligned tcache chunk detected"). Write the trace
            // as from any fatal signal (no scan: the finish was cut off
            // anywhere), or it stayed without its events.
            finish_here(exit, Ending::Signal, thread::current_if_any());
        } else if !ending.by_signal() {
            wait_for_other_finish();
        }
        return;
    }
    // A program's signal handler that calls exit or _exit may have
    // interrupted this very thread inside a hook, holding a shard lock: the
    // snapshot and the exit scan then waited for it for ever (100% of a
    // core, for good). Finish as from a fatal signal instead: bounded lock
    // attempts (a shard that cannot be had is counted as lost), no scan,
    // no freeres. The exit is still the program's.
    let interrupted_agent =
        thread::current_if_any().is_some_and(|t| t.guard > 0 && !t.agent_thread);
    let ending = if interrupted_agent {
        Ending::Signal
    } else {
        ending
    };
    // The reachability scan and the last flush need about 60 KiB of stack,
    // more than a small thread stack has: they run on the side stack.
    let signal = ending == Ending::Signal;
    let ts = if signal {
        thread::current_if_any()
    } else {
        Some(thread::current())
    };
    match ts.as_ref().map(|t| t.rules.side_ptr()) {
        // SAFETY: a thread's side stack lives as long as its state, which
        // is freed only when the thread exits, after this call.
        Some(side) => unsafe { &*side }.run(|| finish_here(exit, ending, ts)),
        None => finish_here(exit, ending, ts),
    }
}

/// Whether this thread is the one finishing the trace, its records not yet
/// written, and this is the first fatal signal of its finish (a second one,
/// in the finish from the first, lets the signal take its course).
fn faulted_in_own_finish() -> bool {
    static ONCE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
    phase::finishing_tid() == sys::gettid()
        && !phase::recording_stopped()
        && !ONCE.swap(true, Ordering::AcqRel)
}

/// `__gnu_cxx::__freeres` wherever it is defined at exit: a program that
/// links libstdc++ statically exports it itself (gcc's cc1 kept libstdc++'s
/// 72,704-byte emergency pool "still reachable"), and a library loaded
/// later may define it. Found in the modules' own symbol tables, not with
/// dlsym: a failed dlsym allocates its message through the program's
/// malloc, which may be the program's own (memcheck's static_malloc then
/// crashed in glibc's realloc of it) or run on a heap the program
/// corrupted (fprw aborted in the finish, its trace left empty).
fn cxx_freeres_defined_now() -> usize {
    crate::platform::imports::defined_anywhere(c"_ZN9__gnu_cxx9__freeresEv")
}

/// `finish` on the side stack; `ts` is the calling thread's state (none in
/// a fatal signal's handler on a thread that never had one).
fn finish_here(exit: ExitKind, ending: Ending, mut ts: Option<&'static mut thread::ThreadState>) {
    let signal = ending == Ending::Signal;
    if exit != ExitKind::Exec {
        crate::platform::heap::KEEP_MAPPINGS.store(true, Ordering::Relaxed);
    }
    crate::services::profile::stop(signal);
    // No watcher asks anything of a process that is finishing its trace.
    crate::services::control::stop();
    // Every watched page back, before freeres and the scan read them (not
    // from a fatal signal: the crashed thread may hold the monitor's lock,
    // and nothing reads the heap then).
    if !signal {
        crate::tracking::access::give_all_back();
    }
    #[cfg(feature = "capture-timing")]
    crate::capture::unwind::timing::report();
    // Like memcheck: let the C and C++ runtimes free their own buffers so
    // they are not blamed on the program. Their frees are recorded. Only
    // in a process left with this one thread: freeres assumes it, and
    // frees what running threads use (glibc's cache of thread stacks,
    // which a detached thread ending meanwhile pushes onto: the exit
    // crashed in 2-5% of runs of a program whose main returned while such
    // threads started and ended). With others, their buffers stay.
    if ending == Ending::Exit
        && config::flag(&OPTIONS.freeres)
        && crate::services::scan::other_program_threads() == Some(0)
    {
        let cxx = cxx_freeres_defined_now();
        if cxx != 0 {
            // SAFETY: __gnu_cxx::__freeres() takes no arguments.
            let f: extern "C" fn() = unsafe { core::mem::transmute(cxx) };
            f();
        }
        // SAFETY: glibc's exported freeres; called after every atexit handler.
        unsafe { __libc_freeres() };
    }
    // After the runtimes' last frees: every capture of the run is counted.
    #[cfg(feature = "cache-audit")]
    crate::capture::unwind::audit::report();
    let spins = if signal { 200_000 } else { u32::MAX };
    if let Some(t) = ts.as_mut() {
        t.guard += 1;
    }
    let mut out = FinalOutput::new(ending);
    if !ending.by_signal() {
        // Rescanning allocates and takes the loader's lock: not from a signal.
        for m in modules::refresh().loaded {
            out.push(&Event::ModuleLoad(m), None);
        }
    }
    // The reachability scan (not from a fatal signal: it allocates and waits).
    // A skipped scan leaves the snapshot unjudged, as with --no-scan.
    let scanning = !signal && exit != ExitKind::Exec && crate::services::scan::at_exit_enabled();
    // From here the program's other threads stay stopped until the trace is
    // written, where they can be (scan::ExitHold).
    let mut hold = if scanning {
        crate::services::scan::ExitHold::stop()
    } else {
        crate::services::scan::ExitHold::none()
    };
    let (scan, skipped) = match scanning.then(|| crate::services::scan::run_at_exit(&mut hold)) {
        Some(Ok(o)) => (Some(o), None),
        Some(Err(s)) => (None, Some(s)),
        None => (None, None),
    };
    let time = clock::precise_now();
    out.push(
        &Event::SnapshotBegin {
            time,
            kind: SnapshotKind::Exit,
        },
        Some(time),
    );
    let (mut blocks, mut bytes) = (0u64, 0u64);
    if let Some(o) = &scan {
        crate::services::scan::emit(o, &mut out);
        (blocks, bytes) = (o.stats.blocks, o.stats.bytes);
    }
    for shard in live::shards().iter().filter(|_| scan.is_none()) {
        let Some(mut locked) = shard.try_locked(spins) else {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        locked.for_each(|addr, block| {
            if let Some(b) = out.room() {
                ensure_stack_in(b, block.stack);
            }
            out.push(
                &Event::LiveBlock {
                    addr,
                    size: block.size,
                    func: block.func,
                    stack: block.stack,
                },
                None,
            );
            blocks += 1;
            bytes += block.size;
        });
    }
    out.push(&Event::SnapshotEnd { blocks, bytes }, None);
    if let Some(mut s) = skipped {
        // After the snapshot, among the last records, where the end-of-run
        // summary reads (stats::summary_from_tail).
        s.time = clock::precise_now();
        crate::services::scan::emit_skipped(&s, &mut out);
    }
    phase::set_recording_stopped(true);
    if signal {
        thread::steal_all_into(100_000, |b| {
            writer::write_direct(&b);
            out.written_directly += u64::from(b.events);
            core::mem::forget(b);
        });
    } else {
        thread::steal_all(10_000_000);
    }
    let end_time = clock::precise_now();
    let lost = crate::events::buffers::EVENTS_LOST.load(Ordering::Relaxed)
        + untracked::OVERFLOW.load(Ordering::Relaxed);
    // A fatal signal may have struck between a count and its event.
    if let Some(t) = crate::events::totals::exact(lost).filter(|_| !signal) {
        out.push(&Event::RunTotals(t), None);
    }
    if config::production() {
        // The program's threads are held or gone: their counts are final.
        let counts = thread::call_counts();
        crate::events::call_counts::write(&counts, end_time, |ev| out.push(ev, Some(end_time)));
    }
    if config::flag(&OPTIONS.attached) {
        out.push(
            &Event::AttachTotals {
                earlier_releases: crate::events::record::EARLIER_RELEASES.load(Ordering::Relaxed),
            },
            None,
        );
    }
    let counters = EndCounters {
        events: crate::events::buffers::EVENTS_SUBMITTED.load(Ordering::Relaxed)
            + out.written_directly
            + out.events_pending()
            + 1,
        events_lost: lost,
        untracked_calls: untracked::CALLS.load(Ordering::Relaxed),
    };
    out.push(
        &Event::End {
            time: end_time,
            exit,
            counters,
        },
        Some(end_time),
    );
    out.close();
    if signal {
        // The writer thread may be stuck behind a lock this thread holds:
        // write what is queued from here and do not wait for it.
        writer::drain_no_alloc(100_000);
    } else {
        writer::finish(if ending == Ending::Exit {
            120_000
        } else {
            30_000
        });
    }
    phase::set_trace_done();
    FINISH_CHANGED.notify_all();
    // The threads kept stopped stay so while the exit ends the process.
    hold.release_at_end();
    if let Some(t) = ts.as_mut() {
        t.guard -= 1;
    }
}

/// Starts a new trace file for this process image (fork child, failed exec).
fn restart_trace() {
    phase::finish_called_off();
    FINISH_CHANGED.notify_all();
    if open_trace(false) {
        crate::events::buffers::submit_first(header_buffer());
        start_writer();
        phase::set_recording_stopped(false);
        crate::services::control::start();
    } else {
        phase::set_recording_stopped(true);
    }
}

/// exec failed after `finish(Exec)`: the image goes on, into a new trace.
pub fn resume_after_failed_exec() {
    writer::reset_for_new_file();
    restart_trace();
    let pending = SIGNAL_DURING_EXEC.swap(0, Ordering::AcqRel);
    if pending != 0 {
        // SAFETY: raising a signal; its handler (the agent's, or the
        // program's if it installed one meanwhile) runs as for any signal.
        unsafe { libc::raise(pending) };
    }
}

/// Another thread is finishing the trace (its exit, an exec): this one's
/// `_exit` or exec waits until the trace is written to its end record, or
/// the process would end with the trace cut short. A thread that finishes
/// for itself (an exit handler that calls `_exit` from inside the finish)
/// does not wait for itself.
fn wait_for_other_finish() {
    let me = sys::gettid();
    wait_for_trace_done(|| another_is_finishing(me));
}

/// Whether a thread is finishing the trace (exit, exec, a fatal signal):
/// periodic work that writes events (a scan) must not start any more.
pub fn finishing() -> bool {
    phase::finishing()
}

/// Whether a thread other than `me` is finishing the trace.
fn another_is_finishing(me: u32) -> bool {
    finishing() && phase::finishing_tid() != me
}

/// How long a thread whose fatal signal came while another finished the
/// trace waits, once the trace is written, for the process to end before
/// its signal takes its course (`wait_out_fault_during_finish`).
const FAULT_WAIT_NS: u64 = 10_000_000_000;

/// A fatal signal of this thread's own (a fault, `abort`) while another
/// thread finishes the trace. Natively that thread's exit would have ended
/// this one first: it runs on only because the finish (the exit scan, the
/// snapshot, the flush) takes longer than the `exit_group` it stands in
/// for, or it faults on what the finish did (the C library's freeres). So
/// it waits, its signal held, for the trace to be written and the exit to
/// end it. If the process goes on (an exec that failed), or
/// `FAULT_WAIT_NS` pass after the trace is done, the signal takes its
/// course. Returns false, at once, when no other thread is finishing.
///
/// Before, it died of its signal then and there: a thread that faulted
/// after the program's last exit handler ended the process with SIGSEGV
/// where natively it exited 0, and the trace had no end record
/// (`fault_in_finish.c`).
pub fn wait_out_fault_during_finish() -> bool {
    let me = sys::gettid();
    if !another_is_finishing(me) || !owns_process() {
        return false;
    }
    wait_for_trace_done(|| another_is_finishing(me));
    let until = clock::monotonic_ns() + FAULT_WAIT_NS;
    while another_is_finishing(me) && clock::monotonic_ns() < until {
        crate::platform::futex::sleep_ns(10_000_000);
    }
    true
}

/// From the `pthread_create` hook: while another thread finishes the trace
/// (for an exit or an exec, after every exit handler of the program),
/// threads that would start more threads wait until the trace is written.
/// Natively the process is in `exit_group` by then and they are gone; under
/// the agent they went on during the finish (its scan, its flush), and a
/// program whose threads start threads in a loop grew to thousands of them
/// there, until the agent's memory ran out and the process aborted.
pub fn wait_while_another_finishes() {
    if phase::finishing() {
        wait_for_other_finish();
    }
}

/// Waits, at most `OTHER_FINISH_WAIT_NS`, while `still` holds and the
/// trace is not yet written to its end record: asleep on `FINISH_CHANGED`,
/// which signals interrupt (the exit scan parks a waiting thread like any
/// other). It polled every millisecond before, and a program with 13,000
/// threads waiting there kept both cores busy waking them: the finishing
/// thread got a sliver of a core and a 2 s program took minutes to exit.
fn wait_for_trace_done(still: impl Fn() -> bool) {
    let deadline = clock::monotonic_ns() + OTHER_FINISH_WAIT_NS;
    loop {
        let seen = FINISH_CHANGED.generation();
        let now = clock::monotonic_ns();
        if !still() || phase::trace_done() || now >= deadline {
            return;
        }
        // Bounded: `still` can turn false without a notification (the
        // finishing thread's own conditions).
        FINISH_CHANGED.wait(seen, Some((deadline - now).min(100_000_000)));
    }
}

/// From the `exit` hook: the first thread to call `exit` goes on, and a
/// later one waits until the trace is written to its end record (or 60 s
/// have passed) before it goes on into glibc's `exit`. Before, a second
/// thread's `exit` ran the remaining exit handlers beside the first, and
/// reached the end (glibc's own `_exit`, past the agent) while the first
/// was still finishing the trace: three threads calling `exit` at once
/// left no end record, every time. glibc's `exit` itself makes later
/// callers wait for ever from 2.41 on; the bound keeps a program whose
/// exit handler waits for the second thread (a join) from hanging. The
/// same thread calling `exit` again (from an exit handler) goes on.
pub fn enter_exit() {
    let me = sys::gettid();
    match EXITING_TID.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(first) if first == me => {}
        Err(_) => wait_for_trace_done(|| true),
    }
}

/// A terminating signal arrived while the trace is being finished (not
/// after): the process is ending by its own exit, `_exit`, exec or an
/// earlier fatal signal, and natively would be gone or past the point
/// where the signal could act; dying of it now would cut the trace short
/// (a `multiprocessing` pool worker killed with SIGTERM as it called
/// `_exit` left no end record). Returns true when the signal is to be let
/// go: the trace's finish goes on. One that arrives during an exec's finish
/// is raised again if the exec fails.
pub fn signal_during_finish(sig: i32) -> bool {
    if !phase::finishing() || phase::trace_done() || !owns_process() {
        return false;
    }
    if phase::finishing_for_exec() {
        SIGNAL_DURING_EXEC.store(sig, Ordering::Release);
    }
    true
}

extern "C" fn fork_prepare() {
    // The forking thread's guard stays raised until the parent or child
    // handler: prepare handlers registered before the agent's (by a library
    // initialized before its constructor, as jemalloc is when the first
    // malloc comes from another library's initializer) run after this one,
    // while it holds every lock below. Their mutexes and allocations must
    // pass through the hooks as nested calls, or they wait for these locks
    // forever. Taken first: creating the thread's state takes the registry.
    thread::current_without_allocating().guard += 1;
    // First: watched pages must be back before the kernel copies the
    // memory (a child's would have nothing behind them); giving them back
    // allocates nothing.
    crate::tracking::access::before_fork();
    crate::services::profile::fork_prepare();
    crate::events::threads::lock();
    thread::lock_all();
    live::lock_all();
    stacks::lock_all();
    crate::events::buffers::lock();
    // Last: every lock above may be taken by code that allocates.
    crate::AGENT_HEAP.lock();
}

extern "C" fn fork_parent() {
    crate::AGENT_HEAP.unlock();
    crate::events::buffers::unlock();
    stacks::unlock_all();
    live::unlock_all();
    thread::unlock_all();
    crate::events::threads::unlock();
    crate::services::profile::fork_parent();
    crate::tracking::access::after_fork_parent();
    end_fork_window();
}

extern "C" fn fork_child() {
    fork_child_restart();
    end_fork_window();
}

/// Lowers the guard `fork_prepare` raised; releases the blocks that other
/// handlers freed meanwhile (`record::leave`).
fn end_fork_window() {
    if let Some(ts) = thread::current_if_any() {
        if ts.guard == 1 {
            crate::events::record::leave(ts);
        } else {
            ts.guard -= 1;
        }
    }
}

fn fork_child_restart() {
    EXITING_TID.store(0, Ordering::Relaxed);
    phase::clear_finishing_tid();
    crate::AGENT_HEAP.reset_lock();
    crate::services::scan::reset_in_child();
    crate::services::control::reset_in_child();
    crate::tracking::access::after_fork_child();
    writer::reset_in_child();
    stacks::reset_locks();
    live::reset_locks();
    modules::reset_lock();
    thread::reset_in_child();
    crate::events::threads::reset_in_child();
    crate::services::process_end::reset_in_child();
    phase::set_owner(sys::getpid_raw());
    phase::set_fork_token();
    sys::membarrier_register();
    crate::services::profile::fork_child(
        !phase::recording_stopped() && config::flag(&OPTIONS.follow),
    );
    if phase::recording_stopped() {
        return;
    }
    if !config::flag(&OPTIONS.follow) {
        phase::set_recording_stopped(true);
        return;
    }
    let ts = thread::current();
    ts.guard += 1;
    restart_trace();
    ts.guard -= 1;
}

/// LD_PRELOAD and trapline's variables for an exec'd image: when following,
/// and without following for the traced process's own images (an exec
/// replaces the process rather than starting another: a wrapper script's
/// `exec prog` stays traced; a child's exec does not).
pub fn exec_env_additions(envp: &[&[u8]]) -> Vec<CString> {
    let mut add = Vec::new();
    let follow = config::flag(&OPTIONS.follow);
    if !follow && (phase::recording_stopped() || !owns_process()) {
        return add;
    }
    let (Some(output), Some(agent_path)) = (config::output(), AGENT_PATH.get()) else {
        return add;
    };
    // Whether the exec's environment sets `name` already.
    let has = |name: &str| envp.iter().any(|e| env::sets(e, name));
    if !follow && !has(env::FOLLOW) {
        add.extend(CString::new(format!("{}=0", env::FOLLOW)));
    }
    if !envp
        .iter()
        .any(|e| env::sets(e, "LD_PRELOAD") && env::names_agent(e))
    {
        let existing = envp
            .iter()
            .find(|e| e.starts_with(b"LD_PRELOAD="))
            .map(|e| &e[11..]);
        let mut v = format!("LD_PRELOAD={}", agent_path).into_bytes();
        if let Some(x) = existing {
            v.push(b':');
            v.extend_from_slice(x);
        }
        add.extend(CString::new(v));
    }
    if !has(env::OUTPUT) {
        add.extend(CString::new(format!("{}={}", env::OUTPUT, output)));
    }
    if !has(env::PASS_INVALID) && config::flag(&OPTIONS.pass_invalid) {
        add.extend(CString::new(format!("{}=1", env::PASS_INVALID)));
    }
    if let Some(hz) = crate::services::profile::hz().filter(|_| !has(env::PROFILE_HZ)) {
        add.extend(CString::new(format!("{}={hz}", env::PROFILE_HZ)));
    }
    if !has(env::RELEASE_STACKS) && !config::flag(&OPTIONS.release_stacks) {
        add.extend(CString::new(format!("{}=0", env::RELEASE_STACKS)));
    }
    if !has(env::FREERES) && !config::flag(&OPTIONS.freeres) {
        add.extend(CString::new(format!("{}=0", env::FREERES)));
    }
    add
}

#[cfg(test)]
mod tests {
    use super::{kept_arguments, split_cmdline};

    #[test]
    fn empty_arguments_are_kept_and_title_padding_is_not() {
        let args = split_cmdline(b"redis-server\0--save\0\0", false);
        assert_eq!(args, [&b"redis-server"[..], b"--save", b""]);
        let args = split_cmdline(b"nginx: worker process\0\0\0\0", true);
        assert_eq!(args, [&b"nginx: worker process"[..]]);
        assert_eq!(split_cmdline(b"retitled", true), [&b"retitled"[..]]);
        assert!(split_cmdline(b"", false).is_empty());
    }

    #[test]
    fn a_long_command_line_is_cut_and_says_so() {
        let long = vec![b'x'; 10];
        let args: Vec<&[u8]> = vec![b"prog", &long, &long];
        assert_eq!(
            kept_arguments(&args, 100),
            ["prog", "xxxxxxxxxx", "xxxxxxxxxx"]
        );
        assert_eq!(
            kept_arguments(&args, 18),
            [
                "prog",
                "xxxxxxxxxx",
                "xxxx",
                "[trapline: 6 more bytes of the command line, in 1 argument(s), not recorded]"
            ]
        );
        assert_eq!(
            kept_arguments(&args, 14),
            [
                "prog",
                "xxxxxxxxxx",
                "[trapline: 10 more bytes of the command line, in 1 argument(s), not recorded]"
            ]
        );
    }
}

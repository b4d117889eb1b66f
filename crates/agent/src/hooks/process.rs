//! Process lifecycle: fork (the parent notes the child), exec (the trace is
//! finished first, and the new image is kept traced), _exit, and dlopen /
//! dlclose (the module map and the unwinder follow the loaded code).

use crate::runtime::lifecycle;
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};
use std::ffi::CStr;
use trapline_trace::{Event, ExitKind};

static REAL_FORK: AtomicUsize = AtomicUsize::new(0);
static REAL_UNDERSCORE_FORK: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVE: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVP: AtomicUsize = AtomicUsize::new(0);
static REAL_EXECVPE: AtomicUsize = AtomicUsize::new(0);
static REAL_FEXECVE: AtomicUsize = AtomicUsize::new(0);
static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

use crate::platform::sys::cached_next_symbol as real;

/// Resolves the real functions (from the constructor, while it is safe to call dlsym).
pub fn resolve() {
    real(&REAL_FORK, c"fork");
    real(&REAL_EXECVE, c"execve");
    real(&REAL_EXECVP, c"execvp");
    real(&REAL_EXECVPE, c"execvpe");
    real(&REAL_FEXECVE, c"fexecve");
    real(&REAL_EXIT, c"_exit");
    real(&REAL_QUICK_EXIT, c"quick_exit");
    real(&REAL_DLOPEN, c"dlopen");
    real(&REAL_DLCLOSE, c"dlclose");
    // Looked up now, not in a vfork child, where dlsym must not run.
    real(&REAL_POSIX_SPAWN, c"posix_spawn");
    real(&REAL_POSIX_SPAWNP, c"posix_spawnp");
    real(&REAL_EXECVEAT, c"execveat");
}

/// Writes module map changes to the trace.
fn note_module_changes() {
    if crate::phase::recording_stopped() {
        return;
    }
    let changes = crate::capture::modules::refresh();
    if changes.loaded.is_empty() && changes.unloaded.is_empty() {
        return;
    }
    if !changes.loaded.is_empty() && crate::config::flag(&crate::config::OPTIONS.attached) {
        crate::runtime::attach::patch_new_modules();
    }
    let mut b = crate::events::buffers::take_buffer(0);
    let events = changes.loaded.into_iter().map(Event::ModuleLoad).chain(
        changes
            .unloaded
            .into_iter()
            .map(|id| Event::ModuleUnload { id }),
    );
    for ev in events {
        if b.room() < crate::events::buffers::EVENT_RESERVE {
            crate::events::buffers::submit(
                core::mem::replace(&mut b, crate::events::buffers::take_buffer(0)),
                true,
            );
        }
        if !b.push_event(&ev, None) {
            crate::events::buffers::EVENTS_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
    crate::events::buffers::submit(b, true);
}

#[no_mangle]
pub extern "C" fn fork() -> libc::pid_t {
    let f = real(&REAL_FORK, c"fork");
    // SAFETY: glibc's fork; it runs the agent's atfork handlers.
    let real_fork: extern "C" fn() -> libc::pid_t = unsafe { core::mem::transmute(f) };
    let pid = real_fork();
    record_fork(pid);
    pid
}

/// glibc's fork without the atfork handlers (glibc 2.34), for
/// async-signal-safe forking: nothing resets the agent in the child, which
/// therefore stops recording at once (it usually execs, and the new image is
/// traced again).
#[no_mangle]
pub extern "C" fn _Fork() -> libc::pid_t {
    let f = real(&REAL_UNDERSCORE_FORK, c"_Fork");
    if f == 0 {
        // SAFETY: setting errno through its thread-local location.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: glibc's _Fork, no arguments.
    let real_fork: extern "C" fn() -> libc::pid_t = unsafe { core::mem::transmute(f) };
    let pid = real_fork();
    if pid == 0 {
        if crate::phase::in_unreset_child() {
            crate::phase::abandon_unreset_child();
        }
    } else {
        record_fork(pid);
    }
    pid
}

/// The parent's `Fork` event, with the child's pid.
fn record_fork(pid: libc::pid_t) {
    if pid > 0 && !crate::phase::recording_stopped() {
        if let crate::events::record::Entry::Record(ts) = crate::events::record::enter() {
            let t = ts.next_time();
            ts.emit(Some(t), |e, c| {
                e.event(
                    c,
                    &Event::Fork {
                        time: t,
                        child_pid: pid as u32,
                    },
                )
            });
            crate::events::record::leave(ts);
        }
    }
}

/// Builds the environment for an exec'd image: the program's, plus what keeps it traced.
fn env_with_agent(envp: *const *const c_char) -> (Vec<std::ffi::CString>, Vec<*const c_char>) {
    let mut entries: Vec<*const c_char> = Vec::new();
    let mut view: Vec<&[u8]> = Vec::new();
    if !envp.is_null() {
        let mut i = 0;
        // SAFETY: envp is a NULL-terminated array of C strings (execve's contract).
        unsafe {
            while !(*envp.add(i)).is_null() {
                let e = *envp.add(i);
                entries.push(e);
                view.push(CStr::from_ptr(e).to_bytes());
                i += 1;
            }
        }
    }
    let add = lifecycle::exec_env_additions(&view);
    // LD_PRELOAD replaces an existing entry; others are appended. The top
    // role (and the inherited SIGPIPE) is never passed on: only `trapline
    // run` gives it (a program may still hold it in a copy of its
    // environment taken before the agent's constructor removed it).
    let mut out: Vec<*const c_char> = entries
        .into_iter()
        .zip(view.iter())
        .filter(|(_, v)| {
            let replaced = v.starts_with(b"LD_PRELOAD=")
                && add.iter().any(|a| a.as_bytes().starts_with(b"LD_PRELOAD="));
            !replaced && !is_for_the_top_image(v)
        })
        .map(|(e, _)| e)
        .collect();
    out.extend(add.iter().map(|a| a.as_ptr()));
    out.push(core::ptr::null());
    (add, out)
}

/// Variables `trapline run` gives the top process's first image alone.
fn is_for_the_top_image(entry: &[u8]) -> bool {
    use trapline_contract::env;
    [env::ROLE, env::IGNORE_SIGPIPE, env::DIE_WITH]
        .iter()
        .any(|name| env::sets(entry, name))
}

/// Runs an exec (`exec`, given the environment) of a program that can take
/// the agent or, when `foreign` (`exec_target.rs`), cannot: the environment
/// keeps the agent (or has it taken out), and the trace is finished first
/// (taken up again if the exec fails). A vfork child's exec of a program
/// that can take the agent passes straight through: it shares our memory.
/// The foreign path allocates nothing, so it serves vfork children too.
fn exec_with(
    foreign: bool,
    envp: *const *const c_char,
    exec: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if foreign {
        let mut storage = crate::runtime::exec_target::EnvWithoutAgent::new();
        let env = storage.build(envp, is_for_the_top_image).unwrap_or(envp);
        let finished = before_exec();
        let r = exec(env);
        after_failed_exec(finished);
        return r;
    }
    if !crate::phase::owns_process() {
        return exec(envp);
    }
    let (_keep, env) = env_with_agent(envp);
    let finished = before_exec();
    let r = exec(env.as_ptr());
    after_failed_exec(finished);
    r
}

fn before_exec() -> bool {
    if !crate::phase::initialized() || !crate::phase::owns_process() {
        return false;
    }
    lifecycle::finish(ExitKind::Exec, lifecycle::Ending::Immediate);
    true
}

fn after_failed_exec(finished: bool) {
    if finished {
        lifecycle::resume_after_failed_exec();
    }
}

extern "C" {
    static mut environ: *const *const c_char;
}

/// # Safety
/// execve's contract.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(&REAL_EXECVE, c"execve");
    // SAFETY: glibc's execve.
    let real_execve: unsafe extern "C" fn(
        *const c_char,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int = unsafe { core::mem::transmute(f) };
    let foreign = crate::runtime::exec_target::is_foreign_path(path, false);
    // SAFETY: the caller's arguments, with the environment `exec_with` gives.
    exec_with(foreign, envp, |env| unsafe { real_execve(path, argv, env) })
}

/// # Safety
/// execv's contract.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: environ is the process environment.
    unsafe { execve(path, argv, environ) }
}

/// # Safety
/// execvpe's contract.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(&REAL_EXECVPE, c"execvpe");
    // SAFETY: glibc's execvpe.
    let real_fn: unsafe extern "C" fn(
        *const c_char,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int = unsafe { core::mem::transmute(f) };
    let foreign = crate::runtime::exec_target::is_foreign_path(file, true);
    // SAFETY: the caller's arguments, with the environment `exec_with` gives.
    exec_with(foreign, envp, |env| unsafe { real_fn(file, argv, env) })
}

/// # Safety
/// execvp's contract.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: environ is the process environment.
    unsafe { execvpe(file, argv, environ) }
}

/// # Safety
/// fexecve's contract.
#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(&REAL_FEXECVE, c"fexecve");
    // SAFETY: glibc's fexecve.
    let real_fn: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int =
        unsafe { core::mem::transmute(f) };
    let foreign = crate::runtime::exec_target::is_foreign_fd(fd);
    // SAFETY: the caller's arguments, with the environment `exec_with` gives.
    exec_with(foreign, envp, |env| unsafe { real_fn(fd, argv, env) })
}

static REAL_EXECVEAT: AtomicUsize = AtomicUsize::new(0);

/// # Safety
/// execveat's contract (glibc 2.34's wrapper; `fexecve` uses the system call
/// inside glibc, which its own hook covers).
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    let f = real(&REAL_EXECVEAT, c"execveat");
    if f == 0 {
        // SAFETY: setting errno through its thread-local location.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: glibc's execveat.
    let real_fn: unsafe extern "C" fn(
        c_int,
        *const c_char,
        *const *const c_char,
        *const *const c_char,
        c_int,
    ) -> c_int = unsafe { core::mem::transmute(f) };
    let foreign = crate::runtime::exec_target::is_foreign_at_dir(dirfd, path, flags);
    // SAFETY: the caller's arguments, with the environment `exec_with` gives.
    exec_with(foreign, envp, |env| unsafe {
        real_fn(dirfd, path, argv, env, flags)
    })
}

static REAL_POSIX_SPAWN: AtomicUsize = AtomicUsize::new(0);
static REAL_POSIX_SPAWNP: AtomicUsize = AtomicUsize::new(0);

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// `posix_spawn` and `posix_spawnp` start their child inside the C library,
/// which executes it past the exec hooks: the child got `envp` as it was
/// (a caller's own environment without `LD_PRELOAD` left it untraced; a
/// 32-bit or musl program got the agent). Here it gets what an exec hook
/// gives: the agent kept in (or put back into) `LD_PRELOAD` when following,
/// or taken out for a program that cannot take it (`exec_target.rs`). The
/// caller's trace goes on: the call starts another process.
///
/// The environment to start `path` with (`search`: found along PATH) is
/// given to `spawn`.
fn spawn_with(
    search: bool,
    path: *const c_char,
    envp: *const *const c_char,
    spawn: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if path.is_null() || envp.is_null() || !crate::phase::owns_process() {
        return spawn(envp);
    }
    if crate::runtime::exec_target::is_foreign_path(path, search) {
        let mut storage = crate::runtime::exec_target::EnvWithoutAgent::new();
        return spawn(storage.build(envp, is_for_the_top_image).unwrap_or(envp));
    }
    let (_keep, env) = env_with_agent(envp);
    spawn(env.as_ptr())
}

/// # Safety
/// posix_spawn's contract.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(&REAL_POSIX_SPAWN, c"posix_spawn");
    // SAFETY: glibc's posix_spawn.
    let real_fn: SpawnFn = unsafe { core::mem::transmute(f) };
    spawn_with(false, path, envp, |env| {
        // SAFETY: the caller's arguments (posix_spawn's contract), with `env`.
        unsafe { real_fn(pid, path, actions, attr, argv, env) }
    })
}

/// # Safety
/// posix_spawnp's contract.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(&REAL_POSIX_SPAWNP, c"posix_spawnp");
    // SAFETY: glibc's posix_spawnp.
    let real_fn: SpawnFn = unsafe { core::mem::transmute(f) };
    spawn_with(true, file, envp, |env| {
        // SAFETY: the caller's arguments (posix_spawnp's contract), with `env`.
        unsafe { real_fn(pid, file, actions, attr, argv, env) }
    })
}

#[inline(always)]
fn exit_now(status: c_int) -> ! {
    if crate::phase::owns_process() {
        crate::services::scan::note_exit_here();
        lifecycle::finish(ExitKind::Code(status), lifecycle::Ending::Immediate);
    }
    let f = real(&REAL_EXIT, c"_exit");
    // SAFETY: glibc's _exit never returns.
    let real_exit: extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(f) };
    real_exit(status)
}

static REAL_QUICK_EXIT: AtomicUsize = AtomicUsize::new(0);

/// quick_exit runs its at_quick_exit handlers and then glibc's internal
/// _exit, past the agent's hook: finish the trace first.
#[no_mangle]
pub extern "C" fn quick_exit(status: c_int) -> ! {
    if crate::phase::owns_process() {
        crate::services::scan::note_exit_here();
        lifecycle::finish(ExitKind::Code(status), lifecycle::Ending::Immediate);
    }
    let f = real(&REAL_QUICK_EXIT, c"quick_exit");
    // SAFETY: glibc's quick_exit never returns.
    let real_fn: extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(f) };
    real_fn(status)
}

#[no_mangle]
pub extern "C" fn _exit(status: c_int) -> ! {
    exit_now(status)
}

#[no_mangle]
pub extern "C" fn _Exit(status: c_int) -> ! {
    exit_now(status)
}

/// daemon(3), as glibc does it, but through the agent's `fork` and `_exit`:
/// glibc's own calls its internal `_exit` in the parent, past the hook, so
/// the parent's trace had no end record (the top trace of every traced
/// daemon).
#[no_mangle]
pub extern "C" fn daemon(nochdir: c_int, noclose: c_int) -> c_int {
    match fork() {
        -1 => return -1,
        0 => {}
        _ => exit_now(0),
    }
    // SAFETY: plain system calls on the caller's behalf, as glibc's daemon
    // makes them; the path is NUL-terminated.
    unsafe {
        if libc::setsid() == -1 {
            return -1;
        }
        if nochdir == 0 {
            // glibc ignores a failed chdir too.
            let _ = libc::chdir(c"/".as_ptr());
        }
        if noclose == 0 {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if fd == -1 {
                return -1;
            }
            let mut st: libc::stat = core::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
                libc::close(fd);
                *libc::__errno_location() = libc::ENODEV;
                return -1;
            }
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
    0
}

/// # Safety
/// dlopen's contract.
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let f = real(&REAL_DLOPEN, c"dlopen");
    // SAFETY: glibc's dlopen.
    let real_fn: unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void =
        unsafe { core::mem::transmute(f) };
    // RTLD_DEEPBIND would let the library bind malloc to libc's past the agent.
    // SAFETY: passing the caller's arguments through.
    let h = unsafe { real_fn(file, mode & !libc::RTLD_DEEPBIND) };
    if !h.is_null() {
        note_module_changes();
    }
    h
}

/// # Safety
/// dlclose's contract.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let f = real(&REAL_DLCLOSE, c"dlclose");
    // SAFETY: glibc's dlclose.
    let real_fn: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { core::mem::transmute(f) };
    // SAFETY: passing the caller's handle through.
    let r = unsafe { real_fn(handle) };
    note_module_changes();
    r
}

/// Reads a variadic argument list as spilled by the arch trampolines: five
/// register slots, then the stack. Returns argv (NULL-terminated) and the
/// argument after the terminating NULL (execle's envp).
///
/// # Safety
/// `regs` points to five readable words and `stack` to the caller's stack
/// arguments, and the list is NULL-terminated as exec requires.
unsafe fn collect_args(
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> (Vec<*const c_char>, *const c_char) {
    let at = |i: usize| -> *const c_char {
        // SAFETY: per the function's contract.
        unsafe {
            if i < 5 {
                *regs.add(i)
            } else {
                *stack.add(i - 5)
            }
        }
    };
    let mut argv = Vec::new();
    let mut i = 0;
    loop {
        let a = at(i);
        argv.push(a);
        i += 1;
        if a.is_null() {
            break;
        }
    }
    (argv, at(i))
}

crate::platform::arch::variadic_exec_trampoline!(execl, execl_collected);
crate::platform::arch::variadic_exec_trampoline!(execle, execle_collected);
crate::platform::arch::variadic_exec_trampoline!(execlp, execlp_collected);
crate::platform::arch::syscall_trampoline!(exit: _exit, execve: execve);

/// # Safety
/// Called only by the `execl` trampoline.
pub unsafe extern "C" fn execl_collected(
    path: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    // SAFETY: the trampoline's layout; argv stays alive across the call.
    unsafe {
        let (argv, _) = collect_args(regs, stack);
        execv(path, argv.as_ptr())
    }
}

/// # Safety
/// Called only by the `execlp` trampoline.
pub unsafe extern "C" fn execlp_collected(
    file: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    // SAFETY: as above.
    unsafe {
        let (argv, _) = collect_args(regs, stack);
        execvp(file, argv.as_ptr())
    }
}

/// # Safety
/// Called only by the `execle` trampoline.
pub unsafe extern "C" fn execle_collected(
    path: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    // SAFETY: as above; execle's envp follows the NULL that ends argv.
    unsafe {
        let (argv, envp) = collect_args(regs, stack);
        execve(path, argv.as_ptr(), envp as *const *const c_char)
    }
}

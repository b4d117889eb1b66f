//! `trapline run`: start a command with the agent preloaded, wait for it, and
//! summarize what was recorded.
//!
//! Exit status: the command's own (128+N when a signal N killed it); 125 when
//! trapline could not start it (agent missing, unwritable trace path, a static
//! or setuid program), 126 when the command cannot be executed, 127 when it
//! does not exist, like env(1) and timeout(1); 124 when `--timeout` stopped it.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use trapline_contract::elf::ProgramStart;
use trapline_contract::env;

use crate::embedded_agent::AGENT_FILE;
use crate::run_args::{
    fail, RunArgs, DEFAULT_PROFILE_HZ, EXIT_CANNOT_RUN, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND,
    EXIT_TIMED_OUT,
};
use crate::run_signals::{forward_signals, signal_forwarding, INHERITED_SIGPIPE};
use crate::run_summary::{summarize_apart, OomKills, OOM_KILLS_AT_START, PRIVATE_ALLOCATOR};
/// After SIGTERM at the timeout, how long the command may take to end before SIGKILL.
const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the agent library is: $TRAPLINE_AGENT, next to this binary, in
/// the install layout `<prefix>/lib/trapline/` beside `<prefix>/bin/trapline`,
/// or the copy this binary carries, written out (`embedded_agent`).
pub fn find_agent() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env::AGENT) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "TRAPLINE_AGENT names {}, which is not a file",
                p.display()
            ))
        };
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the trapline binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(AGENT_FILE),
        dir.join("../lib/trapline").join(AGENT_FILE),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(c.canonicalize().unwrap_or_else(|_| c.clone()));
        }
    }
    if let Some(embedded) = crate::embedded_agent::path() {
        return embedded;
    }
    Err(format!(
        "cannot find the agent library {AGENT_FILE} (looked in {} and {}); build it with `cargo build --release` or set TRAPLINE_AGENT",
        candidates[0].display(),
        candidates[1].display()
    ))
}

/// Resolves CMD like execvp does.
fn resolve_command(cmd: &OsString) -> Result<PathBuf, ExitCode> {
    find_command(cmd).map_err(|(code, msg)| fail(code, msg))
}

/// Resolves CMD like execvp does; else the exit status and why.
pub(crate) fn find_command(cmd: &OsString) -> Result<PathBuf, (u8, String)> {
    let p = Path::new(cmd);
    let found = if p.as_os_str().to_string_lossy().contains('/') {
        if p.is_dir() {
            return Err((
                EXIT_NOT_EXECUTABLE,
                format!("{}: is a directory, not a program", p.display()),
            ));
        }
        p.is_file().then(|| p.to_path_buf())
    } else {
        std::env::var_os("PATH")
            .map(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join(p))
                    .find(|c| c.is_file())
            })
            .unwrap_or(None)
    };
    let Some(path) = found else {
        return Err((
            EXIT_NOT_FOUND,
            format!("{}: command not found", p.display()),
        ));
    };
    let meta = std::fs::metadata(&path)
        .map_err(|e| (EXIT_NOT_EXECUTABLE, format!("{}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o111 == 0 {
        return Err((
            EXIT_NOT_EXECUTABLE,
            format!("{}: permission denied (not executable)", path.display()),
        ));
    }
    Ok(path)
}

/// Refuses programs the dynamic loader will not preload into.
fn check_preloadable(path: &Path) -> Result<(), ExitCode> {
    let meta = std::fs::metadata(path)
        .map_err(|e| fail(EXIT_NOT_EXECUTABLE, format!("{}: {e}", path.display())))?;
    let euid = nix::unistd::geteuid().as_raw();
    let egid = nix::unistd::getegid().as_raw();
    if (meta.mode() & 0o4000 != 0 && meta.uid() != euid)
        || (meta.mode() & 0o2000 != 0 && meta.gid() != egid)
    {
        return Err(fail(
            EXIT_CANNOT_RUN,
            format!(
                "{} is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it, so it cannot be traced",
                path.display()
            ),
        ));
    }
    let Ok(file) = std::fs::File::open(path).and_then(trapline_symbols::BlockFile::new) else {
        return Ok(());
    };
    // Read lazily: only the headers and the symbol tables are needed
    // (reading cc1 whole took 33 MB before every run).
    let data = object::read::ReadCache::new(file);
    match program_start(path) {
        // Recorded from outside (crates/tracer).
        ProgramStart::Static => return Ok(()),
        ProgramStart::Loader { path: loader, .. } if !loader.is_glibc() => {
            return Err(fail(
                EXIT_CANNOT_RUN,
                format!(
                    "{} is started by the dynamic loader {loader}, not the GNU C library's: trapline's agent is built for glibc and that loader cannot load it (the program would not even start), so it cannot be traced (build it against glibc)",
                    path.display()
                ),
            ));
        }
        _ => {}
    }
    if let Some(kind) = foreign_elf(&data) {
        return Err(fail(
            EXIT_CANNOT_RUN,
            format!(
                "{} is {kind} program, and trapline's agent is {AGENT_KIND} library: the dynamic loader preloads a library only into programs of its own architecture, so it cannot be traced (build it for {AGENT_KIND_SHORT})",
                path.display()
            ),
        ));
    }
    if let Some(trapline_symbols::PrivateAllocator { allocator, symbol }) =
        trapline_symbols::private_allocator(&data)
    {
        let warning = format!(
            "warning: {} has an allocator of its own ({allocator}, found as {symbol}): the \
             blocks it serves do not go through malloc, so they are not in the trace; build \
             it with the system allocator to trace them",
            path.display()
        );
        eprintln!("==trapline== {warning}");
        let _ = PRIVATE_ALLOCATOR.set(warning);
    }
    if let Some((sanitizer, runtime)) = sanitizer_runtime(&data) {
        return Err(fail(
            EXIT_CANNOT_RUN,
            format!(
                "{} is built with {sanitizer} (it loads {runtime}): the sanitizer's runtime has an allocator of its own and must be the first library loaded, so the program cannot run with trapline's agent preloaded (rebuild it without -fsanitize, or use the sanitizer's own reports)",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// A script (`#!`) runs in its interpreter, which is what the agent is
/// loaded into: the interpreter must pass `check_preloadable` too (a musl
/// interpreter failed on the agent and the script never ran; a static one
/// ran it untraced).
fn check_interpreter(script: &Path) -> Result<(), ExitCode> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let line = line.split(|&b| b == b'\n').next().unwrap_or(line);
    let Some(interpreter) = line
        .split(|&b| b == b' ' || b == b'\t')
        .find(|w| !w.is_empty())
    else {
        return Ok(());
    };
    let interpreter = Path::new(std::ffi::OsStr::from_bytes(interpreter));
    if !interpreter.is_file() {
        // The kernel reports it when the script is run.
        return Ok(());
    }
    let static_interpreter = || {
        Err(fail(
            EXIT_CANNOT_RUN,
            format!(
                "{} is statically linked: the agent cannot be preloaded into it, and a script it runs is not recorded from outside (run the interpreter itself: trapline run -- {} {})",
                interpreter.display(),
                interpreter.display(),
                script.display()
            ),
        ))
    };
    if program_start(interpreter) == ProgramStart::Static {
        static_interpreter()
    } else {
        check_preloadable(interpreter)
    }
    .inspect_err(|_| {
        eprintln!(
            "trapline run: {} is a script that {} runs",
            script.display(),
            interpreter.display()
        );
    })
}

/// The sanitizer whose shared runtime the executable loads, if any. Each of
/// them intercepts malloc and refuses to start unless it comes first in
/// the library list ("ASan runtime does not come first in initial library
/// list"): preloaded before it, the agent only got an exit status of 1 and
/// no trace. Found by the runtime's name among the executable's dynamic
/// strings, where its DT_NEEDED entry names it.
fn sanitizer_runtime<'data, R: object::ReadRef<'data>>(data: R) -> Option<(&'static str, String)> {
    use object::{Object, ObjectSection};
    const RUNTIMES: [(&str, &str); 4] = [
        ("AddressSanitizer", "libasan.so"),
        ("ThreadSanitizer", "libtsan.so"),
        ("LeakSanitizer", "liblsan.so"),
        ("HWAddressSanitizer", "libhwasan.so"),
    ];
    let file = object::File::parse(data).ok()?;
    let dynstr = file.section_by_name(".dynstr")?.data().ok()?;
    // One pass (node's .dynstr holds 2.5 MB of names).
    dynstr.split(|&b| b == 0).find_map(|name| {
        RUNTIMES
            .into_iter()
            .find(|(_, runtime)| name.starts_with(runtime.as_bytes()))
            .map(|(sanitizer, _)| (sanitizer, String::from_utf8_lossy(name).into_owned()))
    })
}

/// The agent's architecture, as the dynamic loader sees it.
#[cfg(target_arch = "x86_64")]
const AGENT_ARCH: object::Architecture = object::Architecture::X86_64;
#[cfg(target_arch = "aarch64")]
const AGENT_ARCH: object::Architecture = object::Architecture::Aarch64;
#[cfg(target_arch = "x86_64")]
const AGENT_KIND: &str = "a 64-bit x86-64";
#[cfg(target_arch = "aarch64")]
const AGENT_KIND: &str = "a 64-bit ARM (aarch64)";
#[cfg(target_arch = "x86_64")]
const AGENT_KIND_SHORT: &str = "x86-64";
#[cfg(target_arch = "aarch64")]
const AGENT_KIND_SHORT: &str = "aarch64";

/// An ELF executable the agent cannot be loaded into: another architecture,
/// or another ABI of this one (32-bit x86 next to x86-64). ld.so only says
/// "wrong ELF class: ELFCLASS64 ... ignored" and runs it untraced. Returns
/// how to name it ("a 32-bit x86 (i386)"); None for anything that is not
/// an ELF file (a script is checked when its interpreter runs).
fn foreign_elf<'data, R: object::ReadRef<'data>>(data: R) -> Option<String> {
    use object::{Architecture, Object};
    let file = object::File::parse(data).ok()?;
    let arch = file.architecture();
    if arch == AGENT_ARCH && file.is_64() {
        return None;
    }
    Some(match arch {
        Architecture::I386 => "a 32-bit x86 (i386)".to_owned(),
        Architecture::X86_64_X32 => "an x32 (x86-64 with 32-bit pointers)".to_owned(),
        Architecture::X86_64 => "a 64-bit x86-64".to_owned(),
        Architecture::Aarch64 => "a 64-bit ARM (aarch64)".to_owned(),
        Architecture::Arm => "a 32-bit ARM".to_owned(),
        Architecture::Riscv64 => "a 64-bit RISC-V".to_owned(),
        Architecture::Unknown => "an unknown-architecture".to_owned(),
        other => format!("a {}-bit {other:?}", if file.is_64() { 64 } else { 32 }),
    })
}

/// How the file at `path` starts as a program (the agent's test too).
fn program_start(path: &Path) -> ProgramStart {
    use std::os::unix::fs::FileExt;
    let Ok(file) = std::fs::File::open(path) else {
        return ProgramStart::Unknown;
    };
    trapline_contract::elf::program_start(&mut |offset, buf| {
        file.read_exact_at(buf, offset).is_ok()
    })
}

fn preload_value(agent: &Path) -> OsString {
    let mut v = agent.as_os_str().to_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(existing);
    }
    v
}

pub fn main(args: RunArgs) -> ExitCode {
    let timeout = match args.timeout.map(std::time::Duration::try_from_secs_f64) {
        None => None,
        Some(Ok(d)) if !d.is_zero() => Some(d),
        Some(_) => {
            return fail(
                crate::args::EXIT_USAGE,
                "--timeout needs a positive number of seconds",
            )
        }
    };
    let agent = match find_agent() {
        Ok(a) => a,
        Err(e) => return fail(EXIT_CANNOT_RUN, e),
    };
    let program = match resolve_command(&args.command[0]) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Err(code) = check_preloadable(&program).and_then(|()| check_interpreter(&program)) {
        return code;
    }
    let is_static = program_start(&program) == ProgramStart::Static;
    // The trace path must be writable before anything runs.
    let output = output_path(&args);
    if let Err(code) = prepare_output(&args, &output) {
        return code;
    }

    if is_static {
        return crate::run_static::main(&args, &program, &output);
    }
    let cmd = agent_command(&args, &agent, &output);
    let signals = match signal_forwarding() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // What the kernel's OOM killer had done before the command ran: a
    // SIGKILL it sends while the command runs is then named as its.
    let _ = OOM_KILLS_AT_START.set(OomKills::now());
    let child = match spawn(cmd, &program, &output) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let child_pid = Pid::from_raw(child.id() as i32);
    let watcher = args.watch.map(|secs| {
        crate::watch::TreeWatch::start(child_pid.as_raw() as u32, secs, args.stale_after, &output)
    });
    let (handle, forwarder) = forward_signals(signals, child_pid);
    let (status, timed_out) = match wait_with_timeout(child, child_pid, timeout) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                EXIT_CANNOT_RUN,
                format!("waiting for {} failed: {e}", program.display()),
            )
        }
    };
    handle.close();
    let _ = forwarder.join();
    let watched = watcher.map(crate::watch::TreeWatch::finish);
    if args.control || args.watch.is_some() {
        // Workers that changed their user could not remove their sockets
        // from the directory they made them in as root.
        crate::watch::remove_stale_sockets();
    }

    let code: u8 = match (status.code(), status.signal()) {
        _ if timed_out => EXIT_TIMED_OUT,
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    };
    let mut found = None;
    if !args.quiet || args.error_exitcode.is_some() {
        let read = summarize_apart(
            &output,
            &program,
            child_pid.as_raw() as u32,
            status.signal(),
            !args.quiet,
        );
        found = read.found;
        if timed_out && !args.quiet {
            eprintln!(
                "==trapline== stopped by --timeout: if it hung on a lock, see: trapline deadlocks {}",
                read.last_image.display()
            );
        }
    }
    if !args.quiet {
        if let Some(w) = watched {
            for line in w {
                eprintln!("==trapline== {line}");
            }
        }
    }
    crate::run_summary::exit_status(code, args.error_exitcode, found)
}

/// The trace path, absolute (the command may change directory).
fn output_path(args: &RunArgs) -> PathBuf {
    if args.output.is_absolute() {
        args.output.clone()
    } else {
        std::env::current_dir()
            .map(|d| d.join(&args.output))
            .unwrap_or_else(|_| args.output.clone())
    }
}

/// Checks that the trace path can be written, and moves the previous
/// run's traces aside (saying so unless `--quiet`).
fn prepare_output(args: &RunArgs, output: &Path) -> Result<(), ExitCode> {
    match crate::trace_output::prepare(output, &args.command, args.force) {
        Err(e) => return Err(fail(EXIT_CANNOT_RUN, e)),
        Ok(p) if !p.moved_aside.is_empty() && !args.quiet => {
            let names: Vec<String> = p
                .moved_aside
                .iter()
                .map(|f| f.display().to_string())
                .collect();
            let deleted = match p.deleted {
                0 => String::new(),
                1 => "; the older trace kept there was deleted".to_owned(),
                n => format!("; the {n} older traces kept there were deleted"),
            };
            // A process tree's traces can be a hundred: the top ones
            // named, the rest counted (they share the first one's name).
            const NAMED: usize = 3;
            let listed = match names.len() {
                n if n <= NAMED => names.join(", "),
                n => format!(
                    "{} and {} more beside them ({}.*)",
                    names[..NAMED].join(", "),
                    n - NAMED,
                    names[0]
                ),
            };
            eprintln!(
                "trapline run: the previous run's trace{} moved aside: {listed}{deleted}",
                if names.len() == 1 { "" } else { "s" },
            );
        }
        Ok(_) => {}
    }
    Ok(())
}

/// The command with the agent preloaded and the options in its
/// environment.
fn agent_command(args: &RunArgs, agent: &Path, output: &Path) -> Command {
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload_value(agent))
        .env(env::OUTPUT, output)
        .env(env::ROLE, env::ROLE_TOP);
    // Options at the agent's default are left out of the command's
    // environment (and an inherited value removed): the program then sees
    // two variables of trapline's, `LD_PRELOAD` and `TRAPLINE_OUTPUT`, where
    // it saw eight.
    let recorded = |r: &str| {
        args.record
            .as_ref()
            .is_none_or(|list| list.iter().any(|x| x == r))
            && (r != env::RECORD_CPU || args.record.is_some())
    };
    let options = [
        (env::FOLLOW, args.no_follow.then(|| "0".to_string())),
        (
            env::PASS_INVALID,
            args.pass_invalid_frees.then(|| "1".to_string()),
        ),
        (env::FREERES, args.no_freeres.then(|| "0".to_string())),
        (
            env::RELEASE_STACKS,
            args.no_release_stacks.then(|| "0".to_string()),
        ),
        (env::SCAN, args.no_scan.then(|| "0".to_string())),
        (
            env::SCAN_EVERY_MS,
            args.scan_every
                .map(|s| ((s * 1000.0).round() as u64).to_string()),
        ),
        (
            env::SCAN_BUDGET_PPM,
            args.scan_budget
                .map(|p| ((p * 10_000.0).round() as u64).to_string()),
        ),
        (
            env::PROFILE_HZ,
            args.profile
                .or_else(|| recorded(env::RECORD_CPU).then_some(DEFAULT_PROFILE_HZ))
                .map(|hz| hz.to_string()),
        ),
        (
            env::RECORD,
            args.record.as_ref().map(|_| {
                [env::RECORD_MEMORY, env::RECORD_LOCKS]
                    .into_iter()
                    .filter(|r| recorded(r))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        ),
        (
            env::CONTROL,
            (args.control || args.watch.is_some()).then(|| "1".to_string()),
        ),
        (env::SAMPLE_BYTES, args.sample.map(|b| b.to_string())),
        (env::PRODUCTION, args.production.then(|| "1".to_string())),
        (
            env::DIE_WITH,
            (!args.outlive).then(|| std::process::id().to_string()),
        ),
    ];
    for (name, value) in options {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    // An inherited SIG_IGN for SIGPIPE reaches the command through the
    // agent, since Rust's runtime and Command lose it (csrc/inherited_sigpipe.c).
    cmd.env_remove(INHERITED_SIGPIPE);
    if std::env::var_os(INHERITED_SIGPIPE).is_some_and(|v| v == "ignored") {
        cmd.env(env::IGNORE_SIGPIPE, "1");
    } else {
        cmd.env_remove(env::IGNORE_SIGPIPE);
    }
    cmd
}

/// Starts the command; a failure is said, with the exit status it means.
fn spawn(mut cmd: Command, program: &Path, output: &Path) -> Result<std::process::Child, ExitCode> {
    match cmd.spawn() {
        Ok(c) => Ok(c),
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::PermissionDenied {
                EXIT_NOT_EXECUTABLE
            } else {
                EXIT_CANNOT_RUN
            };
            // ENOEXEC: what a shell would run as a script (execve does not).
            let hint = if e.raw_os_error() == Some(libc::ENOEXEC) {
                format!(
                    " (neither a program nor a script with a #! line; to run it as a shell script: trapline run -- sh {})",
                    program.display()
                )
            } else {
                String::new()
            };
            // Nothing ran: the empty trace made to check the path goes too.
            let _ = std::fs::remove_file(output);
            Err(fail(
                code,
                format!("cannot run {}: {e}{hint}", program.display()),
            ))
        }
    }
}

/// Waits for the command; with a timeout, sends SIGTERM when it expires (and
/// SIGKILL after a grace period). Returns its status and whether it timed out.
fn wait_with_timeout(
    mut child: std::process::Child,
    pid: Pid,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<(std::process::ExitStatus, bool)> {
    let Some(timeout) = timeout else {
        return child.wait().map(|s| (s, false));
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let mut timed_out = false;
    let status = match rx.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            timed_out = true;
            eprintln!(
                "==trapline== timeout: the command ran for {} s; sending SIGTERM",
                timeout.as_secs_f64()
            );
            let _ = kill(pid, Signal::SIGTERM);
            match rx.recv_timeout(TERM_GRACE) {
                Ok(s) => s,
                Err(_) => {
                    eprintln!("==trapline== the command ignored SIGTERM; sending SIGKILL");
                    let _ = kill(pid, Signal::SIGKILL);
                    rx.recv()
                        .unwrap_or_else(|_| Err(std::io::Error::other("waiter thread lost")))
                }
            }
        }
    };
    let _ = waiter.join();
    status.map(|s| (s, timed_out))
}

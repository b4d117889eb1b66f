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

use crate::trace_names;

/// trapline could not run the command.
pub const EXIT_CANNOT_RUN: u8 = 125;
/// The command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// The command was stopped by `--timeout` (like timeout(1)).
pub const EXIT_TIMED_OUT: u8 = 124;
/// After SIGTERM at the timeout, how long the command may take to end before SIGKILL.
const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A byte count with an optional binary suffix: `4096`, `512K`, `1M`, `2G`.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("'{s}' is not a byte count (like 4096, 512K, 1M)")),
    };
    match digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_shl(shift))
    {
        Some(n) if n > 0 && n >> shift == digits.parse::<u64>().unwrap_or(0) => Ok(n),
        _ => Err(format!(
            "'{s}' is not a byte count of at least 1 (like 4096, 512K, 1M)"
        )),
    }
}

/// File name of the agent library.
pub const AGENT_FILE: &str = "libtrapline_agent.so";

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Trace file of the top process; other processes write PATH.<pid>.
    #[arg(short = 'o', long = "output", default_value = "trapline.trace")]
    pub output: PathBuf,
    /// Trace only the top process (its exec'd images too), not its children.
    #[arg(long)]
    pub no_follow: bool,
    /// Let the command run on if trapline itself is killed (by default the
    /// kernel sends it SIGKILL then: nothing runs on orphaned, recording).
    #[arg(long)]
    pub outlive: bool,
    /// Pass invalid and double frees on to the C library (which usually aborts)
    /// instead of skipping them as memcheck does.
    #[arg(long)]
    pub pass_invalid_frees: bool,
    /// Do not run the C library's freeres at exit (its own buffers then show as unfreed).
    #[arg(long)]
    pub no_freeres: bool,
    /// Record no call stack for releases (free, delete): about a third less
    /// overhead on allocation-heavy programs. Errors still get the stack of
    /// the bad call and the allocation stack; a double free's first-free
    /// stack is then unknown, and reports say so.
    #[arg(long)]
    pub no_release_stacks: bool,
    /// Sample every thread's CPU time with call stacks, HZ times per second of
    /// its CPU time (default 999); see `trapline profile`.
    #[arg(
        long,
        value_name = "HZ",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = DEFAULT_PROFILE_HZ_TEXT,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub profile: Option<u32>,
    /// What to record, comma-separated: `mem` (allocations and releases:
    /// leaks, allocation errors, heap), `locks` (locks, condition waits and
    /// joins: contention, deadlocks, misuse), `cpu` (CPU samples, as
    /// --profile). Default: mem,locks. The hooks of a recorder that is off
    /// pass every call straight on.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = [env::RECORD_MEMORY, env::RECORD_LOCKS, env::RECORD_CPU]
    )]
    pub record: Option<Vec<String>>,
    /// Sampled recording, for production: every allocation is still
    /// recorded (counts, bytes, errors and reachability stay exact), but
    /// only about one per BYTES allocated (default 512K, a Poisson process
    /// over bytes) takes its full call stack; the others record their
    /// caller only. Reports scale the sampled stacks to estimates with
    /// error bars. Releases take no stack (as --no-release-stacks).
    #[arg(
        long,
        value_name = "BYTES",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "512K",
        value_parser = parse_bytes
    )]
    pub sample: Option<u64>,
    /// Also judge every live block by reachability every SECS seconds while
    /// the program runs (each scan is a snapshot; see `trapline leaks --history`).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub scan_every: Option<f64>,
    /// The share of the run's wall time the periodic scans may pause the
    /// program, in percent (default 5): a scan due while their pauses came
    /// to more is deferred, and the trace says so.
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub scan_budget: Option<f64>,
    /// Do not scan for reachability at exit (leaks then shows blocks unfreed at exit, unjudged).
    #[arg(long)]
    pub no_scan: bool,
    /// Serve the control socket that `trapline watch PID` asks, while the
    /// program runs (in $XDG_RUNTIME_DIR/trapline, else /tmp/trapline-UID).
    #[arg(long)]
    pub control: bool,
    /// Also watch the program while it runs (implies --control): a
    /// `trapline watch` writes one JSON look every SECS seconds (default 1)
    /// to OUTPUT.watch.jsonl, and the summary names the sites judged
    /// growing or stale at its last look.
    #[arg(
        long,
        value_name = "SECS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1",
        value_parser = parse_seconds
    )]
    pub watch: Option<f64>,
    /// With --watch: a watched block untouched for SECS seconds is stale
    /// (`trapline watch --stale-after`).
    #[arg(long, value_name = "SECS", requires = "watch", value_parser = parse_seconds)]
    pub stale_after: Option<f64>,
    /// Stop the command with SIGTERM after SECS seconds (SIGKILL 10 s later if
    /// it is still running); the agent completes the trace on SIGTERM. For
    /// programs that may hang, e.g. in a deadlock. Exit status 124 then.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print no summary when the command ends.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Write the trace even where the output path is a file that is not a
    /// trapline trace, or a symbolic link (the link is replaced, not followed).
    #[arg(long)]
    pub force: bool,
    /// The command to run, and its arguments.
    #[arg(
        trailing_var_arg = true,
        required = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// A percentage above 0 and at most 100 (decimals allowed, down to 0.0001).
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0001..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a percentage from 0.0001 to 100")),
    }
}

/// A positive number of seconds (decimals allowed), at least a millisecond.
/// CPU samples per second of a thread's CPU time, when not given.
const DEFAULT_PROFILE_HZ: u32 = 999;
const DEFAULT_PROFILE_HZ_TEXT: &str = "999";

pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.001 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (at least 0.001)")),
    }
}

pub(crate) fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("trapline run: {msg}");
    ExitCode::from(code)
}

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

/// The warning about an allocator linked into the executable under names of
/// its own, repeated in the end-of-run summary.
static PRIVATE_ALLOCATOR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

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
    RUNTIMES.into_iter().find_map(|(sanitizer, runtime)| {
        dynstr
            .split(|&b| b == 0)
            .find(|name| name.starts_with(runtime.as_bytes()))
            .map(|name| (sanitizer, String::from_utf8_lossy(name).into_owned()))
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
                crate::EXIT_USAGE,
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
    let output = if args.output.is_absolute() {
        args.output.clone()
    } else {
        std::env::current_dir()
            .map(|d| d.join(&args.output))
            .unwrap_or_else(|_| args.output.clone())
    };
    match crate::trace_output::prepare(&output, &args.command, args.force) {
        Err(e) => return fail(EXIT_CANNOT_RUN, e),
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
            eprintln!(
                "trapline run: the previous run's trace{} moved aside: {}{deleted}",
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            );
        }
        Ok(_) => {}
    }

    if is_static {
        return crate::run_static::main(&args, &program, &output);
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload_value(&agent))
        .env(env::OUTPUT, &output)
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

    let signals = match signal_forwarding() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // What the kernel's OOM killer had done before the command ran: a
    // SIGKILL it sends while the command runs is then named as its.
    let _ = OOM_KILLS_AT_START.set(OomKills::now());
    let child = match cmd.spawn() {
        Ok(c) => c,
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
            let _ = std::fs::remove_file(&output);
            return fail(code, format!("cannot run {}: {e}{hint}", program.display()));
        }
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
    if !args.quiet {
        let last_image = summarize(
            &output,
            &program,
            child_pid.as_raw() as u32,
            status.signal(),
        );
        if timed_out {
            eprintln!(
                "==trapline== stopped by --timeout: if it hung on a lock, see: trapline deadlocks {}",
                last_image.display()
            );
        }
        if let Some(w) = watched {
            for line in w {
                eprintln!("==trapline== {line}");
            }
        }
    }
    ExitCode::from(code)
}

/// Signals sent to trapline while the command runs.
pub(crate) struct Forwarding {
    signals: signal_hook::iterator::Signals,
}

/// The signals meant for the command, caught before it starts.
pub(crate) fn signal_forwarding() -> Result<Forwarding, ExitCode> {
    // While the command runs, signals meant for it must not kill trapline
    // first: a terminal's SIGINT/SIGQUIT reach the whole process group anyway;
    // SIGTERM, SIGHUP and the user signals sent to trapline are passed on.
    let swallowed = [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT];
    // A signal trapline was started with ignored stays ignored, so that the
    // command inherits it ignored as it would natively (`nohup`; a shell's
    // background job ignores SIGINT and SIGQUIT): a handler here would
    // become SIG_DFL in the command at exec, and `nohup trapline run --
    // server` died of the SIGHUP it was meant to survive.
    let ignored = ignored_signals();
    let caught: Vec<i32> = FORWARDED
        .iter()
        .chain(swallowed.iter())
        .copied()
        .filter(|&sig| ignored & (1 << (sig - 1)) == 0)
        .collect();
    signal_hook::iterator::Signals::new(&caught)
        .map(|signals| Forwarding { signals })
        .map_err(|e| {
            fail(
                EXIT_CANNOT_RUN,
                format!("cannot set up signal forwarding: {e}"),
            )
        })
}

/// SIGTERM, SIGHUP and the user signals trapline gets go on to the command
/// `child` (SIGINT and SIGQUIT are swallowed: a terminal sends them to the
/// whole process group anyway). Close the handle, then join the thread.
pub(crate) fn forward_signals(
    mut f: Forwarding,
    child: Pid,
) -> (signal_hook::iterator::Handle, std::thread::JoinHandle<()>) {
    let handle = f.signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in f.signals.forever() {
            if FORWARDED.contains(&sig) {
                if let Ok(s) = Signal::try_from(sig) {
                    let _ = kill(child, s);
                }
            }
        }
    });
    (handle, forwarder)
}

const FORWARDED: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGUSR1,
    signal_hook::consts::SIGUSR2,
];

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

/// The short report printed when the command ends: about the command's
/// process as it ended (its last image, when it replaced itself with exec),
/// then the other processes added up. `top_pid`: the command's process;
/// The signals a crash ends a program with (a fault, `abort`): the agent
/// records where it struck and judges the heap (lifecycle.rs).
const CRASH_SIGNALS: [i32; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];

/// `killed_by`: the signal that ended it, if one did. Returns the trace of
/// that last image.
pub(crate) fn summarize(
    output: &Path,
    program: &Path,
    top_pid: u32,
    killed_by: Option<i32>,
) -> PathBuf {
    let mut files = vec![output.to_path_buf()];
    files.extend(trace_names::family_files(output));
    let empty = std::fs::metadata(output)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    eprintln!(
        "==trapline== traces written: {}",
        files.len() - usize::from(empty)
    );
    // Every file is read once, for the list and the summaries both.
    let summaries: Vec<Option<ReadSummary>> = files
        .iter()
        .map(|f| {
            if f == output && empty {
                None
            } else {
                read_summary(f)
            }
        })
        .collect();
    let mut unlisted = 0usize;
    for (i, (f, summary)) in files.iter().zip(&summaries).enumerate() {
        if f == output && empty {
            continue;
        }
        // The top process's summary below says so; other processes here.
        let allocators = summary
            .as_ref()
            .and_then(|s| s.as_ref().ok())
            .filter(|_| f != output)
            .map(|s| s.allocators.clone())
            .unwrap_or_default();
        // A long tree (a build, a shell loop) lists its first traces only,
        // and after them those that warn.
        let listed = i < TRACES_LISTED;
        match (allocators.shadowed_by, allocators.library) {
            (Some(module), _) => eprintln!(
                "==trapline==   {} (WARNING: its allocator of its own, in {module}, is not traced)",
                f.display()
            ),
            (None, Some(library)) if listed => {
                eprintln!("==trapline==   {} (allocator: {library})", f.display())
            }
            _ if listed => eprintln!("==trapline==   {}", f.display()),
            _ => unlisted += 1,
        }
    }
    if unlisted > 0 {
        eprintln!(
            "==trapline==   ... and {} more, named {}.<pid>",
            th(unlisted as u64),
            output.display()
        );
    }
    if empty {
        let not_loaded = "the agent was not loaded into it (a static, setuid, 32-bit or musl program started by a script? a program that clears LD_PRELOAD?)";
        match killed_by {
            // SIGKILL, or a crash the agent's handler could not run for
            // (a stack overflow without an alternate stack), before the
            // first chunk was written.
            Some(signal) => eprintln!(
                "==trapline== warning: {} wrote no trace: it was killed by signal {signal} before the agent wrote anything, or {not_loaded}",
                program.display()
            ),
            None => eprintln!(
                "==trapline== warning: {} wrote no trace: {not_loaded}",
                program.display()
            ),
        }
        return output.to_path_buf();
    }
    let images = top_images(output, top_pid, &files, &summaries);
    let last = *images.last().unwrap_or(&0);
    let last_trace = &files[last];
    if images.len() > 1 {
        eprintln!(
            "==trapline== the command replaced itself with exec {}: {}; below, its last image ({})",
            if images.len() == 2 {
                "once".to_string()
            } else {
                format!("{} times", images.len() - 1)
            },
            image_names(&images, &summaries),
            last_trace.display()
        );
    }
    let mut summaries = summaries;
    let mut last_calls = None;
    match summaries[last].take() {
        Some(Ok(s)) => {
            last_calls = Some(s.allocation_calls);
            print_summary(&s);
            let exec_untraced = s.process.exit.is_some_and(|e| e.exec);
            if exec_untraced {
                eprintln!("==trapline== {EXEC_UNTRACED}");
            }
            if s.events_lost.is_none() {
                match killed_by {
                    Some(signal) => eprintln!("==trapline== {}", unflushed_death(signal)),
                    None => eprintln!("==trapline== {UNFLUSHED_EXIT}"),
                }
            } else if let Some(signal) = killed_by.filter(|s| CRASH_SIGNALS.contains(s)) {
                eprintln!(
                    "==trapline== CRASH: the program died of {}: where it struck, and the heap as it left it: trapline leaks {}",
                    trapline_analysis::report::signal_name(signal as u32),
                    last_trace.display()
                );
            }
        }
        Some(Err(e)) => eprintln!("==trapline== cannot read {}: {e}", last_trace.display()),
        None => {}
    }
    let (others, others_summaries): (Vec<PathBuf>, Vec<Option<ReadSummary>>) = files
        .iter()
        .zip(summaries)
        .enumerate()
        .filter(|(i, _)| *i != last)
        .map(|(_, (f, s))| (f.clone(), s))
        .unzip();
    let others_are = if images.len() > 1 {
        "other processes and earlier images"
    } else {
        "other processes"
    };
    let busiest = summarize_others(output, others_are, &others, others_summaries.into_iter());
    // A driver (g++, make, a shell) makes few allocation calls; the other
    // processes that carry the work (ten times the command's own calls, and
    // a thousand at least) are named first. The command's earlier images
    // are the command.
    let mine = last_calls.unwrap_or(0);
    let working: Vec<&Busy> = busiest
        .iter()
        .filter(|b| b.calls >= WORK_CALLS_AT_LEAST.max(mine.saturating_mul(10)))
        .filter(|b| !images.iter().any(|&i| files[i] == b.path))
        .collect();
    if working.is_empty() {
        eprintln!("==trapline== see: trapline leaks {}", last_trace.display());
    } else {
        let named: Vec<String> = working
            .iter()
            .map(|b| {
                format!(
                    "{} ({}, {} allocation calls)",
                    b.path.display(),
                    b.name,
                    th(b.calls)
                )
            })
            .collect();
        eprintln!(
            "==trapline== most of the work is in other processes: {}",
            named.join(", ")
        );
        eprintln!(
            "==trapline== see: trapline leaks {}",
            working[0].path.display()
        );
        eprintln!(
            "==trapline==      trapline leaks {} (the command's own, {} allocation calls)",
            last_trace.display(),
            th(mine)
        );
    }
    last_trace.clone()
}

/// A trace of another process with many allocation calls.
struct Busy {
    path: PathBuf,
    /// Its executable's file name.
    name: String,
    calls: u64,
}

/// Traces of other processes named as the ones that carry the work.
const BUSIEST_NAMED: usize = 3;
/// Allocation calls another process must make to be named as the work.
const WORK_CALLS_AT_LEAST: u64 = 1000;

/// The exec'd image after the last trace was not traced.
const EXEC_UNTRACED: &str = "the process then replaced itself with a program the agent \
     could not enter (a static, setuid, 32-bit or musl program, or one that clears LD_PRELOAD): the \
     exit status is that program's";

/// The command's process, image by image: indexes into `files` of its
/// first trace (`output`), then of each image it exec'd, which writes
/// `output.<pid>`, then `output.<pid>.1`, ... (a failed exec goes on in a
/// new file too). Follows the chain while each trace ends with an exec.
fn top_images(
    output: &Path,
    top_pid: u32,
    files: &[PathBuf],
    summaries: &[Option<ReadSummary>],
) -> Vec<usize> {
    let mut images = vec![0];
    for generation in 0.. {
        let current = images[images.len() - 1];
        let exec = matches!(
            &summaries[current],
            Some(Ok(s)) if s.process.exit.is_some_and(|e| e.exec)
        );
        if !exec {
            break;
        }
        let next = trace_names::image_trace(output, top_pid, generation);
        match files.iter().position(|f| *f == next) {
            Some(i) => images.push(i),
            None => break,
        }
    }
    images
}

/// "env, bash, python3.11": the images' executables, by file name (the
/// first and last three of a longer chain).
fn image_names(images: &[usize], summaries: &[Option<ReadSummary>]) -> String {
    let name = |i: &usize| match &summaries[*i] {
        Some(Ok(s)) => s
            .process
            .executable
            .as_deref()
            .map(|e| e.rsplit('/').next().unwrap_or(e).to_string())
            .unwrap_or_else(|| "?".to_string()),
        _ => "?".to_string(),
    };
    if images.len() <= 6 {
        images.iter().map(name).collect::<Vec<_>>().join(", ")
    } else {
        let first: Vec<_> = images[..3].iter().map(name).collect();
        let last: Vec<_> = images[images.len() - 3..].iter().map(name).collect();
        format!("{}, ..., {}", first.join(", "), last.join(", "))
    }
}

/// A trace file's summary, or why it could not be read.
type ReadSummary = Result<trapline_analysis::stats::RunSummary, trapline_trace::TraceError>;

/// The summary of one trace file: the agent's own totals, from the end of
/// the file, when it could keep them exactly; otherwise a replay of the
/// whole trace. None if the file cannot be opened.
fn read_summary(path: &Path) -> Option<ReadSummary> {
    let mut file = std::fs::File::open(path).ok()?;
    Some(
        match trapline_analysis::stats::summary_from_tail(&mut file) {
            Ok(Some(s)) => Ok(s),
            _ => {
                // A replay reads every event: say why trapline has not returned yet.
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if len >= SLOW_SUMMARY_BYTES {
                    eprintln!(
                        "==trapline== reading {} MB of {} for the summary (-q skips this)...",
                        th(len >> 20),
                        path.display()
                    );
                }
                trapline_analysis::stats::analyze_totals(&mut file)
                    .map(|s| trapline_analysis::stats::RunSummary::from_stats(&s))
            }
        },
    )
}

/// Trace files listed by name before the summary.
const TRACES_LISTED: usize = 20;

/// Traces of other processes listed one by one when they need a look.
const OTHERS_LISTED: usize = 10;

/// The totals of the other processes' traces (children, exec'd images), and
/// which of them hold errors or lost events: the top process's summary
/// alone said "errors found: 0" for a tree whose child double-freed. Their
/// unfreed blocks are not added up: a fork child that execs lists the heap
/// it inherited, and a shell's children would sum to many times its heap.
/// Returns the traces with the most allocation calls, most first.
fn summarize_others(
    output: &Path,
    others_are: &str,
    others: &[PathBuf],
    summaries: impl Iterator<Item = Option<ReadSummary>>,
) -> Vec<Busy> {
    let mut busiest: Vec<Busy> = Vec::new();
    if others.is_empty() {
        return busiest;
    }
    let (mut calls, mut errors, mut lost, mut unfinished) = (0u64, 0u64, 0u64, 0usize);
    let mut running = 0usize;
    let mut failed = 0u64;
    let mut notable = Vec::new();
    for (path, summary) in others.iter().zip(summaries) {
        let s = match summary {
            Some(Ok(s)) => s,
            // A process that has just started may not have written its
            // first chunk yet.
            Some(Err(_)) if trace_names::pid_in_name(output, path).is_some_and(is_alive) => {
                running += 1;
                notable.push(format!("{}: {STILL_RUNNING}", path.display()));
                continue;
            }
            Some(Err(e)) => {
                notable.push(format!("{}: cannot read it: {e}", path.display()));
                continue;
            }
            None => continue,
        };
        calls += s.allocation_calls;
        busiest.push(Busy {
            path: path.clone(),
            name: s
                .process
                .executable
                .as_deref()
                .map(|e| e.rsplit('/').next().unwrap_or(e).to_string())
                .unwrap_or_else(|| "?".to_string()),
            calls: s.allocation_calls,
        });
        busiest.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.path.cmp(&b.path)));
        busiest.truncate(BUSIEST_NAMED);
        errors += s.errors;
        failed += s.failed_allocations;
        // A process that outlived the command (a daemon, Python's
        // resource tracker) is still writing its trace.
        // The pid from the file's name when its first chunk is not written
        // yet (a child that has just started).
        let pid = s
            .process
            .pid
            .or_else(|| trace_names::pid_in_name(output, path));
        let still_running = s.events_lost.is_none() && pid.is_some_and(is_alive);
        match s.events_lost {
            Some(n) => lost += n,
            None if still_running => running += 1,
            None => unfinished += 1,
        }
        let mut what = Vec::new();
        if s.errors > 0 {
            what.push(counted(s.errors, "error"));
        }
        if s.failed_allocations > 0 {
            what.push(counted(s.failed_allocations, "failed allocation call"));
        }
        match s.events_lost {
            Some(0) => {}
            Some(n) => what.push(format!("{} lost", counted(n, "event"))),
            None if still_running => what.push(STILL_RUNNING.to_string()),
            None => what.push("no end record".to_string()),
        }
        if !what.is_empty() {
            notable.push(format!("{}: {}", path.display(), what.join(", ")));
        }
    }
    let unfinished = match (running, unfinished) {
        (0, 0) => String::new(),
        (0, u) => format!(" ({u} without an end record)"),
        (r, 0) => format!(" ({r} still running)"),
        (r, u) => format!(" ({r} still running, {u} without an end record)"),
    };
    let failed = if failed > 0 {
        format!(", failed allocation calls: {}", th(failed))
    } else {
        String::new()
    };
    eprintln!(
        "==trapline== {others_are} ({}): {} allocation calls, errors found: {}{failed}, events lost: {}{unfinished}",
        counted(others.len() as u64, "trace"),
        th(calls),
        th(errors),
        th(lost)
    );
    for line in notable.iter().take(OTHERS_LISTED) {
        eprintln!("==trapline==   {line}");
    }
    if notable.len() > OTHERS_LISTED {
        eprintln!(
            "==trapline==   ... and {} more with errors, failed allocations or lost events",
            counted((notable.len() - OTHERS_LISTED) as u64, "trace")
        );
    }
    busiest
}

const STILL_RUNNING: &str =
    "still running: it outlived the command, and its trace grows until it ends";

/// Set before `main` by the C constructor of `csrc/inherited_sigpipe.c`:
/// "ignored" when trapline was started with SIGPIPE ignored.
const INHERITED_SIGPIPE: &str = "TRAPLINE_INHERITED_SIGPIPE";

/// The signals this process ignores (bit N-1 for signal N), from
/// `/proc/self/status`: what it inherited, except SIGPIPE, which Rust's
/// runtime ignores before `main` (and resets to the default for the
/// command it spawns; `INHERITED_SIGPIPE` says what it was).
fn ignored_signals() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Whether process `pid` runs: it exists and is no zombie (it may be
/// another process that got the pid since, which only makes a trace
/// without end record "still running").
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the command may hold ')', the state follows the last.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Why a trace has no end record although the program exited.
const UNFLUSHED_EXIT: &str = "the program exited, yet its trace has no end record: its exit \
     went past the agent (the exit_group system call made directly, or a vfork child that \
     called exit()), or the agent could not write its last chunks (its message above says \
     why); what it did since the agent's last flush (at most about 200 ms) is missing";

/// What the kernel's OOM killer has done: in the memory cgroup that
/// trapline and the command share (which names the limit), and system-wide
/// (`oom_kill` of `/proc/vmstat`, Linux 4.13, which counts a cgroup's kills
/// too).
struct OomKills {
    group: Option<(trapline_memlimits::Group, u64)>,
    system: Option<u64>,
}

impl OomKills {
    fn now() -> OomKills {
        let group = trapline_memlimits::Group::of_this_process()
            .and_then(|g| g.oom_kills().map(|n| (g, n)));
        OomKills {
            group,
            system: trapline_memlimits::system_oom_kills(),
        }
    }
}

static OOM_KILLS_AT_START: std::sync::OnceLock<OomKills> = std::sync::OnceLock::new();

/// Why a SIGKILL came, when the OOM killer ended processes while the
/// command ran: the cgroup's, with its limit, when its count rose (then
/// it was the command or another process of the group), else the system's
/// (most likely the command: it is the one that grew).
fn oom_kill_note() -> Option<String> {
    let before = OOM_KILLS_AT_START.get()?;
    let agent = "Under trapline a program also holds the agent's table (about 26 bytes per \
                 live block) and its buffers";
    if let Some((group, n)) = &before.group {
        if group.oom_kills().is_some_and(|now| now > *n) {
            let limit = group
                .limit()
                .map(|l| format!(" of {} MiB", l >> 20))
                .unwrap_or_default();
            return Some(format!(
                "the OOM killer of the memory cgroup {} (limit{limit}) ended a process of the \
                 group while the command ran: the command reached the group's limit. {agent}",
                group.path
            ));
        }
    }
    let killed = trapline_memlimits::system_oom_kills()?
        .checked_sub(before.system?)
        .filter(|&n| n > 0)?;
    let processes = if killed == 1 {
        "a process".to_string()
    } else {
        format!("{killed} processes")
    };
    Some(format!(
        "the kernel's OOM killer ended {processes} while the command ran (/proc/vmstat), most \
         likely this one: its memory cgroup or the system ran out of memory. {agent}"
    ))
}

/// Why a trace has no end record although the program died of `signal`,
/// which the agent's handler normally records before it lets the program die.
fn unflushed_death(signal: i32) -> String {
    let name = Signal::try_from(signal).map_or("a signal", |s| s.as_str());
    let why = match Signal::try_from(signal) {
        Ok(Signal::SIGKILL) => match oom_kill_note() {
            Some(note) => format!("SIGKILL cannot be caught; {note}"),
            None => "SIGKILL cannot be caught".to_string(),
        },
        Ok(Signal::SIGSEGV | Signal::SIGBUS) => {
            "perhaps a stack overflow on an alternate signal stack of the program's own too \
             small for the agent's handler, or a handler of the program's that ended it"
                .to_string()
        }
        _ => format!("the program handled {name} itself, or the agent's handler could not run"),
    };
    format!(
        "the program died of signal {signal} ({name}) before the agent could finish the trace: \
         {why}; what it did since the agent's last flush (at most about 200 ms) is missing"
    )
}

/// Trace size from which a summary replay takes long enough (about a second)
/// to be announced.
const SLOW_SUMMARY_BYTES: u64 = 32 << 20;

fn th(n: u64) -> String {
    trapline_analysis::report::thousands(n)
}

/// "1 trace", "2 traces".
fn counted(n: u64, noun: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{} {noun}{s}", th(n))
}

/// The summary lines after the trace names.
fn print_summary(s: &trapline_analysis::stats::RunSummary) {
    eprintln!(
        "==trapline== allocation calls: {} ({} releases)",
        th(s.allocation_calls),
        th(s.release_calls)
    );
    eprintln!(
        "==trapline== peak heap: {} bytes at {:.3} s",
        th(s.peak_heap_bytes),
        trapline_analysis::report::seconds(s.peak_heap_time_ns)
    );
    // The exit snapshot is the agent's own table at exit; a replay of the
    // events misses what the process did not allocate itself (a fork child's
    // inherited blocks) and what ran after the last chunk.
    let (bytes, blocks) = (th(s.unfreed.bytes), th(s.unfreed.blocks));
    if s.unfreed_replayed {
        eprintln!("==trapline== unfreed at end of trace: {bytes} bytes in {blocks} blocks (replayed: the process did not finish)");
    } else {
        eprintln!("==trapline== unfreed at exit: {bytes} bytes in {blocks} blocks");
    }
    eprintln!("==trapline== errors found: {}", th(s.errors));
    if s.failed_allocations > 0 {
        eprintln!(
            "==trapline== failed allocation calls: {} (out of memory? `trapline leaks` lists where)",
            th(s.failed_allocations)
        );
    }
    match s.events_lost {
        Some(n) => eprintln!("==trapline== events lost: {}", th(n)),
        None => eprintln!("==trapline== events lost: unknown (the trace has no end record)"),
    }
    for w in &s.warnings {
        eprintln!("==trapline== {w}");
    }
    if let Some(w) = PRIVATE_ALLOCATOR.get() {
        eprintln!("==trapline== {w}");
    }
}

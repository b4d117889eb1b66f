//! `trapline run`'s arguments, exit codes and value parsers: what `run`,
//! `run_static`, `watch` and `vm` share, below them all.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use trapline_contract::env;

/// trapline could not run the command.
pub const EXIT_CANNOT_RUN: u8 = 125;
/// The command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// The command was stopped by `--timeout` (like timeout(1)).
pub const EXIT_TIMED_OUT: u8 = 124;

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
    /// Sampled recording, for staging and CI (for a service, use
    /// --production): every allocation is still recorded (counts, bytes,
    /// errors and reachability stay exact), but
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
    /// Production mode, to leave on in a service: only about one
    /// allocation per 512K allocated (or per --sample=BYTES) is recorded,
    /// with its full stack and its release; every other call is only
    /// counted, by function. Reports estimate the heap by stack with 95%
    /// intervals; double frees are found for the sampled blocks only.
    /// Locks: contended waits and each thread's first acquisition at a new
    /// pair of lock sites are recorded, enough for `deadlocks`; an
    /// uncontended lock writes nothing. At exit (unless --no-scan), a scan
    /// of all memory finds the sampled blocks nothing points to.
    #[arg(long, conflicts_with_all = ["record", "scan_every", "no_release_stacks"])]
    pub production: bool,
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
    /// Exit with status N when the run leaked (a definitely or possibly lost
    /// block, not suppressed), had an allocation error, lock misuse or a
    /// deadlock (actual or potential), in any of its processes; otherwise
    /// with the command's status, as memcheck's --error-exitcode.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub error_exitcode: Option<u8>,
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

/// CPU samples per second of a thread's CPU time, when not given.
pub(crate) const DEFAULT_PROFILE_HZ: u32 = 999;
pub const DEFAULT_PROFILE_HZ_TEXT: &str = "999";

/// A positive number of seconds (decimals allowed), at least a millisecond.
pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.001 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (at least 0.001)")),
    }
}

/// `trapline run`'s failure: its message, and exit status `code`.
pub(crate) fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("trapline run: {msg}");
    ExitCode::from(code)
}

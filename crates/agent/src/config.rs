//! The agent's options: read once, from the environment, in the
//! constructor (`read_from_environment`), and from then on read from here
//! by every layer. The variable names are the CLI's and the agent's
//! contract (trapline-contract's `env`).
//!
//! One struct of atomics rather than plain values: the hot paths read a
//! flag or two per event, which costs one relaxed load as before, and a
//! program thread that predates the constructor (a preloaded library's
//! own) never reads a torn value.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::RwLock;
use trapline_contract::env;

/// A knob of the agent's own, not set by `trapline run`: `0` turns the
/// unwind-rule table off (framehop unwinds every frame, to compare the two
/// on a suspect stack).
pub const ENV_RULE_TABLE: &str = "TRAPLINE_RULE_TABLE";
/// `1`: print how long each phase of a scan took.
const ENV_SCAN_TIMES: &str = "TRAPLINE_SCAN_TIMES";
/// `0`: scan without checking the room first (scan/headroom.rs): for a user
/// who knows the estimate errs high, and for the tests of the fallible
/// allocations behind it.
const ENV_SCAN_CHECK: &str = "TRAPLINE_SCAN_CHECK";

/// 5%: a periodic scan is deferred while the pauses of those before it came
/// to more than this share of the time since the process started.
const DEFAULT_SCAN_BUDGET_PPM: u64 = 50_000;
/// The highest sampling rate accepted (`TRAPLINE_PROFILE`).
pub const MAX_PROFILE_HZ: u32 = 100_000;
/// `profile_hz` when the variable was set to something that is no rate.
pub const PROFILE_HZ_INVALID: u32 = u32::MAX;

pub struct Options {
    /// This process is the one `trapline run` started (not a descendant).
    pub top: AtomicBool,
    /// Trace the program's children and exec'd images too.
    pub follow: AtomicBool,
    /// Run the C and C++ runtimes' freeres at exit (`--no-freeres` clears it).
    pub freeres: AtomicBool,
    /// Capture a call stack for every release (`--no-release-stacks`
    /// clears it: then only releases that are errors get one).
    pub release_stacks: AtomicBool,
    /// Pass invalid and double frees on to the C library
    /// (`--pass-invalid-frees`).
    pub pass_invalid: AtomicBool,
    /// Use the unwind-rule table (`ENV_RULE_TABLE`).
    pub rule_table: AtomicBool,
    /// The program inherited SIGPIPE ignored (the CLI restores it).
    pub ignore_sigpipe: AtomicBool,
    /// CPU samples per second (0: off; `PROFILE_HZ_INVALID`: asked for,
    /// but not a rate in 1..=MAX_PROFILE_HZ).
    pub profile_hz: AtomicU32,
    /// `--scan-every` in milliseconds (0: no periodic scan).
    pub scan_every_ms: AtomicU64,
    /// `--scan-budget` in parts per million of the run's time.
    pub scan_budget_ppm: AtomicU64,
    /// A reachability scan at exit (`--no-scan` clears it).
    pub scan_at_exit: AtomicBool,
    /// Print each scan's phase times (`ENV_SCAN_TIMES`).
    pub scan_times: AtomicBool,
    /// Check there is room for a scan before one (`ENV_SCAN_CHECK`).
    pub scan_check_room: AtomicBool,
    /// Serve the control socket (`--control`, `--watch`).
    pub control: AtomicBool,
    /// Record allocations and releases (`--record` with `mem`; off, the
    /// allocation hooks pass every call straight on).
    pub record_memory: AtomicBool,
    /// Record locks, condition waits and joins (`--record` with `locks`).
    pub record_locks: AtomicBool,
    /// Sampled recording: the mean bytes between allocations that take a
    /// full stack (0: every allocation does).
    pub sample_bytes: AtomicU64,
    /// Production mode (`env::PRODUCTION`): an unsampled allocation is
    /// only counted; sampled blocks alone are in the table and the trace.
    pub production: AtomicBool,
    /// Production mode with locks recorded (one load at every lock hook).
    pub production_locks: AtomicBool,
    /// The samplers' seed (`env::SAMPLE_SEED`; 0: from the clock).
    pub sample_seed: AtomicU64,
    /// The agent was attached to a running process (`trapline attach`):
    /// releases of blocks it never saw are the program's earlier blocks,
    /// passed on and counted, not errors.
    pub attached: AtomicBool,
    /// Blocks the agent never saw may be released: the program's blocks
    /// from before an attach, or those an allocator in the executable
    /// handed out before it was detoured. Their releases are passed on and
    /// counted, not errors (a block released lately is still a double free).
    pub blocks_predate: AtomicBool,
}

pub static OPTIONS: Options = Options {
    top: AtomicBool::new(false),
    follow: AtomicBool::new(true),
    freeres: AtomicBool::new(true),
    release_stacks: AtomicBool::new(true),
    pass_invalid: AtomicBool::new(false),
    rule_table: AtomicBool::new(true),
    ignore_sigpipe: AtomicBool::new(false),
    profile_hz: AtomicU32::new(0),
    scan_every_ms: AtomicU64::new(0),
    scan_budget_ppm: AtomicU64::new(DEFAULT_SCAN_BUDGET_PPM),
    scan_at_exit: AtomicBool::new(true),
    scan_times: AtomicBool::new(false),
    scan_check_room: AtomicBool::new(true),
    control: AtomicBool::new(false),
    record_memory: AtomicBool::new(true),
    record_locks: AtomicBool::new(true),
    sample_bytes: AtomicU64::new(0),
    production: AtomicBool::new(false),
    production_locks: AtomicBool::new(false),
    sample_seed: AtomicU64::new(0),
    attached: AtomicBool::new(false),
    blocks_predate: AtomicBool::new(false),
};

/// The trace's path (`TRAPLINE_OUTPUT`, else `trapline-PID.trace`). Set
/// again by an attach after a failed one (the strings are leaked: a few,
/// ever).
static OUTPUT: RwLock<Option<&'static str>> = RwLock::new(None);

/// The file this process image writes its trace into, once open.
static TRACE_PATH: RwLock<Option<&'static str>> = RwLock::new(None);

/// Notes the file this image's trace went into (a fork child's is named
/// after the top's).
pub fn set_trace_path(path: String) {
    store(&TRACE_PATH, Some(path));
}

/// The file this image's trace is written into (what `watch` reads).
pub fn trace_path() -> Option<&'static str> {
    load(&TRACE_PATH)
}

/// The control socket's directory, when the CLI named it (attach).
static CONTROL_DIR: RwLock<Option<&'static str>> = RwLock::new(None);

fn store(at: &RwLock<Option<&'static str>>, value: Option<String>) {
    let value = value.map(|v| &*Box::leak(v.into_boxed_str()));
    *at.write().unwrap_or_else(|e| e.into_inner()) = value;
}

fn load(at: &RwLock<Option<&'static str>>) -> Option<&'static str> {
    *at.read().unwrap_or_else(|e| e.into_inner())
}

/// Reads every option from the environment (the constructor; `pid` names
/// a trace whose path was not given).
pub fn read_from_environment(pid: u32) {
    read_from(
        |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()),
        pid,
    );
}

/// Reads every option from `NAME=value` lines, the environment's names:
/// what `trapline attach` hands the agent it loads.
pub fn read_from_lines(lines: &str, pid: u32) {
    read_from(
        |name| {
            lines
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        },
        pid,
    );
    let dir = lines
        .lines()
        .find_map(|l| l.strip_prefix(env::CONTROL_DIR)?.strip_prefix('='));
    store(&CONTROL_DIR, dir.map(str::to_owned));
}

/// The control socket's directory the CLI named, if it did.
pub fn control_dir() -> Option<&'static str> {
    load(&CONTROL_DIR)
}

fn read_from(var: impl Fn(&str) -> Option<String>, pid: u32) {
    let o = &OPTIONS;
    let is = |name: &str, value: &str| var(name).as_deref() == Some(value);
    let set = |flag: &AtomicBool, on: bool| flag.store(on, Ordering::Relaxed);
    set(&o.top, is(env::ROLE, env::ROLE_TOP));
    set(&o.follow, !is(env::FOLLOW, "0"));
    set(&o.freeres, !is(env::FREERES, "0"));
    set(&o.release_stacks, !is(env::RELEASE_STACKS, "0"));
    set(&o.pass_invalid, is(env::PASS_INVALID, "1"));
    set(&o.rule_table, !is(ENV_RULE_TABLE, "0"));
    set(&o.ignore_sigpipe, is(env::IGNORE_SIGPIPE, "1"));
    if let Some(v) = var(env::PROFILE_HZ) {
        let hz = match v.parse::<u32>() {
            Ok(hz) if (1..=MAX_PROFILE_HZ).contains(&hz) => hz,
            _ => PROFILE_HZ_INVALID,
        };
        o.profile_hz.store(hz, Ordering::Relaxed);
    }
    if let Some(ms) = var(env::SCAN_EVERY_MS).and_then(|v| v.parse().ok()) {
        o.scan_every_ms.store(ms, Ordering::Relaxed);
    }
    if let Some(ppm) = var(env::SCAN_BUDGET_PPM).and_then(|v| v.parse().ok()) {
        o.scan_budget_ppm.store(ppm, Ordering::Relaxed);
    }
    set(&o.scan_at_exit, !is(env::SCAN, "0"));
    set(&o.scan_times, is(ENV_SCAN_TIMES, "1"));
    set(&o.scan_check_room, !is(ENV_SCAN_CHECK, "0"));
    set(&o.control, is(env::CONTROL, "1"));
    if let Some(list) = var(env::RECORD) {
        let on = |name: &str| list.split(',').any(|r| r.trim() == name);
        set(&o.record_memory, on(env::RECORD_MEMORY));
        set(&o.record_locks, on(env::RECORD_LOCKS));
    }
    if let Some(n) = var(env::SAMPLE_BYTES).and_then(|v| v.parse::<u64>().ok()) {
        o.sample_bytes.store(n, Ordering::Relaxed);
        if n != 0 {
            // A release's stack would cost what sampling saves; erroneous
            // releases still get theirs.
            set(&o.release_stacks, false);
        }
    }
    if let Some(seed) = var(env::SAMPLE_SEED).and_then(|v| v.parse::<u64>().ok()) {
        o.sample_seed.store(seed, Ordering::Relaxed);
    }
    let production = is(env::PRODUCTION, "1");
    set(&o.production, production);
    if production {
        if o.sample_bytes.load(Ordering::Relaxed) == 0 {
            o.sample_bytes
                .store(env::DEFAULT_SAMPLE_BYTES, Ordering::Relaxed);
        }
        set(&o.release_stacks, false);
        // The table holds the sampled blocks only: the exit scan reads all
        // of memory instead of the table's blocks (scan/everything.rs), as
        // a scan asked for on the control socket does; none periodically
        // (the CLI refuses `--scan-every`).
        o.scan_every_ms.store(0, Ordering::Relaxed);
        // Releases of blocks not in the table are the unsampled blocks'.
        set(&o.blocks_predate, true);
    }
    if !flag(&o.record_memory) {
        // Nothing for production mode to sample.
        set(&o.production, false);
        // No live table to judge.
        set(&o.scan_at_exit, false);
        o.scan_every_ms.store(0, Ordering::Relaxed);
    }
    let production_locks = flag(&o.production) && flag(&o.record_locks);
    set(&o.production_locks, production_locks);
    store(
        &OUTPUT,
        Some(var(env::OUTPUT).unwrap_or_else(|| format!("trapline-{pid}.trace"))),
    );
}

/// The trace's path, once read.
pub fn output() -> Option<&'static str> {
    load(&OUTPUT)
}

#[inline]
pub fn flag(f: &AtomicBool) -> bool {
    f.load(Ordering::Relaxed)
}

/// Whether allocations are recorded (one load: the allocation hooks ask
/// at every call).
#[inline(always)]
pub fn memory_recorded() -> bool {
    OPTIONS.record_memory.load(Ordering::Relaxed)
}

/// Whether locks are recorded (one load, at every lock hook).
#[inline(always)]
pub fn locks_recorded() -> bool {
    OPTIONS.record_locks.load(Ordering::Relaxed)
}

/// Whether production mode is on (one load, at every allocation).
#[inline(always)]
pub fn production() -> bool {
    OPTIONS.production.load(Ordering::Relaxed)
}

/// Whether production mode records locks (one load, at every lock hook).
#[inline(always)]
pub fn production_locks() -> bool {
    OPTIONS.production_locks.load(Ordering::Relaxed)
}

/// The mean bytes between sampled allocations (0: not sampling; one load,
/// at every allocation).
#[inline(always)]
pub fn sample_bytes() -> u64 {
    OPTIONS.sample_bytes.load(Ordering::Relaxed)
}

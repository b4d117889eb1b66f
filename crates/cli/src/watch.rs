//! `trapline watch PID`: the policy half of watching a running program.
//!
//! The agent of a process started with `trapline run --control` answers on
//! its control socket (the mechanism: crates/agent services/control.rs).
//! This process asks it, every interval, for the live bytes of each
//! allocation site, keeps each site's series, and judges which sites keep
//! growing with the estimator `trapline leaks` uses (trapline-analysis's
//! `growth`). It names the sites from the trace the agent is writing. A
//! watcher that stops, or is killed, leaves the program as it was: it can
//! be started again at any time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use trapline_analysis::growth::{judge, Growth};
use trapline_analysis::report::{frame_text, thousands, FrameReport};
use trapline_analysis::staleness::Staleness;
use trapline_contract::control;

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The process to watch, started with `trapline run --control`.
    pub pid: u32,
    /// Seconds between two looks.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds)]
    pub interval: f64,
    /// Looks to take before stopping (default: until the process ends).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    /// Sites listed at each look, largest first (growing sites always are).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Output: a table that refreshes in place on a terminal (text), or
    /// one JSON object per look (jsonl).
    #[arg(long, value_enum, default_value_t = WatchFormat::Text)]
    pub format: WatchFormat,
    /// Wait up to SECS seconds for the process's socket to appear (a
    /// process just started).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub wait: Option<f64>,
    /// A watched block no access reaches for SECS seconds is stale.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_seconds)]
    pub stale_after: f64,
    /// Do not watch blocks for accesses (growth and reachability only).
    #[arg(long)]
    pub no_stale: bool,
    /// Most of the run's time, in percent, that page faults of watched
    /// blocks may cost; the blocks watched adapt to it.
    #[arg(long, value_name = "PERCENT", default_value = "1", value_parser = parse_percent)]
    pub fault_budget: f64,
    /// Ask for a reachability scan every N looks (0: never), for the
    /// `unreachable` verdict. A scan stops the program's threads for its
    /// pause, and gives every watched page back.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub scan_every: u32,
    /// Write the looks to FILE instead of stdout, keeping at most
    /// `--log-limit` on disk (FILE and FILE.1).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace FILE (and FILE.1) if they exist.
    #[arg(long, requires = "output")]
    pub force: bool,
    /// With -o: most bytes of looks kept on disk (a count, or 512K, 64M).
    /// When FILE reaches half of it, it becomes FILE.1 (the FILE.1 before
    /// is deleted) and FILE starts again: the last half of the limit, at
    /// least, is always kept.
    #[arg(long, value_name = "SIZE", default_value = "64M", requires = "output",
          value_parser = crate::run_args::parse_bytes)]
    pub log_limit: u64,
}

/// Where the looks go: stdout, or a file rotated to `FILE.1` whenever it
/// reaches half the limit, so that at most the limit is on disk.
enum LookSink {
    Stdout,
    File {
        path: PathBuf,
        file: std::fs::File,
        written: u64,
        half_limit: u64,
    },
}

impl LookSink {
    fn open(args: &WatchArgs) -> Result<LookSink, String> {
        let Some(path) = &args.output else {
            return Ok(LookSink::Stdout);
        };
        let rotated = rotated_name(path);
        for p in [path, &rotated] {
            if p.exists() && !args.force {
                return Err(format!(
                    "{}: exists; --force replaces it (nothing was written)",
                    p.display()
                ));
            }
        }
        match std::fs::remove_file(&rotated) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot remove {}: {e}", rotated.display()));
            }
            _ => {}
        }
        let file = std::fs::File::create(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(LookSink::File {
            path: path.clone(),
            file,
            written: 0,
            half_limit: args.log_limit / 2,
        })
    }

    /// Writes one look; false when it cannot (a closed stdout, a full disk).
    fn write(&mut self, look: &str) -> bool {
        match self {
            LookSink::Stdout => {
                let mut stdout = std::io::stdout().lock();
                stdout
                    .write_all(look.as_bytes())
                    .and_then(|_| stdout.flush())
                    .is_ok()
            }
            LookSink::File {
                path,
                file,
                written,
                half_limit,
            } => {
                let len = look.len() as u64;
                if *written > 0 && *written + len > *half_limit {
                    let fresh = std::fs::rename(&*path, rotated_name(path))
                        .and_then(|()| std::fs::File::create(&*path));
                    match fresh {
                        Ok(f) => {
                            *file = f;
                            *written = 0;
                        }
                        Err(e) => {
                            eprintln!("trapline watch: cannot rotate {}: {e}", path.display());
                            return false;
                        }
                    }
                }
                *written += len;
                file.write_all(look.as_bytes()).is_ok()
            }
        }
    }
}

/// `FILE.1`, where a full look log goes.
fn rotated_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("`{s}` is not a percentage (above 0, at most 100)")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchFormat {
    Text,
    Jsonl,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.01 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (at least 0.01)")),
    }
}

/// One look's line of `--format jsonl`.
#[derive(Serialize)]
struct Look<'a> {
    pid: u32,
    /// Seconds since the first look.
    time_seconds: f64,
    /// Looks so far.
    looks: usize,
    live_bytes: u64,
    live_blocks: u64,
    monitor: Option<Monitor>,
    sites: Vec<SiteLook<'a>>,
}

#[derive(Serialize)]
struct SiteLook<'a> {
    stack_id: u32,
    allocated_by: &'a str,
    bytes: u64,
    blocks: u64,
    /// Sampled recording, a full stack: the bytes of all its blocks,
    /// estimated from the sampled ones `bytes` counts (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    estimated_bytes: Option<u64>,
    /// Sampled recording: the stack is the caller of blocks that took no
    /// full stack (absent when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    caller_only: bool,
    /// What is wrong with the site, strongest first: `unreachable`,
    /// `growing`, `stale`.
    verdicts: Vec<&'static str>,
    /// Why the site is judged growing, or null.
    growth: Option<Growth>,
    /// What watching its blocks for accesses found, or null (not watched).
    staleness: Option<Staleness>,
    /// Unreachable bytes and blocks at the last scan, or null (none).
    unreachable: Option<[u64; 2]>,
    /// Blocks by age (`control::AGE_BUCKETS_S`).
    ages: Vec<u64>,
    /// Blocks born and released since the previous look.
    new_blocks: u64,
    gone_blocks: u64,
    /// The allocation stack (empty until the agent has written it).
    stack: &'a [FrameReport],
}

/// The access monitor's state and cost, in each look.
#[derive(Serialize, Clone, Default)]
struct Monitor {
    /// `userfaultfd`, `off`, or why none can be used.
    mechanism: String,
    faults: u64,
    /// Time the faults and the arming cost, the agent's handling plus
    /// `TRAP_NS` per fault for the kernel's part.
    fault_seconds: f64,
    /// That time's share of the last interval.
    fault_fraction: f64,
    armed_pages: u64,
    /// Blocks watched per suspect site at once (adapts to the budget).
    blocks_per_site: usize,
}

type Site = (u32, String);

/// What a site's live blocks were at the last look.
#[derive(Clone, Default)]
struct SiteNow {
    bytes: u64,
    blocks: u64,
    estimated_bytes: Option<u64>,
    caller_only: bool,
    ages: Vec<u64>,
    new_blocks: u64,
    gone_blocks: u64,
}

/// A block whose pages the agent watches.
struct BlockWatch {
    site: Site,
    pages: Vec<u64>,
    /// Seconds since the first look, when armed.
    armed_at: f64,
}

/// What watching a site's blocks has found so far.
#[derive(Default)]
struct SiteAccess {
    touched: u64,
    last_access: Option<f64>,
}

/// The staleness policy's state.
struct Access {
    stale_after: f64,
    budget: f64,
    blocks_per_site: usize,
    watched: HashMap<u64, BlockWatch>,
    /// The watched blocks on each watched page.
    on_page: HashMap<u64, Vec<u64>>,
    /// Blocks seen accessed: not watched again.
    done: std::collections::HashSet<u64>,
    sites: HashMap<Site, SiteAccess>,
    monitor: Monitor,
    /// The cost counters at the previous look, and when.
    previous: Option<(f64, f64)>,
}

struct Watcher {
    pid: u32,
    trace: Option<PathBuf>,
    times: Vec<f64>,
    series: HashMap<Site, Vec<u64>>,
    /// Each site's live blocks at the last look.
    current: HashMap<Site, SiteNow>,
    stacks: HashMap<u32, Vec<FrameReport>>,
    access: Option<Access>,
    /// Unreachable bytes and blocks per site at the last scan.
    lost: HashMap<Site, (u64, u64)>,
    /// The verdicts last written into the trace per site.
    written: HashMap<Site, u64>,
}

impl Access {
    /// Takes an answer to `watches` in: a watched page touched means every
    /// watched block on it was accessed; one given back unaccessed ends
    /// its blocks' watches with nothing learned (their other pages are
    /// given back too).
    fn learn(&mut self, now: f64, answer: &Value, agent: &mut impl FnMut(&str) -> Option<Value>) {
        let mut ended: Vec<u64> = Vec::new();
        let watches = answer.get("watches").and_then(Value::as_array);
        for v in watches.into_iter().flatten().filter_map(Value::as_array) {
            let (Some(page), Some(outcome)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_str),
            ) else {
                continue;
            };
            if outcome == "armed" {
                continue;
            }
            for addr in self.on_page.remove(&page).unwrap_or_default() {
                let Some(b) = self.watched.remove(&addr) else {
                    continue;
                };
                if outcome == "touched" {
                    let seen = self.sites.entry(b.site.clone()).or_default();
                    seen.touched += 1;
                    seen.last_access = Some(now);
                    self.done.insert(addr);
                }
                for p in &b.pages {
                    if let Some(blocks) = self.on_page.get_mut(p) {
                        blocks.retain(|&x| x != addr);
                        if blocks.is_empty() {
                            self.on_page.remove(p);
                        }
                    }
                }
                ended.push(addr);
            }
        }
        // Their pages that no other watched block shares: given back.
        if !ended.is_empty() {
            let mut request = control::DISARM.to_owned();
            for addr in &ended {
                request.push_str(&format!(" {addr}"));
            }
            agent(&request);
        }
    }

    /// Reads the agent's counters and keeps the time in faults within the
    /// budget: fewer blocks per site when over it (and none at all when
    /// far over), more when well under.
    fn budget_round(
        &mut self,
        now: f64,
        counters: &Value,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let n = |k: &str| counters.get(k).and_then(Value::as_u64).unwrap_or(0);
        let faults = n("faults");
        let cost = (n("fault_ns") + n("arm_ns")) as f64 + faults as f64 * TRAP_NS;
        self.monitor.mechanism = counters
            .get("access_monitor")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        self.monitor.faults = faults;
        self.monitor.fault_seconds = cost / 1e9;
        self.monitor.armed_pages = n("armed_pages");
        if let Some((then, cost_then)) = self.previous {
            let span = (now - then) * 1e9;
            if span > 0.0 {
                let share = (cost - cost_then).max(0.0) / span;
                self.monitor.fault_fraction = share;
                if share > 2.0 * self.budget {
                    agent(&format!("{} all", control::DISARM));
                    self.watched.clear();
                    self.on_page.clear();
                }
                if share > self.budget {
                    self.blocks_per_site = (self.blocks_per_site / 2).max(MIN_BLOCKS_PER_SITE);
                } else if share < self.budget / 4.0 {
                    self.blocks_per_site = (self.blocks_per_site * 2).min(MAX_BLOCKS_PER_SITE);
                }
            }
        }
        self.previous = Some((now, cost));
        self.monitor.blocks_per_site = self.blocks_per_site;
    }
}

/// The kernel's part of a fault's cost, which the agent cannot time:
/// 4.5 to 5.2 us measured per userfaultfd fault on these machines.
const TRAP_NS: f64 = 5_000.0;
/// Blocks per suspect site watched at once: the first, least and most.
const BLOCKS_PER_SITE: usize = 32;
const MIN_BLOCKS_PER_SITE: usize = 2;
const MAX_BLOCKS_PER_SITE: usize = 512;
/// Blocks remembered as accessed or refused, at most.
const MAX_REMEMBERED: usize = 100_000;

/// The control socket's directory and the socket of `pid` in it, where
/// this user's CLI looks (`trapline attach` tells the agent the directory).
pub fn socket_of(pid: u32) -> (String, String) {
    if let Some(path) = served_socket(pid) {
        let dir = Path::new(&path)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        return (dir, path);
    }
    let uid = nix::unistd::geteuid().as_raw();
    let dir = control::socket_dir(std::env::var("XDG_RUNTIME_DIR").ok().as_deref(), uid);
    let path = control::socket_path(&dir, pid);
    (dir, path)
}

/// Removes the sockets in the caller's socket directory of processes that
/// are gone.
pub fn remove_stale_sockets() {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = control::socket_dir(std::env::var("XDG_RUNTIME_DIR").ok().as_deref(), uid);
    control::remove_stale_sockets(&dir, |pid| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None)
            == Err(nix::errno::Errno::ESRCH)
    });
}

/// The control socket process `pid` listens on, wherever it is: the
/// directory is its user's, which is not the caller's when root looks at a
/// process that runs as another user (or dropped privileges after it made
/// its socket as root). Found as a listening Unix socket named `PID.sock`
/// in /proc/net/unix whose inode is one of the process's descriptors
/// (readable by root and by the process's own user).
pub fn served_socket(pid: u32) -> Option<String> {
    let name = format!("/{pid}.sock");
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    // Num RefCount Protocol Flags Type St Inode Path; a listener has
    // __SO_ACCEPTCON (0x10000) in Flags.
    let listening: Vec<(u64, &str)> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = u64::from_str_radix(f.get(3)?, 16).ok()?;
            let inode = f.get(6)?.parse().ok()?;
            let path = *f.get(7)?;
            (flags & 0x10000 != 0 && path.ends_with(&name)).then_some((inode, path))
        })
        .collect();
    if listening.is_empty() {
        return None;
    }
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(link) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let inode = link
            .to_str()
            .and_then(|l| l.strip_prefix("socket:["))
            .and_then(|l| l.strip_suffix(']'))
            .and_then(|l| l.parse::<u64>().ok());
        if let Some((_, path)) = listening.iter().find(|(i, _)| Some(*i) == inode) {
            return Some(path.to_string());
        }
    }
    None
}

pub fn main(args: WatchArgs) -> ExitCode {
    let mut sink = match LookSink::open(&args) {
        Ok(sink) => sink,
        Err(e) => {
            eprintln!("trapline watch: {e}");
            return ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR);
        }
    };
    let (_, path) = socket_of(args.pid);
    if let Some(secs) = args.wait {
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        while !Path::new(&path).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "no control socket at {path}: process {} was not started with `trapline run --control`, or has ended",
                    args.pid
                ),
                std::io::ErrorKind::ConnectionRefused => format!(
                    "{path} is left from a process that has ended (nothing answers there)"
                ),
                _ => format!("{path}: {e}"),
            };
            eprintln!("trapline watch: {why}");
            return ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR);
        }
    };
    let mut w = Watcher::new(args.pid);
    if !args.no_stale {
        w.access = Some(Access {
            stale_after: args.stale_after,
            budget: args.fault_budget / 100.0,
            blocks_per_site: BLOCKS_PER_SITE,
            watched: HashMap::new(),
            on_page: HashMap::new(),
            done: Default::default(),
            sites: HashMap::new(),
            monitor: Monitor::default(),
            previous: None,
        });
    }
    let refresh = args.format == WatchFormat::Text
        && args.output.is_none()
        && std::io::stdout().is_terminal();
    let mut reader = match stream.try_clone() {
        Ok(r) => BufReader::new(r),
        Err(e) => {
            eprintln!("trapline watch: {path}: {e}");
            return ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR);
        }
    };
    let mut writer = stream;
    let mut agent = |request: &str| ask(&mut writer, &mut reader, request);
    let start = Instant::now();
    let interval = Duration::from_secs_f64(args.interval);
    let mut looks = 0u32;
    loop {
        let answer = agent(control::SITES);
        let Some(answer) = answer else {
            // The process ended (or stopped serving): the last look stands.
            eprintln!("trapline watch: process {} is no longer served", args.pid);
            return ExitCode::SUCCESS;
        };
        if let Some(err) = answer.get("error").and_then(Value::as_str) {
            eprintln!("trapline watch: the agent answered: {err}");
            return ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR);
        }
        let now = start.elapsed().as_secs_f64();
        w.observe(now, &answer);
        if args.scan_every > 0 && looks % args.scan_every == args.scan_every - 1 {
            if let Some(scan) = agent(control::SCAN) {
                w.observe_scan(&scan);
            }
        }
        let growing = w.growing();
        w.watch_for_access(now, &growing, &mut agent);
        w.write_verdicts(now, &growing, &mut agent);
        w.name_stacks(growing.keys().map(|s| s.0).chain(w.largest(args.top)));
        let out = match args.format {
            WatchFormat::Jsonl => w.jsonl(now, &growing, args.top),
            WatchFormat::Text => w.text(now, &growing, args.top, refresh),
        };
        if !sink.write(&out) {
            return ExitCode::SUCCESS;
        }
        looks += 1;
        if args.count.is_some_and(|n| looks >= n) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(interval);
    }
}

/// A `trapline watch` that `trapline run --watch` started beside the
/// program, writing its looks to `TRACE.watch.jsonl`.
pub struct Beside {
    child: std::process::Child,
    looks: PathBuf,
}

/// Starts watching process `pid` every `secs` seconds, its looks next to
/// the trace `trace`; None (with a warning) if it cannot start.
pub fn start_beside(pid: u32, secs: f64, stale_after: Option<f64>, trace: &Path) -> Option<Beside> {
    let mut looks = trace.as_os_str().to_owned();
    looks.push(".watch.jsonl");
    let looks = PathBuf::from(looks);
    let started = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args([
                "watch",
                &pid.to_string(),
                "--format",
                "jsonl",
                "--wait",
                "30",
                "--force",
            ])
            .arg("--interval")
            .arg(secs.to_string())
            .arg("-o")
            .arg(&looks)
            .args(stale_after.map(|s| format!("--stale-after={s}")))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    });
    match started {
        Ok(child) => Some(Beside { child, looks }),
        Err(e) => {
            eprintln!(
                "==trapline== cannot watch the program ({}): {e}",
                looks.display()
            );
            None
        }
    }
}

/// `trapline run --watch`: a watcher beside the top process and beside
/// every process of its tree that serves a socket (a master's workers,
/// which do the work), found every half second while the run lasts; a
/// process's looks go next to its trace, `TRACE.<pid>.watch.jsonl`.
pub struct TreeWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    finder: std::thread::JoinHandle<Vec<(u32, Beside)>>,
}

impl TreeWatch {
    pub fn start(top: u32, secs: f64, stale_after: Option<f64>, trace: &Path) -> TreeWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let trace = trace.to_path_buf();
        let finder = std::thread::spawn(move || {
            let mut watched: Vec<(u32, Beside)> = Vec::new();
            watched.extend(start_beside(top, secs, stale_after, &trace).map(|b| (top, b)));
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for pid in descendants(top) {
                    if watched.iter().any(|(p, _)| *p == pid) || served_socket(pid).is_none() {
                        continue;
                    }
                    let mut own = trace.as_os_str().to_owned();
                    own.push(format!(".{pid}"));
                    if let Some(b) = start_beside(pid, secs, stale_after, Path::new(&own)) {
                        watched.push((pid, b));
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            watched
        });
        TreeWatch { stop, finder }
    }

    /// The run has ended: the summary lines of every watcher, the top
    /// process's first, the others' marked with their pid.
    pub fn finish(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let watched = self.finder.join().unwrap_or_default();
        let mut lines = Vec::new();
        for (i, (pid, b)) in watched.into_iter().enumerate() {
            let own = b.finish();
            if i == 0 {
                lines.extend(own);
            } else {
                lines.extend(
                    own.into_iter()
                        .map(|l| l.replacen("watch: ", &format!("watch (process {pid}): "), 1)),
                );
            }
        }
        lines
    }
}

/// The processes below `pid`, children first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in list
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if !out.contains(&c) {
                    out.push(c);
                    next.push(c);
                }
            }
        }
    }
    out
}

impl Beside {
    /// The program has ended: waits for the watcher (which sees its socket
    /// go) and returns the summary lines, the sites still growing at its
    /// last look.
    pub fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The log just rotated holds no look yet: the last is in FILE.1.
        let rotated = rotated_name(&self.looks);
        let last_in = |path: &Path| -> Option<Value> {
            let text = std::fs::read_to_string(path).ok()?;
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
        };
        let last = last_in(&self.looks).or_else(|| last_in(&rotated));
        let Some(last) = last else {
            return vec![format!("watch: no look taken ({})", self.looks.display())];
        };
        let kept = if rotated.exists() {
            format!(
                "{} (the latest; earlier looks in {}, older ones deleted)",
                self.looks.display(),
                rotated.display()
            )
        } else {
            self.looks.display().to_string()
        };
        let mut lines = vec![format!(
            "watch: {} looks in {kept}",
            last.get("looks").and_then(Value::as_u64).unwrap_or(0),
        )];
        let sites = last.get("sites").and_then(Value::as_array);
        for s in sites.into_iter().flatten() {
            let verdicts: Vec<&str> = s
                .get("verdicts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if verdicts.is_empty() {
                continue;
            }
            let place = s
                .get("stack")
                .and_then(Value::as_array)
                .and_then(|frames| {
                    let named = |f: &&Value| f.get("function").is_some_and(|v| !v.is_null());
                    let wrapper = |f: &&Value| {
                        f.get("allocation_wrapper").and_then(Value::as_bool) == Some(true)
                            || f.get("function")
                                .and_then(Value::as_str)
                                .is_some_and(trapline_analysis::report::is_allocation_wrapper)
                    };
                    // Named by the first frame outside allocation wrappers.
                    frames
                        .iter()
                        .find(|f| named(f) && !wrapper(f))
                        .or_else(|| frames.iter().find(named))
                })
                .map_or_else(
                    || format!("stack {}", s.get("stack_id").unwrap_or(&Value::Null)),
                    |f| {
                        let name = f.get("function").and_then(Value::as_str).unwrap_or("?");
                        match (
                            f.get("file").and_then(Value::as_str),
                            f.get("line").and_then(Value::as_u64),
                        ) {
                            (Some(file), Some(line)) => {
                                let file = Path::new(file)
                                    .file_name()
                                    .map_or(file.into(), |n| n.to_string_lossy());
                                format!("{name} ({file}:{line})")
                            }
                            _ => name.to_owned(),
                        }
                    },
                );
            let mut evidence = Vec::new();
            if let Some(rate) = s
                .pointer("/growth/bytes_per_second")
                .and_then(Value::as_f64)
            {
                evidence.push(format!("+{} bytes/s", thousands(rate as u64)));
            }
            if verdicts.contains(&"stale") {
                let n = |k: &str| {
                    s.pointer(&format!("/staleness/{k}"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                };
                evidence.push(format!(
                    "{} of {} watched blocks untouched",
                    thousands(n("untouched_blocks")),
                    thousands(n("watched_blocks"))
                ));
            }
            lines.push(format!(
                "watch: {} at the last look: {place}, {}",
                verdicts.join(", "),
                evidence.join(", ")
            ));
        }
        lines
    }
}

/// Sends one request and reads its one-line answer (None: the agent is gone).
fn ask(
    writer: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    request: &str,
) -> Option<Value> {
    writer.write_all(format!("{request}\n").as_bytes()).ok()?;
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => serde_json::from_str(&line).ok(),
    }
}

impl Watcher {
    fn new(pid: u32) -> Watcher {
        Watcher {
            pid,
            trace: None,
            times: Vec::new(),
            series: HashMap::new(),
            current: HashMap::new(),
            stacks: HashMap::new(),
            access: None,
            lost: HashMap::new(),
            written: HashMap::new(),
        }
    }

    /// Takes an answer to `scan` in: the unreachable blocks per site.
    fn observe_scan(&mut self, answer: &Value) {
        let Some(lost) = answer.get("lost").and_then(Value::as_array) else {
            return;
        };
        self.lost.clear();
        for v in lost.iter().filter_map(Value::as_array) {
            if let (Some(stack), Some(func), Some(bytes), Some(blocks)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_str),
                v.get(2).and_then(Value::as_u64),
                v.get(3).and_then(Value::as_u64),
            ) {
                self.lost
                    .insert((stack as u32, func.to_owned()), (bytes, blocks));
            }
        }
    }

    /// Sites suspected of leaking: growing, or with unreachable blocks.
    fn suspects(&self, growing: &HashMap<Site, Growth>) -> Vec<Site> {
        let mut out: Vec<Site> = growing.keys().cloned().collect();
        for site in self.lost.keys() {
            if !out.contains(site) {
                out.push(site.clone());
            }
        }
        out.sort();
        out
    }

    /// One round of the staleness policy: learns what became of the
    /// watched pages, keeps the fault cost within the budget, and has the
    /// agent watch old blocks of the suspect sites.
    fn watch_for_access(
        &mut self,
        now: f64,
        growing: &HashMap<Site, Growth>,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let suspects = self.suspects(growing);
        let Some(a) = self.access.as_mut() else {
            return;
        };
        if let Some(answer) = agent(control::WATCHES) {
            a.learn(now, &answer, agent);
        }
        if let Some(c) = agent(control::COUNTERS) {
            a.budget_round(now, &c, agent);
        }
        if a.monitor.mechanism.starts_with("unavailable") {
            return;
        }
        // Old enough: a block younger than this is still in use, and a
        // page holding one is hot.
        let min_age_ms = (a.stale_after * 250.0).clamp(1_000.0, 60_000.0) as u64;
        let mut wanted: HashMap<u64, Site> = HashMap::new();
        for site in &suspects {
            let have = a.watched.values().filter(|b| &b.site == site).count();
            if have >= a.blocks_per_site {
                continue;
            }
            let ask_for = (a.blocks_per_site - have) * 2 + 8;
            let request = format!(
                "{} {} {} {ask_for} {min_age_ms}",
                control::BLOCKS,
                site.0,
                site.1
            );
            let Some(answer) = agent(&request) else {
                return;
            };
            let blocks = answer.get("blocks").and_then(Value::as_array);
            let fresh = blocks
                .into_iter()
                .flatten()
                .filter_map(|b| b.get(0).and_then(Value::as_u64))
                .filter(|addr| !a.watched.contains_key(addr) && !a.done.contains(addr))
                .take(a.blocks_per_site - have);
            wanted.extend(fresh.map(|addr| (addr, site.clone())));
        }
        if wanted.is_empty() {
            return;
        }
        let mut request = format!("{} {min_age_ms}", control::ARM);
        for addr in wanted.keys() {
            request.push_str(&format!(" {addr}"));
        }
        let Some(answer) = agent(&request) else {
            return;
        };
        if let Some(err) = answer.get("error").and_then(Value::as_str) {
            a.monitor.mechanism = err.to_owned();
            return;
        }
        // Addresses come back as new blocks: a long run forgets them now
        // and then rather than skip new blocks for ever.
        if a.done.len() > MAX_REMEMBERED {
            a.done.clear();
        }
        // A block refused is not asked for again (its pages are shared).
        let refused = answer.get("refused").and_then(Value::as_array);
        for v in refused.into_iter().flatten().filter_map(Value::as_array) {
            if let Some(addr) = v.first().and_then(Value::as_u64) {
                a.done.insert(addr);
            }
        }
        let armed = answer.get("armed").and_then(Value::as_array);
        for v in armed.into_iter().flatten().filter_map(Value::as_array) {
            let (Some(addr), Some(pages)) = (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_array),
            ) else {
                continue;
            };
            let pages: Vec<u64> = pages.iter().filter_map(Value::as_u64).collect();
            let Some(site) = wanted.get(&addr).cloned() else {
                continue;
            };
            for p in &pages {
                a.on_page.entry(*p).or_default().push(addr);
            }
            a.watched.insert(
                addr,
                BlockWatch {
                    site,
                    pages,
                    armed_at: now,
                },
            );
        }
    }

    /// The verdicts of every site now, strongest first.
    fn verdicts(
        &self,
        now: f64,
        site: &Site,
        growing: &HashMap<Site, Growth>,
    ) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.lost.contains_key(site) {
            v.push("unreachable");
        }
        if growing.contains_key(site) {
            v.push("growing");
        }
        // Data that is rarely read but still reachable and not growing is
        // no leak suspect (an idle keyspace): stale counts only beside
        // another verdict, although the site's blocks stay watched.
        if !v.is_empty() && self.staleness(now, site).is_some_and(|s| s.is_stale()) {
            v.push("stale");
        }
        v
    }

    /// What watching `site`'s blocks found (None: none watched).
    fn staleness(&self, now: f64, site: &Site) -> Option<Staleness> {
        let a = self.access.as_ref()?;
        let seen = a.sites.get(site);
        let mut watched = 0u64;
        let mut untouched = 0u64;
        let mut shortest: Option<f64> = None;
        for b in a.watched.values().filter(|b| &b.site == site) {
            watched += 1;
            let quiet = now - b.armed_at;
            if quiet >= a.stale_after {
                untouched += 1;
                shortest = Some(shortest.map_or(quiet, |s: f64| s.min(quiet)));
            }
        }
        let touched = seen.map_or(0, |s| s.touched);
        if watched + touched == 0 {
            return None;
        }
        Some(Staleness {
            watched_blocks: watched + touched,
            untouched_blocks: untouched,
            touched_blocks: touched,
            untouched_seconds: shortest.unwrap_or(0.0),
            last_access_seconds_ago: seen.and_then(|s| s.last_access).map(|t| now - t),
        })
    }

    /// Writes into the trace, through the agent, the verdict of each site
    /// whose verdicts changed since the last look.
    fn write_verdicts(
        &mut self,
        now: f64,
        growing: &HashMap<Site, Growth>,
        agent: &mut impl FnMut(&str) -> Option<Value>,
    ) {
        let mut sites: Vec<Site> = self.suspects(growing);
        sites.extend(self.written.keys().cloned());
        sites.sort();
        sites.dedup();
        for site in sites {
            let verdicts = self.verdicts(now, &site, growing);
            let mut kinds = 0u64;
            if verdicts.contains(&"growing") {
                kinds |= trapline_trace::event::site_verdict::GROWING;
            }
            if verdicts.contains(&"stale") {
                kinds |= trapline_trace::event::site_verdict::STALE;
            }
            if self.written.get(&site).copied().unwrap_or(0) == kinds {
                continue;
            }
            let rate = growing
                .get(&site)
                .map_or(0, |g| g.bytes_per_second.max(0.0) as u64);
            let s = self.staleness(now, &site);
            let (watched, untouched, quiet_ms) = s.as_ref().map_or((0, 0, 0), |s| {
                (
                    s.watched_blocks,
                    s.untouched_blocks,
                    (s.untouched_seconds * 1000.0) as u64,
                )
            });
            let request = format!(
                "{} {} {} {kinds} {rate} {watched} {untouched} {quiet_ms} 0",
                control::VERDICT,
                site.0,
                site.1
            );
            if agent(&request).is_some_and(|a| a.get("written").is_some()) {
                self.written.insert(site, kinds);
            }
        }
    }

    /// Takes one answer to `sites` in, at `time` seconds.
    fn observe(&mut self, time: f64, answer: &Value) {
        if self.trace.is_none() {
            self.trace = answer
                .get("trace")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(PathBuf::from);
        }
        let n = self.times.len();
        self.times.push(time);
        self.current.clear();
        let sites = answer.get("sites").and_then(Value::as_array);
        for v in sites.into_iter().flatten() {
            let (Some(stack), Some(func), Some(bytes), Some(blocks)) = (
                v.get("stack").and_then(Value::as_u64),
                v.get("fn").and_then(Value::as_str),
                v.get("bytes").and_then(Value::as_u64),
                v.get("blocks").and_then(Value::as_u64),
            ) else {
                continue;
            };
            let count = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
            let site = (stack as u32, func.to_owned());
            let series = self.series.entry(site.clone()).or_default();
            series.resize(n, 0);
            // Under sampled recording, a full stack's sampled blocks stand
            // for all of its blocks: its growth is judged on the estimate.
            let estimated_bytes = v.get("estimated_bytes").and_then(Value::as_u64);
            series.push(estimated_bytes.unwrap_or(bytes));
            let ages = v.get("ages").and_then(Value::as_array);
            self.current.insert(
                site,
                SiteNow {
                    bytes,
                    blocks,
                    estimated_bytes,
                    caller_only: v.get("caller_only") == Some(&Value::Bool(true)),
                    ages: ages
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .collect(),
                    new_blocks: count("new_blocks"),
                    gone_blocks: count("gone_blocks"),
                },
            );
        }
        for series in self.series.values_mut() {
            series.resize(n + 1, 0);
        }
    }

    /// The sites judged growing over the looks so far.
    fn growing(&self) -> HashMap<Site, Growth> {
        self.series
            .iter()
            .filter_map(|(site, ys)| judge(&self.times, ys).map(|g| (site.clone(), g)))
            .collect()
    }

    /// The stack ids of the `n` largest sites now.
    fn largest(&self, n: usize) -> Vec<u32> {
        self.ranked(0.0, &HashMap::new(), n)
            .iter()
            .map(|s| s.0)
            .collect()
    }

    /// The sites to list: those with verdicts first (more verdicts first,
    /// then faster growth, then more bytes), then the largest.
    fn ranked(&self, now: f64, growing: &HashMap<Site, Growth>, n: usize) -> Vec<Site> {
        let mut judged: Vec<(Site, usize)> = self
            .suspects(growing)
            .into_iter()
            .map(|s| {
                let k = self.verdicts(now, &s, growing).len();
                (s, k)
            })
            .filter(|(_, k)| *k > 0)
            .collect();
        let rate = |s: &Site| growing.get(s).map_or(0.0, |g| g.bytes_per_second);
        let bytes = |s: &Site| self.current.get(s).map_or(0, |c| c.bytes);
        judged.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then(rate(&b.0).total_cmp(&rate(&a.0)))
                .then(bytes(&b.0).cmp(&bytes(&a.0)))
                .then(a.0.cmp(&b.0))
        });
        let mut big: Vec<(&Site, &SiteNow)> = self.current.iter().collect();
        big.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        let mut out: Vec<Site> = judged.into_iter().map(|(s, _)| s).collect();
        for (site, _) in big.into_iter().take(n) {
            if !out.contains(site) {
                out.push(site.clone());
            }
        }
        out
    }

    /// Names the stacks not named yet from the trace as written so far (a
    /// stack the writer has not flushed yet is tried again at the next look).
    fn name_stacks(&mut self, ids: impl Iterator<Item = u32>) {
        let missing: Vec<u32> = ids.filter(|id| !self.stacks.contains_key(id)).collect();
        let Some(trace) = self.trace.as_deref().filter(|_| !missing.is_empty()) else {
            return;
        };
        let Ok(mut file) = std::fs::File::open(trace) else {
            return;
        };
        let Ok(named) = trapline_analysis::report::symbolized_stacks(&mut file, &missing) else {
            return;
        };
        self.stacks
            .extend(named.into_iter().filter(|(_, frames)| !frames.is_empty()));
    }

    fn jsonl(&self, now: f64, growing: &HashMap<Site, Growth>, n: usize) -> String {
        let none = SiteNow::default();
        let sites = self.ranked(now, growing, n);
        let look = Look {
            pid: self.pid,
            time_seconds: *self.times.last().unwrap_or(&0.0),
            looks: self.times.len(),
            live_bytes: self.current.values().map(|v| v.bytes).sum(),
            live_blocks: self.current.values().map(|v| v.blocks).sum(),
            monitor: self.access.as_ref().map(|a| a.monitor.clone()),
            sites: sites
                .iter()
                .map(|site| {
                    let c = self.current.get(site).unwrap_or(&none);
                    SiteLook {
                        stack_id: site.0,
                        allocated_by: &site.1,
                        bytes: c.bytes,
                        blocks: c.blocks,
                        estimated_bytes: c.estimated_bytes,
                        caller_only: c.caller_only,
                        verdicts: self.verdicts(now, site, growing),
                        growth: growing.get(site).cloned(),
                        staleness: self.staleness(now, site),
                        unreachable: self.lost.get(site).map(|&(b, n)| [b, n]),
                        ages: c.ages.clone(),
                        new_blocks: c.new_blocks,
                        gone_blocks: c.gone_blocks,
                        stack: self.stacks.get(&site.0).map_or(&[], Vec::as_slice),
                    }
                })
                .collect(),
        };
        let mut line = serde_json::to_string(&look).unwrap_or_default();
        line.push('\n');
        line
    }

    fn text(&self, now: f64, growing: &HashMap<Site, Growth>, n: usize, refresh: bool) -> String {
        let mut out = String::new();
        if refresh {
            // Home and clear: the table is redrawn in place.
            out.push_str("\x1b[H\x1b[2J");
        }
        let live: u64 = self.current.values().map(|v| v.bytes).sum();
        out.push_str(&format!(
            "trapline watch {}: {} bytes live in {} sites, look {} at {:.1} s{}\n",
            self.pid,
            thousands(live),
            thousands(self.current.len() as u64),
            self.times.len(),
            self.times.last().unwrap_or(&0.0),
            if self.times.len() < 8 {
                " (growth is judged from the 8th look)"
            } else {
                ""
            }
        ));
        if let Some(m) = self.access.as_ref().map(|a| &a.monitor) {
            out.push_str(&format!(
                "access monitor: {}, {} pages watched, {} faults, {:.3} s in faults ({:.2}% of the last interval)\n",
                if m.mechanism.is_empty() { "off" } else { &m.mechanism },
                m.armed_pages,
                thousands(m.faults),
                m.fault_seconds,
                m.fault_fraction * 100.0
            ));
        }
        out.push_str(&format!(
            "{:>14} {:>10} {:>12} {:>9}  {:<24} {}\n",
            "bytes", "blocks", "growth/s", "untouched", "verdicts", "site"
        ));
        let none = SiteNow::default();
        for site in self.ranked(now, growing, n) {
            let c = self.current.get(&site).unwrap_or(&none);
            let rate = growing.get(&site).map_or_else(String::new, |g| {
                format!("+{}", thousands(g.bytes_per_second as u64))
            });
            let untouched = self.staleness(now, &site).map_or_else(String::new, |s| {
                format!("{}/{}", s.untouched_blocks, s.watched_blocks)
            });
            let frames = self.stacks.get(&site.0);
            let place = frames
                .and_then(|f| {
                    let outside = trapline_analysis::report::wrapper_frames(f);
                    f[outside..].iter().find(|f| f.function.is_some())
                })
                .map_or_else(|| format!("stack {} ({})", site.0, site.1), frame_text);
            out.push_str(&format!(
                "{:>14} {:>10} {:>12} {:>9}  {:<24} {place}\n",
                thousands(c.bytes),
                thousands(c.blocks),
                rate,
                untouched,
                self.verdicts(now, &site, growing).join(",")
            ));
        }
        if !refresh {
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sites: &[(u32, u64)]) -> Value {
        let sites: Vec<Value> = sites
            .iter()
            .map(|&(stack, bytes)| {
                serde_json::json!({"stack": stack, "fn": "malloc", "bytes": bytes, "blocks": bytes / 100})
            })
            .collect();
        serde_json::json!({"pid": 7, "time_ns": 0, "trace": "", "sites": sites})
    }

    /// A site that climbs at every look is judged growing once there are
    /// enough looks; one that holds is not; a site missing from a look
    /// counts as 0 there.
    #[test]
    fn looks_build_each_sites_series() {
        let mut w = Watcher::new(7);
        for i in 0..12u64 {
            let mut sites = vec![(1, 100_000 * (i + 1)), (2, 500_000)];
            if i != 5 {
                sites.push((3, 1_000));
            }
            w.observe(i as f64, &answer(&sites));
            let growing = w.growing();
            assert_eq!(
                growing.contains_key(&(1, "malloc".into())),
                i >= 7,
                "look {i}"
            );
            assert!(!growing.contains_key(&(2, "malloc".into())));
        }
        assert_eq!(w.series[&(3, "malloc".to_string())][5], 0);
        let line = w.jsonl(12.0, &w.growing(), 1);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["looks"], 12);
        assert_eq!(v["sites"][0]["stack_id"], 1);
        assert!(
            v["sites"][0]["growth"]["bytes_per_second"]
                .as_f64()
                .unwrap()
                > 90_000.0
        );
    }
}

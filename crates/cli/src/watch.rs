//! `trapline watch PID` and `run --watch`'s watchers: the shell around the
//! policy (crates/policy) that talks to a process's control socket (the
//! mechanism: crates/agent services/control.rs), asks every interval, and
//! renders each look as a table or a JSON line. A watcher that stops, or
//! is killed, leaves the program as it was: it can be started again at
//! any time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::Value;
use trapline_analysis::report::{frame_text, thousands};
use trapline_contract::control;
use trapline_policy::{Look, StalenessOptions, Watcher};

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
                std::io::ErrorKind::NotFound
                    if !Path::new(&format!("/proc/{}", args.pid)).exists() =>
                {
                    format!("no process {} (it has ended, or never ran)", args.pid)
                }
                std::io::ErrorKind::NotFound => format!(
                    "process {pid} is not being recorded (no control socket at {path}): start it with \
                     `trapline run --control`, or `trapline attach {pid}` records it as it runs",
                    pid = args.pid
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
    let staleness = (!args.no_stale).then_some(StalenessOptions {
        stale_after: args.stale_after,
        fault_budget: args.fault_budget / 100.0,
    });
    let mut w = Watcher::new(args.pid, staleness);
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
        let mut look = w.look(now, &growing, args.top);
        mark_estimated_growth(&mut look);
        let out = match args.format {
            WatchFormat::Jsonl => {
                let mut line = serde_json::to_string(&look).unwrap_or_default();
                line.push('\n');
                line
            }
            WatchFormat::Text => text(&look, w.site_count(), refresh),
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

/// Under sampled recording (`--sample`, `--production`) the agent gives a
/// full stack's estimated bytes beside its sampled ones, and the policy
/// judges the site's growth on the estimate: its growth says so.
fn mark_estimated_growth(look: &mut Look<'_>) {
    for site in &mut look.sites {
        if let (Some(_), Some(g)) = (site.estimated_bytes, site.growth.as_mut()) {
            g.estimated = true;
        }
    }
}

/// A `trapline watch` that `trapline run --watch` started beside the
/// program, writing its looks to `TRACE.watch.jsonl`.
pub struct Beside {
    child: std::process::Child,
    looks: PathBuf,
    /// The trace the looks are of.
    trace: PathBuf,
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
        Ok(child) => Some(Beside {
            child,
            looks,
            trace: trace.to_path_buf(),
        }),
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
        let judged = |s: &&Value| {
            s.get("verdicts")
                .and_then(Value::as_array)
                .is_some_and(|v| !v.is_empty())
        };
        let named = self.stacks_unnamed_at(sites.into_iter().flatten().filter(judged));
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
            let id = s.get("stack_id").and_then(Value::as_u64).unwrap_or(0);
            let place = s
                .get("stack")
                .and_then(Value::as_array)
                .filter(|frames| !frames.is_empty())
                .or_else(|| named.get(&id).and_then(Value::as_array))
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
                let estimated = s.pointer("/growth/estimated") == Some(&Value::Bool(true));
                evidence.push(format!(
                    "+{} bytes/s{}",
                    thousands(rate as u64),
                    if estimated { " (estimated)" } else { "" }
                ));
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

impl Beside {
    /// The stacks of `sites` that the looks could not name, named from the
    /// trace now that the program has ended (as JSON frames, by stack id):
    /// a production-mode program with one thread has its trace written at
    /// its end only, so no look could read its stacks.
    fn stacks_unnamed_at<'a>(&self, sites: impl Iterator<Item = &'a Value>) -> HashMap<u64, Value> {
        let ids: Vec<u32> = sites
            .filter(|s| {
                s.get("stack")
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty)
            })
            .filter_map(|s| s.get("stack_id").and_then(Value::as_u64))
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        if ids.is_empty() {
            return HashMap::new();
        }
        let Ok(mut file) = std::fs::File::open(&self.trace) else {
            return HashMap::new();
        };
        let Ok(named) = trapline_analysis::report::symbolized_stacks(&mut file, &ids) else {
            return HashMap::new();
        };
        named
            .into_iter()
            .filter(|(_, frames)| !frames.is_empty())
            .filter_map(|(id, frames)| Some((u64::from(id), serde_json::to_value(frames).ok()?)))
            .collect()
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

/// A look as a table for people; `sites`: how many sites have live
/// blocks; `refresh`: redrawn in place on a terminal.
fn text(look: &Look, sites: usize, refresh: bool) -> String {
    let mut out = String::new();
    if refresh {
        // Home and clear: the table is redrawn in place.
        out.push_str("\x1b[H\x1b[2J");
    }
    out.push_str(&format!(
        "trapline watch {}: {} bytes live in {} sites, look {} at {:.1} s{}\n",
        look.pid,
        thousands(look.live_bytes),
        thousands(sites as u64),
        look.looks,
        look.time_seconds,
        if look.looks < 8 {
            " (growth is judged from the 8th look)"
        } else {
            ""
        }
    ));
    if let Some(m) = &look.monitor {
        out.push_str(&format!(
            "access monitor: {}, {} pages watched, {} faults, {:.3} s in faults ({:.2}% of the last interval)\n",
            if m.mechanism.is_empty() { "off" } else { &m.mechanism },
            m.armed_pages,
            thousands(m.faults),
            m.fault_seconds,
            m.fault_fraction * 100.0
        ));
    }
    if look.sites.iter().any(|s| s.estimated_bytes.is_some()) {
        out.push_str(
            "sampled recording: ~ marks the bytes of a full stack estimated from its sampled blocks; its growth is judged on the estimate\n",
        );
    }
    out.push_str(&format!(
        "{:>14} {:>10} {:>12} {:>9}  {:<24} {}\n",
        "bytes", "blocks", "growth/s", "untouched", "verdicts", "site"
    ));
    for site in &look.sites {
        let rate = site.growth.as_ref().map_or_else(String::new, |g| {
            let about = if g.estimated { "~" } else { "" };
            format!("+{about}{}", thousands(g.bytes_per_second as u64))
        });
        let bytes = site
            .estimated_bytes
            .map_or_else(|| thousands(site.bytes), |e| format!("~{}", thousands(e)));
        let untouched = site.staleness.as_ref().map_or_else(String::new, |s| {
            format!("{}/{}", s.untouched_blocks, s.watched_blocks)
        });
        let outside = trapline_analysis::report::wrapper_frames(site.stack);
        let place = site.stack[outside..]
            .iter()
            .find(|f| f.function.is_some())
            .map_or_else(
                || format!("stack {} ({})", site.stack_id, site.allocated_by),
                frame_text,
            );
        out.push_str(&format!(
            "{:>14} {:>10} {:>12} {:>9}  {:<24} {place}\n",
            bytes,
            thousands(site.blocks),
            rate,
            untouched,
            site.verdicts.join(",")
        ));
    }
    if !refresh {
        out.push('\n');
    }
    out
}
